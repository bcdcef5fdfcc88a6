"""Zero-copy views of user tensors and the operand checks every plan runs.

:func:`operand` (:mod:`quantplan.runtime._readers`, re-exported here) reads pointer, shape,
dtype name, contiguity and device of an array without copying it (NumPy, CuPy, PyTorch,
``__cuda_array_interface__`` objects). It is called in ``run``, so the reader of each array
type is looked up once per type and touches only cheap attributes. :class:`OperandChecks` holds the rules every plan applies to its arguments (the
operand rules, written once):

* a tensor lives where the plan runs (NumPy arrays on the reference backend, the plan's device
  on CUDA), has the shape the descriptor implies, one of its element kind's dtype names, is
  C-contiguous and aligned to its elements;
* a parameter is an array of the scope's parameter shape or, for TensorScope only, a Python
  scalar (a scale finite and > 0 in the parameter dtype);
* a Philox seed / offset (SPEC section 4) is a Python int in [0, 2**64) or a one-element int64
  array on the plan's device;
* an output shares no byte with an input unless it is that input itself (in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantplan.runtime._operand import Operand
from quantplan.runtime._readers import _DTYPE_NAMES, _POINTERS, dtype_name, operand
from quantplan.vocabulary.elements import ElementInfo
from quantplan.vocabulary.errors import InvalidProblem, MisalignedOperand
from quantplan.vocabulary.philox import uniform_for_elements
from quantplan.vocabulary.types import BackendKind, Scope, expand_params


def overlaps(a: Operand, b: Operand) -> bool:
    """True when two (contiguous) operands share any byte; an operand of pointer 0 never does."""
    if not a.ptr or not b.ptr:
        return False
    return a.ptr < b.ptr + b.size * b.itemsize and b.ptr < a.ptr + a.size * a.itemsize


def is_scalar(value: Any) -> bool:
    """True for Python / NumPy numbers (not arrays)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def same_or_disjoint(out: Operand, out_name: str, src: Operand, src_name: str) -> None:
    """Raise unless ``out`` is ``src`` itself (in place) or shares no byte with it."""
    if out.ptr != src.ptr and overlaps(out, src):
        raise InvalidProblem(
            f"{out_name} partly overlaps {src_name}; pass the same tensor (in place) or a disjoint one"
        )


@dataclass(slots=True)
class TensorArgs:
    """The first two arguments of every elementwise run: ``input`` (read) and ``output`` (written).
    A plan's Args class derives from it and adds its parameters."""

    input: Any
    output: Any


def check_writeable(*named: tuple[str, Operand | None]) -> None:
    """InvalidProblem for a read-only NumPy array among the operands a plan writes."""
    for name, op in named:
        if op is not None and type(op.obj) is np.ndarray and not op.obj.flags.writeable:
            raise InvalidProblem(
                f"{name} is a read-only NumPy array; pass a writeable array (e.g. its .copy()), the plan writes it"
            )


def check_outputs(
    written: tuple[tuple[str, Operand | None], ...],
    read: tuple[tuple[str, Any], ...] = (),
    in_place: tuple[str, str] | None = None,
) -> None:
    """The outputs of a call: writeable, and sharing no byte with another output or with an input
    (``read``; scalars are skipped), except the pair ``in_place`` (output, input) when it is the
    same array (same first byte). InvalidProblem naming the pair otherwise."""
    check_writeable(*written)
    for i, (name, out) in enumerate(written):
        if out is None:
            continue
        for other_name, other in (*written[i + 1 :], *read):
            if type(other) is Operand and overlaps(out, other):
                if in_place == (name, other_name) and out.ptr == other.ptr:
                    continue
                hint = " (or the same array, in place)" if in_place == (name, other_name) else ""
                raise InvalidProblem(f"{name} overlaps {other_name}; pass disjoint arrays{hint}")


def check_disjoint(*named: tuple[str, Operand | None]) -> None:
    """InvalidProblem when two of the device operands share a byte (the kernels read and write them all)."""
    spans = [(op.ptr, op.ptr + op.size * op.itemsize) for _, op in named if op is not None and op.ptr]
    spans.sort()
    for i in range(1, len(spans)):  # sorted by start: any overlap shows between neighbours
        if spans[i][0] < spans[i - 1][1]:
            _name_overlap(named)


def _name_overlap(named: tuple[tuple[str, Operand | None], ...]) -> None:
    """Raise for the first overlapping pair in argument order."""
    count = len(named)
    for i in range(count):
        name_a, a = named[i]
        if a is None:
            continue
        for j in range(i + 1, count):
            name_b, b = named[j]
            if b is not None and overlaps(a, b):
                raise InvalidProblem(f"{name_a} overlaps {name_b}; pass disjoint tensors")


def check_positive(name: str, value: int) -> None:
    """InvalidProblem unless ``value`` is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidProblem(f"{name}={value!r} must be an integer >= 1")


def host_view(op: Operand, info: ElementInfo) -> np.ndarray:
    """The NumPy array behind a host operand, viewed in the storage dtype of ``info``."""
    return np.asarray(op.obj).view(info.numpy_dtype)


def write_back(op: Operand, info: ElementInfo, value: np.ndarray) -> None:
    """Copy ``value`` (storage dtype of ``info``) into the host operand ``op``, shape for shape."""
    out = host_view(op, info)
    np.copyto(out, np.asarray(value).reshape(out.shape).view(out.dtype), casting="no")


def reference_uniform(shape: tuple[int, ...], seed: Operand | int | None, offset: Operand | int | None) -> np.ndarray:
    """The Philox uniforms of a run on the reference backend (seed / offset: ints or 1-element arrays)."""

    def value(v: Operand | int | None) -> int:
        return int(np.asarray(v.obj).reshape(-1)[0]) % 2**64 if isinstance(v, Operand) else int(v or 0)

    return uniform_for_elements(math.prod(shape), value(seed), value(offset)).reshape(shape)


_UINT64_MAX = 2**64 - 1
_INT32 = (-(2**31), 2**31 - 1)


#: dtype -> (smallest normal, largest finite): a scale between them stays finite and > 0 when rounded.
_SCALE_BOUNDS: dict[np.dtype, tuple[float, float]] = {}


def scalar_scale(value: Any, dtype: np.dtype) -> float:
    """A Python-number scale as every plan takes it: finite and > 0, and still so when rounded to
    ``dtype`` (the parameter dtype: float32, float64 for F64 data); InvalidProblem otherwise."""
    s = float(value)
    bounds = _SCALE_BOUNDS.get(dtype)
    if bounds is None:
        info = np.finfo(dtype)
        bounds = _SCALE_BOUNDS[dtype] = (float(info.tiny), float(info.max))
    if bounds[0] <= s <= bounds[1]:
        return s
    if not (math.isfinite(s) and s > 0):
        raise InvalidProblem(f"scale={value!r}: a scalar scale must be finite and > 0 in {dtype.name}")
    with np.errstate(over="ignore", under="ignore"):
        rounded = float(dtype.type(s))
    if not 0 < rounded < math.inf:
        raise InvalidProblem(
            f"scale={value!r}: a scalar scale must be finite and > 0 in {dtype.name} "
            f"(it rounds to 0 or Inf in {dtype.name})"
        )
    return s


def scalar_zero_point(value: Any, lo: int = _INT32[0], hi: int = _INT32[1]) -> int:
    """A Python-number integer zero point: an integer in [lo, hi] (default: the int32 range);
    InvalidProblem otherwise."""
    v = float(value)
    if not (math.isfinite(v) and v == int(v) and lo <= int(value) <= hi):
        where = "the int32 range" if (lo, hi) == _INT32 else f"[{lo}, {hi}] (the plan's q_min, q_max)"
        raise InvalidProblem(f"zero_point={value!r} must be an integer in {where}; pass a zero point within it")
    return int(value)


def _refuse_layout(op: Operand, name: str) -> None:
    """MisalignedOperand for an operand that is not C-contiguous or not aligned to its elements."""
    if not op.contiguous:
        raise MisalignedOperand(
            f"{name} is not C-contiguous; pass a contiguous array (.contiguous() / ascontiguousarray)"
        )
    raise MisalignedOperand(
        f"{name} pointer {op.ptr:#x} is not aligned to its {op.itemsize}-byte elements; pass an array that "
        f"starts on an element boundary (a fresh allocation or a copy)"
    )


def host_values(op: Operand) -> np.ndarray:
    """The elements of an array operand as a flat NumPy array (copied to the host from a GPU)."""
    obj = op.obj
    if type(obj) is np.ndarray:
        return obj.reshape(-1)
    get = getattr(obj, "get", None)  # CuPy
    if get is not None:
        return np.asarray(get()).reshape(-1)
    return np.asarray(obj.detach().cpu().numpy()).reshape(-1)  # PyTorch


def _first_bad(op: Operand, bad: np.ndarray, name: str, values: np.ndarray, rule: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        where = ", ".join(str(int(k)) for k in np.unravel_index(i, op.shape)) if op.shape else ""
        raise InvalidProblem(
            f"{name}[{where}] = {values[i].item()!r} {rule} (found by PlanPreference(validate_values=True)); "
            f"fix the parameter array"
        )


def check_param_values(scale: Any, zero_point: Any, lo: int, hi: int, scale_name: str = "scale") -> None:
    """``PlanPreference(validate_values=True)``: every element of a scale array finite and > 0,
    every element of a zero-point array in [lo, hi]; InvalidProblem naming the first bad index.
    Scalars (checked on every call anyway) and None are skipped."""
    if type(scale) is Operand:
        v = host_values(scale)
        with np.errstate(invalid="ignore"):
            _first_bad(scale, ~(np.isfinite(v) & (v > 0)), scale_name, v, "must be finite and > 0")
    if type(zero_point) is Operand:
        z = host_values(zero_point)
        _first_bad(zero_point, (z < lo) | (z > hi), "zero_point", z, f"lies outside [{lo}, {hi}]")


class OperandChecks:
    """The operand rules (module docstring) against one plan's backend, device and parameter shape.

    A plan deriving from it sets ``backend``, ``device_id``, ``_param_shape`` and ``_tensor_scope``.
    """

    backend: BackendKind
    device_id: int | None
    _param_shape: tuple[int, ...]
    _tensor_scope: bool

    def _tensor(self, value: Any, name: str, shape: tuple[int, ...], info: ElementInfo) -> Operand:
        """A tensor of ``shape`` and element ``info``: residence, shape, dtype, contiguity, alignment."""
        op = operand(value, name)
        if op.device_id != self.device_id or (self.backend is BackendKind.REFERENCE and type(op.obj) is not np.ndarray):
            self._check_residence(op, name)
        if op.shape != shape:
            raise InvalidProblem(f"{name} has shape {op.shape}, but the descriptor implies {shape}")
        if op.dtype_name not in info.dtype_names:
            raise InvalidProblem(
                f"{name} has dtype {op.dtype_name}; {info.kind.name} needs one of {sorted(info.dtype_names)}"
            )
        if not op.contiguous or op.ptr % op.itemsize:
            _refuse_layout(op, name)
        return op

    def _required(self, value: Any, name: str, shape: tuple[int, ...], info: ElementInfo) -> Operand:
        """:meth:`_tensor`, with a clear message when ``value`` is None."""
        if value is None:
            raise InvalidProblem(f"{name} is required: an array of shape {shape} ({info.kind.name})")
        return self._tensor(value, name, shape, info)

    def _check_residence(self, op: Operand, name: str) -> None:
        """Raise unless ``op`` lives where the plan runs (the callers test the common case inline)."""
        if self.backend is BackendKind.REFERENCE:
            if not isinstance(op.obj, np.ndarray):
                raise InvalidProblem(
                    f"{name} is a {type(op.obj).__name__}; this plan runs on the REFERENCE backend, which takes "
                    f"NumPy arrays (select a CUDA plan for device tensors)"
                )
        elif op.device_id != self.device_id:
            where = "host memory" if op.device_id is None else f"device {op.device_id}"
            raise InvalidProblem(f"{name} lives in {where}, but the plan was selected for device {self.device_id}")

    def _param(self, value: Any, name: str, dtype: np.dtype, allow_none: bool) -> Operand | float | int | None:
        """A parameter: an array of ``_param_shape`` and ``dtype`` or, for TensorScope, a scalar."""
        if value is None:
            if allow_none:
                return None
            raise InvalidProblem(f"{name} is required for this plan")
        if is_scalar(value):
            if not self._tensor_scope:
                raise InvalidProblem(
                    f"{name} is a scalar, which only TensorScope takes; pass an array of shape {self._param_shape}"
                )
            return value  # type: ignore[no-any-return]
        return self._param_array(value, name, dtype, self._tensor_scope, "needs")

    def _param_array(self, value: Any, name: str, dtype: np.dtype, one_element: bool | None, verb: str) -> Operand:
        """A parameter array: residence, ``_param_shape`` (any one-element shape when
        ``one_element``; None: when the parameter shape has one element), ``dtype``, C-contiguous
        and aligned. ``verb``: "needs" / "writes"."""
        op = operand(value, name)
        if op.device_id != self.device_id or (self.backend is BackendKind.REFERENCE and type(op.obj) is not np.ndarray):
            self._check_residence(op, name)
        if op.shape != self._param_shape and not (
            op.size == 1 and (math.prod(self._param_shape) == 1 if one_element is None else one_element)
        ):
            raise InvalidProblem(f"{name} has shape {op.shape}, but the scope's parameter shape is {self._param_shape}")
        if op.dtype_name != (_DTYPE_NAMES.get(dtype) or dtype_name(dtype)):
            raise InvalidProblem(f"{name} has dtype {op.dtype_name}; this plan {verb} {dtype.name}")
        if not op.contiguous or op.ptr % op.itemsize:
            _refuse_layout(op, name)
        return op

    def _positive_scale(self, value: Any, dtype: np.dtype) -> Operand | float:
        """``scale`` as every plan takes it: an array of ``_param_shape`` or, for TensorScope, a
        scalar that is finite and > 0 and stays so when rounded to ``dtype``."""
        scale = self._param(value, "scale", dtype, allow_none=False)
        if type(scale) is Operand:
            return scale
        return scalar_scale(scale, dtype)

    def _int32_zero_point(
        self, value: Any, dtype: np.dtype, lo: int = _INT32[0], hi: int = _INT32[1]
    ) -> Operand | int | None:
        """An integer zero point: an int32 array of ``_param_shape`` or, for TensorScope, an
        integer in [lo, hi] (default: the int32 range; ``dtype``: int32)."""
        zp = self._param(value, "zero_point", dtype, allow_none=False)
        if type(zp) is Operand:
            return zp
        return scalar_zero_point(zp, lo, hi)

    def _broadcast_param(
        self, value: Operand | float | int, shape: tuple[int, ...], scope: Scope, dtype: np.dtype | None = None
    ) -> np.ndarray:
        """A parameter (array or scalar) broadcast against data of ``shape`` on the reference backend."""
        pshape = self._param_shape if self._param_shape else (1,)
        shape = shape if shape else (1,)
        arr = np.asarray(value.obj).reshape(pshape) if isinstance(value, Operand) else np.full(pshape, value, dtype)
        return expand_params(arr, shape, scope)

    @staticmethod
    def _host_view(op: Operand, shape: tuple[int, ...], info: ElementInfo) -> np.ndarray:
        """A reference-backend operand as a NumPy array of ``info``'s dtype and ``shape``."""
        return host_view(op, info).reshape(shape if shape else (1,))

    @staticmethod
    def _write_host(op: Operand, value: np.ndarray) -> None:
        """Copy a reference result into the caller's NumPy array (its shape and raw dtype)."""
        out = np.asarray(op.obj)
        np.copyto(out, value.reshape(out.shape).view(out.dtype), casting="no")

    def _param_output(self, value: Any, name: str, dtype: np.dtype, required: bool) -> Operand | None:
        """A parameter array the plan writes (``scale_out`` / ``zero_point_out``): ``_param_shape``
        (any one-element shape when that is all ones), ``dtype``, C-contiguous and aligned; None
        when ``value`` is None and not ``required``."""
        if value is None:
            if required:
                raise InvalidProblem(f"{name} is required: an array of shape {self._param_shape} ({dtype.name})")
            return None
        return self._param_array(value, name, dtype, None, "writes")

    def _rng_value(self, value: Any, name: str) -> Operand | int:
        """A seed / offset: a Python int in [0, 2**64) or a one-element int64 array on the plan's device."""
        if value is None:
            raise InvalidProblem(
                f"{name} is required with Rounding.STOCHASTIC (a Python int or a 1-element int64 array)"
            )
        if is_scalar(value):
            if not isinstance(value, (int, np.integer)) or not 0 <= int(value) <= _UINT64_MAX:
                raise InvalidProblem(f"{name}={value!r} must be an integer in [0, 2**64)")
            return int(value)
        op = operand(value, name)
        if op.device_id != self.device_id or (self.backend is BackendKind.REFERENCE and type(op.obj) is not np.ndarray):
            self._check_residence(op, name)
        if op.size != 1 or op.dtype_name != "int64":
            raise InvalidProblem(
                f"{name} must be a Python int or a 1-element int64 array, got {op.dtype_name} {op.shape}"
            )
        if op.ptr % 8:
            raise MisalignedOperand(f"{name} pointer {op.ptr:#x} is not 8-byte aligned")
        return op

    def _rng(self, stochastic: bool, seed: Any, offset: Any) -> tuple[Operand | int, Operand | int]:
        """The seed and offset of a run: checked when ``stochastic``, else both must be None (0, 0)."""
        if stochastic:
            return self._rng_value(seed, "rng_seed"), self._rng_value(offset, "rng_offset")
        if seed is not None or offset is not None:
            raise InvalidProblem("rng_seed / rng_offset apply only to Rounding.STOCHASTIC plans; leave them None")
        return 0, 0


def view(value: Any, name: str) -> Any:
    """An unchecked argument: None and scalars as given, arrays as :class:`Operand` (``check=False``)."""
    if value is None or type(value) in _SCALAR_TYPES:
        return value
    return operand(value, name) if not is_scalar(value) else value


def pointer_view(value: Any, name: str) -> Any:
    """:func:`view` reading only what a launch needs: an array's object and data pointer (its
    other :class:`Operand` fields are left empty). The unchecked path of ``run``."""
    if value is None or type(value) in _SCALAR_TYPES:
        return value
    reader = _POINTERS.get(type(value))
    if reader is None:
        return view(value, name)
    return Operand(value, reader(value), (), "", 1, True, None)


_SCALAR_TYPES = frozenset({int, float})


__all__ = [
    "Operand",
    "OperandChecks",
    "TensorArgs",
    "check_disjoint",
    "check_outputs",
    "check_param_values",
    "check_writeable",
    "check_positive",
    "dtype_name",
    "host_values",
    "host_view",
    "is_scalar",
    "operand",
    "overlaps",
    "pointer_view",
    "reference_uniform",
    "same_or_disjoint",
    "scalar_scale",
    "scalar_zero_point",
    "view",
    "write_back",
]
