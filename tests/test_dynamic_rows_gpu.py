"""GPU: the whole-row kernels (``dynamic_quantize_rows``, ``dynamic_fake_quantize_rows``) equal the
reference bit for bit.

They serve contiguous rows of 2048, 4096 and 8192 16-bit elements (token rows, channel axis 0)
with nearest rounding: one block per row, its vectors in registers. Covered here: every row
length, every code kind and mode, rows that leave the division-free range (NaN / Inf, all-zero,
tiny and huge magnitudes) at the start, middle and end of many-block grids, narrowed code ranges,
in-place fake quantization, and the variant each shape selects; and
``dynamic_fake_quantize_cluster`` (sm_90: few long rows, one per thread-block cluster).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODES, random_floats
from test_dynamic_range_gpu import assert_same, run_both
from test_fake_dense_gpu import _dynamic

import quantplan as qp
from quantplan.elements import ELEMENTS
from quantplan.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
FLOATS = [EK.F16, EK.BF16]
# (rows, length, large): at least 34 rows (fewer take dynamic_quantize_cluster on sm_90); the large
# shapes have more blocks than an H200 holds at once.
SHAPES = [(50, 2048, False), (37, 4096, False), (40, 8192, False), (1500, 2048, True), (1100, 4096, True)]


def _rows_data(rng: np.random.Generator, shape: tuple[int, int], kind: EK) -> np.ndarray:
    """Random rows, and rows off the division-free path at the start, middle and end: all zero,
    NaN, -Inf, tiny (scale below 2^-60, or subnormal) and huge (scale above 2^100 for bf16)."""
    x = random_floats(rng, shape, kind).astype(np.float64)
    rows = shape[0]
    special = {1: "zero", 2: "nan", 3: "inf", 5: "tiny", 6: "huge", 7: "sub"}
    for r, what in list(special.items()):
        for row in (r, rows - r, rows // 2 + r):
            if not 0 <= row < rows:
                continue
            if what == "zero":
                x[row] = 0.0
            elif what == "nan":
                x[row, row % shape[1]] = np.nan
            elif what == "inf":
                x[row, -1 - row % 7] = -np.inf
            elif what == "tiny":
                x[row] *= 1e-30
            elif what == "huge":
                x[row] *= 1e35 if kind is EK.BF16 else 1.0
            else:
                x[row] *= 2.0**-126
    with np.errstate(over="ignore", under="ignore"):
        return x.astype(ELEMENTS[kind].numpy_dtype)


def _variant(plan: qp.DynamicRangeQuantizePlan | qp.DynamicRangeFakeQuantizePlan) -> None:
    variant = plan.sku().variant
    assert "dense-rows" in variant, variant


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("shape_index", range(len(SHAPES)))
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_rows_match_reference(rng, float_kind, code_kind, shape_index, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is ASYM:
        pytest.skip("FP8 codes are symmetric only")
    rows, length, large = SHAPES[shape_index]
    if large and code_kind not in (EK.S8, EK.U4, EK.FP8_E4M3):
        pytest.skip("large shapes: one code kind per packing")
    order = qp.NibbleOrder.HIGH_FIRST if shape_index % 2 else qp.NibbleOrder.LOW_FIRST
    scope = qp.ChannelScope(axis=0) if shape_index == 1 else qp.TokenScope()
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(rows, length),
        scope=scope,
        mode=mode,
        input_element=float_kind,
        output_element=code_kind,
        nibble_order=order,
    )
    _variant(qp.DynamicRangeQuantizePlan.select(None, desc))
    ref, got = run_both(desc, _rows_data(rng, (rows, length), float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.S4, -7, 5)])
@pytest.mark.parametrize("rows", [36, 1200])
def test_rows_narrowed_ranges(rng, code_kind, q_min, q_max, rows) -> None:
    shape = (rows, 4096)
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=code_kind, q_min=q_min, q_max=q_max
    )
    _variant(qp.DynamicRangeQuantizePlan.select(None, desc))
    ref, got = run_both(desc, _rows_data(rng, shape, EK.F16))
    assert_same(ref, got)


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 8), (SYM, 2), (ASYM, 3)])
@pytest.mark.parametrize(("rows", "length"), [(40, 8192), (50, 2048), (1500, 2048)])
def test_fake_rows_match_reference(rng, kind, mode, bits, rows, length) -> None:
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(rows, length), scope=qp.TokenScope(), mode=mode, element=kind, bits=bits
    )
    _variant(qp.DynamicRangeFakeQuantizePlan.select(None, desc))
    _dynamic(desc, _rows_data(rng, (rows, length), kind))


@pytest.mark.parametrize(("shape", "kind", "mode"), [((1100, 4096), EK.BF16, SYM), ((1200, 2048), EK.F16, ASYM)])
def test_fake_rows_in_place(rng, shape, kind, mode) -> None:
    """In place on many blocks: each thread reads its vectors before it writes them."""
    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=qp.TokenScope(), mode=mode, element=kind, bits=8)
    _variant(qp.DynamicRangeFakeQuantizePlan.select(None, desc))
    _dynamic(desc, _rows_data(rng, shape, kind), in_place=True)


@pytest.mark.parametrize("kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 8), (SYM, 2), (ASYM, 3)])
@pytest.mark.parametrize(("rows", "length"), [(16, 8192), (33, 2048), (3, 4096)])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_fake_cluster_match_reference(rng, kind, mode, bits, rows, length, in_place) -> None:
    """Few long rows on sm_90: ``dynamic_fake_quantize_cluster`` (one row per cluster of 8 blocks)."""
    import cupy

    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(rows, length), scope=qp.TokenScope(), mode=mode, element=kind, bits=bits
    )
    variant = qp.DynamicRangeFakeQuantizePlan.select(None, desc).sku().variant
    assert ("dense-cluster" in variant) == (int(cupy.cuda.Device().compute_capability) >= 90), variant
    _dynamic(desc, _rows_data(rng, (rows, length), kind), in_place=in_place)
