"""CPU: every plan derives from the one base (``quantplan.runtime._plan.Plan``) and ``run(..., check=False)``
gives the checked run's results bit for bit (reference backend), with a one-line repr and no
prepared launches on the reference backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import quantplan as qp
from quantplan.ops import deepspeed_format as dsp
from quantplan.runtime._plan import Plan

EK = qp.ElementKind
R = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)


def _cases() -> list[tuple[Any, Callable[[], tuple[Any, list[np.ndarray]]]]]:
    rng = np.random.default_rng(1)
    CASES: list[tuple[Any, Callable[[], tuple[Any, list[np.ndarray]]]]] = []
    x = rng.standard_normal((6, 40)).astype(np.float32)
    d = qp.QuantizeDescriptor(
        shape=(6, 40),
        scope=qp.TokenScope(),
        input_element=EK.F32,
        output_element=EK.S8,
        rounding=qp.Rounding.STOCHASTIC,
    )
    s = np.abs(x).max(1, keepdims=True).astype(np.float32) / 127

    def make_1():
        q = np.zeros((6, 40), np.int8)
        return qp.QuantizeArgs(x, q, s, None, 5, 7), [q]

    CASES.append((qp.QuantizePlan.select(None, d, R), make_1))
    dd = qp.DynamicRangeQuantizeDescriptor(
        shape=(6, 40),
        scope=qp.GroupScope(group_size=8),
        mode=qp.QuantMode.ASYMMETRIC,
        input_element=EK.F32,
        output_element=EK.U4,
    )

    def make_2():
        q = np.zeros(dd.output_shape, np.uint8)
        sc = np.zeros(dd.param_shape, np.float32)
        z = np.zeros(dd.param_shape, np.int32)
        return qp.DynamicRangeQuantizeArgs(x, q, sc, z), [q, sc, z]

    CASES.append((qp.DynamicRangeQuantizePlan.select(None, dd, R), make_2))
    deq = qp.DequantizeDescriptor(shape=(6, 40), scope=qp.TokenScope(), input_element=EK.S8, output_element=EK.F32)
    qq = rng.integers(-128, 127, (6, 40)).astype(np.int8)

    def make_3():
        y = np.zeros((6, 40), np.float32)
        return qp.DequantizeArgs(qq, y, s), [y]

    CASES.append((qp.DequantizePlan.select(None, deq, R), make_3))
    fd = qp.FakeQuantizeDescriptor(
        shape=(6, 40), scope=qp.TensorScope(), element=EK.F32, q_min=-128, q_max=127, mode=qp.QuantMode.ASYMMETRIC
    )

    def make_4():
        y = np.zeros((6, 40), np.float32)
        return qp.FakeQuantizeArgs(x, y, 0.02, 3), [y]

    CASES.append((qp.FakeQuantizePlan.select(None, fd, R), make_4))
    bd = qp.FakeQuantizeBackwardDescriptor(**fd.model_dump(), learnable=True)
    dy = rng.standard_normal((6, 40)).astype(np.float32)

    def make_5():
        dx = np.zeros((6, 40), np.float32)
        gs = np.zeros((1, 1), np.float32)
        gz = np.zeros((1, 1), np.float32)
        return qp.FakeQuantizeBackwardArgs(
            x, dy, dx, np.full((1, 1), 0.02, np.float32), np.full((1, 1), 3.0, np.float32), gs, gz, 0.5
        ), [dx, gs, gz]

    CASES.append((qp.FakeQuantizeBackwardPlan.select(None, bd, R), make_5))
    qb = qp.QuantizeBackwardDescriptor(shape=(6, 40), scope=qp.TokenScope(), input_element=EK.F32, output_element=EK.S8)

    def make_6():
        dx = np.zeros((6, 40), np.float32)
        return qp.QuantizeBackwardArgs(x, dy, dx, s), [dx]

    CASES.append((qp.QuantizeBackwardPlan.select(None, qb, R), make_6))
    dfd = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(6, 40), scope=qp.TokenScope(), element=EK.F32, bits=4, rounding=qp.Rounding.STOCHASTIC
    )

    def make_7():
        y = np.zeros((6, 40), np.float32)
        sc = np.zeros((6, 1), np.float32)
        return qp.DynamicRangeFakeQuantizeArgs(x, y, sc, None, 3, 4), [y, sc]

    CASES.append((qp.DynamicRangeFakeQuantizePlan.select(None, dfd, R), make_7))
    sd = qp.SwizzledQuantizeDescriptor(
        shape=(240,),
        group_size=10,
        nodes=2,
        devices_per_node=2,
        input_element=EK.F32,
        output_element=EK.S8,
        error_element=EK.F32,
    )
    xf = x.reshape(-1)

    def make_8():
        q = np.zeros(sd.output_shape, np.int8)
        sc = np.zeros(sd.param_shape, np.float32)
        e = np.full(240, 0.1, np.float32)
        return qp.SwizzledQuantizeArgs(xf, q, sc, None, e, 0.25), [q, sc, e]

    CASES.append((qp.SwizzledQuantizePlan.select(None, sd, R), make_8))
    rd = qp.DequantReduceDescriptor(
        peers=3,
        chunk_elements=40,
        input_group_size=10,
        output_group_size=20,
        input_element=EK.S8,
        output_element=EK.S8,
        error_element=EK.F32,
    )
    qin = rng.integers(-100, 100, rd.input_shape).astype(np.int8)
    sin = rng.random(rd.input_param_shape).astype(np.float32)

    def make_9():
        y = np.zeros(rd.output_shape, np.int8)
        so = np.zeros(rd.param_shape, np.float32)
        e = np.full(40, 0.1, np.float32)
        return qp.DequantReduceArgs(qin, sin, y, so, None, None, e, 0.5), [y, so, e]

    CASES.append((qp.DequantReducePlan.select(None, rd, R), make_9))
    qd = dsp.DeepSpeedQuantizeDescriptor(numel=240, groups=8, num_bits=4, input_element=EK.F32, error_element=EK.F32)

    def make_10():
        y = np.zeros(qd.output_bytes, np.int8)
        p = np.zeros(qd.param_shape, np.float32)
        e = np.full(240, 0.1, np.float32)
        return dsp.DeepSpeedQuantizeArgs(xf, y, p, e, 0.3), [y, p, e]

    CASES.append((dsp.DeepSpeedQuantizePlan.select(None, qd, R), make_10))
    md = dsp.MoQFakeQuantizeDescriptor(numel=240, groups=8, num_bits=4, element=EK.F32, rounding=qp.Rounding.STOCHASTIC)

    def make_11():
        y = np.zeros(240, np.float32)
        return dsp.MoQFakeQuantizeArgs(xf, y, 3, 9), [y]

    CASES.append((dsp.MoQFakeQuantizePlan.select(None, md, R), make_11))
    ddq = dsp.DeepSpeedDequantizeDescriptor(numel=240, groups=8, num_bits=8, output_element=EK.F32)
    qb8 = rng.integers(-100, 100, 240).astype(np.int8)
    pp = rng.random((8, 2)).astype(np.float32)

    def make_12():
        y = np.zeros(240, np.float32)
        return dsp.DeepSpeedDequantizeArgs(qb8, pp, y), [y]

    CASES.append((dsp.DeepSpeedDequantizePlan.select(None, ddq, R), make_12))
    rdd = dsp.DeepSpeedReduceDescriptor(numel=240, in_groups=8, out_groups=4, num_bits=8, devices_per_node=2)

    def make_13():
        y = np.zeros(rdd.output_bytes, np.int8)
        po = np.zeros(rdd.param_shape, np.float32)
        return dsp.DeepSpeedReduceArgs(qb8, pp[:, :1].copy(), y, po), [y, po]

    CASES.append((dsp.DeepSpeedReducePlan.select(None, rdd, R), make_13))
    return CASES


CASES = _cases()


@pytest.mark.parametrize("plan, make", CASES, ids=[type(p).__name__ for p, _ in CASES])
def test_unchecked_run_equals_checked_run(plan: Any, make: Callable[[], tuple[Any, list[np.ndarray]]]) -> None:
    results = []
    for check in (True, False):
        args, outputs = make()
        plan.run(None, None, args, check=check)
        results.append([o.copy() for o in outputs])
    for checked, unchecked in zip(*results, strict=True):
        assert np.array_equal(checked.view(np.uint8), unchecked.view(np.uint8))


@pytest.mark.parametrize("plan", [p for p, _ in CASES], ids=[type(p).__name__ for p, _ in CASES])
def test_every_plan_derives_from_the_base(plan: Any) -> None:
    assert isinstance(plan, Plan)
    assert plan._prepared == () and plan.backend is qp.BackendKind.REFERENCE
    text = repr(plan)
    assert "\n" not in text and type(plan).__name__ in text and "backend=reference" in text
    assert plan.sku().precision_guarantee == plan.precision_guarantee()
    assert plan.workspace_size() == 0


def test_descriptors_read_their_resolved_code_range_and_equal_the_explicit_default() -> None:
    EK = qp.ElementKind
    base = dict(shape=(4, 8), scope=qp.TokenScope(), input_element=EK.F32)
    implicit = qp.QuantizeDescriptor(**base, output_element=EK.S8)
    explicit = qp.QuantizeDescriptor(**base, output_element=EK.S8, q_min=-128, q_max=127)
    assert (implicit.q_min, implicit.q_max) == (-128, 127)
    assert implicit == explicit and hash(implicit) == hash(explicit) and {implicit: 1}[explicit] == 1
    half = qp.DynamicRangeQuantizeDescriptor(**base, output_element=EK.S4, q_min=-7)
    assert (half.q_min, half.q_max) == (-7, 7)
    assert qp.DynamicRangeQuantizePlan.select(None, half, R).problem.q_min == -7
    fp8 = qp.QuantizeDescriptor(**base, output_element=EK.FP8_E4M3)
    assert (fp8.q_min, fp8.q_max) == (None, None)  # no integer range applies
    # a copy to another kind resolves its range again; a range that was given stays
    u4 = implicit.model_copy(update={"output_element": EK.U4})
    assert (u4.q_min, u4.q_max) == (0, 15)
    assert half.model_copy(update={"shape": (2, 8)}).q_min == -7
    with pytest.raises(qp.InvalidProblem, match="output_element"):
        implicit.model_copy(update={"output_element": "s9"})
    backward = qp.QuantizeBackwardDescriptor.from_forward(implicit)
    assert (backward.q_min, backward.q_max) == (-128, 127)
    swz = qp.SwizzledQuantizeDescriptor(shape=(64,), group_size=8, input_element=EK.F32, output_element=EK.U4)
    assert (swz.q_min, swz.q_max) == (0, 15)
    dr = dict(peers=2, chunk_elements=8, input_group_size=4, input_element=EK.S8)
    assert qp.DequantReduceDescriptor(**dr, output_element=EK.F32).q_min is None
    assert qp.DequantReduceDescriptor(**dr, output_group_size=4, output_element=EK.U8).q_max == 255


def test_descriptor_and_plan_identity_print_readably() -> None:
    EK = qp.ElementKind
    desc = qp.QuantizeDescriptor(
        shape=(16, 4096), scope=qp.TokenScope(), input_element=EK.F32, output_element=EK.S8, q_min=-127
    )
    text = repr(desc)
    assert text == str(desc)
    assert text.startswith("QuantizeDescriptor(shape=(16, 4096), scope=TokenScope(), mode=SYMMETRIC,"), text
    assert "input_element=F32, output_element=S8, q_min=-127, q_max=127" in text and "<" not in text, text
    assert repr(qp.GroupScope(group_size=128)) == "GroupScope(axis=-1, group_size=128)"
    plan = qp.QuantizePlan.select(None, desc, R)
    assert str(plan.sku()) == "quantize/static F32 / S8, variant 'numpy', reference backend on host"
    assert str(plan.precision_guarantee()).startswith("F32 math, F32 accumulator, deterministic")
    assert "<" not in repr(plan.sku())
