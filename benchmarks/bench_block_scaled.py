"""Block-scaled quantization: quantplan's kernel against a copy of the same bytes and torchao 0.18.

Rows (8192 x 8192 unless named, bf16 and fp16): MXFP8 e4m3 (rceil, compact and 128x4 blocked
scales), MXFP6 e2m3, MXFP4, MXINT8, FP8 1x128 (div with f32 scales; UE8M0 packed for DeepGEMM;
column-major TMA-aligned f32), and the 16 x 8192 MXFP8 row; the 2-D tile kernel (FP8 128x128 div /
enc, MX 32x32) and the fused rowwise + columnwise kernel (MXFP8, FP8 1x128), whose bytes moved are
x read once plus both copies written. Peers in the same run: ``torch.compile(to_mx)`` (MXFP8
rceil / floor, MXFP4), torchao's Triton FP8 1x128 kernel, its 128x128 weight kernel
(``triton_fp8_blockwise_weight_quant_rhs``) and, for the fused FP8 row, its two activation
kernels (``act_quant_lhs`` + ``act_quant_transposed_lhs``) back to back.
Each row: median kernel µs (CUDA events, harness.time_gpu), a copy of the same bytes read plus
written, % of copy, the peer's µs and the ratio peer / ours, and whether our bytes equal the
reference's (``quantplan.reference.block_scaled``).

    python3 benchmarks/bench_block_scaled.py [--out PATH] [--no-peers] [--no-check]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402


def _cupy_view(t: Any) -> Any:
    import cupy
    import torch

    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return cupy.from_dlpack(t)


def _ours(x: Any, **kw: Any) -> Any:
    import cupy
    import torch

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    dtype = "bfloat16" if x.dtype == torch.bfloat16 else "float16"
    xc = _cupy_view(x)
    if kw.get("tensor_amax") == "given":  # a calibrated amax on the device (24 for the bench's data)
        kw = {**kw, "tensor_amax": cupy.asarray([24.0], dtype=cupy.float32)}
    return lambda: quantize_block_scaled(xc, input_dtype=dtype, stream=stream, **kw)


def _check(x: Any, fn: Any, kind: str, **kw: Any) -> str:
    import ml_dtypes
    import numpy as np
    import torch

    import quantplan.reference.block_scaled as rbs

    codes, scales = fn()
    torch.cuda.synchronize()
    host = x.float().cpu().numpy()
    host = host.astype(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16 else host.astype(np.float16)
    if kind in ("nvfp4", "nvfp4_sr"):
        sr = {"rounding": "stochastic", "seed": kw["seed"], "offset": kw["offset"]} if kind == "nvfp4_sr" else {}
        ref = rbs.nvfp4_quantize(host, global_amax=24.0, **sr)
        want_scales = ref.scales
    elif kind == "mx":
        ref = rbs.mx_quantize(host, kw["element"], scale_mode=kw.get("rule", "rceil"))
        want_scales = ref.scales if kw.get("layout", "compact") == "compact" else rbs.to_blocked(ref.scales)
    else:
        sf = "ue8m0" if kw["rule"] == "ue8m0" else "f32"
        ref = rbs.fp8_block_quantize(
            host, block=(1, 128), scale_format=sf, elem_op="div" if sf == "ue8m0" else kw["rule"]
        )
        layout = kw.get("layout", "compact")
        want_scales = {
            "compact": ref.scales,
            "column_major": rbs.col_major_tma_aligned(ref.scales) if layout == "column_major" else None,
            "packed_ue8m0": rbs.deepgemm_sf_layout(ref.scales) if layout == "packed_ue8m0" else None,
        }[layout]
    got_codes = codes.get().reshape(ref.codes.shape)
    got_scales = scales.get().view(want_scales.dtype).reshape(want_scales.shape)
    same = np.array_equal(got_codes, ref.codes) and np.array_equal(
        got_scales.view(np.uint8), np.ascontiguousarray(want_scales).view(np.uint8)
    )
    return "= reference" if same else "≠ reference"


def _ours_tiles(x: Any, fused: bool, **kw: Any) -> Any:
    import cupy
    import torch

    from quantplan.runtime._block_scaled_tile_kernels import quantize_block_scaled_2d, quantize_transpose_block_scaled

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    dtype = "bfloat16" if x.dtype == torch.bfloat16 else "float16"
    xc = _cupy_view(x)
    fn = quantize_transpose_block_scaled if fused else quantize_block_scaled_2d
    return lambda: fn(xc, input_dtype=dtype, stream=stream, **kw)


def _check_tiles(x: Any, out: Any, fused: bool, **kw: Any) -> str:
    import ml_dtypes
    import numpy as np
    import torch

    import quantplan.reference.block_scaled as rbs

    torch.cuda.synchronize()
    host = x.float().cpu().numpy()
    host = host.astype(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16 else host.astype(np.float16)
    rule = kw.get("rule", "rceil")
    fp8 = {"scale_format": "ue8m0" if rule == "ue8m0" else "f32", "elem_op": "div" if rule == "ue8m0" else rule}
    if fused:
        if kw["block"] == 32:
            pair = rbs.quantize_transpose(host, "mx", element=kw.get("element", "e4m3"), scale_mode=rule)
        else:
            pair = rbs.quantize_transpose(host, "fp8_block", block=(1, 128), **fp8)
        want = [pair.rowwise.codes, pair.rowwise.scales, pair.columnwise.codes, pair.columnwise.scales]
    elif kw["block"] == (32, 32):
        ref = rbs.mx_quantize(host, kw.get("element", "e4m3"), scale_mode=rule, block_2d=True)
        want = [ref.codes, ref.scales]
    else:
        ref8 = rbs.fp8_block_quantize(host, block=(128, 128), **fp8)
        cm = kw.get("layout") == "column_major"
        want = [ref8.codes, rbs.col_major_tma_aligned(ref8.scales) if cm else ref8.scales]
    got = [a.get() for a in out]
    same = all(
        np.array_equal(g.view(np.uint8).reshape(-1), np.ascontiguousarray(w).view(np.uint8).reshape(-1))
        for g, w in zip(got, want, strict=True)
    )
    return "= reference" if same else "≠ reference"


def _tile_rows(args: argparse.Namespace, torch_peers: dict[str, Any]) -> list[str]:
    """The 2-D tile and fused transpose rows (8192 x 8192, bf16 and fp16)."""
    import torch

    M = N = 8192
    # (label, fused, kwargs, code copies, scale bytes per element, peer)
    cases: list[tuple[str, bool, dict[str, Any], int, float, str]] = [
        ("FP8 128x128 div f32", False, {"block": (128, 128), "rule": "div"}, 1, 4 / 16384, "fp8_rhs"),
        ("FP8 128x128 enc f32", False, {"block": (128, 128), "rule": "enc"}, 1, 4 / 16384, "fp8_rhs"),
        (
            "FP8 128x128 UE8M0 column-major",
            False,
            {"block": (128, 128), "rule": "ue8m0", "layout": "column_major"},
            1,
            1 / 16384,
            "",
        ),
        ("MXFP8 e4m3 32x32 tiles rceil", False, {"block": (32, 32), "rule": "rceil"}, 1, 1 / 32, ""),
        ("MXFP8 e4m3 rceil rowwise + columnwise", True, {"block": 32, "rule": "rceil"}, 2, 2 / 32, ""),
        ("MXFP8 e4m3 floor rowwise + columnwise", True, {"block": 32, "rule": "floor"}, 2, 2 / 32, ""),
        ("FP8 1x128 div rowwise + columnwise", True, {"block": 128, "rule": "div"}, 2, 8 / 128, ""),
        ("FP8 1x128 enc rowwise + columnwise", True, {"block": 128, "rule": "enc"}, 2, 8 / 128, "fp8_lhs_pair"),
    ]
    lines = []
    for dtype in (torch.bfloat16, torch.float16):
        dname = "bf16" if dtype == torch.bfloat16 else "fp16"
        for label, fused, kw, copies, scale_per_elem, peer in cases:
            x = torch.randn((M, N), device="cuda", dtype=torch.float32).mul_(4).to(dtype)
            sets = harness.rotation_sets(x.numel() * 2)
            xs = [x] + [x.clone() for _ in range(sets - 1)]
            fns = [_ours_tiles(xi, fused, **kw) for xi in xs]
            fns[0]()
            n = x.numel()
            read, written = 2 * n, copies * n + int(n * scale_per_elem)
            ours = harness.time_gpu(fns[0], rotate=fns[1:], reps=args.reps)
            copy_us, _ = harness.copy_time(read, written, reps=args.reps)
            check = "—" if args.no_check else _check_tiles(x, fns[0](), fused, **kw)
            peer_name, peer_us = "—", None
            try:
                if peer == "fp8_rhs" and "fp8_rhs" in torch_peers:
                    pf = [lambda xi=xi: torch_peers["fp8_rhs"](xi, 128) for xi in xs]
                    peer_name = "torchao triton_fp8_blockwise_weight_quant_rhs"
                elif peer == "fp8_lhs_pair" and "fp8_lhs" in torch_peers and "fp8_lhs_t" in torch_peers:

                    def both(xi: Any) -> None:
                        torch_peers["fp8_lhs"](xi, 128)
                        torch_peers["fp8_lhs_t"](xi, 128)

                    pf = [lambda xi=xi: both(xi) for xi in xs]
                    peer_name = "torchao act_quant_lhs + act_quant_transposed_lhs"
                else:
                    pf = []
                if pf:
                    pf[0]()
                    peer_us = harness.time_gpu(pf[0], rotate=pf[1:], reps=args.reps)
            except Exception as exc:
                peer_name, peer_us = f"{peer} failed: {type(exc).__name__}", None
            ratio = f"{peer_us / ours:.2f}×" if peer_us else "—"
            peer_txt = f"{peer_us:.2f}" if peer_us else "—"
            row = (
                f"| {label} {M}x{N} | {dname} | {ours:.2f} | {copy_us:.2f} | {100 * copy_us / ours:.1f}% "
                f"| {peer_name} | {peer_txt} | {ratio} | {check} |"
            )
            print(row, flush=True)
            lines.append(row)
    return lines


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", metavar="PATH", help="markdown file (default: print only)")
    p.add_argument("--no-peers", action="store_true", help="leave torchao out")
    p.add_argument("--no-check", action="store_true", help="skip the bit comparison with the reference")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--only-tiles", action="store_true", help="only the 2-D tile and fused transpose rows")
    p.add_argument("--only", metavar="TEXT", help="rows whose label contains TEXT (A|B: either)")
    args = p.parse_args(argv)
    t_start = time.time()
    peers: dict[str, Any] = {}
    if not args.no_peers:
        peers, missing = harness.load_torchao()
        for line in missing:  # the rows keep our figures
            print(f"torchao unavailable: {line}", file=sys.stderr)

    lines = [
        "| workload | dtype | ours µs | copy µs | % of copy | peer | peer µs | × peer | vs reference |",
        "|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    M = N = 8192
    cases: list[tuple[str, str, tuple[int, int], dict[str, Any], float]] = [
        ("MXFP8 e4m3 rceil", "mx", (M, N), {"element": "e4m3", "block": 32, "rule": "rceil"}, 1.0),
        (
            "MXFP8 e4m3 rceil, 128x4 blocked scales",
            "mx",
            (M, N),
            {"element": "e4m3", "block": 32, "rule": "rceil", "layout": "blocked"},
            1.0,
        ),
        ("MXFP8 e4m3 floor", "mx", (M, N), {"element": "e4m3", "block": 32, "rule": "floor"}, 1.0),
        ("MXFP6 e2m3 rceil", "mx", (M, N), {"element": "e2m3", "block": 32, "rule": "rceil"}, 1.0),
        ("MXFP4 e2m1 rceil", "mx", (M, N), {"element": "e2m1", "block": 32, "rule": "rceil"}, 0.5),
        ("MXINT8 rceil", "mx", (M, N), {"element": "int8", "block": 32, "rule": "rceil"}, 1.0),
        (
            "NVFP4 te, given tensor amax",
            "nvfp4",
            (M, N),
            {"element": "nvfp4", "block": 16, "rule": "te", "tensor_amax": "given"},
            0.5,
        ),
        (
            "NVFP4 te stochastic, given tensor amax",
            "nvfp4_sr",
            (M, N),
            {
                "element": "nvfp4",
                "block": 16,
                "rule": "te",
                "tensor_amax": "given",
                "rounding": "stochastic",
                "seed": 0x5EED_0000_0001,
                "offset": 7,
            },
            0.5,
        ),
        ("FP8 1x128 div f32", "fp8", (M, N), {"element": "e4m3", "block": 128, "rule": "div"}, 1.0),
        (
            "FP8 1x128 enc f32 column-major",
            "fp8",
            (M, N),
            {"element": "e4m3", "block": 128, "rule": "enc", "layout": "column_major"},
            1.0,
        ),
        (
            "FP8 1x128 UE8M0 packed (DeepGEMM)",
            "fp8",
            (M, N),
            {"element": "e4m3", "block": 128, "rule": "ue8m0", "layout": "packed_ue8m0"},
            1.0,
        ),
        ("MXFP8 e4m3 rceil 16x8192", "mx", (16, 8192), {"element": "e4m3", "block": 32, "rule": "rceil"}, 1.0),
    ]
    for dtype in (torch.bfloat16, torch.float16) if not args.only_tiles else ():
        dname = "bf16" if dtype == torch.bfloat16 else "fp16"
        for label, kind, shape, kw, code_bytes in cases:
            if args.only and not any(t in label for t in args.only.split("|")):
                continue
            x = torch.randn(shape, device="cuda", dtype=torch.float32).mul_(4).to(dtype)
            sets = harness.rotation_sets(x.numel() * 2)
            xs = [x] + [x.clone() for _ in range(sets - 1)]
            fns = [_ours(xi, **kw) for xi in xs]
            fns[0]()
            n = x.numel()
            blocks = n // kw["block"]
            scale_bytes = blocks * (4 if kw["rule"] in ("div", "mul_rcp", "enc") else 1)
            read, written = 2 * n, int(n * code_bytes) + scale_bytes
            ours = harness.time_gpu(fns[0], rotate=fns[1:], reps=args.reps)
            copy_us, _ = harness.copy_time(read, written, reps=args.reps)
            check = "—" if args.no_check else _check(x, fns[0], kind, **kw)
            peer_name, peer_us = "—", None
            if "to_mx" in peers and kind == "mx" and kw["element"] in ("e4m3", "e2m1") and kw.get("layout") is None:
                to_mx_c, mode = peers["to_mx"]
                elem = torch.float8_e4m3fn if kw["element"] == "e4m3" else torch.float4_e2m1fn_x2
                sm = mode.RCEIL if kw["rule"] == "rceil" else mode.FLOOR
                try:
                    pf = [lambda xi=xi, f=to_mx_c, e=elem, m=sm: f(xi, e, 32, m) for xi in xs]
                    pf[0]()
                    peer_us = harness.time_gpu(pf[0], rotate=pf[1:], reps=args.reps)
                    peer_name = f"torch.compile(to_mx) {sm.name}"
                except Exception as exc:
                    peer_name = f"to_mx failed: {type(exc).__name__}"
            if "nvfp4" in peers and kind == "nvfp4":
                try:
                    pts = torch.tensor(24.0 / 2688.0, device="cuda", dtype=torch.float32)
                    pf = [lambda xi=xi, f=peers["nvfp4"], t=pts: f(xi, t) for xi in xs]
                    pf[0]()
                    peer_us = harness.time_gpu(pf[0], rotate=pf[1:], reps=args.reps)
                    peer_name = "torch.compile(NVFP4Tensor.to_nvfp4)"
                except Exception as exc:
                    peer_name = f"to_nvfp4 failed: {type(exc).__name__}"
            if "fp8_lhs" in peers and kind == "fp8" and kw["rule"] == "enc":
                try:
                    pf = [lambda xi=xi: peers["fp8_lhs"](xi, 128) for xi in xs]
                    pf[0]()
                    peer_us = harness.time_gpu(pf[0], rotate=pf[1:], reps=args.reps)
                    peer_name = "torchao triton_fp8_blockwise_act_quant_lhs"
                except Exception as exc:
                    peer_name = f"triton fp8 failed: {type(exc).__name__}"
            ratio = f"{peer_us / ours:.2f}×" if peer_us else "—"
            peer_txt = f"{peer_us:.2f}" if peer_us else "—"
            row = (
                f"| {label} {shape[0]}x{shape[1]} | {dname} | {ours:.2f} | {copy_us:.2f} | {100 * copy_us / ours:.1f}% "
                f"| {peer_name} | {peer_txt} | {ratio} | {check} |"
            )
            print(row, flush=True)
            lines.append(row)
    lines += _tile_rows(args, peers)
    summary = harness.device_summary()
    header = [
        f"# Block-scaled quantization: {summary.get('device', '?')}",
        "",
        f"wall time: {time.time() - t_start:.0f} s",
        "",
    ]
    text = "\n".join(header + lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
