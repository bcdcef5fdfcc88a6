"""CPU: dequantize-reduce-requantize (ZeRO++ qgZ) in the reference and its plan, and the qgZ flow end to end."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE, random_floats

import quantplan as qp
from quantplan import reference
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK
from quantplan.vocabulary.types import GroupScope, MathPrecision, NibbleOrder, QuantMode

pytestmark = pytest.mark.filterwarnings("error")

SYM, ASYM = QuantMode.SYMMETRIC, QuantMode.ASYMMETRIC
F32 = MathPrecision.F32
f = np.float32


def run_plan(
    q: np.ndarray,
    scale: np.ndarray,
    zp: np.ndarray | None,
    in_kind: EK,
    in_group: int,
    out_kind: EK,
    out_group: int,
    mode: QuantMode = SYM,
    q_min: int | None = None,
    q_max: int | None = None,
    order: NibbleOrder = NibbleOrder.LOW_FIRST,
    average: bool = False,
    error: np.ndarray | None = None,
    beta: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    peers = q.shape[0]
    chunk = scale.shape[1] * in_group
    err_kind = None if error is None else {"float16": EK.F16, "bfloat16": EK.BF16, "float32": EK.F32}[error.dtype.name]
    desc = qp.DequantReduceDescriptor(
        peers=peers,
        chunk_elements=chunk,
        input_group_size=in_group,
        output_group_size=out_group,
        mode=mode,
        input_element=in_kind,
        output_element=out_kind,
        q_min=q_min,
        q_max=q_max,
        nibble_order=order,
        average=average,
        error_element=err_kind,
    )
    plan = qp.DequantReducePlan.select(None, desc, REFERENCE)
    assert plan.workspace_size() == 0 and plan.sku().category is qp.OpCategory.COLLECTIVE
    out = np.zeros(desc.output_shape, ELEMENTS[out_kind].numpy_dtype)
    s_out = np.zeros(desc.param_shape, np.float32)
    z_out = np.zeros(desc.param_shape, np.int32) if mode is ASYM else None
    plan.run(None, None, qp.DequantReduceArgs(q, scale, out, s_out, zp, z_out, error, beta))
    return out, s_out, z_out


# ---------------------------------------------------------------------------------------------
# Hand-computed vectors
# ---------------------------------------------------------------------------------------------


def test_hand_vector_symmetric_sum_and_average() -> None:
    q = np.array([[10, -20, 30, 40], [2, 4, -6, 8]], np.int8)
    scale = np.array([[0.5, 0.25], [1.0, 0.5]], np.float32)
    # y0 = [5, -10, 7.5, 10], y1 = [2, 4, -3, 4]; sum [7, -6, 4.5, 14]; q range [-7, 7]: scale 2
    out, s, z = run_plan(q, scale, None, EK.S8, 2, EK.S8, 4, q_min=-7, q_max=7)
    assert z is None and s.tolist() == [2.0] and out.tolist() == [4, -3, 2, 7]  # 3.5 -> 4, 2.25 -> 2
    # average: [3.5, -3, 2.25, 7] -> scale 1, codes 4 (tie to even), -3, 2, 7
    out, s, _ = run_plan(q, scale, None, EK.S8, 2, EK.S8, 4, q_min=-7, q_max=7, average=True)
    assert s.tolist() == [1.0] and out.tolist() == [4, -3, 2, 7]
    # output groups of 1 (independent of the input groups of 2): every element its own scale
    out, s, _ = run_plan(q, scale, None, EK.S8, 2, EK.S8, 1, q_min=-7, q_max=7)
    assert s.tolist() == [f(7) / f(7), f(6) / f(7), f(4.5) / f(7), f(14) / f(7)]
    assert out.tolist() == [7, -7, 7, 7]


def test_hand_vector_asymmetric_with_zero_points() -> None:
    q = np.array([[10, 20, 30, 40], [0, 4, 8, 12]], np.uint8)
    scale = np.array([[0.5, 0.25], [1.0, 1.0]], np.float32)
    zp = np.array([[10, 20], [4, 4]], np.int32)
    # y0 = [0, 5, 2.5, 5], y1 = [-4, 0, 4, 8]; sum [-4, 5, 6.5, 13]; range [0, 17]: scale 1, zp 4
    out, s, z = run_plan(q, scale, zp, EK.U8, 2, EK.U8, 4, ASYM, q_min=0, q_max=17)
    assert s.tolist() == [1.0] and z is not None and z.tolist() == [4]
    assert out.tolist() == [0, 9, 10, 17]  # 6.5 ties to 6, + 4


def test_hand_vector_int4_in_int8_out_three_peers() -> None:
    # three peers of 4 codes, S4 LOW_FIRST, one group each, scale 1: codes [1, -2, 3, -4], [1, 1, 1, 1], [0, 0, -8, 7]
    q = np.array([[0xE1, 0xC3], [0x11, 0x11], [0x00, 0x78]], np.uint8)
    scale = np.ones((3, 1), np.float32)
    out, s, _ = run_plan(q, scale, None, EK.S4, 4, EK.S8, 2, q_min=-4, q_max=4)
    # sum [2, -1, -4, 4]: groups [2, -1] -> scale 0.5, codes [4, -2]; [-4, 4] -> scale 1, codes [-4, 4]
    assert s.tolist() == [0.5, 1.0] and out.tolist() == [4, -2, -4, 4]


def test_sum_is_float32_in_peer_order() -> None:
    # y = 2**24, 1, 1: ((2**24 + 1) + 1) = 2**24 in float32 (each +1 ties to even), not 2**24 + 2
    q = np.array([[1], [1], [1]], np.int8)
    scale = np.array([[2.0**24], [1.0], [1.0]], np.float32)
    out, s, _ = run_plan(q, scale, None, EK.S8, 1, EK.S8, 1, q_min=-127)
    assert s.tolist() == [f(2**24) / f(127)] and out.tolist() == [127]
    assert f(2**24) / f(127) != f(2**24 + 2) / f(127)
    # peer 0 last would give 2**24 + 2: order matters, and it is peer 0 first
    out, s, _ = run_plan(q[::-1].copy(), scale[::-1].copy(), None, EK.S8, 1, EK.S8, 1, q_min=-127)
    assert s.tolist() == [f(2**24 + 2) / f(127)]


def test_average_is_an_ieee_division_by_n() -> None:
    q = np.array([[7], [0], [0]], np.int8)
    scale = np.ones((3, 1), np.float32)
    _, s, _ = run_plan(q, scale, None, EK.S8, 1, EK.S8, 1, q_min=-127, average=True)
    assert s.tolist() == [(f(7) / f(3)) / f(127)]
    assert (f(7) / f(3)) != f(7) * (f(1) / f(3))  # a product with 1/3 would differ


def test_nan_input_scale_propagates_to_its_output_group() -> None:
    q = np.array([[1, 2, 3, 4], [1, 1, 1, 1]], np.int8)
    scale = np.array([[np.nan, 1.0], [1.0, 1.0]], np.float32)
    out, s, _ = run_plan(q, scale, None, EK.S8, 2, EK.S8, 2)
    assert np.isnan(s[0]) and s[1] == f(5) / f(127)
    assert out[:2].tolist() == [0, 0] and out[2:].tolist() == [round(4 / (5 / 127)), 127]


def test_single_peer_requantizes_with_new_groups() -> None:
    x = np.array([0.5, -1.0, 3.0, 2.0, -6.0, 1.5], np.float32)
    q, s, _ = reference.dynamic_quantize(x, GroupScope(group_size=3), SYM, EK.S8, -127, 127, F32)
    out, s_out, _ = run_plan(q[None], s[None], None, EK.S8, 3, EK.S8, 2, q_min=-127)
    y = (q.astype(np.float32) * np.repeat(s, 3)).astype(np.float32)
    ref_q, ref_s, _ = reference.dynamic_quantize(y, GroupScope(group_size=2), SYM, EK.S8, -127, 127, F32)
    assert np.array_equal(out, ref_q) and np.array_equal(s_out, ref_s)


# ---------------------------------------------------------------------------------------------
# Random problems against a plain loop
# ---------------------------------------------------------------------------------------------


def loop_model(
    q: np.ndarray, s: np.ndarray, z: np.ndarray | None, in_kind: EK, gi: int, order: NibbleOrder, average: bool
) -> np.ndarray:
    """The float32 sum (or mean) element by element, peer 0 first."""
    peers = q.shape[0]
    chunk = s.shape[1] * gi
    total = np.zeros(chunk, np.float32)
    for j in range(peers):
        codes = reference.decode_codes(q[j], in_kind, chunk, order).astype(np.int64)
        for i in range(chunk):
            zp = 0 if z is None else int(z[j, i // gi])
            y = np.float32(codes[i] - zp) * s[j, i // gi]
            total[i] = total[i] + np.float32(y) if j else np.float32(y)
    if average:
        total = (total / np.float32(peers)).astype(np.float32)
    return total


@pytest.mark.parametrize(
    ("mode", "in_kind", "out_kind", "q_min", "q_max"),
    [
        (SYM, EK.S8, EK.S8, -127, 127),
        (SYM, EK.S4, EK.S4, -7, 7),
        (ASYM, EK.U8, EK.U4, 0, 15),
        (ASYM, EK.S4, EK.S8, -128, 127),
        (SYM, EK.S8, EK.S4, -8, 7),
    ],
    ids=lambda v: getattr(v, "value", str(v)),
)
@pytest.mark.parametrize(("peers", "gi", "go", "chunk"), [(1, 4, 6, 12), (3, 5, 3, 30), (4, 7, 14, 42), (2, 1, 2, 8)])
@pytest.mark.parametrize("average", [False, True])
def test_plan_matches_a_loop_model(
    rng: np.random.Generator,
    mode: QuantMode,
    in_kind: EK,
    out_kind: EK,
    q_min: int,
    q_max: int,
    peers: int,
    gi: int,
    go: int,
    chunk: int,
    average: bool,
) -> None:
    order = NibbleOrder.HIGH_FIRST
    qs, ss, zs = [], [], []
    in_lo, in_hi = ELEMENTS[in_kind].code_range or (0, 0)
    for _ in range(peers):
        x = random_floats(rng, (chunk,), EK.F32, specials=False)
        q, s, z = reference.dynamic_quantize(x, GroupScope(group_size=gi), mode, in_kind, in_lo, in_hi, F32, order)
        qs.append(q)
        ss.append(s)
        zs.append(z)
    q_in, s_in = np.stack(qs), np.stack(ss)
    z_in = None if mode is SYM else np.stack(zs)
    out, s_out, z_out = run_plan(q_in, s_in, z_in, in_kind, gi, out_kind, go, mode, q_min, q_max, order, average)
    v = loop_model(q_in, s_in, z_in, in_kind, gi, order, average)
    ref_q, ref_s, ref_z = reference.dynamic_quantize(
        v, GroupScope(group_size=go), mode, out_kind, q_min, q_max, F32, order
    )
    assert np.array_equal(out, ref_q) and np.array_equal(s_out, ref_s)
    assert (z_out is None) == (ref_z is None) and (ref_z is None or np.array_equal(z_out, ref_z))
    r_q, r_s, r_z, r_e = reference.dequant_reduce(
        q_in, s_in, z_in, in_kind, gi, out_kind, go, mode, q_min, q_max, order, average
    )
    assert np.array_equal(r_q, out) and np.array_equal(r_s, s_out) and r_e is None


# ---------------------------------------------------------------------------------------------
# LoCo
# ---------------------------------------------------------------------------------------------


def test_loco_hand_vector() -> None:
    q = np.array([[4, 1], [0, 0]], np.int8)  # sum [4, 1.25 with e], scale 1 per input group
    scale = np.array([[1.0], [1.0]], np.float32)
    err = np.array([0.0, 0.25], np.float32)
    out, s, _ = run_plan(q, scale, None, EK.S8, 2, EK.S8, 2, q_min=-8, q_max=4, error=err, beta=0.5)
    # v = [4, 1.25] -> scale 1, q [4, 1]; r = [0, 0.25]; e = .5 * [0, .25] + .5 * [0, .25]
    assert s.tolist() == [1.0] and out.tolist() == [4, 1] and err.tolist() == [0.0, 0.25]
    err[:] = [0.0, 0.5]
    out, _, _ = run_plan(q, scale, None, EK.S8, 2, EK.S8, 2, q_min=-8, q_max=4, error=err, beta=0.25)
    # v = [4, 1.5] -> q [4, 2]; r = [0, -0.5]; e = .25 * .5 + .75 * -.5 = -0.25
    assert out.tolist() == [4, 2] and err.tolist() == [0.0, -0.25]


def test_loco_matches_explicit_steps_with_bf16_buffer(rng: np.random.Generator) -> None:
    peers, gi, go, chunk = 3, 4, 6, 24
    bf16 = ELEMENTS[EK.BF16].numpy_dtype
    qs = rng.integers(-8, 8, size=(peers, chunk)).astype(np.int32)
    q_in = np.stack([reference.pack_nibbles(r, NibbleOrder.LOW_FIRST) for r in qs])
    s_in = np.exp(rng.uniform(-3, 1, size=(peers, chunk // gi))).astype(np.float32)
    err = (rng.standard_normal(chunk) * 0.05).astype(bf16)
    e0 = err.copy()
    z_in = np.zeros(s_in.shape, np.int32)  # ASYMMETRIC on both sides: these codes have zero point 0
    out, s_out, z_out = run_plan(q_in, s_in, z_in, EK.S4, gi, EK.U4, go, ASYM, error=err, beta=0.8, average=True)
    total = loop_model(q_in, s_in, z_in, EK.S4, gi, NibbleOrder.LOW_FIRST, True)
    v = (total + e0.astype(np.float32)).astype(np.float32)
    ref_q, ref_s, ref_z = reference.dynamic_quantize(v, GroupScope(group_size=go), ASYM, EK.U4, 0, 15, F32)
    assert np.array_equal(out, ref_q) and np.array_equal(s_out, ref_s)
    assert ref_z is not None and z_out is not None and np.array_equal(z_out, ref_z)
    d = reference.dequantize(ref_q, np.repeat(ref_s, go), np.repeat(ref_z, go), EK.U4, EK.F32, chunk, F32)
    assert err.dtype == bf16 and np.array_equal(err, reference.loco_error_update(v, d, e0, 0.8))


# ---------------------------------------------------------------------------------------------
# The qgZ flow: swizzle -> intra-node all-to-all -> dequant-reduce -> inter-node all-to-all -> sum
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "q_max"), [(EK.S4, 7), (EK.S8, 127)])
@pytest.mark.parametrize("in_kind", [EK.F16, EK.BF16, EK.F32])
def test_qgz_flow_2_nodes_x_2_devices_matches_an_f32_sum(
    rng: np.random.Generator, code: EK, q_max: int, in_kind: EK
) -> None:
    nodes, dpn, g, g_out, slice_len = 2, 2, 16, 8, 64
    ranks = nodes * dpn
    numel = ranks * slice_len
    q_min = -q_max
    grads = [
        (rng.standard_normal(numel) * rng.uniform(0.5, 2.0)).astype(ELEMENTS[in_kind].numpy_dtype) for _ in range(ranks)
    ]
    packed = ELEMENTS[code].is_packed

    # step 1: every rank quantizes in swizzled order
    sq = qp.SwizzledQuantizeDescriptor(
        shape=(numel,),
        group_size=g,
        nodes=nodes,
        devices_per_node=dpn,
        input_element=in_kind,
        output_element=code,
        q_min=q_min,
        q_max=q_max,
    )
    sq_plan = qp.SwizzledQuantizePlan.select(None, sq, REFERENCE)
    sent = []
    for r in range(ranks):
        q = np.zeros(sq.output_shape, ELEMENTS[code].numpy_dtype)
        s = np.zeros(sq.param_shape, np.float32)
        sq_plan.run(None, None, qp.SwizzledQuantizeArgs(grads[r], q, s))
        sent.append((q, s))

    # steps 2-3: intra-node all-to-all (local device d receives chunk d of each local peer) and reduce
    chunk = nodes * slice_len
    dr = qp.DequantReduceDescriptor(
        peers=dpn,
        chunk_elements=chunk,
        input_group_size=g,
        output_group_size=g_out,
        input_element=code,
        output_element=code,
        q_min=q_min,
        q_max=q_max,
    )
    dr_plan = qp.DequantReducePlan.select(None, dr, REFERENCE)
    reduced = {}
    for n in range(nodes):
        for d in range(dpn):
            peers = [n * dpn + j for j in range(dpn)]
            q_in = np.stack([sent[p][0][0, d] for p in peers])
            s_in = np.stack([sent[p][1][0, d] for p in peers])
            out = np.zeros(dr.output_shape, ELEMENTS[code].numpy_dtype)
            s_out = np.zeros(dr.param_shape, np.float32)
            dr_plan.run(None, None, qp.DequantReduceArgs(q_in, s_in, out, s_out))
            reduced[n, d] = (out, s_out)

    # steps 4-5: inter-node all-to-all (segment n' of the reduced chunk goes to rank (n', d)), dequantize, sum
    seg_bytes = slice_len // 2 if packed else slice_len
    seg_groups = slice_len // g_out
    for n_dst in range(nodes):
        for d in range(dpn):
            total = np.zeros(slice_len, np.float32)
            for n_src in range(nodes):
                out, s_out = reduced[n_src, d]
                q_seg = out[n_dst * seg_bytes : (n_dst + 1) * seg_bytes]
                s_seg = s_out[n_dst * seg_groups : (n_dst + 1) * seg_groups]
                y = reference.dequantize(q_seg, np.repeat(s_seg, g_out), 0, code, EK.F32, slice_len, F32)
                total = (total + y).astype(np.float32)
            z = n_dst * dpn + d  # this rank's partition
            exact = sum(gr.astype(np.float64)[z * slice_len : (z + 1) * slice_len] for gr in grads)
            # error bound of the bit width: each rank's first quantization is off by at most
            # amax / q_max / 2 per element, each node's re-quantization by its sum's amax / q_max / 2
            amax = max(float(np.abs(gr.astype(np.float64)).max()) for gr in grads)
            bound = ranks * amax / q_max / 2 + nodes * (dpn * amax * (1 + 1 / q_max)) / q_max / 2
            err = np.abs(total.astype(np.float64) - exact)
            assert err.max() <= bound * (1 + 1e-5) + 1e-5, (z, err.max(), bound)
            assert err.max() > 0  # it is quantized
