"""CPU: the format table (quantplan.vocabulary.formats) against independent facts.

Element facts are the literals of MICROSCALING.md section 1.2 and SPEC.md section 3, the values
ml_dtypes decodes for every code, and max finite recomputed here from the bit fields; the scale
element of every served format is a hard list from SPEC.md section 4 / Args docs ("float32;
float64 for F64 plans"), checked on the descriptors, the plans and the functional layer.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan.runtime import _families
from quantplan.vocabulary import formats
from quantplan.vocabulary.elements import CODE_KINDS, ELEMENTS, FLOAT_KINDS
from quantplan.vocabulary.formats import ELEMENT_FORMATS, FORMATS, BlockKind, Encoding, ZeroPoint, format_of
from quantplan.vocabulary.types import ElementKind as EK

# name: (bits, exponent bits, mantissa bits, bias, max finite, max code, emax_elem, min subnormal)
SECTION_1_2 = {
    "e4m3": (8, 4, 3, 7, 448.0, 0x7E, 8, 2.0**-9),
    "e5m2": (8, 5, 2, 15, 57344.0, 0x7B, 15, 2.0**-16),
    "e2m3": (6, 2, 3, 1, 7.5, 0x1F, 2, 0.125),
    "e3m2": (6, 3, 2, 3, 28.0, 0x1F, 4, 0.0625),
    "e2m1": (4, 2, 1, 1, 6.0, 0x7, 2, 0.5),
    "e8m0": (8, 8, 0, 127, 2.0**127, 0xFE, 127, 2.0**-127),
}
#: Special codes (NaN, Inf) of section 1.2, both signs.
SPECIALS = {
    "e4m3": ({0x7F, 0xFF}, set()),
    "e5m2": ({0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}, {0x7C, 0xFC}),
    "e2m3": (set(), set()),
    "e3m2": (set(), set()),
    "e2m1": (set(), set()),
    "e8m0": ({0xFF}, set()),
}
ML_DTYPES = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
}
#: SPEC section 4 default ranges.
SPEC_RANGES = {EK.S8: (-128, 127), EK.U8: (0, 255), EK.S4: (-8, 7), EK.U4: (0, 15)}
#: SPEC: the parameters are float32, float64 for F64 data, for every code format served today.
SPEC_SCALE = {EK.F16: np.float32, EK.BF16: np.float32, EK.F32: np.float32, EK.F64: np.float64}
SERVED = [EK.S8, EK.U8, EK.S4, EK.U4, EK.FP8_E4M3, EK.FP8_E5M2]
BLOCK_ONLY = [EK.FP6_E2M3, EK.FP6_E3M2, EK.FP4_E2M1, EK.E8M0]


def max_finite_from_fields(e: int, m: int, bias: int, specials: str) -> float:
    """Largest finite value from the bit fields: IEEE keeps the top exponent for Inf / NaN, "fn"
    only the all-ones code for NaN, "none" has no special code."""
    top = 2**e - 1
    if specials == "ieee":
        return (2 - 2.0**-m) * 2.0 ** (top - 1 - bias)
    if specials == "fn":
        return (2 - 2.0 ** (1 - m)) * 2.0 ** (top - bias) if m else 2.0 ** (top - 1 - bias)
    return (2 - 2.0**-m) * 2.0 ** (top - bias)


@pytest.mark.parametrize("name", sorted(SECTION_1_2))
def test_element_facts_match_section_1_2(name: str) -> None:
    f = ELEMENT_FORMATS[name]
    bits, e, m, bias, fmax, max_code, emax, min_sub = SECTION_1_2[name]
    assert (f.bits, f.exponent_bits, f.mantissa_bits, f.bias) == (bits, e, m, bias)
    assert f.max_finite == fmax
    assert f.max_code == max_code
    assert f.decode(max_code) == fmax
    assert f.emax_elem == emax
    assert f.min_subnormal == min_sub
    nan, inf = SPECIALS[name]
    assert set(f.nan_codes) == nan and set(f.inf_codes) == inf
    specials = {"e4m3": "fn", "e5m2": "ieee", "e8m0": "fn"}.get(name, "none")
    assert f.max_finite == max_finite_from_fields(e, m, bias, specials)


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
def test_every_code_decodes_as_ml_dtypes(name: str) -> None:
    f = ELEMENT_FORMATS[name]
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    expected = codes.view(ML_DTYPES[name]).astype(np.float64)
    ours = np.array([f.decode(int(c)) for c in codes])
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
    ok = ~np.isnan(expected)
    np.testing.assert_array_equal(ours[ok], expected[ok])
    assert np.array_equal(np.signbit(ours[ok]), np.signbit(expected[ok]))  # -0 is a code of its own
    info = ml_dtypes.finfo(ML_DTYPES[name])
    assert f.max_finite == float(info.max)
    assert f.min_subnormal == float(info.smallest_subnormal)


def test_storage_and_packing() -> None:
    e2m3, e3m2, e2m1 = ELEMENT_FORMATS["e2m3"], ELEMENT_FORMATS["e3m2"], ELEMENT_FORMATS["e2m1"]
    assert (e2m3.codes_per_byte, e2m3.code_mask, e3m2.codes_per_byte, e3m2.code_mask) == (1, 0x3F, 1, 0x3F)
    assert (e2m1.codes_per_byte, e2m1.code_mask) == (2, 0xF)
    for name in ("int4", "uint4"):
        assert ELEMENT_FORMATS[name].codes_per_byte == 2
        assert FORMATS[name].nibble_orders == (qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST)
    for name in ("mxfp4", "nvfp4"):  # MICROSCALING 1.5: element 2i in bits 0-3, no other order
        assert FORMATS[name].nibble_orders == (qp.NibbleOrder.LOW_FIRST,)
    for name in ("int8", "uint8", "e4m3", "e5m2", "mxfp8_e4m3", "mxfp6_e2m3", "mxint8"):
        assert FORMATS[name].element.codes_per_byte == 1 and FORMATS[name].nibble_orders == ()


def test_mxint8() -> None:
    f = ELEMENT_FORMATS["mxint8"]
    assert f.kind is EK.S8 and f.encoding is Encoding.INTEGER
    assert f.code_range == (-127, 127)
    assert f.max_finite == 127 / 64 and f.min_subnormal == 1 / 64 and f.emax_elem == 0
    assert f.decode(0x81) == -127 / 64


@pytest.mark.parametrize("kind", SERVED)
def test_served_ranges_are_the_elements_table(kind: EK) -> None:
    f = format_of(kind)
    assert f.served and f.code_kind is kind
    assert f.element.code_range == ELEMENTS[kind].code_range
    if kind in SPEC_RANGES:
        assert f.element.code_range == SPEC_RANGES[kind]
        assert f.zero_points == (ZeroPoint.NONE, ZeroPoint.I32)
    else:
        assert f.element.code_range is None and f.zero_points == (ZeroPoint.NONE,)
        assert f.element.max_finite == ELEMENTS[kind].fp8_max
    assert f.element.info is ELEMENTS[kind]


def test_served_kinds_are_the_kernel_code_kinds() -> None:
    assert list(formats.SERVED_CODE_KINDS) == SERVED == list(CODE_KINDS)
    assert sorted(formats.BLOCK_ONLY_KINDS) == sorted(BLOCK_ONLY)
    for kind in BLOCK_ONLY:
        assert kind not in CODE_KINDS and kind not in FLOAT_KINDS and kind not in _families.QGZ_CODE_KINDS
        assert ELEMENTS[kind].numpy_dtype == np.dtype(np.uint8)


@pytest.mark.parametrize("code", SERVED)
@pytest.mark.parametrize("data", [EK.F16, EK.BF16, EK.F32, EK.F64])
def test_scale_element_is_spec_for_every_served_format(code: EK, data: EK) -> None:
    expected = np.dtype(SPEC_SCALE[data])
    f = format_of(code)
    assert f.scale_dtype(data) == expected
    qd = qp.QuantizeDescriptor(shape=(3, 10), scope=qp.TokenScope(), input_element=data, output_element=code)
    dd = qp.DequantizeDescriptor(shape=(3, 10), scope=qp.TokenScope(), input_element=code, output_element=data)
    assert qd.format is f and dd.format is f
    for plan_cls, desc in (
        (qp.QuantizePlan, qd),
        (qp.DequantizePlan, dd),
        (qp.QuantizeBackwardPlan, qp.QuantizeBackwardDescriptor.from_forward(qd)),
        (qp.DynamicRangeQuantizePlan, qp.DynamicRangeQuantizeDescriptor(**dict(qd))),
    ):
        plan = plan_cls.select(None, desc, REFERENCE)
        assert plan._param_dtype == expected, plan_cls.__name__


@pytest.mark.parametrize("code", ["int8", "uint4", "fp8_e4m3"])
@pytest.mark.parametrize("data", [EK.BF16, EK.F32, EK.F64])
def test_functional_scales_have_the_format_dtype(code: str, data: EK) -> None:
    rng = np.random.default_rng(24)
    x = random_floats(rng, (5, 37), data)
    qt = qp.quantize(x, code, scope=qp.TokenScope())
    assert qt.scale.dtype == np.dtype(SPEC_SCALE[data])
    y = qp.dequantize(qt, "float64" if data is not EK.F64 else "float32")
    assert y.shape == x.shape


def test_block_geometries() -> None:
    assert formats.geometry_of(qp.TensorScope()).kind is BlockKind.TENSOR
    assert formats.geometry_of(qp.TokenScope()).kind is BlockKind.TOKEN
    assert formats.geometry_of(qp.ChannelScope(axis=0)).kind is BlockKind.CHANNEL
    assert formats.geometry_of(qp.GroupScope(group_size=8)).kind is BlockKind.GROUP

    def shapes(name: str) -> set[tuple[int, int | None]]:
        return {(g.rows, g.cols) for g in FORMATS[name].geometries}

    assert shapes("mxfp8_e4m3") == {(1, 32), (32, 32)}
    assert shapes("mxfp4") == {(1, 32)} and shapes("mxint8") == {(1, 32)}
    assert shapes("nvfp4") == {(1, 16), (16, 16)}
    assert shapes("fp8_block_e4m3") == {(1, 128), (128, 128)}
    assert formats.FP8_TILE.is_2d and not formats.MX_BLOCK.is_2d and formats.FP8_TILE.elements == 128 * 128


def test_block_scale_elements() -> None:
    for name in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8"):
        f = FORMATS[name]
        assert {f.scale_element(d) for d in (EK.F16, EK.BF16, EK.F32)} == {EK.E8M0}
        assert f.zero_points == (ZeroPoint.NONE,) and not f.served
        with pytest.raises(KeyError):
            f.scale_element(EK.F64)
    nvfp4 = FORMATS["nvfp4"]
    assert nvfp4.scale_element(EK.BF16) is EK.FP8_E4M3 and nvfp4.tensor_scale is EK.F32
    assert nvfp4.element.name == "e2m1"
    assert FORMATS["fp8_block_e4m3"].scale_element(EK.F32) is EK.F32
    assert FORMATS["fp8_block_e4m3_ue8m0"].scale_element(EK.F32) is EK.E8M0
    assert math.isnan(ELEMENT_FORMATS["e8m0"].decode(0xFF)) and ELEMENT_FORMATS["e8m0"].decode(127) == 1.0


def test_zero_point_of_mode() -> None:
    assert ZeroPoint.of_mode(qp.QuantMode.SYMMETRIC) is ZeroPoint.NONE
    assert ZeroPoint.of_mode(qp.QuantMode.ASYMMETRIC) is ZeroPoint.I32


@pytest.mark.parametrize("kind", BLOCK_ONLY)
def test_block_only_kinds_are_unsupported_by_every_plan(kind: EK) -> None:
    def q(**kw: object) -> dict[str, object]:
        return dict(shape=(4, 8), scope=qp.TokenScope(), **kw)

    cases = [
        (qp.QuantizePlan, qp.QuantizeDescriptor(**q(input_element=EK.F32, output_element=kind))),  # type: ignore[arg-type]
        (qp.DequantizePlan, qp.DequantizeDescriptor(**q(input_element=kind, output_element=EK.F32))),  # type: ignore[arg-type]
        (
            qp.DynamicRangeQuantizePlan,
            qp.DynamicRangeQuantizeDescriptor(**q(input_element=EK.BF16, output_element=kind)),  # type: ignore[arg-type]
        ),
        (
            qp.QuantizeBackwardPlan,
            qp.QuantizeBackwardDescriptor(**q(input_element=EK.F16, output_element=kind)),  # type: ignore[arg-type]
        ),
        (
            qp.SwizzledQuantizePlan,
            qp.SwizzledQuantizeDescriptor(
                shape=(4, 24), group_size=6, nodes=2, devices_per_node=2, input_element=EK.F32, output_element=kind
            ),
        ),
        (
            qp.DequantReducePlan,
            qp.DequantReduceDescriptor(
                peers=2,
                chunk_elements=12,
                input_group_size=4,
                output_group_size=6,
                input_element=kind,
                output_element=EK.S8,
            ),
        ),
    ]
    for plan_cls, desc in cases:
        with pytest.raises(qp.Unsupported, match=kind.name):
            plan_cls.select(None, desc, REFERENCE)
    with pytest.raises(qp.Unsupported, match=kind.name):
        _ = qp.QuantizeDescriptor(**q(input_element=EK.F32, output_element=kind)).format  # type: ignore[arg-type]
    with pytest.raises(qp.InvalidProblem):  # the codes of a block format are no float data
        qp.FakeQuantizePlan.select(
            None, qp.FakeQuantizeDescriptor(shape=(4, 8), scope=qp.TensorScope(), element=kind), REFERENCE
        )
