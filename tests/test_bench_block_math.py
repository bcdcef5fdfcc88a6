"""CPU: the plain PyTorch block-scaled formats of ``benchmarks/block_math.py`` (the ``torch.compile``
column of bench_peers' block-scaled rows) give the bytes of ``quantplan.reference.block_scaled``.

Eager PyTorch on the CPU, fresh random data of ragged shapes (partial blocks), with the special
values of MICROSCALING.md §1.4 planted: zero blocks, NaN and ±Inf blocks, subnormal amax, values
at the element maximum and at rounding ties.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import block_math  # noqa: E402

import quantplan.reference.block_scaled as rb  # noqa: E402

DTYPES = {"float32": (torch.float32, np.float32), "bfloat16": (torch.bfloat16, ml_dtypes.bfloat16)}


def _data(rng: np.random.Generator, shape: tuple[int, int], np_dtype: Any, block: int) -> np.ndarray:
    """Heavy-tailed values with per-row magnitudes over many binades, and planted special blocks."""
    rows, cols = shape
    x = rng.standard_t(df=3, size=shape) * np.exp2(rng.integers(-20, 20, size=(rows, 1)))
    x = x.astype(np.float32)
    x[0, :block] = 0.0  # all-zero block
    if rows > 1:
        x[1, 3] = np.nan
    if rows > 2:
        x[2, min(5, cols - 1)] = -np.inf
    if rows > 3:
        x[3, :block] = np.float32(1e-39) * rng.standard_normal(block)  # subnormal amax
    if rows > 4:
        x[4, :block] = rng.choice([448.0, -6.0, 7.5, 0.375, 2.5, 1.25, 3.5], size=block)  # maxima and ties
    return x.astype(np_dtype)


def _torch(x: np.ndarray) -> object:
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(x)


def _same(got: object, want: np.ndarray) -> None:
    g = got.contiguous().view(torch.uint8).numpy().reshape(-1)  # type: ignore[attr-defined]
    w = np.ascontiguousarray(want).view(np.uint8).reshape(-1)
    assert g.shape == w.shape, (g.shape, w.shape)
    diff = np.flatnonzero(g != w)
    assert diff.size == 0, f"{diff.size} of {w.size} bytes differ, first at {diff[:5]}"


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("element", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"])
@pytest.mark.parametrize("rule", ["rceil", "floor"])
def test_mx_bytes_equal_the_reference(dtype: str, element: str, rule: str) -> None:
    rng = np.random.default_rng([7, len(element), len(rule), len(dtype)])
    shape = (int(rng.integers(5, 40)), int(rng.integers(33, 300)))
    x = _data(rng, shape, DTYPES[dtype][1], 32)
    ref = rb.mx_quantize(x, element, scale_mode=rule)
    codes, scales = block_math.mx_quantize(_torch(x), block_math.limit_tensor(element), element, rule)
    _same(scales, ref.scales)
    _same(codes, ref.codes)
    _same(block_math.to_blocked(scales), rb.to_blocked(ref.scales))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("scale_format", ["f32", "ue8m0"])
def test_fp8_1x128_bytes_and_layouts_equal_the_reference(dtype: str, scale_format: str) -> None:
    rng = np.random.default_rng([11, len(scale_format), len(dtype)])
    shape = (int(rng.integers(5, 70)), int(rng.integers(129, 700)))
    x = _data(rng, shape, DTYPES[dtype][1], 128)
    ref = rb.fp8_block_quantize(x, block=(1, 128), scale_format=scale_format, elem_op="div")
    codes, scales = block_math.fp8_block_quantize(_torch(x), block_math.limit_tensor("e4m3"), scale_format)
    _same(codes, ref.codes)
    _same(scales, ref.scales)
    if scale_format == "ue8m0":
        _same(block_math.packed_ue8m0(scales), rb.deepgemm_sf_layout(ref.scales))
    else:
        _same(block_math.col_major_tma_aligned(scales), rb.col_major_tma_aligned(ref.scales))


def test_encoders_cover_every_code() -> None:
    """Every finite value of each element encodes to its own code (decode table of the reference)."""
    for element in ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1"):
        bits = 1 + sum(block_math.FP_ELEMENTS[element][:2])
        codes = np.arange(1 << bits, dtype=np.uint8)
        values = rb.decode_elements(codes, element).astype(np.float32)
        keep = np.isfinite(values)
        got = block_math.encode_fp(torch.from_numpy(values[keep]), element).numpy()
        np.testing.assert_array_equal(got, codes[keep])


def test_bench_peers_block_rows_run_on_the_reference_backend(tmp_path: Path) -> None:
    """``bench_peers.py --cpu-smoke --only-block``: the block rows build, run on the reference
    backend, equal the reference, and the block_math column equals ours (plumbing; times nothing)."""
    import bench_peers

    out = tmp_path / "block.md"
    only = "MXINT8|FP8 1x128 UE8M0|rowwise + columnwise|NVFP4 te, given"
    status = bench_peers.main(["--cpu-smoke", "--only-block", "--quick", "--only", only, "--out", str(out)])
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "bf16" in line]
    assert status == 0 and len(rows) == 7, text  # the four fused rows: two of them in the GEMM layouts
    assert all("= reference" in row for row in rows), text
    assert sum("torch.compile = ours" in row for row in rows) == 2, text
