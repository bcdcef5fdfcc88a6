"""CPU: swizzled group quantization (ZeRO++ qgZ) and LoCo error feedback in the reference and its plan."""

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
LOW, HIGH = NibbleOrder.LOW_FIRST, NibbleOrder.HIGH_FIRST


def run_plan(
    x: np.ndarray,
    group_size: int,
    nodes: int = 1,
    dpn: int = 1,
    pipeline: int = 1,
    mode: QuantMode = SYM,
    out: EK = EK.S8,
    q_min: int | None = None,
    q_max: int | None = None,
    order: NibbleOrder = LOW,
    error: np.ndarray | None = None,
    beta: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Run SwizzledQuantizePlan on the reference backend; returns (codes storage, scale, zero point)."""
    in_kind = {"float16": EK.F16, "bfloat16": EK.BF16, "float32": EK.F32}[x.dtype.name]
    err_kind = None if error is None else {"float16": EK.F16, "bfloat16": EK.BF16, "float32": EK.F32}[error.dtype.name]
    desc = qp.SwizzledQuantizeDescriptor(
        shape=x.shape,
        group_size=group_size,
        nodes=nodes,
        devices_per_node=dpn,
        pipeline=pipeline,
        mode=mode,
        input_element=in_kind,
        output_element=out,
        q_min=q_min,
        q_max=q_max,
        nibble_order=order,
        error_element=err_kind,
    )
    plan = qp.SwizzledQuantizePlan.select(None, desc, REFERENCE)
    q = np.zeros(desc.output_shape, ELEMENTS[out].numpy_dtype)
    s = np.zeros(desc.param_shape, np.float32)
    z = np.zeros(desc.param_shape, np.int32) if mode is ASYM else None
    plan.run(None, None, qp.SwizzledQuantizeArgs(x, q, s, z, error, beta))
    return q, s, z


# ---------------------------------------------------------------------------------------------
# The swizzle order
# ---------------------------------------------------------------------------------------------


def test_swizzle_order_two_nodes_four_devices() -> None:
    assert reference.swizzle_order(2, 4).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    # pipeline 2: slice z * 2 + p; stage 0 of partitions 0 4 1 5 2 6 3 7, then stage 1
    assert reference.swizzle_order(2, 4, 2).tolist() == [0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15]


def test_swizzle_order_degenerate_and_other_shapes() -> None:
    assert reference.swizzle_order(1, 1).tolist() == [0]
    assert reference.swizzle_order(1, 4).tolist() == [0, 1, 2, 3]  # one node: nothing to transpose
    assert reference.swizzle_order(4, 1).tolist() == [0, 1, 2, 3]  # one device per node: idem
    assert reference.swizzle_order(3, 2).tolist() == [0, 2, 4, 1, 3, 5]
    assert reference.swizzle_order(1, 1, 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        reference.swizzle_order(0, 4)


def test_swizzle_moves_whole_slices_with_their_rows() -> None:
    a = np.arange(16).reshape(8, 2)  # 8 slices of one row each
    assert reference.swizzle(a, 2, 4)[:, 0].tolist() == [0, 8, 2, 10, 4, 12, 6, 14]
    assert reference.swizzle(np.arange(16), 2, 4).reshape(8, 2)[:, 0].tolist() == [0, 8, 2, 10, 4, 12, 6, 14]


def test_plan_writes_partitions_in_swizzled_order_2x4() -> None:
    # one element per group and per partition: partition z holds (z + 1) * (-1)**z
    x = np.array([(z + 1) * (-1) ** z for z in range(8)], np.float32)
    q, s, z = run_plan(x, 1, nodes=2, dpn=4, q_min=-127)
    assert q.shape == (1, 4, 2) and s.shape == (1, 4, 2) and z is None
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    assert s.reshape(-1).tolist() == [np.float32(k + 1) / np.float32(127) for k in order]
    assert q.reshape(-1).tolist() == [127 if k % 2 == 0 else -127 for k in order]
    # chunk for local device d = partitions d (node 0) and 4 + d (node 1)
    for d in range(4):
        assert s[0, d].tolist() == [np.float32(d + 1) / np.float32(127), np.float32(d + 5) / np.float32(127)]


def test_plan_writes_pipeline_stages_outermost() -> None:
    x = np.arange(1, 17, dtype=np.float32)  # slice i = z * 2 + p holds the value i + 1
    q, s, _ = run_plan(x, 1, nodes=2, dpn=4, pipeline=2, q_min=-127)
    assert q.shape == (2, 4, 2) and np.all(q == 127)
    got = np.rint(s.reshape(-1) * 127).astype(int) - 1
    assert got.tolist() == [0, 8, 2, 10, 4, 12, 6, 14, 1, 9, 3, 11, 5, 13, 7, 15]
    for p in range(2):
        for d in range(4):
            # stage p, local device d: partition d of node 0 then partition 4 + d of node 1
            assert np.rint(s[p, d] * 127).astype(int).tolist() == [2 * d + p + 1, 2 * (4 + d) + p + 1]


def test_hand_vector_symmetric_int8_groups_of_three_2x2() -> None:
    a = [1.0, -2.0, 0.5]  # scale 2/127: codes 64 (63.5 ties to even), -127, 32
    b = [4.0, -1.0, 3.0]  # scale 4/127: codes 127, -32 (-31.75), 95 (95.25)
    c = [0.0, 0.0, 0.0]  # scale 1, codes 0
    d = [-8.0, 4.0, 2.0]  # scale 8/127: codes -127, 64 (63.5), 32 (31.75)
    x = np.array(a + b + c + d, np.float32)  # partitions z = 0, 1, 2, 3 (node 0: 0 1, node 1: 2 3)
    q, s, _ = run_plan(x, 3, nodes=2, dpn=2, q_min=-127)
    # device 0 gets partitions 0 (node 0) and 2 (node 1); device 1 gets 1 and 3
    assert q.tolist() == [[[64, -127, 32, 0, 0, 0], [127, -32, 95, -127, 64, 32]]]
    f = np.float32
    assert s.tolist() == [[[f(2) / f(127), 1.0], [f(4) / f(127), f(8) / f(127)]]]


def test_hand_vector_asymmetric_u4_both_nibble_orders() -> None:
    # group [-1, 0, 2, 1]: lo -1, hi 2, scale fl(3/15), zp 5, codes 0 5 15 10; group of zeros: scale 1, zp 0
    x = np.array([-1.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    for order, first in ((LOW, [0x50, 0xAF]), (HIGH, [0x05, 0xFA])):
        q, s, z = run_plan(x, 4, nodes=2, mode=ASYM, out=EK.U4, order=order)
        assert q.shape == (1, 1, 4) and q.dtype == np.uint8
        assert q.tolist() == [[first + [0x00, 0x00]]]
        assert s.tolist() == [[[np.float32(3) / np.float32(15), 1.0]]]
        assert z is not None and z.tolist() == [[[5, 0]]]


def test_hand_vector_s4_symmetric_high_first_swizzled() -> None:
    # 2 nodes x 2 devices, one group of 2 per partition, q range [-7, 7]
    x = np.array([7.0, -3.5, -7.0, 2.5, 2.0, -2.0, 0.0, 0.0], np.float32)
    q, s, _ = run_plan(x, 2, nodes=2, dpn=2, out=EK.S4, q_min=-7, q_max=7, order=HIGH)
    # partition codes (ties to even): [7, -4], [-7, 2], [7, -7] (2 / fl(2/7) = 6.9999997), [0, 0]
    # device 0 gets partitions 0 and 2, device 1 gets 1 and 3; element 2i in the high nibble
    assert q.tolist() == [[[0x7C, 0x79], [0x92, 0x00]]]
    f = np.float32
    assert s.tolist() == [[[1.0, f(2) / f(7)], [1.0, 1.0]]]


def unswizzle(a: np.ndarray, nodes: int, dpn: int, pipeline: int) -> np.ndarray:
    """Inverse of reference.swizzle on the flat stream."""
    blocks = nodes * dpn * pipeline
    rows = np.asarray(a).reshape(blocks, -1)
    out = np.empty_like(rows)
    out[reference.swizzle_order(nodes, dpn, pipeline)] = rows
    return out.reshape(-1)


CONFIGS = [  # (nodes, dpn, pipeline, group_size, groups per slice)
    (2, 4, 1, 5, 3),
    (2, 2, 2, 7, 2),
    (3, 2, 1, 16, 1),
    (1, 1, 1, 9, 4),
    (4, 1, 3, 2, 5),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize(
    ("mode", "out", "q_min", "q_max"),
    [
        (SYM, EK.S8, -127, 127),
        (ASYM, EK.U8, 0, 255),
        (SYM, EK.S4, -7, 7),
        (ASYM, EK.U4, 0, 15),
        (ASYM, EK.S8, -128, 127),
    ],
    ids=lambda v: getattr(v, "value", str(v)),
)
@pytest.mark.parametrize("in_kind", [EK.F16, EK.BF16, EK.F32])
def test_plan_is_a_permutation_of_dynamic_group_quantization(
    rng: np.random.Generator, config: tuple[int, ...], mode: QuantMode, out: EK, q_min: int, q_max: int, in_kind: EK
) -> None:
    nodes, dpn, pipeline, g, per_slice = config
    packed = ELEMENTS[out].is_packed
    if packed and (g * per_slice) % 2:
        per_slice += 1
    n = nodes * dpn * pipeline * g * per_slice
    x = random_floats(rng, (n,), in_kind).reshape(2, n // 2) if n % 2 == 0 else random_floats(rng, (n,), in_kind)
    q, s, z = run_plan(x, g, nodes, dpn, pipeline, mode, out, q_min, q_max, HIGH)
    q_ref, s_ref, z_ref = reference.dynamic_quantize(
        x.reshape(-1), GroupScope(group_size=g), mode, out, q_min, q_max, MathPrecision.F32, HIGH
    )
    assert np.array_equal(unswizzle(s, nodes, dpn, pipeline), s_ref, equal_nan=True)  # f16 data may overflow
    if z is not None:
        assert z_ref is not None and np.array_equal(unswizzle(z, nodes, dpn, pipeline), z_ref)
    assert np.array_equal(unswizzle(q, nodes, dpn, pipeline), q_ref)
    # and the reference function gives the plan's output
    q2, s2, z2, e2 = reference.swizzled_quantize(x, g, nodes, dpn, pipeline, mode, out, q_min, q_max, HIGH)
    assert np.array_equal(q2, q) and np.array_equal(s2, s, equal_nan=True) and e2 is None
    assert (z2 is None) == (z is None) and (z is None or np.array_equal(z2, z))


def test_nonfinite_group_gets_nan_scale_and_zero_codes_in_its_swizzled_place() -> None:
    x = np.ones(8, np.float32)
    x[2] = np.nan  # partition 1 (of 4, 2 elements each), which goes to device 1 / node 0
    q, s, z = run_plan(x, 2, nodes=2, dpn=2, mode=ASYM, out=EK.U8)
    assert np.isnan(s[0, 1, 0]) and np.isfinite(s[0, 1, 1]) and np.isfinite(s[0, 0]).all()
    assert z is not None and z[0, 1, 0] == 0 and q[0, 1, :2].tolist() == [0, 0]
    err = np.zeros(8, np.float32)
    run_plan(x, 2, nodes=2, dpn=2, error=err, beta=0.5)
    assert np.isnan(err[2:4]).all() and np.isfinite(np.delete(err, [2, 3])).all()


def test_zero_size_is_a_noop() -> None:
    x = np.zeros((0, 4), np.float32)
    q, s, _ = run_plan(x, 4, nodes=2, dpn=2)
    assert q.shape == (1, 2, 0) and s.shape == (1, 2, 0)


# ---------------------------------------------------------------------------------------------
# LoCo error feedback
# ---------------------------------------------------------------------------------------------


def test_loco_hand_vector_three_steps() -> None:
    # S4 symmetric with q range [-8, 4]: amax 4 -> scale 1 exactly; beta 0.5
    x = np.array([4.0, 1.25], np.float32)
    err = np.zeros(2, np.float16)
    expected = [  # (codes, error after the step); e' = .5 e + .5 (v - q)
        ([4, 1], [0.0, 0.125]),  # v = [4, 1.25] -> q [4, 1], r = 0.25
        ([4, 1], [0.0, 0.25]),  # v = [4, 1.375] -> q [4, 1], r = 0.375
        ([4, 2], [0.0, -0.125]),  # v = [4, 1.5] -> q [4, 2] (tie to even), r = -0.5
        ([4, 1], [0.0, 0.0]),  # v = [4, 1.125] -> q [4, 1], r = 0.125
    ]
    for codes, e_after in expected:
        q, s, _ = run_plan(x, 2, out=EK.S4, q_min=-8, q_max=4, order=HIGH, error=err, beta=0.5)
        assert s.tolist() == [[[1.0]]]
        assert reference.unpack_nibbles(q.reshape(-1), 2, True, HIGH).tolist() == codes
        assert err.dtype == np.float16 and err.tolist() == e_after


def test_loco_update_formula_order_in_float32() -> None:
    v = np.array([1.1, -2.7, 3.3e-3], np.float32)
    d = np.array([1.0, -2.5, 0.0], np.float32)
    e = np.array([0.3, -0.1, 1e-4], np.float32)
    beta = 0.37
    b = np.float32(beta)
    c = np.float32(1) - b
    want = (b * e).astype(np.float32) + (c * (v - d).astype(np.float32)).astype(np.float32)
    got = reference.loco_error_update(v, d, e, beta)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    for dtype in (np.float16, ELEMENTS[EK.BF16].numpy_dtype):
        got = reference.loco_error_update(v, d, e.astype(dtype), beta)
        want_d = (b * e.astype(dtype).astype(np.float32)).astype(np.float32) + (c * (v - d)).astype(np.float32)
        assert got.dtype == dtype and np.array_equal(got, want_d.astype(dtype))
    # beta = 1: the error is kept; beta = 0: it becomes the residual
    assert np.array_equal(reference.loco_error_update(v, d, e, 1.0), e)
    assert np.array_equal(reference.loco_error_update(v, d, e, 0.0), (v - d).astype(np.float32))


def test_loco_plan_matches_explicit_steps(rng: np.random.Generator) -> None:
    nodes, dpn, g = 2, 2, 6
    x = random_floats(rng, (nodes * dpn * g * 2,), EK.BF16, specials=False)
    err = (rng.standard_normal(x.size) * 0.01).astype(np.float32)
    e0 = err.copy()
    q, s, _ = run_plan(x, g, nodes, dpn, out=EK.S4, q_min=-7, q_max=7, error=err, beta=0.25)
    v = (x.astype(np.float32) + e0).astype(np.float32)
    q_ref, s_ref, _ = reference.dynamic_quantize(v, GroupScope(group_size=g), SYM, EK.S4, -7, 7, MathPrecision.F32)
    assert np.array_equal(unswizzle(q, nodes, dpn, 1), q_ref) and np.array_equal(unswizzle(s, nodes, dpn, 1), s_ref)
    dq = reference.dequantize(q_ref, np.repeat(s_ref, g), 0, EK.S4, EK.F32, x.size, MathPrecision.F32)
    assert np.array_equal(err, reference.loco_error_update(v, dq, e0, 0.25))
    assert np.all(np.abs(err) <= 0.75 * np.repeat(s_ref, g) / 2 + 0.25 * np.abs(e0) + 1e-7)


def test_loco_with_beta_zero_makes_the_mean_of_dequantized_steps_converge(rng: np.random.Generator) -> None:
    x = rng.standard_normal(32).astype(np.float32)
    err = np.zeros(32, np.float32)
    total = np.zeros(32, np.float64)
    steps = 64
    max_scale = 0.0
    for _ in range(steps):
        q, s, _ = run_plan(x, 8, nodes=2, dpn=2, out=EK.S4, q_min=-7, q_max=7, error=err, beta=0.0)
        codes = reference.unpack_nibbles(q.reshape(-1), 32, True, LOW)
        scale = np.repeat(s.reshape(-1), 8)
        total += unswizzle(codes * scale.astype(np.float64), 2, 2, 1)
        max_scale = max(max_scale, float(s.max()))
    # sum of dequantized steps = steps * x - e_final (beta = 0): the mean is within |e| / steps
    mean_err = np.abs(total / steps - x)
    assert np.all(mean_err <= (max_scale / 2) / steps + 1e-5)
    assert np.abs(x - np.round(x / max_scale) * max_scale).max() > 10 * mean_err.max()  # far better than one step
