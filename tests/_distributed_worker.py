"""Worker bodies and NumPy models of the quantized-collective tests (``quantplan.distributed``).

Not a test module (pytest collects ``test_*.py`` only). Three parts:

* NumPy models composed from :mod:`quantplan.reference` (``reduce_scatter_model``,
  ``all_gather_model``) with the per-element error bounds the bit width implies;
* ``cpu_worker``: the body each process of the CPU tests runs (gloo, reference backend),
  started by ``torch.multiprocessing`` from ``tests/test_distributed.py``;
* ``main``: the multi-GPU check, run under torchrun by ``tests/test_distributed_multi_gpu.py``::

      python -m torch.distributed.run --standalone --nproc_per_node=N tests/_distributed_worker.py --nodes K --out DIR

  Every rank writes ``DIR/rank<r>.json`` (``ok``, failures, per-case figures) and exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import secrets
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script under torchrun: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quantplan import reference  # noqa: E402
from quantplan.vocabulary.elements import ELEMENTS  # noqa: E402
from quantplan.vocabulary.errors import Unsupported  # noqa: E402
from quantplan.vocabulary.types import ElementKind, GroupScope, MathPrecision, QuantMode  # noqa: E402

F32 = MathPrecision.F32
#: Half a unit in the last place, relative, of each output dtype (round to nearest).
OUT_EPS = {ElementKind.F32: 2.0**-24, ElementKind.BF16: 2.0**-8, ElementKind.F16: 2.0**-11}
#: Half the spacing of the smallest subnormals (absolute rounding error near zero).
OUT_TINY = {ElementKind.F32: 2.0**-150, ElementKind.BF16: 2.0**-134, ElementKind.F16: 2.0**-25}
TORCH_DTYPES = {ElementKind.F16: "float16", ElementKind.BF16: "bfloat16", ElementKind.F32: "float32"}


# ---- NumPy models -------------------------------------------------------------------------------


def random_input(rng: np.random.Generator, numel: int, kind: ElementKind) -> np.ndarray:
    """Fresh normal data with group magnitudes spread over two decades, rounded to ``kind``, as float32."""
    scale = np.exp(rng.uniform(-2.5, 2.5, size=-(-numel // 64)))
    x = rng.standard_normal(numel) * np.repeat(scale, 64)[:numel]
    return x.astype(ELEMENTS[kind].numpy_dtype).astype(np.float32)


def reduce_scatter_model(
    xs: list[np.ndarray],
    nodes: int,
    group_size: int,
    code: ElementKind,
    mode: QuantMode,
    average: bool,
    out: ElementKind,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every rank's qgZ output and its error bound, composed from the reference functions.

    ``xs[r]``: rank ``r``'s flat input (float32 holding values of ``out``'s dtype). Returns
    ``(outputs, bounds)``: ``outputs[z]`` in ``out``'s NumPy dtype (reference.swizzled_quantize on
    every rank, then reference.dequant_reduce over the local peers of node ``z // dpn`` in peer
    order, and for ``nodes > 1`` a re-quantized chunk, then reference.dequant_reduce over the
    nodes) and ``bounds[z]`` the quantization part of the error bound per element:
    ``(1/nodes) * sum_n [(1/dpn) * sum_{r in n} s1_r / 2 + s2_n / 2]`` (no ``1/...`` without
    ``average``; no ``s2`` for one node), ``s1`` / ``s2`` the scales of the element's groups.
    """
    world = len(xs)
    dpn = world // nodes
    q_min, q_max = ELEMENTS[code].code_range or (0, 0)
    float_in = [x.astype(ELEMENTS[out].numpy_dtype) for x in xs]
    sw = [reference.swizzled_quantize(x, group_size, nodes, dpn, 1, mode, code, q_min, q_max) for x in float_in]
    q1 = [t[0][0] for t in sw]  # (dpn, nodes * slice storage): chunk d for local device d
    s1 = [t[1][0] for t in sw]
    z1 = [None if t[2] is None else t[2][0] for t in sw]
    shard = xs[0].size // world
    sg = shard // group_size

    asym = mode is QuantMode.ASYMMETRIC

    def reduce(qs: list[np.ndarray], ss: list[np.ndarray], zs: list[Any], kind: ElementKind) -> tuple[Any, ...]:
        zp = np.stack(zs) if asym else None
        is_float = ELEMENTS[kind].is_float
        return reference.dequant_reduce(
            np.stack(qs),
            np.stack(ss),
            zp,
            code,
            group_size,
            kind,
            None if is_float else group_size,
            mode,
            q_min,
            q_max,
            average=average,
        )

    outputs: list[np.ndarray] = []
    bounds: list[np.ndarray] = []
    mids: dict[tuple[int, int], tuple[Any, ...]] = {}
    if nodes > 1:
        for n in range(nodes):
            peers = range(n * dpn, (n + 1) * dpn)
            for d in range(dpn):
                zs = [z1[p][d] for p in peers] if asym else []  # type: ignore[index]
                mids[(n, d)] = reduce([q1[p][d] for p in peers], [s1[p][d] for p in peers], zs, code)
    for z in range(world):
        n0, d0 = divmod(z, dpn)
        part = slice(n0 * sg, (n0 + 1) * sg)
        if nodes == 1:
            peers = range(dpn)
            zs = [z1[p][d0] for p in peers] if asym else []  # type: ignore[index]
            y = reduce([q1[p][d0] for p in peers], [s1[p][d0] for p in peers], zs, out)[0]
            b = sum(0.5 * s1[p][d0].astype(np.float64) for p in peers)
            bound = b / dpn if average else b
        else:
            storage = ELEMENTS[code].storage_bits * shard // 8
            qs = [mids[(n, d0)][0][n0 * storage : (n0 + 1) * storage] for n in range(nodes)]
            ss = [mids[(n, d0)][1][part] for n in range(nodes)]
            zs = [mids[(n, d0)][2][part] for n in range(nodes)] if asym else []
            y = reduce(qs, ss, zs, out)[0]
            total = np.zeros(sg)
            for n in range(nodes):
                b1 = sum(0.5 * s1[p][d0][part].astype(np.float64) for p in range(n * dpn, (n + 1) * dpn))
                b2 = 0.5 * mids[(n, d0)][1][part].astype(np.float64)
                total = total + (b1 / dpn if average else b1) + b2
            bound = total / nodes if average else total
        outputs.append(y)
        bounds.append(np.repeat(np.asarray(bound, dtype=np.float64), group_size))
    return outputs, bounds


def exact_reduce_scatter(xs: list[np.ndarray], average: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The exact shards (float64) of the mean or sum, and of ``sum_r |x_r|`` (scaled alike) for rounding slack."""
    world = len(xs)
    total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    mags = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
    if average:
        total, mags = total / world, mags / world
    shard = xs[0].size // world
    return (
        [total[z * shard : (z + 1) * shard] for z in range(world)],
        [mags[z * shard : (z + 1) * shard] for z in range(world)],
    )


def tolerance(bound: np.ndarray, exact: np.ndarray, mags: np.ndarray, out: ElementKind, terms: int) -> np.ndarray:
    """Bound on ``|result - exact|``: the quantization ``bound`` plus float32 rounding of the ``terms``
    dequantizations / additions / divisions (relative ``2**-24`` each of the magnitudes involved)
    and the final rounding to ``out`` (half an ulp of the result, or of the subnormal spacing)."""
    f32 = (terms + 4) * 2.0**-24 * (mags + 16 * bound)
    final = OUT_EPS[out] * (np.abs(exact) + bound + f32) + OUT_TINY[out]
    return bound + f32 + final


def all_gather_model(
    xs: list[np.ndarray], group_size: int, code: ElementKind, mode: QuantMode, out: ElementKind
) -> tuple[np.ndarray, np.ndarray]:
    """The qwZ output (``out``'s dtype) and its bound per element (``scale / 2``), from
    reference.dynamic_quantize and reference.dequantize of each rank's shard."""
    q_min, q_max = ELEMENTS[code].code_range or (0, 0)
    ys, bounds = [], []
    scope = GroupScope(axis=-1, group_size=group_size)
    for x in xs:
        xf = x.astype(ELEMENTS[out].numpy_dtype)
        q, s, z = reference.dynamic_quantize(xf, scope, mode, code, q_min, q_max, F32)
        zp: np.ndarray | int = 0 if z is None else np.repeat(z, group_size)
        ys.append(reference.dequantize(q, np.repeat(s, group_size), zp, code, out, x.size, F32))
        bounds.append(np.repeat(0.5 * s.astype(np.float64), group_size))
    return np.concatenate(ys), np.concatenate(bounds)


def bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (float32 views; any NaN equals any NaN)."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a32.shape != b32.shape:
        return False
    nan = np.isnan(a32)
    if not np.array_equal(nan, np.isnan(b32)):
        return False
    return bool(np.array_equal(a32[~nan].view(np.uint32), b32[~nan].view(np.uint32)))


# ---- CPU worker (gloo, reference backend) ----------------------------------------------------------


def _bad_call(qpd: Any, torch: Any, case: dict[str, Any], world: int) -> tuple[Callable[[], None], Any]:
    """One call that must raise before communicating, and the output it must leave untouched (7s)."""
    bad = case["bad"]
    f32 = torch.float32
    g = 8
    numel = world * g * 2
    x = torch.ones(numel, dtype=f32)
    y = torch.full((numel // world,), 7.0, dtype=f32)
    kwargs: dict[str, Any] = {"group_size": g}
    op = qpd.quantized_reduce_scatter
    if bad == "nodes":
        kwargs["nodes"] = 3
    elif bad == "numel":
        x = torch.ones(numel + world * g // 2, dtype=f32)
        y = torch.full(((numel + world * g // 2) // world,), 7.0, dtype=f32)
    elif bad == "dtype":
        y = torch.full((numel // world,), 7.0, dtype=torch.bfloat16)
    elif bad == "int_dtype":
        x = torch.ones(numel, dtype=torch.int32)
        y = torch.full((numel // world,), 7, dtype=torch.int32)
    elif bad == "out_size":
        y = torch.full((numel // world + 1,), 7.0, dtype=f32)
    elif bad == "noncontiguous_input":
        x = torch.ones(2, numel // 2, dtype=f32).t()
    elif bad == "noncontiguous_output":
        y = torch.full((2, numel // world), 7.0, dtype=f32)[:, ::2]
    elif bad == "devices":
        y = torch.empty(numel // world, dtype=f32, device="meta")
    elif bad == "code":
        kwargs["code"] = ElementKind.F32
    elif bad == "unsigned_sym":
        kwargs.update(code=ElementKind.U8, mode=QuantMode.SYMMETRIC)
    elif bad == "odd4bit":
        kwargs.update(group_size=3, code=ElementKind.S4)
        x = torch.ones(world * 3, dtype=f32)
        y = torch.full((3,), 7.0, dtype=f32)
    elif bad == "ag_group":
        op = qpd.quantized_all_gather
        x = torch.ones(g + 4, dtype=f32)
        y = torch.full((world * (g + 4),), 7.0, dtype=f32)
    elif bad == "ag_size":
        op = qpd.quantized_all_gather
        x = torch.ones(g, dtype=f32)
        y = torch.full((world * g - 1,), 7.0, dtype=f32)
    elif bad == "ag_odd4bit":
        op = qpd.quantized_all_gather
        kwargs.update(group_size=3, code=ElementKind.S4)
        x = torch.ones(3, dtype=f32)
        y = torch.full((world * 3,), 7.0, dtype=f32)
    else:
        raise AssertionError(f"unknown bad case {bad}")
    return (lambda: op(y, x, **kwargs)), y


def _run_case(qpd: Any, torch: Any, dist: Any, case: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    out_kind: ElementKind = case.get("dtype", ElementKind.F32)
    dtype = getattr(torch, TORCH_DTYPES[out_kind])
    result: dict[str, Any] = {"name": case["name"]}
    if case["op"] == "bad":
        call, y = _bad_call(qpd, torch, case, world)
        try:
            call()
            result["error"] = None
        except Exception as exc:  # recorded; the test asserts on type and message
            result["error"] = (type(exc).__name__, str(exc))
        result["untouched"] = bool(y.device.type == "meta" or bool(torch.all(y == 7)))
        return result
    x = torch.from_numpy(case["inputs"][rank]).to(dtype)
    if case["op"] == "rs":
        shard = x.numel() // world
        outs = []
        group = dist.new_group(list(range(world))) if case.get("explicit_group") else None
        kwargs = dict(
            group=group,
            nodes=case["nodes"],
            group_size=case["group_size"],
            code=case["code"],
            mode=case["mode"],
            average=case["average"],
        )
        impl = case.get("implementation")
        for _ in range(2):
            y = torch.full((shard,), float("nan"), dtype=dtype)
            if impl is None:
                qpd.quantized_reduce_scatter(y, x, **kwargs)
            else:
                op = qpd.QuantizedReduceScatter(x.numel(), dtype, "cpu", implementation=impl, **kwargs)
                op.run(y, x)
                result["describe"] = op.describe()
                result["bytes"] = tuple(op.bytes_sent)
            outs.append(y.float().numpy())
    else:
        outs = []
        for _ in range(2):
            y = torch.full((world * x.numel(),), float("nan"), dtype=dtype)
            qpd.quantized_all_gather(y, x, group_size=case["group_size"], code=case["code"], mode=case["mode"])
            outs.append(y.float().numpy())
    result["output"], result["output2"] = outs
    return result


def cpu_worker(rank: int, world: int, store: str, case_file: str, out_dir: str) -> None:
    """One process of the CPU tests: gloo over a file store, every case of ``case_file`` in order;
    writes ``out_dir/rank<r>.pkl`` (a list of per-case results)."""
    import torch
    import torch.distributed as dist

    import quantplan.distributed as qpd

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=90)
    )
    try:
        with open(case_file, "rb") as f:
            cases = pickle.load(f)
        results = []
        for case in cases:
            try:
                results.append(_run_case(qpd, torch, dist, case, rank, world))
            except Exception:
                results.append({"name": case["name"], "crash": traceback.format_exc()})
        dist.barrier()  # every rank got here: no rank is stuck in a collective another skipped
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(results, f)
    finally:
        qpd.clear_cache()
        dist.destroy_process_group()


# ---- the multi-GPU check (torchrun, NCCL) --------------------------------------------------------


#: The device of the multi-GPU check: this rank's GPU (``--cpu``: the CPU, a smoke run over gloo).
_DEVICE: list[Any] = []


class _Checks:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.cases: list[dict[str, Any]] = []

    def expect(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)


def _gpu_reduce_scatter(
    checks: _Checks,
    comm: Any,
    seed: int,
    nodes: int,
    code: ElementKind,
    mode: QuantMode,
    out: ElementKind,
    group_size: int,
    k: int,
) -> None:
    """qgZ on this rank's GPU: both implementations, twice each, against the CPU reference
    composition (bit for bit), the exact mean and NCCL's float32 reduce_scatter_tensor (within
    the bound), and through the CuPy NCCL communicator ``comm`` when there is one (same bits)."""
    import torch
    import torch.distributed as dist

    import quantplan.distributed as qpd

    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, TORCH_DTYPES[out])
    device = _DEVICE[0]
    numel = world * group_size * k
    xs = [random_input(np.random.default_rng([seed, r, k]), numel, out) for r in range(world)]
    x = torch.from_numpy(xs[rank]).to(device=device, dtype=dtype)
    name = f"rs/{code.name}/{mode.value}/{TORCH_DTYPES[out]}/nodes{nodes}/g{group_size}x{k}"
    model, bounds = reduce_scatter_model(xs, nodes, group_size, code, mode, True, out)
    exact, mags = exact_reduce_scatter(xs, True)
    tol = tolerance(bounds[rank], exact[rank], mags[rank], out, world)
    # NCCL full-precision reference: float32 sum, then the mean.
    ref_t = torch.empty(numel // world, dtype=torch.float32, device=device)
    dist.reduce_scatter_tensor(ref_t, x.float())
    ref = (ref_t / world).cpu().numpy().astype(np.float64)
    results: dict[str, np.ndarray] = {}
    for impl in ("auto", "composed"):
        op = qpd.QuantizedReduceScatter(
            numel, dtype, device, nodes=nodes, group_size=group_size, code=code, mode=mode, implementation=impl
        )
        runs = []
        for _ in range(2):
            y = torch.full((numel // world,), float("nan"), dtype=dtype, device=device)
            op.run(y, x)
            runs.append(y.float().cpu().numpy())
        checks.expect(bits_equal(runs[0], runs[1]), f"{name}/{impl}: two runs differ")
        checks.expect(
            bits_equal(runs[0], model[rank].astype(np.float32)),
            f"{name}/{impl}: differs from the CPU reference composition",
        )
        err = np.abs(runs[0].astype(np.float64) - exact[rank])
        checks.expect(bool(np.all(err <= tol)), f"{name}/{impl}: error {np.max(err - tol):.3g} over the bound")
        nccl_err = np.abs(runs[0].astype(np.float64) - ref)
        checks.expect(
            bool(np.all(nccl_err <= tol + world * 2.0**-23 * mags[rank])),
            f"{name}/{impl}: farther from NCCL's reduce_scatter_tensor than the bound",
        )
        results[impl] = runs[0]
        checks.cases.append(
            {
                "name": f"{name}/{impl}",
                "describe": op.describe(),
                "bytes_sent": op.bytes_sent.total,
                "max_abs_err_vs_nccl": float(np.max(nccl_err)) if nccl_err.size else 0.0,
                "max_bound": float(np.max(tol)) if tol.size else 0.0,
            }
        )
    if comm is None:
        checks.cases.append({"name": f"{name}/cupy-nccl", "skipped": "CuPy's NCCL binding is not available"})
        return
    op = qpd.QuantizedReduceScatter(
        numel, dtype, device, group=comm, nodes=nodes, group_size=group_size, code=code, mode=mode
    )
    y = torch.full((numel // world,), float("nan"), dtype=dtype, device=device)
    op.run(y, x)
    checks.expect(
        bits_equal(y.float().cpu().numpy(), results["auto"]), f"{name}/cupy-nccl: differs from the torch path"
    )
    checks.cases.append({"name": f"{name}/cupy-nccl", "describe": op.describe()})


def _gpu_all_gather(
    checks: _Checks, comm: Any, seed: int, code: ElementKind, mode: QuantMode, out: ElementKind, group_size: int
) -> None:
    """qwZ on this rank's GPU: against NCCL's all_gather_into_tensor of the float shards (within
    ``scale / 2``), the CPU reference (bit for bit), twice the same bits, and through the CuPy
    NCCL communicator ``comm`` when there is one (same bits)."""
    import torch
    import torch.distributed as dist

    import quantplan.distributed as qpd

    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, TORCH_DTYPES[out])
    device = _DEVICE[0]
    shard = group_size * 3
    xs = [random_input(np.random.default_rng([seed, r, 99]), shard, out) for r in range(world)]
    x = torch.from_numpy(xs[rank]).to(device=device, dtype=dtype)
    name = f"ag/{code.name}/{mode.value}/{TORCH_DTYPES[out]}/g{group_size}"
    model, bound = all_gather_model(xs, group_size, code, mode, out)
    full = np.concatenate(xs).astype(np.float64)
    ref = torch.empty(world * shard, dtype=dtype, device=device)
    dist.all_gather_into_tensor(ref, x)
    checks.expect(bits_equal(ref.float().cpu().numpy(), full.astype(np.float32)), f"{name}: NCCL all-gather mismatch")
    runs = []
    for _ in range(2):
        y = torch.full((world * shard,), float("nan"), dtype=dtype, device=device)
        qpd.quantized_all_gather(y, x, group_size=group_size, code=code, mode=mode)
        runs.append(y.float().cpu().numpy())
    checks.expect(bits_equal(runs[0], runs[1]), f"{name}: two runs differ")
    checks.expect(bits_equal(runs[0], model.astype(np.float32)), f"{name}: differs from the CPU reference")
    if comm is not None:
        op = qpd.QuantizedAllGather(shard, dtype, device, group=comm, group_size=group_size, code=code, mode=mode)
        y = torch.full((world * shard,), float("nan"), dtype=dtype, device=device)
        op.run(y, x)
        checks.expect(bits_equal(y.float().cpu().numpy(), runs[0]), f"{name}/cupy-nccl: differs from the torch path")
    tol = bound + OUT_EPS[out] * (np.abs(full) + bound) + OUT_TINY[out] + 8 * 2.0**-24 * (np.abs(full) + bound)
    err = np.abs(runs[0].astype(np.float64) - full)
    checks.expect(bool(np.all(err <= tol)), f"{name}: error {np.max(err - tol):.3g} over the bound")
    checks.cases.append({"name": name, "max_abs_err": float(np.max(err))})


def main(argv: list[str] | None = None) -> int:
    """The multi-GPU check: qgZ (both implementations, twice, vs NCCL and the CPU reference, CuPy
    NCCL when available) and qwZ, on this rank; writes ``--out/rank<r>.json``; 0 when all pass."""
    import torch
    import torch.distributed as dist

    import quantplan.distributed as qpd

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--cpu", action="store_true", help="CPU tensors over gloo (a smoke run of this script)")
    args = p.parse_args(argv)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        _DEVICE[:] = [torch.device("cpu")]
    else:
        torch.cuda.set_device(local)
        _DEVICE[:] = [torch.device("cuda", local)]
    dist.init_process_group("gloo" if args.cpu else "nccl", timeout=timedelta(seconds=300))
    rank = dist.get_rank()
    checks = _Checks(rank)
    box = [secrets.randbits(63) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    seed = int(box[0] or 0)
    comm = None
    if not args.cpu:
        try:
            comm = qpd.nccl_communicator()
        except Unsupported:
            pass
    cases: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (_gpu_reduce_scatter, (comm, seed, args.nodes, ElementKind.S4, QuantMode.SYMMETRIC, ElementKind.BF16, 2048, 3)),
        (_gpu_reduce_scatter, (comm, seed, args.nodes, ElementKind.S8, QuantMode.SYMMETRIC, ElementKind.BF16, 2048, 2)),
        (_gpu_reduce_scatter, (comm, seed, args.nodes, ElementKind.S4, QuantMode.ASYMMETRIC, ElementKind.F32, 94, 5)),
        (_gpu_reduce_scatter, (comm, seed, args.nodes, ElementKind.U8, QuantMode.ASYMMETRIC, ElementKind.F16, 77, 3)),
        (_gpu_all_gather, (comm, seed, ElementKind.S8, QuantMode.SYMMETRIC, ElementKind.BF16, 2048)),
        (_gpu_all_gather, (comm, seed, ElementKind.S4, QuantMode.ASYMMETRIC, ElementKind.F32, 90)),
    ]
    for fn, fargs in cases:
        try:
            fn(checks, *fargs)
        except Exception:
            checks.failures.append(f"{fn.__name__}{fargs[2:]}: {traceback.format_exc()}")
    dist.barrier()
    report = {"rank": rank, "world": dist.get_world_size(), "nodes": args.nodes, "seed": seed}
    report.update(ok=not checks.failures, failures=checks.failures, cases=checks.cases)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    qpd.clear_cache()
    dist.destroy_process_group()
    return 0 if not checks.failures else 1


if __name__ == "__main__":
    sys.exit(main())
