"""CPU: descriptors, select and can_implement truth tables (SPEC section 7), on the reference backend.

Every bad input raises the documented error before anything runs, and the output is untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE

import quantplan as qp
from quantplan.runtime.workspace import check_workspace
from quantplan.vocabulary.types import ElementKind as EK

SENTINEL = 77


def _desc(**kw) -> qp.QuantizeDescriptor:  # noqa: ANN003
    base = dict(shape=(4, 12), scope=qp.TokenScope(), input_element=EK.F32, output_element=EK.S8)
    base.update(kw)
    return qp.QuantizeDescriptor(**base)


def test_descriptor_is_frozen_hashable_and_forbids_extra() -> None:
    d = _desc()
    assert hash(d) == hash(_desc())
    with pytest.raises(qp.InvalidProblem):
        d.shape = (1,)  # type: ignore[misc]
    with pytest.raises(qp.InvalidProblem):
        qp.QuantizeDescriptor(shape=(4,), scope=qp.TensorScope(), input_element=EK.F32, output_element=EK.S8, bogus=1)
    with pytest.raises(qp.InvalidProblem):
        qp.GroupScope(group_size=0)


def test_descriptor_shapes() -> None:
    d = _desc(shape=(3, 5, 7), output_element=EK.S4, scope=qp.GroupScope(axis=1, group_size=5))
    assert d.output_shape == (3, 5, 4)
    assert d.param_shape == (3, 1, 7)
    assert _desc(shape=(3, 5, 7), scope=qp.ChannelScope(axis=-2)).param_shape == (1, 5, 1)
    assert _desc(shape=(3, 5, 7), scope=qp.TensorScope()).param_shape == (1, 1, 1)
    assert _desc(shape=(3, 5, 7)).param_shape == (3, 5, 1)
    dd = qp.DequantizeDescriptor(shape=(2, 9), scope=qp.TokenScope(), input_element=EK.U4, output_element=EK.F16)
    assert dd.input_shape == (2, 5) and dd.output_shape == (2, 9)


@pytest.mark.parametrize(
    "kw,error",
    [
        (dict(q_min=5, q_max=4), qp.InvalidProblem),
        (dict(q_min=-129), qp.InvalidProblem),
        (dict(output_element=EK.U8, q_max=256), qp.InvalidProblem),
        (dict(scope=qp.GroupScope(group_size=5)), qp.InvalidProblem),
        (dict(scope=qp.ChannelScope(axis=2)), qp.InvalidProblem),
        (dict(scope=qp.GroupScope(axis=-3, group_size=2)), qp.InvalidProblem),
        (dict(output_element=EK.FP8_E4M3, mode=qp.QuantMode.ASYMMETRIC), qp.InvalidProblem),
        (dict(output_element=EK.FP8_E4M3, q_min=-10), qp.InvalidProblem),
        (dict(output_element=EK.F16), qp.InvalidProblem),
        (dict(input_element=EK.S8), qp.InvalidProblem),
        (dict(shape=(4, -1)), qp.InvalidProblem),
    ],
)
def test_select_rejects_bad_descriptors(kw, error) -> None:  # noqa: ANN001
    with pytest.raises(error):
        qp.QuantizePlan.select(None, _desc(**kw), REFERENCE)


def test_dequantize_select_rejects_float_input() -> None:
    with pytest.raises(qp.InvalidProblem):
        qp.DequantizePlan.select(
            None,
            qp.DequantizeDescriptor(shape=(2, 2), scope=qp.TensorScope(), input_element=EK.F32, output_element=EK.F16),
            REFERENCE,
        )


def test_cuda_preference_without_gpu_is_unsupported() -> None:
    if qp.cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(qp.Unsupported):
        qp.QuantizePlan.select(None, _desc(), qp.PlanPreference(backend=qp.BackendKind.CUDA))


def _good(shape=(4, 12)):  # noqa: ANN001, ANN202
    x = np.linspace(-3, 3, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    q = np.full(shape, SENTINEL, np.int8)
    return x, q, np.full((shape[0], 1), 0.05, np.float32)


def _bad_args():  # noqa: ANN202
    x, q, s = _good()
    return {
        "wrong input dtype": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x.astype(np.float64), q, s)),
        "wrong output dtype": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x, q.view(np.uint8), s)),
        "wrong input shape": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x[:, :6].copy(), q, s)),
        "wrong output shape": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x, q[:3], s)),
        "non-contiguous input": (qp.MisalignedOperand, lambda: qp.QuantizeArgs(np.asfortranarray(x), q, s)),
        "wrong scale shape": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x, q, s[:2])),
        "wrong scale dtype": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x, q, s.astype(np.float64))),
        "scalar scale for token scope": (qp.InvalidProblem, lambda: qp.QuantizeArgs(x, q, 0.1)),
        "zero point in symmetric mode": (
            qp.InvalidProblem,
            lambda: qp.QuantizeArgs(x, q, s, np.zeros((4, 1), np.int32)),
        ),
        "not an array": (qp.InvalidProblem, lambda: qp.QuantizeArgs([1.0], q, s)),
    }


@pytest.mark.parametrize("case", list(_bad_args()))
def test_run_rejects_bad_arguments_and_writes_nothing(case: str) -> None:
    error, make = _bad_args()[case]
    plan = qp.QuantizePlan.select(None, _desc(), REFERENCE)
    args = make()
    with pytest.raises(error):
        plan.can_implement(args)
    with pytest.raises(error):
        plan.run(None, None, args)
    out = args.output
    if isinstance(out, np.ndarray):
        assert (out.view(np.int8) == SENTINEL).all()


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), 1e-50])
def test_scalar_scale_must_be_finite_positive(scale: float) -> None:
    x, q, _ = _good((2, 3))
    plan = qp.QuantizePlan.select(None, _desc(shape=(2, 3), scope=qp.TensorScope()), REFERENCE)
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.QuantizeArgs(x, q, scale))
    assert (q == SENTINEL).all()


def test_asymmetric_needs_an_int32_zero_point() -> None:
    x, q, s = _good()
    plan = qp.QuantizePlan.select(None, _desc(mode=qp.QuantMode.ASYMMETRIC), REFERENCE)
    for zp in (None, np.zeros((4, 1), np.int64), np.zeros((4, 2), np.int32)):
        with pytest.raises(qp.InvalidProblem):
            plan.run(None, None, qp.QuantizeArgs(x, q, s, zp))
    tensor_plan = qp.QuantizePlan.select(None, _desc(mode=qp.QuantMode.ASYMMETRIC, scope=qp.TensorScope()), REFERENCE)
    for zp in (2.5, 2**31):
        with pytest.raises(qp.InvalidProblem):
            tensor_plan.run(None, None, qp.QuantizeArgs(x, q, 0.1, zp))
    assert (q == SENTINEL).all()
    plan.run(None, None, qp.QuantizeArgs(x, q, s, np.full((4, 1), -3, np.int32)))
    assert not (q == SENTINEL).all()


def test_workspace_checks() -> None:
    assert qp.Workspace.allocate(0) is None
    ws = qp.Workspace.allocate(16, device=False)
    assert ws is not None and ws.nbytes == 16
    check_workspace(ws, 16)
    with pytest.raises(qp.WorkspaceTooSmall):
        check_workspace(ws, 17)
    with pytest.raises(qp.WorkspaceTooSmall):
        check_workspace(None, 1)


def test_plan_reports_sku_precision_and_workspace() -> None:
    plan = qp.QuantizePlan.select(None, _desc(input_element=EK.F64), REFERENCE)
    assert plan.workspace_size() == 0
    pg = plan.precision_guarantee()
    assert pg.math_precision is qp.MathPrecision.F64 and pg.deterministic and pg.matches_reference
    sku = plan.sku()
    assert sku.category is qp.OpCategory.QUANTIZE and sku.op is qp.QuantizeKind.STATIC
    assert sku.element is EK.F64 and sku.aux_element is EK.S8 and sku.backend is qp.BackendKind.REFERENCE


def test_zero_size_and_rank_zero() -> None:
    plan = qp.QuantizePlan.select(None, _desc(shape=(0, 12)), REFERENCE)
    plan.run(
        None,
        None,
        qp.QuantizeArgs(np.zeros((0, 12), np.float32), np.zeros((0, 12), np.int8), np.zeros((0, 1), np.float32)),
    )
    scalar = qp.QuantizePlan.select(None, _desc(shape=(), scope=qp.TensorScope()), REFERENCE)
    q = np.zeros((), np.int8)
    scalar.run(None, None, qp.QuantizeArgs(np.array(2.6, np.float32), q, 0.5))
    assert int(q) == 5
