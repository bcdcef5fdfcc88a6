"""CPU: NVFP4 stochastic rounding's kernel side without a GPU.

* the f32 steps of the kernel's encoder (``nvfp4_encode_stochastic`` in
  ``kernels/qp_block_scaled.cuh``), replayed in NumPy, equal the reference's §1.6 rounding
  (``encode_elements_stochastic``) on every binade, grid points and their neighbours, ties of the
  comparison u < frac, saturation and signed zeros;
* the launcher's seed / offset arguments and its refusals, before any launch;
* the instantiation list holds the stochastic twin of every NVFP4 schedule.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from quantplan import _block_scaled_kernels as bk
from quantplan.errors import InvalidProblem, Unsupported
from quantplan.reference_block_scaled import encode_elements_stochastic


def _f(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def kernel_encode(v: np.ndarray, word: np.ndarray) -> np.ndarray:
    """The kernel's encoder step by step in f32 (fl_rz(a + M) written as M + floor(a / step) * step,
    exact in float64: the definition of rounding toward zero at M's ulp)."""
    ux = _bits(v)
    a = np.minimum(np.abs(np.asarray(v, np.float32)), np.float32(6.0))
    e = np.maximum(_bits(a), np.uint32(0x3F800000)) & np.uint32(0x7F800000)
    magic = _f(e + np.uint32(22 << 23))
    step = magic.astype(np.float64) * 2.0**-23
    total = magic.astype(np.float64) + np.floor(a.astype(np.float64) / step) * step
    sum_rz = total.astype(np.float32)
    assert np.array_equal(sum_rz.astype(np.float64), total)  # representable: no second rounding
    rest = a - (sum_rz - magic)
    frac24 = rest * _f(np.uint32(0x8B800000) - e)
    up = _bits((np.asarray(word, np.uint32) >> np.uint32(8)).astype(np.float32) - frac24) >> np.uint32(31)
    code = (_bits(sum_rz) - e + np.uint32((-(22 << 23) - 254) & 0xFFFFFFFF)) + (e >> np.uint32(22)) + up
    return ((code | ((ux >> np.uint32(28)) & np.uint32(8))) & np.uint32(0xFF)).astype(np.uint8)


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
    """u == frac rounds down, one step of u below rounds up (frac on the 2**-24 lattice)."""
    a = (rng.integers(0, 6 * 2**22, 100_000) * 2.0**-22).astype(np.float32)
    step = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    frac = (a - np.floor(a / step) * step) / step
    word = ((frac * 2**24).astype(np.uint64) << np.uint64(8)).astype(np.uint32)
    word |= rng.integers(0, 256, a.size).astype(np.uint32)  # the 8 bits u ignores
    for w in (word, word - np.uint32(256) * (word >= 256)):
        got = kernel_encode(a, w)
        np.testing.assert_array_equal(got, _reference(a, w))
    assert np.any(kernel_encode(a, word) != kernel_encode(a, word - np.uint32(256) * (word >= 256)))


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
