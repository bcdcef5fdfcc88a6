"""GPU: DynamicRangeFakeQuantizePlan equals the reference bit for bit (values, scales, zero points).

Every float kind x scope x mode x rounding on fresh ragged data with all-zero and non-finite
segments; bit widths 1 to 8; the fused pass at every team size and the multi-pass path past it
(huge groups, strided segments, large TensorScope); in place; misaligned operands; stochastic
rounding reproducible and unbiased; graph capture; agreement with FakeQuantizePlan given the
same parameters.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import FLOATS, REFERENCE, SCOPES, first_mismatch, float_bits_equal, random_floats, to_device

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
NEAREST, STOCHASTIC = qp.Rounding.NEAREST_EVEN, qp.Rounding.STOCHASTIC


def data_with_special_segments(rng: np.random.Generator, shape: tuple[int, ...], kind: EK) -> np.ndarray:
    x = random_floats(rng, shape, kind).astype(np.float64)
    flat = x.reshape(shape[0], -1)
    flat[min(1, shape[0] - 1)] = 0.0  # an all-zero leading slice
    if shape[0] > 3:
        flat[2, 0] = np.nan
        flat[3, -1] = -np.inf
    return flat.reshape(shape).astype(ELEMENTS[kind].numpy_dtype)


def rng_args(desc: qp.DynamicRangeFakeQuantizeDescriptor, seed: int = 1234, offset: int = 77) -> dict:
    return {"rng_seed": seed, "rng_offset": offset} if desc.rounding is STOCHASTIC else {}


def reference_run(desc: qp.DynamicRangeFakeQuantizeDescriptor, x: np.ndarray, **kw: object) -> tuple:
    pdtype = np.float64 if desc.element is EK.F64 else np.float32
    y = np.zeros_like(x)
    s = np.zeros(desc.param_shape, pdtype)
    z = np.zeros(desc.param_shape, np.int32) if desc.mode is ASYM else None
    qp.DynamicRangeFakeQuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.DynamicRangeFakeQuantizeArgs(x, y, s, z, **kw)
    )
    return y, s, z


def device_run(
    desc: qp.DynamicRangeFakeQuantizeDescriptor, x: np.ndarray, in_place: bool = False, **kw: object
) -> tuple:
    import cupy

    pdtype = np.float64 if desc.element is EK.F64 else np.float32
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    x_dev = to_device(x)
    y_dev = x_dev if in_place else cupy.full_like(x_dev, 0x3C)
    s_dev = cupy.full(desc.param_shape, 7.0, pdtype)
    z_dev = cupy.full(desc.param_shape, 99, np.int32) if desc.mode is ASYM else None
    plan.run(None, ws, qp.DynamicRangeFakeQuantizeArgs(x_dev, y_dev, s_dev, z_dev, **kw))
    return y_dev.get().view(x.dtype), s_dev.get(), None if z_dev is None else z_dev.get()


def assert_same(ref: tuple, got: tuple) -> None:
    assert float_bits_equal(got[0], ref[0]), first_mismatch(got[0].view(np.uint8), ref[0].view(np.uint8))
    assert float_bits_equal(got[1], ref[1])
    if ref[2] is not None:
        assert np.array_equal(got[2], ref[2]), first_mismatch(got[2], ref[2])


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize("scope_index", range(len(SCOPES)))
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 4), (SYM, 3), (ASYM, 8)])
@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC])
def test_matches_reference(rng, float_kind, scope_index, mode, bits, rounding) -> None:
    scope, shape = SCOPES[scope_index]
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=scope, mode=mode, element=float_kind, bits=bits, rounding=rounding
    )
    x = data_with_special_segments(rng, shape, float_kind)
    assert_same(reference_run(desc, x, **rng_args(desc)), device_run(desc, x, **rng_args(desc)))


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_every_bit_width(rng, bits, mode) -> None:
    if mode is SYM and bits == 1:
        pytest.skip("SYMMETRIC needs 2 bits")
    shape = (33, 256)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.GroupScope(axis=-1, group_size=128), mode=mode, element=EK.BF16, bits=bits
    )
    x = random_floats(rng, shape, EK.BF16)
    ref = reference_run(desc, x)
    assert_same(ref, device_run(desc, x))
    # Each group holds at most 2**bits distinct values (zero among them).
    y = ref[0].astype(np.float64).reshape(33, 2, 128)
    assert max(len(np.unique(g)) for g in y.reshape(-1, 128)) <= 2**bits


# (rows, segment length): teams of 1 thread up to 1024, and lengths past the fused limit.
LENGTHS = [(301, 1), (97, 6), (50, 64), (33, 250), (9, 1000), (5, 4098), (40, 8192), (3, 20002), (2, 32768)]


@pytest.mark.parametrize(("rows", "length"), [*LENGTHS, (2, 32770), (3, 40000)])
@pytest.mark.parametrize(
    ("float_kind", "mode", "rounding"),
    [(EK.BF16, SYM, NEAREST), (EK.F16, ASYM, STOCHASTIC), (EK.F32, ASYM, NEAREST), (EK.F64, SYM, STOCHASTIC)],
)
def test_token_rows_of_every_team_size(rng, rows, length, float_kind, mode, rounding) -> None:
    shape = (rows, length)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=mode, element=float_kind, bits=6, rounding=rounding
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    fused = length <= (16384 if float_kind is EK.F64 else 32768)
    assert ("fused-single-pass" in plan.sku().variant) == fused, plan.sku().variant
    assert (plan.workspace_size() == 0) == fused
    x = data_with_special_segments(rng, shape, float_kind) if rows > 3 else random_floats(rng, shape, float_kind)
    assert_same(reference_run(desc, x, **rng_args(desc)), device_run(desc, x, **rng_args(desc)))


@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC])
@pytest.mark.parametrize("mode", [SYM, ASYM])
def test_huge_groups_take_the_multi_pass_path(rng, rounding, mode) -> None:
    """A group of 2**20 elements (DeepSpeed gives up silently past about a million)."""
    shape = (3, 1 << 20)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape,
        scope=qp.GroupScope(axis=-1, group_size=1 << 20),
        mode=mode,
        element=EK.BF16,
        bits=4,
        rounding=rounding,
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    assert "range-atomics" in plan.sku().variant and plan.workspace_size() > 0
    x = random_floats(rng, shape, EK.BF16)
    assert_same(reference_run(desc, x, **rng_args(desc)), device_run(desc, x, **rng_args(desc)))


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC])
@pytest.mark.parametrize("content", ["random", "zeros", "nan"])
def test_large_tensor_scope(rng, float_kind, rounding, content) -> None:
    shape = (301, 302)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.TensorScope(), mode=ASYM, element=float_kind, bits=5, rounding=rounding
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    assert "block-reduced-range" in plan.sku().variant and "flat" in plan.sku().variant
    x = random_floats(rng, shape, float_kind).astype(np.float64)
    if content == "zeros":
        x[:] = 0.0
    elif content == "nan":
        x[150, 7] = np.nan
    x = x.astype(ELEMENTS[float_kind].numpy_dtype)
    assert_same(reference_run(desc, x, **rng_args(desc)), device_run(desc, x, **rng_args(desc)))


@pytest.mark.parametrize(
    ("scope", "shape"),
    [
        (qp.GroupScope(axis=-1, group_size=128), (16, 1024)),  # fused
        (qp.ChannelScope(axis=-1), (40, 96)),  # multi-pass (strided segments)
        (qp.TensorScope(), (300, 301)),  # multi-pass flat
    ],
)
@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC])
def test_in_place_and_without_parameter_outputs(rng, scope, shape, rounding) -> None:
    import cupy

    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=scope, mode=ASYM, element=EK.F32, rounding=rounding)
    x = random_floats(rng, shape, EK.F32)
    ref = reference_run(desc, x, **rng_args(desc))
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    buf = cupy.asarray(x)
    plan.run(None, ws, qp.DynamicRangeFakeQuantizeArgs(buf, buf, **rng_args(desc)))
    assert float_bits_equal(buf.get(), ref[0])


@pytest.mark.parametrize("scope", [qp.GroupScope(axis=-1, group_size=64), qp.ChannelScope(axis=-1)])
@pytest.mark.parametrize("rounding", [NEAREST, STOCHASTIC])
def test_misaligned_operands(rng, scope, rounding) -> None:
    import cupy

    shape = (24, 192)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=scope, mode=SYM, element=EK.F16, rounding=rounding)
    x = random_floats(rng, shape, EK.F16)
    ref = reference_run(desc, x, **rng_args(desc))
    n = x.size
    x_buf = cupy.zeros(n + 1, np.float16)
    y_buf = cupy.zeros(n + 3, np.float16)
    x_buf[1:] = cupy.asarray(x.reshape(-1))
    x_dev, y_dev = x_buf[1:].reshape(shape), y_buf[3:].reshape(shape)
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    plan.run(
        None,
        qp.Workspace.allocate(plan.workspace_size()),
        qp.DynamicRangeFakeQuantizeArgs(x_dev, y_dev, **rng_args(desc)),
    )
    assert float_bits_equal(y_dev.get(), ref[0])


def test_equals_fake_quantize_with_the_same_parameters(rng) -> None:
    """y == FakeQuantizePlan(x, scale_out, zero_point_out) on the device."""
    import cupy

    shape = (64, 384)
    scope = qp.GroupScope(axis=-1, group_size=128)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=scope, mode=ASYM, element=EK.BF16, bits=4)
    x = to_device(random_floats(rng, shape, EK.BF16))
    y = cupy.empty_like(x)
    s = cupy.empty(desc.param_shape, np.float32)
    z = cupy.empty(desc.param_shape, np.int32)
    qp.DynamicRangeFakeQuantizePlan.select(None, desc).run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, y, s, z))
    static = qp.FakeQuantizeDescriptor(
        shape=shape, scope=scope, mode=ASYM, element=EK.BF16, q_min=desc.q_min, q_max=desc.q_max
    )
    y2 = cupy.empty_like(x)
    qp.FakeQuantizePlan.select(None, static).run(None, None, qp.FakeQuantizeArgs(x, y2, s, z))
    assert bool((y == y2).all())


def test_stochastic_reproducible_and_unbiased(rng) -> None:
    import cupy

    shape = (256, 4096)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.GroupScope(axis=-1, group_size=128), mode=SYM, element=EK.F32, bits=3, rounding=STOCHASTIC
    )
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    x = cupy.asarray(rng.standard_normal(shape, dtype=np.float32))
    outs = []
    for seed, offset in [(5, 0), (5, 0), (6, 0), (5, 1 << 40)]:
        y = cupy.empty_like(x)
        plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, y, rng_seed=seed, rng_offset=offset))
        outs.append(y)
    assert bool((outs[0] == outs[1]).all())
    assert not bool((outs[0] == outs[2]).all()) and not bool((outs[0] == outs[3]).all())
    # Unbiased: averaged over seeds, y approaches x (3-bit codes, errors up to a step each draw).
    seeds = 64
    acc = cupy.zeros(shape, np.float64)
    for seed in range(seeds):
        y = cupy.empty_like(x)
        plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, y, rng_seed=seed, rng_offset=0))
        acc += y
    mean_err = float(cupy.abs(acc / seeds - x).mean())
    nearest = qp.DynamicRangeFakeQuantizePlan.select(None, desc.model_copy(update={"rounding": NEAREST}))
    y = cupy.empty_like(x)
    nearest.run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, y))
    rne_err = float(cupy.abs(y - x).mean())
    assert mean_err < rne_err / 3, (mean_err, rne_err)
    bias = float((acc / seeds - x).mean())
    assert abs(bias) < 1e-3, bias


def test_device_seed_and_offset(rng) -> None:
    import cupy

    shape = (8, 512)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=ASYM, element=EK.BF16, bits=4, rounding=STOCHASTIC
    )
    x = random_floats(rng, shape, EK.BF16)
    ref = reference_run(desc, x, rng_seed=2**63 + 11, rng_offset=9)
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    y = cupy.empty(shape, np.uint16)
    seed = cupy.asarray(np.array([2**63 + 11], np.uint64).view(np.int64))
    offset = cupy.asarray(np.array([9], np.int64))
    plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(to_device(x), y, rng_seed=seed, rng_offset=offset))
    assert float_bits_equal(y.get().view(x.dtype), ref[0])


@pytest.mark.parametrize("scope", [qp.GroupScope(axis=-1, group_size=128), qp.ChannelScope(axis=-1)])
def test_graph_capture(rng, scope) -> None:
    import cupy

    shape = (32, 1024)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(
        shape=shape, scope=scope, mode=ASYM, element=EK.F16, rounding=STOCHASTIC
    )
    x_host = random_floats(rng, shape, EK.F16)
    ref = reference_run(desc, x_host, rng_seed=3, rng_offset=4)
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    ws = qp.Workspace.allocate(plan.workspace_size())
    stream = cupy.cuda.Stream(non_blocking=True)
    x = cupy.asarray(x_host)
    y = cupy.zeros_like(x)
    args = qp.DynamicRangeFakeQuantizeArgs(x, y, rng_seed=3, rng_offset=4)
    with stream:
        stream.begin_capture()
        plan.run(stream, ws, args)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    assert float_bits_equal(y.get(), ref[0])


def test_zero_size_tensor_is_a_no_op() -> None:
    import cupy

    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=(0, 128), scope=qp.TokenScope(), element=EK.F32)
    x = cupy.zeros((0, 128), np.float32)
    qp.DynamicRangeFakeQuantizePlan.select(None, desc).run(None, None, qp.DynamicRangeFakeQuantizeArgs(x, x))


def test_bad_input_raises_before_launch(rng) -> None:
    import cupy

    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=(4, 64), scope=qp.ChannelScope(axis=-1), element=EK.F32)
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    x = cupy.asarray(rng.standard_normal((4, 64), dtype=np.float32))
    y = cupy.full((4, 64), 3.0, np.float32)
    with pytest.raises(qp.WorkspaceTooSmall):
        plan.run(None, qp.Workspace.allocate(plan.workspace_size() - 4), qp.DynamicRangeFakeQuantizeArgs(x, y))
    with pytest.raises(qp.InvalidProblem):
        plan.run(
            None,
            qp.Workspace.allocate(plan.workspace_size()),
            qp.DynamicRangeFakeQuantizeArgs(x, y, scale_out=cupy.zeros((4, 1), np.float32)),
        )
    with pytest.raises(qp.InvalidProblem):
        plan.run(None, qp.Workspace.allocate(plan.workspace_size()), qp.DynamicRangeFakeQuantizeArgs(x, y[:, :32]))
    cupy.cuda.runtime.deviceSynchronize()
    assert bool((y == 3.0).all())


# ---- dynamic_fake_quantize_row_shares: few rows of 4096 / 8192 / 16384, nearest ---------------

# (shape, blocks per row): token rows; the most rows it takes on an H200 (33).
SHARES_CASES = [((16, 8192), 4), ((3, 4096), 2), ((2, 16384), 8), ((1, 8192), 4), ((33, 4096), 2)]


@pytest.mark.parametrize("case", range(len(SHARES_CASES)))
@pytest.mark.parametrize("kind", [EK.F16, EK.BF16], ids=lambda k: k.name)
@pytest.mark.parametrize(("mode", "bits"), [(SYM, 8), (ASYM, 8), (SYM, 2), (ASYM, 3)])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_row_shares_match_reference(rng, case, kind, mode, bits, in_place) -> None:
    """Out of place: ``dynamic_fake_quantize_row_shares``; in place the plan's in-place twin
    (``dynamic_fake_quantize_cluster`` on sm_90; before, ``_rows`` or ``_dense``)."""
    import cupy
    from test_dynamic_range_schedules_gpu import shares_data

    shape, blocks = SHARES_CASES[case]
    if shape[0] * 4 > cupy.cuda.Device().attributes["MultiProcessorCount"]:
        pytest.skip("more rows than the row-shares kernel takes on this device")
    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=qp.TokenScope(), mode=mode, element=kind, bits=bits)
    variant = qp.DynamicRangeFakeQuantizePlan.select(None, desc).sku().variant
    assert f"dense-row-shares,{blocks}x256t-per-segment" in variant, variant
    twin = "dense-cluster" if int(cupy.cuda.Device().compute_capability) >= 90 else "dense"  # rows / dense
    assert f"+in-place:fused-single-pass[{twin}" in variant, variant
    x = shares_data(rng, shape, kind)
    assert_same(reference_run(desc, x), device_run(desc, x, in_place=in_place))


@pytest.mark.parametrize(("mode", "kind"), [(SYM, EK.F16), (ASYM, EK.BF16)])
def test_row_shares_kernel_in_place(rng, mode, kind) -> None:
    """The row-shares launch itself given the same array as input and output (``run(check=False)``
    may replay an out-of-place call's launch for an in-place one): block 0 of each row writes the
    whole row, the others return; the result equals the reference. Then the same through ``run``
    with ``check=False``, after out-of-place calls taught its fast path."""
    import cupy

    from quantplan.runtime._launch import launch_on

    shape = (16, 8192)
    desc = qp.DynamicRangeFakeQuantizeDescriptor(shape=shape, scope=qp.TokenScope(), mode=mode, element=kind, bits=8)
    plan = qp.DynamicRangeFakeQuantizePlan.select(None, desc)
    x = random_floats(rng, shape, kind).astype(np.float64)
    x[3, 5000] = np.nan  # a rare row: the in-place branch's out-of-line path
    x[7] *= 1e-30
    x = x.astype(ELEMENTS[kind].numpy_dtype)
    ref = reference_run(desc, x)
    buf = to_device(x)
    s = cupy.zeros(desc.param_shape, np.float32)
    z = cupy.zeros(desc.param_shape, np.int32) if mode is ASYM else None
    assert "dense-row-shares" in plan.sku().variant, plan.sku().variant
    launch = plan._fused.primary
    p = launch.params
    p.x, p.y, p.scale_out, p.zp_out = buf.data.ptr, buf.data.ptr, s.data.ptr, 0 if z is None else z.data.ptr
    launch_on(0, cupy.cuda.get_current_stream().ptr, launch)
    assert_same(ref, (buf.get().view(x.dtype), s.get(), None if z is None else z.get()))
    # run(check=False): out of place twice (remembered), then in place.
    y = cupy.zeros_like(buf)
    for _ in range(3):
        plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(to_device(x), y, s, z), check=False)
    assert_same(ref, (y.get().view(x.dtype), s.get(), None if z is None else z.get()))
    for _ in range(2):
        buf = to_device(x)
        plan.run(None, None, qp.DynamicRangeFakeQuantizeArgs(buf, buf, s, z), check=False)
        assert_same(ref, (buf.get().view(x.dtype), s.get(), None if z is None else z.get()))
