"""GPU: DequantReducePlan equals the reference bit for bit (codes, scales, zero points, LoCo buffer,
float sums).

Every input code x output code x mode; 1, 3 and 8 peers; input and output groups of different
sizes (vector widths 16 down to 1), the two-pass path (4-bit outputs with odd groups, groups
above 32768 elements); averaging; LoCo with every buffer element; float outputs; NaN input
scales; misaligned operands; fresh random codes and parameters; the dense reduction (peer counts,
team widths, group sizes, non-fast groups, several grid-stride passes; 4-bit codes under small
scales).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE, first_mismatch, float_bits_equal, random_codes, random_floats, random_zero_point
from test_swizzled_quantize_gpu import device_view

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

QGZ_FLOATS = [EK.F16, EK.BF16, EK.F32]
QGZ_CODES = [EK.S8, EK.U8, EK.S4, EK.U4]
SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC


def peer_inputs(
    rng: np.random.Generator, desc: qp.DequantReduceDescriptor, nan_scale: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Random codes, scales (spread over decades) and zero points of ``desc``'s peers."""
    q = random_codes(rng, (desc.peers, desc.chunk_elements), desc.input_element)
    scale = np.exp(rng.uniform(-6, 1, size=desc.input_param_shape)).astype(np.float32)
    if nan_scale and scale.shape[1] > 2:
        scale[-1, 2] = np.nan
    zp = random_zero_point(rng, desc.input_param_shape, desc.input_element) if desc.mode is ASYM else None
    return q, scale, zp


def run_both(
    desc: qp.DequantReduceDescriptor,
    q: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None,
    error: np.ndarray | None = None,
    beta: float | None = None,
    offset: int = 0,
) -> None:
    """Run the reference and the CUDA plan on the same inputs and assert every output is bit-equal."""
    import cupy

    asym = desc.mode is ASYM
    out_info = ELEMENTS[desc.output_element]
    odtype = out_info.numpy_dtype
    floats = out_info.is_float
    y_ref = np.zeros(desc.output_shape, odtype)
    s_ref = None if floats else np.zeros(desc.param_shape, np.float32)
    z_ref = np.zeros(desc.param_shape, np.int32) if asym and not floats else None
    e_ref = None if error is None else error.copy()
    qp.DequantReducePlan.select(None, desc, REFERENCE).run(
        None, None, qp.DequantReduceArgs(q, scale, y_ref, s_ref, zp, z_ref, e_ref, beta)
    )
    plan = qp.DequantReducePlan.select(None, desc)
    assert plan.backend is qp.BackendKind.CUDA
    fill = np.full(desc.output_shape, 0x5A, np.uint8) if not floats else np.full(desc.output_shape, 3, np.float32)
    y_dev = device_view(fill.astype(odtype) if floats else fill.view(odtype), offset)
    s_dev = None if floats else cupy.full(desc.param_shape, 7.0, np.float32)
    z_dev = cupy.full(desc.param_shape, 99, np.int32) if asym and not floats else None
    e_dev = None if error is None else device_view(error, offset)
    args = qp.DequantReduceArgs(
        device_view(q, offset),
        cupy.asarray(scale),
        y_dev,
        s_dev,
        None if zp is None else cupy.asarray(zp),
        z_dev,
        e_dev,
        beta,
    )
    plan.run(None, None, args)
    variant = plan.sku().variant
    if floats:
        got = y_dev.get().view(y_ref.dtype)
        assert float_bits_equal(got, y_ref), f"{variant}: sums {first_mismatch(got, y_ref)}"
        return
    got_q = y_dev.get().view(np.uint8)
    assert np.array_equal(got_q, y_ref.view(np.uint8)), (
        f"{variant}: codes {first_mismatch(got_q, y_ref.view(np.uint8))}"
    )
    assert s_dev is not None and s_ref is not None
    assert float_bits_equal(s_dev.get(), s_ref), f"{variant}: scales {first_mismatch(s_dev.get(), s_ref)}"
    if asym:
        assert z_dev is not None and z_ref is not None
        assert np.array_equal(z_dev.get(), z_ref), f"{variant}: zero points {first_mismatch(z_dev.get(), z_ref)}"
    if error is not None:
        assert e_dev is not None and e_ref is not None
        got_e = e_dev.get().view(e_ref.dtype)
        assert float_bits_equal(got_e, e_ref), f"{variant}: error buffer {first_mismatch(got_e, e_ref)}"


def descriptor(peers: int, chunk: int, g_in: int, g_out: int | None, **kw: object) -> qp.DequantReduceDescriptor:
    return qp.DequantReduceDescriptor(
        peers=peers, chunk_elements=chunk, input_group_size=g_in, output_group_size=g_out, **kw
    )


# (peers, chunk, input group, output group): vector widths 16, 8, 2 and 1; groups of different sizes.
FUSED_CASES = [
    (8, 8192, 2048, 2048),
    (3, 3 * 1024, 128, 512),
    (1, 4096, 4096, 64),
    (3, 960, 24, 40),
    (2, 630, 6, 10),
    (3, 693, 7, 21),
]


@pytest.mark.parametrize("peers,chunk,g_in,g_out", FUSED_CASES)
@pytest.mark.parametrize("code_in", QGZ_CODES)
@pytest.mark.parametrize("code_out", QGZ_CODES)
@pytest.mark.parametrize("mode", [SYM, ASYM])
@pytest.mark.parametrize("average", [False, True])
def test_fused_pass_matches_reference(rng, peers, chunk, g_in, g_out, code_in, code_out, mode, average) -> None:  # noqa: ANN001
    packed = ELEMENTS[code_in].is_packed or ELEMENTS[code_out].is_packed
    if packed and chunk % 2:
        pytest.skip("4-bit codes need an even chunk")
    desc = descriptor(
        peers, chunk, g_in, g_out, mode=mode, input_element=code_in, output_element=code_out, average=average
    )
    run_both(desc, *peer_inputs(rng, desc))


# The dense reduction (SYMMETRIC, no LoCo, aligned; output groups of team * 16 elements, input
# groups a multiple of 16): unrolled peer counts (2, 4, 8, 16) and the loop (1, 3, 5), teams of
# 1 to 256 threads (shuffles, then shared memory), input groups below / above / unlike the
# output groups (a non-power-of-two input group divides instead of shifting), chunks whose last
# block is partly idle, and a chunk larger than one grid-stride pass.
DENSE_CASES = [
    (8, 8192 * 4, 512, 512),
    (8, 16 * 1024, 512, 512),
    (2, 16 * 77, 16, 16),
    (4, 96 * 64, 48, 64),
    (16, 4096 * 3, 1024, 4096),
    (5, 2048 * 9, 2048, 256),
    (1, 2048, 32, 128),
    (3, 2048 * 6, 96, 2048),
    (2, 24 * 64, 24, 64),
]


@pytest.mark.parametrize("peers,chunk,g_in,g_out", DENSE_CASES)
@pytest.mark.parametrize("code_in", QGZ_CODES)
@pytest.mark.parametrize("code_out", QGZ_CODES)
@pytest.mark.parametrize("average", [False, True])
def test_dense_reduction_matches_reference(rng, peers, chunk, g_in, g_out, code_in, code_out, average) -> None:  # noqa: ANN001
    desc = descriptor(peers, chunk, g_in, g_out, input_element=code_in, output_element=code_out, average=average)
    assert qp.DequantReducePlan.select(None, desc).sku().variant.startswith("dense["), "the dense path serves it"
    run_both(desc, *peer_inputs(rng, desc))


@pytest.mark.parametrize("code_in,code_out", [(EK.S4, EK.S4), (EK.U4, EK.S8), (EK.S8, EK.U4)])
@pytest.mark.parametrize("peers", [8, 3])
def test_dense_reduction_special_groups(rng, code_in, code_out, peers) -> None:  # noqa: ANN001
    """Groups whose output scale is not `fast` take the exact codes: a NaN input scale, scales that
    overflow the sum to +-Inf, tiny scales (output scale below 2^-60), all-zero groups (scale 1);
    both nibble orders; codes and scales of every other group unaffected."""
    for order in (qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST):
        desc = descriptor(peers, 512 * 12, 64, 512, input_element=code_in, output_element=code_out, nibble_order=order)
        q, scale, _ = peer_inputs(rng, desc)  # NaN scale in the last peer's group 2
        scale[:, 8:16] = np.float32(3e38)  # output group 1: +-Inf sums
        scale[:, 24:32] = np.float32(1e-30)  # output group 3: tiny sums
        scale[0, 40:48] = np.float32(2e38)  # output group 5: Inf from one peer only where codes are big
        width = q.shape[1] // 12
        q[:, 6 * width : 7 * width] = 0  # output group 6: zero codes
        scale[:, 56:64] = np.float32(0.0)  # output group 7: zero scales (signed zeros)
        assert qp.DequantReducePlan.select(None, desc).sku().variant.startswith("dense[")
        run_both(desc, q, scale, None)


@pytest.mark.parametrize("peers,chunk,g_in,g_out", [(8, 1 << 20, 512, 512), (3, 3 << 18, 96, 256)])
@pytest.mark.parametrize("code_in", QGZ_CODES)
@pytest.mark.parametrize("code_out", QGZ_CODES)
def test_dense_reduction_large_chunks(rng, peers, chunk, g_in, g_out, code_in, code_out) -> None:  # noqa: ANN001
    """Chunks large enough for 16 elements per thread (small ones take 8)."""
    desc = descriptor(peers, chunk, g_in, g_out, input_element=code_in, output_element=code_out)
    assert "16-per-thread" in qp.DequantReducePlan.select(None, desc).sku().variant
    run_both(desc, *peer_inputs(rng, desc))


def test_dense_reduction_large_chunk_grid_stride(rng) -> None:  # noqa: ANN001
    """More threads than one grid of resident blocks: the block loop runs several passes."""
    desc = descriptor(2, 16 * 512 * 500, 512, 512, input_element=EK.S4, output_element=EK.S4)
    assert qp.DequantReducePlan.select(None, desc).sku().variant.startswith("dense[")
    run_both(desc, *peer_inputs(rng, desc))


# 4-bit input codes under scales of magnitude below 0.5 take one fused multiply-add per code
# (DenseCodes::products_fma; with unrolled peers, when every peer's scale of the pass is below
# 0.5); larger, NaN or infinite scales, the decoded product. Scales on both sides of 0.5 (peer by
# peer), negative, subnormal and signed-zero scales; unrolled peer counts and the loop; 4, 8 and
# 16 elements per thread; both nibble orders; averaging.
FMA_CASES = [
    (8, 16 * 1024, 512, 512),
    (8, 1 << 20, 512, 512),
    (2, 4096 * 3, 64, 1024),
    (16, 8192, 256, 128),
    (3, 2048 * 6, 96, 2048),
]


@pytest.mark.parametrize("peers,chunk,g_in,g_out", FMA_CASES)
@pytest.mark.parametrize("code_in,code_out", [(EK.S4, EK.S4), (EK.U4, EK.S8), (EK.S4, EK.U4)])
@pytest.mark.parametrize("order", [qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST])
@pytest.mark.parametrize("average", [False, True])
def test_dense_reduction_small_scales(rng, peers, chunk, g_in, g_out, code_in, code_out, order, average) -> None:  # noqa: ANN001
    desc = descriptor(
        peers, chunk, g_in, g_out, input_element=code_in, output_element=code_out, nibble_order=order, average=average
    )
    assert qp.DequantReducePlan.select(None, desc).sku().variant.startswith("dense[")
    q, _, _ = peer_inputs(rng, desc)
    shape = desc.input_param_shape
    scale = np.exp(rng.uniform(-14, np.log(0.5), size=shape)).astype(np.float32)  # below 0.5: the FMA
    scale *= rng.choice(np.array([-1, 1], np.float32), size=shape)
    flat = scale.reshape(-1)
    specials = np.array(
        [0.49999997, -0.49999997, 0.5, -0.5, 0.75, 1e-40, -1e-42, 0.0, -0.0, 1e-30, np.nan, np.inf, -np.inf, 3e38],
        np.float32,
    )
    picks = rng.choice(flat.size, size=min(flat.size // 4, 64), replace=False)
    flat[picks] = specials[rng.integers(0, specials.size, size=picks.size)]
    run_both(desc, q, scale, None)


# Chunks of several grid-stride passes with the next pass's codes and scales loaded into
# registers during this one (unrolled peers whose codes fit 16 words per thread), warps as units
# of work (teams of a warp): small scales with specials scattered, so passes take the one-test FMA
# path or the per-peer test; a ragged last pass (4501 groups of 512).
@pytest.mark.parametrize("peers,code_in,code_out", [(8, EK.S4, EK.S4), (4, EK.S8, EK.U4), (2, EK.U4, EK.S8)])
def test_dense_reduction_pipelined_passes(rng, peers, code_in, code_out) -> None:  # noqa: ANN001
    desc = descriptor(peers, 512 * 4501, 512, 512, input_element=code_in, output_element=code_out)
    assert "16-per-thread" in qp.DequantReducePlan.select(None, desc).sku().variant
    q, _, _ = peer_inputs(rng, desc)
    shape = desc.input_param_shape
    scale = np.exp(rng.uniform(-14, np.log(0.5), size=shape)).astype(np.float32)
    scale *= rng.choice(np.array([-1, 1], np.float32), size=shape)
    flat = scale.reshape(-1)
    specials = np.array([0.5, -0.75, 1e-40, -0.0, np.nan, np.inf, 3e38, 0.49999997], np.float32)
    picks = rng.choice(flat.size, size=48, replace=False)
    flat[picks] = specials[rng.integers(0, specials.size, size=picks.size)]
    run_both(desc, q, scale, None)


@pytest.mark.parametrize("code_in,code_out", [(EK.S4, EK.S8), (EK.U8, EK.S4)])
def test_dense_reduction_wide_teams_several_passes(rng, code_in, code_out) -> None:  # noqa: ANN001
    """Teams of 128 threads (groups of 2048 at 16 per thread) over two passes per block: the
    reduction's shared-memory slot sets taken in turn."""
    desc = descriptor(2, 1 << 22, 512, 2048, input_element=code_in, output_element=code_out)
    assert "128t-per-group,16-per-thread" in qp.DequantReducePlan.select(None, desc).sku().variant
    run_both(desc, *peer_inputs(rng, desc))


def test_small_chunks_take_four_elements_per_thread() -> None:
    """A chunk too small to give every SM a block of threads at 16 elements each takes the
    smallest fitting count (4 here); a large one keeps 16."""
    small = descriptor(8, 16 * 1024, 512, 512, input_element=EK.S4, output_element=EK.S4)
    assert "4-per-thread" in qp.DequantReducePlan.select(None, small).sku().variant
    large = descriptor(8, 8192 * 1024, 512, 512, input_element=EK.S4, output_element=EK.S4)
    assert "16-per-thread" in qp.DequantReducePlan.select(None, large).sku().variant


@pytest.mark.parametrize("offset", [1, 8])
def test_dense_reduction_misaligned_takes_the_twin(rng, offset) -> None:  # noqa: ANN001
    desc = descriptor(8, 4096, 512, 512, input_element=EK.S8, output_element=EK.S8)
    run_both(desc, *peer_inputs(rng, desc), offset=offset)


@pytest.mark.parametrize(
    "peers,chunk,g_in,g_out,code_out",
    [
        (3, 140, 14, 7, EK.S4),  # odd output groups of 4-bit codes
        (2, 126, 7, 9, EK.U4),  # odd input groups with 4-bit codes
        (2, 80000, 2000, 40000, EK.S8),  # output groups above 32768 elements
        (4, 40002, 6667, 40002, EK.U4),
    ],
)
@pytest.mark.parametrize("code_in", QGZ_CODES)
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_two_pass_matches_reference(rng, peers, chunk, g_in, g_out, code_out, code_in, mode) -> None:  # noqa: ANN001
    desc = descriptor(
        peers, chunk, g_in, g_out, mode=mode, input_element=code_in, output_element=code_out, average=True
    )
    assert qp.DequantReducePlan.select(None, desc).sku().variant.startswith("two-pass")
    run_both(desc, *peer_inputs(rng, desc))


@pytest.mark.parametrize("error_kind", QGZ_FLOATS)
@pytest.mark.parametrize("code,mode", [(EK.S8, SYM), (EK.S4, SYM), (EK.U4, ASYM), (EK.U8, ASYM)])
@pytest.mark.parametrize("peers,chunk,g_in,g_out", [(4, 4096, 256, 512), (3, 140, 14, 7)])
def test_loco_error_feedback_matches_reference(rng, error_kind, code, mode, peers, chunk, g_in, g_out) -> None:  # noqa: ANN001
    desc = descriptor(
        peers, chunk, g_in, g_out, mode=mode, input_element=code, output_element=code, error_element=error_kind
    )
    q, scale, zp = peer_inputs(rng, desc, nan_scale=False)
    small = random_floats(rng, (chunk,), EK.F32, specials=False) * np.float32(0.01)
    error = small.astype(ELEMENTS[error_kind].numpy_dtype)
    for beta in (float(rng.uniform(0, 1)), 0.0, 1.0):
        run_both(desc, q, scale, zp, error, beta)


@pytest.mark.parametrize("out_kind", QGZ_FLOATS)
@pytest.mark.parametrize("code", QGZ_CODES)
@pytest.mark.parametrize("peers,chunk,g_in", [(8, 8192, 2048), (3, 966, 7), (2, 1000, 10)])
@pytest.mark.parametrize("average", [False, True])
def test_float_output_matches_reference(rng, out_kind, code, peers, chunk, g_in, average) -> None:  # noqa: ANN001
    if ELEMENTS[code].is_packed and chunk % 2:
        pytest.skip("4-bit codes need an even chunk")
    desc = descriptor(peers, chunk, g_in, None, mode=ASYM, input_element=code, output_element=out_kind, average=average)
    run_both(desc, *peer_inputs(rng, desc))


@pytest.mark.parametrize("code", QGZ_CODES)
@pytest.mark.parametrize("floats", [False, True])
def test_misaligned_operands_take_the_element_io_twin(rng, code, floats) -> None:  # noqa: ANN001
    out = EK.BF16 if floats else code
    desc = descriptor(4, 2048, 256, None if floats else 256, input_element=code, output_element=out)
    run_both(desc, *peer_inputs(rng, desc), offset=1)


@pytest.mark.parametrize("code", [EK.S4, EK.U4])
def test_high_first_nibbles(rng, code) -> None:  # noqa: ANN001
    for g_out in (128, 7):  # fused, then two-pass
        desc = descriptor(
            3, 896, 64, g_out, input_element=code, output_element=code, nibble_order=qp.NibbleOrder.HIGH_FIRST
        )
        run_both(desc, *peer_inputs(rng, desc))


def test_bad_input_raises_before_launch(rng) -> None:  # noqa: ANN001
    import cupy

    desc = descriptor(2, 512, 64, 128, input_element=EK.S8, output_element=EK.S8)
    plan = qp.DequantReducePlan.select(None, desc)
    q = cupy.asarray(random_codes(rng, (2, 512), EK.S8))
    s = cupy.ones(desc.input_param_shape, np.float32)
    y = cupy.full(desc.output_shape, 3, np.int8)
    so = cupy.full(desc.param_shape, 5.0, np.float32)
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.DequantReduceArgs(q[:1], s, y, so))
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.DequantReduceArgs(q, s.astype(np.float64), y, so))
    with pytest.raises(qp.InvalidProblem, match="overlaps"):
        plan.run(None, None, qp.DequantReduceArgs(q, s, q[0], so))
    assert bool((y == 3).all()) and bool((so == 5.0).all())
