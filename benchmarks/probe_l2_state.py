"""Probe: the dense row kernels against torch.compile's Triton kernels under several L2 states.

The bench (``bench_peers.py``) times a row's calls back to back on one buffer set when the problem
moves more than twice the L2 size: each call starts with the L2 full of the previous call's lines,
two thirds of them dirty output. This script times, on the bench's own rows and operands:

* ``bench``: :func:`harness.time_gpu` exactly as the bench calls it, in interleaved rounds (every
  contender once per round, the order rotated), so drift falls on all alike;
* ``clean``: each call after a read-only pass over 256 MiB (the L2 holds clean lines);
* ``dirty``: each call after a write pass over 256 MiB (the L2 holds dirty lines of other memory);
* ``b2b``: one event pair around 50 calls back to back (no events between calls);

for the plan, the ``torch.compile``d math, the pure load/store floor kernel of the same bytes, and
variants of the plan's dense kernel (vectors per thread, block size, resident blocks) selected
through the tuning table (``quantplan.runtime._tuning.TUNING``, as ``QUANTPLAN_NVRTC_OPTIONS`` overrides it) and
the layout module's constants. Each variant's output is
compared with the plan's bit for bit. ``--ncu-target ROW`` runs each contender a few times for an
Nsight Compute run (``--cache-control none`` keeps the previous call's L2 state).

Usage: ``python3 benchmarks/probe_l2_state.py [--rows deq,fake,...] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import harness  # noqa: E402

Thunk = Callable[[], Any]


@dataclass(frozen=True)
class Variant:
    """A kernel shape: NVRTC defines and the Python constants that select the same shape."""

    name: str
    defines: tuple[str, ...] = ()
    #: (module attribute path, value): ``_layout.DENSE_MAX_THREADS``, ``_layout.DENSE_ROW_SHAPES[k]``, ...
    patches: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class RowProbe:
    """One bench row and the variants of its kernel to time."""

    key: str
    label: str
    dtype: str
    unit: str  # which compile unit the variants rebuild (see _unit_of)
    variants: tuple[Variant, ...] = field(default_factory=tuple)


_DQ = "_layout.DENSE_ROW_SHAPES['dequantize_dense']"
_DQ_THREADS = "_layout.DENSE_ROW_THREADS['dequantize_dense']"
_DQB = "_layout.DENSE_ROW_SHAPES['dequantize_backward_dense']"
_QB_BF16 = "_layout.DENSE_ROW_SHAPES_BY_FLOAT[('quantize_backward_dense', 'BF16')]"
_THREADS = "_layout.DENSE_MAX_THREADS"
_FAKE_BLOCK = "_layout._FAKE_DENSE_NEAREST_BLOCK"
_FAKE_BYTES = "_layout._FAKE_DENSE_THREAD_BYTES"
#: Candidate shapes against the defaults (dequantize: two 8-element vectors per thread in blocks of
#: 256; the nearest fake forward: two 16-byte vectors in blocks of 256, 6 resident blocks).
_DQ_VARIANTS = (
    Variant("u1-128t", ("-DQP_DENSE_DEQUANTIZE_UNROLL=1",), ((_DQ, (8, 1)), (_DQ_THREADS, 128))),
    Variant("u2-128t", (), ((_DQ_THREADS, 128),)),
    Variant("u1-256t", ("-DQP_DENSE_DEQUANTIZE_UNROLL=1",), ((_DQ, (8, 1)),)),
)
_FAKE_ONE = ("-DQP_FAKE_DENSE_ROWS_MIN_BLOCKS=8", "-DQP_FAKE_DENSE_THREAD_BYTES=16")
_FAKE_VARIANTS = (
    Variant("u1-128t-8blk", _FAKE_ONE, ((_FAKE_BYTES, 16), (_FAKE_BLOCK, 128))),
    Variant("u2-128t", (), ((_FAKE_BLOCK, 128),)),
    Variant("u1-256t-8blk", _FAKE_ONE, ((_FAKE_BYTES, 16),)),
)

ROWS: dict[str, RowProbe] = {
    r.key: r
    for r in (
        RowProbe("deq", "dequantize per-token int8", "fp16", "dequantize:F16:S8", _DQ_VARIANTS),
        RowProbe("fake", "fake quant per-channel int8", "fp16", "fake_quantize:F16", _FAKE_VARIANTS),
        RowProbe(
            "qbwd",
            "quantize bwd per-token int8",
            "bf16",
            "quantize:BF16:S8",
            (
                Variant("8blk", ("-DQP_DENSE_QBWD_BF16_MIN_BLOCKS=8",)),
                Variant("v8-6blk", (), ((_QB_BF16, (8, 1)),)),
            ),
        ),
        RowProbe(
            "dqbwd",
            "dequantize bwd per-token int8",
            "bf16",
            "dequantize:BF16:S8",
            (Variant("v8-128t", (), ((_THREADS, 128),)),),
        ),
        RowProbe("deq8", "dequantize fp8 e4m3 per-tensor", "fp16", "dequantize:F16:FP8_E4M3", _DQ_VARIANTS[:2]),
        RowProbe("deqbf", "dequantize per-token int8", "bf16", "dequantize:BF16:S8", _DQ_VARIANTS[:1]),
        RowProbe("fakebf", "fake quant per-channel int8", "bf16", "fake_quantize:BF16", _FAKE_VARIANTS[:1]),
    )
}


# ---- variants: constants and compile options ----------------------------------------------------


def _resolve(path: str) -> tuple[Any, str, Any]:
    """(container, key, is_item) of a patch path such as ``_layout.DENSE_ROW_SHAPES['k']``."""
    import importlib

    module_name, _, rest = path.partition(".")
    module = importlib.import_module(f"quantplan.{module_name}")
    if "[" not in rest:
        return module, rest, False
    attr, _, key_text = rest.partition("[")
    key: Any = eval(key_text[:-1])  # a literal of this file's tables
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], str):
        from quantplan.vocabulary.types import ElementKind

        key = (key[0], ElementKind[key[1]])
    return getattr(module, attr), key, True


@contextmanager
def applied(variant: Variant | None) -> Iterator[None]:
    """``variant``'s constants and NVRTC options in force inside the block (restored after): its
    defines override the tuning table (``quantplan.runtime._tuning.TUNING``) the kernels compile with; the
    Python constants its patches name are set beside them."""
    from quantplan.runtime import _tuning

    undo: list[Callable[[], None]] = []
    old_env = os.environ.get("QUANTPLAN_NVRTC_OPTIONS")
    old_table = _tuning.TUNING
    try:
        if variant is not None:
            os.environ["QUANTPLAN_NVRTC_OPTIONS"] = " ".join(variant.defines)
            _tuning.TUNING = _tuning._table()
            for path, value in variant.patches:
                container, key, item = _resolve(path)
                if item:
                    had, old = key in container, container.get(key)
                    container[key] = value
                    undo.append(lambda c=container, k=key, h=had, o=old: c.__setitem__(k, o) if h else c.pop(k, None))
                else:
                    old = getattr(container, key)
                    setattr(container, key, value)
                    undo.append(lambda c=container, k=key, o=old: setattr(c, k, o))
        yield
    finally:
        for fn in reversed(undo):
            fn()
        _tuning.TUNING = old_table
        if old_env is None:
            os.environ.pop("QUANTPLAN_NVRTC_OPTIONS", None)
        else:
            os.environ["QUANTPLAN_NVRTC_OPTIONS"] = old_env


def _unit_of(unit: str) -> tuple[str, list[str]]:
    from quantplan.runtime import _families as fam
    from quantplan.vocabulary.types import ElementKind, Rounding

    family, *kinds = unit.split(":")
    k = [ElementKind[x] for x in kinds]
    if family == "dequantize":
        return family, fam.dequantize_unit(k[0], k[1], False)
    if family == "quantize":
        return family, fam.quantize_unit(k[0], k[1], False, Rounding.NEAREST_EVEN)
    return family, fam.fake_quantize_unit(k[0])


def _prefill(unit: str, variant: Variant, arch: str) -> str:
    """Compile ``variant``'s unit into the on-disk cache (a worker process: NVRTC only)."""
    from quantplan.runtime._tuning import kernel_options
    from quantplan.runtime.compiler import compile_instantiations
    from quantplan.vocabulary.types import ArchSku

    with applied(variant):
        family, names = _unit_of(unit)
        compile_instantiations(family, names, ArchSku.parse(arch), kernel_options())
    return variant.name


# ---- timing protocols ---------------------------------------------------------------------------


def timed_after(fns: Sequence[Thunk], pre: Thunk, reps: int = 60, warmup: int = 6) -> float:
    """Median µs of each call of ``fns`` (cycled) with ``pre()`` run before it, outside its events."""
    import torch

    for i in range(warmup):
        pre()
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for j in range(0, reps, 16):
        torch.cuda.synchronize()
        harness._backlog(2000.0)
        for i in range(j, min(reps, j + 16)):
            pre()
            starts[i].record()
            fns[i % len(fns)]()
            ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))


def back_to_back(fns: Sequence[Thunk], calls: int = 50, repeats: int = 3) -> float:
    """µs per call of ``calls`` calls between one pair of events (median of ``repeats``)."""
    import torch

    got = []
    for _ in range(repeats):
        for i in range(4):
            fns[i % len(fns)]()
        torch.cuda.synchronize()
        harness._backlog(3000.0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fns[i % len(fns)]()
        end.record()
        end.synchronize()
        got.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(got)


# ---- contenders -----------------------------------------------------------------------------------


def floor_thunk(nbytes_read: int, nbytes_written: int, block: int = 128) -> Thunk:
    """harness.floor_time's kernel for these bytes, one configuration (plain loads)."""
    import math

    import cupy
    import numpy
    import torch

    ratio = min(harness._FLOOR_VECTORS, key=lambda r: abs(math.log(r) - math.log(nbytes_read / nbytes_written)))
    r, w = harness._FLOOR_VECTORS[ratio]
    n = nbytes_read // r
    kernel = harness._floor_module().get_function(f"qp_floor_pattern<{r}, {w}, false>")
    src = torch.empty(n * r, dtype=torch.uint8, device="cuda")
    dst = torch.empty(n * w, dtype=torch.uint8, device="cuda")
    grid = (n + block - 1) // block

    def launch() -> None:
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((grid,), (block,), (numpy.uint64(src.data_ptr()), numpy.uint64(dst.data_ptr()), numpy.int64(n)))

    return launch


def plan_thunk(bp: Any, built: Any, s: dict[str, Any], variant: Variant | None) -> tuple[Thunk, Any]:
    """The plan's call on buffer set ``s`` (``variant`` in force while it is selected), and the plan."""
    import torch

    import quantplan as qp

    with applied(variant):
        plan = bp._select(built, reference=False)
    ws = qp.Workspace.allocate(plan.workspace_size())
    args = built.args(s)
    stream = torch.cuda.current_stream()
    return partial(plan.run, stream, ws, args), plan


def _regs(bp: Any, plan: Any) -> str:
    """Registers and occupancy of the plan's kernel (the bench's kernel_info)."""
    try:
        launches = bp.find_launches(plan)
        info = bp.kernel_info(launches[:1], [])
        return f"regs {info.regs}, {info.occupancy}"
    except Exception as exc:
        return f"regs ? ({type(exc).__name__})"


def outputs_equal(built: Any, a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when the plan outputs in sets ``a`` and ``b`` hold the same bits."""
    import torch

    return all(torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in built.outputs)


# ---- one row -------------------------------------------------------------------------------------


def probe_row(bp: Any, probe: RowProbe, compile_it: bool, rounds: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every contender of ``probe`` under every protocol; a JSON-able summary."""
    import torch

    spec = next(s for s in bp.specs() if s.label == probe.label and s.dtype == probe.dtype and s.shape == bp.BIG)
    built = bp.build(spec)
    base_set = bp._new_set(built)
    read, written = bp._plan_io_bytes(built, base_set)
    out: dict[str, Any] = {"row": spec.name, "dtype": spec.dtype, "bytes": [read, written], "variants": {}}
    contenders: dict[str, list[Thunk]] = {}
    base_fn, base_plan = plan_thunk(bp, built, base_set, None)
    base_fn()
    torch.cuda.synchronize()
    contenders["plan"] = [base_fn]
    out["variants"]["plan"] = f"{base_plan.sku().variant} {_regs(bp, base_plan)}"
    for v in probe.variants:
        try:
            vset = {k: (t if k not in built.outputs else torch.empty_like(t)) for k, t in base_set.items()}
            fn, plan = plan_thunk(bp, built, vset, v)
            fn()
            torch.cuda.synchronize()
            same = outputs_equal(built, base_set, vset)
            out["variants"][v.name] = f"{plan.sku().variant} {_regs(bp, plan)} {'= plan' if same else 'DIFFERS'}"
            contenders[v.name] = [fn]
        except Exception as exc:  # a variant that does not build is reported, not fatal
            out["variants"][v.name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    contenders["floor128"] = [floor_thunk(read, written, 128)]
    contenders["floor256"] = [floor_thunk(read, written, 256)]
    if compile_it and built.math is not None:
        t0 = time.perf_counter()
        import torch._dynamo

        torch._dynamo.reset()
        compiled = torch.compile(built.math, dynamic=False)
        got = compiled(*(base_set[n] for n in built.math_in))
        torch.cuda.synchronize()
        out["compile_s"] = round(time.perf_counter() - t0, 1)
        out["compile_vs_plan"] = bp.diff_vs_plan(got, list(built.outputs), base_set) or "same bits"
        contenders["compile"] = [partial(bp._call_named, compiled, built.math_in, base_set)]
    names = list(contenders)
    # The bench's protocol, interleaved rounds with the order rotated.
    per: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            per[n].append(harness.time_gpu(contenders[n], warmup=10, reps=100))
    out["bench_rounds"] = {n: [round(x, 2) for x in per[n]] for n in names}
    out["bench"] = {n: round(statistics.median(per[n]), 2) for n in names}
    # L2 states: after a clean (read-only) or dirty (write) pass over other memory; back to back.
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")

    def clean() -> None:
        torch.sum(big.view(torch.int64), dim=0, out=sink)

    def dirty() -> None:
        big.fill_(7)

    proto: dict[str, dict[str, float]] = {}
    for n in names:
        proto[n] = {
            "clean": round(timed_after(contenders[n], clean), 2),
            "dirty": round(timed_after(contenders[n], dirty), 2),
            "b2b": round(back_to_back(contenders[n]), 2),
        }
    out["protocols"] = proto
    # After an idle spell (the bench times the plan right after its CPU reference check).
    if "compile" in contenders and probe.key == "deq":
        idle: dict[str, list[float]] = {}
        for n in ("plan", "compile"):
            time.sleep(1.5)
            cold = harness.time_gpu(contenders[n], warmup=10, reps=100)
            warm = harness.time_gpu(contenders[n], warmup=10, reps=100)
            idle[n] = [round(cold, 2), round(warm, 2)]
        out["idle_then_warm"] = idle
    ref = out["bench"].get("compile")
    floor = min(out["bench"]["floor128"], out["bench"]["floor256"])
    log(f"\n== {spec.name} {spec.dtype}  (read {read >> 20} MiB, write {written >> 20} MiB)")
    for n in names:
        b = out["bench"][n]
        x = f"{ref / b:.3f}x compile" if ref else "-"
        p = proto[n]
        log(
            f"  {n:14s} bench {b:7.2f} us  {x:16s} {floor / b:.3f}x floor | rounds {out['bench_rounds'][n]} | "
            f"clean {p['clean']:.2f} dirty {p['dirty']:.2f} b2b {p['b2b']:.2f}"
        )
    for n, desc in out["variants"].items():
        log(f"    {n}: {desc}")
    if "idle_then_warm" in out:
        log(f"  idle(1.5 s) then warm: {out['idle_then_warm']}  compile {out.get('compile_s')} s")
    return out


def ncu_target(bp: Any, keys: Sequence[str], calls: int) -> None:
    """For Nsight Compute: each contender of each row ``calls`` times back to back, in order."""
    import torch

    for key in keys:
        probe = ROWS[key]
        spec = next(s for s in bp.specs() if s.label == probe.label and s.dtype == probe.dtype and s.shape == bp.BIG)
        built = bp.build(spec)
        s = bp._new_set(built)
        read, written = bp._plan_io_bytes(built, s)
        fns: dict[str, Thunk] = {"plan": plan_thunk(bp, built, s, None)[0]}
        for v in probe.variants[:2]:
            vs = {k: (t if k not in built.outputs else torch.empty_like(t)) for k, t in s.items()}
            fns[v.name] = plan_thunk(bp, built, vs, v)[0]
        fns["floor128"] = floor_thunk(read, written, 128)
        if built.math is not None:
            compiled = torch.compile(built.math, dynamic=False)
            fns["compile"] = partial(bp._call_named, compiled, built.math_in, s)
            fns["compile"]()
        torch.cuda.synchronize()
        for name, fn in fns.items():
            print(f"NCU-ORDER {key} {name} x{calls}", flush=True)
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="deq,fake,qbwd,dqbwd,deq8,deqbf,fakebf", help="comma list of " + ",".join(ROWS))
    p.add_argument(
        "--compile-rows", default="deq,fake,qbwd,dqbwd,deq8,deqbf,fakebf", help="rows that also time torch.compile"
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--budget", type=float, default=200.0, help="seconds; past it, later rows skip torch.compile")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--ncu-target", default=None, help="comma list of rows: run for ncu instead of timing")
    p.add_argument("--ncu-calls", type=int, default=4)
    opt = p.parse_args(argv)
    t_start = time.perf_counter()
    import bench_peers as bp

    if opt.ncu_target:
        ncu_target(bp, opt.ncu_target.split(","), opt.ncu_calls)
        return 0
    keys = [k for k in opt.rows.split(",") if k]
    # Compile every variant's unit in parallel worker processes while torch.compile runs.
    pool = ProcessPoolExecutor(max_workers=min(12, os.cpu_count() or 4))
    futures: list[Future[str]] = [
        pool.submit(_prefill, ROWS[k].unit, v, "sm_90") for k in keys for v in ROWS[k].variants
    ]

    def log(text: str) -> None:
        print(text, flush=True)

    import torch

    log(f"device {torch.cuda.get_device_name()}, L2 {harness.l2_cache_bytes() >> 20} MiB")
    results = []
    for i, k in enumerate(keys):
        if i == 1:
            for f in futures:
                try:
                    f.result()
                except Exception as exc:
                    log(f"prefill failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        compile_it = k in opt.compile_rows.split(",") and time.perf_counter() - t_start < opt.budget
        results.append(probe_row(bp, ROWS[k], compile_it, opt.rounds, log))
        log(f"  [t = {time.perf_counter() - t_start:.0f} s]")
    pool.shutdown(wait=False, cancel_futures=True)
    if opt.json is not None:
        opt.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
