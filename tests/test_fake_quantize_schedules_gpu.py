"""GPU: the specialised fake-quantization kernels equal the reference bit for bit.

``dynamic_fake_quantize_dense`` (DynamicRangeFakeQuantizePlan on 16-bit segments of
team x 8 x nv elements, both roundings) and the ``*_dense_rows`` kernels (FakeQuantizePlan,
FakeQuantizeBackwardPlan and the multi-pass dynamic path on contiguous rows with one parameter
per row or per whole vector): the shapes that select them and their edges (teams of every size,
partial blocks of teams, partial chunks, several chunks per row, per-vector group parameters,
int32 / float zero points, NaN / Inf / zero segments, scales whose reciprocal overflows, in place),
and misaligned operands falling back to the generic kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REFERENCE, first_mismatch, float_bits_equal, random_floats, to_device

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
NEAREST, STOCHASTIC = qp.Rounding.NEAREST_EVEN, qp.Rounding.STOCHASTIC


# ---- DynamicRangeFakeQuantizePlan: dynamic_fake_quantize_dense --------------------------------


def _segments_data(rng: np.random.Generator, shape: tuple[int, int], kind: EK) -> np.ndarray:
    """Random rows with an all-zero row, a NaN row, an Inf row and (bf16) a row so small that
    its scale's reciprocal overflows float32 (the kernel's general path)."""
    x = random_floats(rng, shape, kind).astype(np.float64)
    rows = shape[0]
    if rows > 5:
        x[1] = 0.0
        x[2, 3] = np.nan
        x[3, -1] = -np.inf
        x[4] = rng.standard_normal(shape[1]) * 2.0**-126  # bf16 subnormals: scale < 2**-128
        x[5] *= 2.0**-20
    with np.errstate(over="ignore", under="ignore"):
        return x.astype(ELEMENTS[kind].numpy_dtype)


def _dynamic(
    desc: qp.DynamicRangeFakeQuantizeDescriptor,
    x: np.ndarray,
    in_place: bool = False,
    pref: qp.PlanPreference | None = None,
) -> str:
    """Run ``desc`` on ``x`` on the reference and the device (``pref``: its preference, e.g. a
    forced schedule), assert the same bits, return the device plan's variant."""
    import cupy

    kw = {"rng_seed": 2**64 - 5, "rng_offset": 3 << 33} if desc.rounding is STOCHASTIC else {}
    y_ref, s_ref = np.zeros_like(x), np.zeros(desc.param_shape, np.float32)
    z_ref = np.zeros(desc.param_shape, np.int32) if desc.mode is ASYM else None
    qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.DynamicRangeFakeQuantizeArgs(x, y_ref, s_ref, z_ref, **kw)
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc, pref)
    xd = to_device(x)
    yd = xd if in_place else cupy.full_like(xd, 0x3C)
    sd = cupy.full(desc.param_shape, 7.0, np.float32)
    zd = cupy.full(desc.param_shape, 99, np.int32) if desc.mode is ASYM else None
    ws = qp.Workspace.allocate(plan.workspace_size())  # None when 0; multi-pass needs scratch
    plan.run(None, ws, qp.DynamicRangeFakeQuantizeArgs(xd, yd, sd, zd, **kw))
    y = yd.get().view(x.dtype)
    assert float_bits_equal(y, y_ref), first_mismatch(y.view(np.uint16), y_ref.view(np.uint16))
    assert float_bits_equal(sd.get(), s_ref)
    if zd is not None:
        assert np.array_equal(zd.get(), z_ref)
    return plan.sku().variant


# (segments, length): teams of 1 to 256 threads and 1 to 4 vectors each; block-fulls of teams
# with a partial last block (301 segments of 64: teams of 8, 32 per block).
DENSE_SHAPES = [(7, 8192), (9, 2048), (301, 64), (33, 8), (50, 1024), (3, 4096), (16, 8192)]


@pytest.mark.parametrize(("rows", "length"), DENSE_SHAPES)
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16], ids=lambda k: k.name)
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 8), (SYM, 2), (ASYM, 3)])
@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC], ids=["nearest", "stochastic"])
def test_dynamic_dense_matches_reference(rng, rows, length, kind, mode, bits, rounding) -> None:
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=(rows, length), scope=qp.TokenScope(), mode=mode, element=kind, bits=bits, rounding=rounding
    )
    variant = _dynamic(desc, _segments_data(rng, (rows, length), kind))
    assert "fused-single-pass[dense" in variant, variant


@pytest.mark.parametrize(
    ("shape", "kind", "mode", "rounding", "in_place"),
    [
        ((30000, 64), EK.F16, ASYM, STOCHASTIC, False),  # teams of 8, 32 per block: 938 blocks
        ((30000, 64), EK.BF16, SYM, NEAREST, True),
        ((900, 8192), EK.F16, SYM, NEAREST, False),  # one team per block: 900 blocks
        ((900, 8192), EK.BF16, ASYM, STOCHASTIC, True),
    ],
)
def test_dynamic_dense_grid_stride(rng, shape, kind, mode, rounding, in_place) -> None:
    """More blocks of teams than an H200 holds at once (6 x 132): the persistent grid strides and
    prefetches each team's next segment."""
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=mode, element=kind, bits=8, rounding=rounding
    )
    assert "dense" in _dynamic(desc, _segments_data(rng, shape, kind), in_place=in_place)


@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC], ids=["nearest", "stochastic"])
def test_dynamic_dense_groups_and_in_place(rng, rounding) -> None:
    shape = (24, 4096)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.GroupScope(axis=-1, group_size=256), mode=ASYM, element=EK.BF16, rounding=rounding
    )
    assert "dense" in _dynamic(desc, _segments_data(rng, shape, EK.BF16), in_place=True)


# ---- FakeQuantizePlan / FakeQuantizeBackwardPlan: *_dense_rows ---------------------------------

RANGES = {SYM: (-128, 127), ASYM: (0, 255)}

# (scope, shape): one parameter per row (token, leading channel axis: rank 2 and 3), several and
# partial chunks per row, per-vector group parameters (groups a multiple of the vector).
ROW_CASES = [
    (qp.ChannelScope(axis=0), (16, 8192)),
    (qp.ChannelScope(axis=0), (37, 1000)),
    (qp.ChannelScope(axis=0), (3, 7, 256)),
    (qp.TokenScope(), (300, 2056)),
    (qp.TokenScope(), (2, 65536)),
    (qp.GroupScope(axis=-1, group_size=64), (5, 4096)),
    (qp.GroupScope(axis=-1, group_size=8), (3, 2048)),
]


def _params(rng: np.random.Generator, desc, x: np.ndarray, float_zp: bool) -> tuple:  # noqa: ANN001
    dtype = np.float64 if desc.element is EK.F64 else np.float32
    finite = x.astype(np.float64)[np.isfinite(x.astype(np.float64))]
    amax = float(np.max(np.abs(finite), initial=1.0))
    scale = (amax / 100 * np.exp(rng.uniform(-1.5, 0.5, size=desc.param_shape))).astype(dtype)
    if desc.mode is SYM:
        return scale, None
    if float_zp:
        return scale, rng.uniform(-20, 275, size=desc.param_shape).astype(dtype)
    return scale, rng.integers(0, 256, size=desc.param_shape).astype(np.int32)


def _with_specials(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    flat = x.reshape(-1).copy()
    idx = rng.choice(flat.size, size=4, replace=False)
    flat[idx] = np.array([np.nan, -np.inf, -0.0, np.inf]).astype(x.dtype)
    return flat.reshape(x.shape)


@pytest.mark.parametrize("case", range(len(ROW_CASES)))
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16, EK.F32, EK.F64], ids=lambda k: k.name)
@pytest.mark.parametrize("zp", ["sym", "int", "float"])
def test_dense_rows_match_reference(rng, case, kind, zp) -> None:
    import cupy

    scope, shape = ROW_CASES[case]
    mode = SYM if zp == "sym" else ASYM
    q_min, q_max = RANGES[mode]
    fields = dict(shape=shape, scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max)
    desc = qp.FakeQuantizeDescriptor(**fields)
    bdesc = qp.FakeQuantizeBackwardDescriptor(**fields)
    x = _with_specials(rng, random_floats(rng, shape, kind))
    dy = random_floats(rng, shape, kind, specials=False)
    scale, zero_point = _params(rng, desc, x, zp == "float")
    y_ref, dx_ref = np.zeros_like(x), np.zeros_like(dy)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zero_point))
    qp.FakeQuantizeBackwardPlan.select(None, bdesc, REFERENCE).run(
        None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx_ref, scale, zero_point)
    )
    plan, bplan = qp.FakeQuantizePlan.select(None, desc), qp.FakeQuantizeBackwardPlan.select(None, bdesc)
    assert "dense-rows" in plan.sku().variant and "dense-rows" in bplan.sku().variant, plan.sku().variant
    sd, zd = to_device(scale), None if zero_point is None else to_device(zero_point)
    xd = to_device(x)
    y = cupy.full_like(xd, 7)
    plan.run(None, None, qp.FakeQuantizeArgs(xd, y, sd, zd))
    got = y.get().view(x.dtype).reshape(shape)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)
    dyd = to_device(dy)
    bplan.run(None, None, qp.FakeQuantizeBackwardArgs(xd, dyd, dyd, sd, zd))  # in place: dx is dy
    got = dyd.get().view(dy.dtype).reshape(shape)
    assert float_bits_equal(got, dx_ref), first_mismatch(got, dx_ref)
    plan.run(None, None, qp.FakeQuantizeArgs(xd, xd, sd, zd))  # in place: y is x
    got = xd.get().view(x.dtype).reshape(shape)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)


@pytest.mark.parametrize("kind", [EK.F16, EK.F32], ids=lambda k: k.name)
def test_dense_rows_misaligned_take_the_generic_twin(rng, kind) -> None:
    import cupy

    shape = (16, 1024)
    desc = qp.FakeQuantizeDescriptor(
        shape=shape, scope=qp.ChannelScope(axis=0), mode=ASYM, element=kind, q_min=0, q_max=255
    )
    x = random_floats(rng, shape, kind)
    scale, zero_point = _params(rng, desc, x, False)
    y_ref = np.zeros_like(x)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zero_point))
    buf = to_device(np.concatenate([x.reshape(-1)[:1], x.reshape(-1)]))
    out = cupy.zeros_like(buf)
    plan = qp.FakeQuantizePlan.select(None, desc)
    plan.run(None, None, qp.FakeQuantizeArgs(buf[1:].reshape(shape), out[1:].reshape(shape), to_device(scale),
                                             to_device(zero_point)))  # fmt: skip
    got = out[1:].get().view(x.dtype).reshape(shape)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)


@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC], ids=["nearest", "stochastic"])
def test_dynamic_multi_pass_takes_the_dense_rows(rng, rounding) -> None:
    """Segments past the fused limit: range passes, then the dense-rows kernel (both roundings)."""
    shape = (2, 65536)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=ASYM, element=EK.F16, bits=5, rounding=rounding
    )
    kw = {"rng_seed": 77, "rng_offset": 5} if rounding is STOCHASTIC else {}
    x = random_floats(rng, shape, EK.F16)
    y_ref = np.zeros_like(x)
    qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.DynamicRangeFakeQuantizeArgs(x, y_ref, **kw)
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    assert "dense-rows" in plan.sku().variant, plan.sku().variant
    y = to_device(np.zeros_like(x))
    plan.run(None, qp.Workspace.allocate(plan.workspace_size()), qp.DynamicRangeFakeQuantizeArgs(to_device(x), y, **kw))
    got = y.get().view(x.dtype)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)


@pytest.mark.parametrize(
    ("q_min", "q_max", "mode"),
    [
        (-(2**21), 2**21, SYM),  # the short forms' limit, exactly
        (-(2**21) - 1, 2**21 + 1, SYM),  # just past it: the general forms
        (0, 2**24, ASYM),  # zero points up to 2**24: both forms by row
        (-(2**24), 2**24, SYM),  # the widest range (rounding of q + zp near the bounds)
    ],
)
@pytest.mark.parametrize("kind", [EK.F16, EK.F32], ids=lambda k: k.name)
def test_dense_rows_wide_code_ranges(rng, q_min, q_max, mode, kind) -> None:
    """Ranges at and past the short forms' limits (FakeShortParam::ok), forward and mask."""
    import cupy

    shape = (16, 1024)
    fields = dict(shape=shape, scope=qp.ChannelScope(axis=0), mode=mode, element=kind, q_min=q_min, q_max=q_max)
    desc, bdesc = qp.FakeQuantizeDescriptor(**fields), qp.FakeQuantizeBackwardDescriptor(**fields)
    x = _with_specials(rng, random_floats(rng, shape, kind))
    dy = random_floats(rng, shape, kind, specials=False)
    amax = np.nanmax(np.abs(np.where(np.isfinite(x.astype(np.float64)), x.astype(np.float64), 0)), axis=1)
    # codes spanning the range and beyond it (some clamp)
    scale = (np.maximum(amax, 1e-3) / (0.8 * max(abs(q_min), q_max))).reshape(16, 1).astype(np.float32)
    zp = None if mode is SYM else rng.integers(q_min, q_max + 1, size=(16, 1)).astype(np.int32)
    if zp is not None:
        zp[:4, 0] = [q_min, q_max, 2**21, 2**23 + 1]
    y_ref, dx_ref = np.zeros_like(x), np.zeros_like(dy)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zp))
    qp.FakeQuantizeBackwardPlan.select(None, bdesc, REFERENCE).run(
        None, None, qp.FakeQuantizeBackwardArgs(x, dy, dx_ref, scale, zp)
    )
    plan, bplan = qp.FakeQuantizePlan.select(None, desc), qp.FakeQuantizeBackwardPlan.select(None, bdesc)
    assert "dense-rows" in plan.sku().variant
    sd, zd, xd = to_device(scale), None if zp is None else to_device(zp), to_device(x)
    y, dx = cupy.full_like(xd, 7), cupy.full_like(xd, 7)
    plan.run(None, None, qp.FakeQuantizeArgs(xd, y, sd, zd))
    bplan.run(None, None, qp.FakeQuantizeBackwardArgs(xd, to_device(dy), dx, sd, zd))
    got = y.get().view(x.dtype).reshape(shape)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)
    got = dx.get().view(dy.dtype).reshape(shape)
    assert float_bits_equal(got, dx_ref), first_mismatch(got, dx_ref)


# ---- FakeQuantizePlan: every forced schedule on ragged shapes ------------------------------------


@pytest.mark.parametrize("schedule", ["dense-rows", "row-layout", "flat"])
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16, EK.F32, EK.F64], ids=lambda k: k.name)
def test_every_forced_fake_quantize_schedule_matches_reference(rng, schedule, kind) -> None:
    """FakeQuantizePlan forced into each schedule (``PlanPreference(schedule=...)``) on a random
    number of rows of a random multiple of 256 elements (``dense-rows`` serves every such row:
    at least 32 whole vectors), token or per-channel scope (``flat``: TensorScope), in place too."""
    import cupy

    shape = (int(rng.integers(1, 200)), 256 * int(rng.integers(1, 40)))
    scope = (
        qp.TensorScope() if schedule == "flat" else qp.TokenScope() if rng.random() < 0.5 else qp.ChannelScope(axis=0)
    )
    mode = SYM if rng.random() < 0.5 else ASYM
    q_min, q_max = RANGES[mode]
    desc = qp.FakeQuantizeDescriptor(shape=shape, scope=scope, mode=mode, element=kind, q_min=q_min, q_max=q_max)
    x = _with_specials(rng, random_floats(rng, shape, kind))
    scale, zero_point = _params(rng, desc, x, bool(rng.integers(2)))
    y_ref = np.zeros_like(x)
    qp.FakeQuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.FakeQuantizeArgs(x, y_ref, scale, zero_point))
    plan = qp.FakeQuantizePlan.select(None, desc, qp.PlanPreference(schedule=schedule))
    assert (schedule in plan.sku().variant) or (schedule == "row-layout" and "dense-rows" not in plan.sku().variant)
    sd, zd = to_device(scale), None if zero_point is None else to_device(zero_point)
    xd = to_device(x)
    y = cupy.full_like(xd, 7)
    plan.run(None, None, qp.FakeQuantizeArgs(xd, y, sd, zd))
    got = y.get().view(x.dtype).reshape(shape)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)
    plan.run(None, None, qp.FakeQuantizeArgs(xd, xd, sd, zd))  # in place: y is x
    got = xd.get().view(x.dtype).reshape(shape)
    assert float_bits_equal(got, y_ref), first_mismatch(got, y_ref)


def test_forced_fake_quantize_schedules_that_cannot_serve_refuse() -> None:
    """``flat`` serves TensorScope only and TensorScope takes nothing else; ``dense-rows`` needs rows of
    at least 32 whole vectors: Unsupported at ``select``."""
    for schedule, scope, shape in (
        ("flat", qp.TokenScope(), (4, 4096)),
        ("dense-rows", qp.TensorScope(), (4, 4096)),
        ("row-layout", qp.TensorScope(), (4, 4096)),
        ("dense-rows", qp.TokenScope(), (4, 12)),
    ):
        desc = qp.FakeQuantizeDescriptor(shape=shape, scope=scope, element=EK.F16, q_min=-8, q_max=7)
        with pytest.raises(qp.Unsupported, match=schedule):
            qp.FakeQuantizePlan.select(None, desc, qp.PlanPreference(schedule=schedule))
