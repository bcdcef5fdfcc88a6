"""Segment launches and the range passes: the machinery of every plan that computes per-segment
parameters from the data (dynamic range, dynamic fake quantization, the qgZ and DeepSpeed-format plans).

* the **fused single pass**: a team of threads holds one contiguous segment in registers, reduces
  its range and writes its codes; :func:`prepare_segments` prepares the schedule that
  :mod:`quantplan.runtime._selection` chose, :class:`SegmentLayoutArgs` is the kernels' by-value
  ``SegmentLayout``;
* the **multi-pass** range: statistics reset, per-segment range (lo, hi, non-finite flag) by
  order-independent integer atomics (or block-reduced for TensorScope), parameters
  (:class:`RangePasses`, ``kernels/dynamic_range.cu``);
* :class:`RangePlanState`: the constructor and the state the two dynamic-range plans share.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import ClassVar, Generic, Protocol, TypeVar

import numpy as np

from quantplan.runtime._device import device_info
from quantplan.runtime._kernel_names import dynamic_range_unit
from quantplan.runtime._launch import (
    LaunchPair,
    PreparedLaunch,
    fields,
    launch_on,
    occupancy_grid,
    params_struct,
    vector_alignment,
)
from quantplan.runtime._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, row_layout
from quantplan.runtime._problems import AffineProblem
from quantplan.runtime._segment_geometry import (
    MAX_TEAM,
    SegmentGeometry,
    SegmentLayoutArgs,
    fused_segment_geometry,
    mode_code,
    segment_elements_per_thread,
    segment_layout,
)
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.vocabulary.elements import ELEMENTS, acc_cpp, acc_ctype
from quantplan.vocabulary.types import ElementKind, MathPrecision, QuantMode, TensorScope


def range_divisor(problem: AffineProblem) -> float:
    """The divisor of the dynamic scale: ``fp8_max`` (FP8), ``q_max`` (SYMMETRIC) or ``q_max - q_min``."""
    element = problem.format.element
    if element.code_range is None:  # FP8: the format's largest finite value
        return element.max_finite
    return range_divisor_of(problem.mode, problem.q_min, problem.q_max)


def divisor_inverse(divisor: float) -> float:
    """``rn(1 / divisor)`` in float32 (IEEE float32 division, as kernels compute it), as a Python float."""
    return float(np.float32(1.0) / np.float32(divisor))


def range_divisor_of(mode: QuantMode, q_min: int, q_max: int) -> float:
    """The divisor of the dynamic scale of integer codes: ``q_max`` (SYMMETRIC) or ``q_max - q_min``."""
    return float(q_max if mode is QuantMode.SYMMETRIC else q_max - q_min)


#: The fused-pass argument block of ``dynamic_quantize_segments`` / ``dynamic_fake_quantize_segments``
#: (and their specialised kernels) per precision: input, output, parameter outputs, layout, divisor,
#: Philox seed / offset, and ``divisor_inverse``: rn(1 / divisor) in float32 (:func:`divisor_inverse`,
#: read by ``dynamic_quantize_lanes``; last, so the other fields keep their offsets).
SEGMENT_PARAMS = {
    precision: params_struct(
        "SegmentKernelParams",
        [
            *fields(ctypes.c_uint64, "x", "y", "scale_out", "zp_out"),
            ("layout", SegmentLayoutArgs),
            ("divisor", acc_ctype(precision)),
            *fields(ctypes.c_uint64, "seed_ptr", "offset_ptr", "seed_value", "offset_value"),
            ("divisor_inverse", ctypes.c_float),
        ],
    )
    for precision in MathPrecision
}


def prepare_segments(
    problem: AffineProblem,
    geometries: tuple[SegmentGeometry, SegmentGeometry],
    family: str,
    unit: list[str],
    name: Callable[[SegmentGeometry], str],
    out_bits: int,
    device_id: int,
    dense: tuple[str, SegmentGeometry] | None = None,
    dense_grid: int | None = None,
) -> LaunchPair:
    """Compile (first use) ``unit`` of ``family`` and prepare the fused pass of ``problem``
    (argument block :data:`SEGMENT_PARAMS`) for aligned operands and its element-I/O twin.
    ``name(geometry)``: the kernel's name expression; ``out_bits``: bits per output element;
    ``dense``: (name, geometry) of a specialised kernel for aligned operands (one block per
    block-full of segments, no grid-stride, unless ``dense_grid`` gives the grid), same argument
    block."""
    info = device_info(device_id)
    functions = load_kernels(family, unit, info.arch, device_id, kernel_options())
    params_type = SEGMENT_PARAMS[problem.precision]
    divisor = range_divisor(problem)
    inverse = divisor_inverse(divisor)

    def prepare(g: SegmentGeometry, kernel: str | None = None) -> PreparedLaunch:
        fn = functions[kernel or name(g)]
        layout = g.args(problem.q_min, problem.q_max, problem.mode)
        if kernel:
            grid = g.blocks(2**31 - 1) if dense_grid is None else dense_grid
        else:
            grid = occupancy_grid(fn, g.block, g.blocks(2**62), info)
        return PreparedLaunch(fn, grid, g.block, params_type, layout=layout, divisor=divisor, divisor_inverse=inverse)

    primary, fallback = geometries
    in_bits = ELEMENTS[problem.float_kind].storage_bits
    return LaunchPair(
        prepare(primary) if dense is None else prepare(dense[1], dense[0]),
        prepare(fallback),
        vector_alignment(primary.vec, in_bits),
        vector_alignment(primary.vec, out_bits),
    )


_INIT_PARAMS = params_struct("RangeInitParams", [("stats", ctypes.c_uint64), ("count", ctypes.c_int64)])
_STATS_PARAMS = params_struct(
    "RangeStatsParams", [("x", ctypes.c_uint64), ("stats", ctypes.c_uint64), ("layout", RowLayoutArgs)]
)
_TENSOR_STATS_PARAMS = params_struct(
    "TensorStatsParams",
    [("x", ctypes.c_uint64), ("stats", ctypes.c_uint64), ("n_vectors", ctypes.c_int64), ("mode", ctypes.c_int32)],
)
_PARAMS_PARAMS = {
    precision: params_struct(
        "RangeParamsParams",
        [
            *fields(ctypes.c_uint64, "stats", "scale_out", "zp_out"),
            ("count", ctypes.c_int64),
            *fields(ctypes.c_int32, "mode", "q_min", "q_max"),
            ("divisor", acc_ctype(precision)),
        ],
    )
    for precision in MathPrecision
}


class RangePasses:
    """The multi-pass path's parameter launches: statistics reset, range statistics (row layout by
    integer atomics, or block-reduced for TensorScope) and parameters, written to ``scale_out`` /
    ``zp_out`` device arrays. Shared by DynamicRangeQuantizePlan and DynamicRangeFakeQuantizePlan.

    ``stats_bytes``: the workspace the statistics take (three integer keys per segment).
    """

    __slots__ = ("init", "kind", "params", "stats", "stats_bytes")

    def __init__(
        self, init: PreparedLaunch, stats: LaunchPair, params: PreparedLaunch, stats_bytes: int, kind: str
    ) -> None:
        self.init, self.stats, self.params = init, stats, params
        self.stats_bytes, self.kind = stats_bytes, kind

    @property
    def launches(self) -> tuple[PreparedLaunch, ...]:
        return (self.init, *self.stats.launches, self.params)

    @classmethod
    def prepare(cls, problem: AffineProblem, device_id: int) -> RangePasses:
        """Compile (first use) and prepare the range passes of ``problem`` on ``device_id``."""
        info = device_info(device_id)
        functions = load_kernels(
            "dynamic_range", dynamic_range_unit(problem.float_kind), info.arch, device_id, kernel_options()
        )
        acc = acc_cpp(problem.precision)
        float_info = ELEMENTS[problem.float_kind]
        tag = float_info.cpp_tag
        mode = mode_code(problem.mode)

        def stats_launch(layout: RowLayout) -> PreparedLaunch:
            fn = functions[template_name("range_stats_rows", tag, layout.vec, True)]
            grid = occupancy_grid(fn, BLOCK_THREADS, layout.blocks(2**62), info)
            return PreparedLaunch(
                fn, grid, BLOCK_THREADS, _STATS_PARAMS, layout=layout.args(problem.q_min, problem.q_max)
            )

        def tensor_stats_launch(vec: int) -> PreparedLaunch:
            fn = functions[template_name("range_stats_tensor", tag, vec)]
            n_vectors = problem.numel // vec
            grid = occupancy_grid(fn, BLOCK_THREADS, -(-n_vectors // BLOCK_THREADS), info)
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
            divisor=range_divisor(problem),
        )
        in_bytes = float_info.storage_bits // 8
        key_bytes = 8 if problem.precision is MathPrecision.F64 else 4
        if isinstance(problem.scope, TensorScope):
            vec = float_info.vec_max
            while problem.numel % vec:
                vec //= 2
            primary, fallback, kind = tensor_stats_launch(vec), tensor_stats_launch(1), "block-reduced-range"
        else:
            layout = row_layout(problem.shape, problem.scope, float_info.vec_max, False, info.busy_threads)
            vec = layout.vec
            primary = stats_launch(layout)
            fallback = stats_launch(row_layout(problem.shape, problem.scope, 1, False, info.busy_threads))
            kind = "range-atomics"
        stats = LaunchPair(primary, fallback, min(16, vec * in_bytes))
        return cls(init, stats, params, 3 * key_bytes * count, kind)

    def launch(self, device_id: int, handle: int, x_ptr: int, stats_ptr: int, scale_ptr: int, zp_ptr: int) -> None:
        """Enqueue reset, statistics and parameters on raw stream ``handle`` (``zp_ptr`` 0: none)."""
        stats = self.stats.pick(x_ptr, 0)
        self.init.params.stats = stats_ptr
        stats.params.x = x_ptr
        stats.params.stats = stats_ptr
        self.params.params.stats = stats_ptr
        self.params.params.scale_out = scale_ptr
        self.params.params.zp_out = zp_ptr
        launch_on(device_id, handle, self.init, stats, self.params)


class _Launches(Protocol):
    @property
    def launches(self) -> tuple[PreparedLaunch, ...]: ...


DescT = TypeVar("DescT")
RowsT = TypeVar("RowsT", bound=_Launches)


class RangePlanState(Generic[DescT, RowsT]):
    """The constructor and the state DynamicRangeQuantizePlan and DynamicRangeFakeQuantizePlan
    share: the fused single pass (``fused``; ``in_place`` its twin for calls whose output is the
    input, where ``fused`` must not run in place), or the multi-pass path (``passes``, then the
    elementwise ``rows``), and the fields their argument checks read.

    Mixed in before :class:`~quantplan.runtime._plan.Plan` (this module sits below it), whose
    constructor it calls with the prepared launches and the workspace. A plan says what differs:
    ``_output_kind`` (the element its output holds), ``_multi_pass_workspace`` (the multi-pass
    path's bytes, from the range statistics' ``stats_bytes``) and ``_setup`` (its own fields).
    """

    _extract_fields: ClassVar[tuple[str, ...]] = (
        "input",
        "output",
        "scale_out",
        "zero_point_out",
        "rng_seed",
        "rng_offset",
    )

    def __init__(
        self,
        desc: DescT,
        problem: AffineProblem,
        device_id: int | None,
        variant: str,
        fused: LaunchPair | None = None,
        passes: RangePasses | None = None,
        rows: RowsT | None = None,
        in_place: LaunchPair | None = None,
    ) -> None:
        prepared: tuple[PreparedLaunch, ...] = fused.launches if fused is not None else ()
        if in_place is not None:
            prepared += in_place.launches
        workspace = 0
        if passes is not None and rows is not None:
            prepared = (*passes.launches, *rows.launches)
            workspace = self._multi_pass_workspace(problem, passes.stats_bytes)
        plan_init: Callable[..., None] = super().__init__  # Plan's, next in the MRO
        kinds = problem.float_kind, self._output_kind(problem)
        plan_init(problem, device_id, *kinds, variant, workspace_bytes=workspace, prepared=prepared)
        self.descriptor = desc
        self._fused, self._passes, self._rows, self._in_place = fused, passes, rows, in_place
        self._param_shape = problem.param_shape
        self._tensor_scope = isinstance(problem.scope, TensorScope)
        self._param_dtype = problem.scale_dtype
        self._int32 = np.dtype(np.int32)
        self._stochastic = problem.stochastic
        self._asymmetric = problem.mode is QuantMode.ASYMMETRIC
        self._setup(problem)

    def _output_kind(self, problem: AffineProblem) -> ElementKind:
        """The element the plan's output holds (codes, or the input's float)."""
        raise NotImplementedError

    def _multi_pass_workspace(self, problem: AffineProblem, stats_bytes: int) -> int:
        """Workspace bytes of the multi-pass path: the range statistics (what more a plan keeps
        there, it adds)."""
        return stats_bytes

    def _setup(self, problem: AffineProblem) -> None:
        """The plan's own fields (after the shared ones)."""


__all__ = [
    "divisor_inverse",
    "MAX_TEAM",
    "SEGMENT_PARAMS",
    "RangePasses",
    "RangePlanState",
    "SegmentGeometry",
    "SegmentLayoutArgs",
    "fused_segment_geometry",
    "mode_code",
    "prepare_segments",
    "range_divisor",
    "range_divisor_of",
    "segment_elements_per_thread",
    "segment_layout",
]
