"""GPU: the block-scaled quantize kernel (``kernels/block_scaled.cu``) equals the reference bit for bit.

Covered: every MX element and scale rule, FP8 1x128 blocks in every scale form and amax floor,
float16 / bfloat16 / float32 inputs, ragged shapes (partial last blocks, odd FP4 rows), misaligned
operands (the general schedule), blocks holding NaN / +-Inf / only zeros / subnormal or huge
magnitudes, and the scale layouts (compact, cuBLAS 128x4 blocked, DeepGEMM column-major
TMA-aligned, UE8M0 packed in int32) with their zero padding.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from helpers import to_device

pytestmark = pytest.mark.gpu

rbs = pytest.importorskip("quantplan.reference.block_scaled")

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32]
MX_ELEMENTS = ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8"]
MX_RULES = ["rceil", "floor", "ceil", "even"]
SHAPES = [(4, 64), (3, 100), (2, 5, 96), (1, 31), (37, 288), (130, 33)]


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: type, block: int) -> np.ndarray:
    """Normal data whose blocks span many decades, with special blocks in the first rows."""
    x = rng.standard_normal(shape).astype(np.float64)
    flat = x.reshape(-1, shape[-1])
    nb = -(-shape[-1] // block)
    lo, hi = (-14, 14) if dtype is np.float16 else (-100, 100)
    mags = np.exp2(rng.integers(lo, hi, size=(flat.shape[0], nb)).astype(np.float64))
    flat *= np.repeat(mags, block, axis=1)[:, : shape[-1]]
    rows = flat.shape[0]
    if rows > 0 and shape[-1] > 3:
        flat[0, 1] = np.nan
    if rows > 1 and shape[-1] > 3:
        flat[1, 2] = -np.inf
    if rows > 2:
        flat[2, :block] = 0.0
    if rows > 3 and shape[-1] > 8:
        flat[3, :block] = rng.standard_normal(min(block, shape[-1])) * (2.0**-130 if dtype is np.float32 else 2.0**-20)
    if rows > 4 and dtype is np.float32:
        flat[4, 0] = 3.4028234663852886e38
    with np.errstate(over="ignore"):
        return flat.reshape(shape).astype(dtype)


def _run(x: np.ndarray, misaligned: bool = False, **kw):  # noqa: ANN202
    import cupy

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    dtype = "bfloat16" if x.dtype == ml_dtypes.bfloat16 else str(x.dtype)
    xd = to_device(x)
    if misaligned:  # the same values one element into a larger buffer: not 16-byte aligned
        big = cupy.empty(xd.size + 1, xd.dtype)
        big[1:] = xd.ravel()
        xd = big[1:].reshape(xd.shape)
    codes, scales = quantize_block_scaled(xd, input_dtype=dtype, **kw)
    cupy.cuda.get_current_stream().synchronize()
    return codes.get(), scales.get()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", MX_ELEMENTS)
@pytest.mark.parametrize("rule", MX_RULES)
def test_mx_matches_reference(rng: np.random.Generator, dtype: type, element: str, rule: str) -> None:
    for shape in SHAPES:
        x = _data(rng, shape, dtype, 32)
        ref = rbs.mx_quantize(x, element, scale_mode=rule)
        codes, scales = _run(x, element=element, block=32, rule=rule)
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes, err_msg=f"codes {shape}")
        np.testing.assert_array_equal(scales.reshape(ref.scales.shape), ref.scales, err_msg=f"scales {shape}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e2m1"])
def test_mx_misaligned_and_blocked_layout(rng: np.random.Generator, dtype: type, element: str) -> None:
    for shape in [(64, 128), (129, 96), (5, 70)]:
        x = _data(rng, shape, dtype, 32)
        ref = rbs.mx_quantize(x, element)
        codes, scales = _run(x, misaligned=True, element=element, block=32, rule="rceil")
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes)
        np.testing.assert_array_equal(scales.reshape(ref.scales.shape), ref.scales)
        codes, blocked = _run(x, element=element, block=32, rule="rceil", layout="blocked")
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes)
        np.testing.assert_array_equal(blocked, rbs.to_blocked(ref.scales.reshape(shape[0], -1)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rule", ["div", "mul_rcp", "enc", "ue8m0"])
@pytest.mark.parametrize("amax_floor", [0.0, 1e-10, 1e-4])
def test_fp8_1x128_matches_reference(
    rng: np.random.Generator, dtype: type, element: str, rule: str, amax_floor: float
) -> None:
    scale_format = "ue8m0" if rule == "ue8m0" else "f32"
    elem_op = "div" if rule == "ue8m0" else rule
    for shape in [(4, 256), (3, 300), (2, 3, 128), (33, 129)]:
        x = _data(rng, shape, dtype, 128)
        ref = rbs.fp8_block_quantize(
            x, block=(1, 128), element=element, scale_format=scale_format, elem_op=elem_op, amax_floor=amax_floor
        )
        codes, scales = _run(x, element=element, block=128, rule=rule, amax_floor=amax_floor)
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes, err_msg=f"codes {shape}")
        got = scales.reshape(ref.scales.shape)
        if scale_format == "f32":
            got, want = got.view(np.uint32), ref.scales.view(np.uint32)
        else:
            want = ref.scales
        np.testing.assert_array_equal(got, want, err_msg=f"scales {shape}")


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("rule", ["div", "mul_rcp", "enc", "ue8m0"])
def test_fp8_1x128_large_schedules_match_reference(rng: np.random.Generator, dtype: type, rule: str) -> None:
    """A problem past the small-problem threshold runs the large rows of the tuning table (``div``:
    SCHEDULES, the multiplying rules: MULTIPLY_SCHEDULES), in every scale layout of the rule."""
    from quantplan.runtime import _block_scaled_kernels as bk
    from quantplan.runtime._device import device_info

    shape = (4352, 1024)  # 34,816 blocks of 128: past the small row of both schedules on 132 multiprocessors
    name = "bfloat16" if dtype is ml_dtypes.bfloat16 else "float16"
    teams = shape[0] * shape[1] // 128
    sched = bk.choose_schedule(name, 128, True, teams, device_info(0).sm_count, divide=rule == "div")
    table = bk.SCHEDULES if rule == "div" else bk.MULTIPLY_SCHEDULES
    assert sched is table[True, 128, False]
    x = _data(rng, shape, dtype, 128)
    scale_format = "ue8m0" if rule == "ue8m0" else "f32"
    ref = rbs.fp8_block_quantize(
        x, block=(1, 128), scale_format=scale_format, elem_op="div" if rule == "ue8m0" else rule
    )
    layouts = ("compact", "column_major", "packed_ue8m0") if rule == "ue8m0" else ("compact", "column_major")
    for layout in layouts:
        codes, scales = _run(x, element="e4m3", block=128, rule=rule, layout=layout)
        np.testing.assert_array_equal(codes, ref.codes, err_msg=layout)
        if layout == "compact":
            want = ref.scales
        elif layout == "column_major":
            want = rbs.col_major_tma_aligned(ref.scales)
        else:
            want = rbs.deepgemm_sf_layout(ref.scales)
        got = scales.reshape(-1).view(np.uint8)
        np.testing.assert_array_equal(got, np.ascontiguousarray(want).reshape(-1).view(np.uint8), err_msg=layout)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=lambda d: np.dtype(d).name)
def test_fp8_scale_layouts(rng: np.random.Generator, dtype: type) -> None:
    for shape in [(7, 384), (64, 1024), (5, 130)]:
        x = _data(rng, shape, dtype, 128)
        ref = rbs.fp8_block_quantize(x, block=(1, 128))
        _, cm = _run(x, element="e4m3", block=128, rule="div", layout="column_major")
        want = rbs.col_major_tma_aligned(ref.scales)
        np.testing.assert_array_equal(cm.reshape(want.shape).view(np.uint32), want.view(np.uint32))
        ref8 = rbs.fp8_block_quantize(x, block=(1, 128), scale_format="ue8m0")
        _, packed = _run(x, element="e4m3", block=128, rule="ue8m0", layout="packed_ue8m0")
        want8 = rbs.deepgemm_sf_layout(ref8.scales)
        np.testing.assert_array_equal(packed.view(np.int32).reshape(want8.shape), want8)
        _, cm8 = _run(x, element="e4m3", block=128, rule="ue8m0", layout="column_major")
        np.testing.assert_array_equal(cm8.reshape(-1), rbs.col_major_tma_aligned(ref8.scales).reshape(-1))


def test_large_tensor_past_2_31_elements() -> None:
    """More than 2**31 elements: 64-bit indexing (the last rows hold a distinctive block)."""
    import cupy

    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    rows, cols = 2**16 + 3, 2**15  # 2**31 + 3 * 2**15 float16 elements
    try:
        x = cupy.zeros((rows, cols), cupy.float16)
    except cupy.cuda.memory.OutOfMemoryError:
        pytest.skip("not enough GPU memory")
    tail = np.linspace(-3, 3, cols, dtype=np.float16)
    x[-1] = cupy.asarray(tail)
    codes, scales = quantize_block_scaled(x, element="e4m3", block=32)
    ref = rbs.mx_quantize(tail[None, :], "e4m3")
    np.testing.assert_array_equal(codes[-1].get(), ref.codes[0])
    np.testing.assert_array_equal(scales.reshape(rows, -1)[-1].get(), ref.scales[0])
    assert int(scales.reshape(rows, -1)[0, 0].get()) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("amax_mode", ["given", "compute", "one_level"])
def test_nvfp4_te_matches_reference(rng: np.random.Generator, dtype: type, amax_mode: str) -> None:
    import cupy

    for shape in [(4, 64), (3, 100), (2, 5, 48), (1, 15), (130, 33), (64, 4096)]:
        x = _data(rng, shape, dtype, 16)
        if amax_mode == "given":
            amax = np.float32(np.abs(x.astype(np.float32)[np.isfinite(x.astype(np.float32))]).max() * 0.75)
            ref = rbs.nvfp4_quantize(x, global_amax=float(amax))
            kw = {"tensor_amax": cupy.asarray(np.array([amax], np.float32))}
        elif amax_mode == "compute":
            ref = rbs.nvfp4_quantize(x)
            kw = {}
        else:
            ref = rbs.nvfp4_quantize(x, two_level=False)
            kw = {"tensor_amax": None}
        codes, scales = _run(x, element="nvfp4", block=16, rule="te", **kw)
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes, err_msg=f"codes {shape}")
        np.testing.assert_array_equal(scales.reshape(ref.scales.shape), ref.scales, err_msg=f"scales {shape}")
        if amax_mode == "compute":
            from quantplan.runtime._block_scaled_kernels import tensor_amax_of

            dname = "bfloat16" if x.dtype == ml_dtypes.bfloat16 else str(x.dtype)
            got = tensor_amax_of(to_device(x), dname, cupy.cuda.get_current_stream()).get()[0]
            assert got.view(np.uint32) == np.float32(ref.amax).view(np.uint32)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16], ids=lambda d: np.dtype(d).name)
def test_nvfp4_misaligned_and_blocked_layout(rng: np.random.Generator, dtype: type) -> None:
    for shape in [(64, 128), (129, 96), (5, 70)]:
        x = _data(rng, shape, dtype, 16)
        ref = rbs.nvfp4_quantize(x)
        codes, scales = _run(x, misaligned=True, element="nvfp4", block=16, rule="te")
        np.testing.assert_array_equal(codes.reshape(ref.codes.shape), ref.codes)
        np.testing.assert_array_equal(scales.reshape(ref.scales.shape), ref.scales)
        _, blocked = _run(x, element="nvfp4", block=16, rule="te", layout="blocked")
        np.testing.assert_array_equal(blocked, rbs.to_blocked(ref.scales.reshape(shape[0], -1)))


@pytest.mark.parametrize("out_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "fmt", ["mx_e4m3", "mx_e5m2", "mx_e2m3", "mx_e3m2", "mx_e2m1", "mx_int8", "fp8_f32", "fp8_ue8m0", "nvfp4"]
)
def test_dequantize_matches_reference(rng: np.random.Generator, out_dtype: str, fmt: str) -> None:
    import cupy

    from quantplan.runtime._block_scaled_kernels import dequantize_block_scaled

    out_np = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[out_dtype]
    for shape in [(4, 64), (3, 100), (2, 5, 48), (1, 15), (130, 257)]:
        x = _data(rng, shape, np.float32, 32)
        if fmt.startswith("mx_"):
            q = rbs.mx_quantize(x, fmt[3:])
            want = rbs.mx_dequantize(q, out_np)
            kw = {"element": fmt[3:], "block": 32, "scale_kind": "e8m0"}
            scales = q.scales
        elif fmt.startswith("fp8_"):
            sf = fmt[4:]
            q = rbs.fp8_block_quantize(x, block=(1, 128), scale_format=sf)
            want = rbs.fp8_block_dequantize(q, out_np)
            kw = {"element": "e4m3", "block": 128, "scale_kind": "e8m0" if sf == "ue8m0" else "f32"}
            scales = q.scales
        else:
            q = rbs.nvfp4_quantize(x)
            want = rbs.nvfp4_dequantize(q, out_np)
            kw = {
                "element": "nvfp4",
                "block": 16,
                "scale_kind": "e4m3",
                "tensor_scale": cupy.asarray(np.array([q.tensor_scale], np.float32)),
            }
            scales = q.scales
        got = dequantize_block_scaled(
            cupy.asarray(q.codes), cupy.asarray(np.ascontiguousarray(scales)), shape, out_dtype=out_dtype, **kw
        ).get()
        if out_dtype == "bfloat16":  # compare values (NaN equals NaN whatever its payload)
            got = (got.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
            want = want.astype(np.float32)
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=f"{fmt} {shape}")
