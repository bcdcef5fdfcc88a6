"""GPU: FakeQuantizePlan / FakeQuantizeBackwardPlan on CUDA equal the reference bit for bit, and PyTorch.

Forward and straight-through backward: every float kind x scope x mode (int32 and float zero
points), bit for bit. Learnable backward: dx bit for bit, dscale / dzp within the documented
float64-sum tolerance, identical bits run to run and for misaligned operands. Against torch:
fake_quantize_per_tensor_affine / _per_channel_affine (NaN and Inf included) and their
gradients, and the learnable per-tensor op. In place, torch tensors on a torch stream, graph capture.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import FLOATS, REFERENCE, SCOPES, first_mismatch, float_bits_equal, random_floats, to_device

import quantplan as qp
from quantplan import reference
from quantplan.runtime._layout import expand_params
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

RANGES = {qp.QuantMode.SYMMETRIC: (-128, 127), qp.QuantMode.ASYMMETRIC: (0, 255)}


def _desc(shape, scope, mode, kind, cls=qp.FakeQuantizeDescriptor, **kw):  # noqa: ANN001, ANN003, ANN202
    q_min, q_max = RANGES[mode]
    return cls(shape=shape, scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max, **kw)


def _scale(rng: np.random.Generator, desc, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """Scales near each segment's range / 255, so codes land inside and outside the clamp range."""
    dtype = np.float64 if desc.element is EK.F64 else np.float32
    amax = float(np.nanmax(np.abs(x.astype(np.float64)[np.isfinite(x.astype(np.float64))]), initial=1.0))
    return (amax / 100 * np.exp(rng.uniform(-1.5, 0.5, size=desc.param_shape))).astype(dtype)


def _zero_point(rng: np.random.Generator, desc, learnable: bool) -> np.ndarray | None:  # noqa: ANN001
    if desc.mode is qp.QuantMode.SYMMETRIC:
        return None
    if learnable:  # float zero points, a few outside the range (clamped) and on ties
        z = rng.uniform(desc.q_min - 20, desc.q_max + 20, size=desc.param_shape)
        z.reshape(-1)[::3] = np.floor(z.reshape(-1)[::3]) + 0.5
        return z.astype(np.float64 if desc.element is EK.F64 else np.float32)
    return rng.integers(desc.q_min, desc.q_max + 1, size=desc.param_shape).astype(np.int32)


def _with_specials(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """``x`` with NaN, +-Inf and -0.0 at random places."""
    flat = x.reshape(-1).copy()
    if flat.size > 16:
        specials = [np.nan, -np.inf, -0.0, np.inf]
        idx = rng.choice(flat.size, size=len(specials), replace=False)
        flat[idx] = np.array(specials).astype(x.dtype)
    return flat.reshape(x.shape)


def _get(a, like: np.ndarray) -> np.ndarray:  # noqa: ANN001
    return a.get().view(like.dtype).reshape(like.shape)


COMBOS = list(itertools.product(FLOATS, range(len(SCOPES)), qp.QuantMode, (False, True)))


@pytest.mark.parametrize(
    "kind,scope_index,mode,float_zp",
    COMBOS,
    ids=[f"{k.name}-s{i}-{m.name[:4]}-{'fzp' if f else 'izp'}" for k, i, m, f in COMBOS],
)
def test_forward_and_ste_match_reference(rng, kind, scope_index, mode, float_zp) -> None:
    if float_zp and mode is qp.QuantMode.SYMMETRIC:
        pytest.skip("no zero point in SYMMETRIC mode")
    scope, shape = SCOPES[scope_index]
    desc = _desc(shape, scope, mode, kind)
    x = _with_specials(rng, random_floats(rng, shape, kind))
    scale = _scale(rng, desc, x)
    zp = _zero_point(rng, desc, float_zp)
    y_ref = np.zeros_like(x)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zp))

    plan = qp.FakeQuantizePlan.select(None, desc)
    assert plan.sku().backend is qp.BackendKind.CUDA and plan.workspace_size() == 0
    y_dev = to_device(np.full_like(x, 7))
    dzp = None if zp is None else to_device(zp)
    plan.run(None, None, qp.FakeQuantizeArgs(to_device(x), y_dev, to_device(scale), dzp))
    y_gpu = _get(y_dev, y_ref)
    assert float_bits_equal(y_gpu, y_ref), first_mismatch(y_gpu, y_ref)
    assert not np.all(y_ref.astype(np.float64) == 0)

    bdesc = _desc(shape, scope, mode, kind, qp.FakeQuantizeBackwardDescriptor)
    dy = random_floats(rng, shape, kind, specials=False)
    dx_ref = np.zeros_like(dy)
    args_ref = qp.FakeQuantizeBackwardArgs(x, dy, dx_ref, scale, zp)
    qp.FakeQuantizeBackwardPlan.select(None, bdesc, REFERENCE).run(None, None, args_ref)
    dx_dev = to_device(np.full_like(dy, 3))
    bplan = qp.FakeQuantizeBackwardPlan.select(None, bdesc)
    bplan.run(None, None, qp.FakeQuantizeBackwardArgs(to_device(x), to_device(dy), dx_dev, to_device(scale), dzp))
    dx_gpu = _get(dx_dev, dx_ref)
    assert float_bits_equal(dx_gpu, dx_ref), first_mismatch(dx_gpu, dx_ref)


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
def test_tensor_scope_scalars_in_place_and_misaligned(rng, kind) -> None:
    import cupy

    shape = (33, 517)
    desc = _desc(shape, qp.TensorScope(), qp.QuantMode.ASYMMETRIC, kind)
    x = random_floats(rng, shape, kind)
    scale = float(_scale(rng, desc, x).reshape(-1)[0])
    for zp in (17, 17.5, 300.25):  # int; float ties and out of range: rne, clamp
        y_ref = np.zeros_like(x)
        qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zp))
        plan = qp.FakeQuantizePlan.select(None, desc)
        buf = to_device(x)
        plan.run(None, None, qp.FakeQuantizeArgs(buf, buf, scale, zp))  # in place
        assert float_bits_equal(_get(buf, y_ref), y_ref), first_mismatch(_get(buf, y_ref), y_ref)
    # misaligned: a view one element into a larger buffer (element-I/O twin)
    n = math.prod(shape)
    flat = to_device(np.concatenate([x.reshape(-1)[:1], x.reshape(-1)]))
    out = cupy.zeros_like(flat)
    plan.run(None, None, qp.FakeQuantizeArgs(flat[1:].reshape(shape), out[1:].reshape(shape), scale, 17))
    y_ref = np.zeros_like(x)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, 17))
    got = out[1:].get().view(y_ref.dtype).reshape(shape)
    assert n and float_bits_equal(got, y_ref), first_mismatch(got, y_ref)


# ---- learnable (LSQ) backward ------------------------------------------------------------------

LSQ_CASES = [
    (qp.TensorScope(), (37, 203)),  # one segment, 1 chunk... several chunks (7511 elements)
    (qp.TensorScope(), (3, 50001)),  # many chunks: the finishing pass
    (qp.ChannelScope(axis=0), (43, 131)),
    (qp.ChannelScope(axis=0), (5, 40000)),  # channel rows longer than a chunk
    (qp.TokenScope(), (4, 7, 301)),
    (qp.GroupScope(axis=-1, group_size=7), (19, 105)),
    (qp.GroupScope(axis=-1, group_size=128), (64, 1024)),
    (qp.ChannelScope(axis=1), (1, 6, 5, 3)),  # leading unit axis: contiguous
]


def _lsq_tolerance(terms: np.ndarray, ref: np.ndarray, scope, shape) -> np.ndarray:  # noqa: ANN001
    """Documented bound: one ulp of the result plus float64 rounding of the sum of |terms|."""
    from quantplan.reference import reduce_segments

    mag = reduce_segments(np.abs(terms.astype(np.float64)), scope, np.add, 0.0)
    n = math.prod(shape)
    return np.spacing(np.abs(ref).astype(ref.dtype)).astype(np.float64) + n * 2.0**-52 * mag + 1e-300


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize("mode", list(qp.QuantMode), ids=lambda m: m.name[:4])
@pytest.mark.parametrize("case", range(len(LSQ_CASES)))
def test_learnable_backward(rng, kind, mode, case) -> None:
    import cupy

    scope, shape = LSQ_CASES[case]
    desc = _desc(shape, scope, mode, kind, qp.FakeQuantizeBackwardDescriptor, learnable=True)
    x = random_floats(rng, shape, kind)
    dy = random_floats(rng, shape, kind, specials=False)
    scale = _scale(rng, desc, x)
    zp = _zero_point(rng, desc, learnable=True)
    gf = 1.0 / math.sqrt(x.size * desc.q_max)
    pdtype = scale.dtype
    ref = {k: np.zeros(desc.param_shape, pdtype) for k in ("ds", "dz")}
    dx_ref = np.zeros_like(dy)
    ref_args = qp.FakeQuantizeBackwardArgs(
        x, dy, dx_ref, scale, zp, ref["ds"], None if zp is None else ref["dz"], grad_factor=gf
    )
    qp.FakeQuantizeBackwardPlan.select(None, desc, REFERENCE).run(None, None, ref_args)

    plan = qp.FakeQuantizeBackwardPlan.select(None, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    results = []
    for offset in (0, 1, 0):  # aligned, misaligned (element-I/O twin), aligned again
        n = x.size
        xs, dys = (to_device(np.concatenate([a.reshape(-1)[:offset], a.reshape(-1)])) for a in (x, dy))
        dx_buf = cupy.zeros_like(dys)
        ds = cupy.full(desc.param_shape, 5, pdtype)
        dz = cupy.full(desc.param_shape, 5, pdtype) if zp is not None else None
        args = qp.FakeQuantizeBackwardArgs(
            xs[offset:].reshape(shape),
            dys[offset:].reshape(shape),
            dx_buf[offset:].reshape(shape),
            to_device(scale),
            None if zp is None else to_device(zp),
            ds,
            dz,
            grad_factor=gf,
        )
        plan.run(None, ws, args)
        dx = dx_buf[offset:].get().view(dx_ref.dtype).reshape(shape)
        assert n and float_bits_equal(dx, dx_ref), first_mismatch(dx, dx_ref)
        results.append((ds.get(), None if dz is None else dz.get()))
    for other in results[1:]:  # identical bits: run to run, and for misaligned operands
        assert np.array_equal(other[0].view(np.uint8), results[0][0].view(np.uint8))
        if zp is not None:
            assert np.array_equal(other[1].view(np.uint8), results[0][1].view(np.uint8))
    xe = expand_params(scale.reshape(desc.param_shape or (1,)), shape, scope)
    ze = None if zp is None else expand_params(zp.reshape(desc.param_shape or (1,)), shape, scope)
    _, terms_s, terms_z = reference.fake_quantize_lsq_terms(
        x, dy, xe, 0 if ze is None else ze, desc.q_min, desc.q_max, gf, ELEMENTS[kind].math_precision
    )
    ds_gpu = results[0][0]
    tol = _lsq_tolerance(terms_s, ref["ds"], scope, shape)
    assert np.all(np.abs(ds_gpu.astype(np.float64) - ref["ds"].astype(np.float64)) <= tol.reshape(ds_gpu.shape))
    assert np.any(ref["ds"] != 0)
    if zp is not None:
        tol = _lsq_tolerance(terms_z, ref["dz"], scope, shape)
        dz_gpu = results[0][1]
        assert np.all(np.abs(dz_gpu.astype(np.float64) - ref["dz"].astype(np.float64)) <= tol.reshape(dz_gpu.shape))


# ---- PyTorch parity ------------------------------------------------------------------------------

TORCH_KINDS = [EK.F16, EK.BF16, EK.F32]


def _assert_same_bits(ours, theirs, what: str) -> None:  # noqa: ANN001
    import torch

    bits = torch.int16 if ours.element_size() == 2 else torch.int32
    a = ours.detach().view(bits).cpu().numpy()
    b = theirs.detach().view(bits).cpu().numpy()
    assert np.array_equal(a, b), f"{what} differs from torch: " + first_mismatch(
        ours.detach().float().cpu().numpy(), theirs.detach().float().cpu().numpy()
    )


def _torch_dtype(kind: EK):  # noqa: ANN202
    import torch

    return {EK.F16: torch.float16, EK.BF16: torch.bfloat16, EK.F32: torch.float32}[kind]


def _torch_input(rng: np.random.Generator, shape: tuple[int, ...], kind: EK, specials: bool = True):  # noqa: ANN202
    import torch

    x = random_floats(rng, shape, kind)  # F16: its 1e3-scaled values may overflow to +-Inf
    x = (_with_specials(rng, x) if specials else np.where(np.isfinite(x), x, 0)).astype(np.float32)
    return torch.from_numpy(x).cuda().to(_torch_dtype(kind))


@pytest.mark.parametrize("kind", TORCH_KINDS, ids=lambda k: k.name)
def test_per_tensor_matches_torch(rng, kind) -> None:
    torch = pytest.importorskip("torch")
    shape = (129, 515)
    x = _torch_input(rng, shape, kind).requires_grad_(True)
    scale, zp, q_min, q_max = 0.0173, 131, 0, 255
    try:
        y_t = torch.fake_quantize_per_tensor_affine(x, scale, zp, q_min, q_max)
    except RuntimeError as exc:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch has no per-tensor fake quant for {kind.name}: {exc}")
    dy = torch.randn(shape, device="cuda").to(x.dtype)
    (dx_t,) = torch.autograd.grad(y_t, x, dy)
    desc = qp.FakeQuantizeDescriptor(
        shape=shape, scope=qp.TensorScope(), mode=qp.QuantMode.ASYMMETRIC, element=kind, q_min=q_min, q_max=q_max
    )
    y = torch.empty_like(x, requires_grad=False)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        qp.FakeQuantizePlan.select(stream, desc).run(stream, None, qp.FakeQuantizeArgs(x.detach(), y, scale, zp))
    bdesc = qp.FakeQuantizeBackwardDescriptor(**desc.model_dump())
    dx = torch.empty_like(y)
    with torch.cuda.stream(stream):
        qp.FakeQuantizeBackwardPlan.select(stream, bdesc).run(
            stream, None, qp.FakeQuantizeBackwardArgs(x.detach(), dy, dx, scale, zp)
        )
    stream.synchronize()
    _assert_same_bits(y, y_t, "forward")
    _assert_same_bits(dx, dx_t, "STE gradient")


@pytest.mark.parametrize("kind", TORCH_KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_matches_torch(rng, kind, axis) -> None:
    torch = pytest.importorskip("torch")
    shape = (67, 301)
    # finite data: PyTorch's per-channel kernel forms int64(rne(x * inv)) + zp, which overflows for
    # NaN and +-Inf (INT64_MIN / MAX plus a zero point of either sign); documented difference
    x = _torch_input(rng, shape, kind, specials=False).requires_grad_(True)
    channels = shape[axis]
    scale_np = np.exp(rng.uniform(-6, -2, size=channels)).astype(np.float32)
    zp_np = rng.integers(-128, 128, size=channels).astype(np.int32)
    scale_t, zp_t = torch.from_numpy(scale_np).cuda(), torch.from_numpy(zp_np).cuda()
    try:
        y_t = torch.fake_quantize_per_channel_affine(x, scale_t, zp_t, axis, -128, 127)
    except RuntimeError as exc:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch has no per-channel fake quant for {kind.name}: {exc}")
    dy = torch.randn(shape, device="cuda").to(x.dtype)
    (dx_t,) = torch.autograd.grad(y_t, x, dy)
    desc = qp.FakeQuantizeDescriptor(
        shape=shape, scope=qp.ChannelScope(axis=axis), mode=qp.QuantMode.ASYMMETRIC, element=kind, q_min=-128, q_max=127
    )
    pshape = desc.param_shape
    y = torch.empty_like(x, requires_grad=False)
    qp.FakeQuantizePlan.select(None, desc).run(
        None, None, qp.FakeQuantizeArgs(x.detach(), y, scale_t.reshape(pshape), zp_t.reshape(pshape))
    )
    dx = torch.empty_like(y)
    bdesc = qp.FakeQuantizeBackwardDescriptor(**desc.model_dump())
    qp.FakeQuantizeBackwardPlan.select(None, bdesc).run(
        None, None, qp.FakeQuantizeBackwardArgs(x.detach(), dy, dx, scale_t.reshape(pshape), zp_t.reshape(pshape))
    )
    torch.cuda.synchronize()
    _assert_same_bits(y, y_t, "forward")
    _assert_same_bits(dx, dx_t, "STE gradient")


def test_learnable_per_tensor_matches_torch(rng) -> None:
    torch = pytest.importorskip("torch")
    shape = (257, 1031)
    x = torch.from_numpy(random_floats(rng, shape, EK.F32, specials=False)).cuda().requires_grad_(True)
    amax = float(x.detach().abs().max())
    scale_t = torch.tensor([amax / 90], device="cuda", requires_grad=True)
    zp_t = torch.tensor([100.0], device="cuda", requires_grad=True)  # integral: PyTorch's two roundings agree
    gf = 1.0 / math.sqrt(x.numel() * 255)
    y_t = torch._fake_quantize_learnable_per_tensor_affine(x, scale_t, zp_t, 0, 255, gf)
    dy = torch.randn(shape, device="cuda")
    dx_t, ds_t, dz_t = torch.autograd.grad(y_t, (x, scale_t, zp_t), dy)

    desc = qp.FakeQuantizeDescriptor(
        shape=shape, scope=qp.TensorScope(), mode=qp.QuantMode.ASYMMETRIC, element=EK.F32, q_min=0, q_max=255
    )
    y = torch.empty_like(x, requires_grad=False)
    qp.FakeQuantizePlan.select(None, desc).run(
        None, None, qp.FakeQuantizeArgs(x.detach(), y, scale_t.detach(), zp_t.detach())
    )
    bdesc = qp.FakeQuantizeBackwardDescriptor(**desc.model_dump(), learnable=True)
    plan = qp.FakeQuantizeBackwardPlan.select(None, bdesc)
    dx, ds, dz = torch.empty_like(y), torch.empty(1, device="cuda"), torch.empty(1, device="cuda")
    args = qp.FakeQuantizeBackwardArgs(x.detach(), dy, dx, scale_t.detach(), zp_t.detach(), ds, dz, grad_factor=gf)
    plan.run(None, qp.Workspace.allocate(plan.workspace_size()), args)
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.int32), y_t.detach().view(torch.int32)), "forward differs from torch"
    assert torch.equal(dx.view(torch.int32), dx_t.view(torch.int32)), "dx differs from torch"
    # torch sums float32 terms in float32; ours are float64 sums: close, not equal
    assert torch.allclose(ds, ds_t, rtol=1e-4, atol=1e-6), (ds, ds_t)
    assert torch.allclose(dz, dz_t, rtol=1e-4, atol=1e-6), (dz, dz_t)


def test_graph_capture_forward_and_learnable_backward(rng) -> None:
    import cupy

    shape = (96, 3000)
    scope = qp.ChannelScope(axis=0)
    desc = _desc(shape, scope, qp.QuantMode.ASYMMETRIC, EK.BF16)
    bdesc = _desc(shape, scope, qp.QuantMode.ASYMMETRIC, EK.BF16, qp.FakeQuantizeBackwardDescriptor, learnable=True)
    x = random_floats(rng, shape, EK.BF16)
    dy = random_floats(rng, shape, EK.BF16, specials=False)
    scale, zp = _scale(rng, desc, x), _zero_point(rng, desc, learnable=True)
    stream = cupy.cuda.Stream(non_blocking=True)
    fwd = qp.FakeQuantizePlan.select(stream, desc)
    bwd = qp.FakeQuantizeBackwardPlan.select(stream, bdesc)
    ws = qp.Workspace.allocate(bwd.workspace_size())
    xd, dyd, sd, zd = to_device(x), to_device(dy), to_device(scale), to_device(zp)
    y, dx = cupy.zeros_like(xd), cupy.zeros_like(dyd)
    ds, dz = cupy.zeros(desc.param_shape, np.float32), cupy.zeros(desc.param_shape, np.float32)
    with stream:
        stream.begin_capture()
        fwd.run(stream, None, qp.FakeQuantizeArgs(xd, y, sd, zd))
        bwd.run(stream, ws, qp.FakeQuantizeBackwardArgs(xd, dyd, dx, sd, zd, ds, dz))
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    y_ref, dx_ref = np.zeros_like(x), np.zeros_like(dy)
    ds_ref, dz_ref = np.zeros(desc.param_shape, np.float32), np.zeros(desc.param_shape, np.float32)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zp))
    qp.FakeQuantizeBackwardPlan.select(None, bdesc, REFERENCE).run(
        None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx_ref, scale, zp, ds_ref, dz_ref)
    )
    assert float_bits_equal(_get(y, y_ref), y_ref)
    assert float_bits_equal(_get(dx, dx_ref), dx_ref)
    assert np.allclose(ds.get(), ds_ref, rtol=1e-5, atol=1e-30)
    first = ds.get().copy()
    graph.launch(stream)  # replay: identical bits
    stream.synchronize()
    assert np.array_equal(first, ds.get())


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
def test_tensor_scope_many_tiles_with_a_partial_vector(rng, kind) -> None:
    """The flat TensorScope kernel over many block tiles, the last vector partial (odd element count)."""
    shape = (7, 142_861)  # 1_000_027 elements
    desc = _desc(shape, qp.TensorScope(), qp.QuantMode.ASYMMETRIC, kind)
    bdesc = _desc(shape, qp.TensorScope(), qp.QuantMode.ASYMMETRIC, kind, qp.FakeQuantizeBackwardDescriptor)
    x = _with_specials(rng, random_floats(rng, shape, kind))
    dy = random_floats(rng, shape, kind, specials=False)
    scale = _scale(rng, desc, x).reshape(-1)[:1].reshape(desc.param_shape)
    zp = np.array(rng.integers(0, 256), np.int32).reshape(desc.param_shape)
    y_ref, dx_ref = np.zeros_like(x), np.zeros_like(dy)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zp))
    qp.FakeQuantizeBackwardPlan.select(None, bdesc, REFERENCE).run(
        None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx_ref, scale, zp)
    )
    plan, bplan = qp.FakeQuantizePlan.select(None, desc), qp.FakeQuantizeBackwardPlan.select(None, bdesc)
    assert "flat" in plan.sku().variant and "flat" in bplan.sku().variant
    xd, dyd, sd, zd = to_device(x), to_device(dy), to_device(scale), to_device(zp)
    y_dev, dx_dev = to_device(np.zeros_like(x)), to_device(np.zeros_like(dy))
    plan.run(None, None, qp.FakeQuantizeArgs(xd, y_dev, sd, zd))
    bplan.run(None, None, qp.FakeQuantizeBackwardArgs(xd, dyd, dx_dev, sd, zd))
    assert float_bits_equal(_get(y_dev, y_ref), y_ref), first_mismatch(_get(y_dev, y_ref), y_ref)
    assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)
