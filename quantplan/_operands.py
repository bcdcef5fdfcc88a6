"""Zero-copy views of user tensors: NumPy, CuPy, PyTorch and ``__cuda_array_interface__`` objects.

:func:`operand` reads pointer, shape, dtype name, contiguity and device of an array without
copying it. It is called in ``run``, so each branch touches only cheap attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidProblem

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


@dataclass(slots=True)
class Operand:
    """What quantplan needs of one tensor argument.

    ``device_id`` is None for host (NumPy) arrays. ``ptr`` is 0 for host arrays.
    """

    obj: Any
    ptr: int
    shape: tuple[int, ...]
    dtype_name: str
    itemsize: int
    contiguous: bool
    device_id: int | None

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def operand(obj: Any, name: str) -> Operand:
    """View ``obj`` (argument ``name``) as an :class:`Operand`, or raise InvalidProblem."""
    if isinstance(obj, np.ndarray):
        return Operand(obj, 0, obj.shape, obj.dtype.name, obj.itemsize, obj.flags.c_contiguous, None)
    module = type(obj).__module__
    if module.startswith("cupy"):
        return Operand(
            obj, obj.data.ptr, obj.shape, _dtype_name(obj.dtype), obj.itemsize, obj.flags.c_contiguous, obj.device.id
        )
    if module.startswith("torch"):
        device_index = obj.get_device()  # -1 for CPU tensors
        dtype_name = _dtype_name(obj.dtype)
        if device_index < 0:
            return Operand(obj, 0, tuple(obj.shape), dtype_name, obj.element_size(), obj.is_contiguous(), None)
        return Operand(
            obj, obj.data_ptr(), tuple(obj.shape), dtype_name, obj.element_size(), obj.is_contiguous(), device_index
        )
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        typestr = cai["typestr"]
        cai_dtype = _CAI_TYPESTR.get(typestr)
        if cai_dtype is None:
            raise InvalidProblem(f"{name}: __cuda_array_interface__ typestr {typestr!r} is not a supported dtype")
        shape = tuple(cai["shape"])
        itemsize = int(typestr[2:])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, itemsize)
        import cupy

        ptr = int(cai["data"][0])
        device_id = cupy.cuda.runtime.pointerGetAttributes(ptr).device if ptr else int(cupy.cuda.runtime.getDevice())
        return Operand(obj, ptr, shape, cai_dtype, itemsize, contiguous, int(device_id))
    raise InvalidProblem(
        f"{name}: expected a NumPy array, a CuPy array, a PyTorch tensor or an object with "
        f"__cuda_array_interface__, got {type(obj).__name__}"
    )


_DTYPE_NAMES: dict[Any, str] = {}


def overlaps(a: Operand, b: Operand) -> bool:
    """True when two device operands share any byte (host operands, pointer 0, never do)."""
    if not a.ptr or not b.ptr:
        return False
    return a.ptr < b.ptr + b.size * b.itemsize and b.ptr < a.ptr + a.size * a.itemsize


def _dtype_name(dtype: Any) -> str:
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


def is_scalar(value: Any) -> bool:
    """True for Python / NumPy numbers (not arrays)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


__all__ = ["Operand", "is_scalar", "operand"]


def same_or_disjoint(out: Operand, out_name: str, src: Operand, src_name: str) -> None:
    """Raise unless ``out`` is ``src`` itself (in place) or shares no byte with it."""
    if out.ptr != src.ptr and overlaps(out, src):
        raise InvalidProblem(
            f"{out_name} partly overlaps {src_name}; pass the same tensor (in place) or a disjoint one"
        )
