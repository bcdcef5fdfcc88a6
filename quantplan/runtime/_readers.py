"""Zero-copy views of user arrays as :class:`Operand` records: one reader per array type (NumPy,
CuPy, PyTorch, ``__cuda_array_interface__`` objects), looked up once per type, touching only cheap
attributes (the hot path of ``run`` and of the fast path reads them). Below the operand rules
(:mod:`quantplan.runtime._operands`, which re-exports them) so that the fast path needs neither the
rules nor the vocabulary's models."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quantplan.runtime._operand import Operand
from quantplan.vocabulary.errors import InvalidArgumentType, InvalidProblem

_CAI_TYPESTR = {
    "<f2": "float16",
    "<f4": "float32",
    "<f8": "float64",
    "|i1": "int8",
    "|u1": "uint8",
    "<i4": "int32",
    "<u2": "uint16",
    "<i2": "int16",
    "<i8": "int64",
}


def _numpy_operand(obj: Any) -> Operand:
    dtype = obj.dtype
    name = _DTYPE_NAMES.get(dtype) or dtype_name(dtype)
    ptr = obj.__array_interface__["data"][0]
    return Operand(obj, ptr, obj.shape, name, obj.itemsize, obj.flags.c_contiguous, None)


def _cupy_operand(obj: Any) -> Operand:
    dtype = obj.dtype
    name = _DTYPE_NAMES.get(dtype) or dtype_name(dtype)
    return Operand(obj, obj.data.ptr, obj.shape, name, obj.itemsize, obj.flags.c_contiguous, obj.device.id)


def _cupy_operand_direct(obj: Any) -> Operand:
    """:func:`_cupy_operand` reading CuPy's contiguity flag directly (``.flags`` builds an object per call)."""
    dtype = obj.dtype
    name = _DTYPE_NAMES.get(dtype) or dtype_name(dtype)
    return Operand(obj, obj.data.ptr, obj.shape, name, obj.itemsize, obj._c_contiguous, obj.device.id)


def _torch_operand(obj: Any) -> Operand:
    dtype = obj.dtype
    name = _DTYPE_NAMES.get(dtype) or dtype_name(dtype)
    device_index = obj.get_device()  # -1 for CPU tensors
    if device_index < 0:
        return Operand(obj, 0, tuple(obj.shape), name, obj.element_size(), obj.is_contiguous(), None)
    return Operand(obj, obj.data_ptr(), tuple(obj.shape), name, obj.element_size(), obj.is_contiguous(), device_index)


def _cai_operand(obj: Any) -> Operand:
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    cai_dtype = _CAI_TYPESTR.get(typestr)
    if cai_dtype is None:
        raise InvalidProblem(f"__cuda_array_interface__ typestr {typestr!r} is not a supported dtype")
    shape = tuple(cai["shape"])
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    contiguous = strides is None or tuple(strides) == _c_strides(shape, itemsize)
    import cupy

    ptr = int(cai["data"][0])
    device_id = cupy.cuda.runtime.pointerGetAttributes(ptr).device if ptr else int(cupy.cuda.runtime.getDevice())
    return Operand(obj, ptr, shape, cai_dtype, itemsize, contiguous, int(device_id))


def _cupy_pointer(obj: Any) -> int:
    return obj.data.ptr  # type: ignore[no-any-return]


def _torch_pointer(obj: Any) -> int:
    return obj.data_ptr() if obj.get_device() >= 0 else 0  # type: ignore[no-any-return]


def _cai_pointer(obj: Any) -> int:
    return int(obj.__cuda_array_interface__["data"][0])


def _host_pointer(obj: Any) -> int:
    return 0


_POINTER_OF: dict[Callable[[Any], Operand], Callable[[Any], int]] = {
    _numpy_operand: _host_pointer,
    _cupy_operand: _cupy_pointer,
    _cupy_operand_direct: _cupy_pointer,
    _torch_operand: _torch_pointer,
    _cai_operand: _cai_pointer,
}
#: array type -> its reader, filled on first sight of each type.
_READERS: dict[type, Callable[[Any], Operand]] = {np.ndarray: _numpy_operand}


def _reader(kind: type, obj: Any, name: str) -> Callable[[Any], Operand]:
    module = kind.__module__
    if issubclass(kind, np.ndarray):
        reader = _numpy_operand
    elif module.startswith("cupy"):
        direct = isinstance(getattr(obj, "_c_contiguous", None), bool)
        reader = _cupy_operand_direct if direct else _cupy_operand
    elif module.startswith("torch"):
        reader = _torch_operand
    elif getattr(obj, "__cuda_array_interface__", None) is not None:
        reader = _cai_operand
    else:
        raise InvalidArgumentType(
            f"{name}: expected a NumPy array, a CuPy array, a PyTorch tensor or an object with "
            f"__cuda_array_interface__, got {type(obj).__name__}"
        )
    _READERS[kind] = reader
    _POINTERS[kind] = _POINTER_OF[reader]
    return reader


def operand(obj: Any, name: str) -> Operand:
    """View ``obj`` (argument ``name``) as an :class:`Operand`, or raise InvalidProblem."""
    reader = _READERS.get(type(obj))
    if reader is None:
        reader = _reader(type(obj), obj, name)
    try:
        return reader(obj)
    except InvalidProblem as exc:
        raise InvalidProblem(f"{name}: {exc}") from None


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """NumPy-style name of a NumPy / CuPy / PyTorch dtype (``torch.bfloat16`` -> ``bfloat16``), memoized."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        text = str(dtype)
        name = text[6:] if text.startswith("torch.") else np.dtype(dtype).name
        _DTYPE_NAMES[dtype] = name
    return name


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


#: array type -> the reader of its data pointer (0 for host arrays), filled on first sight.
_POINTERS: dict[type, Callable[[Any], int]] = {np.ndarray: _host_pointer}


__all__ = ["dtype_name", "operand"]
