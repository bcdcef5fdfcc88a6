"""NumPy reference backend: the semantics of SPEC section 4, written plainly.

The CUDA kernels are tested to equal these functions bit for bit (integer codes, FP8 bytes and
scales; float outputs bit for bit except that every NaN counts as equal to every NaN). Arrays
here are NumPy arrays in their storage dtypes: bfloat16 and FP8 through ``ml_dtypes``, 4-bit
codes as uint8 bytes packed along the last axis.
"""

from __future__ import annotations

import numpy as np

from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.formats import element_format, format_of, is_served_code
from quantplan.vocabulary.types import (
    ChannelScope,
    ElementKind,
    GroupScope,
    MathPrecision,
    NibbleOrder,
    QuantMode,
    Scope,
    TensorScope,
    TokenScope,
    expand_params,
    normalize_axis,
    param_shape,
)

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
    mant, bias, fmax = _fp8_layout(kind)
    max_code = element_format(kind).max_code
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
        code = np.where(a >= fmax, np.uint64(max_code), np.where(a < 2.0 ** (1 - bias), subnormal, normal))
    code = (code | sign).astype(np.uint8)
    code[np.isnan(x)] = FP8_CANONICAL_NAN
    return code


def _fp8_layout(kind: ElementKind) -> tuple[int, int, float]:
    """(mantissa bits, exponent bias, largest finite value) of an FP8 kind, from its element format."""
    if not ELEMENTS[kind].is_fp8:
        raise ValueError(f"{kind} is not an FP8 kind")
    element = element_format(kind)
    return element.mantissa_bits, element.bias, element.max_finite


def fp8_stochastic_encode(v: np.ndarray, uniform: np.ndarray, kind: ElementKind) -> np.ndarray:
    """Stochastic rounding of ``v`` to FP8 ``kind``, as uint8 bytes.

    ``v`` is in the accumulator dtype (float32, or float64 for F64 plans); ``uniform`` holds one
    ``u`` in [0, 1) per element (a multiple of 2**-24, see :mod:`quantplan.vocabulary.philox`).

    * NaN -> 0x7F (the canonical NaN, as :func:`fp8_encode`).
    * ``v >= fp8_max`` -> +max code, ``v <= -fp8_max`` -> -max code (saturation; Inf included; no
      randomness).
    * otherwise ``lo`` = the largest FP8 value ``<= v`` (toward -inf), ``hi`` = the next FP8 value
      above ``lo`` and ``frac = (v - lo) / (hi - lo)``, computed in ``v``'s dtype (``hi - lo`` is
      a power of two, the FP8 spacing of that binade, and the division by it is exact;
      ``v - lo`` is exact except when ``|v|`` lies far below the FP8 subnormal spacing, where it
      is rounded once, as in the kernels). The result is ``hi if u < frac else lo``, so
      ``P(hi) = frac`` up to the 2**-24 resolution of ``u``, as the integer rule
      ``floor(v) + (u < v - floor(v))``.
    * a zero result takes the sign of ``v``: a tiny negative ``v`` may give -0 (0x80); ``v``
      exactly representable (+-0 included) gives itself.
    """
    mant, bias, fmax = _fp8_layout(kind)
    x = np.asarray(v)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    u = np.broadcast_to(np.asarray(uniform), x.shape).astype(x.dtype)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a = np.abs(x64)
        finite_in_range = a < fmax  # False for NaN, +-Inf and the saturating range
        a_in = np.where(finite_in_range, a, 0.0)
        _, e = np.frexp(a_in)  # a = m * 2**e, m in [0.5, 1): the binade is [2**(e-1), 2**e)
        # FP8 step of that binade; below the smallest normal the subnormal step 2**(1-bias-mant)
        spacing = np.ldexp(1.0, np.maximum(e - 1, 1 - bias) - mant)
        a_lo = np.floor(a_in / spacing) * spacing  # exact: scaling by powers of two
        a_hi = a_lo + spacing
        neg = np.signbit(x64)
        lo = np.where(neg, -a_hi, a_lo)
        hi = np.where(neg, -a_lo, a_hi)
        frac = (x - lo.astype(x.dtype)) / spacing.astype(x.dtype)
        chosen = np.where(u < frac, hi, lo)
        chosen = np.copysign(np.abs(chosen), x64)  # zero takes the sign of v
        chosen = np.where(finite_in_range, chosen, x64)  # saturation and NaN: fp8_encode's rules
    return fp8_encode(chosen, kind)


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


def stochastic_round_and_clamp(
    v: np.ndarray, uniform: np.ndarray, zero_point: np.ndarray | int, q_min: int, q_max: int
) -> np.ndarray:
    """``clamp(floor(v) + (u < v - floor(v)) + zp, q_min, q_max)`` as int32; NaN -> zp; +-Inf clamps.

    ``v`` is in the accumulator dtype (float32, or float64 for F64 plans); ``uniform`` holds one
    ``u`` in [0, 1) per element (multiples of 2**-24, exact in float32). ``f = floor(v)`` and the
    comparison ``u < v - f`` are done in ``v``'s dtype. ``v - f`` is exact for ``v >= 0`` and
    ``v <= -1``; for ``-1 < v < 0`` it is ``1 + v`` rounded once (as in the kernels), an error of
    at most 2**-25 in float32, below the 2**-24 resolution of ``u``. So ``v`` rounds up with
    probability ``v - floor(v)`` (to within 2**-24): ``E[q - zp] = v`` inside the code range. An
    integer ``v`` stays itself.
    """
    x = np.asarray(v)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    u = np.broadcast_to(np.asarray(uniform), x.shape).astype(x.dtype)
    zp = np.asarray(zero_point, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        f = np.floor(x)
        up = u < (x - f)  # Inf - Inf = NaN compares False: +-Inf stay +-Inf and clamp
        t = np.clip(f.astype(np.float64) + up + zp, q_min, q_max)
    t = np.where(np.isnan(x), np.broadcast_to(zp, t.shape), t)
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
    *,
    uniform: np.ndarray | None = None,
) -> np.ndarray:
    """Static quantization: ``q = clamp(rne(x / scale) + zp, q_min, q_max)``, FP8: ``fp8(x / scale)``.

    ``scale`` and ``zero_point`` must broadcast against ``x`` (see ``expand_params``). Returns the
    output's storage array.

    ``uniform`` (optional): one ``u`` in [0, 1) per element of ``x`` (same shape or size, flat C
    order of the logical tensor, e.g. ``philox.uniform_for_elements(x.size, seed, offset)``).
    When given, ``v = x / scale`` is rounded stochastically instead of to nearest even:
    :func:`stochastic_round_and_clamp` for integer codes, :func:`fp8_stochastic_encode` for FP8.
    """
    acc = acc_dtype(precision)
    x_acc = to_acc(x, precision)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = x_acc / np.asarray(scale).astype(acc)
    if uniform is None:
        if ELEMENTS[output].is_fp8:
            return fp8_encode(v, output)
        return encode_codes(round_and_clamp(v, zero_point, q_min, q_max), output, nibble_order)
    u = np.asarray(uniform)
    if u.size != x_acc.size:
        raise ValueError(
            f"uniform has {u.size} elements but x has {x_acc.size} (shape {x_acc.shape}); pass one per element"
        )
    u = u.reshape(v.shape)
    if ELEMENTS[output].is_fp8:
        return fp8_stochastic_encode(v, u, output)
    return encode_codes(stochastic_round_and_clamp(v, u, zero_point, q_min, q_max), output, nibble_order)


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


def _reduced_axes(rank: int, scope: Scope) -> tuple[int, ...]:
    """Axes reduced by a Tensor / Token / Channel scope (GroupScope is handled by a reshape)."""
    if isinstance(scope, TensorScope):
        return tuple(range(rank))
    if isinstance(scope, TokenScope):
        return (rank - 1,)
    if isinstance(scope, ChannelScope):
        axis = normalize_axis(scope.axis, rank, "channel scope")
        return tuple(i for i in range(rank) if i != axis)
    raise TypeError(f"unexpected scope {scope!r}")


def reduce_segments(a: np.ndarray, scope: Scope, ufunc: np.ufunc, initial: float | bool) -> np.ndarray:
    """``ufunc.reduce`` of ``a`` over each segment of ``scope`` -> array of ``param_shape(a.shape, scope)``.

    Segments: TensorScope = the whole tensor; TokenScope = each row (all axes but the last);
    ChannelScope(axis) = each index along ``axis``; GroupScope(axis, g) = contiguous runs of ``g``
    along ``axis``. ``initial`` seeds every reduction (and is the result of an empty segment).
    """
    shape = tuple(a.shape)
    pshape = param_shape(shape, scope)
    if isinstance(scope, GroupScope):
        axis = normalize_axis(scope.axis, len(shape), "group scope")
        g = scope.group_size
        grouped = a.reshape(*shape[:axis], shape[axis] // g, g, *shape[axis + 1 :])
        out = ufunc.reduce(grouped, axis=axis + 1, initial=initial)
    else:
        out = ufunc.reduce(a, axis=_reduced_axes(len(shape), scope), keepdims=True, initial=initial)
    return np.asarray(out).reshape(pshape)


def nonfinite_segments(x: np.ndarray, scope: Scope) -> np.ndarray:
    """Boolean array of ``param_shape``: True where a segment holds any NaN or +-Inf."""
    return reduce_segments(~np.isfinite(np.asarray(x)), scope, np.logical_or, False).astype(bool)


def dynamic_range_params(
    x: np.ndarray,
    scope: Scope,
    mode: QuantMode,
    output: ElementKind,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-segment ``(scale, zero_point)`` computed from the data (SPEC section 4, dynamic range).

    Returns ``scale`` (float32, float64 for F64 precision) and ``zero_point`` (int32; None for
    SYMMETRIC), both of shape ``param_shape(x.shape, scope)``. Arithmetic is in the accumulator
    dtype (inputs upcast exactly), IEEE division, rne = round half to even:

    * SYMMETRIC: ``amax = max|x|``; integer codes ``scale = amax / q_max``; FP8
      ``scale = amax / fp8_max`` (448 for e4m3, 57344 for e5m2).
    * ASYMMETRIC (integer codes only): ``lo = min(min x, 0)``, ``hi = max(max x, 0)``;
      ``scale = (hi - lo) / (q_max - q_min)`` (``hi - lo`` rounded once in the accumulator, so
      a range beyond the float32 maximum gives ``scale = inf``); ``zp = clamp(q_min -
      rne(lo / scale), q_min, q_max)`` with ``lo / scale`` and its rne in the accumulator and the
      subtraction exact.
    * ``scale == 0`` (an all-zero segment, or a range so tiny that the division underflows to 0)
      -> ``scale = 1``, so no 0/0 ever arises; ASYMMETRIC then has ``zp = clamp(q_min - rne(lo))``,
      which is ``q_min`` for an all-zero (or tiny) segment: zero maps to ``q_min`` exactly. An
      empty segment (a zero extent) counts as all-zero.
    * a segment holding any NaN or +-Inf -> ``scale = NaN``, ``zp = 0``.

    Raises ValueError for ASYMMETRIC FP8, ``q_max <= 0`` in SYMMETRIC integer mode, or
    ``q_min >= q_max`` in ASYMMETRIC mode.
    """
    if not is_served_code(output):
        raise ValueError(f"output must be a quantized kind (S8, U8, S4, U4, FP8), got {output}")
    element = format_of(output).element
    acc = acc_dtype(precision)
    xa = to_acc(x, precision)
    bad = nonfinite_segments(xa, scope)
    with np.errstate(all="ignore"):
        if mode is QuantMode.SYMMETRIC:
            amax = reduce_segments(np.abs(xa), scope, np.maximum, 0.0).astype(acc)
            if element.code_range is None:  # FP8: the largest finite value
                denom = element.max_finite
            else:
                if q_max <= 0:
                    raise ValueError(f"symmetric dynamic range needs q_max > 0, got q_max={q_max}")
                denom = float(q_max)
            scale = amax / acc.type(denom)
            scale = np.where(scale == 0, acc.type(1), scale).astype(acc)
            scale = np.where(bad, acc.type(np.nan), scale).astype(acc)
            return scale, None
        if element.code_range is None:
            raise ValueError(f"FP8 outputs ({output}) have no zero point; use QuantMode.SYMMETRIC")
        if q_min >= q_max:
            raise ValueError(f"asymmetric dynamic range needs q_min < q_max, got q_min={q_min}, q_max={q_max}")
        lo = reduce_segments(xa, scope, np.minimum, 0.0).astype(acc)
        hi = reduce_segments(xa, scope, np.maximum, 0.0).astype(acc)
        scale = (hi - lo) / acc.type(q_max - q_min)
        scale = np.where(scale == 0, acc.type(1), scale).astype(acc)
        r = np.rint(lo / scale)  # in the accumulator dtype
        zp = np.clip(np.float64(q_min) - r.astype(np.float64), q_min, q_max)
        zp = np.where(bad | ~np.isfinite(zp), 0.0, zp).astype(np.int32)
        scale = np.where(bad, acc.type(np.nan), scale).astype(acc)
    return scale, zp


def dynamic_quantize(
    x: np.ndarray,
    scope: Scope,
    mode: QuantMode,
    output: ElementKind,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST,
    uniform: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Dynamic-range quantization: parameters from :func:`dynamic_range_params`, then :func:`quantize`.

    Returns ``(q_storage, scale, zero_point)``: the output storage exactly as :func:`quantize`
    returns it (4-bit codes packed along the last axis in ``nibble_order``, FP8 as uint8 bytes),
    ``scale`` and ``zero_point`` (None for SYMMETRIC) of ``param_shape(x.shape, scope)``.

    Every element of a non-finite segment (scale NaN, zero point 0) gets ``q = zp = 0``; for FP8
    that is byte 0x00 (not the NaN code). Other elements are quantized with the expanded
    parameters: rne, or stochastic rounding when ``uniform`` (one ``u`` per element, flat C order
    of ``x``) is given.
    """
    x = np.asarray(x)
    scale, zp = dynamic_range_params(x, scope, mode, output, q_min, q_max, precision)
    shape = tuple(x.shape)
    scale_x = expand_params(scale, shape, scope)
    zp_x: np.ndarray | int = 0 if zp is None else expand_params(zp, shape, scope)
    q = quantize(x, scale_x, zp_x, output, q_min, q_max, precision, nibble_order, uniform=uniform)
    if ELEMENTS[output].is_fp8:
        # Integer codes already hold zp = 0 there (x / NaN is NaN, and NaN -> zp); FP8 would hold 0x7F.
        bad = np.broadcast_to(expand_params(nonfinite_segments(x, scope), shape, scope), shape)
        q = np.where(bad, np.uint8(0), q).astype(np.uint8)
    return q, scale, zp


__all__ = [
    "FP8_CANONICAL_NAN",
    "acc_dtype",
    "decode_codes",
    "dequantize",
    "dynamic_quantize",
    "dynamic_range_params",
    "encode_codes",
    "fp8_decode",
    "fp8_encode",
    "fp8_stochastic_encode",
    "nonfinite_segments",
    "pack_nibbles",
    "quantize",
    "reduce_segments",
    "round_and_clamp",
    "stochastic_round_and_clamp",
    "to_acc",
    "unpack_nibbles",
]


# ---- fake quantization (QAT) ----------------------------------------------------------------


def fake_zero_point(
    zero_point: np.ndarray | int | float, q_min: int, q_max: int, precision: MathPrecision
) -> np.ndarray:
    """The zero point fake quantization uses, in the accumulator type.

    Integer zero points are used as given; float (learnable) ones are rounded half to even and
    clamped to ``[q_min, q_max]`` (NaN -> ``q_min``), the same way forward and backward.
    """
    acc = acc_dtype(precision)
    z = np.asarray(zero_point)
    if z.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            r = np.rint(z.astype(acc))
        return np.where(np.isnan(r), acc.type(q_min), np.minimum(np.maximum(r, q_min), q_max)).astype(acc)
    return z.astype(acc)


def fake_quantize_codes(
    x: np.ndarray, scale: np.ndarray, zp: np.ndarray, precision: MathPrecision, uniform: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x_acc, inv, q)`` with ``inv = rn(1 / scale)`` and ``q = rne(x * inv) + zp`` in the
    accumulator type, a NaN ``q`` replaced by -Inf: below the range, as PyTorch's CUDA kernels
    convert NaN to int64 (INT64_MIN).
    ``scale`` / ``zp`` broadcast against ``x`` (accumulator type). With ``uniform`` (one ``u`` per
    element, SPEC section 4), stochastic rounding replaces rne: ``v = x * inv``,
    ``q = floor(v) + (u < v - floor(v)) + zp``, each step in the accumulator type."""
    acc = acc_dtype(precision)
    xa = to_acc(x, precision)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        inv = (acc.type(1) / scale).astype(acc)
        v = (xa * inv).astype(acc)
        if uniform is None:
            r = np.rint(v)
        else:
            f = np.floor(v)
            u = np.broadcast_to(np.asarray(uniform), v.shape).astype(acc)
            r = np.where(u < (v - f).astype(acc), f + acc.type(1), f).astype(acc)
        q = (r + zp).astype(acc)
    return xa, inv, np.where(np.isnan(q), acc.type(-np.inf), q)


def fake_quantize(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int | float,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
    uniform: np.ndarray | None = None,
) -> np.ndarray:
    """Fake quantization (SPEC section 4, PyTorch's ``fake_quantize_per_*_affine``), in ``x``'s dtype:

    ``inv = rn(1 / scale)``; ``q = rne(x * inv) + zp`` (NaN -> below ``q_min``);
    ``y = (clamp(q, q_min, q_max) - zp) * scale``, each step rounded in the accumulator type, then
    rounded once to ``x``'s dtype. ``scale`` / ``zero_point`` broadcast against ``x``. ``uniform``:
    stochastic rounding instead of rne (see :func:`fake_quantize_codes`).
    """
    acc = acc_dtype(precision)
    s = np.asarray(scale).astype(acc)
    zp = fake_zero_point(zero_point, q_min, q_max, precision)
    _, _, q = fake_quantize_codes(x, s, zp, precision, uniform)
    with np.errstate(over="ignore", invalid="ignore"):
        y = ((np.minimum(np.maximum(q, q_min), q_max) - zp) * s).astype(acc)
    return y.astype(np.asarray(x).dtype)


def fake_quantize_ste(
    x: np.ndarray,
    grad_output: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int | float,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
) -> np.ndarray:
    """Straight-through gradient of :func:`fake_quantize`: ``dx = dy * (q_min <= q <= q_max)``
    (an IEEE product, so a negative ``dy`` outside gives -0 and NaN stays NaN, as ``dy * mask``
    does in PyTorch), in ``grad_output``'s dtype."""
    acc = acc_dtype(precision)
    zp = fake_zero_point(zero_point, q_min, q_max, precision)
    _, _, q = fake_quantize_codes(x, np.asarray(scale).astype(acc), zp, precision)
    mask = ((q >= q_min) & (q <= q_max)).astype(acc)
    with np.errstate(invalid="ignore"):
        return (to_acc(grad_output, precision) * mask).astype(np.asarray(grad_output).dtype)


def fake_quantize_lsq_terms(
    x: np.ndarray,
    grad_output: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int | float,
    q_min: int,
    q_max: int,
    grad_factor: float,
    precision: MathPrecision,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-element gradients of learnable fake quantization (LSQ, PyTorch's
    ``_fake_quantize_learnable_per_*_affine_backward``): ``(dx, dscale_i, dzp_i)``, ``dx`` in
    ``grad_output``'s dtype and the terms in the accumulator type. With ``y`` the fake-quantized
    value in the accumulator type and ``gf`` the grad factor:

    * inside ``[q_min, q_max]``: ``dx = dy``, ``dscale_i = ((dy * (y - x)) * inv) * gf``, ``dzp_i = 0``;
    * below / above: ``dx = dy * 0``, ``dscale_i = (dy * (q_min - zp)) * gf`` / ``(dy * (q_max - zp)) * gf``,
      ``dzp_i = ((-dy) * scale) * gf``.
    """
    acc = acc_dtype(precision)
    s = np.asarray(scale).astype(acc)
    zp = fake_zero_point(zero_point, q_min, q_max, precision)
    xa, inv, q = fake_quantize_codes(x, s, zp, precision)
    dy = to_acc(grad_output, precision)
    gf = acc.type(grad_factor)
    below, above = q < q_min, q > q_max
    inside = ~(below | above)
    with np.errstate(over="ignore", invalid="ignore"):
        y = ((np.minimum(np.maximum(q, q_min), q_max) - zp) * s).astype(acc)
        inner = (((dy * (y - xa)).astype(acc) * inv).astype(acc) * gf).astype(acc)
        edge = np.where(below, acc.type(q_min) - zp, acc.type(q_max) - zp).astype(acc)
        outer = ((dy * edge).astype(acc) * gf).astype(acc)
        dscale = np.where(inside, inner, outer).astype(acc)
        dzp = np.where(inside, acc.type(0), (((-dy) * s).astype(acc) * gf).astype(acc)).astype(acc)
        dx = (dy * inside.astype(acc)).astype(np.asarray(grad_output).dtype)
    return dx, dscale, dzp


def dynamic_fake_quantize(
    x: np.ndarray,
    scope: Scope,
    mode: QuantMode,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
    uniform: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Dynamic-range fake quantization: ``(y, scale, zero_point)``.

    The parameters are :func:`dynamic_range_params`' (integer codes in ``[q_min, q_max]``: scale
    from the segment's range, zero point for ASYMMETRIC, NaN scale for a non-finite segment);
    ``y`` is :func:`fake_quantize` of ``x`` with them (``inv = rn(1 / scale)``, rne or, with
    ``uniform``, stochastic rounding), in ``x``'s dtype. A non-finite segment comes out all NaN.
    """
    x = np.asarray(x)
    code = ElementKind.S8 if mode is QuantMode.SYMMETRIC else ElementKind.U8
    scale, zp = dynamic_range_params(x, scope, mode, code, q_min, q_max, precision)
    shape = tuple(x.shape)
    zp_x: np.ndarray | int = 0 if zp is None else expand_params(zp, shape, scope)
    y = fake_quantize(x, expand_params(scale, shape, scope), zp_x, q_min, q_max, precision, uniform)
    return y, scale, zp


def fake_quantize_lsq(
    x: np.ndarray,
    grad_output: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int | float,
    q_min: int,
    q_max: int,
    grad_factor: float,
    scope: Scope,
    precision: MathPrecision,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Learnable fake quantization backward: ``(dx, dscale, dzp)`` with ``dscale`` / ``dzp`` of
    ``param_shape(x.shape, scope)``: the per-element terms of :func:`fake_quantize_lsq_terms` summed
    over each segment in float64 (NumPy's pairwise order), rounded once to the accumulator type.
    ``scale`` / ``zero_point`` are broadcast against ``x`` (see ``expand_params``)."""
    acc = acc_dtype(precision)
    dx, ds, dz = fake_quantize_lsq_terms(x, grad_output, scale, zero_point, q_min, q_max, grad_factor, precision)
    dscale = reduce_segments(ds.astype(np.float64), scope, np.add, 0.0).astype(acc)
    dzp = reduce_segments(dz.astype(np.float64), scope, np.add, 0.0).astype(acc)
    return dx, dscale, dzp


# ---- gradients of static quantize / dequantize (straight-through estimator) -----------------


def quantize_backward_mask(
    x: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int,
    output: ElementKind,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
) -> np.ndarray:
    """Where :func:`quantize`'s pre-clamp value lies inside the code range (boolean, ``x``'s shape).

    ``v = x / scale`` exactly as :func:`quantize` computes it (accumulator dtype, IEEE division).
    Integer codes: ``q_min <= rne(v) + zp <= q_max`` (inclusive; the sum exact). FP8 codes:
    ``|v| <= fp8_max``. NaN and +-Inf ``x`` are outside. ``scale`` / ``zero_point`` broadcast
    against ``x`` (see ``expand_params``).
    """
    acc = acc_dtype(precision)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = to_acc(x, precision) / np.asarray(scale).astype(acc)
        element = format_of(output).element
        if element.code_range is None:  # FP8: the largest finite value
            return np.asarray(np.abs(v) <= element.max_finite)
        # |rne(v)| up to 2**32 is exact in float64 and so is the sum; beyond, v is far outside any range.
        t = np.rint(v).astype(np.float64) + np.asarray(zero_point, dtype=np.int64)
        return np.asarray((t >= q_min) & (t <= q_max))


def quantize_backward(
    x: np.ndarray,
    grad_output: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | int,
    output: ElementKind,
    q_min: int,
    q_max: int,
    precision: MathPrecision,
) -> np.ndarray:
    """Straight-through gradient of :func:`quantize` w.r.t. ``x``, in ``grad_output``'s dtype:

    ``dx = dq / scale`` (IEEE division in the accumulator dtype, rounded once) where
    :func:`quantize_backward_mask` holds, else ``+0`` (also for a NaN or Inf ``dq``). ``dq`` is
    ``grad_output``, the gradient w.r.t. the codes as floats (``x``'s shape, unpacked for 4-bit codes).
    """
    acc = acc_dtype(precision)
    inside = quantize_backward_mask(x, scale, zero_point, output, q_min, q_max, precision)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        g = to_acc(grad_output, precision) / np.asarray(scale).astype(acc)
        return np.where(inside, g, acc.type(0)).astype(acc).astype(np.asarray(grad_output).dtype)


def dequantize_backward(grad_output: np.ndarray, scale: np.ndarray, precision: MathPrecision) -> np.ndarray:
    """Gradient of :func:`dequantize` w.r.t. the codes (as floats): ``dq = dy * scale`` in the
    accumulator dtype, rounded once to ``grad_output``'s dtype; no mask, no zero point.
    ``scale`` broadcasts against ``grad_output``."""
    acc = acc_dtype(precision)
    with np.errstate(over="ignore", invalid="ignore"):
        g = to_acc(grad_output, precision) * np.asarray(scale).astype(acc)
        return g.astype(acc).astype(np.asarray(grad_output).dtype)


# ---- ZeRO++ qgZ: swizzled quantization, dequantize-reduce, LoCo error feedback ---------------


def swizzle_order(nodes: int, devices_per_node: int, pipeline: int = 1) -> np.ndarray:
    """The slice permutation of swizzled quantization (DeepSpeed ZeRO++ ``swizzle_quant``).

    The flattened input is cut into ``nodes * devices_per_node * pipeline`` equal slices, slice
    ``z * pipeline + p`` being pipeline stage ``p`` of partition ``z = node * devices_per_node +
    device`` (the shard destined for global rank ``z``). The output orders the slices
    ``[pipeline][device][node]``: a (node, device) -> (device, node) transpose, pipeline stages
    outermost. Entry ``k`` of the returned int64 array is the input slice placed at output slice
    ``k``. Example: 2 nodes x 4 devices, pipeline 1 -> ``0 4 1 5 2 6 3 7``; with pipeline 2 ->
    ``0 8 2 10 4 12 6 14 1 9 3 11 5 13 7 15`` (stage 0 of partitions 0 4 1 5 2 6 3 7, then stage 1).
    """
    for name, value in (("nodes", nodes), ("devices_per_node", devices_per_node), ("pipeline", pipeline)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    index = np.arange(nodes * devices_per_node * pipeline, dtype=np.int64)
    return index.reshape(nodes, devices_per_node, pipeline).transpose(2, 1, 0).reshape(-1)


def swizzle(a: np.ndarray, nodes: int, devices_per_node: int, pipeline: int = 1) -> np.ndarray:
    """Reorder the leading axis of ``a`` in :func:`swizzle_order`'s slices (a contiguous copy).

    Axis 0 must split into ``nodes * devices_per_node * pipeline`` equal slices; the trailing
    axes travel with their rows. Codes (flat, or packed bytes whose slices are whole bytes) and
    per-group parameters go through the same permutation, so parameters stay in step with groups.
    """
    a = np.asarray(a)
    blocks = nodes * devices_per_node * pipeline
    if a.shape[0] % blocks:
        raise ValueError(f"axis 0 of extent {a.shape[0]} does not split into {blocks} equal slices")
    per = a.shape[0] // blocks
    view = a.reshape(nodes, devices_per_node, pipeline, per, *a.shape[1:])
    return np.ascontiguousarray(view.swapaxes(0, 2)).reshape(a.shape)


def loco_error_update(v: np.ndarray, dequantized: np.ndarray, error: np.ndarray, beta: float) -> np.ndarray:
    """LoCo error feedback: the new error buffer, in ``error``'s dtype (F16 / BF16 / F32).

    ``b = f32(beta)`` (rounded once), ``c = 1 - b`` (in float32), ``r = v - dequantized``, then
    ``e' = (b * e) + (c * r)``: every operation in float32, each rounded once (no fused
    multiply-add), and ``e'`` rounded once to the buffer's dtype. ``v`` is the value that was
    quantized (``x + e`` in float32) and ``dequantized`` its dequantization in float32. A NaN
    anywhere (a non-finite group has a NaN scale) gives a NaN error element.
    """
    err = np.asarray(error)
    b = np.float32(beta)
    c = np.float32(1) - b
    with np.errstate(over="ignore", invalid="ignore"):
        r = (np.asarray(v, np.float32) - np.asarray(dequantized, np.float32)).astype(np.float32)
        new = (b * err.astype(np.float32)).astype(np.float32) + (c * r).astype(np.float32)
        return new.astype(np.float32).astype(err.dtype)


def _loco_input(x: np.ndarray, error: np.ndarray | None) -> np.ndarray:
    """``v = x + e`` in float32 (each upcast exactly, one rounding), or ``x`` without error feedback."""
    if error is None:
        return x
    with np.errstate(over="ignore", invalid="ignore"):
        return (to_acc(x, MathPrecision.F32) + to_acc(error, MathPrecision.F32)).astype(np.float32)


def _dequantize_groups(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    kind: ElementKind,
    group_size: int,
    nibble_order: NibbleOrder,
) -> np.ndarray:
    """Flat float32 ``(q - zp) * scale`` (SPEC dequantize, not rounded further) of codes in groups of ``group_size``."""
    n = np.asarray(scale).size * group_size
    scope = GroupScope(axis=-1, group_size=group_size)
    s = expand_params(np.asarray(scale).reshape(-1), (n,), scope)
    zp: np.ndarray | int = 0 if zero_point is None else expand_params(np.asarray(zero_point).reshape(-1), (n,), scope)
    return dequantize(np.asarray(q).reshape(-1), s, zp, kind, ElementKind.F32, n, MathPrecision.F32, nibble_order)


def swizzled_quantize(
    x: np.ndarray,
    group_size: int,
    nodes: int,
    devices_per_node: int,
    pipeline: int,
    mode: QuantMode,
    output: ElementKind,
    q_min: int,
    q_max: int,
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST,
    error: np.ndarray | None = None,
    error_beta: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Group quantization in swizzled order: ``(q_storage, scale, zero_point, new_error)``.

    ``x`` (F16 / BF16 / F32, any shape) is flattened and cut into groups of ``group_size``
    contiguous elements; each group gets :func:`dynamic_range_params` (SPEC section 4, float32)
    and is quantized with them (:func:`dynamic_quantize`, rne; a non-finite group: scale NaN,
    zero point 0, codes 0). Codes and parameters are then reordered by :func:`swizzle` into
    ``[pipeline][device][node][group][E]`` and returned with shapes ``(pipeline,
    devices_per_node, nodes * slice)``: ``q_storage[p, d]`` is everything local device ``d``
    reduces at stage ``p``. 4-bit codes are packed two per byte along the flat swizzled stream in
    ``nibble_order``.

    With ``error`` (LoCo, same element count as ``x``, F16 / BF16 / F32, in ``x``'s order, not
    swizzled): ``v = x + e`` in float32 is quantized instead of ``x``, and ``new_error`` is
    :func:`loco_error_update` of ``v``, ``dequant(q)`` (SPEC dequantize in float32) and ``e``.

    Needs ``x.size % (nodes * devices_per_node * pipeline * group_size) == 0`` and, for 4-bit
    codes, an even slice ``x.size / (nodes * devices_per_node * pipeline)`` (ValueError).
    """
    xf = np.asarray(x).reshape(-1)
    n = xf.size
    blocks = nodes * devices_per_node * pipeline
    if group_size < 1 or n % (blocks * group_size):
        raise ValueError(f"{n} elements do not split into {blocks} slices of whole groups of {group_size}")
    if ELEMENTS[output].is_packed and (n // blocks) % 2:
        raise ValueError(f"4-bit codes need an even slice; {n} / {blocks} is odd")
    ef = None if error is None else np.asarray(error).reshape(-1)
    v = _loco_input(xf, ef)
    scope = GroupScope(axis=-1, group_size=group_size)
    q, scale, zp = dynamic_quantize(v, scope, mode, output, q_min, q_max, MathPrecision.F32, nibble_order)
    new_error = None
    if ef is not None:
        d = _dequantize_groups(q, scale, zp, output, group_size, nibble_order)
        new_error = loco_error_update(v, d, ef, error_beta).reshape(np.asarray(error).shape)

    def order(a: np.ndarray) -> np.ndarray:
        return swizzle(a, nodes, devices_per_node, pipeline).reshape(pipeline, devices_per_node, -1)

    return order(q), order(scale), None if zp is None else order(zp), new_error


def dequant_reduce(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray | None,
    input_kind: ElementKind,
    input_group_size: int,
    output: ElementKind,
    output_group_size: int | None,
    mode: QuantMode,
    q_min: int,
    q_max: int,
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST,
    average: bool = False,
    error: np.ndarray | None = None,
    error_beta: float = 0.0,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """Dequantize N peers' chunks, sum in float32, re-quantize: ``(q_storage, scale, zero_point, new_error)``.

    Float ``output`` (F16 / BF16 / F32): no re-quantization; returns ``(y, None, None, None)`` with
    ``y`` the float32 sum (averaged) rounded once to ``output`` (``output_group_size`` and
    ``error`` unused: ``error`` must be None).

    ``q``: ``(N, chunk)`` codes (``(N, chunk / 2)`` bytes for 4-bit ``input_kind``), chunk ``j``
    from peer ``j``; ``scale`` / ``zero_point``: ``(N, chunk / input_group_size)`` (zero point
    None for SYMMETRIC). Peer ``j`` is dequantized as SPEC section 4 says, ``y_j = (q - zp) *
    scale`` in float32 (not rounded to any narrower type); the sum is ``((y_0 + y_1) + y_2) + ...``
    in float32, peer 0 first, each addition rounded once; ``average`` then divides by ``N``
    (IEEE float32 division by ``float32(N)``, not a multiplication by ``1 / N``). With ``error``
    (LoCo, ``chunk`` elements): ``v = s + e`` in float32. ``v`` is re-quantized with fresh
    dynamic parameters per group of ``output_group_size`` (:func:`dynamic_quantize` with
    ``output``, ``mode``, ``q_min`` / ``q_max``); ``new_error`` is :func:`loco_error_update`.
    Outputs: codes ``(chunk,)`` (``(chunk / 2,)`` bytes for 4-bit ``output``), parameters
    ``(chunk / output_group_size,)``.
    """
    q = np.asarray(q)
    s = np.asarray(scale)
    if q.ndim != 2 or s.ndim != 2 or s.shape[0] != q.shape[0] or q.shape[0] < 1:
        raise ValueError(f"q {q.shape} and scale {s.shape} must be (N, ...) with the same N >= 1")
    peers = q.shape[0]
    chunk = s.shape[1] * input_group_size
    float_output = ELEMENTS[output].is_float
    if float_output:
        if error is not None:
            raise ValueError("a float output has no LoCo error feedback (nothing is re-quantized)")
    elif output_group_size is None or chunk % output_group_size:
        raise ValueError(f"output_group_size {output_group_size} does not divide the chunk of {chunk} elements")
    total: np.ndarray | None = None
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(peers):
            zp_j = None if zero_point is None else np.asarray(zero_point)[j]
            y = _dequantize_groups(q[j], s[j], zp_j, input_kind, input_group_size, nibble_order)
            total = y if total is None else (total + y).astype(np.float32)
        assert total is not None
        if average:
            total = (total / np.float32(peers)).astype(np.float32)
    if float_output:
        return total.astype(ELEMENTS[output].numpy_dtype), None, None, None
    assert output_group_size is not None
    ef = None if error is None else np.asarray(error).reshape(-1)
    v = _loco_input(total, ef)
    out_scope = GroupScope(axis=-1, group_size=output_group_size)
    q_out, scale_out, zp_out = dynamic_quantize(
        v, out_scope, mode, output, q_min, q_max, MathPrecision.F32, nibble_order
    )
    new_error = None
    if ef is not None:
        d = _dequantize_groups(q_out, scale_out, zp_out, output, output_group_size, nibble_order)
        new_error = loco_error_update(v, d, ef, error_beta).reshape(np.asarray(error).shape)
    return q_out, scale_out, zp_out, new_error
