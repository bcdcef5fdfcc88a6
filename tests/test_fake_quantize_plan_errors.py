"""CPU: FakeQuantizePlan / FakeQuantizeBackwardPlan truth tables (SPEC section 7) on the reference backend.

Every bad input raises a clear exception before anything runs, and every output is left untouched.
(A partly overlapping output / input is only detectable for device pointers: see the GPU tests.)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from helpers import REFERENCE

import quantplan as qp
from quantplan.vocabulary.types import ElementKind as EK

SENTINEL = 77.0
SHAPE = (4, 12)
ASYM = qp.QuantMode.ASYMMETRIC


def _fields(**kw: object) -> dict[str, object]:
    base: dict[str, object] = dict(shape=SHAPE, scope=qp.TokenScope(), element=EK.F32, q_min=-128, q_max=127)
    base.update(kw)
    return base


def _desc(**kw: object) -> qp.FakeQuantizeDescriptor:
    return qp.FakeQuantizeDescriptor(**_fields(**kw))


def _bdesc(**kw: object) -> qp.FakeQuantizeBackwardDescriptor:
    return qp.FakeQuantizeBackwardDescriptor(**_fields(**kw))


def _x(shape: tuple[int, ...] = SHAPE, dtype: type = np.float32) -> np.ndarray:
    return np.linspace(-3, 3, int(np.prod(shape)), dtype=dtype).reshape(shape)


def _out(shape: tuple[int, ...] = SHAPE, dtype: type = np.float32) -> np.ndarray:
    return np.full(shape, SENTINEL, dtype)


def _scale(shape: tuple[int, ...] = (4, 1), dtype: type = np.float32) -> np.ndarray:
    return np.full(shape, 0.05, dtype)


def _untouched(*arrays: object) -> bool:
    return all(not isinstance(a, np.ndarray) or bool((a == SENTINEL).all()) for a in arrays)


# ---- descriptors ------------------------------------------------------------------------------


def test_descriptor_is_frozen_hashable_and_forbids_extra() -> None:
    d = _desc()
    assert hash(d) == hash(_desc())
    assert d.param_shape == (4, 1)
    assert _bdesc().learnable is False
    with pytest.raises(qp.InvalidProblem):
        d.q_min = 0  # type: ignore[misc]
    with pytest.raises(qp.InvalidProblem):
        qp.FakeQuantizeDescriptor(**_fields(bogus=1))
    with pytest.raises(qp.InvalidProblem):
        qp.FakeQuantizeDescriptor(**_fields(q_min=1.5))


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(q_min=5, q_max=4), r"q_min=5 > q_max=4"),
        (dict(q_min=0, q_max=2**24 + 1), r"within \+-2\*\*24"),
        (dict(q_min=-(2**24) - 1, q_max=0), r"within \+-2\*\*24"),
        (dict(element=EK.S8), r"element must be one of F16, BF16, F32, F64, got S8"),
        (dict(element=EK.FP8_E4M3), r"got FP8_E4M3"),
        (dict(shape=(4, -1)), r"negative extent"),
        (dict(scope=qp.GroupScope(group_size=5)), r"group_size 5 does not divide the extent 12"),
        (dict(scope=qp.ChannelScope(axis=2)), r"channel scope axis 2 is out of range for a rank-2 tensor"),
        (dict(scope=qp.GroupScope(axis=-3, group_size=2)), r"group scope axis -3 is out of range"),
        (dict(shape=(), scope=qp.TokenScope()), r"rank >= 1"),
    ],
)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_select_rejects_bad_descriptors(kw: dict[str, object], match: str, backward: bool) -> None:
    with pytest.raises(qp.InvalidProblem, match=match):
        if backward:
            qp.FakeQuantizeBackwardPlan.select(None, _bdesc(**kw), REFERENCE)
        else:
            qp.FakeQuantizePlan.select(None, _desc(**kw), REFERENCE)


def test_code_limit_is_inclusive() -> None:
    plan = qp.FakeQuantizePlan.select(None, _desc(q_min=-(2**24), q_max=2**24), REFERENCE)
    assert plan.problem.q_max == 2**24
    qp.FakeQuantizePlan.select(None, _desc(q_min=3, q_max=3), REFERENCE)  # a one-code range is fine


def test_learnable_needs_contiguous_segments() -> None:
    with pytest.raises(qp.Unsupported, match=r"contiguous runs"):
        qp.FakeQuantizeBackwardPlan.select(None, _bdesc(scope=qp.ChannelScope(axis=-1), learnable=True), REFERENCE)
    with pytest.raises(qp.Unsupported, match=r"contiguous runs"):
        qp.FakeQuantizeBackwardPlan.select(
            None, _bdesc(scope=qp.GroupScope(axis=0, group_size=2), learnable=True), REFERENCE
        )
    # the same scopes are fine for the straight-through backward, and where only extent-1 axes precede
    qp.FakeQuantizeBackwardPlan.select(None, _bdesc(scope=qp.ChannelScope(axis=-1)), REFERENCE)
    qp.FakeQuantizeBackwardPlan.select(
        None, _bdesc(shape=(1, 12), scope=qp.ChannelScope(axis=-1), learnable=True), REFERENCE
    )
    # an empty tensor has nothing to sum, whatever its scope
    qp.FakeQuantizeBackwardPlan.select(
        None, _bdesc(shape=(0, 12), scope=qp.ChannelScope(axis=-1), learnable=True), REFERENCE
    )


def test_cuda_preference_without_gpu_is_unsupported() -> None:
    if qp.cuda_available():
        pytest.skip("a GPU is present")
    cuda = qp.PlanPreference(backend=qp.BackendKind.CUDA)
    with pytest.raises(qp.Unsupported):
        qp.FakeQuantizePlan.select(None, _desc(), cuda)
    with pytest.raises(qp.Unsupported):
        qp.FakeQuantizeBackwardPlan.select(None, _bdesc(learnable=True), cuda)


def test_plans_report_sku_and_workspace() -> None:
    fwd = qp.FakeQuantizePlan.select(None, _desc(element=EK.BF16), REFERENCE)
    bwd = qp.FakeQuantizeBackwardPlan.select(None, _bdesc(element=EK.F64, learnable=True), REFERENCE)
    ste = qp.FakeQuantizeBackwardPlan.select(None, _bdesc(), REFERENCE)
    for plan in (fwd, bwd, ste):
        assert plan.workspace_size() == 0
        sku = plan.sku()
        assert sku.backend is qp.BackendKind.REFERENCE
        assert sku.op is qp.QuantizeKind.STATIC
        assert plan.precision_guarantee().deterministic
    assert fwd.sku().category is qp.OpCategory.FAKE_QUANTIZE and fwd.sku().element is EK.BF16
    assert bwd.sku().category is qp.OpCategory.GRADIENT and bwd.sku().element is EK.F64
    assert bwd.precision_guarantee().math_precision is qp.MathPrecision.F64
    assert fwd.precision_guarantee().math_precision is qp.MathPrecision.F32


def test_workspace_argument_is_checked() -> None:
    plan = qp.FakeQuantizePlan.select(None, _desc(), REFERENCE)
    y = _out()
    ws = qp.Workspace.allocate(16, device=False)
    plan.run(None, ws, qp.FakeQuantizeArgs(_x(), y, _scale()))  # a larger workspace than needed is fine
    assert not _untouched(y)


# ---- forward arguments ------------------------------------------------------------------------

BadCase = tuple[type[Exception], str, Callable[[], qp.FakeQuantizeArgs]]


def _forward_cases() -> dict[str, BadCase]:
    x, s = _x(), _scale()
    IP, MO = qp.InvalidProblem, qp.MisalignedOperand
    return {
        "wrong input shape": (IP, r"input has shape \(4, 6\)", lambda: qp.FakeQuantizeArgs(x[:, :6].copy(), _out(), s)),
        "wrong output shape": (IP, r"output has shape \(3, 12\)", lambda: qp.FakeQuantizeArgs(x, _out((3, 12)), s)),
        "wrong input dtype": (
            IP,
            r"input has dtype float64; F32 needs",
            lambda: qp.FakeQuantizeArgs(x.astype(np.float64), _out(), s),
        ),
        "wrong output dtype": (
            IP,
            r"output has dtype float16",
            lambda: qp.FakeQuantizeArgs(x, _out(dtype=np.float16), s),
        ),
        "non-contiguous input": (MO, r"not C-contiguous", lambda: qp.FakeQuantizeArgs(np.asfortranarray(x), _out(), s)),
        "not an array": (IP, r"expected a NumPy array", lambda: qp.FakeQuantizeArgs(x.tolist(), _out(), s)),
        "wrong scale shape": (IP, r"scale has shape \(2, 1\)", lambda: qp.FakeQuantizeArgs(x, _out(), s[:2])),
        "wrong scale dtype": (
            IP,
            r"scale has dtype float64; this plan needs float32",
            lambda: qp.FakeQuantizeArgs(x, _out(), s.astype(np.float64)),
        ),
        "missing scale": (IP, r"scale is required", lambda: qp.FakeQuantizeArgs(x, _out(), None)),
        "scalar scale for token scope": (
            IP,
            r"scale is a scalar, which only TensorScope takes",
            lambda: qp.FakeQuantizeArgs(x, _out(), 0.1),
        ),
        "zero point in symmetric mode": (
            IP,
            r"zero_point must be None in SYMMETRIC mode",
            lambda: qp.FakeQuantizeArgs(x, _out(), s, np.zeros((4, 1), np.int32)),
        ),
    }


@pytest.mark.parametrize("case", list(_forward_cases()))
def test_forward_rejects_bad_arguments_and_writes_nothing(case: str) -> None:
    error, match, make = _forward_cases()[case]
    plan = qp.FakeQuantizePlan.select(None, _desc(), REFERENCE)
    args = make()
    with pytest.raises(error, match=match):
        plan.can_implement(args)
    with pytest.raises(error, match=match):
        plan.run(None, None, args)
    assert _untouched(args.output)


def _asym_cases() -> dict[str, tuple[qp.Scope, object, object, str]]:
    """(scope, scale, zero_point, message) for an ASYMMETRIC [0, 255] plan."""
    token, tensor = qp.TokenScope(), qp.TensorScope()
    s = _scale()
    return {
        "missing zero point": (token, s, None, r"zero_point is required in ASYMMETRIC mode"),
        "scalar zero point, token scope": (token, s, 3, r"zero_point is a scalar, which only TensorScope takes"),
        "scalar float zero point, token scope": (token, s, 3.0, r"zero_point is a scalar"),
        "int64 zero point array": (token, s, np.zeros((4, 1), np.int64), r"zero_point has dtype int64; .*needs int32"),
        "uint8 zero point array": (token, s, np.zeros((4, 1), np.uint8), r"zero_point has dtype uint8"),
        "float64 zero point array": (
            token,
            s,
            np.zeros((4, 1), np.float64),
            r"zero_point has dtype float64; this plan needs float32",
        ),
        "wrong zero point shape": (token, s, np.zeros((4, 2), np.int32), r"zero_point has shape \(4, 2\)"),
        "int zero point above q_max": (tensor, 0.1, 256, r"zero_point=256 lies outside \[q_min, q_max\] = \[0, 255\]"),
        "int zero point below q_min": (tensor, 0.1, -1, r"zero_point=-1 lies outside"),
        "numpy int zero point outside": (tensor, 0.1, np.int32(300), r"zero_point=.*300.* lies outside"),
        "huge int zero point": (tensor, 0.1, 2**40, r"lies outside"),
        "bool zero point": (tensor, 0.1, True, r"expected a NumPy array"),
    }


@pytest.mark.parametrize("case", list(_asym_cases()))
def test_forward_zero_point_rules(case: str) -> None:
    scope, scale, zp, match = _asym_cases()[case]
    plan = qp.FakeQuantizePlan.select(None, _desc(scope=scope, mode=ASYM, q_min=0, q_max=255), REFERENCE)
    y = _out()
    with pytest.raises(qp.InvalidProblem, match=match):
        plan.run(None, None, qp.FakeQuantizeArgs(_x(), y, scale, zp))
    assert _untouched(y)


@pytest.mark.parametrize("scale", [0.0, -0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e-50, 1e39])
def test_scalar_scale_must_be_finite_positive_in_float32(scale: float) -> None:
    plan = qp.FakeQuantizePlan.select(None, _desc(scope=qp.TensorScope()), REFERENCE)
    y = _out()
    with pytest.raises(qp.InvalidProblem, match=r"a scalar scale must be finite and > 0 in float32"):
        plan.run(None, None, qp.FakeQuantizeArgs(_x(), y, scale))
    assert _untouched(y)
    bplan = qp.FakeQuantizeBackwardPlan.select(None, _bdesc(scope=qp.TensorScope()), REFERENCE)
    dx = _out()
    with pytest.raises(qp.InvalidProblem, match=r"a scalar scale must be finite and > 0"):
        bplan.run(None, None, qp.FakeQuantizeBackwardArgs(_x(), _x(), dx, scale))
    assert _untouched(dx)


@pytest.mark.filterwarnings("error")
def test_out_of_range_scalar_scale_is_rejected_without_a_numpy_warning() -> None:
    plan = qp.FakeQuantizePlan.select(None, _desc(scope=qp.TensorScope()), REFERENCE)
    y = _out()
    with pytest.raises(qp.InvalidProblem, match=r"finite and > 0 in float32"):
        plan.run(None, None, qp.FakeQuantizeArgs(_x(), y, 1e39))
    assert _untouched(y)


def test_f64_plan_takes_scalar_scales_of_float64_range() -> None:
    # 1e-50 and 1e39 underflow / overflow float32 but are fine float64 scales
    plan = qp.FakeQuantizePlan.select(None, _desc(scope=qp.TensorScope(), element=EK.F64), REFERENCE)
    for scale in (1e-50, 1e39):
        y = _out(dtype=np.float64)
        plan.run(None, None, qp.FakeQuantizeArgs(_x(dtype=np.float64), y, scale))
        assert not _untouched(y)
    with pytest.raises(qp.InvalidProblem, match=r"in float64"):
        plan.run(None, None, qp.FakeQuantizeArgs(_x(dtype=np.float64), _out(dtype=np.float64), 1e-400))


def test_good_arguments_pass() -> None:
    plan = qp.FakeQuantizePlan.select(None, _desc(scope=qp.TensorScope(), mode=ASYM, q_min=0, q_max=255), REFERENCE)
    for scale, zp in (
        (0.1, 0),
        (0.1, 255),
        (np.float32(0.1), np.int32(7)),
        (0.1, 300.5),
        (np.full((1,), 0.1, np.float32), -2.0),
    ):
        y = _out()
        assert plan.can_implement(qp.FakeQuantizeArgs(_x(), y, scale, zp))
        plan.run(None, None, qp.FakeQuantizeArgs(_x(), y, scale, zp))
        assert not _untouched(y)


# ---- backward arguments -----------------------------------------------------------------------

BackCase = tuple[qp.FakeQuantizeBackwardDescriptor, str, dict[str, object]]


def _backward_cases() -> dict[str, BackCase]:
    x, s = _x(), _scale()
    ste, ste_asym = _bdesc(), _bdesc(mode=ASYM, q_min=0, q_max=255)
    lsq, lsq_asym = _bdesc(learnable=True), _bdesc(learnable=True, mode=ASYM, q_min=0, q_max=255)
    zp = np.full((4, 1), 3, np.int32)
    return {
        "wrong input shape": (ste, r"input has shape \(4, 6\)", dict(input=x[:, :6].copy())),
        "wrong grad_output shape": (ste, r"grad_output has shape \(2, 12\)", dict(grad_output=x[:2].copy())),
        "wrong grad_input shape": (ste, r"grad_input has shape \(4, 11\)", dict(grad_input=_out((4, 11)))),
        "wrong input dtype": (ste, r"input has dtype float16", dict(input=x.astype(np.float16))),
        "wrong grad_output dtype": (ste, r"grad_output has dtype float64", dict(grad_output=x.astype(np.float64))),
        "wrong grad_input dtype": (ste, r"grad_input has dtype float64", dict(grad_input=_out(dtype=np.float64))),
        "wrong scale dtype": (ste, r"scale has dtype float64", dict(scale=s.astype(np.float64))),
        "scalar scale for token scope": (ste, r"scale is a scalar", dict(scale=0.5)),
        "zero point in symmetric mode": (ste, r"zero_point must be None in SYMMETRIC mode", dict(zero_point=zp)),
        "missing zero point": (ste_asym, r"zero_point is required in ASYMMETRIC mode", dict()),
        "grad_scale for a non-learnable plan": (
            ste,
            r"grad_scale / grad_zero_point are written by learnable plans only",
            dict(grad_scale=_out((4, 1))),
        ),
        "grad_zero_point for a non-learnable plan": (
            ste_asym,
            r"written by learnable plans only",
            dict(zero_point=zp, grad_zero_point=_out((4, 1))),
        ),
        "learnable: missing grad_scale": (lsq, r"grad_scale is required: an array of shape \(4, 1\)", dict()),
        "learnable: missing grad_zero_point": (
            lsq_asym,
            r"grad_zero_point is required",
            dict(zero_point=zp, grad_scale=_out((4, 1))),
        ),
        "learnable: grad_zero_point in symmetric mode": (
            lsq,
            r"grad_zero_point must be None in SYMMETRIC mode",
            dict(grad_scale=_out((4, 1)), grad_zero_point=_out((4, 1))),
        ),
        "learnable: wrong grad_scale shape": (lsq, r"grad_scale has shape \(4,\)", dict(grad_scale=_out((4,)))),
        "learnable: wrong grad_scale dtype": (
            lsq,
            r"grad_scale has dtype float64; this plan needs float32",
            dict(grad_scale=_out((4, 1), np.float64)),
        ),
        "learnable: wrong grad_zero_point dtype": (
            lsq_asym,
            r"grad_zero_point has dtype float16",
            dict(zero_point=zp, grad_scale=_out((4, 1)), grad_zero_point=_out((4, 1), np.float16)),
        ),
        "learnable: nan grad_factor": (
            lsq,
            r"grad_factor=nan must be finite",
            dict(grad_scale=_out((4, 1)), grad_factor=float("nan")),
        ),
        "learnable: inf grad_factor": (
            lsq,
            r"grad_factor=-inf must be finite",
            dict(grad_scale=_out((4, 1)), grad_factor=-float("inf")),
        ),
    }


def _backward_args(**kw: object) -> qp.FakeQuantizeBackwardArgs:
    base: dict[str, object] = dict(input=_x(), grad_output=_x(), grad_input=_out(), scale=_scale())
    base.update(kw)
    return qp.FakeQuantizeBackwardArgs(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", list(_backward_cases()))
def test_backward_rejects_bad_arguments_and_writes_nothing(case: str) -> None:
    desc, match, kw = _backward_cases()[case]
    plan = qp.FakeQuantizeBackwardPlan.select(None, desc, REFERENCE)
    args = _backward_args(**kw)
    with pytest.raises(qp.InvalidProblem, match=match):
        plan.can_implement(args)
    with pytest.raises(qp.InvalidProblem, match=match):
        plan.run(None, None, args)
    assert _untouched(args.grad_input, args.grad_scale, args.grad_zero_point)


def test_learnable_takes_array_parameters_only() -> None:
    """Scalar scale / zero point are refused by learnable plans (the gradients are per-parameter arrays)."""
    sym = qp.FakeQuantizeBackwardPlan.select(None, _bdesc(scope=qp.TensorScope(), learnable=True), REFERENCE)
    asym = qp.FakeQuantizeBackwardPlan.select(
        None, _bdesc(scope=qp.TensorScope(), learnable=True, mode=ASYM, q_min=0, q_max=255), REFERENCE
    )
    one = np.full((1, 1), 0.5, np.float32)
    cases = [
        (sym, dict(scale=0.5)),
        (sym, dict(scale=np.float32(0.5))),
        (asym, dict(scale=0.5, zero_point=np.full((1, 1), 3.0, np.float32))),
        (asym, dict(scale=one, zero_point=3)),
        (asym, dict(scale=one, zero_point=3.0)),
    ]
    for plan, kw in cases:
        gs, gz = _out((1, 1)), _out((1, 1))
        args = _backward_args(grad_scale=gs, grad_zero_point=gz if plan is asym else None, **kw)
        with pytest.raises(qp.InvalidProblem, match=r"learnable plans take scale \(and zero_point\) as arrays"):
            plan.run(None, None, args)
        assert _untouched(args.grad_input, gs, gz)
    gs, gz = _out((1, 1)), _out((1, 1))
    args = _backward_args(scale=one, zero_point=np.full((1, 1), 3.0, np.float32), grad_scale=gs, grad_zero_point=gz)
    asym.run(None, None, args)
    assert not _untouched(args.grad_input) and not _untouched(gs) and not _untouched(gz)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_grad_factor_must_be_finite_in_the_arithmetic_type() -> None:
    plan = qp.FakeQuantizeBackwardPlan.select(None, _bdesc(learnable=True), REFERENCE)
    args = _backward_args(grad_scale=_out((4, 1)), grad_factor=1e39)
    with pytest.raises(qp.InvalidProblem, match=r"grad_factor"):
        plan.run(None, None, args)
    assert _untouched(args.grad_input, args.grad_scale)


def test_backward_in_place_and_good_arguments_pass() -> None:
    plan = qp.FakeQuantizeBackwardPlan.select(None, _bdesc(learnable=True), REFERENCE)
    dy = _x()
    gs = _out((4, 1))
    args = qp.FakeQuantizeBackwardArgs(_x(), dy, dy, _scale(), grad_scale=gs, grad_factor=0.5)
    assert plan.can_implement(args)
    plan.run(None, None, args)
    assert not _untouched(gs)
