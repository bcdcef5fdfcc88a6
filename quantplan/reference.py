"""NumPy reference backend: the semantics of SPEC section 4, written plainly.

The CUDA kernels are tested to equal these functions bit for bit (integer codes, FP8 bytes and
scales; float outputs bit for bit except that every NaN counts as equal to every NaN). Arrays
here are NumPy arrays in their storage dtypes: bfloat16 and FP8 through ``ml_dtypes``, 4-bit
codes as uint8 bytes packed along the last axis.
"""

from __future__ import annotations

import numpy as np

from .elements import ELEMENTS
from .types import ElementKind, MathPrecision, NibbleOrder

#: Byte written for any NaN by FP8 quantization (both formats): sign 0, all exponent and mantissa bits 1.
FP8_CANONICAL_NAN = 0x7F


def acc_dtype(precision: MathPrecision) -> np.dtype:
    """float32, or float64 for F64 arithmetic."""
    return np.dtype(np.float64) if precision is MathPrecision.F64 else np.dtype(np.float32)


def to_acc(x: np.ndarray, precision: MathPrecision) -> np.ndarray:
    """Exact upcast of float storage to the accumulator type."""
    return np.asarray(x).astype(acc_dtype(precision))


def fp8_encode(v: np.ndarray, kind: ElementKind) -> np.ndarray:
    """``fp8_rne_saturate(v)`` as uint8 bytes: one round-to-nearest-even straight from ``v``'s exact
    value, saturating to +-largest finite (Inf included); NaN -> 0x7F.

    Written on the float64 bit pattern (exact for float32 / float64 inputs) rather than through a
    library cast, because a cast from float64 may round twice (via float32).
    """
    info = ELEMENTS[kind]
    assert info.fp8_max is not None
    mant = 3 if kind is ElementKind.FP8_E4M3 else 2
    bias = 7 if kind is ElementKind.FP8_E4M3 else 15
    max_code = 0x7E if kind is ElementKind.FP8_E4M3 else 0x7B
    x = np.asarray(v, dtype=np.float64)
    a = np.abs(x)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint64)
    with np.errstate(invalid="ignore", over="ignore"):
        subnormal = (
            np.rint(a * 2.0 ** (bias - 1 + mant)).astype(np.uint64, copy=False) if a.size else a.astype(np.uint64)
        )
        bits = np.nan_to_num(a, nan=0.0, posinf=0.0).view(np.uint64)
        shift = np.uint64(52 - mant)
        rounded = (bits + np.uint64((1 << (51 - mant)) - 1) + ((bits >> shift) & np.uint64(1))) >> shift
        normal = rounded - np.uint64((1023 - bias) << mant)
        code = np.where(a >= info.fp8_max, np.uint64(max_code), np.where(a < 2.0 ** (1 - bias), subnormal, normal))
    code = (code | sign).astype(np.uint8)
    code[np.isnan(x)] = FP8_CANONICAL_NAN
    return code


def fp8_decode(codes: np.ndarray, kind: ElementKind) -> np.ndarray:
    """Exact float32 values of FP8 bytes."""
    raw = np.asarray(codes)
    return raw.view(np.uint8).view(ELEMENTS[kind].numpy_dtype).astype(np.float32)


def pack_nibbles(codes: np.ndarray, order: NibbleOrder) -> np.ndarray:
    """Pack integer codes (..., L) two per byte along the last axis -> uint8 (..., ceil(L/2)).

    An odd last extent gets a zero padding nibble at the end of each row.
    """
    codes = np.atleast_1d(np.asarray(codes))
    L = codes.shape[-1]
    nib = (codes.astype(np.int64) & 0xF).astype(np.uint8)
    if L % 2:
        nib = np.concatenate([nib, np.zeros((*nib.shape[:-1], 1), np.uint8)], axis=-1)
    even, odd = nib[..., 0::2], nib[..., 1::2]
    if order is NibbleOrder.HIGH_FIRST:
        return ((even << 4) | odd).astype(np.uint8)
    return ((odd << 4) | even).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray, length: int, signed: bool, order: NibbleOrder) -> np.ndarray:
    """Inverse of :func:`pack_nibbles`: uint8 (..., ceil(L/2)) -> int32 codes (..., L)."""
    packed = np.asarray(packed, dtype=np.uint8)
    low = (packed & 0xF).astype(np.int32)
    high = (packed >> 4).astype(np.int32)
    even, odd = (high, low) if order is NibbleOrder.HIGH_FIRST else (low, high)
    codes = np.stack([even, odd], axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)[..., :length]
    if signed:
        codes = np.where(codes >= 8, codes - 16, codes)
    return codes.astype(np.int32)


def round_and_clamp(v: np.ndarray, zero_point: np.ndarray | int, q_min: int, q_max: int) -> np.ndarray:
    """``clamp(rne(v) + zp, q_min, q_max)`` as int32; NaN -> zp; +-Inf clamps."""
    r = np.rint(v)
    zp = np.asarray(zero_point, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        t = np.clip(r.astype(np.float64) + zp, q_min, q_max)
    t = np.where(np.isnan(r), np.broadcast_to(zp, t.shape), t)
    return t.astype(np.int32)


def encode_codes(codes_or_values: np.ndarray, output: ElementKind, nibble_order: NibbleOrder) -> np.ndarray:
    """Storage of ``output``: int codes -> int8/uint8 (or packed bytes); FP8 values -> bytes."""
    info = ELEMENTS[output]
    if info.is_fp8:
        return fp8_encode(codes_or_values, output)
    if info.is_packed:
        return pack_nibbles(codes_or_values, nibble_order)
    return codes_or_values.astype(info.numpy_dtype)


def decode_codes(storage: np.ndarray, input_kind: ElementKind, length: int, nibble_order: NibbleOrder) -> np.ndarray:
    """Integer codes (int32) or, for FP8, exact float32 values of quantized storage."""
    info = ELEMENTS[input_kind]
    if info.is_fp8:
        return fp8_decode(storage, input_kind)
    if info.is_packed:
        return unpack_nibbles(storage, length, info.code_range is not None and info.code_range[0] < 0, nibble_order)
    return np.asarray(storage).astype(np.int32)


def quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int,
    output: ElementKind,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST,
) -> np.ndarray:
    """Static quantization: ``q = clamp(rne(x / scale) + zp, q_min, q_max)``, FP8: ``fp8(x / scale)``.

    ``scale`` and ``zero_point`` must broadcast against ``x`` (see ``expand_params``). Returns the
    output's storage array.
    """
    acc = acc_dtype(precision)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = to_acc(x, precision) / np.asarray(scale).astype(acc)
    if ELEMENTS[output].is_fp8:
        return fp8_encode(v, output)
    return encode_codes(round_and_clamp(v, zero_point, q_min, q_max), output, nibble_order)


def dequantize(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int,
    input_kind: ElementKind,
    output: ElementKind,
    length: int,
    precision: MathPrecision,
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST,
) -> np.ndarray:
    """Dequantization: ``y = (q - zp) * scale`` in the accumulator type, rounded once to ``output``."""
    acc = acc_dtype(precision)
    codes = decode_codes(q, input_kind, length, nibble_order)
    if ELEMENTS[input_kind].is_fp8:
        centered = codes.astype(acc)
    else:
        centered = (codes.astype(np.int64) - np.asarray(zero_point, dtype=np.int64)).astype(acc)
    with np.errstate(over="ignore", invalid="ignore"):
        y = centered * np.asarray(scale).astype(acc)
        return y.astype(ELEMENTS[output].numpy_dtype)


__all__ = [
    "FP8_CANONICAL_NAN",
    "acc_dtype",
    "decode_codes",
    "dequantize",
    "encode_codes",
    "fp8_decode",
    "fp8_encode",
    "pack_nibbles",
    "quantize",
    "round_and_clamp",
    "to_acc",
    "unpack_nibbles",
]
