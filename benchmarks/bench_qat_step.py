"""A small QAT training step: ``quantplan.pytorch`` against PyTorch's own fake-quant ops.

The step: ``x -> fq(x) -> Linear(W1 fq per channel) -> ReLU -> fq -> Linear(W2 fq per channel) ->
loss -> backward -> SGD``, activations fake-quantized per tensor (scale 0.05), weights per output
channel (scales from the weights' range at start, zero points 0), int8 range. The PyTorch step
uses ``torch.fake_quantize_per_tensor_affine`` / ``torch.fake_quantize_per_channel_affine``; the
quantplan step :func:`quantplan.pytorch.fake_quantize` (the same bits, forward and gradient).
Small layers make the step launch-bound: the difference is the host cost per op.

Prints one markdown table: ms per step (median of 7 rounds of ``--steps`` steps, synchronised at
the end of each round) for each width, eager and (``--compile MODE``) compiled, and the ratio.

Usage (GPU)::

    python3 benchmarks/bench_qat_step.py [--steps 200] [--widths 256,1024] [--compile reduce-overhead]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def make_step(width: int, batch: int, use_quantplan: bool, compile_mode: str | None = None) -> Callable[[], Any]:
    """One training step of the two-layer model, with its parameters and optimizer; with
    ``compile_mode`` the forward and loss are ``torch.compile(mode=compile_mode, fullgraph=True)``
    (the backward graph is compiled with them; zero_grad and the SGD step stay eager)."""
    import torch

    import quantplan as qp
    import quantplan.pytorch as qpt

    torch.manual_seed(0)
    dev = "cuda"
    w1 = torch.nn.Parameter(torch.randn(width, width, device=dev) / width**0.5)
    w2 = torch.nn.Parameter(torch.randn(width, width, device=dev) / width**0.5)
    s1 = (w1.detach().abs().amax(dim=1) / 127).clamp_min(1e-8)
    s2 = (w2.detach().abs().amax(dim=1) / 127).clamp_min(1e-8)
    z = torch.zeros(width, dtype=torch.int32, device=dev)
    x = torch.randn(batch, width, device=dev)
    opt = torch.optim.SGD([w1, w2], lr=1e-3)
    channel = qp.ChannelScope(axis=0)

    if use_quantplan:

        def fq_act(t: Any) -> Any:
            return qpt.fake_quantize(t, 0.05, None, -128, 127)

        def fq_w(t: Any, s: Any) -> Any:
            return qpt.fake_quantize(t, s, z, -128, 127, channel)
    else:

        def fq_act(t: Any) -> Any:
            return torch.fake_quantize_per_tensor_affine(t, 0.05, 0, -128, 127)

        def fq_w(t: Any, s: Any) -> Any:
            return torch.fake_quantize_per_channel_affine(t, s, z, 0, -128, 127)

    def forward() -> Any:
        h = torch.relu(fq_act(x) @ fq_w(w1, s1).t())
        y = fq_act(h) @ fq_w(w2, s2).t()
        return y.square().mean()

    if compile_mode is not None:
        forward = torch.compile(forward, mode=compile_mode, fullgraph=True)

    def step() -> Any:
        loss = forward()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def ms_per_step(step: Callable[[], Any], steps: int) -> float:
    import torch

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e3 / steps)
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--widths", default="256,1024")
    parser.add_argument(
        "--compile",
        default=None,
        help="also time both steps under torch.compile(mode=COMPILE, fullgraph=True), e.g. default or reduce-overhead",
    )
    opt = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU")
        return 2
    modes: list[str | None] = [None] if opt.compile is None else [None, opt.compile]
    print("| width x batch | mode | PyTorch fake-quant ms/step | quantplan.pytorch ms/step | quantplan / PyTorch |")
    print("|---|---|---:|---:|---:|")
    for width in (int(w) for w in opt.widths.split(",")):
        for mode in modes:
            ours = ms_per_step(make_step(width, opt.batch, True, mode), opt.steps)
            theirs = ms_per_step(make_step(width, opt.batch, False, mode), opt.steps)
            label = "eager" if mode is None else f"compile {mode}"
            print(f"| {width} x {opt.batch} | {label} | {theirs:.4f} | {ours:.4f} | {ours / theirs:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
