"""Segment geometry and the range passes: the machinery of every plan that computes per-segment
parameters from the data (dynamic range, dynamic fake quantization, the qgZ and DeepSpeed-format plans).

* the **fused single pass**: a team of threads holds one contiguous segment in registers, reduces
  its range and writes its codes; :func:`fused_segment_geometry` picks the vector width and team,
  :class:`SegmentLayoutArgs` is the kernels' by-value ``SegmentLayout``;
* the **multi-pass** range: statistics reset, per-segment range (lo, hi, non-finite flag) by
  order-independent integer atomics (or block-reduced for TensorScope), parameters
  (:class:`RangePasses`, ``kernels/dynamic_range.cu``).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._device import DeviceInfo, device_info
from ._kernel_names import (
    CLUSTER_BLOCKS,
    DENSE_FLOAT_KINDS,
    DENSE_NV,
    LANES_SHAPES,
    ROWS_BLOCK,
    ROWS_NV,
    SHARES_BLOCK,
    SHARES_BLOCKS,
    dynamic_range_unit,
)
from ._launch import LaunchPair, PreparedLaunch, fields, launch_on, occupancy_grid, params_struct, vector_alignment
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, contiguous_segment_length, row_layout
from ._problems import AffineProblem
from ._segment_geometry import (
    MAX_TEAM,
    SegmentGeometry,
    SegmentLayoutArgs,
    fused_segment_geometry,
    mode_code,
    segment_elements_per_thread,
    segment_layout,
)
from ._tuning import TUNING, kernel_options
from .compiler import load_kernels, template_name
from .elements import ELEMENTS, acc_cpp, acc_ctype
from .types import MathPrecision, QuantMode, TensorScope


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


def fused_geometries(problem: AffineProblem, busy_threads: int) -> tuple[SegmentGeometry, SegmentGeometry] | None:
    """The fused pass of ``problem`` for aligned operands and its element-I/O twin, or None (multi-pass)."""
    geometry = segment_geometry(problem, busy_threads, ELEMENTS[problem.float_kind].vec_max)
    if geometry is None:
        return None
    fallback = segment_geometry(problem, busy_threads, 1)
    assert fallback is not None
    return geometry, fallback


#: Threads per block of ``dynamic_quantize_dense`` / ``dynamic_fake_quantize_dense``.
DENSE_BLOCK = TUNING.dense_block


def dense_geometry(
    problem: AffineProblem, geometry: SegmentGeometry, busy_threads: int
) -> tuple[SegmentGeometry, int] | None:
    """The launch of ``dynamic_quantize_dense`` for the fused pass ``geometry``, and its vectors
    (of 8 elements) per thread ``nv``; None where the specialised kernel does not apply.

    It serves nearest rounding of F16 / BF16 segments of exactly ``team * 8 * nv`` elements
    (team a power of two up to one block of :data:`DENSE_BLOCK`, nv in ``DENSE_NV``) with 16-byte
    vector I/O: the most vectors per thread, fewer (a wider team) while that leaves SMs idle.
    F32 stays on the generic kernel, which serves it better (docs/performance.md).
    """
    if problem.stochastic or problem.float_kind not in DENSE_FLOAT_KINDS or geometry.vec != 8:
        return None
    for nv in sorted(DENSE_NV, reverse=True):
        team, rem = divmod(geometry.length, 8 * nv)
        if rem or team == 0 or team > DENSE_BLOCK or team & (team - 1):
            continue
        while nv > 1 and team * 2 <= DENSE_BLOCK and geometry.segments * team < busy_threads:
            team, nv = team * 2, nv // 2
        return SegmentGeometry(geometry.segments, geometry.length, 8, True, team, DENSE_BLOCK), nv
    return None


def lanes_geometry(
    problem: AffineProblem, geometry: SegmentGeometry, info: DeviceInfo
) -> tuple[SegmentGeometry, tuple[int, int, int], int] | None:
    """The launch of ``dynamic_quantize_lanes`` for the fused pass ``geometry``: its geometry (team
    = the lanes of one segment), shape ``(lanes, nv, unroll)`` of :data:`LANES_SHAPES` and grid;
    None where it does not apply.

    It serves nearest rounding of F16 / BF16 segments of exactly ``lanes * 8 * nv`` elements for
    one of the shapes, with 16-byte vector I/O. Large problems take the first shape of that
    length, problems whose threads would leave multiprocessors idle the last (more lanes per
    segment); blocks of 256 threads for every size (no halving for small problems). The grid covers every segment (the kernel makes one pass, no
    grid-stride loop).
    """
    if problem.stochastic or problem.float_kind not in DENSE_FLOAT_KINDS or geometry.vec != 8:
        return None
    if geometry.segments >= 2**31 or geometry.segments * geometry.length // 8 >= 2**32:
        return None  # the kernel indexes segments and 16-byte vectors in 32 bits
    shapes = [shape for shape in LANES_SHAPES if shape[0] * 8 * shape[1] == geometry.length]
    if not shapes:
        return None
    segments = geometry.segments
    shape = shapes[0] if segments * shapes[0][0] >= info.busy_threads else shapes[-1]
    lanes, _, unroll = shape

    def grid(block: int) -> int:
        return -(-segments // (block // lanes * unroll))

    block = DENSE_BLOCK
    return SegmentGeometry(segments, geometry.length, 8, True, lanes, block), shape, grid(block)


def cluster_geometry(
    problem: AffineProblem, geometry: SegmentGeometry, info: DeviceInfo
) -> tuple[SegmentGeometry, int] | None:
    """The launch of ``dynamic_quantize_cluster`` (sm_90 and later) for the fused pass ``geometry``:
    its geometry (a cluster of ``CLUSTER_BLOCKS`` blocks per segment, one vector of 8 elements per
    thread, team = the block) and grid (``segments * CLUSTER_BLOCKS``); None where it does not apply.

    It serves nearest rounding of F16 / BF16 segments of ``CLUSTER_BLOCKS * 8 * block`` elements
    (block a multiple of 32 threads, at most 1024) when they are few: at most two clusters' blocks
    per multiprocessor in all (16 rows of 8192 elements), where a block per segment would leave
    most multiprocessors idle.
    """
    if problem.stochastic or problem.float_kind not in DENSE_FLOAT_KINDS or geometry.vec != 8:
        return None
    if info.arch.major < 9:
        return None
    per_block, rem = divmod(geometry.length, CLUSTER_BLOCKS * 8)
    if rem or per_block % 32 or per_block > 1024 or geometry.segments * CLUSTER_BLOCKS > 2 * info.sm_count:
        return None
    grid = geometry.segments * CLUSTER_BLOCKS
    return SegmentGeometry(geometry.segments, geometry.length, 8, True, per_block, per_block), grid


#: ``shares_geometry``: at least this many multiprocessors per segment (few segments).
SHARES_SMS_PER_SEGMENT = 4


@dataclass(frozen=True)
class SharesLaunch:
    """The launch of ``dynamic_quantize_row_shares`` / ``dynamic_fake_quantize_row_shares``:
    ``geometry`` (team = block = :data:`~quantplan._families.SHARES_BLOCK` threads), ``blocks``
    per segment (the template's ``BLOCKS``, one of :data:`~quantplan._families.SHARES_BLOCKS`) and
    ``grid`` (``segments * blocks``)."""

    geometry: SegmentGeometry
    blocks: int
    grid: int

    def describe(self) -> str:
        """Short variant tag for KernelSku.variant."""
        team = self.geometry.team
        return f"fused-single-pass[dense-row-shares,{self.blocks}x{team}t-per-segment,{self.blocks}vec8-per-thread]"


def shares_geometry(problem: AffineProblem, geometry: SegmentGeometry, info: DeviceInfo) -> SharesLaunch | None:
    """The launch of the row-shares kernels for the fused pass ``geometry``, or None where they do
    not apply.

    They serve nearest rounding of F16 / BF16 segments of ``SHARES_BLOCK * 8 * blocks`` elements
    (blocks in :data:`~quantplan._families.SHARES_BLOCKS`: rows of 4096, 8192, 16384) with 16-byte
    vector I/O when they are few: at least :data:`SHARES_SMS_PER_SEGMENT` multiprocessors per
    segment (16 rows of 8192: 64 blocks), where one block per segment
    would leave most multiprocessors idle. Every block of a segment reads all of it (L2 serves the repeats) and
    writes its share, so no block waits for another (no cluster: any architecture; it beats
    ``dynamic_quantize_cluster`` there). The kernels read the
    whole segment after other blocks may have written theirs: the output must not overlap the
    input (the fake-quantize plan keeps an in-place launch beside it).
    """
    if problem.stochastic or problem.float_kind not in DENSE_FLOAT_KINDS or geometry.vec != 8:
        return None
    blocks, rem = divmod(geometry.length, SHARES_BLOCK * 8)
    if rem or blocks not in SHARES_BLOCKS:
        return None
    if geometry.segments * SHARES_SMS_PER_SEGMENT > info.sm_count:
        return None
    grid = geometry.segments * blocks
    g = SegmentGeometry(geometry.segments, geometry.length, 8, True, SHARES_BLOCK, SHARES_BLOCK)
    return SharesLaunch(g, blocks, grid)


@dataclass(frozen=True)
class RowsLaunch:
    """The launch of ``dynamic_quantize_rows`` / ``dynamic_fake_quantize_rows``: ``geometry`` (team =
    block = :data:`~quantplan._families.ROWS_BLOCK` threads per segment), ``nv`` vectors of 8
    elements per thread and ``grid`` (one block per segment)."""

    geometry: SegmentGeometry
    nv: int
    grid: int


def rows_geometry(problem: AffineProblem, geometry: SegmentGeometry) -> RowsLaunch | None:
    """The launch of the rows kernels for the fused pass ``geometry``, or None where they do not apply.

    They serve nearest rounding of F16 / BF16 segments of exactly ``ROWS_BLOCK * 8 * nv``
    elements (nv in :data:`~quantplan._families.ROWS_NV`: rows of 2048, 4096, 8192) with 16-byte
    vector I/O: one block per segment (grid-stride past the grid's limit), not a persistent grid
    that prefetches each block's next row (docs/performance.md).
    """
    if problem.stochastic or problem.float_kind not in DENSE_FLOAT_KINDS or geometry.vec != 8:
        return None
    nv, rem = divmod(geometry.length, ROWS_BLOCK * 8)
    if rem or nv not in ROWS_NV:
        return None
    g = SegmentGeometry(geometry.segments, geometry.length, 8, True, ROWS_BLOCK, ROWS_BLOCK)
    return RowsLaunch(g, nv, min(geometry.segments, 2**31 - 1))


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


__all__ = [
    "DENSE_BLOCK",
    "dense_geometry",
    "cluster_geometry",
    "divisor_inverse",
    "shares_geometry",
    "SharesLaunch",
    "lanes_geometry",
    "RowsLaunch",
    "rows_geometry",
    "MAX_TEAM",
    "SEGMENT_PARAMS",
    "RangePasses",
    "SegmentGeometry",
    "SegmentLayoutArgs",
    "fused_geometries",
    "fused_segment_geometry",
    "mode_code",
    "prepare_segments",
    "range_divisor",
    "range_divisor_of",
    "segment_elements_per_thread",
    "segment_geometry",
    "segment_layout",
]
