"""GPU: the row-shares kernel (``dynamic_quantize_row_shares``) equals the reference bit for bit.

It serves few contiguous rows of 4096, 8192 or 16384 16-bit elements (token rows, channel axis 0)
with nearest rounding: 2, 4 or 8 blocks per row, every block reads the whole row, reduces its
range alone and quantizes its own share. Covered: every code kind, mode and nibble order; rows
whose non-finite element, zero or extreme magnitude sits in one share only (every block must see
it); one row; the largest row count it takes and the first it leaves to the rows kernel; rounding
boundaries; narrowed code ranges; misaligned operands (the element-I/O twin); and the variant each
shape selects.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODES, random_floats, to_device
from test_dynamic_range_gpu import assert_same, run_both
from test_dynamic_range_lanes_gpu import _boundary_data, _desc

import quantplan as qp
from quantplan._device import device_info
from quantplan.elements import ELEMENTS
from quantplan.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
FLOATS16 = [EK.F16, EK.BF16]
SHARE = 2048  # elements of one block's share (256 threads x 8)


def _rows() -> int:
    """The most rows the row-shares kernel takes on this device (one row per 4 multiprocessors)."""
    return device_info(0).sm_count // 4


# (scope, shape, blocks per row)
CASES = [
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
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_row_shares_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is ASYM:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape, blocks = CASES[case]
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
    scope, shape, blocks = CASES[case]
    desc = _desc(shape, scope, mode, float_kind, code_kind)
    _expect_shares(desc, blocks)
    x = _boundary_data(rng, shape, shape[-1], float_kind, code_kind, mode)
    ref, got = run_both(desc, x)
    assert_same(ref, got)


@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.U8, 3, 250)])
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_row_shares_narrowed_ranges(rng, code_kind, q_min, q_max, mode) -> None:
    scope, shape, blocks = CASES[0]
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
