"""GPU: the dense row kernels (``quantize_dense``, ``dequantize_dense``, ``quantize_backward_dense``,
``dequantize_backward_dense``) equal the reference backend bit for bit.

The static plans take these kernels for 16-bit floats on the hot layouts (contiguous rows, the
row's length a multiple of the vector, groups of whole vectors; ``quantplan.runtime._layout.dense_row_layout``).
The shapes here select them (the variant says ``dense``) and sit at their edges: one block per row,
several chunks per row with a partial last one, short merged rows, a row shorter than a block, a
small problem spread over small blocks, channel(axis 0) rows, groups of 16 / 48 / 128; data with
NaN, +-Inf, -0 and quotients past 2**21 (the exact path); full vectors and the small problems'
vectors; every code kind, both modes, both nibble orders; in place for the gradients; misaligned
operands (the element-I/O twin).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import CODES, REFERENCE, first_mismatch, float_bits_equal, random_codes, random_floats, to_device

import quantplan as qp
from quantplan.runtime._selection import SCHEDULES
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
DENSE_FLOATS = [EK.F16, EK.BF16]
#: (scope, shape): every one is a dense layout. Quantize and dequantize keep their full vectors at
#: every size; the gradients use vectors of 4 on small problems. Blocks narrow only while the grid
#: would cover less than a quarter of the SMs.
CASES = [
    (qp.TokenScope(), (70, 8208)),  # several chunks per row, partial last one
    (qp.TokenScope(), (600, 1040)),  # short rows merged (group-like parameters)
    (qp.TensorScope(), (160, 4096)),
    (qp.ChannelScope(axis=0), (300, 2080)),
    (qp.GroupScope(axis=-1, group_size=16), (2100, 272)),
    (qp.GroupScope(axis=-1, group_size=48), (200, 3072)),
    (qp.GroupScope(axis=-1, group_size=128), (136, 4096)),
    (qp.TokenScope(), (37, 256)),  # small: a row shorter than a 256-thread block
    (qp.TokenScope(), (3, 5, 1040)),  # small, merged rows
    (qp.TokenScope(), (16, 8192)),  # small: the 16x8192 bench row
    (qp.TokenScope(), (2, 70000)),  # small, many chunks per row
    (qp.GroupScope(axis=-1, group_size=16), (9, 272)),
]


def _data(rng: np.random.Generator, shape: tuple[int, ...], kind: EK) -> np.ndarray:
    """Random floats with NaN, +-Inf, -0 and the largest finite values placed in."""
    x = random_floats(rng, shape, kind).reshape(-1).copy()
    big = float(np.finfo(np.float16).max) if kind is EK.F16 else 3.0e38
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, big, -big]).astype(x.dtype)
    x[rng.choice(x.size, size=specials.size, replace=False)] = specials
    return x.reshape(shape)


def _params(rng: np.random.Generator, desc, code: EK):  # noqa: ANN001, ANN202
    """Scales near the data's range over the code span (some codes clamp), int32 zero points."""
    info = ELEMENTS[code]
    span = info.fp8_max if info.is_fp8 else (info.code_range[1] - info.code_range[0])  # type: ignore[index]
    scale = (np.exp(rng.uniform(-4, 4, size=desc.param_shape)) / span * np.exp(rng.uniform(-2, 1))).astype(np.float32)
    if desc.mode is SYM:
        return scale, None
    lo, hi = info.code_range  # type: ignore[misc]
    return scale, rng.integers(lo, hi + 1, size=desc.param_shape).astype(np.int32)


def _dev(a: np.ndarray | None):  # noqa: ANN202
    return None if a is None else to_device(a)


def _get(a, like: np.ndarray) -> np.ndarray:  # noqa: ANN001
    return a.get().view(like.dtype).reshape(like.shape)


COMBOS = [
    (f, c, i, m)
    for f, c, i, m in itertools.product(DENSE_FLOATS, CODES, range(len(CASES)), qp.QuantMode)
    if not (ELEMENTS[c].is_fp8 and m is ASYM)
]


@pytest.mark.parametrize(
    "float_kind,code_kind,case,mode", COMBOS, ids=[f"{f.name}-{c.name}-c{i}-{m.name[:4]}" for f, c, i, m in COMBOS]
)
def test_dense_quantize_and_dequantize_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    scope, shape = CASES[case]
    order = (
        qp.NibbleOrder.HIGH_FIRST if ELEMENTS[code_kind].is_packed and rng.random() < 0.5 else qp.NibbleOrder.LOW_FIRST
    )
    fields = dict(shape=shape, scope=scope, mode=mode, nibble_order=order)
    desc = qp.QuantizeDescriptor(**fields, input_element=float_kind, output_element=code_kind)
    x = _data(rng, shape, float_kind)
    scale, zp = _params(rng, desc, code_kind)
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale, zp))

    plan = qp.QuantizePlan.select(None, desc)
    assert "dense" in plan.sku().variant, plan.sku().variant
    q_dev = to_device(np.full(desc.output_shape, 0xA5, np.uint8).view(q_ref.dtype))
    plan.run(None, None, qp.QuantizeArgs(to_device(x), q_dev, to_device(scale), _dev(zp)))
    q_gpu = _get(q_dev, q_ref)
    assert np.array_equal(q_gpu.view(np.uint8), q_ref.view(np.uint8)), first_mismatch(q_gpu, q_ref)

    ddesc = qp.DequantizeDescriptor(**fields, input_element=code_kind, output_element=float_kind)
    codes = random_codes(rng, shape, code_kind).view(q_ref.dtype) if rng.random() < 0.5 else q_ref
    y_ref = np.zeros(shape, ELEMENTS[float_kind].numpy_dtype)
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(codes, y_ref, scale, zp))
    dplan = qp.DequantizePlan.select(None, ddesc)
    assert "dense" in dplan.sku().variant, dplan.sku().variant
    y_dev = to_device(np.full(shape, np.nan, y_ref.dtype))
    dplan.run(None, None, qp.DequantizeArgs(to_device(codes), y_dev, to_device(scale), _dev(zp)))
    y_gpu = _get(y_dev, y_ref)
    assert float_bits_equal(y_gpu, y_ref), first_mismatch(y_gpu, y_ref)


BACKWARD = [
    (f, c, i, m)
    for f, c, i, m in itertools.product(DENSE_FLOATS, CODES, range(len(CASES)), qp.QuantMode)
    if not (ELEMENTS[c].is_fp8 and m is ASYM) and (i + CODES.index(c)) % 2 == 0
]


@pytest.mark.parametrize(
    "float_kind,code_kind,case,mode", BACKWARD, ids=[f"{f.name}-{c.name}-c{i}-{m.name[:4]}" for f, c, i, m in BACKWARD]
)
def test_dense_backward_plans_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    scope, shape = CASES[case]
    check_backward_plans(rng, float_kind, code_kind, scope, shape, mode)


#: (scope, shape): the fp16 gradients' full vectors of 8 (problems past sm_count blocks of 256
#: such vectors) on rows of 16 k + 8 elements and groups of 24 (not dense for a 16-element
#: vector), a partial last chunk (513 vectors per row). bf16's quantize backward keeps vectors
#: of 16 (quantplan.runtime._layout.DENSE_ROW_SHAPES_BY_FLOAT; the CASES above).
BACKWARD_EDGES = [
    (qp.TokenScope(), (140, 2056)),
    (qp.GroupScope(axis=-1, group_size=24), (150, 2040)),
    (qp.TokenScope(), (70, 4104)),
    (qp.ChannelScope(axis=0), (100, 3000)),
]
EDGE_COMBOS = [
    (f, c, i, m)
    for f, c, i, m in itertools.product([EK.F16], (EK.S8, EK.U4, EK.FP8_E4M3), range(len(BACKWARD_EDGES)), qp.QuantMode)
    if not (ELEMENTS[c].is_fp8 and m is ASYM)
]


@pytest.mark.parametrize(
    "float_kind,code_kind,case,mode",
    EDGE_COMBOS,
    ids=[f"{f.name}-{c.name}-e{i}-{m.name[:4]}" for f, c, i, m in EDGE_COMBOS],
)
def test_dense_backward_vector_edges_match_reference(rng, float_kind, code_kind, case, mode) -> None:
    scope, shape = BACKWARD_EDGES[case]
    check_backward_plans(rng, float_kind, code_kind, scope, shape, mode, variant="vec8")


def check_backward_plans(rng, float_kind, code_kind, scope, shape, mode, variant: str = "dense") -> None:  # noqa: ANN001
    """QuantizeBackwardPlan and DequantizeBackwardPlan on ``shape``: a dense kernel whose variant
    says ``variant`` equals the reference bit for bit (half the time in place)."""
    fields = dict(shape=shape, scope=scope, mode=mode)
    desc = qp.QuantizeBackwardDescriptor(**fields, input_element=float_kind, output_element=code_kind)
    x, dq = _data(rng, shape, float_kind), _data(rng, shape, float_kind)
    scale, zp = _params(rng, desc, code_kind)
    dx_ref = np.zeros_like(dq)
    qp.QuantizeBackwardPlan.select(None, desc, REFERENCE).run(
        None, None, qp.QuantizeBackwardArgs(x, dq, dx_ref, scale, zp)
    )
    plan = qp.QuantizeBackwardPlan.select(None, desc)
    assert "dense" in plan.sku().variant and variant in plan.sku().variant, plan.sku().variant
    in_place = bool(rng.random() < 0.5)
    dq_dev = to_device(dq)
    dx_dev = dq_dev if in_place else to_device(np.full(shape, 7, dx_ref.dtype))
    plan.run(None, None, qp.QuantizeBackwardArgs(to_device(x), dq_dev, dx_dev, to_device(scale), _dev(zp)))
    dx_gpu = _get(dx_dev, dx_ref)
    assert float_bits_equal(dx_gpu, dx_ref), first_mismatch(dx_gpu, dx_ref)

    ddesc = qp.DequantizeBackwardDescriptor(**fields, input_element=code_kind, output_element=float_kind)
    dy = _data(rng, shape, float_kind)
    dq_ref = np.zeros_like(dy)
    qp.DequantizeBackwardPlan.select(None, ddesc, REFERENCE).run(
        None, None, qp.DequantizeBackwardArgs(dy, dq_ref, scale)
    )
    dplan = qp.DequantizeBackwardPlan.select(None, ddesc)
    assert "dense" in dplan.sku().variant and variant in dplan.sku().variant, dplan.sku().variant
    dy_dev = to_device(dy)
    out = dy_dev if in_place else to_device(np.full(shape, 7, dq_ref.dtype))
    dplan.run(None, None, qp.DequantizeBackwardArgs(dy_dev, out, to_device(scale)))
    dq_gpu = _get(out, dq_ref)
    assert float_bits_equal(dq_gpu, dq_ref), first_mismatch(dq_gpu, dq_ref)


@pytest.mark.parametrize("float_kind", DENSE_FLOATS, ids=lambda k: k.name)
def test_dense_scalar_scale_and_large_quotients(rng, float_kind) -> None:
    """A Python-float scale (TensorScope), and a tiny scale: most quotients pass 2**21 (exact path)."""
    shape = (64, 1024)
    x = _data(rng, shape, float_kind)
    for code_kind, scale in ((EK.S8, 1e-7), (EK.FP8_E4M3, 3e-6), (EK.U4, 0.37)):
        desc = qp.QuantizeDescriptor(
            shape=shape, scope=qp.TensorScope(), input_element=float_kind, output_element=code_kind
        )
        q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
        qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
        plan = qp.QuantizePlan.select(None, desc)
        assert "dense" in plan.sku().variant
        q_dev = to_device(np.zeros_like(q_ref))
        plan.run(None, None, qp.QuantizeArgs(to_device(x), q_dev, scale))
        q_gpu = _get(q_dev, q_ref)
        assert np.array_equal(q_gpu.view(np.uint8), q_ref.view(np.uint8)), first_mismatch(q_gpu, q_ref)


@pytest.mark.parametrize("code_kind", [EK.S8, EK.S4, EK.FP8_E5M2], ids=lambda k: k.name)
def test_dense_shapes_with_misaligned_pointers_use_the_twin(rng, code_kind) -> None:
    import cupy

    shape = (8, 512)
    desc = qp.QuantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=code_kind)
    x = _data(rng, shape, EK.F16)
    scale, _ = _params(rng, desc, code_kind)
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
    x_buf = cupy.zeros(x.size + 1, cupy.float16)
    x_buf[1:] = cupy.asarray(x.reshape(-1))
    n_out = int(np.prod(desc.output_shape))
    q_buf = cupy.zeros(n_out + 3, cupy.uint8)
    q_view = q_buf[3:].reshape(desc.output_shape)
    q_view = q_view.view(np.int8) if code_kind is EK.S8 else q_view
    qp.QuantizePlan.select(None, desc).run(
        None, None, qp.QuantizeArgs(x_buf[1:].reshape(shape), q_view, cupy.asarray(scale))
    )
    q_gpu = q_view.get().view(np.uint8)
    assert np.array_equal(q_gpu, q_ref.view(np.uint8)), first_mismatch(q_gpu, q_ref.view(np.uint8))
    ddesc = qp.DequantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=code_kind, output_element=EK.F16)
    y_ref = np.zeros(shape, np.float16)
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(q_ref, y_ref, scale))
    y_buf = cupy.zeros(x.size + 1, cupy.float16)
    qp.DequantizePlan.select(None, ddesc).run(
        None, None, qp.DequantizeArgs(q_view, y_buf[1:].reshape(shape), cupy.asarray(scale))
    )
    y_gpu = y_buf[1:].get().reshape(shape)
    assert float_bits_equal(y_gpu, y_ref), first_mismatch(y_gpu, y_ref)


@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3], ids=lambda k: k.name)
def test_dense_bf16_quantize_backward_gradient_range(rng, code_kind) -> None:
    """bf16 quantize backward: gradients of 0, +-2**-25 and just below, bf16 subnormals, huge values
    and NaN in some 16-element vectors (the per-element test of the vector's range), whole vectors
    of zeros, and vectors of ordinary values beside them (the pair test alone)."""
    shape = (160, 4096)  # past 132 blocks of 256 16-element vectors: the full vectors
    scope = qp.TokenScope()
    desc = qp.QuantizeBackwardDescriptor(
        shape=shape, scope=scope, mode=SYM, input_element=EK.BF16, output_element=code_kind
    )
    x = _data(rng, shape, EK.BF16)
    dq = random_floats(rng, shape, EK.BF16, specials=False).reshape(-1).copy()
    edge = np.array(
        [0.0, -0.0, 2.0**-25, -(2.0**-25), 2.0**-25 * (1 - 2.0**-8), 2.0**-26, 1e-39, -1e-39, 2.0**-133, 3.0e38, np.nan]
    ).astype(dq.dtype)
    vectors = dq.size // 16
    for v in rng.choice(vectors, size=vectors // 8, replace=False):  # one edge value in some vectors
        dq[v * 16 + int(rng.integers(16))] = edge[int(rng.integers(edge.size))]
    for v in rng.choice(vectors, size=vectors // 16, replace=False):  # whole vectors of zeros
        dq[v * 16 : v * 16 + 16] = 0.0
    dq = dq.reshape(shape)
    scale, _ = _params(rng, desc, code_kind)
    dx_ref = np.zeros_like(dq)
    qp.QuantizeBackwardPlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeBackwardArgs(x, dq, dx_ref, scale))
    plan = qp.QuantizeBackwardPlan.select(None, desc)
    assert "dense" in plan.sku().variant and "vec16" in plan.sku().variant, plan.sku().variant
    dx_dev = to_device(np.full(shape, 7, dx_ref.dtype))
    plan.run(None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale)))
    dx_gpu = _get(dx_dev, dx_ref)
    assert float_bits_equal(dx_gpu, dx_ref), first_mismatch(dx_gpu, dx_ref)


# ---- every forced schedule on ragged shapes ------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES["quantize"])
@pytest.mark.parametrize("float_kind", DENSE_FLOATS)
@pytest.mark.parametrize("code_kind", CODES)
def test_every_forced_schedule_matches_reference(rng, schedule, float_kind, code_kind) -> None:
    """QuantizePlan and DequantizePlan forced into each schedule (``PlanPreference(schedule=...)``)
    on a random number of rows of a random multiple of 16 elements (every such shape serves both
    ``dense-rows`` and ``row-layout``), token or last-axis group scope: the reference's bits."""
    mode = SYM if ELEMENTS[code_kind].is_fp8 or rng.random() < 0.5 else ASYM
    shape = (int(rng.integers(1, 300)), 16 * int(rng.integers(2, 600)))
    scope = qp.GroupScope(axis=-1, group_size=16) if rng.random() < 0.5 else qp.TokenScope()
    packed = ELEMENTS[code_kind].is_packed
    order = qp.NibbleOrder.HIGH_FIRST if packed and rng.random() < 0.5 else qp.NibbleOrder.LOW_FIRST
    fields = dict(shape=shape, scope=scope, mode=mode, nibble_order=order)
    pref = qp.PlanPreference(schedule=schedule)
    desc = qp.QuantizeDescriptor(**fields, input_element=float_kind, output_element=code_kind)
    x = _data(rng, shape, float_kind)
    scale, zp = _params(rng, desc, code_kind)
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale, zp))
    plan = qp.QuantizePlan.select(None, desc, pref)
    assert ("dense" in plan.sku().variant) == (schedule == "dense-rows"), plan.sku().variant
    q_dev = to_device(np.full(desc.output_shape, 0xA5, np.uint8).view(q_ref.dtype))
    plan.run(None, None, qp.QuantizeArgs(to_device(x), q_dev, to_device(scale), _dev(zp)))
    q_gpu = _get(q_dev, q_ref)
    assert np.array_equal(q_gpu.view(np.uint8), q_ref.view(np.uint8)), first_mismatch(q_gpu, q_ref)

    ddesc = qp.DequantizeDescriptor(**fields, input_element=code_kind, output_element=float_kind)
    y_ref = np.zeros(shape, ELEMENTS[float_kind].numpy_dtype)
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(q_ref, y_ref, scale, zp))
    dplan = qp.DequantizePlan.select(None, ddesc, pref)
    assert ("dense" in dplan.sku().variant) == (schedule == "dense-rows"), dplan.sku().variant
    y_dev = to_device(np.full(shape, np.nan, y_ref.dtype))
    dplan.run(None, None, qp.DequantizeArgs(to_device(q_ref), y_dev, to_device(scale), _dev(zp)))
    y_gpu = _get(y_dev, y_ref)
    assert float_bits_equal(y_gpu, y_ref), first_mismatch(y_gpu, y_ref)


def test_forced_dense_rows_refuses_what_it_cannot_serve() -> None:
    """``dense-rows`` forced on F32 data, or on rows of 10 elements (not whole vectors), raises
    Unsupported at ``select``."""
    for kind, shape in ((EK.F32, (4, 4096)), (EK.F16, (4, 10))):
        desc = qp.QuantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=kind, output_element=EK.S8)
        with pytest.raises(qp.Unsupported, match="dense-rows"):
            qp.QuantizePlan.select(None, desc, qp.PlanPreference(schedule="dense-rows"))
