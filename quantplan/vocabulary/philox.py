"""Philox4x32-10 in NumPy and the per-element uniform stream of stochastic rounding (SPEC section 4).

Philox4x32-R is the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel Random
Numbers: As Easy as 1, 2, 3" (SC'11), as defined by the Random123 library: a 128-bit counter
``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)``; each of the R rounds computes

    (hi0, lo0) = mulhilo(0xD2511F53, c0)
    (hi1, lo1) = mulhilo(0xCD9E8D57, c2)
    (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

and between rounds the key is bumped by the Weyl constants, ``k0 += 0x9E3779B9``,
``k1 += 0xBB67AE85`` (mod 2**32). ``mulhilo`` is the full 64-bit product split into its high and
low 32-bit words; here it is computed exactly in uint64.

The stochastic-rounding stream (:func:`uniform_for_elements`) gives flat element ``i`` of a run
the uniform ``u = (word >> 8) * 2**-24`` in [0, 1), where ``word`` is output word ``i % 4`` of
Philox4x32-10 with key ``(seed low 32, seed high 32)`` and counter
``(j low 32, j high 32, offset low 32, offset high 32)``, ``j = i // 4``. The CUDA kernels draw
the same numbers, so stochastic rounding is reproducible from ``(seed, offset)`` on any device.
"""

from __future__ import annotations

import numbers

import numpy as np

PHILOX_M4x32_0 = 0xD2511F53
PHILOX_M4x32_1 = 0xCD9E8D57
PHILOX_W32_0 = 0x9E3779B9
PHILOX_W32_1 = 0xBB67AE85
#: Scale of the 24-bit uniforms: ``u = (word >> 8) * UNIFORM_STEP``.
UNIFORM_STEP = 2.0**-24

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def _mulhilo(multiplier: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high word, low word) of ``multiplier * x`` for uint64 arrays holding 32-bit values."""
    product = np.uint64(multiplier) * x  # < 2**64: exact
    return product >> _SHIFT32, product & _MASK32


def _philox4x32(counter: np.ndarray, key: np.ndarray, rounds: int) -> np.ndarray:
    """Philox4x32 with ``rounds`` rounds (Random123's key schedule); see :func:`philox4x32_10`."""
    ctr = np.asarray(counter)
    k = np.asarray(key)
    if ctr.ndim != 2 or ctr.shape[1] != 4:
        raise ValueError(f"counter must have shape (N, 4), got {ctr.shape}")
    if k.shape not in ((2,), (ctr.shape[0], 2)):
        raise ValueError(f"key must have shape (2,) or ({ctr.shape[0]}, 2) to match the counter, got {k.shape}")
    for name, arr in (("counter", ctr), ("key", k)):
        if arr.dtype != np.uint32:
            raise ValueError(f"{name} must be uint32, got {arr.dtype}; convert with .astype(np.uint32)")
    c0, c1, c2, c3 = (ctr[:, w].astype(np.uint64) for w in range(4))
    k0 = k[..., 0].astype(np.uint64)
    k1 = k[..., 1].astype(np.uint64)
    for r in range(rounds):
        if r:
            k0 = (k0 + np.uint64(PHILOX_W32_0)) & _MASK32
            k1 = (k1 + np.uint64(PHILOX_W32_1)) & _MASK32
        hi0, lo0 = _mulhilo(PHILOX_M4x32_0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M4x32_1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 of each counter: ``counter`` (N, 4) uint32, ``key`` (2,) or (N, 2) uint32 -> (N, 4) uint32.

    Word order as Random123's ``philox4x32(ctr, key)``: ``counter[:, 0]`` is ``ctr.v[0]``,
    ``key[..., 0]`` is ``key.v[0]``; output word ``w`` is ``out.v[w]``.
    """
    return _philox4x32(counter, key, 10)


def _check_u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer in [0, 2**64), got {value!r} ({type(value).__name__})")
    v = int(value)
    if not 0 <= v < 2**64:
        raise ValueError(f"{name} must be in [0, 2**64), got {v}; reduce it modulo 2**64")
    return v


def uniform_for_elements(count: int, seed: int, offset: int, start: int = 0) -> np.ndarray:
    """Uniforms ``u`` in [0, 1) of flat elements ``start .. start + count - 1`` (float64, shape (count,)).

    Element ``i`` uses output word ``i % 4`` of Philox4x32-10 with key ``(seed & 0xFFFFFFFF,
    seed >> 32)`` and counter ``(j & 0xFFFFFFFF, j >> 32, offset & 0xFFFFFFFF, offset >> 32)``,
    ``j = i // 4``, and ``u = (word >> 8) * 2**-24``. Values are multiples of 2**-24 below 1, so
    they are exact in float32 as well. ``seed`` and ``offset`` are integers in [0, 2**64)
    (ValueError otherwise); ``start + count`` must not exceed 2**64.

    A tensor of shape ``s`` draws ``uniform_for_elements(prod(s), seed, offset).reshape(s)``:
    element index ``i`` is the flat C-order index of the logical tensor (4-bit codes unpacked).
    """
    seed = _check_u64("seed", seed)
    offset = _check_u64("offset", offset)
    count = _check_u64("count", count)
    start = _check_u64("start", start)
    if start + count > 2**64:
        raise ValueError(f"start + count = {start + count} exceeds 2**64 element indices")
    if count == 0:
        return np.zeros(0, np.float64)
    first_block = start // 4
    n_blocks = (start + count - 1) // 4 - first_block + 1
    j = np.uint64(first_block) + np.arange(n_blocks, dtype=np.uint64)
    counter = np.empty((n_blocks, 4), np.uint32)
    counter[:, 0] = (j & _MASK32).astype(np.uint32)
    counter[:, 1] = (j >> _SHIFT32).astype(np.uint32)
    counter[:, 2] = offset & 0xFFFFFFFF
    counter[:, 3] = offset >> 32
    key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32)
    words = philox4x32_10(counter, key).reshape(-1)
    first = start % 4
    words = words[first : first + count]
    return (words >> np.uint32(8)).astype(np.float64) * UNIFORM_STEP


__all__ = [
    "PHILOX_M4x32_0",
    "PHILOX_M4x32_1",
    "PHILOX_W32_0",
    "PHILOX_W32_1",
    "UNIFORM_STEP",
    "philox4x32_10",
    "uniform_for_elements",
]
