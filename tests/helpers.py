"""Test data and comparisons shared by the CPU and GPU tests."""

from __future__ import annotations

import numpy as np

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind

REFERENCE = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)

FLOATS = [ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64]
CODES = [ElementKind.S8, ElementKind.U8, ElementKind.S4, ElementKind.U4, ElementKind.FP8_E4M3, ElementKind.FP8_E5M2]
# (scope, shape): ragged extents, odd groups, several ranks.
SCOPES = [
    (qp.TensorScope(), (37, 203)),
    (qp.TokenScope(), (5, 7, 301)),
    (qp.TokenScope(), (300, 13)),
    (qp.ChannelScope(axis=0), (43, 131)),
    (qp.ChannelScope(axis=-1), (29, 99)),
    (qp.ChannelScope(axis=1), (3, 17, 5, 22)),
    (qp.GroupScope(axis=-1, group_size=7), (19, 105)),
    (qp.GroupScope(axis=-1, group_size=100), (11, 4100)),
    (qp.GroupScope(axis=0, group_size=3), (39, 45)),
    (qp.GroupScope(axis=1, group_size=5), (2, 35, 3, 18)),
]


def to_device(a: np.ndarray):  # noqa: ANN201
    """A CuPy copy of ``a``; bfloat16 / float8 (no CuPy dtype) travel as their raw bits."""
    import cupy

    if a.dtype.itemsize == 2 and a.dtype.kind not in "fiu":
        a = a.view(np.uint16)  # bfloat16 -> raw bits
    elif a.dtype.itemsize == 1 and a.dtype.kind not in "iu":
        a = a.view(np.uint8)  # float8 -> raw bits
    return cupy.asarray(a)


def random_floats(
    rng: np.random.Generator, shape: tuple[int, ...], kind: ElementKind, specials: bool = True
) -> np.ndarray:
    """Normal data with per-row magnitudes spread over decades; a few zeros, ties and huge values."""
    n = int(np.prod(shape)) if shape else 1
    rows = shape[0] if shape else 1
    mags = np.exp(rng.uniform(-4, 4, size=(rows,) + (1,) * (len(shape) - 1))) if shape else 1.0
    x = rng.standard_normal(shape) * mags
    if specials and n > 8:
        flat = x.reshape(-1)
        idx = rng.choice(n, size=max(1, n // 50), replace=False)
        flat[idx[: len(idx) // 3]] = 0.0
        flat[idx[len(idx) // 3 : 2 * len(idx) // 3]] = (
            rng.integers(-20, 20, size=len(idx[len(idx) // 3 : 2 * len(idx) // 3])) + 0.5
        )
        flat[idx[2 * len(idx) // 3 :]] *= 1e3
    with np.errstate(over="ignore"):
        return x.astype(ELEMENTS[kind].numpy_dtype)


def random_scale(rng: np.random.Generator, shape: tuple[int, ...], precision: qp.MathPrecision) -> np.ndarray:
    dtype = np.float64 if precision is qp.MathPrecision.F64 else np.float32
    return np.exp(rng.uniform(-5, 2, size=shape)).astype(dtype)


def random_zero_point(rng: np.random.Generator, shape: tuple[int, ...], kind: ElementKind) -> np.ndarray:
    lo, hi = ELEMENTS[kind].code_range or (0, 0)
    return rng.integers(lo, hi + 1, size=shape).astype(np.int32)


def random_codes(rng: np.random.Generator, shape: tuple[int, ...], kind: ElementKind) -> np.ndarray:
    """Random storage bytes for codes of ``kind`` with logical ``shape`` (FP8: every byte, NaNs included)."""
    from quantplan.runtime._affine import storage_shape

    sshape = storage_shape(shape, kind)
    info = ELEMENTS[kind]
    if info.is_fp8 or info.is_packed:
        data = rng.integers(0, 256, size=sshape).astype(np.uint8)
        if info.is_packed and shape and shape[-1] % 2:
            data[..., -1] &= 0x0F  # padding nibble of odd rows is zero (LOW_FIRST); test sets order itself
        return data
    return rng.integers(info.code_range[0], info.code_range[1] + 1, size=sshape).astype(info.numpy_dtype)


def float_bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of float arrays, counting any NaN equal to any NaN."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    af, bf = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(af), np.isnan(bf)
    if not np.array_equal(nan_a, nan_b):
        return False
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(np.array_equal(a.view(width)[~nan_a], b.view(width)[~nan_b]))


def first_mismatch(a: np.ndarray, b: np.ndarray) -> str:
    a = np.asarray(a).reshape(-1)
    b = np.asarray(b).reshape(-1)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    diff = np.nonzero(a.view(width) != b.view(width))[0]
    if not len(diff):
        return "no mismatch"
    i = diff[0]
    return f"{len(diff)} mismatches; first at flat index {i}: got {a[i]!r} expected {b[i]!r}"
