"""ZeRO++ qgZ with quantplan: a quantized reduce-scatter of a gradient bucket, one process per GPU.

Run it with torchrun (``--nodes K`` splits the ranks into K groups of consecutive ranks, as if
they were K machines, to exercise the hierarchical path on one host)::

    torchrun --nproc_per_node=4 examples/zeropp_torchrun.py --nodes 2
    torchrun --nproc_per_node=2 examples/zeropp_torchrun.py --bits 8

Every rank builds a random bf16 "gradient" of ``world * shard`` elements, reduce-scatters it
with :func:`quantplan.distributed.quantized_reduce_scatter` (4-bit codes by default, one scale per
2048 elements) and with ``torch.distributed.reduce_scatter_tensor`` in float32, and rank 0 prints
each rank's maximum error, the bound the bit width implies, and the bytes each rank sent
against what a bf16 ring reduce-scatter sends. With GPUs the ranks use NCCL; without, they run on
the CPU over gloo with quantplan's NumPy reference backend (same results, bit for bit).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import quantplan as qp
import quantplan.distributed as qpd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=1, help="groups of consecutive ranks (the hierarchy's nodes)")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4, help="code width")
    p.add_argument("--asymmetric", action="store_true", help="ASYMMETRIC codes (an int32 zero point per group)")
    p.add_argument("--group-size", type=int, default=2048, help="elements sharing one scale")
    p.add_argument("--groups-per-shard", type=int, default=64, help="shard size, in groups")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    if cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    shard = args.group_size * args.groups_per_shard
    numel = world * shard
    generator = torch.Generator().manual_seed(1234 + rank)
    grad = (torch.randn(numel, generator=generator) * 1e-3).to(device=device, dtype=torch.bfloat16)

    code = qp.ElementKind.S4 if args.bits == 4 else qp.ElementKind.S8
    mode = qp.QuantMode.ASYMMETRIC if args.asymmetric else qp.QuantMode.SYMMETRIC
    out = torch.empty(shard, dtype=torch.bfloat16, device=device)
    qpd.quantized_reduce_scatter(out, grad, nodes=args.nodes, group_size=args.group_size, code=code, mode=mode)

    exact = torch.empty(shard, dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(exact, grad.float())  # full-precision sum ...
    exact /= world  # ... and mean
    err = (out.float() - exact).abs().max().item()
    # A loose version of the documented bound: half a step of the widest group on every hop.
    q_max = 7 if args.bits == 4 else 127
    step = grad.float().abs().max() / q_max
    dist.all_reduce(step, op=dist.ReduceOp.MAX)
    bound = step.item() * (0.5 if args.nodes == 1 else 1.0) + exact.abs().max().item() * 2**-8

    op = qpd.QuantizedReduceScatter(
        numel, torch.bfloat16, device, nodes=args.nodes, group_size=args.group_size, code=code, mode=mode
    )
    sent = op.bytes_sent
    ring_bf16 = (world - 1) * shard * 2  # a ring reduce-scatter sends world - 1 shards of bf16
    line = (
        f"rank {rank}: max |error| vs reduce_scatter_tensor = {err:.3e} (bound ~{bound:.3e}); "
        f"bytes sent: {sent.total} (intra-node {sent.intra}, inter-node {sent.inter}) "
        f"vs {ring_bf16} for a bf16 ring ({ring_bf16 / max(1, sent.total):.2f}x fewer)"
    )
    lines: list[str | None] = [None] * world
    dist.all_gather_object(lines, line)
    if rank == 0:
        print(
            f"quantized reduce-scatter of {numel} bf16 elements: world {world}, nodes {args.nodes}, "
            f"{args.bits}-bit {mode.value}, group {args.group_size}; steps: {op.describe()}"
        )
        for text in lines:
            print(text)
    del op
    qpd.clear_cache()  # drop the cached collectives and subgroups before the process group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
