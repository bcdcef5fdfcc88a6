"""GPU: DynamicRangeQuantizePlan and stochastic QuantizePlan equal the reference bit for bit.

Codes, scales and zero points for every float kind x code kind x scope x mode on fresh ragged
data with non-finite and all-zero segments; > 65535 rows; 8192 x 4100 with group 100; Philox
stochastic rounding (static and dynamic), its reproducibility and unbiasedness.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    CODES,
    FLOATS,
    REFERENCE,
    SCOPES,
    first_mismatch,
    float_bits_equal,
    random_floats,
    random_scale,
    to_device,
)

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu


def data_with_special_segments(rng: np.random.Generator, shape: tuple[int, ...], kind: EK) -> np.ndarray:
    x = random_floats(rng, shape, kind).astype(np.float64)
    flat = x.reshape(shape[0], -1)
    flat[min(1, shape[0] - 1)] = 0.0  # an all-zero leading slice
    if shape[0] > 3:
        flat[2, 0] = np.nan
        flat[3, -1] = -np.inf
    return flat.reshape(shape).astype(ELEMENTS[kind].numpy_dtype)


def run_both(
    desc: qp.DynamicRangeQuantizeDescriptor, x: np.ndarray, pref: qp.PlanPreference | None = None, **rng_args: object
) -> tuple:
    """(reference q, scale, zp), (device q, scale, zp) as NumPy arrays; ``pref``: the device plan's
    preference (a forced schedule)."""
    import cupy

    pdtype = np.float64 if desc.input_element is EK.F64 else np.float32
    asym = desc.mode is qp.QuantMode.ASYMMETRIC
    qdtype = ELEMENTS[desc.output_element].numpy_dtype
    q_ref = np.zeros(desc.output_shape, qdtype)
    s_ref = np.zeros(desc.param_shape, pdtype)
    z_ref = np.zeros(desc.param_shape, np.int32) if asym else None
    qp.DynamicRangeQuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.DynamicRangeQuantizeArgs(x, q_ref, s_ref, z_ref, **rng_args)
    )
    plan = qp.DynamicRangeQuantizePlan.select(None, desc, pref)
    ws = qp.Workspace.allocate(plan.workspace_size())
    q_dev = to_device(np.full(desc.output_shape, 0x5A, np.uint8).view(qdtype))
    s_dev = cupy.full(desc.param_shape, 7.0, pdtype)
    z_dev = cupy.full(desc.param_shape, 99, np.int32) if asym else None
    plan.run(None, ws, qp.DynamicRangeQuantizeArgs(to_device(x), q_dev, s_dev, z_dev, **rng_args))
    got = (q_dev.get().view(np.uint8), s_dev.get(), None if z_dev is None else z_dev.get())
    return (q_ref.view(np.uint8), s_ref, z_ref), got


def assert_same(ref: tuple, got: tuple) -> None:
    assert np.array_equal(got[0], ref[0]), first_mismatch(got[0], ref[0])
    assert float_bits_equal(got[1], ref[1])
    if ref[2] is not None:
        assert np.array_equal(got[2], ref[2]), first_mismatch(got[2], ref[2])


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize("code_kind", CODES)
@pytest.mark.parametrize("scope_index", range(len(SCOPES)))
@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dynamic_range_matches_reference(rng, float_kind, code_kind, scope_index, mode) -> None:
    if ELEMENTS[code_kind].is_fp8 and mode is qp.QuantMode.ASYMMETRIC:
        pytest.skip("FP8 codes are symmetric only")
    scope, shape = SCOPES[scope_index]
    order = qp.NibbleOrder.HIGH_FIRST if scope_index % 2 else qp.NibbleOrder.LOW_FIRST
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=scope, mode=mode, input_element=float_kind, output_element=code_kind, nibble_order=order
    )
    x = data_with_special_segments(rng, shape, float_kind)
    ref, got = run_both(desc, x)
    assert_same(ref, got)


def test_more_than_65535_rows(rng) -> None:
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(70001, 3), scope=qp.TokenScope(), input_element=EK.BF16, output_element=EK.S8
    )
    ref, got = run_both(desc, random_floats(rng, (70001, 3), EK.BF16))
    assert_same(ref, got)


@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_large_odd_groups(rng, mode) -> None:
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(8192, 4100),
        scope=qp.GroupScope(axis=-1, group_size=100),
        mode=mode,
        input_element=EK.F16,
        output_element=EK.U4 if mode is qp.QuantMode.ASYMMETRIC else EK.S4,
    )
    x = rng.standard_normal((8192, 4100)).astype(np.float16)
    ref, got = run_both(desc, x)
    assert_same(ref, got)


def test_workspace_too_small_raises_and_writes_nothing(rng) -> None:
    import cupy

    # Channel scope on the last axis: strided segments, the multi-pass path with its workspace.
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(4, 64), scope=qp.ChannelScope(axis=-1), input_element=EK.F32, output_element=EK.S8
    )
    plan = qp.DynamicRangeQuantizePlan.select(None, desc)
    assert plan.workspace_size() > 0
    q = cupy.full((4, 64), 3, np.int8)
    s = cupy.full((1, 64), 2.0, np.float32)
    small = qp.Workspace.allocate(plan.workspace_size() - 4)
    with pytest.raises(qp.WorkspaceTooSmall):
        plan.run(None, small, qp.DynamicRangeQuantizeArgs(cupy.asarray(rng.standard_normal((4, 64), np.float32)), q, s))
    cupy.cuda.runtime.deviceSynchronize()
    assert int((q != 3).sum()) == 0 and float(s[0, 0]) == 2.0


# (rows, segment length): teams of 1 thread up to 1024 (several teams per warp and per block,
# one block per segment, the widest register tiles), and lengths past the fused pass's limit.
FUSED_LENGTHS = [
    (301, 1),
    (97, 6),
    (50, 64),
    (33, 250),
    (9, 1000),
    (5, 4098),
    (40, 8192),
    (4, 12000),
    (3, 20002),
    (2, 32768),
]


@pytest.mark.parametrize(("rows", "length"), [*FUSED_LENGTHS, (2, 32770), (2, 40000)])
@pytest.mark.parametrize(
    ("float_kind", "code_kind", "mode"),
    [
        (EK.BF16, EK.S8, qp.QuantMode.SYMMETRIC),
        (EK.F16, EK.U4, qp.QuantMode.ASYMMETRIC),
        (EK.F32, EK.FP8_E4M3, qp.QuantMode.SYMMETRIC),
        (EK.F64, EK.U8, qp.QuantMode.ASYMMETRIC),
    ],
)
def test_token_rows_of_every_team_size(rng, rows, length, float_kind, code_kind, mode) -> None:
    """The fused single pass at every team size, and the multi-pass path beyond its limit."""
    shape = (rows, length)
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), mode=mode, input_element=float_kind, output_element=code_kind
    )
    limit = 16384 if float_kind is EK.F64 else 32768
    fused = length <= limit and not (ELEMENTS[code_kind].is_packed and length % 2)
    plan = qp.DynamicRangeQuantizePlan.select(None, desc)
    assert ("fused-single-pass" in plan.sku().variant) == fused, plan.sku().variant
    assert (plan.workspace_size() == 0) == fused
    x = data_with_special_segments(rng, shape, float_kind) if rows > 3 else random_floats(rng, shape, float_kind)
    ref, got = run_both(desc, x)
    assert_same(ref, got)


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize(
    ("code_kind", "mode"),
    [(EK.S8, qp.QuantMode.SYMMETRIC), (EK.U4, qp.QuantMode.ASYMMETRIC), (EK.FP8_E5M2, qp.QuantMode.SYMMETRIC)],
)
@pytest.mark.parametrize("content", ["random", "zeros", "nan", "inf", "negative"])
def test_large_tensor_scope(rng, float_kind, code_kind, mode, content) -> None:
    """TensorScope past the fused pass: block-reduced statistics, then the quantize kernel."""
    shape = (301, 302)
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=qp.TensorScope(), mode=mode, input_element=float_kind, output_element=code_kind
    )
    plan = qp.DynamicRangeQuantizePlan.select(None, desc)
    assert "block-reduced-range" in plan.sku().variant and plan.workspace_size() > 0
    x = random_floats(rng, shape, float_kind).astype(np.float64)
    if content == "zeros":
        x[:] = 0.0
    elif content == "nan":
        x[150, 7] = np.nan
    elif content == "inf":
        x[-1, -1] = -np.inf
    elif content == "negative":
        x = -np.abs(x) - 0.5
    ref, got = run_both(desc, x.astype(ELEMENTS[float_kind].numpy_dtype))
    assert_same(ref, got)


@pytest.mark.parametrize(
    ("scope", "shape"),
    [
        (qp.TokenScope(), (37, 1024)),
        (qp.GroupScope(axis=-1, group_size=128), (16, 1024)),
        (qp.ChannelScope(axis=0), (24, 2, 64)),
        (qp.TensorScope(), (64, 64)),
        (qp.TensorScope(), (300, 301)),
    ],
)
def test_misaligned_operands(rng, scope, shape) -> None:
    """Views one element into a buffer: the element-I/O twins of the fused kernel and of the
    tensor statistics, same results."""
    import cupy

    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=shape, scope=scope, mode=qp.QuantMode.ASYMMETRIC, input_element=EK.F16, output_element=EK.U8
    )
    plan = qp.DynamicRangeQuantizePlan.select(None, desc)
    assert ("fused-single-pass" in plan.sku().variant) == (shape != (300, 301))
    n = int(np.prod(shape))
    x = random_floats(rng, shape, EK.F16)
    q_ref = np.zeros(shape, np.uint8)
    s_ref = np.zeros(desc.param_shape, np.float32)
    z_ref = np.zeros(desc.param_shape, np.int32)
    qp.DynamicRangeQuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.DynamicRangeQuantizeArgs(x, q_ref, s_ref, z_ref)
    )
    x_buf = cupy.zeros(n + 1, np.float16)
    x_buf[1:] = cupy.asarray(x.reshape(-1))
    q_buf = cupy.zeros(n + 3, np.uint8)
    x_dev, q_dev = x_buf[1:].reshape(shape), q_buf[3:].reshape(shape)
    s_dev = cupy.zeros(desc.param_shape, np.float32)
    z_dev = cupy.zeros(desc.param_shape, np.int32)
    ws = qp.Workspace.allocate(plan.workspace_size())
    plan.run(None, ws, qp.DynamicRangeQuantizeArgs(x_dev, q_dev, s_dev, z_dev))
    assert np.array_equal(q_dev.get(), q_ref), first_mismatch(q_dev.get(), q_ref)
    assert float_bits_equal(s_dev.get(), s_ref)
    assert np.array_equal(z_dev.get(), z_ref)
    assert int(q_buf[:3].sum()) == 0  # nothing written before the view


@pytest.mark.parametrize("float_kind", [EK.BF16, EK.F32, EK.F64])
@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3, EK.FP8_E5M2])
@pytest.mark.parametrize("shape", [(3, 37), (8, 128)])
def test_static_stochastic_matches_reference(rng, float_kind, code_kind, shape) -> None:
    import cupy

    desc = qp.QuantizeDescriptor(
        shape=shape,
        scope=qp.TokenScope(),
        input_element=float_kind,
        output_element=code_kind,
        rounding=qp.Rounding.STOCHASTIC,
    )
    x = random_floats(rng, shape, float_kind)
    scale = random_scale(rng, desc.param_shape, ELEMENTS[float_kind].math_precision)
    seed, offset = int(rng.integers(0, 2**63)) * 2 + 1, int(rng.integers(0, 2**40))
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(
        None, None, qp.QuantizeArgs(x, q_ref, scale, rng_seed=seed, rng_offset=offset)
    )
    plan = qp.QuantizePlan.select(None, desc)
    q_dev = to_device(np.zeros(desc.output_shape, q_ref.dtype))
    plan.run(None, None, qp.QuantizeArgs(to_device(x), q_dev, cupy.asarray(scale), rng_seed=seed, rng_offset=offset))
    assert np.array_equal(q_dev.get().view(np.uint8), q_ref.view(np.uint8))
    # Device-scalar seed / offset read by the kernel give the same codes.
    q_dev2 = to_device(np.zeros(desc.output_shape, q_ref.dtype))
    dev_seed = cupy.asarray(np.array([seed], np.uint64).view(np.int64))
    dev_offset = cupy.asarray(np.array([offset], np.int64))
    plan.run(
        None, None, qp.QuantizeArgs(to_device(x), q_dev2, cupy.asarray(scale), rng_seed=dev_seed, rng_offset=dev_offset)
    )
    assert np.array_equal(q_dev2.get().view(np.uint8), q_ref.view(np.uint8))


@pytest.mark.parametrize("mode", [qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC])
def test_dynamic_stochastic_matches_reference_and_is_reproducible(rng, mode) -> None:
    desc = qp.DynamicRangeQuantizeDescriptor(
        shape=(33, 257),
        scope=qp.GroupScope(axis=-1, group_size=257),
        mode=mode,
        input_element=EK.BF16,
        output_element=EK.S4 if mode is qp.QuantMode.SYMMETRIC else EK.U8,
        rounding=qp.Rounding.STOCHASTIC,
    )
    x = random_floats(rng, (33, 257), EK.BF16)
    ref, got = run_both(desc, x, rng_seed=12345, rng_offset=7)
    assert_same(ref, got)
    # The multi-pass path (groups along axis 0) draws the same uniforms for the same elements.
    desc0 = desc.model_copy(update={"shape": (257, 33), "scope": qp.GroupScope(axis=0, group_size=257)})
    ref0, got0 = run_both(desc0, np.ascontiguousarray(x.T), rng_seed=12345, rng_offset=7)
    assert_same(ref0, got0)
    _, again = run_both(desc, x, rng_seed=12345, rng_offset=7)
    assert np.array_equal(again[0], got[0])
    _, other = run_both(desc, x, rng_seed=12345, rng_offset=8)
    assert not np.array_equal(other[0], got[0])


def test_stochastic_rounding_is_unbiased_on_the_gpu(rng) -> None:
    """Mean over many seeds of dequantized stochastic codes converges to x."""
    import cupy

    shape = (4, 256)
    x = rng.uniform(-3, 3, size=shape).astype(np.float32)
    scale = np.full((4, 1), 0.25, np.float32)
    desc = qp.QuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.F32, output_element=EK.S8, rounding=qp.Rounding.STOCHASTIC
    )
    plan = qp.QuantizePlan.select(None, desc)
    xd, sd = cupy.asarray(x), cupy.asarray(scale)
    q = cupy.zeros(shape, np.int8)
    total = cupy.zeros(shape, np.float64)
    n = 2000
    for seed in range(n):
        plan.run(None, None, qp.QuantizeArgs(xd, q, sd, rng_seed=seed, rng_offset=0))
        total += q.astype(np.float64)
    mean = total.get() / n * 0.25
    # per element the std of one draw is <= 0.125; of the mean <= 0.125 / sqrt(n) ~ 0.0028
    assert np.max(np.abs(mean - x)) < 6 * 0.125 / np.sqrt(n)
    assert not np.allclose(mean, np.round(x / 0.25) * 0.25)  # not rne
