"""Benchmark quantized reduce-scatter (ZeRO++ qgZ) against NCCL's bf16 reduce-scatter.

Rows, for each bucket size and the world size the script is launched with: quantplan's
quantized reduce-scatter with int4 and int8 symmetric codes (one float32 scale per
``--group-size`` elements, default 2048) and ``torch.distributed.reduce_scatter_tensor`` of the
same bf16 data (op AVG). Columns: median time of one call (CUDA events around each call after
warmup, every rank synchronized and aligned by a barrier first; the slowest rank's median), the
bytes each GPU sends per call, and the ratios against the NCCL row (time: NCCL / ours, > 1 means
faster; bytes: NCCL / ours).

Bytes each GPU sends: quantized, ``(dpn - 1)`` intra-node chunks of codes and scales plus, with
``--nodes K > 1``, ``(K - 1)`` re-quantized slices across nodes (``QuantizedReduceScatter.bytes_sent``);
NCCL, the ring model ``(world - 1) / world * numel * 2`` (NCCL may pick another algorithm; the ring
is the bandwidth-optimal reference).

Usage (one process per GPU)::

    PYTHONPATH=. torchrun --nproc_per_node=8 benchmarks/bench_collectives.py [--nodes 2] [--json PATH] [--quick]

``--nodes K`` treats the ranks as K groups of consecutive ranks ("nodes") to exercise the
hierarchical path on one host; every link is still NVLink, so the written model printed at the
end (time ~ bytes / link bandwidth) is what predicts the gain on a real inter-node link.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402

import quantplan as qp  # noqa: E402

#: Bucket sizes (elements of each rank's full input) timed by default.
DEFAULT_NUMELS = (1 << 22, 1 << 24, 1 << 26)


@dataclass
class CollectiveRow:
    """One row: an op on one bucket size, its median time and the bytes one GPU sends per call."""

    op: str
    numel: int
    world: int
    nodes: int
    us: float
    bytes_sent: int
    intra_bytes: int
    inter_bytes: int
    baseline_us: float = 0.0
    baseline_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def x_time(self) -> float:
        """Baseline (NCCL bf16) time / ours: > 1 means faster."""
        return self.baseline_us / self.us if self.us > 0 else float("nan")

    @property
    def x_bytes(self) -> float:
        """Baseline bytes / ours: how many times fewer bytes cross the links."""
        return self.baseline_bytes / self.bytes_sent if self.bytes_sent > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(x_time=self.x_time, x_bytes=self.x_bytes)
        return d


def _time_collective(fn: Callable[[], None], warmup: int, reps: int) -> float:
    """The slowest rank's median time of ``fn`` in µs (CUDA events; a barrier aligns every call)."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    median = torch.tensor([statistics.median(times)], dtype=torch.float64, device="cuda")
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return float(median.item())


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def print_table(rows: list[CollectiveRow]) -> None:
    """Markdown table: op, bucket, time, bytes sent (intra / inter), ratios to the NCCL row."""
    header = [
        "op",
        "bucket (elements)",
        "µs",
        "MiB sent / GPU",
        "intra / inter MiB",
        "× time vs NCCL bf16",
        "× fewer bytes",
    ]
    print("| " + " | ".join(header) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        cells = [
            r.op,
            f"{r.numel:,}",
            f"{r.us:.1f}",
            _mib(r.bytes_sent),
            f"{_mib(r.intra_bytes)} / {_mib(r.inter_bytes)}",
            f"{r.x_time:.2f}×",
            f"{r.x_bytes:.2f}×",
        ]
        print("| " + " | ".join(cells) + " |")


def print_model(rows: list[CollectiveRow], link_gbs: float) -> None:
    """The written model of the gain on a bandwidth-limited link, with this run's byte counts."""
    print()
    print("Model of the gain on a bandwidth-limited (inter-node) link:")
    print("  time ≈ latency + bytes_sent / link_bandwidth (+ the quantize / dequantize-reduce kernels, which")
    print("  stream HBM at TB/s and so cost little next to a link of tens of GB/s). When the link dominates,")
    print("  the speedup over a bf16 ring reduce-scatter is the ratio of bytes: about 16 / (bits + 32 / group_size)")
    print("  for one level (int4, group 2048: ~3.9x; int8: ~2x). With --nodes K, only the re-quantized slices")
    print("  cross nodes: (K - 1) / world of the payload per GPU, against the ring's (world - 1) / world of bf16.")
    print(f"  Predicted at {link_gbs:g} GB/s per GPU (bytes / bandwidth, this run's bytes):")
    for r in rows:
        predicted = r.bytes_sent / (link_gbs * 1e3)  # µs
        base = r.baseline_bytes / (link_gbs * 1e3)
        print(
            f"    {r.op:<28} {r.numel:>12,} elements: {predicted:10.1f} µs (NCCL bf16 ring {base:10.1f} µs, {r.x_bytes:.2f}x)"
        )


def _bench_size(
    numel: int, args: argparse.Namespace, device: Any, warmup: int, reps: int
) -> tuple[list[CollectiveRow], int]:
    """The NCCL row and the quantized rows of one bucket size; and how many rows failed."""
    import torch
    import torch.distributed as dist

    import quantplan.distributed as qpd

    rank, world = dist.get_rank(), dist.get_world_size()
    shard = numel // world
    generator = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(numel, generator=generator).to(device=device, dtype=torch.bfloat16)
    out = torch.empty(shard, dtype=torch.bfloat16, device=device)

    def nccl() -> None:
        dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)

    baseline_us = _time_collective(nccl, warmup, reps)
    baseline_bytes = (world - 1) * shard * 2
    rows = [
        CollectiveRow(
            "NCCL reduce_scatter bf16", numel, world, args.nodes, baseline_us, baseline_bytes, baseline_bytes, 0
        )
    ]
    failed = 0
    for bits, code in ((4, qp.ElementKind.S4), (8, qp.ElementKind.S8)):
        label = f"qgZ int{bits} sym g{args.group_size}"
        try:
            op = qpd.QuantizedReduceScatter(
                numel, torch.bfloat16, device, nodes=args.nodes, group_size=args.group_size, code=code
            )

            def quantized(op: qpd.QuantizedReduceScatter = op) -> None:
                op.run(out, x)

            us = _time_collective(quantized, warmup, reps)
        except Exception as exc:  # every rank fails alike (same problem); report and go on
            failed += 1
            if rank == 0:
                print(f"ERROR: {label} at {numel} elements: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        sent = op.bytes_sent
        rows.append(
            CollectiveRow(
                label, numel, world, args.nodes, us, sent.total, sent.intra, sent.inter, extra={"steps": op.describe()}
            )
        )
    for r in rows:
        r.baseline_us, r.baseline_bytes = baseline_us, baseline_bytes
    return rows, failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1, help="groups of consecutive ranks (the hierarchy's nodes)")
    p.add_argument("--group-size", type=int, default=2048, help="elements per scale")
    p.add_argument("--numel", type=int, nargs="*", default=list(DEFAULT_NUMELS), help="bucket sizes (elements)")
    p.add_argument("--link-gbs", type=float, default=50.0, help="link bandwidth of the written model, GB/s per GPU")
    p.add_argument("--json", metavar="PATH", help="also write the rows (and device info) to PATH as JSON (rank 0)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, noisier figures)")
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    import quantplan.distributed as qpd

    if not torch.cuda.is_available():
        print("bench_collectives: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local)
    warmup, reps = (3, 10) if args.quick else (10, 50)
    unit = world * args.group_size
    rows: list[CollectiveRow] = []
    failed = 0
    for requested in args.numel:
        numel = max(unit, -(-requested // unit) * unit)  # whole groups per shard
        size_rows, size_failed = _bench_size(numel, args, device, warmup, reps)
        rows += size_rows
        failed += size_failed
        qpd.clear_cache()
        torch.cuda.empty_cache()

    if rank == 0:
        meta = harness.device_summary()
        meta.update(world=world, nodes=args.nodes, group_size=args.group_size, warmup=warmup, reps=reps)
        print("# bench_collectives: " + ", ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
        print()
        print_table(rows)
        print_model(rows, args.link_gbs)
        if args.json:
            payload = {"meta": meta, "rows": [r.to_dict() for r in rows]}
            Path(args.json).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
