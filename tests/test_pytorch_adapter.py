"""quantplan.pytorch: autograd functions and modules for QAT on CPU (reference backend) and CUDA.

CPU: forward and gradients equal PyTorch's fake-quant ops bit for bit (per tensor, per channel,
learnable per tensor / per channel; LSQ parameter gradients to float32 rounding), the other
dtypes and scopes equal the reference plans, non-contiguous inputs, plan caching, modules in a
model that trains, dynamic-range fake quantization (nearest, reproducible stochastic), errors.
GPU (marked ``gpu``): the same on CUDA tensors, the current non-default PyTorch stream, CUDA
graph capture of forward + backward, workspaces allocated through PyTorch.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import quantplan as qp  # noqa: E402
import quantplan.pytorch as qpt  # noqa: E402
from quantplan import reference  # noqa: E402
from quantplan.runtime._layout import expand_params  # noqa: E402
from quantplan.vocabulary.elements import ELEMENTS  # noqa: E402
from quantplan.vocabulary.types import ElementKind as EK  # noqa: E402

REFERENCE = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)
TORCH_DTYPES = {EK.F16: torch.float16, EK.BF16: torch.bfloat16, EK.F32: torch.float32, EK.F64: torch.float64}
SHAPES = [(37, 203), (5, 7, 31), (129, 3), (1031,)]


def gpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A GPU test: the repo's ``gpu`` mark (skipped without CuPy's device) and PyTorch's CUDA."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")
    return pytest.mark.gpu(skip(fn))  # type: ignore[no-any-return]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = None, device: str = "cpu") -> Any:
    """Fresh normal data, magnitudes spread over a few decades; every 17th-ish value on the grid
    (k + 0.5) / 16, so a power-of-two scale such as 1/16 meets exact ties (x * inv = k + 0.5)."""
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-1, 2, size=shape[:1] + (1,) * (len(shape) - 1)))
    flat = x.reshape(-1)
    flat[:: max(1, flat.size // 17)] = (rng.integers(-40, 40, size=flat[:: max(1, flat.size // 17)].size) + 0.5) / 16
    t = torch.from_numpy(x.astype(np.float32)).to(device)
    return t if dtype is None else t.to(dtype)


def _bits(t: Any) -> Any:
    t = t.detach()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_bits(ours: Any, theirs: Any, what: str) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape)
    same = _bits(ours) == _bits(theirs)
    if not bool(same.all()):
        i = int((~same).reshape(-1).nonzero()[0])
        a, b = ours.detach().reshape(-1)[i].item(), theirs.detach().reshape(-1)[i].item()
        pytest.fail(f"{what}: {int((~same).sum())} elements differ; first at flat index {i}: {a!r} vs {b!r}")


def _grads(y: Any, inputs: tuple[Any, ...], dy: Any) -> tuple[Any, ...]:
    return torch.autograd.grad(y, inputs, dy)


# ---- import rules ------------------------------------------------------------------------------------


def test_quantplan_does_not_import_torch_and_adapter_needs_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "import quantplan\n"
        "assert 'quantplan.pytorch' not in sys.modules\n"
        "try:\n"
        "    import quantplan.pytorch\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "quantplan.pytorch needs PyTorch: pip install torch" in out


# ---- static fake quantization on the CPU ---------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize(
    "params", [(0.0173, 131, 0, 255), (0.05, 0, -128, 127), (0.3, -3, -8, 7), (0.0625, 5, -128, 127)], ids=str
)
def test_per_tensor_matches_torch_cpu(rng: np.random.Generator, shape: tuple[int, ...], params: tuple) -> None:
    scale, zp, q_min, q_max = params
    x = _data(rng, shape).requires_grad_(True)
    dy = _data(rng, shape)
    y_t = torch.fake_quantize_per_tensor_affine(x, scale, zp, q_min, q_max)
    y = qpt.fake_quantize(x, scale, zp, q_min, q_max)
    _assert_bits(y, y_t, "forward")
    _assert_bits(_grads(y, (x,), dy)[0], _grads(y_t, (x,), dy)[0], "STE gradient")
    # tensor parameters (one-element float32 scale, int32 zero point), as PyTorch's tensor overload
    s_t, z_t = torch.tensor([scale]), torch.tensor([zp], dtype=torch.int32)
    y2 = qpt.fake_quantize(x, s_t, z_t, q_min, q_max)
    _assert_bits(y2, torch.fake_quantize_per_tensor_affine(x, s_t, z_t, q_min, q_max), "forward, tensor params")


def test_per_tensor_symmetric_is_zero_point_zero(rng: np.random.Generator) -> None:
    x = _data(rng, (61, 77))
    y = qpt.fake_quantize(x, 0.021, None, -127, 127)
    _assert_bits(y, torch.fake_quantize_per_tensor_affine(x, 0.021, 0, -127, 127), "symmetric forward")


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("shape", [(43, 131), (5, 17, 23)], ids=str)
def test_per_channel_matches_torch_cpu(rng: np.random.Generator, axis: int, shape: tuple[int, ...]) -> None:
    x = _data(rng, shape).requires_grad_(True)
    dy = _data(rng, shape)
    channels = shape[axis]
    scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=channels)).astype(np.float32))
    zp = torch.from_numpy(rng.integers(-128, 128, size=channels).astype(np.int32))
    y_t = torch.fake_quantize_per_channel_affine(x, scale, zp, axis % len(shape), -128, 127)
    y = qpt.fake_quantize(x, scale, zp, -128, 127, qp.ChannelScope(axis=axis))
    _assert_bits(y, y_t, "forward")
    _assert_bits(_grads(y, (x,), dy)[0], _grads(y_t, (x,), dy)[0], "STE gradient")
    # int64 zero points (what some observers hold) are cast to int32
    y64 = qpt.fake_quantize(x, scale, zp.long(), -128, 127, qp.ChannelScope(axis=axis))
    _assert_bits(y64, y_t, "forward, int64 zero point")


SCOPES = [
    (qp.TokenScope(), (5, 7, 31)),
    (qp.GroupScope(axis=-1, group_size=7), (19, 105)),
    (qp.GroupScope(axis=0, group_size=3), (39, 45)),
    (qp.ChannelScope(axis=1), (3, 17, 5)),
]


def _reference_forward_and_ste(x: Any, dy: Any, scale: Any, zp: Any, scope: qp.Scope, q_min: int, q_max: int) -> tuple:
    """The reference plans on NumPy copies (bfloat16 through ml_dtypes)."""
    kind = {v: k for k, v in TORCH_DTYPES.items()}[x.dtype]
    npd = ELEMENTS[kind].numpy_dtype
    xn = x.detach().double().numpy().astype(npd)
    dyn = dy.double().numpy().astype(npd)
    mode = qp.QuantMode.SYMMETRIC if zp is None else qp.QuantMode.ASYMMETRIC
    fields = dict(shape=tuple(x.shape), scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max)
    sn = scale.numpy().reshape(qp.FakeQuantizeDescriptor(**fields).param_shape)
    zn = None if zp is None else zp.numpy().reshape(sn.shape)
    y, dx = np.zeros_like(xn), np.zeros_like(xn)
    qp.FakeQuantizePlan.select(None, qp.FakeQuantizeDescriptor(**fields), REFERENCE).run(
        None, None, qp.FakeQuantizeArgs(xn, y, sn, zn)
    )
    qp.FakeQuantizeBackwardPlan.select(None, qp.FakeQuantizeBackwardDescriptor(**fields), REFERENCE).run(
        None, None, qp.FakeQuantizeBackwardArgs(xn, dyn, dx, sn, zn)
    )
    return torch.from_numpy(y.astype(np.float64)).to(x.dtype), torch.from_numpy(dx.astype(np.float64)).to(x.dtype)


@pytest.mark.parametrize("kind", [EK.F16, EK.BF16, EK.F32, EK.F64], ids=lambda k: k.name)
@pytest.mark.parametrize("case", range(len(SCOPES)))
def test_other_scopes_and_dtypes_match_reference_cpu(rng: np.random.Generator, kind: EK, case: int) -> None:
    scope, shape = SCOPES[case]
    x = _data(rng, shape, TORCH_DTYPES[kind]).requires_grad_(True)
    dy = _data(rng, shape, TORCH_DTYPES[kind])
    pshape = qp.FakeQuantizeDescriptor(
        shape=shape, scope=scope, element=kind, mode=qp.QuantMode.ASYMMETRIC, q_min=0, q_max=255
    ).param_shape
    pdtype = np.float64 if kind is EK.F64 else np.float32
    scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=pshape)).astype(pdtype))
    zp = torch.from_numpy(rng.integers(0, 256, size=pshape).astype(np.int32))
    y = qpt.fake_quantize(x, scale.reshape(-1), zp.reshape(-1), 0, 255, scope)  # flat parameters are reshaped
    (dx,) = _grads(y, (x,), dy)
    y_ref, dx_ref = _reference_forward_and_ste(x, dy, scale, zp, scope, 0, 255)
    _assert_bits(y, y_ref, "forward")
    _assert_bits(dx, dx_ref, "STE gradient")


def test_non_contiguous_input_is_made_contiguous(rng: np.random.Generator) -> None:
    base = _data(rng, (64, 48))
    xt = base.t().requires_grad_(True)  # (48, 64), not contiguous
    scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=48)).astype(np.float32))
    y = qpt.fake_quantize(xt, scale, None, -128, 127, qp.ChannelScope(axis=0))
    y_c = qpt.fake_quantize(xt.detach().contiguous(), scale, None, -128, 127, qp.ChannelScope(axis=0))
    assert y.is_contiguous()
    _assert_bits(y, y_c, "non-contiguous forward")
    dy = _data(rng, (64, 48)).t()  # a non-contiguous gradient too
    zeros = torch.zeros(48, dtype=torch.int32)
    x_t = xt.detach().clone().requires_grad_(True)
    y_t = torch.fake_quantize_per_channel_affine(x_t, scale, zeros, 0, -128, 127)
    _assert_bits(y, y_t, "forward vs torch")
    _assert_bits(_grads(y, (xt,), dy)[0], _grads(y_t, (x_t,), dy)[0], "STE gradient")


def test_empty_and_scalar_tensors() -> None:
    x = torch.zeros(0, 5, requires_grad=True)
    y = qpt.fake_quantize(x, 0.1)
    y.sum().backward()
    assert y.shape == (0, 5) and x.grad is not None and x.grad.shape == (0, 5)
    s = torch.tensor(1.234, requires_grad=True)
    y0 = qpt.fake_quantize(s, 0.1, 2)
    _assert_bits(y0, torch.fake_quantize_per_tensor_affine(s, 0.1, 2, -128, 127), "0-d forward")


def test_plans_are_cached(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    qpt.clear_plan_cache()
    calls: list[Any] = []
    real = qp.FakeQuantizePlan.select.__func__  # type: ignore[attr-defined]

    def counting(cls: Any, stream: Any, desc: Any, pref: Any = None) -> Any:
        calls.append(desc)
        return real(cls, stream, desc, pref)

    monkeypatch.setattr(qp.FakeQuantizePlan, "select", classmethod(counting))
    x = _data(rng, (16, 40))
    for _ in range(3):
        qpt.fake_quantize(x, 0.1, 3, 0, 255)
    assert len(calls) == 1
    qpt.fake_quantize(x, 0.2, 7, 0, 255)  # other parameter values: same plan
    assert len(calls) == 1
    qpt.fake_quantize(_data(rng, (16, 41)), 0.1, 3, 0, 255)  # another shape: a new plan
    qpt.fake_quantize(x, 0.1, None, -128, 127)  # another mode and range: a new plan
    assert len(calls) == 3
    qpt.clear_plan_cache()
    qpt.fake_quantize(x, 0.1, 3, 0, 255)
    assert len(calls) == 4


def test_errors_are_clear(rng: np.random.Generator) -> None:
    x = _data(rng, (8, 12))
    with pytest.raises(qp.InvalidProblem, match="dtype torch.int32"):
        qpt.fake_quantize(x.to(torch.int32), 0.1)
    with pytest.raises(qp.InvalidProblem, match="scale has 5 elements"):
        qpt.fake_quantize(x, torch.ones(5), None, -128, 127, qp.ChannelScope(axis=1))
    with pytest.raises(qp.InvalidProblem, match="scale"):
        qpt.fake_quantize(x, -1.0)
    with pytest.raises(qp.InvalidProblem, match="q_min"):
        qpt.fake_quantize(x, 0.1, None, 5, 4)
    with pytest.raises(qp.InvalidProblem, match="'meta' device"):
        qpt.fake_quantize(torch.empty(3, 4, device="meta"), 0.1)


# ---- learnable (LSQ) on the CPU ------------------------------------------------------------------------


def _tie_free(
    rng: np.random.Generator, shape: tuple[int, ...], scope: qp.Scope, q_min: int, q_max: int, symmetric: bool
) -> tuple[Any, Any, Any]:
    """``(x, scale, zero_point)`` (float32; parameters flat, zero point None if symmetric) with every
    ``x * inv`` at least 0.1 from a half-integer: PyTorch's learnable backward rounds
    ``zp + x * inv`` (an inexact float sum) where we round ``x * inv`` and add ``zp``, which can
    move a near-tie by one step and its dscale term by ``dy * gf``; away from ties both agree.
    Codes land inside and up to 20 steps outside ``[q_min, q_max]``."""
    pshape = qp.FakeQuantizeDescriptor(shape=shape, scope=scope, element=EK.F32, q_min=q_min, q_max=q_max).param_shape
    scale = np.exp(rng.uniform(-4, -1, size=pshape)).astype(np.float32)
    zp = (
        np.zeros(pshape, np.float32)
        if symmetric
        else rng.integers(q_min + 10, q_max - 9, size=pshape).astype(np.float32)
    )
    k = rng.integers(q_min - 20, q_max + 21, size=shape)
    v = k - expand_params(zp, shape, scope) + rng.uniform(-0.4, 0.4, size=shape)
    x = (v * expand_params(scale, shape, scope)).astype(np.float32)
    z = None if symmetric else torch.from_numpy(zp.reshape(-1))
    return torch.from_numpy(x), torch.from_numpy(scale.reshape(-1)), z


def _assert_param_grads(
    ours: tuple[Any, ...],
    theirs: tuple[Any, ...],
    x: Any,
    dy: Any,
    scale: Any,
    zp: Any,
    scope: qp.Scope,
    q_min: int,
    q_max: int,
    gf: float,
) -> None:
    """dscale (and dzero_point) within rtol 1e-4 of PyTorch's, plus 1e-6 of the segment's sum of
    |terms| (PyTorch sums float32 terms in float32, we sum in float64 and round once)."""
    shape = tuple(x.shape)
    pshape = qp.FakeQuantizeDescriptor(shape=shape, scope=scope, element=EK.F32, q_min=q_min, q_max=q_max).param_shape
    se = expand_params(scale.detach().cpu().numpy().reshape(pshape), shape, scope)
    ze = 0 if zp is None else expand_params(zp.detach().cpu().numpy().reshape(pshape), shape, scope)
    xn, dyn = x.detach().cpu().numpy(), dy.cpu().numpy()
    _, terms_s, terms_z = reference.fake_quantize_lsq_terms(xn, dyn, se, ze, q_min, q_max, gf, qp.MathPrecision.F32)
    for name, a, b, terms in zip(("dscale", "dzero_point"), ours, theirs, (terms_s, terms_z), strict=False):
        assert a.shape == b.shape and a.dtype == b.dtype, (name, a.shape, b.shape)
        mag = reference.reduce_segments(np.abs(terms.astype(np.float64)), scope, np.add, 0.0).reshape(-1)
        a64, b64 = a.detach().cpu().double().numpy().reshape(-1), b.detach().cpu().double().numpy().reshape(-1)
        err, tol = np.abs(a64 - b64), 1e-4 * np.abs(b64) + 1e-6 * mag + 1e-30
        assert np.all(err <= tol), f"{name}: worst {np.max(err / tol):.3g}x the tolerance; ours {a64}, torch {b64}"
        assert np.any(b64 != 0), f"{name} is all zero: the case does not exercise it"


@pytest.mark.parametrize("shape", [(257, 131), (3, 5000)], ids=str)
@pytest.mark.parametrize("symmetric", [False, True])
def test_learnable_per_tensor_matches_torch_cpu(rng: np.random.Generator, shape: tuple, symmetric: bool) -> None:
    q_min, q_max = (-128, 127) if symmetric else (0, 255)
    x, scale, zp = _tie_free(rng, shape, qp.TensorScope(), q_min, q_max, symmetric)
    x.requires_grad_(True)
    scale.requires_grad_(True)
    zp_t = (torch.zeros(1) if zp is None else zp).requires_grad_(True)
    dy = _data(rng, shape)
    gf = 1.0 / math.sqrt(x.numel() * q_max)
    y_t = torch._fake_quantize_learnable_per_tensor_affine(x, scale, zp_t, q_min, q_max, gf)
    dx_t, ds_t, dz_t = _grads(y_t, (x, scale, zp_t), dy)
    if symmetric:
        y = qpt.fake_quantize_learnable(x, scale, None, q_min, q_max, grad_factor=gf)
        dx, *params = _grads(y, (x, scale), dy)
    else:
        y = qpt.fake_quantize_learnable(x, scale, zp_t, q_min, q_max, grad_factor=gf)
        dx, *params = _grads(y, (x, scale, zp_t), dy)
    _assert_bits(y, y_t, "forward")
    _assert_bits(dx, dx_t, "dx")
    _assert_param_grads(tuple(params), (ds_t, dz_t), x, dy, scale, zp, qp.TensorScope(), q_min, q_max, gf)


@pytest.mark.parametrize("axis,shape", [(0, (48, 75)), (1, (6, 24, 33)), (-1, (40, 21))], ids=str)
def test_learnable_per_channel_matches_torch_cpu(rng: np.random.Generator, axis: int, shape: tuple) -> None:
    """Axis 0 sums contiguous rows; axes 1 and -1 take the moved-axis path of the backward."""
    scope = qp.ChannelScope(axis=axis)
    x, scale, zp = _tie_free(rng, shape, scope, -128, 127, False)
    for t in (x, scale, zp):
        t.requires_grad_(True)
    dy = _data(rng, shape)
    gf = 0.37
    y_t = torch._fake_quantize_learnable_per_channel_affine(x, scale, zp, axis % len(shape), -128, 127, gf)
    dx_t, ds_t, dz_t = _grads(y_t, (x, scale, zp), dy)
    y = qpt.fake_quantize_learnable(x, scale, zp, -128, 127, scope, gf)
    dx, ds, dz = _grads(y, (x, scale, zp), dy)
    _assert_bits(y, y_t, "forward")
    _assert_bits(dx, dx_t, "dx")
    _assert_param_grads((ds, dz), (ds_t, dz_t), x, dy, scale, zp, scope, -128, 127, gf)


@pytest.mark.parametrize(
    "scope,shape",
    [
        (qp.GroupScope(axis=0, group_size=4), (12, 9)),
        (qp.GroupScope(axis=-1, group_size=5), (7, 30)),
        (qp.TokenScope(), (4, 6, 11)),
    ],
    ids=str,
)
def test_learnable_group_and_token_match_reference_cpu(rng: np.random.Generator, scope: qp.Scope, shape: tuple) -> None:
    x = _data(rng, shape).requires_grad_(True)
    dy = _data(rng, shape)
    pshape = qp.FakeQuantizeDescriptor(shape=shape, scope=scope, element=EK.F32, q_min=0, q_max=15).param_shape
    scale = torch.from_numpy(np.exp(rng.uniform(-3, 0, size=pshape)).astype(np.float32)).requires_grad_(True)
    zp = torch.from_numpy(rng.uniform(-2, 17, size=pshape).astype(np.float32)).requires_grad_(True)
    y = qpt.fake_quantize_learnable(x, scale, zp, 0, 15, scope, 0.5)
    dx, ds, dz = _grads(y, (x, scale, zp), dy)
    xn, dyn = x.detach().numpy(), dy.numpy()
    se = expand_params(scale.detach().numpy(), shape, scope)
    ze = expand_params(zp.detach().numpy(), shape, scope)
    y_ref = reference.fake_quantize(xn, se, ze, 0, 15, qp.MathPrecision.F32)
    dx_ref, ds_ref, dz_ref = reference.fake_quantize_lsq(xn, dyn, se, ze, 0, 15, 0.5, scope, qp.MathPrecision.F32)
    _assert_bits(y, torch.from_numpy(y_ref), "forward")
    _assert_bits(dx, torch.from_numpy(dx_ref), "dx")
    torch.testing.assert_close(ds, torch.from_numpy(ds_ref.reshape(pshape)), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(dz, torch.from_numpy(dz_ref.reshape(pshape)), rtol=1e-5, atol=1e-7)


def test_learnable_only_x_needs_grad_uses_ste(rng: np.random.Generator) -> None:
    x = _data(rng, (33, 70)).requires_grad_(True)
    dy = _data(rng, (33, 70))
    scale, zp = torch.tensor([0.02]), torch.tensor([3.0])  # no grad wanted
    (dx,) = _grads(qpt.fake_quantize_learnable(x, scale, zp, -128, 127), (x,), dy)
    (dx_t,) = _grads(torch.fake_quantize_per_tensor_affine(x, 0.02, 3, -128, 127), (x,), dy)
    _assert_bits(dx, dx_t, "dx")


# ---- modules ----------------------------------------------------------------------------------------


def test_modules_train_one_step_in_a_sequential() -> None:
    torch.manual_seed(0)
    weight_fq = qpt.LearnableFakeQuantize(
        torch.full((8,), 0.02), None, q_min=-127, q_max=127, scope=qp.ChannelScope(axis=0), grad_factor=None
    )

    class QLinear(torch.nn.Linear):
        def forward(self, x: Any) -> Any:
            return torch.nn.functional.linear(x, weight_fq(self.weight), self.bias)

    act_fq = qpt.LearnableFakeQuantize(0.004, 128.0, q_min=0, q_max=255)  # some codes clamp
    model = torch.nn.Sequential(
        qpt.FakeQuantize(0.05, 0, q_min=-128, q_max=127),
        QLinear(16, 8),
        act_fq,
        torch.nn.ReLU(),
        qpt.DynamicFakeQuantize(8, group_size=4),
        torch.nn.Linear(8, 1),
    )
    opt = torch.optim.Adam([*model.parameters(), *weight_fq.parameters()], lr=1e-2)  # every parameter moves
    x, target = torch.randn(32, 16), torch.randn(32, 1)
    before = [p.detach().clone() for p in (act_fq.scale, act_fq.zero_point, weight_fq.scale)]
    loss0 = torch.nn.functional.mse_loss(model(x), target)
    opt.zero_grad()
    loss0.backward()
    for p in (act_fq.scale, act_fq.zero_point, weight_fq.scale, model[1].weight):
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and p.grad.shape == p.shape
    assert float(act_fq.scale.grad.abs().sum()) > 0 and float(weight_fq.scale.grad.abs().sum()) > 0
    opt.step()
    after = [act_fq.scale, act_fq.zero_point, weight_fq.scale]
    assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    loss1 = torch.nn.functional.mse_loss(model(x), target)
    assert loss1.item() < loss0.item()


def test_fake_quantize_module_buffers_and_state_dict(rng: np.random.Generator) -> None:
    scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=12)).astype(np.float32))
    zp = torch.from_numpy(rng.integers(0, 256, size=12))  # int64: stored as int32
    fq = qpt.FakeQuantize(scale, zp, q_min=0, q_max=255, scope=qp.ChannelScope(axis=1))
    assert fq.zero_point.dtype == torch.int32 and "channel(axis=1)" in repr(fq)
    x = _data(rng, (9, 12))
    _assert_bits(fq(x), torch.fake_quantize_per_channel_affine(x, scale, zp.int(), 1, 0, 255), "module forward")
    other = qpt.FakeQuantize(
        torch.ones(12), torch.zeros(12, dtype=torch.int32), q_min=0, q_max=255, scope=qp.ChannelScope(axis=1)
    )
    other.load_state_dict(fq.state_dict())
    _assert_bits(other(x), fq(x), "after load_state_dict")
    fq.set_qparams(scale * 2, zp.int())
    _assert_bits(fq(x), torch.fake_quantize_per_channel_affine(x, scale * 2, zp.int(), 1, 0, 255), "set_qparams")
    fq.enabled = False
    assert fq(x) is x


def test_learnable_module_parameters() -> None:
    m = qpt.LearnableFakeQuantize(0.1, 3.0, q_min=0, q_max=15, scope=qp.ChannelScope(axis=0), num_channels=4)
    assert m.scale.shape == (4,) and m.zero_point is not None and m.zero_point.shape == (4,)
    assert {n for n, _ in m.named_parameters()} == {"scale", "zero_point"}
    sym = qpt.LearnableFakeQuantize([0.1, 0.2])
    assert sym.zero_point is None and sym.scale.dtype == torch.float32
    with pytest.raises(qp.InvalidProblem, match="num_channels"):
        qpt.LearnableFakeQuantize([0.1, 0.2], num_channels=3)


# ---- dynamic-range fake quantization -------------------------------------------------------------------


def _dynamic_plan_output(
    x: Any,
    bits: int,
    mode: qp.QuantMode,
    scope: qp.Scope,
    rounding: qp.Rounding,
    seed: int | None = None,
    offset: int | None = None,
) -> Any:
    """The plan run directly (REFERENCE for CPU tensors, CUDA for CUDA tensors)."""
    from quantplan.ops.dynamic_fake_quantize import (
        DynamicRangeFakeQuantizeArgs,
        DynamicRangeFakeQuantizeDescriptor,
        DynamicRangeFakeQuantizePlan,
    )

    kind = {v: k for k, v in TORCH_DTYPES.items()}[x.dtype]
    desc = DynamicRangeFakeQuantizeDescriptor(
        shape=tuple(x.shape), scope=scope, mode=mode, element=kind, bits=bits, rounding=rounding
    )
    if x.is_cuda:
        plan = DynamicRangeFakeQuantizePlan.select(None, desc, qp.PlanPreference(backend=qp.BackendKind.CUDA))
        y = torch.empty_like(x)
        ws = qp.Workspace.allocate(plan.workspace_size())
        plan.run(None, ws, DynamicRangeFakeQuantizeArgs(x, y, rng_seed=seed, rng_offset=offset))
        torch.cuda.synchronize()
        return y
    plan = DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE)
    npd = ELEMENTS[kind].numpy_dtype
    xn = x.double().numpy().astype(npd)
    yn = np.zeros_like(xn)
    plan.run(None, None, DynamicRangeFakeQuantizeArgs(xn, yn, rng_seed=seed, rng_offset=offset))
    return torch.from_numpy(yn.astype(np.float64)).to(x.dtype)


DYNAMIC_CASES = [
    (8, qp.QuantMode.SYMMETRIC, qp.TensorScope(), (37, 203)),
    (4, qp.QuantMode.ASYMMETRIC, qp.GroupScope(axis=-1, group_size=7), (19, 105)),
    (3, qp.QuantMode.SYMMETRIC, qp.TokenScope(), (5, 7, 31)),
    (6, qp.QuantMode.ASYMMETRIC, qp.ChannelScope(axis=1), (64, 33)),
]


@pytest.mark.parametrize("case", range(len(DYNAMIC_CASES)))
@pytest.mark.parametrize("kind", [EK.BF16, EK.F32], ids=lambda k: k.name)
def test_dynamic_nearest_equals_plan_cpu(rng: np.random.Generator, case: int, kind: EK) -> None:
    bits, mode, scope, shape = DYNAMIC_CASES[case]
    x = _data(rng, shape, TORCH_DTYPES[kind]).requires_grad_(True)
    y = qpt.dynamic_fake_quantize(x, bits, mode, scope)
    _assert_bits(y, _dynamic_plan_output(x.detach(), bits, mode, scope, qp.Rounding.NEAREST_EVEN), "dynamic forward")
    dy = _data(rng, shape, TORCH_DTYPES[kind])
    _assert_bits(_grads(y, (x,), dy)[0], dy, "identity gradient")


def test_dynamic_stochastic_is_reproducible_cpu(rng: np.random.Generator) -> None:
    shape, stochastic = (24, 96), qp.Rounding.STOCHASTIC
    x = _data(rng, shape)
    scope = qp.GroupScope(axis=-1, group_size=32)
    a = qpt.dynamic_fake_quantize(x, 4, qp.QuantMode.SYMMETRIC, scope, stochastic, 1234, 77)
    b = qpt.dynamic_fake_quantize(x, 4, qp.QuantMode.SYMMETRIC, scope, stochastic, 1234, 77)
    c = qpt.dynamic_fake_quantize(x, 4, qp.QuantMode.SYMMETRIC, scope, stochastic, 1234, 78)
    _assert_bits(a, b, "same seed and offset")
    assert not torch.equal(a, c)
    _assert_bits(a, _dynamic_plan_output(x, 4, qp.QuantMode.SYMMETRIC, scope, stochastic, 1234, 77), "plan output")
    with pytest.raises(qp.InvalidProblem, match="rng_seed"):
        qpt.dynamic_fake_quantize(x, 4, qp.QuantMode.SYMMETRIC, scope, stochastic)


def test_dynamic_module_offset_counter_and_state(rng: np.random.Generator) -> None:
    x = _data(rng, (6, 64))
    m = qpt.DynamicFakeQuantize(4, group_size=16, rounding=qp.Rounding.STOCHASTIC, seed=99)
    y1, y2 = m(x), m(x)
    assert m.rng_offset == 2 * x.numel()
    assert not torch.equal(y1, y2)  # fresh randomness every call
    mode, scope, sr = qp.QuantMode.SYMMETRIC, qp.GroupScope(axis=-1, group_size=16), qp.Rounding.STOCHASTIC
    _assert_bits(y1, qpt.dynamic_fake_quantize(x, 4, mode, scope, sr, 99, 0), "first call: offset 0")
    _assert_bits(y2, qpt.dynamic_fake_quantize(x, 4, mode, scope, sr, 99, x.numel()), "second call: offset numel")
    resumed = qpt.DynamicFakeQuantize(4, group_size=16, rounding=qp.Rounding.STOCHASTIC, seed=1)
    resumed.load_state_dict(m.state_dict())
    _assert_bits(resumed(x), m(x), "resumed from state_dict")
    with pytest.raises(qp.InvalidProblem, match="bits"):
        qpt.DynamicFakeQuantize(1, qp.QuantMode.SYMMETRIC)
    torch.manual_seed(5)
    s1 = qpt.DynamicFakeQuantize(rounding=qp.Rounding.STOCHASTIC).rng_seed
    torch.manual_seed(5)
    assert qpt.DynamicFakeQuantize(rounding=qp.Rounding.STOCHASTIC).rng_seed == s1


# ---- GPU -------------------------------------------------------------------------------------------------


def _repeated_fake_quantize(rng: np.random.Generator, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated eager calls without a gradient (replayed on CUDA after the first of each signature)
    on fresh data, with Python scales that change between calls, a zero point, channel scale
    tensors flat and in the parameter shape, and calls that need a cast or a filled zero point (not
    replayed): each result equals PyTorch's fake quantization bit for bit. On CUDA the repeated
    calls of a remembered signature skip the full path."""
    shape, c = (13, 301), 301
    scale_flat = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=c)).astype(np.float32)).to(device)
    scale_param = scale_flat.reshape(1, c).clone()
    zeros = torch.zeros(c, dtype=torch.int32, device=device)
    calls: list[tuple[Any, Any, qp.Scope | None]] = [
        (0.0625, None, None),
        (0.0625, 3, None),
        (0.125, None, None),
        (scale_flat, None, qp.ChannelScope(axis=1)),
        (scale_param, None, qp.ChannelScope(axis=1)),
        (scale_flat.double(), None, qp.ChannelScope(axis=1)),  # cast to float32 per call: not replayed
        (scale_flat, 0, qp.ChannelScope(axis=1)),  # a filled zero-point tensor per call: not replayed
    ]
    full = [0]
    parts = qpt._static_forward_parts

    def counting(*args: Any) -> Any:
        full[0] += 1
        return parts(*args)

    monkeypatch.setattr(qpt, "_static_forward_parts", counting)
    op = torch.ops.quantplan.fake_quantize.default
    for round_ in range(3):
        for scale, zp, scope in calls:
            x = _data(rng, shape, torch.float32, device)
            y = qpt.fake_quantize(x, scale, zp, -8, 7, scope or qp.TensorScope())
            tensor = isinstance(scale, torch.Tensor)
            ints = qpt.scope_ints(scope or qp.TensorScope())
            y_op = op(x, scale if tensor else None, 0.0 if tensor else scale, None, zp, ints, -8, 7)
            if scope is None:
                want = torch.fake_quantize_per_tensor_affine(x, scale, zp or 0, -8, 7)
            else:
                z = zeros if zp is None else torch.full((c,), zp, dtype=torch.int32, device=device)
                want = torch.fake_quantize_per_channel_affine(x, scale.reshape(-1).float(), z, 1, -8, 7)
            what = f"round {round_}: scale {scale if scope is None else 'tensor'}, zp {zp}"
            _assert_bits(y, want, what)
            _assert_bits(y_op, want, f"operator, {what}")
    # CUDA: every call but the first of each replayable signature (5 of 7, the operator's calls
    # sharing the function's) is replayed; the other two take the full path every time
    assert full[0] == (7 + 2 + 2 * 2 * 2 if device == "cuda" else 3 * 7 * 2), full[0]


def _repeated_quantize_dynamic(rng: np.random.Generator, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated ``torch.ops.quantplan.quantize_dynamic`` calls (replayed on CUDA after the first of
    each nearest-rounding signature) on fresh data: codes, scales and zero points equal the
    reference plan's bit for bit; stochastic and FP8 calls take the full path every time."""
    from quantplan import _torch_ops

    shape = (13, 256)
    op = torch.ops.quantplan.quantize_dynamic.default
    kinds = _torch_ops._KIND_INDEX
    token, group = [2, 0, 0], [3, -1, 64]
    calls = [  # (code, scope, asymmetric, stochastic, seed, replayed)
        (EK.S8, token, False, False, None, True),
        (EK.U4, group, True, False, None, True),
        (EK.S4, [0, 0, 0], False, False, None, True),  # per tensor: a workspace
        (EK.FP8_E4M3, token, False, False, None, False),
        (EK.S8, token, False, True, 7, False),
    ]
    full = [0]
    prepare = _torch_ops._prepare

    def counting(x: Any) -> Any:
        full[0] += 1
        return prepare(x)

    monkeypatch.setattr(_torch_ops, "_prepare", counting)
    for round_ in range(3):
        for code, scope, asym, stochastic, seed, _ in calls:
            x = _data(rng, shape, torch.float16, device)
            codes, scale, zp = op(x, kinds[code], scope, asym, None, None, 0, stochastic, seed, 5)
            desc = qp.DynamicRangeQuantizeDescriptor(
                shape=shape,
                scope=_torch_ops.scope_of(scope),
                mode=qp.QuantMode.ASYMMETRIC if asym else qp.QuantMode.SYMMETRIC,
                input_element=EK.F16,
                output_element=code,
                rounding=qp.Rounding.STOCHASTIC if stochastic else qp.Rounding.NEAREST_EVEN,
            )
            x_np = x.cpu().numpy()
            want_q = np.zeros(desc.output_shape, ELEMENTS[code].numpy_dtype)
            want_s = np.zeros(desc.param_shape, np.float32)
            want_z = np.zeros(desc.param_shape, np.int32) if asym else None
            ref = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)
            plan = qp.DynamicRangeQuantizePlan.select(None, desc, ref)
            ws = qp.Workspace.allocate(plan.workspace_size(), device=False) if plan.workspace_size() else None
            offset = 5 if stochastic else None
            plan.run(None, ws, qp.DynamicRangeQuantizeArgs(x_np, want_q, want_s, want_z, seed, offset))
            what = f"round {round_}: {code.name} scope {scope}"
            assert np.array_equal(codes.cpu().view(torch.uint8).numpy().view(want_q.dtype), want_q), what
            assert np.array_equal(scale.cpu().numpy(), want_s), what
            if asym:
                assert np.array_equal(zp.cpu().numpy(), want_z), what
            else:
                assert zp.shape == (0,) and zp.dtype == torch.int32, what
    replayed = sum(call[-1] for call in calls)
    assert full[0] == (len(calls) + 2 * (len(calls) - replayed) if device == "cuda" else 3 * len(calls)), full[0]


def test_repeated_quantize_dynamic_equals_the_plan_cpu(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    _repeated_quantize_dynamic(rng, "cpu", monkeypatch)


@gpu
def test_repeated_quantize_dynamic_equals_the_plan_cuda(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    qp.clear_plan_cache()
    _repeated_quantize_dynamic(rng, "cuda", monkeypatch)


def test_repeated_fake_quantize_equals_torch_cpu(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    _repeated_fake_quantize(rng, "cpu", monkeypatch)


@gpu
def test_repeated_fake_quantize_equals_torch_cuda(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    qp.clear_plan_cache()
    _repeated_fake_quantize(rng, "cuda", monkeypatch)


@gpu
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16, EK.F32], ids=lambda k: k.name)
def test_static_matches_torch_cuda(rng: np.random.Generator, kind: EK) -> None:
    dtype = TORCH_DTYPES[kind]
    shape = (129, 515)
    x = _data(rng, shape, dtype, "cuda").requires_grad_(True)
    dy = _data(rng, shape, dtype, "cuda")
    try:
        y_t = torch.fake_quantize_per_tensor_affine(x, 0.0173, 131, 0, 255)
    except RuntimeError as exc:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch has no per-tensor fake quant for {dtype}: {exc}")
    y = qpt.fake_quantize(x, 0.0173, 131, 0, 255)
    _assert_bits(y, y_t, "per-tensor forward")
    _assert_bits(_grads(y, (x,), dy)[0], _grads(y_t, (x,), dy)[0], "per-tensor STE")
    for axis in (0, 1):
        c = shape[axis]
        scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=c)).astype(np.float32)).cuda()
        zp = torch.from_numpy(rng.integers(-128, 128, size=c).astype(np.int32)).cuda()
        y_t = torch.fake_quantize_per_channel_affine(x, scale, zp, axis % len(shape), -128, 127)
        y = qpt.fake_quantize(x, scale, zp, -128, 127, qp.ChannelScope(axis=axis))
        _assert_bits(y, y_t, f"per-channel({axis}) forward")
        _assert_bits(_grads(y, (x,), dy)[0], _grads(y_t, (x,), dy)[0], f"per-channel({axis}) STE")


@gpu
@pytest.mark.parametrize("shape", [(257, 1031), (3, 50001)], ids=str)  # the second needs a workspace
def test_learnable_per_tensor_matches_torch_cuda(rng: np.random.Generator, shape: tuple) -> None:
    x, scale, zp = (t.cuda().requires_grad_(True) for t in _tie_free(rng, shape, qp.TensorScope(), 0, 255, False))
    dy = _data(rng, shape, device="cuda")
    gf = 1.0 / math.sqrt(x.numel() * 255)
    y_t = torch._fake_quantize_learnable_per_tensor_affine(x, scale, zp, 0, 255, gf)
    dx_t, ds_t, dz_t = _grads(y_t, (x, scale, zp), dy)
    y = qpt.fake_quantize_learnable(x, scale, zp, 0, 255, grad_factor=gf)
    dx, ds, dz = _grads(y, (x, scale, zp), dy)
    _assert_bits(y, y_t, "forward")
    _assert_bits(dx, dx_t, "dx")
    _assert_param_grads((ds, dz), (ds_t, dz_t), x, dy, scale, zp, qp.TensorScope(), 0, 255, gf)


@gpu
def test_learnable_per_channel_cuda_equals_cpu(rng: np.random.Generator) -> None:
    """Per-channel along axis 1 (moved-axis backward): CUDA equals the CPU reference path."""
    shape = (6, 24, 33)
    x = _data(rng, shape)
    dy = _data(rng, shape)
    scale = torch.from_numpy(np.exp(rng.uniform(-4, -1, size=24)).astype(np.float32))
    zp = torch.from_numpy(rng.uniform(-20, 20, size=24).astype(np.float32))
    results = []
    for device in ("cpu", "cuda"):
        xd = x.to(device).requires_grad_(True)
        s, z = scale.to(device).requires_grad_(True), zp.to(device).requires_grad_(True)
        y = qpt.fake_quantize_learnable(xd, s, z, -128, 127, qp.ChannelScope(axis=1), 0.25)
        results.append((y, *_grads(y, (xd, s, z), dy.to(device))))
    (y_c, dx_c, ds_c, dz_c), (y_g, dx_g, ds_g, dz_g) = results
    _assert_bits(y_g.cpu(), y_c, "forward")
    _assert_bits(dx_g.cpu(), dx_c, "dx")
    torch.testing.assert_close(ds_g.cpu(), ds_c, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(dz_g.cpu(), dz_c, rtol=1e-6, atol=1e-9)


@gpu
def test_runs_on_the_current_non_default_stream(rng: np.random.Generator) -> None:
    """The op must follow the producer of ``x`` on the current stream: launched anywhere else it
    would read ``x`` before the delayed copy on ``side`` fills it."""
    src = _data(rng, (513, 1027), device="cuda")
    dy = _data(rng, (513, 1027), device="cuda")
    x_t = src.clone().requires_grad_(True)
    expected = torch.fake_quantize_per_tensor_affine(x_t, 0.02, 5, -128, 127)
    (expected_dx,) = _grads(expected, (x_t,), dy)
    x = torch.full_like(src, 1e6)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert qpt.cupy_stream(src.device).ptr == side.cuda_stream
        assert qpt.cupy_stream(src.device) is qpt.cupy_stream(src.device)
        torch.cuda._sleep(100_000_000)
        x.copy_(src)
        xg = x.requires_grad_(True)
        y = qpt.fake_quantize(xg, 0.02, 5)
        (dx,) = _grads(y, (xg,), dy)
    side.synchronize()
    _assert_bits(y, expected, "forward on a side stream")
    _assert_bits(dx, expected_dx, "backward on a side stream")


@gpu
def test_cuda_graph_capture_of_forward_and_backward(rng: np.random.Generator) -> None:
    shape = (96, 3001)
    x = _data(rng, shape, torch.bfloat16, "cuda").requires_grad_(True)
    dy = _data(rng, shape, torch.bfloat16, "cuda")
    scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=96)).astype(np.float32)).cuda()
    zp = torch.from_numpy(rng.integers(-128, 128, size=96).astype(np.int32)).cuda()
    scope = qp.ChannelScope(axis=0)

    def step() -> tuple[Any, Any]:
        y = qpt.fake_quantize(x, scale, zp, -128, 127, scope)
        (dx,) = torch.autograd.grad(y, (x,), dy)
        return y, dx

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plans selected (and compiled) before capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g, dx_g = step()
    with torch.no_grad():  # new data in the captured buffers, then replay
        x.copy_(_data(rng, shape, torch.bfloat16, "cuda"))
        dy.copy_(_data(rng, shape, torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    y_e, dx_e = step()
    torch.cuda.synchronize()
    _assert_bits(y_g, y_e, "graph forward")
    _assert_bits(dx_g, dx_e, "graph backward")
    _assert_bits(y_e, torch.fake_quantize_per_channel_affine(x.detach(), scale, zp, 0, -128, 127), "eager vs torch")


@gpu
@pytest.mark.parametrize("case", range(len(DYNAMIC_CASES)))  # the last case runs the multi-pass path (workspace)
def test_dynamic_cuda_equals_plan_and_cpu(rng: np.random.Generator, case: int) -> None:
    bits, mode, scope, shape = DYNAMIC_CASES[case]
    x = _data(rng, shape, torch.bfloat16, "cuda").requires_grad_(True)
    y = qpt.dynamic_fake_quantize(x, bits, mode, scope)
    _assert_bits(y, _dynamic_plan_output(x.detach(), bits, mode, scope, qp.Rounding.NEAREST_EVEN), "vs plan")
    _assert_bits(y.cpu(), qpt.dynamic_fake_quantize(x.detach().cpu(), bits, mode, scope), "vs CPU")
    dy = _data(rng, shape, torch.bfloat16, "cuda")
    _assert_bits(_grads(y, (x,), dy)[0], dy, "identity gradient")
    sr = qp.Rounding.STOCHASTIC
    a = qpt.dynamic_fake_quantize(x, bits, mode, scope, sr, 42, 1000)
    b = qpt.dynamic_fake_quantize(x, bits, mode, scope, sr, 42, 1000)
    _assert_bits(a, b, "stochastic, same seed and offset")
    _assert_bits(a, _dynamic_plan_output(x.detach(), bits, mode, scope, sr, 42, 1000), "stochastic vs plan")
    _assert_bits(
        a.cpu(), qpt.dynamic_fake_quantize(x.detach().cpu(), bits, mode, scope, sr, 42, 1000), "stochastic vs CPU"
    )


@gpu
def test_dynamic_module_on_cuda_matches_cpu_module(rng: np.random.Generator) -> None:
    x = _data(rng, (32, 256))
    cpu = qpt.DynamicFakeQuantize(4, qp.QuantMode.ASYMMETRIC, group_size=64, rounding=qp.Rounding.STOCHASTIC, seed=7)
    dev = qpt.DynamicFakeQuantize(
        4, qp.QuantMode.ASYMMETRIC, group_size=64, rounding=qp.Rounding.STOCHASTIC, seed=7
    ).cuda()
    for _ in range(3):
        _assert_bits(dev(x.cuda()).cpu(), cpu(x), "module step")
    assert dev.rng_offset == cpu.rng_offset == 3 * x.numel()
