"""A replayed CuPy ``qp.quantize`` returns a QuantizedTensor whose arrays are made when first read.

The replay allocates the outputs as regions of one allocation and launches; its QuantizedTensor
holds that allocation and makes ``codes`` / ``scale`` / ``zero_point`` (``cupy.ndarray`` views
at the regions' offsets) on first read, then keeps them. On the simulated GPU (CPU) these tests
check that the fields are the regions of the allocation, the same as an eager QuantizedTensor's,
made once; that the class's behaviour (``nbytes``, ``repr``, ``==``, ``dataclasses``, copying)
is the eager one's; and that the allocation lives while the QuantizedTensor or one of its arrays
does. On the GPU: the results and their dequantization equal the reference bit for bit.
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
    del qt
    assert owner() is None, "an unread QuantizedTensor frees its allocation when it dies"
    qt = qp.quantize(x, "int8", scope=qp.TokenScope())
    owner = allocations[-1][2]
    scale = qt.scale
    del qt
    assert owner() is not None, "a field read keeps the allocation"
    del scale
    assert owner() is None
    qp.dequantize(qp.quantize(x, "int8", scope=qp.TokenScope()))  # the full path of dequantize
    qt = qp.quantize(x, "int8", scope=qp.TokenScope())
    owner = allocations[-1][2]
    y = qp.dequantize(qt)  # a replay reading the allocation's pointers
    assert owner() is not None and not set(FIELDS) & set(vars(qt))
    del qt
    assert owner() is None and y.shape == (16, 512)


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
                if attempt >= 2:  # unread or read, the allocation lives until the QuantizedTensor dies
                    fresh = qp.quantize(xd, name, scope=scope, asymmetric=asymmetric)
                    held = pool.used_bytes()
                    del fresh
                    assert pool.used_bytes() < held
                del qt
                cupy.cuda.get_current_stream().synchronize()
                if attempt:  # (the first call may also load the plans' tables)
                    assert pool.used_bytes() == used, (shape, attempt)
    _frontend.clear_plan_cache()
