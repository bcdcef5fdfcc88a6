"""CPU: fake quantization (QAT) on the reference backend, on hand-computed vectors (SPEC section 4).

``inv = rn(1 / scale)``; ``q = rne(x * inv) + zp`` (NaN -> below q_min); ``y = (clamp(q) - zp) * scale`` in
float32 (float64 for F64 data), rounded once to the data type; ``dx = dy * (q_min <= q <= q_max)``;
LSQ ``dscale`` / ``dzero_point`` summed per segment. Every expected value below is a literal worked
out by hand (the comments show the steps), never a call of the function under test.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import FLOATS, REFERENCE, SCOPES, first_mismatch, float_bits_equal, random_floats, random_scale

import quantplan as qp
from quantplan import reference
from quantplan.runtime._layout import expand_params, param_shape
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK
from quantplan.vocabulary.types import MathPrecision

F32, F64 = MathPrecision.F32, MathPrecision.F64
_KIND_OF = {np.dtype(np.float16): EK.F16, np.dtype(ml_dtypes.bfloat16): EK.BF16}
_KIND_OF |= {np.dtype(np.float32): EK.F32, np.dtype(np.float64): EK.F64}


def _desc(
    x: np.ndarray, zp: object, q_min: int, q_max: int, scope: qp.Scope | None, learnable: bool | None = None
) -> qp.FakeQuantizeDescriptor:
    """A forward descriptor, or a backward one when ``learnable`` is given, for ``x``'s shape and dtype."""
    fields = dict(
        shape=x.shape,
        scope=scope or qp.TensorScope(),
        mode=qp.QuantMode.SYMMETRIC if zp is None else qp.QuantMode.ASYMMETRIC,
        element=_KIND_OF[x.dtype],
        q_min=q_min,
        q_max=q_max,
    )
    if learnable is None:
        return qp.FakeQuantizeDescriptor(**fields)
    return qp.FakeQuantizeBackwardDescriptor(**fields, learnable=learnable)


def fake(
    x: np.ndarray, scale: object, zp: object = None, q_min: int = -128, q_max: int = 127, scope: qp.Scope | None = None
) -> np.ndarray:
    """FakeQuantizePlan on the reference backend; output of ``x``'s dtype (pre-filled with a sentinel)."""
    plan = qp.FakeQuantizePlan.select(None, _desc(x, zp, q_min, q_max, scope), REFERENCE)
    y = np.full_like(x, 77)
    plan.run(None, None, qp.FakeQuantizeArgs(x, y, scale, zp))
    return y


def ste(
    x: np.ndarray,
    dy: np.ndarray,
    scale: object,
    zp: object = None,
    q_min: int = -128,
    q_max: int = 127,
    scope: qp.Scope | None = None,
) -> np.ndarray:
    """Straight-through FakeQuantizeBackwardPlan on the reference backend -> dx."""
    plan = qp.FakeQuantizeBackwardPlan.select(None, _desc(x, zp, q_min, q_max, scope, False), REFERENCE)
    dx = np.full_like(dy, 77)
    plan.run(None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx, scale, zp))
    return dx


def lsq(
    x: np.ndarray,
    dy: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None = None,
    q_min: int = -128,
    q_max: int = 127,
    scope: qp.Scope | None = None,
    grad_factor: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Learnable FakeQuantizeBackwardPlan on the reference backend -> (dx, dscale, dzero_point or None)."""
    plan = qp.FakeQuantizeBackwardPlan.select(None, _desc(x, zp, q_min, q_max, scope, True), REFERENCE)
    dx = np.full_like(dy, 77)
    ds = np.full_like(scale, 77)
    dz = None if zp is None else np.full(scale.shape, 77, scale.dtype)
    plan.run(
        None,
        None,
        qp.FakeQuantizeBackwardArgs(x, dy, dx, scale, zp, grad_scale=ds, grad_zero_point=dz, grad_factor=grad_factor),
    )
    return dx, ds, dz


def f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def assert_bits(got: np.ndarray, expected: np.ndarray) -> None:
    assert float_bits_equal(got, expected), f"{got!r} != {expected!r}: {first_mismatch(got, expected)}"


# ---- forward: rounding, clamping, zero points ---------------------------------------------------


def test_ties_round_half_to_even_both_signs() -> None:
    # scale 0.25 -> inv 4 exactly; x * 4 = 2.5, 3.5, -2.5, -3.5, 1.5, -1.5, 0.5, -0.5 -> 2, 4, -2, -4, 2, -2, 0, -0
    x = f32(0.625, 0.875, -0.625, -0.875, 0.375, -0.375, 0.125, -0.125)
    # rne(-0.5) = -0 but q = -0 + zp(0) = +0 (IEEE sum), so y is +0 (as PyTorch's int64 q gives)
    assert_bits(fake(x, 0.25), f32(0.5, 1.0, -0.5, -1.0, 0.5, -0.5, 0.0, 0.0))


def test_negative_zero_input_gives_positive_zero() -> None:
    y = fake(f32(-0.0, -0.1, 0.0), 1.0)
    assert_bits(y, f32(0.0, 0.0, 0.0))
    assert not np.signbit(y).any()


def test_multiplies_by_the_rounded_inverse_not_divides() -> None:
    # scale 7: inv = rn(1/7) = 0x3E124925 (rounded up, 1/7 + 3/7 * 2**-26). -213.5 = -30.5 * 7, so
    # x / scale is the tie -30.5 (-> -30), but x * inv = -30.5 - 1.36e-6, past half an ulp (2**-20)
    # of 30.5 in float32: -30.500002 -> -31, y = -217. In float64 rn(1/7) is rounded *down*
    # (by 2/7 * 2**-55), x * inv = -30.5 + 30.5 * 2**-54 rounds back to the tie -30.5 -> -30, y = -210.
    assert_bits(fake(f32(-213.5, 213.5), 7.0), f32(-217.0, 217.0))
    assert_bits(fake(np.array([-213.5, 213.5]), 7.0), np.array([-210.0, 210.0]))


def test_clamp_edges_symmetric() -> None:
    # scale 1, [-128, 127]: 127.5 -> 128 (even) is outside; -128.5 -> -128 (even) is inside
    x = f32(127.0, 127.5, 128.0, -128.0, -128.5, -129.0, 126.5, 1e30, -1e30)
    assert_bits(fake(x, 1.0), f32(127, 127, 127, -128, -128, -128, 126, 127, -128))
    dy = f32(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert_bits(ste(x, dy, 1.0), f32(1, 0, 0, 4, 5, 0, 7, 0, 0))


def test_clamp_edges_with_a_zero_point() -> None:
    # scale 0.5 (inv 2), zp 10, [0, 255]:
    # -5 -> -10 + 10 = 0 = q_min (inside); -5.5 -> -1 (outside, clamps to 0); 122.5 -> 255 = q_max (inside);
    # 123 -> 256 (outside); 1.25 -> rne(2.5) = 2 -> 12; -1.25 -> -2 -> 8. y = (clamp(q) - 10) * 0.5
    x = f32(-5.0, -5.5, 122.5, 123.0, 1.25, -1.25)
    assert_bits(fake(x, 0.5, 10, 0, 255), f32(-5.0, -5.0, 122.5, 122.5, 1.0, -1.0))
    assert_bits(ste(x, f32(1, 2, 3, 4, 5, -6), 0.5, 10, 0, 255), f32(1, 0, 3, 0, 5, -6))


def test_zero_point_is_added_after_rounding() -> None:
    # zp 1: rne(2.5) + 1 = 3 (not rne(3.5) = 4); rne(3.5) + 1 = 5; rne(-2.5) + 1 = -1 -> clamp 0
    assert_bits(fake(f32(2.5, 3.5, -2.5), 1.0, 1, 0, 255), f32(2.0, 4.0, -1.0))
    assert_bits(ste(f32(2.5, 3.5, -2.5), f32(1, 1, 1), 1.0, 1, 0, 255), f32(1, 1, 0))


def test_int32_zero_point_array_is_used_as_given() -> None:
    # zp -5 lies outside [0, 255]; an int array zero point is not clamped:
    # 1 - 5 = -4 -> clamp 0 -> (0 + 5) * 1 = 5; 300 - 5 = 295 -> 255 -> 260
    zp = np.array([[-5]], np.int32)
    x = f32(1.0, 300.0).reshape(1, 2)
    assert_bits(fake(x, 1.0, zp, 0, 255), f32(5.0, 260.0).reshape(1, 2))
    assert reference.fake_zero_point(np.array([300, -5], np.int32), 0, 255, F32).tolist() == [300.0, -5.0]


def test_nan_input_counts_as_below_q_min() -> None:
    # PyTorch's CUDA kernels convert a NaN q to INT64_MIN: below the range, clamped to q_min, masked out
    x = f32(np.nan)
    dy = f32(1.5)
    # symmetric, [-128, 127]: y = (-128 - 0) * 0.5 = -64; mask false
    assert_bits(fake(x, 0.5), f32(-64.0))
    assert_bits(ste(x, dy, 0.5), f32(0.0))
    # zp 3, [0, 255]: y = (0 - 3) * 0.5 = -1.5; mask false
    assert_bits(fake(x, 0.5, 3, 0, 255), f32(-1.5))
    assert_bits(ste(x, dy, 0.5, 3, 0, 255), f32(0.0))
    # zp 3, [1, 255]: y = (1 - 3) * 0.5 = -1
    assert_bits(fake(x, 0.5, 3, 1, 255), f32(-1.0))
    # zp -5, [-10, -1]: y = (-10 + 5) * 0.5 = -2.5; a negative dy outside gives -0
    assert_bits(fake(x, 0.5, -5, -10, -1), f32(-2.5))
    assert_bits(ste(x, f32(-1.5), 0.5, -5, -10, -1), f32(-0.0))


def test_infinities_clamp_and_are_masked() -> None:
    # scale 0.5: +-Inf and 3e38 * 2 (overflows to +Inf) clamp to 127 / -128; mask false
    x = f32(np.inf, -np.inf, 3e38, -3e38)
    assert_bits(fake(x, 0.5), f32(63.5, -64.0, 63.5, -64.0))
    assert_bits(ste(x, f32(2, -3, 4, -5), 0.5), f32(0.0, -0.0, 0.0, -0.0))
    assert_bits(fake(x, 0.5, 3, 0, 255), f32(126.0, -1.5, 126.0, -1.5))


def test_negative_grad_outside_gives_negative_zero_and_nan_grad_stays_nan() -> None:
    x = f32(1000.0, -1000.0, 0.0, 1000.0, 0.0)
    dx = ste(x, f32(-1.5, 2.0, -3.0, np.nan, np.nan), 1.0)
    assert_bits(dx, f32(-0.0, 0.0, -3.0, np.nan, np.nan))
    assert np.signbit(dx).tolist()[:3] == [True, False, True]
    assert np.isnan(dx[3:]).all()


def test_f16_output_is_rounded_once_from_float32() -> None:
    # row 0: scale 1 + 2**-11: 2 * s = 2 + 2**-10 = half an f16 ulp (2**-9) above 2 -> tie -> 2 (even);
    #        3 * s = 3 + 0.75 ulp -> 3 + 2**-9 = 3.001953125
    # row 1: scale 1 + 3 * 2**-11: 2 * s = 2 + 1.5 ulp -> tie between 2 + 2**-9 (odd) and 2 + 2**-8 (even)
    # (x * inv rounds to +-2 and 3 in every case: inv is within 0.2% of 1)
    x = np.array([[2.0, 3.0], [2.0, -2.0]], np.float16)
    scale = np.array([[1 + 2**-11], [1 + 3 * 2**-11]], np.float32)
    y = fake(x, scale, scope=qp.ChannelScope(axis=0))
    assert_bits(y, np.array([[2.0, 3.001953125], [2.00390625, -2.00390625]], np.float16))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_f16_output_overflows_to_infinity() -> None:
    # scale 1000 (inv = rn(0.001) = 0.0010000000475): Inf -> 127 -> 127000 > 65504 -> +Inf;
    # 60000 -> 60.0000028 -> 60 -> 60000 (exact in f16); -65504 -> -65.504 -> -66 -> -66000 -> -Inf
    x = np.array([np.inf, 60000.0, -65504.0], np.float16)
    assert_bits(fake(x, 1000.0), np.array([np.inf, 60000.0, -np.inf], np.float16))


def test_bf16_output_is_rounded_once_from_float32() -> None:
    # bf16 ulp on [2, 4) is 2**-6. row 0: scale 1 + 2**-8: 2 * s = 2 + 0.5 ulp -> tie -> 2 (even);
    # 3 * s = 3 + 0.75 ulp -> 3.015625. row 1: scale 1 + 3 * 2**-8: 2 * s = 2 + 1.5 ulp -> tie -> 2 + 2 ulp
    bf16 = ml_dtypes.bfloat16
    x = np.array([[2.0, 3.0], [2.0, -2.0]], bf16)
    scale = np.array([[1 + 2**-8], [1 + 3 * 2**-8]], np.float32)
    y = fake(x, scale, scope=qp.ChannelScope(axis=0))
    assert_bits(y, np.array([[2.0, 3.015625], [2.03125, -2.03125]], bf16))


def test_bf16_raw_uint16_storage() -> None:
    # the same values through uint16 bit patterns: 2.0 = 0x4000, 3.0 = 0x4040; 2.03125 = 0x4002, 3.03125 = 0x4042
    x = np.array([0x4000, 0x4040], np.uint16)
    desc = qp.FakeQuantizeDescriptor(shape=(2,), scope=qp.TensorScope(), element=EK.BF16, q_min=-128, q_max=127)
    y = np.zeros(2, np.uint16)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y, 1 + 3 * 2**-8))
    # 3 * (1 + 3 * 2**-8) = 3 + 2.25 ulp -> 3 + 2 ulp = 3.03125
    assert y.tolist() == [0x4002, 0x4042]


# ---- learnable (float) zero points ------------------------------------------------------------


def test_learnable_zero_point_is_rounded_half_even_and_clamped() -> None:
    z = f32(2.5, 3.5, -0.5, -3.0, 20.0, np.nan, np.inf, -np.inf, 14.5)
    assert reference.fake_zero_point(z, 0, 15, F32).tolist() == [2, 4, 0, 0, 15, 0, 15, 0, 14]
    assert reference.fake_zero_point(np.array([np.nan, 7.5]), 1, 15, F64).tolist() == [1, 8]
    # per channel, scale 1, [0, 15]: x = -100 -> q_min -> y = -zp; x = 100 -> q_max -> y = 15 - zp
    zp = f32(2.5, 3.5, -3.0, 20.0, np.nan).reshape(5, 1)  # -> 2, 4, 0, 15, 0 (NaN -> q_min)
    x = np.tile(f32(-100.0, 100.0), (5, 1))
    y = fake(x, np.ones((5, 1), np.float32), zp, 0, 15, qp.ChannelScope(axis=0))
    assert_bits(y, f32(-2, 13, -4, 11, 0, 15, -15, 0, 0, 15).reshape(5, 2))


def test_scalar_float_zero_point() -> None:
    # 2.5 -> 2, 3.5 -> 4, 99.0 -> 15: x = 100 clamps to 15 -> y = 15 - zp
    assert_bits(fake(f32(100.0), 1.0, 2.5, 0, 15), f32(13.0))
    assert_bits(fake(f32(100.0), 1.0, 3.5, 0, 15), f32(11.0))
    assert_bits(fake(f32(100.0), 1.0, 99.0, 0, 15), f32(0.0))
    assert_bits(fake(f32(100.0), 1.0, np.float32(np.nan), 0, 15), f32(15.0))


def test_scalar_float_zero_point_rounds_like_a_float32_array() -> None:
    # x = 300 clamps to q_max = 10; y = 10 - zp. float32(2.5000001) == 2.5 -> rne 2 -> y = 8
    x = f32(300.0)
    assert_bits(fake(x, 1.0, np.array([2.5000001], np.float32), 0, 10), f32(8.0))
    assert_bits(reference.fake_quantize(x, np.float32(1.0), 2.5000001, 0, 10, F32), f32(8.0))
    assert_bits(fake(x, 1.0, 2.5000001, 0, 10), f32(8.0))


def test_learnable_zero_point_rounding_in_the_straight_through_mask() -> None:
    # [0, 15], scale 1: zp 2.5 -> 2: 13 + 2 = 15 inside, 14 + 2 = 16 outside;
    # zp 3.5 -> 4: 11 + 4 = 15 inside, 12 + 4 = 16 outside
    dy = f32(1.0, 1.0)
    assert_bits(ste(f32(13.0, 14.0), dy, 1.0, 2.5, 0, 15), f32(1.0, 0.0))
    assert_bits(ste(f32(11.0, 12.0), dy, 1.0, 3.5, 0, 15), f32(1.0, 0.0))


# ---- direct reference functions ---------------------------------------------------------------


def test_fake_quantize_codes_inverse_and_nan() -> None:
    xa, inv, q = reference.fake_quantize_codes(f32(-213.5, 213.5, np.nan), np.float32(7.0), np.float32(0.0), F32)
    assert xa.dtype == np.float32 and np.asarray(inv).dtype == np.float32
    assert np.asarray(inv, np.float32).view(np.uint32) == 0x3E124925  # rn(1/7), rounded up
    assert_bits(q, f32(-31.0, 31.0, -np.inf))  # NaN -> -Inf: below any q_min
    xa, inv, q = reference.fake_quantize_codes(np.array([-213.5, 213.5, np.nan]), np.float64(7.0), np.float64(2.0), F64)
    assert np.asarray(inv, np.float64).view(np.uint64) == 0x3FC2492492492492  # rn(1/7), rounded down
    assert_bits(q, np.array([-28.0, 32.0, -np.inf]))  # rne(-30.5) + 2, rne(30.5) + 2, NaN -> -Inf


def test_reference_functions_on_hand_vectors() -> None:
    x = f32(1.25, -5.0, np.nan, np.inf)
    # scale 0.5, zp 3, [0, 15]: q = 5, -7 (below), -Inf (NaN: below), inf (above)
    assert_bits(reference.fake_quantize(x, np.float32(0.5), 3, 0, 15, F32), f32(1.0, -1.5, -1.5, 6.0))
    dy = f32(-1.0, -1.0, -1.0, -1.0)
    assert_bits(reference.fake_quantize_ste(x, dy, np.float32(0.5), 3, 0, 15, F32), f32(-1.0, -0.0, -0.0, -0.0))
    x16 = x.astype(np.float16)
    y16 = reference.fake_quantize(x16, np.float32(0.5), 3, 0, 15, F32)
    assert_bits(y16, np.array([1.0, -1.5, -1.5, 6.0], np.float16))


# ---- learnable (LSQ) backward -----------------------------------------------------------------

# Per tensor: scale 0.5 (inv 2), zp 3.4 (-> 3), [0, 15], x / dy:
#   -5    / 2   : -10 + 3 = -7 below: dscale = 2 * (0 - 3) = -6,     dzp = (-2) * 0.5 = -1,   dx = 0
#   10    / 3   :  20 + 3 = 23 above: dscale = 3 * (15 - 3) = 36,    dzp = (-3) * 0.5 = -1.5, dx = 0
#   1.25  / 0.5 : rne(2.5) + 3 = 5 inside, y = (5 - 3) * 0.5 = 1: dscale = (0.5 * (1 - 1.25)) * 2 = -0.25
#   0.75  / -4  : rne(1.5) + 3 = 5 inside, y = 1: dscale = (-4 * 0.25) * 2 = -2
# dscale = -6 + 36 - 0.25 - 2 = 27.75, dzp = -2.5
LSQ_X = f32(-5.0, 10.0, 1.25, 0.75)
LSQ_DY = f32(2.0, 3.0, 0.5, -4.0)


def test_lsq_terms_per_element() -> None:
    dx, ds, dz = reference.fake_quantize_lsq_terms(LSQ_X, LSQ_DY, np.float32(0.5), np.float32(3.4), 0, 15, 1.0, F32)
    assert_bits(dx, f32(0.0, 0.0, 0.5, -4.0))
    assert_bits(ds, f32(-6.0, 36.0, -0.25, -2.0))
    assert_bits(dz, f32(-1.0, -1.5, 0.0, 0.0))


def test_lsq_per_tensor() -> None:
    dx, ds, dz = lsq(LSQ_X, LSQ_DY, f32(0.5), f32(3.4), 0, 15)
    assert_bits(dx, f32(0.0, 0.0, 0.5, -4.0))
    assert_bits(ds, f32(27.75))
    assert dz is not None
    assert_bits(dz, f32(-2.5))


def test_lsq_grad_factor_scales_dscale_and_dzp_only() -> None:
    dx, ds, dz = lsq(LSQ_X, LSQ_DY, f32(0.5), f32(3.4), 0, 15, grad_factor=0.25)
    assert_bits(dx, f32(0.0, 0.0, 0.5, -4.0))
    assert_bits(ds, f32(6.9375))  # 27.75 / 4
    assert dz is not None
    assert_bits(dz, f32(-0.625))  # -2.5 / 4
    _, ds, dz = lsq(LSQ_X, LSQ_DY, f32(0.5), f32(3.4), 0, 15, grad_factor=-2.0)
    assert dz is not None
    assert_bits(ds, f32(-55.5))
    assert_bits(dz, f32(5.0))


def test_lsq_per_channel_sums() -> None:
    # [-8, 7], int32 zero points. row 0: scale 0.5 (inv 2), zp 1; row 1: scale 0.25 (inv 4), zp -2
    #  3.0 / 1   : 6 + 1 = 7 = q_max inside, y = 3 = x: dscale 0
    #  10  / 1   : 21 above: dscale = 1 * (7 - 1) = 6, dzp = -0.5
    #  -5  / 1   : -9 below: dscale = 1 * (-8 - 1) = -9, dzp = -0.5        -> row 0: -3, -1
    # -1.5 / 2   : -6 - 2 = -8 = q_min inside, y = -1.5 = x: dscale 0
    # 0.375 / -1 : rne(1.5) - 2 = 0 inside, y = 0.5: dscale = (-1 * 0.125) * 4 = -0.5
    #  2.5 / 0.5 : 10 - 2 = 8 above: dscale = 0.5 * (7 + 2) = 4.5, dzp = -0.5 * 0.25 = -0.125 -> row 1: 4, -0.125
    x = f32(3.0, 10.0, -5.0, -1.5, 0.375, 2.5).reshape(2, 3)
    dy = f32(1.0, 1.0, 1.0, 2.0, -1.0, 0.5).reshape(2, 3)
    scale = f32(0.5, 0.25).reshape(2, 1)
    zp = np.array([[1], [-2]], np.int32)
    dx, ds, dz = lsq(x, dy, scale, zp, -8, 7, qp.ChannelScope(axis=0))
    assert_bits(dx, f32(1.0, 0.0, 0.0, 2.0, -1.0, 0.0).reshape(2, 3))
    assert_bits(ds, f32(-3.0, 4.0).reshape(2, 1))
    assert dz is not None
    assert_bits(dz, f32(-1.0, -0.125).reshape(2, 1))


# GroupScope(axis=-1, group_size=2) on (2, 4), symmetric, [-4, 3], scales [[1, 0.5], [0.25, 2]]:
#   g00 (inv 1):   2.5 -> 2 -> 2.0;  5 -> 5 > 3 -> 3.0 (above)
#   g01 (inv 2):   0.5 -> 1 -> 0.5;  1.75 -> rne(3.5) = 4 > 3 -> 1.5 (above)
#   g10 (inv 4): 0.625 -> rne(2.5) = 2 -> 0.5;  -2 -> -8 < -4 -> -1.0 (below)
#   g11 (inv 0.5): 5 -> rne(2.5) = 2 -> 4.0;  -9 -> rne(-4.5) = -4 = q_min (inside) -> -8.0
GROUP = qp.GroupScope(axis=-1, group_size=2)
GROUP_X = f32(2.5, 5.0, 0.5, 1.75, 0.625, -2.0, 5.0, -9.0).reshape(2, 4)
GROUP_SCALE = f32(1.0, 0.5, 0.25, 2.0).reshape(2, 2)


def test_group_scope_forward_and_straight_through() -> None:
    assert_bits(fake(GROUP_X, GROUP_SCALE, None, -4, 3, GROUP), f32(2, 3, 0.5, 1.5, 0.5, -1, 4, -8).reshape(2, 4))
    dy = np.ones((2, 4), np.float32)
    assert_bits(ste(GROUP_X, dy, GROUP_SCALE, None, -4, 3, GROUP), f32(1, 0, 1, 0, 1, 0, 1, 1).reshape(2, 4))


def test_group_scope_lsq() -> None:
    # dy = 1, gf = 1. g00: (2 - 2.5) * 1 = -0.5, above 3 -> 2.5;  g01: 0 + 3 = 3;
    # g10: (0.5 - 0.625) * 4 = -0.5, below -4 -> -4.5;  g11: (4 - 5) * 0.5 + (-8 + 9) * 0.5 = 0
    dy = np.ones((2, 4), np.float32)
    dx, ds, dz = lsq(GROUP_X, dy, GROUP_SCALE, None, -4, 3, GROUP)
    assert dz is None
    assert_bits(dx, f32(1, 0, 1, 0, 1, 0, 1, 1).reshape(2, 4))
    assert_bits(ds, f32(2.5, 3.0, -4.5, 0.0).reshape(2, 2))


def test_lsq_f64_and_f16_data() -> None:
    # the per-tensor case again: F64 data -> float64 gradients, F16 data -> float32 gradients, f16 dx
    dx, ds, dz = lsq(LSQ_X.astype(np.float64), LSQ_DY.astype(np.float64), np.array([0.5]), np.array([3.4]), 0, 15)
    assert dz is not None
    assert_bits(dx, np.array([0.0, 0.0, 0.5, -4.0]))
    assert_bits(ds, np.array([27.75]))
    assert_bits(dz, np.array([-2.5]))
    dx, ds, dz = lsq(LSQ_X.astype(np.float16), LSQ_DY.astype(np.float16), f32(0.5), f32(3.4), 0, 15)
    assert dz is not None
    assert_bits(dx, np.array([0.0, 0.0, 0.5, -4.0], np.float16))
    assert_bits(ds, f32(27.75))
    assert_bits(dz, f32(-2.5))


def test_lsq_empty_segments_sum_to_zero() -> None:
    x = np.zeros((4, 0), np.float32)
    dx, ds, dz = lsq(x, x.copy(), np.ones((4, 1), np.float32), np.zeros((4, 1), np.float32), 0, 15, qp.TokenScope())
    assert dz is not None
    assert_bits(ds, np.zeros((4, 1), np.float32))
    assert_bits(dz, np.zeros((4, 1), np.float32))


def test_rank_zero() -> None:
    assert_bits(fake(np.array(2.6, np.float32), 0.5), np.array(2.5, np.float32))  # rne(5.2) = 5
    assert_bits(ste(np.array(80.0, np.float32), np.array(-2.0, np.float32), 0.5), np.array(-0.0, np.float32))


# ---- the plan equals the reference functions --------------------------------------------------


def _random_params(
    rng: np.random.Generator, shape: tuple[int, ...], scope: qp.Scope, kind: EK, mode: str, q_min: int, q_max: int
) -> tuple[np.ndarray, np.ndarray | None]:
    precision = ELEMENTS[kind].math_precision
    pshape = param_shape(shape, scope)
    scale = random_scale(rng, pshape, precision)
    if mode == "symmetric":
        return scale, None
    if mode == "int":
        return scale, rng.integers(q_min, q_max + 1, size=pshape).astype(np.int32)
    # learnable: ties, out-of-range values and a NaN
    zp = rng.integers(q_min - 3, q_max + 4, size=pshape) + rng.choice([0.0, 0.5, 0.25], size=pshape)
    zp.reshape(-1)[0] = np.nan
    return scale, zp.astype(scale.dtype)


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize("mode", ["symmetric", "int", "float"])
def test_plan_equals_reference_random(rng: np.random.Generator, kind: EK, mode: str) -> None:
    precision = ELEMENTS[kind].math_precision
    for (scope, shape), (q_min, q_max) in zip(
        SCOPES, [(-128, 127), (0, 255), (-8, 7), (0, 15), (-7, 7)] * 2, strict=True
    ):
        x = random_floats(rng, shape, kind)
        x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
        scale, zp = _random_params(rng, shape, scope, kind, mode, q_min, q_max)
        mode_enum = qp.QuantMode.SYMMETRIC if zp is None else qp.QuantMode.ASYMMETRIC
        common = dict(shape=shape, scope=scope, mode=mode_enum, element=kind, q_min=q_min, q_max=q_max)
        scale_x = expand_params(scale, shape, scope)
        zp_x = 0 if zp is None else expand_params(zp, shape, scope)
        with np.errstate(over="ignore"):
            expected = reference.fake_quantize(x, scale_x, zp_x, q_min, q_max, precision)
            y = np.zeros_like(x)
            plan = qp.FakeQuantizePlan.select(None, qp.FakeQuantizeDescriptor(**common), REFERENCE)
            plan.run(None, None, qp.FakeQuantizeArgs(x, y, scale, zp))
        assert float_bits_equal(y, expected), f"{scope} {shape}: {first_mismatch(y, expected)}"
        dy = random_floats(rng, shape, kind, specials=False)
        back = qp.FakeQuantizeBackwardPlan.select(None, qp.FakeQuantizeBackwardDescriptor(**common), REFERENCE)
        dx = np.zeros_like(dy)
        back.run(None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx, scale, zp))
        expected_dx = reference.fake_quantize_ste(x, dy, scale_x, zp_x, q_min, q_max, precision)
        assert float_bits_equal(dx, expected_dx), f"{scope} {shape}: {first_mismatch(dx, expected_dx)}"


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
def test_learnable_plan_equals_reference_random(rng: np.random.Generator, kind: EK) -> None:
    precision = ELEMENTS[kind].math_precision
    cases = [
        (qp.TensorScope(), (37, 203)),
        (qp.TokenScope(), (5, 7, 301)),
        (qp.ChannelScope(axis=0), (43, 131)),
        (qp.GroupScope(axis=-1, group_size=7), (19, 105)),
    ]
    for scope, shape in cases:
        x = random_floats(rng, shape, kind)
        dy = random_floats(rng, shape, kind, specials=False)
        scale, zp = _random_params(rng, shape, scope, kind, "float", 0, 255)
        desc = qp.FakeQuantizeBackwardDescriptor(
            shape=shape, scope=scope, mode=qp.QuantMode.ASYMMETRIC, element=kind, q_min=0, q_max=255, learnable=True
        )
        dx, ds, dz = np.zeros_like(dy), np.zeros_like(scale), np.zeros_like(scale)
        with np.errstate(over="ignore"):
            qp.FakeQuantizeBackwardPlan.select(None, desc, REFERENCE).run(
                None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx, scale, zp, ds, dz, grad_factor=0.125)
            )
            ex, es, ez = reference.fake_quantize_lsq(
                x,
                dy,
                expand_params(scale, shape, scope),
                expand_params(zp, shape, scope),
                0,
                255,
                0.125,
                scope,
                precision,
            )
        for got, want in ((dx, ex), (ds, es), (dz, ez)):
            assert float_bits_equal(got, want), f"{scope} {shape}: {first_mismatch(got, want)}"


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
def test_in_place(rng: np.random.Generator, kind: EK) -> None:
    shape = (6, 40)
    scope = qp.ChannelScope(axis=0)
    precision = ELEMENTS[kind].math_precision
    x = random_floats(rng, shape, kind)
    scale = random_scale(rng, (6, 1), precision)
    zp = rng.integers(0, 256, size=(6, 1)).astype(np.int32)
    common = dict(shape=shape, scope=scope, mode=qp.QuantMode.ASYMMETRIC, element=kind, q_min=0, q_max=255)
    with np.errstate(over="ignore"):
        expected = reference.fake_quantize(x.copy(), scale, zp, 0, 255, precision)
        expected_dx = reference.fake_quantize_ste(x, x, scale, zp, 0, 255, precision)
        # backward first (grad_input is grad_output, a copy of x), then the forward on x itself
        dy = x.copy()
        back = qp.FakeQuantizeBackwardPlan.select(None, qp.FakeQuantizeBackwardDescriptor(**common), REFERENCE)
        back.run(None, None, qp.FakeQuantizeBackwardArgs(x, dy, dy, scale, zp))
        plan = qp.FakeQuantizePlan.select(None, qp.FakeQuantizeDescriptor(**common), REFERENCE)
        plan.run(None, None, qp.FakeQuantizeArgs(x, x, scale, zp))
    assert float_bits_equal(x, expected), first_mismatch(x, expected)
    assert float_bits_equal(dy, expected_dx), first_mismatch(dy, expected_dx)
