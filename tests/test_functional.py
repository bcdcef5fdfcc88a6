"""The functional layer (qp.quantize / qp.dequantize / qp.fake_quantize): same bits as the plans.

One body per check runs on NumPy arrays and PyTorch CPU tensors (reference backend, CI) and, with a
GPU, on CuPy arrays and PyTorch CUDA tensors (CUDA backend), always compared with the reference
plans run by hand on the same data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan.elements import ELEMENTS
from quantplan.types import ElementKind as EK

try:
    import torch
except ImportError:  # pragma: no cover - CI without PyTorch
    torch = None

LIBRARIES = [
    pytest.param("numpy", id="numpy"),
    pytest.param("torch-cpu", id="torch-cpu", marks=pytest.mark.skipif(torch is None, reason="no PyTorch")),
    pytest.param("cupy", id="cupy", marks=pytest.mark.gpu),
    pytest.param(
        "torch-cuda", id="torch-cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(torch is None, reason="no PyTorch")]
    ),
]


def converters(library: str) -> tuple[Callable[[np.ndarray], Any], Callable[[Any], np.ndarray]]:
    """(NumPy -> library array, library array -> NumPy); bfloat16 / float8 travel as their bits."""

    def bits(a: np.ndarray) -> np.ndarray:
        if a.dtype.kind not in "fiu":  # ml_dtypes' bfloat16 / float8
            return a.view({2: np.uint16, 1: np.uint8}[a.dtype.itemsize])
        return a

    if library == "numpy":
        return (lambda a: a), (lambda a: np.asarray(a))
    if library == "cupy":
        import cupy

        return (lambda a: cupy.asarray(bits(a))), (lambda a: cupy.asnumpy(a))
    device = "cpu" if library == "torch-cpu" else "cuda"

    def to_torch(a: np.ndarray) -> Any:
        if a.dtype.kind not in "fiu":  # bfloat16 / float8: through their bits
            raw = torch.from_numpy(bits(a).view(np.int16 if a.dtype.itemsize == 2 else np.int8).copy())
            name = {"bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}[
                a.dtype.name
            ]
            return raw.view(getattr(torch, name)).to(device)
        return torch.from_numpy(a.copy()).to(device)

    def to_numpy(t: Any) -> np.ndarray:
        t = t.detach().cpu()
        if t.dtype is torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        if t.dtype.is_floating_point and t.element_size() == 1:  # float8
            return t.view(torch.uint8).numpy()
        return t.numpy()

    return to_torch, to_numpy


def raw(a: np.ndarray) -> np.ndarray:
    """Bits of ``a`` for exact comparison (NaN scales compare equal to themselves)."""
    return a.view({8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize])


def assert_same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit, except that NaN equals NaN (a NaN scale's payload is not part of the contract)."""
    got = got.view(want.dtype) if got.dtype != want.dtype else got  # bfloat16 arrives as its bits
    got_bits, want_bits = raw(got), raw(want)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got_bits[~nan], want_bits[~nan])


def reference_dynamic(x: np.ndarray, desc: qp.DynamicRangeQuantizeDescriptor) -> tuple[np.ndarray, ...]:
    plan = qp.DynamicRangeQuantizePlan.select(None, desc, REFERENCE)
    code = ELEMENTS[desc.output_element]
    q = np.zeros(desc.output_shape, np.uint8 if code.is_packed or code.is_fp8 else code.numpy_dtype)
    pdt = np.float64 if desc.input_element is EK.F64 else np.float32
    s = np.zeros(desc.param_shape, pdt)
    z = np.zeros(desc.param_shape, np.int32) if desc.mode is qp.QuantMode.ASYMMETRIC else None
    ws = qp.Workspace.allocate(plan.workspace_size(), device=False) if plan.workspace_size() else None
    plan.run(None, ws, qp.DynamicRangeQuantizeArgs(x, q, s, z))
    return q, s, z


CASES = [
    ("int8", dict(scope=qp.TokenScope()), EK.F16, (37, 203)),
    ("int4", dict(group_size=7, asymmetric=True), EK.BF16, (19, 105)),
    ("uint8", dict(axis=0, asymmetric=True), EK.F32, (43, 31)),
    ("fp8_e4m3", dict(), EK.F32, (5, 3, 33)),
    (EK.U4, dict(group_size=10), EK.F64, (4, 50)),
]


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize(("dtype", "kw", "float_kind", "shape"), CASES, ids=lambda v: str(getattr(v, "name", v)))
def test_dynamic_quantize_round_trip_equals_the_plans(
    library: str, dtype: Any, kw: dict[str, Any], float_kind: EK, shape: tuple[int, ...], rng: np.random.Generator
) -> None:
    to_lib, to_np = converters(library)
    for _ in range(3):  # the later calls are replayed (qp.quantize remembers the signature)
        x = random_floats(rng, shape, float_kind)
        qt = qp.quantize(to_lib(x), dtype, **kw)
        assert isinstance(qt, qp.QuantizedTensor) and qt.shape == shape
        code_kind = qt.descriptor.input_element
        scope = kw.get("scope") or (
            qp.GroupScope(axis=-1, group_size=kw["group_size"])
            if "group_size" in kw
            else qp.ChannelScope(axis=kw["axis"])
            if "axis" in kw
            else qp.TensorScope()
        )
        mode = qp.QuantMode.ASYMMETRIC if kw.get("asymmetric") else qp.QuantMode.SYMMETRIC
        desc = qp.DynamicRangeQuantizeDescriptor(
            shape=shape, scope=scope, mode=mode, input_element=float_kind, output_element=code_kind
        )
        q, s, z = reference_dynamic(x, desc)
        assert np.array_equal(raw(to_np(qt.codes)), raw(q))
        assert np.array_equal(raw(to_np(qt.scale)), raw(s))
        if z is None:
            assert qt.zero_point is None
        else:
            assert np.array_equal(to_np(qt.zero_point), z)
        # dequantize: the DequantizePlan's bits
        y = qt.dequantize()
        ref = np.zeros(shape, ELEMENTS[float_kind].numpy_dtype)
        deq = qp.DequantizePlan.select(None, qt.descriptor, REFERENCE)
        deq.run(None, None, qp.DequantizeArgs(q, ref, s, z))
        assert_same_floats(to_np(y), ref)
    y32 = qp.dequantize(qt, "float32")
    assert to_np(y32).dtype == np.float32 and to_np(y32).shape == shape
    assert qt.nbytes >= q.nbytes + s.nbytes
    assert "QuantizedTensor(" in repr(qt) and code_kind.name in repr(qt)


@pytest.mark.parametrize("library", LIBRARIES)
def test_static_quantize_and_fake_quantize_equal_the_plans(library: str, rng: np.random.Generator) -> None:
    to_lib, to_np = converters(library)
    x = random_floats(rng, (29, 99), EK.F32)
    scale = np.exp(rng.uniform(-3, 1, size=(1, 99))).astype(np.float32)
    zp = rng.integers(-5, 5, size=(1, 99)).astype(np.int32)
    qt = qp.quantize(to_lib(x), "int8", axis=-1, scale=to_lib(scale), zero_point=to_lib(zp))
    desc = qp.QuantizeDescriptor(
        shape=(29, 99),
        scope=qp.ChannelScope(axis=-1),
        mode=qp.QuantMode.ASYMMETRIC,
        input_element=EK.F32,
        output_element=EK.S8,
    )
    q = np.zeros((29, 99), np.int8)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q, scale, zp))
    assert np.array_equal(to_np(qt.codes), q)

    y = qp.fake_quantize(to_lib(x), 0.0625, 3, q_min=-8, q_max=7)
    fdesc = qp.FakeQuantizeDescriptor(
        shape=(29, 99), scope=qp.TensorScope(), mode=qp.QuantMode.ASYMMETRIC, element=EK.F32, q_min=-8, q_max=7
    )
    ref = np.zeros_like(x)
    qp.FakeQuantizePlan.select(None, fdesc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, ref, 0.0625, 3))
    assert np.array_equal(raw(to_np(y)), raw(ref))


@pytest.mark.parametrize("library", LIBRARIES)
def test_repeated_fake_quantize_equals_the_plan(library: str, rng: np.random.Generator) -> None:
    """Repeated calls (replayed on CUDA after the first of each signature) on fresh data, with a
    Python scale that changes between calls, a per-channel scale array and zero points: each
    result is the reference plan's, bit for bit."""
    to_lib, to_np = converters(library)
    shape = (13, 301)
    scale_c = np.exp(rng.uniform(-3, 1, size=(1, 301))).astype(np.float32)
    zp_c = rng.integers(-5, 5, size=(1, 301)).astype(np.int32)
    calls = [(0.0625, None, None), (0.0625, 3, None), (0.125, None, None), (scale_c, zp_c, 1), (scale_c, None, 1)]
    for _ in range(3):
        for scale, zp, axis in calls * 2:
            x = random_floats(rng, shape, EK.F16)
            args = [to_lib(a) if isinstance(a, np.ndarray) else a for a in (scale, zp)]
            y = qp.fake_quantize(to_lib(x), *args, axis=axis, q_min=-8, q_max=7)
            scope = qp.TensorScope() if axis is None else qp.ChannelScope(axis=axis)
            mode = qp.QuantMode.SYMMETRIC if zp is None else qp.QuantMode.ASYMMETRIC
            fdesc = qp.FakeQuantizeDescriptor(shape=shape, scope=scope, mode=mode, element=EK.F16, q_min=-8, q_max=7)
            ref = np.zeros_like(x)
            qp.FakeQuantizePlan.select(None, fdesc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, ref, scale, zp))
            assert np.array_equal(raw(to_np(y)), raw(ref)), (scale if axis is None else "array", zp)


def test_stochastic_rounding_is_reproducible_from_the_seed(rng: np.random.Generator) -> None:
    x = random_floats(rng, (8, 64), EK.F32)
    a = qp.quantize(x, "int8", scope=qp.TokenScope(), rounding=qp.Rounding.STOCHASTIC, seed=7, offset=3)
    b = qp.quantize(x, "int8", scope=qp.TokenScope(), rounding=qp.Rounding.STOCHASTIC, seed=7, offset=3)
    assert np.array_equal(a.codes, b.codes)


def test_a_loop_selects_once(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    qp.clear_plan_cache()
    calls = []
    original = qp.DynamicRangeQuantizePlan.select

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(qp.DynamicRangeQuantizePlan, "select", counting)
    for _ in range(3):
        qp.quantize(random_floats(rng, (4, 16), EK.F32), "int8", scope=qp.TokenScope())
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x: qp.quantize(x, "int7"), "int7"),
        (lambda x: qp.quantize(x, "int8", scope=qp.TokenScope(), group_size=4), "one of scope"),
        (lambda x: qp.quantize(x, "int8", zero_point=3), "zero_point"),
        (lambda x: qp.quantize(x, "int8", scale=0.5, asymmetric=True), "zero_point"),
        (lambda x: qp.quantize(x.astype(np.int32), "int8"), "int32"),
        (lambda x: qp.quantize(x, "int8", seed=3), "STOCHASTIC"),
        (lambda x: qp.quantize([1.0, 2.0], "int8"), "list"),
        (lambda x: qp.dequantize(x), "QuantizedTensor"),
        (lambda x: qp.quantize(x, "int8", group_size=5), "group"),
    ],
)
def test_bad_calls_raise_quantplan_errors(call: Callable[[np.ndarray], Any], match: str) -> None:
    x = np.ones((4, 16), np.float32)
    with pytest.raises(qp.QuantPlanError, match=match):
        call(x)
