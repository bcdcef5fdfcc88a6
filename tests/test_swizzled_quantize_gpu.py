"""GPU: SwizzledQuantizePlan equals the reference bit for bit (codes, scales, zero points, LoCo buffer).

Every input float x code x mode, several (nodes, devices_per_node, pipeline) splits, the fused
pass (even and ragged groups), the two-pass path (4-bit codes with odd groups, groups above
32768 elements), LoCo error feedback with every buffer element, misaligned operands (the
element-I/O twin), non-finite and all-zero groups, both nibble orders; fresh random data.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE, first_mismatch, float_bits_equal, random_floats, to_device

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

QGZ_FLOATS = [EK.F16, EK.BF16, EK.F32]
QGZ_CODES = [EK.S8, EK.U8, EK.S4, EK.U4]
SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC


def special_groups(x: np.ndarray, group_size: int, kind: EK) -> np.ndarray:
    """Group 1 all zeros, group 2 holds a NaN, group 3 a -Inf (when there are that many groups)."""
    flat = x.reshape(-1).astype(np.float64)
    groups = flat.size // group_size
    if groups > 1:
        flat[group_size : 2 * group_size] = 0.0
    if groups > 2:
        flat[2 * group_size + group_size // 2] = np.nan
    if groups > 3:
        flat[4 * group_size - 1] = -np.inf
    return flat.reshape(x.shape).astype(ELEMENTS[kind].numpy_dtype)


def device_view(a: np.ndarray, offset_elements: int):  # noqa: ANN201
    """A CuPy copy of ``a``, placed ``offset_elements`` elements into a larger buffer (misaligned when odd)."""
    import cupy

    d = to_device(a.reshape(-1))
    if offset_elements == 0:
        return d.reshape(a.shape)
    big = cupy.zeros(d.size + offset_elements, d.dtype)
    big[offset_elements:] = d
    return big[offset_elements:].reshape(a.shape)


def run_both(
    desc: qp.SwizzledQuantizeDescriptor,
    x: np.ndarray,
    error: np.ndarray | None = None,
    beta: float | None = None,
    offset: int = 0,
    pref: qp.PlanPreference | None = None,
) -> tuple[bytes, ...]:
    """Run the reference and the CUDA plan (selected with ``pref``) on the same data, assert every
    output is bit-equal, and return the CUDA outputs' bytes (codes, scales, zero points, error buffer)."""
    import cupy

    asym = desc.mode is ASYM
    qdtype = ELEMENTS[desc.output_element].numpy_dtype
    q_ref = np.zeros(desc.output_shape, qdtype)
    s_ref = np.zeros(desc.param_shape, np.float32)
    z_ref = np.zeros(desc.param_shape, np.int32) if asym else None
    e_ref = None if error is None else error.copy()
    qp.SwizzledQuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.SwizzledQuantizeArgs(x, q_ref, s_ref, z_ref, e_ref, beta)
    )
    plan = qp.SwizzledQuantizePlan.select(None, desc, pref)
    assert plan.backend is qp.BackendKind.CUDA
    q_dev = device_view(np.full(desc.output_shape, 0x5A, np.uint8).view(qdtype), offset)
    s_dev = cupy.full(desc.param_shape, 7.0, np.float32)
    z_dev = cupy.full(desc.param_shape, 99, np.int32) if asym else None
    e_dev = None if error is None else device_view(error, offset)
    plan.run(None, None, qp.SwizzledQuantizeArgs(device_view(x, offset), q_dev, s_dev, z_dev, e_dev, beta))
    variant = plan.sku().variant
    got_q = q_dev.get().view(np.uint8)
    assert np.array_equal(got_q, q_ref.view(np.uint8)), (
        f"{variant}: codes {first_mismatch(got_q, q_ref.view(np.uint8))}"
    )
    assert float_bits_equal(s_dev.get(), s_ref), f"{variant}: scales {first_mismatch(s_dev.get(), s_ref)}"
    if asym:
        assert z_dev is not None and z_ref is not None
        assert np.array_equal(z_dev.get(), z_ref), f"{variant}: zero points {first_mismatch(z_dev.get(), z_ref)}"
    if error is not None:
        assert e_dev is not None and e_ref is not None
        got_e = e_dev.get().view(e_ref.dtype)
        assert float_bits_equal(got_e, e_ref), f"{variant}: error buffer {first_mismatch(got_e, e_ref)}"
    return (
        got_q.tobytes(),
        s_dev.get().tobytes(),
        b"" if z_dev is None else z_dev.get().tobytes(),
        b"" if e_dev is None else e_dev.get().tobytes(),
    )


def descriptor(
    shape: tuple[int, ...], group: int, split: tuple[int, int, int], **kw: object
) -> qp.SwizzledQuantizeDescriptor:
    nodes, dpn, pipeline = split
    return qp.SwizzledQuantizeDescriptor(
        shape=shape, group_size=group, nodes=nodes, devices_per_node=dpn, pipeline=pipeline, **kw
    )


# (shape, group size, (nodes, devices_per_node, pipeline)): fused pass, ragged groups, hierarchy.
FUSED_CASES = [
    ((8, 2048), 256, (2, 4, 1)),
    ((6, 770), 110, (1, 3, 2)),
    ((4, 4, 96), 6, (2, 2, 2)),
    ((40, 2048), 2048, (1, 8, 1)),
    ((3, 30000), 30000, (1, 1, 1)),
]


@pytest.mark.parametrize("shape,group,split", FUSED_CASES)
@pytest.mark.parametrize("code", QGZ_CODES)
@pytest.mark.parametrize("float_kind", QGZ_FLOATS)
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_fused_pass_matches_reference(rng, shape, group, split, code, float_kind, mode) -> None:  # noqa: ANN001
    x = special_groups(random_floats(rng, shape, float_kind), group, float_kind)
    desc = descriptor(shape, group, split, mode=mode, input_element=float_kind, output_element=code)
    run_both(desc, x)


@pytest.mark.parametrize(
    "shape,group,split,code",
    [
        ((2, 4, 70), 7, (2, 2, 1), EK.S4),  # odd groups of 4-bit codes: the two-pass path
        ((2, 4, 70), 7, (2, 2, 1), EK.U4),
        ((4, 40000), 40000, (2, 2, 1), EK.S8),  # groups above 32768 elements
        ((2, 40002), 40002, (1, 2, 1), EK.U4),
    ],
)
@pytest.mark.parametrize("float_kind", QGZ_FLOATS)
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_two_pass_matches_reference(rng, shape, group, split, code, float_kind, mode) -> None:  # noqa: ANN001
    x = special_groups(random_floats(rng, shape, float_kind), group, float_kind)
    desc = descriptor(shape, group, split, mode=mode, input_element=float_kind, output_element=code)
    assert qp.SwizzledQuantizePlan.select(None, desc).sku().variant.startswith("two-pass")
    run_both(desc, x)


@pytest.mark.parametrize("error_kind", QGZ_FLOATS)
@pytest.mark.parametrize("float_kind", QGZ_FLOATS)
@pytest.mark.parametrize("code,mode", [(EK.S8, SYM), (EK.S4, SYM), (EK.U4, ASYM), (EK.U8, ASYM)])
@pytest.mark.parametrize("shape,group,split", [((4, 1024), 128, (2, 2, 1)), ((2, 4, 70), 7, (2, 2, 1))])
def test_loco_error_feedback_matches_reference(rng, error_kind, float_kind, code, mode, shape, group, split) -> None:  # noqa: ANN001
    x = random_floats(rng, shape, float_kind, specials=False)
    error = (random_floats(rng, shape, EK.F32, specials=False).astype(np.float32) * 0.01).astype(
        ELEMENTS[error_kind].numpy_dtype
    )
    desc = descriptor(
        shape, group, split, mode=mode, input_element=float_kind, output_element=code, error_element=error_kind
    )
    beta = float(rng.uniform(0.0, 1.0))
    run_both(desc, x, error, beta)
    run_both(desc, x, error, 1.0)
    run_both(desc, x, error, 0.0)


@pytest.mark.parametrize("code", QGZ_CODES)
@pytest.mark.parametrize("error_kind", [None, EK.BF16])
def test_misaligned_operands_take_the_element_io_twin(rng, code, error_kind) -> None:  # noqa: ANN001
    shape, group = (8, 512), 64
    x = random_floats(rng, shape, EK.BF16)
    error = None
    if error_kind is not None:
        small = random_floats(rng, shape, EK.F32, specials=False) * np.float32(0.01)
        error = small.astype(ELEMENTS[error_kind].numpy_dtype)
    desc = descriptor(shape, group, (2, 2, 1), input_element=EK.BF16, output_element=code, error_element=error_kind)
    run_both(desc, x, error, None if error is None else 0.5, offset=1)


@pytest.mark.parametrize("code", [EK.S4, EK.U4])
def test_high_first_nibbles(rng, code) -> None:  # noqa: ANN001
    shape = (4, 1000)
    x = random_floats(rng, shape, EK.F16)
    for group in (100, 5):  # fused, then two-pass
        desc = descriptor(
            shape, group, (1, 2, 2), input_element=EK.F16, output_element=code, nibble_order=qp.NibbleOrder.HIGH_FIRST
        )
        run_both(desc, x)


def test_run_is_deterministic_and_leaves_input_alone(rng) -> None:  # noqa: ANN001
    import cupy

    shape, group = (64, 4096), 2048
    x = random_floats(rng, shape, EK.BF16)
    desc = descriptor(shape, group, (2, 4, 1), input_element=EK.BF16, output_element=EK.S4)
    plan = qp.SwizzledQuantizePlan.select(None, desc)
    xd = to_device(x)
    before = xd.copy()
    outs = []
    for _ in range(2):
        q = cupy.zeros(desc.output_shape, np.uint8)
        s = cupy.zeros(desc.param_shape, np.float32)
        plan.run(None, None, qp.SwizzledQuantizeArgs(xd, q, s))
        outs.append((q.get(), s.get()))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    assert bool((xd == before).all())


def test_bad_input_raises_before_launch(rng) -> None:  # noqa: ANN001
    import cupy

    shape, group = (4, 256), 64
    desc = descriptor(shape, group, (2, 2, 1), input_element=EK.F32, output_element=EK.S8)
    plan = qp.SwizzledQuantizePlan.select(None, desc)
    x = cupy.asarray(random_floats(rng, shape, EK.F32))
    q = cupy.full(desc.output_shape, 3, np.int8)
    s = cupy.full(desc.param_shape, 5.0, np.float32)
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.SwizzledQuantizeArgs(x, q[:, :, :-1], s))
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.SwizzledQuantizeArgs(x.astype(np.float16), q, s))
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, None, qp.SwizzledQuantizeArgs(x.get(), q, s))  # host array on a CUDA plan
    overlap = cupy.zeros(x.size, np.float32)
    with pytest.raises(qp.InvalidProblem, match="overlaps"):
        plan.run(None, None, qp.SwizzledQuantizeArgs(overlap.reshape(shape), q, overlap[: s.size].reshape(s.shape)))
    assert bool((q == 3).all()) and bool((s == 5.0).all())


# The dense pass (16-bit input, no LoCo, groups of team * 8 * nv elements): 4 vectors per thread
# (the grid fills the GPU: 18432 groups of 512), 2 and 1 (small problems widen the team), a team
# of one thread (groups of 8) and of a block (2048), non-finite and all-zero groups, both nibble
# orders and a hierarchical split; symmetric teams spanning warps over several passes per block
# (4608 groups of 2048) and a symmetric team of a whole block in a small problem.
DENSE_CASES = [
    ((2304, 4096), 512, (2, 4, 1), EK.F16, EK.S4, SYM, qp.NibbleOrder.LOW_FIRST),
    ((2304, 4096), 512, (1, 8, 1), EK.BF16, EK.U8, ASYM, qp.NibbleOrder.LOW_FIRST),
    ((16, 8192), 512, (1, 8, 1), EK.F16, EK.S4, SYM, qp.NibbleOrder.HIGH_FIRST),
    ((4, 2048), 8, (2, 2, 2), EK.BF16, EK.S8, SYM, qp.NibbleOrder.LOW_FIRST),
    ((6, 4096), 128, (1, 2, 2), EK.F16, EK.U4, ASYM, qp.NibbleOrder.HIGH_FIRST),
    ((8, 4096), 2048, (2, 2, 1), EK.F16, EK.S4, ASYM, qp.NibbleOrder.LOW_FIRST),
    ((2304, 4096), 2048, (1, 8, 1), EK.F16, EK.S8, SYM, qp.NibbleOrder.LOW_FIRST),
    ((16, 8192), 2048, (1, 8, 1), EK.BF16, EK.S4, SYM, qp.NibbleOrder.HIGH_FIRST),
]


@pytest.mark.parametrize("shape,group,split,float_kind,code,mode,order", DENSE_CASES)
def test_dense_pass_matches_reference(rng, shape, group, split, float_kind, code, mode, order) -> None:  # noqa: ANN001
    x = special_groups(random_floats(rng, shape, float_kind), group, float_kind)
    desc = descriptor(shape, group, split, mode=mode, input_element=float_kind, output_element=code, nibble_order=order)
    assert qp.SwizzledQuantizePlan.select(None, desc).sku().variant.startswith("dense")
    run_both(desc, x)


# ---- views of the same bytes, and forced schedules -----------------------------------------------

#: (numel, group size, split, input, code, mode, LoCo buffer): ragged flat buckets reaching each
#: schedule by default: dense (2311 groups of 512 per slice: 4 vectors per thread on an H100; 16 x
#: 8192 in groups of 512; groups of 2048), the fused pass (groups of 110 and 6, F32 input, LoCo),
#: two-pass (groups above 32768, odd 4-bit groups).
VIEW_CASES = [
    (2 * 4 * 2311 * 512, 512, (2, 4, 1), EK.F16, EK.S4, SYM, None),
    (16 * 8192, 512, (1, 8, 1), EK.BF16, EK.U4, ASYM, None),
    (8 * 9 * 2048, 2048, (1, 8, 1), EK.F16, EK.S8, SYM, None),
    (2 * 3 * 13 * 110, 110, (2, 3, 1), EK.BF16, EK.S4, SYM, None),
    (2 * 2 * 2 * 29 * 6, 6, (2, 2, 2), EK.F32, EK.U8, ASYM, None),
    (4 * 11 * 64, 64, (2, 2, 1), EK.F16, EK.S4, ASYM, EK.BF16),
    (2 * 3 * 40000, 40000, (1, 2, 1), EK.BF16, EK.S8, SYM, None),
    (2 * 2 * 7 * 2, 7, (1, 2, 1), EK.F16, EK.U4, SYM, None),
]


def _views(numel: int, group: int, slices: int) -> list[tuple[int, ...]]:
    """The flat bucket, rows of one group, rows of one slice, and a 3-D view (leading 2 where it divides)."""
    lead = 2 if (numel // group) % 2 == 0 else 1
    return [(numel,), (numel // group, group), (slices, numel // slices), (lead, numel // (lead * group), group)]


def _loco_buffer(rng: np.random.Generator, shape: tuple[int, ...], kind: EK | None) -> np.ndarray | None:
    if kind is None:
        return None
    small = random_floats(rng, shape, EK.F32, specials=False) * np.float32(0.01)
    return small.astype(ELEMENTS[kind].numpy_dtype)


@pytest.mark.parametrize("numel,group,split,float_kind,code,mode,error_kind", VIEW_CASES)
def test_every_view_of_a_bucket_gives_the_same_bytes(
    rng, numel, group, split, float_kind, code, mode, error_kind
) -> None:  # noqa: ANN001
    """The flat 1-D bucket and its 2-D / 3-D views: each equals the reference, and all are byte-identical."""
    flat = special_groups(random_floats(rng, (numel,), float_kind), group, float_kind)
    error = _loco_buffer(rng, (numel,), error_kind)
    outputs = []
    variants = set()
    for shape in _views(numel, group, split[0] * split[1] * split[2]):
        desc = descriptor(shape, group, split, mode=mode, input_element=float_kind, output_element=code,
                          error_element=error_kind)  # fmt: skip
        variants.add(qp.SwizzledQuantizePlan.select(None, desc).sku().variant)
        e = None if error is None else error.reshape(shape).copy()
        outputs.append(run_both(desc, flat.reshape(shape), e, None if e is None else 0.25))
    assert len(variants) == 1, variants
    assert all(o == outputs[0] for o in outputs[1:]), "a view of the same bytes changed the output"


@pytest.mark.parametrize("schedule", ["dense", "fused", "fused-element-io", "two-pass"])
@pytest.mark.parametrize("numel,group,split,float_kind,code,mode,error_kind", VIEW_CASES)
def test_forced_schedule_matches_reference(
    rng, schedule, numel, group, split, float_kind, code, mode, error_kind
) -> None:  # noqa: ANN001
    """Every schedule forced on every problem it can serve (refused before any launch otherwise):
    the reference's bits, flat and as rows, and the variant that ran is the one forced."""
    pref = qp.PlanPreference(schedule=schedule)
    flat = special_groups(random_floats(rng, (numel,), float_kind), group, float_kind)
    error = _loco_buffer(rng, (numel,), error_kind)
    outputs = []
    for shape in ((numel,), (numel // group, group)):
        desc = descriptor(shape, group, split, mode=mode, input_element=float_kind, output_element=code,
                          error_element=error_kind)  # fmt: skip
        try:
            plan = qp.SwizzledQuantizePlan.select(None, desc, pref)
        except qp.Unsupported:
            assert schedule != "two-pass"
            continue
        variant = plan.sku().variant
        tag = {"dense": "dense[", "fused": "fused-single-pass[", "two-pass": "two-pass["}.get(schedule)
        if tag is not None:
            assert variant.startswith(tag), variant
        else:  # the element-I/O twin: one element per access (two for 4-bit codes, scalar I/O)
            assert variant.startswith("fused-single-pass[") and ("vec1" in variant or "scalar-io" in variant), variant
        e = None if error is None else error.reshape(shape).copy()
        outputs.append(run_both(desc, flat.reshape(shape), e, None if e is None else 0.25, pref=pref))
    assert all(o == outputs[0] for o in outputs[1:])
