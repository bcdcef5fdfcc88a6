"""DeepSpeed's quantizer formulas in NumPy: the reference paths of :mod:`quantplan.compat.deepspeed`.

These are DeepSpeed's numbers, not SPEC section 4's: a user who swaps the import gets the same
parameters and codes as DeepSpeed's CUDA quantizer (facts: ``DEEPSPEED_FORMAT.md``), computed in
float32 with IEEE division and round half to even, every operation rounded once (no fused
multiply-add). Where DeepSpeed is defective (see :mod:`quantplan.compat.deepspeed`) these
functions do the documented, fixed thing.

Layouts: a group is ``E = numel / groups`` contiguous elements of the flat tensor; parameters
are float32 ``[groups, 1]`` (symmetric: the stored ``1 / scale``) or ``[groups, 2]``
(asymmetric: ``1 / scale`` and the midpoint ``offset``, interleaved); 4-bit codes are signed
nibbles packed two per byte along the flat stream, element ``2i`` in the high nibble.
"""

from __future__ import annotations

import numpy as np

from quantplan import reference
from quantplan.vocabulary.types import NibbleOrder, QuantMode

_F32 = np.float32


def code_bounds(bits: int) -> tuple[int, int]:
    """DeepSpeed's signed code range of ``bits`` bits: ``[-2**(bits-1), 2**(bits-1) - 1]``."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def params_per_group(mode: QuantMode) -> int:
    """Stored parameters per group: 1 (``1 / scale``) or 2 (``1 / scale``, ``offset``)."""
    return 1 if mode is QuantMode.SYMMETRIC else 2


def group_params(v: np.ndarray, bits: int, mode: QuantMode) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """DeepSpeed's per-group quantization parameters of float32 ``v`` (``(groups, E)``).

    Returns ``(scale, offset, bad)``: the multiplier ``scale`` (float32, ``(groups, 1)``), the
    midpoint ``offset`` (``(groups, 1)``, None for SYMMETRIC) and a boolean ``(groups,)`` mask of
    groups whose statistics are not finite.

    * SYMMETRIC: ``scale = 2**bits / (2 * absmax)``, evaluated as ``2**(bits-1) / absmax`` (the
      same float32 quotient bit for bit, since halving numerator and denominator is exact, and
      no overflow of ``2 * absmax``); ``absmax == 0`` -> ``scale = 1``.
    * ASYMMETRIC: ``scale = 2**bits / (max - min)`` (``max == min`` -> 1) and ``offset = (max + min) / 2``,
      over the group's own elements (no padding lanes, no forced zero).
    * ``bad``: a group holding NaN or +-Inf, or whose ``max - min`` / ``max + min`` overflows float32.
    """
    bad = ~np.isfinite(v).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mode is QuantMode.SYMMETRIC:
            absmax = np.max(np.abs(v), axis=1, keepdims=True, initial=0.0).astype(_F32)
            scale = np.where(absmax == 0, _F32(1), _F32(1 << (bits - 1)) / absmax).astype(_F32)
            return scale, None, bad
        hi = np.max(v, axis=1, keepdims=True, initial=-np.inf).astype(_F32)
        lo = np.min(v, axis=1, keepdims=True, initial=np.inf).astype(_F32)
        span = (hi - lo).astype(_F32)
        scale = np.where(span == 0, _F32(1), _F32(1 << bits) / span).astype(_F32)
        offset = ((hi + lo).astype(_F32) / _F32(2)).astype(_F32)
        bad = bad | ~np.isfinite(span[:, 0]) | ~np.isfinite(offset[:, 0])
    return scale, offset, bad


def group_quantize(v: np.ndarray, bits: int, mode: QuantMode) -> tuple[np.ndarray, np.ndarray]:
    """DeepSpeed's group quantization of float32 ``v`` (``(groups, E)``): ``(codes int32, params)``.

    SYMMETRIC ``q = clamp(rne(v * scale), -2**(b-1), 2**(b-1) - 1)``, stored ``[1 / scale]``;
    ASYMMETRIC ``q = clamp(rne((v - offset) * scale), ...)``, stored ``[1 / scale, offset]``
    (float32, each operation rounded once). A ``bad`` group (see :func:`group_params`) gets NaN
    parameters and codes 0, so it dequantizes to NaN: visible, never garbage.
    """
    scale, offset, bad = group_params(v, bits, mode)
    lo, hi = code_bounds(bits)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        centered = v if offset is None else (v - offset).astype(_F32)
        codes = reference.round_and_clamp((centered * scale).astype(_F32), 0, lo, hi)
        stored = (_F32(1) / scale).astype(_F32)
    codes[bad] = 0
    params = stored if offset is None else np.concatenate([stored, offset], axis=1)
    params = params.astype(_F32)
    params[bad] = np.nan
    return codes, params


def group_dequantize(codes: np.ndarray, params: np.ndarray, mode: QuantMode) -> np.ndarray:
    """DeepSpeed's dequantization in float32: ``q * p0`` (SYMMETRIC) or ``(q * p0) + p1``
    (ASYMMETRIC; two roundings, no FMA), ``codes`` ``(groups, E)``, ``params`` ``(groups, 1|2)``."""
    p = np.asarray(params, _F32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = (np.asarray(codes).astype(_F32) * p[:, :1]).astype(_F32)
        if mode is QuantMode.ASYMMETRIC:
            y = (y + p[:, 1:2]).astype(_F32)
    return y


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Flat int codes -> DeepSpeed storage bytes (uint8): int8 two's complement, or 4-bit signed
    nibbles with element ``2i`` in the high nibble."""
    flat = np.asarray(codes).reshape(-1)
    if bits == 4:
        return reference.pack_nibbles(flat, NibbleOrder.HIGH_FIRST)
    return flat.astype(np.int8).view(np.uint8)


def unpack_codes(storage: np.ndarray, numel: int, bits: int) -> np.ndarray:
    """DeepSpeed storage bytes -> flat int32 codes (inverse of :func:`pack_codes`)."""
    raw = np.asarray(storage).reshape(-1).view(np.uint8)
    if bits == 4:
        return reference.unpack_nibbles(raw, numel, True, NibbleOrder.HIGH_FIRST)
    return raw.view(np.int8).astype(np.int32)


def _loco_input(x: np.ndarray, error: np.ndarray | None) -> np.ndarray:
    xf = np.asarray(x).reshape(-1).astype(_F32)
    if error is None:
        return xf
    with np.errstate(over="ignore", invalid="ignore"):
        return (xf + np.asarray(error).reshape(-1).astype(_F32)).astype(_F32)


def _quantize_with_error(
    x: np.ndarray, groups: int, bits: int, mode: QuantMode, error: np.ndarray | None, error_beta: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(codes, params, new_error)``: ``v = x`` (``x + e`` with ``error``) quantized in ``groups``
    groups (:func:`group_quantize`); with ``error``, ``new_error`` is
    :func:`quantplan.reference.loco_error_update` of ``v`` and its DeepSpeed dequantization, in
    ``error``'s dtype and shape."""
    v = _loco_input(x, error)
    codes, params = group_quantize(v.reshape(groups, v.size // groups), bits, mode)
    if error is None:
        return codes, params, None
    d = group_dequantize(codes, params, mode).reshape(-1)
    err = np.asarray(error)
    return codes, params, reference.loco_error_update(v, d, err.reshape(-1), error_beta).reshape(err.shape)


def swizzled_quantize(
    x: np.ndarray,
    groups: int,
    bits: int,
    mode: QuantMode,
    nodes: int = 1,
    devices_per_node: int = 1,
    pipeline: int = 1,
    error: np.ndarray | None = None,
    error_beta: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """DeepSpeed ``quantize`` / ``swizzle_quant`` / ``loco_swizzle_quant``: ``(storage, params, new_error)``.

    ``v = x`` (or ``x + e`` in float32 with ``error``) is cut into ``groups`` groups and quantized
    with :func:`group_quantize`; codes (flat) and parameter rows are then put in swizzled order
    (:func:`quantplan.reference.swizzle`; identity for 1 node x 1 device x 1 stage) and the codes
    packed (:func:`pack_codes`). ``storage`` is flat uint8, ``params`` ``(groups, 1|2)`` float32.
    ``new_error`` (with ``error``): :func:`quantplan.reference.loco_error_update` of ``v``, its
    DeepSpeed dequantization and ``e``, in ``error``'s dtype and shape (input order).
    """
    codes, params, new_error = _quantize_with_error(x, groups, bits, mode, error, error_beta)
    codes = reference.swizzle(codes.reshape(-1), nodes, devices_per_node, pipeline)
    params = reference.swizzle(params, nodes, devices_per_node, pipeline)
    return pack_codes(codes, bits), params, new_error


def dequantize(
    storage: np.ndarray, params: np.ndarray, numel: int, groups: int, bits: int, mode: QuantMode
) -> np.ndarray:
    """DeepSpeed ``dequantize``: flat float32 values of ``numel`` packed codes (see :func:`group_dequantize`)."""
    codes = unpack_codes(storage, numel, bits).reshape(groups, numel // groups)
    return group_dequantize(codes, np.asarray(params).reshape(groups, -1), mode).reshape(-1)


def quantized_reduction(
    storage: np.ndarray,
    params: np.ndarray,
    numel: int,
    in_groups: int,
    out_groups: int,
    bits: int,
    mode: QuantMode,
    devices_per_node: int,
    error: np.ndarray | None = None,
    error_beta: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """DeepSpeed ``quantized_reduction`` / ``loco_quantized_reduction``: ``(storage, params, new_error)``.

    The input holds ``devices_per_node`` chunks of ``numel / dpn`` codes, chunk ``j`` using
    parameter rows ``[j * in_groups / dpn, (j + 1) * in_groups / dpn)``. Each chunk is dequantized
    (:func:`group_dequantize`, float32), the chunks are summed in float32 in peer order
    (``((y_0 + y_1) + y_2) + ...``; DeepSpeed sums in fp16), not averaged, ``e`` added with
    ``error`` (float32), and the result re-quantized with :func:`group_quantize` in
    ``out_groups`` groups. ``new_error``: :func:`quantplan.reference.loco_error_update`.
    """
    chunk = numel // devices_per_node
    codes = unpack_codes(storage, numel, bits).reshape(devices_per_node, chunk)
    rows = np.asarray(params, _F32).reshape(devices_per_node, in_groups // devices_per_node, -1)
    total: np.ndarray | None = None
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(devices_per_node):
            g = rows.shape[1]
            y = group_dequantize(codes[j].reshape(g, chunk // g), rows[j], mode).reshape(-1)
            total = y if total is None else (total + y).astype(_F32)
    assert total is not None
    out_codes, out_params, new_error = _quantize_with_error(total, out_groups, bits, mode, error, error_beta)
    return pack_codes(out_codes, bits), out_params, new_error


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: round half away from zero (exact: the fraction of a float32 is exact)."""
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(np.where(a - f >= 0.5, f + 1, f), v).astype(v.dtype)


def moq_fake_quantize(
    x: np.ndarray, groups: int, bits: int, mode: QuantMode, uniform: np.ndarray | None = None
) -> np.ndarray:
    """DeepSpeed MoQ fake quantization (``ds_quantize_*``, ``ds_sr_quantize_*``): values in ``x``'s dtype.

    Per group of ``E = numel / groups`` elements, in float32, each operation rounded once:

    * SYMMETRIC: ``scale = 2**b / ((2 * absmax) + 1e-5)``; ``w = x * scale``; nearest:
      ``q = rne(w)``; stochastic: ``t = trunc(w)``, ``q = t + sign(w) * (u < |w - t|)`` (one step
      away from zero with probability equal to the fraction); then ``q`` clamped to
      ``[-2**(b-1), 2**(b-1) - 1]`` and ``x <- q / scale``.
    * ASYMMETRIC: ``step = ((max - min) + 1e-5) / 2**b``; ``w = (x - min) / step``; nearest:
      ``q = round_half_away(w)``; stochastic: ``q = floor(w) + (u < w - floor(w))``; no clamp
      (as DeepSpeed: the group maximum may reach code ``2**b``); ``x <- (q * step) + min``.
    * A group holding NaN or +-Inf (or whose statistics overflow float32) comes out all NaN.

    ``uniform``: one ``u`` in [0, 1) per element (flat order), e.g. Philox as SPEC section 4.
    """
    xs = np.asarray(x)
    v = xs.reshape(groups, -1).astype(_F32)
    bad = ~np.isfinite(v).all(axis=1)
    u = None if uniform is None else np.asarray(uniform).reshape(v.shape).astype(_F32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if mode is QuantMode.SYMMETRIC:
            absmax = np.max(np.abs(v), axis=1, keepdims=True, initial=0.0).astype(_F32)
            den = ((_F32(2) * absmax).astype(_F32) + _F32(1e-5)).astype(_F32)
            scale = (_F32(1 << bits) / den).astype(_F32)
            w = (v * scale).astype(_F32)
            if u is None:
                q = np.rint(w)
            else:
                t = np.trunc(w)
                q = (t + np.sign(w) * (u < np.abs(w - t))).astype(_F32)
            lo, hi = code_bounds(bits)
            q = np.clip(q, lo, hi).astype(_F32)
            y = (q / scale).astype(_F32)
            bad = bad | ~np.isfinite(den[:, 0])
        else:
            hi_v = np.max(v, axis=1, keepdims=True, initial=-np.inf).astype(_F32)
            lo_v = np.min(v, axis=1, keepdims=True, initial=np.inf).astype(_F32)
            step = (((hi_v - lo_v).astype(_F32) + _F32(1e-5)).astype(_F32) / _F32(1 << bits)).astype(_F32)
            w = ((v - lo_v).astype(_F32) / step).astype(_F32)
            if u is None:
                q = _round_half_away(w)
            else:
                f = np.floor(w)
                q = (f + (u < (w - f))).astype(_F32)
            y = ((q * step).astype(_F32) + lo_v).astype(_F32)
            bad = bad | ~np.isfinite(step[:, 0])
    y[bad] = np.nan
    return y.reshape(xs.shape).astype(xs.dtype)


__all__ = [
    "code_bounds",
    "dequantize",
    "group_dequantize",
    "group_params",
    "group_quantize",
    "moq_fake_quantize",
    "pack_codes",
    "params_per_group",
    "quantized_reduction",
    "swizzled_quantize",
    "unpack_codes",
]
