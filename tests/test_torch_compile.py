"""quantplan's torch.library operators under torch.compile.

CPU: a small QAT step (two linear layers, weight and activation fake quantization from
``quantplan.pytorch`` -- static per channel / per tensor, LSQ, dynamic range -- a loss, backward)
compiled with ``torch.compile(fullgraph=True)`` gives the eager loss and gradients bit for bit,
and ``torch._dynamo.explain`` counts no graph break; ``qp.quantize`` / ``.dequantize()`` traced
with ``fullgraph=True`` equal eager; ``torch.library.opcheck`` passes for every registered
operator on random ragged inputs.
GPU (marked ``gpu``): the same step on CUDA tensors, ``mode="reduce-overhead"`` (CUDA graphs)
replayed several times equal to eager, and the operators on the current (non-default) stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import quantplan as qp  # noqa: E402
import quantplan.distributed  # noqa: E402, F401  (its operators are the _torch_ops ones)
import quantplan.pytorch as qpt  # noqa: E402
from quantplan import _torch_ops as ops  # noqa: E402
from quantplan.vocabulary.types import ElementKind as EK  # noqa: E402


def gpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A GPU test: the repo's ``gpu`` mark (skipped without CuPy's device) and PyTorch's CUDA."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA device")
    return pytest.mark.gpu(skip(fn))  # type: ignore[no-any-return]


def _bits(t: Any) -> Any:
    t = t.detach()
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8)
    if not t.dtype.is_floating_point:
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _assert_bits(ours: Any, theirs: Any, what: str) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape)
    same = _bits(ours) == _bits(theirs)
    if not bool(same.all()):
        pytest.fail(f"{what}: {int((~same).sum())} of {same.numel()} elements differ")


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0, device: str = "cpu") -> Any:
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).to(device)


# ---- the QAT step ------------------------------------------------------------------------------------


class _Model(torch.nn.Module):
    """x -> fq -> Linear(W1 fq per channel) -> ReLU -> LSQ fq -> dynamic fq -> fq -> Linear(W2 fq per
    channel) -> squared error, summed exactly."""

    def __init__(self, rng: np.random.Generator, sizes: tuple[int, int, int], device: str) -> None:
        super().__init__()
        d_in, hidden, d_out = sizes
        self.w1 = torch.nn.Parameter(_normal(rng, (hidden, d_in), d_in**-0.5, device))
        self.w2 = torch.nn.Parameter(_normal(rng, (d_out, hidden), hidden**-0.5, device))
        s1 = (self.w1.detach().abs().amax(dim=1) / 127).clamp_min(1e-6)
        s2 = (self.w2.detach().abs().amax(dim=1) / 127).clamp_min(1e-6)
        zp1 = torch.from_numpy(rng.integers(-3, 4, size=hidden).astype(np.int32)).to(device)
        channel = qp.ChannelScope(axis=0)
        self.fq_x = qpt.FakeQuantize(0.03125, 2)  # per tensor, asymmetric
        self.fq_w1 = qpt.FakeQuantize(s1, zp1, scope=channel)
        self.fq_w2 = qpt.FakeQuantize(s2, None, q_min=-127, q_max=127, scope=channel)
        self.lsq = qpt.LearnableFakeQuantize(0.004, 1.5, q_min=0, q_max=255)  # clamps the largest h
        self.dyn = qpt.DynamicFakeQuantize(6, group_size=hidden // 3)
        self.to(device)

    def forward(self, x: Any) -> Any:
        h = torch.relu(self.fq_x(x) @ self.fq_w1(self.w1).t())
        h = self.dyn(self.lsq(h))
        y = qpt.fake_quantize(h, 0.0625) @ self.fq_w2(self.w2).t()
        # The loss: squares on a grid of 2**-6 (fake-quantized, [0, 255]), so their sum is exact in
        # float32 whatever order a compiled reduction takes (inductor's sum order is not eager's).
        return qpt.fake_quantize(y.square(), 2**-6, None, 0, 255).sum()


def _step(model: _Model, fn: Callable[[Any], Any], x: Any) -> tuple[Any, ...]:
    """Loss and gradients (w1, w2, LSQ scale, LSQ zero point) of one step of ``fn``."""
    for p in model.parameters():
        p.grad = None
    loss = fn(x)
    loss.backward()
    grads = [p.grad.detach().clone() for p in (model.w1, model.w2, model.lsq.scale, model.lsq.zero_point)]
    return (loss.detach().clone(), *grads)


_SIZES = (37, 48, 11)  # ragged: no multiple of 8 except the hidden width (3 groups of 16)
_NAMES = ("loss", "dw1", "dw2", "dscale", "dzero_point")


def test_qat_step_compiled_fullgraph_equals_eager(rng: np.random.Generator) -> None:
    torch._dynamo.reset()
    model = _Model(rng, _SIZES, "cpu")
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):
        x = _normal(rng, (13, _SIZES[0]))
        eager = _step(model, model, x)
        traced = _step(model, compiled, x)
        assert all(bool(g.abs().sum() > 0) for g in eager[1:]), "every gradient must be exercised"
        for name, a, b in zip(_NAMES, traced, eager, strict=True):
            _assert_bits(a, b, name)


def test_qat_step_has_no_graph_break(rng: np.random.Generator) -> None:
    torch._dynamo.reset()
    model = _Model(rng, _SIZES, "cpu")
    explanation = torch._dynamo.explain(model)(_normal(rng, (13, _SIZES[0])))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    names = {str(getattr(n, "target", "")) for g in explanation.graphs for n in g.graph.nodes}
    assert {"quantplan.fake_quantize.default", "quantplan.fake_quantize_learnable.default"} <= names, names
    assert "quantplan.dynamic_fake_quantize.default" in names, names


def test_functions_under_compile_equal_eager(rng: np.random.Generator) -> None:
    """qpt.fake_quantize with tensor and number parameters, every scope, and stochastic dynamic
    fake quantization with tensor seeds (read on the device: no recompilation per offset)."""
    torch._dynamo.reset()
    x = _normal(rng, (6, 10, 21), 3.0).requires_grad_(True)
    scale = torch.from_numpy(np.exp(rng.uniform(-4, -1, size=(6, 5, 21))).astype(np.float32))
    zp = torch.from_numpy(rng.integers(-5, 6, size=(6, 5, 21)).astype(np.int32))
    seed = torch.tensor([987654321], dtype=torch.int64)
    offset = torch.tensor([77], dtype=torch.int64)
    stochastic, asymmetric = qp.Rounding.STOCHASTIC, qp.QuantMode.ASYMMETRIC

    def f(x: Any) -> tuple[Any, ...]:
        a = qpt.fake_quantize(x, scale, zp, -128, 127, _GROUP)
        b = qpt.fake_quantize(x, 0.125, 3, 0, 15, _TOKEN)
        c = qpt.dynamic_fake_quantize(x, 4, asymmetric, _GROUP_LAST, stochastic, seed, offset)
        d = qpt.dynamic_fake_quantize(x, 8, qp.QuantMode.SYMMETRIC, _TOKEN, stochastic, 2**64 - 5, 2**63)
        return a, b, c, d, (a * b + c - d).sum()

    eager = f(x)
    (dx_e,) = torch.autograd.grad(eager[-1], (x,))
    traced = torch.compile(f, fullgraph=True)(x)
    (dx_t,) = torch.autograd.grad(traced[-1], (x,))
    for i, (a, b) in enumerate(zip(traced[:-1], eager[:-1], strict=True)):
        _assert_bits(a, b, f"output {i}")
    _assert_bits(dx_t, dx_e, "dx")


_GROUP = qp.GroupScope(axis=1, group_size=2)
_GROUP_LAST = qp.GroupScope(axis=-1, group_size=7)
_TOKEN = qp.TokenScope()
_CHANNEL0 = qp.ChannelScope(axis=0)  # scopes are made outside compiled code (a pydantic model is not traced)


def test_operator_autograd_eager_and_redispatched_paths_agree(rng: np.random.Generator) -> None:
    """The operators' Autograd kernel: plain tensors take the adapter's autograd.Function, and under a
    dispatch mode (as while tracing) the re-dispatching Function whose backward is the backward
    operators; both give the same outputs and gradients, bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.seen.add(str(func))
            return func(*args, **(kwargs or {}))

    x = _normal(rng, (7, 30), 2.0)
    dy = _normal(rng, (7, 30))
    scale = torch.from_numpy(np.exp(rng.uniform(-4, -1, size=7)).astype(np.float32))
    zp = torch.from_numpy(rng.uniform(-3, 3, size=7).astype(np.float32))
    cases = [
        (qpt.fake_quantize_op, lambda x, s, z: (x, s, 0.0, None, 3, [1, 0, 0], -128, 127), (0,)),
        (qpt.fake_quantize_learnable_op, lambda x, s, z: (x, s, z, [1, 0, 0], 0, 255, 0.5), (0, 1, 2)),
        (qpt.dynamic_fake_quantize_op, lambda x, s, z: (x, 5, True, [2, 0, 0], True, None, None, 9, 2**62), (0,)),
    ]
    backward_ops = [qpt.fake_quantize_ste_backward_op, qpt.fake_quantize_learnable_backward_op, None]
    for (op, make, wrt), backward_op in zip(cases, backward_ops, strict=True):
        results = []
        for watch in (None, Watch()):
            leaves = [t.clone().requires_grad_(True) for t in (x, scale, zp)]
            with watch if watch is not None else _Null():
                y = op(*make(*leaves))
                grads = torch.autograd.grad(y, [leaves[i] for i in wrt], dy)
            results.append((y, *grads))
            if watch is not None:
                assert str(op) in watch.seen, watch.seen
                assert backward_op is None or str(backward_op) in watch.seen, watch.seen
        for i, (a, b) in enumerate(zip(*results, strict=True)):
            _assert_bits(a, b, f"{op} output/gradient {i}")


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ---- qp.quantize / dequantize ------------------------------------------------------------------------

_QUANTIZE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("int8", {"scope": _TOKEN}),
    ("int4", {"group_size": 7, "asymmetric": True}),
    ("uint8", {"axis": 0, "asymmetric": True}),
    ("fp8_e4m3", {}),
    ("int8", {"scale": 0.0375}),
    ("int4", {"scale": "tensor", "zero_point": "tensor", "axis": 1}),
    ("int8", {"rounding": qp.Rounding.STOCHASTIC, "seed": 2**64 - 3, "offset": 5, "scope": _TOKEN}),
]


@pytest.mark.parametrize("case", range(len(_QUANTIZE_CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_quantize_dequantize_fullgraph_equals_eager(rng: np.random.Generator, case: int, dtype: Any) -> None:
    code, kwargs = _QUANTIZE_CASES[case]
    x = _normal(rng, (9, 14), 2.0).to(dtype)
    kwargs = dict(kwargs)
    if kwargs.get("scale") == "tensor":
        kwargs["scale"] = torch.from_numpy(np.exp(rng.uniform(-3, -1, size=(1, 14))).astype(np.float32))
        kwargs["zero_point"] = torch.from_numpy(rng.integers(-4, 4, size=(1, 14)).astype(np.int32))

    def f(x: Any) -> tuple[Any, ...]:
        qt = qp.quantize(x, code, **kwargs)
        fq = qp.fake_quantize(x, 0.0625, 3, q_min=-8, q_max=7)
        return qt.codes, qt.scale, qt.dequantize(), qt.dequantize("float64"), fq

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(f)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    eager = f(x)
    traced = torch.compile(f, fullgraph=True)(x)
    names = ("codes", "scale", "dequantize", "dequantize float64", "qp.fake_quantize")
    for name, a, b in zip(names, traced, eager, strict=True):
        if isinstance(b, float):
            assert a == b, name
        else:
            _assert_bits(a, b, name)


def test_quantize_operators_on_an_input_that_requires_grad(rng: np.random.Generator) -> None:
    """The quantize / dequantize operators are not differentiable: on an input that requires a
    gradient, eager and compiled, their outputs require none and hold the same bits as on a
    detached input (their Autograd key falls through to the kernel)."""
    torch._dynamo.reset()
    x = _normal(rng, (7, 18), 2.0)
    xg = x.clone().requires_grad_(True)

    def f(t: Any) -> tuple[Any, ...]:
        qt = qp.quantize(t, "int8", scope=_TOKEN)
        qa = qp.quantize(t, "uint4", asymmetric=True, group_size=6)
        return qt.codes, qt.scale, qt.dequantize(), qa.codes, qa.scale, qa.zero_point

    plain = f(x)
    for name, call in (("eager", f), ("compiled", torch.compile(f, fullgraph=True))):
        outputs = call(xg)
        for i, (a, b) in enumerate(zip(outputs, plain, strict=True)):
            assert not a.requires_grad, f"{name} output {i} requires grad"
            _assert_bits(a, b, f"{name} output {i}")
    codes, scale, zp = ops.quantize_dynamic_op(
        xg, ops._KIND_INDEX[EK.S8], [2, 0, 0], False, None, None, 0, False, None, 0
    )
    assert not (codes.requires_grad or scale.requires_grad or zp.requires_grad)
    _assert_bits(codes, plain[0], "torch.ops codes")


def test_quantized_tensor_returned_from_a_compiled_function(rng: np.random.Generator) -> None:
    torch._dynamo.reset()
    x = _normal(rng, (5, 24))
    qt = torch.compile(lambda t: qp.quantize(t, "int4", group_size=8), fullgraph=True)(x)
    ref = qp.quantize(x, "int4", group_size=8)
    assert qt.descriptor == ref.descriptor
    _assert_bits(qt.codes, ref.codes, "codes")
    _assert_bits(qt.dequantize(), ref.dequantize(), "dequantize")


# ---- opcheck on every operator -------------------------------------------------------------------------


def _opcheck_samples(rng: np.random.Generator, device: str = "cpu") -> list[tuple[Any, tuple[Any, ...]]]:
    """(operator, args) for every quantplan operator, on fresh random ragged data."""
    x = _normal(rng, (7, 30), 2.0, device)
    dy = _normal(rng, (7, 30), 1.0, device)
    sc_ch = torch.from_numpy(np.exp(rng.uniform(-4, -1, size=7)).astype(np.float32)).to(device)
    zp_ch = torch.from_numpy(rng.integers(-5, 6, size=7).astype(np.int32)).to(device)
    zp_f = torch.from_numpy(rng.uniform(-3, 3, size=7).astype(np.float32)).to(device)
    ch0, tensor, group = [1, 0, 0], [0, 0, 0], [3, -1, 5]
    s8, s4, f32 = ops.kind_index(EK.S8), ops.kind_index(EK.S4), ops.kind_index(EK.F32)
    q = torch.from_numpy(rng.integers(-128, 128, size=(7, 30)).astype(np.int8)).to(device)
    qs = torch.from_numpy(np.exp(rng.uniform(-4, -1, size=(7, 6))).astype(np.float32)).to(device)
    # collectives: 2 peers of 60 elements, groups of 10, one node of 2 devices
    flat = _normal(rng, (120,), 1.0, device)
    send_q = torch.empty((2, 60), dtype=torch.int8, device=device)
    send_s = torch.empty((2, 6), dtype=torch.float32, device=device)
    peers_q = torch.from_numpy(rng.integers(-128, 128, size=(2, 60)).astype(np.int8)).to(device)
    peers_s = torch.from_numpy(np.exp(rng.uniform(-4, -1, size=(2, 6))).astype(np.float32)).to(device)
    return [
        (qpt.fake_quantize_op, (x, sc_ch, 0.0, zp_ch, None, ch0, -128, 127)),
        (qpt.fake_quantize_op, (x.t(), None, 0.0625, None, 3, tensor, -8, 7)),
        (qpt.fake_quantize_ste_backward_op, (dy, x, sc_ch, 0.0, None, None, ch0, -128, 127)),
        (qpt.fake_quantize_learnable_op, (x, sc_ch, zp_f, ch0, 0, 255, 0.5)),
        (qpt.fake_quantize_learnable_backward_op, (dy, x, sc_ch, zp_f, ch0, 0, 255, 0.5)),
        (qpt.fake_quantize_learnable_backward_op, (dy, x, sc_ch[:1], None, tensor, -128, 127, 0.25)),
        (qpt.dynamic_fake_quantize_op, (x, 4, True, group, False, None, None, None, None)),
        (qpt.dynamic_fake_quantize_op, (x, 8, False, tensor, True, None, None, -5, 2**62)),
        (ops.quantize_dynamic_op, (x, s8, [2, 0, 0], False, None, None, 0, False, None, 0)),
        (ops.quantize_dynamic_op, (x, s4, group, True, None, None, 1, True, 11, 3)),
        (
            ops.quantize_static_op,
            (x, sc_ch.reshape(7, 1), 0.0, zp_ch.reshape(7, 1), None, s8, ch0, None, None, 0, False, None, 0),
        ),
        (ops.dequantize_op, (q, qs, 0.0, None, None, [7, 30], group, s8, f32, 0)),
        (ops.dequantize_op, (q, None, 0.5, None, 4, [7, 30], tensor, s8, ops.kind_index(EK.BF16), 0)),
        (ops.dynamic_quantize_out_op, (flat, send_q.view(-1), send_s.view(-1), None, s8, [3, -1, 10], False)),
        (ops.dequantize_out_op, (peers_q.view(-1), peers_s.view(-1), None, flat.clone(), s8, [3, -1, 10], 0)),
        (ops.swizzled_quantize_out_op, (flat, send_q, send_s, None, 10, 1, 2, s8, False)),
        (
            ops.dequant_reduce_out_op,
            (peers_q, peers_s, None, torch.empty(60, device=device), None, None, 2, 60, 10, None, s8, f32, True),
        ),
    ]


def test_every_operator_passes_opcheck(rng: np.random.Generator) -> None:
    samples = _opcheck_samples(rng)
    registered = {name for name in dir(torch.ops.quantplan) if not name.startswith("_")}
    checked = {op._schema.name.removeprefix("quantplan::") for op, _ in samples}
    missing = {
        "fake_quantize",
        "fake_quantize_ste_backward",
        "fake_quantize_learnable",
        "fake_quantize_learnable_backward",
        "dynamic_fake_quantize",
        "quantize_dynamic",
        "quantize_static",
        "dequantize",
        "dynamic_quantize_out",
        "dequantize_out",
        "swizzled_quantize_out",
        "dequant_reduce_out",
    } - checked
    assert not missing, missing
    assert checked <= registered, checked - registered
    for op, args in samples:
        torch.library.opcheck(op, args)


# ---- GPU -------------------------------------------------------------------------------------------------


@gpu
def test_qat_step_cuda_compiled_fullgraph_equals_eager(rng: np.random.Generator) -> None:
    torch._dynamo.reset()
    model = _Model(rng, _SIZES, "cuda")
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):
        x = _normal(rng, (13, _SIZES[0]), device="cuda")
        eager = _step(model, model, x)
        traced = _step(model, compiled, x)
        assert all(bool(g.abs().sum() > 0) for g in eager[1:]), "every gradient must be exercised"
        for name, a, b in zip(_NAMES, traced, eager, strict=True):
            _assert_bits(a, b, name)
    explanation = torch._dynamo.explain(model)(_normal(rng, (13, _SIZES[0]), device="cuda"))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@gpu
def test_qat_step_cuda_graphs_replay_exactly(rng: np.random.Generator) -> None:
    """``mode="reduce-overhead"``: the compiled step is recorded into CUDA graphs and replayed;
    every replay (new inputs copied into the graph's buffers) equals the eager step bit for bit."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    model = _Model(rng, _SIZES, "cuda")
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(6):  # warm-up, recording, then replays
        x = _normal(rng, (13, _SIZES[0]), device="cuda")
        eager = _step(model, model, x)
        traced = _step(model, compiled, x)
        torch.cuda.synchronize()
        for name, a, b in zip(_NAMES, traced, eager, strict=True):
            _assert_bits(a, b, name)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@gpu
def test_operators_run_on_the_current_stream(rng: np.random.Generator) -> None:
    """A compiled function's quantplan operators follow the producer of their input on the
    current (non-default) stream: launched anywhere else they would read ``x`` before the delayed
    copy on ``side`` fills it."""
    torch._dynamo.reset()
    src = _normal(rng, (257, 1031), 2.0, "cuda")
    scale = torch.from_numpy(np.exp(rng.uniform(-5, -1, size=257)).astype(np.float32)).cuda()

    def f(x: Any) -> tuple[Any, ...]:
        a = qpt.fake_quantize(x, scale, None, -127, 127, _CHANNEL0)
        b = qpt.dynamic_fake_quantize(x, 4, qp.QuantMode.ASYMMETRIC, _TOKEN)
        qt = qp.quantize(x, "int8", scope=_TOKEN)
        return a, b, qt.codes, qt.dequantize()

    expected = f(src)
    compiled = torch.compile(f, fullgraph=True)
    compiled(src)  # compiled (and plans selected) before the timed race below
    x = torch.full_like(src, 1e6)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x.copy_(src)
        got = compiled(x)
    side.synchronize()
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        _assert_bits(a, b, f"output {i} on a side stream")


@gpu
@pytest.mark.parametrize("case", range(len(_QUANTIZE_CASES)))
def test_quantize_dequantize_cuda_fullgraph_equals_eager_and_cpu(rng: np.random.Generator, case: int) -> None:
    code, kwargs = _QUANTIZE_CASES[case]
    x = _normal(rng, (9, 14), 2.0).to(torch.bfloat16)
    kwargs = dict(kwargs)
    if kwargs.get("scale") == "tensor":
        kwargs["scale"] = torch.from_numpy(np.exp(rng.uniform(-3, -1, size=(1, 14))).astype(np.float32))
        kwargs["zero_point"] = torch.from_numpy(rng.integers(-4, 4, size=(1, 14)).astype(np.int32))
    on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    def f(x: Any, options: dict[str, Any]) -> tuple[Any, ...]:
        qt = qp.quantize(x, code, **options)
        return qt.codes, qt.dequantize(), qt.dequantize("float32")

    torch._dynamo.reset()
    on_cpu = f(x, kwargs)
    eager = f(x.cuda(), on_gpu)
    traced = torch.compile(lambda t: f(t, on_gpu), fullgraph=True)(x.cuda())
    for name, a, b, c in zip(("codes", "dequantize", "dequantize float32"), traced, eager, on_cpu, strict=True):
        _assert_bits(a, b, name)
        _assert_bits(a.cpu(), c, f"{name} vs CPU")


@gpu
def test_every_operator_passes_opcheck_on_cuda(rng: np.random.Generator) -> None:
    for op, args in _opcheck_samples(rng, "cuda"):
        torch.library.opcheck(op, args)
