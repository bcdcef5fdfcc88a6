"""GPU: NVFP4 with stochastic rounding (``kernels/block_scaled.cu``, element ``nv_e2m1_sr``) equals
the reference (``reference_block_scaled.nvfp4_quantize(rounding="stochastic")``, MICROSCALING §1.6)
bit for bit: codes and scales, on ragged shapes (partial last blocks, odd FP4 rows, N-D), every
schedule row of blocks of 16, misaligned operands, non-finite / zero / tiny blocks, several seeds
and offsets (beyond 2**32 too), given as integers or as one-element device int64 arrays.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import to_device

from quantplan.vocabulary.philox import uniform_for_elements

pytestmark = pytest.mark.gpu

rbs = pytest.importorskip("quantplan.reference.block_scaled")

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32]
SHAPES = [(4, 64), (3, 100), (2, 5, 48), (1, 15), (130, 33), (7, 4099), (64, 4096)]
RNG_PAIRS = [(0, 0), (1234, 5), (2**40 + 3, 2**33 + 7), (2**64 - 1, 2**64 - 1)]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Normal data whose blocks of 16 span many decades, with special blocks in the first rows."""
    x = rng.standard_normal(shape).astype(np.float64)
    flat = x.reshape(-1, shape[-1])
    nb = -(-shape[-1] // 16)
    lo, hi = (-12, 12) if dtype is np.float16 else (-60, 60)
    flat *= np.repeat(np.exp2(rng.integers(lo, hi, size=(flat.shape[0], nb)).astype(np.float64)), 16, axis=1)[
        :, : shape[-1]
    ]
    rows, cols = flat.shape
    if rows > 0 and cols > 3:
        flat[0, 1] = np.nan
    if rows > 1 and cols > 3:
        flat[1, 2] = -np.inf
    if rows > 2:
        flat[2, :16] = 0.0
        flat[2, 16:32] = -0.0
    if rows > 3 and cols > 8:
        flat[3, :16] = rng.standard_normal(min(16, cols)) * (2.0**-130 if dtype is np.float32 else 2.0**-20)
    with np.errstate(over="ignore"):
        return flat.reshape(shape).astype(dtype)


def _run(x: np.ndarray, misaligned: bool = False, **kw):  # noqa: ANN202
    import cupy

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    dtype = "bfloat16" if x.dtype == ml_dtypes.bfloat16 else str(x.dtype)
    xd = to_device(x)
    if misaligned:  # the same values one element into a larger buffer: the general schedule
        big = cupy.empty(xd.size + 1, xd.dtype)
        big[1:] = xd.ravel()
        xd = big[1:].reshape(xd.shape)
    codes, scales = quantize_block_scaled(
        xd, input_dtype=dtype, element="nvfp4", block=16, rule="te", rounding="stochastic", **kw
    )
    cupy.cuda.get_current_stream().synchronize()
    return codes.get(), scales.get()


def _assert_same(got: tuple[np.ndarray, np.ndarray], ref, what: str) -> None:  # noqa: ANN001
    codes, scales = got
    np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes, err_msg=f"codes {what}")
    np.testing.assert_array_equal(scales.reshape(ref.scales.shape), ref.scales, err_msg=f"scales {what}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("amax_mode", ["given", "compute", "one_level"])
def test_nvfp4_stochastic_matches_reference(rng: np.random.Generator, dtype: type, amax_mode: str) -> None:
    import cupy

    for shape in SHAPES:
        x = _data(rng, shape, dtype)
        seed, offset = RNG_PAIRS[int(rng.integers(len(RNG_PAIRS)))]
        sr = {"rounding": "stochastic", "seed": seed, "offset": offset}
        if amax_mode == "given":
            finite = x.astype(np.float32)[np.isfinite(x.astype(np.float32))]
            amax = np.float32(np.abs(finite).max() * 0.75)
            ref = rbs.nvfp4_quantize(x, global_amax=float(amax), **sr)
            kw = {"tensor_amax": cupy.asarray(np.array([amax], np.float32))}
        elif amax_mode == "compute":
            ref = rbs.nvfp4_quantize(x, **sr)
            kw = {}
        else:
            ref = rbs.nvfp4_quantize(x, two_level=False, **sr)
            kw = {"tensor_amax": None}
        _assert_same(_run(x, seed=seed, offset=offset, **kw), ref, f"{shape} seed {seed} offset {offset}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("seed_offset", RNG_PAIRS, ids=str)
def test_every_schedule_and_misaligned(rng: np.random.Generator, dtype: type, seed_offset: tuple[int, int]) -> None:
    """Each schedule row of blocks of 16 and each stochastic candidate schedule (two or four whole
    blocks per thread on a persistent grid) forced on the same data, and the general schedule on
    misaligned operands."""
    from quantplan.runtime import _block_scaled_kernels as bk

    seed, offset = seed_offset
    shape = (48, 1024)
    x = _data(rng, shape, dtype)
    ref = rbs.nvfp4_quantize(x, rounding="stochastic", seed=seed, offset=offset)
    scheds = [s for (contiguous, block, _), s in bk.SCHEDULES.items() if block == 16 and contiguous]
    scheds += [*bk.STOCHASTIC_SCHEDULES.values(), *bk.STOCHASTIC_CANDIDATES]  # the probe's candidates too
    for sched in scheds:
        _assert_same(_run(x, seed=seed, offset=offset, schedule=sched), ref, f"schedule {sched}")
    for shape in [(64, 128), (129, 96), (5, 70), (3, 7)]:
        x = _data(rng, shape, dtype)
        ref = rbs.nvfp4_quantize(x, rounding="stochastic", seed=seed, offset=offset)
        _assert_same(_run(x, misaligned=True, seed=seed, offset=offset), ref, f"misaligned {shape}")


def test_device_seed_and_offset(rng: np.random.Generator) -> None:
    """seed and offset as one-element int64 device arrays: read at launch, so a new value on the
    device gives the reference's codes for that value with no new host arguments."""
    import cupy

    x = _data(rng, (33, 272), ml_dtypes.bfloat16)
    seed = cupy.asarray(np.array([987654321], np.int64))
    offset = cupy.asarray(np.array([3], np.int64))
    for value in (3, 4, 2**35 + 1):
        offset[0] = value
        ref = rbs.nvfp4_quantize(x, rounding="stochastic", seed=987654321, offset=value)
        _assert_same(_run(x, seed=seed, offset=offset), ref, f"device offset {value}")


def test_blocked_layout_and_nearest_unchanged(rng: np.random.Generator) -> None:
    """The 128x4 blocked scales of the stochastic kernel; the nearest kernel's codes are not its."""
    x = _data(rng, (130, 96), np.float16)
    ref = rbs.nvfp4_quantize(x, rounding="stochastic", seed=11, offset=12)
    codes, blocked = _run(x, seed=11, offset=12, layout="blocked")
    np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes)
    np.testing.assert_array_equal(blocked, rbs.to_blocked(ref.scales.reshape(130, -1)))
    nearest = rbs.nvfp4_quantize(x)
    assert not np.array_equal(nearest.codes, ref.codes)
    np.testing.assert_array_equal(nearest.scales, ref.scales)


def test_large_tensor_past_2_31_elements() -> None:
    """More than 2**31 elements: the words of the last row come from flat indices past 2**31."""
    import cupy

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    rows, cols = 2**16 + 3, 2**15
    try:
        x = cupy.zeros((rows, cols), cupy.float16)
    except cupy.cuda.memory.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    tail = np.linspace(-3, 3, cols, dtype=np.float16)
    x[-1] = cupy.asarray(tail)
    codes, scales = quantize_block_scaled(
        x, element="nvfp4", block=16, rule="te", tensor_amax=None, rounding="stochastic", seed=5, offset=9
    )
    u = uniform_for_elements(cols, 5, 9, (rows - 1) * cols).astype(np.float32)
    ref = rbs.nvfp4_quantize(tail[None, :], two_level=False)
    with np.errstate(divide="ignore"):  # a scale of 0: inv = min(1 / 0, FLT_MAX) (§3.3)
        inv = np.minimum(
            np.float32(1.0) / rbs.decode_elements(ref.scales[0], "e4m3"), np.float32(3.4028234663852886e38)
        )
    v_codes = rbs.encode_elements_stochastic(
        tail.astype(np.float32).reshape(-1, 16) * inv[:, None], u.reshape(-1, 16), "e2m1"
    ).reshape(-1)
    np.testing.assert_array_equal(codes[-1].get(), rbs.pack_fp4(v_codes[None, :])[0])
    np.testing.assert_array_equal(scales.reshape(rows, -1)[-1].get(), ref.scales[0])
