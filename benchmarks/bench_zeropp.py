"""Benchmark the ZeRO++ qgZ kernels (SwizzledQuantizePlan, DequantReducePlan) against a copy,
PyTorch eager and torch.compile.

Rows: swizzled quantization of an 8192 x 8192 fp16 / bf16 gradient to symmetric int8 and int4
in groups of 2048 for 2 nodes x 4 devices (plus one row with LoCo error feedback in a bf16
buffer, and the int4 rows again on the same elements as one flat 1-D bucket, as ZeRO++ hands
it over: the plan resolves both views to one problem, so the two should time alike); dequantize-reduce of 8 peers' chunks (8192 x 8192 codes in all, chunk = 8192 * 8192 / 8
elements, groups of 2048 on both sides, summed in float32 in peer order) re-quantized to int8 /
int4; and the same two ops in DeepSpeed's formats (``quantplan.compat.deepspeed``'s plans:
symmetric ``mult = 2**(b-1) / absmax``, stored ``1 / mult``, int4 high nibble first), bf16
input. Peers compute the same math (SPEC section 4: ``scale = amax / q_max`` (0 -> 1),
``q = clamp(rne(v / scale))``, sums as ``((y_0 + y_1) + ...)``); the plan's output is checked
against eager's before timing. Effective bandwidth counts the op's bytes: inputs (and the error
buffer) read once, codes, parameters (and the error buffer) written. Method: :mod:`harness`.

Usage (on a GPU machine)::

    PYTHONPATH=. python benchmarks/bench_zeropp.py [--json PATH] [--quick] [--no-compile]
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
from harness import Row, Timing  # noqa: E402

SHAPE = (8192, 8192)
#: The same elements as one flat bucket.
FLAT = (SHAPE[0] * SHAPE[1],)
GROUP = 2048
NODES, DEVICES = 2, 4
PEERS = 8


@dataclass(frozen=True)
class ZeroppCase:
    """One row: op (swizzle / loco / reduce), code (S8 / S4), float dtype and the input's view
    (swizzle / loco: ``SHAPE`` or the flat bucket ``FLAT``)."""

    label: str
    op: str
    code: str
    dtype: str
    shape: tuple[int, ...] = SHAPE


def cases() -> list[ZeroppCase]:
    rows = []
    for code, name in (("S8", "int8"), ("S4", "int4")):
        for dtype in ("fp16", "bf16"):
            rows.append(ZeroppCase(f"swizzled quantize {name} 2x4", "swizzle", code, dtype))
    for dtype in ("fp16", "bf16"):
        rows.append(ZeroppCase("swizzled quantize int4 2x4 flat bucket", "swizzle", "S4", dtype, FLAT))
    rows.append(ZeroppCase("swizzled quantize int4 2x4 + LoCo(bf16)", "loco", "S4", "bf16"))
    for code, name in (("S8", "int8"), ("S4", "int4")):
        rows.append(ZeroppCase(f"dequant-reduce {name} 8 peers", "reduce", code, "-"))
    # quantplan.compat.deepspeed's kernels (DeepSpeed's formulas and layouts), timed at the plan.
    for code, name in (("S8", "int8"), ("S4", "int4")):
        rows.append(ZeroppCase(f"deepspeed swizzle_quant {name} 2x4", "ds_swizzle", code, "bf16"))
    for code, name in (("S8", "int8"), ("S4", "int4")):
        rows.append(ZeroppCase(f"deepspeed quantized_reduction {name} 8 peers", "ds_reduce", code, "-"))
    return rows


def _unpack_s4(b: Any) -> Any:
    """Signed nibbles of LOW_FIRST bytes as int8, element 2i from the low nibble."""
    import torch

    bi = b.view(torch.int8)
    lo = torch.bitwise_right_shift(torch.bitwise_left_shift(bi, 4), 4)
    hi = torch.bitwise_right_shift(bi, 4)
    return torch.stack([lo, hi], dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def _quantize_groups(v: Any, q_max: float, packed: bool) -> tuple[Any, Any]:
    """(codes, scales) of float32 ``v`` viewed ``(groups, GROUP)``: symmetric, SPEC section 4."""
    import torch

    amax = v.abs().amax(dim=-1, keepdim=True)
    scale = amax / torch.full_like(amax, q_max)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(v / scale).clamp(-q_max - 1, q_max).to(torch.int8)
    if packed:
        u = q.view(torch.uint8) & 0xF
        q = (u[..., 0::2] | (u[..., 1::2] << 4)).view(torch.uint8)
    return q, scale.squeeze(-1)


def _deepspeed_groups(v: Any, bits: int) -> tuple[Any, Any]:
    """DeepSpeed's symmetric (codes, stored 1 / mult) of float32 ``v`` viewed ``(groups, GROUP)``:
    ``mult = 2**(b-1) / absmax`` (0 -> 1), ``q = clamp(rne(v * mult))``; int4 high nibble first."""
    import torch

    amax = v.abs().amax(dim=-1, keepdim=True)
    mult = torch.where(amax == 0, torch.ones_like(amax), (2.0 ** (bits - 1)) / amax)
    q = torch.round(v * mult).clamp(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1).to(torch.int8)
    if bits == 4:
        u = q.view(torch.uint8) & 0xF
        q = ((u[..., 0::2] << 4) | u[..., 1::2]).view(torch.int8)
    return q, (1.0 / mult).squeeze(-1)


def _deepspeed_unpack_s4(b: Any) -> Any:
    """Signed nibbles of DeepSpeed bytes as int8, element 2i from the high nibble."""
    import torch

    bi = b.view(torch.int8)
    hi = torch.bitwise_right_shift(bi, 4)
    lo = torch.bitwise_right_shift(torch.bitwise_left_shift(bi, 4), 4)
    return torch.stack([hi, lo], dim=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


def torch_math(case: ZeroppCase) -> Callable[..., tuple[Any, ...]]:
    """PyTorch doing the same math; ``f(inputs...) -> outputs`` in the plan's layout."""

    packed = case.code == "S4"
    q_max = 7.0 if packed else 127.0
    n = SHAPE[0] * SHAPE[1]

    def swizzle(a: Any) -> Any:
        per = a.numel() // (NODES * DEVICES)
        return a.reshape(NODES, DEVICES, per).transpose(0, 1).reshape(1, DEVICES, NODES * per)

    def swizzled(x: Any) -> tuple[Any, Any]:
        q, s = _quantize_groups(x.float().view(n // GROUP, GROUP), q_max, packed)
        return swizzle(q.reshape(-1)), swizzle(s.reshape(-1))

    def loco(x: Any, e: Any) -> tuple[Any, Any, Any]:
        v = (x.float() + e.float()).view(n // GROUP, GROUP)
        q, s = _quantize_groups(v, q_max, packed)
        codes = _unpack_s4(q) if packed else q
        d = codes.float() * s.unsqueeze(-1)
        new_e = (0.5 * e.float().view_as(v) + 0.5 * (v - d)).to(e.dtype)
        return swizzle(q.reshape(-1)), swizzle(s.reshape(-1)), new_e.view(e.shape)

    def reduce(q: Any, s: Any) -> tuple[Any, Any]:
        codes = _unpack_s4(q) if packed else q
        chunk = n // PEERS
        y = codes.float().view(PEERS, chunk // GROUP, GROUP) * s.view(PEERS, chunk // GROUP, 1)
        total = y[0]
        for j in range(1, PEERS):
            total = total + y[j]
        out, scale = _quantize_groups(total, q_max, packed)
        return out.reshape(-1), scale.reshape(-1)

    bits = 4 if packed else 8

    def ds_swizzled(x: Any) -> tuple[Any, Any]:
        q, s = _deepspeed_groups(x.float().view(n // GROUP, GROUP), bits)
        return swizzle(q.reshape(-1)), swizzle(s.reshape(-1))

    def ds_reduce(q: Any, s: Any) -> tuple[Any, Any]:
        codes = _deepspeed_unpack_s4(q) if packed else q
        chunk = n // PEERS
        y = codes.float().view(PEERS, chunk // GROUP, GROUP) * s.view(PEERS, chunk // GROUP, 1)
        total = y[0]
        for j in range(1, PEERS):
            total = total + y[j]
        out, inv = _deepspeed_groups(total, bits)
        return out.reshape(-1), inv.reshape(-1)

    return {"swizzle": swizzled, "loco": loco, "reduce": reduce, "ds_swizzle": ds_swizzled, "ds_reduce": ds_reduce}[
        case.op
    ]


def bench_row(case: ZeroppCase, timing: Timing, use_compile: bool) -> Row:
    import torch

    import quantplan as qp

    stream = torch.cuda.current_stream()
    packed = case.code == "S4"
    code_kind = qp.ElementKind[case.code]
    n = SHAPE[0] * SHAPE[1]
    code_bytes = n // 2 if packed else n
    params = n // GROUP
    inputs: list[tuple[Any, ...]] = []
    if case.op.startswith("ds_"):
        from quantplan.ops import deepspeed_format as dsp

        bits = 4 if packed else 8
        if case.op == "ds_swizzle":
            desc: Any = dsp.DeepSpeedQuantizeDescriptor(
                numel=n,
                groups=params,
                num_bits=bits,
                input_element=qp.ElementKind.BF16,
                nodes=NODES,
                devices_per_node=DEVICES,
            )
            plan: Any = dsp.DeepSpeedQuantizePlan.select(stream, desc)
            read, written = n * 2, code_bytes + params * 4
        else:
            desc = dsp.DeepSpeedReduceDescriptor(
                numel=n, in_groups=params, out_groups=params // PEERS, num_bits=bits, devices_per_node=PEERS
            )
            plan = dsp.DeepSpeedReducePlan.select(stream, desc)
            read, written = code_bytes + params * 4, code_bytes // PEERS + params // PEERS * 4
        for _ in range(harness.rotation_sets(read + written)):
            if case.op == "ds_swizzle":
                a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
                b = None
            else:
                a = torch.randint(-128, 128, (desc.input_bytes,), device="cuda", dtype=torch.int8)
                b = torch.rand(desc.input_param_shape, device="cuda") * 1e-3 + 1e-4
            q = torch.empty(desc.output_bytes, device="cuda", dtype=torch.int8)
            s = torch.empty(desc.param_shape, device="cuda")
            inputs.append((a, b, q, s))
        if case.op == "ds_swizzle":
            args = [dsp.DeepSpeedQuantizeArgs(a, q, s) for a, _, q, s in inputs]
        else:
            args = [dsp.DeepSpeedReduceArgs(a, b, q, s) for a, b, q, s in inputs]

        def eager_args(t: tuple[Any, ...]) -> tuple[Any, ...]:
            return (t[0],) if t[1] is None else (t[0], t[1])

    elif case.op in ("swizzle", "loco"):
        float_dtype = torch.float16 if case.dtype == "fp16" else torch.bfloat16
        loco = case.op == "loco"
        desc = qp.SwizzledQuantizeDescriptor(
            shape=case.shape,
            group_size=GROUP,
            nodes=NODES,
            devices_per_node=DEVICES,
            input_element=qp.ElementKind.F16 if case.dtype == "fp16" else qp.ElementKind.BF16,
            output_element=code_kind,
            error_element=qp.ElementKind.BF16 if loco else None,
        )
        plan = qp.SwizzledQuantizePlan.select(stream, desc)
        read = n * 2 + (n * 2 if loco else 0)
        written = code_bytes + params * 4 + (n * 2 if loco else 0)
        for _ in range(harness.rotation_sets(read + written)):
            x = torch.randn(case.shape, device="cuda", dtype=float_dtype)
            e = (torch.randn(case.shape, device="cuda") * 0.01).to(torch.bfloat16) if loco else None
            q = torch.empty(desc.output_shape, device="cuda", dtype=torch.uint8 if packed else torch.int8)
            s = torch.empty(desc.param_shape, device="cuda")
            inputs.append((x, e, q, s))
        args = [qp.SwizzledQuantizeArgs(x, q, s, None, e, 0.5 if loco else None) for x, e, q, s in inputs]

        def eager_args(t: tuple[Any, ...]) -> tuple[Any, ...]:
            return (t[0], t[1]) if loco else (t[0],)

    else:
        chunk = n // PEERS
        desc = qp.DequantReduceDescriptor(
            peers=PEERS,
            chunk_elements=chunk,
            input_group_size=GROUP,
            output_group_size=GROUP,
            input_element=code_kind,
            output_element=code_kind,
        )
        plan = qp.DequantReducePlan.select(stream, desc)
        read = code_bytes + params * 4
        written = code_bytes // PEERS + params // PEERS * 4
        for _ in range(harness.rotation_sets(read + written)):
            if packed:
                qin = torch.randint(0, 256, desc.input_shape, device="cuda", dtype=torch.uint8)
            else:
                qin = torch.randint(-127, 128, desc.input_shape, device="cuda", dtype=torch.int8)
            sin = torch.rand(desc.input_param_shape, device="cuda") * 1e-3 + 1e-4
            q = torch.empty(desc.output_shape, device="cuda", dtype=qin.dtype)
            s = torch.empty(desc.param_shape, device="cuda")
            inputs.append((qin, sin, q, s))
        args = [qp.DequantReduceArgs(qin, sin, q, s) for qin, sin, q, s in inputs]

        def eager_args(t: tuple[Any, ...]) -> tuple[Any, ...]:
            return (t[0], t[1])

    math_fn = torch_math(case)
    want = math_fn(*eager_args(inputs[0]))  # first: LoCo updates the error buffer in place
    plan.run(stream, None, args[0])
    torch.cuda.synchronize()
    notes = []
    q0, s0 = inputs[0][2], inputs[0][3]
    same = torch.equal(q0.view(torch.uint8).reshape(-1), want[0].view(torch.uint8).reshape(-1))
    same = same and torch.equal(s0.reshape(-1), want[1].reshape(-1))
    if case.op == "loco":
        same = same and torch.equal(inputs[0][1].view(torch.int16), want[2].view(torch.int16))
    if not same:
        print(f"WARNING: {case}: plan output differs from PyTorch eager", flush=True)
        notes.append("plan != eager")
    if case.op == "loco":  # the check above advanced the buffers; time on fresh ones
        for t in inputs:
            t[1].copy_((torch.randn(case.shape, device="cuda") * 0.01).to(torch.bfloat16))
    kw = {"warmup": timing.warmup, "reps": timing.reps}
    ours = harness.time_gpu([lambda a=a: plan.run(stream, None, a) for a in args], **kw)
    copy_us, _ = harness.copy_time(read, written, **kw)
    eager_us = harness.time_gpu([lambda t=t: math_fn(*eager_args(t)) for t in inputs], **kw)
    compile_us = None
    if use_compile:
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(math_fn, dynamic=False)
        compiled(*eager_args(inputs[0]))
        compile_us = harness.time_gpu([lambda t=t: compiled(*eager_args(t)) for t in inputs], **kw)
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
    return harness.bench_main("bench_zeropp", __doc__.split("\n\n")[0], argv, cases(), lambda c: c.label, bench_row)


if __name__ == "__main__":
    sys.exit(main())
