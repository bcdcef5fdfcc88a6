"""Shared timing and reporting helpers for the quantplan benchmarks (SPEC section 6).

Method: every measurement runs on PyTorch's current CUDA stream (pass
``torch.cuda.current_stream()`` to ``plan.run`` too, so quantplan, PyTorch eager and
``torch.compile`` share one stream). :func:`time_gpu` brackets each call with a pair of CUDA events
and reports the median in microseconds. Before each chunk of timed calls it parks the stream behind
a short ``torch.cuda._sleep`` so the host enqueues the whole chunk while the GPU is still busy:
the events then measure the GPU's time for the call, not the Python time taken to launch it (that
is reported separately by :func:`host_overhead_us`).

Effective bandwidth is ``(bytes read + bytes written) / median time``; :func:`copy_time` measures
a device-to-device copy moving the same bytes in the same run, the yardstick for "% of copy".

Cache policy (:func:`rotation_sets`): problems moving less than 1 MiB per call are timed hot (they
are launch-latency bound, as in back-to-back layers); problems between that and twice the L2 size
rotate among several buffer sets, so consecutive calls do not find their operands in L2; larger
problems use one set (they flush L2 themselves).

PyTorch is imported lazily, so a script can parse ``--help`` on a machine without it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "Row",
    "copy_time",
    "floor_time",
    "device_summary",
    "host_overhead_interleaved",
    "host_overhead_us",
    "l2_cache_bytes",
    "load_torchao",
    "print_markdown",
    "rotation_sets",
    "time_gpu",
    "write_json",
]

#: Problems moving fewer bytes than this per call are timed with a hot cache (launch-bound regime).
SMALL_PROBLEM_BYTES = 1 << 20
#: Most buffer sets :func:`rotation_sets` asks for.
MAX_ROTATION_SETS = 64
#: Timed calls enqueued behind one backlog sleep.
_CHUNK = 32
#: Assumed host cost of recording one CUDA event, in µs (only sizes the backlog, generously).
_EVENT_US = 5.0
#: Longest backlog sleep, in µs.
_MAX_BACKLOG_US = 50_000.0

Thunk = Callable[[], Any]


# ---- device facts ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def l2_cache_bytes() -> int:
    """L2 size of the current CUDA device in bytes (50 MiB when PyTorch does not report it)."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    size = int(getattr(props, "L2_cache_size", 0) or 0)
    return size if size > 0 else 50 << 20


def device_summary() -> dict[str, Any]:
    """Device name, L2 size and library versions, for the report header and the JSON file."""
    import torch

    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "l2_bytes": l2_cache_bytes(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except Exception:  # CuPy missing only matters to the plans, which report it themselves
        info["cupy"] = None
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # torch.compile rows will say n/a
        info["triton"] = None
    return info


def rotation_sets(nbytes: int, *, l2_bytes: int | None = None) -> int:
    """How many buffer sets a problem moving ``nbytes`` per call should rotate among.

    1 below :data:`SMALL_PROBLEM_BYTES` (hot, launch-bound) and at or above twice the L2 size
    (streams through L2 anyway); otherwise enough sets for the rotation to span twice the L2
    size, at most :data:`MAX_ROTATION_SETS`.
    """
    l2 = l2_cache_bytes() if l2_bytes is None else l2_bytes
    if nbytes < SMALL_PROBLEM_BYTES or nbytes >= 2 * l2:
        return 1
    return min(MAX_ROTATION_SETS, math.ceil(2 * l2 / nbytes))


# ---- timing -----------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _sleep_cycles_per_us() -> float | None:
    """Clock cycles of ``torch.cuda._sleep`` per µs, or None when it is unavailable."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    try:
        sleep(1000)  # first call may load the kernel
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 2_000_000
        start.record()
        sleep(cycles)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3
    except Exception:
        return None
    return cycles / us if us > 0 else None


def _backlog(us: float) -> None:
    """Keep the current stream busy for about ``us`` µs (no-op without ``torch.cuda._sleep``)."""
    import torch

    rate = _sleep_cycles_per_us()
    if rate is None or us <= 0:
        return
    torch.cuda._sleep(int(min(us, _MAX_BACKLOG_US) * rate))


def _thunks(fn: Thunk | Sequence[Thunk], rotate: Sequence[Thunk]) -> list[Thunk]:
    fns = list(fn) if isinstance(fn, Sequence) else [fn]
    fns.extend(rotate)
    if not fns:
        raise ValueError("time_gpu needs at least one callable")
    return fns


def time_gpu(
    fn: Thunk | Sequence[Thunk],
    *,
    warmup: int = 10,
    reps: int = 100,
    rotate: Sequence[Thunk] = (),
) -> float:
    """Median GPU time of one call of ``fn``, in µs, measured with CUDA events around each call.

    ``fn`` launches work on PyTorch's current stream. ``rotate``: further callables doing the same
    work on other buffers (see :func:`rotation_sets`); calls cycle through ``fn, *rotate`` so
    consecutive calls touch different memory. ``fn`` may also be a sequence of such callables.
    Calls are enqueued in chunks behind a short GPU sleep, so the events time the GPU work and
    not the host's launch latency.
    """
    import torch

    fns = _thunks(fn, rotate)
    n = len(fns)
    counter = 0
    torch.cuda.synchronize()
    # Warm up (first calls may compile or allocate); time the later ones on the host to size the backlog.
    host_us = 50.0
    t0 = time.perf_counter()
    for i in range(max(1, warmup)):
        if i == 1:
            t0 = time.perf_counter()
        fns[counter % n]()
        counter += 1
    if warmup > 1:
        host_us = max(1.0, (time.perf_counter() - t0) * 1e6 / (warmup - 1))
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    done = 0
    while done < reps:
        m = min(_CHUNK, reps - done)
        torch.cuda.synchronize()
        _backlog(1.5 * m * (host_us + 2 * _EVENT_US) + 20.0)
        for j in range(done, done + m):
            starts[j].record()
            fns[counter % n]()
            ends[j].record()
            counter += 1
        done += m
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))


def copy_time(nbytes_read: int, nbytes_written: int, *, warmup: int = 10, reps: int = 100) -> tuple[float, float]:
    """Time a device-to-device copy moving ``nbytes_read + nbytes_written`` bytes in all.

    Copies a uint8 tensor of ``ceil((read + written) / 2)`` bytes (read that many, write that
    many), rotating buffers as :func:`rotation_sets` says. Returns ``(median µs, TB/s)``, the
    bandwidth counting bytes read plus bytes written.
    """
    import torch

    half = max(1, (nbytes_read + nbytes_written + 1) // 2)
    sets = rotation_sets(2 * half)
    pairs = [
        (
            torch.randint(0, 256, (half,), dtype=torch.uint8, device="cuda"),
            torch.empty(half, dtype=torch.uint8, device="cuda"),
        )
        for _ in range(sets)
    ]
    fns: list[Thunk] = [lambda src=src, dst=dst: dst.copy_(src) for src, dst in pairs]
    us = time_gpu(fns, warmup=warmup, reps=reps)
    return us, 2 * half / us / 1e6


#: (bytes read, bytes written) per thread of :func:`floor_time`'s kernel, by read:write ratio.
_FLOOR_VECTORS = {8.0: (16, 2), 4.0: (16, 4), 2.0: (16, 8), 1.0: (16, 16), 0.5: (8, 16), 0.25: (4, 16)}

_FLOOR_SOURCE = r"""
template <int N> struct qp_floor_word;
template <> struct qp_floor_word<2> { typedef unsigned short type; };
template <> struct qp_floor_word<4> { typedef unsigned int type; };
template <> struct qp_floor_word<8> { typedef uint2 type; };
template <> struct qp_floor_word<16> { typedef uint4 type; };
__device__ __forceinline__ unsigned qp_floor_fold(unsigned short v) { return v; }
__device__ __forceinline__ unsigned qp_floor_fold(unsigned v) { return v; }
__device__ __forceinline__ unsigned qp_floor_fold(uint2 v) { return v.x ^ v.y; }
__device__ __forceinline__ unsigned qp_floor_fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }
__device__ __forceinline__ void qp_floor_fill(unsigned short& o, unsigned v) { o = (unsigned short)v; }
__device__ __forceinline__ void qp_floor_fill(unsigned& o, unsigned v) { o = v; }
__device__ __forceinline__ void qp_floor_fill(uint2& o, unsigned v) { o = make_uint2(v, v + 1u); }
__device__ __forceinline__ void qp_floor_fill(uint4& o, unsigned v) { o = make_uint4(v, v + 1u, v + 2u, v + 3u); }
// One thread: one R-byte load, one W-byte store derived from it; one pass (no loop), no math.
template <int R, int W, bool STREAMING>
__global__ void qp_floor_pattern(const void* __restrict__ x, void* __restrict__ y, long long n) {
  typedef typename qp_floor_word<R>::type In;
  typedef typename qp_floor_word<W>::type Out;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const In* xp = reinterpret_cast<const In*>(x) + i;
  In v = STREAMING ? __ldcs(xp) : *xp;
  Out o;
  qp_floor_fill(o, qp_floor_fold(v));
  reinterpret_cast<Out*>(y)[i] = o;
}
"""


def floor_time(nbytes_read: int, nbytes_written: int, *, warmup: int = 10, reps: int = 100) -> tuple[float, str] | None:
    """The fastest pure bandwidth kernel moving about ``nbytes_read`` and ``nbytes_written``: the
    floor any kernel with these bytes meets (no math, no parameters, no reduction).

    Each thread loads one vector and stores one vector derived from it, in a one-pass grid (the
    shape a sweep of per-thread vectors, loops, block sizes and cache hints found fastest on an
    H200: it ties a copy of the same bytes). The read:write ratio is rounded to the nearest of
    8:1 ... 1:4 (the op's parameters, a fraction of a percent, are left out). Returns the best
    median µs over block 128 / 256 and plain / streaming loads, with that configuration; None
    when the ratio is outside that range."""
    import cupy
    import numpy
    import torch

    if nbytes_read <= 0 or nbytes_written <= 0:
        return None
    ratio = min(_FLOOR_VECTORS, key=lambda r: abs(math.log(r) - math.log(nbytes_read / nbytes_written)))
    if abs(math.log(ratio) - math.log(nbytes_read / nbytes_written)) > 0.05:
        return None
    r, w = _FLOOR_VECTORS[ratio]
    n = nbytes_read // r
    module = _floor_module()
    src = torch.empty(n * r, dtype=torch.uint8, device="cuda")
    dst = torch.empty(n * w, dtype=torch.uint8, device="cuda")
    sets = rotation_sets(n * (r + w))
    buffers = [(src, dst)] + [(torch.empty_like(src), torch.empty_like(dst)) for _ in range(sets - 1)]
    best: tuple[float, str] | None = None
    for streaming in (False, True):
        kernel = module.get_function(f"qp_floor_pattern<{r}, {w}, {str(streaming).lower()}>")
        for block in (128, 256):
            grid = (n + block - 1) // block

            def launch(a: Any = None, b: Any = None, k: Any = kernel, g: int = grid, t: int = block) -> None:
                with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                    k((g,), (t,), (numpy.uint64(a.data_ptr()), numpy.uint64(b.data_ptr()), numpy.int64(n)))

            fns: list[Thunk] = [partial(launch, a, b) for a, b in buffers]
            us = time_gpu(fns, warmup=warmup, reps=reps)
            label = f"{r} B in / {w} B out per thread, block {block}, {'streaming' if streaming else 'plain'} loads"
            if best is None or us < best[0]:
                best = (us, label)
    return best


@lru_cache(maxsize=1)
def _floor_module() -> Any:
    import cupy

    names = [f"qp_floor_pattern<{r}, {w}, {s}>" for r, w in _FLOOR_VECTORS.values() for s in ("false", "true")]
    return cupy.RawModule(code=_FLOOR_SOURCE, options=("-std=c++17",), name_expressions=names)


def host_overhead_us(fn: Thunk, n: int = 2000, *, batch: int = 100, repeats: int = 5) -> float:
    """Host time of one call of ``fn`` in µs (e.g. ``plan.run``): the median over ``repeats``
    rounds of the mean of ``n`` calls (:func:`host_overhead_interleaved` of ``fn`` alone)."""
    return host_overhead_interleaved({"fn": fn}, n, batch=batch, repeats=repeats)["fn"]


def host_overhead_interleaved(
    fns: dict[str, Thunk], n: int = 2000, *, batch: int = 100, repeats: int = 5
) -> dict[str, float]:
    """Host time of one call of each of ``fns`` in µs: for each, the median over ``repeats``
    rounds of the mean of ``n`` calls, the rounds of all ``fns`` interleaved (round 1 of each,
    then round 2 of each, ...), so a slow spell of the host (another process, a clock change)
    falls on every callable alike and their ratios keep.

    After a warm-up of up to 200 calls each, the device is synchronized before and after each
    batch of ``batch`` calls, outside the timed region, so the launch queue never fills and the
    figure is the Python/driver cost alone. Each round is ``n`` calls timed by the wall clock with
    no sync inside.
    """
    import torch

    for fn in fns.values():  # warm up: caches, the allocator, the CPU's clock
        for _ in range(min(n, 200)):
            fn()
    torch.cuda.synchronize()
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(1, repeats)):
        for name, fn in fns.items():
            total = 0.0
            left = n
            while left > 0:
                m = min(batch, left)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(m):
                    fn()
                total += time.perf_counter() - t0
                left -= m
            rounds[name].append(total * 1e6 / max(1, n))
    torch.cuda.synchronize()
    return {name: statistics.median(r) for name, r in rounds.items()}


# ---- peers --------------------------------------------------------------------------------------


def load_torchao(compile: bool = True) -> tuple[dict[str, Any], list[str]]:
    """torchao 0.18's block-scaled producers, by name, and what could not be loaded (one line each).

    ``to_mx``: ``(to_mx, ScaleCalculationMode)``, ``to_mx`` under ``torch.compile`` (how torchao
    runs it on Hopper) unless ``compile`` is False; ``nvfp4``: ``f(x, per_tensor_scale)`` calling
    ``NVFP4Tensor.to_nvfp4`` (compiled likewise), returning the tensor; ``fp8_lhs``,
    ``fp8_lhs_t``, ``fp8_rhs``, ``fp8_rhs_t``: the Triton kernels ``triton_fp8_blockwise_act_quant_lhs``
    (1x128), ``..._act_quant_transposed_lhs`` (128x1 of x, written transposed),
    ``..._weight_quant_rhs`` (128x128, codes and scales written column-major) and
    ``..._weight_quant_transposed_rhs`` (128x128 tiles of x, the transposed view of x's codes stored
    column-major: x's own row-major order, scales likewise), each ``f(x, block_size)``. A missing torchao or a moved
    API leaves its names out; the benches then report the peer as unavailable.
    """
    import torch

    peers: dict[str, Any] = {}
    missing: list[str] = []

    def wrap(f: Any) -> Any:
        return torch.compile(f) if compile else f

    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx

        peers["to_mx"] = (wrap(to_mx), ScaleCalculationMode)

        def to_mx_pair(x: Any, elem: Any, mode: Any, **kw: Any) -> Any:  # torchao's dim0 and dim1 casts
            return to_mx(x, elem, 32, mode, **kw), to_mx(x.t().contiguous(), elem, 32, mode, **kw)

        peers["to_mx_pair"] = wrap(to_mx_pair)
    except Exception as exc:  # torchao missing or its API moved
        missing.append(f"to_mx: {type(exc).__name__}: {exc}")
    try:
        from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

        def to_nvfp4(x: Any, per_tensor_scale: Any) -> Any:
            return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_scale)

        def to_nvfp4_amax(x: Any) -> Any:  # the tensor scale from x's amax, in the same graph
            return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(torch.max(torch.abs(x))))

        peers["nvfp4"] = wrap(to_nvfp4)
        peers["nvfp4_amax"] = wrap(to_nvfp4_amax)
    except Exception as exc:
        missing.append(f"NVFP4Tensor: {type(exc).__name__}: {exc}")
    try:
        from torchao.prototype.blockwise_fp8_training import kernels

        peers["fp8_lhs"] = kernels.triton_fp8_blockwise_act_quant_lhs
        peers["fp8_lhs_t"] = kernels.triton_fp8_blockwise_act_quant_transposed_lhs
        peers["fp8_rhs"] = kernels.triton_fp8_blockwise_weight_quant_rhs
        peers["fp8_rhs_t"] = kernels.triton_fp8_blockwise_weight_quant_transposed_rhs
    except Exception as exc:  # Triton missing (no GPU) or the kernels moved
        missing.append(f"blockwise_fp8_training kernels: {type(exc).__name__}: {exc}")
    return peers, missing


# ---- reporting --------------------------------------------------------------------------------


@dataclass
class Row:
    """One benchmark row: our time and its peers on the same problem.

    ``nbytes``: bytes read plus bytes written by the op (parameters included). ``copy_us``: a
    device-to-device copy of the same bytes. ``compile_us`` / ``eager_us``: ``torch.compile``
    and PyTorch eager doing the same math (None when unavailable). ``note``: free text.
    """

    op: str
    shape: str
    dtype: str
    us: float
    nbytes: int
    copy_us: float
    compile_us: float | None = None
    eager_us: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tbps(self) -> float:
        """Effective bandwidth of our op, TB/s."""
        return self.nbytes / self.us / 1e6

    @property
    def copy_tbps(self) -> float:
        """Bandwidth of the copy of the same bytes, TB/s."""
        return self.nbytes / self.copy_us / 1e6

    @property
    def pct_of_copy(self) -> float:
        """Our bandwidth as a percentage of the copy's (= copy time / our time)."""
        return 100.0 * self.copy_us / self.us

    @property
    def x_compile(self) -> float | None:
        """``torch.compile`` time / our time (> 1: we are faster)."""
        return None if self.compile_us is None else self.compile_us / self.us

    @property
    def x_eager(self) -> float | None:
        """PyTorch eager time / our time (> 1: we are faster)."""
        return None if self.eager_us is None else self.eager_us / self.us

    def to_dict(self) -> dict[str, Any]:
        """Fields plus derived figures, for JSON."""
        d = asdict(self)
        d.update(
            tbps=self.tbps,
            copy_tbps=self.copy_tbps,
            pct_of_copy=self.pct_of_copy,
            x_compile=self.x_compile,
            x_eager=self.x_eager,
        )
        return d


def _ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}×"


def print_markdown(rows: Sequence[Row]) -> None:
    """Print ``rows`` as a markdown table (op, shape, dtype, µs, TB/s, % of copy, × compile, × eager)."""
    header = ["op", "shape", "dtype", "µs", "TB/s", "% of copy", "× torch.compile", "× eager"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|")
    for r in rows:
        cells = [
            r.op,
            r.shape,
            r.dtype,
            f"{r.us:.2f}",
            f"{r.tbps:.3f}",
            f"{r.pct_of_copy:.1f}%",
            _ratio(r.x_compile),
            _ratio(r.x_eager),
        ]
        print("| " + " | ".join(cells) + " |")


def write_json(rows: Sequence[Row], path: str | Path, meta: dict[str, Any] | None = None) -> None:
    """Write ``rows`` (fields and derived figures) and optional ``meta`` to ``path`` as JSON."""
    payload = {"meta": meta or {}, "rows": [r.to_dict() for r in rows]}
    Path(path).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Timing:
    """Repetition counts of one run."""

    warmup: int
    reps: int
    host_calls: int


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of every benchmark script: ``[--json PATH] [--quick] [--no-compile] [--only TEXT]``."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", metavar="PATH", help="also write the rows (and device info) to PATH as JSON")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run, noisier figures)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column (reported as n/a)")
    p.add_argument("--only", metavar="TEXT", default="", help="run only the rows whose op label contains TEXT")
    return p.parse_args(argv)


CaseT = TypeVar("CaseT")


def run_rows(
    cases: Sequence[CaseT],
    label: Callable[[CaseT], str],
    bench: Callable[[CaseT], Row],
    *,
    only: str = "",
    json_path: str | None = None,
    meta: dict[str, Any] | None = None,
) -> int:
    """Benchmark every case whose label contains ``only``; print the markdown table (and write
    JSON to ``json_path``). A failing row prints its traceback and the others go on; returns 1
    if any row failed, else 0."""
    import torch

    rows: list[Row] = []
    failed = 0
    for case in cases:
        if only and only not in label(case):
            continue
        try:
            rows.append(bench(case))
        except Exception:
            failed += 1
            print(f"ERROR: {case}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        finally:
            torch.cuda.empty_cache()
    if json_path:
        write_json(rows, json_path, meta)
    print()
    print_markdown(rows)
    return 1 if failed else 0


def bench_main(
    name: str,
    description: str,
    argv: list[str] | None,
    cases: Sequence[CaseT],
    label: Callable[[CaseT], str],
    bench: Callable[[CaseT, Timing, bool], Row],
) -> int:
    """The ``main`` of a benchmark script: parse the command line, check for a GPU (exit 2),
    print the run's header, then :func:`run_rows` with ``bench(case, timing, use_compile)``."""
    args = parse_args(description, argv)
    import torch

    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    timing = Timing(warmup=3, reps=20, host_calls=300) if args.quick else Timing(warmup=10, reps=100, host_calls=2000)
    torch.manual_seed(0)
    meta = device_summary()
    meta.update(warmup=timing.warmup, reps=timing.reps, quick=args.quick, compile=not args.no_compile)
    print(f"# {name}: " + ", ".join(f"{k}={v}" for k, v in meta.items()), flush=True)
    use_compile = not args.no_compile
    return run_rows(
        cases,
        label,
        lambda c: bench(c, timing, use_compile),
        only=args.only,
        json_path=args.json,
        meta=meta,
    )
