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

Usage::

    python3 benchmarks/host_sim.py [--calls N] [--profile TEXT]
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import pstats
import sys
import time
from collections.abc import Callable
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

    import quantplan.compiler as compiler

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

    import quantplan._device as device

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


def rows() -> list[tuple[str, Callable[[], Any]]]:
    """(name, call) of every host row."""
    import bench_peers as bp
    import cupy

    import quantplan as qp
    from quantplan.compat import deepspeed as compat

    bp._DEV = "cpu"
    out: list[tuple[str, Callable[[], Any]]] = []
    for spec in bp.specs():
        if not spec.host or spec.dtype == "bf16":
            continue
        built = bp.build(spec)
        s = bp._new_set(built)
        arrays = {k: cupy.empty(tuple(v.shape), dtype=str(v.dtype).removeprefix("torch.")) for k, v in s.items()}
        args = built.args(arrays)
        plan = built.plan_cls.select(None, built.desc)
        ws = qp.Workspace.allocate(plan.workspace_size()) if plan.workspace_size() else None
        out.append((f"plan.run checked: {spec.name}", lambda p=plan, w=ws, a=args: p.run(None, w, a)))
        out.append((f"plan.run check=False: {spec.name}", lambda p=plan, w=ws, a=args: p.run(None, w, a, check=False)))
        if built.compat is not None:  # the compat call alone, as bench_peers times it
            try:
                call = bp._library_call(partial(built.compat, None, arrays), [compat])
            except TypeError:  # the bench's own reshapes around the call are PyTorch-only
                continue
            out.append((f"compat: {spec.name}", call))
    x = cupy.empty((16, 8192), dtype="float16")
    out.append(("qp.quantize(x, 'int8', TokenScope())", lambda: qp.quantize(x, "int8", scope=qp.TokenScope())))
    out.append(("compat.quantize(x, 16, 8, Symmetric)", lambda: compat.quantize(x, 16, 8, compat.Symmetric)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", default=None, help="cProfile the first row whose name contains this")
    parser.add_argument("--only", default=None)
    opt = parser.parse_args(argv)
    simulate_gpu()
    table = rows()
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
    print("| host row (simulated GPU, no driver launch) | µs per call |\n|---|---:|")
    for name, fn in table:
        if opt.only and opt.only not in name:
            continue
        print(f"| {name} | {host_us(fn, opt.calls):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
