"""GPU: the block-scaled plans and one-liners equal the reference backend bit for bit.

* ``BlockScaledQuantizePlan`` on CUDA (MX 1x32 and FP8 1x128 blocks along the last axis, every
  element, scale rule, amax floor and scale layout; float16, bfloat16 and float32 inputs; ragged
  shapes with partial blocks, N-D inputs, misaligned operands for the general schedule, blocks with
  NaN / Inf / zeros) writes the bytes the same plan writes on the REFERENCE backend, through the
  checked ``run``, its fast path (repeated calls) and ``check=False``;
* ``select`` on CUDA refuses what has no kernel yet (NVFP4, 2-D tiles, other axes, stochastic);
* ``qp.quantize(x, "mxfp8" | ...)`` on CuPy arrays and PyTorch CUDA tensors equals the NumPy
  one-liner (kernel or, for NVFP4 / 2-D tiles, the reference on a host copy), and dequantizes.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import to_device

import quantplan as qp
from quantplan.types import ElementKind as EK

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

REF = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)
CUDA = qp.PlanPreference(backend=qp.BackendKind.CUDA)
DTYPES = {EK.F16: np.float16, EK.BF16: ml_dtypes.bfloat16, EK.F32: np.float32}
MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8"]
FP8 = ["fp8_block_e4m3", "fp8_block_e5m2", "fp8_block_e4m3_ue8m0", "fp8_block_e5m2_ue8m0"]
MX_SHAPES = [(4, 64), (3, 100), (2, 5, 96), (1, 31), (37, 288), (130, 33), (257, 64)]
FP8_SHAPES = [(4, 256), (3, 300), (2, 3, 128), (33, 129), (5, 1000)]


def _data(rng: np.random.Generator, shape: tuple[int, ...], kind: EK, block: int) -> np.ndarray:
    """Blocks spanning many decades, and in the first rows a NaN, an Inf, an all-zero block, tiny values."""
    x = rng.standard_normal(shape)
    flat = x.reshape(-1, shape[-1])
    nb = -(-shape[-1] // block)
    lo, hi = (-14, 14) if kind is EK.F16 else (-100, 100)
    flat *= np.repeat(np.exp2(rng.integers(lo, hi, size=(flat.shape[0], nb)).astype(np.float64)), block, axis=1)[
        :, : shape[-1]
    ]
    if flat.shape[1] > 3:
        flat[0, 1] = np.nan
        if flat.shape[0] > 1:
            flat[1, 2] = -np.inf
        if flat.shape[0] > 2:
            flat[2, :block] = 0.0
        if flat.shape[0] > 3:
            flat[3, :block] *= 2.0**-130 if kind is EK.F32 else 2.0**-20
    with np.errstate(over="ignore"):
        return flat.reshape(shape).astype(DTYPES[kind])


def _outputs(d: Any, device: bool) -> dict[str, Any]:
    out = dict(codes=np.full(d.codes_shape, 0x4D, np.uint8), scales=np.full(d.scales_shape, 0x4D, d.scales_dtype))
    if device:
        return {k: cupy.asarray(v) for k, v in out.items()}
    return out


def _both(d: Any, x: np.ndarray, misaligned: bool = False) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(reference outputs, CUDA outputs, CUDA plan) of descriptor ``d`` on ``x``."""
    ref_out = _outputs(d, False)
    qp.BlockScaledQuantizePlan.select(None, d, REF).run(None, None, qp.BlockScaledQuantizeArgs(x, **ref_out))
    plan = qp.BlockScaledQuantizePlan.select(None, d, CUDA)
    xd = to_device(x)
    if misaligned:  # one element into a larger buffer: not 16-byte aligned (the general schedule)
        big = cupy.empty(xd.size + 1, xd.dtype)
        big[1:] = xd.reshape(-1)
        xd = big[1:].reshape(xd.shape)
    out = _outputs(d, True)
    plan.run(None, None, qp.BlockScaledQuantizeArgs(xd, **out))
    cupy.cuda.get_current_stream().synchronize()
    return ref_out, {k: v.get() for k, v in out.items()}, plan


def _assert_same(ref: dict[str, Any], got: dict[str, Any], what: str) -> None:
    for k in ref:
        np.testing.assert_array_equal(got[k].view(np.uint8), ref[k].view(np.uint8), err_msg=f"{k}: {what}")


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_mx_plan_equals_reference(rng: np.random.Generator, kind: EK, fmt: str, mode: str) -> None:
    for i, shape in enumerate(MX_SHAPES):
        layout = ("compact", "blocked", "column_major", "packed_ue8m0")[i % 4]
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format=fmt, input_element=kind, scale_mode=mode, scale_layout=layout
        )
        x = _data(rng, shape, kind, 32)
        ref, got, _ = _both(d, x, misaligned=i == 1)
        _assert_same(ref, got, f"{fmt} {mode} {shape} {layout}")


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("amax_floor", [0.0, 1e-10, 1e-4])
def test_fp8_block_plan_equals_reference(rng: np.random.Generator, kind: EK, fmt: str, amax_floor: float) -> None:
    ue8m0 = fmt.endswith("ue8m0")
    layouts = ("compact", "blocked", "column_major", "packed_ue8m0") if ue8m0 else ("compact", "column_major")
    for mode in ("rceil",) if ue8m0 else ("div", "mul_rcp", "enc"):
        for i, shape in enumerate(FP8_SHAPES):
            layout = layouts[i % len(layouts)]
            d = qp.BlockScaledQuantizeDescriptor(
                shape=shape, format=fmt, input_element=kind, scale_mode=None if ue8m0 else mode,
                amax_floor=amax_floor, scale_layout=layout,
            )  # fmt: skip
            x = _data(rng, shape, kind, 128)
            ref, got, _ = _both(d, x, misaligned=i == 0)
            _assert_same(ref, got, f"{fmt} {mode} {amax_floor} {shape} {layout}")


@pytest.mark.parametrize("layout", ["compact", "blocked", "column_major", "packed_ue8m0"])
def test_every_layout_on_a_large_ragged_matrix(rng: np.random.Generator, layout: str) -> None:
    for fmt, shape in [("mxfp8_e4m3", (1000, 4128)), ("mxfp4", (129, 8192)), ("fp8_block_e4m3_ue8m0", (300, 7000))]:
        d = qp.BlockScaledQuantizeDescriptor(shape=shape, format=fmt, input_element=EK.BF16, scale_layout=layout)
        x = _data(rng, shape, EK.BF16, d._problem().block[1])
        ref, got, plan = _both(d, x)
        _assert_same(ref, got, f"{fmt} {shape} {layout} {plan.sku().variant}")


def test_fast_path_and_unchecked_runs_write_the_same_bytes(rng: np.random.Generator) -> None:
    shape = (64, 4096)
    d = qp.BlockScaledQuantizeDescriptor(
        shape=shape, format="mxfp8_e4m3", input_element=EK.BF16, scale_layout="blocked"
    )
    x = _data(rng, shape, EK.BF16, 32)
    ref, _, plan = _both(d, x)
    xd = to_device(x)
    for check in (True, True, True, False, False):
        out = _outputs(d, True)
        plan.run(None, None, qp.BlockScaledQuantizeArgs(xd, **out), check=check)
        cupy.cuda.get_current_stream().synchronize()
        _assert_same(ref, {k: v.get() for k, v in out.items()}, f"check={check}")
    assert any(f for mode in plan._fast for f in mode)


def test_empty_problem_launches_nothing() -> None:
    d = qp.BlockScaledQuantizeDescriptor(shape=(0, 64), format="mxfp8_e4m3", input_element=EK.F32)
    plan = qp.BlockScaledQuantizePlan.select(None, d, CUDA)
    plan.run(None, None, qp.BlockScaledQuantizeArgs(cupy.zeros((0, 64), cupy.float32), **_outputs(d, True)))


@pytest.mark.parametrize(
    "change",
    [dict(format="nvfp4"), dict(block=(32, 32)), dict(axis=0), dict(rounding=qp.Rounding.STOCHASTIC)],
    ids=["nvfp4", "tile", "axis0", "stochastic"],
)
def test_cuda_refuses_what_has_no_kernel_yet(change: dict[str, Any]) -> None:
    fields: dict[str, Any] = {**dict(shape=(64, 64), format="mxfp8_e4m3", input_element=EK.F32), **change}
    with pytest.raises(qp.Unsupported, match="REFERENCE"):
        qp.BlockScaledQuantizePlan.select(None, qp.BlockScaledQuantizeDescriptor(**fields), CUDA)


ONE_LINERS: list[tuple[str, dict[str, Any]]] = [
    ("mxfp8", {}),
    ("mxfp8_e5m2", dict(layout="blocked")),
    ("mxfp6_e2m3", dict(scale_mode="floor")),
    ("mxfp4", dict(layout="blocked")),
    ("mxint8", {}),
    ("fp8_block", dict(layout="column_major")),
    ("fp8_block", dict(scale_format="ue8m0", layout="packed_ue8m0", amax_floor=1e-4)),
    ("nvfp4", {}),  # the reference on a host copy until the NVFP4 kernel lands
    ("fp8_block", dict(block=(128, 128))),  # likewise
]


@pytest.mark.parametrize("library", ["cupy", "torch"])
@pytest.mark.parametrize("name,opts", ONE_LINERS, ids=[f"{n}-{o}" for n, o in ONE_LINERS])
def test_one_liners_on_device_equal_numpy(rng: np.random.Generator, library: str, name: str, opts: dict) -> None:
    x = _data(rng, (37, 1000), EK.BF16, 128)
    want = qp.quantize(x, name, **opts)
    if library == "cupy":
        xd: Any = to_device(x)
    else:
        torch = pytest.importorskip("torch")
        xd = torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
    qt = qp.quantize(xd, name, **opts)
    served = name != "nvfp4" and opts.get("block", (1, 128))[0] == 1
    assert qt.backend is (qp.BackendKind.CUDA if served else qp.BackendKind.REFERENCE)

    def host(a: Any) -> np.ndarray:
        if library == "cupy":
            return a.get().view(np.uint8)
        import torch

        return a.view(torch.uint8).cpu().numpy() if a.element_size() == 1 else a.cpu().numpy().view(np.uint8)

    np.testing.assert_array_equal(host(qt.codes), np.asarray(want.codes).view(np.uint8))
    np.testing.assert_array_equal(host(qt.scales).reshape(-1), np.asarray(want.scales).view(np.uint8).reshape(-1))
    if want.tensor_scale is not None:
        np.testing.assert_array_equal(host(qt.tensor_scale), want.tensor_scale.view(np.uint8))
    again = qp.quantize(xd, name, **opts)  # a replay where the call has one (no options, CUDA kernel)
    assert type(again.codes) is type(qt.codes) and again.codes.dtype == qt.codes.dtype
    np.testing.assert_array_equal(host(again.codes), host(qt.codes))
    np.testing.assert_array_equal(host(again.scales), host(qt.scales))
    y = qt.dequantize("float32")
    y_host = y.get() if library == "cupy" else y.cpu().numpy()
    np.testing.assert_array_equal(y_host.view(np.uint32), want.dequantize("float32").view(np.uint32))
