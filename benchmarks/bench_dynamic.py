"""Benchmark DynamicRangeQuantizePlan against a copy, PyTorch eager and torch.compile.

Rows (8): per-token symmetric {int8, fp8 e4m3} x {16x8192, 8192x8192} x {fp16, bf16}. Peers
compute the same math (SPEC section 4): ``amax = max|x|`` per row, ``scale = amax / q_max``
(448 for e4m3; 0 -> 1), ``q = clamp(rne(x / scale))`` (fp8: cast with rne). Effective bandwidth
counts the op's bytes: input read once, codes and scales written. Method: :mod:`harness`.

Usage (on a GPU machine)::

    PYTHONPATH=. python benchmarks/bench_dynamic.py [--json PATH] [--quick] [--no-compile]
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402
from bench_quantize import Timing, parse_args  # noqa: E402
from harness import Row  # noqa: E402

SHAPES: tuple[tuple[int, int], ...] = ((16, 8192), (8192, 8192))
DTYPES: tuple[str, ...] = ("fp16", "bf16")
CODES: tuple[str, ...] = ("S8", "FP8_E4M3")


def torch_math(code: str) -> Callable[[Any], tuple[Any, Any]]:
    """PyTorch eager dynamic per-token quantization: ``f(x) -> (q, scale)``."""
    import torch

    q_max, out_dtype = (127.0, torch.int8) if code == "S8" else (448.0, torch.float8_e4m3fn)

    def dynamic_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        amax = xf.abs().amax(dim=-1, keepdim=True)
        # Tensor / tensor: IEEE division (PyTorch turns a division by a Python scalar into a
        # multiplication by its rounded reciprocal, which is not the spec's scale).
        scale = amax / torch.full_like(amax, q_max)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        v = xf / scale
        q = torch.round(v).clamp(-128, 127).to(out_dtype) if code == "S8" else v.to(out_dtype)
        return q, scale

    return dynamic_token


def bench_row(code: str, shape: tuple[int, int], dtype: str, timing: Timing, use_compile: bool) -> Row:
    import torch

    import quantplan as qp

    stream = torch.cuda.current_stream()
    float_dtype = torch.float16 if dtype == "fp16" else torch.bfloat16
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape,
        scope=qp.TokenScope(),
        input_element=qp.ElementKind.F16 if dtype == "fp16" else qp.ElementKind.BF16,
        output_element=qp.ElementKind[code],
    )
    plan = qp.DynamicRangeQuantizePlan.select(stream, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    code_dtype = torch.int8 if code == "S8" else torch.float8_e4m3fn
    m = shape[0]
    moved = shape[0] * shape[1] * (2 + 1) + m * 4
    sets = []
    for _ in range(harness.rotation_sets(moved)):
        x = torch.randn(shape, device="cuda", dtype=float_dtype)
        sets.append((x, torch.empty(shape, device="cuda", dtype=code_dtype), torch.empty((m, 1), device="cuda")))
    args = [qp.DynamicRangeQuantizeArgs(x, q, s) for x, q, s in sets]
    math_fn = torch_math(code)
    plan.run(stream, ws, args[0])
    want_q, want_s = math_fn(sets[0][0])
    torch.cuda.synchronize()
    notes = []
    if not torch.equal(sets[0][2], want_s) or not torch.equal(sets[0][1].view(torch.uint8), want_q.view(torch.uint8)):
        print(f"WARNING: dynamic {code} {shape} {dtype}: plan output differs from PyTorch eager", flush=True)
        notes.append("plan != eager")
    kw = {"warmup": timing.warmup, "reps": timing.reps}
    ours = harness.time_gpu([lambda a=a: plan.run(stream, ws, a) for a in args], **kw)
    copy_us, _ = harness.copy_time(shape[0] * shape[1] * 2, moved - shape[0] * shape[1] * 2, **kw)
    eager_us = harness.time_gpu([lambda s=s: math_fn(s[0]) for s in sets], **kw)
    compile_us = None
    if use_compile:
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(math_fn, dynamic=False)
        compiled(sets[0][0])
        compile_us = harness.time_gpu([lambda s=s: compiled(s[0]) for s in sets], **kw)
    label = "dynamic s8 token" if code == "S8" else "dynamic fp8 token"
    return Row(
        op=label,
        shape="x".join(map(str, shape)),
        dtype=dtype,
        us=ours,
        nbytes=moved,
        copy_us=copy_us,
        compile_us=compile_us,
        eager_us=eager_us,
        note="; ".join(notes),
        extra={"variant": plan.sku().variant},
    )


def main(argv: list[str] | None = None) -> int:
    """Run the rows; print the markdown table (and JSON with ``--json``). Exit 1 if a row failed."""
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_dynamic: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    timing = Timing(warmup=3, reps=20, host_calls=300) if args.quick else Timing(warmup=10, reps=100, host_calls=2000)
    torch.manual_seed(0)
    meta = harness.device_summary()
    rows: list[Row] = []
    failed = 0
    for code in CODES:
        for shape in SHAPES:
            for dtype in DTYPES:
                try:
                    rows.append(bench_row(code, shape, dtype, timing, not args.no_compile))
                except Exception:
                    failed += 1
                    print(f"ERROR: {code} {shape} {dtype}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                finally:
                    torch.cuda.empty_cache()
    if args.json:
        harness.write_json(rows, args.json, meta)
    harness.print_markdown(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
