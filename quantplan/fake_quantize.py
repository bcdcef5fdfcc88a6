"""Fake quantization for quantization-aware training: FakeQuantizePlan and FakeQuantizeBackwardPlan.

Formulas (SPEC section 4, PyTorch's ``fake_quantize_per_tensor_affine`` /
``fake_quantize_per_channel_affine``; arithmetic in float32, float64 for F64 data; each operation
rounded, no FMA; rne = round half to even):

* ``inv = rn(1 / scale)``; ``q = rne(x * inv) + zp`` (a NaN ``q`` counts as below ``q_min``:
  PyTorch's CUDA kernels convert it to int64, which gives INT64_MIN);
* forward: ``y = (clamp(q, q_min, q_max) - zp) * scale``, rounded once more to the data type;
* straight-through backward: ``dx = dy * (q_min <= q <= q_max)`` (inclusive);
* learnable (LSQ, PyTorch's ``_fake_quantize_learnable_per_*_affine_backward``), with ``gf`` the
  grad factor: inside the range ``dscale_i = ((dy * (y - x)) * inv) * gf``, ``dzp_i = 0``; below /
  above ``dscale_i = (dy * (q_min - zp)) * gf`` / ``(dy * (q_max - zp)) * gf`` and
  ``dzp_i = ((-dy) * scale) * gf``; ``dscale`` / ``dzp`` are the sums over each segment.

Kernels: ``kernels/fake_quantize.cu`` (+ ``qp_fake_quantize.cuh``); reference:
:func:`quantplan.reference.fake_quantize`, ``fake_quantize_ste``, ``fake_quantize_lsq``; tests:
``tests/test_fake_quantize_*.py`` and ``tests/test_reference_fake_quantize.py``.
"""

from __future__ import annotations

import ctypes
import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from . import reference
from ._affine import OperandChecks, ScopedProblem, choose_backend
from ._device import device_info, stream_device_id
from ._launch import PreparedLaunch, launch_on, stream_handle
from ._layout import (
    BLOCK_THREADS,
    UNROLL,
    RowLayout,
    RowLayoutArgs,
    contiguous_segment_length,
    param_shape,
    row_layout,
)
from ._operands import Operand, is_scalar, overlaps, same_or_disjoint
from .compiler import compile_options, load_kernels, register_family, template_name
from .elements import ELEMENTS, FLOAT_KINDS, ElementInfo, param_element, param_numpy_dtype
from .errors import InvalidProblem, Unsupported
from .types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
    Scope,
    TensorScope,
)
from .workspace import Workspace, check_workspace

_FAMILY = "fake_quantize"
_FROZEN = ConfigDict(frozen=True, extra="forbid")
#: Largest |q_min|, |q_max|: integers up to 2**24 are exact in float32, so clamp and subtraction are exact.
CODE_LIMIT = 2**24
#: ZeroPointSource of ``qp_fake_quantize.cuh``: the scalar value, an int32 array, a float array.
_ZP_VALUE, _ZP_INT32, _ZP_FLOAT = 0, 1, 2


class FakeOp(enum.IntEnum):
    """What an elementwise fake-quantization kernel computes (``FakeOp`` of ``kernels/fake_quantize.cu``)."""

    NEAREST = 0  #: y = fake(x), rne
    STE = 1  #: dx = dy * mask
    STOCHASTIC = 2  #: y = fake(x), Philox stochastic rounding


#: The row kernel of each FakeOp.
_ROW_KERNELS = {
    FakeOp.NEAREST: "fake_quantize_rows",
    FakeOp.STE: "fake_quantize_ste_rows",
    FakeOp.STOCHASTIC: "fake_quantize_stochastic_rows",
}
_RNG_FIELDS = [
    ("seed_ptr", ctypes.c_uint64),
    ("offset_ptr", ctypes.c_uint64),
    ("seed_value", ctypes.c_uint64),
    ("offset_value", ctypes.c_uint64),
]


class FakeQuantizeDescriptor(BaseModel):
    """A fake quantization problem: ``y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale``.

    Fields: ``shape`` (any rank); ``scope`` (Tensor / Token / Channel / GroupScope); ``mode``
    SYMMETRIC (zero point 0, ``zero_point=None``) or ASYMMETRIC (a zero point is given);
    ``element`` F16, BF16, F32 or F64 (input and output); ``q_min`` / ``q_max`` the integer range
    (e.g. 0 / 255, -128 / 127; any integers with ``q_min <= q_max`` and magnitude at most 2**24).

    ``param_shape``: the shape of ``scale`` / ``zero_point`` (SPEC section 3).
    """

    model_config = _FROZEN
    shape: tuple[int, ...]
    scope: Scope
    mode: QuantMode = QuantMode.SYMMETRIC
    element: ElementKind
    q_min: int
    q_max: int

    @property
    def param_shape(self) -> tuple[int, ...]:
        """Shape of ``scale`` / ``zero_point``."""
        return param_shape(self.shape, self.scope)


class FakeQuantizeBackwardDescriptor(FakeQuantizeDescriptor):
    """The gradient of a :class:`FakeQuantizeDescriptor` problem.

    ``learnable=False``: the straight-through estimator, ``dx = dy * (q_min <= q <= q_max)``.
    ``learnable=True``: also ``dscale`` (and ``dzero_point`` for ASYMMETRIC) by the LSQ formulas
    PyTorch's ``_fake_quantize_learnable_per_*_affine_backward`` use, summed per segment.
    """

    learnable: bool = False


@dataclass(frozen=True)
class FakeQuantizeProblem(ScopedProblem):
    """A validated fake quantization problem (``float_kind``: the data type, in and out)."""

    shape: tuple[int, ...]
    scope: Scope
    mode: QuantMode
    float_kind: ElementKind
    q_min: int
    q_max: int


def fake_quantize_problem(desc: FakeQuantizeDescriptor) -> FakeQuantizeProblem:
    """Validate a (forward or backward) descriptor; raise InvalidProblem if malformed."""
    if any(e < 0 for e in desc.shape):
        raise InvalidProblem(f"shape {desc.shape} has a negative extent")
    if not ELEMENTS[desc.element].is_float:
        raise InvalidProblem(f"element must be one of F16, BF16, F32, F64, got {desc.element.name}")
    param_shape(desc.shape, desc.scope)  # validates axis and group divisibility
    if desc.q_min > desc.q_max:
        raise InvalidProblem(f"q_min={desc.q_min} > q_max={desc.q_max}; q_min must not exceed q_max")
    if max(abs(desc.q_min), abs(desc.q_max)) > CODE_LIMIT:
        raise InvalidProblem(
            f"q_min={desc.q_min}, q_max={desc.q_max}: codes must lie within +-2**24 (exact in float32)"
        )
    return FakeQuantizeProblem(tuple(desc.shape), desc.scope, desc.mode, desc.element, desc.q_min, desc.q_max)


@dataclass(slots=True)
class FakeQuantizeArgs:
    """Arguments of :class:`FakeQuantizePlan`.

    ``input`` and ``output`` (same shape and dtype; ``output`` may be ``input`` itself: in place);
    ``scale``: float32 array of ``param_shape`` (float64 for F64), or a Python float / one-element
    array for TensorScope; ``zero_point``: None for SYMMETRIC; for ASYMMETRIC an int32 array, or a
    float array of the scale's dtype (a learnable zero point: rounded half to even and clamped to
    ``[q_min, q_max]``), or a Python int / float for TensorScope.
    """

    input: Any
    output: Any
    scale: Any
    zero_point: Any = None


@dataclass(slots=True)
class FakeQuantizeBackwardArgs:
    """Arguments of :class:`FakeQuantizeBackwardPlan`.

    ``input`` (the forward's input), ``grad_output`` (dy, same shape and dtype), ``grad_input``
    (dx, written; may be ``grad_output`` itself), ``scale`` / ``zero_point`` as in
    :class:`FakeQuantizeArgs`. Learnable plans also write ``grad_scale`` (and ``grad_zero_point``
    for ASYMMETRIC), arrays of ``param_shape`` in the scale's dtype, and take ``grad_factor``
    (LSQ's gradient scale, e.g. ``1 / sqrt(numel * q_max)``; 1.0 by default).
    """

    input: Any
    grad_output: Any
    grad_input: Any
    scale: Any
    zero_point: Any = None
    grad_scale: Any = None
    grad_zero_point: Any = None
    grad_factor: float = 1.0


def _acc_type(precision: MathPrecision) -> type[ctypes.c_float] | type[ctypes.c_double]:
    return ctypes.c_double if precision is MathPrecision.F64 else ctypes.c_float


def _struct(name: str, fields: list[tuple[str, Any]]) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def _row_params(precision: MathPrecision, op: FakeOp) -> type[ctypes.Structure]:
    """Argument block of the row kernel of ``op`` (``_ROW_KERNELS``)."""
    data = (
        [("x", ctypes.c_uint64)] + ([("dy", ctypes.c_uint64)] if op is FakeOp.STE else []) + [("out", ctypes.c_uint64)]
    )
    return _struct(
        "FakeRowParams",
        data
        + [
            ("scale_ptr", ctypes.c_uint64),
            ("zp_ptr", ctypes.c_uint64),
            ("scale_value", _acc_type(precision)),
            ("zp_value", ctypes.c_int32),
            ("layout", RowLayoutArgs),
        ]
        + (_RNG_FIELDS if op is FakeOp.STOCHASTIC else []),
    )


class LsqLayoutArgs(ctypes.Structure):
    """``struct LsqLayout`` of ``kernels/fake_quantize.cu``, field for field (passed by value)."""

    _fields_ = [
        ("segments", ctypes.c_int64),
        ("items", ctypes.c_int64),
        *(
            (name, ctypes.c_int32)
            for name in ("S", "chunk", "chunks_per_segment", "team_log2", "q_min", "q_max", "zp_source", "pad")
        ),
    ]


def _lsq_params(precision: MathPrecision) -> type[ctypes.Structure]:
    return _struct(
        "LsqParams",
        [
            ("x", ctypes.c_uint64),
            ("dy", ctypes.c_uint64),
            ("dx", ctypes.c_uint64),
            ("scale_ptr", ctypes.c_uint64),
            ("zp_ptr", ctypes.c_uint64),
            ("grad_factor", _acc_type(precision)),
            ("grad_scale", ctypes.c_uint64),
            ("grad_zp", ctypes.c_uint64),
            ("partials", ctypes.c_uint64),
            ("layout", LsqLayoutArgs),
        ],
    )


_FINISH_PARAMS = _struct(
    "LsqFinishParams",
    [
        ("partials", ctypes.c_uint64),
        ("grad_scale", ctypes.c_uint64),
        ("grad_zp", ctypes.c_uint64),
        ("segments", ctypes.c_int64),
        ("chunks_per_segment", ctypes.c_int32),
    ],
)
_ROW_PARAMS = {(p, op): _row_params(p, op) for p in MathPrecision for op in FakeOp}
_FLAT_PARAMS = {
    p: _struct(
        "FakeFlatParams",
        [
            ("x", ctypes.c_uint64),
            ("dy", ctypes.c_uint64),
            ("out", ctypes.c_uint64),
            ("scale_ptr", ctypes.c_uint64),
            ("zp_ptr", ctypes.c_uint64),
            ("scale_value", _acc_type(p)),
            ("zp_value", ctypes.c_int32),
            ("zp_source", ctypes.c_int32),
            ("q_min", ctypes.c_int32),
            ("q_max", ctypes.c_int32),
            ("n", ctypes.c_int64),
            ("per_thread", ctypes.c_int32),
            *_RNG_FIELDS,
        ],
    )
    for p in MathPrecision
}
#: Vectors one thread of ``fake_quantize_flat`` takes per tile (kFakeUnroll in the kernel).
_FLAT_UNROLL = 4
#: Most blocks of one ``fake_quantize_flat`` launch (grid-stride beyond).
_FLAT_MAX_BLOCKS = 1 << 20
_LSQ_PARAMS = {p: _lsq_params(p) for p in MathPrecision}


def _vec_max(element: ElementKind) -> int:
    return 4 if element is ElementKind.F64 else 8


def _widths(element: ElementKind) -> list[int]:
    return [v for v in (8, 4, 2, 1) if v <= _vec_max(element)]


def fake_quantize_unit(element: ElementKind) -> list[str]:
    """The elementwise and learnable kernels of one data type: the row kernel of every FakeOp at
    each vector width, the flat TensorScope kernel of every FakeOp (widest vector, and 1), the
    learnable backward at each width with vector and element I/O, and its finishing sum."""
    tag = ELEMENTS[element].cpp_tag
    acc = "double" if element is ElementKind.F64 else "float"
    widths = _widths(element)
    rows = [template_name(k, tag, v, True) for k in _ROW_KERNELS.values() for v in widths]
    flat = [template_name("fake_quantize_flat", tag, v, int(op)) for v in (widths[0], 1) for op in FakeOp]
    lsq = [template_name("fake_quantize_lsq_segments", tag, v, io) for v in widths for io in (True, False)]
    return [*rows, *flat, *lsq, template_name("fake_quantize_lsq_finish", acc)]


def dynamic_fake_quantize_unit(element: ElementKind) -> list[str]:
    """The fused single pass of DynamicRangeFakeQuantizePlan for one data type: each vector width
    (the widest dividing the segment; 1 for misaligned operands), nearest and stochastic."""
    tag = ELEMENTS[element].cpp_tag
    return [
        template_name("dynamic_fake_quantize_segments", tag, v, True, stochastic)
        for v in _widths(element)
        for stochastic in (False, True)
    ]


@register_family(_FAMILY)
def fake_quantize_units() -> list[list[str]]:
    """Compile units of ``kernels/fake_quantize.cu``: per float data type, the elementwise and
    learnable kernels, and the dynamic-range fused pass."""
    return [unit(k) for unit in (fake_quantize_unit, dynamic_fake_quantize_unit) for k in FLOAT_KINDS]


@dataclass(frozen=True)
class LsqGeometry:
    """Launch geometry of the learnable backward: ``segments`` contiguous segments of ``length``
    elements, cut into chunks of ``chunk`` elements, one team of ``team`` threads per chunk.

    Chosen from the segment length and data type alone, so the order of every sum (hence every
    result bit) is the same on every GPU and for misaligned operands (element-I/O twin).
    """

    segments: int
    length: int
    vec: int
    team: int
    chunk: int

    @property
    def chunks_per_segment(self) -> int:
        return max(1, -(-self.length // self.chunk))

    @property
    def items(self) -> int:
        return self.segments * self.chunks_per_segment

    def args(self, q_min: int, q_max: int) -> LsqLayoutArgs:
        return LsqLayoutArgs(
            self.segments,
            self.items,
            self.length,
            self.chunk,
            self.chunks_per_segment,
            int(math.log2(self.team)),
            q_min,
            q_max,
            0,
            0,
        )

    def describe(self) -> str:
        return f"lsq-segments[{self.team}t-per-chunk,vec{self.vec},{self.chunks_per_segment}chunks-per-segment]"


def lsq_geometry(shape: tuple[int, ...], scope: Scope, element: ElementKind) -> LsqGeometry | None:
    """The learnable backward's geometry, or None where segments are not contiguous runs."""
    dims = shape if shape else (1,)
    length = contiguous_segment_length(dims, scope)
    if length is None or length == 0:
        return None
    vec = _vec_max(element)
    while length % vec:
        vec //= 2
    team = 1
    while team < BLOCK_THREADS and team * vec * UNROLL < length:
        team *= 2
    return LsqGeometry(math.prod(dims) // length, length, vec, team, team * vec * UNROLL)


class _FakeQuantizePlanBase(OperandChecks):
    """Shared parts of the forward and backward plans: backend, operands, parameters, SKU."""

    _category: OpCategory

    def __init__(
        self,
        problem: FakeQuantizeProblem,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        variant: str,
    ) -> None:
        self.problem = problem
        self.backend = backend
        self.device_id = device_id
        self._arch_name = arch_name
        self._variant = variant
        self._param_shape = problem.param_shape
        self._tensor_scope = isinstance(problem.scope, TensorScope)
        self._info: ElementInfo = ELEMENTS[problem.float_kind]
        self._param_dtype = param_numpy_dtype(problem.precision)

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic (float64 for F64 data), bit-exact to the reference, deterministic."""
        return PrecisionGuarantee(
            math_precision=self.problem.precision, accumulator=param_element(self.problem.precision)
        )

    def sku(self) -> KernelSku:
        """Identity of the selected kernels (variant: scope, mode and layout)."""
        return KernelSku(
            category=self._category,
            op=QuantizeKind.STATIC,
            element=self.problem.float_kind,
            aux_element=self.problem.float_kind,
            variant=self._variant,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- parameters ---------------------------------------------------------------------------

    def _zero_point(self, value: Any) -> tuple[Operand | int, int]:
        """The zero point and its ZeroPointSource."""
        p = self.problem
        if p.mode is QuantMode.SYMMETRIC:
            if value is not None:
                raise InvalidProblem("zero_point must be None in SYMMETRIC mode (the zero point is 0)")
            return 0, _ZP_VALUE
        if value is None:
            raise InvalidProblem("zero_point is required in ASYMMETRIC mode")
        if is_scalar(value):
            if not self._tensor_scope:
                raise InvalidProblem(
                    f"zero_point is a scalar, which only TensorScope takes; pass an array of shape {self._param_shape}"
                )
            if isinstance(value, (int, np.integer)):
                zp = int(value)
                if not p.q_min <= zp <= p.q_max:
                    raise InvalidProblem(f"zero_point={value!r} lies outside [q_min, q_max] = [{p.q_min}, {p.q_max}]")
            else:  # a learnable (float) zero point: in the scale's dtype, rne, clamped, NaN -> q_min
                with np.errstate(over="ignore"):
                    z = float(self._param_dtype.type(value))
                zp = p.q_min if math.isnan(z) else int(min(max(float(np.rint(z)), p.q_min), p.q_max))
            return zp, _ZP_VALUE
        dtype_name = getattr(getattr(value, "dtype", None), "name", str(getattr(value, "dtype", "")))
        if "int" in dtype_name:
            op = self._param(value, "zero_point", np.dtype(np.int32), allow_none=False)
            assert isinstance(op, Operand)
            return op, _ZP_INT32
        op = self._param(value, "zero_point", self._param_dtype, allow_none=False)
        assert isinstance(op, Operand)
        return op, _ZP_FLOAT

    def _data(self, value: Any, name: str) -> Operand:
        return self._tensor(value, name, self.problem.shape, self._info)


def _row_launch(
    problem: FakeQuantizeProblem, layout: RowLayout, name: str, functions: dict[str, Any], op: FakeOp, sm_count: int
) -> PreparedLaunch:
    import cupy

    fn = functions[name]
    per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0)
    return PreparedLaunch(
        fn,
        layout.blocks(max(1, per_sm) * sm_count),
        BLOCK_THREADS,
        _ROW_PARAMS[problem.precision, op],
        layout=layout.args(problem.q_min, problem.q_max),
    )


class FakeRowLaunches:
    """An elementwise kernel with aligned vector I/O and its one-element-vector twin for misaligned
    operands; ``flat``: ``fake_quantize_flat`` (zero-point source in its own argument) rather than
    a row kernel (source in ``layout.flags``)."""

    __slots__ = ("align", "fallback", "flat", "primary")

    def __init__(self, primary: PreparedLaunch, fallback: PreparedLaunch, align: int, flat: bool) -> None:
        self.primary, self.fallback, self.align, self.flat = primary, fallback, align, flat

    def pick(self, *ptrs: int) -> PreparedLaunch:
        return self.primary if all(p % self.align == 0 for p in ptrs) else self.fallback

    def set_params(self, params: Any, scale: Operand | float, zp: Operand | int, zp_source: int) -> None:
        """Write the per-call parameter fields (pointer or value, zero-point source)."""
        if isinstance(scale, Operand):
            params.scale_ptr, params.scale_value = scale.ptr, 1.0
        else:
            params.scale_ptr, params.scale_value = 0, scale
        if isinstance(zp, Operand):
            params.zp_ptr, params.zp_value = zp.ptr, 0
        else:
            params.zp_ptr, params.zp_value = 0, zp
        if self.flat:
            params.zp_source = zp_source
        else:
            params.layout.flags = zp_source

    @staticmethod
    def set_rng(params: Any, seed: Operand | int, offset: Operand | int) -> None:
        """Write the seed and offset of a STOCHASTIC launch (device scalar or value)."""
        params.seed_ptr, params.seed_value = (seed.ptr, 0) if isinstance(seed, Operand) else (0, seed)
        params.offset_ptr, params.offset_value = (offset.ptr, 0) if isinstance(offset, Operand) else (0, offset)


def flat_geometry(n_vectors: int, sm_count: int) -> tuple[int, int]:
    """``(block threads, vectors per thread)`` of ``fake_quantize_flat``: 256 x 4 for large
    tensors; for small ones fewer vectors per thread, then smaller blocks, until the grid has
    two blocks per SM (16 x 8192 bf16: 128 blocks of 128 threads, one vector each)."""
    block, per_thread = BLOCK_THREADS, _FLAT_UNROLL
    while per_thread > 1 and -(-n_vectors // (block * per_thread)) < 2 * sm_count:
        per_thread //= 2
    while block > 64 and -(-n_vectors // (block * per_thread)) < 2 * sm_count:
        block //= 2
    return block, per_thread


def prepare_fake_rows(problem: FakeQuantizeProblem, op: FakeOp, device_id: int) -> tuple[FakeRowLaunches, str]:
    """The elementwise kernel of ``op`` for ``problem`` and its variant tag: ``fake_quantize_flat``
    for TensorScope, the row kernels for the other scopes."""
    info = device_info(device_id)
    functions = load_kernels(_FAMILY, fake_quantize_unit(problem.float_kind), info.arch, device_id, compile_options())
    tag = ELEMENTS[problem.float_kind].cpp_tag
    in_bytes = ELEMENTS[problem.float_kind].storage_bits // 8
    if isinstance(problem.scope, TensorScope):
        vec = _vec_max(problem.float_kind)

        def flat(v: int) -> PreparedLaunch:
            n_vectors = -(-problem.numel // v)
            block, per_thread = flat_geometry(n_vectors, info.sm_count)
            return PreparedLaunch(
                functions[template_name("fake_quantize_flat", tag, v, int(op))],
                max(1, min(_FLAT_MAX_BLOCKS, -(-n_vectors // (block * per_thread)))),
                block,
                _FLAT_PARAMS[problem.precision],
                q_min=problem.q_min,
                q_max=problem.q_max,
                n=problem.numel,
                per_thread=per_thread,
            )

        block, per_thread = flat_geometry(-(-problem.numel // vec), info.sm_count)
        variant = f"tensor/{problem.mode.value}/flat[vec{vec},{block}t,{per_thread}vec-per-thread]"
        return FakeRowLaunches(flat(vec), flat(1), min(16, vec * in_bytes), True), variant
    kernel = _ROW_KERNELS[op]
    busy = info.sm_count * 2048
    primary = row_layout(problem.shape, problem.scope, _vec_max(problem.float_kind), False, busy)
    fallback = row_layout(problem.shape, problem.scope, 1, False, busy)
    launches = FakeRowLaunches(
        _row_launch(problem, primary, template_name(kernel, tag, primary.vec, True), functions, op, info.sm_count),
        _row_launch(problem, fallback, template_name(kernel, tag, 1, True), functions, op, info.sm_count),
        min(16, primary.vec * in_bytes),
        False,
    )
    return launches, f"{problem.scope.kind}/{problem.mode.value}/{primary.describe()}"


def _zero_fill(device_id: int, handle: int, op: Operand) -> None:
    """Enqueue zeros over ``op``'s bytes on raw stream ``handle`` (no allocation)."""
    import cupy

    with cupy.cuda.Device(device_id):
        cupy.cuda.runtime.memsetAsync(op.ptr, 0, op.size * op.itemsize, handle)


class FakeQuantizePlan(_FakeQuantizePlanBase):
    """Fake quantization (quantize, then dequantize, in one pass) for quantization-aware training.

    Formula: ``inv = rn(1 / scale)``, ``q = rne(x * inv) + zp``,
    ``y = (clamp(q, q_min, q_max) - zp) * scale`` in float32 (float64 for F64), rounded once to
    the data type. Bit-identical to ``torch.fake_quantize_per_tensor_affine`` /
    ``torch.fake_quantize_per_channel_affine`` on F16 / BF16 / F32 data, NaN and -Inf included
    (PyTorch's CUDA kernels turn a NaN ``q`` into INT64_MIN, so NaN gives ``(q_min - zp) * scale``
    and falls outside the gradient mask). Two differences, on purpose: where ``x * inv`` reaches
    2**63 (+Inf included), PyTorch's per-channel kernel overflows ``int64(rne(x * inv)) + zp`` and
    clamps to ``q_min``; this plan (like PyTorch's per-tensor kernel) clamps to ``q_max``.
    PyTorch computes float64 data in float32; this plan computes it in float64.

    **When to use:** the forward of a QAT model (weights and activations), with the scale and
    zero point held by the model (observers, or learnable parameters: a float zero point is
    rounded half to even and clamped to ``[q_min, q_max]``, as PyTorch's learnable op does).

    **Dtypes:** F16 / BF16 / F32 / F64 in and out (same dtype). ``scale`` float32 (float64 for
    F64); ``zero_point`` int32, or float of the scale's dtype.

    **Shape limits:** any rank, any extents, every scope; 64-bit indexing; no limit on rows. In
    place allowed (``output`` is ``input``). Array scales are used as given (not checked for > 0
    on the device).

    **Workspace:** none.

    **Precision guarantee:** each operation rounded once in the accumulator type (no FMA);
    equal bit for bit to :func:`quantplan.reference.fake_quantize`; deterministic.
    """

    _category = OpCategory.FAKE_QUANTIZE

    def __init__(
        self,
        problem: FakeQuantizeProblem,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        variant: str,
        launches: FakeRowLaunches | None,
    ) -> None:
        super().__init__(problem, backend, device_id, arch_name, variant)
        self._launches = launches

    @classmethod
    def select(cls, stream: Any, desc: FakeQuantizeDescriptor, pref: PlanPreference | None = None) -> FakeQuantizePlan:
        """Validate ``desc``, pick the backend and kernel variant, compile it on first use.

        Raises InvalidProblem for a malformed descriptor.
        """
        problem = fake_quantize_problem(desc)
        backend = choose_backend(pref or PlanPreference())
        if backend is BackendKind.REFERENCE:
            return cls(problem, backend, None, HOST_ARCH.name, "numpy", None)
        device_id = stream_device_id(stream)
        launches, variant = prepare_fake_rows(problem, FakeOp.NEAREST, device_id)
        return cls(problem, backend, device_id, device_info(device_id).arch.name, variant, launches)

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: always 0."""
        return 0

    def _check(self, args: FakeQuantizeArgs) -> tuple[Operand, Operand, Operand | float, Operand | int, int]:
        x = self._data(args.input, "input")
        y = self._data(args.output, "output")
        same_or_disjoint(y, "output", x, "input")
        scale = self._positive_scale(args.scale, self._param_dtype)
        zp, source = self._zero_point(args.zero_point)
        return x, y, scale, zp, source

    def can_implement(self, args: FakeQuantizeArgs) -> bool:
        """Check ``args`` (shapes, dtypes, device, contiguity, alignment, parameters); True or raises."""
        self._check(args)
        return True

    def run(self, stream: Any, workspace: Workspace | None, args: FakeQuantizeArgs) -> None:
        """Fake-quantize on ``stream``: one launch, no allocation, no synchronisation (capturable)."""
        check_workspace(workspace, 0)
        x, y, scale, zp, source = self._check(args)
        p = self.problem
        if self.backend is BackendKind.REFERENCE:
            zp_np = self._broadcast_param(zp, self.problem.shape, self.problem.scope) if isinstance(zp, Operand) else zp
            result = reference.fake_quantize(
                self._host_view(x, self.problem.shape, self._info),
                self._broadcast_param(scale, self.problem.shape, self.problem.scope),
                zp_np,
                p.q_min,
                p.q_max,
                p.precision,
            )
            self._write_host(y, result)
            return
        if p.numel == 0:
            return
        assert self._launches is not None and self.device_id is not None
        launch = self._launches.pick(x.ptr, y.ptr)
        params = launch.params
        params.x, params.out = x.ptr, y.ptr
        self._launches.set_params(params, scale, zp, source)
        launch_on(self.device_id, stream_handle(stream), launch)


class _LsqLaunches:
    __slots__ = ("align", "fallback", "finish", "geometry", "primary")

    def __init__(
        self,
        primary: PreparedLaunch,
        fallback: PreparedLaunch,
        finish: PreparedLaunch | None,
        align: int,
        geometry: LsqGeometry,
    ) -> None:
        self.primary, self.fallback, self.finish, self.align, self.geometry = primary, fallback, finish, align, geometry


def _prepare_lsq(problem: FakeQuantizeProblem, geometry: LsqGeometry, device_id: int) -> _LsqLaunches:
    import cupy

    info = device_info(device_id)
    functions = load_kernels(_FAMILY, fake_quantize_unit(problem.float_kind), info.arch, device_id, compile_options())
    tag = ELEMENTS[problem.float_kind].cpp_tag

    def prepare(vector_io: bool) -> PreparedLaunch:
        fn = functions[template_name("fake_quantize_lsq_segments", tag, geometry.vec, vector_io)]
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0)
        teams_per_block = BLOCK_THREADS // geometry.team
        grid = max(1, min(max(1, per_sm) * info.sm_count, -(-geometry.items // teams_per_block)))
        return PreparedLaunch(
            fn, grid, BLOCK_THREADS, _LSQ_PARAMS[problem.precision], layout=geometry.args(problem.q_min, problem.q_max)
        )

    finish = None
    if geometry.chunks_per_segment > 1:
        acc = "double" if problem.precision is MathPrecision.F64 else "float"
        grid = max(1, min(info.sm_count * 8, -(-geometry.segments // (BLOCK_THREADS // 32))))
        finish = PreparedLaunch(
            functions[template_name("fake_quantize_lsq_finish", acc)],
            grid,
            BLOCK_THREADS,
            _FINISH_PARAMS,
            segments=geometry.segments,
            chunks_per_segment=geometry.chunks_per_segment,
        )
    align = min(16, geometry.vec * ELEMENTS[problem.float_kind].storage_bits // 8)
    return _LsqLaunches(prepare(True), prepare(False), finish, align, geometry)


class FakeQuantizeBackwardPlan(_FakeQuantizePlanBase):
    """Gradients of fake quantization: straight-through ``dx``, and LSQ ``dscale`` / ``dzero_point``.

    Formulas (``q = rne(x * inv) + zp`` as in :class:`FakeQuantizePlan`, ``y`` its fake-quantized
    value in the accumulator type, ``gf`` = ``grad_factor``):

    * ``dx = dy * (q_min <= q <= q_max)`` (an IEEE product: -0 for a negative ``dy`` outside, NaN
      stays NaN; bit-identical to PyTorch's ``dy * mask``);
    * learnable: inside ``dscale_i = ((dy * (y - x)) * inv) * gf``, ``dzp_i = 0``; below / above
      ``dscale_i = (dy * (q_min - zp)) * gf`` / ``(dy * (q_max - zp)) * gf``,
      ``dzp_i = ((-dy) * scale) * gf``; ``dscale`` / ``dzero_point`` sum them over each segment.

    Differences from PyTorch's learnable ops, on purpose: the zero point is rounded half to even
    and clamped the same way forward and backward (PyTorch's per-tensor backward uses
    ``trunc(zp + 0.5)``); the zero point is added after rounding in every scope (PyTorch's
    per-channel backward rounds ``zp + x * inv``, which can flip a tie when the sum is inexact);
    every dtype is served (PyTorch's learnable backward takes float32 only); the sums are exact
    to float64 rounding in a fixed order (PyTorch sums float32 terms in float32).

    **When to use:** the backward of :class:`FakeQuantizePlan` in a QAT model; ``learnable=True``
    for LSQ-style trained scales and zero points.

    **Dtypes:** F16 / BF16 / F32 / F64 data; ``grad_output`` / ``grad_input`` of the data's
    dtype; ``scale``, ``grad_scale``, ``grad_zero_point`` float32 (float64 for F64).

    **Shape limits:** straight-through: any rank, any extents, every scope. Learnable: scopes
    whose segments are contiguous runs (TensorScope, TokenScope, GroupScope along the last axis,
    ChannelScope with only extent-1 axes before it, e.g. a weight's axis 0); others raise
    Unsupported. ``scale`` (and ``zero_point``) must be arrays for learnable plans. In place
    allowed (``grad_input`` is ``grad_output``).

    **Workspace:** learnable plans whose segments exceed one chunk (256 threads x 32 elements,
    16 for F64) need ``16 x chunks`` bytes for the partial sums; otherwise 0.

    **Precision guarantee:** ``dx`` bit-exact to :func:`quantplan.reference.fake_quantize_ste`
    / ``fake_quantize_lsq``; ``dscale`` / ``dzero_point`` are float64 sums in a fixed order
    (per thread, per team butterfly, per chunk), rounded once: deterministic and identical on
    every run and every GPU, within float64 rounding of the reference's float64 sum (so at most
    one float32 ulp apart, plus ``n * 2**-52 * sum|terms|``).
    """

    _category = OpCategory.GRADIENT

    def __init__(
        self,
        problem: FakeQuantizeProblem,
        learnable: bool,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        variant: str,
        rows: FakeRowLaunches | None,
        lsq: _LsqLaunches | None,
    ) -> None:
        super().__init__(problem, backend, device_id, arch_name, variant)
        self.learnable = learnable
        self._rows = rows
        self._lsq = lsq

    @classmethod
    def select(
        cls, stream: Any, desc: FakeQuantizeBackwardDescriptor, pref: PlanPreference | None = None
    ) -> FakeQuantizeBackwardPlan:
        """Validate ``desc``, pick the backend and kernels, compile them on first use.

        Raises InvalidProblem for a malformed descriptor, Unsupported for a learnable problem
        whose segments are not contiguous runs of the tensor.
        """
        problem = fake_quantize_problem(desc)
        geometry = lsq_geometry(problem.shape, problem.scope, problem.float_kind) if desc.learnable else None
        if desc.learnable and geometry is None and problem.numel:
            raise Unsupported(
                f"learnable fake quantization needs segments that are contiguous runs of the tensor; {problem.scope!r} "
                f"on shape {problem.shape} is not (use TensorScope, TokenScope, GroupScope on the last axis, or "
                f"ChannelScope on the first non-unit axis, transposing the tensor if needed)"
            )
        backend = choose_backend(pref or PlanPreference())
        if backend is BackendKind.REFERENCE:
            return cls(problem, desc.learnable, backend, None, HOST_ARCH.name, "numpy", None, None)
        device_id = stream_device_id(stream)
        arch = device_info(device_id).arch.name
        if desc.learnable:
            if geometry is None:  # empty tensor: nothing to launch
                return cls(problem, True, backend, device_id, arch, "empty", None, None)
            lsq = _prepare_lsq(problem, geometry, device_id)
            variant = f"{problem.scope.kind}/{problem.mode.value}/{geometry.describe()}"
            return cls(problem, True, backend, device_id, arch, variant, None, lsq)
        rows, variant = prepare_fake_rows(problem, FakeOp.STE, device_id)
        return cls(problem, False, backend, device_id, arch, variant, rows, None)

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: 16 per chunk when learnable segments span several chunks, else 0."""
        if self._lsq is None or self._lsq.finish is None:
            return 0
        return 16 * self._lsq.geometry.items

    def _check(self, args: FakeQuantizeBackwardArgs) -> dict[str, Any]:
        x = self._data(args.input, "input")
        dy = self._data(args.grad_output, "grad_output")
        dx = self._data(args.grad_input, "grad_input")
        same_or_disjoint(dx, "grad_input", dy, "grad_output")
        if self.backend is BackendKind.CUDA and overlaps(dx, x):
            raise InvalidProblem("grad_input overlaps input; the plan reads input while writing grad_input")
        scale = self._positive_scale(args.scale, self._param_dtype)
        zp, source = self._zero_point(args.zero_point)
        checked: dict[str, Any] = {"x": x, "dy": dy, "dx": dx, "scale": scale, "zp": zp, "source": source}
        if not self.learnable:
            if args.grad_scale is not None or args.grad_zero_point is not None:
                raise InvalidProblem(
                    "grad_scale / grad_zero_point are written by learnable plans only; leave them None"
                )
            return checked
        if not isinstance(scale, Operand) or (
            self.problem.mode is QuantMode.ASYMMETRIC and not isinstance(zp, Operand)
        ):
            raise InvalidProblem(
                f"learnable plans take scale (and zero_point) as arrays of shape {self._param_shape}, not Python scalars"
            )
        try:
            with np.errstate(over="ignore"):
                gf = float(self._param_dtype.type(args.grad_factor))
        except (TypeError, ValueError) as exc:
            raise InvalidProblem(f"grad_factor={args.grad_factor!r} must be a real number") from exc
        if not math.isfinite(gf):
            raise InvalidProblem(f"grad_factor={args.grad_factor!r} must be finite in {self._param_dtype.name}")
        checked["grad_factor"] = gf
        checked["grad_scale"] = self._param_out(args.grad_scale, "grad_scale")
        if self.problem.mode is QuantMode.ASYMMETRIC:
            checked["grad_zp"] = self._param_out(args.grad_zero_point, "grad_zero_point")
        elif args.grad_zero_point is not None:
            raise InvalidProblem("grad_zero_point must be None in SYMMETRIC mode (there is no zero point)")
        else:
            checked["grad_zp"] = None
        return checked

    def _param_out(self, value: Any, name: str) -> Operand:
        if value is None:
            raise InvalidProblem(
                f"{name} is required: an array of shape {self._param_shape} ({self._param_dtype.name})"
            )
        op = self._param(value, name, self._param_dtype, allow_none=False)
        assert isinstance(op, Operand)
        return op

    def can_implement(self, args: FakeQuantizeBackwardArgs) -> bool:
        """Check ``args`` (shapes, dtypes, device, contiguity, alignment, parameters); True or raises."""
        self._check(args)
        return True

    def run(self, stream: Any, workspace: Workspace | None, args: FakeQuantizeBackwardArgs) -> None:
        """Compute the gradients on ``stream``: one launch (two for multi-chunk learnable
        segments), no allocation, no synchronisation (capturable in a CUDA graph)."""
        check_workspace(workspace, self.workspace_size())
        a = self._check(args)
        p = self.problem
        if self.backend is BackendKind.REFERENCE:
            self._run_reference(a)
            return
        assert self.device_id is not None
        handle = stream_handle(stream)
        if p.numel == 0:
            if self.learnable:  # empty segments: zero gradients, as the reference writes
                for out in (a["grad_scale"], a["grad_zp"]):
                    if out is not None and out.size:
                        _zero_fill(self.device_id, handle, out)
            return
        x, dy, dx = a["x"], a["dy"], a["dx"]
        if self._rows is not None:
            launch = self._rows.pick(x.ptr, dy.ptr, dx.ptr)
            params = launch.params
            params.x, params.dy, params.out = x.ptr, dy.ptr, dx.ptr
            self._rows.set_params(params, a["scale"], a["zp"], a["source"])
            launch_on(self.device_id, handle, launch)
            return
        lsq = self._lsq
        assert lsq is not None
        aligned = all(ptr % lsq.align == 0 for ptr in (x.ptr, dy.ptr, dx.ptr))
        launch = lsq.primary if aligned else lsq.fallback
        params = launch.params
        params.x, params.dy, params.dx = x.ptr, dy.ptr, dx.ptr
        params.scale_ptr = a["scale"].ptr
        params.zp_ptr = a["zp"].ptr if isinstance(a["zp"], Operand) else 0
        params.layout.zp_source = a["source"]
        params.grad_factor = a["grad_factor"]
        params.grad_scale = a["grad_scale"].ptr
        params.grad_zp = 0 if a["grad_zp"] is None else a["grad_zp"].ptr
        params.partials = 0 if lsq.finish is None else workspace.ptr  # type: ignore[union-attr]
        if lsq.finish is None:
            launch_on(self.device_id, handle, launch)
            return
        finish = lsq.finish.params
        finish.partials = params.partials
        finish.grad_scale = params.grad_scale
        finish.grad_zp = params.grad_zp
        launch_on(self.device_id, handle, launch, lsq.finish)

    def _run_reference(self, a: dict[str, Any]) -> None:
        p = self.problem
        x, dy = (
            self._host_view(a["x"], self.problem.shape, self._info),
            self._host_view(a["dy"], self.problem.shape, self._info),
        )
        scale = self._broadcast_param(a["scale"], self.problem.shape, self.problem.scope)
        zp = (
            self._broadcast_param(a["zp"], self.problem.shape, self.problem.scope)
            if isinstance(a["zp"], Operand)
            else a["zp"]
        )
        if not self.learnable:
            self._write_host(a["dx"], reference.fake_quantize_ste(x, dy, scale, zp, p.q_min, p.q_max, p.precision))
            return
        dx, dscale, dzp = reference.fake_quantize_lsq(
            x, dy, scale, zp, p.q_min, p.q_max, a["grad_factor"], p.scope, p.precision
        )
        self._write_host(a["dx"], dx)
        self._write_host(a["grad_scale"], dscale)
        if a["grad_zp"] is not None:
            self._write_host(a["grad_zp"], dzp)


__all__ = [
    "FakeQuantizeArgs",
    "FakeQuantizeBackwardArgs",
    "FakeQuantizeBackwardDescriptor",
    "FakeQuantizeBackwardPlan",
    "FakeQuantizeDescriptor",
    "FakeQuantizePlan",
    "lsq_geometry",
]
