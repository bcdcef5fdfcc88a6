"""DynamicRangeFakeQuantizePlan: per-segment range -> scale (and zero point) -> fake quantization.

The quantization-aware-training counterpart of :class:`~quantplan.DynamicRangeQuantizePlan`
(MoQ-style training: DeepSpeed's fake quantizer), for any bit width from 1 to 8:

* parameters exactly as DynamicRangeQuantizePlan computes them (SPEC section 4, dynamic range)
  for integer codes ``[q_min, q_max]`` of ``bits`` bits: SYMMETRIC ``[-2**(bits-1), 2**(bits-1) - 1]``
  (bits >= 2), ``scale = max|x| / q_max``; ASYMMETRIC ``[0, 2**bits - 1]``,
  ``scale = (hi - lo) / (q_max - q_min)``, ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``;
* then :class:`~quantplan.FakeQuantizePlan`'s formula with those parameters:
  ``inv = rn(1 / scale)``, ``q = rne(x * inv) + zp`` (or Philox stochastic rounding of ``x * inv``),
  ``y = (clamp(q, q_min, q_max) - zp) * scale``, rounded to the data type.

Kernels: ``dynamic_fake_quantize_segments`` in ``kernels/fake_quantize.cu`` (fused single pass,
shared segment loop in ``qp_dynamic_segments.cuh``; ``dynamic_fake_quantize_dense`` on 16-bit
segments of team x 8 x nv elements), or the range passes of
``kernels/dynamic_range.cu`` followed by ``fake_quantize_{,stochastic_}rows`` / ``fake_quantize_flat``;
reference: :func:`quantplan.reference.dynamic_fake_quantize`; tests:
``tests/test_dynamic_fake_quantize_*.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quantplan import reference
from quantplan.runtime._affine import AffineOperands, AffineProblem, ScopedDescriptor
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._fake_rows import ZP_INT32, ZP_VALUE, FakeOp, FakeRowLaunches, prepare_fake_rows
from quantplan.runtime._kernel_names import dynamic_fake_quantize_unit
from quantplan.runtime._launch import LaunchPair, PreparedLaunch, launch_on, set_rng
from quantplan.runtime._layout import param_shape
from quantplan.runtime._operands import Operand, OperandChecks, TensorArgs, check_outputs, reference_uniform
from quantplan.runtime._plan import REFERENCE_VARIANT, Plan, check_descriptor, choose_backend
from quantplan.runtime._segments import RangePasses, RangePlanState, SegmentGeometry, prepare_segments
from quantplan.runtime._selection import SCHEDULES, SegmentChoice, choose_fake_rows, choose_segments
from quantplan.runtime.compiler import template_name
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary import types
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidProblem
from quantplan.vocabulary.types import ElementKind, NibbleOrder, QuantMode, Rounding

#: The op's name in :data:`quantplan.runtime._selection.SCHEDULES`.
_OP = "dynamic_fake_quantize"
#: Alignment of each part of the multi-pass workspace (statistics, scales, zero points).
_WORKSPACE_ALIGN = 256


def dynamic_fake_quantize_range(mode: QuantMode, bits: int) -> tuple[int, int]:
    """The integer code range ``(q_min, q_max)`` of ``bits`` bits: SYMMETRIC
    ``[-2**(bits-1), 2**(bits-1) - 1]`` (bits 2 to 8), ASYMMETRIC ``[0, 2**bits - 1]`` (bits 1 to 8)."""
    if not 1 <= bits <= 8:
        raise InvalidProblem(f"bits={bits}: dynamic fake quantization supports 1 to 8 bits")
    if mode is QuantMode.SYMMETRIC:
        if bits < 2:
            raise InvalidProblem(
                "SYMMETRIC needs bits >= 2 (1 bit gives q_max = 0, and scale = amax / q_max); use ASYMMETRIC"
            )
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


class DynamicRangeFakeQuantizeDescriptor(ScopedDescriptor):
    """A dynamic-range fake quantization problem (see :class:`DynamicRangeFakeQuantizePlan`).

    Fields: ``shape`` (any rank); ``scope`` (Tensor / Token / Channel / GroupScope: the segments
    that share a range); ``mode`` SYMMETRIC or ASYMMETRIC; ``element`` F16, BF16, F32 or F64 (in
    and out); ``bits`` 1 to 8 (SYMMETRIC: 2 to 8); ``rounding`` NEAREST_EVEN or STOCHASTIC.

    ``q_min`` / ``q_max``: the code range ``bits`` gives; ``param_shape``: the shape of the
    optional ``scale_out`` / ``zero_point_out``.
    """

    element: ElementKind
    bits: int = 8
    rounding: Rounding = Rounding.NEAREST_EVEN

    @property
    def q_min(self) -> int:
        """Smallest code: ``-2**(bits-1)`` (SYMMETRIC) or 0 (ASYMMETRIC)."""
        return dynamic_fake_quantize_range(self.mode, self.bits)[0]

    @property
    def q_max(self) -> int:
        """Largest code: ``2**(bits-1) - 1`` (SYMMETRIC) or ``2**bits - 1`` (ASYMMETRIC)."""
        return dynamic_fake_quantize_range(self.mode, self.bits)[1]


@dataclass(slots=True)
class DynamicRangeFakeQuantizeArgs(TensorArgs):
    """Arguments of :class:`DynamicRangeFakeQuantizePlan`.

    ``input`` and ``output`` (same shape and dtype; ``output`` may be ``input``: in place);
    optional ``scale_out`` (float32, float64 for F64, of ``param_shape``) and ``zero_point_out``
    (int32 of ``param_shape``, ASYMMETRIC only) receive the parameters used; for STOCHASTIC
    rounding ``rng_seed`` / ``rng_offset`` (Python ints in [0, 2**64) or one-element int64 device
    arrays, e.g. a counter advanced on the device).
    """

    scale_out: Any = None
    zero_point_out: Any = None
    rng_seed: Any = None
    rng_offset: Any = None


def dynamic_fake_quantize_problem(desc: DynamicRangeFakeQuantizeDescriptor) -> AffineProblem:
    """Validate ``desc``; the problem as DynamicRangeQuantizePlan sees it (8-bit integer code kind,
    narrowed to the range of ``bits``), which the range passes and the fused geometry take."""
    check_descriptor(desc, DynamicRangeFakeQuantizeDescriptor)
    if not ELEMENTS[desc.element].is_float:
        raise InvalidProblem(f"element must be one of F16, BF16, F32, F64, got {desc.element.name}")
    param_shape(desc.shape, desc.scope)  # validates axis and group divisibility
    q_min, q_max = dynamic_fake_quantize_range(desc.mode, desc.bits)
    code_kind = ElementKind.S8 if desc.mode is QuantMode.SYMMETRIC else ElementKind.U8
    shape, low_first = tuple(desc.shape), NibbleOrder.LOW_FIRST
    return AffineProblem(shape, desc.scope, desc.mode, desc.element, q_min, q_max, code_kind, low_first, desc.rounding)


def _align(n: int) -> int:
    return -(-n // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN


def _prepare_fused(problem: AffineProblem, choice: SegmentChoice, device_id: int) -> LaunchPair:
    """Compile (first use) and prepare the fused pass of ``problem`` in the schedule ``choice``
    (:func:`quantplan.runtime._selection.choose_segments`): its specialised kernel, or
    ``dynamic_fake_quantize_segments``, for aligned operands, and the latter's element-I/O twin
    (misaligned operands). ``choice.resident``: the grid holds only the blocks every SM keeps
    resident (each team's next segment in flight while it works)."""
    assert choice.geometries is not None
    tag = ELEMENTS[problem.float_kind].cpp_tag

    def name(g: SegmentGeometry) -> str:
        return template_name("dynamic_fake_quantize_segments", tag, g.vec, True, problem.stochastic)

    unit = dynamic_fake_quantize_unit(problem.float_kind)
    bits = ELEMENTS[problem.float_kind].storage_bits
    special = None if choice.kernel is None or choice.geometry is None else (choice.kernel, choice.geometry)
    pair = prepare_segments(
        problem, choice.geometries, "fake_quantize", unit, name, bits, device_id, special, choice.grid
    )
    if choice.resident:
        pair.primary.grid = _resident_grid(pair.primary, device_id)
    return pair


def _resident_grid(launch: PreparedLaunch, device_id: int) -> int:
    """``launch``'s grid, at most the blocks every SM holds at once."""
    import cupy

    with cupy.cuda.Device(device_id):
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(launch.function_ptr, launch.block, 0)
    return max(1, min(launch.grid, max(1, per_sm) * device_info(device_id).sm_count))


class DynamicRangeFakeQuantizePlan(
    RangePlanState[DynamicRangeFakeQuantizeDescriptor, FakeRowLaunches],
    OperandChecks,
    Plan[DynamicRangeFakeQuantizeArgs, AffineOperands],
):
    """Fake quantization with per-segment parameters from the data, in one pass where it can.

    Formulas (SPEC section 4; float32 arithmetic, float64 for F64; each operation rounded once):

    * code range of ``bits``: SYMMETRIC ``[-2**(bits-1), 2**(bits-1) - 1]``, ASYMMETRIC ``[0, 2**bits - 1]``;
    * parameters as :class:`~quantplan.DynamicRangeQuantizePlan` computes them for that range:
      SYMMETRIC ``scale = max|x| / q_max``, ``zp = 0``; ASYMMETRIC ``lo = min(min x, 0)``,
      ``hi = max(max x, 0)``, ``scale = (hi - lo) / (q_max - q_min)``,
      ``zp = clamp(q_min - rne(lo / scale), q_min, q_max)``; an all-zero segment gets ``scale = 1``;
      a segment with NaN or +-Inf gets ``scale = NaN`` (and comes out all NaN);
    * ``y = (clamp(q, q_min, q_max) - zp) * scale`` with ``inv = rn(1 / scale)`` and
      ``q = rne(x * inv) + zp`` (NEAREST_EVEN) or ``q = floor(v) + (u < v - floor(v)) + zp`` with
      ``v = x * inv`` and ``u`` the element's Philox uniform (STOCHASTIC, SPEC section 4: flat
      element index, seed, offset), rounded once to the data type.

    So ``y`` equals :class:`~quantplan.FakeQuantizePlan` run with the parameters this plan
    computes (and returns in ``scale_out`` / ``zero_point_out`` when given). Decision: the fake
    value uses PyTorch's fake-quant formula (multiplication by ``rn(1 / scale)``) rather than
    DynamicRangeQuantizePlan's division ``x / scale``; for the rare element where the two round
    differently (a quotient within an ulp of a half-integer), ``y`` differs from
    ``DequantizePlan(DynamicRangeQuantizePlan(x))`` by one step of ``scale``. Unlike DeepSpeed's
    fake quantizer, the symmetric scale divides by ``q_max`` (``2**(bits-1) - 1``), so ``-max|x|``
    and ``+max|x|`` are both exactly representable, and the stochastic path rounds the
    asymmetric formula (DeepSpeed runs its symmetric kernel there).

    The backward of this op is the identity (straight-through: the dynamic range clamps nothing
    finite), so no backward plan is needed; :mod:`quantplan.pytorch` wires it so.

    **When to use:** MoQ-style QAT of weights or activations with per-group (per-token,
    per-tensor) dynamic ranges and low bit widths, optionally with unbiased stochastic rounding.

    **Dtypes:** F16 / BF16 / F32 / F64 in and out (same dtype); ``scale_out`` float32 (float64 for
    F64), ``zero_point_out`` int32.

    **Shape limits:** any rank, any extents, every scope, any group size (no silent limit), 64-bit
    indexing. In place allowed (``output`` is ``input``). Kernel variants (``sku().variant``):
    ``fused-single-pass[...]`` when segments are contiguous runs of at most 32768 elements (16384
    for F64): one read of the input; otherwise the multi-pass path (range statistics by exact
    integer atomics, parameters, then the elementwise fake-quant kernel), which has no size limit.

    **Schedules:** ``select`` asks :func:`quantplan.runtime._selection.choose_segments` (``row-shares``
    with an in-place twin, ``cluster``, ``rows``, ``dense``, ``fused``, ``fused-element-io``,
    ``multi-pass``); ``PlanPreference(schedule=...)`` forces one (Unsupported where it cannot
    serve the problem). The bits do not depend on it.

    **Workspace:** 0 for the fused pass; for the multi-pass path, the range statistics and the
    parameters (a few bytes per segment, ``workspace_size()``).

    **Precision guarantee:** bit-exact to :func:`quantplan.reference.dynamic_fake_quantize`
    (values, scales, zero points) for both roundings; deterministic (exact, order-independent
    range reductions; stochastic rounding reproducible from (seed, offset) on any device).
    """

    _args_type = DynamicRangeFakeQuantizeArgs
    _category = types.OpCategory.FAKE_QUANTIZE
    _op = types.QuantizeKind.DYNAMIC_RANGE
    _checked = AffineOperands
    #: Where the multi-pass path keeps the scales and zero points in the workspace (0: no such path).
    _scale_offset = _zp_offset = 0

    def _output_kind(self, problem: AffineProblem) -> ElementKind:
        return problem.float_kind

    def _multi_pass_workspace(self, problem: AffineProblem, stats_bytes: int) -> int:
        """The range statistics, then the scales and (ASYMMETRIC) the int32 zero points."""
        count = math.prod(problem.param_shape) if problem.param_shape else 1
        self._scale_offset = _align(stats_bytes)
        self._zp_offset = self._scale_offset + _align(count * problem.scale_dtype.itemsize)
        return self._zp_offset + (_align(count * 4) if problem.mode is QuantMode.ASYMMETRIC else 0)

    def _setup(self, problem: AffineProblem) -> None:
        self._zp_source = ZP_INT32 if self._asymmetric else ZP_VALUE
        self._info = ELEMENTS[problem.float_kind]

    # ---- selection ----------------------------------------------------------------------------

    @classmethod
    def select(
        cls, stream: Any, desc: DynamicRangeFakeQuantizeDescriptor, pref: types.PlanPreference | None = None
    ) -> DynamicRangeFakeQuantizePlan:
        """Validate ``desc``, pick the backend and the kernel path, compile on first use.

        Raises InvalidProblem for a malformed descriptor (bits outside 1-8, SYMMETRIC with 1 bit,
        a group size that does not divide its axis, ...).
        """
        problem = dynamic_fake_quantize_problem(desc)
        if choose_backend(pref, stream, SCHEDULES[_OP]) is types.BackendKind.REFERENCE:
            return cls(desc, problem, None, REFERENCE_VARIANT)
        device_id = stream_device_id(stream)
        info = device_info(device_id)
        choice = choose_segments(_OP, problem, info, None if pref is None else pref.schedule)
        if choice.geometries is not None:
            fused, kind, in_place = _prepare_fused(problem, choice, device_id), choice.tag, None
            if choice.schedule == "row-shares":  # not in place: a twin that is
                twin = choose_segments(_OP, problem, info, out_of_place=False)
                in_place = _prepare_fused(problem, twin, device_id)
                kind = f"{kind}+in-place:{twin.tag}"
            variant = f"{problem.scope.kind}/{problem.mode.value}/{kind}"
            return cls(desc, problem, device_id, variant, fused=fused, in_place=in_place)
        passes = RangePasses.prepare(problem, device_id)
        op = FakeOp.forward(problem.rounding)
        rows_choice = choose_fake_rows(problem, op, info)
        rows, rows_variant = prepare_fake_rows(problem, op, device_id, rows_choice.dense)
        return cls(desc, problem, device_id, f"{passes.kind}+{rows_variant}", passes=passes, rows=rows)

    # ---- arguments ----------------------------------------------------------------------------

    def _check(self, args: DynamicRangeFakeQuantizeArgs) -> AffineOperands:
        p = self.problem
        x = self._tensor(args.input, "input", p.shape, self._info)
        y = self._tensor(args.output, "output", p.shape, self._info)
        scale = self._param_output(args.scale_out, "scale_out", self._param_dtype, required=False)
        zp: Operand | None = None
        if self._asymmetric:
            zp = self._param_output(args.zero_point_out, "zero_point_out", self._int32, required=False)
        elif args.zero_point_out is not None:
            raise InvalidProblem("zero_point_out must be None in SYMMETRIC mode (the zero point is 0)")
        seed, offset = self._rng(self._stochastic, args.rng_seed, args.rng_offset)
        written = (("output", y), ("scale_out", scale), ("zero_point_out", zp))
        check_outputs(written, (("input", x),), in_place=("output", "input"))
        return AffineOperands(x, y, scale, zp, seed, offset)

    # ---- execution ----------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: AffineOperands) -> None:
        assert self.device_id is not None
        scale_ptr = 0 if a.scale is None else a.scale.ptr
        zp_ptr = 0 if a.zp is None else a.zp.ptr
        stochastic = self._stochastic
        fused = self._fused
        if fused is not None:
            if a.x.ptr == a.y.ptr and self._in_place is not None:  # in place: the twin that may run so
                fused = self._in_place
            launch = fused.pick(a.x.ptr, a.y.ptr)
            params = launch.params
            params.x, params.y, params.scale_out, params.zp_out = a.x.ptr, a.y.ptr, scale_ptr, zp_ptr
            if stochastic:
                set_rng(params, a.seed, a.offset)
            launch_on(self.device_id, handle, launch)
            return
        assert workspace is not None and self._passes is not None and self._rows is not None
        asym = self._asymmetric
        scale_ptr = scale_ptr or workspace.ptr + self._scale_offset
        if asym:
            zp_ptr = zp_ptr or workspace.ptr + self._zp_offset
        self._passes.launch(self.device_id, handle, a.x.ptr, workspace.ptr, scale_ptr, zp_ptr if asym else 0)
        rows = self._rows.pick(a.x.ptr, a.y.ptr)
        params = rows.params
        params.x, params.out = a.x.ptr, a.y.ptr
        params.scale_ptr, params.scale_value = scale_ptr, 1.0
        params.zp_ptr, params.zp_value = (zp_ptr, 0) if asym else (0, 0)
        if self._rows.flat:
            params.zp_source = self._zp_source
        else:
            params.layout.flags = self._zp_source
        if stochastic:
            set_rng(params, a.seed, a.offset)
        launch_on(self.device_id, handle, rows)

    def _run_reference(self, a: AffineOperands) -> None:
        p = self.problem
        shape = p.shape if p.shape else (1,)
        x = self._host_view(a.x, p.shape, self._info)
        uniform = reference_uniform(shape, a.seed, a.offset) if self._stochastic else None
        y, scale, zp = reference.dynamic_fake_quantize(x, p.scope, p.mode, p.q_min, p.q_max, p.precision, uniform)
        self._write_host(a.y, y)
        if a.scale is not None:
            self._write_host(a.scale, scale)
        if a.zp is not None and zp is not None:
            self._write_host(a.zp, zp)


__all__ = [
    "DynamicRangeFakeQuantizeArgs",
    "DynamicRangeFakeQuantizeDescriptor",
    "DynamicRangeFakeQuantizePlan",
]
