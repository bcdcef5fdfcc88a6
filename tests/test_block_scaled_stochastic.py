"""CPU: NVFP4 stochastic rounding's kernel side without a GPU.

* the f32 steps of the kernel's encoder (``nvfp4_sr_nibble`` in ``kernels/qp_block_scaled.cuh``),
  replayed in NumPy, equal the reference's §1.6 rounding (``encode_elements_stochastic``) on every
  binade, grid points and their neighbours, ties of the comparison u < frac (on the lattice of u
  and off it), saturation and signed zeros;
* the launcher's seed / offset arguments and its refusals, before any launch;
* the instantiation list holds the stochastic twin of every NVFP4 schedule.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from quantplan.reference.block_scaled import encode_elements_stochastic
from quantplan.runtime import _block_scaled_kernels as bk
from quantplan.vocabulary.errors import InvalidProblem, Unsupported


def _f(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _round_f32(exact: np.ndarray, mode: str) -> np.ndarray:
    """float64 values (exact) rounded to float32 upward ("ru") or toward zero ("rz", "rd" on values >= 0)."""
    r = exact.astype(np.float32)
    if mode == "ru":
        r = np.where(r.astype(np.float64) < exact, np.nextafter(r, np.float32(np.inf)), r)
    else:
        r = np.where(r.astype(np.float64) > exact, np.nextafter(r, np.float32(0)), r)
    return r.astype(np.float32)


def kernel_encode(v: np.ndarray, word: np.ndarray) -> np.ndarray:
    """The kernel's encoder (``nvfp4_sr_nibble``) step by step: each f32 operation in float64, where
    its exact result is representable (products by powers of two; the fma's product and sum span at
    most 28 bits), then rounded to float32 in the instruction's direction."""
    v = np.asarray(v, np.float32)
    nw = ~np.asarray(word, np.uint32)
    a = np.minimum(np.abs(v), np.float32(6.0))
    b = _round_f32(a.astype(np.float64) * 2.0**-124, "ru")
    step = _f(np.maximum(_bits(a), np.uint32(0x3F800000)) & np.uint32(0x7F800000))
    y = _round_f32(_f(nw >> np.uint32(8)).astype(np.float64) * step.astype(np.float64) + b.astype(np.float64), "rd")
    d = _round_f32(y.astype(np.float64) * 0.25, "rz")
    nibble = (_bits(d) << np.uint32(6)) | (_bits(v) & np.uint32(0x80000000))
    return (nibble >> np.uint32(28)).astype(np.uint8)


def _reference(v: np.ndarray, word: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):  # frac of saturating values, discarded
        return encode_elements_stochastic(v, (word >> np.uint32(8)).astype(np.float64) * 2.0**-24, "e2m1")


def test_kernel_encoder_equals_reference(rng: np.random.Generator) -> None:
    n = 200_000
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
    neighbours = np.concatenate([np.nextafter(grid, np.float32(np.inf)), np.nextafter(grid, np.float32(0))])
    mags = np.concatenate(
        [
            rng.uniform(0, 7, n).astype(np.float32),
            np.exp2(rng.uniform(-149, 4, n)).astype(np.float32),  # every binade, f32 subnormals included
            np.repeat(np.concatenate([grid, neighbours]).astype(np.float32), 32),
            np.array([6.5, 7, 1e30, 3.4028235e38, np.inf, 1e-45, 2**-126], np.float32),
        ]
    )
    v = np.where(rng.random(mags.size) < 0.5, -mags, mags).astype(np.float32)
    v = np.concatenate([v, np.array([0.0, -0.0], np.float32)])
    words = rng.integers(0, 2**32, v.size, dtype=np.uint64).astype(np.uint32)
    words[:500] = 0
    words[500:1000] = 0xFFFFFFFF
    np.testing.assert_array_equal(kernel_encode(v, words), _reference(v, words))


def test_kernel_encoder_ties_of_the_comparison(rng: np.random.Generator) -> None:
    """u just below, at and just above frac, for frac on the 2**-24 lattice (|v| from 2**-2 up) and
    off it (|v| below 2**-2, where frac * 2**24 has a fraction: u < frac iff u < ceil(frac))."""
    a = np.concatenate(
        [
            rng.integers(0, 6 * 2**22, 100_000) * 2.0**-22,  # every binade's lattice
            rng.integers(0, 2**24, 100_000) * 2.0**-25,  # below 0.5, on the 2**-25 lattice of u * step
            rng.integers(0, 2**24, 100_000) * 2.0**-49,  # below 2**-25: frac far off the lattice
            rng.integers(1, 2**23, 100_000) * 2.0**-149,  # f32 subnormals
        ]
    ).astype(np.float32)
    step = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    frac = (a.astype(np.float64) - np.floor(a / step) * step) / step
    at = (np.ceil(frac * 2**24).astype(np.int64) << 8).clip(0, 2**32 - 1)
    low = rng.integers(0, 256, a.size)  # the 8 bits u ignores
    words = [((at + d).clip(0, 2**32 - 256) | low).astype(np.uint32) for d in (-512, -256, 0, 256)]
    for w in words:
        np.testing.assert_array_equal(kernel_encode(a, w), _reference(a, w))
    assert np.any(kernel_encode(a, words[1]) != kernel_encode(a, words[2]))


def test_rng_arguments() -> None:
    assert bk.rng_arguments(5, 2**64 - 1) == (0, 0, 5, 2**64 - 1)
    assert bk.rng_arguments(np.uint64(7), np.int64(3)) == (0, 0, 7, 3)
    seed = SimpleNamespace(data=SimpleNamespace(ptr=4096), dtype=np.dtype(np.int64), size=1)
    offset = SimpleNamespace(data=SimpleNamespace(ptr=8192), dtype=np.dtype(np.int64), size=1)
    assert bk.rng_arguments(seed, offset) == (4096, 8192, 0, 0)
    assert bk.rng_arguments(seed, 11) == (4096, 0, 0, 11)
    for bad in (-1, 2**64, 1.5, True, "1"):
        with pytest.raises(InvalidProblem, match="seed"):
            bk.rng_arguments(bad, 0)
    wrong = SimpleNamespace(data=SimpleNamespace(ptr=4096), dtype=np.dtype(np.int32), size=1)
    with pytest.raises(InvalidProblem, match="offset"):
        bk.rng_arguments(0, wrong)


def test_launcher_refusals_before_launch() -> None:
    x = np.zeros((2, 32), np.float16)
    with pytest.raises(Unsupported, match="NVFP4 only"):
        bk.quantize_block_scaled(x, element="e2m1", block=32, rounding="stochastic")
    with pytest.raises(InvalidProblem, match="rounding"):
        bk.quantize_block_scaled(x, element="nvfp4", block=16, rule="te", rounding="up")
    with pytest.raises(InvalidProblem, match="element"):
        bk.quantize_block_scaled(x, element="nvfp4_sr", block=16, rule="te")
    with pytest.raises(InvalidProblem, match="offset"):
        bk.quantize_block_scaled(x, element="nvfp4", block=16, rule="te", rounding="stochastic", offset=-1)


def test_instantiations_hold_the_stochastic_twins() -> None:
    names = set(bk.instantiations())
    for key, sched in bk.SCHEDULES.items():
        contiguous, block, _ = key
        if block != 16:
            continue
        sr_sched = bk.STOCHASTIC_SCHEDULES.get(key, sched)
        for dtype in bk.INPUT_TAGS:
            nearest = bk.kernel_name(dtype, "nvfp4", 16, False, contiguous, sched)
            stochastic = bk.kernel_name(dtype, "nvfp4_sr", 16, False, contiguous, sr_sched)
            assert {nearest, stochastic} <= names
            twin = bk.kernel_name(dtype, "nvfp4", 16, False, contiguous, sr_sched)
            assert stochastic == twin.replace("qp::nv_e2m1,", "qp::nv_e2m1_sr,")
