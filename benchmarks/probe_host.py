"""Host µs per call of the front-ends on one small problem, and of the pieces they are made of.

16 x 8192 float16, dynamic per-token int8; every row's calls in interleaved rounds with an empty
kernel's ``cuLaunchKernel`` (7 rounds of 10 batches of 200 calls, the device synchronized outside
each batch; the median round and the round range are printed):

* ``plan.run`` checked and ``check=False`` (CuPy operands, outputs preallocated);
* ``qp.quantize`` on a CuPy array and on a PyTorch tensor (the result dies unread: its
  allocation serves the next call), and on a bfloat16 tensor whose replay recycles nothing (an
  allocation per call); the compat layer's ``quantize`` on the PyTorch tensor;
* ``torch.ops.quantplan.quantize_dynamic`` called directly (the dispatcher and the operator);
* allocations: ``cupy.empty`` of the codes and of the scales, the memory pool's ``malloc``, one
  allocation and two arrays over it, ``torch.empty`` and ``Tensor.new_empty``, and the replays'
  allocations (``new_empty`` of a prototype of the dtype: no dtype or device argument parsed).

Usage (on a GPU)::

    python3 benchmarks/probe_host.py
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def rows() -> dict[str, Callable[[], Any]]:
    """The timed calls, by name."""
    import cupy
    import torch
    from cupy.cuda import driver

    import quantplan as qp
    from quantplan import _torch_ops

    shape = (16, 8192)
    x = cupy.random.standard_normal(shape).astype(cupy.float16)
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=qp.ElementKind.F16, output_element=qp.ElementKind.S8
    )
    plan = qp.DynamicRangeQuantizePlan.select(None, desc)
    codes, scale = cupy.empty(shape, cupy.int8), cupy.empty(desc.param_shape, cupy.float32)
    args = qp.DynamicRangeQuantizeArgs(input=x, output=codes, scale_out=scale)
    kernel = cupy.RawKernel('extern "C" __global__ void qp_probe_empty() {}', "qp_probe_empty")
    kernel.compile()
    function, stream = kernel.kernel.ptr, cupy.cuda.get_current_stream().ptr
    tx = torch.randn(shape, device="cuda", dtype=torch.float16)
    token = qp.TokenScope()
    pool = cupy.get_default_memory_pool()
    op = torch.ops.quantplan.quantize_dynamic.default
    code, scope = _torch_ops._KIND_INDEX[qp.ElementKind.S8], _torch_ops.scope_ints(token)

    from quantplan import _frontend
    from quantplan.compat import deepspeed as ds

    # the same call on bfloat16 with its replay built while RECYCLE_BYTES is 0: every call allocates
    tb = tx.to(torch.bfloat16)
    limit, _frontend.RECYCLE_BYTES = _frontend.RECYCLE_BYTES, 0
    for _ in range(3):
        qp.quantize(tb, "int8", scope=token)
    _frontend.RECYCLE_BYTES = limit
    new_i8 = _frontend.torch_new_empty(tx.device, torch.int8)
    new_f32 = _frontend.torch_new_empty(tx.device, torch.float32)

    def one_buffer() -> Any:
        memory = pool.malloc(shape[0] * shape[1] + 256)
        return cupy.ndarray(shape, cupy.int8, memory), cupy.ndarray((16, 1), cupy.float32, memory + shape[0] * shape[1])

    return {
        "empty-kernel launch": lambda: driver.launchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0),
        "plan.run checked": lambda: plan.run(None, None, args),
        "plan.run check=False": lambda: plan.run(None, None, args, check=False),
        "qp.quantize (CuPy)": lambda: qp.quantize(x, "int8", scope=token),
        "qp.quantize (PyTorch)": lambda: qp.quantize(tx, "int8", scope=token),
        "qp.quantize (PyTorch bf16, nothing recycled)": lambda: qp.quantize(tb, "int8", scope=token),
        "compat quantize (PyTorch)": lambda: ds.quantize(tx, 16, 8, ds.Symmetric),
        "torch.ops.quantplan.quantize_dynamic": lambda: op(tx, code, scope, False, None, None, 0, False, None, 0),
        "cupy.empty codes": lambda: cupy.empty(shape, cupy.int8),
        "cupy.empty scales": lambda: cupy.empty((16, 1), cupy.float32),
        "memory pool malloc": lambda: pool.malloc(shape[0] * shape[1]),
        "one malloc + two arrays": one_buffer,
        "torch.empty codes": lambda: torch.empty(shape, dtype=torch.int8, device="cuda"),
        "Tensor.new_empty codes": lambda: tx.new_empty(shape, dtype=torch.int8),
        "int8 prototype's new_empty(16, 8192) (the replays')": lambda: new_i8(16, 8192),
        "codes + scales by the prototypes (compat's two)": lambda: (new_i8(16, 8192), new_f32(16, 1)),
    }


def main() -> None:
    import cupy

    fns = rows()
    for fn in fns.values():
        for _ in range(300):
            fn()
    cupy.cuda.runtime.deviceSynchronize()
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(7):
        for name, fn in fns.items():
            total = 0.0
            for _batch in range(10):
                cupy.cuda.runtime.deviceSynchronize()
                t0 = time.perf_counter()
                for _ in range(200):
                    fn()
                total += time.perf_counter() - t0
            rounds[name].append(total * 1e6 / 2000)
    cpus = sorted(os.sched_getaffinity(0))
    print(f"| host row ({len(cpus)} CPUs allowed) | µs per call (median) | rounds |")
    print("|---|---:|---|")
    for name, r in rounds.items():
        print(f"| {name} | {statistics.median(r):.2f} | {min(r):.2f}-{max(r):.2f} |")


if __name__ == "__main__":
    main()
