"""Shared fixtures: a fresh random generator per test (its seed printed on failure), the simulated
GPU's allocations (``simulated_allocations``) and GPU gating."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import quantplan as qp


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    seed = int(np.random.SeedSequence().entropy % (2**63))
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


class _Owner:
    """What a simulated allocation's memory holds: dies when the memory is freed."""


@pytest.fixture
def simulated_allocations(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[tuple[int, int, Any]], Any]]:
    """The simulated GPU of ``benchmarks/host_sim.py`` (no kernel compiled or launched), CuPy's
    allocator a bump allocator; yields (allocations as (ptr, size, weak
    reference to the memory's owner), device_array)."""
    cupy = pytest.importorskip("cupy")
    from cupy.cuda import memory

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import host_sim

    from quantplan import _frontend
    from quantplan.runtime import _device, _fast_check, _launch

    for owner, name, value in host_sim.gpu_patches(compile_kernels=False):
        monkeypatch.setattr(owner, name, value)
    for module, name in ((_launch, "current_device"), (_launch, "_current_stream"), (_fast_check, "current_device")):
        monkeypatch.setattr(module, name, getattr(module, name))  # bound on first use: restored afterwards
    allocations: list[tuple[int, int, Any]] = []
    base = [1 << 44]

    def alloc(size: int) -> Any:
        ptr, owner = base[0], _Owner()
        base[0] += (size + 511) // 256 * 256
        allocations.append((ptr, size, weakref.ref(owner)))
        return memory.MemoryPointer(memory.UnownedMemory(ptr, max(size, 1), owner, device_id=0), 0)

    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    _frontend.clear_plan_cache()
    with cupy.cuda.using_allocator(alloc):
        yield allocations, host_sim.device_array
    _frontend.clear_plan_cache()
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()


@pytest.fixture
def simulated_torch(
    simulated_allocations: tuple[list[tuple[int, int, Any]], Any], monkeypatch: pytest.MonkeyPatch
) -> list[Any]:
    """``simulated_allocations`` plus ``benchmarks/host_sim.py``'s PyTorch patches: CPU tensors
    read as CUDA tensors of device 0 and the front-ends allocate 256-byte aligned CPU tensors;
    returns the list of weak references to the tensors those allocations returned, in order."""
    pytest.importorskip("torch")
    import host_sim

    from quantplan import _frontend

    for owner, name, value in host_sim.torch_patches():
        monkeypatch.setattr(owner, name, value)
    made: list[Any] = []
    empty = _frontend.torch.empty

    def counted(*size: Any, dtype: Any, device: Any = None) -> Any:
        tensor = empty(*size, dtype=dtype, device=device)
        made.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(_frontend.torch, "empty", counted)
    return made


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--nvrtc-sweep",
        action="store_true",
        help="also compile every kernel instantiation with NVRTC (sm_80 and sm_90 cubins, fast-compile level; CI runs it)",
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: ``-m "not gpu"`` sees the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # every test of a *_gpu.py file needs a GPU, marked or not
        if item.path.name.endswith("_gpu.py") and "gpu" not in item.keywords:
            item.add_marker(pytest.mark.gpu)
    if not config.getoption("--nvrtc-sweep"):
        sweep = pytest.mark.skip(reason="the full NVRTC sweep runs with --nvrtc-sweep (a sample compiles by default)")
        for item in items:
            if "nvrtc_sweep" in item.keywords:
                item.add_marker(sweep)
    if qp.cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible (CuPy sees no device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
