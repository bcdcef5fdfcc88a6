"""Host cost of one call on the CUDA path, measured on a machine without a GPU.

The GPU is simulated: CuPy's runtime answers one device of compute capability 9.0 and 132
multiprocessors; kernels compile through NVRTC as usual but are not loaded (each function is a
stand-in with a pointer); ``cuLaunchKernel`` is a no-op; CuPy arrays are views of made-up device
addresses (a bump allocator behind ``cupy.empty``). Everything else is the real package: the
checks, the fast-path caches, the argument stores and the front-ends. The figures are therefore
the package's own Python per call, without the driver's launch (measured on the GPU by
``bench_peers.py``: add the ``launch floor`` it prints).

Rows: the 16x8192 host rows of ``bench_peers.py`` with CuPy operands (fp16), ``plan.run`` checked
and ``check=False`` and the compat call where the row has one, plus ``qp.quantize`` and ``quantplan.compat.deepspeed.quantize`` on CuPy
arrays. ``--profile NAME``: cProfile of one row (the top functions by own time).

``--torch``: the ``plan.run`` rows with PyTorch operands and a PyTorch stream, as ``bench_peers.py``
times them on the GPU, and ``qp.quantize`` / ``qp.dequantize`` rows on PyTorch tensors: CPU tensors
at 256-byte aligned addresses (``torch.frombuffer`` of aligned host memory) made to read as CUDA
tensors of device 0 (``torch.Tensor.get_device`` is replaced by a C method that returns 0 for
them, of about the same cost; ``is_cuda`` reads True), a stand-in of ``torch.cuda.current_stream()``
(its ``cuda_stream``, a C getter of about the same cost) and of the raw current-stream getter, and
the front-ends' outputs allocated by ``torch.empty`` on the CPU (its allocator in place of the
CUDA caching allocator: the allocation counts carry over, their cost only roughly).

``--alternate``: the ``plan.run`` rows alternate between two sets of operands (and workspaces)
of the same shapes, so that every call passes pointers other than the previous call's (a
training loop that reuses its buffers passes the same pointers every time, the default rows).

``--instructions``: the same rows under valgrind's callgrind, in CPU instructions per call (a
figure that does not move with the machine's load, unlike the wall clock): the script runs itself
under ``valgrind --tool=callgrind --instr-atstart=no`` and counts only the timed loop of each row,
through callgrind's client requests (a small C helper built with ``cc`` against
``valgrind/callgrind.h``). Needs valgrind, its headers and a C compiler; about a minute.

Each row also shows its bar as the package's own µs (issue 26: ``plan.run`` checked ≤ launch + 3
µs, ``check=False`` ≤ launch + 1.5 µs, ``qp.quantize`` ≤ the checked ``plan.run`` of its row + 2
µs; the compat layer's bar is DeepSpeed's binding, measured on the GPU only).

Usage::

    python3 benchmarks/host_sim.py [--calls N] [--profile TEXT] [--only TEXT] [--instructions] [--torch] [--alternate]
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import itertools
import math
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE), str(_HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: Launches the simulated driver received (kernel pointer, grid, block, stream, params pointer).
LAUNCHES: list[tuple[int, ...]] = []


class _Function:
    """A loaded kernel's stand-in: a unique pointer."""

    _next = itertools.count(0x1000, 0x10)

    def __init__(self) -> None:
        self.ptr = next(self._next)


class _Device:
    """``cupy.cuda.Device`` of the simulated GPU: a context manager that switches nothing."""

    def __init__(self, device: int = 0) -> None:
        self.id = device

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def gpu_patches(
    launch: Callable[..., Any] = lambda *a: None, compile_kernels: bool = True
) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, value) of every patch that makes the CUDA path run without a GPU:
    CuPy's runtime and driver entry points, ``cupy.cuda.Device``, and the package's kernel loader
    (NVRTC compiles when ``compile_kernels``; the functions are stand-ins). ``launch`` receives
    ``cuLaunchKernel``'s arguments."""
    import cupy
    from cupy.cuda import driver, runtime

    import quantplan.runtime.compiler as compiler

    null = cupy.cuda.Stream.null

    def load_kernels(family: str, names: Any, arch: Any, device_id: int, options: Any = ()) -> dict[str, Any]:
        if compile_kernels:
            compiler.compile_instantiations(family, names, arch, options)
        return {name: _Function() for name in names}

    patches: list[tuple[Any, str, Any]] = [
        (runtime, "getDeviceCount", lambda: 1),
        (runtime, "getDevice", lambda: 0),
        (runtime, "setDevice", lambda device: None),
        (runtime, "getDeviceProperties", lambda device: {"major": 9, "minor": 0, "multiProcessorCount": 132}),
        (cupy.cuda, "get_current_stream", lambda *a: null),
        (cupy.cuda, "Device", _Device),
        (driver, "occupancyMaxActiveBlocksPerMultiprocessor", lambda fn, block, smem: 8),
        (driver, "launchKernel", launch),
        (driver, "funcSetAttribute", lambda fn, attribute, value: None),
    ]
    for name, module in list(sys.modules.items()):
        if name.startswith("quantplan") and getattr(module, "load_kernels", None) is not None:
            patches.append((module, "load_kernels", load_kernels))
    return patches


def device_array(ptr: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """A CuPy array of ``shape`` and ``dtype`` at device address ``ptr`` of the simulated GPU."""
    import cupy
    import numpy as np
    from cupy.cuda import memory

    nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return cupy.ndarray(shape, dtype, memory.MemoryPointer(memory.UnownedMemory(ptr, nbytes, None, device_id=0), 0))


def simulate_gpu() -> None:
    """Apply :func:`gpu_patches` for the life of the process, and a bump allocator behind ``cupy.empty``."""
    import cupy
    from cupy.cuda import memory

    import quantplan.runtime._device as device

    for owner, name, value in gpu_patches():
        setattr(owner, name, value)
    base = [0x7F00_0000_0000]

    def alloc(size: int) -> Any:
        ptr = base[0]
        base[0] += (size + 511) // 256 * 256
        return memory.MemoryPointer(memory.UnownedMemory(ptr, max(size, 1), None, device_id=0), 0)

    cupy.cuda.set_allocator(alloc)
    device.cuda_available.cache_clear()


def host_us(fn: Callable[[], Any], calls: int) -> float:
    """µs per call of ``fn``: the best of 5 rounds of ``calls`` calls."""
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6 / calls


#: The package's own µs per call each kind of row must stay under (issue 26's bars less the
#: driver's launch); None where the bar is another call's figure (see ``bar``).
BARS = {"plan.run checked": 3.0, "plan.run check=False": 1.5}


def bar(name: str) -> str:
    """The bar of row ``name`` as text."""
    for prefix, us in BARS.items():
        if name.startswith(prefix + ":"):
            return f"≤ {us:g}"
    if name.startswith("qp."):
        return "≤ its row's plan.run checked + 2"
    if name.startswith(("cupy.", "torch.")):
        return "—"
    return "≤ DeepSpeed's binding (GPU)"


_HELPER = """
#include <valgrind/callgrind.h>
void qp_cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void qp_cg_zero(void) { CALLGRIND_ZERO_STATS; }
void qp_cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
void qp_cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""
_ENV = "QP_HOST_SIM_CALLGRIND"


def count_instructions(table: list[tuple[str, Callable[[], Any]]], calls: int) -> None:
    """Under callgrind (``--instructions``): each row's timed loop of ``calls`` calls, dumped
    under the row's name (the parent reads the dumps)."""
    helper = ctypes.CDLL(os.environ[_ENV])
    for name, fn in table:
        for _ in range(3):
            fn()
        helper.qp_cg_start()
        for _ in range(3):  # translated once more with instrumentation on
            fn()
        helper.qp_cg_zero()
        for _ in range(calls):
            fn()
        helper.qp_cg_dump(name.encode())
        helper.qp_cg_stop()


def instructions(argv: list[str], calls: int) -> dict[str, float]:
    """Row name -> instructions per call: this script under callgrind with ``argv``."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind")
    tmp = Path(tempfile.mkdtemp(prefix="qp_host_sim_"))
    (tmp / "helper.c").write_text(_HELPER)
    so = tmp / "helper.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(tmp / "helper.c")], check=True)
    env = dict(os.environ, **{_ENV: str(so)})
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={tmp}/cg.%p"]
    subprocess.run([*command, sys.executable, __file__, *argv], env=env, check=True, stderr=subprocess.DEVNULL)
    counts: dict[str, float] = {}
    for dump in sorted(tmp.glob("cg.*"), key=lambda path: int(path.suffix[1:]) if path.suffix[1:].isdigit() else 0):
        text = dump.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.M)
        total = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and total:
            counts[trigger.group(1)] = int(total.group(1)) / calls
    if os.environ.get("QP_HOST_SIM_KEEP"):  # the dumps, for callgrind_annotate
        print(f"callgrind dumps: {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return counts


class _TorchStream:
    """``torch.cuda.current_stream()`` of the simulated GPU: its handle is ``cuda_stream``."""

    __module__ = "torch.cuda.streams"
    __slots__ = ("cuda_stream",)

    def __init__(self) -> None:
        self.cuda_stream = 0


_KEEP: list[Any] = []


def torch_device_array(shape: tuple[int, ...], dtype: Any) -> Any:
    """A PyTorch tensor of ``shape`` and ``dtype`` that reads as a CUDA tensor of device 0 (see
    ``--torch``): host memory aligned to 256 bytes, at storage offset 0."""
    import numpy as np
    import torch

    nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size())
    raw = np.empty(nbytes + 256, np.uint8)
    start = -raw.ctypes.data % 256
    _KEEP.append(raw)
    return torch.frombuffer(raw[start : start + nbytes], dtype=torch.uint8).view(dtype).reshape(shape)


def torch_patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, value) of every patch that makes PyTorch CPU tensors read as CUDA
    tensors of device 0 (see ``--torch``): ``get_device()`` is ``sparse_dim()`` (a C method that
    returns 0 for every strided tensor, views included), ``is_cuda`` reads True, the raw
    current stream of device 0 is 0 (through ``abs``, a C function), and the front-ends' target of
    device 0 and their replays' allocations (``_frontend.torch_new_empty``) allocate on the CPU,
    256-byte aligned as the CUDA caching allocator's blocks are (a ``torch.empty`` 255 bytes
    longer, sliced: a little dearer than one ``torch.empty``)."""
    import torch

    from quantplan import _frontend

    _frontend._import_torch()
    target = _frontend.Target(_frontend.TORCH, 0, 0, torch.device("cpu"))
    targets = dict(_frontend._TARGETS)
    targets[(_frontend.TORCH, 0, 0)] = target
    cpu_empty, u8 = torch.empty, torch.uint8

    def empty(*size: Any, dtype: Any, device: Any = None) -> Any:
        shape = size[0] if len(size) == 1 and isinstance(size[0], tuple) else size
        nbytes = math.prod(shape) * (dtype.itemsize if hasattr(dtype, "itemsize") else 1)
        raw = cpu_empty(nbytes + 255, dtype=u8)
        start = -raw.data_ptr() % 256
        return raw[start : start + nbytes].view(dtype).view(shape)

    module = types.ModuleType("torch")
    module.__dict__.update(torch.__dict__)
    module.empty = empty  # type: ignore[attr-defined]

    def new_empty(device: Any, dtype: Any) -> Callable[..., Any]:
        return lambda *size: module.empty(*size, dtype=dtype, device=device)  # (module.empty as patched then)

    return [
        (_frontend, "torch_new_empty", new_empty),
        (torch.Tensor, "get_device", torch._C.TensorBase.sparse_dim),
        (torch.Tensor, "is_cuda", property(lambda self: True)),
        (_frontend, "_RAW_STREAM", [abs]),
        (_frontend, "_TARGETS", targets),
        (_frontend, "torch", module),
    ]


def simulate_torch_cuda() -> None:
    """Apply :func:`torch_patches` for the life of the process."""
    for owner, name, value in torch_patches():
        setattr(owner, name, value)


def _alternating(first: Callable[[], Any], second: Callable[[], Any]) -> Callable[[], Any]:
    """A call that makes ``first()`` and ``second()`` in turn."""
    calls = itertools.cycle((first, second))
    return lambda: next(calls)()


def _host_plans(make_array: Callable[[Any], Any]) -> Iterator[tuple[Any, Any, dict[str, Any], Any, Any]]:
    """(spec, built, arrays, args, plan) of every fp16 host row of ``bench_peers.py``, its operands
    made by ``make_array`` from the bench's tensors (the plan selected for the simulated GPU)."""
    import bench_peers as bp

    bp._DEV = "cpu"
    for spec in bp.specs():
        if not spec.host or spec.dtype == "bf16":
            continue
        built = bp.build(spec)
        arrays = {k: make_array(v) for k, v in bp._new_set(built).items()}
        args = built.args(arrays)
        yield spec, built, arrays, args, built.plan_cls.select(None, built.desc)


def _run_rows(
    name: str, plan: Any, stream: Any, sets: list[tuple[Any, Any]], alternate: bool
) -> list[tuple[str, Callable[[], Any]]]:
    """The checked and unchecked ``plan.run`` rows over one operand set, or two in turn."""
    checked = [lambda p=plan, w=w, a=a: p.run(stream, w, a) for a, w in sets]
    unchecked = [lambda p=plan, w=w, a=a: p.run(stream, w, a, check=False) for a, w in sets]
    return [
        (f"plan.run {kind}: {name}", _alternating(*calls) if alternate else calls[0])
        for kind, calls in (("checked", checked), ("check=False", unchecked))
    ]


def torch_rows(alternate: bool = False) -> list[tuple[str, Callable[[], Any]]]:
    """(name, call) of the ``plan.run`` host rows on PyTorch operands and stream, and the
    ``qp.quantize`` / ``qp.dequantize`` rows on PyTorch tensors (``--torch``)."""
    import quantplan as qp

    stream = _TorchStream()
    out: list[tuple[str, Callable[[], Any]]] = []
    make = lambda v: torch_device_array(tuple(v.shape), v.dtype)  # noqa: E731
    for spec, built, arrays, args, plan in _host_plans(make):
        sets = []
        for operands in [args, built.args({k: make(v) for k, v in arrays.items()})][: 2 if alternate else 1]:
            ws = None
            if plan.workspace_size():
                import torch

                ws = qp.Workspace(torch_device_array((plan.workspace_size(),), torch.uint8), plan.workspace_size())
            sets.append((operands, ws))
        out.extend(_run_rows(spec.name, plan, stream, sets, alternate))
    import torch

    x = torch_device_array((16, 8192), torch.float16)
    token = qp.TokenScope()
    out.append(("qp.quantize(x, 'int8', scope=token) (torch)", lambda: qp.quantize(x, "int8", scope=token)))
    out += _functional_rows(x, "torch, ", "tensors made")
    from quantplan import _frontend

    empty = _frontend.torch.empty  # the simulated allocation (torch_patches)
    out.append(
        (
            "torch.empty(16, 8192, dtype=int8) (a simulated allocation, for scale)",
            lambda: empty(16, 8192, dtype=torch.int8),
        )
    )
    return out


def _functional_rows(x: Any, tag: str, made: str) -> list[tuple[str, Callable[[], Any]]]:
    """The one-liner's rows on ``x`` beside the plain call: per tensor (a workspace), reading the
    result's fields, and the quantize / dequantize round trip (``tag``: the row names' prefix)."""
    import quantplan as qp

    token = qp.TokenScope()
    return [
        (f"qp.quantize(x, 'int8') ({tag}per tensor: a workspace)", lambda: qp.quantize(x, "int8")),
        (
            f"qp.quantize(x, 'int8', scope=token) then .codes and .scale ({tag}{made})",
            lambda: (qt := qp.quantize(x, "int8", scope=token)).codes is qt.scale,
        ),
        (
            f"qp.dequantize(qp.quantize(x, 'int8', scope=token)) ({tag}round trip)",
            lambda: qp.dequantize(qp.quantize(x, "int8", scope=token)),
        ),
    ]


def rows(alternate: bool = False) -> list[tuple[str, Callable[[], Any]]]:
    """(name, call) of every host row."""
    import bench_peers as bp
    import cupy

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    out: list[tuple[str, Callable[[], Any]]] = []
    cupy_array = lambda v: cupy.empty(tuple(v.shape), dtype=str(v.dtype).removeprefix("torch."))  # noqa: E731
    for spec, built, arrays, args, plan in _host_plans(cupy_array):
        ws = qp.Workspace.allocate(plan.workspace_size()) if plan.workspace_size() else None
        sets = [(args, ws)]
        if alternate:
            other = {k: cupy_array(v) for k, v in arrays.items()}
            sets.append((built.args(other), qp.Workspace.allocate(plan.workspace_size()) if ws is not None else None))
        out.extend(_run_rows(spec.name, plan, None, sets, alternate))
        if built.compat is not None:  # the compat call alone, as bench_peers times it
            try:
                call = bp._library_call(partial(built.compat, None, arrays), [compat])
            except TypeError:  # the bench's own reshapes around the call are PyTorch-only
                continue
            out.append((f"compat: {spec.name}", call))
    x = cupy.empty((16, 8192), dtype="float16")
    out.append(("qp.quantize(x, 'int8', TokenScope())", lambda: qp.quantize(x, "int8", scope=qp.TokenScope())))
    token = qp.TokenScope()
    out.append(("qp.quantize(x, 'int8', scope=token) (scope made once)", lambda: qp.quantize(x, "int8", scope=token)))
    out += _functional_rows(x, "", "arrays made")
    qt = qp.quantize(x, "int8", scope=token)
    out.append(("qp.dequantize(qt) (per token)", lambda: qp.dequantize(qt)))
    out.append(("qp.fake_quantize(x, 0.05)", lambda: qp.fake_quantize(x, 0.05)))
    out.append(("compat.quantize(x, 16, 8, Symmetric)", lambda: compat.quantize(x, 16, 8, compat.Symmetric)))
    out.append(("cupy.empty((16, 8192), 'int8') (an allocation, for scale)", lambda: cupy.empty((16, 8192), "int8")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", default=None, help="cProfile the first row whose name contains this")
    parser.add_argument("--only", default=None, help="rows whose name contains this")
    parser.add_argument("--instructions", action="store_true", help="CPU instructions per call (callgrind)")
    parser.add_argument("--torch", action="store_true", help="plan.run rows on PyTorch operands and stream")
    parser.add_argument("--alternate", action="store_true", help="plan.run rows alternate two operand sets")
    opt = parser.parse_args(argv)
    if opt.instructions and _ENV not in os.environ:
        passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--instructions"]
        counts = instructions([*passed, "--instructions"], opt.calls)
        print("| host row (simulated GPU, no driver launch) | instructions per call | bar (package µs) |")
        print("|---|---:|---|")
        for name, count in counts.items():
            print(f"| {name} | {count:,.0f} | {bar(name)} |")
        return 0
    simulate_gpu()
    if opt.torch:
        simulate_torch_cuda()
    table = torch_rows(opt.alternate) if opt.torch else rows(opt.alternate)
    if opt.only:
        table = [row for row in table if opt.only in row[0]]
    if opt.instructions:
        count_instructions(table, opt.calls)
        return 0
    if opt.profile:
        name, fn = next(r for r in table if opt.profile in r[0])
        fn()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(opt.calls):
            fn()
        profiler.disable()
        print(name)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return 0
    print("| host row (simulated GPU, no driver launch) | µs per call | bar (package µs) |\n|---|---:|---|")
    for name, fn in table:
        print(f"| {name} | {host_us(fn, opt.calls):.2f} | {bar(name)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
