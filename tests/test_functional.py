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
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

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


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize(
    ("kw", "segment"),
    [
        (dict(scope=qp.TokenScope()), lambda r, c: (r, slice(None))),
        (dict(group_size=8, asymmetric=True), lambda r, c: (r, slice(c // 8 * 8, c // 8 * 8 + 8))),
        (dict(), lambda r, c: (slice(None), slice(None))),
    ],
    ids=["token", "group-asymmetric", "tensor"],
)
def test_a_nan_makes_its_whole_segment_nan_and_nonfinite_reports_it(
    library: str, kw: dict[str, Any], segment: Callable[[int, int], Any], rng: np.random.Generator
) -> None:
    """The README's rule: a segment holding NaN gets scale NaN, codes = zero point, and dequantizes
    to NaN as a whole (other segments untouched); nonfinite="propagate" keeps those bits,
    "warn" warns and "raise" raises InvalidProblem, every call (replayed ones included)."""
    to_lib, to_np = converters(library)
    x = random_floats(rng, (6, 40), EK.F32)
    x = np.where(np.isfinite(x), x, 0).astype(np.float32)
    r, c = int(rng.integers(0, 6)), int(rng.integers(0, 40))
    bad = x.copy()
    bad[r, c] = np.nan
    qt = qp.quantize(to_lib(bad), "int8", **kw)
    y = to_np(qt.dequantize())
    nan_rows = np.zeros(x.shape, bool)
    nan_rows[segment(r, c)] = True
    assert np.isnan(y[nan_rows]).all() and not np.isnan(y[~nan_rows]).any()
    nan_scale = np.isnan(to_np(qt.scale))
    assert nan_scale.sum() == 1
    assert qt.zero_point is None or (to_np(qt.zero_point)[nan_scale] == 0).all()
    assert (to_np(qt.codes)[nan_rows] == 0).all()
    same = qp.quantize(to_lib(bad), "int8", nonfinite="propagate", **kw)
    assert np.array_equal(to_np(same.codes), to_np(qt.codes))
    for _ in range(2):  # the second call of a signature is the replayed one on CUDA
        with pytest.warns(RuntimeWarning, match="not finite.*dequantizes to NaN"):
            warned = qp.quantize(to_lib(bad), "int8", nonfinite="warn", **kw)
        assert np.array_equal(to_np(warned.codes), to_np(qt.codes))
        with pytest.raises(qp.InvalidProblem, match=r"1 of \d+ scales are not finite"):
            qp.quantize(to_lib(bad), "int8", nonfinite="raise", **kw)
    clean = qp.quantize(to_lib(x), "int8", nonfinite="raise", **kw)  # finite input: no complaint, same bits
    assert np.array_equal(to_np(clean.codes), to_np(qp.quantize(to_lib(x), "int8", **kw).codes))


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_float64_scale_is_rounded_to_the_parameter_dtype(library: str, rng: np.random.Generator) -> None:
    to_lib, to_np = converters(library)
    x = random_floats(rng, (7, 33), EK.F32)
    scale64 = np.exp(rng.uniform(-3, 1, size=(7, 1)))
    got = qp.quantize(to_lib(x), "int8", scope=qp.TokenScope(), scale=to_lib(scale64))
    want = qp.quantize(to_lib(x), "int8", scope=qp.TokenScope(), scale=to_lib(scale64.astype(np.float32)))
    assert np.array_equal(to_np(got.codes), to_np(want.codes))
    assert to_np(got.scale).dtype == np.float32
    assert np.array_equal(raw(to_np(got.scale)), raw(scale64.astype(np.float32)))
    assert np.array_equal(raw(to_np(got.dequantize())), raw(to_np(want.dequantize())))


def test_a_list_raises_the_same_error_class_from_the_one_liner_and_the_plan_api() -> None:
    """One mistake, one class: an argument that is no array is InvalidArgumentType (a TypeError)."""
    data = [[1.0, 2.0], [3.0, 4.0]]
    desc = qp.QuantizeDescriptor(shape=(2, 2), scope=qp.TensorScope(), input_element=EK.F32, output_element=EK.S8)
    plan = qp.QuantizePlan.select(None, desc, REFERENCE)
    with pytest.raises(qp.InvalidArgumentType, match="input"):
        plan.run(None, None, qp.QuantizeArgs(data, np.zeros((2, 2), np.int8), 0.5))
    with pytest.raises(qp.InvalidArgumentType, match="x is a list"):
        qp.quantize(data, "int8")
    with pytest.raises(qp.InvalidArgumentType, match="scale is a list"):
        qp.quantize(np.ones((2, 2), np.float32), "int8", scale=[[0.5]])
    with pytest.raises(qp.InvalidArgumentType, match="x is a list"):
        qp.fake_quantize(data, 0.5)
    with pytest.raises(qp.InvalidArgumentType, match="QuantizedTensor"):
        qp.dequantize(np.ones(3))
    with pytest.raises(qp.InvalidProblem, match="nonfinite"):
        qp.quantize(np.ones((2, 2), np.float32), "int8", nonfinite="ignore")


def test_nonfinite_also_checks_a_given_scale() -> None:
    x = np.ones((3, 4), np.float32)
    scale = np.array([[0.5], [np.inf], [0.25]], np.float32)
    with pytest.raises(qp.InvalidProblem, match=r"1 of 3 scales .* index \(1, 0\).*scale= given"):
        qp.quantize(x, "int8", scope=qp.TokenScope(), scale=scale, nonfinite="raise")
    qt = qp.quantize(x, "int8", scope=qp.TokenScope(), scale=scale)  # default: no check, the row decodes to NaN
    y = qt.dequantize()
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
