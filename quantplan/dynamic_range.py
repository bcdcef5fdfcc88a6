"""DynamicRangeQuantizePlan: scale (and zero point) from the tensor's runtime range, then quantize.

SPEC section 4, dynamic range. Two CUDA paths, chosen in ``select``:

* fused single pass (``dynamic_quantize_segments``) where segments are contiguous and fit one
  team's registers: one launch, one read of the input, no workspace;
* multi-pass otherwise: statistics reset, per-segment range (lo, hi, non-finite flag) by
  order-independent integer atomics (TensorScope: reduced per block first), parameters, and the
  quantization kernel of :class:`~quantplan.QuantizePlan` reading those parameters.

Kernels: ``kernels/dynamic_range.cu`` (+ ``qp_range.cuh``); reference:
:func:`quantplan.reference.dynamic_quantize`; tests: ``tests/test_dynamic_*.py``.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from . import reference
from ._affine import (
    AffineProblem,
    CheckedArgs,
    choose_backend,
    device_arg,
    reference_uniform,
)
from ._device import device_info, stream_device_id
from ._launch import PreparedLaunch, launch_on, stream_handle
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, contiguous_segment_length, row_layout
from ._operands import Operand, overlaps
from .compiler import compile_options, load_kernels, register_family, template_name
from .elements import CODE_KINDS, ELEMENTS, FLOAT_KINDS, param_element, param_numpy_dtype
from .errors import InvalidProblem
from .static_quantize import QuantizeDescriptor, QuantizePlan, quantize_problem, row_kernel_unit
from .types import (
    HOST_ARCH,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    NibbleOrder,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    QuantizeKind,
    QuantMode,
    TensorScope,
)
from .workspace import Workspace, check_workspace

_FAMILY = "dynamic_range"


class DynamicRangeQuantizeDescriptor(QuantizeDescriptor):
    """A dynamic-range quantization problem: parameters from the data, then ``q``.

    The fields and implied shapes of :class:`~quantplan.QuantizeDescriptor` (``shape``, ``scope``,
    ``mode``, ``input_element``, ``output_element``, ``q_min`` / ``q_max``, ``nibble_order``,
    ``rounding``; ``output_shape``, ``param_shape``); here ``param_shape`` is the shape of
    ``scale_out`` and ``zero_point_out``, which the plan writes.
    """


@dataclass(slots=True)
class DynamicRangeQuantizeArgs:
    """Arguments of :class:`DynamicRangeQuantizePlan`.

    ``input`` (floats), ``output`` (codes), ``scale_out`` (float32, float64 for F64 input, of
    ``param_shape``), ``zero_point_out`` (int32 of ``param_shape`` for ASYMMETRIC, None for
    SYMMETRIC), and for STOCHASTIC rounding ``rng_seed`` / ``rng_offset`` (Python ints in
    [0, 2**64) or one-element int64 device arrays).
    """

    input: Any
    output: Any
    scale_out: Any
    zero_point_out: Any = None
    rng_seed: Any = None
    rng_offset: Any = None


def _params_struct(name: str, fields: list[tuple[str, Any]]) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {"_fields_": fields})


_INIT_PARAMS = _params_struct("RangeInitParams", [("stats", ctypes.c_uint64), ("count", ctypes.c_int64)])
_STATS_PARAMS = _params_struct(
    "RangeStatsParams", [("x", ctypes.c_uint64), ("stats", ctypes.c_uint64), ("layout", RowLayoutArgs)]
)
_TENSOR_STATS_PARAMS = _params_struct(
    "TensorStatsParams",
    [("x", ctypes.c_uint64), ("stats", ctypes.c_uint64), ("n_vectors", ctypes.c_int64), ("mode", ctypes.c_int32)],
)
_PARAMS_PARAMS = {
    precision: _params_struct(
        "RangeParamsParams",
        [
            ("stats", ctypes.c_uint64),
            ("scale_out", ctypes.c_uint64),
            ("zp_out", ctypes.c_uint64),
            ("count", ctypes.c_int64),
            ("mode", ctypes.c_int32),
            ("q_min", ctypes.c_int32),
            ("q_max", ctypes.c_int32),
            ("divisor", acc),
        ],
    )
    for precision, acc in ((MathPrecision.F32, ctypes.c_float), (MathPrecision.F64, ctypes.c_double))
}


class SegmentLayoutArgs(ctypes.Structure):
    """``struct SegmentLayout`` of ``kernels/dynamic_range.cu``, field for field (passed by value)."""

    _fields_ = [
        ("segments", ctypes.c_int64),
        *((name, ctypes.c_int32) for name in ("S", "seg_log2", "q_min", "q_max", "mode", "pad")),
    ]


_SEGMENT_PARAMS = {
    precision: _params_struct(
        "SegmentKernelParams",
        [
            ("x", ctypes.c_uint64),
            ("q", ctypes.c_uint64),
            ("scale_out", ctypes.c_uint64),
            ("zp_out", ctypes.c_uint64),
            ("layout", SegmentLayoutArgs),
            ("divisor", acc),
            ("seed_ptr", ctypes.c_uint64),
            ("offset_ptr", ctypes.c_uint64),
            ("seed_value", ctypes.c_uint64),
            ("offset_value", ctypes.c_uint64),
        ],
    )
    for precision, acc in ((MathPrecision.F32, ctypes.c_float), (MathPrecision.F64, ctypes.c_double))
}

#: Largest team of the fused pass (threads holding one segment; __launch_bounds__ of the kernel).
MAX_TEAM = 1024


def segment_elements_per_thread(float_kind: ElementKind) -> int:
    """Elements one thread of the fused pass holds in registers (``segment_vectors`` in the kernel)."""
    return 16 if float_kind is ElementKind.F64 else 32


@dataclass(frozen=True)
class SegmentGeometry:
    """Launch geometry of the fused single pass: ``segments`` contiguous segments of ``length``
    elements, each held by a team of ``team`` threads (vectors of ``vec`` elements)."""

    segments: int
    length: int
    vec: int
    vector_io: bool
    team: int
    block: int

    def args(self, q_min: int, q_max: int, mode: QuantMode) -> SegmentLayoutArgs:
        """The kernel's by-value ``SegmentLayout`` argument."""
        return SegmentLayoutArgs(
            self.segments,
            self.length,
            int(math.log2(self.team)),
            q_min,
            q_max,
            0 if mode is QuantMode.SYMMETRIC else 1,
            0,
        )

    def blocks(self, max_blocks: int) -> int:
        """Grid size: one block per block-full of teams, at most ``max_blocks`` (grid-stride beyond)."""
        return max(1, min(max_blocks, -(-self.segments // (self.block // self.team))))

    def describe(self) -> str:
        """Short variant tag for KernelSku.variant."""
        per_thread = -(-self.length // (self.team * self.vec))
        io = "" if self.vector_io else ",scalar-io"
        return f"fused-single-pass[{self.team}t-per-segment,vec{self.vec}{io},{per_thread}vec-per-thread]"


def segment_geometry(problem: AffineProblem, busy_threads: int, vec_max: int) -> SegmentGeometry | None:
    """The fused single pass for ``problem``, or None where it does not apply.

    It applies when segments are contiguous (:func:`~quantplan._layout.contiguous_segment_length`),
    fit one team's registers (at most ``MAX_TEAM`` threads x 32 elements, 16 for F64) and, for
    4-bit codes, start on whole bytes (even segments and rows). ``vec_max``: the widest vector
    (halved while it does not divide a segment); 1 gives the element-I/O geometry (2 with element
    loads for packed codes). The team is the smallest power of two that holds a segment, widened
    (while each thread keeps a vector, up to one block of ``BLOCK_THREADS``) until the grid has
    ``busy_threads`` threads.
    """
    shape = problem.shape if problem.shape else (1,)
    length = contiguous_segment_length(shape, problem.scope)
    if length is None or length == 0 or problem.numel == 0:
        return None
    packed = ELEMENTS[problem.code_kind].is_packed
    if packed and shape[-1] % 2:
        return None
    return fused_segment_geometry(
        problem.numel // length, length, packed, segment_elements_per_thread(problem.float_kind), vec_max, busy_threads
    )


def fused_segment_geometry(
    segments: int, length: int, packed: bool, per_thread: int, vec_max: int, busy_threads: int
) -> SegmentGeometry | None:
    """The fused single pass over ``segments`` contiguous segments of ``length`` elements, or None
    where a team cannot hold one (more than ``MAX_TEAM * per_thread`` elements) or 4-bit codes
    would not start on whole bytes (an odd ``length``). Shared by the dynamic-range plans and the
    qgZ plans (:mod:`quantplan.swizzled_quantize`, :mod:`quantplan.dequant_reduce`); see
    :func:`segment_geometry` for the choice of vector width and team.
    """
    if length == 0 or segments == 0 or (packed and length % 2) or length > MAX_TEAM * per_thread:
        return None
    vec = vec_max
    while length % vec:
        vec //= 2
    vector_io = True
    if packed and vec < 2:
        vec, vector_io = 2, False
    team = 1
    while team * per_thread < length:
        team *= 2
    # Widen small problems up to one block: measured faster than larger teams, whose extra
    # warps each hold one vector and add barrier work (16 x 8192 bf16 on H200: 5.3 vs 5.9 us).
    while team < BLOCK_THREADS and team * vec < length and segments * team < busy_threads:
        team *= 2
    return SegmentGeometry(segments, length, vec, vector_io, team, max(team, BLOCK_THREADS))


def _acc_tag(precision: MathPrecision) -> str:
    return "double" if precision is MathPrecision.F64 else "float"


def dynamic_range_unit(float_kind: ElementKind) -> list[str]:
    """The range kernels of one input kind: reset, every vector width of the statistics passes
    (row layout, and whole tensor), parameters."""
    precision = ELEMENTS[float_kind].math_precision
    acc = _acc_tag(precision)
    vec_max = 4 if float_kind is ElementKind.F64 else 8
    tag = ELEMENTS[float_kind].cpp_tag
    widths = [v for v in (8, 4, 2, 1) if v <= vec_max]
    rows = [template_name("range_stats_rows", tag, v, True) for v in widths]
    tensor = [template_name("range_stats_tensor", tag, v) for v in widths]
    return [template_name("range_stats_init", acc), *rows, *tensor, template_name("range_params", acc)]


def dynamic_segments_unit(
    float_kind: ElementKind, code_kind: ElementKind, high_first: bool, stochastic: bool
) -> list[str]:
    """The fused single-pass kernels of one (input, code, nibble order, rounding).

    ``dynamic_quantize_segments`` has the template signature of ``quantize_rows`` and the same
    vector widths (see :func:`~quantplan.static_quantize.row_kernel_unit`): 8 elements (4 for F64)
    halved down to 1, packed codes at least 2, and (2, element I/O) for misaligned operands.
    """
    return row_kernel_unit("dynamic_quantize_segments", True, float_kind, code_kind, high_first, stochastic)


@register_family(_FAMILY)
def dynamic_range_units() -> list[list[str]]:
    """Compile units of ``kernels/dynamic_range.cu``: the range passes per input float kind, and
    the fused pass per (input, code, nibble order, rounding)."""
    units = [dynamic_range_unit(k) for k in FLOAT_KINDS]
    for float_kind in FLOAT_KINDS:
        for code_kind in CODE_KINDS:
            for high_first in (False, True) if ELEMENTS[code_kind].is_packed else (False,):
                for stochastic in (False, True):
                    units.append(dynamic_segments_unit(float_kind, code_kind, high_first, stochastic))
    return units


class DynamicRangeQuantizePlan:
    """Quantization with parameters computed from the tensor's runtime range, per segment of ``scope``.

    Formulas (SPEC section 4; arithmetic in float32, float64 for F64 input):

    * SYMMETRIC: ``scale = max|x| / q_max`` (FP8: ``/ fp8_max``), ``q = clamp(rne(x / scale), q_min, q_max)``.
    * ASYMMETRIC: ``lo = min(min x, 0)``, ``hi = max(max x, 0)``, ``scale = (hi - lo) / (q_max - q_min)``,
      ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``, ``q = clamp(rne(x / scale) + zp, q_min, q_max)``.
    * ``scale == 0`` (all-zero segment, or a range whose scale underflows) -> ``scale = 1`` (zero maps
      to the zero point exactly); a segment holding NaN or +-Inf -> ``scale = NaN``, ``zp = 0`` and
      every code of it 0 (the zero point; FP8 byte 0x00).
    * ``Rounding.STOCHASTIC`` replaces rne by Philox stochastic rounding (see QuantizeDescriptor).

    ``scale_out`` / ``zero_point_out`` feed :class:`~quantplan.DequantizePlan` directly.

    **When to use:** activations and gradients whose range is only known at run time (LLM
    inference per token, per-group int4 weights produced on the fly). With a known scale, use
    QuantizePlan (one pass instead of two).

    **Dtypes:** input F16 / BF16 / F32 / F64; output S8 / U8 / S4 / U4 (packed, either nibble
    order) / FP8_E4M3 / FP8_E5M2 (FP8: SYMMETRIC only). ``scale_out`` float32 (float64 for F64);
    ``zero_point_out`` int32.

    **Shape limits:** any rank, any extents, 64-bit indexing, no row limit.

    **Kernel variants** (``sku().variant``): ``fused-single-pass[Nt-per-segment,...]`` when the
    segments are contiguous runs of the tensor (TokenScope; GroupScope along the last axis;
    ChannelScope whose axis has only extent-1 axes before it, e.g. a weight's axis 0;
    TensorScope up to 32768 elements) of at most 32768 elements (16384 for F64; 4-bit codes:
    even segments and rows): a team of N threads (1 to 1024, chosen from the segment length and
    the problem size) reads its segment once, reduces the range by shuffles and shared memory,
    and quantizes from registers. Otherwise ``range-atomics`` / ``block-reduced-range``
    (TensorScope) followed by the QuantizePlan row kernel.

    **Workspace:** ``workspace_size()`` bytes on the GPU: 0 for the fused pass, three integers
    per segment for the multi-pass path; a smaller workspace raises WorkspaceTooSmall. None on
    the reference backend.

    **Precision guarantee:** bit-exact to :func:`quantplan.reference.dynamic_quantize` (codes,
    scales and zero points); deterministic (the range reductions are exact, order-independent
    min / max).
    """

    def __init__(
        self,
        desc: DynamicRangeQuantizeDescriptor,
        problem: AffineProblem,
        backend: BackendKind,
        device_id: int | None,
        arch_name: str,
        quantize: QuantizePlan | None,
        passes: RangePasses | None,
        variant: str,
        fused: _FusedLaunches | None = None,
    ) -> None:
        self.descriptor = desc
        self.problem = problem
        self.backend = backend
        self.device_id = device_id
        self._arch_name = arch_name
        self._quantize = quantize
        self._passes = passes
        self._variant = variant
        self._fused = fused
        # Argument checks are QuantizePlan's (same operands); a plan without the multi-pass path
        # gets an instance that only checks (nothing compiled or launched through it).
        self._checker = quantize or QuantizePlan(problem, backend, device_id, arch_name, None, None, (1, 1), "checks")
        self._param_shape = problem.param_shape
        self._param_count = math.prod(self._param_shape) if self._param_shape else 1
        self._param_dtype = param_numpy_dtype(problem.precision)

    # ---- selection ------------------------------------------------------------------------

    @classmethod
    def select(
        cls, stream: Any, desc: DynamicRangeQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> DynamicRangeQuantizePlan:
        """Validate ``desc``, pick the backend, compile the kernels on first use.

        Raises InvalidProblem for a malformed descriptor (including SYMMETRIC integer codes with
        ``q_max <= 0``, ASYMMETRIC with ``q_min >= q_max``, ASYMMETRIC FP8).
        """
        pref = pref or PlanPreference()
        problem = replace(quantize_problem(desc), layout_flags=1)
        if not ELEMENTS[problem.code_kind].is_fp8:
            if problem.mode is QuantMode.SYMMETRIC and problem.q_max <= 0:
                raise InvalidProblem(
                    f"SYMMETRIC dynamic range needs q_max > 0 (scale = amax / q_max), got {problem.q_max}"
                )
            if problem.mode is QuantMode.ASYMMETRIC and problem.q_min >= problem.q_max:
                raise InvalidProblem(
                    f"ASYMMETRIC dynamic range needs q_min < q_max, got q_min={problem.q_min}, q_max={problem.q_max}"
                )
        backend = choose_backend(pref)
        if backend is BackendKind.REFERENCE:
            return cls(desc, problem, backend, None, HOST_ARCH.name, None, None, "numpy")

        device_id = stream_device_id(stream)
        info = device_info(device_id)
        divisor = range_divisor(problem)
        busy = info.sm_count * 2048
        geometry = segment_geometry(problem, busy, 4 if problem.float_kind is ElementKind.F64 else 8)
        if geometry is not None:
            fallback_geometry = segment_geometry(problem, busy, 1)
            assert fallback_geometry is not None
            fused = _prepare_fused(problem, geometry, fallback_geometry, divisor, device_id)
            variant = f"{problem.scope.kind}/{problem.mode.value}/{geometry.describe()}"
            return cls(desc, problem, backend, device_id, info.arch.name, None, None, variant, fused)
        quantize = QuantizePlan._select(stream, problem, pref)
        assert isinstance(quantize, QuantizePlan)
        passes = RangePasses.prepare(problem, divisor, device_id)
        variant = f"{problem.scope.kind}/{problem.mode.value}/{passes.kind}+{quantize.sku().variant}"
        return cls(desc, problem, backend, device_id, info.arch.name, quantize, passes, variant)

    # ---- introspection --------------------------------------------------------------------

    def workspace_size(self) -> int:
        """Bytes of workspace ``run`` needs: three integer statistics per segment on the GPU's
        multi-pass path; 0 for the fused single pass and on the reference backend."""
        if self._passes is None:
            return 0
        return self._passes.stats_bytes

    def precision_guarantee(self) -> PrecisionGuarantee:
        """float32 arithmetic (float64 for F64), exact order-independent range reductions, bit-exact to the reference."""
        return PrecisionGuarantee(
            math_precision=self.problem.precision, accumulator=param_element(self.problem.precision)
        )

    def sku(self) -> KernelSku:
        """Identity of the selected kernels (variant: scope, mode, range pass and quantize layout)."""
        return KernelSku(
            category=OpCategory.QUANTIZE,
            op=QuantizeKind.DYNAMIC_RANGE,
            element=self.problem.float_kind,
            aux_element=self.problem.code_kind,
            variant=self._variant,
            arch=self._arch_name,
            backend=self.backend,
            precision_guarantee=self.precision_guarantee(),
        )

    # ---- arguments --------------------------------------------------------------------------

    def _check(self, args: DynamicRangeQuantizeArgs) -> tuple[CheckedArgs, Operand, Operand | None]:
        helper = self._checker
        p = self.problem
        x = helper._tensor(args.input, "input", p.shape, ELEMENTS[p.float_kind])
        y = helper._tensor(args.output, "output", p.code_shape, ELEMENTS[p.code_kind])
        scale = self._param_out(args.scale_out, "scale_out", self._param_dtype)
        zp: Operand | None = None
        if p.mode is QuantMode.ASYMMETRIC:
            zp = self._param_out(args.zero_point_out, "zero_point_out", np.dtype(np.int32))
        elif args.zero_point_out is not None:
            raise InvalidProblem("zero_point_out must be None in SYMMETRIC mode (the zero point is 0)")
        seed: Operand | int | None = None
        offset: Operand | int | None = None
        if p.stochastic:
            seed = helper._rng_value(args.rng_seed, "rng_seed")
            offset = helper._rng_value(args.rng_offset, "rng_offset")
        elif args.rng_seed is not None or args.rng_offset is not None:
            raise InvalidProblem("rng_seed / rng_offset apply only to Rounding.STOCHASTIC plans; leave them None")
        outputs = [("output", y), ("scale_out", scale)] + ([("zero_point_out", zp)] if zp is not None else [])
        for name, out in outputs:
            if self.backend is BackendKind.CUDA and overlaps(out, x):
                raise InvalidProblem(f"{name} overlaps input; the plan reads the input twice")
        return CheckedArgs(x, y, 0.0, None, seed, offset), scale, zp

    def _param_out(self, value: Any, name: str, dtype: np.dtype) -> Operand:
        op = self._checker._param_output(value, name, dtype, required=True)
        assert op is not None
        return op

    def can_implement(self, args: DynamicRangeQuantizeArgs) -> bool:
        """Check ``args`` (shapes, dtypes, device, contiguity, alignment, rng); True or raises."""
        self._check(args)
        return True

    # ---- execution ------------------------------------------------------------------------

    def run(self, stream: Any, workspace: Workspace | None, args: DynamicRangeQuantizeArgs) -> None:
        """Compute the parameters and quantize on ``stream``; no allocation, no synchronisation.

        One launch (fused pass) or four (multi-pass) on the GPU, capturable in a CUDA graph;
        NumPy on the reference backend.
        """
        check_workspace(workspace, self.workspace_size())
        a, scale, zp = self._check(args)
        if self.backend is BackendKind.REFERENCE:
            self._run_reference(a, scale, zp)
            return
        if self.problem.numel == 0:
            return
        assert self.device_id is not None
        handle = stream_handle(stream)
        if self._fused is not None:
            self._fused.launch(self.device_id, handle, a, scale, zp)
            return
        assert workspace is not None and self._quantize is not None and self._passes is not None
        self._passes.launch(self.device_id, handle, a.x.ptr, workspace.ptr, scale.ptr, 0 if zp is None else zp.ptr)
        self._quantize.launch_on_device(
            handle,
            a.x.ptr,
            a.y.ptr,
            (scale.ptr, 0.0),
            (0, 0) if zp is None else (zp.ptr, 0),
            device_arg(a.seed),
            device_arg(a.offset),
        )

    def _run_reference(self, a: CheckedArgs, scale: Operand, zp: Operand | None) -> None:
        p = self.problem
        shape = p.shape
        x = np.asarray(a.x.obj).view(ELEMENTS[p.float_kind].numpy_dtype).reshape(shape)
        uniform = reference_uniform(shape, a.seed, a.offset) if p.stochastic else None
        q, s, z = reference.dynamic_quantize(
            x, p.scope, p.mode, p.code_kind, p.q_min, p.q_max, p.precision, p.nibble_order, uniform
        )
        out = np.asarray(a.y.obj).view(ELEMENTS[p.code_kind].numpy_dtype)
        np.copyto(out, q.reshape(out.shape).view(out.dtype), casting="no")
        np.copyto(np.asarray(scale.obj), s.reshape(np.asarray(scale.obj).shape), casting="no")
        if zp is not None and z is not None:
            np.copyto(np.asarray(zp.obj), z.reshape(np.asarray(zp.obj).shape), casting="no")


def range_divisor(problem: AffineProblem) -> float:
    """The divisor of the dynamic scale: ``fp8_max`` (FP8), ``q_max`` (SYMMETRIC) or ``q_max - q_min``."""
    code = ELEMENTS[problem.code_kind]
    if code.is_fp8:
        assert code.fp8_max is not None
        return code.fp8_max
    if problem.mode is QuantMode.SYMMETRIC:
        return float(problem.q_max)
    return float(problem.q_max - problem.q_min)


class RangePasses:
    """The multi-pass path's parameter launches: statistics reset, range statistics (row layout by
    integer atomics, or block-reduced for TensorScope) and parameters, written to ``scale_out`` /
    ``zp_out`` device arrays. Shared by DynamicRangeQuantizePlan and DynamicRangeFakeQuantizePlan.

    ``stats_bytes``: the workspace the statistics take (three integer keys per segment).
    """

    __slots__ = ("fallback", "init", "kind", "params", "stats", "stats_align", "stats_bytes")

    def __init__(
        self,
        init: PreparedLaunch,
        stats: PreparedLaunch,
        fallback: PreparedLaunch,
        params: PreparedLaunch,
        stats_align: int,
        stats_bytes: int,
        kind: str,
    ) -> None:
        self.init, self.stats, self.fallback, self.params = init, stats, fallback, params
        self.stats_align, self.stats_bytes, self.kind = stats_align, stats_bytes, kind

    @classmethod
    def prepare(cls, problem: AffineProblem, divisor: float, device_id: int) -> RangePasses:
        """Compile (first use) and prepare the range passes of ``problem`` on ``device_id``."""
        import cupy

        info = device_info(device_id)
        functions = load_kernels(
            _FAMILY, dynamic_range_unit(problem.float_kind), info.arch, device_id, compile_options()
        )
        acc = _acc_tag(problem.precision)
        busy = info.sm_count * 2048
        vec_max = 4 if problem.float_kind is ElementKind.F64 else 8
        tag = ELEMENTS[problem.float_kind].cpp_tag
        mode = 0 if problem.mode is QuantMode.SYMMETRIC else 1

        def per_sm(fn: Any) -> int:
            return max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0))

        def stats_launch(layout: RowLayout) -> PreparedLaunch:
            fn = functions[template_name("range_stats_rows", tag, layout.vec, True)]
            grid = layout.blocks(per_sm(fn) * info.sm_count)
            return PreparedLaunch(
                fn, grid, BLOCK_THREADS, _STATS_PARAMS, layout=layout.args(problem.q_min, problem.q_max)
            )

        def tensor_stats_launch(vec: int) -> PreparedLaunch:
            fn = functions[template_name("range_stats_tensor", tag, vec)]
            n_vectors = problem.numel // vec
            grid = max(1, min(per_sm(fn) * info.sm_count, -(-n_vectors // BLOCK_THREADS)))
            return PreparedLaunch(fn, grid, BLOCK_THREADS, _TENSOR_STATS_PARAMS, n_vectors=n_vectors, mode=mode)

        count = math.prod(problem.param_shape) if problem.param_shape else 1
        small_grid = max(1, min(info.sm_count * 8, -(-count // BLOCK_THREADS)))
        init = PreparedLaunch(
            functions[template_name("range_stats_init", acc)], small_grid, BLOCK_THREADS, _INIT_PARAMS, count=count
        )
        params = PreparedLaunch(
            functions[template_name("range_params", acc)],
            small_grid,
            BLOCK_THREADS,
            _PARAMS_PARAMS[problem.precision],
            count=count,
            mode=mode,
            q_min=problem.q_min,
            q_max=problem.q_max,
            divisor=divisor,
        )
        in_bytes = ELEMENTS[problem.float_kind].storage_bits // 8
        key_bytes = 8 if problem.precision is MathPrecision.F64 else 4
        if isinstance(problem.scope, TensorScope):
            vec = vec_max
            while problem.numel % vec:
                vec //= 2
            stats, fallback, kind = tensor_stats_launch(vec), tensor_stats_launch(1), "block-reduced-range"
        else:
            primary = row_layout(problem.shape, problem.scope, vec_max, False, busy)
            vec = primary.vec
            stats = stats_launch(primary)
            fallback = stats_launch(row_layout(problem.shape, problem.scope, 1, False, busy))
            kind = "range-atomics"
        return cls(init, stats, fallback, params, min(16, vec * in_bytes), 3 * key_bytes * count, kind)

    def launch(self, device_id: int, handle: int, x_ptr: int, stats_ptr: int, scale_ptr: int, zp_ptr: int) -> None:
        """Enqueue reset, statistics and parameters on raw stream ``handle`` (``zp_ptr`` 0: none)."""
        stats = self.stats if x_ptr % self.stats_align == 0 else self.fallback
        self.init.params.stats = stats_ptr
        stats.params.x = x_ptr
        stats.params.stats = stats_ptr
        self.params.params.stats = stats_ptr
        self.params.params.scale_out = scale_ptr
        self.params.params.zp_out = zp_ptr
        launch_on(device_id, handle, self.init, stats, self.params)


class _FusedLaunches:
    """The fused pass's launch with aligned vector I/O and its element-I/O twin for misaligned operands."""

    __slots__ = ("align_in", "align_out", "fallback", "primary", "stochastic")

    def __init__(
        self, primary: PreparedLaunch, fallback: PreparedLaunch, align_in: int, align_out: int, stochastic: bool
    ) -> None:
        self.primary, self.fallback = primary, fallback
        self.align_in, self.align_out = align_in, align_out
        self.stochastic = stochastic

    def launch(self, device_id: int, handle: int, a: CheckedArgs, scale: Operand, zp: Operand | None) -> None:
        aligned = a.x.ptr % self.align_in == 0 and a.y.ptr % self.align_out == 0
        launch = self.primary if aligned else self.fallback
        params = launch.params
        params.x = a.x.ptr
        params.q = a.y.ptr
        params.scale_out = scale.ptr
        params.zp_out = 0 if zp is None else zp.ptr
        if self.stochastic:
            params.seed_ptr, params.seed_value = device_arg(a.seed)
            params.offset_ptr, params.offset_value = device_arg(a.offset)
        launch_on(device_id, handle, launch)


def _prepare_fused(
    problem: AffineProblem, geometry: SegmentGeometry, fallback: SegmentGeometry, divisor: float, device_id: int
) -> _FusedLaunches:
    """Compile (first use) and prepare the fused pass of ``problem``: ``geometry`` for aligned
    operands, ``fallback`` (element I/O) for the others."""
    import cupy

    info = device_info(device_id)
    high_first = problem.nibble_order is NibbleOrder.HIGH_FIRST
    unit = dynamic_segments_unit(problem.float_kind, problem.code_kind, high_first, problem.stochastic)
    functions = load_kernels(_FAMILY, unit, info.arch, device_id, compile_options())
    float_info, code_info = ELEMENTS[problem.float_kind], ELEMENTS[problem.code_kind]
    packed = code_info.is_packed

    def prepare(g: SegmentGeometry) -> PreparedLaunch:
        name = template_name(
            "dynamic_quantize_segments",
            float_info.cpp_tag,
            code_info.cpp_tag,
            g.vec,
            g.vector_io,
            high_first and packed,
            problem.stochastic,
        )
        fn = functions[name]
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, g.block, 0)
        return PreparedLaunch(
            fn,
            g.blocks(max(1, per_sm) * info.sm_count),
            g.block,
            _SEGMENT_PARAMS[problem.precision],
            layout=g.args(problem.q_min, problem.q_max, problem.mode),
            divisor=divisor,
        )

    in_bytes = geometry.vec * float_info.storage_bits // 8
    out_bytes = geometry.vec // 2 if packed else geometry.vec
    return _FusedLaunches(
        prepare(geometry), prepare(fallback), min(16, in_bytes), min(16, max(1, out_bytes)), problem.stochastic
    )


__all__ = ["DynamicRangeQuantizeArgs", "DynamicRangeQuantizeDescriptor", "DynamicRangeQuantizePlan"]
