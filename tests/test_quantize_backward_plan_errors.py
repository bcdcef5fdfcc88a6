"""CPU: QuantizeBackwardPlan / DequantizeBackwardPlan truth tables (SPEC section 7) on the reference backend.

Every bad descriptor raises at ``select``; every bad argument raises a clear exception from
``can_implement`` and from ``run`` before anything runs, and ``grad_input`` is left untouched.
(Misaligned pointers and partial overlaps are only detectable for device pointers: see the GPU tests.)
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


def _qdesc(**kw: object) -> qp.QuantizeBackwardDescriptor:
    base: dict[str, object] = dict(shape=SHAPE, scope=qp.TokenScope(), input_element=EK.F32, output_element=EK.S8)
    base.update(kw)
    return qp.QuantizeBackwardDescriptor(**base)


def _ddesc(**kw: object) -> qp.DequantizeBackwardDescriptor:
    base: dict[str, object] = dict(shape=SHAPE, scope=qp.TokenScope(), input_element=EK.S8, output_element=EK.F32)
    base.update(kw)
    return qp.DequantizeBackwardDescriptor(**base)


def _x(shape: tuple[int, ...] = SHAPE, dtype: type = np.float32) -> np.ndarray:
    return np.linspace(-3, 3, int(np.prod(shape)), dtype=dtype).reshape(shape)


def _out(shape: tuple[int, ...] = SHAPE, dtype: type = np.float32) -> np.ndarray:
    return np.full(shape, SENTINEL, dtype)


def _scale(shape: tuple[int, ...] = (4, 1), dtype: type = np.float32) -> np.ndarray:
    return np.full(shape, 0.05, dtype)


def _untouched(a: np.ndarray) -> bool:
    return bool((a == SENTINEL).all())


# ---- descriptors --------------------------------------------------------------------------------


def test_descriptors_are_frozen_hashable_and_forbid_extra() -> None:
    d = _qdesc()
    assert hash(d) == hash(_qdesc()) and d.grad_shape == SHAPE and d.param_shape == (4, 1)
    with pytest.raises(qp.InvalidProblem):
        d.q_min = 0  # type: ignore[misc]
    with pytest.raises(qp.InvalidProblem):
        _qdesc(bogus=1)
    with pytest.raises(qp.InvalidProblem):
        _ddesc(q_min=-127)  # the dequantize descriptor has no code range
    assert hash(_ddesc()) == hash(_ddesc())


@pytest.mark.parametrize(
    "kw,error,match",
    [
        (dict(q_min=5, q_max=4), qp.InvalidProblem, r"q_min=5 > q_max=4"),
        (dict(q_min=-129), qp.InvalidProblem, r"outside the S8 range"),
        (dict(output_element=EK.U8, q_max=256), qp.InvalidProblem, r"outside the U8 range"),
        (dict(scope=qp.GroupScope(group_size=5)), qp.InvalidProblem, r"group_size 5 does not divide"),
        (dict(scope=qp.ChannelScope(axis=2)), qp.InvalidProblem, r"out of range for a rank-2 tensor"),
        (dict(output_element=EK.FP8_E4M3, mode=ASYM), qp.InvalidProblem, r"symmetric only"),
        (dict(output_element=EK.FP8_E5M2, q_max=10), qp.InvalidProblem, r"q_min/q_max do not apply"),
        (dict(output_element=EK.F16), qp.InvalidProblem, r"quantized element must be one of"),
        (dict(input_element=EK.S8), qp.InvalidProblem, r"float element must be one of"),
        (dict(shape=(4, -1)), qp.InvalidProblem, r"negative extent"),
        (dict(shape=(), scope=qp.TokenScope()), qp.InvalidProblem, r"rank >= 1"),
        (dict(rounding=qp.Rounding.STOCHASTIC), qp.Unsupported, r"needs rounding=NEAREST_EVEN"),
    ],
)
def test_quantize_backward_select_rejects_bad_descriptors(kw: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        qp.QuantizeBackwardPlan.select(None, _qdesc(**kw), REFERENCE)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(output_element=EK.S8), r"float element must be one of"),
        (dict(input_element=EK.F16), r"quantized element must be one of"),
        (dict(input_element=EK.FP8_E4M3, mode=ASYM), r"symmetric only"),
        (dict(scope=qp.GroupScope(axis=0, group_size=3)), r"group_size 3 does not divide"),
        (dict(shape=(-1, 2)), r"negative extent"),
    ],
)
def test_dequantize_backward_select_rejects_bad_descriptors(kw: dict[str, object], match: str) -> None:
    with pytest.raises(qp.InvalidProblem, match=match):
        qp.DequantizeBackwardPlan.select(None, _ddesc(**kw), REFERENCE)


def test_cuda_preference_without_gpu_is_unsupported() -> None:
    if qp.cuda_available():
        pytest.skip("a GPU is present")
    cuda = qp.PlanPreference(backend=qp.BackendKind.CUDA)
    with pytest.raises(qp.Unsupported, match="no CUDA GPU"):
        qp.QuantizeBackwardPlan.select(None, _qdesc(), cuda)
    with pytest.raises(qp.Unsupported, match="no CUDA GPU"):
        qp.DequantizeBackwardPlan.select(None, _ddesc(), cuda)


def test_plans_report_sku_precision_and_workspace() -> None:
    q = qp.QuantizeBackwardPlan.select(None, _qdesc(input_element=EK.F64, output_element=EK.U4), REFERENCE)
    d = qp.DequantizeBackwardPlan.select(None, _ddesc(input_element=EK.FP8_E4M3, output_element=EK.BF16), REFERENCE)
    for plan in (q, d):
        assert plan.workspace_size() == 0
        sku = plan.sku()
        assert sku.category is qp.OpCategory.GRADIENT and sku.op is qp.QuantizeKind.STATIC
        assert sku.backend is qp.BackendKind.REFERENCE
        pg = plan.precision_guarantee()
        assert pg.deterministic and pg.matches_reference and pg.bit_stable_on_same_hardware
    assert q.sku().element is EK.F64 and q.sku().aux_element is EK.U4
    assert q.precision_guarantee().math_precision is qp.MathPrecision.F64
    assert q.precision_guarantee().accumulator is EK.F64
    assert d.sku().element is EK.BF16 and d.sku().aux_element is EK.FP8_E4M3
    assert d.precision_guarantee().math_precision is qp.MathPrecision.F32


# ---- quantize backward arguments ----------------------------------------------------------------

QCase = tuple[type[Exception], str, Callable[[], qp.QuantizeBackwardArgs]]


def _qargs(**kw: object) -> qp.QuantizeBackwardArgs:
    base: dict[str, object] = dict(input=_x(), grad_output=_x(), grad_input=_out(), scale=_scale())
    base.update(kw)
    return qp.QuantizeBackwardArgs(**base)  # type: ignore[arg-type]


def _quantize_cases() -> dict[str, QCase]:
    IP, MO = qp.InvalidProblem, qp.MisalignedOperand
    x = _x()
    return {
        "wrong input shape": (IP, r"input has shape \(4, 6\)", lambda: _qargs(input=x[:, :6].copy())),
        "wrong grad_output shape": (IP, r"grad_output has shape \(2, 12\)", lambda: _qargs(grad_output=x[:2].copy())),
        "packed grad_output shape": (
            IP,
            r"grad_output has shape \(4, 6\)",
            lambda: _qargs(grad_output=_x((4, 6))),
        ),
        "wrong grad_input shape": (IP, r"grad_input has shape \(4, 11\)", lambda: _qargs(grad_input=_out((4, 11)))),
        "wrong input dtype": (IP, r"input has dtype float16; F32 needs", lambda: _qargs(input=x.astype(np.float16))),
        "wrong grad_output dtype": (
            IP,
            r"grad_output has dtype float64",
            lambda: _qargs(grad_output=x.astype(np.float64)),
        ),
        "codes as grad_output": (IP, r"grad_output has dtype int8", lambda: _qargs(grad_output=x.astype(np.int8))),
        "wrong grad_input dtype": (
            IP,
            r"grad_input has dtype float64",
            lambda: _qargs(grad_input=_out(dtype=np.float64)),
        ),
        "non-contiguous input": (MO, r"input is not C-contiguous", lambda: _qargs(input=np.asfortranarray(x))),
        "non-contiguous grad_output": (
            MO,
            r"grad_output is not C-contiguous",
            lambda: _qargs(grad_output=np.asfortranarray(x)),
        ),
        "non-contiguous grad_input": (
            MO,
            r"grad_input is not C-contiguous",
            lambda: _qargs(grad_input=np.full((12, 4), SENTINEL, np.float32).T),
        ),
        "not an array": (IP, r"input: expected a NumPy array", lambda: _qargs(input=x.tolist())),
        "missing scale": (IP, r"scale is required", lambda: _qargs(scale=None)),
        "wrong scale shape": (IP, r"scale has shape \(2, 1\)", lambda: _qargs(scale=_scale((2, 1)))),
        "wrong scale dtype": (
            IP,
            r"scale has dtype float64; this plan needs float32",
            lambda: _qargs(scale=_scale(dtype=np.float64)),
        ),
        "scalar scale for token scope": (
            IP,
            r"scale is a scalar, which only TensorScope takes",
            lambda: _qargs(scale=0.1),
        ),
        "non-contiguous scale": (
            MO,
            r"scale is not C-contiguous",
            lambda: _qargs(scale=np.full((4, 2), 0.05, np.float32)[:, :1]),
        ),
        "zero point in symmetric mode": (
            IP,
            r"zero_point must be None in SYMMETRIC mode",
            lambda: _qargs(zero_point=np.zeros((4, 1), np.int32)),
        ),
    }


@pytest.mark.parametrize("case", list(_quantize_cases()))
def test_quantize_backward_rejects_bad_arguments_and_writes_nothing(case: str) -> None:
    error, match, make = _quantize_cases()[case]
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(), REFERENCE)
    args = make()
    with pytest.raises(error, match=match):
        plan.can_implement(args)
    with pytest.raises(error, match=match):
        plan.run(None, None, args)
    if isinstance(args.grad_input, np.ndarray) and args.grad_input.dtype.kind == "f":
        assert _untouched(args.grad_input)


def _zero_point_cases() -> dict[str, tuple[qp.Scope, object, object, str]]:
    token, tensor = qp.TokenScope(), qp.TensorScope()
    s = _scale()
    return {
        "missing zero point": (token, s, None, r"zero_point is required"),
        "scalar zero point, token scope": (token, s, 3, r"zero_point is a scalar, which only TensorScope takes"),
        "int64 zero point array": (token, s, np.zeros((4, 1), np.int64), r"zero_point has dtype int64; .*needs int32"),
        "float zero point array": (token, s, np.zeros((4, 1), np.float32), r"zero_point has dtype float32"),
        "wrong zero point shape": (token, s, np.zeros((4, 2), np.int32), r"zero_point has shape \(4, 2\)"),
        "fractional scalar zero point": (tensor, 0.1, 2.5, r"zero_point=2.5 must be an integer in the int32 range"),
        "int32 overflow": (tensor, 0.1, 2**31, r"must be an integer in the int32 range"),
        "bool zero point": (tensor, 0.1, True, r"expected a NumPy array"),
    }


@pytest.mark.parametrize("case", list(_zero_point_cases()))
def test_quantize_backward_zero_point_rules(case: str) -> None:
    scope, scale, zp, match = _zero_point_cases()[case]
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(scope=scope, mode=ASYM, output_element=EK.U8), REFERENCE)
    dx = _out()
    with pytest.raises(qp.InvalidProblem, match=match):
        plan.run(None, None, qp.QuantizeBackwardArgs(_x(), _x(), dx, scale, zp))
    assert _untouched(dx)


@pytest.mark.parametrize("scale", [0.0, -0.0, -1.0, float("nan"), float("inf"), -float("inf")])
def test_scalar_scale_must_be_finite_and_positive(scale: float) -> None:
    qplan = qp.QuantizeBackwardPlan.select(None, _qdesc(scope=qp.TensorScope()), REFERENCE)
    dplan = qp.DequantizeBackwardPlan.select(None, _ddesc(scope=qp.TensorScope()), REFERENCE)
    dx, dq = _out(), _out()
    with pytest.raises(qp.InvalidProblem, match=r"a scalar scale must be finite and > 0"):
        qplan.run(None, None, qp.QuantizeBackwardArgs(_x(), _x(), dx, scale))
    with pytest.raises(qp.InvalidProblem, match=r"a scalar scale must be finite and > 0"):
        dplan.run(None, None, qp.DequantizeBackwardArgs(_x(), dq, scale))
    assert _untouched(dx) and _untouched(dq)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("scale", [1e-50, 1e39])
def test_scalar_scale_must_stay_finite_and_nonzero_in_float32(scale: float) -> None:
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(scope=qp.TensorScope()), REFERENCE)
    dx = _out()
    with pytest.raises(qp.InvalidProblem, match=r"rounds to 0 or Inf in float32"):
        plan.run(None, None, qp.QuantizeBackwardArgs(_x(), _x(), dx, scale))
    assert _untouched(dx)
    # the same scalars are fine float64 scales
    plan64 = qp.QuantizeBackwardPlan.select(None, _qdesc(scope=qp.TensorScope(), input_element=EK.F64), REFERENCE)
    dx64 = _out(dtype=np.float64)
    plan64.run(None, None, qp.QuantizeBackwardArgs(_x(dtype=np.float64), _x(dtype=np.float64), dx64, scale))
    assert not _untouched(dx64)


def test_good_arguments_pass_scalars_and_one_element_arrays() -> None:
    plan = qp.QuantizeBackwardPlan.select(
        None, _qdesc(scope=qp.TensorScope(), mode=ASYM, output_element=EK.U8), REFERENCE
    )
    for scale, zp in (
        (0.05, 0),
        (np.float32(0.05), np.int32(128)),
        (np.full((1, 1), 0.05, np.float32), np.full((1, 1), 7, np.int32)),
        (np.full((1,), 0.05, np.float32), -3),
        (0.05, 2**31 - 1),
    ):
        dx = _out()
        args = qp.QuantizeBackwardArgs(_x(), _x(), dx, scale, zp)
        assert plan.can_implement(args)
        plan.run(None, None, args)
        assert not _untouched(dx)


def test_in_place_gradient() -> None:
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(), REFERENCE)
    x, dq = _x(), _x() * 2
    expected = np.zeros_like(dq)
    plan.run(None, None, qp.QuantizeBackwardArgs(x, dq, expected, _scale()))
    plan.run(None, None, qp.QuantizeBackwardArgs(x, dq, dq, _scale()))  # grad_input is grad_output
    assert np.array_equal(dq, expected)


def test_workspace_argument_is_checked() -> None:
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(), REFERENCE)
    dx = _out()
    ws = qp.Workspace.allocate(16, device=False)
    plan.run(None, ws, qp.QuantizeBackwardArgs(_x(), _x(), dx, _scale()))  # a larger workspace is fine
    assert not _untouched(dx)


def test_zero_size_and_rank_zero() -> None:
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(shape=(0, 12)), REFERENCE)
    empty = np.zeros((0, 12), np.float32)
    plan.run(None, None, qp.QuantizeBackwardArgs(empty, empty, empty.copy(), np.zeros((0, 1), np.float32)))
    scalar = qp.QuantizeBackwardPlan.select(None, _qdesc(shape=(), scope=qp.TensorScope()), REFERENCE)
    dx = np.full((), SENTINEL, np.float32)
    scalar.run(None, None, qp.QuantizeBackwardArgs(np.array(2.6, np.float32), np.array(3.0, np.float32), dx, 0.5))
    assert float(dx) == 6.0
    dscalar = qp.DequantizeBackwardPlan.select(None, _ddesc(shape=(), scope=qp.TensorScope()), REFERENCE)
    dq = np.full((), SENTINEL, np.float32)
    dscalar.run(None, None, qp.DequantizeBackwardArgs(np.array(3.0, np.float32), dq, 0.5))
    assert float(dq) == 1.5


def test_reference_backend_refuses_foreign_arrays() -> None:
    torch = pytest.importorskip("torch")
    plan = qp.QuantizeBackwardPlan.select(None, _qdesc(), REFERENCE)
    dx = _out()
    with pytest.raises(qp.InvalidProblem, match=r"input is a Tensor; this plan runs on the REFERENCE backend"):
        plan.run(None, None, qp.QuantizeBackwardArgs(torch.from_numpy(_x()), _x(), dx, _scale()))
    assert _untouched(dx)


# ---- dequantize backward arguments ----------------------------------------------------------------


def _dargs(**kw: object) -> qp.DequantizeBackwardArgs:
    base: dict[str, object] = dict(grad_output=_x(), grad_input=_out(), scale=_scale())
    base.update(kw)
    return qp.DequantizeBackwardArgs(**base)  # type: ignore[arg-type]


DCase = tuple[type[Exception], str, Callable[[], qp.DequantizeBackwardArgs]]


def _dequantize_cases() -> dict[str, DCase]:
    IP, MO = qp.InvalidProblem, qp.MisalignedOperand
    x = _x()
    return {
        "wrong grad_output shape": (IP, r"grad_output has shape \(4, 6\)", lambda: _dargs(grad_output=_x((4, 6)))),
        "wrong grad_input shape": (IP, r"grad_input has shape \(12, 4\)", lambda: _dargs(grad_input=_out((12, 4)))),
        "codes as grad_output": (IP, r"grad_output has dtype int8", lambda: _dargs(grad_output=x.astype(np.int8))),
        "wrong grad_input dtype": (
            IP,
            r"grad_input has dtype float16",
            lambda: _dargs(grad_input=_out(dtype=np.float16)),
        ),
        "non-contiguous grad_output": (MO, r"not C-contiguous", lambda: _dargs(grad_output=np.asfortranarray(x))),
        "wrong scale shape": (IP, r"scale has shape \(4,\)", lambda: _dargs(scale=_scale((4,)))),
        "wrong scale dtype": (IP, r"scale has dtype float16", lambda: _dargs(scale=_scale(dtype=np.float16))),
        "scalar scale for token scope": (IP, r"scale is a scalar", lambda: _dargs(scale=2.0)),
        "missing scale": (IP, r"scale is required", lambda: _dargs(scale=None)),
    }


@pytest.mark.parametrize("case", list(_dequantize_cases()))
def test_dequantize_backward_rejects_bad_arguments_and_writes_nothing(case: str) -> None:
    error, match, make = _dequantize_cases()[case]
    plan = qp.DequantizeBackwardPlan.select(None, _ddesc(), REFERENCE)
    args = make()
    with pytest.raises(error, match=match):
        plan.can_implement(args)
    with pytest.raises(error, match=match):
        plan.run(None, None, args)
    if args.grad_input.dtype.kind == "f":
        assert _untouched(args.grad_input)


def test_dequantize_backward_ignores_the_codes_kind_and_runs_in_place() -> None:
    """The gradient is the same for every code kind, mode and nibble order."""
    results = []
    for kw in (
        dict(),
        dict(input_element=EK.U4, mode=ASYM, nibble_order=qp.NibbleOrder.HIGH_FIRST),
        dict(input_element=EK.FP8_E5M2),
    ):
        plan = qp.DequantizeBackwardPlan.select(None, _ddesc(**kw), REFERENCE)
        dy = _x() + 1
        plan.run(None, None, qp.DequantizeBackwardArgs(dy, dy, _scale()))  # in place
        results.append(dy)
    assert all(np.array_equal(r, results[0]) for r in results)
    assert np.array_equal(results[0], ((_x() + 1) * np.float32(0.05)).astype(np.float32))
