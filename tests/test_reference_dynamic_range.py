"""CPU: dynamic-range parameters, dynamic quantization and stochastic rounding in the reference (SPEC section 4)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import random_floats

from quantplan import reference
from quantplan.runtime._layout import expand_params, param_shape
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.philox import uniform_for_elements
from quantplan.vocabulary.types import (
    ChannelScope,
    GroupScope,
    MathPrecision,
    NibbleOrder,
    QuantMode,
    Scope,
    TensorScope,
    TokenScope,
)
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.filterwarnings("error")  # no RuntimeWarning (0/0, overflow, invalid) anywhere

SYM, ASYM = QuantMode.SYMMETRIC, QuantMode.ASYMMETRIC
F32, F64 = MathPrecision.F32, MathPrecision.F64
TOP = 1.0 - 2.0**-24  # the largest uniform the stream can produce


def dq(
    x: object,
    scope: Scope | None = None,
    mode: QuantMode = SYM,
    out: EK = EK.S8,
    q_min: int | None = None,
    q_max: int | None = None,
    precision: MathPrecision = F32,
    order: NibbleOrder = NibbleOrder.LOW_FIRST,
    uniform: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """dynamic_quantize with default code ranges; float32 input unless ``x`` is already an array."""
    arr = x if isinstance(x, np.ndarray) else np.asarray(x, np.float32)
    lo, hi = ELEMENTS[out].code_range or (0, 0)
    return reference.dynamic_quantize(
        arr,
        scope or TokenScope(),
        mode,
        out,
        lo if q_min is None else q_min,
        hi if q_max is None else q_max,
        precision,
        order,
        uniform,
    )


def codes_of(q: np.ndarray, out: EK, length: int, order: NibbleOrder = NibbleOrder.LOW_FIRST) -> np.ndarray:
    return reference.decode_codes(q, out, length, order)


# ---------------------------------------------------------------------------------------------
# Hand-computed vectors
# ---------------------------------------------------------------------------------------------


def test_token_symmetric_s8_hand_vector() -> None:
    q, scale, zp = dq([[1.0, -2.0, 0.5], [4.0, -1.0, 3.0]], q_min=-127)
    assert zp is None
    assert scale.dtype == np.float32 and scale.shape == (2, 1)
    assert scale[:, 0].tolist() == [np.float32(2) / np.float32(127), np.float32(4) / np.float32(127)]
    # 1 / fl(2/127) = 63.5 exactly in float32 -> 64 (even); -2 -> -127; 0.5 -> 31.75 -> 32
    # 4 -> 127; -1 / fl(4/127) = -31.75 -> -32; 3 -> 95.25 -> 95
    assert q.dtype == np.int8
    assert q.tolist() == [[64, -127, 32], [127, -32, 95]]


def test_ties_round_half_to_even_with_unit_scale() -> None:
    q, scale, _ = dq([[127.0, 2.5, 3.5, -2.5, -126.5, 0.5, -0.5]])
    assert scale.tolist() == [[1.0]]
    assert q.tolist() == [[127, 2, 4, -2, -126, 0, 0]]


def test_all_zero_rows_symmetric_and_asymmetric() -> None:
    x = np.zeros((2, 5), np.float32)
    q, scale, zp = dq(x)
    assert scale.tolist() == [[1.0], [1.0]] and zp is None
    assert q.tolist() == [[0] * 5] * 2
    for out, q_min in ((EK.U8, 0), (EK.S8, -128), (EK.U4, 0), (EK.S4, -8)):
        q, scale, zp = dq(x, mode=ASYM, out=out)
        assert scale.tolist() == [[1.0], [1.0]]
        assert zp is not None and zp.dtype == np.int32 and zp.tolist() == [[q_min], [q_min]]
        codes = codes_of(q, out, 5)
        assert codes.tolist() == [[q_min] * 5] * 2  # 0 maps to q_min exactly
        y = reference.dequantize(q, scale, zp, out, EK.F32, 5, F32)
        assert np.array_equal(y, x) and not np.signbit(y).any()


def test_constant_rows() -> None:
    x = [[3.0, 3.0, 3.0], [-3.0, -3.0, -3.0]]
    q, scale, _ = dq(x, q_min=-127)
    assert scale[:, 0].tolist() == [np.float32(3) / np.float32(127)] * 2
    assert q.tolist() == [[127] * 3, [-127] * 3]
    q, scale, zp = dq(x, mode=ASYM, out=EK.U8)
    # positive row: lo = 0, hi = 3 -> zp 0, codes 255; negative row: lo = -3, hi = 0 -> zp 255, codes 0
    assert scale[:, 0].tolist() == [np.float32(3) / np.float32(255)] * 2
    assert zp is not None and zp.tolist() == [[0], [255]]
    assert q.tolist() == [[255] * 3, [0] * 3]


def test_all_negative_row_asymmetric() -> None:
    q, scale, zp = dq([[-1.0, -2.0, -4.0, 0.0]], mode=ASYM, out=EK.U8)
    s = np.float32(4) / np.float32(255)  # hi = max(max x, 0) = 0, lo = -4
    assert scale.tolist() == [[s]]
    assert zp is not None and zp.tolist() == [[255]]
    expected = [min(max(int(np.rint(np.float32(v) / s)) + 255, 0), 255) for v in (-1.0, -2.0, -4.0, 0.0)]
    assert q.tolist() == [expected]
    assert expected[2] == 0 and expected[3] == 255  # the minimum maps to q_min, zero to the zero point


def test_asymmetric_u4_and_u8_hand_vectors() -> None:
    # lo = -1, hi = 2: scale = 3 / 15 = fl(0.2); zp = 0 - rne(-1 / 0.2) = 5; codes 0, 5, 15
    q, scale, zp = dq([[-1.0, 0.0, 2.0]], mode=ASYM, out=EK.U4)
    assert scale.tolist() == [[np.float32(3) / np.float32(15)]]
    assert zp is not None and zp.tolist() == [[5]]
    assert codes_of(q, EK.U4, 3).tolist() == [[0, 5, 15]]
    assert q.tolist() == [[0x50, 0x0F]]  # LOW_FIRST: 0 | 5 << 4, then 15 and a zero padding nibble
    # u8: lo = -2, hi = 1, scale = 3 / 255; -2 / scale = -170 exactly -> zp 170; 1 / scale = 85 -> 255
    q, scale, zp = dq([[1.0, -2.0, 0.5]], mode=ASYM, out=EK.U8)
    assert zp is not None and zp.tolist() == [[170]]
    assert q.tolist() == [[255, 0, 170 + int(np.rint(np.float32(0.5) / scale[0, 0]))]]


def test_s4_packed_both_nibble_orders() -> None:
    x = [[7.0, -3.5, 1.0, 0.0, -7.0]]  # amax 7, q range [-7, 7] -> scale 1; -3.5 ties to -4
    low, scale, _ = dq(x, out=EK.S4, q_min=-7, q_max=7)
    assert scale.tolist() == [[1.0]]
    # codes 7, -4 (0xC), 1, 0, -7 (0x9) + padding nibble
    assert low.tolist() == [[0xC7, 0x01, 0x09]]
    high, _, _ = dq(x, out=EK.S4, q_min=-7, q_max=7, order=NibbleOrder.HIGH_FIRST)
    assert high.tolist() == [[0x7C, 0x10, 0x90]]
    for q, order in ((low, NibbleOrder.LOW_FIRST), (high, NibbleOrder.HIGH_FIRST)):
        assert codes_of(q, EK.S4, 5, order).tolist() == [[7, -4, 1, 0, -7]]


@pytest.mark.parametrize(
    ("mode", "out"),
    [
        (m, k)
        for m in (SYM, ASYM)
        for k in (EK.S8, EK.U8, EK.S4, EK.U4, EK.FP8_E4M3, EK.FP8_E5M2)
        if m is SYM or not ELEMENTS[k].is_fp8
    ],
)
def test_nonfinite_rows_get_nan_scale_zero_point_and_codes(mode: QuantMode, out: EK) -> None:
    x = np.array(
        [
            [1.0, -2.0, 0.5, 4.0],
            [1.0, np.nan, 2.0, 3.0],
            [np.inf, 1.0, 1.0, 1.0],
            [-1.0, -np.inf, 0.0, 5.0],
            [0.25, 8.0, -3.0, 1.0],
        ],
        np.float32,
    )
    q, scale, zp = dq(x, mode=mode, out=out)
    assert np.isnan(scale[1:4, 0]).all() and np.isfinite(scale[[0, 4], 0]).all()
    if mode is ASYM:
        assert zp is not None and zp[1:4, 0].tolist() == [0, 0, 0]
    else:
        assert zp is None
    if ELEMENTS[out].is_fp8:
        assert q[1:4].tolist() == [[0] * 4] * 3  # byte 0x00, not the NaN code
    else:
        assert codes_of(q, out, 4)[1:4].tolist() == [[0] * 4] * 3
    # other rows unaffected
    q_ok, scale_ok, zp_ok = dq(x[[0, 4]], mode=mode, out=out)
    assert np.array_equal(q[[0, 4]], q_ok) and np.array_equal(scale[[0, 4]], scale_ok)
    if zp is not None:
        assert zp_ok is not None and np.array_equal(zp[[0, 4]], zp_ok)


def test_nonfinite_with_stochastic_rounding_and_tensor_scope() -> None:
    x = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    u = np.zeros(4)
    q, scale, zp = dq(x, TensorScope(), ASYM, EK.U8, uniform=u)
    assert np.isnan(scale).all() and zp is not None and zp.tolist() == [[0]]
    assert q.tolist() == [[0, 0], [0, 0]]
    q, _, _ = dq(x, TensorScope(), SYM, EK.FP8_E4M3, uniform=u)
    assert q.tolist() == [[0, 0], [0, 0]]


@pytest.mark.parametrize(("out", "max_code"), [(EK.FP8_E4M3, 0x7E), (EK.FP8_E5M2, 0x7B)])
def test_fp8_amax_maps_to_max_code(rng: np.random.Generator, out: EK, max_code: int) -> None:
    x = random_floats(rng, (9, 37), EK.F32, specials=False)
    x[::2] *= -1  # put the amax at both signs
    q, scale, _ = dq(x, out=out)
    assert scale[:, 0].tolist() == (np.abs(x).max(axis=1) / np.float32(ELEMENTS[out].fp8_max)).tolist()
    amax_at = np.abs(x).argmax(axis=1)
    for r, c in enumerate(amax_at):
        assert q[r, c] == (max_code | (0x80 if x[r, c] < 0 else 0))
    # every other element decodes to a magnitude <= fp8_max
    assert np.all(np.abs(reference.fp8_decode(q, out)) <= ELEMENTS[out].fp8_max)


def test_tiny_range_that_underflows_gets_unit_scale() -> None:
    d = float(np.float32(2.0**-149))  # smallest float32 subnormal
    q, scale, _ = dq([[d, 0.0, -d]])
    assert scale.tolist() == [[1.0]] and q.tolist() == [[0, 0, 0]]
    q, scale, zp = dq([[d, 0.0, -d]], mode=ASYM, out=EK.S8)
    assert scale.tolist() == [[1.0]] and zp is not None and zp.tolist() == [[-128]]
    assert q.tolist() == [[-128] * 3]
    # in float64 the same range is representable: no fallback
    _, scale64, _ = dq(np.array([[d, 0.0, -d]]), precision=F64)
    assert scale64.tolist() == [[d / 127]]


def test_empty_segments_and_rank0() -> None:
    q, scale, zp = dq(np.zeros((2, 0), np.float32), mode=ASYM, out=EK.U8)
    assert q.shape == (2, 0) and scale.tolist() == [[1.0], [1.0]] and zp is not None and zp.tolist() == [[0], [0]]
    q, scale, _ = dq(np.zeros((0, 3), np.float32))
    assert q.shape == (0, 3) and scale.shape == (0, 1)
    q, scale, _ = dq(np.float32(-3.0), TensorScope(), q_min=-127)
    assert q.shape == () and int(q) == -127 and scale.shape == () and float(scale) == np.float32(3) / np.float32(127)


def test_f64_is_computed_in_double() -> None:
    x = np.array([[0.1 + 2.0**-40, -0.3, 0.2]], np.float64)
    q, scale, _ = dq(x, precision=F64)
    assert scale.dtype == np.float64 and scale.tolist() == [[0.3 / 127]]
    assert scale[0, 0] != float(np.float32(0.3) / np.float32(127))
    assert q.tolist() == [[int(np.rint(v / (0.3 / 127))) for v in x[0]]]
    _, scale, zp = dq(x, mode=ASYM, out=EK.U8, precision=F64)
    lo, hi = -0.3, 0.2
    assert scale.dtype == np.float64 and scale.tolist() == [[(hi - lo) / 255]]
    assert zp is not None and zp.dtype == np.int32 and zp.tolist() == [[int(-np.rint(lo / ((hi - lo) / 255)))]]


def test_argument_errors() -> None:
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match="zero point"):
        reference.dynamic_range_params(x, TokenScope(), ASYM, EK.FP8_E4M3, 0, 0, F32)
    with pytest.raises(ValueError, match="q_min < q_max"):
        reference.dynamic_range_params(x, TokenScope(), ASYM, EK.U8, 5, 5, F32)
    with pytest.raises(ValueError, match="q_max > 0"):
        reference.dynamic_range_params(x, TokenScope(), SYM, EK.S8, -8, 0, F32)
    with pytest.raises(ValueError, match="quantized kind"):
        reference.dynamic_range_params(x, TokenScope(), SYM, EK.F16, -8, 7, F32)
    with pytest.raises(ValueError, match="uniform"):
        reference.quantize(x, np.float32(1), 0, EK.S8, -128, 127, F32, uniform=np.zeros(7))


# ---------------------------------------------------------------------------------------------
# Every scope on a ragged rank-3 tensor, against a plain per-segment loop
# ---------------------------------------------------------------------------------------------

SCOPES: list[Scope] = [
    TensorScope(),
    TokenScope(),
    ChannelScope(axis=0),
    ChannelScope(axis=1),
    ChannelScope(axis=2),
    ChannelScope(axis=-2),
    GroupScope(axis=1, group_size=5),
    GroupScope(axis=-1, group_size=7),
    GroupScope(axis=0, group_size=3),
    GroupScope(axis=2, group_size=1),
]

CASES = [  # (mode, output, q_min, q_max)
    (SYM, EK.S8, -127, 127),
    (SYM, EK.S8, -128, 127),
    (ASYM, EK.U8, 0, 255),
    (ASYM, EK.S8, -128, 127),
    (SYM, EK.S4, -7, 7),
    (ASYM, EK.U4, 0, 15),
    (ASYM, EK.S4, -8, 7),
    (SYM, EK.FP8_E4M3, 0, 0),
    (SYM, EK.FP8_E5M2, 0, 0),
]


def segment_slices(pidx: tuple[int, ...], shape: tuple[int, ...], scope: Scope) -> tuple[slice, ...]:
    pshape = param_shape(shape, scope)
    group_axis = scope.axis % len(shape) if isinstance(scope, GroupScope) else None
    out = []
    for i, (p, e, pe) in enumerate(zip(pidx, shape, pshape, strict=True)):
        if i == group_axis:
            assert isinstance(scope, GroupScope)
            out.append(slice(p * scope.group_size, (p + 1) * scope.group_size))
        elif pe == e:
            out.append(slice(p, p + 1))
        else:
            out.append(slice(None))
    return tuple(out)


def loop_model(
    x: np.ndarray, scope: Scope, mode: QuantMode, out: EK, q_min: int, q_max: int, acc: type, u: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale, zero point and codes (FP8: bytes) segment by segment, with scalar arithmetic."""
    shape = x.shape
    pshape = param_shape(shape, scope)
    xa: np.ndarray = x.astype(acc)
    scale: np.ndarray = np.zeros(pshape, acc)
    zp = np.zeros(pshape, np.int64)
    codes = np.zeros(shape, np.int64)
    fp8_max = ELEMENTS[out].fp8_max
    for pidx in np.ndindex(*pshape):
        sl = segment_slices(pidx, shape, scope)
        seg = xa[sl]
        if mode is SYM:
            s = acc(np.abs(seg).max()) / acc(fp8_max if fp8_max else q_max)
            z = 0
        else:
            lo, hi = acc(min(seg.min(), 0)), acc(max(seg.max(), 0))
            s = (hi - lo) / acc(q_max - q_min)
            if s == 0:
                s = acc(1)
            z = min(max(q_min - int(np.rint(lo / s)), q_min), q_max)
        if s == 0:
            s = acc(1)
        scale[pidx] = s
        zp[pidx] = z
        v = seg / s
        if fp8_max:
            codes[sl] = reference.fp8_encode(v, out) if u is None else reference.fp8_stochastic_encode(v, u[sl], out)
        elif u is None:
            codes[sl] = np.clip(np.rint(v) + z, q_min, q_max)
        else:
            f = np.floor(v)
            codes[sl] = np.clip(f + (u[sl].astype(acc) < v - f) + z, q_min, q_max)
    return scale, zp, codes


@pytest.mark.parametrize("stochastic", [False, True], ids=["rne", "stochastic"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].value}-{c[1].value}-{c[2]}")
@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: repr(s).replace(" ", ""))
def test_every_scope_matches_a_segment_loop(
    rng: np.random.Generator, scope: Scope, case: tuple, stochastic: bool
) -> None:
    mode, out, q_min, q_max = case
    for in_kind, precision in ((EK.BF16, F32), (EK.F32, F32), (EK.F64, F64)):
        x = random_floats(rng, (3, 5, 7), in_kind)
        acc = np.float64 if precision is F64 else np.float32
        u = (
            uniform_for_elements(x.size, int(rng.integers(0, 2**63)), int(rng.integers(0, 2**63))).reshape(x.shape)
            if stochastic
            else None
        )
        q, scale, zp = reference.dynamic_quantize(
            x, scope, mode, out, q_min, q_max, precision, NibbleOrder.HIGH_FIRST, u
        )
        e_scale, e_zp, e_codes = loop_model(x, scope, mode, out, q_min, q_max, acc, u)
        assert scale.dtype == acc and scale.shape == param_shape(x.shape, scope)
        assert np.array_equal(scale, e_scale)
        if mode is ASYM:
            assert zp is not None and zp.dtype == np.int32 and np.array_equal(zp, e_zp)
        else:
            assert zp is None
        if ELEMENTS[out].is_fp8:
            assert q.dtype == np.uint8 and np.array_equal(q, e_codes.astype(np.uint8))
        else:
            assert np.array_equal(codes_of(q, out, 7, NibbleOrder.HIGH_FIRST), e_codes)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].value}-{c[1].value}-{c[2]}")
@pytest.mark.parametrize("precision", [F32, F64])
def test_dequantize_reconstructs_within_half_a_step(
    rng: np.random.Generator, case: tuple, precision: MathPrecision
) -> None:
    mode, out, q_min, q_max = case
    in_kind = EK.F64 if precision is F64 else EK.F32
    x = random_floats(rng, (6, 5, 8), in_kind)
    for scope in (TokenScope(), ChannelScope(axis=1), GroupScope(axis=-1, group_size=4), TensorScope()):
        q, scale, zp = reference.dynamic_quantize(x, scope, mode, out, q_min, q_max, precision)
        s = np.broadcast_to(expand_params(scale, x.shape, scope), x.shape).astype(np.float64)
        z = 0 if zp is None else expand_params(zp, x.shape, scope)
        y = reference.dequantize(q, expand_params(scale, x.shape, scope), z, out, in_kind, 8, precision).astype(
            np.float64
        )
        xd = x.astype(np.float64)
        eps = 2.0**-52 if precision is F64 else 2.0**-23
        err = np.abs(y - xd)
        if ELEMENTS[out].is_fp8:
            mant = 3 if out is EK.FP8_E4M3 else 2
            bias = 7 if out is EK.FP8_E4M3 else 15
            bound = np.maximum(np.abs(xd) * 2.0 ** -(mant + 1), s * 2.0 ** (-bias - mant))
        else:
            bound = s / 2
        assert np.all(err <= bound * (1 + 1e-5) + 8 * eps * np.abs(xd)), (scope, float((err - bound).max()))


# ---------------------------------------------------------------------------------------------
# Stochastic rounding
# ---------------------------------------------------------------------------------------------


def test_stochastic_round_with_extreme_uniforms() -> None:
    v = np.array([1.25, -1.25, 2.0, -3.0, 0.0, -(2.0**-30), 2.5, 126.999, -127.75], np.float32)
    # u = 0: every non-integer rounds up (0 < frac), integers stay
    up = reference.stochastic_round_and_clamp(v, np.zeros(v.shape), 0, -128, 127)
    assert up.tolist() == [2, -1, 2, -3, 0, 0, 3, 127, -127]
    # u = 1 - 2**-24: floor unless frac > u; -2**-30 has frac 1 - 2**-30 -> rounded to 1 in float32 -> up
    down = reference.stochastic_round_and_clamp(v, np.full(v.shape, TOP), 0, -128, 127)
    assert down.tolist() == [1, -2, 2, -3, 0, 0, 2, 126, -128]
    # ties are not special: 2.5 goes up iff u < 0.5
    assert reference.stochastic_round_and_clamp(
        np.array([2.5, 2.5], np.float32), np.array([0.5 - 2.0**-24, 0.5]), 0, -128, 127
    ).tolist() == [3, 2]


def test_stochastic_round_zero_point_clamp_and_specials() -> None:
    v = np.array([np.nan, np.inf, -np.inf, 300.5, -300.5, 1.5], np.float32)
    q = reference.stochastic_round_and_clamp(v, np.full(v.shape, 0.25), 7, 0, 255)
    assert q.dtype == np.int32 and q.tolist() == [7, 255, 0, 255, 0, 9]
    # float64 accumulator: compares in double
    q64 = reference.stochastic_round_and_clamp(np.array([1.0 + 2.0**-30]), np.array([0.0]), 0, -8, 7)
    assert q64.tolist() == [2]


def test_quantize_uniform_keyword_matches_static_formula() -> None:
    x = np.array([[0.3, -0.7, 1.1, 2.0]], np.float32)
    u = np.array([[0.75, 0.7, 0.25, 0.9]])
    q = reference.quantize(x, np.float32(0.5), 3, EK.U8, 0, 255, F32, uniform=u)
    # v = 0.6, -1.4, 2.2, 4 -> floor 0, -2, 2, 4, frac ~.6, ~.6, ~.2, 0 -> +1 iff u < frac: 0, -2, 2, 4; +3
    assert q.tolist() == [[3, 1, 5, 7]]
    assert reference.quantize(x, np.float32(0.5), 3, EK.U8, 0, 255, F32).tolist() == [[4, 2, 5, 7]]  # rne
    # a flat uniform of the same size is accepted (flat C order)
    assert reference.quantize(x, np.float32(0.5), 3, EK.U8, 0, 255, F32, uniform=u.reshape(-1)).tolist() == [
        [3, 1, 5, 7]
    ]


def test_dynamic_stochastic_is_reproducible_from_seed_and_offset(rng: np.random.Generator) -> None:
    x = random_floats(rng, (4, 33), EK.F32)
    seed = int(rng.integers(0, 2**64, dtype=np.uint64))

    def run(seed: int, offset: int, out: EK = EK.S4) -> np.ndarray:
        u = uniform_for_elements(x.size, seed, offset).reshape(x.shape)
        return dq(x, GroupScope(group_size=11), ASYM if out is EK.S4 else SYM, out, uniform=u)[0]

    for out in (EK.S4, EK.FP8_E5M2):
        assert np.array_equal(run(seed, 5, out), run(seed, 5, out))
        assert not np.array_equal(run(seed, 5, out), run(seed, 6, out))
        assert not np.array_equal(run(seed, 5, out), run(seed ^ (1 << 40), 5, out))
    # the uniforms only move codes by one step at most relative to rne
    rne = codes_of(dq(x, GroupScope(group_size=11), ASYM, EK.S4)[0], EK.S4, 33)
    assert np.abs(codes_of(run(seed, 5), EK.S4, 33) - rne).max() <= 1


@pytest.mark.parametrize(("out", "mode"), [(EK.S8, SYM), (EK.U4, ASYM), (EK.FP8_E4M3, SYM)])
def test_stochastic_rounding_is_unbiased(rng: np.random.Generator, out: EK, mode: QuantMode) -> None:
    x = (rng.standard_normal((2, 24)) * np.exp(rng.uniform(-3, 3, size=(2, 1)))).astype(np.float32)
    lo, hi = ELEMENTS[out].code_range or (0, 0)
    scale, zp = reference.dynamic_range_params(x, TokenScope(), mode, out, lo, hi, F32)
    n = 2000
    base = int(rng.integers(0, 2**62))
    total = np.zeros(x.shape)
    total_sq = np.zeros(x.shape)
    for k in range(n):
        u = uniform_for_elements(x.size, base + k, 0).reshape(x.shape)
        q, _, _ = dq(x, TokenScope(), mode, out, uniform=u)
        y = reference.dequantize(q, scale, 0 if zp is None else zp, out, EK.F64, 24, F32).astype(np.float64)
        total += y
        total_sq += y * y
    mean = total / n
    sd = np.sqrt(np.maximum(total_sq / n - mean**2, 0.0))
    if ELEMENTS[out].is_fp8:
        step = np.abs(x) * 2.0**-2 + scale.astype(np.float64) * 2.0**-9  # bounds the FP8 spacing at x
        inside = np.ones(x.shape, bool)
        model_sd = step / 2  # a draw between two neighbours: sd <= spacing / 2
    else:
        step = np.broadcast_to(scale.astype(np.float64), x.shape)
        # values whose v + zp lies past the code range are clamped (biased by design): only test the inside
        v = x / scale + (0 if zp is None else zp)
        inside = (v >= lo) & (v <= hi)
        assert inside.mean() > 0.9
        frac = v - np.floor(v)
        model_sd = step * np.sqrt(frac * (1 - frac))  # Bernoulli(frac) steps
    # The sample sd underestimates a rare outcome that did not occur (frac near 0 or 1): bound
    # the mean's deviation with the model's sd as well.
    tol = 5 * np.maximum(sd, model_sd) / np.sqrt(n) + 3 * step / n + 1e-6 * np.abs(x)
    err = np.abs(mean - x)
    assert np.all(err[inside] <= tol[inside]), float(np.max(err[inside] - tol[inside]))
    # rounding to nearest would be off by up to half a step: the test resolves far finer than that
    assert np.median(tol / step) < 0.1


# ---------------------------------------------------------------------------------------------
# FP8 stochastic rounding
# ---------------------------------------------------------------------------------------------


def fp8_sr(values: list[float], u: float | list[float], kind: EK = EK.FP8_E4M3, dtype: type = np.float32) -> list[int]:
    v: np.ndarray = np.array(values, dtype)
    return reference.fp8_stochastic_encode(v, np.broadcast_to(np.asarray(u, np.float64), v.shape), kind).tolist()


def test_fp8_stochastic_between_neighbours_e4m3() -> None:
    # 1 + 3/64 between 1 (0x38) and 1.125 (0x39): frac 3/8
    assert fp8_sr([1.046875] * 3, [0.0, 0.375 - 2.0**-24, 0.375]) == [0x39, 0x39, 0x38]
    # negative: lo = -1.125 (0xB9), hi = -1 (0xB8), frac = (v - lo) / 0.125 = 5/8
    assert fp8_sr([-1.046875] * 3, [0.0, 0.625 - 2.0**-24, 0.625]) == [0xB8, 0xB8, 0xB9]
    # across a binade: 1.96875 between 1.875 (0x3F) and 2 (0x40), frac 3/4; its negative has frac 1/4
    assert fp8_sr([1.96875, 1.96875], [0.7, 0.75]) == [0x40, 0x3F]
    assert fp8_sr([-1.96875, -1.96875], [0.2, 0.25]) == [0xBF, 0xC0]
    # subnormals: 1.5 * 2**-9 between 2**-9 (0x01) and 2**-8 (0x02)
    assert fp8_sr([1.5 * 2.0**-9] * 2, [0.49, 0.5]) == [0x02, 0x01]
    # below the smallest subnormal: 2**-12 between 0 and 2**-9, frac 1/8; zero keeps the sign of v
    assert fp8_sr([2.0**-12] * 2, [0.0, 0.125]) == [0x01, 0x00]
    assert fp8_sr([-(2.0**-12)] * 2, [0.0, 0.875]) == [0x80, 0x81]
    assert fp8_sr([-1e-10], 0.0) == [0x80]
    # near the top: 440 between 416 (0x7D) and 448 (0x7E), frac 3/4
    assert fp8_sr([440.0, 440.0, -440.0, -440.0], [0.74, 0.75, 0.24, 0.25]) == [0x7E, 0x7D, 0xFD, 0xFE]


def test_fp8_stochastic_saturation_nan_and_exact_values() -> None:
    for u in (0.0, 0.5, TOP):
        assert fp8_sr([448.0, 449.0, 1e6, np.inf, -448.0, -1e6, -np.inf, np.nan], u) == [0x7E] * 4 + [0xFE] * 3 + [0x7F]
        assert fp8_sr([57344.0, 60000.0, -np.inf, np.nan], u, EK.FP8_E5M2) == [0x7B, 0x7B, 0xFB, 0x7F]
        assert fp8_sr([1.0, -1.0, 0.0, -0.0, 2.0**-9, 416.0], u) == [0x38, 0xB8, 0x00, 0x80, 0x01, 0x7D]
        assert fp8_sr([1.0, -1.0, 0.0, -0.0], u, EK.FP8_E5M2, np.float64) == [0x3C, 0xBC, 0x00, 0x80]


def test_fp8_stochastic_e5m2_neighbours() -> None:
    # spacing 0.25 on [1, 2): 1.125 has frac 1/2
    assert fp8_sr([1.125, 1.125], [0.49, 0.5], EK.FP8_E5M2) == [0x3D, 0x3C]
    # top binade spacing 8192: 55296 between 49152 (0x7A) and 57344 (0x7B), frac 3/4
    assert fp8_sr([55296.0, 55296.0], [0.74, 0.75], EK.FP8_E5M2) == [0x7B, 0x7A]


@pytest.mark.parametrize("kind", [EK.FP8_E4M3, EK.FP8_E5M2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fp8_stochastic_matches_a_table_model(rng: np.random.Generator, kind: EK, dtype: type) -> None:
    """Against the sorted table of all finite FP8 values: lo = last value <= v, hi = next, hi iff u < frac."""
    fmax = ELEMENTS[kind].fp8_max
    assert fmax is not None
    table = np.arange(256, dtype=np.uint8).view(ELEMENTS[kind].numpy_dtype).astype(np.float64)
    table = np.unique(table[np.isfinite(table)])  # -0 and +0 collapse to one 0
    n = 20000
    mags = np.exp2(rng.uniform(-14 if kind is EK.FP8_E4M3 else -20, np.log2(fmax), size=n))
    v = (mags * rng.choice([-1.0, 1.0], size=n)).astype(dtype)
    v[:50] = rng.choice(table[np.abs(table) < fmax], size=50)  # some exact values
    u = rng.integers(0, 2**24, size=n) * 2.0**-24
    got = reference.fp8_decode(reference.fp8_stochastic_encode(v, u, kind), kind).astype(np.float64)
    vd = v.astype(np.float64)
    idx = np.searchsorted(table, vd, side="right") - 1
    lo = table[idx]
    hi = table[np.minimum(idx + 1, len(table) - 1)]
    frac = np.where(hi > lo, (vd - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    expected = np.where(u < frac, hi, lo)
    assert np.array_equal(got, expected)
    # signs: zero results carry the sign of v
    raw = reference.fp8_stochastic_encode(v, u, kind)
    zero = got == 0
    assert np.array_equal(raw[zero] == 0x80, np.signbit(v[zero]))
