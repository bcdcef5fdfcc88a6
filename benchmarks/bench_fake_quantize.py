"""Benchmark FakeQuantizePlan / FakeQuantizeBackwardPlan against a copy, PyTorch's native ops and torch.compile.

Rows, at 16x8192 and 8192x8192, in fp32, bf16 and fp16 (learnable: fp32, the dtype PyTorch's
learnable backward takes):

* ``fake quant tensor fwd``: per-tensor forward; eager peer ``torch.fake_quantize_per_tensor_affine``
  (its output is checked equal to ours bit for bit first); compile peer: ``torch.compile`` of
  the same formula written in PyTorch ops.
* ``fake quant tensor bwd (STE)``: ``dx = dy * mask`` from ``x`` and ``dy``; eager peer PyTorch's
  own backward (``fake_quantize_per_tensor_affine_cachemask_backward`` on the mask its forward
  cached: it reads ``dy`` and the 1-byte mask); compile peer: the same math from ``x`` and ``dy``.
* ``fake quant learnable bwd``: LSQ gradients (dx, dscale, dzero_point); eager peer
  ``torch._fake_quantize_learnable_per_tensor_affine_backward``.
* ``dyn fake quant group128 s8 nearest`` / ``... stochastic``: DynamicRangeFakeQuantizePlan,
  symmetric 8-bit, groups of 128 along the last axis (MoQ); peers: the same math in PyTorch ops
  (``torch.rand_like`` for the stochastic draw), eager and ``torch.compile``; the nearest row's
  output is checked equal to the eager formula's.

Effective bandwidth counts the op's bytes (inputs read once, outputs written). Method: :mod:`harness`.

Usage (on a GPU machine)::

    PYTHONPATH=. python benchmarks/bench_fake_quantize.py [--json PATH] [--quick] [--no-compile] [--only TEXT]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402
from harness import Row, Timing  # noqa: E402

SCALE, ZERO_POINT, Q_MIN, Q_MAX = 0.02, 128, 0, 255


@dataclass(frozen=True)
class FakeCase:
    """One row: which op, shape, dtype."""

    label: str
    kind: str  # forward | ste | learnable
    shape: tuple[int, int]
    dtype: str


def cases() -> list[FakeCase]:
    rows: list[FakeCase] = []
    for label, kind, dtypes in (
        ("fake quant tensor fwd", "forward", ("fp32", "bf16", "fp16")),
        ("fake quant tensor bwd (STE)", "ste", ("fp32", "bf16", "fp16")),
        ("fake quant learnable bwd", "learnable", ("fp32",)),
        ("dyn fake quant group128 s8 nearest", "dynamic", ("bf16", "fp16")),
        ("dyn fake quant group128 s8 stochastic", "dynamic_stochastic", ("bf16", "fp16")),
    ):
        for shape in ((16, 8192), (8192, 8192)):
            for dtype in dtypes:
                rows.append(FakeCase(label, kind, shape, dtype))
    return rows


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def _element(name: str) -> Any:
    import quantplan as qp

    return {"fp32": qp.ElementKind.F32, "bf16": qp.ElementKind.BF16, "fp16": qp.ElementKind.F16}[name]


def torch_formula(x: Any) -> Any:
    """SPEC's fake quantization in PyTorch ops (the compile peer of the forward)."""
    import torch

    inv = 1.0 / torch.tensor(SCALE, dtype=torch.float32, device=x.device)
    q = torch.round(x.float() * inv) + ZERO_POINT
    return ((q.clamp(Q_MIN, Q_MAX) - ZERO_POINT) * SCALE).to(x.dtype)


def torch_ste(x: Any, dy: Any) -> Any:
    """The straight-through gradient in PyTorch ops (the compile peer of the backward)."""
    import torch

    inv = 1.0 / torch.tensor(SCALE, dtype=torch.float32, device=x.device)
    q = torch.round(x.float() * inv) + ZERO_POINT
    return dy * ((q >= Q_MIN) & (q <= Q_MAX))


GROUP = 128


def torch_dynamic(x: Any) -> Any:
    """Symmetric 8-bit group(128) dynamic fake quantization in PyTorch ops (nearest)."""
    import torch

    g = x.float().reshape(-1, GROUP)
    scale = g.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(g * (1.0 / scale)).clamp(-128, 127)
    return (q * scale).to(x.dtype).reshape(x.shape)


def torch_dynamic_stochastic(x: Any) -> Any:
    """As :func:`torch_dynamic` with stochastic rounding: floor(v + u), u ~ U[0, 1)."""
    import torch

    g = x.float().reshape(-1, GROUP)
    scale = g.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.floor(g * (1.0 / scale) + torch.rand_like(g)).clamp(-128, 127)
    return (q * scale).to(x.dtype).reshape(x.shape)


def bench_dynamic_row(case: FakeCase, timing: Timing, use_compile: bool) -> Row:
    """A DynamicRangeFakeQuantizePlan row (group 128, symmetric 8-bit)."""
    import torch

    import quantplan as qp

    stream = torch.cuda.current_stream()
    dtype = _torch_dtype(case.dtype)
    m, n = case.shape
    esize = torch.finfo(dtype).bits // 8
    stochastic = case.kind == "dynamic_stochastic"
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=case.shape,
        scope=qp.GroupScope(axis=-1, group_size=GROUP),
        mode=qp.QuantMode.SYMMETRIC,
        element=_element(case.dtype),
        bits=8,
        rounding=qp.Rounding.STOCHASTIC if stochastic else qp.Rounding.NEAREST_EVEN,
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(stream, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    read, written = m * n * esize, m * n * esize
    kw = {"warmup": timing.warmup, "reps": timing.reps}
    sets = [
        (torch.randn(case.shape, device="cuda", dtype=dtype), torch.empty(case.shape, device="cuda", dtype=dtype))
        for _ in range(harness.rotation_sets(read + written))
    ]
    rng = {"rng_seed": 1234, "rng_offset": 0} if stochastic else {}
    args = [qp.DynamicRangeFakeQuantizeArgs(x, y, **rng) for x, y in sets]
    peer = torch_dynamic_stochastic if stochastic else torch_dynamic
    notes: list[str] = []
    if not stochastic:
        plan.run(stream, ws, args[0])
        torch.cuda.synchronize()
        if not torch.equal(sets[0][1], torch_dynamic(sets[0][0])):
            notes.append("plan != torch formula")
    ours = harness.time_gpu([lambda a=a: plan.run(stream, ws, a) for a in args], **kw)
    eager_us = harness.time_gpu([lambda s=s: peer(s[0]) for s in sets], **kw)
    copy_us, _ = harness.copy_time(read, written, **kw)
    compile_us = None
    if use_compile:
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(peer, dynamic=False)
        compiled(sets[0][0])
        compile_us = harness.time_gpu([lambda s=s: compiled(s[0]) for s in sets], **kw)
    return Row(
        op=case.label,
        shape="x".join(map(str, case.shape)),
        dtype=case.dtype,
        us=ours,
        nbytes=read + written,
        copy_us=copy_us,
        compile_us=compile_us,
        eager_us=eager_us,
        note="; ".join(notes),
        extra={"variant": plan.sku().variant},
    )


def bench_row(case: FakeCase, timing: Timing, use_compile: bool) -> Row:
    import torch

    import quantplan as qp

    if case.kind.startswith("dynamic"):
        return bench_dynamic_row(case, timing, use_compile)
    stream = torch.cuda.current_stream()
    dtype = _torch_dtype(case.dtype)
    m, n = case.shape
    esize = torch.finfo(dtype).bits // 8
    fwd_desc = qp.FakeQuantizeDescriptor(
        shape=case.shape,
        scope=qp.TensorScope(),
        mode=qp.QuantMode.ASYMMETRIC,
        element=_element(case.dtype),
        q_min=Q_MIN,
        q_max=Q_MAX,
    )
    kw = {"warmup": timing.warmup, "reps": timing.reps}
    notes: list[str] = []
    compile_us = None
    if case.kind == "forward":
        plan = qp.FakeQuantizePlan.select(stream, fwd_desc)
        read, written = m * n * esize, m * n * esize
        sets = [
            (
                torch.randn(case.shape, device="cuda", dtype=dtype) * 2,
                torch.empty(case.shape, device="cuda", dtype=dtype),
            )
            for _ in range(harness.rotation_sets(read + written))
        ]
        args = [qp.FakeQuantizeArgs(x, y, SCALE, ZERO_POINT) for x, y in sets]
        plan.run(stream, None, args[0])
        want = torch.fake_quantize_per_tensor_affine(sets[0][0], SCALE, ZERO_POINT, Q_MIN, Q_MAX)
        torch.cuda.synchronize()
        if not torch.equal(sets[0][1], want):
            print(f"WARNING: {case}: plan output differs from torch", flush=True)
            notes.append("plan != torch")
        ours = harness.time_gpu([lambda a=a: plan.run(stream, None, a) for a in args], **kw)
        eager_us = harness.time_gpu(
            [lambda s=s: torch.fake_quantize_per_tensor_affine(s[0], SCALE, ZERO_POINT, Q_MIN, Q_MAX) for s in sets],
            **kw,
        )
        peer: Callable[..., Any] = torch_formula
        peer_args = [(s[0],) for s in sets]
        variant = plan.sku().variant
    elif case.kind == "ste":
        bdesc = qp.FakeQuantizeBackwardDescriptor(**fwd_desc.model_dump())
        plan_b = qp.FakeQuantizeBackwardPlan.select(stream, bdesc)
        read, written = 2 * m * n * esize, m * n * esize
        sets = []
        for _ in range(harness.rotation_sets(read + written)):
            x = torch.randn(case.shape, device="cuda", dtype=dtype) * 2
            dy = torch.randn(case.shape, device="cuda", dtype=dtype)
            _, mask = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(x, SCALE, ZERO_POINT, Q_MIN, Q_MAX)
            sets.append((x, dy, torch.empty_like(dy), mask))
        bargs = [qp.FakeQuantizeBackwardArgs(x, dy, dx, SCALE, ZERO_POINT) for x, dy, dx, _ in sets]
        plan_b.run(stream, None, bargs[0])
        torch.cuda.synchronize()
        if not torch.equal(sets[0][2], torch_ste(sets[0][0], sets[0][1])):
            notes.append("plan != torch")
        ours = harness.time_gpu([lambda a=a: plan_b.run(stream, None, a) for a in bargs], **kw)
        backward = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask_backward
        eager_us = harness.time_gpu([lambda s=s: backward(s[1], s[3]) for s in sets], **kw)
        peer = torch_ste
        peer_args = [(s[0], s[1]) for s in sets]
        variant = plan_b.sku().variant
    else:
        bdesc = qp.FakeQuantizeBackwardDescriptor(**fwd_desc.model_dump(), learnable=True)
        plan_l = qp.FakeQuantizeBackwardPlan.select(stream, bdesc)
        ws = qp.Workspace.allocate(plan_l.workspace_size())
        read, written = 2 * m * n * esize + 8, m * n * esize + 8
        gf = 1.0 / math.sqrt(m * n * Q_MAX)
        sets = []
        for _ in range(harness.rotation_sets(read + written)):
            x = torch.randn(case.shape, device="cuda", dtype=dtype) * 2
            dy = torch.randn(case.shape, device="cuda", dtype=dtype)
            s = torch.tensor([SCALE], device="cuda")
            z = torch.tensor([float(ZERO_POINT)], device="cuda")
            sets.append(
                (x, dy, torch.empty_like(dy), s, z, torch.empty(1, device="cuda"), torch.empty(1, device="cuda"))
            )
        largs = [qp.FakeQuantizeBackwardArgs(x, dy, dx, s, z, ds, dz, gf) for x, dy, dx, s, z, ds, dz in sets]
        ours = harness.time_gpu([lambda a=a: plan_l.run(stream, ws, a) for a in largs], **kw)
        backward_l = torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward
        eager_us = harness.time_gpu(
            [lambda t=t: backward_l(t[1], t[0], t[3], t[4], Q_MIN, Q_MAX, gf) for t in sets], **kw
        )
        peer = None  # type: ignore[assignment]
        peer_args = []
        variant = plan_l.sku().variant
    copy_us, _ = harness.copy_time(read, written, **kw)
    if use_compile and peer is not None:
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(peer, dynamic=False)
        compiled(*peer_args[0])
        compile_us = harness.time_gpu([lambda a=a: compiled(*a) for a in peer_args], **kw)
    return Row(
        op=case.label,
        shape="x".join(map(str, case.shape)),
        dtype=case.dtype,
        us=ours,
        nbytes=read + written,
        copy_us=copy_us,
        compile_us=compile_us,
        eager_us=eager_us,
        note="; ".join(notes),
        extra={"variant": variant},
    )


def main(argv: list[str] | None = None) -> int:
    """Run the rows; print the markdown table (and JSON with ``--json``). Exit 1 if a row failed.

    The ``× eager`` column is the ratio to PyTorch's native op (for the learnable row: its
    learnable backward; for the dynamic rows, the eager formula)."""
    return harness.bench_main(
        "bench_fake_quantize", __doc__.split("\n\n")[0], argv, cases(), lambda c: c.label, bench_row
    )


if __name__ == "__main__":
    sys.exit(main())
