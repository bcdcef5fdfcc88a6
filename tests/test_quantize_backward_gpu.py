"""GPU: QuantizeBackwardPlan / DequantizeBackwardPlan on CUDA equal the reference backend bit for bit.

Every float kind x scope x mode x code kind on fresh random ragged shapes (NaN, +-Inf and -0
included), scalar and device-array parameters, in place, misaligned operands (element-I/O
twin), values at and next to the mask's bounds (ties, large quotients, extreme zero points),
the mask against QuantizePlan's own codes, the chain dequantize backward -> quantize backward
against FakeQuantizeBackwardPlan, torch tensors, graph capture, and bad inputs that must raise
before any launch.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import CODES, FLOATS, REFERENCE, first_mismatch, float_bits_equal, random_floats, to_device

import quantplan as qp
from quantplan import reference
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.types import ElementKind as EK

pytestmark = pytest.mark.gpu

SYM, ASYM = qp.QuantMode.SYMMETRIC, qp.QuantMode.ASYMMETRIC
SCOPE_KINDS = [
    "tensor",
    "token",
    "token-short-rows",
    "channel-first",
    "channel-last",
    "channel-middle",
    "group-last-odd",
    "group-last-long",
    "group-first",
    "group-middle",
]


def _ragged(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An extent in [lo, hi] that is not a multiple of 8."""
    while True:
        e = int(rng.integers(lo, hi + 1))
        if e % 8:
            return e


def _case(rng: np.random.Generator, kind: str) -> tuple[qp.Scope, tuple[int, ...]]:
    """A scope and a fresh random ragged shape for it."""
    r = _ragged
    if kind == "tensor":
        return qp.TensorScope(), (r(rng, 2, 60), r(rng, 3, 300))
    if kind == "token":
        return qp.TokenScope(), (r(rng, 2, 9), r(rng, 2, 9), r(rng, 50, 400))
    if kind == "token-short-rows":
        return qp.TokenScope(), (r(rng, 100, 400), r(rng, 3, 30))
    if kind == "channel-first":
        return qp.ChannelScope(axis=0), (r(rng, 2, 60), r(rng, 30, 300))
    if kind == "channel-last":
        return qp.ChannelScope(axis=-1), (r(rng, 2, 40), r(rng, 30, 200))
    if kind == "channel-middle":
        return qp.ChannelScope(axis=1), (r(rng, 2, 5), r(rng, 3, 20), r(rng, 2, 7), r(rng, 3, 30))
    if kind == "group-last-odd":
        g = int(rng.choice([3, 5, 7, 9, 11, 13]))
        return qp.GroupScope(axis=-1, group_size=g), (r(rng, 2, 30), g * int(rng.integers(2, 20)))
    if kind == "group-last-long":
        g = r(rng, 65, 200)
        return qp.GroupScope(axis=-1, group_size=g), (r(rng, 2, 12), g * int(rng.integers(2, 12)))
    if kind == "group-first":
        g = int(rng.integers(2, 6))
        return qp.GroupScope(axis=0, group_size=g), (g * int(rng.integers(2, 15)), r(rng, 3, 60))
    assert kind == "group-middle"
    g = int(rng.choice([3, 5, 7]))
    return qp.GroupScope(axis=1, group_size=g), (r(rng, 2, 4), g * int(rng.integers(2, 8)), r(rng, 2, 4), r(rng, 3, 25))


def _with_specials(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """``x`` with NaN, +-Inf and -0.0 at random places."""
    flat = x.reshape(-1).copy()
    if flat.size > 16:
        specials = [np.nan, -np.inf, -0.0, np.inf]
        idx = rng.choice(flat.size, size=len(specials), replace=False)
        flat[idx] = np.array(specials).astype(x.dtype)
    return flat.reshape(x.shape)


def _param_dtype(float_kind: EK) -> type:
    return np.float64 if float_kind is EK.F64 else np.float32


def _params(
    rng: np.random.Generator, desc: qp.QuantizeBackwardDescriptor, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """Scales near the data's range / the code span, so codes land inside and outside the range."""
    code = ELEMENTS[desc.output_element]
    finite = np.abs(x.astype(np.float64)[np.isfinite(x.astype(np.float64))])
    amax = float(finite.max()) if finite.size else 1.0
    span = code.fp8_max if code.is_fp8 else (code.code_range[1] - code.code_range[0])  # type: ignore[index]
    scale = (max(amax, 1e-3) / span * np.exp(rng.uniform(-3.0, 0.5, size=desc.param_shape))).astype(
        _param_dtype(desc.input_element)
    )
    if desc.mode is SYM:
        return scale, None
    lo, hi = code.code_range  # type: ignore[misc]
    return scale, rng.integers(lo, hi + 1, size=desc.param_shape).astype(np.int32)


def _get(a, like: np.ndarray) -> np.ndarray:  # noqa: ANN001
    return a.get().view(like.dtype).reshape(like.shape)


def _dev(a: np.ndarray | None):  # noqa: ANN202
    return None if a is None else to_device(a)


def _ref_quantize_backward(desc, x, dq, scale, zp) -> np.ndarray:  # noqa: ANN001
    dx = np.zeros_like(dq)
    plan = qp.QuantizeBackwardPlan.select(None, desc, REFERENCE)
    plan.run(None, None, qp.QuantizeBackwardArgs(x, dq, dx, scale, zp))
    return dx


def _ref_dequantize_backward(desc, dy, scale) -> np.ndarray:  # noqa: ANN001
    dq = np.zeros_like(dy)
    qp.DequantizeBackwardPlan.select(None, desc, REFERENCE).run(None, None, qp.DequantizeBackwardArgs(dy, dq, scale))
    return dq


COMBOS = [
    (f, c, s, m)
    for f, c, s, m in itertools.product(FLOATS, CODES, SCOPE_KINDS, qp.QuantMode)
    if not (ELEMENTS[c].is_fp8 and m is ASYM)
]


@pytest.mark.parametrize(
    "float_kind,code_kind,scope_kind,mode",
    COMBOS,
    ids=[f"{f.name}-{c.name}-{s}-{m.name[:4]}" for f, c, s, m in COMBOS],
)
def test_backward_plans_match_reference(rng, float_kind, code_kind, scope_kind, mode) -> None:
    scope, shape = _case(rng, scope_kind)
    fields = dict(shape=shape, scope=scope, mode=mode)
    desc = qp.QuantizeBackwardDescriptor(**fields, input_element=float_kind, output_element=code_kind)
    x = _with_specials(rng, random_floats(rng, shape, float_kind))
    dq = _with_specials(rng, random_floats(rng, shape, float_kind))
    scale, zp = _params(rng, desc, x)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, zp)
    mask = dx_ref.astype(np.float64) != 0
    if mask.size > 16:  # NaN / Inf placed: both sides of the mask are exercised
        assert 0 < np.count_nonzero(mask) < mask.size

    plan = qp.QuantizeBackwardPlan.select(None, desc)
    assert plan.sku().backend is qp.BackendKind.CUDA and plan.workspace_size() == 0
    assert plan.sku().variant.startswith(scope.kind)
    dx_dev = to_device(np.full(shape, 7, dx_ref.dtype))
    plan.run(None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale), _dev(zp)))
    dx_gpu = _get(dx_dev, dx_ref)
    assert float_bits_equal(dx_gpu, dx_ref), first_mismatch(dx_gpu, dx_ref)

    ddesc = qp.DequantizeBackwardDescriptor(**fields, input_element=code_kind, output_element=float_kind)
    dy = _with_specials(rng, random_floats(rng, shape, float_kind))
    dq_ref = _ref_dequantize_backward(ddesc, dy, scale)
    dq_dev = to_device(np.full(shape, 7, dq_ref.dtype))
    qp.DequantizeBackwardPlan.select(None, ddesc).run(
        None, None, qp.DequantizeBackwardArgs(to_device(dy), dq_dev, to_device(scale))
    )
    dq_gpu = _get(dq_dev, dq_ref)
    assert float_bits_equal(dq_gpu, dq_ref), first_mismatch(dq_gpu, dq_ref)


@pytest.mark.parametrize("code_kind", [EK.S4, EK.U4])
@pytest.mark.parametrize("float_kind", [EK.BF16, EK.F64])
def test_high_first_nibble_order_descriptors(rng, float_kind, code_kind) -> None:
    """HIGH_FIRST descriptors load the forward's other compile unit; the gradients do not change."""
    shape = (19, 105)
    fields = dict(shape=shape, scope=qp.GroupScope(group_size=7), mode=ASYM, nibble_order=qp.NibbleOrder.HIGH_FIRST)
    desc = qp.QuantizeBackwardDescriptor(**fields, input_element=float_kind, output_element=code_kind)
    x, dq = random_floats(rng, shape, float_kind), random_floats(rng, shape, float_kind)
    scale, zp = _params(rng, desc, x)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, zp)
    dx_dev = to_device(np.zeros_like(dx_ref))
    qp.QuantizeBackwardPlan.select(None, desc).run(
        None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale), to_device(zp))
    )
    assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)
    ddesc = qp.DequantizeBackwardDescriptor(**fields, input_element=code_kind, output_element=float_kind)
    dq_ref = _ref_dequantize_backward(ddesc, dq, scale)
    dq_dev = to_device(np.zeros_like(dq_ref))
    qp.DequantizeBackwardPlan.select(None, ddesc).run(
        None, None, qp.DequantizeBackwardArgs(to_device(dq), dq_dev, to_device(scale))
    )
    assert float_bits_equal(_get(dq_dev, dq_ref), dq_ref)


# ---- parameters, in place, misaligned -----------------------------------------------------------


@pytest.mark.parametrize("float_kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize("code_kind", [EK.S8, EK.U4, EK.FP8_E4M3])
def test_scalar_and_one_element_device_parameters(rng, float_kind, code_kind) -> None:
    import cupy

    shape = (33, 517)
    mode = SYM if ELEMENTS[code_kind].is_fp8 else ASYM
    desc = qp.QuantizeBackwardDescriptor(
        shape=shape, scope=qp.TensorScope(), mode=mode, input_element=float_kind, output_element=code_kind
    )
    x, dq = random_floats(rng, shape, float_kind), random_floats(rng, shape, float_kind)
    scale_arr, zp_arr = _params(rng, desc, x)
    s = float(scale_arr.reshape(-1)[0])
    z = None if zp_arr is None else int(zp_arr.reshape(-1)[0])
    dx_ref = _ref_quantize_backward(desc, x, dq, s, z)
    plan = qp.QuantizeBackwardPlan.select(None, desc)
    pdtype = _param_dtype(float_kind)
    device_params = (cupy.asarray(np.array([s], pdtype)), None if z is None else cupy.asarray(np.array([z], np.int32)))
    for scale, zp in ((s, z), device_params):
        dx_dev = to_device(np.zeros_like(dx_ref))
        plan.run(None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, scale, zp))
        assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)
    ddesc = qp.DequantizeBackwardDescriptor(
        shape=shape, scope=qp.TensorScope(), mode=mode, input_element=code_kind, output_element=float_kind
    )
    dq_ref = _ref_dequantize_backward(ddesc, dq, s)
    dplan = qp.DequantizeBackwardPlan.select(None, ddesc)
    for scale in (s, device_params[0]):
        out = to_device(np.zeros_like(dq_ref))
        dplan.run(None, None, qp.DequantizeBackwardArgs(to_device(dq), out, scale))
        assert float_bits_equal(_get(out, dq_ref), dq_ref), first_mismatch(_get(out, dq_ref), dq_ref)


@pytest.mark.parametrize("float_kind", FLOATS, ids=lambda k: k.name)
def test_in_place(rng, float_kind) -> None:
    shape = (45, 203)
    scope = qp.ChannelScope(axis=0)
    desc = qp.QuantizeBackwardDescriptor(
        shape=shape, scope=scope, mode=ASYM, input_element=float_kind, output_element=EK.U8
    )
    x, dq = _with_specials(rng, random_floats(rng, shape, float_kind)), random_floats(rng, shape, float_kind)
    scale, zp = _params(rng, desc, x)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, zp)
    buf = to_device(dq)
    qp.QuantizeBackwardPlan.select(None, desc).run(
        None, None, qp.QuantizeBackwardArgs(to_device(x), buf, buf, to_device(scale), to_device(zp))
    )
    assert float_bits_equal(_get(buf, dx_ref), dx_ref), first_mismatch(_get(buf, dx_ref), dx_ref)
    ddesc = qp.DequantizeBackwardDescriptor(
        shape=shape, scope=scope, mode=ASYM, input_element=EK.U8, output_element=float_kind
    )
    dq_ref = _ref_dequantize_backward(ddesc, dq, scale)
    buf = to_device(dq)
    qp.DequantizeBackwardPlan.select(None, ddesc).run(None, None, qp.DequantizeBackwardArgs(buf, buf, to_device(scale)))
    assert float_bits_equal(_get(buf, dq_ref), dq_ref), first_mismatch(_get(buf, dq_ref), dq_ref)


def _offset_view(a: np.ndarray, offset: int):  # noqa: ANN202
    """A device copy of ``a`` starting ``offset`` elements into a larger buffer (and the buffer)."""
    flat = a.reshape(-1)
    buf = to_device(np.concatenate([flat[:offset], flat]))
    return buf[offset:].reshape(a.shape), buf


@pytest.mark.parametrize("float_kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize("scope_kind", ["token", "group-last-odd", "tensor"])
def test_misaligned_operands_take_the_element_io_twin(rng, float_kind, scope_kind) -> None:
    scope, shape = _case(rng, scope_kind)
    shape = (*shape[:-1], shape[-1] - shape[-1] % 8 + 8) if scope_kind != "group-last-odd" else shape
    desc = qp.QuantizeBackwardDescriptor(shape=shape, scope=scope, input_element=float_kind, output_element=EK.S8)
    x, dq = _with_specials(rng, random_floats(rng, shape, float_kind)), random_floats(rng, shape, float_kind)
    scale, _ = _params(rng, desc, x)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, None)
    ddesc = qp.DequantizeBackwardDescriptor(shape=shape, scope=scope, input_element=EK.S8, output_element=float_kind)
    dq_ref = _ref_dequantize_backward(ddesc, dq, scale)
    plan, dplan = qp.QuantizeBackwardPlan.select(None, desc), qp.DequantizeBackwardPlan.select(None, ddesc)
    sentinel = np.full(shape, 5, dq.dtype)
    for offsets in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (0, 0, 0)):
        xv, _ = _offset_view(x, offsets[0])
        gv, _ = _offset_view(dq, offsets[1])
        ov, obuf = _offset_view(sentinel, offsets[2])
        plan.run(None, None, qp.QuantizeBackwardArgs(xv, gv, ov, to_device(scale)))
        got = _get(ov, dx_ref)
        assert float_bits_equal(got, dx_ref), f"offsets {offsets}: " + first_mismatch(got, dx_ref)
        assert np.array_equal(obuf[: offsets[2]].get(), to_device(sentinel).reshape(-1)[: offsets[2]].get())
        ov2, _ = _offset_view(sentinel, offsets[2])
        dplan.run(None, None, qp.DequantizeBackwardArgs(gv, ov2, to_device(scale)))
        got2 = _get(ov2, dq_ref)
        assert float_bits_equal(got2, dq_ref), f"offsets {offsets}: " + first_mismatch(got2, dq_ref)


# ---- values at and next to the mask's bounds -----------------------------------------------------


def _nudge(rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    """Each value, or one to three float32 ulps up or down."""
    out = x.astype(np.float32)
    for _ in range(3):
        step = rng.integers(-1, 2, size=x.shape)
        out = np.where(step > 0, np.nextafter(out, np.float32(np.inf)), out)
        out = np.where(step < 0, np.nextafter(out, np.float32(-np.inf)), out)
    return out


@pytest.mark.parametrize("code_kind", [EK.S8, EK.U8, EK.S4, EK.U4, EK.FP8_E4M3, EK.FP8_E5M2])
@pytest.mark.parametrize("float_kind", [EK.F32, EK.BF16, EK.F16, EK.F64])
def test_values_at_and_next_to_the_mask_bounds(rng, float_kind, code_kind) -> None:
    """Ties at q_min - 1/2 and q_max + 1/2 (and a few ulps around them) under random scales: the
    division-free quotient must defer to the division exactly where the forward's does."""
    rows, L = 64, 256
    info = ELEMENTS[code_kind]
    pdtype = _param_dtype(float_kind)
    top = 0.0 if float_kind is EK.F16 else 3.0  # float16 holds 1.0625 * 57344 * scale only for scale <= 1
    scale = np.exp(rng.uniform(-4, top, size=(rows, 1))).astype(pdtype)
    sign = rng.choice([-1.0, 1.0], size=(rows, L))
    if info.is_fp8:
        assert info.fp8_max is not None
        centers = sign * info.fp8_max * rng.choice([1.0, 1.0 + 2.0**-10, 1.0 - 2.0**-10, 1.0625], size=(rows, L))
        mode, zp = SYM, None
    else:
        lo, hi = info.code_range  # type: ignore[misc]
        zp = rng.integers(lo, hi + 1, size=(rows, 1)).astype(np.int32)
        edges = np.where(sign > 0, hi - zp + 0.5, lo - zp - 0.5)
        centers = edges + rng.choice([0.0, -1.0, 1.0, 0.5, -0.5], size=(rows, L)) * sign
        mode = ASYM
    x = (centers * scale).astype(pdtype)
    x = x if float_kind is EK.F64 else _nudge(rng, x)
    x = x.astype(ELEMENTS[float_kind].numpy_dtype)
    desc = qp.QuantizeBackwardDescriptor(
        shape=(rows, L), scope=qp.TokenScope(), mode=mode, input_element=float_kind, output_element=code_kind
    )
    dq = random_floats(rng, (rows, L), float_kind, specials=False)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, zp)
    dx_dev = to_device(np.zeros_like(dx_ref))
    qp.QuantizeBackwardPlan.select(None, desc).run(
        None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale), _dev(zp))
    )
    assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)


@pytest.mark.parametrize("float_kind", [EK.F32, EK.BF16])
@pytest.mark.parametrize("base", [1000, 70000, 2**21 - 300, 2**21 + 5000])
def test_large_quotients_next_to_ties_with_offset_zero_point(rng, float_kind, base) -> None:
    """x / scale = k + 0.5 (and a few ulps around) for large k brought into the U8 window by
    zp = -base: the division-free path gives up at 2**21 and the division takes over."""
    rows, L = 48, 512
    scale = np.exp(rng.uniform(-6, 2, size=(rows, 1))).astype(np.float32)
    centers = base + rng.integers(-20, 275, size=(rows, L)) + rng.choice([0.0, 0.5], size=(rows, L))
    x = _nudge(rng, (centers * scale).astype(np.float32)).astype(ELEMENTS[float_kind].numpy_dtype)
    zp = np.full((rows, 1), -base, np.int32)
    desc = qp.QuantizeBackwardDescriptor(
        shape=(rows, L), scope=qp.TokenScope(), mode=ASYM, input_element=float_kind, output_element=EK.U8
    )
    dq = random_floats(rng, (rows, L), float_kind, specials=False)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, zp)
    dx_dev = to_device(np.zeros_like(dx_ref))
    qp.QuantizeBackwardPlan.select(None, desc).run(
        None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale), to_device(zp))
    )
    assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)


@pytest.mark.parametrize("float_kind", [EK.F32, EK.BF16, EK.F64])
def test_extreme_int32_zero_points(rng, float_kind) -> None:
    """Zero points anywhere in int32: the mask's bounds q_min - zp and q_max - zp are compared
    exactly (rounded outwards), on the division-free path (|zp| <= 2**30) and off it."""
    rows, L = 40, 130
    special = [0, 1, -1, 2**20 + 1, -(2**21) - 5, 2**24 + 1, -(2**24) - 3, 2**30 + 7, -(2**30) - 9, 2**31 - 1, -(2**31)]
    zp = np.concatenate([special, rng.integers(-(2**31), 2**31, size=rows - len(special))]).astype(np.int32)
    zp = zp.reshape(rows, 1)
    scale = np.exp(rng.uniform(-4, 2, size=(rows, 1))).astype(_param_dtype(float_kind))
    # x / scale near -zp, so that rne(x / scale) + zp lands in and around [0, 255]
    centers = -zp.astype(np.float64) + rng.integers(-20, 275, size=(rows, L)) + 0.5
    x = (centers * scale).astype(ELEMENTS[float_kind].numpy_dtype)
    desc = qp.QuantizeBackwardDescriptor(
        shape=(rows, L), scope=qp.TokenScope(), mode=ASYM, input_element=float_kind, output_element=EK.U8
    )
    dq = random_floats(rng, (rows, L), float_kind, specials=False)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, zp)
    dx_dev = to_device(np.zeros_like(dx_ref))
    qp.QuantizeBackwardPlan.select(None, desc).run(
        None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale), to_device(zp))
    )
    assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)


@pytest.mark.parametrize("float_kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize("code_kind,lo,hi", [(EK.S8, -100, 100), (EK.U8, 1, 254), (EK.S4, -7, 6), (EK.U4, 1, 14)])
def test_mask_agrees_with_quantize_plan_codes_on_the_gpu(rng, float_kind, code_kind, lo, hi) -> None:
    """QuantizePlan (CUDA) with the range widened by one each side: a code in [lo, hi] is exactly
    one the clamp left alone, which is exactly where QuantizeBackwardPlan (CUDA) passes the gradient."""
    import cupy

    scope, shape = _case(rng, "group-last-odd")
    fwd = qp.QuantizeDescriptor(
        shape=shape,
        scope=scope,
        mode=ASYM,
        input_element=float_kind,
        output_element=code_kind,
        q_min=lo - 1,
        q_max=hi + 1,
    )
    x = random_floats(rng, shape, float_kind)
    scale = (np.exp(rng.uniform(-3, 1, size=fwd.param_shape)) * 0.05).astype(_param_dtype(float_kind))
    zp = rng.integers(lo, hi + 1, size=fwd.param_shape).astype(np.int32)
    q = cupy.zeros(fwd.output_shape, ELEMENTS[code_kind].numpy_dtype)
    xd, sd, zd = to_device(x), to_device(scale), to_device(zp)
    qp.QuantizePlan.select(None, fwd).run(None, None, qp.QuantizeArgs(xd, q, sd, zd))
    codes = reference.decode_codes(q.get(), code_kind, shape[-1], qp.NibbleOrder.LOW_FIRST)
    bwd = qp.QuantizeBackwardDescriptor.from_forward(fwd.model_copy(update={"q_min": lo, "q_max": hi}))
    dx = to_device(np.zeros(shape, x.dtype))
    qp.QuantizeBackwardPlan.select(None, bwd).run(
        None, None, qp.QuantizeBackwardArgs(xd, to_device(np.ones(shape, x.dtype)), dx, sd, zd)
    )
    inside = _get(dx, x).astype(np.float64) != 0
    expected = (codes >= lo) & (codes <= hi) & ~np.isnan(x.astype(np.float64))
    assert np.array_equal(inside, expected), f"{np.count_nonzero(inside != expected)} mask mismatches"
    assert 0 < np.count_nonzero(expected) < expected.size


# ---- the chain against FakeQuantizeBackwardPlan ---------------------------------------------------


@pytest.mark.parametrize("float_kind", FLOATS, ids=lambda k: k.name)
@pytest.mark.parametrize("scope_kind", ["tensor", "token", "channel-last", "group-first"])
def test_chain_equals_fake_quantize_ste_for_power_of_two_scales(rng, float_kind, scope_kind) -> None:
    """Power-of-two scales: x * rn(1/s) == x / s and (dy * s) / s == dy exactly, so dequantize
    backward -> quantize backward equals FakeQuantizeBackwardPlan's dy * mask (up to the sign of zero)."""
    scope, shape = _case(rng, scope_kind)
    fields = dict(shape=shape, scope=scope, mode=ASYM)
    fdesc = qp.FakeQuantizeBackwardDescriptor(**fields, element=float_kind, q_min=0, q_max=255)
    scale = (2.0 ** rng.integers(-3, 4, size=fdesc.param_shape)).astype(_param_dtype(float_kind))
    zp = rng.integers(0, 256, size=fdesc.param_shape).astype(np.int32)
    dtype = ELEMENTS[float_kind].numpy_dtype
    x = (rng.uniform(-200, 200, size=shape) * np.broadcast_to(_expand(scale, shape, scope), shape)).astype(dtype)
    dy = (rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.01, 4.0, size=shape)).astype(dtype)
    xd, dyd, sd, zd = to_device(x), to_device(dy), to_device(scale), to_device(zp)
    dq = to_device(np.zeros_like(dy))
    dx = to_device(np.zeros_like(dy))
    ddesc = qp.DequantizeBackwardDescriptor(**fields, input_element=EK.U8, output_element=float_kind)
    qdesc = qp.QuantizeBackwardDescriptor(**fields, input_element=float_kind, output_element=EK.U8)
    qp.DequantizeBackwardPlan.select(None, ddesc).run(None, None, qp.DequantizeBackwardArgs(dyd, dq, sd))
    qp.QuantizeBackwardPlan.select(None, qdesc).run(None, None, qp.QuantizeBackwardArgs(xd, dq, dx, sd, zd))
    ste = to_device(np.zeros_like(dy))
    qp.FakeQuantizeBackwardPlan.select(None, fdesc).run(None, None, qp.FakeQuantizeBackwardArgs(xd, dyd, ste, sd, zd))
    chain, fake = _get(dx, dy).astype(np.float64), _get(ste, dy).astype(np.float64)
    assert np.array_equal(chain, fake), first_mismatch(chain, fake)
    assert 0 < np.count_nonzero(chain) < chain.size


def _expand(params: np.ndarray, shape: tuple[int, ...], scope: qp.Scope) -> np.ndarray:
    from quantplan.runtime._layout import expand_params

    return expand_params(params, shape, scope)


# ---- scale, streams, graphs, torch ----------------------------------------------------------------


def test_more_than_65535_rows(rng) -> None:
    shape = (70001, 24)
    for scope in (qp.TokenScope(), qp.ChannelScope(axis=0)):
        desc = qp.QuantizeBackwardDescriptor(shape=shape, scope=scope, input_element=EK.F32, output_element=EK.S8)
        x, dq = random_floats(rng, shape, EK.F32), random_floats(rng, shape, EK.F32)
        scale, _ = _params(rng, desc, x)
        dx_ref = _ref_quantize_backward(desc, x, dq, scale, None)
        dx_dev = to_device(np.zeros_like(dx_ref))
        qp.QuantizeBackwardPlan.select(None, desc).run(
            None, None, qp.QuantizeBackwardArgs(to_device(x), to_device(dq), dx_dev, to_device(scale))
        )
        assert float_bits_equal(_get(dx_dev, dx_ref), dx_ref), first_mismatch(_get(dx_dev, dx_ref), dx_ref)


def test_non_default_stream_and_graph_capture(rng) -> None:
    import cupy

    shape = (96, 3000)
    scope = qp.GroupScope(group_size=100)
    fields = dict(shape=shape, scope=scope, mode=ASYM)
    qdesc = qp.QuantizeBackwardDescriptor(**fields, input_element=EK.BF16, output_element=EK.U4)
    ddesc = qp.DequantizeBackwardDescriptor(**fields, input_element=EK.U4, output_element=EK.BF16)
    x, dy = random_floats(rng, shape, EK.BF16), random_floats(rng, shape, EK.BF16)
    scale, zp = _params(rng, qdesc, x)
    stream = cupy.cuda.Stream(non_blocking=True)
    qplan, dplan = qp.QuantizeBackwardPlan.select(stream, qdesc), qp.DequantizeBackwardPlan.select(stream, ddesc)
    xd, dyd, sd, zd = to_device(x), to_device(dy), to_device(scale), to_device(zp)
    dq, dx = cupy.zeros_like(dyd), cupy.zeros_like(dyd)
    with stream:
        stream.begin_capture()
        dplan.run(stream, None, qp.DequantizeBackwardArgs(dyd, dq, sd))
        qplan.run(stream, None, qp.QuantizeBackwardArgs(xd, dq, dx, sd, zd))
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    dq_ref = _ref_dequantize_backward(ddesc, dy, scale)
    dx_ref = _ref_quantize_backward(qdesc, x, dq_ref, scale, zp)
    assert float_bits_equal(_get(dq, dq_ref), dq_ref)
    assert float_bits_equal(_get(dx, dx_ref), dx_ref)
    dx.fill(0)
    graph.launch(stream)  # replay
    stream.synchronize()
    assert float_bits_equal(_get(dx, dx_ref), dx_ref)


def test_torch_tensors_and_torch_stream(rng) -> None:
    torch = pytest.importorskip("torch")
    import ml_dtypes

    shape = (257, 1000)
    desc = qp.QuantizeBackwardDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.BF16, output_element=EK.FP8_E4M3
    )
    x, dq = random_floats(rng, shape, EK.BF16), random_floats(rng, shape, EK.BF16)
    scale, _ = _params(rng, desc, x)
    dx_ref = _ref_quantize_backward(desc, x, dq, scale, None)

    def bf16(a: np.ndarray):  # noqa: ANN202
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()

    xt, dqt, st = bf16(x), bf16(dq), torch.from_numpy(scale).cuda()
    dxt = torch.full(shape, 3.0, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    qp.QuantizeBackwardPlan.select(stream, desc).run(stream, None, qp.QuantizeBackwardArgs(xt, dqt, dxt, st))
    ddesc = qp.DequantizeBackwardDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.FP8_E4M3, output_element=EK.BF16
    )
    dqt2 = torch.empty_like(dqt)
    qp.DequantizeBackwardPlan.select(stream, ddesc).run(stream, None, qp.DequantizeBackwardArgs(dqt, dqt2, st))
    stream.synchronize()
    got = dxt.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    assert float_bits_equal(got, dx_ref), first_mismatch(got, dx_ref)
    dq_ref = _ref_dequantize_backward(ddesc, dq, scale)
    got2 = dqt2.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    assert float_bits_equal(got2, dq_ref), first_mismatch(got2, dq_ref)


# ---- bad inputs and empty problems -----------------------------------------------------------------


def test_bad_input_raises_before_launch_and_writes_nothing(rng) -> None:
    import cupy

    shape = (8, 32)
    n = shape[0] * shape[1]
    desc = qp.QuantizeBackwardDescriptor(shape=shape, scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8)
    plan = qp.QuantizeBackwardPlan.select(None, desc)
    x = cupy.asarray(random_floats(rng, shape, EK.F16))
    dq = cupy.asarray(random_floats(rng, shape, EK.F16))
    s = cupy.ones((8, 1), cupy.float32)
    dx = cupy.full(shape, 7, cupy.float16)
    shared = cupy.full(n + 1, 7, cupy.float16)  # grad_output and grad_input one element apart
    odd = cupy.zeros(2 * n + 2, cupy.uint8)  # a float16 view at an odd address
    odd_view = cupy.ndarray(shape, cupy.float16, memptr=odd.data + 1)
    bad = [
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x.astype(cupy.float32), dq, dx, s)),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x, dq, dx, cupy.ones((8, 1), cupy.float64))),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x, dq, dx, cupy.ones((8, 2), cupy.float32))),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x.get(), dq, dx, s)),  # host memory
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x, dq, dx, 2.0)),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x, dq, dx, s, cupy.zeros((8, 1), cupy.int32))),
        (qp.MisalignedOperand, qp.QuantizeBackwardArgs(cupy.asfortranarray(x), dq, dx, s)),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x[:, ::2], dq, dx, s)),  # wrong shape
        (qp.MisalignedOperand, qp.QuantizeBackwardArgs(x, odd_view, dx, s)),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(x, shared[:n].reshape(shape), shared[1:].reshape(shape), s)),
        (qp.InvalidProblem, qp.QuantizeBackwardArgs(dx, dq, dx, s)),  # grad_input overlaps input
    ]
    for error, args in bad:
        with pytest.raises(error):
            plan.run(None, None, args)
    ddesc = qp.DequantizeBackwardDescriptor(
        shape=shape, scope=qp.TokenScope(), input_element=EK.S8, output_element=EK.F16
    )
    dplan = qp.DequantizeBackwardPlan.select(None, ddesc)
    dbad = [
        (qp.InvalidProblem, qp.DequantizeBackwardArgs(dq, dx.astype(cupy.float32), s)),
        (qp.InvalidProblem, qp.DequantizeBackwardArgs(dq.get(), dx, s)),
        (qp.InvalidProblem, qp.DequantizeBackwardArgs(dq, dx, s.astype(cupy.float16))),
        (qp.MisalignedOperand, qp.DequantizeBackwardArgs(odd_view, dx, s)),
        (qp.InvalidProblem, qp.DequantizeBackwardArgs(shared[1:].reshape(shape), shared[:n].reshape(shape), s)),
    ]
    for error, dargs in dbad:
        with pytest.raises(error):
            dplan.run(None, None, dargs)
    cupy.cuda.Device().synchronize()
    assert bool((dx == 7).all()) and bool((shared == 7).all())


def test_zero_size_and_rank_zero() -> None:
    import cupy

    desc = qp.QuantizeBackwardDescriptor(
        shape=(0, 16), scope=qp.TokenScope(), input_element=EK.F16, output_element=EK.S8
    )
    empty = cupy.zeros((0, 16), cupy.float16)
    qp.QuantizeBackwardPlan.select(None, desc).run(
        None, None, qp.QuantizeBackwardArgs(empty, empty, empty, cupy.zeros((0, 1), cupy.float32))
    )
    scalar = qp.QuantizeBackwardDescriptor(shape=(), scope=qp.TensorScope(), input_element=EK.F32, output_element=EK.S8)
    dx = cupy.zeros((), cupy.float32)
    qp.QuantizeBackwardPlan.select(None, scalar).run(
        None, None, qp.QuantizeBackwardArgs(cupy.asarray(2.6, cupy.float32), cupy.asarray(3.0, cupy.float32), dx, 0.5)
    )
    assert float(dx.get()) == 6.0
    dscalar = qp.DequantizeBackwardDescriptor(
        shape=(), scope=qp.TensorScope(), input_element=EK.S8, output_element=EK.F32
    )
    dq = cupy.zeros((), cupy.float32)
    qp.DequantizeBackwardPlan.select(None, dscalar).run(
        None, None, qp.DequantizeBackwardArgs(cupy.asarray(3.0, cupy.float32), dq, 0.5)
    )
    assert float(dq.get()) == 1.5
