"""GPU: the 2-D tile and fused quantize + transpose kernels (``kernels/block_scaled_tiles.cu``) equal
the reference bit for bit.

Covered: FP8 128x128 tiles in every scale form and amax floor, e4m3 / e5m2; MX 32x32 tiles for every
element and rule; the fused rowwise + columnwise MXFP8 (every rule) and FP8 1x128 / 128x1 (every
rule and floor) copies; float16 / bfloat16 / float32 inputs; ragged shapes (partial tiles and
blocks on both axes, 1x1, odd widths that take the general path) and a 2048x4096 case; tiles or
blocks holding NaN / -Inf / only zeros / subnormal magnitudes / FLT_MAX; the scale layouts with
their zero padding (column-major TMA-aligned, cuBLAS 128x4 blocked, UE8M0 packed).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import to_device

pytestmark = pytest.mark.gpu

rbs = pytest.importorskip("quantplan.reference.block_scaled")

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32]
MX_ELEMENTS = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"]
MX_RULES = ["rceil", "floor", "ceil", "even"]
FP8_RULES = ["div", "mul_rcp", "enc", "ue8m0"]
FLOORS = [0.0, 1e-10, 1e-4]
SHAPES = [(1, 1), (3, 130), (129, 257), (128, 128), (256, 384), (2, 70, 96), (160, 48), (33, 31)]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, tile: tuple[int, int]) -> np.ndarray:
    """Normal data whose 32x32 regions span many decades; special tiles (``tile`` = rows x cols):
    (0, 0) one NaN, (0, 1) one -Inf, (1, 0) all zero, (1, 1) subnormal magnitudes, FLT_MAX (f32)."""
    x = rng.standard_normal(shape).astype(np.float64)
    flat = x.reshape(-1, shape[-1])
    rows, cols = flat.shape
    lo, hi = (-14, 14) if dtype is np.float16 else (-100, 100)
    mags = np.exp2(rng.integers(lo, hi, size=(-(-rows // 32), -(-cols // 32))).astype(np.float64))
    flat *= np.repeat(np.repeat(mags, 32, axis=0), 32, axis=1)[:rows, :cols]
    tr, tc = tile
    flat[min(rows - 1, tr // 2), min(cols - 1, 3)] = np.nan
    if cols > tc:
        flat[min(rows - 1, 5), tc + 1] = -np.inf
    if rows > tr:
        flat[tr : 2 * tr, :tc] = 0.0
        if cols > tc:
            tiny = 2.0**-20 if dtype is np.float16 else 2.0**-130
            flat[tr : 2 * tr, tc : 2 * tc] = rng.standard_normal(flat[tr : 2 * tr, tc : 2 * tc].shape) * tiny
    if dtype is np.float32 and rows > 2 and cols > 2:
        flat[rows - 1, cols - 1] = 3.4028234663852886e38
    with np.errstate(over="ignore"):
        return flat.reshape(shape).astype(dtype)


def _dtype_name(x: np.ndarray) -> str:
    return "bfloat16" if x.dtype == ml_dtypes.bfloat16 else str(x.dtype)


def _tiles(x: np.ndarray, **kw: Any) -> tuple[np.ndarray, np.ndarray]:
    import cupy

    from quantplan.runtime._block_scaled_tile_kernels import quantize_block_scaled_2d

    codes, scales = quantize_block_scaled_2d(to_device(x), input_dtype=_dtype_name(x), **kw)
    cupy.cuda.get_current_stream().synchronize()
    return codes.get(), scales.get()


def _transpose(x: np.ndarray, **kw: Any) -> tuple[np.ndarray, ...]:
    import cupy

    from quantplan.runtime._block_scaled_tile_kernels import quantize_transpose_block_scaled

    out = quantize_transpose_block_scaled(to_device(x), input_dtype=_dtype_name(x), **kw)
    cupy.cuda.get_current_stream().synchronize()
    return tuple(a.get() for a in out)


def _same_scales(got: np.ndarray, want: np.ndarray, msg: str) -> None:
    want = np.ascontiguousarray(want)
    got = got.view(want.dtype).reshape(want.shape)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=msg)


def _fp8_kw(rule: str) -> dict[str, str]:
    return {"scale_format": "ue8m0" if rule == "ue8m0" else "f32", "elem_op": "div" if rule == "ue8m0" else rule}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rule", FP8_RULES)
@pytest.mark.parametrize("amax_floor", FLOORS)
def test_fp8_128x128_matches_reference(
    rng: np.random.Generator, dtype: type, element: str, rule: str, amax_floor: float
) -> None:
    for shape in SHAPES:
        x = _data(rng, shape, dtype, (128, 128))
        ref = rbs.fp8_block_quantize(x, block=(128, 128), element=element, amax_floor=amax_floor, **_fp8_kw(rule))
        codes, scales = _tiles(x, element=element, block=(128, 128), rule=rule, amax_floor=amax_floor)
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes, err_msg=f"codes {shape}")
        _same_scales(scales, ref.scales, f"scales {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rule", ["div", "ue8m0"])
def test_fp8_128x128_column_major_and_large(rng: np.random.Generator, dtype: type, rule: str) -> None:
    for shape in [(300, 520), (2048, 4096)]:
        x = _data(rng, shape, dtype, (128, 128))
        ref = rbs.fp8_block_quantize(x, block=(128, 128), **_fp8_kw(rule))
        codes, cm = _tiles(x, block=(128, 128), rule=rule, layout="column_major")
        np.testing.assert_array_equal(codes, ref.codes, err_msg=f"codes {shape}")
        _same_scales(cm, rbs.col_major_tma_aligned(ref.scales), f"column-major scales {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", MX_ELEMENTS)
@pytest.mark.parametrize("rule", MX_RULES)
def test_mx_32x32_matches_reference(rng: np.random.Generator, dtype: type, element: str, rule: str) -> None:
    for shape in SHAPES:
        x = _data(rng, shape, dtype, (32, 32))
        ref = rbs.mx_quantize(x, element, scale_mode=rule, block_2d=True)
        codes, scales = _tiles(x, element=element, block=(32, 32), rule=rule)
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes, err_msg=f"codes {shape}")
        _same_scales(scales, ref.scales, f"scales {shape}")


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=lambda d: np.dtype(d).name)
def test_mx_32x32_blocked_layout(rng: np.random.Generator, dtype: type) -> None:
    for shape in [(129, 257), (64, 512), (2048, 4096)]:
        x = _data(rng, shape, dtype, (32, 32))
        ref = rbs.mx_quantize(x, "e4m3", block_2d=True)
        codes, blocked = _tiles(x, element="e4m3", block=(32, 32), rule="rceil", layout="blocked")
        np.testing.assert_array_equal(codes, ref.codes)
        _same_scales(blocked, rbs.to_blocked(ref.scales), f"blocked scales {shape}")


def _check_pair(got: tuple[np.ndarray, ...], pair: Any, shape: tuple[int, ...], layout: str = "compact") -> None:
    codes_r, scales_r, codes_c, scales_c = got
    row, col = pair.rowwise, pair.columnwise
    m = int(np.prod(shape[:-1]))
    np.testing.assert_array_equal(codes_r.reshape(m, -1), row.codes.reshape(m, -1), err_msg=f"rowwise codes {shape}")
    np.testing.assert_array_equal(codes_c, col.codes, err_msg=f"columnwise codes {shape}")
    rs, cs = row.scales.reshape(m, -1), col.scales
    if layout == "blocked":
        rs, cs = rbs.to_blocked(rs), rbs.to_blocked(cs)
    elif layout == "column_major":
        rs, cs = rbs.col_major_tma_aligned(rs), rbs.col_major_tma_aligned(cs)
    elif layout == "packed_ue8m0":
        rs, cs = rbs.deepgemm_sf_layout(rs), rbs.deepgemm_sf_layout(cs)
    _same_scales(scales_r, rs, f"rowwise scales {shape}")
    _same_scales(scales_c, cs, f"columnwise scales {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rule", MX_RULES)
def test_mxfp8_transpose_matches_reference(rng: np.random.Generator, dtype: type, element: str, rule: str) -> None:
    for shape in SHAPES:
        x = _data(rng, shape, dtype, (32, 32))
        pair = rbs.quantize_transpose(x, "mx", element=element, scale_mode=rule)
        _check_pair(_transpose(x, element=element, block=32, rule=rule), pair, shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rule", FP8_RULES)
@pytest.mark.parametrize("amax_floor", FLOORS)
def test_fp8_1x128_transpose_matches_reference(
    rng: np.random.Generator, dtype: type, element: str, rule: str, amax_floor: float
) -> None:
    for shape in SHAPES:
        x = _data(rng, shape, dtype, (128, 128))
        pair = rbs.quantize_transpose(
            x, "fp8_block", block=(1, 128), element=element, amax_floor=amax_floor, **_fp8_kw(rule)
        )
        _check_pair(_transpose(x, element=element, block=128, rule=rule, amax_floor=amax_floor), pair, shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_transpose_layouts_and_large(rng: np.random.Generator, dtype: type) -> None:
    for shape in [(129, 257), (2048, 4096)]:
        x = _data(rng, shape, dtype, (32, 32))
        pair = rbs.quantize_transpose(x, "mx")
        _check_pair(_transpose(x, block=32), pair, shape)
        _check_pair(_transpose(x, block=32, scale_layout="blocked"), pair, shape, "blocked")
        pair8 = rbs.quantize_transpose(x, "fp8_block", block=(1, 128))
        _check_pair(_transpose(x, block=128, scale_layout="column_major"), pair8, shape, "column_major")
        pair8 = rbs.quantize_transpose(x, "fp8_block", block=(1, 128), scale_format="ue8m0")
        _check_pair(_transpose(x, block=128, rule="ue8m0", scale_layout="packed_ue8m0"), pair8, shape, "packed_ue8m0")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rule", MX_RULES)
def test_mxfp8_te_layout_matches_reference(rng: np.random.Generator, dtype: type, element: str, rule: str) -> None:
    for shape in SHAPES:
        x = _data(rng, shape, dtype, (32, 32))
        pair = rbs.quantize_transpose(x, "mx", layout="te_mxfp8", element=element, scale_mode=rule)
        codes_r, scales_r, codes_c, scales_c = _transpose(x, element=element, block=32, rule=rule, layout="te_mxfp8")
        m = int(np.prod(shape[:-1]))
        np.testing.assert_array_equal(codes_r.reshape(m, -1), pair.rowwise.codes.reshape(m, -1))
        _same_scales(scales_r, pair.rowwise.scales.reshape(m, -1), f"rowwise scales {shape}")
        np.testing.assert_array_equal(codes_c.reshape(m, -1), pair.columnwise.codes.reshape(m, -1), err_msg=f"{shape}")
        _same_scales(scales_c, pair.columnwise.scales.reshape(-(-m // 32), -1), f"columnwise scales {shape}")


def test_bad_requests_raise_before_launch() -> None:
    import cupy

    from quantplan.runtime._block_scaled_tile_kernels import quantize_block_scaled_2d, quantize_transpose_block_scaled
    from quantplan.vocabulary.errors import InvalidProblem, Unsupported

    x = cupy.zeros((64, 64), cupy.float16)
    with pytest.raises(Unsupported):
        quantize_block_scaled_2d(x, block=(16, 16))
    with pytest.raises(InvalidProblem):
        quantize_block_scaled_2d(x, block=(128, 128), element="e2m1")
    with pytest.raises(Unsupported):
        quantize_block_scaled_2d(x, block=(128, 128), layout="blocked")
    with pytest.raises(InvalidProblem):
        quantize_transpose_block_scaled(x[0], block=32)
    with pytest.raises(InvalidProblem):
        quantize_transpose_block_scaled(x, block=128, rule="rceil")
    with pytest.raises(InvalidProblem):
        quantize_block_scaled_2d(x, amax_floor=-1.0)
    with pytest.raises(Unsupported):
        quantize_transpose_block_scaled(x, block=128, layout="te_mxfp8")


def _near_fp8_ties(rng: np.random.Generator, rows: int, cols: int, element: str) -> np.ndarray:
    """f32 data whose FP8 ``div`` quotients x / s sit on and one f32 ulp around the element's
    rounding ties (the midpoints of adjacent codes, the subnormal ones included), the block scale s
    set by each row's first element (the row's amax, 2^-60 .. 2^60): a division that is not
    correctly rounded shows as a code off by one."""
    top = 448.0 if element == "e4m3" else 57344.0
    grid = np.unique(rbs._decode_table(rbs.ELEMENT_FORMATS[element]).astype(np.float64))  # every code's value
    grid = grid[np.isfinite(grid) & (grid >= 0) & (grid <= top)]
    ties = (grid[:-1] + grid[1:]) / 2
    amax = np.exp2(rng.uniform(-60, 60, size=(rows, 1))).astype(np.float32)
    s = (amax / np.float32(top)).astype(np.float32)
    t = rng.choice(ties, size=(rows, cols)) * rng.choice([-1.0, 1.0], size=(rows, cols))
    x = (t * s.astype(np.float64)).astype(np.float32)
    nudge = rng.integers(-1, 2, size=x.shape)
    x = np.where(nudge > 0, np.nextafter(x, np.float32(np.inf)), x)
    x = np.where(nudge < 0, np.nextafter(x, np.float32(-np.inf)), x).astype(np.float32)
    x[:, 0] = amax[:, 0]
    return x


@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_fp8_div_near_ties(rng: np.random.Generator, element: str) -> None:
    """The ``div`` rule divides each element by its block scale with correct rounding: quotients on
    and around every rounding tie, in the 1x128 rowwise and columnwise copies of the fused kernel
    (the columnwise copy of x.T sees the same blocks) and the 128x128 tiles."""
    x = _near_fp8_ties(rng, 256, 384, element)
    kw = _fp8_kw("div")
    for data in (x, np.ascontiguousarray(x.T)):
        pair = rbs.quantize_transpose(data, "fp8_block", block=(1, 128), element=element, **kw)
        _check_pair(_transpose(data, element=element, block=128, rule="div"), pair, data.shape)
    tile = x[:128, :128].copy()
    tile[0, 0] = np.abs(tile).max()  # the tile's amax: the scale of every element of the tile
    ref = rbs.fp8_block_quantize(tile, block=(128, 128), element=element, **kw)
    codes, scales = _tiles(tile, element=element, block=(128, 128), rule="div")
    np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes)
    _same_scales(scales, ref.scales, "128x128 div near ties")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_transpose_schedules_match_reference(rng: np.random.Generator, dtype: type) -> None:
    """Every candidate schedule of the fused kernel (``TRANSPOSE_CANDIDATES``: resident CTAs, L2
    prefetch ahead) gives the reference's bytes, through its rule-specialised tile code (MX
    ``rceil``, FP8 ``div`` and ``enc``) and its run-time rule code: MXFP8 rceil / floor, FP8 1x128
    div / enc / mul_rcp with and without an amax floor, full and partial tiles; a 2064 x 4112 case
    (17 x 33 tiles, partial ones on both edges, aligned) has enough CTAs for every prefetch distance
    to reach whole and partial tiles."""
    from quantplan.runtime._block_scaled_tile_kernels import TRANSPOSE_CANDIDATES

    candidates = TRANSPOSE_CANDIDATES[_dtype_name(np.zeros(1, dtype))]
    cases: list[tuple[tuple[int, int], int, str, float]] = [
        (shape, 32, rule, 0.0) for shape in [(256, 384), (129, 257), (160, 48)] for rule in ("rceil", "floor")
    ]
    cases += [
        (shape, 128, rule, floor)
        for shape in [(256, 384), (129, 257), (160, 48)]
        for rule, floor in (("div", 0.0), ("div", 1e-4), ("enc", 0.0), ("enc", 1e-10), ("mul_rcp", 0.0))
    ]
    cases += [((2064, 4112), 32, "rceil", 0.0), ((2064, 4112), 128, "div", 0.0), ((2064, 4112), 128, "enc", 0.0)]
    for shape, block, rule, floor in cases:
        x = _data(rng, shape, dtype, (block, block))
        if block == 32:
            pair = rbs.quantize_transpose(x, "mx", scale_mode=rule)
        else:
            pair = rbs.quantize_transpose(x, "fp8_block", block=(1, 128), amax_floor=floor, **_fp8_kw(rule))
        for tag, sched in candidates.items():
            got = _transpose(x, block=block, rule=rule, amax_floor=floor, schedule=sched)
            try:
                _check_pair(got, pair, shape)
            except AssertionError as e:
                raise AssertionError(f"schedule {tag} ({sched}), {rule} floor {floor}: {e}") from None


def _near_fp8_ties_16bit(rng: np.random.Generator, rows: int, cols: int, element: str, dtype: type) -> np.ndarray:
    """16-bit data whose FP8 ``div`` quotients x / s sit on and next to the element's rounding ties:
    each row's first element is its amax a (half of the rows a short multiple of max_elem, so that
    s = fl(a / max_elem) is short and t * s lands on 16-bit values), the others t * s rounded to the
    input format and their neighbours; with and without the amax floor's tiny blocks."""
    top = 448.0 if element == "e4m3" else 57344.0
    grid = np.unique(rbs._decode_table(rbs.ELEMENT_FORMATS[element]).astype(np.float64))
    grid = grid[np.isfinite(grid) & (grid >= 0) & (grid <= top)]
    ties = (grid[:-1] + grid[1:]) / 2
    lo, hi = (-10, 10) if dtype is np.float16 else (-60, 60)
    amax = np.exp2(rng.integers(lo, hi, size=(rows, 1)).astype(np.float64))
    short = rng.choice([1.0, 1.125, 1.25, 1.5, 1.75], size=(rows, 1)) * top / 256.0
    amax = np.where(np.arange(rows)[:, None] % 2 == 0, amax * short, amax * rng.uniform(1, 2, size=(rows, 1)))
    amax = amax.astype(dtype).astype(np.float64)
    s = (amax.astype(np.float32) / np.float32(top)).astype(np.float64)
    t = rng.choice(ties, size=(rows, cols)) * rng.choice([-1.0, 1.0], size=(rows, cols))
    x = (t * s).astype(dtype)
    bits = x.view(np.uint16).astype(np.int32) + rng.integers(-1, 2, size=x.shape)
    x = np.clip(bits, 0, 0xFFFF).astype(np.uint16).view(dtype)
    x = np.where(np.abs(x.astype(np.float64)) <= amax, x, np.zeros_like(x))
    x[:, 0] = amax[:, 0].astype(dtype)
    return np.ascontiguousarray(x)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_fp8_div_near_ties_16bit(rng: np.random.Generator, dtype: type, element: str) -> None:
    """The ``div`` rule on 16-bit inputs (one correction step, divide_rn1) is correctly rounded on and
    around every rounding tie, in the rowwise and columnwise copies, with the amax floor binding on
    some blocks (their division takes the general sequence)."""
    x = _near_fp8_ties_16bit(rng, 256, 384, element, dtype)
    for floor in (0.0, 1e-4):
        for data in (x, np.ascontiguousarray(x.T)):
            pair = rbs.quantize_transpose(
                data, "fp8_block", block=(1, 128), element=element, amax_floor=floor, **_fp8_kw("div")
            )
            got = _transpose(data, element=element, block=128, rule="div", amax_floor=floor)
            _check_pair(got, pair, data.shape)
