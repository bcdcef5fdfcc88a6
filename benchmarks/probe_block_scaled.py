"""Schedules of the block-scaled kernel side by side: each (unroll, min_blocks) of the tuning
table's space timed on the same input in one run, with a copy of the same bytes.

    python3 benchmarks/probe_block_scaled.py [--precompile] [--only TEXT]
    python3 benchmarks/probe_block_scaled.py --stochastic [--precompile]
    python3 benchmarks/probe_block_scaled.py --transpose   # the fused rowwise + columnwise kernel

``--transpose``: ``block_scaled_transpose`` (every schedule of ``TRANSPOSE_CANDIDATES``) for MXFP8
rceil and FP8 1x128 div / enc, 8192 x 8192 bf16 and fp16, timed side by side with a copy of the
bytes moved (x read, both code copies and both scale matrices written), each checked against the
reference.

``--stochastic``: NVFP4 with stochastic rounding only, 8192 x 8192 bfloat16 and float16, every
schedule of ``STOCHASTIC_CANDIDATES`` beside the round-to-nearest twin and a copy of the same
bytes (x read, codes and E4M3 scales written).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402

from quantplan.runtime import _block_scaled_kernels as bk  # noqa: E402
from quantplan.runtime._block_scaled_kernels import Schedule, kernel_name  # noqa: E402

SCHEDULES = [
    Schedule(v, u, m, p)
    for v, u, m, p in ((2, 1, 1, False), (4, 1, 1, False), (4, 1, 2, False), (4, 1, 4, False), (4, 2, 4, False))
]
CASES = [  # (label, element, block, rule, code bytes per element)
    ("MXFP8 e4m3", "e4m3", 32, "rceil", 1.0),
    ("MXFP4 e2m1", "e2m1", 32, "rceil", 0.5),
    ("MXFP6 e2m3", "e2m3", 32, "rceil", 1.0),
    ("FP8 1x128 div", "e4m3", 128, "div", 1.0),
    ("FP8 1x128 enc column-major", "e4m3", 128, "enc", 1.0),
    ("FP8 1x128 enc compact", "e4m3", 128, "enc", 1.0),
    ("NVFP4 te", "nvfp4", 16, "te", 0.5),
    ("NVFP4 te stochastic", "nvfp4_sr", 16, "te", 0.5),  # the nvfp4 kernel's stochastic twin
]
#: Extra schedules tried for 16-element blocks (one or several whole blocks per thread).
SCHEDULES_16 = [
    Schedule(v, u, m, p)
    for v, u, m, p in (
        (2, 1, 4, False),
        (2, 2, 4, False),
        (2, 1, 6, False),
        (4, 1, 3, False),
        (4, 2, 2, False),
        (8, 1, 2, False),
        (4, 1, 4, True),
    )
]


#: Extra schedules tried for 128-element blocks (a team of 2 or 1 threads a block, or two slots).
SCHEDULES_128 = [
    Schedule(v, u, m, p)
    for v, u, m, p in ((2, 1, 2, False), (2, 1, 4, False), (8, 1, 2, False), (2, 2, 4, False), (2, 1, 4, True))
]
#: FP8 128 x 128 tile schedules of ``--tiles`` (the first is the table's).
TILE_CANDIDATES = [(128, 2, 3), (128, 2, 2), (128, 2, 4), (128, 1, 4), (128, 4, 2), (256, 2, 2)]


def _schedules(block: int) -> list[Schedule]:
    return SCHEDULES + (SCHEDULES_16 if block == 16 else SCHEDULES_128 if block == 128 else [])


def _compile(name: str, family: str = "block_scaled") -> str:
    from quantplan.runtime._tuning import kernel_options
    from quantplan.runtime.compiler import compile_instantiations
    from quantplan.vocabulary.types import ArchSku

    compile_instantiations(family, [name], ArchSku.parse("sm_90"), kernel_options())
    return name


def _compile_tiles(name: str) -> str:
    return _compile(name, "block_scaled_tiles")


#: (label, block, rule) of the fused transpose probe.
TRANSPOSE_CASES = [("MXFP8 rceil", 32, "rceil"), ("FP8 1x128 enc", 128, "enc"), ("FP8 1x128 div", 128, "div")]


def _transpose_probe(only: str | None, shape: tuple[int, int] = (8192, 8192), check: bool = True) -> None:
    import cupy
    import ml_dtypes
    import numpy as np
    import torch

    import quantplan.reference.block_scaled as rbs
    from quantplan.runtime._block_scaled_tile_kernels import (
        TRANSPOSE_CANDIDATES,
        TransposeSchedule,
        quantize_transpose_block_scaled,
        transpose_kernel_name,
    )

    names = [
        transpose_kernel_name(d, "e4m3", blk, False, rule == "div", True, sched)
        for d in ("bfloat16", "float16")
        for label, blk, rule in TRANSPOSE_CASES
        if not only or only in label
        for sched in TRANSPOSE_CANDIDATES[d].values()
    ]
    with ProcessPoolExecutor(16) as ex:  # every candidate compiled side by side, not one by one
        list(ex.map(_compile_tiles, names))
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for tdt, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        x = torch.randn(shape, device="cuda").mul_(4).to(tdt)
        n = x.numel()
        sets = harness.rotation_sets(n * 4)
        xs = [cupy.from_dlpack((x if i == 0 else x.clone()).view(torch.int16)) for i in range(sets)]
        host = (
            x.float().cpu().numpy().astype(ml_dtypes.bfloat16 if name == "bfloat16" else np.float16) if check else None
        )
        for label, blk, rule in TRANSPOSE_CASES:
            if only and only not in label:
                continue
            scale_bytes = 2 * (n // blk) * (1 if blk == 32 else 4)
            copy_us, _ = harness.copy_time(2 * n, 2 * n + scale_bytes)
            want: list[Any] = []
            if check and host is not None and blk == 32:
                pair = rbs.quantize_transpose(host, "mx", scale_mode=rule)
            elif check and host is not None:
                pair = rbs.quantize_transpose(host, "fp8_block", block=(1, 128), scale_format="f32", elem_op=rule)
            if check:
                want = [pair.rowwise.codes, pair.rowwise.scales, pair.columnwise.codes, pair.columnwise.scales]
            cells = []
            for tag, sched in TRANSPOSE_CANDIDATES[name].items():

                def fn(
                    xi: Any, sched: TransposeSchedule = sched, blk: int = blk, rule: str = rule, dt: str = name
                ) -> Any:
                    return quantize_transpose_block_scaled(
                        xi, block=blk, rule=rule, input_dtype=dt, stream=stream, schedule=sched
                    )

                got = [a.get() for a in fn(xs[0])] if check else []
                same = not check or all(
                    np.array_equal(g.view(np.uint8).reshape(-1), np.ascontiguousarray(w).view(np.uint8).reshape(-1))
                    for g, w in zip(got, want, strict=True)
                )
                fns = [lambda xi=xi, f=fn: f(xi) for xi in xs]
                us = harness.time_gpu(fns[0], rotate=fns[1:])
                cells.append(f"{tag} {us:.2f} ({100 * copy_us / us:.1f}%){'' if same else ' != reference'}")
            print(f"{label} {name} {shape[0]}x{shape[1]}: copy {copy_us:.2f} | " + " | ".join(cells), flush=True)


def _tiles_probe() -> None:
    """FP8 128 x 128 enc (compact scales), 8192 x 8192 bf16 and fp16: each (tile columns, vectors,
    resident CTAs) of TILE_CANDIDATES against a copy of the same bytes, checked against the table's
    schedule."""
    import cupy
    import numpy as np
    import torch

    from quantplan.runtime._block_scaled_tile_kernels import (
        TileSchedule,
        quantize_block_scaled_2d,
        tile_kernel_name,
    )

    scheds = [TileSchedule(128, c, 128, False, v, m) for c, v, m in TILE_CANDIDATES]
    names = [tile_kernel_name(d, "e4m3", False, True, s) for d in ("bfloat16", "float16") for s in scheds]
    with ProcessPoolExecutor(16) as ex:
        list(ex.map(_compile_tiles, names))
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for tdt, name in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
        x = torch.randn((8192, 8192), device="cuda").mul_(4).to(tdt)
        n = x.numel()
        xs = [
            cupy.from_dlpack((x if i == 0 else x.clone()).view(torch.int16))
            for i in range(harness.rotation_sets(n * 3))
        ]
        if name == "float16":
            xs = [xi.view(cupy.float16) for xi in xs]
        copy_us, _ = harness.copy_time(2 * n, n + 4 * n // 16384)
        want: list[Any] = []
        cells = []
        for sched in scheds:

            def fn(xi: Any, sched: TileSchedule = sched, dt: str = name) -> Any:
                return quantize_block_scaled_2d(
                    xi, element="e4m3", block=(128, 128), rule="enc", input_dtype=dt, stream=stream, schedule=sched
                )

            got = [a.get() for a in fn(xs[0])]
            want = want or got
            same = all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
            fns = [lambda xi=xi, f=fn: f(xi) for xi in xs]
            us = harness.time_gpu(fns[0], rotate=fns[1:])
            tag = f"c{sched.tile_cols}v{sched.vecs}m{sched.min_blocks}"
            cells.append(f"{tag} {us:.2f} ({100 * copy_us / us:.1f}%){'' if same else ' != table'}")
        print(f"FP8 128x128 enc {name} 8192x8192: copy {copy_us:.2f} | " + " | ".join(cells), flush=True)


def stochastic(precompile: bool) -> None:
    """NVFP4 stochastic rounding's candidate schedules and its nearest twin, bfloat16 and float16,
    8192 x 8192, each against a copy of the same bytes."""
    nearest = bk.SCHEDULES[(True, 16, False)]
    dtypes = ("bfloat16", "float16")
    names = [kernel_name(d, "nvfp4_sr", 16, False, True, s) for d in dtypes for s in bk.STOCHASTIC_CANDIDATES]
    names += [kernel_name(d, "nvfp4", 16, False, True, nearest) for d in dtypes]
    if precompile:
        with ProcessPoolExecutor(16) as ex:
            list(ex.map(_compile, names))
    import cupy
    import torch

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    shape = (8192, 8192)
    n = shape[0] * shape[1]
    amax = cupy.asarray([24.0], dtype=cupy.float32)
    for dtype in dtypes:
        torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float16
        x = torch.randn(shape, device="cuda").mul_(4).to(torch_dtype)
        sets = harness.rotation_sets(x.numel() * 2)
        xs = [cupy.from_dlpack((x if i == 0 else x.clone()).view(torch.int16)) for i in range(sets)]
        if dtype == "float16":
            xs = [xi.view(cupy.float16) for xi in xs]
        copy_us, _ = harness.copy_time(2 * n, n // 2 + n // 16)
        rows: list[tuple[str, Schedule, dict[str, Any]]] = [("nearest", nearest, {})] + [
            ("stochastic", s, {"rounding": "stochastic", "seed": 1234, "offset": 5}) for s in bk.STOCHASTIC_CANDIDATES
        ]
        cells = []
        for label, sched, kw in rows:

            def fn(xi: Any, sched: Schedule = sched, kw: dict[str, Any] = kw, dtype: str = dtype) -> Any:
                return quantize_block_scaled(
                    xi,
                    element="nvfp4",
                    block=16,
                    rule="te",
                    tensor_amax=amax,
                    input_dtype=dtype,
                    stream=stream,
                    schedule=sched,
                    **kw,
                )

            fns = [lambda xi=xi, f=fn: f(xi) for xi in xs]
            us = harness.time_gpu(fns[0], rotate=fns[1:])
            tag = f"v{sched.vecs}u{sched.unroll}m{sched.min_blocks}{'p' if sched.persistent else ''}"
            cells.append(f"{label} {tag} {us:.2f} ({100 * copy_us / us:.1f}%)")
        print(f"NVFP4 {dtype} {shape}: copy {copy_us:.2f} | " + " | ".join(cells), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precompile", action="store_true")
    p.add_argument("--only", metavar="TEXT", help="cases whose label contains TEXT")
    p.add_argument("--transpose", action="store_true", help="the fused transpose's candidate schedules instead")
    p.add_argument("--stochastic", action="store_true", help="NVFP4 stochastic rounding's candidate schedules")
    p.add_argument("--shape", type=int, nargs=2, default=(8192, 8192), metavar=("ROWS", "COLS"), help="--transpose's x")
    p.add_argument("--no-check", action="store_true", help="--transpose: time only, no reference")
    p.add_argument("--tiles", action="store_true", help="FP8 128 x 128 tile schedules instead")
    args = p.parse_args()
    if args.tiles:
        _tiles_probe()
        return
    if args.transpose:
        _transpose_probe(args.only, tuple(args.shape), not args.no_check)
    if args.stochastic:
        stochastic(args.precompile)
    if args.transpose or args.stochastic:
        return
    cases = [c for c in CASES if not args.only or args.only in c[0]]
    names = sorted(
        {
            kernel_name("bfloat16", el, blk, rule == "div", True, s)
            for _, el, blk, rule, _ in cases
            for s in _schedules(blk)
        }
    )
    if args.precompile:
        with ProcessPoolExecutor(16) as ex:
            list(ex.map(_compile, names))
    import cupy
    import torch

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    for shape in ((8192, 8192), (16, 8192)):
        x = torch.randn(shape, device="cuda").mul_(4).to(torch.bfloat16)
        sets = harness.rotation_sets(x.numel() * 2)
        xs = [cupy.from_dlpack((x if i == 0 else x.clone()).view(torch.int16)) for i in range(sets)]
        for label, el, blk, rule, cb in cases:
            n = x.numel()
            copy_us, _ = harness.copy_time(2 * n, int(n * cb) + n // blk * (4 if rule == "div" else 1))
            cells = []
            extra: dict[str, Any] = {}
            if el.startswith("nvfp4"):
                extra["tensor_amax"] = cupy.asarray([24.0], dtype=cupy.float32)
            if el == "nvfp4_sr":
                extra.update(rounding="stochastic", seed=1234, offset=5)
            element = "nvfp4" if el == "nvfp4_sr" else el
            if "column-major" in label:
                extra["layout"] = "column_major"
            for s in _schedules(blk):

                def fn(
                    xi: Any,
                    s: Schedule = s,
                    el: str = element,
                    blk: int = blk,
                    rule: str = rule,
                    kw: dict[str, Any] = extra,
                ) -> Any:
                    return quantize_block_scaled(
                        xi, element=el, block=blk, rule=rule, input_dtype="bfloat16", stream=stream, schedule=s, **kw
                    )

                fns = [lambda xi=xi, f=fn: f(xi) for xi in xs]
                us = harness.time_gpu(fns[0], rotate=fns[1:])
                cells.append(
                    f"v{s.vecs}u{s.unroll}m{s.min_blocks}{'p' if s.persistent else ''} {us:.2f} ({100 * copy_us / us:.1f}%)"
                )
            print(f"{label} {shape}: copy {copy_us:.2f} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
