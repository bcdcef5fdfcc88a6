"""CPU: DynamicRangeQuantizePlan descriptor and argument checks, and reference runs end to end."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE

import quantplan as qp
from quantplan import reference
from quantplan.vocabulary.types import ElementKind as EK


def desc(**kw: object) -> qp.DynamicRangeQuantizeDescriptor:
    base: dict[str, object] = dict(shape=(4, 6), scope=qp.TokenScope(), input_element=EK.F32, output_element=EK.S8)
    base.update(kw)
    return qp.DynamicRangeQuantizeDescriptor(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw",
    [
        dict(output_element=EK.FP8_E4M3, mode=qp.QuantMode.ASYMMETRIC),
        dict(q_min=-8, q_max=0),
        dict(mode=qp.QuantMode.ASYMMETRIC, q_min=5, q_max=5),
        dict(output_element=EK.F16),
        dict(scope=qp.GroupScope(axis=-1, group_size=4)),
        dict(scope=qp.ChannelScope(axis=2)),
    ],
)
def test_bad_descriptors_raise_invalid_problem(kw: dict[str, object]) -> None:
    with pytest.raises(qp.InvalidProblem):
        qp.DynamicRangeQuantizePlan.select(None, desc(**kw), REFERENCE)


def test_bad_arguments_raise_and_write_nothing(rng: np.random.Generator) -> None:
    plan = qp.DynamicRangeQuantizePlan.select(None, desc(mode=qp.QuantMode.ASYMMETRIC, output_element=EK.U8), REFERENCE)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    q = np.full((4, 6), 9, np.uint8)
    s = np.full((4, 1), 3.0, np.float32)
    z = np.full((4, 1), 4, np.int32)
    bad = [
        qp.DynamicRangeQuantizeArgs(x, q, s, None),  # zero_point_out missing
        qp.DynamicRangeQuantizeArgs(x, q, s.astype(np.float64), z),  # scale dtype
        qp.DynamicRangeQuantizeArgs(x, q, np.zeros((4,), np.float32), z),  # scale shape
        qp.DynamicRangeQuantizeArgs(x, q.astype(np.int8), s, z),  # output dtype
        qp.DynamicRangeQuantizeArgs(x, q, s, z, rng_seed=1),  # rng on a rne plan
    ]
    for args in bad:
        with pytest.raises(qp.InvalidProblem):
            plan.run(None, None, args)
    assert (q == 9).all() and (s == 3.0).all() and (z == 4).all()


def test_stochastic_needs_seed_and_offset(rng: np.random.Generator) -> None:
    plan = qp.DynamicRangeQuantizePlan.select(None, desc(rounding=qp.Rounding.STOCHASTIC), REFERENCE)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    q, s = np.zeros((4, 6), np.int8), np.zeros((4, 1), np.float32)
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.DynamicRangeQuantizeArgs(x, q, s))
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.DynamicRangeQuantizeArgs(x, q, s, rng_seed=-1, rng_offset=0))
    plan.run(None, None, qp.DynamicRangeQuantizeArgs(x, q, s, rng_seed=2**64 - 1, rng_offset=3))
    assert q.any()


def test_reference_plan_equals_reference_function_and_dequantizes_back(rng: np.random.Generator) -> None:
    shape = (5, 3, 40)
    scope = qp.GroupScope(axis=-1, group_size=8)
    d = desc(shape=shape, scope=scope, mode=qp.QuantMode.ASYMMETRIC, output_element=EK.U4)
    x = rng.standard_normal(shape).astype(np.float32)
    q = np.zeros(d.output_shape, np.uint8)
    s = np.zeros(d.param_shape, np.float32)
    z = np.zeros(d.param_shape, np.int32)
    plan = qp.DynamicRangeQuantizePlan.select(None, d, REFERENCE)
    assert plan.workspace_size() == 0 and plan.sku().op is qp.QuantizeKind.DYNAMIC_RANGE
    plan.run(None, None, qp.DynamicRangeQuantizeArgs(x, q, s, z))
    q_ref, s_ref, z_ref = reference.dynamic_quantize(
        x, scope, qp.QuantMode.ASYMMETRIC, EK.U4, 0, 15, qp.MathPrecision.F32
    )
    assert np.array_equal(q, q_ref) and np.array_equal(s, s_ref) and np.array_equal(z, z_ref)
    dd = qp.DequantizeDescriptor(
        shape=shape, scope=scope, mode=qp.QuantMode.ASYMMETRIC, input_element=EK.U4, output_element=EK.F32
    )
    y = np.zeros(shape, np.float32)
    qp.DequantizePlan.select(None, dd, REFERENCE).run(None, None, qp.DequantizeArgs(q, y, s, z))
    assert np.all(np.abs(y - x) <= np.repeat(s, 8, axis=-1) / 2 + 1e-6)
