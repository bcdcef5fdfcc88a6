"""One place chooses the kernel schedule of the affine plans.

A *schedule* is how a kernel's threads cover the problem's segments (rows, groups). Each op
lists the schedules it has in one global order, :data:`ORDER`; ``select`` asks this module,
which takes the first of the op's schedules that **serves** the problem (a fact: the kernel
computes it) and, where the schedule has a size heuristic, that it **prefers** on this device
(the few-segment schedules). ``PlanPreference(schedule=name)`` forces a schedule: serving is
then enough, and a name the op does not list, or a schedule that cannot serve the problem,
raises :class:`~quantplan.vocabulary.errors.Unsupported`. Every schedule computes the same bits (the
reference's); only the time differs. Launch details inside a schedule (vectors per thread,
team widening, the grid) stay with the schedule and depend on the device as before.

Decision table (ops: DRQ ``DynamicRangeQuantizePlan``, DRFQ ``DynamicRangeFakeQuantizePlan``,
Q / DQ ``QuantizePlan`` / ``DequantizePlan``, FQ ``FakeQuantizePlan`` (and the elementwise
kernels of ``FakeQuantizeBackwardPlan``), SQ ``SwizzledQuantizePlan``, DSQ / MoQ / DSR the
DeepSpeed-format quantize, MoQ fake quantize and quantized reduction):

================  ==================================  ===============================  =================
schedule          serves (threads per segment)        preferred, by default            ops
================  ==================================  ===============================  =================
row-shares        F16/BF16 nearest, rows of 4096,     segments x 4 <= SMs              DRQ, DRFQ (out
                  8192, 16384 (2/4/8 blocks of 256,                                    of place)
                  each reads the row, writes a share)
cluster           F16/BF16 nearest, sm_90+, rows of   segments x 8 <= 2 x SMs          DRQ, DRFQ, DSQ,
                  64 x block (a cluster of 8 blocks;                                   MoQ
                  block % 32 == 0, <= 1024; DSQ/MoQ
                  <= 256)
lanes             F16/BF16 nearest, groups of 128     DSQ: the dense team is 16 with   DRQ, DSQ
                  (4 or 16 lanes of a warp; DSQ: no   one vector per thread
                  swizzle across ranks)
rows              F16/BF16 nearest, rows of 2048 x    always                           DRQ, DRFQ
                  nv, nv 1/2/4 (a block of 256 holds
                  the row in registers)
dense             F16/BF16 segments of team x 8 x nv  always                           DRQ, DRFQ, SQ,
                  (team a power of two <= 256; DRQ                                     DSQ, MoQ, DSR
                  nearest; DRFQ both roundings; qgZ
                  no LoCo, < 2**31 elements; MoQ
                  SYMMETRIC nearest; DSR output
                  groups of team x 8)
fused             contiguous segments <= 32768        always                           DRQ, DRFQ, SQ,
                  (F64 16384; 4-bit: even), a team                                     DSQ, MoQ, DSR
                  per segment, vector I/O
fused-element-io  as fused, element I/O               never (misaligned operands       as fused
                                                      take it at ``run``)
dense-rows        rows with a per-row / per-vector    always                           Q, DQ (F16/BF16
                  parameter (``_layout.dense_row_                                      nearest), FQ
                  layout``, ``_layout.dense_rows``):
                  one (row, chunk) item per block
row-layout        every problem (FQ: not Tensor-      always                           Q, DQ, FQ
                  Scope), grid-stride row layout
flat              TensorScope, grid-stride flat       always                           FQ
two-pass          every problem: group parameters,    always                           SQ, DSQ, MoQ,
                  then every element                                                   DSR
multi-pass        every problem: range statistics,    always                           DRQ, DRFQ
                  parameters, then a row kernel
================  ==================================  ===============================  =================

Where an op differs from the one order, and why:

* DRFQ has no ``lanes`` (no fake-quantize lanes kernel: groups of 128 take ``dense``); its
  ``dense`` serves stochastic rounding too, and for nearest rounding keeps a resident grid whose
  teams prefetch their next segment. ``row-shares`` blocks read the whole segment after others
  wrote theirs, so it cannot run in place: DRFQ keeps an in-place twin, the first of its other
  schedules (:func:`choose_segments` with ``out_of_place=False``).
* DSQ / MoQ clusters hold at most 256 threads per block (the DeepSpeed-format kernels' bound).
* FQ on TensorScope has ``flat`` only; its other scopes have ``dense-rows`` and ``row-layout``.

Not chosen here yet (each has its own rule beside its launcher, and takes no forced schedule):
the gradient plans' dense rows (``quantize_backward``), ``DequantReducePlan`` and the
block-scaled plans (their schedule tables in ``_block_scaled_kernels`` /
``_block_scaled_tile_kernels``).

The kernels each schedule instantiates are listed by family in :mod:`quantplan.runtime._kernel_names`
from the same parameter sets this module reads (``DENSE_NV``, ``LANES_SHAPES``, ``ROWS_NV``,
``SHARES_BLOCKS``, ``QGZ_DENSE_NV``, ``DEEPSPEED_LANES_TEAMS``, ``DEEPSPEED_REDUCE_DENSE_NV``);
``tests/test_instantiations.py`` checks that the NVRTC sweep's list is exactly what selection
can ask for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quantplan.runtime._device import DeviceInfo
from quantplan.runtime._kernel_names import (
    CLUSTER_BLOCKS,
    DEEPSPEED_LANES_TEAMS,
    DEEPSPEED_REDUCE_DENSE_NV,
    DENSE_FLOAT_KINDS,
    DENSE_NV,
    LANES_SHAPES,
    QGZ_DENSE_NV,
    ROW_DENSE_FLOAT_KINDS,
    ROWS_BLOCK,
    ROWS_NV,
    SHARES_BLOCK,
    SHARES_BLOCKS,
    cluster_kernel_name,
    dense_kernel_name,
    dynamic_fake_cluster_name,
    dynamic_fake_dense_name,
    dynamic_fake_rows_name,
    dynamic_fake_shares_name,
    lanes_kernel_name,
    rows_kernel_name,
    shares_kernel_name,
)
from quantplan.runtime._layout import (
    DenseRows,
    RowLayout,
    contiguous_segment_length,
    dense_block,
    dense_row_layout,
    dense_rows,
    dense_unroll,
    row_layout,
)
from quantplan.runtime._problems import AffineProblem, CodeRangeProblem
from quantplan.runtime._segment_geometry import (
    DENSE_MAX_ELEMENTS,
    MAX_TEAM,
    QGZ_ELEMENTS_PER_THREAD,
    SegmentGeometry,
    fused_segment_geometry,
    mode_code,
    segment_elements_per_thread,
)
from quantplan.runtime._tuning import TUNING
from quantplan.vocabulary._kinds import FakeOp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import Unsupported
from quantplan.vocabulary.types import ElementKind, Rounding, TensorScope

#: Every schedule, in the one order every op tries its own in (see the module's table).
ORDER = (
    "row-shares",
    "cluster",
    "lanes",
    "rows",
    "dense",
    "fused",
    "fused-element-io",
    "dense-rows",
    "row-layout",
    "flat",
    "two-pass",
    "multi-pass",
)


def _of(*names: str) -> tuple[str, ...]:
    assert set(names) <= set(ORDER), names
    return tuple(s for s in ORDER if s in names)


#: The schedules of each op, in :data:`ORDER` (what ``PlanPreference(schedule=...)`` accepts).
SCHEDULES: dict[str, tuple[str, ...]] = {
    "dynamic_quantize": _of(
        "row-shares", "cluster", "lanes", "rows", "dense", "fused", "fused-element-io", "multi-pass"
    ),
    "dynamic_fake_quantize": _of("row-shares", "cluster", "rows", "dense", "fused", "fused-element-io", "multi-pass"),
    "quantize": _of("dense-rows", "row-layout"),
    "dequantize": _of("dense-rows", "row-layout"),
    "fake_quantize": _of("dense-rows", "row-layout", "flat"),
    "swizzled_quantize": _of("dense", "fused", "fused-element-io", "two-pass"),
    "deepspeed_quantize": _of("cluster", "lanes", "dense", "fused", "fused-element-io", "two-pass"),
    "moq_fake_quantize": _of("cluster", "dense", "fused", "fused-element-io", "two-pass"),
    "deepspeed_reduce": _of("dense", "fused", "fused-element-io", "two-pass"),
}


def _forced_misfit(op: str, forced: str, why: str) -> Unsupported:
    return Unsupported(f"PlanPreference(schedule={forced!r}) cannot serve this problem ({op}): {why}")


# ---- fused single pass: dynamic range quantize, dynamic fake quantize -------------------------


def segment_geometry(problem: AffineProblem, busy_threads: int, vec_max: int) -> SegmentGeometry | None:
    """The fused single pass for ``problem``, or None where it does not apply.

    It applies when segments are contiguous (:func:`~quantplan.runtime._layout.contiguous_segment_length`),
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


def _vec8_nearest(problem: AffineProblem, geometry: SegmentGeometry) -> bool:
    """The specialised fused kernels' common ground: nearest rounding of F16 / BF16 with 16-byte vectors."""
    return not problem.stochastic and problem.float_kind in DENSE_FLOAT_KINDS and geometry.vec == 8


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
    if not _vec8_nearest(problem, geometry):
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
    = the lanes of one segment), shape ``(lanes, nv, unroll)`` of ``LANES_SHAPES`` and grid;
    None where it does not apply.

    It serves nearest rounding of F16 / BF16 segments of exactly ``lanes * 8 * nv`` elements for
    one of the shapes, with 16-byte vector I/O. Large problems take the first shape of that
    length, problems whose threads would leave multiprocessors idle the last (more lanes per
    segment); blocks of 256 threads for every size. The grid covers every segment (the kernel
    makes one pass, no grid-stride loop).
    """
    if not _vec8_nearest(problem, geometry):
        return None
    if geometry.segments >= 2**31 or geometry.segments * geometry.length // 8 >= 2**32:
        return None  # the kernel indexes segments and 16-byte vectors in 32 bits
    shapes = [shape for shape in LANES_SHAPES if shape[0] * 8 * shape[1] == geometry.length]
    if not shapes:
        return None
    segments = geometry.segments
    shape = shapes[0] if segments * shapes[0][0] >= info.busy_threads else shapes[-1]
    lanes, _, unroll = shape
    block = DENSE_BLOCK
    grid = -(-segments // (block // lanes * unroll))
    return SegmentGeometry(segments, geometry.length, 8, True, lanes, block), shape, grid


def cluster_geometry(
    problem: AffineProblem, geometry: SegmentGeometry, info: DeviceInfo, prefer: bool = True
) -> tuple[SegmentGeometry, int] | None:
    """The launch of ``dynamic_quantize_cluster`` (sm_90 and later) for the fused pass ``geometry``:
    its geometry (a cluster of ``CLUSTER_BLOCKS`` blocks per segment, one vector of 8 elements per
    thread, team = the block) and grid (``segments * CLUSTER_BLOCKS``); None where it does not apply.

    It serves nearest rounding of F16 / BF16 segments of ``CLUSTER_BLOCKS * 8 * block`` elements
    (block a multiple of 32 threads, at most 1024) on sm_90 and later; ``prefer``: only when they
    are few, at most two clusters' blocks per multiprocessor in all (16 rows of 8192 elements),
    where a block per segment would leave most multiprocessors idle.
    """
    if not _vec8_nearest(problem, geometry) or info.arch.major < 9:
        return None
    per_block, rem = divmod(geometry.length, CLUSTER_BLOCKS * 8)
    if rem or per_block % 32 or per_block > 1024:
        return None
    if prefer and geometry.segments * CLUSTER_BLOCKS > 2 * info.sm_count:
        return None
    grid = geometry.segments * CLUSTER_BLOCKS
    return SegmentGeometry(geometry.segments, geometry.length, 8, True, per_block, per_block), grid


#: ``shares_geometry``: at least this many multiprocessors per segment (few segments).
SHARES_SMS_PER_SEGMENT = 4


@dataclass(frozen=True)
class SharesLaunch:
    """The launch of ``dynamic_quantize_row_shares`` / ``dynamic_fake_quantize_row_shares``:
    ``geometry`` (team = block = ``SHARES_BLOCK`` threads), ``blocks`` per segment (the
    template's ``BLOCKS``, one of ``SHARES_BLOCKS``) and ``grid`` (``segments * blocks``)."""

    geometry: SegmentGeometry
    blocks: int
    grid: int

    def describe(self) -> str:
        """Short variant tag for KernelSku.variant."""
        team = self.geometry.team
        return f"fused-single-pass[dense-row-shares,{self.blocks}x{team}t-per-segment,{self.blocks}vec8-per-thread]"


def shares_geometry(
    problem: AffineProblem, geometry: SegmentGeometry, info: DeviceInfo, prefer: bool = True
) -> SharesLaunch | None:
    """The launch of the row-shares kernels for the fused pass ``geometry``, or None where they do
    not apply.

    They serve nearest rounding of F16 / BF16 segments of ``SHARES_BLOCK * 8 * blocks`` elements
    (blocks in ``SHARES_BLOCKS``: rows of 4096, 8192, 16384) with 16-byte vector I/O; ``prefer``:
    only when they are few, at least :data:`SHARES_SMS_PER_SEGMENT` multiprocessors per segment
    (16 rows of 8192: 64 blocks), where one block per segment would leave most multiprocessors
    idle. Every block of a segment reads all of it (L2 serves the repeats) and writes its share,
    so no block waits for another (no cluster: any architecture). The kernels read the whole
    segment after other blocks may have written theirs: the output must not overlap the input.
    """
    if not _vec8_nearest(problem, geometry):
        return None
    blocks, rem = divmod(geometry.length, SHARES_BLOCK * 8)
    if rem or blocks not in SHARES_BLOCKS:
        return None
    if prefer and geometry.segments * SHARES_SMS_PER_SEGMENT > info.sm_count:
        return None
    g = SegmentGeometry(geometry.segments, geometry.length, 8, True, SHARES_BLOCK, SHARES_BLOCK)
    return SharesLaunch(g, blocks, geometry.segments * blocks)


@dataclass(frozen=True)
class RowsLaunch:
    """The launch of ``dynamic_quantize_rows`` / ``dynamic_fake_quantize_rows``: ``geometry`` (team =
    block = ``ROWS_BLOCK`` threads per segment), ``nv`` vectors of 8 elements per thread and
    ``grid`` (one block per segment)."""

    geometry: SegmentGeometry
    nv: int
    grid: int


def rows_geometry(problem: AffineProblem, geometry: SegmentGeometry) -> RowsLaunch | None:
    """The launch of the rows kernels for the fused pass ``geometry``, or None where they do not apply.

    They serve nearest rounding of F16 / BF16 segments of exactly ``ROWS_BLOCK * 8 * nv``
    elements (nv in ``ROWS_NV``: rows of 2048, 4096, 8192) with 16-byte vector I/O: one block per
    segment (grid-stride past the grid's limit).
    """
    if not _vec8_nearest(problem, geometry):
        return None
    nv, rem = divmod(geometry.length, ROWS_BLOCK * 8)
    if rem or nv not in ROWS_NV:
        return None
    g = SegmentGeometry(geometry.segments, geometry.length, 8, True, ROWS_BLOCK, ROWS_BLOCK)
    return RowsLaunch(g, nv, min(geometry.segments, 2**31 - 1))


@dataclass(frozen=True)
class SegmentChoice:
    """The schedule of a dynamic-range plan.

    ``geometries``: the generic fused pass (aligned, element I/O: the twin every fused schedule
    keeps for misaligned operands); None for ``multi-pass``. ``kernel`` / ``geometry`` / ``grid``:
    the specialised kernel's name expression, geometry and grid (None: the generic fused pass;
    grid None: one block per block-full of segments). ``tag``: the variant tag. ``resident``: the
    grid is cut to the blocks every SM holds at once (DRFQ ``dense``, nearest rounding).
    """

    schedule: str
    geometries: tuple[SegmentGeometry, SegmentGeometry] | None
    kernel: str | None = None
    geometry: SegmentGeometry | None = None
    grid: int | None = None
    tag: str = ""
    resident: bool = False


def _segment_schedule(
    op: str,
    schedule: str,
    problem: AffineProblem,
    geometries: tuple[SegmentGeometry, SegmentGeometry] | None,
    info: DeviceInfo,
    prefer: bool,
) -> SegmentChoice | None:
    """``schedule`` for ``problem``, or None where it does not serve (or, ``prefer``, is not preferred)."""
    if schedule == "multi-pass":
        return SegmentChoice(schedule, None)
    if geometries is None:
        return None
    g = geometries[0]
    fake = op == "dynamic_fake_quantize"
    f, c, high_first, mode = problem.float_kind, problem.code_kind, problem.high_first, mode_code(problem.mode)
    if schedule == "fused":
        return SegmentChoice(schedule, geometries, tag=g.describe())
    if schedule == "fused-element-io":
        return SegmentChoice(schedule, (geometries[1], geometries[1]), tag=geometries[1].describe())
    if schedule == "row-shares":
        shares = shares_geometry(problem, g, info, prefer)
        if shares is None:
            return None
        b = shares.blocks
        kernel = dynamic_fake_shares_name(f, mode, b) if fake else shares_kernel_name(f, c, high_first, mode, b)
        return SegmentChoice(schedule, geometries, kernel, shares.geometry, shares.grid, shares.describe())
    if schedule == "cluster":
        cluster = cluster_geometry(problem, g, info, prefer)
        if cluster is None:
            return None
        geometry, grid = cluster
        kernel = dynamic_fake_cluster_name(f, mode) if fake else cluster_kernel_name(f, c, high_first, mode)
        tag = f"fused-single-pass[dense-cluster,{CLUSTER_BLOCKS}x{geometry.team}t-per-segment,1vec8-per-thread]"
        return SegmentChoice(schedule, geometries, kernel, geometry, grid, tag)
    if schedule == "lanes":
        lanes = lanes_geometry(problem, g, info)
        if lanes is None:
            return None
        geometry, shape, grid = lanes
        tag = f"fused-single-pass[dense-lanes,{shape[0]}t-per-segment,{shape[1]}vec8-per-thread,x{shape[2]}]"
        return SegmentChoice(
            schedule, geometries, lanes_kernel_name(f, c, high_first, mode, shape), geometry, grid, tag
        )
    if schedule == "rows":
        rows = rows_geometry(problem, g)
        if rows is None:
            return None
        kernel = dynamic_fake_rows_name(f, mode, rows.nv) if fake else rows_kernel_name(f, c, high_first, mode, rows.nv)
        tag = f"fused-single-pass[dense-rows,{rows.geometry.team}t-per-segment,{rows.nv}vec8-per-thread]"
        return SegmentChoice(schedule, geometries, kernel, rows.geometry, rows.grid, tag)
    assert schedule == "dense", schedule
    # The fake kernel serves both roundings; dense_geometry describes the quantize kernel's (nearest).
    found = dense_geometry(replace(problem, rounding=Rounding.NEAREST_EVEN) if fake else problem, g, info.busy_threads)
    if found is None:
        return None
    dense, nv = found
    tag = f"fused-single-pass[dense,{dense.team}t-per-segment,{nv}vec8-per-thread]"
    if not fake:
        return SegmentChoice(schedule, geometries, dense_kernel_name(f, c, high_first, nv), dense, None, tag)
    kernel = dynamic_fake_dense_name(f, nv, problem.stochastic)
    if problem.stochastic:  # compute-bound: one segment per team and block balances the SMs best
        return SegmentChoice(schedule, geometries, kernel, dense, None, tag)
    # Nearest: a resident grid, each team's next segment in flight while it works (grid-stride).
    return SegmentChoice(schedule, geometries, kernel, dense, None, tag[:-1] + ",prefetch]", resident=True)


def choose_segments(
    op: str, problem: AffineProblem, info: DeviceInfo, forced: str | None = None, out_of_place: bool = True
) -> SegmentChoice:
    """The schedule of the dynamic-range plan ``op`` (``"dynamic_quantize"`` or
    ``"dynamic_fake_quantize"``) for ``problem`` on ``info``: ``forced`` where it serves
    (Unsupported otherwise), else the first of ``SCHEDULES[op]`` that serves and is preferred
    (never ``fused-element-io``; ``row-shares`` only ``out_of_place``)."""
    schedules = SCHEDULES[op]
    geometries = fused_geometries(problem, info.busy_threads)
    if forced is not None:
        if forced not in schedules:
            raise _forced_misfit(op, forced, f"its schedules are {', '.join(schedules)}")
        choice = _segment_schedule(op, forced, problem, geometries, info, prefer=False)
        if choice is None:
            raise _forced_misfit(op, forced, _segment_misfit(forced, problem, info))
        return choice
    for schedule in schedules:
        if schedule == "fused-element-io" or (schedule == "row-shares" and not out_of_place):
            continue
        choice = _segment_schedule(op, schedule, problem, geometries, info, prefer=True)
        if choice is not None:
            return choice
    raise AssertionError("multi-pass serves every problem")


def _segment_misfit(schedule: str, problem: AffineProblem, info: DeviceInfo) -> str:
    if schedule in ("fused", "fused-element-io"):
        return (
            f"segments must be contiguous runs of at most {MAX_TEAM * segment_elements_per_thread(problem.float_kind)} "
            "elements (4-bit codes: even rows)"
        )
    if schedule == "cluster" and info.arch.major < 9:
        return f"thread-block clusters need sm_90 or later, this GPU is sm_{info.arch.major}{info.arch.minor}"
    lengths = {
        "row-shares": [SHARES_BLOCK * 8 * b for b in SHARES_BLOCKS],
        "cluster": "64 x block (block a multiple of 32, at most 1024)",
        "lanes": sorted({s[0] * 8 * s[1] for s in LANES_SHAPES}),
        "rows": [ROWS_BLOCK * 8 * nv for nv in ROWS_NV],
        "dense": f"team x 8 x nv (team a power of two up to {DENSE_BLOCK}, nv in {DENSE_NV})",
    }[schedule]
    return f"it takes contiguous F16 / BF16 segments (nearest rounding) of {lengths} elements, 16-byte aligned rows"


# ---- static row kernels: quantize / dequantize -----------------------------------------------


@dataclass(frozen=True)
class RowsChoice:
    """The schedule of a static row kernel: ``dense-rows`` (``dense``: its layout) or ``row-layout``."""

    schedule: str
    dense: RowLayout | None = None


def choose_rows(problem: AffineProblem, float_to_code: bool, info: DeviceInfo, forced: str | None = None) -> RowsChoice:
    """The schedule of ``QuantizePlan`` (``float_to_code``) or ``DequantizePlan``: ``dense-rows``
    (``quantize_dense`` / ``dequantize_dense``: F16 / BF16, nearest rounding, the hot layouts of
    :func:`~quantplan.runtime._layout.dense_row_layout`), else ``row-layout``; ``forced`` where it serves."""
    op = "quantize" if float_to_code else "dequantize"
    dense = None
    if problem.float_kind in ROW_DENSE_FLOAT_KINDS and not (float_to_code and problem.stochastic):
        kernel = "quantize_dense" if float_to_code else "dequantize_dense"
        packed = ELEMENTS[problem.code_kind].is_packed
        dense = dense_row_layout(problem.shape, problem.scope, kernel, packed, info.sm_count)
    if forced is not None:
        if forced not in SCHEDULES[op]:
            raise _forced_misfit(op, forced, f"its schedules are {', '.join(SCHEDULES[op])}")
        if forced == "dense-rows" and dense is None:
            raise _forced_misfit(
                op, forced, "it takes F16 / BF16 (nearest rounding) contiguous rows of whole vectors with one "
                "parameter per row or per group of whole vectors"
            )  # fmt: skip
        return RowsChoice(forced, dense if forced == "dense-rows" else None)
    return RowsChoice("dense-rows", dense) if dense is not None else RowsChoice("row-layout")


# ---- elementwise fake quantization -----------------------------------------------------------


@dataclass(frozen=True)
class FakeRowsChoice:
    """The schedule of an elementwise fake-quantization kernel: ``flat`` (TensorScope),
    ``dense-rows`` (``dense``: its geometry) or ``row-layout`` (``layout``: the aligned one)."""

    schedule: str
    layout: RowLayout | None = None
    dense: DenseRows | None = None


def choose_fake_rows(
    problem: CodeRangeProblem, op: FakeOp, info: DeviceInfo, forced: str | None = None
) -> FakeRowsChoice:
    """The schedule of the elementwise fake-quantization kernel of ``op``: ``flat`` for TensorScope;
    otherwise ``dense-rows`` where :func:`~quantplan.runtime._layout.dense_rows` applies, else
    ``row-layout``; ``forced`` where it serves."""
    name = "fake_quantize"
    if forced is not None and forced not in SCHEDULES[name]:
        raise _forced_misfit(name, forced, f"its schedules are {', '.join(SCHEDULES[name])}")
    if isinstance(problem.scope, TensorScope):
        if forced not in (None, "flat"):
            raise _forced_misfit(name, forced, "TensorScope takes the flat kernel only")
        return FakeRowsChoice("flat")
    if forced == "flat":
        raise _forced_misfit(name, forced, "the flat kernel serves TensorScope only")
    float_info = ELEMENTS[problem.float_kind]
    vec, in_bytes = float_info.vec_max, float_info.storage_bits // 8
    layout = row_layout(problem.shape, problem.scope, vec, False, info.busy_threads)
    if forced == "row-layout":
        return FakeRowsChoice(forced, layout)
    dense = dense_rows(layout, vec, dense_unroll(vec, in_bytes, op), info.sm_count, dense_block(op, in_bytes))
    if dense is None:
        if forced == "dense-rows":
            raise _forced_misfit(
                name, forced, "it takes contiguous rows of at least 32 whole vectors with one parameter per row "
                "or per group of whole vectors"
            )  # fmt: skip
        return FakeRowsChoice("row-layout", layout)
    return FakeRowsChoice("dense-rows", layout, dense)


# ---- group quantization: swizzled quantize, DeepSpeed-format quantize and MoQ ----------------


@dataclass(frozen=True)
class GroupProblem:
    """What the group schedules read of a qgZ or DeepSpeed-format quantization: ``groups`` groups
    of ``group_size`` elements of ``float_kind`` (``packed``: 4-bit codes); ``fast``: the
    specialised passes apply to the op's mode (no LoCo buffer; MoQ: SYMMETRIC nearest);
    ``identity_map``: the swizzle keeps the groups in place (the lanes pass has no group map)."""

    groups: int
    group_size: int
    float_kind: ElementKind
    packed: bool
    fast: bool
    identity_map: bool = True

    @property
    def numel(self) -> int:
        return self.groups * self.group_size


#: Threads of a block of the qgZ dense passes (``QP_QGZ_DENSE_BLOCK`` of ``kernels/qp_qgz.cuh``).
QGZ_DENSE_BLOCK = TUNING.qgz_dense_block


def dense_quantize_geometry(groups: int, group_size: int, busy_threads: int) -> tuple[int, int] | None:
    """``(team, nv)`` of ``swizzled_quantize_dense`` for groups of ``group_size`` 16-bit elements,
    or None: groups of exactly ``team * 8 * nv`` (team a power of two up to one block, nv in
    ``QGZ_DENSE_NV``); the most vectors per thread, fewer (a wider team) while that leaves SMs idle."""
    for nv in QGZ_DENSE_NV:
        team, rem = divmod(group_size, 8 * nv)
        if rem or team == 0 or team > QGZ_DENSE_BLOCK or team & (team - 1):
            continue
        while nv > 1 and team * 2 <= QGZ_DENSE_BLOCK and groups * team < busy_threads:
            team, nv = team * 2, nv // 2
        return team, nv
    return None


#: Blocks of a thread-block cluster of the DeepSpeed-format cluster passes.
DS_CLUSTER_BLOCKS = TUNING.ds_cluster_blocks
#: Threads of a block of the DeepSpeed-format dense passes (and most of a cluster pass's block).
DS_DENSE_BLOCK = TUNING.ds_dense_block


@dataclass(frozen=True)
class GroupChoice:
    """The schedule of a group quantization: its name, and for ``cluster`` / ``lanes`` /
    ``dense`` the team of threads per group (``cluster``: per block) and vectors of 8 per thread."""

    schedule: str
    team: int = 0
    nv: int = 0


def group_misfit(op: str, schedule: str, p: GroupProblem, info: DeviceInfo | None, prefer: bool = False) -> str | None:
    """Why ``schedule`` cannot serve ``p`` (or, ``prefer``, is not preferred on ``info``), or None.
    ``info`` None (the reference backend): the device-dependent conditions are not checked."""
    if schedule == "two-pass":
        return None
    if fused_segment_geometry(p.groups, p.group_size, p.packed, QGZ_ELEMENTS_PER_THREAD, 1, 1) is None:
        return (
            f"groups of {p.group_size} elements are not held by one team of the fused pass (at most "
            f"{MAX_TEAM * QGZ_ELEMENTS_PER_THREAD} elements; even groups for 4-bit codes)"
        )
    if schedule in ("fused", "fused-element-io"):
        return None
    if p.float_kind not in DENSE_FLOAT_KINDS or not p.fast:
        mode = "SYMMETRIC nearest rounding" if op == "moq_fake_quantize" else "no LoCo error feedback"
        return f"the {schedule} pass reads F16 / BF16 input ({mode})"
    if p.numel >= DENSE_MAX_ELEMENTS:
        return f"the {schedule} pass indexes with 32-bit integers: fewer than {DENSE_MAX_ELEMENTS} elements"
    if schedule == "cluster":
        per_block, rem = divmod(p.group_size, 8 * DS_CLUSTER_BLOCKS)
        if rem or per_block % 32 or not 0 < per_block <= DS_DENSE_BLOCK:
            return (
                f"the cluster pass takes groups of {8 * DS_CLUSTER_BLOCKS} x block (block a multiple of 32, "
                f"at most {DS_DENSE_BLOCK})"
            )
        if info is not None and info.arch.major < 9:
            return f"thread-block clusters need sm_90 or later, this GPU is sm_{info.arch.major}{info.arch.minor}"
        if prefer and info is not None and p.groups * DS_CLUSTER_BLOCKS > 2 * info.sm_count:
            return "many groups: a cluster per group is not preferred"
        return None
    if schedule == "lanes":
        if not p.identity_map:
            return "the lanes pass has no group map: no swizzle across nodes and devices, one pipeline stage"
        if p.group_size not in {8 * team for team in DEEPSPEED_LANES_TEAMS}:
            return f"the lanes pass takes groups of {sorted(8 * t for t in DEEPSPEED_LANES_TEAMS)} elements"
        if prefer and info is not None:
            team_nv = dense_quantize_geometry(p.groups, p.group_size, info.busy_threads)
            if team_nv is None or team_nv[1] != 1 or team_nv[0] not in DEEPSPEED_LANES_TEAMS:
                return "many groups: the dense pass with more vectors per thread is preferred"
        return None
    assert schedule == "dense", schedule
    if dense_quantize_geometry(p.groups, p.group_size, 1) is None:
        return (
            f"the dense pass takes groups of team * 8 * nv elements (team a power of two up to {QGZ_DENSE_BLOCK}, "
            f"nv in {QGZ_DENSE_NV}), not {p.group_size}"
        )
    return None


def choose_groups(op: str, p: GroupProblem, info: DeviceInfo | None, forced: str | None = None) -> GroupChoice:
    """The schedule of the group quantization ``op`` (``"swizzled_quantize"``,
    ``"deepspeed_quantize"``, ``"moq_fake_quantize"``) for ``p``: ``forced`` where it serves
    (Unsupported otherwise), else the first of ``SCHEDULES[op]`` that serves and is preferred
    (never ``fused-element-io``). An empty problem launches nothing: ``two-pass``, whatever is
    forced. ``info`` None (the reference backend): the name only, device-dependent conditions
    unchecked; the launch shape (team, nv) is the device's."""
    schedules = SCHEDULES[op]
    if forced is not None and forced not in schedules:
        raise _forced_misfit(op, forced, f"its schedules are {', '.join(schedules)}")
    if p.numel == 0:
        return GroupChoice("two-pass")
    if forced is not None:
        why = group_misfit(op, forced, p, info)
        if why is not None:
            raise _forced_misfit(op, forced, why)
        schedule = forced
    else:
        schedule = next(
            s for s in schedules if s != "fused-element-io" and group_misfit(op, s, p, info, prefer=True) is None
        )
    if info is None or schedule not in ("cluster", "lanes", "dense"):
        return GroupChoice(schedule)
    if schedule == "cluster":
        return GroupChoice(schedule, p.group_size // (8 * DS_CLUSTER_BLOCKS), 1)
    if schedule == "lanes":
        return GroupChoice(schedule, p.group_size // 8, 1)
    team_nv = dense_quantize_geometry(p.groups, p.group_size, info.busy_threads)
    assert team_nv is not None
    return GroupChoice(schedule, *team_nv)


def reduce_dense_shape(group_size: int) -> tuple[int, int] | None:
    """``(team, nv)`` of ``deepspeed_reduce_dense`` for output groups of ``group_size``, or None:
    ``team * 8 * nv`` elements, team a power of two up to one block, the fewest vectors per thread."""
    for nv in DEEPSPEED_REDUCE_DENSE_NV:
        team, rem = divmod(group_size, 8 * nv)
        if not rem and 0 < team <= DS_DENSE_BLOCK and team & (team - 1) == 0:
            return team, nv
    return None


def choose_reduce(
    out_groups: int,
    out_group: int,
    in_group: int,
    numel: int,
    fused: bool,
    loco: bool,
    forced: str | None = None,
) -> GroupChoice:
    """The schedule of the DeepSpeed-format quantized reduction: ``dense`` (no LoCo, input groups of
    whole vectors of 8, output groups of :func:`reduce_dense_shape`, fewer than 2**31 elements),
    ``fused`` where a fused geometry exists (``fused``), else ``two-pass``; ``forced`` where it serves."""
    op = "deepspeed_reduce"
    schedules = SCHEDULES[op]
    if forced is not None and forced not in schedules:
        raise _forced_misfit(op, forced, f"its schedules are {', '.join(schedules)}")
    shape = None
    if fused and not loco and in_group % 8 == 0 and 0 < numel < DENSE_MAX_ELEMENTS:
        shape = reduce_dense_shape(out_group)
    if forced is None:
        forced_or_default = "dense" if shape is not None else "fused" if fused else "two-pass"
        return GroupChoice(forced_or_default, *(shape or (0, 0)))
    if forced == "dense" and shape is None:
        raise _forced_misfit(
            op, forced, "it takes output groups of team x 8 (team a power of two up to 256), input groups of whole "
            "vectors of 8, no LoCo"
        )  # fmt: skip
    if forced in ("fused", "fused-element-io") and not fused:
        raise _forced_misfit(op, forced, "the output groups are not held by one team of the fused pass")
    return GroupChoice(forced, *(shape or (0, 0))) if forced == "dense" else GroupChoice(forced)


__all__ = [
    "DENSE_BLOCK",
    "DS_CLUSTER_BLOCKS",
    "DS_DENSE_BLOCK",
    "ORDER",
    "QGZ_DENSE_BLOCK",
    "SCHEDULES",
    "SHARES_SMS_PER_SEGMENT",
    "FakeRowsChoice",
    "GroupChoice",
    "GroupProblem",
    "RowsChoice",
    "RowsLaunch",
    "SegmentChoice",
    "SharesLaunch",
    "choose_fake_rows",
    "choose_groups",
    "choose_reduce",
    "choose_rows",
    "choose_segments",
    "dense_quantize_geometry",
    "cluster_geometry",
    "dense_geometry",
    "fused_geometries",
    "group_misfit",
    "lanes_geometry",
    "reduce_dense_shape",
    "rows_geometry",
    "segment_geometry",
    "shares_geometry",
]
