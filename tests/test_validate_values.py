"""PlanPreference(validate_values=True) (issue 16 item 4) and the error classes of the contract.

The values inside array parameters (NaN, zero or negative scales, zero points outside the code
range) are not inspected on the hot path; with ``validate_values=True`` the checked run and
``can_implement`` inspect them and raise InvalidProblem naming the first bad index, before any
write. Off by default: the same call runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import quantplan as qp
from quantplan.vocabulary.types import ElementKind as EK

ASYM = qp.QuantMode.ASYMMETRIC
TOKEN = qp.TokenScope()
SHAPE = (4, 8)


def _pref(validate: bool) -> qp.PlanPreference:
    return qp.PlanPreference(backend=qp.BackendKind.REFERENCE, validate_values=validate)


def _floats() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)


def _scale() -> np.ndarray:
    return np.full((4, 1), 0.05, np.float32)


def _zp(value: int = 3) -> np.ndarray:
    return np.full((4, 1), value, np.int32)


def _quantize(validate: bool, scale: np.ndarray, zp: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    d = qp.QuantizeDescriptor(shape=SHAPE, scope=TOKEN, input_element=EK.F32, output_element=EK.U8, mode=ASYM)
    out = np.full(SHAPE, 77, np.uint8)
    return qp.QuantizePlan.select(None, d, _pref(validate)), qp.QuantizeArgs(_floats(), out, scale, zp), out


def _dequantize(validate: bool, scale: np.ndarray, zp: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    d = qp.DequantizeDescriptor(shape=SHAPE, scope=TOKEN, input_element=EK.S8, output_element=EK.F32, mode=ASYM)
    out = np.full(SHAPE, 77.0, np.float32)
    codes = np.zeros(SHAPE, np.int8)
    return qp.DequantizePlan.select(None, d, _pref(validate)), qp.DequantizeArgs(codes, out, scale, zp), out


def _quantize_backward(validate: bool, scale: np.ndarray, zp: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    d = qp.QuantizeBackwardDescriptor(shape=SHAPE, scope=TOKEN, input_element=EK.F32, output_element=EK.U8, mode=ASYM)
    out = np.full(SHAPE, 77.0, np.float32)
    args = qp.QuantizeBackwardArgs(_floats(), _floats(), out, scale, zp)
    return qp.QuantizeBackwardPlan.select(None, d, _pref(validate)), args, out


def _fake_quantize(validate: bool, scale: np.ndarray, zp: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    d = qp.FakeQuantizeDescriptor(shape=SHAPE, scope=TOKEN, element=EK.F32, q_min=0, q_max=15, mode=ASYM)
    out = np.full(SHAPE, 77.0, np.float32)
    return qp.FakeQuantizePlan.select(None, d, _pref(validate)), qp.FakeQuantizeArgs(_floats(), out, scale, zp), out


def _dequant_reduce(validate: bool, scale: np.ndarray, zp: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    d = qp.DequantReduceDescriptor(
        peers=4, chunk_elements=8, input_group_size=8, mode=ASYM, input_element=EK.U8, output_element=EK.F32
    )
    out = np.full((8,), 77.0, np.float32)
    args = qp.DequantReduceArgs(np.zeros((4, 8), np.uint8), scale, out, None, zero_point=zp)
    return qp.DequantReducePlan.select(None, d, _pref(validate)), args, out


MAKERS: dict[str, Callable[[bool, np.ndarray, np.ndarray], tuple[Any, Any, np.ndarray]]] = {
    "quantize": _quantize,
    "dequantize": _dequantize,
    "quantize_backward": _quantize_backward,
    "fake_quantize": _fake_quantize,
    "dequant_reduce": _dequant_reduce,
}

#: name -> (scale, zero point, message fragment)
BAD: dict[str, tuple[Callable[[], np.ndarray], Callable[[], np.ndarray], str]] = {
    "nan_scale": (lambda: _with(_scale(), 2, np.nan), _zp, r"scale\[2, 0\] = nan must be finite and > 0"),
    "zero_scale": (lambda: _with(_scale(), 1, 0.0), _zp, r"scale\[1, 0\] = 0.0 must be finite and > 0"),
    "negative_scale": (lambda: _with(_scale(), 3, -0.5), _zp, r"scale\[3, 0\] = -0.5"),
    "inf_scale": (lambda: _with(_scale(), 0, np.inf), _zp, r"scale\[0, 0\] = inf"),
    "zero_point_out_of_range": (_scale, lambda: _with(_zp(), 2, 1000), r"zero_point\[2, 0\] = 1000 lies outside"),
}


def _with(a: np.ndarray, row: int, value: float) -> np.ndarray:
    a[row, 0] = value
    return a


@pytest.mark.parametrize("plan", sorted(MAKERS))
@pytest.mark.parametrize("bad", sorted(BAD))
def test_validate_values_names_the_first_bad_index(plan: str, bad: str) -> None:
    make_scale, make_zp, fragment = BAD[bad]
    p, args, out = MAKERS[plan](True, make_scale(), make_zp())
    before = out.copy()
    with pytest.raises(qp.InvalidProblem, match=fragment):
        p.can_implement(args)
    with pytest.raises(qp.InvalidProblem, match=fragment):
        p.run(None, None, args)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("plan", sorted(MAKERS))
def test_values_are_not_inspected_by_default(plan: str) -> None:
    p, args, _ = MAKERS[plan](False, _with(_scale(), 2, np.nan), _with(_zp(), 1, 1000))
    assert p.can_implement(args)
    with np.errstate(all="ignore"):
        p.run(None, None, args)


@pytest.mark.parametrize("plan", sorted(MAKERS))
def test_validate_values_accepts_good_values(plan: str) -> None:
    p, args, out = MAKERS[plan](True, _scale(), _zp())
    assert p.can_implement(args)
    p.run(None, None, args)
    assert not np.array_equal(out, np.full_like(out, 77))


def test_wrong_types_are_type_errors_and_quantplan_errors() -> None:
    p, args, _ = _quantize(False, _scale(), _zp())
    for call in (
        lambda: p.run(None, None, dict(input=1)),
        lambda: p.run(None, "garbage", args),
        lambda: p.run("garbage", None, args),
        lambda: qp.QuantizePlan.select(None, None),
        lambda: qp.QuantizePlan.select(None, p.problem, "fast"),
    ):
        with pytest.raises(qp.InvalidArgumentType) as info:
            call()
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
        assert isinstance(info.value, qp.QuantPlanError)


def test_descriptor_validation_is_invalid_problem() -> None:
    with pytest.raises(qp.InvalidProblem, match="group_size"):
        qp.GroupScope(group_size=0)
    with pytest.raises(qp.InvalidProblem, match="validate_values"):
        qp.PlanPreference(validate_values="often")
    with pytest.raises(qp.InvalidProblem, match=r"2\*\*63 - 1"):
        qp.QuantizeDescriptor(shape=(2**40, 2**40), scope=TOKEN, input_element=EK.F32, output_element=EK.S8)
