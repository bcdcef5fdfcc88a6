"""Benchmark QuantizePlan and DequantizePlan against a copy, PyTorch eager and torch.compile.

Rows (16): {quantize, dequantize} x {per-token int8, per-group(128) int4} x {16x8192, 8192x8192}
x {fp16, bf16}, all symmetric; and their gradients (8 rows, bf16): ``quantize bwd`` (QuantizeBackwardPlan,
``dx = dq / scale`` inside the mask, from ``x`` and ``dq``) and ``dequantize bwd``
(DequantizeBackwardPlan, ``dq = dy * scale``). For each row, in the same run: the plan's median kernel time, a
device-to-device copy of the same bytes, PyTorch eager doing the same math (SPEC section 4) and
``torch.compile`` of that math (default mode, compiled once per row and warmed up). Before timing,
the plan's output is compared with eager's (exact equality expected) and a warning printed if
they differ. Method and cache policy: :mod:`harness` (SPEC section 6).

Usage (on a GPU machine; the package need not be installed)::

    PYTHONPATH=. python benchmarks/bench_quantize.py [--json PATH] [--quick] [--no-compile]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):  # the repo root (quantplan) and this folder (harness)
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402
from harness import Row, Timing  # noqa: E402

if TYPE_CHECKING:
    import torch

SHAPES: tuple[tuple[int, int], ...] = ((16, 8192), (8192, 8192))
DTYPES: tuple[str, ...] = ("fp16", "bf16")
GROUP = 128
#: (label, code kind name, scope kind, q_min, q_max)
SCHEMES: tuple[tuple[str, str, str, int, int], ...] = (
    ("s8 token", "S8", "token", -128, 127),
    ("s4 group128", "S4", "group", -8, 7),
)
#: The row whose ``plan.run`` host time is reported.
HOST_ROW = ("s8 token", (8192, 8192), "bf16")


@dataclass(frozen=True)
class Case:
    """One row of the table: direction, code scheme, shape and float dtype."""

    quantize: bool
    scheme: str
    code: str
    scope: str
    q_min: int
    q_max: int
    shape: tuple[int, int]
    dtype: str
    #: The gradient plan (QuantizeBackwardPlan / DequantizeBackwardPlan) instead of the forward.
    backward: bool = False

    @property
    def op(self) -> str:
        return f"{'quantize' if self.quantize else 'dequantize'}{' bwd' if self.backward else ''} {self.scheme}"

    @property
    def shape_str(self) -> str:
        return "x".join(map(str, self.shape))

    @property
    def label(self) -> str:
        return f"{self.op} {self.shape_str} {self.dtype}"


def cases() -> list[Case]:
    """All 16 rows, in table order."""
    out = []
    for quantize in (True, False):
        for scheme, code, scope, q_min, q_max in SCHEMES:
            for shape in SHAPES:
                for dtype in DTYPES:
                    out.append(Case(quantize, scheme, code, scope, q_min, q_max, shape, dtype))
    for quantize in (True, False):
        for scheme, code, scope, q_min, q_max in SCHEMES:
            for shape in SHAPES:
                out.append(Case(quantize, scheme, code, scope, q_min, q_max, shape, "bf16", backward=True))
    return out


# ---- the math in PyTorch (SPEC section 4; symmetric, so zp = 0) ------------------------------


def torch_math(case: Case) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """PyTorch eager implementation of ``case``: ``f(input, scale) -> output``.

    Quantize: ``q = clamp(rne(x.float() / scale), q_min, q_max)`` as int8 (``torch.round`` is half
    to even); int4 codes are packed two per byte, element 2i in the low nibble. Dequantize:
    ``y = (q.float() * scale).to(dtype)``, int4 nibbles unpacked and sign-extended first.
    """
    import torch

    q_min, q_max = case.q_min, case.q_max
    float_dtype = _torch_dtype(case.dtype)

    if case.quantize and case.scope == "token":

        def quantize_token(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return torch.round(x.float() / scale).clamp(q_min, q_max).to(torch.int8)

        return quantize_token

    if case.quantize:

        def quantize_group(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            m, n = x.shape
            v = x.float().reshape(m, n // GROUP, GROUP) / scale.unsqueeze(-1)
            u = torch.round(v).clamp(q_min, q_max).to(torch.int8).reshape(m, n).view(torch.uint8)
            return (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)

        return quantize_group

    if case.scope == "token":

        def dequantize_token(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return (q.float() * scale).to(float_dtype)

        return dequantize_token

    def dequantize_group(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        m, half = packed.shape
        lo = (packed << 4).view(torch.int8) >> 4  # sign-extended low nibble (element 2i)
        hi = packed.view(torch.int8) >> 4  # sign-extended high nibble (element 2i + 1)
        q = torch.stack((lo, hi), dim=-1).reshape(m, 2 * half // GROUP, GROUP)
        return (q.float() * scale.unsqueeze(-1)).reshape(m, 2 * half).to(float_dtype)

    return dequantize_group


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


# ---- operands and plans -----------------------------------------------------------------------


@dataclass
class Operands:
    """One buffer set of a row: plan input, plan output (preallocated) and scale."""

    input: torch.Tensor
    output: torch.Tensor
    scale: torch.Tensor


def make_descriptor(case: Case) -> Any:
    """The quantplan descriptor of ``case``."""
    import quantplan as qp

    scope = qp.TokenScope() if case.scope == "token" else qp.GroupScope(axis=-1, group_size=GROUP)
    float_kind = qp.ElementKind.F16 if case.dtype == "fp16" else qp.ElementKind.BF16
    code_kind = qp.ElementKind[case.code]
    if case.quantize:
        return qp.QuantizeDescriptor(shape=case.shape, scope=scope, input_element=float_kind, output_element=code_kind)
    return qp.DequantizeDescriptor(shape=case.shape, scope=scope, input_element=code_kind, output_element=float_kind)


def make_operands(case: Case, desc: Any) -> Operands:
    """Random operands of ``case``: normal floats with amax-derived scales, or random codes."""
    import torch

    m, n = case.shape
    float_dtype = _torch_dtype(case.dtype)
    code_dtype = torch.uint8 if case.code == "S4" else torch.int8
    if case.quantize:
        x = torch.randn(case.shape, device="cuda", dtype=float_dtype)
        xf = x.float() if case.scope == "token" else x.float().reshape(m, n // GROUP, GROUP)
        scale = (xf.abs().amax(dim=-1, keepdim=case.scope == "token") / case.q_max).clamp_min(1e-8).contiguous()
        output = torch.empty(desc.output_shape, device="cuda", dtype=code_dtype)
        ops = Operands(x, output, scale)
    else:
        if case.code == "S4":
            codes = torch.randint(0, 256, desc.input_shape, device="cuda", dtype=torch.uint8)
        else:
            codes = torch.randint(case.q_min, case.q_max + 1, desc.input_shape, device="cuda", dtype=torch.int8)
        scale = torch.rand(desc.param_shape, device="cuda", dtype=torch.float32) * 1e-2 + 1e-3
        output = torch.empty(desc.output_shape, device="cuda", dtype=float_dtype)
        ops = Operands(codes, output, scale)
    assert tuple(ops.scale.shape) == tuple(desc.param_shape), (ops.scale.shape, desc.param_shape)
    return ops


def nbytes(ops: Operands) -> int:
    """Bytes read plus bytes written by one call: input + output + scale."""
    return sum(t.numel() * t.element_size() for t in (ops.input, ops.output, ops.scale))


def _mismatch(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when ``got`` equals ``want`` exactly (bit for bit), else a short description."""
    import torch

    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)}/{got.dtype} vs {tuple(want.shape)}/{want.dtype}"
    a, b = got.contiguous().view(-1), want.contiguous().view(-1)
    if a.element_size() == 2:
        a, b = a.view(torch.int16), b.view(torch.int16)
    diff = a != b
    count = int(diff.sum())
    if count == 0:
        return None
    first = int(diff.nonzero()[0, 0])
    g, w = got.reshape(-1)[first].item(), want.reshape(-1)[first].item()
    return f"{count} of {a.numel()} elements differ (first at flat index {first}: {g} vs {w})"


# ---- one row ----------------------------------------------------------------------------------


def torch_backward_math(case: Case) -> Callable[..., torch.Tensor]:
    """PyTorch eager gradient of ``case``: quantize ``f(x, dq, scale) -> dx`` with
    ``dx = where(q_min <= rne(x / scale) <= q_max, dq / scale, 0)``; dequantize
    ``f(dy, scale) -> dq = dy * scale`` (group scales broadcast over their groups)."""
    import torch

    def grouped(t: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if case.scope == "token":
            return t.float(), scale
        m, n = t.shape
        return t.float().reshape(m, n // GROUP, GROUP), scale.unsqueeze(-1)

    if case.quantize:

        def quantize_backward(x: torch.Tensor, dq: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            xv, s = grouped(x, scale)
            dv, _ = grouped(dq, scale)
            r = torch.round(xv / s)
            dx = torch.where((r >= case.q_min) & (r <= case.q_max), dv / s, torch.zeros_like(dv))
            return dx.reshape(x.shape).to(x.dtype)

        return quantize_backward

    def dequantize_backward(dy: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        dv, s = grouped(dy, scale)
        return (dv * s).reshape(dy.shape).to(dy.dtype)

    return dequantize_backward


def bench_backward_case(case: Case, timing: Timing, use_compile: bool) -> Row:
    """Time a gradient row: plan, copy of the same bytes, eager and torch.compile of the same math."""
    import torch

    import quantplan as qp

    stream = torch.cuda.current_stream()
    forward = make_descriptor(case)
    dtype = _torch_dtype(case.dtype)
    m, n = case.shape
    esize = 2
    math_fn = torch_backward_math(case)
    if case.quantize:
        plan: Any = qp.QuantizeBackwardPlan.select(stream, qp.QuantizeBackwardDescriptor.from_forward(forward))
        moved = 3 * m * n * esize
    else:
        plan = qp.DequantizeBackwardPlan.select(stream, qp.DequantizeBackwardDescriptor.from_forward(forward))
        moved = 2 * m * n * esize
    sets = []
    for _ in range(harness.rotation_sets(moved)):
        x = torch.randn(case.shape, device="cuda", dtype=dtype)
        xf = x.float() if case.scope == "token" else x.float().reshape(m, n // GROUP, GROUP)
        # Scales a little below amax / q_max, so some elements fall outside the mask.
        scale = (xf.abs().amax(dim=-1, keepdim=case.scope == "token") / (case.q_max + 8)).clamp_min(1e-8)
        grad = torch.randn(case.shape, device="cuda", dtype=dtype)
        out = torch.empty_like(grad)
        if case.quantize:
            sets.append(((x, grad, scale.contiguous()), qp.QuantizeBackwardArgs(x, grad, out, scale.contiguous()), out))
        else:
            sets.append(((grad, scale.contiguous()), qp.DequantizeBackwardArgs(grad, out, scale.contiguous()), out))
    notes: list[str] = []
    plan.run(stream, None, sets[0][1])
    want = math_fn(*sets[0][0])
    torch.cuda.synchronize()
    if not torch.equal(sets[0][2], want):
        print(f"WARNING: {case.label}: plan output differs from PyTorch eager", flush=True)
        notes.append("plan != eager")
    kw = {"warmup": timing.warmup, "reps": timing.reps}
    ours = harness.time_gpu([lambda a=a: plan.run(stream, None, a) for _, a, _ in sets], **kw)
    copy_us, _ = harness.copy_time(moved - m * n * esize, m * n * esize, **kw)
    eager_us = harness.time_gpu([lambda t=t: math_fn(*t) for t, _, _ in sets], **kw)
    compile_us: float | None = None
    if use_compile:
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(math_fn, dynamic=False)
        compiled(*sets[0][0])
        compile_us = harness.time_gpu([lambda t=t: compiled(*t) for t, _, _ in sets], **kw)
    return Row(
        op=case.op,
        shape=case.shape_str,
        dtype=case.dtype,
        us=ours,
        nbytes=moved,
        copy_us=copy_us,
        compile_us=compile_us,
        eager_us=eager_us,
        note="; ".join(notes),
        extra={"variant": plan.sku().variant},
    )


def bench_case(case: Case, timing: Timing, use_compile: bool) -> Row:
    """Time ``case``: plan, copy of the same bytes, eager, torch.compile; verify the plan first."""
    import torch

    import quantplan as qp

    if case.backward:
        return bench_backward_case(case, timing, use_compile)

    stream = torch.cuda.current_stream()
    desc = make_descriptor(case)
    plan_cls = qp.QuantizePlan if case.quantize else qp.DequantizePlan
    args_cls = qp.QuantizeArgs if case.quantize else qp.DequantizeArgs
    plan = plan_cls.select(stream, desc)

    first = make_operands(case, desc)
    moved = nbytes(first)
    sets = [first] + [make_operands(case, desc) for _ in range(harness.rotation_sets(moved) - 1)]
    args = [args_cls(input=o.input, output=o.output, scale=o.scale) for o in sets]
    math_fn = torch_math(case)
    notes: list[str] = []

    # Verify on the first buffer set before timing.
    plan.run(stream, None, args[0])
    want = math_fn(first.input, first.scale)
    torch.cuda.synchronize()
    bad = _mismatch(first.output, want)
    if bad is not None:
        print(f"WARNING: {case.label}: plan output differs from PyTorch eager: {bad}", flush=True)
        notes.append("plan != eager")

    kw = {"warmup": timing.warmup, "reps": timing.reps}
    ours = harness.time_gpu([lambda a=a: plan.run(stream, None, a) for a in args], **kw)
    copy_us, _ = harness.copy_time(moved // 2, moved - moved // 2, **kw)
    eager_us = harness.time_gpu([lambda o=o: math_fn(o.input, o.scale) for o in sets], **kw)

    compile_us: float | None = None
    if use_compile:
        try:
            import torch._dynamo

            torch._dynamo.reset()
            compiled = torch.compile(math_fn, dynamic=False)
            got = compiled(first.input, first.scale)
            torch.cuda.synchronize()
            cbad = _mismatch(got, want)
            if cbad is not None:
                print(f"note: {case.label}: torch.compile output differs from eager: {cbad}", flush=True)
                notes.append("compile != eager")
            compile_us = harness.time_gpu([lambda o=o: compiled(o.input, o.scale) for o in sets], **kw)
        except Exception as exc:  # a compile failure costs one cell, not the run
            first_line = (str(exc).strip().splitlines() or [""])[0][:200]
            print(f"torch.compile failed for {case.label}: {type(exc).__name__}: {first_line}", flush=True)
            notes.append("compile failed")

    if (case.scheme, case.shape, case.dtype) == HOST_ROW:
        a0 = args[0]
        host = harness.host_overhead_us(lambda: plan.run(stream, None, a0), timing.host_calls)
        host_nc = harness.host_overhead_us(lambda: plan.run(stream, None, a0, check=False), timing.host_calls)
        print(
            f"{case.op} {case.shape_str} {case.dtype}: plan.run host time: {host:.2f} µs/call "
            f"(check=False: {host_nc:.2f} µs/call)",
            flush=True,
        )

    return Row(
        op=case.op,
        shape=case.shape_str,
        dtype=case.dtype,
        us=ours,
        nbytes=moved,
        copy_us=copy_us,
        compile_us=compile_us,
        eager_us=eager_us,
        note="; ".join(notes),
        extra={"variant": plan.sku().variant, "buffer_sets": len(sets)},
    )


# ---- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run all rows, print notes as they come and the markdown table last. Exit 1 if a row failed."""
    return harness.bench_main("bench_quantize", __doc__.split("\n\n")[0], argv, cases(), lambda c: c.op, bench_case)


if __name__ == "__main__":
    sys.exit(main())
