"""CPU: quantplan.compat.deepspeed — DeepSpeed's layouts and formulas on hand-computed examples."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import quantplan as qp
from quantplan import reference
from quantplan.compat import deepspeed as ds
from quantplan.reference import deepspeed_format as dsref
from quantplan.vocabulary.philox import uniform_for_elements
from quantplan.vocabulary.types import NibbleOrder, QuantMode

pytestmark = pytest.mark.filterwarnings("error")

f = np.float32
SYM, ASYM = ds.Symmetric, ds.Asymmetric


def test_quantization_type_values_and_module_attributes() -> None:
    assert int(ds.QuantizationType.Symmetric) == 0 and int(ds.QuantizationType.Asymmetric) == 1
    assert ds.Symmetric is ds.QuantizationType.Symmetric and ds.Asymmetric is ds.QuantizationType.Asymmetric
    x = np.array([1.0, -2.0], np.float32)
    for t in (0, ds.Symmetric, QuantMode.SYMMETRIC):
        assert ds.quantize(x, 1, 8, t)[1].tolist() == [[f(1) / f(64)]]
    with pytest.raises(qp.InvalidProblem, match="quant_type"):
        ds.quantize(x, 1, 8, 2)


# ---------------------------------------------------------------------------------------------
# quantize / dequantize: layouts and formulas
# ---------------------------------------------------------------------------------------------


def test_symmetric_int8_hand_vector() -> None:
    # absmax 4: scale = 2**8 / (2 * 4) = 32; 4 * 32 = 128 clips to 127; stored 1 / 32
    q, params = ds.quantize(np.array([1.0, -2.0, 0.5, 4.0], np.float16), 1, 8, SYM)
    assert q.dtype == np.int8 and q.tolist() == [32, -64, 16, 127]
    assert params.dtype == np.float32 and params.shape == (1, 1) and params.tolist() == [[0.03125]]
    y = ds.dequantize(q, params, 1, 8, SYM)
    assert y.dtype == np.float16 and y.tolist() == [1.0, -2.0, 0.5, 3.96875]


def test_asymmetric_int8_midpoint_offset_hand_vector() -> None:
    # max 3, min -1: scale = 256 / 4 = 64, offset = (3 + -1) / 2 = 1; q = (x - 1) * 64
    q, params = ds.quantize(np.array([-1.0, 3.0, 0.0, 1.0], np.float32), 1, 8, ASYM)
    assert q.tolist() == [-128, 127, -64, 0]  # 128 clips to 127
    assert params.shape == (1, 2) and params.tolist() == [[0.015625, 1.0]]  # (1 / scale, offset) interleaved
    y = ds.dequantize_fp32(q, params, 1, 8, ASYM)
    assert y.dtype == np.float32 and y.tolist() == [-1.0, 2.984375, 0.0, 1.0]


def test_int4_signed_nibbles_high_first() -> None:
    # symmetric: scale = 16 / 8 = 2: q = 2, -4, 1, 8 -> 7; bytes 0x2C, 0x17
    q, params = ds.quantize(np.array([[1.0, -2.0, 0.5, 4.0]], np.float32), 1, 4, SYM)
    assert q.shape == (1, 2) and q.dtype == np.int8 and q.view(np.uint8).tolist() == [[0x2C, 0x17]]
    assert params.tolist() == [[0.5]]
    assert ds.dequantize_fp32(q, params, 1, 4, SYM).tolist() == [[1.0, -2.0, 0.5, 3.5]]
    # asymmetric: scale = 16 / 4 = 4, offset 1: q = -8, 8 -> 7, -4, 0; bytes 0x87, 0xC0
    q, params = ds.quantize(np.array([-1.0, 3.0, 0.0, 1.0], np.float32), 1, 4, ASYM)
    assert q.view(np.uint8).tolist() == [0x87, 0xC0] and q.tolist() == [-121, -64]
    assert params.tolist() == [[0.25, 1.0]]
    assert ds.dequantize_fp32(q, params, 1, 4, ASYM).tolist() == [-1.0, 2.75, 0.0, 1.0]


def test_groups_are_contiguous_runs_of_the_flat_tensor() -> None:
    x = np.array([[1.0, 2.0, 3.0], [4.0, -8.0, 0.0]], np.float32)  # 3 groups of 2: [1 2] [3 4] [-8 0]
    q, params = ds.quantize(x, 3, 8, SYM)
    assert q.shape == (2, 3)
    assert params[:, 0].tolist() == [f(2) / f(128), f(4) / f(128), f(8) / f(128)]
    assert q.tolist() == [[64, 127, 96], [127, -128, 0]]


def test_quantize_shapes() -> None:
    x = np.zeros((4, 6), np.float32)
    assert ds.quantize(x, 3, 8, SYM)[0].shape == (4, 6)
    q, params = ds.quantize(x, 3, 4, ASYM)
    assert q.shape == (4, 3) and params.shape == (3, 2)
    assert ds.quantize(np.zeros((2, 3), np.float32), 2, 4, SYM)[0].shape == (3,)  # odd last dim: flat
    with pytest.raises(qp.InvalidProblem):
        ds.quantize(np.zeros((3, 5), np.float32), 3, 4, SYM)  # 15 elements cannot pack into bytes
    q, params = ds.quantize(np.zeros((0, 4), np.float32), 2, 8, ASYM)
    assert q.shape == (0, 4) and params.tolist() == [[1.0, 0.0], [1.0, 0.0]]


def test_all_zero_and_constant_groups() -> None:
    q, params = ds.quantize(np.zeros(4, np.float32), 2, 8, SYM)
    assert q.tolist() == [0, 0, 0, 0] and params.tolist() == [[1.0], [1.0]]
    q, params = ds.quantize(np.full(4, 2.5, np.float32), 1, 8, ASYM)  # max = min: scale 1, offset 2.5
    assert q.tolist() == [0, 0, 0, 0] and params.tolist() == [[1.0, 2.5]]
    assert ds.dequantize_fp32(q, params, 1, 8, ASYM).tolist() == [2.5] * 4


def test_nonfinite_group_gets_nan_parameters_and_zero_codes() -> None:
    x = np.array([1.0, np.inf, 2.0, 3.0], np.float32)
    for t in (SYM, ASYM):
        q, params = ds.quantize(x, 2, 8, t)
        assert q[:2].tolist() == [0, 0] and np.isnan(params[0]).all() and np.isfinite(params[1]).all()
        y = ds.dequantize_fp32(q, params, 2, 8, t)
        assert np.isnan(y[:2]).all() and np.isfinite(y[2:]).all()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("t", [SYM, ASYM])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_round_trip_error_and_plan_equals_formula(rng: np.random.Generator, bits: int, t: int, dtype: type) -> None:
    groups, e = 6, 7  # odd group size: DeepSpeed needs multiples of 8
    x = (rng.standard_normal(groups * e * 2) * np.exp(rng.uniform(-3, 3))).astype(dtype).reshape(6, 14)
    q, params = ds.quantize(x, groups, bits, t)
    mode = QuantMode.SYMMETRIC if t == SYM else QuantMode.ASYMMETRIC
    codes, ref_params = dsref.group_quantize(x.reshape(groups, -1).astype(np.float32), bits, mode)
    assert np.array_equal(params, ref_params)
    assert np.array_equal(dsref.unpack_codes(q, x.size, bits), codes.reshape(-1))
    y = ds.dequantize_fp32(q, params, groups, bits, t)
    assert np.array_equal(y.reshape(-1), dsref.group_dequantize(codes, params, mode).reshape(-1))
    step = np.repeat(params[:, 0], e * 2).reshape(x.shape)  # 1 / scale: one code step
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    # half a step, or one step where the top of the range clips to 2**(b-1) - 1
    assert np.all(err <= step * (1 + 1e-5) + 1e-6 * np.abs(x.astype(np.float64)))
    y16 = ds.dequantize(q, params, groups, bits, t)
    assert y16.dtype == np.float16 and np.array_equal(y16, y.astype(np.float16))


def test_symmetric_dequantize_runs_on_dequantize_plan(rng: np.random.Generator) -> None:
    codes = rng.integers(-8, 8, size=24)
    packed = reference.pack_nibbles(codes, NibbleOrder.HIGH_FIRST).view(np.int8)
    params = np.exp(rng.uniform(-3, 3, size=(4, 1))).astype(np.float32)
    desc = qp.DequantizeDescriptor(
        shape=(24,),
        scope=qp.GroupScope(group_size=6),
        input_element=qp.ElementKind.S4,
        output_element=qp.ElementKind.F32,
        nibble_order=NibbleOrder.HIGH_FIRST,
    )
    y = np.zeros(24, np.float32)
    qp.DequantizePlan.select(None, desc, qp.PlanPreference(backend=qp.BackendKind.REFERENCE)).run(
        None, None, qp.DequantizeArgs(packed.view(np.uint8), y, params.reshape(4))
    )
    assert np.array_equal(ds.dequantize_fp32(packed, params, 4, 4, SYM), y)
    assert np.array_equal(y, (codes.astype(np.float32) * np.repeat(params[:, 0], 6)).astype(np.float32))


def test_no_group_size_limits() -> None:
    n = 50_000  # above DeepSpeed's 16,384 (quantize) and 40,960 (swizzle) elements per group
    x = np.linspace(-1, 1, n, dtype=np.float32)
    q, params = ds.quantize(x, 1, 8, SYM)
    assert params.tolist() == [[f(1) / f(128)]] and q[0] == -128 and q[-1] == 127
    q, params = ds.swizzle_quant(x, 2, 4, SYM, 1, 2, 1)
    assert q.shape == (n // 2,) and np.isfinite(params).all() and params[0, 0] > 0


def test_bf16_input_is_read_as_bf16() -> None:
    x = np.array([1.0, -2.0, 0.5, 4.0], ml_dtypes.bfloat16)
    q, params = ds.quantize(x, 1, 8, SYM)
    assert q.tolist() == [32, -64, 16, 127] and params.tolist() == [[0.03125]]


def test_argument_errors() -> None:
    x = np.ones(8, np.float32)
    with pytest.raises(qp.InvalidProblem, match="equal groups"):
        ds.quantize(x, 3, 8, SYM)
    with pytest.raises(qp.InvalidProblem, match="num_bits"):
        ds.quantize(x, 2, 6, SYM)
    with pytest.raises(qp.InvalidProblem, match="dtype"):
        ds.quantize(x.astype(np.int32), 2, 8, SYM)
    with pytest.raises(qp.Unsupported):
        ds.quantize(x.astype(np.float64), 2, 8, SYM)
    with pytest.raises(qp.InvalidProblem, match="NumPy array"):
        ds.quantize([1.0, 2.0], 1, 8, SYM)
    q, params = ds.quantize(x, 2, 8, ASYM)
    with pytest.raises(qp.InvalidProblem, match="values"):
        ds.dequantize(q, params[:, :1].copy(), 2, 8, ASYM)
    with pytest.raises(qp.InvalidProblem, match="float32"):
        ds.dequantize(q, params.astype(np.float64), 2, 8, ASYM)
    with pytest.raises(qp.InvalidProblem, match="int8"):
        ds.dequantize(q.astype(np.int16), params, 2, 8, ASYM)
    with pytest.raises(qp.InvalidProblem, match="multiple of"):
        ds.swizzle_quant(x, 2, 8, SYM, 1, 2, 2)  # 2 groups cannot fill 4 partitions
    with pytest.raises(qp.InvalidProblem, match=r"\[0, 1\]"):
        ds.loco_swizzle_quant(x, np.zeros(8, np.float32), 2.0, 2, 8, SYM, 1, 1, 1)
    with pytest.raises(qp.MisalignedOperand):
        ds.loco_swizzle_quant(x, np.zeros(16, np.float32)[::2], 0.5, 2, 8, SYM, 1, 1, 1)


def _bits(a: object) -> np.ndarray:
    """The bits of a NumPy array or PyTorch CPU tensor (bfloat16 as uint16)."""
    import torch

    if isinstance(a, torch.Tensor):
        a = a.view(torch.int16).numpy() if a.dtype is torch.bfloat16 else a.numpy()
    arr = np.ascontiguousarray(a)
    return arr.view({8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}[arr.dtype.itemsize])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_cpu_tensors_run_on_the_reference_backend_with_numpy_bits(rng: np.random.Generator, dtype: str) -> None:
    """PyTorch CPU tensors are served (reference backend): every function returns PyTorch CPU
    tensors with the bits NumPy arrays give, in-place buffers updated the same way."""
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    x32 = (rng.standard_normal((6, 40)) * np.exp(rng.uniform(-3, 3, (6, 1)))).astype(np.float32)
    xt = torch.from_numpy(x32).to(tdtype)
    xn = xt.float().numpy().astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    for bits, mode in ((8, SYM), (4, ASYM)):
        qt, pt = ds.quantize(xt, 12, bits, mode)
        qn, pn = ds.quantize(xn, 12, bits, mode)
        assert isinstance(qt, torch.Tensor) and qt.device.type == "cpu" and tuple(qt.shape) == qn.shape
        assert np.array_equal(_bits(qt), _bits(qn)) and np.array_equal(_bits(pt), _bits(pn))
        assert np.array_equal(
            _bits(ds.dequantize(qt, pt, 12, bits, mode)), _bits(ds.dequantize(qn, pn, 12, bits, mode))
        )
        assert np.array_equal(
            _bits(ds.dequantize_fp32(qt, pt, 12, bits, mode)), _bits(ds.dequantize_fp32(qn, pn, 12, bits, mode))
        )
        st, spt = ds.swizzle_quant(xt, 8, bits, mode, 1, 2, 2)
        sn, spn = ds.swizzle_quant(xn, 8, bits, mode, 1, 2, 2)
        assert np.array_equal(_bits(st), _bits(sn)) and np.array_equal(_bits(spt), _bits(spn))
        rt = ds.quantized_reduction(st, spt, 8, 4, bits, mode, 2)
        rn = ds.quantized_reduction(sn, spn, 8, 4, bits, mode, 2)
        assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(rt, rn, strict=True))
    e32 = (rng.standard_normal(240) * 0.01).astype(np.float32)
    et, en = torch.from_numpy(e32.copy()), e32.copy()
    lt = ds.loco_swizzle_quant(xt, et, 0.5, 8, 4, SYM, 1, 2, 2)
    ln = ds.loco_swizzle_quant(xn, en, 0.5, 8, 4, SYM, 1, 2, 2)
    assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(lt, ln, strict=True))
    assert np.array_equal(_bits(et), _bits(en))  # the error buffer, updated in place
    mt, mn = xt.clone()[:, ::2], xn.copy()[:, ::2]  # non-contiguous: updated in place through a copy
    assert ds.ds_quantize_asym_fp16(mt, 6, 4) is mt
    ds.ds_quantize_asym_fp16(mn, 6, 4)
    assert np.array_equal(_bits(mt.contiguous()), _bits(mn))
    ft, fn = xt.clone(), xn.copy()
    ds.ds_sr_quantize_fp32(ft, 12, 8, rng_seed=11, rng_offset=2)
    ds.ds_sr_quantize_fp32(fn, 12, 8, rng_seed=11, rng_offset=2)
    assert np.array_equal(_bits(ft), _bits(fn))


# ---------------------------------------------------------------------------------------------
# swizzle_quant
# ---------------------------------------------------------------------------------------------


def test_swizzle_order_2_nodes_x_4_devices() -> None:
    # one group of 2 per partition z, holding [z + 1, -(z + 1) / 2]: params identify the partition
    x = np.array([[z + 1.0, -(z + 1.0) / 2] for z in range(8)], np.float32).reshape(-1)
    q, params = ds.swizzle_quant(x, 8, 8, SYM, 1, 2, 4)
    assert q.shape == (16,) and q.dtype == np.int8 and params.shape == (8, 1)
    partitions = np.rint(params[:, 0] * 128).astype(int) - 1  # stored 1/scale = (z + 1) / 128
    assert partitions.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert q.tolist() == [127, -64] * 8  # codes travel with their group


def test_swizzle_order_with_pipeline_2() -> None:
    x = np.repeat(np.arange(1, 17, dtype=np.float32), 2)  # slice z * 2 + p holds the value z * 2 + p + 1
    q, params = ds.swizzle_quant(x, 16, 8, SYM, 2, 2, 4)
    slices = np.rint(params[:, 0] * 128).astype(int) - 1
    assert slices.tolist() == [0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15]


def test_swizzle_int4_asymmetric_interleaved_params() -> None:
    # 2 nodes x 2 devices, one group of 2 per partition: [lo, hi] = [z, z + 4] -> offset z + 2, 1/scale 0.25
    x = np.array([[z, z + 4.0] for z in range(4)], np.float32).reshape(-1)
    q, params = ds.swizzle_quant(x, 4, 4, ASYM, 1, 2, 2)
    assert params.tolist() == [[0.25, 2.0], [0.25, 4.0], [0.25, 3.0], [0.25, 5.0]]  # partitions 0 2 1 3
    assert q.view(np.uint8).tolist() == [0x87] * 4  # -8 (0x8) high, 8 -> 7 low


# ---------------------------------------------------------------------------------------------
# quantized_reduction
# ---------------------------------------------------------------------------------------------


def test_quantized_reduction_hand_vector() -> None:
    # chunk 0: codes [32, -64] with 1/scale 1/32 -> [1, -2]; chunk 1: [64, 16] with 1/16 -> [4, 1]
    q = np.array([32, -64, 64, 16], np.int8)
    params = np.array([[0.03125], [0.0625]], np.float32)
    out, out_params = ds.quantized_reduction(q, params, 2, 1, 8, SYM, 2)
    # sum [5, -1]: scale = 128 / 5; 5 -> 128 clips to 127; -1 * 25.6 = -25.6 -> -26
    assert out.shape == (2,) and out.tolist() == [127, -26]
    assert out_params.tolist() == [[f(1) / (f(128) / f(5))]]


def test_quantized_reduction_sums_in_float32_not_fp16() -> None:
    # 2048 + 1 = 2049 in float32; fp16 would round it to 2048 (spacing 2)
    q = np.array([127, 127], np.int8)
    params = np.array([[2048 / 127], [1 / 127]], np.float32)
    y0 = f(127) * params[0, 0]
    y1 = f(127) * params[1, 0]
    total = f(y0 + y1)
    assert np.float16(y0) + np.float16(y1) != total
    _, out_params = ds.quantized_reduction(q, params, 2, 1, 8, SYM, 2)
    assert out_params.tolist() == [[f(1) / (f(128) / total)]]


def test_quantized_reduction_shapes_and_asymmetric(rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 16)).astype(np.float32)
    q, params = ds.quantize(x, 12, 4, ASYM)  # (3, 8) bytes, 12 groups of 4
    out, out_params = ds.quantized_reduction(q, params, 12, 4, 4, ASYM, 2)
    assert out.shape == (3, 4) and out_params.shape == (4, 2)
    # against the formula: chunk j = elements [24 j, 24 j + 24), params rows [6 j, 6 j + 6)
    y = dsref.group_dequantize(dsref.unpack_codes(q, 48, 4).reshape(12, 4), params, QuantMode.ASYMMETRIC).reshape(-1)
    total = (y[:24] + y[24:]).astype(np.float32)
    codes, ref_params = dsref.group_quantize(total.reshape(4, 6), 4, QuantMode.ASYMMETRIC)
    assert np.array_equal(out_params, ref_params)
    assert np.array_equal(dsref.unpack_codes(out, 24, 4), codes.reshape(-1))
    # a last dimension that does not split by devices_per_node gives a flat output
    q3, p3 = ds.quantize(np.ones((2, 3), np.float32), 2, 8, SYM)
    assert ds.quantized_reduction(q3, p3, 2, 1, 8, SYM, 2)[0].shape == (3,)


@pytest.mark.parametrize("bits", [4, 8])
def test_qgz_flow_2_nodes_x_2_devices(rng: np.random.Generator, bits: int) -> None:
    nodes, dpn, e = 2, 2, 16
    ranks = nodes * dpn
    part = 32  # elements per partition
    numel = ranks * part
    groups = numel // e
    grads = [rng.standard_normal(numel).astype(np.float16) for _ in range(ranks)]
    sent = [ds.swizzle_quant(g, groups, bits, SYM, 1, nodes, dpn) for g in grads]
    chunk_bytes = numel * bits // 8 // dpn  # what each local device receives from each peer
    chunk_groups = groups // dpn
    out_groups = nodes * part // 8  # re-quantize in groups of 8
    reduced = {}
    for n in range(nodes):
        for d in range(dpn):
            peers = [n * dpn + j for j in range(dpn)]
            q_in = np.concatenate([sent[p][0][d * chunk_bytes : (d + 1) * chunk_bytes] for p in peers])
            p_in = np.concatenate([sent[p][1][d * chunk_groups : (d + 1) * chunk_groups] for p in peers])
            reduced[n, d] = ds.quantized_reduction(q_in, p_in, groups, out_groups, bits, SYM, dpn)
    q_max = 2 ** (bits - 1) - 1
    amax = max(float(np.abs(g.astype(np.float64)).max()) for g in grads)
    seg_bytes = part * bits // 8
    seg_groups = out_groups // nodes
    for n_dst in range(nodes):
        for d in range(dpn):
            total = np.zeros(part, np.float32)
            for n_src in range(nodes):
                q_r, p_r = reduced[n_src, d]
                seg = q_r[n_dst * seg_bytes : (n_dst + 1) * seg_bytes]
                total = (
                    total
                    + ds.dequantize_fp32(seg, p_r[n_dst * seg_groups : (n_dst + 1) * seg_groups], seg_groups, bits, SYM)
                ).astype(np.float32)
            z = n_dst * dpn + d
            exact = sum(g.astype(np.float64)[z * part : (z + 1) * part] for g in grads)
            # step = 2 absmax / 2**b; half a step per quantization, a whole one where +absmax clips
            step1 = 2 * amax / 2**bits
            step2 = 2 * dpn * amax / 2**bits
            bound = ranks * step1 + nodes * step2
            err = np.abs(total.astype(np.float64) - exact)
            assert 0 < err.max() <= bound, (z, err.max(), bound, q_max)


# ---------------------------------------------------------------------------------------------
# LoCo
# ---------------------------------------------------------------------------------------------


def test_loco_swizzle_quant_hand_vector() -> None:
    x = np.array([8.0, 1.0], np.float32)
    err = np.zeros(2, np.float16)
    # absmax 8: scale 16; 8 * 16 = 128 clips to 127 -> dequant 7.9375; r = [0.0625, 0]; e = .5 * r
    q, params = ds.loco_swizzle_quant(x, err, 0.5, 1, 8, SYM, 1, 1, 1)
    assert q.tolist() == [127, 16] and params.tolist() == [[0.0625]]
    assert err.tolist() == [0.03125, 0.0]
    # second step: v = [8.03125, 1]; checked against the written-out float32 formula
    v = np.array([8.03125, 1.0], np.float32)
    scale = f(128) / f(8.03125)
    codes = np.clip(np.rint((v * scale).astype(np.float32)), -128, 127)
    d = (codes.astype(np.float32) * (f(1) / scale)).astype(np.float32)
    e_want = (f(0.5) * err.astype(np.float32) + (f(0.5) * (v - d)).astype(np.float32)).astype(np.float16)
    q, params = ds.loco_swizzle_quant(x, err, 0.5, 1, 8, SYM, 1, 1, 1)
    assert q.tolist() == codes.tolist() and params.tolist() == [[f(1) / scale]]
    assert err.tolist() == e_want.tolist()


def test_loco_quantized_reduction_hand_vector() -> None:
    q = np.array([64, 16, 64, 0], np.int8)  # chunk 0 -> [4, 1], chunk 1 -> [4, 0] (1/scale 1/16)
    params = np.array([[0.0625], [0.0625]], np.float32)
    err = np.array([0.0, 0.5], np.float32)
    out, out_params = ds.loco_quantized_reduction(q, params, err, 0.25, 2, 1, 8, SYM, 2)
    # v = [8, 1.5]: scale 16; q = [127 (clipped), 24]; dequant [7.9375, 1.5]; r = [0.0625, 0]
    assert out.tolist() == [127, 24] and out_params.tolist() == [[0.0625]]
    assert err.tolist() == [0.75 * 0.0625, 0.25 * 0.5]


def test_loco_error_buffer_dtypes_and_order(rng: np.random.Generator) -> None:
    x = rng.standard_normal(64).astype(ml_dtypes.bfloat16)
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        err = (rng.standard_normal(64) * 0.01).astype(dtype)
        e0 = err.copy()
        q, params = ds.loco_swizzle_quant(x, err, 0.9, 8, 4, ASYM, 1, 2, 2)
        # the buffer stays in input order: equal to the unswizzled computation
        q0, p0, e_ref = dsref.swizzled_quantize(x, 8, 4, QuantMode.ASYMMETRIC, error=e0, error_beta=0.9)
        assert err.dtype == dtype and np.array_equal(err, e_ref)
        assert np.array_equal(np.sort(params, axis=0), np.sort(p0, axis=0))


# ---------------------------------------------------------------------------------------------
# MoQ fake quantization
# ---------------------------------------------------------------------------------------------


def test_moq_symmetric_fp32_returns_values_not_codes() -> None:
    vals = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
    out = ds.ds_quantize_fp32(vals, 1, 8)
    assert out is vals  # in place
    scale = f(256) / (f(8) + f(1e-5))
    codes = np.clip(np.rint(np.array([1.0, -2.0, 0.5, 4.0], np.float32) * scale), -128, 127)
    assert codes.tolist() == [32, -64, 16, 127]
    assert vals.tolist() == (codes.astype(np.float32) / scale).astype(np.float32).tolist()
    assert np.abs(vals - [1.0, -2.0, 0.5, 4.0]).max() < 0.04  # DeepSpeed's fp32 kernel returns 32, -64, ...


def test_moq_symmetric_fp16_and_bf16() -> None:
    for dtype in (np.float16, ml_dtypes.bfloat16):
        vals = np.array([1.0, -2.0, 0.5, 4.0], dtype)
        ds.ds_quantize_fp16(vals, 1, 8)
        scale = f(256) / (f(8) + f(1e-5))
        want = (np.array([32, -64, 16, 127], np.float32) / scale).astype(np.float32).astype(dtype)
        assert vals.dtype == dtype and vals.tolist() == want.tolist()


def test_moq_asymmetric_hand_vector() -> None:
    vals = np.array([-1.0, 3.0, 0.0, 1.0], np.float32)
    ds.ds_quantize_asym_fp32(vals, 1, 2)
    step = (f(4) + f(1e-5)) / f(4)
    w = ((np.array([-1.0, 3.0, 0.0, 1.0], np.float32) + f(1)) / step).astype(np.float32)
    codes = np.floor(w + 0.5)  # round half away (w >= 0)
    assert codes.tolist() == [0, 4, 1, 2]  # the maximum reaches 2**b (no clamp, as DeepSpeed)
    assert vals.tolist() == ((codes.astype(np.float32) * step).astype(np.float32) - f(1)).tolist()


def test_moq_round_half_away_from_zero() -> None:
    w = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.4999998], np.float32)
    assert dsref._round_half_away(w).tolist() == [1, 2, 3, -1, -3, 2]


def test_moq_stochastic_symmetric_uses_philox_and_truncation(rng: np.random.Generator) -> None:
    x = rng.standard_normal(64).astype(np.float32)
    vals = x.copy()
    ds.ds_sr_quantize_fp32(vals, 4, 4, rng_seed=123, rng_offset=7)
    u = uniform_for_elements(64, 123, 7).astype(np.float32).reshape(4, 16)
    g = x.reshape(4, 16)
    scale = f(16) / ((f(2) * np.abs(g).max(axis=1, keepdims=True)) + f(1e-5))
    w = (g * scale).astype(np.float32)
    t = np.trunc(w)
    q = np.clip(t + np.sign(w) * (u < np.abs(w - t)), -8, 7)
    assert vals.tolist() == (q.astype(np.float32) / scale).astype(np.float32).reshape(-1).tolist()
    # same seed and offset: same draws; the module state advances the offset per call
    again = x.copy()
    ds.ds_sr_quantize_fp16(again, 4, 4, rng_seed=123, rng_offset=7)
    assert np.array_equal(again, vals)
    ds.manual_seed(5)
    a, b = x.copy(), x.copy()
    ds.ds_sr_quantize_fp32(a, 4, 4)
    ds.ds_sr_quantize_fp32(b, 4, 4)
    ds.manual_seed(5)
    c = x.copy()
    ds.ds_sr_quantize_fp32(c, 4, 4)
    assert np.array_equal(a, c) and not np.array_equal(a, b)


def test_moq_stochastic_asymmetric_runs_the_asymmetric_formula(rng: np.random.Generator) -> None:
    x = rng.uniform(1.0, 5.0, size=32).astype(np.float32)  # all positive: a symmetric grid would differ
    vals = x.copy()
    ds.ds_sr_quantize_asym_fp32(vals, 2, 3, rng_seed=9, rng_offset=0)
    u = uniform_for_elements(32, 9, 0)
    want = dsref.moq_fake_quantize(x, 2, 3, QuantMode.ASYMMETRIC, u)
    assert np.array_equal(vals, want)
    g = x.reshape(2, 16)
    lo = g.min(axis=1, keepdims=True)
    step = (((g.max(axis=1, keepdims=True) - lo) + f(1e-5)) / f(8)).astype(np.float32)
    k = (vals.reshape(2, 16) - lo) / step  # on the asymmetric grid min + k * step
    assert np.allclose(k, np.rint(k), atol=1e-3) and np.abs(vals - x).max() <= step.max() * 1.001
    sym = x.copy()
    ds.ds_sr_quantize_fp32(sym, 2, 3, rng_seed=9, rng_offset=0)
    assert not np.array_equal(sym, vals)


def test_moq_nonfinite_group_and_non_contiguous_vals() -> None:
    vals = np.array([1.0, np.nan, 2.0, 3.0], np.float32)
    ds.ds_quantize_asym_fp32(vals, 2, 8)
    assert np.isnan(vals[:2]).all() and np.isfinite(vals[2:]).all()
    base = np.arange(16, dtype=np.float32).reshape(4, 4)
    view = base[:, ::2]  # non-contiguous: computed on a copy and written back
    want = view.copy()
    ds.ds_quantize_fp32(want, 2, 8)
    out = ds.ds_quantize_fp32(view, 2, 8)
    assert out is view and np.array_equal(base[:, ::2], want) and base[0, 1] == 1.0
    with pytest.raises(qp.InvalidProblem):
        ds.ds_quantize_fp32(np.ones(6, np.float32), 4, 8)
