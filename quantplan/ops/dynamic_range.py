"""DynamicRangeQuantizePlan: scale (and zero point) from the tensor's runtime range, then quantize.

SPEC section 4, dynamic range. Two CUDA paths, chosen in ``select``:

* fused single pass (``dynamic_quantize_segments``) where segments are contiguous and fit one
  team's registers: one launch, one read of the input, no workspace; for 16-bit input with
  nearest rounding and aligned operands, specialised twins: ``dynamic_quantize_lanes`` (groups
  of 128 held by a few lanes of a warp), ``dynamic_quantize_row_shares`` (few rows of 4096 /
  8192 / 16384, a few blocks per row that each read all of it), ``dynamic_quantize_cluster``
  (few long rows, a thread-block cluster per row, sm_90), ``dynamic_quantize_rows`` (rows of 2048 / 4096 / 8192
  held in one block's registers), ``dynamic_quantize_dense`` (a
  block-sized team);
* multi-pass otherwise: statistics reset, per-segment range (lo, hi, non-finite flag) by
  order-independent integer atomics (TensorScope: reduced per block first), parameters
  (:class:`quantplan.runtime._segments.RangePasses`), and the quantization row kernel of
  :class:`~quantplan.QuantizePlan` reading those parameters (:class:`quantplan.runtime._affine.AffineRows`).

Kernels: ``kernels/dynamic_range.cu`` (+ ``qp_range.cuh``); reference:
:func:`quantplan.reference.dynamic_quantize`; tests: ``tests/test_dynamic_range_*.py`` and ``tests/test_reference_dynamic_range.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from quantplan import reference
from quantplan.runtime._affine import AffineOperands, AffineProblem, AffineRows, QuantizeDescriptor, quantize_problem
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._kernel_names import dynamic_segments_unit, row_kernel_name
from quantplan.runtime._launch import LaunchPair, launch_on, set_rng
from quantplan.runtime._operands import Operand, OperandChecks, TensorArgs, check_outputs, reference_uniform
from quantplan.runtime._plan import REFERENCE_VARIANT, Plan, choose_backend
from quantplan.runtime._segments import RangePasses, RangePlanState, SegmentGeometry, prepare_segments
from quantplan.runtime._selection import SCHEDULES, SegmentChoice, choose_rows, choose_segments
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import (
    BackendKind,
    ElementKind,
    OpCategory,
    PlanPreference,
    QuantizeKind,
    QuantMode,
)


class DynamicRangeQuantizeDescriptor(QuantizeDescriptor):
    """A dynamic-range quantization problem: parameters from the data, then ``q``.

    The fields and implied shapes of :class:`~quantplan.QuantizeDescriptor` (``shape``, ``scope``,
    ``mode``, ``input_element``, ``output_element``, ``q_min`` / ``q_max``, ``nibble_order``,
    ``rounding``; ``output_shape``, ``param_shape``); here ``param_shape`` is the shape of
    ``scale_out`` and ``zero_point_out``, which the plan writes.
    """


@dataclass(slots=True)
class DynamicRangeQuantizeArgs(TensorArgs):
    """Arguments of :class:`DynamicRangeQuantizePlan`.

    ``input`` (floats), ``output`` (codes), ``scale_out`` (float32, float64 for F64 input, of
    ``param_shape``), ``zero_point_out`` (int32 of ``param_shape`` for ASYMMETRIC, None for
    SYMMETRIC), and for STOCHASTIC rounding ``rng_seed`` / ``rng_offset`` (Python ints in
    [0, 2**64) or one-element int64 device arrays).
    """

    scale_out: Any
    zero_point_out: Any = None
    rng_seed: Any = None
    rng_offset: Any = None


class DynamicRangeQuantizePlan(
    RangePlanState[DynamicRangeQuantizeDescriptor, AffineRows],
    OperandChecks,
    Plan[DynamicRangeQuantizeArgs, AffineOperands],
):
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
    and quantizes from registers (``dense``, ``dense-lanes``, ``dense-row-shares``, ``dense-cluster``, ``dense-rows``:
    the specialised kernels for 16-bit input). Otherwise ``range-atomics`` / ``block-reduced-range``
    (TensorScope) followed by the QuantizePlan row kernel.

    **Schedules:** ``select`` asks :func:`quantplan.runtime._selection.choose_segments` (its table:
    ``row-shares``, ``cluster``, ``lanes``, ``rows``, ``dense``, ``fused``, ``fused-element-io``,
    ``multi-pass``, the first that serves and suits the device); ``PlanPreference(schedule=...)``
    forces one (Unsupported where it cannot serve the problem). The bits do not depend on it.

    **Workspace:** ``workspace_size()`` bytes on the GPU: 0 for the fused pass, three integers
    per segment for the multi-pass path; a smaller workspace raises WorkspaceTooSmall. None on
    the reference backend.

    **Precision guarantee:** bit-exact to :func:`quantplan.reference.dynamic_quantize` (codes,
    scales and zero points); deterministic (the range reductions are exact, order-independent
    min / max).
    """

    _args_type = DynamicRangeQuantizeArgs
    _category = OpCategory.QUANTIZE
    _op = QuantizeKind.DYNAMIC_RANGE
    _checked = AffineOperands

    def _output_kind(self, problem: AffineProblem) -> ElementKind:
        return problem.code_kind

    def _setup(self, problem: AffineProblem) -> None:
        self._float_info, self._code_info = ELEMENTS[problem.float_kind], ELEMENTS[problem.code_kind]
        self._code_shape = problem.code_shape

    # ---- selection ------------------------------------------------------------------------

    @classmethod
    def select(
        cls, stream: Any, desc: DynamicRangeQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> DynamicRangeQuantizePlan:
        """Validate ``desc``, pick the backend, compile the kernels on first use.

        Raises InvalidProblem for a malformed descriptor (including SYMMETRIC integer codes with
        ``q_max <= 0``, ASYMMETRIC with ``q_min >= q_max``, ASYMMETRIC FP8).
        """
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
        if choose_backend(pref, stream, SCHEDULES[_OP]) is BackendKind.REFERENCE:
            return cls(desc, problem, None, REFERENCE_VARIANT)
        device_id = stream_device_id(stream)
        info = device_info(device_id)
        prefix = f"{problem.scope.kind}/{problem.mode.value}/"
        choice = choose_segments(_OP, problem, info, None if pref is None else pref.schedule)
        if choice.geometries is not None:
            return cls(desc, problem, device_id, prefix + choice.tag, fused=_prepare_fused(problem, choice, device_id))
        rows = AffineRows.prepare(problem, True, device_id, choose_rows(problem, True, info).dense)
        passes = RangePasses.prepare(problem, device_id)
        variant = f"{prefix}{passes.kind}+{prefix}{rows.layout.describe()}"
        return cls(desc, problem, device_id, variant, passes=passes, rows=rows)

    # ---- arguments --------------------------------------------------------------------------

    def _check(self, args: DynamicRangeQuantizeArgs) -> AffineOperands:
        p = self.problem
        x = self._tensor(args.input, "input", p.shape, self._float_info)
        y = self._tensor(args.output, "output", self._code_shape, self._code_info)
        scale = self._param_output(args.scale_out, "scale_out", self._param_dtype, True)
        assert scale is not None
        zp: Operand | None = None
        if self._asymmetric:
            zp = self._param_output(args.zero_point_out, "zero_point_out", self._int32, True)
        elif args.zero_point_out is not None:
            raise InvalidProblem("zero_point_out must be None in SYMMETRIC mode (the zero point is 0)")
        seed, offset = self._rng(self._stochastic, args.rng_seed, args.rng_offset)
        check_outputs((("output", y), ("scale_out", scale), ("zero_point_out", zp)), (("input", x),))
        return AffineOperands(x, y, scale, zp, seed, offset)

    # ---- execution ------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: AffineOperands) -> None:
        assert self.device_id is not None
        zp_ptr = 0 if a.zp is None else a.zp.ptr
        fused = self._fused
        if fused is not None:
            launch = fused.pick(a.x.ptr, a.y.ptr)
            params = launch.params
            params.x = a.x.ptr
            params.y = a.y.ptr
            params.scale_out = a.scale.ptr
            params.zp_out = zp_ptr
            if self._stochastic:
                set_rng(params, a.seed, a.offset)
            launch_on(self.device_id, handle, launch)
            return
        assert workspace is not None and self._passes is not None and self._rows is not None
        self._passes.launch(self.device_id, handle, a.x.ptr, workspace.ptr, a.scale.ptr, zp_ptr)
        self._rows.launch(handle, a.x.ptr, a.y.ptr, a.scale, a.zp, a.seed, a.offset)

    def _run_reference(self, a: AffineOperands) -> None:
        p = self.problem
        x = self._host_view(a.x, p.shape, self._float_info).reshape(p.shape)
        uniform = reference_uniform(p.shape, a.seed, a.offset) if self._stochastic else None
        q, s, z = reference.dynamic_quantize(
            x, p.scope, p.mode, p.code_kind, p.q_min, p.q_max, p.precision, p.nibble_order, uniform
        )
        self._write_host(a.y, q.view(self._code_info.numpy_dtype))
        self._write_host(a.scale, s)
        if a.zp is not None and z is not None:
            self._write_host(a.zp, z)


def _prepare_fused(problem: AffineProblem, choice: SegmentChoice, device_id: int) -> LaunchPair:
    """Compile (first use) and prepare the fused pass of ``problem`` in the schedule ``choice``
    (:func:`quantplan.runtime._selection.choose_segments`): its specialised kernel, or
    ``dynamic_quantize_segments``, for aligned operands, and the latter's element-I/O twin."""
    assert choice.geometries is not None
    unit = dynamic_segments_unit(problem.float_kind, problem.code_kind, problem.high_first, problem.rounding)
    f, c, high_first = problem.float_kind, problem.code_kind, problem.high_first

    def name(g: SegmentGeometry) -> str:
        return row_kernel_name(
            "dynamic_quantize_segments", True, f, c, g.vec, g.vector_io, high_first, problem.rounding
        )

    code_bits = ELEMENTS[c].storage_bits
    special = None if choice.kernel is None or choice.geometry is None else (choice.kernel, choice.geometry)
    return prepare_segments(
        problem, choice.geometries, "dynamic_range", unit, name, code_bits, device_id, special, choice.grid
    )


#: The op's name in :data:`quantplan.runtime._selection.SCHEDULES`.
_OP = "dynamic_quantize"


__all__ = ["DynamicRangeQuantizeArgs", "DynamicRangeQuantizeDescriptor", "DynamicRangeQuantizePlan"]
