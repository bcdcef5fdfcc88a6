"""GPU: quantplan.compat.deepspeed on CuPy arrays and PyTorch CUDA tensors equals its NumPy run bit for bit.

The contract: each function, given device arrays, returns arrays of the same library on the
same device whose bits (shapes and dtypes included) equal the results of the same function on
NumPy copies of the data; LoCo error buffers and MoQ values are updated in place. Covered:

* ``quantize``: float16 / bfloat16 / float32 x 8 / 4 bits x symmetric / asymmetric x ragged
  groups (odd sizes for 8 bits, even for 4), groups of 1 and 2 elements, 8 groups of 2048,
  groups of 40000 (above 32768: the two-pass path), 1-D / 2-D / 3-D inputs and the flat 4-bit
  output of an odd last dimension; non-finite groups (NaN, -inf, all zero, a float32-overflowing
  range) give NaN parameter rows and zero codes, identically.
* ``swizzle_quant``: (nodes, devices_per_node, pipeline) in (2, 4, 1), (1, 2, 1), (2, 2, 2),
  and groups of 40000.
* ``loco_swizzle_quant`` / ``loco_quantized_reduction``: every error-buffer dtype against every
  input dtype, two steps; codes, parameters and the in-place buffer.
* ``dequantize`` / ``dequantize_fp32`` on codes from ``quantize``.
* ``quantized_reduction``: 1, 3 and 4 devices per node, input and output groups of different
  (ragged, large) sizes, structured and flat codes.
* The dense and cluster passes (float16 / bfloat16 groups of ``team * 8 * nv``, no LoCo): every
  team shape (one thread to a block, many and few groups, a cluster of 8 blocks of 32 / 128 / 256
  threads per group), 8 / 4 bits, both modes; groups at and beyond the
  edges of their division-free path (all equal, zero, subnormal, huge, overflowing, NaN, inf);
  the swizzle map; MoQ nearest symmetric at 8 / 4 / 1 bits; a misaligned input; the dense
  quantized reduction (output groups of team * 8) on 1 / 3 / 8 peers, with non-finite and extreme sums.
* MoQ: the eight ``ds_[sr_]quantize[_asym]_fp16/32`` functions on every dtype, 8 / 4 / 3 bits,
  ragged and 40000-element groups, non-finite groups; the stochastic ones with explicit
  ``rng_seed`` / ``rng_offset`` (same Philox draws) and with the module seed.
* PyTorch CUDA tensors (torch in, torch out): int4 asymmetric bfloat16 quantize and dequantize,
  swizzle, reduction, LoCo with torch error buffers, stochastic MoQ.
* Errors: NumPy / CuPy / torch operands mixed in one call, a non-contiguous CuPy LoCo buffer
  (raised before anything is written). Outputs on a second GPU stay there (two GPUs only).

Fresh random data each run (the ``rng`` fixture prints its seed). CuPy bfloat16 arrays need a
CuPy with the ``ml_dtypes`` bfloat16 dtype; without one those cases skip (torch covers bfloat16).
"""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import first_mismatch, float_bits_equal, random_floats

import quantplan as qp
from quantplan.compat import deepspeed as ds
from quantplan.reference import deepspeed_format as dsref
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
KINDS = [EK.F16, EK.BF16, EK.F32]
KIND_IDS = [k.value for k in KINDS]
SYM, ASYM = ds.Symmetric, ds.Asymmetric
QUANT_TYPES = pytest.mark.parametrize("quant_type", [SYM, ASYM], ids=["sym", "asym"])
FLOAT_NAMES = {"float16", "bfloat16", "float32"}
BETA = 0.7
MOQ_FUNCTIONS = [
    "ds_quantize_fp16",
    "ds_quantize_fp32",
    "ds_sr_quantize_fp16",
    "ds_sr_quantize_fp32",
    "ds_quantize_asym_fp16",
    "ds_quantize_asym_fp32",
    "ds_sr_quantize_asym_fp16",
    "ds_sr_quantize_asym_fp32",
]


# ---- helpers ---------------------------------------------------------------------------------------


def dtype_of(kind: EK) -> np.dtype:
    return np.dtype(ELEMENTS[kind].numpy_dtype)


@functools.cache
def cupy_has_bfloat16() -> bool:
    import cupy

    try:
        return bool(cupy.asarray(np.zeros(1, BF16)).dtype == BF16)
    except Exception:  # CuPy without ml_dtypes' bfloat16
        return False


def to_cupy(a: np.ndarray) -> Any:
    """A CuPy copy of ``a`` on the current device (bfloat16 as CuPy's bfloat16; skips without one)."""
    import cupy

    if a.dtype == BF16 and not cupy_has_bfloat16():
        pytest.skip("this CuPy has no bfloat16 dtype (CuPy >= 14 with ml_dtypes); torch tests cover bfloat16")
    return cupy.asarray(a)


def to_torch(a: np.ndarray) -> Any:
    """A PyTorch CUDA copy of ``a`` (bfloat16 through its int16 bits)."""
    import torch

    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(a.copy()).cuda()


def to_numpy(a: Any) -> np.ndarray:
    """A NumPy array with the bits of CuPy array / torch tensor ``a`` (bfloat16 as ml_dtypes.bfloat16)."""
    if isinstance(a, np.ndarray):
        return a
    if type(a).__module__.startswith("torch"):
        import torch

        t = a.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(BF16)
        return t.numpy()
    import cupy

    assert isinstance(a, cupy.ndarray), f"expected a CuPy array or a torch tensor, got {type(a).__name__}"
    return cupy.asnumpy(a)


def assert_same_bits(got: Any, want: np.ndarray, what: str) -> None:
    """``got`` (device or NumPy) has ``want``'s shape, dtype and bits (floats: any NaN equals any NaN)."""
    g = to_numpy(got)
    assert g.shape == want.shape, f"{what}: shape {g.shape}, NumPy gives {want.shape}"
    assert g.dtype == want.dtype, f"{what}: dtype {g.dtype}, NumPy gives {want.dtype}"
    if g.dtype.name in FLOAT_NAMES:
        assert float_bits_equal(g, want), f"{what}: {first_mismatch(g, want)}"
        return
    gb, wb = np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)
    assert np.array_equal(gb, wb), f"{what}: {first_mismatch(gb, wb)}"


def assert_on_device(out: Any, like: Any, what: str) -> None:
    """``out`` is an array of ``like``'s library on ``like``'s device."""
    if type(like).__module__.startswith("torch"):
        import torch

        assert isinstance(out, torch.Tensor), f"{what}: torch in, {type(out).__name__} out"
        assert out.device == like.device, f"{what}: on {out.device}, input on {like.device}"
        return
    import cupy

    assert isinstance(out, cupy.ndarray), f"{what}: CuPy in, {type(out).__name__} out"
    assert out.device.id == like.device.id, f"{what}: on device {out.device.id}, input on {like.device.id}"


def assert_outputs(got: tuple[Any, Any], want: tuple[np.ndarray, np.ndarray], like: Any, what: str) -> None:
    """``(codes, params)`` from the device equal NumPy's and live beside ``like``."""
    assert isinstance(got, tuple) and len(got) == 2, f"{what}: expected (codes, params), got {type(got).__name__}"
    for name, g, w in zip(("codes", "params"), got, want, strict=True):
        assert_on_device(g, like, f"{what}: {name}")
        assert_same_bits(g, w, f"{what}: {name}")


def bits_changed(before: np.ndarray, after: Any) -> bool:
    return not np.array_equal(np.ascontiguousarray(before).view(np.uint8), to_numpy(after).view(np.uint8))


def with_special_groups(x: np.ndarray, groups: int) -> np.ndarray:
    """Group 1 holds a NaN, group 2 a -inf, group 3 is all zero, group 4 spans [-max, max] of the dtype
    (a range that overflows float32 for bfloat16 / float32); needs at least 5 groups of 2 or more."""
    flat = x.reshape(-1).copy()
    e = flat.size // groups
    assert groups >= 5 and e >= 2
    big = ml_dtypes.finfo(flat.dtype).max
    flat[e + e // 2] = np.nan
    flat[3 * e - 1] = -np.inf
    flat[3 * e : 4 * e] = 0
    flat[4 * e], flat[5 * e - 1] = big, -big
    return flat.reshape(x.shape)


def torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    return torch


def case(bits: int, shape: tuple[int, ...], groups: int) -> Any:
    size = int(np.prod(shape)) // groups
    return pytest.param(bits, shape, groups, id=f"{bits}b-{'x'.join(map(str, shape))}-g{groups}of{size}")


# ---- quantize / dequantize -------------------------------------------------------------------------

QUANTIZE_CASES = [
    case(8, (3, 1000), 24),  # ragged odd groups of 125
    case(8, (1000,), 8),
    case(8, (5, 7, 33), 11),  # odd groups of 105 across rows
    case(8, (4, 6), 24),  # groups of 1
    case(8, (8, 2048), 8),
    case(8, (2, 40000), 2),  # above 32768: two-pass
    case(4, (3, 1000), 30),  # groups of 100
    case(4, (1000,), 4),  # groups of 250
    case(4, (6, 77), 3),  # odd last dimension: flat output
    case(4, (4, 6), 12),  # groups of 2
    case(4, (8, 2048), 8),
    case(4, (2, 40000), 2),
    case(4, (10, 99), 10),  # odd 4-bit groups of 99 (an even total): the two-pass path, pairs across groups
]


@pytest.mark.parametrize("bits,shape,groups", QUANTIZE_CASES)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@QUANT_TYPES
def test_quantize_matches_numpy(
    rng: np.random.Generator, bits: int, shape: tuple, groups: int, kind: EK, quant_type: int
) -> None:
    x = random_floats(rng, shape, kind)
    x_dev = to_cupy(x)
    assert_outputs(
        ds.quantize(x_dev, groups, bits, quant_type), ds.quantize(x, groups, bits, quant_type), x_dev, "quantize"
    )
    assert_same_bits(x_dev, x, "input (left alone)")


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@QUANT_TYPES
def test_quantize_nonfinite_and_zero_groups(rng: np.random.Generator, bits: int, kind: EK, quant_type: int) -> None:
    groups = 8
    x = with_special_groups(random_floats(rng, (8, 250), kind, specials=False), groups)
    x_dev = to_cupy(x)
    q, params = ds.quantize(x_dev, groups, bits, quant_type)
    assert_outputs((q, params), ds.quantize(x, groups, bits, quant_type), x_dev, "quantize")
    p = to_numpy(params)
    assert np.isnan(p[1:3]).all() and not np.isnan(p[3]).any() and p[3, 0] == 1.0
    codes = dsref.unpack_codes(to_numpy(q), x.size, bits).reshape(groups, -1)
    assert not codes[1:4].any()  # NaN / -inf groups and the zero group: codes 0
    y = ds.dequantize_fp32(q, params, groups, bits, quant_type)
    assert_same_bits(y, ds.dequantize_fp32(to_numpy(q), p, groups, bits, quant_type), "dequantize_fp32")
    assert np.isnan(to_numpy(y).reshape(groups, -1)[1:3]).all()


DEQUANTIZE_CASES = [
    case(8, (3, 1000), 24),
    case(8, (2, 40000), 2),
    case(4, (3, 1000), 30),
    case(4, (6, 77), 3),  # flat codes
    case(4, (2, 40000), 2),
    case(4, (10, 99), 10),  # odd 4-bit groups of 99 (an even total): the two-pass path, pairs across groups
]


@pytest.mark.parametrize("bits,shape,groups", DEQUANTIZE_CASES)
@pytest.mark.parametrize("name", ["dequantize", "dequantize_fp32"])
@QUANT_TYPES
def test_dequantize_matches_numpy(
    rng: np.random.Generator, bits: int, shape: tuple, groups: int, name: str, quant_type: int
) -> None:
    q, params = ds.quantize(random_floats(rng, shape, EK.F16), groups, bits, quant_type)
    q_dev, p_dev = to_cupy(q), to_cupy(params)
    fn = getattr(ds, name)
    y = fn(q_dev, p_dev, groups, bits, quant_type)
    assert_on_device(y, q_dev, name)
    assert_same_bits(y, fn(q, params, groups, bits, quant_type), name)


# ---- the dense passes (16-bit groups of team * 8 * nv elements) -------------------------------------

# (shape, groups): every (team, vectors per thread) shape class of deepspeed_quantize_dense and
# moq_fake_quantize_dense: teams of 1, a few lanes, a warp, several warps and a full block; many
# groups (4 lanes x 4 vectors, the large-problem shape) and few (widened: for quantize, 16 lanes x
# 1 vector is deepspeed_quantize_lanes, also with a part block); and few long groups, which take a
# thread-block cluster per group on sm_90 (the cluster passes).
DENSE_CASES = [
    pytest.param((70000, 128), 70000, id="70000g-of-128"),  # 4 lanes x 4 vectors
    pytest.param((64, 128), 64, id="64g-of-128"),  # widened: 16 lanes x 1 vector
    pytest.param((16, 8192), 1024, id="1024g-of-128"),  # 16 lanes x 1 vector: the 16 x 8192 row
    pytest.param((37, 128), 37, id="37g-of-128"),  # 16 lanes x 1 vector, the last block in part
    pytest.param((40, 8192), 40, id="40g-of-8192"),  # a block of 256 x 4 vectors per group
    pytest.param((40, 512), 40, id="40g-of-512"),  # 64 threads x 1 vector: a team over two warps
    pytest.param((100, 256), 100, id="100g-of-256"),  # a warp x 1 vector
    pytest.param((3, 16), 6, id="6g-of-8"),  # a team of one thread
    pytest.param((16, 8192), 16, id="16g-of-8192"),  # cluster: 8 blocks of 128
    pytest.param((6, 16384), 6, id="6g-of-16384"),  # cluster: 8 blocks of 256
    pytest.param((8, 2048), 8, id="8g-of-2048"),  # cluster: 8 blocks of 32
]
DENSE_KINDS = pytest.mark.parametrize("kind", [EK.F16, EK.BF16], ids=["float16", "bfloat16"])


def extreme_groups(kind: EK, groups: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``groups`` groups of ``size`` (at least 8 groups): normal data, then groups outside the dense
    passes' division-free range or at its edges: all equal (span 0), all zero, tiny (subnormal for
    bfloat16), +-huge (a range above 2**100 for bfloat16), equal huge values (max + min overflows for
    bfloat16), a NaN, an +inf."""
    dt = dtype_of(kind)
    finfo = ml_dtypes.finfo(dt)
    x = random_floats(rng, (groups, size), kind, specials=False).astype(np.float32)
    x[1] = 3.0
    x[2] = 0.0
    x[3] = rng.standard_normal(size) * float(finfo.smallest_subnormal) * 4
    x[4] = rng.standard_normal(size) * float(finfo.max) / 8
    x[5] = float(finfo.max)
    x[6, size // 2] = np.nan
    x[7, 0] = np.inf
    with np.errstate(over="ignore"):
        return x.astype(dt)


@pytest.mark.parametrize("shape,groups", DENSE_CASES)
@pytest.mark.parametrize("bits", [8, 4])
@DENSE_KINDS
@QUANT_TYPES
def test_dense_quantize_matches_numpy(
    rng: np.random.Generator, shape: tuple, groups: int, bits: int, kind: EK, quant_type: int
) -> None:
    x = random_floats(rng, shape, kind)
    x_dev = to_cupy(x)
    assert_outputs(
        ds.quantize(x_dev, groups, bits, quant_type), ds.quantize(x, groups, bits, quant_type), x_dev, "quantize"
    )


# (groups, size) of the extreme-value tests: dense teams of 1, 16 and 256 threads, and clusters.
EXTREME_CASES = [(12, 8), (12, 128), (12, 1024), (40, 8192), (12, 8192)]


@pytest.mark.parametrize("groups,size", EXTREME_CASES)
@pytest.mark.parametrize("bits", [8, 4])
@DENSE_KINDS
@QUANT_TYPES
def test_dense_quantize_extreme_groups(
    rng: np.random.Generator, groups: int, size: int, bits: int, kind: EK, quant_type: int
) -> None:
    x = extreme_groups(kind, groups, size, rng)
    x_dev = to_cupy(x)
    want = ds.quantize(x, groups, bits, quant_type)
    assert_outputs(ds.quantize(x_dev, groups, bits, quant_type), want, x_dev, "quantize")
    assert np.isnan(want[1][6:8]).all()


@pytest.mark.parametrize("split", [(2, 4, 1), (2, 2, 2), (1, 8, 1)], ids=lambda s: "n{}d{}p{}".format(*s))
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("groups", [512, 2048], ids=["g512", "g2048"])
@QUANT_TYPES
def test_dense_swizzle_quant_matches_numpy(
    rng: np.random.Generator, split: tuple[int, int, int], bits: int, groups: int, quant_type: int
) -> None:
    # Groups of 512 through the swizzle map; groups of 128 (16 lanes x 1 vector): the dense pass
    # where the map is not the identity, the lanes pass where it is (1 node: n1d8p1).
    nodes, dpn, pipeline = split
    x = random_floats(rng, (64, 4096), EK.F16)
    x_dev = to_cupy(x)
    got = ds.swizzle_quant(x_dev, groups, bits, quant_type, pipeline, nodes, dpn)
    want = ds.swizzle_quant(x, groups, bits, quant_type, pipeline, nodes, dpn)
    assert_outputs(got, want, x_dev, "swizzle_quant")


@pytest.mark.parametrize(
    "numel,groups,split,variant",
    [
        (16 * 8192, 1024, (1, 1, 1), "lanes[16t-per-group,1vec8-per-thread]"),
        (37 * 128, 37, (1, 1, 1), "lanes[16t-per-group,1vec8-per-thread]"),
        (64 * 4096, 2048, (1, 8, 1), "lanes[16t-per-group,1vec8-per-thread]"),
        (64 * 4096, 2048, (2, 4, 1), "dense[16t-per-group,1vec8-per-thread]"),
        (8192 * 8192, 8192 * 64, (1, 1, 1), "dense[4t-per-group,4vec8-per-thread]"),
    ],
)
@pytest.mark.parametrize("bits", [8, 4])
@QUANT_TYPES
def test_dense_quantize_variants(
    numel: int, groups: int, split: tuple[int, int, int], variant: str, bits: int, quant_type: int
) -> None:
    # The pass each shape selects: the lanes pass only for 16 lanes x 1 vector under the identity map.
    from quantplan.ops.deepspeed_format import DeepSpeedQuantizeDescriptor, DeepSpeedQuantizePlan

    nodes, dpn, pipeline = split
    mode = qp.QuantMode.ASYMMETRIC if quant_type == ASYM else qp.QuantMode.SYMMETRIC
    desc = DeepSpeedQuantizeDescriptor(
        numel=numel,
        groups=groups,
        num_bits=bits,
        mode=mode,
        input_element=EK.F16,
        nodes=nodes,
        devices_per_node=dpn,
        pipeline=pipeline,
    )
    assert DeepSpeedQuantizePlan.select(None, desc).sku().variant == f"deepspeed-format:{variant}"


@pytest.mark.parametrize("shape,groups", DENSE_CASES)
@pytest.mark.parametrize("bits", [8, 4, 1])
@DENSE_KINDS
def test_dense_moq_matches_numpy(rng: np.random.Generator, shape: tuple, groups: int, bits: int, kind: EK) -> None:
    run_moq_both(rng, "ds_quantize_fp16", random_floats(rng, shape, kind), groups, bits, to_cupy)


@pytest.mark.parametrize("groups,size", EXTREME_CASES)
@DENSE_KINDS
def test_dense_moq_extreme_groups(rng: np.random.Generator, groups: int, size: int, kind: EK) -> None:
    run_moq_both(rng, "ds_quantize_fp16", extreme_groups(kind, groups, size, rng), groups, 8, to_cupy)


def test_dense_quantize_misaligned_input_matches_numpy(rng: np.random.Generator) -> None:
    wide = random_floats(rng, (64 * 128 + 1,), EK.F16)
    x, x_dev = wide[1:], to_cupy(wide)[1:]  # one element in: the element-I/O twin
    assert_outputs(ds.quantize(x_dev, 64, 8, SYM), ds.quantize(x, 64, 8, SYM), x_dev, "quantize")


# ---- swizzle / LoCo swizzle --------------------------------------------------------------------------

SPLITS = [(2, 4, 1), (1, 2, 1), (2, 2, 2)]  # (nodes, devices_per_node, pipeline)
SWIZZLE_GROUPS = {8: 64, 4: 96}  # of (4, 1200): odd groups of 75 (8 bits), even groups of 50 (4 bits)


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "n{}d{}p{}".format(*s))
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@QUANT_TYPES
def test_swizzle_quant_matches_numpy(
    rng: np.random.Generator, split: tuple[int, int, int], bits: int, kind: EK, quant_type: int
) -> None:
    nodes, dpn, pipeline = split
    groups = SWIZZLE_GROUPS[bits]
    x = random_floats(rng, (4, 1200), kind)
    x_dev = to_cupy(x)
    got = ds.swizzle_quant(x_dev, groups, bits, quant_type, pipeline, nodes, dpn)
    assert_outputs(got, ds.swizzle_quant(x, groups, bits, quant_type, pipeline, nodes, dpn), x_dev, "swizzle_quant")


@pytest.mark.parametrize("bits", [8, 4])
@QUANT_TYPES
def test_swizzle_quant_groups_above_32768(rng: np.random.Generator, bits: int, quant_type: int) -> None:
    x = random_floats(rng, (8, 40000), EK.F16)
    x_dev = to_cupy(x)
    got = ds.swizzle_quant(x_dev, 8, bits, quant_type, 1, 2, 4)
    assert_outputs(got, ds.swizzle_quant(x, 8, bits, quant_type, 1, 2, 4), x_dev, "swizzle_quant")


@pytest.mark.parametrize("err_kind", KINDS, ids=[f"err-{k}" for k in KIND_IDS])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("bits", [8, 4])
@QUANT_TYPES
def test_loco_swizzle_quant_matches_numpy(
    rng: np.random.Generator, err_kind: EK, kind: EK, bits: int, quant_type: int
) -> None:
    shape, groups = (4, 1000), {8: 32, 4: 40}[bits]  # groups of 125 / 100; 2 nodes x 2 devices
    e_np = (rng.standard_normal(shape) * 0.01).astype(dtype_of(err_kind))
    e_dev = to_cupy(e_np)
    for step in range(2):
        x = random_floats(rng, shape, kind, specials=False)
        before = e_np.copy()
        want = ds.loco_swizzle_quant(x, e_np, BETA, groups, bits, quant_type, 1, 2, 2)
        x_dev = to_cupy(x)
        got = ds.loco_swizzle_quant(x_dev, e_dev, BETA, groups, bits, quant_type, 1, 2, 2)
        assert_outputs(got, want, x_dev, f"step {step}")
        assert_same_bits(e_dev, e_np, f"step {step}: error buffer (in place)")
        assert bits_changed(before, e_dev), f"step {step}: error buffer not updated"


# ---- quantized reduction / LoCo reduction -------------------------------------------------------------

# (bits, chunk elements per peer, input group size, output group size)
REDUCTION_CASES = [
    pytest.param(8, 384, 64, 96, id="8b-384-in64-out96"),
    pytest.param(8, 390, 13, 65, id="8b-390-in13-out65"),
    pytest.param(8, 40000, 40000, 40000, id="8b-40000"),
    pytest.param(4, 384, 64, 96, id="4b-384-in64-out96"),
    pytest.param(4, 392, 14, 98, id="4b-392-in14-out98"),
    pytest.param(4, 40000, 40000, 40000, id="4b-40000"),
]


def reduction_inputs(
    rng: np.random.Generator, dpn: int, chunk: int, g_in: int, bits: int, quant_type: int, swizzled: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes and parameters of ``dpn`` peer chunks, as NumPy ``quantize`` (shaped) or ``swizzle_quant`` (flat) makes them."""
    x = random_floats(rng, (dpn, chunk), EK.F32)
    in_groups = dpn * chunk // g_in
    if swizzled:
        q, params = ds.swizzle_quant(x, in_groups, bits, quant_type, 1, 1, dpn)
    else:
        q, params = ds.quantize(x, in_groups, bits, quant_type)
    return q, params, in_groups


def check_quantized_reduction(
    rng: np.random.Generator, bits: int, chunk: int, g_in: int, g_out: int, dpn: int, quant_type: int
) -> None:
    """quantized_reduction on the GPU against NumPy, on ``dpn`` fresh peer chunks (swizzled for 3 peers)."""
    q, params, in_groups = reduction_inputs(rng, dpn, chunk, g_in, bits, quant_type, swizzled=dpn == 3)
    out_groups = chunk // g_out
    q_dev, p_dev = to_cupy(q), to_cupy(params)
    got = ds.quantized_reduction(q_dev, p_dev, in_groups, out_groups, bits, quant_type, dpn)
    want = ds.quantized_reduction(q, params, in_groups, out_groups, bits, quant_type, dpn)
    assert_outputs(got, want, q_dev, "quantized_reduction")


@pytest.mark.parametrize("bits,chunk,g_in,g_out", REDUCTION_CASES)
@pytest.mark.parametrize("dpn", [1, 3, 4])
@QUANT_TYPES
def test_quantized_reduction_matches_numpy(
    rng: np.random.Generator, bits: int, chunk: int, g_in: int, g_out: int, dpn: int, quant_type: int
) -> None:
    check_quantized_reduction(rng, bits, chunk, g_in, g_out, dpn, quant_type)


# (bits, chunk, input group, output group): the dense reduction (output groups of team * 8,
# input groups of whole vectors of 8): teams of 1, 8, a warp, two warps and a block.
DENSE_REDUCTION_CASES = [
    pytest.param(8, 4096, 128, 512, id="8b-4096-in128-out512"),
    pytest.param(4, 4096, 128, 512, id="4b-4096-in128-out512"),
    pytest.param(8, 1024, 64, 256, id="8b-1024-in64-out256"),
    pytest.param(4, 2048, 2048, 2048, id="4b-2048-in2048-out2048"),
    pytest.param(8, 512, 8, 64, id="8b-512-in8-out64"),
    pytest.param(4, 64, 16, 8, id="4b-64-in16-out8"),
    pytest.param(4, 65536, 512, 512, id="4b-65536-in512-out512"),
]


@pytest.mark.parametrize("bits,chunk,g_in,g_out", DENSE_REDUCTION_CASES)
@pytest.mark.parametrize("dpn", [1, 3, 8])
@QUANT_TYPES
def test_dense_quantized_reduction_matches_numpy(
    rng: np.random.Generator, bits: int, chunk: int, g_in: int, g_out: int, dpn: int, quant_type: int
) -> None:
    check_quantized_reduction(rng, bits, chunk, g_in, g_out, dpn, quant_type)


@pytest.mark.parametrize("bits", [8, 4])
@QUANT_TYPES
def test_dense_quantized_reduction_nonfinite_and_extreme_groups(
    rng: np.random.Generator, bits: int, quant_type: int
) -> None:
    """Peer rows of NaN (a NaN / inf group), zero, equal and huge values: non-finite and extreme sums
    take the generic formulas in the dense reduction, identically."""
    dpn, chunk, g = 4, 8 * 256, 256
    x = with_special_groups(random_floats(rng, (dpn, chunk), EK.F32, specials=False), dpn * chunk // g)
    x.reshape(-1, g)[5] = 3.0
    x.reshape(-1, g)[6] = 1e-38
    x.reshape(-1, g)[9] = 3e37
    in_groups = dpn * chunk // g
    q, params = ds.quantize(x, in_groups, bits, quant_type)
    q_dev, p_dev = to_cupy(q), to_cupy(params)
    got = ds.quantized_reduction(q_dev, p_dev, in_groups, chunk // g, bits, quant_type, dpn)
    want = ds.quantized_reduction(q, params, in_groups, chunk // g, bits, quant_type, dpn)
    assert_outputs(got, want, q_dev, "quantized_reduction")
    assert np.isnan(want[1][1:3]).all()


@pytest.mark.parametrize("err_kind", KINDS, ids=[f"err-{k}" for k in KIND_IDS])
@pytest.mark.parametrize("dpn", [1, 3, 4])
@pytest.mark.parametrize("bits", [8, 4])
@QUANT_TYPES
def test_loco_quantized_reduction_matches_numpy(
    rng: np.random.Generator, err_kind: EK, dpn: int, bits: int, quant_type: int
) -> None:
    chunk, g_in, g_out = 384, 64, 96
    out_groups = chunk // g_out
    e_np = (rng.standard_normal(chunk) * 0.01).astype(dtype_of(err_kind))
    e_dev = to_cupy(e_np)
    for step in range(2):
        q, params, in_groups = reduction_inputs(rng, dpn, chunk, g_in, bits, quant_type, swizzled=True)
        before = e_np.copy()
        want = ds.loco_quantized_reduction(q, params, e_np, BETA, in_groups, out_groups, bits, quant_type, dpn)
        q_dev, p_dev = to_cupy(q), to_cupy(params)
        got = ds.loco_quantized_reduction(q_dev, p_dev, e_dev, BETA, in_groups, out_groups, bits, quant_type, dpn)
        assert_outputs(got, want, q_dev, f"step {step}")
        assert_same_bits(e_dev, e_np, f"step {step}: error buffer (in place)")
        assert bits_changed(before, e_dev), f"step {step}: error buffer not updated"


# ---- MoQ fake quantization --------------------------------------------------------------------------


def moq(name: str, vals: Any, groups: int, bits: int, seed: int, offset: int) -> Any:
    fn = getattr(ds, name)
    if name.startswith("ds_sr_"):
        return fn(vals, groups, bits, rng_seed=seed, rng_offset=offset)
    return fn(vals, groups, bits)


def run_moq_both(rng: np.random.Generator, name: str, x: np.ndarray, groups: int, bits: int, to_dev: Any) -> None:
    """Fake-quantize NumPy and device copies of ``x`` (same Philox seed / offset); in place, equal bits."""
    seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**40))
    v_np = x.copy()
    assert moq(name, v_np, groups, bits, seed, offset) is v_np
    v_dev = to_dev(x)
    assert moq(name, v_dev, groups, bits, seed, offset) is v_dev, f"{name}: must return its (updated) input"
    assert_same_bits(v_dev, v_np, name)
    assert bits_changed(x, v_dev), f"{name}: values not updated in place"


MOQ_CASES = [
    case(8, (6, 250), 12),  # ragged groups of 125
    case(4, (5, 77), 35),  # groups of 11
    case(3, (2, 40000), 2),  # above 32768
]


@pytest.mark.parametrize("bits,shape,groups", MOQ_CASES)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("name", MOQ_FUNCTIONS)
def test_moq_matches_numpy(rng: np.random.Generator, bits: int, shape: tuple, groups: int, kind: EK, name: str) -> None:
    run_moq_both(rng, name, random_floats(rng, shape, kind), groups, bits, to_cupy)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("name", MOQ_FUNCTIONS)
def test_moq_nonfinite_groups_and_large_groups(rng: np.random.Generator, kind: EK, name: str) -> None:
    x = with_special_groups(random_floats(rng, (6, 40000), kind, specials=False), 6)
    run_moq_both(rng, name, x, 6, 8, to_cupy)


def test_moq_module_seed_drives_the_gpu_like_numpy(rng: np.random.Generator) -> None:
    x = random_floats(rng, (4, 300), EK.F32)
    seed = int(rng.integers(0, 2**63))
    ds.manual_seed(seed)
    want = [ds.ds_sr_quantize_fp32(x.copy(), 12, 4), ds.ds_sr_quantize_asym_fp16(x.copy(), 12, 4)]
    ds.manual_seed(seed)
    got = [ds.ds_sr_quantize_fp32(to_cupy(x), 12, 4), ds.ds_sr_quantize_asym_fp16(to_cupy(x), 12, 4)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same_bits(g, w, f"call {i} (offset {i})")


# ---- PyTorch CUDA tensors ------------------------------------------------------------------------------


def test_torch_quantize_int4_asymmetric_bf16(rng: np.random.Generator) -> None:
    torch = torch_cuda()
    x = random_floats(rng, (3, 1000), EK.BF16)
    xt = to_torch(x)
    q, params = ds.quantize(xt, 30, 4, ASYM)
    q_np, p_np = ds.quantize(x, 30, 4, ASYM)
    assert_outputs((q, params), (q_np, p_np), xt, "quantize")
    assert q.dtype == torch.int8 and params.dtype == torch.float32
    for name in ("dequantize", "dequantize_fp32"):
        y = getattr(ds, name)(q, params, 30, 4, ASYM)
        assert_on_device(y, xt, name)
        assert_same_bits(y, getattr(ds, name)(q_np, p_np, 30, 4, ASYM), name)


@pytest.mark.parametrize("bits", [8, 4])
def test_torch_swizzle_quant(rng: np.random.Generator, bits: int) -> None:
    torch_cuda()
    x = random_floats(rng, (4, 1200), EK.F16)
    xt = to_torch(x)
    groups = SWIZZLE_GROUPS[bits]
    got = ds.swizzle_quant(xt, groups, bits, SYM, 1, 2, 4)
    assert_outputs(got, ds.swizzle_quant(x, groups, bits, SYM, 1, 2, 4), xt, "swizzle_quant")


def test_torch_quantized_reduction(rng: np.random.Generator) -> None:
    torch_cuda()
    q, params, in_groups = reduction_inputs(rng, 4, 384, 64, 8, ASYM, swizzled=False)
    qt, pt = to_torch(q), to_torch(params)
    got = ds.quantized_reduction(qt, pt, in_groups, 4, 8, ASYM, 4)
    assert_outputs(got, ds.quantized_reduction(q, params, in_groups, 4, 8, ASYM, 4), qt, "quantized_reduction")


@pytest.mark.parametrize("err_kind", [EK.BF16, EK.F32], ids=["err-bf16", "err-f32"])
def test_torch_loco_error_buffers(rng: np.random.Generator, err_kind: EK) -> None:
    torch_cuda()
    x = random_floats(rng, (4, 1000), EK.F32, specials=False)
    e_np = (rng.standard_normal(x.shape) * 0.01).astype(dtype_of(err_kind))
    et, xt = to_torch(e_np), to_torch(x)
    want = ds.loco_swizzle_quant(x, e_np, BETA, 40, 4, ASYM, 1, 2, 2)
    assert_outputs(ds.loco_swizzle_quant(xt, et, BETA, 40, 4, ASYM, 1, 2, 2), want, xt, "loco_swizzle_quant")
    assert_same_bits(et, e_np, "loco_swizzle_quant: error buffer (in place)")
    q, params, in_groups = reduction_inputs(rng, 4, 384, 64, 4, SYM, swizzled=True)
    r_np = (rng.standard_normal(384) * 0.01).astype(dtype_of(err_kind))
    rt, qt = to_torch(r_np), to_torch(q)
    want = ds.loco_quantized_reduction(q, params, r_np, BETA, in_groups, 4, 4, SYM, 4)
    got = ds.loco_quantized_reduction(qt, to_torch(params), rt, BETA, in_groups, 4, 4, SYM, 4)
    assert_outputs(got, want, qt, "loco_quantized_reduction")
    assert_same_bits(rt, r_np, "loco_quantized_reduction: error buffer (in place)")


@pytest.mark.parametrize("name", ["ds_sr_quantize_asym_fp16", "ds_sr_quantize_fp32"])
def test_torch_moq_stochastic(rng: np.random.Generator, name: str) -> None:
    torch_cuda()
    run_moq_both(rng, name, random_floats(rng, (6, 250), EK.BF16), 12, 4, to_torch)


# ---- errors and devices ----------------------------------------------------------------------------------


def mixed() -> Any:
    return pytest.raises((qp.InvalidProblem, qp.Unsupported))


def test_mixed_numpy_and_cupy_operands_raise(rng: np.random.Generator) -> None:
    import cupy

    x = random_floats(rng, (4, 256), EK.F32)
    q, params = ds.quantize(x, 8, 8, ASYM)
    with mixed():
        ds.dequantize(to_cupy(q), params, 8, 8, ASYM)
    with mixed():
        ds.dequantize_fp32(q, to_cupy(params), 8, 8, ASYM)
    with mixed():
        ds.quantized_reduction(to_cupy(q), params, 8, 4, 8, ASYM, 2)
    e_np = np.zeros(x.shape, np.float32)
    with mixed():
        ds.loco_swizzle_quant(to_cupy(x), e_np, 0.5, 8, 8, SYM, 1, 1, 1)
    assert not e_np.any()
    e_dev = cupy.zeros(x.shape, np.float32)
    with mixed():
        ds.loco_swizzle_quant(x, e_dev, 0.5, 8, 8, SYM, 1, 1, 1)
    with mixed():
        ds.loco_quantized_reduction(to_cupy(q), to_cupy(params), np.zeros(512, np.float32), 0.5, 8, 4, 8, ASYM, 2)
    assert not bool(e_dev.any())


def test_mixed_torch_and_cupy_operands_raise(rng: np.random.Generator) -> None:
    torch_cuda()
    x = random_floats(rng, (4, 256), EK.F32)
    q, params = ds.quantize(x, 8, 4, SYM)
    with mixed():
        ds.dequantize(to_torch(q), to_cupy(params), 8, 4, SYM)
    et = to_torch(np.zeros(x.shape, np.float32))
    with mixed():
        ds.loco_swizzle_quant(to_cupy(x), et, 0.5, 8, 4, SYM, 1, 1, 1)
    assert not bool(et.any())


def test_non_contiguous_cupy_error_buffer_raises_before_writing(rng: np.random.Generator) -> None:
    import cupy

    x = to_cupy(random_floats(rng, (4, 256), EK.F32))
    base = cupy.full(2 * 1024, 3.0, np.float32)
    with pytest.raises(qp.InvalidProblem):
        ds.loco_swizzle_quant(x, base[::2], 0.5, 8, 8, SYM, 1, 1, 1)
    q, params = ds.quantize(random_floats(rng, (2, 512), EK.F32), 8, 8, SYM)
    with pytest.raises(qp.InvalidProblem):
        ds.loco_quantized_reduction(to_cupy(q), to_cupy(params), base[::4], 0.5, 8, 2, 8, SYM, 2)
    assert bool((base == 3.0).all())


def test_outputs_stay_on_the_input_device(rng: np.random.Generator) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x = random_floats(rng, (4, 1000), EK.F16)
    with cupy.cuda.Device(1):
        x_dev = cupy.asarray(x)
    assert x_dev.device.id == 1 and cupy.cuda.runtime.getDevice() == 0
    q, params = ds.quantize(x_dev, 8, 4, ASYM)  # device 0 current, data on device 1
    assert_outputs((q, params), ds.quantize(x, 8, 4, ASYM), x_dev, "quantize")
    y = ds.dequantize(q, params, 8, 4, ASYM)
    assert_on_device(y, x_dev, "dequantize")
    with cupy.cuda.Device(1):
        v = cupy.asarray(x)
    assert ds.ds_quantize_fp16(v, 8, 8) is v
    assert_same_bits(v, ds.ds_quantize_fp16(x.copy(), 8, 8), "ds_quantize_fp16 on device 1")


# ---- replayed calls ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits,shape,groups", [case(8, (16, 1000), 16), case(4, (6, 512), 12), case(4, (6, 77), 3)])
@QUANT_TYPES
def test_replayed_calls_match_numpy(
    rng: np.random.Generator, bits: int, shape: tuple, groups: int, quant_type: int
) -> None:
    """A call like an earlier one is replayed (outputs allocated, kernels launched on the pointers,
    no front-end Python): every repetition on fresh data, and one on a misaligned view (the replay
    declines it), gives NumPy's bits."""
    from quantplan import _frontend

    for trial in range(4):
        x = random_floats(rng, shape, EK.F16)
        if trial == 3:  # a view one element in: another alignment class than the remembered calls
            wide = random_floats(rng, (int(np.prod(shape)) + 1,), EK.F16)
            x_dev = to_cupy(wide)[1:].reshape(shape)
            x = wide[1:].reshape(shape)
        else:
            x_dev = to_cupy(x)
        got = ds.quantize(x_dev, groups, bits, quant_type)
        expected = ds.quantize(x, groups, bits, quant_type)
        assert_outputs(got, expected, x_dev, "quantize")
        q, params = expected
        y = ds.dequantize(to_cupy(q), to_cupy(params), groups, bits, quant_type)
        assert_same_bits(y, ds.dequantize(q, params, groups, bits, quant_type), "dequantize")
    key = (ds.quantize, type(x_dev), x_dev.dtype, x_dev.shape, groups, bits, quant_type)
    assert _frontend.replay_of(key) is not None


@pytest.mark.parametrize("bits", [8, 4])
def test_replayed_swizzle_reduction_and_moq_match_numpy(rng: np.random.Generator, bits: int) -> None:
    """swizzle_quant, quantized_reduction and the MoQ quantizer (in place) replayed on fresh data."""
    for _ in range(4):
        x = random_floats(rng, (8, 1024), EK.F16)
        got = ds.swizzle_quant(to_cupy(x), 32, bits, ds.Symmetric, 1, 1, 4)
        want = ds.swizzle_quant(x, 32, bits, ds.Symmetric, 1, 1, 4)
        assert_outputs(got, want, to_cupy(x), "swizzle_quant")
        q, p = want
        got = ds.quantized_reduction(to_cupy(q), to_cupy(p), 32, 8, bits, ds.Symmetric, 4)
        red = ds.quantized_reduction(q, p, 32, 8, bits, ds.Symmetric, 4)
        assert_outputs(got, red, to_cupy(q), "quantized_reduction")
        v = random_floats(rng, (12, 500), EK.F16)
        dev = to_cupy(v)
        assert ds.ds_quantize_fp16(dev, 12, bits) is dev
        assert_same_bits(dev, ds.ds_quantize_fp16(v.copy(), 12, bits), "ds_quantize_fp16")


# ---- every forced schedule of the DeepSpeed-format plans, on ragged group counts ---------------

#: Group sizes each schedule serves (``quantplan.runtime._selection``); a test draws one and a group count.
FORCED_GROUP_SIZES = {
    "cluster": (2048, 4096, 16384),
    "lanes": (128,),
    "dense": (8, 128, 1024, 8192),
    "fused": (6, 100, 1000, 8192),
    "fused-element-io": (6, 100, 8192),
    "two-pass": (6, 1000, 40000),
}


def _plan_both(plan_cls: Any, desc: Any, make_args: Any, schedule: str) -> None:
    """Run ``desc`` on the reference and, forced into ``schedule``, on the device; the outputs
    (``make_args(device)`` builds the Args and names the outputs) must match bit for bit."""
    from quantplan.runtime._device import device_info

    if schedule == "cluster" and device_info(0).arch.major < 9:
        pytest.skip("thread-block clusters need sm_90")
    ref_args, ref_out = make_args(False)
    plan_cls.select(None, desc, qp.PlanPreference(backend=qp.BackendKind.REFERENCE)).run(None, None, ref_args)
    plan = plan_cls.select(None, desc, qp.PlanPreference(schedule=schedule))
    dev_args, dev_out = make_args(True)
    plan.run(None, qp.Workspace.allocate(plan.workspace_size()), dev_args)
    for want, got in zip(ref_out, dev_out, strict=True):
        host = got.get().view(want.dtype)
        assert float_bits_equal(host, want), first_mismatch(host, want)


@pytest.mark.parametrize("schedule", list(FORCED_GROUP_SIZES))
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16])
@pytest.mark.parametrize("bits", [8, 4])
def test_every_forced_quantize_schedule_matches_reference(
    rng: np.random.Generator, schedule: str, kind: EK, bits: int
) -> None:
    import cupy

    from quantplan.ops.deepspeed_format import (
        DeepSpeedQuantizeArgs,
        DeepSpeedQuantizeDescriptor,
        DeepSpeedQuantizePlan,
    )

    groups, size = int(rng.integers(5, 40)), int(rng.choice(FORCED_GROUP_SIZES[schedule]))
    mode = qp.QuantMode.ASYMMETRIC if rng.integers(2) else qp.QuantMode.SYMMETRIC
    desc = DeepSpeedQuantizeDescriptor(numel=groups * size, groups=groups, num_bits=bits, mode=mode, input_element=kind)
    x = with_special_groups(random_floats(rng, (groups * size,), kind), groups)

    def make(device: bool) -> tuple[Any, tuple[Any, ...]]:
        out = np.full(desc.output_bytes, 0xA5, np.uint8)
        params = np.full(desc.param_shape, 7.0, np.float32)
        if device:
            out_d, params_d = cupy.asarray(out), cupy.asarray(params)
            return DeepSpeedQuantizeArgs(to_cupy(x), out_d, params_d), (out_d, params_d)
        return DeepSpeedQuantizeArgs(x, out, params), (out, params)

    _plan_both(DeepSpeedQuantizePlan, desc, make, schedule)


@pytest.mark.parametrize("schedule", [s for s in FORCED_GROUP_SIZES if s != "lanes"])
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16])
def test_every_forced_moq_schedule_matches_reference(rng: np.random.Generator, schedule: str, kind: EK) -> None:
    import cupy

    from quantplan.ops.deepspeed_format import MoQFakeQuantizeArgs, MoQFakeQuantizeDescriptor, MoQFakeQuantizePlan

    groups, size = int(rng.integers(5, 40)), int(rng.choice(FORCED_GROUP_SIZES[schedule]))
    fast = schedule in ("cluster", "dense")  # SYMMETRIC nearest rounding only
    mode = qp.QuantMode.SYMMETRIC if fast or rng.integers(2) else qp.QuantMode.ASYMMETRIC
    rounding = qp.Rounding.NEAREST_EVEN if fast or rng.integers(2) else qp.Rounding.STOCHASTIC
    desc = MoQFakeQuantizeDescriptor(
        numel=groups * size, groups=groups, num_bits=int(rng.integers(2, 9)), mode=mode, rounding=rounding, element=kind
    )
    x = with_special_groups(random_floats(rng, (groups * size,), kind), groups)
    seed = {"rng_seed": 12345, "rng_offset": 7} if rounding is qp.Rounding.STOCHASTIC else {}

    def make(device: bool) -> tuple[Any, tuple[Any, ...]]:
        if device:
            xs = to_cupy(x)
            out_d = cupy.zeros_like(xs)
            return MoQFakeQuantizeArgs(xs, out_d, **seed), (out_d,)
        out = np.zeros_like(x)
        return MoQFakeQuantizeArgs(x, out, **seed), (out,)

    _plan_both(MoQFakeQuantizePlan, desc, make, schedule)
