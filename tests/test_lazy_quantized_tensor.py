"""A replayed CuPy ``qp.quantize`` returns a QuantizedTensor whose arrays are made when first read.

The replay allocates the outputs as regions of one allocation and launches; its QuantizedTensor
holds that allocation and makes ``codes`` / ``scale`` / ``zero_point`` (``cupy.ndarray`` views
at the regions' offsets) on first read, then keeps them. On the simulated GPU (CPU) these tests
check that the fields are the regions of the allocation, the same as an eager QuantizedTensor's,
made once; that the class's behaviour (``nbytes``, ``repr``, ``==``, ``dataclasses``, copying)
is the eager one's; and that the allocation lives while the QuantizedTensor or one of its arrays
does. PyTorch CUDA tensors (simulated: CPU tensors that read as CUDA) get the same: one uint8
tensor, fields its views made on first read, dequantize replayed from its pointers. On the GPU
(CuPy and PyTorch): the results and their dequantization equal the reference bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan import _frontend
from quantplan._frontend import nbytes_of, packed_offsets
from quantplan.functional import QuantizedTensor
from quantplan.vocabulary.types import ElementKind as EK

FIELDS = ("codes", "scale", "zero_point")


CASES = [
    ("int8", {"scope": qp.TokenScope()}, (16, 1000)),
    ("uint4", {"group_size": 100, "asymmetric": True}, (5, 300)),
    ("int8", {}, (7, 333)),  # per tensor: a workspace after the outputs
    ("fp8_e4m3", {"axis": 0}, (9, 130)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_lazy_fields_are_the_regions_of_the_allocation(simulated_allocations: Any, case: int) -> None:
    allocations, dev = simulated_allocations
    dtype, kwargs, shape = CASES[case]
    x = dev(1 << 40, shape, "float16")
    eager = qp.quantize(x, dtype, **kwargs)  # the full path
    assert type(eager) is QuantizedTensor
    made = len(allocations)
    qt = qp.quantize(x, dtype, **kwargs)  # a replay
    assert len(allocations) == made + 1
    assert isinstance(qt, QuantizedTensor) and not set(FIELDS) & set(vars(qt))
    ptr, size, _ = allocations[-1]
    expected = [a for a in (eager.codes, eager.scale, eager.zero_point) if a is not None]
    offsets, _ = packed_offsets([nbytes_of(a.shape, a.dtype) for a in expected])
    scale = qt.scale  # one field alone
    assert set(vars(qt)) & set(FIELDS) == {"scale"}
    assert qt.scale is scale  # made once
    got = [qt.codes, qt.scale] + ([qt.zero_point] if eager.zero_point is not None else [])
    assert (qt.zero_point is None) == (eager.zero_point is None)
    for a, e, offset in zip(got, expected, offsets, strict=True):
        assert (a.shape, a.dtype, a.flags.c_contiguous) == (e.shape, e.dtype, True)
        assert int(a.data.ptr) == ptr + offset and offset + a.nbytes <= size
    assert len({id(a.data.mem) for a in got}) == 1
    assert qt.descriptor is eager.descriptor and qt.shape == eager.shape == shape
    assert qt.nbytes == eager.nbytes
    assert repr(qt).startswith("QuantizedTensor(") and repr(qt).split(", cupy")[0] == repr(eager).split(", cupy")[0]


def test_lazy_quantized_tensor_behaves_as_an_eager_one(simulated_allocations: Any) -> None:
    _, dev = simulated_allocations
    x = dev(1 << 40, (6, 256), "float16")
    for _ in range(2):
        qt = qp.quantize(x, "uint8", group_size=64, asymmetric=True)
    same = QuantizedTensor(qt.codes, qt.scale, qt.zero_point, qt.descriptor)
    assert qt == same and same == qt  # noqa: PLR0124
    other = qt.descriptor.model_copy(update={"output_element": EK.F32})
    assert qt != QuantizedTensor(qt.codes, qt.scale, qt.zero_point, other)
    assert dataclasses.is_dataclass(qt) and [f.name for f in dataclasses.fields(qt)] == [*FIELDS, "descriptor"]
    for fresh in (qp.quantize(x, "uint8", group_size=64, asymmetric=True), qt):  # unread and read
        copied = copy.copy(fresh)
        assert type(copied) is QuantizedTensor
        assert all(getattr(copied, name) is getattr(fresh, name) for name in (*FIELDS, "descriptor"))
        replaced = dataclasses.replace(fresh, zero_point=None)
        assert replaced.codes is fresh.codes and replaced.scale is fresh.scale and replaced.zero_point is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        qt.codes = qt.scale  # type: ignore[misc]
    with pytest.raises(AttributeError):
        qt.no_such_field  # noqa: B018


def test_allocation_lives_while_the_quantized_tensor_or_an_array_does(simulated_allocations: Any) -> None:
    allocations, dev = simulated_allocations
    x = dev(1 << 40, (16, 512), "float16")
    qp.quantize(x, "int8", scope=qp.TokenScope())
    qt = qp.quantize(x, "int8", scope=qp.TokenScope())  # nothing read
    owner = allocations[-1][2]
    assert owner() is not None
    scale = qt.scale
    del qt
    assert owner() is not None, "a field read keeps the allocation"
    del scale
    assert owner() is None, "a result whose arrays were made gives nothing back: freed with them"
    qp.dequantize(qp.quantize(x, "int8", scope=qp.TokenScope()))  # the full path of dequantize
    qt = qp.quantize(x, "int8", scope=qp.TokenScope())
    owner = allocations[-1][2]
    y = qp.dequantize(qt)  # a replay reading the allocation's pointers
    assert owner() is not None and not set(FIELDS) & set(vars(qt))
    del qt
    assert y.shape == (16, 512)
    assert owner() is not None, "an unread result gives its allocation back to the replay"
    _frontend.clear_plan_cache()
    assert owner() is None, "the plan cache's release frees it"


def test_an_unread_result_gives_its_allocation_to_the_next_call(simulated_allocations: Any) -> None:
    allocations, dev = simulated_allocations
    x = dev(1 << 40, (16, 512), "float16")
    qp.quantize(x, "int8", scope=qp.TokenScope())  # the full path
    made = len(allocations)
    pointers = []
    for _ in range(6):  # the loop ``qt = qp.quantize(x)``: two allocations (the live result and the next)
        qt = qp.quantize(x, "int8", scope=qp.TokenScope())
        pointers.append(int(qt._memory.ptr))
    assert len(allocations) == made + 2, "the previous result dies after the call: its memory serves the next"
    assert pointers[::2] == [pointers[0]] * 3 and pointers[1::2] == [pointers[1]] * 3 != pointers[:1]
    ptr = pointers[-2]  # the spare, now
    del qt
    made = len(allocations)
    kept = qp.quantize(x, "int8", scope=qp.TokenScope())
    assert len(allocations) == made and int(kept._memory.ptr) == ptr, "the dead result's allocation, taken again"
    other = qp.quantize(x, "int8", scope=qp.TokenScope())  # the spare is taken: a fresh one
    assert len(allocations) == made + 1
    second = allocations[-1][2]
    del kept
    del other  # one spare a replay: the second one is freed
    assert second() is None
    read = qp.quantize(x, "int8", scope=qp.TokenScope())  # takes the spare back
    assert len(allocations) == made + 1 and int(read._memory.ptr) == ptr
    codes = read.codes
    del read, codes  # its arrays were made: freed, not kept
    made = len(allocations)
    qp.quantize(x, "int8", scope=qp.TokenScope())
    assert len(allocations) == made + 1
    big = dev(1 << 40, (65, 16384), "float16")  # outputs above RECYCLE_BYTES: never kept
    assert 65 * 16384 > _frontend.RECYCLE_BYTES
    qp.quantize(big, "int8", scope=qp.TokenScope())
    qp.quantize(big, "int8", scope=qp.TokenScope())
    owner = allocations[-1][2]
    assert owner() is None


def test_an_evicted_replay_frees_what_it_kept(simulated_allocations: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    allocations, dev = simulated_allocations
    monkeypatch.setattr(_frontend, "PLAN_CACHE_SIZE", 4)
    x = dev(1 << 40, (16, 512), "float16")
    qp.quantize(x, "int8", scope=qp.TokenScope())
    qp.quantize(x, "int8", scope=qp.TokenScope())  # a replay: its result dies unread
    owner = allocations[-1][2]
    assert owner() is not None, "kept for the next call"
    gc.disable()  # the release must not wait for the cyclic collector
    try:
        for rows in range(1, 9):  # other problems push the replay out of the plan cache
            qp.quantize(dev(1 << 40, (rows, 64), "float16"), "int8", scope=qp.TokenScope())
        assert owner() is None, "the evicted replay's kept allocation is freed"
    finally:
        gc.enable()


# ---- on the GPU: bit for bit -----------------------------------------------------------------------


@pytest.mark.gpu
def test_lazy_quantized_tensor_on_the_gpu_equals_the_reference(rng: np.random.Generator) -> None:
    import cupy

    pool = cupy.cuda.MemoryPool()
    _frontend.clear_plan_cache()
    cases = [
        ((19, 105), qp.GroupScope(axis=-1, group_size=7), qp.QuantMode.ASYMMETRIC, EK.U8, "uint8"),
        ((33, 301), qp.TokenScope(), qp.QuantMode.SYMMETRIC, EK.S8, "int8"),
        ((5, 257), qp.TensorScope(), qp.QuantMode.SYMMETRIC, EK.S8, "int8"),
        ((12, 64), qp.GroupScope(axis=-1, group_size=32), qp.QuantMode.ASYMMETRIC, EK.U4, "uint4"),
    ]
    with cupy.cuda.using_allocator(pool.malloc):
        for shape, scope, mode, code, name in cases:
            desc = qp.DynamicRangeQuantizeDescriptor(
                shape=shape, scope=scope, mode=mode, input_element=EK.F16, output_element=code
            )
            plan = qp.DynamicRangeQuantizePlan.select(None, desc, REFERENCE)
            deq = qp.DequantizeDescriptor(
                shape=shape, scope=scope, mode=mode, input_element=code, output_element=EK.F32
            )
            deq_plan = qp.DequantizePlan.select(None, deq, REFERENCE)
            asymmetric = mode is qp.QuantMode.ASYMMETRIC
            for attempt in range(4):  # the full path, then replays
                x = random_floats(rng, shape, EK.F16)
                q = np.zeros(desc.output_shape, np.uint8 if code in (EK.U8, EK.U4) else np.int8)
                s = np.zeros(desc.param_shape, np.float32)
                z = np.zeros(desc.param_shape, np.int32) if asymmetric else None
                plan.run(None, None, qp.DynamicRangeQuantizeArgs(x, q, s, z))
                y = np.zeros(shape, np.float32)
                deq_plan.run(None, None, qp.DequantizeArgs(q, y, s, z))
                xd = cupy.asarray(x)
                used = pool.used_bytes()
                qt = qp.quantize(xd, name, scope=scope, asymmetric=asymmetric)
                if attempt:
                    assert not set(FIELDS) & set(vars(qt)), "a replay's QuantizedTensor made no array yet"
                yd = qp.dequantize(qt, "float32")  # a replay reads the regions' pointers (from the 3rd call)
                if attempt >= 2:
                    assert not set(FIELDS) & set(vars(qt)), "the dequantize replay made no array"
                got = cupy.asnumpy(yd)
                nan = np.isnan(y)  # f16 data overflowing to Inf: NaN rows, whose payload bits may differ
                assert np.array_equal(np.isnan(got), nan), (shape, attempt)
                assert np.array_equal(got[~nan].view(np.uint32), y[~nan].view(np.uint32)), (shape, attempt)
                assert np.array_equal(cupy.asnumpy(qt.codes), q), (shape, attempt)
                assert np.array_equal(cupy.asnumpy(qt.scale).view(np.uint32), s.view(np.uint32))
                assert (qt.zero_point is None) == (z is None)
                if z is not None:
                    assert np.array_equal(cupy.asnumpy(qt.zero_point), z)
                del yd
                if attempt >= 2:  # an unread result gives its allocation to the next call; a read one frees it
                    fresh = qp.quantize(xd, name, scope=scope, asymmetric=asymmetric)
                    ptr, held = int(fresh._memory.ptr), pool.used_bytes()
                    del fresh
                    assert pool.used_bytes() == held
                    again = qp.quantize(xd, name, scope=scope, asymmetric=asymmetric)
                    assert int(again._memory.ptr) == ptr and pool.used_bytes() == held
                    assert np.array_equal(cupy.asnumpy(again.codes), q), (shape, attempt)  # rewritten whole
                    assert np.array_equal(cupy.asnumpy(again.scale).view(np.uint32), s.view(np.uint32))
                    del again
                    assert pool.used_bytes() < held
                del qt
                cupy.cuda.get_current_stream().synchronize()
                if attempt:  # (the first call may also load the plans' tables)
                    assert pool.used_bytes() == used, (shape, attempt)
    _frontend.clear_plan_cache()


# ---- PyTorch CUDA tensors: the same single allocation, the fields views made on first read ---------


@pytest.mark.parametrize("case", range(len(CASES)))
def test_torch_lazy_fields_are_views_of_one_allocation(simulated_torch: Any, case: int) -> None:
    import torch

    made = simulated_torch
    dtype, kwargs, shape = CASES[case]
    x = torch.empty(shape, dtype=torch.float16)
    eager = qp.quantize(x, dtype, **kwargs)  # the full path: one tensor per output (and workspace)
    assert type(eager) is QuantizedTensor
    start = len(made)
    qt = qp.quantize(x, dtype, **kwargs)  # a replay
    assert len(made) == start + 1, "one allocation for every output and the workspace"
    assert isinstance(qt, QuantizedTensor) and not set(FIELDS) & set(vars(qt))
    memory = vars(qt)["_memory"]
    assert made[-1]() is memory and memory.dtype is torch.uint8 and memory.dim() == 1
    expected = [a for a in (eager.codes, eager.scale, eager.zero_point) if a is not None]
    offsets, total = packed_offsets([a.numel() * a.element_size() for a in expected])
    assert memory.numel() >= total  # and the workspace after the outputs, where the plan needs one
    scale = qt.scale  # one field alone
    assert set(vars(qt)) & set(FIELDS) == {"scale"} and qt.scale is scale  # made once
    got = [qt.codes, qt.scale] + ([qt.zero_point] if eager.zero_point is not None else [])
    assert (qt.zero_point is None) == (eager.zero_point is None)
    for a, e, offset in zip(got, expected, offsets, strict=True):
        assert (a.shape, a.dtype, a.is_contiguous()) == (e.shape, e.dtype, True)  # FP8: float8, as eager
        assert a.data_ptr() == memory.data_ptr() + offset and offset % 256 == 0
        assert a.untyped_storage().data_ptr() == memory.untyped_storage().data_ptr()  # shares the storage
    assert qt.descriptor is eager.descriptor and qt.shape == eager.shape == shape
    assert qt.nbytes == eager.nbytes and repr(qt) == repr(eager).replace(f"{eager.nbytes} bytes", f"{qt.nbytes} bytes")
    del qt, got, scale, a, memory
    assert made[-1]() is None, "the allocation tensor dies with the QuantizedTensor and its fields"


def test_torch_dequantize_of_a_lazy_result_replays_from_the_pointers(simulated_torch: Any) -> None:
    import torch

    made = simulated_torch
    x = torch.empty((16, 512), dtype=torch.float16)
    for dtype, kwargs in (("int8", {"scope": qp.TokenScope()}), ("fp8_e5m2", {"axis": 1})):
        qp.dequantize(qp.quantize(x, dtype, **kwargs))  # full paths
        qp.dequantize(qp.quantize(x, dtype, **kwargs))  # quantize replayed, dequantize's full path
        qt = qp.quantize(x, dtype, **kwargs)
        memory = made[-1]
        start = len(made)
        y = qp.dequantize(qt)  # a replay reading the allocation's pointers
        assert len(made) == start + 1 and (y.shape, y.dtype) == ((16, 512), torch.float16)
        assert not set(FIELDS) & set(vars(qt)), "no field made"
        del qt
        assert memory() is not None and y.shape == (16, 512), "unread: kept for the next call"
        start = len(made)
        again = qp.quantize(x, dtype, **kwargs)
        assert len(made) == start and vars(again)["_memory"] is memory(), "the next call takes it"
        del again
        _frontend.clear_plan_cache()
        assert memory() is None


def _check_torch_fields(qt: Any, ref: Any, device: Any, shape: tuple[int, ...]) -> None:
    """Every field of ``qt`` (CUDA) equals the reference's ``ref`` bit for bit, typed and shaped as it."""
    import torch

    for field in FIELDS:
        a, e = getattr(qt, field), getattr(ref, field)
        assert (a is None) == (e is None), field
        if a is None:
            continue
        assert (a.device, a.dtype, a.shape, a.is_contiguous()) == (device, e.dtype, e.shape, True), field
        bits = a.view(torch.uint8) if a.element_size() == 1 else a
        ebits = e.view(torch.uint8) if e.element_size() == 1 else e
        assert np.array_equal(bits.cpu().numpy().view(np.uint8), ebits.numpy().view(np.uint8)), (field, shape)


@pytest.mark.gpu
def test_torch_lazy_quantized_tensor_on_the_gpu_equals_the_reference(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    _frontend.clear_plan_cache()
    cases = [
        ((19, 105), {"group_size": 7, "asymmetric": True}, "uint8"),
        ((33, 301), {"scope": qp.TokenScope()}, "int8"),
        ((5, 257), {}, "int8"),  # per tensor: a workspace after the outputs
        ((12, 64), {"group_size": 32, "asymmetric": True}, "uint4"),
        ((9, 130), {"axis": 0}, "fp8_e4m3"),
        ((3, 7, 41), {"scope": qp.TokenScope()}, "fp8_e5m2"),
    ]
    side = torch.cuda.Stream()
    for shape, kwargs, name in cases:
        for attempt in range(4):  # the full path, then replays (on a side stream from the 3rd call)
            x = torch.from_numpy(random_floats(rng, shape, EK.F16))
            ref = qp.quantize(x, name, **kwargs)  # PyTorch CPU: the reference backend
            ref_y = qp.dequantize(ref, "float32").numpy()
            xd = x.cuda()
            stream = side if attempt >= 2 else torch.cuda.current_stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                before = torch.cuda.memory_allocated()
                qt = qp.quantize(xd, name, **kwargs)
                if attempt:
                    assert not set(FIELDS) & set(vars(qt)), "a replay's QuantizedTensor made no tensor yet"
                yd = qp.dequantize(qt, "float32")
                if attempt >= 2:
                    assert not set(FIELDS) & set(vars(qt)), "the dequantize replay made no tensor"
                got_y = yd.cpu().numpy()
            nan = np.isnan(ref_y)  # f16 data overflowing to Inf: NaN segments, whose payload bits may differ
            assert np.array_equal(np.isnan(got_y), nan), (shape, attempt)
            assert np.array_equal(got_y[~nan].view(np.uint32), ref_y[~nan].view(np.uint32)), (shape, attempt)
            _check_torch_fields(qt, ref, xd.device, shape)  # its views die with it: the memory counts below
            if attempt >= 2:  # a field outlives the QuantizedTensor and keeps the allocation; then it is freed
                del yd
                scale = qt.scale
                del qt
                torch.cuda.synchronize()
                assert torch.cuda.memory_allocated() > before
                assert scale.cpu().numpy().view(np.uint8).tobytes() == ref.scale.numpy().view(np.uint8).tobytes()
                del scale
                assert torch.cuda.memory_allocated() == before, (shape, attempt)
            else:
                del qt, yd
    torch.cuda.synchronize()
    _frontend.clear_plan_cache()


@pytest.mark.gpu
def test_torch_recycled_allocation_on_the_gpu(rng: np.random.Generator) -> None:
    """An unread result's allocation serves the next call on the same stream (its outputs
    rewritten whole: equal to the reference), never a call on another stream; the plan cache's
    release frees it."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    import weakref

    _frontend.clear_plan_cache()
    side = torch.cuda.Stream()
    kept = []
    for shape, kwargs, name in [
        ((33, 301), {"scope": qp.TokenScope()}, "int8"),
        ((5, 257), {}, "int8"),  # per tensor: the workspace is recycled too
        ((12, 64), {"group_size": 32, "asymmetric": True}, "uint4"),
    ]:
        xs = [torch.from_numpy(random_floats(rng, shape, EK.F16)) for _ in range(3)]
        refs = [qp.quantize(x, name, **kwargs) for x in xs]
        xds = [x.cuda() for x in xs]
        qp.quantize(xds[0], name, **kwargs)  # the full path
        qt = qp.quantize(xds[0], name, **kwargs)
        ptr = vars(qt)["_memory"].data_ptr()
        del qt
        again = qp.quantize(xds[1], name, **kwargs)
        assert vars(again)["_memory"].data_ptr() == ptr, "the same stream takes the kept allocation"
        _check_torch_fields(again, refs[1], xds[1].device, shape)  # reads its fields: freed after
        del again
        qt = qp.quantize(xds[2], name, **kwargs)
        ptr = vars(qt)["_memory"].data_ptr()
        y = qp.dequantize(qt, "float32")
        kept.append(weakref.ref(vars(qt)["_memory"]))
        del qt
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            other = qp.quantize(xds[0], name, **kwargs)
            assert vars(other)["_memory"].data_ptr() != ptr, "another stream never takes it"
            _check_torch_fields(other, refs[0], xds[0].device, shape)
        torch.cuda.current_stream().wait_stream(side)
        ref_y = qp.dequantize(refs[2], "float32").numpy()
        got = y.cpu().numpy()
        nan = np.isnan(ref_y)
        assert np.array_equal(got[~nan].view(np.uint32), ref_y[~nan].view(np.uint32)), shape
        del other, y
        qt = qp.quantize(xds[2], name, **kwargs)  # kept for the next call
        kept.append(weakref.ref(vars(qt)["_memory"]))
        del qt
        assert kept[-1]() is not None
    _frontend.clear_plan_cache()
    assert all(memory() is None for memory in kept), "the plan cache's release frees every kept allocation"
