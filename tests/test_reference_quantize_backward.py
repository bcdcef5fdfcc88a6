"""CPU: QuantizeBackwardPlan / DequantizeBackwardPlan on the reference backend, against hand-computed values.

Ties (rne of x / scale), the mask's inclusive bounds at q_min / q_max (narrowed ranges and
asymmetric zero points), NaN and +-Inf, the FP8 saturation boundary, every scope, one rounding
of ``dq / scale`` and ``dy * scale``, agreement of the mask with QuantizePlan's codes, and the
chain dequantize backward -> quantize backward against FakeQuantizeBackwardPlan.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan import reference
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
F32 = np.float32


def _qbackward(
    x: np.ndarray,
    dq: np.ndarray,
    scale: object,
    zp: object = None,
    *,
    scope: qp.Scope | None = None,
    code: EK = EK.S8,
    float_kind: EK = EK.F32,
    **kw: object,
) -> np.ndarray:
    """dx from QuantizeBackwardPlan on the reference backend (written over a sentinel)."""
    desc = qp.QuantizeBackwardDescriptor(
        shape=x.shape,
        scope=scope or qp.TensorScope(),
        mode=SYM if zp is None else ASYM,
        input_element=float_kind,
        output_element=code,
        **kw,
    )
    plan = qp.QuantizeBackwardPlan.select(None, desc, REFERENCE)
    dx = np.full(x.shape, 77, x.dtype)
    plan.run(None, None, qp.QuantizeBackwardArgs(x, dq, dx, scale, zp))
    return dx


def _oracle(x: list[float], dq: list[float], s: float, zp: int, lo: int, hi: int) -> list[float]:
    """The rule written element by element with float32 scalars (x / s rounded half to even)."""
    out = []
    for xi, gi in zip(x, dq, strict=True):
        v = F32(xi) / F32(s)
        inside = not math.isnan(v) and not math.isinf(v) and lo <= int(np.rint(v)) + zp <= hi
        out.append(float(F32(gi) / F32(s)) if inside else 0.0)
    return out


def _same(got: np.ndarray, expected: list[float] | np.ndarray) -> None:
    exp = np.asarray(expected, dtype=got.dtype).reshape(got.shape)
    assert np.array_equal(got.view(np.uint8), exp.view(np.uint8)), (got, exp)


# ---- integer codes: ties and inclusive bounds --------------------------------------------------


@pytest.mark.parametrize("scale", [1.0, 0.25, 4.0])
def test_ties_round_half_to_even_at_the_int8_bounds(scale: float) -> None:
    vs = [126.5, 127.0, 127.4, 127.5, 128.0, -127.5, -128.0, -128.5, -128.6, -129.5, 0.5, -0.5, 1.5, -2.5]
    inside = [1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1]
    x = (np.array(vs) * scale).astype(F32)  # powers of two: x / scale is exactly vs
    dq = np.full(x.shape, 3.0, F32)
    dx = _qbackward(x, dq, scale)
    _same(dx, [3.0 / scale if i else 0.0 for i in inside])
    _same(dx, _oracle(list(x), list(dq), scale, 0, -128, 127))


def test_narrowed_symmetric_range_is_inclusive() -> None:
    x = np.array([-127.0, -127.4, -127.5, -126.5, -128.0, 127.0, 127.5], F32)
    dx = _qbackward(x, np.ones_like(x), 1.0, q_min=-127)
    _same(dx, [1, 1, 0, 1, 0, 1, 0])  # -127.5 -> -128 is below q_min = -127


def test_asymmetric_zero_point_shifts_the_window() -> None:
    x = np.array([-10.5, -10.6, -11.5, 244.5, 245.0, 245.4, 245.5, 246.0, 0.0, np.float32(-9.5)], F32)
    # rne(x) + 10:   0,    -1,   -2,   254,   255,   255,   256,  256,  10,   0 (-9.5 -> -10)
    dx = _qbackward(x, np.full_like(x, 2.0), 1.0, 10, code=EK.U8)
    _same(dx, [2, 0, 0, 2, 2, 2, 0, 0, 2, 2])
    # a narrowed window [3, 250] with zp = -5: inside iff 8 <= rne(x) <= 255
    x2 = np.array([7.5, 8.0, 8.5, 9.5, 254.5, 255.0, 255.5, 256.0], F32)
    dx2 = _qbackward(x2, np.ones_like(x2), 1.0, -5, code=EK.U8, q_min=3, q_max=250)
    _same(dx2, [1, 1, 1, 1, 1, 1, 0, 0])  # 7.5 -> 8 (even), 8.5 -> 8, 255.5 -> 256
    _same(dx2, _oracle(list(x2), [1.0] * 8, 1.0, -5, 3, 250))


@pytest.mark.parametrize("code,lo,hi", [(EK.S4, -8, 7), (EK.U4, 0, 15)])
@pytest.mark.parametrize("order", list(qp.NibbleOrder))
def test_int4_codes_use_their_range_with_unpacked_gradients(code: EK, lo: int, hi: int, order: qp.NibbleOrder) -> None:
    vals = np.arange(lo - 2, hi + 3, 0.5, dtype=F32)  # ties everywhere, both ends crossed
    x = vals[: (vals.size // 5) * 5].reshape(-1, 5)  # odd last extent: 4-bit codes would pack to 3
    dq = np.full(x.shape, -1.0, F32)
    scale = np.ones((x.shape[0], 1), F32)
    dx = _qbackward(x, dq, scale, scope=qp.TokenScope(), code=code, nibble_order=order)
    assert dx.shape == x.shape
    _same(dx, [-1.0 if lo <= np.rint(v) <= hi else 0.0 for v in x.reshape(-1)])


# ---- special values ---------------------------------------------------------------------------


def test_nan_and_inf_are_outside_and_outside_is_plus_zero() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 300.0, 1.0, 2.0], F32)
    dq = np.array([-2.0, np.nan, -np.inf, -5.0, -2.0, np.nan], F32)
    dx = _qbackward(x, dq, 0.5)
    assert not np.signbit(dx[:4]).any()  # +0, also for a negative, NaN or infinite dq outside
    _same(dx[:5], [0.0, 0.0, 0.0, 0.0, -4.0])
    assert np.isnan(dx[5])  # a NaN gradient inside stays NaN


def test_inf_gradient_inside_and_overflowing_quotient() -> None:
    x = np.array([1.0, 1.0, 1.0], F32)
    dq = np.array([np.inf, -np.inf, 3e38], F32)
    dx = _qbackward(x, dq, 0.5)  # 3e38 / 0.5 overflows float32 to +Inf
    _same(dx, [np.inf, -np.inf, np.inf])


# ---- FP8 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [EK.FP8_E4M3, EK.FP8_E5M2])
@pytest.mark.parametrize("float_kind", [EK.F32, EK.F64])
def test_fp8_boundary_is_the_largest_finite_inclusive(code: EK, float_kind: EK) -> None:
    fmax = ELEMENTS[code].fp8_max
    assert fmax is not None
    dt = ELEMENTS[float_kind].numpy_dtype.type
    scale = 0.5
    edge = dt(fmax * scale)
    x = np.array(
        [edge, -edge, np.nextafter(edge, dt(np.inf)), -np.nextafter(edge, dt(np.inf)), np.nextafter(edge, dt(0))]
        + [1e-30, -0.0, 0.0, np.nan, np.inf, -np.inf, 1e30],
        dt,
    )
    dq = np.full(x.shape, 1.0, dt)
    dx = _qbackward(x, dq, scale, code=code, float_kind=float_kind)
    _same(dx, [2, 2, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0])


def test_fp8_zero_point_must_be_absent() -> None:
    desc = qp.QuantizeBackwardDescriptor(
        shape=(2, 2), scope=qp.TensorScope(), mode=ASYM, input_element=EK.F32, output_element=EK.FP8_E4M3
    )
    with pytest.raises(qp.InvalidProblem, match="symmetric only"):
        qp.QuantizeBackwardPlan.select(None, desc, REFERENCE)


# ---- arithmetic: one IEEE division, one rounding ------------------------------------------------


def test_gradient_is_one_ieee_division_rounded_once() -> None:
    x = np.zeros(4, F32)
    dq = np.array([1.0, 2.0, -7.0, 1e-3], F32)
    dx = _qbackward(x, dq, 3.0)
    _same(dx, dq / F32(3.0))
    # float64 data divides in float64
    dx64 = _qbackward(x.astype(np.float64), dq.astype(np.float64), 3.0, float_kind=EK.F64)
    _same(dx64, dq.astype(np.float64) / 3.0)
    assert dx64[0] != float(F32(1) / F32(3))
    # float16: float32 quotient, then one rounding to float16 (not float16 arithmetic)
    x16 = np.zeros(2, np.float16)
    dq16 = np.array([1.0, 3.0], np.float16)
    dx16 = _qbackward(x16, dq16, 3.0, float_kind=EK.F16)
    _same(dx16, (dq16.astype(F32) / F32(3.0)).astype(np.float16))


def test_bfloat16_gradients_and_raw_bit_views() -> None:
    bf = ml_dtypes.bfloat16
    x = np.array([1.0, 500.0, -2.0], bf)
    dq = np.array([1.5, 1.5, -3.0], bf)
    desc = qp.QuantizeBackwardDescriptor(
        shape=(3,), scope=qp.TensorScope(), input_element=EK.BF16, output_element=EK.S8
    )
    plan = qp.QuantizeBackwardPlan.select(None, desc, REFERENCE)
    dx = np.zeros(3, np.uint16)  # CuPy-style raw bits
    plan.run(None, None, qp.QuantizeBackwardArgs(x.view(np.uint16), dq, dx, 0.75))
    expected = np.where([True, False, True], dq.astype(F32) / F32(0.75), 0).astype(F32).astype(bf)
    assert np.array_equal(dx, expected.view(np.uint16))


# ---- scopes ------------------------------------------------------------------------------------


def test_token_scope_with_asymmetric_zero_points() -> None:
    x = np.array([[0.0, 1.0, 2.0], [-1.0, 3.0, 40.0]], F32)
    dq = np.ones_like(x)
    scale = np.array([[0.5], [0.25]], F32)
    zp = np.array([[124], [-128]], np.int32)
    # row 0: x / 0.5 + 124 = 124, 126, 128 (out); row 1: x / 0.25 - 128 = -132 (out), -116, 32
    dx = _qbackward(x, dq, scale, zp, scope=qp.TokenScope())
    _same(dx, [[2, 2, 0], [0, 4, 4]])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_channel_scope(axis: int) -> None:
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], F32) * 25
    dq = np.full_like(x, 1.0)
    channels = x.shape[axis]
    scale = np.array([0.25, 1.0, 0.5][:channels], F32)
    pshape = [1, 1]
    pshape[axis] = channels
    dx = _qbackward(x, dq, scale.reshape(pshape), scope=qp.ChannelScope(axis=axis))
    s = np.broadcast_to(scale.reshape(pshape), x.shape)
    expected = [_oracle([xv], [1.0], sv, 0, -128, 127)[0] for xv, sv in zip(x.reshape(-1), s.reshape(-1), strict=True)]
    _same(dx, expected)
    assert 0 < np.count_nonzero(dx) < dx.size  # some inside, some outside


def test_group_scope_along_the_last_axis() -> None:
    x = np.array([[1.0, 200.0, 1.0, 200.0], [100.0, 300.0, 7.5, 8.5]], F32)
    scale = np.array([[1.0, 2.0], [1.0, 0.125]], F32)
    zp = np.array([[0, 0], [-27, -128]], np.int32)
    dq = np.full_like(x, 4.0)
    # groups: (1, 200)/1 -> 1 in, 200 out; (1, 200)/2 -> 0.5->0 in, 100 in;
    #         (100, 300)/1 - 27 -> 73 in, 273 out; (7.5, 8.5)/0.125 - 128 -> -68 in, -60 in
    dx = _qbackward(x, dq, scale, zp, scope=qp.GroupScope(axis=-1, group_size=2))
    _same(dx, [[4, 0, 2, 2], [4, 0, 32, 32]])


def test_group_scope_along_the_first_axis_of_rank_three() -> None:
    x = np.arange(4 * 2 * 3, dtype=F32).reshape(4, 2, 3) * 7 - 60
    dq = np.arange(x.size, dtype=F32).reshape(x.shape) + 1
    scale = np.array([0.5, 0.25, 1.0, 2.0, 0.125, 4.0, 1.0, 0.5, 0.25, 2.0, 1.0, 0.5], F32).reshape(2, 2, 3)
    dx = _qbackward(x, dq, scale, scope=qp.GroupScope(axis=0, group_size=2))
    se = np.repeat(scale, 2, axis=0)
    expected = [
        _oracle([a], [g], s, 0, -128, 127)[0] for a, g, s in zip(x.ravel(), dq.ravel(), se.ravel(), strict=True)
    ]
    _same(dx, expected)


# ---- the mask agrees with the forward's codes ---------------------------------------------------


@pytest.mark.parametrize("float_kind", [EK.F16, EK.BF16, EK.F32, EK.F64])
@pytest.mark.parametrize("code,lo,hi", [(EK.S8, -100, 100), (EK.U8, 1, 254), (EK.S4, -7, 6), (EK.U4, 1, 14)])
def test_mask_agrees_with_quantize_plan_codes(rng, float_kind: EK, code: EK, lo: int, hi: int) -> None:
    """Forward with the range widened by one each side: a code in [lo, hi] is exactly an unclamped one."""
    shape = (37, 29)
    x = random_floats(rng, shape, float_kind)
    pdtype = np.float64 if float_kind is EK.F64 else F32
    # The range of the finite values: F16 data may hold +-Inf (overflowed), whose infinite scale would
    # make dx = dq / scale vanish inside the mask.
    x64 = x.astype(np.float64)
    amax = np.nanmax(np.where(np.isfinite(x64), np.abs(x64), 0.0), axis=1, keepdims=True)
    scale = (amax / (hi - lo) * rng.uniform(0.5, 3.0, size=(37, 1))).astype(pdtype)
    zp = rng.integers(lo - 3, hi + 3, size=(37, 1)).astype(np.int32)
    fwd = qp.QuantizeDescriptor(
        shape=shape,
        scope=qp.TokenScope(),
        mode=ASYM,
        input_element=float_kind,
        output_element=code,
        q_min=lo - 1,
        q_max=hi + 1,
    )
    q = np.zeros(fwd.output_shape, ELEMENTS[code].numpy_dtype)
    qp.QuantizePlan.select(None, fwd, REFERENCE).run(None, None, qp.QuantizeArgs(x, q, scale, zp))
    codes = reference.decode_codes(q, code, shape[-1], qp.NibbleOrder.LOW_FIRST)
    bwd = qp.QuantizeBackwardDescriptor.from_forward(fwd.model_copy(update={"q_min": lo, "q_max": hi}))
    dq = np.ones(shape, x.dtype)
    dx = np.zeros_like(dq)
    qp.QuantizeBackwardPlan.select(None, bwd, REFERENCE).run(None, None, qp.QuantizeBackwardArgs(x, dq, dx, scale, zp))
    expected = (codes >= lo) & (codes <= hi) & ~np.isnan(x.astype(np.float64))
    assert np.array_equal(dx.astype(np.float64) != 0, expected)
    assert 0 < np.count_nonzero(expected) < expected.size


# ---- dequantize backward ------------------------------------------------------------------------


def test_dequantize_backward_is_one_product_rounded_once() -> None:
    scale = 1 + 2.0**-11 + 2.0**-23  # exact in float32; a float16 tie if the scale were rounded first
    for dtype, kind in ((np.float16, EK.F16), (ml_dtypes.bfloat16, EK.BF16)):
        dy = np.array([1.0, -1.0, 0.0, 2.0], dtype)
        desc = qp.DequantizeBackwardDescriptor(
            shape=(4,), scope=qp.TensorScope(), input_element=EK.S8, output_element=kind
        )
        dq = np.zeros(4, dtype)
        qp.DequantizeBackwardPlan.select(None, desc, REFERENCE).run(
            None, None, qp.DequantizeBackwardArgs(dy, dq, scale)
        )
        expected = (dy.astype(F32) * F32(scale)).astype(dtype)
        assert np.array_equal(dq.view(np.uint16), expected.view(np.uint16))
        if kind is EK.F16:
            assert float(dq[0]) == 1 + 2.0**-10  # rounded up past the tie: one rounding of the f32 product


@pytest.mark.parametrize("code", [EK.S8, EK.U4, EK.FP8_E5M2])
def test_dequantize_backward_channel_scope_and_f64(code: EK) -> None:
    dy = np.array([[1.0, -2.0, np.nan], [np.inf, 0.5, -0.0]])
    scale = np.array([[0.1], [3.0]])
    desc = qp.DequantizeBackwardDescriptor(
        shape=(2, 3), scope=qp.ChannelScope(axis=0), input_element=code, output_element=EK.F64
    )
    dq = np.zeros((2, 3))
    qp.DequantizeBackwardPlan.select(None, desc, REFERENCE).run(None, None, qp.DequantizeBackwardArgs(dy, dq, scale))
    expected = dy * scale
    assert np.array_equal(dq, expected, equal_nan=True)
    assert np.signbit(dq[1, 2])  # -0 * 3 = -0: an IEEE product, no mask
    assert dq[0, 0] == 0.1  # float64 scale, float64 product


def test_dequantize_backward_group_scope_float32() -> None:
    dy = np.arange(1, 13, dtype=F32).reshape(2, 6)
    scale = np.array([[0.5, 0.1, 3.0], [2.0, 0.25, 1e-3]], F32)
    desc = qp.DequantizeBackwardDescriptor(
        shape=(2, 6), scope=qp.GroupScope(group_size=2), mode=ASYM, input_element=EK.U8, output_element=EK.F32
    )
    dq = np.zeros_like(dy)
    qp.DequantizeBackwardPlan.select(None, desc, REFERENCE).run(None, None, qp.DequantizeBackwardArgs(dy, dq, scale))
    _same(dq, dy * np.repeat(scale, 2, axis=1))


# ---- the chain against FakeQuantizeBackwardPlan ---------------------------------------------------


def _chain(x: np.ndarray, dy: np.ndarray, kind: EK, scope: qp.Scope, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    fields = dict(shape=x.shape, scope=scope, mode=ASYM)
    ddesc = qp.DequantizeBackwardDescriptor(**fields, input_element=EK.U8, output_element=kind)
    qdesc = qp.QuantizeBackwardDescriptor(**fields, input_element=kind, output_element=EK.U8)
    dq = np.zeros_like(dy)
    qp.DequantizeBackwardPlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeBackwardArgs(dy, dq, scale))
    dx = np.zeros_like(dy)
    qp.QuantizeBackwardPlan.select(None, qdesc, REFERENCE).run(
        None, None, qp.QuantizeBackwardArgs(x, dq, dx, scale, zp)
    )
    return dx


def _fake_ste(
    x: np.ndarray, dy: np.ndarray, kind: EK, scope: qp.Scope, scale: np.ndarray, zp: np.ndarray
) -> np.ndarray:
    desc = qp.FakeQuantizeBackwardDescriptor(shape=x.shape, scope=scope, mode=ASYM, element=kind, q_min=0, q_max=255)
    dx = np.zeros_like(dy)
    qp.FakeQuantizeBackwardPlan.select(None, desc, REFERENCE).run(
        None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx, scale, zp)
    )
    return dx


@pytest.mark.parametrize("kind", [EK.F16, EK.BF16, EK.F32, EK.F64])
def test_chain_equals_fake_quantize_ste_for_power_of_two_scales(rng, kind: EK) -> None:
    shape = (23, 41)
    dtype = ELEMENTS[kind].numpy_dtype
    pdtype = np.float64 if kind is EK.F64 else F32
    scale = (2.0 ** rng.integers(-3, 4, size=(shape[0], 1))).astype(pdtype)  # x * rn(1/s) == x / s exactly
    zp = rng.integers(0, 256, size=(shape[0], 1)).astype(np.int32)
    x = (rng.uniform(-200, 200, size=shape) * scale).astype(dtype)
    dy = (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.01, 4.0, size=shape)).astype(dtype)
    dx = _chain(x, dy, kind, qp.TokenScope(), scale, zp)
    ste = _fake_ste(x, dy, kind, qp.TokenScope(), scale, zp)
    assert np.array_equal(dx.astype(np.float64), ste.astype(np.float64))  # -0 outside there, +0 here
    assert 0 < np.count_nonzero(dx.astype(np.float64)) < dx.size


@pytest.mark.parametrize("kind", [EK.F16, EK.BF16, EK.F32])
def test_chain_is_within_one_ulp_of_fake_quantize_ste_for_any_scale(rng, kind: EK) -> None:
    shape = (31, 57)
    dtype = ELEMENTS[kind].numpy_dtype
    scale = np.exp(rng.uniform(-4, 1, size=(1, shape[1]))).astype(F32)
    zp = rng.integers(0, 256, size=(1, shape[1])).astype(np.int32)
    x = (rng.uniform(-150, 150, size=shape) * scale).astype(dtype)
    dy = (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.01, 4.0, size=shape)).astype(dtype)
    scope = qp.ChannelScope(axis=1)
    dx = _chain(x, dy, kind, scope, scale, zp).astype(np.float64)
    ste = _fake_ste(x, dy, kind, scope, scale, zp).astype(np.float64)
    same_mask = (dx != 0) == (ste != 0)
    assert np.mean(same_mask) > 0.99  # masks differ only at ties that x * rn(1/s) and x / s round apart
    ulp = np.spacing(np.abs(dy)).astype(np.float64)
    assert np.all(np.abs(dx - ste)[same_mask] <= ulp[same_mask])


# ---- descriptors ---------------------------------------------------------------------------------


def test_descriptors_from_forward_and_grad_shapes() -> None:
    fwd = qp.QuantizeDescriptor(
        shape=(3, 7),
        scope=qp.GroupScope(group_size=7),
        mode=ASYM,
        input_element=EK.BF16,
        output_element=EK.U4,
        q_min=1,
        nibble_order=qp.NibbleOrder.HIGH_FIRST,
    )
    bwd = qp.QuantizeBackwardDescriptor.from_forward(fwd)
    assert bwd.model_dump() == fwd.model_dump()
    assert bwd.grad_shape == (3, 7) and fwd.output_shape == (3, 4) and bwd.param_shape == (3, 1)
    assert hash(bwd) == hash(qp.QuantizeBackwardDescriptor(**fwd.model_dump()))
    dfwd = qp.DequantizeDescriptor(shape=(5,), scope=qp.TensorScope(), input_element=EK.S4, output_element=EK.F16)
    dbwd = qp.DequantizeBackwardDescriptor.from_forward(dfwd)
    assert dbwd.model_dump() == dfwd.model_dump() and dbwd.grad_shape == (5,) and dbwd.input_shape == (3,)
    # the forward descriptor itself is accepted by select
    assert qp.QuantizeBackwardPlan.select(None, fwd, REFERENCE).problem.q_min == 1
    assert qp.DequantizeBackwardPlan.select(None, dfwd, REFERENCE).problem.float_kind is EK.F16
