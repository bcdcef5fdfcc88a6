"""GPU: every schedule of the dynamic-range plans equals the reference bit for bit.

The forced-schedule tests run each schedule of ``DynamicRangeQuantizePlan`` and
``DynamicRangeFakeQuantizePlan`` (``PlanPreference(schedule=...)``, ``quantplan.runtime._selection``) on
ragged shapes: random row counts at the segment lengths the schedule serves, whatever the
device's size would pick. The sections after them keep the edges each specialised kernel has
been checked at, reached by the default selection (the variant asserts which kernel ran):

* ``dense`` (``dynamic_quantize_dense``): contiguous segments of ``team * 8 * nv`` elements of
  F16 / BF16 with nearest rounding; every code kind and mode, narrowed code ranges, non-finite
  and all-zero segments, scales outside the division-free range;
* ``lanes`` / ``cluster`` (``dynamic_quantize_lanes``: groups of 128, both shapes;
  ``dynamic_quantize_cluster``: sm_90, few long rows): every code kind, mode and nibble order,
  data at rounding boundaries (elements at and one ulp around ``(m + 1/2) * scale``, asymmetric
  ranges whose ``lo / scale`` sits at a half-integer);
* ``row-shares`` (``dynamic_quantize_row_shares``: few rows of 4096 / 8192 / 16384, each block
  reads the whole row): rows whose special element sits in one share only, the largest row count
  it takes and the first it leaves, misaligned operands (the element-I/O twin);
* ``rows`` (``dynamic_quantize_rows``, ``dynamic_fake_quantize_rows``: rows of 2048 / 4096 /
  8192 in one block's registers) and ``dynamic_fake_quantize_cluster``: many-block grids, in-place
  fake quantization.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODES, random_floats, to_device
from test_dynamic_range_gpu import assert_same, data_with_special_segments, run_both
from test_fake_quantize_schedules_gpu import _dynamic

import quantplan as qp
from quantplan.runtime._device import device_info
from quantplan.runtime._selection import SCHEDULES
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
FLOATS16 = [EK.F16, EK.BF16]


# ---- every forced schedule on ragged shapes ----------------------------------------------------

#: Segment lengths each schedule serves (``quantplan.runtime._selection``); a test draws one and a random
#: row count, so every schedule runs on shapes its default choice would not give it.
FORCED_LENGTHS = {
    "row-shares": (4096, 8192, 16384),
    "cluster": (2048, 4096, 8192),
    "lanes": (128,),
    "rows": (2048, 4096, 8192),
    "dense": (8, 64, 512, 1024, 2048, 8192),
    "fused": (6, 10, 104, 1000, 2048, 8192),
    "fused-element-io": (6, 10, 104, 1000, 8192),
    "multi-pass": (6, 100, 3000, 40000),
}
#: A fragment of the variant each forced schedule runs under.
FORCED_TAGS = {
    "row-shares": "dense-row-shares",
    "cluster": "dense-cluster",
    "lanes": "dense-lanes",
    "rows": "dense-rows",
    "dense": "fused-single-pass[dense,",
    "fused": "fused-single-pass[",
    "fused-element-io": "fused-single-pass[",
    "multi-pass": "range-atomics",
}
#: Schedules that serve stochastic rounding and F32 / F64 input (the others: F16 / BF16, nearest).
GENERAL = ("fused", "fused-element-io", "multi-pass")


def _forced_shape(rng: np.random.Generator, schedule: str) -> tuple[int, int]:
    rows = int(rng.integers(1, 40 if schedule != "row-shares" else 12))
    return rows, int(rng.choice(FORCED_LENGTHS[schedule]))


def _skip_unserved(schedule: str) -> None:
    if schedule == "cluster" and device_info(0).arch.major < 9:
        pytest.skip("thread-block clusters need sm_90")


@pytest.mark.parametrize("schedule", SCHEDULES["dynamic_quantize"])
@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_every_forced_schedule_matches_reference(rng, schedule, float_kind, code_kind, mode) -> None:
    """DynamicRangeQuantizePlan forced into each schedule, on a random row count: the bits of the
    reference, whatever the schedule; special segments (zero, NaN, Inf, tiny) included."""
    if ELEMENTS[code_kind].is_fp8 and mode is ASYM:
        pytest.skip("FP8 codes are symmetric only")
    _skip_unserved(schedule)
    shape = _forced_shape(rng, schedule)
    packed = ELEMENTS[code_kind].is_packed
    order = qp.NibbleOrder.HIGH_FIRST if packed and rng.integers(2) else qp.NibbleOrder.LOW_FIRST
    desc = _desc(shape, qp.TokenScope(), mode, float_kind, code_kind, order)
    pref = qp.PlanPreference(schedule=schedule)
    assert FORCED_TAGS[schedule] in qp.DynamicRangeQuantizePlan.select(None, desc, pref).sku().variant
    assert_same(*run_both(desc, data_with_special_segments(rng, shape, float_kind), pref))


@pytest.mark.parametrize("schedule", GENERAL)
@pytest.mark.parametrize("float_kind", [EK.F16, EK.F32, EK.F64])
@pytest.mark.parametrize("rounding", [qp.Rounding.NEAREST_EVEN, qp.Rounding.STOCHASTIC])
def test_general_forced_schedules_take_every_float_and_rounding(rng, schedule, float_kind, rounding) -> None:
    """The schedules that serve every float kind and both roundings, forced, on ragged shapes and
    last-axis groups."""
    rows, length = _forced_shape(rng, schedule)
    scope = qp.GroupScope(axis=-1, group_size=2) if rng.integers(2) else qp.TokenScope()
    code_kind = EK.S4 if length % 2 == 0 and rng.integers(2) else EK.S8
    desc = _desc((rows, length), scope, ASYM, float_kind, code_kind, rounding=rounding)
    kw: dict[str, int] = {}
    if rounding is qp.Rounding.STOCHASTIC:
        kw = {"rng_seed": int(rng.integers(2**63)), "rng_offset": int(rng.integers(2**40))}
    x = random_floats(rng, (rows, length), float_kind)
    assert_same(*run_both(desc, x, qp.PlanPreference(schedule=schedule), **kw))


@pytest.mark.parametrize("schedule", SCHEDULES["dynamic_fake_quantize"])
@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("mode", [SYM, ASYM])
@pytest.mark.parametrize("in_place", [False, True])
def test_every_forced_fake_schedule_matches_reference(rng, schedule, float_kind, mode, in_place) -> None:
    """DynamicRangeFakeQuantizePlan forced into each schedule, on a random row count, nearest and
    (where the schedule serves it) stochastic rounding, out of place and in place (``row-shares``
    runs its in-place twin there)."""
    _skip_unserved(schedule)
    shape = _forced_shape(rng, schedule)
    stochastic = schedule in (*GENERAL, "dense") and bool(rng.integers(2))
    rounding = qp.Rounding.STOCHASTIC if stochastic else qp.Rounding.NEAREST_EVEN
    bits = int(rng.integers(2, 9))
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=mode, element=float_kind, bits=bits, rounding=rounding
    )
    x = data_with_special_segments(rng, shape, float_kind)
    variant = _dynamic(desc, x, in_place, qp.PlanPreference(schedule=schedule))
    assert FORCED_TAGS[schedule] in variant


@pytest.mark.parametrize("plan", ["dynamic_quantize", "dynamic_fake_quantize"])
def test_forced_schedules_that_cannot_serve_refuse(plan: str) -> None:
    """A forced schedule that cannot serve the problem raises Unsupported at ``select`` (F32 has no
    specialised kernel; a segment of 100 elements, not a multiple of 8, fits none of them)."""
    for schedule in ("row-shares", "lanes", "rows", "dense"):
        if plan == "dynamic_fake_quantize" and schedule == "lanes":
            continue
        for shape, kind in (((4, 8192), EK.F32), ((4, 100), EK.F16)):
            if plan == "dynamic_quantize":
                desc: object = _desc(shape, qp.TokenScope(), SYM, kind, EK.S8)
                cls: type = qp.DynamicRangeQuantizePlan
            else:
                desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=qp.TokenScope(), element=kind)
                cls = qp.DynamicRangeFakeQuantizePlan
            with pytest.raises(qp.Unsupported, match=schedule):
                cls.select(None, desc, qp.PlanPreference(schedule=schedule))


# ---- dense -----------------------------------------------------------------------------------------

DENSE_FLOATS = [EK.F16, EK.BF16]
DENSE_CASES = [
    (qp.TokenScope(), (9, 8192)),
    (qp.TokenScope(), (7, 3, 1024)),
    (qp.TokenScope(), (300, 8)),
    (qp.ChannelScope(axis=0), (5, 4096)),
    (qp.GroupScope(axis=-1, group_size=128), (37, 1024)),
    (qp.GroupScope(axis=-1, group_size=32), (11, 96)),
    (qp.GroupScope(axis=-1, group_size=512), (3, 2048)),
]


@pytest.mark.parametrize("float_kind", DENSE_FLOATS)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("case", range(len(DENSE_CASES)))
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dense_matches_reference(rng, float_kind, code_kind, case, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape = DENSE_CASES[case]
    order = qp.NibbleOrder.HIGH_FIRST if case % 2 else qp.NibbleOrder.LOW_FIRST
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=scope, mode=mode, input_element=float_kind, output_element=code_kind, nibble_order=order
    )
    assert "dense" in qp.DynamicRangeQuantizePlan.select(None, desc).sku().variant
    ref, got = run_both(desc, data_with_special_segments(rng, shape, float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", DENSE_FLOATS)
@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.S4, -7, 5)])
def test_dense_narrowed_ranges(rng, float_kind, code_kind, q_min, q_max) -> None:
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(33, 256),
        scope=qp.TokenScope(),
        input_element=float_kind,
        output_element=code_kind,
        q_min=q_min,
        q_max=q_max,
    )
    ref, got = run_both(desc, data_with_special_segments(rng, (33, 256), float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", [EK.BF16])
@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3])
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dense_scales_outside_the_fast_range(rng, float_kind, code_kind, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    shape = (12, 64)
    x = random_floats(rng, shape, float_kind, specials=False).astype(np.float64)
    x[0] *= 1e-30  # scale below 2^-60
    x[1] *= 1e-38
    x[2] = 0.0
    x[3] *= 1e35  # scale above 2^100
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=mode, input_element=float_kind, output_element=code_kind
    )
    ref, got = run_both(desc, x.astype(ELEMENTS[float_kind].numpy_dtype))
    assert_same(ref, got)


# ---- lanes and cluster -----------------------------------------------------------------------------

GROUP = qp.GroupScope(axis=-1, group_size=128)
# (scope, shape, variant tag): large (4 lanes x 4 vectors), small (16 x 1), cluster rows.
LANES_CASES = [
    (GROUP, (2112, 4096), "dense-lanes,4t"),
    (GROUP, (37, 1024), "dense-lanes,16t"),
    (GROUP, (5, 3, 256), "dense-lanes,16t"),
    (qp.TokenScope(), (16, 10240), "dense-cluster"),  # 16 x 8192 takes dynamic_quantize_row_shares
    (qp.TokenScope(), (3, 2048), "dense-cluster"),
    (qp.TokenScope(), (2, 32768), "dense-cluster"),
]


def _desc(shape, scope, mode, float_kind, code_kind, order=qp.NibbleOrder.LOW_FIRST, **kw):  # noqa: ANN001, ANN202
    return qp.DynamicRangeQuantizeDescriptor(
        shape=shape,
        scope=scope,
        mode=mode,
        input_element=float_kind,
        output_element=code_kind,
        nibble_order=order,
        **kw,
    )


def _expect_variant(desc: qp.DynamicRangeQuantizeDescriptor, tag: str) -> None:
    if "cluster" in tag and device_info(0).arch.major < 9:
        pytest.skip("thread-block clusters need sm_90")
    variant = qp.DynamicRangeQuantizePlan.select(None, desc).sku().variant
    assert tag in variant, variant


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("case", range(len(LANES_CASES)))
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_lanes_and_cluster_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, tag = LANES_CASES[case]
    order = qp.NibbleOrder.HIGH_FIRST if case % 2 else qp.NibbleOrder.LOW_FIRST
    desc = _desc(shape, scope, mode, float_kind, code_kind, order)
    _expect_variant(desc, tag)
    ref, got = run_both(desc, data_with_special_segments(rng, shape, float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.U8, 3, 250)])
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
@pytest.mark.parametrize("case", [0, 1, 3])
def test_narrowed_ranges(rng, float_kind, code_kind, q_min, q_max, mode, case) -> None:
    scope, shape, tag = LANES_CASES[case]
    desc = _desc(shape, scope, mode, float_kind, code_kind, q_min=q_min, q_max=q_max)
    _expect_variant(desc, tag)
    ref, got = run_both(desc, data_with_special_segments(rng, shape, float_kind))
    assert_same(ref, got)


def _divisor(code_kind: EK, mode: qp.QuantMode) -> float:
    info = ELEMENTS[code_kind]
    if info.is_fp8:
        assert info.fp8_max is not None
        return float(info.fp8_max)
    lo, hi = info.code_range
    return float(hi if mode is qp.QuantMode.SYMMETRIC else hi - lo)


def _nudge(v: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``v`` (16-bit floats) moved by -1, 0 or +1 in its bit pattern (one ulp); zeros stay."""
    bits = v.view(np.uint16).astype(np.int32)
    step = rng.integers(-1, 2, size=v.shape)
    step[(bits & 0x7FFF) == 0] = 0
    return (bits + step).astype(np.uint16).view(v.dtype)


def _boundary_data(
    rng: np.random.Generator, shape: tuple[int, ...], group: int, float_kind: EK, code_kind: EK, mode: qp.QuantMode
) -> np.ndarray:
    """Groups of ``group`` elements at and one ulp around (m + 1/2) * scale for the scale each
    group's range gives (every fourth group with a power-of-two scale: exact ties); ASYMMETRIC
    groups also put lo / scale at and one ulp around a half-integer (the zero point)."""
    dtype = ELEMENTS[float_kind].numpy_dtype
    d = _divisor(code_kind, mode)
    n_groups = int(np.prod(shape)) // group
    amax = np.exp(rng.uniform(-6, 6, size=n_groups))
    amax[::4] = d * 2.0 ** rng.integers(-8, 4, size=amax[::4].shape)
    hi = np.minimum(amax, 32768.0).astype(dtype).astype(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if mode is qp.QuantMode.ASYMMETRIC:
            j = rng.integers(0, int(d) // 2, size=n_groups) + 0.5  # |lo| <= hi: no overflow
            lo = _nudge((-j * hi / (d - j)).astype(dtype), rng).astype(np.float32)
            scale = (hi - lo) / np.float32(d)
            lo_m, hi_m = np.floor(lo / scale), np.ceil(hi / scale)
            m = rng.uniform(size=(n_groups, group - 2)) * (hi_m - lo_m)[:, None] + lo_m[:, None]
            ends = np.stack([hi, lo], axis=1)
        else:
            lo = -hi
            scale = hi / np.float32(d)
            m = rng.integers(-int(d), int(d), size=(n_groups, group - 1)).astype(np.float64)
            ends = (hi * rng.choice([-1.0, 1.0], size=n_groups))[:, None]
        target = ((np.floor(m) + 0.5) * scale.astype(np.float64)[:, None]).astype(dtype)
        inner = np.clip(_nudge(target, rng).astype(np.float64), lo[:, None], hi[:, None])
    x = rng.permuted(np.concatenate([ends.astype(np.float64), inner], axis=1), axis=1)
    return x.astype(dtype).reshape(shape)


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
@pytest.mark.parametrize("case", [0, 1, 3])
def test_rounding_boundaries(rng, float_kind, code_kind, mode, case) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, tag = LANES_CASES[case]
    group = 128 if isinstance(scope, qp.GroupScope) else shape[-1]
    desc = _desc(shape, scope, mode, float_kind, code_kind)
    _expect_variant(desc, tag)
    x = _boundary_data(rng, shape, group, float_kind, code_kind, mode)
    ref, got = run_both(desc, x)
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", [EK.BF16])
@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3])
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
@pytest.mark.parametrize("case", [1, 3])
def test_scales_outside_the_fast_range(rng, float_kind, code_kind, mode, case) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, tag = LANES_CASES[case]
    x = random_floats(rng, shape, float_kind, specials=False).astype(np.float64)
    x[0] *= 1e-30  # scale below 2^-60
    x[1] *= 1e-38
    x[2] = 0.0
    x[3] *= 1e35  # scale above 2^100
    if shape[0] > 5:
        x[4] = 3e38 * np.sign(x[4])  # ASYMMETRIC: hi - lo overflows
        x[5] *= 1e-25  # range near 2^-80
    desc = _desc(shape, scope, mode, float_kind, code_kind)
    _expect_variant(desc, tag)
    with np.errstate(over="ignore"):
        ref, got = run_both(desc, x.astype(ELEMENTS[float_kind].numpy_dtype))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("code_kind", [EK.U4, EK.S4, EK.U8])
@pytest.mark.parametrize("order", [qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST])
@pytest.mark.parametrize("shape", [(16, 8192), (3, 1408)])
def test_rare_segments_beside_fast_ones(rng, float_kind, code_kind, order, shape) -> None:
    """16 lanes x 1 vector, ASYMMETRIC: the codes of every segment are stored before the rare-path
    test, and a rare segment (non-finite, tiny or huge range) then overwrites its own bytes while
    the other teams of its warp keep theirs; (3, 1408): 33 segments, a block's last teams idle."""
    x = random_floats(rng, shape, float_kind, specials=False).astype(np.float64)
    flat = x.reshape(-1, 128)
    flat[1, 5] = np.nan  # team 1 of warp 0: non-finite
    flat[2] *= 1e-30  # scale below the fast range
    flat[5, 127] = np.inf
    flat[6] = 0.0
    if flat.shape[0] > 40:
        flat[33] *= 1e35  # scale above the fast range
        flat[-1, 0] = -np.inf
    desc = _desc(shape, GROUP, qp.QuantMode.ASYMMETRIC, float_kind, code_kind, order)
    _expect_variant(desc, "dense-lanes,16t")
    with np.errstate(over="ignore", invalid="ignore"):
        ref, got = run_both(desc, x.astype(ELEMENTS[float_kind].numpy_dtype))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize(
    ("code_kind", "q_min", "q_max"),
    [
        (EK.U4, None, None),
        (EK.S4, None, None),
        (EK.S8, None, None),
        (EK.FP8_E4M3, None, None),
        (EK.U8, 3, 250),
        (EK.U4, 2, 13),
        (EK.U4, 1, 14),
        (EK.S8, -127, 127),
    ],
)
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
@pytest.mark.parametrize("shape", [(16, 8192), (3, 1408)])
def test_zero_groups_and_zero_points(rng, float_kind, code_kind, q_min, q_max, mode, shape) -> None:
    """16 lanes x 1 vector: all-zero groups (+0, -0, mixed) beside others take scale 1 and the
    code of zero (for integer codes stored after the codes computed from a zero scale), even and
    odd q_min (an odd one takes the out-of-line path, ASYMMETRIC), narrowed ranges where the code
    of zero is clamped (SYMMETRIC U8 in [3, 250])."""
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    x = random_floats(rng, shape, float_kind, specials=False).astype(np.float64)
    flat = x.reshape(-1, 128)
    flat[0] = 0.0
    flat[3] = -0.0
    flat[4] = np.where(rng.integers(0, 2, size=128) == 1, 0.0, -0.0)
    flat[-1] = 0.0
    flat[7, :64] = 0.0  # half a group: not a zero range
    kw = {} if q_min is None else {"q_min": q_min, "q_max": q_max}
    desc = _desc(shape, GROUP, mode, float_kind, code_kind, **kw)
    _expect_variant(desc, "dense-lanes,16t")
    ref, got = run_both(desc, x.astype(ELEMENTS[float_kind].numpy_dtype))
    assert_same(ref, got)


# ---- row shares ------------------------------------------------------------------------------------

SHARE = 2048  # elements of one block's share (256 threads x 8)


def _rows() -> int:
    """The most rows the row-shares kernel takes on this device (one row per 4 multiprocessors)."""
    return device_info(0).sm_count // 4


# (scope, shape, blocks per row)
SHARES_CASES = [
    (qp.TokenScope(), (16, 8192), 4),
    (qp.ChannelScope(axis=0), (5, 4096), 2),
    (qp.TokenScope(), (3, 16384), 8),
    (qp.TokenScope(), (1, 8192), 4),
    (qp.TokenScope(), (2, 7, 4096), 2),
    (qp.ChannelScope(axis=0), (6, 2, 8192), 8),
]


def shares_data(rng: np.random.Generator, shape: tuple[int, ...], kind: EK) -> np.ndarray:
    """Random rows, and rows off the division-free path whose special element or magnitude sits in
    one share only (row r: share r % shares): NaN, +Inf, -Inf, all zero but one share, tiny
    (scale below 2^-60), huge (scale above 2^100 for bf16), subnormal, a huge lone element."""
    x = random_floats(rng, shape, kind, specials=False).astype(np.float64)
    flat = x.reshape(shape[0], -1)
    rows, length = flat.shape
    shares = length // SHARE
    for r in range(1, rows):
        share = slice((r % shares) * SHARE, (r % shares + 1) * SHARE)
        pos = (r % shares) * SHARE + (r * 977) % SHARE
        what = r % 9
        if what == 1:
            flat[r, pos] = np.nan
        elif what == 2:
            flat[r, pos] = np.inf
        elif what == 3:
            flat[r, pos] = -np.inf
        elif what == 4:
            kept = flat[r, share].copy()
            flat[r] = 0.0
            flat[r, share] = kept
        elif what == 5:
            flat[r] *= 1e-30
        elif what == 6:
            flat[r] *= 1e35 if kind is EK.BF16 else 1.0
        elif what == 7:
            flat[r] *= 2.0**-126
        elif what == 8:
            flat[r, pos] = 60000.0  # the range of the row from one share
    with np.errstate(over="ignore", under="ignore"):
        return flat.reshape(shape).astype(ELEMENTS[kind].numpy_dtype)


def _expect_shares(desc: qp.DynamicRangeQuantizeDescriptor, blocks: int) -> None:
    variant = qp.DynamicRangeQuantizePlan.select(None, desc).sku().variant
    assert f"dense-row-shares,{blocks}x256t-per-segment" in variant, variant


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("case", range(len(SHARES_CASES)))
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_row_shares_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is ASYM:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, blocks = SHARES_CASES[case]
    order = qp.NibbleOrder.HIGH_FIRST if case % 2 else qp.NibbleOrder.LOW_FIRST
    desc = _desc(shape, scope, mode, float_kind, code_kind, order)
    _expect_shares(desc, blocks)
    ref, got = run_both(desc, shares_data(rng, shape, float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize("length", [4096, 8192, 16384])
@pytest.mark.parametrize(("code_kind", "mode"), [(EK.S8, SYM), (EK.U4, ASYM), (EK.FP8_E4M3, SYM)])
def test_most_rows_and_the_first_row_count_past_them(rng, length, code_kind, mode) -> None:
    """The largest row count the geometry gives the row-shares kernel, and one more (another kernel)."""
    rows = _rows()
    for n, shares in ((rows, True), (rows + 1, False)):
        desc = _desc((n, length), qp.TokenScope(), mode, EK.BF16, code_kind)
        variant = qp.DynamicRangeQuantizePlan.select(None, desc).sku().variant
        assert ("dense-row-shares" in variant) == shares, variant
        ref, got = run_both(desc, shares_data(rng, (n, length), EK.BF16))
        assert_same(ref, got)


@pytest.mark.parametrize("float_kind", FLOATS16)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("mode", [SYM, ASYM])
@pytest.mark.parametrize("case", [0, 1, 2])
def test_row_shares_rounding_boundaries(rng, float_kind, code_kind, mode, case) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is ASYM:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, blocks = SHARES_CASES[case]
    desc = _desc(shape, scope, mode, float_kind, code_kind)
    _expect_shares(desc, blocks)
    x = _boundary_data(rng, shape, shape[-1], float_kind, code_kind, mode)
    ref, got = run_both(desc, x)
    assert_same(ref, got)


@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.U8, 3, 250)])
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_row_shares_narrowed_ranges(rng, code_kind, q_min, q_max, mode) -> None:
    scope, shape, blocks = SHARES_CASES[0]
    desc = _desc(shape, scope, mode, EK.F16, code_kind, q_min=q_min, q_max=q_max)
    _expect_shares(desc, blocks)
    ref, got = run_both(desc, shares_data(rng, shape, EK.F16))
    assert_same(ref, got)


@pytest.mark.parametrize(
    ("shape", "kwargs"),
    [
        ((16, 2048), {}),  # a row of one share: not served
        ((16, 6144), {}),  # three shares: not served
        ((16, 8192), {"rounding": qp.Rounding.STOCHASTIC}),
        ((16, 8192), {"float_kind": EK.F32}),
    ],
)
def test_other_shapes_take_other_kernels(rng, shape, kwargs) -> None:
    kwargs = dict(kwargs)
    float_kind = kwargs.pop("float_kind", EK.F16)
    desc = _desc(shape, qp.TokenScope(), SYM, float_kind, EK.S8, **kwargs)
    variant = qp.DynamicRangeQuantizePlan.select(None, desc).sku().variant
    assert "dense-row-shares" not in variant, variant
    extra = {"rng_seed": 5, "rng_offset": 9} if kwargs.get("rounding") is qp.Rounding.STOCHASTIC else {}
    ref, got = run_both(desc, shares_data(rng, shape, float_kind), **extra)
    assert_same(ref, got)


def test_misaligned_operands_take_the_element_twin(rng) -> None:
    import cupy

    shape = (8, 8192)
    desc = _desc(shape, qp.TokenScope(), ASYM, EK.F16, EK.U8)
    _expect_shares(desc, 4)
    x = shares_data(rng, shape, EK.F16)
    ref, _ = run_both(desc, x)
    buf = cupy.zeros(x.size + 1, np.float16)
    buf[1:] = to_device(x.reshape(-1))
    q = cupy.zeros(x.size + 3, np.uint8)
    s = cupy.zeros(desc.param_shape, np.float32)
    z = cupy.zeros(desc.param_shape, np.int32)
    plan = qp.DynamicRangeQuantizePlan.select(None, desc)
    plan.run(None, None, qp.DynamicRangeQuantizeArgs(buf[1:].reshape(shape), q[3:].reshape(shape), s, z))
    assert np.array_equal(q[3:].get().reshape(shape), ref[0])
    assert np.array_equal(s.get().view(np.uint32), ref[1].view(np.uint32))
    assert np.array_equal(z.get(), ref[2])


# ---- rows ------------------------------------------------------------------------------------------

FLOATS = [EK.F16, EK.BF16]
# (rows, length, large): at least 34 rows (fewer take dynamic_quantize_cluster on sm_90); the large
# shapes have more blocks than an H200 holds at once.
SHAPES = [(50, 2048, False), (37, 4096, False), (40, 8192, False), (1500, 2048, True), (1100, 4096, True)]


def _rows_data(rng: np.random.Generator, shape: tuple[int, int], kind: EK) -> np.ndarray:
    """Random rows, and rows off the division-free path at the start, middle and end: all zero,
    NaN, -Inf, tiny (scale below 2^-60, or subnormal) and huge (scale above 2^100 for bf16)."""
    x = random_floats(rng, shape, kind).astype(np.float64)
    rows = shape[0]
    special = {1: "zero", 2: "nan", 3: "inf", 5: "tiny", 6: "huge", 7: "sub"}
    for r, what in list(special.items()):
        for row in (r, rows - r, rows // 2 + r):
            if not 0 <= row < rows:
                continue
            if what == "zero":
                x[row] = 0.0
            elif what == "nan":
                x[row, row % shape[1]] = np.nan
            elif what == "inf":
                x[row, -1 - row % 7] = -np.inf
            elif what == "tiny":
                x[row] *= 1e-30
            elif what == "huge":
                x[row] *= 1e35 if kind is EK.BF16 else 1.0
            else:
                x[row] *= 2.0**-126
    with np.errstate(over="ignore", under="ignore"):
        return x.astype(ELEMENTS[kind].numpy_dtype)


def _variant(plan: qp.DynamicRangeQuantizePlan | qp.DynamicRangeFakeQuantizePlan) -> None:
    variant = plan.sku().variant
    assert "dense-rows" in variant, variant


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("shape_index", range(len(SHAPES)))
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_rows_match_reference(rng, float_kind, code_kind, shape_index, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is ASYM:
        pytest.skip("FP8 codes are symmetric only")
    rows, length, large = SHAPES[shape_index]
    if large and code_kind not in (EK.S8, EK.U4, EK.FP8_E4M3):
        pytest.skip("large shapes: one code kind per packing")
    order = qp.NibbleOrder.HIGH_FIRST if shape_index % 2 else qp.NibbleOrder.LOW_FIRST
    scope = qp.ChannelScope(axis=0) if shape_index == 1 else qp.TokenScope()
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(rows, length),
        scope=scope,
        mode=mode,
        input_element=float_kind,
        output_element=code_kind,
        nibble_order=order,
    )
    _variant(qp.DynamicRangeQuantizePlan.select(None, desc))
    ref, got = run_both(desc, _rows_data(rng, (rows, length), float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.S4, -7, 5)])
@pytest.mark.parametrize("rows", [36, 1200])
def test_rows_narrowed_ranges(rng, code_kind, q_min, q_max, rows) -> None:
    shape = (rows, 4096)
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=code_kind, q_min=q_min, q_max=q_max
    )
    _variant(qp.DynamicRangeQuantizePlan.select(None, desc))
    ref, got = run_both(desc, _rows_data(rng, shape, EK.F16))
    assert_same(ref, got)


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 8), (SYM, 2), (ASYM, 3)])
@pytest.mark.parametrize(("rows", "length"), [(40, 8192), (50, 2048), (1500, 2048)])
def test_fake_rows_match_reference(rng, kind, mode, bits, rows, length) -> None:
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(rows, length), scope=qp.TokenScope(), mode=mode, element=kind, bits=bits
    )
    _variant(qp.DynamicRangeFakeQuantizePlan.select(None, desc))
    _dynamic(desc, _rows_data(rng, (rows, length), kind))


@pytest.mark.parametrize(("shape", "kind", "mode"), [((1100, 4096), EK.BF16, SYM), ((1200, 2048), EK.F16, ASYM)])
def test_fake_rows_in_place(rng, shape, kind, mode) -> None:
    """In place on many blocks: each thread reads its vectors before it writes them."""
    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=qp.TokenScope(), mode=mode, element=kind, bits=8)
    _variant(qp.DynamicRangeFakeQuantizePlan.select(None, desc))
    _dynamic(desc, _rows_data(rng, shape, kind), in_place=True)


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 8), (SYM, 2), (ASYM, 3)])
@pytest.mark.parametrize(("rows", "length"), [(16, 8192), (33, 2048), (3, 4096)])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_fake_cluster_match_reference(rng, kind, mode, bits, rows, length, in_place) -> None:
    """Few long rows on sm_90: ``dynamic_fake_quantize_cluster`` (one row per cluster of 8 blocks)."""
    import cupy

    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(rows, length), scope=qp.TokenScope(), mode=mode, element=kind, bits=bits
    )
    variant = qp.DynamicRangeFakeQuantizePlan.select(None, desc).sku().variant
    assert ("dense-cluster" in variant) == (int(cupy.cuda.Device().compute_capability) >= 90), variant
    _dynamic(desc, _rows_data(rng, (rows, length), kind), in_place=in_place)
