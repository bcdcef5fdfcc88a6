"""Benchmark DynamicRangeQuantizePlan against a copy, PyTorch eager and torch.compile.

Rows (18), each in fp16 and bf16: per-token symmetric int8 and fp8 e4m3 at 16x8192 and
8192x8192; per-group(128) asymmetric uint4 at 16x8192 and 8192x8192; per-channel (axis 0, a
weight's output channels) int8 at 8192x8192; per-tensor fp8 e4m3 at 4096x4096 and 16384x16384.
Peers compute the same math (SPEC section 4): ``scale = amax / q_max`` (448 for e4m3; 0 -> 1),
``q = clamp(rne(x / scale))`` (fp8: cast with rne); asymmetric ``lo = min(min x, 0)``,
``hi = max(max x, 0)``, ``scale = (hi - lo) / 15``, ``zp = clamp(-rne(lo / scale))``. The plan's
output is checked equal to eager's before timing. Effective bandwidth counts the op's bytes:
input read once, codes and parameters written. Method: :mod:`harness`.

Usage (on a GPU machine)::

    PYTHONPATH=. python benchmarks/bench_dynamic.py [--json PATH] [--quick] [--no-compile]
"""

from __future__ import annotations

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
from bench_quantize import GROUP  # noqa: E402
from harness import Row, Timing  # noqa: E402


@dataclass(frozen=True)
class DynamicCase:
    """One row: scheme (scope, code, mode), shape and float dtype."""

    label: str
    scope: str  # token | group128 | channel0 | tensor
    code: str  # ElementKind name
    asymmetric: bool
    shape: tuple[int, int]
    dtype: str


def cases() -> list[DynamicCase]:
    """The rows of the dynamic-range issue, in table order."""
    rows: list[DynamicCase] = []
    for label, code in (("dynamic s8 token", "S8"), ("dynamic fp8 token", "FP8_E4M3")):
        for shape in ((16, 8192), (8192, 8192)):
            for dtype in ("fp16", "bf16"):
                rows.append(DynamicCase(label, "token", code, False, shape, dtype))
    for shape in ((16, 8192), (8192, 8192)):
        for dtype in ("fp16", "bf16"):
            rows.append(DynamicCase("dynamic u4 asym group128", "group128", "U4", True, shape, dtype))
    for dtype in ("fp16", "bf16"):
        rows.append(DynamicCase("dynamic s8 channel(axis 0)", "channel0", "S8", False, (8192, 8192), dtype))
    for shape in ((4096, 4096), (16384, 16384)):
        for dtype in ("fp16", "bf16"):
            rows.append(DynamicCase("dynamic fp8 tensor", "tensor", "FP8_E4M3", False, shape, dtype))
    return rows


def torch_math(case: DynamicCase) -> Callable[[Any], tuple[Any, ...]]:
    """PyTorch doing the same math (SPEC section 4): ``f(x) -> (q, scale[, zp])``.

    Divisions are tensor / tensor (IEEE); PyTorch turns a division by a Python scalar into a
    multiplication by its rounded reciprocal, which is not the spec's scale.
    """
    import torch

    fp8 = case.code.startswith("FP8")
    q_max = 448.0 if fp8 else 127.0
    m, n = case.shape

    def symmetric(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        if case.scope == "tensor":
            amax = xf.abs().amax().reshape(1, 1)
        else:  # token and channel(axis 0) of a 2-D tensor: one scale per row
            amax = xf.abs().amax(dim=-1, keepdim=True)
        scale = amax / torch.full_like(amax, q_max)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        v = xf / scale
        q = v.to(torch.float8_e4m3fn) if fp8 else torch.round(v).clamp(-128, 127).to(torch.int8)
        return q, scale

    def asymmetric_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xf = x.float().view(m, n // GROUP, GROUP)
        lo = xf.amin(dim=-1, keepdim=True).clamp(max=0.0)
        hi = xf.amax(dim=-1, keepdim=True).clamp(min=0.0)
        scale = (hi - lo) / torch.full_like(lo, 15.0)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zp = (-torch.round(lo / scale)).clamp(0, 15)
        q = (torch.round(xf / scale) + zp).clamp(0, 15).to(torch.uint8).view(m, n)
        packed = q[:, 0::2] | (q[:, 1::2] << 4)
        return packed, scale.view(m, n // GROUP), zp.to(torch.int32).view(m, n // GROUP)

    return asymmetric_groups if case.asymmetric else symmetric


def _descriptor(case: DynamicCase) -> Any:
    import quantplan as qp

    scope = {
        "token": qp.TokenScope(),
        "group128": qp.GroupScope(axis=-1, group_size=GROUP),
        "channel0": qp.ChannelScope(axis=0),
        "tensor": qp.TensorScope(),
    }[case.scope]
    return qp.DynamicRangeQuantizeDescriptor(
        shape=case.shape,
        scope=scope,
        mode=qp.QuantMode.ASYMMETRIC if case.asymmetric else qp.QuantMode.SYMMETRIC,
        input_element=qp.ElementKind.F16 if case.dtype == "fp16" else qp.ElementKind.BF16,
        output_element=qp.ElementKind[case.code],
    )


def bench_row(case: DynamicCase, timing: Timing, use_compile: bool) -> Row:
    import torch

    import quantplan as qp

    stream = torch.cuda.current_stream()
    float_dtype = torch.float16 if case.dtype == "fp16" else torch.bfloat16
    desc = _descriptor(case)
    plan = qp.DynamicRangeQuantizePlan.select(stream, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    code_dtype = {"S8": torch.int8, "FP8_E4M3": torch.float8_e4m3fn, "U4": torch.uint8}[case.code]
    m, n = case.shape
    params = 1
    for e in desc.param_shape:
        params *= e
    q_bytes = m * n // 2 if case.code == "U4" else m * n
    read = m * n * 2
    written = q_bytes + params * (8 if case.asymmetric else 4)
    sets = []
    for _ in range(harness.rotation_sets(read + written)):
        x = torch.randn(case.shape, device="cuda", dtype=float_dtype)
        q = torch.empty(desc.output_shape, device="cuda", dtype=code_dtype)
        s = torch.empty(desc.param_shape, device="cuda")
        z = torch.empty(desc.param_shape, device="cuda", dtype=torch.int32) if case.asymmetric else None
        sets.append((x, q, s, z))
    args = [qp.DynamicRangeQuantizeArgs(x, q, s, z) for x, q, s, z in sets]
    math_fn = torch_math(case)
    plan.run(stream, ws, args[0])
    want = math_fn(sets[0][0])
    torch.cuda.synchronize()
    notes = []
    x0, q0, s0, z0 = sets[0]
    same = torch.equal(q0.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(s0, want[1].view(s0.shape))
    if case.asymmetric:
        same = same and torch.equal(z0, want[2].view(z0.shape))
    if not same:
        print(f"WARNING: {case}: plan output differs from PyTorch eager", flush=True)
        notes.append("plan != eager")
    kw = {"warmup": timing.warmup, "reps": timing.reps}
    ours = harness.time_gpu([lambda a=a: plan.run(stream, ws, a) for a in args], **kw)
    copy_us, _ = harness.copy_time(read, written, **kw)
    eager_us = harness.time_gpu([lambda s=s: math_fn(s[0]) for s in sets], **kw)
    compile_us = None
    if use_compile:
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(math_fn, dynamic=False)
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


def main(argv: list[str] | None = None) -> int:
    """Run the rows; print the markdown table (and JSON with ``--json``). Exit 1 if a row failed."""
    return harness.bench_main("bench_dynamic", __doc__.split("\n\n")[0], argv, cases(), lambda c: c.label, bench_row)


if __name__ == "__main__":
    sys.exit(main())
