"""GPU: the specialised fused kernel (``dynamic_quantize_dense``) equals the reference bit for bit.

It serves contiguous segments of ``team * 8 * nv`` elements (token rows and last-axis groups of
8 .. 8192 elements, channel axis 0) of F16 / BF16 with nearest rounding. Covered here:
every code kind and mode, narrowed code ranges (the clamp-free and clamped paths), non-finite
and all-zero segments, and segments whose scale leaves the division-free range (tiny and huge
magnitudes: the out-of-line checked path).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import CODES, random_floats
from test_dynamic_range_gpu import assert_same, data_with_special_segments, run_both

import quantplan as qp
from quantplan.elements import ELEMENTS
from quantplan.types import ElementKind as EK

pytestmark = pytest.mark.gpu

DENSE_FLOATS = [EK.F16, EK.BF16]
CASES = [
    (qp.TokenScope(), (9, 8192)),
    (qp.TokenScope(), (7, 3, 1024)),
    (qp.TokenScope(), (300, 8)),
    (qp.ChannelScope(axis=0), (5, 4096)),
    (qp.GroupScope(axis=-1, group_size=128), (37, 1024)),
    (qp.GroupScope(axis=-1, group_size=32), (11, 96)),
    (qp.GroupScope(axis=-1, group_size=512), (3, 2048)),
]


@pytest.mark.parametrize("float_kind", DENSE_FLOATS)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dense_matches_reference(rng, float_kind, code_kind, case, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape = CASES[case]
    order = qp.NibbleOrder.HIGH_FIRST if case % 2 else qp.NibbleOrder.LOW_FIRST
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=scope, mode=mode, input_element=float_kind, output_element=code_kind, nibble_order=order
    )
    assert "dense" in qp.DynamicRangeQuantizePlan.select(None, desc).sku().variant
    ref, got = run_both(desc, data_with_special_segments(rng, shape, float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", DENSE_FLOATS)
@pytest.mark.parametrize(("code_kind", "q_min", "q_max"), [(EK.S8, -127, 127), (EK.S8, -100, 127), (EK.S4, -7, 5)])
def test_dense_narrowed_ranges(rng, float_kind, code_kind, q_min, q_max) -> None:
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(33, 256),
        scope=qp.TokenScope(),
        input_element=float_kind,
        output_element=code_kind,
        q_min=q_min,
        q_max=q_max,
    )
    ref, got = run_both(desc, data_with_special_segments(rng, (33, 256), float_kind))
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", [EK.BF16])
@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3])
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dense_scales_outside_the_fast_range(rng, float_kind, code_kind, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    shape = (12, 64)
    x = random_floats(rng, shape, float_kind, specials=False).astype(np.float64)
    x[0] *= 1e-30  # scale below 2^-60
    x[1] *= 1e-38
    x[2] = 0.0
    x[3] *= 1e35  # scale above 2^100
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=mode, input_element=float_kind, output_element=code_kind
    )
    ref, got = run_both(desc, x.astype(ELEMENTS[float_kind].numpy_dtype))
    assert_same(ref, got)
