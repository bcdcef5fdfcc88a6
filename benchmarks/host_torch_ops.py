"""Host cost of the ``quantplan`` torch.library operators in eager mode, on CPU (or CUDA) tensors.

Each row is one call's µs; rows run interleaved (round r of every row, then round r + 1), and
the table gives each row's median over the rounds, so a noisy shared host moves every row alike.

* ``plan.run checked`` / ``check=False``: :class:`~quantplan.FakeQuantizePlan` with the output
  preallocated -- the plan API's cost (CPU: the reference backend on NumPy views; CUDA: the
  kernel on the current stream).
* ``op``: ``torch.ops.quantplan.fake_quantize`` called directly: the dispatcher, the operator's
  Autograd kernel, the front-end (target, cached plan, parameters, output allocation) and the
  same plan unchecked; ``op, x requires grad`` records the backward too.
  ``qpt.fake_quantize`` is what the public function costs in eager mode (no dispatcher), and
  ``autograd.Function`` the adapter's Function alone (``FakeQuantizeFunction.apply``).
* ``dispatch: ...``: an operator whose kernel only returns ``x.new_empty(x.shape)``, defined
  three ways -- ``torch.library.custom_op`` (high-level), ``Library.define`` + ``impl`` (+
  ``register_fake``, ``register_autograd``; or an Autograd kernel of one's own that re-dispatches),
  and a plain ``autograd.Function`` -- so the difference is the registration API's own overhead.

Usage::

    python3 benchmarks/host_torch_ops.py [--calls 2000] [--rounds 15] [--shape 16,64]
    python3 benchmarks/host_torch_ops.py --device cuda      # on a GPU: 16x8192 float16, the kernels
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

_KEEP: list[Any] = []


def dispatch_rows(torch: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The trivial operator, registered three ways."""
    lib = torch.library.Library("qp_host_bench", "FRAGMENT")
    lib.define("empty_like_low(Tensor x, float s) -> Tensor")

    def kernel(x: Any, s: float) -> Any:
        return x.new_empty(x.shape)

    lib.impl("empty_like_low", kernel, "CPU")
    torch.library.register_fake("qp_host_bench::empty_like_low", kernel, lib=lib)

    def setup(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    def backward(ctx: Any, dy: Any) -> Any:
        return dy, None

    torch.library.register_autograd("qp_host_bench::empty_like_low", backward, setup_context=setup, lib=lib)
    low = torch.ops.qp_host_bench.empty_like_low.default

    # the alternative to register_autograd: an Autograd kernel of our own, an autograd.Function
    # whose forward re-dispatches below autograd
    lib.define("empty_like_own(Tensor x, float s) -> Tensor")
    lib.impl("empty_like_own", kernel, "CPU")
    torch.library.register_fake("qp_host_bench::empty_like_own", kernel, lib=lib)
    own = torch.ops.qp_host_bench.empty_like_own.default

    class Redispatch(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, s: float) -> Any:
            with torch._C._AutoDispatchBelowAutograd():
                return own(x, s)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            return dy, None

    lib.impl("empty_like_own", Redispatch.apply, "Autograd")

    def high_kernel(x: Any, s: float) -> Any:
        return x.new_empty(x.shape)

    # string annotations (``from __future__``) are not evaluated by custom_op: the schema is given
    high = torch.library.custom_op(
        "qp_host_bench::empty_like_high", high_kernel, mutates_args=(), schema="(Tensor x, float s) -> Tensor"
    )

    high.register_fake(kernel)
    high.register_autograd(backward, setup_context=setup)

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, s: float) -> Any:
            return x.new_empty(x.shape)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            return dy, None

    x = torch.randn(16, 64)
    xg = x.clone().requires_grad_()
    rows: list[tuple[str, Callable[[], Any]]] = []
    rows.append(("dispatch: Library.define + impl", lambda: low(x, 0.5)))
    rows.append(("dispatch: torch.library.custom_op", lambda: high(x, 0.5)))
    rows.append(("dispatch: Library.define + impl, x requires grad", lambda: low(xg, 0.5)))
    rows.append(("dispatch: torch.library.custom_op, x requires grad", lambda: high(xg, 0.5)))
    rows.append(("dispatch: Library.define + own Autograd kernel, x requires grad", lambda: own(xg, 0.5)))
    rows.append(("dispatch: autograd.Function, x requires grad", lambda: Function.apply(xg, 0.5)))
    rows.append(("dispatch: x.new_empty alone", lambda: x.new_empty(x.shape)))
    _KEEP.append(lib)  # the library lives as long as the rows
    return rows


def op_rows(torch: Any, shape: tuple[int, ...], device: str, dtype: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The plan API and the fake-quantize operator on the same tensor (CPU: the reference
    backend on NumPy views; CUDA: the kernels on the current stream)."""
    import quantplan as qp
    import quantplan.pytorch as qpt
    from quantplan._frontend import Target

    x = torch.randn(*shape, device=device).to(dtype)
    xg = x.clone().requires_grad_()
    y = torch.empty_like(x)
    kind = {torch.float16: qp.ElementKind.F16, torch.bfloat16: qp.ElementKind.BF16, torch.float32: qp.ElementKind.F32}
    desc = qp.FakeQuantizeDescriptor(shape=shape, scope=qp.TensorScope(), element=kind[dtype], q_min=-128, q_max=127)
    target = Target.of(x)
    plan = target.select(qp.FakeQuantizePlan, desc)
    args = qp.FakeQuantizeArgs(input=target.arg(x), output=target.arg(y), scale=0.05)
    stream = target.handle
    op = torch.ops.quantplan.fake_quantize.default
    scope = [0, 0, 0]
    return [
        ("plan.run checked", lambda: plan.run(stream, None, args)),
        ("plan.run check=False", lambda: plan.run(stream, None, args, check=False)),
        ("op (torch.ops.quantplan.fake_quantize)", lambda: op(x, None, 0.05, None, None, scope, -128, 127)),
        ("qpt.fake_quantize(x, 0.05)", lambda: qpt.fake_quantize(x, 0.05)),
        ("op, x requires grad", lambda: op(xg, None, 0.05, None, None, scope, -128, 127)),
        ("qpt.fake_quantize(x, 0.05), x requires grad", lambda: qpt.fake_quantize(xg, 0.05)),
        (
            "autograd.Function, x requires grad",
            lambda: qpt.FakeQuantizeFunction.apply(xg, 0.05, None, qp.TensorScope(), -128, 127),
        ),
        ("torch.empty_like(x) (one output's allocation)", lambda: torch.empty_like(x)),
    ]


def interleaved(
    rows: list[tuple[str, Callable[[], Any]]], calls: int, rounds: int, sync: Callable[[], Any] = lambda: None
) -> list[tuple[str, float]]:
    """Median µs per call of each row over ``rounds`` interleaved rounds of ``calls`` calls (each
    round ends with ``sync()``: the GPU's queue drained)."""
    times: list[list[float]] = [[] for _ in rows]
    for _, fn in rows:
        for _ in range(50):
            fn()
    for _ in range(rounds):
        for i, (_, fn) in enumerate(rows):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[i].append((time.perf_counter() - t0) * 1e6 / calls)
    return [(name, statistics.median(t)) for (name, _), t in zip(rows, times, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shape", default=None, help="default 16,64 on CPU, 16,8192 on CUDA")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or float16 (CUDA default), bfloat16")
    opt = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cuda = opt.device == "cuda"
    shape = tuple(int(e) for e in (opt.shape or ("16,8192" if cuda else "16,64")).split(","))
    dtype = getattr(torch, opt.dtype or ("float16" if cuda else "float32"))
    rows = op_rows(torch, shape, opt.device, dtype) + dispatch_rows(torch)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"| row ({opt.device} {dtype} {shape}, interleaved medians) | µs per call |\n|---|---:|")
    for name, us in interleaved(rows, opt.calls, opt.rounds, sync):
        print(f"| {name} | {us:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
