"""GPU: QuantizePlan / DequantizePlan on CUDA equal the reference backend bit for bit.

Every float kind x code kind x scope x mode, on fresh random ragged data; torch tensors; a
non-default stream; CUDA graph capture; misaligned pointers; > 65535 rows; > 2**31 elements.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import (
    CODES,
    FLOATS,
    REFERENCE,
    SCOPES,
    first_mismatch,
    float_bits_equal,
    random_codes,
    random_floats,
    random_scale,
    random_zero_point,
    to_device,
)

import quantplan as qp
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

COMBOS = [
    (f, c, i, m)
    for f, c, (i, _), m in itertools.product(FLOATS, CODES, enumerate(SCOPES), qp.QuantMode)
    if not (ELEMENTS[c].is_fp8 and m is qp.QuantMode.ASYMMETRIC)
]


def from_device(a, like: np.ndarray) -> np.ndarray:  # noqa: ANN001
    return a.get().view(like.dtype)


def _params(rng: np.random.Generator, desc, code: EK):  # noqa: ANN001, ANN202
    scale = random_scale(
        rng,
        desc.param_shape,
        ELEMENTS[desc.input_element if ELEMENTS[desc.input_element].is_float else desc.output_element].math_precision,
    )
    zp = random_zero_point(rng, desc.param_shape, code) if desc.mode is qp.QuantMode.ASYMMETRIC else None
    return scale, zp


@pytest.mark.parametrize(
    "float_kind,code_kind,scope_index,mode",
    COMBOS,
    ids=[f"{f.name}-{c.name}-s{i}-{m.name[:4]}" for f, c, i, m in COMBOS],
)
@pytest.mark.parametrize("order", [qp.NibbleOrder.LOW_FIRST, qp.NibbleOrder.HIGH_FIRST], ids=["low", "high"])
def test_quantize_and_dequantize_match_reference(rng, float_kind, code_kind, scope_index, mode, order) -> None:
    if order is qp.NibbleOrder.HIGH_FIRST and not ELEMENTS[code_kind].is_packed:
        pytest.skip("nibble order applies to 4-bit codes only")
    scope, shape = SCOPES[scope_index]
    desc = qp.QuantizeDescriptor(
        shape=shape, scope=scope, mode=mode, input_element=float_kind, output_element=code_kind, nibble_order=order
    )
    x = random_floats(rng, shape, float_kind)
    scale, zp = _params(rng, desc, code_kind)
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale, zp))

    plan = qp.QuantizePlan.select(None, desc)
    assert plan.sku().backend is qp.BackendKind.CUDA
    q_dev = to_device(np.full(desc.output_shape, 0xA5, np.uint8).view(q_ref.dtype))
    dev_zp = None if zp is None else to_device(zp)
    plan.run(None, None, qp.QuantizeArgs(to_device(x), q_dev, to_device(scale), dev_zp))
    q_gpu = from_device(q_dev, q_ref)
    assert np.array_equal(q_gpu.view(np.uint8), q_ref.view(np.uint8)), first_mismatch(q_gpu, q_ref)

    ddesc = qp.DequantizeDescriptor(
        shape=shape, scope=scope, mode=mode, input_element=code_kind, output_element=float_kind, nibble_order=order
    )
    codes = random_codes(rng, shape, code_kind).view(q_ref.dtype) if rng.random() < 0.5 else q_ref
    y_ref = np.zeros(shape, ELEMENTS[float_kind].numpy_dtype)
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(codes, y_ref, scale, zp))
    y_dev = to_device(np.full(shape, np.nan, y_ref.dtype))
    qp.DequantizePlan.select(None, ddesc).run(
        None, None, qp.DequantizeArgs(to_device(codes), y_dev, to_device(scale), dev_zp)
    )
    y_gpu = from_device(y_dev, y_ref)
    assert float_bits_equal(y_gpu, y_ref), first_mismatch(y_gpu, y_ref)


@pytest.mark.parametrize("float_kind", FLOATS)
@pytest.mark.parametrize("code_kind", [EK.S8, EK.FP8_E4M3])
def test_scalar_and_device_scalar_scale(rng, float_kind, code_kind) -> None:
    import cupy

    shape = (33, 77)
    desc = qp.QuantizeDescriptor(
        shape=shape, scope=qp.TensorScope(), input_element=float_kind, output_element=code_kind
    )
    x = random_floats(rng, shape, float_kind)
    s = float(np.exp(rng.uniform(-3, 1)))
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, s))
    plan = qp.QuantizePlan.select(None, desc)
    param_dtype = np.float64 if float_kind is EK.F64 else np.float32
    for scale in (s, cupy.asarray(np.array(s, dtype=param_dtype))):
        q_dev = to_device(np.zeros(desc.output_shape, q_ref.dtype))
        plan.run(None, None, qp.QuantizeArgs(to_device(x), q_dev, scale))
        assert np.array_equal(q_dev.get().view(np.uint8), q_ref.view(np.uint8))


def test_torch_tensors_and_torch_stream(rng) -> None:
    torch = pytest.importorskip("torch")
    shape = (257, 1000)
    desc = qp.QuantizeDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.BF16, output_element=EK.S8, q_min=-127
    )
    x = random_floats(rng, shape, EK.BF16)
    scale = random_scale(rng, desc.param_shape, qp.MathPrecision.F32)
    q_ref = np.zeros(shape, np.int8)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
    stream = torch.cuda.Stream()
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()
    st = torch.from_numpy(scale).cuda()
    qt = torch.full(shape, 99, dtype=torch.int8, device="cuda")
    torch.cuda.synchronize()
    plan = qp.QuantizePlan.select(stream, desc)
    plan.run(stream, None, qp.QuantizeArgs(xt, qt, st))
    stream.synchronize()
    assert np.array_equal(qt.cpu().numpy(), q_ref)
    # dequantize back to torch bfloat16
    ddesc = qp.DequantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.S8, output_element=EK.BF16)
    yt = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    qp.DequantizePlan.select(stream, ddesc).run(stream, None, qp.DequantizeArgs(qt, yt, st))
    y_ref = np.zeros(shape, ELEMENTS[EK.BF16].numpy_dtype)
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(q_ref, y_ref, scale))
    stream.synchronize()
    assert float_bits_equal(yt.view(torch.int16).cpu().numpy().view(y_ref.dtype), y_ref)


def test_torch_fp8_output(rng) -> None:
    torch = pytest.importorskip("torch")
    shape = (64, 130)
    desc = qp.QuantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.FP8_E4M3)
    x = random_floats(rng, shape, EK.F16)
    scale = random_scale(rng, desc.param_shape, qp.MathPrecision.F32)
    q_ref = np.zeros(shape, ELEMENTS[EK.FP8_E4M3].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
    qt = torch.empty(shape, dtype=torch.float8_e4m3fn, device="cuda")
    qp.QuantizePlan.select(None, desc).run(
        torch.cuda.current_stream(),
        None,
        qp.QuantizeArgs(torch.from_numpy(x).cuda(), qt, torch.from_numpy(scale).cuda()),
    )
    torch.cuda.synchronize()
    assert np.array_equal(qt.view(torch.uint8).cpu().numpy(), q_ref.view(np.uint8))


def test_non_default_stream_and_graph_capture(rng) -> None:
    import cupy

    shape = (123, 515)
    desc = qp.QuantizeDescriptor(
        shape=shape,
        scope=qp.GroupScope(group_size=5),
        mode=qp.QuantMode.ASYMMETRIC,
        input_element=EK.F16,
        output_element=EK.U4,
    )
    stream = cupy.cuda.Stream(non_blocking=True)
    plan = qp.QuantizePlan.select(stream, desc)
    x1, x2 = (random_floats(rng, shape, EK.F16) for _ in range(2))
    scale = random_scale(rng, desc.param_shape, qp.MathPrecision.F32)
    zp = random_zero_point(rng, desc.param_shape, EK.U4)
    with stream:
        xd = cupy.asarray(x1)
        qd = cupy.zeros(desc.output_shape, np.uint8)
        sd, zd = cupy.asarray(scale), cupy.asarray(zp)
    stream.synchronize()
    args = qp.QuantizeArgs(xd, qd, sd, zd)
    stream.begin_capture()
    plan.run(stream, None, args)
    graph = stream.end_capture()
    for x in (x1, x2):
        xd.set(x, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        q_ref = np.zeros(desc.output_shape, np.uint8)
        qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale, zp))
        assert np.array_equal(qd.get(), q_ref)


@pytest.mark.parametrize("code_kind", [EK.S8, EK.S4])
def test_misaligned_pointers_use_fallback(rng, code_kind) -> None:
    import cupy

    shape = (21, 64)
    desc = qp.QuantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.BF16, output_element=code_kind)
    x = random_floats(rng, shape, EK.BF16)
    scale = random_scale(rng, desc.param_shape, qp.MathPrecision.F32)
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
    n_in, n_out = x.size, int(np.prod(desc.output_shape))
    x_buf = cupy.zeros(n_in + 1, np.uint16)
    x_buf[1:] = cupy.asarray(x.view(np.uint16).reshape(-1))
    q_buf = cupy.zeros(n_out + 3, np.uint8)
    q_view = q_buf[3:].reshape(desc.output_shape)
    q_view = q_view.view(np.int8) if code_kind is EK.S8 else q_view
    qp.QuantizePlan.select(None, desc).run(
        None, None, qp.QuantizeArgs(x_buf[1:].reshape(shape), q_view, cupy.asarray(scale))
    )
    assert np.array_equal(q_view.get().view(np.uint8), q_ref.view(np.uint8))


def test_more_than_65535_rows(rng) -> None:
    import cupy

    shape = (70001, 24)
    for scope in (qp.TokenScope(), qp.ChannelScope(axis=0)):
        desc = qp.QuantizeDescriptor(shape=shape, scope=scope, input_element=EK.F32, output_element=EK.S8)
        x = random_floats(rng, shape, EK.F32)
        scale = random_scale(rng, desc.param_shape, qp.MathPrecision.F32)
        q_ref = np.zeros(shape, np.int8)
        qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
        q_dev = cupy.zeros(shape, np.int8)
        qp.QuantizePlan.select(None, desc).run(None, None, qp.QuantizeArgs(cupy.asarray(x), q_dev, cupy.asarray(scale)))
        assert np.array_equal(q_dev.get(), q_ref)


def test_past_2_to_the_31_elements(rng) -> None:
    """64-bit indexing: rows beyond element 2**31 are quantized like the first ones."""
    import cupy

    L = 4096
    rows = 2**31 // L + 5
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < rows * L * 3 + (1 << 30):
        pytest.skip("not enough GPU memory for a 2**31-element tensor")
    shape = (rows, L)
    desc = qp.QuantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8)
    x = cupy.empty(shape, cupy.float16)
    head = random_floats(rng, (64, L), EK.F16)
    tail = random_floats(rng, (64, L), EK.F16)
    x[:64] = cupy.asarray(head)
    x[-64:] = cupy.asarray(tail)
    scale_np = random_scale(rng, desc.param_shape, qp.MathPrecision.F32)
    q = cupy.zeros(shape, cupy.int8)
    qp.QuantizePlan.select(None, desc).run(None, None, qp.QuantizeArgs(x, q, cupy.asarray(scale_np)))
    for part, sl in ((head, slice(0, 64)), (tail, slice(rows - 64, rows))):
        sub = qp.QuantizeDescriptor(shape=part.shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8)
        ref = np.zeros(part.shape, np.int8)
        qp.QuantizePlan.select(None, sub, REFERENCE).run(None, None, qp.QuantizeArgs(part, ref, scale_np[sl]))
        assert np.array_equal(q[sl].get(), ref)
    del x, q


@pytest.mark.parametrize("float_kind", [EK.F32, EK.F64, EK.BF16])
@pytest.mark.parametrize("fp8", [EK.FP8_E4M3, EK.FP8_E5M2])
def test_fp8_every_byte_round_trips_and_software_path_matches(rng, float_kind, fp8, monkeypatch) -> None:
    """Each finite FP8 value, its neighbours' midpoints and out-of-range values, through both the
    hardware (sm_89+) and the portable software conversion (forced by QUANTPLAN_FP8_SOFTWARE)."""
    import cupy

    values = np.arange(256, dtype=np.uint8).view(ELEMENTS[fp8].numpy_dtype).astype(np.float64)
    finite = np.sort(values[np.isfinite(values)])
    mids = (finite[1:] + finite[:-1]) / 2
    extra = np.array([np.inf, -np.inf, np.nan, 1e30, -1e30, 5e-40, -0.0, 0.0])
    x = np.concatenate([finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), extra])
    x = x.astype(ELEMENTS[float_kind].numpy_dtype)[None, :]
    desc = qp.QuantizeDescriptor(shape=x.shape, scope=qp.TensorScope(), input_element=float_kind, output_element=fp8)
    q_ref = np.zeros(x.shape, ELEMENTS[fp8].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, 1.0))
    for software in ("0", "1"):
        monkeypatch.setenv("QUANTPLAN_FP8_SOFTWARE", software)
        q_dev = cupy.zeros(x.shape, np.uint8)
        qp.QuantizePlan.select(None, desc).run(None, None, qp.QuantizeArgs(to_device(x), q_dev, 1.0))
        got = q_dev.get()
        assert np.array_equal(got, q_ref.view(np.uint8)), f"software={software}: " + first_mismatch(
            got, q_ref.view(np.uint8)
        )


def test_zero_size_problem_launches_nothing() -> None:
    import cupy

    desc = qp.QuantizeDescriptor(shape=(0, 16), scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8)
    plan = qp.QuantizePlan.select(None, desc)
    plan.run(
        None,
        None,
        qp.QuantizeArgs(
            cupy.zeros((0, 16), cupy.float16), cupy.zeros((0, 16), cupy.int8), cupy.zeros((0, 1), cupy.float32)
        ),
    )


def test_bad_input_raises_before_launch_and_writes_nothing(rng) -> None:
    import cupy

    shape = (8, 32)
    desc = qp.QuantizeDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8)
    plan = qp.QuantizePlan.select(None, desc)
    x = cupy.asarray(random_floats(rng, shape, EK.F16))
    q = cupy.full(shape, 7, cupy.int8)
    bad = [
        qp.QuantizeArgs(x.astype(cupy.float32), q, cupy.ones((8, 1), cupy.float32)),
        qp.QuantizeArgs(x, q, cupy.ones((8, 1), cupy.float64)),
        qp.QuantizeArgs(x, q, cupy.ones((8, 2), cupy.float32)),
        qp.QuantizeArgs(x[:, ::2], q[:, :16], cupy.ones((8, 1), cupy.float32)),
        qp.QuantizeArgs(x.get(), q, np.ones((8, 1), np.float32)),
        qp.QuantizeArgs(x, q, 2.0),
    ]
    for args in bad:
        with pytest.raises(qp.InvalidProblem):
            plan.run(None, None, args)
    cupy.cuda.Device().synchronize()
    assert bool((q == 7).all())


def test_kernel_resources_report() -> None:
    """Record registers and local memory of the main variants (no spills expected)."""
    desc = qp.QuantizeDescriptor(shape=(64, 8192), scope=qp.TokenScope(), input_element=EK.BF16, output_element=EK.S8)
    plan = qp.QuantizePlan.select(None, desc)
    fn_ptr = plan._prepared[0].function_ptr
    import cupy

    attrs = cupy.cuda.driver.funcGetAttribute
    regs = attrs(cupy.cuda.driver.CU_FUNC_ATTRIBUTE_NUM_REGS, fn_ptr)
    local = attrs(cupy.cuda.driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn_ptr)
    print(f"quantize_rows bf16->s8 vec8: {regs} registers, {local} bytes local")
    assert local <= 64  # only the rarely taken exact-division call may use a small stack frame


@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3, EK.FP8_E5M2])
@pytest.mark.parametrize("float_kind", [EK.F32, EK.BF16])
def test_values_at_and_next_to_rounding_boundaries(rng, float_kind, code_kind) -> None:
    """Exact ties and their float neighbours: the reciprocal fast path must defer to the exact
    division whenever it cannot prove the rounding (values a few ulps from a boundary)."""
    import cupy

    rows, L = 64, 256
    scale = np.exp(rng.uniform(-4, 3, size=(rows, 1))).astype(np.float32)
    if ELEMENTS[code_kind].is_fp8:
        grid = np.unique(
            np.abs(np.arange(256, dtype=np.uint8).view(ELEMENTS[code_kind].numpy_dtype).astype(np.float64))
        )
        grid = grid[np.isfinite(grid)]
        bounds = (grid[1:] + grid[:-1]) / 2
        centers = rng.choice(bounds, size=(rows, L)) * rng.choice([-1.0, 1.0], size=(rows, L))
    else:
        centers = rng.integers(-20, 20, size=(rows, L)) + 0.5
    x = (centers * scale).astype(np.float32)
    step = rng.integers(-3, 4, size=(rows, L)).astype(np.float32)
    x = np.where(
        step > 0, np.nextafter(x, np.float32(np.inf)), np.where(step < 0, np.nextafter(x, np.float32(-np.inf)), x)
    )
    x = x.astype(ELEMENTS[float_kind].numpy_dtype)
    desc = qp.QuantizeDescriptor(
        shape=(rows, L), scope=qp.TokenScope(), input_element=float_kind, output_element=code_kind
    )
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale))
    q_dev = to_device(np.zeros(desc.output_shape, q_ref.dtype))
    qp.QuantizePlan.select(None, desc).run(None, None, qp.QuantizeArgs(to_device(x), q_dev, cupy.asarray(scale)))
    got = q_dev.get().view(np.uint8)
    assert np.array_equal(got, q_ref.view(np.uint8)), first_mismatch(got, q_ref.view(np.uint8))


@pytest.mark.parametrize("float_kind", [EK.F32, EK.BF16])
@pytest.mark.parametrize("base", [1000, 70000, 2**21 - 300])
def test_large_quotients_next_to_ties_with_offset_zero_point(rng, float_kind, base) -> None:
    """x / scale = k + 0.5 (and +-3 ulps) for large k, brought into the U8 range by zp = -base:
    the fast path's margin grows with |k| and must still defer to the division at every tie."""
    import cupy

    rows, L = 48, 512
    scale = np.exp(rng.uniform(-6, 2, size=(rows, 1))).astype(np.float32)
    centers = base + rng.integers(0, 255, size=(rows, L)) + 0.5
    centers *= rng.choice([-1.0, 1.0], size=(rows, L)) if base < 2**20 else 1.0
    x = (centers * scale).astype(np.float32)
    step = rng.integers(-3, 4, size=(rows, L)).astype(np.float32)
    x = np.where(
        step > 0, np.nextafter(x, np.float32(np.inf)), np.where(step < 0, np.nextafter(x, np.float32(-np.inf)), x)
    ).astype(ELEMENTS[float_kind].numpy_dtype)
    zp = np.full((rows, 1), -base, np.int32)
    desc = qp.QuantizeDescriptor(
        shape=(rows, L),
        scope=qp.TokenScope(),
        mode=qp.QuantMode.ASYMMETRIC,
        input_element=float_kind,
        output_element=EK.U8,
    )
    q_ref = np.zeros(desc.output_shape, np.uint8)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale, zp))
    if float_kind is EK.F32 or base < 2**20:  # bf16 cannot place x / scale within 255 of 2**21
        assert 0 < np.count_nonzero((q_ref > 0) & (q_ref < 255))  # not all clamped
    q_dev = cupy.zeros(desc.output_shape, np.uint8)
    qp.QuantizePlan.select(None, desc).run(
        None, None, qp.QuantizeArgs(to_device(x), q_dev, cupy.asarray(scale), cupy.asarray(zp))
    )
    got = q_dev.get()
    assert np.array_equal(got, q_ref), first_mismatch(got, q_ref)


@pytest.mark.parametrize("code_kind", [EK.U8, EK.S4])
@pytest.mark.parametrize("float_kind", [EK.F32, EK.BF16, EK.F16])
def test_extreme_int32_zero_points(rng, float_kind, code_kind) -> None:
    """Zero points anywhere in int32 (around +-2**21, +-2**24 and the int32 ends): quantize clamps
    exactly and dequantize rounds (q - zp) once, as the reference does."""
    import cupy

    rows, L = 64, 130
    special = np.array(
        [
            0,
            1,
            -1,
            2**20,
            2**20 + 1,
            -(2**20) - 1,
            2**21,
            2**21 + 3,
            -(2**21) - 5,
            2**24 + 1,
            -(2**24) - 3,
            2**30 + 7,
            -(2**30) - 9,
            2**31 - 1,
            -(2**31),
            123456789,
            -987654321,
        ],
        dtype=np.int64,
    )
    zp = np.concatenate([special, rng.integers(-(2**31), 2**31, size=rows - special.size)]).astype(np.int32)
    zp = zp.reshape(rows, 1)
    scale = random_scale(rng, (rows, 1), qp.MathPrecision.F32)
    desc = qp.QuantizeDescriptor(
        shape=(rows, L),
        scope=qp.TokenScope(),
        mode=qp.QuantMode.ASYMMETRIC,
        input_element=float_kind,
        output_element=code_kind,
    )
    x = random_floats(rng, (rows, L), float_kind)
    q_ref = np.zeros(desc.output_shape, ELEMENTS[code_kind].numpy_dtype)
    qp.QuantizePlan.select(None, desc, REFERENCE).run(None, None, qp.QuantizeArgs(x, q_ref, scale, zp))
    q_dev = cupy.zeros(desc.output_shape, q_ref.dtype)
    qp.QuantizePlan.select(None, desc).run(
        None, None, qp.QuantizeArgs(to_device(x), q_dev, cupy.asarray(scale), cupy.asarray(zp))
    )
    got = q_dev.get()
    assert np.array_equal(got, q_ref), first_mismatch(got, q_ref)

    ddesc = qp.DequantizeDescriptor(
        shape=(rows, L),
        scope=qp.TokenScope(),
        mode=qp.QuantMode.ASYMMETRIC,
        input_element=code_kind,
        output_element=float_kind,
    )
    codes = random_codes(rng, (rows, L), code_kind)
    y_ref = np.zeros((rows, L), ELEMENTS[float_kind].numpy_dtype)
    qp.DequantizePlan.select(None, ddesc, REFERENCE).run(None, None, qp.DequantizeArgs(codes, y_ref, scale, zp))
    y_dev = to_device(np.zeros((rows, L), y_ref.dtype))
    qp.DequantizePlan.select(None, ddesc).run(
        None, None, qp.DequantizeArgs(to_device(codes), y_dev, cupy.asarray(scale), cupy.asarray(zp))
    )
    assert float_bits_equal(y_dev.get().view(y_ref.dtype), y_ref)
