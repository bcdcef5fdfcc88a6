"""One-line quantization for notebooks and scripts: ``qp.quantize``, ``qp.dequantize``, ``qp.fake_quantize``.

```python
qt = qp.quantize(x, "int8", scope=qp.TokenScope())          # scale from each row's range
qt = qp.quantize(x, "int4", group_size=128, asymmetric=True)  # groups of 128 along the last axis
y = qt.dequantize()                                           # back to x's dtype
y = qp.fake_quantize(x, 0.05, q_min=-128, q_max=127)          # QAT forward, PyTorch's formula
```

These functions are a thin layer over the plans: each call reads where ``x`` lives (a NumPy array, a
CuPy array, a PyTorch CPU or CUDA tensor), selects the plan once per problem (shape, dtypes, scope,
mode, range) and device and keeps it in the front-ends' plan cache, allocates the outputs with the
same library on the same device, and runs on that library's current stream. The results are the
plans' results, bit for bit: NumPy arrays and PyTorch CPU tensors run on the NumPy reference
backend, CuPy arrays and PyTorch CUDA tensors on the CUDA kernels.

**When to use:** quantizing a tensor in a notebook, a test or a script, where writing a descriptor,
a plan and preallocated outputs is more ceremony than the job needs. In a hot loop that must not
allocate (CUDA graphs, fixed buffers), hold a plan and call ``plan.run`` instead.

Decisions (also in the CHANGELOG): the default scope is :class:`~quantplan.TensorScope`;
``group_size=g`` is a shortcut for ``GroupScope(axis=-1, group_size=g)``; a non-contiguous input is
copied to a contiguous one first; CuPy arrays of dtype uint16 are read as bfloat16 bits (CuPy has no
bfloat16); FP8 codes are returned as ``float8_e4m3fn`` / ``float8_e5m2`` arrays where the library
has the type (NumPy through ml_dtypes, PyTorch) and as uint8 bits in CuPy; stochastic rounding
without a ``seed`` draws a fresh 64-bit seed from the operating system; a static ``scale`` array of
another float dtype than the parameters' (float32; float64 for float64 data) is rounded to it; an
argument that is no array (a list, say) raises InvalidArgumentType, as the plans do.

Non-finite input (NaN, +-Inf): with a static scale, a NaN element gets the zero point (so it
dequantizes to 0; FP8: NaN) and +-Inf clamps to ``q_min`` / ``q_max``: only that element is
affected. With a scale from the data, a segment of the scope (the whole tensor for TensorScope, a
row for TokenScope, a group for ``group_size``) holding a NaN or +-Inf gets scale NaN (zero point
0) and every code of it equals the zero point, so the WHOLE segment dequantizes to NaN.
``qp.quantize(..., nonfinite="warn" | "raise")`` checks the scales after the kernel.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantplan._block_functional import (
    BLOCK_NAMES,
    BLOCK_OPTIONS,
    BlockQuantizedTensor,
    dequantize_block,
    quantize_block,
)
from quantplan._frontend import _LOCAL as _THREAD
from quantplan._frontend import (
    TORCH,
    Target,
    dtype_name,
    nbytes_of,
    packed_offsets,
    remember_replay,
    replay,
)
from quantplan.ops import static_quantize as _static_quantize
from quantplan.ops.dynamic_range import (
    DynamicRangeQuantizeArgs,
    DynamicRangeQuantizeDescriptor,
    DynamicRangeQuantizePlan,
)
from quantplan.ops.fake_quantize import FakeQuantizeArgs, FakeQuantizeDescriptor, FakeQuantizePlan
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidArgumentType, InvalidProblem
from quantplan.vocabulary.formats import FORMATS
from quantplan.vocabulary.types import (
    ChannelScope,
    ElementKind,
    GroupScope,
    NibbleOrder,
    QuantMode,
    Rounding,
    Scope,
    TensorScope,
    TokenScope,
)

#: Short names of the quantized kinds (ElementKind names work too, in any case).
CODE_NAMES: dict[str, ElementKind] = {
    "int8": ElementKind.S8,
    "uint8": ElementKind.U8,
    "int4": ElementKind.S4,
    "uint4": ElementKind.U4,
    "fp8_e4m3": ElementKind.FP8_E4M3,
    "float8_e4m3fn": ElementKind.FP8_E4M3,
    "fp8_e5m2": ElementKind.FP8_E5M2,
    "float8_e5m2": ElementKind.FP8_E5M2,
}
#: Short names of the float kinds; also the dtype names of the arrays read (uint16: CuPy bfloat16 bits).
FLOAT_NAMES: dict[str, ElementKind] = {
    "float16": ElementKind.F16,
    "half": ElementKind.F16,
    "bfloat16": ElementKind.BF16,
    "uint16": ElementKind.BF16,
    "float32": ElementKind.F32,
    "float": ElementKind.F32,
    "float64": ElementKind.F64,
    "double": ElementKind.F64,
}
_NEAREST = Rounding.NEAREST_EVEN
#: Scope types (None's included) whose replay key is the type alone: TensorScope and TokenScope
#: have one field, a constant. Any other scope is keyed by its type and field values.
_PLAIN_SCOPES = frozenset({TensorScope, TokenScope, type(None)})
_CODE_TYPE_NAMES = {ElementKind.FP8_E4M3: "float8_e4m3fn", ElementKind.FP8_E5M2: "float8_e5m2"}
#: (code kind, float kind) -> dtype name of the scale tensor: the served formats' scale element.
_SCALE_DTYPES: dict[tuple[ElementKind, ElementKind], str] = {
    (f.code_kind, data): f.scale_dtype(data).name for f in FORMATS.values() if f.served for data in f.data_kinds
}
#: Float dtypes a static scale array may have (rounded to the parameter dtype when it differs).
_FLOAT_SCALE_DTYPES = frozenset(("float16", "bfloat16", "float32", "float64"))
#: What ``quantize(nonfinite=...)`` does when a scale of the result is not finite.
NONFINITE = ("propagate", "warn", "raise")


def _traced(x: Any) -> bool:
    """Whether torch.compile is tracing this call (then PyTorch tensors go through quantplan's
    torch.library operators, which it can trace). False without PyTorch imported."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and torch.compiler.is_compiling()


#: Array types that torch.compile never traces (NumPy's, CuPy's once seen): the hot path skips
#: :func:`_traced` for them.
_UNTRACED: set[type] = {np.ndarray}


def _kind(value: ElementKind | str, names: dict[str, ElementKind], what: str) -> ElementKind:
    """``value`` as an ElementKind of ``names``' family (an ElementKind, a short name or a kind name)."""
    kind = value if isinstance(value, ElementKind) else None
    if kind is None and isinstance(value, str):
        kind = names.get(value.lower()) or ElementKind.__members__.get(value.upper())
    if kind is None or kind not in names.values():
        choices = ", ".join(repr(n) for n in names if n != "uint16")
        raise InvalidProblem(f"{what}={value!r} is not one this function takes; use an ElementKind or one of {choices}")
    return kind


def _float_kind(x: Any) -> ElementKind:
    name = dtype_name(x)
    kind = FLOAT_NAMES.get(name)
    if kind is None:
        raise InvalidProblem(
            f"input has dtype {name}; quantize float16, bfloat16, float32 or float64 data "
            f"(CuPy bfloat16 as uint16 bits)"
        )
    return kind


def _scope(scope: Scope | None, group_size: int | None, axis: int | None) -> Scope:
    given = [name for name, v in (("scope", scope), ("group_size", group_size), ("axis", axis)) if v is not None]
    if len(given) > 1:
        raise InvalidProblem(f"give one of scope=, group_size=, axis= (got {', '.join(given)})")
    if group_size is not None:
        return GroupScope(axis=-1, group_size=group_size)
    if axis is not None:
        return ChannelScope(axis=axis)
    return scope if scope is not None else TensorScope()


def _codes_view(target: Target, codes: Any, kind: ElementKind) -> Any:
    """FP8 codes typed as float8 where the library has the type (the plans wrote their bits)."""
    name = _CODE_TYPE_NAMES.get(kind)
    if name is None or target.library not in (TORCH, "numpy"):
        return codes
    if target.library == TORCH:
        return codes.view(_torch_dtype(name))
    return codes.view(ELEMENTS[kind].numpy_dtype)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _as_dtype(target: Target, a: Any, name: str) -> Any:
    """``a`` converted (rounded) to dtype ``name`` in its own library and device."""
    return a.to(_torch_dtype(name)) if target.library == TORCH else a.astype(name)


def _host_values(a: Any) -> Any:
    """A NumPy copy (or view) of array ``a`` of any library (a device-to-host copy for CUDA arrays)."""
    if hasattr(a, "detach"):  # PyTorch
        return a.detach().cpu().numpy()
    if hasattr(a, "get"):  # CuPy
        return a.get()
    return a


def _check_scales(qt: QuantizedTensor, nonfinite: str, stacklevel: int, given: bool = False) -> QuantizedTensor:
    """``qt``, after ``quantize(nonfinite="warn" | "raise")``'s check that every scale is finite
    (warning ``stacklevel`` frames above this function's caller; ``given``: a static scale)."""
    values = np.asarray(qt.scale if isinstance(qt.scale, (int, float)) else _host_values(qt.scale))
    bad = np.argwhere(~np.isfinite(values))
    if not len(bad):
        return qt
    why = (
        "the scale= given is NaN or +-Inf there, so that segment dequantizes to NaN; pass finite scales"
        if given
        else "that segment of the input holds NaN or +-Inf, so all its codes are the zero point and it "
        "dequantizes to NaN; clean the input (e.g. nan_to_num)"
    )
    message = (
        f"qp.quantize: {len(bad)} of {values.size} scales are not finite (first at index "
        f"{tuple(int(i) for i in bad[0])}): {why}, or pass nonfinite='propagate' to accept it"
    )
    if nonfinite == "raise":
        raise InvalidProblem(message)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    return qt


def _rng(rounding: Rounding, seed: int | None, offset: int) -> tuple[int | None, int | None]:
    if rounding is not Rounding.STOCHASTIC:
        if seed is not None:
            raise InvalidProblem("seed= applies to rounding=Rounding.STOCHASTIC only")
        return None, None
    return (int.from_bytes(os.urandom(8), "little") if seed is None else seed), offset


@dataclass(frozen=True, slots=True)
class _Quantizer:
    """What one cached problem needs per call: the plan, its output layout and the dequantize descriptor."""

    plan: Any
    codes_shape: tuple[int, ...]
    codes_dtype: str
    param_shape: tuple[int, ...]
    param_dtype: str
    dequantize: _static_quantize.DequantizeDescriptor


def _quantizer(
    target: Target, key: tuple[Any, ...], desc_cls: Any, plan_cls: Any, fields: dict[str, Any]
) -> _Quantizer:
    def build() -> _Quantizer:
        desc = desc_cls(**fields)
        plan = target.select(plan_cls, desc)
        info = ELEMENTS[desc.output_element]
        codes_dtype = "uint8" if info.is_packed or info.is_fp8 else info.numpy_dtype.name
        param_dtype = _SCALE_DTYPES[desc.output_element, desc.input_element]
        # The dequantize problem of the codes: the shared fields copied, the two elements swapped.
        shared = {name: getattr(desc, name) for name in ("shape", "scope", "mode", "nibble_order")}
        deq = _static_quantize.DequantizeDescriptor(
            input_element=desc.output_element, output_element=desc.input_element, **shared
        )

        return _Quantizer(plan, desc.output_shape, codes_dtype, desc.param_shape, param_dtype, deq)

    return target.cached((_Quantizer, *key), build)  # type: ignore[no-any-return]


_new = object.__new__
_set_fields = object.__setattr__


@dataclass(frozen=True)
class QuantizedTensor:
    """Codes and the parameters that decode them: ``x ~= (codes - zero_point) * scale``.

    ``codes``: the quantized storage (S4 / U4 packed two per byte along the last axis, FP8 typed as
    float8 where the library has the type); ``scale``: float32 (float64 for F64 data) of the
    scope's parameter shape; ``zero_point``: int32 of the same shape, None when symmetric;
    ``descriptor``: the :class:`~quantplan.DequantizeDescriptor` that decodes them. All arrays are
    of the input's library and device. A repeated call on CUDA (CuPy or PyTorch) returns one
    whose arrays are regions of one allocation, each made on first read (it holds the allocation
    meanwhile).
    """

    codes: Any
    scale: Any
    zero_point: Any
    descriptor: _static_quantize.DequantizeDescriptor

    def dequantize(self, dtype: ElementKind | str | None = None) -> Any:
        """``(codes - zero_point) * scale`` as a new array of the original float dtype (or ``dtype``)."""
        return dequantize(self, dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape of the quantized data (not of the packed storage)."""
        return self.descriptor.shape

    @property
    def nbytes(self) -> int:
        """Bytes held: codes, scales and zero points."""
        return sum(int(getattr(a, "nbytes", 0)) for a in (self.codes, self.scale, self.zero_point))

    def __repr__(self) -> str:
        d = self.descriptor
        target = Target.of(self.codes)
        where = "host" if target.index is None else f"cuda:{target.index}"
        zp = "" if self.zero_point is None else ", zero_point int32"
        scale = f"scale {tuple(self.scale.shape)}" if hasattr(self.scale, "shape") else f"scale {self.scale!r}"
        return (
            f"QuantizedTensor({d.input_element.name} codes of {d.shape}, {d.scope!r}, {d.mode.value}, {scale}"
            f"{zp}, {self.nbytes} bytes, {target.library} on {where})"
        )


class _Region:
    """A field of :class:`_Packed`, made on first read: an array over its region of the
    allocation (a ``cupy.ndarray``, or a PyTorch view of the uint8 tensor; None for an absent zero
    point), then stored in the instance, where later reads find it without this descriptor (it
    defines no ``__set__``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        state = obj.__dict__
        region = state["_layout"][self.name]
        if region is None:
            value = None
        else:
            value = region[3](state["_memory"])
        state[self.name] = value
        return value


class _Packed(QuantizedTensor):
    """A QuantizedTensor of a replayed CUDA call (CuPy or PyTorch): its arrays are regions of one
    allocation, each made (a ``cupy.ndarray`` over the region, or a view of PyTorch's uint8
    tensor as the field's dtype and shape) when first read and kept from then on. It holds the
    allocation, so the memory lives while the QuantizedTensor or any of its arrays does (a PyTorch
    view shares the tensor's storage). Reads,
    ``nbytes``, ``repr``, ``dequantize``, ``==`` and ``dataclasses`` functions see the same fields
    as an eager QuantizedTensor; pickling and copying give an eager one.

    One that dies with none of its arrays made (nothing else can reach its memory:
    ``dequantize`` reads the regions' pointers during its call only) gives its allocation back
    to the replay that made it (:func:`quantplan._frontend.replay`'s ``memory``), whose next call on the
    same stream takes it instead of allocating: a loop ``qt = qp.quantize(x); y =
    qp.dequantize(qt)`` allocates its codes and scales once. Kept only up to
    :data:`quantplan._frontend.RECYCLE_BYTES` a replay, and released with the plan cache
    (:func:`quantplan.clear_plan_cache`)."""

    codes = _Region("codes")
    scale = _Region("scale")
    zero_point = _Region("zero_point")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuantizedTensor):
            return NotImplemented
        return bool(
            (self.codes, self.scale, self.zero_point, self.descriptor)
            == (other.codes, other.scale, other.zero_point, other.descriptor)
        )

    __hash__ = QuantizedTensor.__hash__  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return QuantizedTensor, (self.codes, self.scale, self.zero_point, self.descriptor)

    def __del__(self) -> None:
        # the allocation back to its replay's list, for the next call on the same stream (replay's ``memory``)
        state = self.__dict__
        spare = state.get("_spare")
        if not spare and spare is not None and "codes" not in state and "scale" not in state:
            if "zero_point" not in state:
                spare.append((state["_stream"], state["_memory"]))


def _packed_layout(
    outputs: list[tuple[tuple[int, ...], str]], library: str, code_kind: ElementKind
) -> dict[str, tuple[Any, ...] | None]:
    """Field name -> (shape, dtype, offset, make) of each output in the replay's one allocation
    (:func:`quantplan._frontend.packed_offsets`; zero_point None when symmetric); ``make(memory)``
    makes the field's array over its region: a ``cupy.ndarray`` (FP8 codes as uint8 bits), or a
    view of PyTorch's uint8 tensor, whose length is a multiple of
    :data:`quantplan._frontend.PACKED_ALIGNMENT` (it reads as any dtype; FP8 codes typed as
    float8, as the eager result's)."""
    dtypes = [np.dtype(dtype) for _, dtype in outputs]
    sizes = [nbytes_of(shape, d) for (shape, _), d in zip(outputs, dtypes, strict=True)]
    offsets, _ = packed_offsets(sizes)
    makers: list[Callable[..., Any]] = []
    if library == TORCH:
        import torch

        names = [_CODE_TYPE_NAMES.get(code_kind, outputs[0][1]), *(dtype for _, dtype in outputs[1:])]
        for (shape, _), name, offset in zip(outputs, names, offsets, strict=True):
            kind = getattr(torch, name)
            strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))
            at = offset // kind.itemsize  # the allocation's length is a multiple of PACKED_ALIGNMENT

            def torch_view(
                memory: Any, shape: Any = shape, kind: Any = kind, strides: Any = strides, at: int = at
            ) -> Any:
                whole = memory.view(kind)  # (as_strided's offset counts from the storage's start)
                return whole.as_strided(shape, strides, whole.storage_offset() + at)

            makers.append(torch_view)
    else:
        import cupy

        for (shape, _), d, offset in zip(outputs, dtypes, offsets, strict=True):

            def cupy_array(memory: Any, shape: Any = shape, d: Any = d, offset: int = offset) -> Any:
                return cupy.ndarray(shape, d, memory + offset if offset else memory)

            makers.append(cupy_array)
    regions = [
        (shape, d, offset, make) for (shape, _), d, offset, make in zip(outputs, dtypes, offsets, makers, strict=True)
    ]
    return {"codes": regions[0], "scale": regions[1], "zero_point": regions[2] if len(regions) > 2 else None}


def quantize(
    x: Any,
    dtype: ElementKind | str = "int8",
    *,
    scope: Scope | None = None,
    group_size: int | None = None,
    axis: int | None = None,
    asymmetric: bool = False,
    scale: Any = None,
    zero_point: Any = None,
    q_min: int | None = None,
    q_max: int | None = None,
    rounding: Rounding = Rounding.NEAREST_EVEN,
    seed: int | None = None,
    offset: int = 0,
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST,
    nonfinite: str = "propagate",
    **block_options: Any,
) -> QuantizedTensor | BlockQuantizedTensor:
    """Quantize ``x`` to ``dtype`` codes; the scale comes from the data unless one is given.

    **Block-scaled formats** (``dtype`` ``"mxfp8"`` (= ``"mxfp8_e4m3"``), ``"mxfp8_e5m2"``,
    ``"mxfp6_e2m3"``, ``"mxfp6_e3m2"``, ``"mxfp4"``, ``"mxint8"``, ``"nvfp4"``, ``"fp8_block"``
    (= ``"fp8_block_e4m3"``), ``"fp8_block_e5m2"``): a :class:`BlockQuantizedTensor` from
    :class:`~quantplan.BlockScaledQuantizePlan` (docs/block_scaled.md), with the options
    ``axis`` (the block axis, default -1), ``block`` ((32, 32) MXFP8, (16, 16) NVFP4, (1, 128) /
    (128, 128) FP8 blocks), ``layout`` (``"compact"``, ``"blocked"``, ``"column_major"``,
    ``"packed_ue8m0"``), ``scale_mode`` (MX ``"rceil"`` / ``"floor"`` / ``"ceil"`` / ``"even"``; NVFP4
    ``"te"`` / ``"torchao"``; FP8 ``"div"`` / ``"mul_rcp"`` / ``"enc"``), ``scale_format`` (FP8
    blocks: ``"f32"`` or ``"ue8m0"``), ``amax_floor`` (FP8 blocks), ``two_level`` and
    ``global_amax`` (NVFP4), ``rounding`` / ``seed`` / ``offset`` (NVFP4, MX float elements) and
    ``nonfinite`` (``block_options``: the keywords beyond the affine ones). ``scope``,
    ``group_size``, ``asymmetric``, ``scale``, ``zero_point``, ``q_min``, ``q_max`` and
    ``nibble_order`` do not apply to them.

    Dynamic range (no ``scale``): symmetric ``scale = amax / q_max`` (FP8: ``amax / fp8_max``),
    asymmetric ``scale = (hi - lo) / (q_max - q_min)`` with ``lo = min(min x, 0)``,
    ``hi = max(max x, 0)`` and ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``, per segment of
    the scope; then ``q = clamp(rne(x / scale) + zp, q_min, q_max)``. Static (``scale`` given, and
    ``zero_point`` for asymmetric): the same last formula with the given parameters. This is
    :class:`~quantplan.DynamicRangeQuantizePlan` / :class:`~quantplan.QuantizePlan`, bit for bit.

    **NaN and +-Inf:** with a scale from the data, a segment (the tensor, a row, a group, a
    channel: whatever shares one scale) that holds a NaN or +-Inf gets ``scale = NaN`` (zero point
    0) and every code of it is the zero point, so the whole segment dequantizes to NaN, not just
    the bad element. With a static ``scale``, a NaN element alone gets the zero point (it
    dequantizes to 0; FP8 codes keep NaN) and +-Inf clamps to ``q_min`` / ``q_max``.
    ``nonfinite`` says what to do when a scale of the result (computed or given) is not finite:
    ``"propagate"`` (default: nothing, no cost),
    ``"warn"`` (a RuntimeWarning naming the first bad segment) or ``"raise"``
    (:class:`~quantplan.InvalidProblem`, the outputs discarded). The check copies the scales to
    the host after the kernel: on CUDA a device-to-host copy and a stream sync per call, so opt in
    for debugging, not in a hot loop.

    **When to use:** one call in a notebook or script; see the module docstring for hot loops.

    **Dtypes:** ``x`` float16, bfloat16, float32 or float64 (NumPy, CuPy, PyTorch); ``dtype`` one of
    ``"int8"``, ``"uint8"``, ``"int4"``, ``"uint4"``, ``"fp8_e4m3"``, ``"fp8_e5m2"`` or an
    :class:`~quantplan.ElementKind`. A static ``scale`` is a Python float (tensor scope) or an array
    of the scope's parameter shape of the same library: float32 (float64 for float64 data), or
    another float dtype, which is rounded to that one (a float64 scale for float32 data becomes
    float32, round to nearest even) and returned so in the result. A non-array ``x`` or ``scale``
    (a list) raises :class:`~quantplan.InvalidArgumentType`.

    **Shape limits:** any rank; ``group_size`` must divide the last axis; ``axis`` picks a channel
    scope. Exactly one of ``scope``, ``group_size``, ``axis`` (or none: one scale for the tensor).

    **Precision guarantee:** as the plans: float32 arithmetic (float64 for float64), IEEE division,
    round half to even (or Philox stochastic rounding with ``rounding=Rounding.STOCHASTIC``, from
    ``seed`` and ``offset``); deterministic.
    """
    if type(x) not in _UNTRACED and _traced(x):  # torch.compile: through the torch.library operators
        from quantplan import _torch_ops

        code = _kind(dtype, CODE_NAMES, "dtype")
        given = (scope, group_size, axis, asymmetric, scale, zero_point, q_min, q_max, rounding, seed, offset)
        return _torch_ops.quantize(QuantizedTensor, x, code, *given, nibble_order)  # type: ignore[no-any-return]
    replay_key: tuple[Any, ...] | None = None
    if scale is None and zero_point is None and rounding is _NEAREST and seed is None and not block_options:
        # A dynamic call like an earlier one: replayed (allocate, launch) without this layer
        # (array_signature and replayed, inlined: this is the one-liner's hot path). The key does
        # not hold the block-scaled options (block, layout, ...): a call that passes any is never
        # replayed, or it would meet the replay of the plain call of the same x and name.
        try:
            replay_key = (
                quantize,
                type(x),
                x.dtype,
                x.shape,
                dtype,
                scope_type if (scope_type := type(scope)) in _PLAIN_SCOPES else (scope_type, *scope.__dict__.values()),
                group_size,
                axis,
                asymmetric,
                q_min,
                q_max,
                nibble_order,
                nonfinite,
            )
            fast = _THREAD.plans.get(replay_key)  # type: ignore[union-attr]
        except (AttributeError, TypeError):  # not an array or a scope; no plan cache yet; an unhashable argument
            fast = None
        if fast is not None:
            result = fast(x)
            if result is not None:
                return result  # type: ignore[no-any-return]
    if type(dtype) is str and dtype in BLOCK_NAMES:
        return _quantize_block_scaled(
            x, dtype, scope, group_size, axis, asymmetric, scale, zero_point, q_min, q_max, rounding, seed, offset,
            nibble_order, nonfinite, block_options, replay_key,
        )  # fmt: skip
    if block_options:
        unknown = ", ".join(f"{name}=" for name in block_options)
        raise InvalidProblem(
            f"{unknown}: quantize() takes these keywords only for the block-scaled formats "
            f"({', '.join(BLOCK_NAMES)}), not for dtype={dtype!r}"
        )
    replayable = replay_key is not None
    if nonfinite not in NONFINITE:
        raise InvalidProblem(f"nonfinite={nonfinite!r}: pass one of {', '.join(map(repr, NONFINITE))}")
    target = Target.of(x, None if scale is None or isinstance(scale, (int, float)) else scale, names=("x", "scale"))
    if target.library != TORCH:
        _UNTRACED.add(type(x))
    x = target.contiguous(x)
    float_kind = _float_kind(x)
    code_kind = _kind(dtype, CODE_NAMES, "dtype")
    chosen = _scope(scope, group_size, axis)
    dynamic = scale is None
    if dynamic and zero_point is not None:
        raise InvalidProblem("zero_point= goes with a static scale=; without a scale both come from the data")
    mode = QuantMode.ASYMMETRIC if (asymmetric or zero_point is not None) else QuantMode.SYMMETRIC
    if not dynamic and mode is QuantMode.ASYMMETRIC and zero_point is None:
        raise InvalidProblem("asymmetric=True with a static scale= needs zero_point= too")
    rng_seed, rng_offset = _rng(rounding, seed, offset)
    shape = tuple(x.shape)
    key = (dynamic, shape, float_kind, code_kind, chosen, mode, q_min, q_max, rounding, nibble_order)
    fields = dict(
        shape=shape,
        scope=chosen,
        mode=mode,
        input_element=float_kind,
        output_element=code_kind,
        q_min=q_min,
        q_max=q_max,
        nibble_order=nibble_order,
        rounding=rounding,
    )
    arg = target.arg
    if dynamic:
        job = _quantizer(target, key, DynamicRangeQuantizeDescriptor, DynamicRangeQuantizePlan, fields)
        outputs = [(job.codes_shape, job.codes_dtype), (job.param_shape, job.param_dtype)]
        if mode is QuantMode.ASYMMETRIC:
            outputs.append((job.param_shape, "int32"))
        (codes, scale_out, *zp), ws = target.empty_many(outputs, job.plan.workspace_size())  # CuPy: one allocation
        zp_out = zp[0] if zp else None
        args: Any = DynamicRangeQuantizeArgs(arg(x), arg(codes), arg(scale_out), arg(zp_out), rng_seed, rng_offset)
        target.run(job.plan, args, ws)
        deq = job.dequantize
        if replayable and math.prod(shape):  # the replay allocates `outputs` as above
            if nonfinite != "propagate":  # the replay does the opt-in check (stack: finish, replay, quantize)

                def finish(x: Any, codes: Any, scale: Any, zp: Any = None) -> QuantizedTensor:
                    qt = QuantizedTensor(_codes_view(target, codes, code_kind), scale, zp, deq)
                    return _check_scales(qt, nonfinite, 4)

            elif target.cuda:  # the arrays made when first read (FP8 codes: uint8 in CuPy, float8 in PyTorch)
                layout = _packed_layout(outputs, target.library, code_kind)

                def packed(x: Any, memory: Any, stream: int, spare: Any) -> QuantizedTensor:
                    qt = _new(_Packed)
                    state = {
                        "descriptor": deq,
                        "_memory": memory,
                        "_layout": layout,
                        "_stream": stream,
                        "_spare": spare,
                    }
                    _set_fields(qt, "__dict__", state)
                    return qt  # type: ignore[no-any-return]

                remember_replay(
                    replay_key, target, lambda: replay(target, job.plan, args, 1, outputs, packed, memory=True)
                )
                return QuantizedTensor(_codes_view(target, codes, code_kind), scale_out, zp_out, deq)
            elif _CODE_TYPE_NAMES.get(code_kind) is None or target.library not in (TORCH, "numpy"):

                def finish(x: Any, codes: Any, scale: Any, zp: Any = None) -> QuantizedTensor:
                    # QuantizedTensor(codes, scale, zp, deq) without the frozen dataclass's four setattr calls
                    qt = _new(QuantizedTensor)
                    _set_fields(qt, "__dict__", {"codes": codes, "scale": scale, "zero_point": zp, "descriptor": deq})
                    return qt  # type: ignore[no-any-return]

            else:  # FP8 codes typed as float8

                def finish(x: Any, codes: Any, scale: Any, zp: Any = None) -> QuantizedTensor:
                    return QuantizedTensor(_codes_view(target, codes, code_kind), scale, zp, deq)

            remember_replay(replay_key, target, lambda: replay(target, job.plan, args, 1, outputs, finish))
        result = QuantizedTensor(_codes_view(target, codes, code_kind), scale_out, zp_out, deq)
        return result if nonfinite == "propagate" else _check_scales(result, nonfinite, 2)
    job = _quantizer(target, key, _static_quantize.QuantizeDescriptor, _static_quantize.QuantizePlan, fields)
    if not isinstance(scale, (int, float)):
        scale_dtype = dtype_name(scale)
        if scale_dtype != job.param_dtype and scale_dtype in _FLOAT_SCALE_DTYPES:
            scale = _as_dtype(target, scale, job.param_dtype)  # rounded to the parameters' precision
    codes = target.empty(job.codes_shape, job.codes_dtype)
    args = _static_quantize.QuantizeArgs(arg(x), arg(codes), arg(scale), arg(zero_point), rng_seed, rng_offset)
    target.run_with_workspace(job.plan, args)
    result = QuantizedTensor(_codes_view(target, codes, code_kind), scale, zero_point, job.dequantize)
    return result if nonfinite == "propagate" else _check_scales(result, nonfinite, 2, given=True)


def _quantize_block_scaled(
    x: Any,
    dtype: str,
    scope: Any,
    group_size: Any,
    axis: int | None,
    asymmetric: bool,
    scale: Any,
    zero_point: Any,
    q_min: Any,
    q_max: Any,
    rounding: Rounding,
    seed: int | None,
    offset: int,
    nibble_order: NibbleOrder,
    nonfinite: str,
    options: dict[str, Any],
    replay_key: Any,
) -> BlockQuantizedTensor:
    """``quantize`` of a block-scaled format: the affine options refused, the rest passed on."""
    affine = dict(scope=scope, group_size=group_size, scale=scale, zero_point=zero_point, q_min=q_min, q_max=q_max)
    given = [name for name, value in affine.items() if value is not None]
    given += ["asymmetric"] if asymmetric else []
    given += ["nibble_order"] if nibble_order is not NibbleOrder.LOW_FIRST else []
    if given:
        raise InvalidProblem(
            f"dtype={dtype!r} is block-scaled (scales from each block); {', '.join(given)} apply to the affine formats"
        )
    unknown = sorted(set(options) - set(BLOCK_OPTIONS))
    if unknown:
        raise InvalidProblem(
            f"quantize(x, {dtype!r}) got unknown keyword(s) {', '.join(unknown)}; the block-scaled options are "
            f"{', '.join(BLOCK_OPTIONS)}"
        )
    if nonfinite not in NONFINITE:
        raise InvalidProblem(f"nonfinite={nonfinite!r}: pass one of {', '.join(map(repr, NONFINITE))}")
    return quantize_block(
        x, dtype, axis=axis, rounding=rounding, seed=seed, offset=offset, nonfinite=nonfinite, replay_key=replay_key,
        **options,
    )  # fmt: skip


def dequantize(qt: QuantizedTensor | BlockQuantizedTensor, dtype: ElementKind | str | None = None) -> Any:
    """``y = (codes - zero_point) * scale`` rounded once to ``dtype`` (default: the dtype quantized).

    A ``dtype`` of another precision than the data quantized (float32 output of float64 data, or the
    reverse) first rounds the scale to that precision's parameter type (float32 / float64).

    This is :class:`~quantplan.DequantizePlan`, bit for bit: float32 arithmetic (float64 for
    float64 output). **Dtypes:** ``dtype`` float16, bfloat16, float32, float64 (short names or
    ElementKind). The output is a new array of the codes' library and device.
    """
    if (
        type(qt) is QuantizedTensor and type(qt.codes) not in _UNTRACED and _traced(qt.codes)
    ):  # torch.compile: through the torch.library operator
        from quantplan import _torch_ops

        out_kind = qt.descriptor.output_element if dtype is None else _kind(dtype, FLOAT_NAMES, "dtype")
        return _torch_ops.dequantize(qt, out_kind)
    replay_key: tuple[Any, ...] | None = None
    packed: dict[str, Any] | None = None
    if type(qt) is _Packed:
        # The result of a replayed CUDA quantize: the replay reads its regions' pointers from its one
        # allocation, so none of its arrays is made. The key holds the ids of the descriptor and the
        # layout (the same per problem), which the remembered replay keeps alive.
        packed = qt.__dict__
        try:
            replay_key = (dequantize, id(qt.descriptor), dtype, id(packed["_layout"]))
            fast = _THREAD.plans.get(replay_key)  # type: ignore[union-attr]
        except (AttributeError, TypeError):  # no plan cache yet; an unhashable dtype
            replay_key = fast = None
        if fast is not None:
            result = fast(packed["_memory"])
            if result is not None:
                return result
    elif type(qt) is QuantizedTensor:
        # A call like an earlier one: replayed (allocate, launch) without this layer. The key holds
        # the descriptor's id (hashing a descriptor costs microseconds); the remembered replay keeps
        # that descriptor alive, so no other object can have its id while the entry exists.
        codes, scale, zp = qt.codes, qt.scale, qt.zero_point
        try:
            replay_key = (
                dequantize,
                id(qt.descriptor),
                dtype,
                type(codes),
                codes.dtype,
                codes.shape,
                type(scale),
                scale.dtype,
                scale.shape,
                None if zp is None else (type(zp), zp.dtype, zp.shape),
            )
            fast = _THREAD.plans.get(replay_key)  # type: ignore[union-attr]
        except (AttributeError, TypeError):  # a Python scale; no plan cache yet; an unhashable dtype
            replay_key = fast = None
        if fast is not None:
            result = fast(codes, scale) if zp is None else fast(codes, scale, zp)
            if result is not None:
                return result
    if not isinstance(qt, QuantizedTensor):
        if isinstance(qt, BlockQuantizedTensor):
            return dequantize_block(qt, dtype)
        raise InvalidArgumentType(f"dequantize takes a QuantizedTensor (from qp.quantize), got {type(qt).__name__}")
    desc = qt.descriptor
    out_kind = desc.output_element if dtype is None else _kind(dtype, FLOAT_NAMES, "dtype")
    target = Target.of(qt.codes, None if isinstance(qt.scale, (int, float)) else qt.scale)
    if target.library != TORCH:
        _UNTRACED.add(type(qt.codes))
    key = (_static_quantize.DequantizePlan, desc, out_kind)

    def build() -> Any:
        d = desc if out_kind is desc.output_element else desc.model_copy(update={"output_element": out_kind})
        return target.select(_static_quantize.DequantizePlan, d)

    plan = target.cached(key, build)
    out_dtype = (
        "uint16" if out_kind is ElementKind.BF16 and target.library == "cupy" else ELEMENTS[out_kind].numpy_dtype.name
    )
    y = target.empty(desc.shape, out_dtype)
    scale = qt.scale
    param_dtype = _SCALE_DTYPES[desc.input_element, out_kind]
    if not isinstance(scale, (int, float)) and dtype_name(scale) != param_dtype:
        # dequantizing to another precision: the scale is rounded to that precision's parameter type
        scale = _as_dtype(target, scale, param_dtype)
    codes = qt.codes
    if ELEMENTS[desc.input_element].is_fp8 and target.library == TORCH:
        codes = target.view(codes, "uint8")  # a CPU float8 tensor has no NumPy view
    args = _static_quantize.DequantizeArgs(
        target.arg(codes), target.arg(y), target.arg(scale), target.arg(qt.zero_point)
    )
    target.run(plan, args)
    # (A packed result's FP8 codes, viewed as uint8 for PyTorch, keep their region's pointer.)
    if replay_key is not None and (codes is qt.codes or packed) and scale is qt.scale and 0 not in desc.shape:

        def finish(*arrays: Any, _holds: Any = desc) -> Any:  # holds the descriptor the key names by id
            return arrays[-1]

        inputs, order = (2, ("x0", "o0", "x1")) if qt.zero_point is None else (3, ("x0", "o0", "x1", "x2"))
        outputs = [(desc.shape, out_dtype)]
        if packed is not None:  # the inputs: the regions of the quantize call's allocation
            layout = packed["_layout"]
            at = [region[2] for region in (layout["codes"], layout["scale"], layout["zero_point"]) if region]

            def finish_packed(memory: Any, y: Any, _holds: Any = (desc, layout)) -> Any:  # the ids the key names
                return y

            remember_replay(
                replay_key,
                target,
                lambda: replay(target, plan, args, inputs, outputs, finish_packed, order, packed_inputs=at),
            )
        else:
            remember_replay(replay_key, target, lambda: replay(target, plan, args, inputs, outputs, finish, order))
    return y


def fake_quantize(
    x: Any,
    scale: Any,
    zero_point: Any = None,
    *,
    scope: Scope | None = None,
    axis: int | None = None,
    q_min: int = -128,
    q_max: int = 127,
) -> Any:
    """``y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale`` with ``inv = 1 / scale`` (f32).

    PyTorch's ``torch.fake_quantize_per_tensor_affine`` / ``_per_channel_affine`` bit for bit, as
    :class:`~quantplan.FakeQuantizePlan` (for autograd, use :mod:`quantplan.pytorch`).

    **When to use:** a QAT forward outside autograd, or to see what quantization does to a tensor.

    **Dtypes:** ``x`` float16, bfloat16, float32, float64; ``scale`` a Python float (tensor scope)
    or an array of the scope's parameter shape (float32; float64 for float64 data); ``zero_point``
    None (symmetric), a Python int, or an int32 (or float, learnable-style) array.

    **Shape limits:** any rank; ``axis=k`` is ``ChannelScope(k)``; default one scale for the tensor.
    """
    if type(x) not in _UNTRACED and _traced(x):  # torch.compile: through the quantplan::fake_quantize operator
        from quantplan import pytorch

        return pytorch.traced_functional_fake_quantize(x, scale, zero_point, scope, axis, q_min, q_max)
    # A call like an earlier one: replayed (allocate, launch) without this layer. Python scalars
    # are keyed by type and value (the launch holds them), arrays by type, dtype and shape.
    replay_key: tuple[Any, ...] | None = None
    plain = type(scale) is float or type(scale) is int, zero_point is None or type(zero_point) is int
    try:
        replay_key = (
            fake_quantize,
            type(x),
            x.dtype,
            x.shape,
            type(scale),
            scale if plain[0] else (scale.dtype, scale.shape),
            type(zero_point),
            zero_point if plain[1] else (zero_point.dtype, zero_point.shape),
            scope_type if (scope_type := type(scope)) in _PLAIN_SCOPES else (scope_type, *scope.__dict__.values()),
            axis,
            q_min,
            q_max,
        )
        fast = _THREAD.plans.get(replay_key)  # type: ignore[union-attr]
    except (AttributeError, TypeError):  # not an array; no plan cache yet; an unhashable argument
        replay_key = fast = None
    if fast is not None:
        arrays = [a for a, is_plain in zip((scale, zero_point), plain, strict=True) if not is_plain]
        result = fast(x, *arrays)
        if result is not None:
            return result
    target = Target.of(
        x,
        None if isinstance(scale, (int, float)) else scale,
        None if zero_point is None or isinstance(zero_point, (int, float)) else zero_point,
        names=("x", "scale", "zero_point"),
    )
    if target.library != TORCH:
        _UNTRACED.add(type(x))
    x = target.contiguous(x)
    kind = _float_kind(x)
    chosen = _scope(scope, None, axis)
    mode = QuantMode.SYMMETRIC if zero_point is None else QuantMode.ASYMMETRIC
    shape = tuple(x.shape)
    key = (FakeQuantizePlan, shape, kind, chosen, mode, q_min, q_max)
    plan = target.plan(
        FakeQuantizePlan,
        key,
        lambda: FakeQuantizeDescriptor(shape=shape, scope=chosen, mode=mode, element=kind, q_min=q_min, q_max=q_max),
    )
    y = target.empty(shape, dtype_name(x))
    if math.prod(shape):
        args = FakeQuantizeArgs(target.arg(x), target.arg(y), target.arg(scale), target.arg(zero_point))
        target.run(plan, args)
        if replay_key is not None:
            order = ["x0", "o0"] + [f"x{n + 1}" for n in range(2 - sum(plain))]
            outputs = [(shape, dtype_name(x))]
            remember_replay(
                replay_key, target, lambda: replay(target, plan, args, len(order) - 1, outputs, _last, order)
            )
    return y


def _last(*arrays: Any) -> Any:
    """A replayed call's result: its last array (the output)."""
    return arrays[-1]


__all__ = [
    "CODE_NAMES",
    "FLOAT_NAMES",
    "NONFINITE",
    "BlockQuantizedTensor",
    "QuantizedTensor",
    "dequantize",
    "fake_quantize",
    "quantize",
]
