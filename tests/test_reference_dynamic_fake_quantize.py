"""CPU: dynamic-range fake quantization semantics on hand-computed cases, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan import reference
from quantplan.ops.dynamic_fake_quantize import dynamic_fake_quantize_range
from quantplan.vocabulary.types import ElementKind as EK
from quantplan.vocabulary.types import MathPrecision

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
F32 = MathPrecision.F32


@pytest.mark.parametrize(
    ("mode", "bits", "expected"),
    [
        (SYM, 2, (-2, 1)),
        (SYM, 4, (-8, 7)),
        (SYM, 8, (-128, 127)),
        (ASYM, 1, (0, 1)),
        (ASYM, 4, (0, 15)),
        (ASYM, 8, (0, 255)),
    ],
)
def test_code_range_of_bits(mode, bits, expected) -> None:
    assert dynamic_fake_quantize_range(mode, bits) == expected
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(4,), scope=qp.TensorScope(), mode=mode, element=EK.F32, bits=bits
    )
    assert (desc.q_min, desc.q_max) == expected


@pytest.mark.parametrize(("mode", "bits"), [(SYM, 1), (SYM, 0), (ASYM, 0), (ASYM, 9), (SYM, 16)])
def test_bad_bit_widths_raise_at_select(mode, bits) -> None:
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(4,), scope=qp.TensorScope(), mode=mode, element=EK.F32, bits=bits
    )
    with pytest.raises(qp.InvalidProblem):
        qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE)


def test_symmetric_two_bits_by_hand() -> None:
    # amax = 1, codes [-2, 1], scale = 1 / 1; rne(-0.5) = -0 -> +0 after + zp; rne(0.75) = 1.
    x = np.array([1.0, -0.5, 0.25, 0.75, -1.0, 0.5], np.float32)
    y, s, z = reference.dynamic_fake_quantize(x, qp.TensorScope(), SYM, -2, 1, F32)
    assert z is None and s.reshape(-1)[0] == np.float32(1.0)
    assert y.tolist() == [1.0, 0.0, 0.0, 1.0, -1.0, 0.0]
    assert not np.signbit(y[1])


def test_asymmetric_two_bits_by_hand() -> None:
    # lo = -1, hi = 2, scale = 3 / 3 = 1, zp = clamp(0 - rne(-1)) = 1; rne(0.5) = 0 -> q = 1 -> 0.
    x = np.array([-1.0, 0.0, 0.5, 2.0, 1.5], np.float32)
    y, s, z = reference.dynamic_fake_quantize(x, qp.TensorScope(), ASYM, 0, 3, F32)
    assert s.reshape(-1)[0] == np.float32(1.0) and z is not None and z.reshape(-1)[0] == 1
    assert y.tolist() == [-1.0, 0.0, 0.0, 2.0, 2.0]


def test_per_group_with_zero_and_nonfinite_groups() -> None:
    x = np.array([[0.0, 0.0, 0.0, 0.0, 3.0, -1.5, 0.7, 1.0, np.nan, 1.0, 2.0, 3.0]], np.float32)
    scope = qp.GroupScope(axis=-1, group_size=4)
    y, s, z = reference.dynamic_fake_quantize(x, scope, SYM, -8, 7, F32)
    assert s.shape == (1, 3) and z is None
    assert s[0, 0] == np.float32(1.0) and np.all(y[0, :4] == 0.0)  # all-zero group: scale 1
    assert s[0, 1] == np.float32(3.0) / np.float32(7.0)
    inv = np.float32(1.0) / s[0, 1]
    expected = ((np.rint(x[0, 4:8] * inv)) * s[0, 1]).astype(np.float32)
    assert np.array_equal(y[0, 4:8], expected)
    assert np.isnan(s[0, 2]) and np.all(np.isnan(y[0, 8:]))  # a NaN poisons only its own group


def test_stochastic_rounding_by_hand() -> None:
    # scale = 1 (amax 7, q_max 7): v = x; u < frac rounds up.
    x = np.array([7.0, 0.25, 0.25, -0.25, -0.25, 2.5], np.float32)
    u = np.array([0.9, 0.1, 0.3, 0.7, 0.8, 0.5], np.float32)
    y, s, _ = reference.dynamic_fake_quantize(x, qp.TensorScope(), SYM, -8, 7, F32, uniform=u)
    assert s.reshape(-1)[0] == np.float32(1.0)
    # -0.25: floor -1, frac 0.75: u=0.7 < 0.75 -> 0; u=0.8 -> -1. 2.5: u=0.5 < 0.5 is False -> 2.
    assert y.tolist() == [7.0, 1.0, 0.0, 0.0, -1.0, 2.0]


def test_equals_fake_quantize_with_its_parameters(rng) -> None:
    x = random_floats(rng, (13, 96), EK.BF16)
    scope = qp.GroupScope(axis=-1, group_size=32)
    y, s, z = reference.dynamic_fake_quantize(x, scope, ASYM, 0, 15, F32)
    assert z is not None
    from quantplan.runtime._layout import expand_params

    expected = reference.fake_quantize(
        x, expand_params(s, x.shape, scope), expand_params(z, x.shape, scope), 0, 15, F32
    )
    assert np.array_equal(y.view(np.uint16), expected.view(np.uint16))
    # And the parameters are DynamicRangeQuantizePlan's for the same range.
    s2, z2 = reference.dynamic_range_params(x, scope, ASYM, EK.U8, 0, 15, F32)
    assert np.array_equal(s, s2) and z2 is not None and np.array_equal(z, z2)


@pytest.mark.parametrize("rounding", [qp.Rounding.NEAREST_EVEN, qp.Rounding.STOCHASTIC])
def test_reference_plan_runs_in_place_and_matches_the_function(rng, rounding) -> None:
    shape = (7, 60)
    scope = qp.GroupScope(axis=-1, group_size=12)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=scope, mode=ASYM, element=EK.F16, bits=5, rounding=rounding
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE)
    assert plan.workspace_size() == 0 and plan.sku().backend is qp.BackendKind.REFERENCE
    x = random_floats(rng, shape, EK.F16)
    kw = {"rng_seed": 9, "rng_offset": 2} if rounding is qp.Rounding.STOCHASTIC else {}
    buf = x.copy()
    s = np.zeros(desc.param_shape, np.float32)
    z = np.zeros(desc.param_shape, np.int32)
    plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(buf, buf, s, z, **kw))
    uniform = None
    if kw:
        from quantplan.runtime._operands import reference_uniform

        uniform = reference_uniform(shape, 9, 2)
    y, s_ref, z_ref = reference.dynamic_fake_quantize(x, scope, ASYM, 0, 31, F32, uniform)
    assert np.array_equal(buf.view(np.uint16), y.view(np.uint16))
    # F16 data may overflow to Inf (random_floats scales some values by 1e3): NaN scales compare equal.
    assert np.array_equal(s, s_ref, equal_nan=True) and z_ref is not None and np.array_equal(z, z_ref)


def _plan(mode=SYM, rounding=qp.Rounding.NEAREST_EVEN) -> qp.DynamicRangeFakeQuantizePlan:
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(4, 8), scope=qp.TokenScope(), mode=mode, element=EK.F32, rounding=rounding
    )
    return qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE)


@pytest.mark.parametrize(
    ("mode", "rounding", "kwargs", "message"),
    [
        (SYM, qp.Rounding.NEAREST_EVEN, {"zero_point_out": np.zeros((4, 1), np.int32)}, "SYMMETRIC"),
        (SYM, qp.Rounding.NEAREST_EVEN, {"rng_seed": 1, "rng_offset": 0}, "STOCHASTIC"),
        (SYM, qp.Rounding.STOCHASTIC, {}, "rng_seed"),
        (SYM, qp.Rounding.STOCHASTIC, {"rng_seed": -1, "rng_offset": 0}, "rng_seed"),
        (SYM, qp.Rounding.NEAREST_EVEN, {"scale_out": np.zeros((4, 2), np.float32)}, "shape"),
        (SYM, qp.Rounding.NEAREST_EVEN, {"scale_out": np.zeros((4, 1), np.float64)}, "dtype"),
        (ASYM, qp.Rounding.NEAREST_EVEN, {"zero_point_out": np.zeros((4, 1), np.int64)}, "dtype"),
    ],
)
def test_bad_arguments_raise_and_write_nothing(mode, rounding, kwargs, message) -> None:
    x = np.ones((4, 8), np.float32)
    y = np.full((4, 8), 5.0, np.float32)
    with pytest.raises(qp.InvalidProblem, match=message):
        _plan(mode, rounding).run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, y, **kwargs))
    assert np.all(y == 5.0)


def test_wrong_output_shape_and_dtype() -> None:
    plan = _plan()
    x = np.ones((4, 8), np.float32)
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, np.zeros((4, 9), np.float32)))
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, np.zeros((4, 8), np.float16)))


def test_group_size_must_divide() -> None:
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(4, 10), scope=qp.GroupScope(axis=-1, group_size=4), element=EK.F32
    )
    with pytest.raises(qp.InvalidProblem):
        qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE)
