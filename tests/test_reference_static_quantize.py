"""CPU: the reference backend on hand-computed vectors (SPEC section 4)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE

import quantplan as qp
from quantplan import reference
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK
from quantplan.vocabulary.types import MathPrecision, NibbleOrder


def quantize(x, scale, zp=None, out=EK.S8, scope=None, **kw) -> np.ndarray:  # noqa: ANN001
    x = np.asarray(x, dtype=np.float32)
    mode = qp.QuantMode.ASYMMETRIC if zp is not None else qp.QuantMode.SYMMETRIC
    desc = qp.QuantizeDescriptor(
        shape=x.shape, scope=scope or qp.TensorScope(), mode=mode, input_element=EK.F32, output_element=out, **kw
    )
    q = np.zeros(desc.output_shape, ELEMENTS[out].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q, scale, zp))
    return q


def test_ties_round_half_to_even() -> None:
    x = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5]
    assert quantize(x, 1.0).tolist() == [0, 2, 2, 0, -2, -2, 4, 126]


def test_ties_through_division_by_scale() -> None:
    # x / 0.25 = 2.5, 3.5, -6.5 exactly -> 2, 4, -6
    assert quantize([0.625, 0.875, -1.625], 0.25).tolist() == [2, 4, -6]


def test_clamp_edges_and_narrowed_range() -> None:
    assert quantize([127.4, 127.5, 128.0, -128.0, -128.5, -129.0, 1e30, -1e30], 1.0).tolist() == [
        127,
        127,
        127,
        -128,
        -128,
        -128,
        127,
        -128,
    ]
    assert quantize([-128.0, -127.0, 127.0], 1.0, q_min=-127).tolist() == [-127, -127, 127]


def test_zero_point_added_after_rounding_then_clamped() -> None:
    # rne(x/2) + zp: 2.5 -> 2 (+10 = 12); 3.5 -> 4 (14); -300 -> -150 + 10 -> clamp 0 (u8); 1000 -> 500 + 10 -> 255
    q = quantize([5.0, 7.0, -300.0, 1000.0], 2.0, zp=10, out=EK.U8)
    assert q.tolist() == [12, 14, 0, 255]


def test_nan_gives_zero_point_and_inf_clamps() -> None:
    assert quantize([np.nan, np.inf, -np.inf], 1.0, zp=3).tolist() == [3, 127, -128]
    assert quantize([np.nan, np.inf], 0.5).tolist() == [0, 127]


def test_int4_packing_both_orders_and_odd_rows() -> None:
    x = np.array([[1, -2, 3, -8, 7]], np.float32)
    one = np.ones((1, 1), np.float32)
    low = quantize(x, one, out=EK.S4, scope=qp.TokenScope())
    # codes 1, -2 (0xE), 3, -8 (0x8), 7 + pad 0 -> low nibble first
    assert low.tolist() == [[0xE1, 0x83, 0x07]]
    high = quantize(x, one, out=EK.S4, scope=qp.TokenScope(), nibble_order=NibbleOrder.HIGH_FIRST)
    assert high.tolist() == [[0x1E, 0x38, 0x70]]
    u = quantize(np.array([[0, 15, 16, 3]], np.float32), one, out=EK.U4, scope=qp.TokenScope())
    assert u.tolist() == [[0xF0, 0x3F]]


def test_unpack_inverts_pack() -> None:
    rng = np.random.default_rng(1)
    codes = rng.integers(-8, 8, size=(3, 9))
    for order in NibbleOrder:
        packed = reference.pack_nibbles(codes, order)
        assert packed.shape == (3, 5)
        assert np.array_equal(reference.unpack_nibbles(packed, 9, True, order), codes)


def test_fp8_max_saturation_and_nan() -> None:
    e4m3 = quantize([448.0, 464.0, 500.0, 1e9, -np.inf, np.nan, 0.0, 2.0**-9, 2.0**-10 * 1.5], 1.0, out=EK.FP8_E4M3)
    bits = e4m3.view(np.uint8).tolist()
    assert bits[:5] == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE]  # +-448 saturate
    assert bits[5] == reference.FP8_CANONICAL_NAN
    assert bits[6] == 0x00 and bits[7] == 0x01  # smallest subnormal 2^-9
    assert bits[8] == 0x01  # 1.5 * 2^-10 = 0.75 * 2^-9 rounds up to 2^-9
    e5m2 = quantize([57344.0, 61440.0, 1e9, 1.0, 1.125, 1.375], 1.0, out=EK.FP8_E5M2)
    b = e5m2.view(np.uint8).tolist()
    assert b[:3] == [0x7B, 0x7B, 0x7B]
    assert b[3] == 0x3C and b[4] == 0x3C and b[5] == 0x3E  # 1.125 tie -> 1.0 (even); 1.375 tie -> 1.5


def test_fp8_rne_ties_between_neighbours() -> None:
    # e4m3 around 1: spacing 1/8; 1 + 1/16 ties to 1 (even mantissa 000), 1 + 3/16 ties to 1.25 (010)
    q = quantize([1.0625, 1.1875], 1.0, out=EK.FP8_E4M3).view(np.uint8).tolist()
    assert q == [0x38, 0x3A]


def test_dequantize_formula_and_rounding_to_output() -> None:
    q = np.array([[-128, -1, 0, 5, 127]], np.int8)
    desc = qp.DequantizeDescriptor(
        shape=q.shape, scope=qp.TensorScope(), mode=qp.QuantMode.ASYMMETRIC, input_element=EK.S8, output_element=EK.F16
    )
    y = np.zeros(q.shape, np.float16)
    qp.DequantizePlan.select(None, desc, REFERENCE).run(None, None, qp.DequantizeArgs(q, y, 0.1, 5))
    expected = ((q.astype(np.int64) - 5).astype(np.float32) * np.float32(0.1)).astype(np.float16)
    assert np.array_equal(y, expected)
    assert y[0, 3] == 0


def test_dequantize_fp8_values() -> None:
    q = np.array([[0x38, 0xB8, 0x7E, 0x01]], np.uint8)
    desc = qp.DequantizeDescriptor(
        shape=q.shape, scope=qp.TensorScope(), input_element=EK.FP8_E4M3, output_element=EK.F32
    )
    y = np.zeros(q.shape, np.float32)
    qp.DequantizePlan.select(None, desc, REFERENCE).run(None, None, qp.DequantizeArgs(q, y, 2.0))
    assert y.tolist() == [[2.0, -2.0, 896.0, 2.0**-8]]


def test_per_group_and_per_channel_parameters() -> None:
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    scale = np.array([[1.0, 2.0], [4.0, 8.0]], np.float32)  # groups of 3 along the last axis
    q = quantize(x, scale, scope=qp.GroupScope(axis=-1, group_size=3))
    assert q.tolist() == [[0, 1, 2, 2, 2, 2], [2, 2, 2, 1, 1, 1]]
    ch = quantize(x, np.array([[1.0], [0.5]], np.float32), scope=qp.ChannelScope(axis=0))
    assert ch.tolist() == [[0, 1, 2, 3, 4, 5], [12, 14, 16, 18, 20, 22]]


def test_f64_arithmetic_is_double() -> None:
    x = np.array([0.1 + 2.0**-40], np.float64)
    desc = qp.QuantizeDescriptor(shape=(1,), scope=qp.TensorScope(), input_element=EK.F64, output_element=EK.S8)
    q = np.zeros((1,), np.int8)
    # x / 0.2 = 0.5 + 2^-39 in double -> rounds up to 1; in float32 it would be a tie -> 0
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q, 0.2))
    assert q.tolist() == [1]


@pytest.mark.parametrize("kind", [EK.FP8_E4M3, EK.FP8_E5M2])
def test_fp8_encode_matches_bitwise_model(kind: EK) -> None:
    """fp8_encode equals an independent integer model of RNE-saturate on random float32 bit patterns."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32)
    v = v[np.isfinite(v)] * np.float32(1)  # keep finite
    got = reference.fp8_encode(v, kind)
    mant = 3 if kind is EK.FP8_E4M3 else 2
    bias = 7 if kind is EK.FP8_E4M3 else 15
    fmax = ELEMENTS[kind].fp8_max
    expected = []
    for val in v.astype(np.float64):
        sign = 0x80 if np.signbit(val) else 0
        a = abs(val)
        if a >= fmax:
            expected.append(sign | (0x7E if kind is EK.FP8_E4M3 else 0x7B))
            continue
        min_normal = 2.0 ** (1 - bias)
        step = 2.0 ** (1 - bias - mant) if a < min_normal else 2.0 ** (np.floor(np.log2(a)) - mant)
        r = np.round(a / step) * step  # np.round: half to even; a/step exact (power-of-two step)
        if r >= fmax:
            r = fmax
        encoded = np.array([r], np.float64).astype(ELEMENTS[kind].numpy_dtype).view(np.uint8)[0]
        expected.append(sign | int(encoded))
    assert got.tolist() == expected


def test_acc_dtype() -> None:
    assert reference.acc_dtype(MathPrecision.F32) == np.float32
    assert reference.acc_dtype(MathPrecision.F64) == np.float64
