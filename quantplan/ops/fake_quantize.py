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
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from pydantic import ConfigDict

from quantplan import reference
from quantplan.runtime._affine import ScopedDescriptor
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._fake_rows import (
    ZP_FLOAT,
    ZP_INT32,
    ZP_VALUE,
    FakeOp,
    FakeQuantizeProblem,
    FakeRowLaunches,
    prepare_fake_rows,
)
from quantplan.runtime._kernel_names import fake_quantize_unit
from quantplan.runtime._launch import LaunchPair, PreparedLaunch, fields, launch_on, occupancy_grid, params_struct
from quantplan.runtime._layout import BLOCK_THREADS, UNROLL, contiguous_segment_length, param_shape
from quantplan.runtime._operands import (
    Operand,
    OperandChecks,
    TensorArgs,
    check_outputs,
    check_param_values,
    is_scalar,
    operand,
    view,
)
from quantplan.runtime._plan import REFERENCE_VARIANT, Plan, check_descriptor, choose_backend, preferred
from quantplan.runtime._selection import SCHEDULES, choose_fake_rows
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary.elements import ELEMENTS, acc_cpp, acc_ctype
from quantplan.vocabulary.errors import InvalidArgumentType, InvalidProblem, Unsupported
from quantplan.vocabulary.types import (
    BackendKind,
    ElementKind,
    MathPrecision,
    OpCategory,
    PlanPreference,
    QuantMode,
    Scope,
    TensorScope,
)

_FROZEN = ConfigDict(frozen=True, extra="forbid")
#: Largest |q_min|, |q_max|: integers up to 2**24 are exact in float32, so clamp and subtraction are exact.
CODE_LIMIT = 2**24


class FakeQuantizeDescriptor(ScopedDescriptor):
    """A fake quantization problem: ``y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale``.

    Fields: ``shape`` (any rank); ``scope`` (Tensor / Token / Channel / GroupScope); ``mode``
    SYMMETRIC (zero point 0, ``zero_point=None``) or ASYMMETRIC (a zero point is given);
    ``element`` F16, BF16, F32 or F64 (input and output); ``q_min`` / ``q_max`` the integer range
    (e.g. 0 / 255, -128 / 127; any integers with ``q_min <= q_max`` and magnitude at most 2**24).

    ``param_shape``: the shape of ``scale`` / ``zero_point`` (SPEC section 3).
    """

    element: ElementKind
    q_min: int
    q_max: int


class FakeQuantizeBackwardDescriptor(FakeQuantizeDescriptor):
    """The gradient of a :class:`FakeQuantizeDescriptor` problem.

    ``learnable=False``: the straight-through estimator, ``dx = dy * (q_min <= q <= q_max)``.
    ``learnable=True``: also ``dscale`` (and ``dzero_point`` for ASYMMETRIC) by the LSQ formulas
    PyTorch's ``_fake_quantize_learnable_per_*_affine_backward`` use, summed per segment.
    """

    learnable: bool = False


def fake_quantize_problem(desc: FakeQuantizeDescriptor) -> FakeQuantizeProblem:
    """Validate a (forward or backward) descriptor; raise InvalidProblem if malformed."""
    check_descriptor(desc, FakeQuantizeDescriptor)
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
class FakeQuantizeArgs(TensorArgs):
    """Arguments of :class:`FakeQuantizePlan`.

    ``input`` and ``output`` (same shape and dtype; ``output`` may be ``input`` itself: in place);
    ``scale``: float32 array of ``param_shape`` (float64 for F64), or a Python float / one-element
    array for TensorScope; ``zero_point``: None for SYMMETRIC; for ASYMMETRIC an int32 array, or a
    float array of the scale's dtype (a learnable zero point: rounded half to even and clamped to
    ``[q_min, q_max]``), or a Python int / float for TensorScope.
    """

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


class LsqLayoutArgs(ctypes.Structure):
    """``struct LsqLayout`` of ``kernels/fake_quantize.cu``, field for field (passed by value)."""

    _fields_ = [
        *fields(ctypes.c_int64, "segments", "items"),
        *(
            (name, ctypes.c_int32)
            for name in ("S", "chunk", "chunks_per_segment", "team_log2", "q_min", "q_max", "zp_source", "pad")
        ),
    ]


_LSQ_PARAMS = {
    p: params_struct(
        "LsqParams",
        [
            *fields(ctypes.c_uint64, "x", "dy", "dx", "scale_ptr", "zp_ptr"),
            ("grad_factor", acc_ctype(p)),
            *fields(ctypes.c_uint64, "grad_scale", "grad_zp", "partials"),
            ("layout", LsqLayoutArgs),
        ],
    )
    for p in MathPrecision
}
_FINISH_PARAMS = params_struct(
    "LsqFinishParams",
    [
        *fields(ctypes.c_uint64, "partials", "grad_scale", "grad_zp"),
        ("segments", ctypes.c_int64),
        ("chunks_per_segment", ctypes.c_int32),
    ],
)


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
    vec = ELEMENTS[element].vec_max
    while length % vec:
        vec //= 2
    team = 1
    while team < BLOCK_THREADS and team * vec * UNROLL < length:
        team *= 2
    return LsqGeometry(math.prod(dims) // length, length, vec, team, team * vec * UNROLL)


def _zero_fill(device_id: int, handle: int, op: Operand) -> None:
    """Enqueue zeros over ``op``'s bytes on raw stream ``handle`` (no allocation)."""
    import cupy

    with cupy.cuda.Device(device_id):
        cupy.cuda.runtime.memsetAsync(op.ptr, 0, op.size * op.itemsize, handle)


class _Checked(NamedTuple):
    """Operands of one fake-quantization run (forward: ``dy`` None, ``dx`` the output; the
    learnable backward adds the gradient factor and the parameter gradients)."""

    x: Operand
    dy: Operand | None
    dx: Operand
    scale: Operand | float
    zp: Operand | int
    source: int
    grad_factor: float = 1.0
    grad_scale: Operand | None = None
    grad_zp: Operand | None = None


class _FakeQuantizePlanBase(OperandChecks, Plan[Any, _Checked]):
    """Shared parts of the forward and backward plans: identity, operands, parameters."""

    def __init__(
        self,
        problem: FakeQuantizeProblem,
        device_id: int | None,
        variant: str,
        prepared: tuple[PreparedLaunch, ...],
        workspace_bytes: int = 0,
        empty: bool | None = None,
    ) -> None:
        kinds = problem.float_kind, problem.float_kind
        super().__init__(
            problem, device_id, *kinds, variant, workspace_bytes=workspace_bytes, prepared=prepared, empty=empty
        )
        self._param_shape = problem.param_shape
        self._tensor_scope = isinstance(problem.scope, TensorScope)
        self._info = ELEMENTS[problem.float_kind]
        self._param_dtype = problem.scale_dtype

    # ---- parameters ---------------------------------------------------------------------------

    def _zero_point(self, value: Any) -> tuple[Operand | int, int]:
        """The zero point and its ZeroPointSource."""
        p = self.problem
        if p.mode is QuantMode.SYMMETRIC:
            if value is not None:
                raise InvalidProblem("zero_point must be None in SYMMETRIC mode (the zero point is 0)")
            return 0, ZP_VALUE
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
            return zp, ZP_VALUE
        dtype_name = getattr(getattr(value, "dtype", None), "name", str(getattr(value, "dtype", "")))
        if "int" in dtype_name:
            op = self._param(value, "zero_point", np.dtype(np.int32), allow_none=False)
            assert isinstance(op, Operand)
            return op, ZP_INT32
        op = self._param(value, "zero_point", self._param_dtype, allow_none=False)
        assert isinstance(op, Operand)
        return op, ZP_FLOAT

    def _data(self, value: Any, name: str) -> Operand:
        return self._tensor(value, name, self.problem.shape, self._info)

    def _check_values(self, checked: _Checked) -> None:
        check_param_values(checked.scale, checked.zp, self.problem.q_min, self.problem.q_max)

    def _extract_params(self, value: Any) -> tuple[Any, int]:
        """An unchecked zero point and its ZeroPointSource (``check=False``)."""
        zp = view(value, "zero_point")
        if zp is None:
            return 0, ZP_VALUE
        if type(zp) is not Operand:
            return self._zero_point(value)
        return zp, ZP_INT32 if "int" in zp.dtype_name else ZP_FLOAT

    def _reference_params(self, a: _Checked) -> tuple[np.ndarray, np.ndarray | int]:
        p = self.problem
        zp = self._broadcast_param(a.zp, p.shape, p.scope) if isinstance(a.zp, Operand) else a.zp
        return self._broadcast_param(a.scale, p.shape, p.scope), zp


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

    **Schedules:** ``flat`` (TensorScope), else ``dense-rows`` or ``row-layout``, chosen by
    :func:`quantplan.runtime._selection.choose_fake_rows`; ``PlanPreference(schedule=...)`` forces one
    (Unsupported where it cannot serve).

    **Workspace:** none.

    **Precision guarantee:** each operation rounded once in the accumulator type (no FMA);
    equal bit for bit to :func:`quantplan.reference.fake_quantize`; deterministic.
    """

    _args_type = FakeQuantizeArgs
    _category = OpCategory.FAKE_QUANTIZE

    def __init__(
        self, problem: FakeQuantizeProblem, device_id: int | None, variant: str, launches: FakeRowLaunches | None
    ) -> None:
        super().__init__(problem, device_id, variant, () if launches is None else launches.launches)
        self._launches = launches

    @classmethod
    def select(cls, stream: Any, desc: FakeQuantizeDescriptor, pref: PlanPreference | None = None) -> FakeQuantizePlan:
        """Validate ``desc``, pick the backend and kernel variant, compile it on first use.

        Raises InvalidProblem for a malformed descriptor.
        """
        problem = fake_quantize_problem(desc)
        if choose_backend(pref, stream, SCHEDULES["fake_quantize"]) is BackendKind.REFERENCE:
            return preferred(cls(problem, None, REFERENCE_VARIANT, None), pref)
        device_id = stream_device_id(stream)
        forced = None if pref is None else pref.schedule
        choice = choose_fake_rows(problem, FakeOp.NEAREST, device_info(device_id), forced)
        launches, variant = prepare_fake_rows(problem, FakeOp.NEAREST, device_id, choice.dense)
        return preferred(cls(problem, device_id, variant, launches), pref)

    def _check(self, args: FakeQuantizeArgs) -> _Checked:
        x = self._data(args.input, "input")
        y = self._data(args.output, "output")
        scale = self._positive_scale(args.scale, self._param_dtype)
        zp, source = self._zero_point(args.zero_point)
        read = (("input", x), ("scale", scale), ("zero_point", zp))
        check_outputs((("output", y),), read, in_place=("output", "input"))
        return _Checked(x, None, y, scale, zp, source)

    def _extract(self, args: FakeQuantizeArgs) -> _Checked:
        zp, source = self._extract_params(args.zero_point)
        return _Checked(
            operand(args.input, "input"), None, operand(args.output, "output"), view(args.scale, "scale"), zp, source
        )

    def _launch(self, handle: int, workspace: Workspace | None, a: _Checked) -> None:
        assert self._launches is not None and self.device_id is not None
        launch = self._launches.pick(a.x.ptr, a.dx.ptr)
        params = launch.params
        params.x, params.out = a.x.ptr, a.dx.ptr
        self._launches.set_params(params, a.scale, a.zp, a.source)
        launch_on(self.device_id, handle, launch)

    def _run_reference(self, a: _Checked) -> None:
        p = self.problem
        scale, zp = self._reference_params(a)
        x = self._host_view(a.x, p.shape, self._info)
        self._write_host(a.dx, reference.fake_quantize(x, scale, zp, p.q_min, p.q_max, p.precision))


class _LsqLaunches(LaunchPair):
    """The learnable backward (aligned and element-I/O twins) and its finishing sum (multi-chunk segments)."""

    __slots__ = ("finish", "geometry")

    def __init__(
        self,
        primary: PreparedLaunch,
        fallback: PreparedLaunch,
        finish: PreparedLaunch | None,
        align: int,
        geometry: LsqGeometry,
    ) -> None:
        super().__init__(primary, fallback, align)
        self.finish, self.geometry = finish, geometry

    @property
    def launches(self) -> tuple[PreparedLaunch, ...]:  # type: ignore[override]
        return (self.primary, self.fallback) + (() if self.finish is None else (self.finish,))


def _prepare_lsq(problem: FakeQuantizeProblem, geometry: LsqGeometry, device_id: int) -> _LsqLaunches:
    info = device_info(device_id)
    functions = load_kernels(
        "fake_quantize", fake_quantize_unit(problem.float_kind), info.arch, device_id, kernel_options()
    )
    tag = ELEMENTS[problem.float_kind].cpp_tag

    def prepare(vector_io: bool) -> PreparedLaunch:
        fn = functions[template_name("fake_quantize_lsq_segments", tag, geometry.vec, vector_io)]
        teams_per_block = BLOCK_THREADS // geometry.team
        grid = occupancy_grid(fn, BLOCK_THREADS, -(-geometry.items // teams_per_block), info)
        return PreparedLaunch(
            fn, grid, BLOCK_THREADS, _LSQ_PARAMS[problem.precision], layout=geometry.args(problem.q_min, problem.q_max)
        )

    finish = None
    if geometry.chunks_per_segment > 1:
        acc = acc_cpp(problem.precision)
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

    _args_type = FakeQuantizeBackwardArgs
    _category = OpCategory.GRADIENT

    def __init__(
        self,
        problem: FakeQuantizeProblem,
        learnable: bool,
        device_id: int | None,
        variant: str,
        rows: FakeRowLaunches | None,
        lsq: _LsqLaunches | None,
    ) -> None:
        launches = rows if rows is not None else lsq
        workspace = 0 if lsq is None or lsq.finish is None else 16 * lsq.geometry.items
        # An empty learnable problem still zeroes its parameter gradients (as the reference does).
        super().__init__(
            problem,
            device_id,
            variant,
            () if launches is None else launches.launches,
            workspace,
            empty=problem.numel == 0 and not learnable,
        )
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
        if choose_backend(pref, stream) is BackendKind.REFERENCE:
            return preferred(cls(problem, desc.learnable, None, REFERENCE_VARIANT, None, None), pref)
        device_id = stream_device_id(stream)
        if desc.learnable:
            if geometry is None:  # empty tensor: nothing to launch
                return preferred(cls(problem, True, device_id, "empty", None, None), pref)
            lsq = _prepare_lsq(problem, geometry, device_id)
            variant = f"{problem.scope.kind}/{problem.mode.value}/{geometry.describe()}"
            return preferred(cls(problem, True, device_id, variant, None, lsq), pref)
        choice = choose_fake_rows(problem, FakeOp.STE, device_info(device_id))
        rows, variant = prepare_fake_rows(problem, FakeOp.STE, device_id, choice.dense)
        return preferred(cls(problem, False, device_id, variant, rows, None), pref)

    def _check(self, args: FakeQuantizeBackwardArgs) -> _Checked:
        x = self._data(args.input, "input")
        dy = self._data(args.grad_output, "grad_output")
        dx = self._data(args.grad_input, "grad_input")
        scale = self._positive_scale(args.scale, self._param_dtype)
        zp, source = self._zero_point(args.zero_point)
        read = (("grad_output", dy), ("input", x), ("scale", scale), ("zero_point", zp))
        if not self.learnable:
            if args.grad_scale is not None or args.grad_zero_point is not None:
                raise InvalidProblem(
                    "grad_scale / grad_zero_point are written by learnable plans only; leave them None"
                )
            check_outputs((("grad_input", dx),), read, in_place=("grad_input", "grad_output"))
            return _Checked(x, dy, dx, scale, zp, source)
        if not isinstance(scale, Operand) or (
            self.problem.mode is QuantMode.ASYMMETRIC and not isinstance(zp, Operand)
        ):
            raise InvalidProblem(
                f"learnable plans take scale (and zero_point) as arrays of shape {self._param_shape}, not Python scalars"
            )
        if not is_scalar(args.grad_factor):
            raise InvalidArgumentType(
                f"grad_factor={args.grad_factor!r} must be a real number (int or float), "
                f"got {type(args.grad_factor).__name__}"
            )
        try:
            with np.errstate(over="ignore"):
                gf = float(self._param_dtype.type(args.grad_factor))
        except (TypeError, ValueError) as exc:
            raise InvalidProblem(f"grad_factor={args.grad_factor!r} must be a real number") from exc
        if not math.isfinite(gf):
            raise InvalidProblem(f"grad_factor={args.grad_factor!r} must be finite in {self._param_dtype.name}")
        grad_scale = self._param_out(args.grad_scale, "grad_scale")
        grad_zp: Operand | None = None
        if self.problem.mode is QuantMode.ASYMMETRIC:
            grad_zp = self._param_out(args.grad_zero_point, "grad_zero_point")
        elif args.grad_zero_point is not None:
            raise InvalidProblem("grad_zero_point must be None in SYMMETRIC mode (there is no zero point)")
        written = (("grad_input", dx), ("grad_scale", grad_scale), ("grad_zero_point", grad_zp))
        check_outputs(written, read, in_place=("grad_input", "grad_output"))
        return _Checked(x, dy, dx, scale, zp, source, gf, grad_scale, grad_zp)

    def _param_out(self, value: Any, name: str) -> Operand:
        if value is None:
            raise InvalidProblem(
                f"{name} is required: an array of shape {self._param_shape} ({self._param_dtype.name})"
            )
        op = self._param(value, name, self._param_dtype, allow_none=False)
        assert isinstance(op, Operand)
        return op

    def _extract(self, args: FakeQuantizeBackwardArgs) -> _Checked:
        zp, source = self._extract_params(args.zero_point)
        return _Checked(
            operand(args.input, "input"),
            operand(args.grad_output, "grad_output"),
            operand(args.grad_input, "grad_input"),
            view(args.scale, "scale"),
            zp,
            source,
            float(args.grad_factor),
            view(args.grad_scale, "grad_scale"),
            view(args.grad_zero_point, "grad_zero_point"),
        )

    def _launch(self, handle: int, workspace: Workspace | None, a: _Checked) -> None:
        assert self.device_id is not None and a.dy is not None
        if self.problem.numel == 0:  # learnable, empty segments: zero gradients, as the reference writes
            for out in (a.grad_scale, a.grad_zp):
                if out is not None and out.size:
                    _zero_fill(self.device_id, handle, out)
            return
        x, dy, dx = a.x, a.dy, a.dx
        if self._rows is not None:
            launch = self._rows.pick(x.ptr, dx.ptr, dy.ptr)
            params = launch.params
            params.x, params.dy, params.out = x.ptr, dy.ptr, dx.ptr
            self._rows.set_params(params, a.scale, a.zp, a.source)
            launch_on(self.device_id, handle, launch)
            return
        lsq = self._lsq
        assert lsq is not None and isinstance(a.scale, Operand) and a.grad_scale is not None
        launch = lsq.pick(x.ptr, dx.ptr, dy.ptr)
        params = launch.params
        params.x, params.dy, params.dx = x.ptr, dy.ptr, dx.ptr
        params.scale_ptr = a.scale.ptr
        params.zp_ptr = a.zp.ptr if isinstance(a.zp, Operand) else 0
        params.layout.zp_source = a.source
        params.grad_factor = a.grad_factor
        params.grad_scale = a.grad_scale.ptr
        params.grad_zp = 0 if a.grad_zp is None else a.grad_zp.ptr
        params.partials = 0 if lsq.finish is None else workspace.ptr  # type: ignore[union-attr]
        if lsq.finish is None:
            launch_on(self.device_id, handle, launch)
            return
        finish = lsq.finish.params
        finish.partials = params.partials
        finish.grad_scale = params.grad_scale
        finish.grad_zp = params.grad_zp
        launch_on(self.device_id, handle, launch, lsq.finish)

    def _run_reference(self, a: _Checked) -> None:
        p = self.problem
        assert a.dy is not None
        x, dy = self._host_view(a.x, p.shape, self._info), self._host_view(a.dy, p.shape, self._info)
        scale, zp = self._reference_params(a)
        if not self.learnable:
            self._write_host(a.dx, reference.fake_quantize_ste(x, dy, scale, zp, p.q_min, p.q_max, p.precision))
            return
        dx, dscale, dzp = reference.fake_quantize_lsq(
            x, dy, scale, zp, p.q_min, p.q_max, a.grad_factor, p.scope, p.precision
        )
        self._write_host(a.dx, dx)
        assert a.grad_scale is not None
        self._write_host(a.grad_scale, dscale)
        if a.grad_zp is not None:
            self._write_host(a.grad_zp, dzp)


__all__ = [
    "FakeQuantizeArgs",
    "FakeQuantizeBackwardArgs",
    "FakeQuantizeBackwardDescriptor",
    "FakeQuantizeBackwardPlan",
    "FakeQuantizeDescriptor",
    "FakeQuantizePlan",
]
