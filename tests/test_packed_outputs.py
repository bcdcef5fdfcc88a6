"""A CuPy front-end call allocates its outputs (and the plan's workspace) as regions of ONE allocation.

``packed_offsets`` lays the regions out (256-byte aligned, disjoint, in order); the replays of
``qp.quantize`` and the compat functions, and their full paths (``Target.empty_many``), allocate
that many bytes once from CuPy's current allocator and make each output a view at its offset. The
regions must be distinct, aligned and non-overlapping, the arrays must own the allocation
jointly, and the results must equal the reference bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan import _frontend
from quantplan._frontend import PACKED_ALIGNMENT, Target, packed_offsets
from quantplan.vocabulary.types import ElementKind as EK

# ---- the layout (CPU) ----------------------------------------------------------------------------


def test_packed_offsets_examples() -> None:
    assert packed_offsets([]) == ([], 0)
    assert packed_offsets([10]) == ([0], 10)
    assert packed_offsets([256, 64, 4]) == ([0, 256, 512], 516)
    assert packed_offsets([257, 0, 1]) == ([0, 512, 768], 769)  # an empty region still gets its own address
    assert packed_offsets([131072, 64, 64, 8]) == ([0, 131072, 131328, 131584], 131592)


def test_packed_offsets_are_aligned_disjoint_and_tight(rng: np.random.Generator) -> None:
    for _ in range(200):
        sizes = [int(s) for s in rng.integers(0, 5000, size=int(rng.integers(1, 7)))]
        sizes = [s if rng.random() > 0.2 else int(rng.integers(0, 3)) for s in sizes]
        offsets, total = packed_offsets(sizes)
        assert len(offsets) == len(sizes) and offsets[0] == 0
        ends = [o + max(s, 1) for o, s in zip(offsets, sizes, strict=True)]
        assert total == ends[-1]
        for i, offset in enumerate(offsets):
            assert offset % PACKED_ALIGNMENT == 0
            if i:  # after the previous region, and no further than the next aligned address
                assert ends[i - 1] <= offset < ends[i - 1] + PACKED_ALIGNMENT


def test_empty_many_on_the_host_makes_one_array_per_spec() -> None:
    target = Target.of(np.zeros(3, np.float32))
    (a, b), ws = target.empty_many([((3, 5), "int8"), ((3, 1), "float32")], workspace=100)
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((3, 5), np.int8, (3, 1), np.float32)
    assert ws is not None and ws.nbytes == 100
    assert not np.shares_memory(a, b)
    assert target.empty_many([((2,), "int32")])[1] is None


# ---- the replay's allocation on the simulated GPU (CPU) -----------------------------------------


def _regions_of(arrays: list[Any]) -> list[tuple[int, int]]:
    return [(int(a.data.ptr), int(a.nbytes)) for a in arrays]


def _assert_packed(arrays: list[Any], allocation: tuple[int, int]) -> None:
    """Distinct, 256-byte aligned, non-overlapping regions inside ``allocation`` (ptr, size),
    all of them views of the same memory object."""
    start, size = allocation
    regions = sorted(_regions_of(arrays))
    assert len({ptr for ptr, _ in regions}) == len(regions)
    for (ptr, n), following in zip(regions, [*regions[1:], None], strict=True):
        assert ptr % PACKED_ALIGNMENT == 0 and start <= ptr and ptr + n <= start + size
        if following is not None:
            assert ptr + n <= following[0]
    assert len({id(a.data.mem) for a in arrays}) == 1


def test_replayed_outputs_are_regions_of_one_allocation(simulated_allocations: Any) -> None:
    from quantplan.compat import deepspeed as ds

    allocations, dev = simulated_allocations
    x = dev(1 << 40, (16, 1000), "float16")
    calls = [
        ("qp.quantize groups asymmetric", lambda: qp.quantize(x, "uint4", group_size=100, asymmetric=True), 3),
        ("qp.quantize per tensor (a workspace)", lambda: qp.quantize(x, "int8"), 2),
        ("compat quantize", lambda: ds.quantize(x, 16, 8, ds.Asymmetric), 2),
    ]
    for name, call, outputs in calls:
        for attempt in ("full path", "replay", "replay"):
            start = len(allocations)
            result = call()
            arrays = [result.codes, result.scale, result.zero_point] if hasattr(result, "codes") else list(result)
            arrays = [a for a in arrays if a is not None]
            assert len(arrays) == outputs, name
            assert len(allocations) == start + 1, f"{name}, {attempt}: {len(allocations) - start} allocations"
            _assert_packed(arrays, allocations[-1][:2])


# ---- on the GPU: bit for bit, one allocation from the user's allocator, joint ownership ---------


@pytest.mark.gpu
def test_packed_outputs_on_the_gpu_equal_the_reference(rng: np.random.Generator) -> None:
    import cupy

    pool = cupy.cuda.MemoryPool()
    requests: list[int] = []

    def counting(size: int) -> Any:
        requests.append(size)
        return pool.malloc(size)

    _frontend.clear_plan_cache()
    for shape, group in (((19, 105), 7), ((5, 300), 100), ((33, 64), 32)):
        desc = qp.DynamicRangeQuantizeDescriptor(
            shape=shape,
            scope=qp.GroupScope(axis=-1, group_size=group),
            mode=qp.QuantMode.ASYMMETRIC,
            input_element=EK.F16,
            output_element=EK.U8,
        )
        plan = qp.DynamicRangeQuantizePlan.select(None, desc, REFERENCE)
        for attempt in range(3):  # the full path, then replays
            x = random_floats(rng, shape, EK.F16)
            q = np.zeros(desc.output_shape, np.uint8)
            s = np.zeros(desc.param_shape, np.float32)
            z = np.zeros(desc.param_shape, np.int32)
            plan.run(None, None, qp.DynamicRangeQuantizeArgs(x, q, s, z))
            xd = cupy.asarray(x)
            with cupy.cuda.using_allocator(counting):
                before, used = len(requests), pool.used_bytes()
                qt = qp.quantize(xd, "uint8", group_size=group, asymmetric=True)
                if attempt:  # a replay allocates once (the full path may also load the plan's tables)
                    assert len(requests) == before + 1, f"{shape}, call {attempt}: one allocation"
            arrays = [qt.codes, qt.scale, qt.zero_point]
            memory = arrays[0].data.mem
            _assert_packed(arrays, (int(memory.ptr), int(memory.size)))
            assert np.array_equal(cupy.asnumpy(qt.codes), q)
            assert np.array_equal(cupy.asnumpy(qt.scale).view(np.uint32), s.view(np.uint32))
            assert np.array_equal(cupy.asnumpy(qt.zero_point), z)
            if attempt:  # one output keeps the allocation alive; the last one frees it
                scale = qt.scale
                del qt, arrays, memory
                assert pool.used_bytes() > used
                del scale
                assert pool.used_bytes() == used
            else:  # released before the next call measures the pool
                del qt, arrays, memory
    _frontend.clear_plan_cache()
