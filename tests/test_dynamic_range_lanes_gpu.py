"""GPU: the warp-team and cluster fused kernels (``dynamic_quantize_lanes``,
``dynamic_quantize_cluster``) equal the reference bit for bit.

``dynamic_quantize_lanes`` serves last-axis groups of 128 F16 / BF16 elements (both of its shapes:
4 lanes x 4 vectors for large problems, 16 lanes x 1 vector for small ones);
``dynamic_quantize_cluster`` (sm_90) few long rows, one thread-block cluster per row. Covered:
every code kind, mode and nibble order; non-finite, all-zero and tiny / huge segments (the
out-of-line path); and data placed at rounding boundaries, where the division-free quotients
must round as the IEEE divisions do: elements at and one ulp around ``(m + 1/2) * scale``, and
asymmetric ranges whose ``lo / scale`` lies at and around a half-integer (the zero point).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODES, random_floats
from test_dynamic_range_gpu import assert_same, data_with_special_segments, run_both

import quantplan as qp
from quantplan._device import device_info
from quantplan.elements import ELEMENTS
from quantplan.types import ElementKind as EK

pytestmark = pytest.mark.gpu

FLOATS16 = [EK.F16, EK.BF16]
GROUP = qp.GroupScope(axis=-1, group_size=128)
# (scope, shape, variant tag): large (4 lanes x 4 vectors), small (16 x 1), cluster rows.
CASES = [
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
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_lanes_and_cluster_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, tag = CASES[case]
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
    scope, shape, tag = CASES[case]
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
    scope, shape, tag = CASES[case]
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
    scope, shape, tag = CASES[case]
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
