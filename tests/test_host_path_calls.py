"""The host path stays short: function calls per repeated call of each front-end (CPU, simulated GPU).

The wall clock of a host path is noisy on a shared machine; the number of functions it calls is
not. On the simulated GPU of ``benchmarks/host_sim.py`` (CuPy arrays at made-up addresses, the
driver's launch a no-op), each front-end's second and later calls of one signature take the fast
path (``plan.run``'s generated functions, the front-ends' replays). ``sys.setprofile`` counts the
Python functions and C functions one such call enters; each count must stay at or under its
bound (today's count plus a small margin). Before the replays of ``qp.dequantize`` and
``qp.fake_quantize`` and the inlined ``qp.quantize`` key these took 41, 38 and 17 Python calls
(and before the type test that skips ``_traced`` for CuPy arrays, 9, 10 and 9):
a change that sends a repeated call back through the checks, the target resolution or a
descriptor shows here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import quantplan as qp
from quantplan import _frontend
from quantplan.runtime import _device, _fast_check, _launch

pytest.importorskip("cupy")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import host_sim  # noqa: E402


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The simulated GPU, with a bump allocator behind ``cupy.empty`` / ``cupy.ndarray``."""
    import cupy
    from cupy.cuda import memory

    for owner, name, value in host_sim.gpu_patches(compile_kernels=False):
        monkeypatch.setattr(owner, name, value)
    for module, name in ((_launch, "current_device"), (_launch, "_current_stream"), (_fast_check, "current_device")):
        monkeypatch.setattr(module, name, getattr(module, name))  # bound on first use: restored afterwards
    base = [1 << 44]

    def alloc(size: int) -> Any:
        ptr = base[0]
        base[0] += (size + 511) // 256 * 256
        return memory.MemoryPointer(memory.UnownedMemory(ptr, max(size, 1), None, device_id=0), 0)

    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()
    _frontend.clear_plan_cache()
    with cupy.cuda.using_allocator(alloc):
        yield
    _frontend.clear_plan_cache()
    _device.cuda_available.cache_clear()
    _device.device_info.cache_clear()


def _calls(fn: Callable[[], Any]) -> tuple[int, int]:
    """(Python functions, C functions) that one call of ``fn`` enters, after two calls to warm it."""
    fn()
    fn()
    counts = {"call": 0, "c_call": 0}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    # the call of setprofile(None) itself is counted as a C call; the lambda calling fn as a Python one
    return counts["call"] - 1, counts["c_call"] - 1


#: (Python calls, C calls) at most per repeated call. Each counts the simulated GPU's stand-ins
#: (a Python lambda for the launch, the current device and stream), as the real ones count C calls.
#: The simulated allocator is a Python function, one call per allocation: qp.quantize and
#: compat.quantize (two outputs, one allocation) make one.
BOUNDS: dict[str, tuple[int, int]] = {
    "plan.run checked": (5, 2),
    "plan.run check=False": (5, 2),
    "qp.quantize": (8, 7),
    "qp.dequantize": (8, 4),
    "qp.dequantize of a replayed qp.quantize": (8, 4),
    "compat.quantize": (11, 5),
    "qp.fake_quantize": (9, 4),
}


def test_repeated_calls_stay_on_the_fast_path(simulated: None) -> None:
    """Each front-end's repeated call enters no more functions than its bound (plan.run: the
    generated function and the driver; front-ends: the replay, the allocations, the launch)."""
    from quantplan.compat import deepspeed as ds

    dev = host_sim.device_array
    x = dev(1 << 40, (16, 1000), "float16")
    q, s = dev(2 << 40, (16, 1000), "int8"), dev(3 << 40, (16, 1), "float32")
    plan = qp.QuantizePlan.select(
        None,
        qp.QuantizeDescriptor(
            shape=(16, 1000),
            scope=qp.TokenScope(),
            input_element=qp.ElementKind.F16,
            output_element=qp.ElementKind.S8,
            mode=qp.QuantMode.SYMMETRIC,
        ),
    )
    args = qp.QuantizeArgs(x, q, s)
    token = qp.quantize(x, "int8", scope=qp.TokenScope())
    replayed = qp.quantize(x, "int8", scope=qp.TokenScope())  # its arrays made on first read
    scope = qp.TokenScope()
    calls = {
        "plan.run checked": lambda: plan.run(None, None, args),
        "plan.run check=False": lambda: plan.run(None, None, args, check=False),
        "qp.quantize": lambda: qp.quantize(x, "int8", scope=scope),
        "qp.dequantize": lambda: qp.dequantize(token),
        "qp.dequantize of a replayed qp.quantize": lambda: qp.dequantize(replayed),
        "compat.quantize": lambda: ds.quantize(x, 16, 8, ds.Symmetric),
        "qp.fake_quantize": lambda: qp.fake_quantize(x, 0.05),
    }
    counted = {name: _calls(fn) for name, fn in calls.items()}
    over = {
        name: (got, BOUNDS[name])
        for name, got in counted.items()
        if got[0] > BOUNDS[name][0] or got[1] > BOUNDS[name][1]
    }
    assert not over, f"calls per repeated call (Python, C) over their bounds: {over}; all counts: {counted}"
