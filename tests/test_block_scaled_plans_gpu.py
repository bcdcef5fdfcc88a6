"""GPU: the block-scaled plans and one-liners equal the reference backend bit for bit.

* ``BlockScaledQuantizePlan`` on CUDA (MX 1x32 and FP8 1x128 blocks along the last axis, every
  element, scale rule, amax floor and scale layout; float16, bfloat16 and float32 inputs; ragged
  shapes with partial blocks, N-D inputs, misaligned operands for the general schedule, blocks with
  NaN / Inf / zeros) writes the bytes the same plan writes on the REFERENCE backend, through the
  checked ``run``, its fast path (repeated calls) and ``check=False``;
* NVFP4 1x16 (``te``; every input dtype and scale layout; the tensor amax computed, a number, a
  device array, or one level), MXFP8 32x32 and FP8 128x128 tiles (every rule, floor and layout
  their kernel writes), the fused columnwise copy (MXFP8 ``transposed`` / ``te_mxfp8``, FP8 1x128
  with 128x1 columnwise, every layout the kernel writes) and the dequantize kernel (every format it
  reads, every output dtype) write on CUDA the bytes of the REFERENCE plan: ragged shapes
  (partial blocks and tiles on both axes, odd FP4 rows), N-D inputs, misaligned operands (the
  general twins), NaN / Inf / all-zero blocks; CuPy arrays and PyTorch CUDA tensors;
* NVFP4 with stochastic rounding (``nv_e2m1_sr``) on CUDA equals the REFERENCE plan bit for bit:
  every input dtype, the tensor amax computed / a number / a device array / one level, seeds and
  offsets up to 2**64 - 1 as integers or device int64 arrays (CuPy and PyTorch), ragged shapes;
* S_dec in ``tensor_scale`` is written by the quantize kernel and equals the reference's bit for
  bit for every amax source (0, subnormal, huge, +Inf, NaN-holding inputs), and ``run`` of every
  NVFP4 amax source is captured in a CUDA graph (CuPy and PyTorch) whose replays read a new amax /
  seed / offset / input from device memory and give the reference's bytes;
* ``select`` on CUDA refuses what has no kernel (NVFP4 ``torchao`` and 16x16, other axes, MX stochastic);
* ``qp.quantize(x, "mxfp8" | ...)`` on CuPy arrays and PyTorch CUDA tensors equals the NumPy
  one-liner (kernel or, for what has none, the reference on a host copy), and dequantizes.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from helpers import to_device

import quantplan as qp
from quantplan.vocabulary.types import ElementKind as EK

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
    if d.tensor_scale_shape is not None:
        out["tensor_scale"] = np.full(d.tensor_scale_shape, -7.0, np.float32)
    if d.columnwise is not None:
        out["columnwise_codes"] = np.full(d.columnwise_codes_shape, 0x4D, np.uint8)
        out["columnwise_scales"] = np.full(d.columnwise_scales_shape, 0x4D, d.scales_dtype)
    if device:
        return {k: cupy.asarray(v) for k, v in out.items()}
    return out


def _misaligned(a: Any) -> Any:
    """The same values one element into a larger buffer: not 16-byte aligned (the general twins)."""
    big = cupy.empty(a.size + 1, a.dtype)
    big[1:] = a.reshape(-1)
    return big[1:].reshape(a.shape)


def _both(
    d: Any, x: np.ndarray, misaligned: bool = False, global_amax: Any = None, seed: Any = None, offset: Any = None
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(reference outputs, CUDA outputs, CUDA plan) of descriptor ``d`` on ``x`` (NVFP4:
    ``global_amax`` None, a number, or a NumPy one-element float32 array sent to the device;
    stochastic rounding: ``seed`` / ``offset`` integers, or NumPy one-element int64 arrays sent to
    the device while the reference takes their value)."""
    ref_out = _outputs(d, False)
    ref_rng = {
        k: int(v[0]) if isinstance(v, np.ndarray) else v for k, v in (("rng_seed", seed), ("rng_offset", offset))
    }
    qp.BlockScaledQuantizePlan.select(None, d, REF).run(
        None, None, qp.BlockScaledQuantizeArgs(x, **ref_out, global_amax=global_amax, **ref_rng)
    )
    plan = qp.BlockScaledQuantizePlan.select(None, d, CUDA)
    xd = to_device(x)
    out = _outputs(d, True)
    if misaligned:
        xd = _misaligned(xd)
        for name in ("codes", "columnwise_codes"):
            if name in out:
                out[name] = _misaligned(out[name])
    amax = cupy.asarray(global_amax) if isinstance(global_amax, np.ndarray) else global_amax
    rng = {
        k: cupy.asarray(v) if isinstance(v, np.ndarray) else v for k, v in (("rng_seed", seed), ("rng_offset", offset))
    }
    workspace = qp.Workspace.allocate(plan.workspace_size())
    plan.run(None, workspace, qp.BlockScaledQuantizeArgs(xd, **out, global_amax=amax, **rng))
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
    [
        dict(format="nvfp4", scale_mode="torchao"),
        dict(format="nvfp4", block=(16, 16)),
        dict(axis=0),
        dict(rounding=qp.Rounding.STOCHASTIC),
    ],
    ids=["nvfp4_torchao", "nvfp4_tile", "axis0", "stochastic"],
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
    ("nvfp4", {}),
    ("nvfp4", dict(layout="blocked", global_amax=5.0)),
    ("fp8_block", dict(block=(128, 128))),
    ("mxfp8", dict(block=(32, 32), layout="blocked")),
    ("nvfp4", dict(block=(16, 16))),  # no kernel: the reference on a host copy
    ("nvfp4", dict(rounding=qp.Rounding.STOCHASTIC, seed=12345, offset=2**33 + 1)),
    ("nvfp4", dict(rounding=qp.Rounding.STOCHASTIC, seed=2**64 - 1, offset=3, global_amax=2.5, layout="blocked")),
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
    served = not (name == "nvfp4" and opts.get("block") == (16, 16))
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


@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_one_liner_options_are_not_replays_of_the_plain_call(rng: np.random.Generator, library: str) -> None:
    """The plain ``qp.quantize(x, "mxfp8")`` is remembered as a replay (x's signature and the name);
    the same x and name with block-scaled options, called after it, run their own problem (the
    replay's key holds no options): each equals the NumPy one-liner, whatever ran before."""
    x = _data(rng, (37, 1000), EK.BF16, 128)
    if library == "cupy":
        xd: Any = to_device(x)
    else:
        torch = pytest.importorskip("torch")
        xd = torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
    qp.clear_plan_cache()
    for opts in ({}, {}, dict(block=(32, 32), layout="blocked"), dict(layout="blocked"), dict(scale_mode="floor")):
        want = qp.quantize(x, "mxfp8", **opts)
        qt = qp.quantize(xd, "mxfp8", **opts)
        assert (qt.block, qt.layout) == (want.block, want.layout), opts
        codes = qt.codes.get() if library == "cupy" else qt.codes.view(torch.uint8).cpu().numpy()
        scales = qt.scales.get() if library == "cupy" else qt.scales.view(torch.uint8).cpu().numpy()
        np.testing.assert_array_equal(codes.view(np.uint8), np.asarray(want.codes).view(np.uint8), err_msg=str(opts))
        np.testing.assert_array_equal(scales.view(np.uint8), np.asarray(want.scales).view(np.uint8), err_msg=str(opts))


# ---- NVFP4, 2-D tiles, the fused transpose, dequantize ------------------------------------------

NVFP4_SHAPES = [(4, 64), (3, 33), (2, 5, 48), (1, 15), (37, 272), (130, 17), (257, 160)]


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("amax", ["computed", "number", "device", "one_level"])
def test_nvfp4_plan_equals_reference(rng: np.random.Generator, kind: EK, amax: str) -> None:
    for i, shape in enumerate(NVFP4_SHAPES):
        layout = ("compact", "blocked", "column_major")[i % 3]
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format="nvfp4", input_element=kind, scale_layout=layout, two_level=amax != "one_level"
        )
        x = _data(rng, shape, kind, 16)
        given: Any = None
        if amax == "number":
            given = float(rng.choice([0.0, 1e-3, 3.0, 6e4, np.inf]))
        elif amax == "device":
            given = np.asarray([abs(rng.standard_normal()) * 2.0 ** int(rng.integers(-10, 10))], np.float32)
        ref, got, plan = _both(d, x, misaligned=i == 1, global_amax=given)
        _assert_same(ref, got, f"nvfp4 {amax} {shape} {layout}")
        # Two-level plans name the amax pass (it runs unless the call gives an amax); one level never.
        assert plan.sku().variant.startswith("lanes" if amax == "one_level" else "tensor_amax+lanes")


def test_nvfp4_all_zero_nonfinite_and_empty(rng: np.random.Generator) -> None:
    for x in (np.zeros((3, 40), np.float32), np.full((2, 32), np.nan, np.float32), np.zeros((0, 16), np.float32)):
        d = qp.BlockScaledQuantizeDescriptor(shape=x.shape, format="nvfp4", input_element=EK.F32)
        ref, got, _ = _both(d, x)
        _assert_same(ref, got, f"nvfp4 special {x.shape}")


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_mx_tile_plan_equals_reference(rng: np.random.Generator, kind: EK, fmt: str, mode: str) -> None:
    # (37, 1000) both ways: the one-liner test's problem (4 column tiles, the last 232 wide; 8-wide last block).
    shapes = [(64, 256), (33, 100), (2, 40, 48), (1, 31), (130, 288), (97, 33), (37, 1000), (37, 1000), (300, 1040)]
    for i, shape in enumerate(shapes):
        layout = ("compact", "blocked")[i % 2]
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format=fmt, input_element=kind, block=(32, 32), scale_mode=mode, scale_layout=layout
        )
        ref, got, _ = _both(d, _data(rng, shape, kind, 128 if shape == (37, 1000) else 32), misaligned=i in (4, 7))
        _assert_same(ref, got, f"{fmt} 32x32 {mode} {shape} {layout}")


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("amax_floor", [0.0, 1e-10, 1e-4])
def test_fp8_tile_plan_equals_reference(rng: np.random.Generator, kind: EK, fmt: str, amax_floor: float) -> None:
    ue8m0 = fmt.endswith("ue8m0")
    for mode in ("rceil",) if ue8m0 else ("div", "mul_rcp", "enc"):
        for i, shape in enumerate([(256, 256), (130, 300), (2, 70, 129), (5, 1000), (129, 16)]):
            layout = ("compact", "column_major")[i % 2]
            d = qp.BlockScaledQuantizeDescriptor(
                shape=shape, format=fmt, input_element=kind, block=(128, 128),
                scale_mode=None if ue8m0 else mode, amax_floor=amax_floor, scale_layout=layout,
            )  # fmt: skip
            ref, got, _ = _both(d, _data(rng, shape, kind, 128), misaligned=i == 0)
            _assert_same(ref, got, f"{fmt} 128x128 {mode} {amax_floor} {shape} {layout}")


TRANSPOSE_SHAPES = [(48, 64), (300, 257), (2, 70, 33), (129, 1000), (16, 16), (1, 40)]


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize(
    "fmt,columnwise,layouts",
    [
        ("mxfp8_e4m3", "transposed", ("compact", "blocked")),
        ("mxfp8_e5m2", "transposed", ("blocked", "compact")),
        ("mxfp8_e4m3", "te_mxfp8", ("compact",)),
        ("mxfp8_e5m2", "te_mxfp8", ("compact",)),
    ],
)
@pytest.mark.parametrize("mode", ["rceil", "floor", "ceil", "even"])
def test_mx_transpose_plan_equals_reference(
    rng: np.random.Generator, kind: EK, fmt: str, columnwise: str, layouts: tuple[str, ...], mode: str
) -> None:
    for i, shape in enumerate(TRANSPOSE_SHAPES):
        layout = layouts[i % len(layouts)]
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format=fmt, input_element=kind, scale_mode=mode, scale_layout=layout, columnwise=columnwise
        )
        ref, got, _ = _both(d, _data(rng, shape, kind, 32), misaligned=i == 0)
        _assert_same(ref, got, f"{fmt} {columnwise} {mode} {shape} {layout}")


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("amax_floor", [0.0, 1e-4])
def test_fp8_transpose_plan_equals_reference(rng: np.random.Generator, kind: EK, fmt: str, amax_floor: float) -> None:
    ue8m0 = fmt.endswith("ue8m0")
    layouts = ("compact", "column_major", "packed_ue8m0") if ue8m0 else ("compact", "column_major")
    for mode in ("rceil",) if ue8m0 else ("div", "mul_rcp", "enc"):
        for i, shape in enumerate(TRANSPOSE_SHAPES):
            layout = layouts[i % len(layouts)]
            d = qp.BlockScaledQuantizeDescriptor(
                shape=shape, format=fmt, input_element=kind, scale_mode=None if ue8m0 else mode,
                amax_floor=amax_floor, scale_layout=layout, columnwise="transposed",
            )  # fmt: skip
            ref, got, _ = _both(d, _data(rng, shape, kind, 128), misaligned=i == 0)
            _assert_same(ref, got, f"{fmt} transposed {mode} {amax_floor} {shape} {layout}")


@pytest.mark.parametrize(
    "d",
    [
        dict(format="fp8_block_e4m3", block=(128, 128), scale_layout="column_major"),
        dict(format="mxfp8_e4m3", block=(32, 32), scale_layout="blocked"),
        dict(format="mxfp8_e4m3", columnwise="transposed", scale_layout="blocked"),
        dict(format="fp8_block_e4m3_ue8m0", columnwise="transposed", scale_layout="packed_ue8m0"),
        dict(format="nvfp4"),
    ],
    ids=["fp8_tile", "mx_tile", "mx_transpose", "fp8_transpose", "nvfp4"],
)
def test_new_kernels_fast_path_and_unchecked_runs(rng: np.random.Generator, d: dict[str, Any]) -> None:
    shape = (256, 512)
    desc = qp.BlockScaledQuantizeDescriptor(shape=shape, input_element=EK.BF16, **d)
    x = _data(rng, shape, EK.BF16, desc._problem().block[1])
    ref, _, plan = _both(desc, x)
    xd = to_device(x)
    workspace = qp.Workspace.allocate(plan.workspace_size())
    for check in (True, True, True, False, False):
        out = _outputs(desc, True)
        plan.run(None, workspace, qp.BlockScaledQuantizeArgs(xd, **out), check=check)
        cupy.cuda.get_current_stream().synchronize()
        _assert_same(ref, {k: v.get() for k, v in out.items()}, f"check={check}")


def test_tile_and_transpose_take_torch_cuda_tensors(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    for d in (
        dict(format="fp8_block_e4m3", block=(128, 128)),
        dict(format="mxfp8_e4m3", columnwise="te_mxfp8"),
        dict(format="nvfp4", scale_layout="blocked"),
    ):
        shape = (130, 300)
        desc = qp.BlockScaledQuantizeDescriptor(shape=shape, input_element=EK.BF16, **d)
        x = _data(rng, shape, EK.BF16, desc._problem().block[1])
        ref = _outputs(desc, False)
        qp.BlockScaledQuantizePlan.select(None, desc, REF).run(None, None, qp.BlockScaledQuantizeArgs(x, **ref))
        plan = qp.BlockScaledQuantizePlan.select(None, desc, CUDA)
        out = {k: torch.from_numpy(v).cuda() for k, v in _outputs(desc, False).items()}
        xt = torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
        ws = qp.Workspace.allocate(plan.workspace_size())
        plan.run(torch.cuda.current_stream(), ws, qp.BlockScaledQuantizeArgs(xt, **out))
        torch.cuda.synchronize()
        _assert_same(ref, {k: v.cpu().numpy() for k, v in out.items()}, f"torch {d}")


DEQUANTIZE_CASES = [
    dict(format="mxfp8_e4m3"),
    dict(format="mxfp8_e5m2", block=(32, 32)),
    dict(format="mxfp6_e2m3"),
    dict(format="mxfp6_e3m2"),
    dict(format="mxfp4"),
    dict(format="mxint8"),
    dict(format="nvfp4"),
    dict(format="nvfp4", block=(16, 16)),
    dict(format="fp8_block_e4m3"),
    dict(format="fp8_block_e5m2_ue8m0"),
]


@pytest.mark.parametrize("case", DEQUANTIZE_CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("out", list(DTYPES), ids=lambda k: k.name)
def test_dequantize_plan_equals_reference(rng: np.random.Generator, case: dict[str, Any], out: EK) -> None:
    for i, shape in enumerate([(4, 64), (3, 33), (2, 5, 100), (1, 7), (130, 257)]):
        q = qp.BlockScaledQuantizeDescriptor(shape=shape, input_element=EK.F32, **case)
        x = _data(rng, shape, EK.F32, q._problem().block[1])
        quantized = _outputs(q, False)
        qp.BlockScaledQuantizePlan.select(None, q, REF).run(None, None, qp.BlockScaledQuantizeArgs(x, **quantized))
        d = qp.BlockScaledDequantizeDescriptor(shape=shape, output_element=out, **case)
        ts = quantized.get("tensor_scale")
        want = np.full(shape, 7, DTYPES[out])
        qp.BlockScaledDequantizePlan.select(None, d, REF).run(
            None, None, qp.BlockScaledDequantizeArgs(quantized["codes"], quantized["scales"], want, ts)
        )
        plan = qp.BlockScaledDequantizePlan.select(None, d, CUDA)
        codes = to_device(quantized["codes"])
        y = to_device(np.full(shape, 7, DTYPES[out]))
        if i == 1:
            codes, y = _misaligned(codes), _misaligned(y) if out is EK.F32 else y
        args = qp.BlockScaledDequantizeArgs(
            codes, to_device(quantized["scales"]), y, None if ts is None else to_device(ts)
        )
        for check in (True, True, False):
            y[...] = 0
            plan.run(None, None, args, check=check)
            cupy.cuda.get_current_stream().synchronize()
            np.testing.assert_array_equal(
                y.get().view(np.uint8), want.view(np.uint8), err_msg=f"{case} {shape} {check}"
            )


# ---- NVFP4 stochastic rounding, S_dec from the kernel, CUDA graphs -------------------------------

SR_SHAPES = [*NVFP4_SHAPES, (64, 4096), (3, 4099)]


def _seed_offset(rng: np.random.Generator, i: int) -> tuple[Any, Any]:
    """A seed and offset: integers over the whole [0, 2**64) range, or (every third case) one-element
    int64 arrays for the device (values below 2**63)."""
    seed = int(rng.integers(0, 2**63)) * (1 + i % 2) + i % 2
    offsets = [0, 1, int(rng.integers(0, 2**32)), int(rng.integers(2**32, 2**63)), 2**64 - 1]
    offset = offsets[int(rng.integers(len(offsets)))]
    if i % 3 == 2:
        return np.array([seed % 2**63], np.int64), np.array([offset % 2**63], np.int64)
    return seed, offset


@pytest.mark.parametrize("kind", list(DTYPES), ids=lambda k: k.name)
@pytest.mark.parametrize("amax", ["computed", "number", "device", "one_level"])
def test_nvfp4_stochastic_plan_equals_reference(rng: np.random.Generator, kind: EK, amax: str) -> None:
    for i, shape in enumerate(SR_SHAPES):
        layout = ("compact", "blocked", "column_major")[i % 3]
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format="nvfp4", input_element=kind, scale_layout=layout, two_level=amax != "one_level",
            rounding=qp.Rounding.STOCHASTIC,
        )  # fmt: skip
        x = _data(rng, shape, kind, 16)
        given: Any = None
        if amax == "number":
            given = float(rng.choice([0.0, 1e-3, 3.0, 6e4, np.inf]))
        elif amax == "device":
            given = np.asarray([abs(rng.standard_normal()) * 2.0 ** int(rng.integers(-10, 10))], np.float32)
        seed, offset = _seed_offset(rng, i)
        ref, got, plan = _both(d, x, misaligned=i == 1, global_amax=given, seed=seed, offset=offset)
        _assert_same(ref, got, f"nvfp4 stochastic {amax} {shape} {layout} seed {seed} offset {offset}")
        assert "stochastic" in plan.sku().variant and plan.backend is qp.BackendKind.CUDA
    nearest = _outputs(d, False)
    qp.BlockScaledQuantizePlan.select(None, d.model_copy(update=dict(rounding=qp.Rounding.NEAREST_EVEN)), REF).run(
        None, None, qp.BlockScaledQuantizeArgs(x, **nearest, global_amax=given)
    )
    assert not np.array_equal(nearest["codes"], got["codes"])  # the stochastic codes are not the nearest ones


def test_nvfp4_stochastic_fast_path_and_unchecked_runs(rng: np.random.Generator) -> None:
    """Repeated calls (the generated fast path) and check=False with new seeds and offsets, as
    values and as device arrays whose content changes between calls."""
    shape = (256, 512)
    d = qp.BlockScaledQuantizeDescriptor(
        shape=shape, format="nvfp4", input_element=EK.BF16, rounding=qp.Rounding.STOCHASTIC
    )
    x = _data(rng, shape, EK.BF16, 16)
    plan = qp.BlockScaledQuantizePlan.select(None, d, CUDA)
    ref_plan = qp.BlockScaledQuantizePlan.select(None, d, REF)
    xd, ws = to_device(x), qp.Workspace.allocate(plan.workspace_size())
    seed_d, offset_d = cupy.zeros(1, cupy.int64), cupy.zeros(1, cupy.int64)
    amax_d = cupy.zeros(1, cupy.float32)
    for i, check in enumerate((True, True, True, False, False, True, True, False)):
        seed, offset = 1000 + i, 2**40 + 7 * i
        amax = float(2.0 ** (i - 3))
        ref = _outputs(d, False)
        ref_plan.run(
            None, None, qp.BlockScaledQuantizeArgs(x, **ref, global_amax=amax, rng_seed=seed, rng_offset=offset)
        )
        out = _outputs(d, True)
        seed_d[0], offset_d[0], amax_d[0] = seed, offset, amax
        device = i >= 5
        args = qp.BlockScaledQuantizeArgs(
            xd, **out, global_amax=amax_d if device else amax, rng_seed=seed_d if device else seed,
            rng_offset=offset_d if device else offset,
        )  # fmt: skip
        plan.run(None, ws, args, check=check)
        cupy.cuda.get_current_stream().synchronize()
        _assert_same(ref, {k: v.get() for k, v in out.items()}, f"call {i} check={check}")


def test_nvfp4_stochastic_takes_torch_tensors(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    shape = (130, 300)
    for two_level in (True, False):
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format="nvfp4", input_element=EK.BF16, rounding=qp.Rounding.STOCHASTIC, two_level=two_level,
            scale_layout="blocked",
        )  # fmt: skip
        x = _data(rng, shape, EK.BF16, 16)
        amax = np.asarray([7.5], np.float32) if two_level else None
        ref = _outputs(d, False)
        qp.BlockScaledQuantizePlan.select(None, d, REF).run(
            None, None, qp.BlockScaledQuantizeArgs(x, **ref, global_amax=amax, rng_seed=2**62 + 1, rng_offset=99)
        )
        plan = qp.BlockScaledQuantizePlan.select(None, d, CUDA)
        out = {k: torch.from_numpy(v).cuda() for k, v in _outputs(d, False).items()}
        xt = torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
        seed = torch.tensor([2**62 + 1], dtype=torch.int64, device="cuda")
        offset = torch.tensor([99], dtype=torch.int64, device="cuda")
        amax_t = None if amax is None else torch.from_numpy(amax).cuda()
        ws = qp.Workspace.allocate(plan.workspace_size())
        args = qp.BlockScaledQuantizeArgs(xt, **out, global_amax=amax_t, rng_seed=seed, rng_offset=offset)
        plan.run(torch.cuda.current_stream(), ws, args)
        torch.cuda.synchronize()
        _assert_same(ref, {k: v.cpu().numpy() for k, v in out.items()}, f"torch stochastic two_level={two_level}")


#: Tensor amaxes whose S_dec takes every branch of §3.2: 0 (S_enc = 1), subnormal (2688 / amax
#: overflows: S_enc = FLT_MAX, S_dec subnormal), tiny and ordinary normals, huge (S_enc tiny),
#: FLT_MAX, +Inf (S_enc = 0 -> 1) and a number past the f32 range (rounds to +Inf).
S_DEC_AMAXES = [0.0, 2.0**-149, 1e-40, 2.0**-126, 1e-30, 0.1, 3.0, 2688.0, 6e4, 1e30, 3.4028234663852886e38, np.inf]


@pytest.mark.parametrize("source", ["number", "device", "computed"])
def test_the_kernel_writes_the_reference_s_dec(rng: np.random.Generator, source: str) -> None:
    from quantplan.reference import block_scaled as rb

    amaxes = [*S_DEC_AMAXES, 1e39] if source == "number" else S_DEC_AMAXES
    for stochastic in (False, True):
        d = qp.BlockScaledQuantizeDescriptor(
            shape=(3, 40), format="nvfp4", input_element=EK.F32,
            rounding=qp.Rounding.STOCHASTIC if stochastic else qp.Rounding.NEAREST_EVEN,
        )  # fmt: skip
        rng_args = dict(seed=5, offset=6) if stochastic else {}
        for amax in amaxes:
            with np.errstate(over="ignore"):
                a32 = np.float32(amax)
            scale = float(a32) if np.isfinite(a32) else 1.0
            x = (rng.uniform(-1, 1, (3, 40)) * scale).astype(np.float32)  # |x| <= a32 after rounding
            x[2, 7] = np.nan  # the computed amax ignores non-finite elements
            x[0, 3] = -np.inf
            given: Any = None
            if source == "computed":
                if not np.isfinite(a32):
                    continue
                x[1, 5] = -a32  # max |x| over the finite elements is exactly a32
            else:
                given = amax if source == "number" else np.asarray([a32], np.float32)
            with np.errstate(over="ignore"):  # the reference's float32 of a number past the f32 range
                ref, got, _ = _both(d, x, global_amax=given, **rng_args)
            _assert_same(ref, got, f"{source} amax {amax} stochastic={stochastic}")
            want = rb.nvfp4_tensor_scales(a32)[1]
            assert got["tensor_scale"].view(np.uint32)[0] == np.float32(want).view(np.uint32), (source, amax)


def test_the_launcher_writes_s_dec(rng: np.random.Generator) -> None:
    from quantplan.reference import block_scaled as rb
    from quantplan.runtime._block_scaled_kernels import quantize_block_scaled

    x = (rng.standard_normal((5, 70)) * 3).astype(np.float32)
    xd = cupy.asarray(x)
    for tensor_amax, amax in (("compute", np.abs(x).max()), (None, None), (np.float32(1e-40), np.float32(1e-40))):
        out = cupy.full(1, -7.0, cupy.float32)
        given = cupy.asarray([tensor_amax]) if isinstance(tensor_amax, np.floating) else tensor_amax
        quantize_block_scaled(xd, element="nvfp4", block=16, rule="te", tensor_amax=given, s_dec_out=out)
        want = rb.nvfp4_tensor_scales(0.0 if amax is None else amax, two_level=amax is not None)[1]
        assert out.get().view(np.uint32)[0] == np.float32(want).view(np.uint32), tensor_amax
    empty = cupy.full(1, -7.0, cupy.float32)  # an empty x still launches to write S_dec
    quantize_block_scaled(
        cupy.zeros((0, 32), cupy.float32), element="nvfp4", block=16, rule="te", tensor_amax=None, s_dec_out=empty
    )
    assert float(empty.get()[0]) == 1.0


def test_nvfp4_empty_problem_writes_s_dec_on_the_device() -> None:
    for given in (None, 3.0, np.asarray([1e-40], np.float32)):
        d = qp.BlockScaledQuantizeDescriptor(shape=(0, 48), format="nvfp4", input_element=EK.BF16)
        ref, got, _ = _both(d, np.zeros((0, 48), ml_dtypes.bfloat16), global_amax=given)
        _assert_same(ref, got, f"empty amax {given}")


@pytest.mark.parametrize("source", ["device", "computed", "number"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_nvfp4_run_is_captured_in_a_cupy_graph(rng: np.random.Generator, source: str, stochastic: bool) -> None:
    """One capture of ``run``; each replay reads what is in device memory now: a new amax (device
    source), seed and offset (stochastic), input (computed and number sources)."""
    shape = (130, 272)
    d = qp.BlockScaledQuantizeDescriptor(
        shape=shape, format="nvfp4", input_element=EK.BF16, scale_layout="blocked",
        rounding=qp.Rounding.STOCHASTIC if stochastic else qp.Rounding.NEAREST_EVEN,
    )  # fmt: skip
    stream = cupy.cuda.Stream(non_blocking=True)
    plan = qp.BlockScaledQuantizePlan.select(stream, d, CUDA)
    ref_plan = qp.BlockScaledQuantizePlan.select(None, d, REF)
    ws = qp.Workspace.allocate(plan.workspace_size())
    x = _data(rng, shape, EK.BF16, 16)
    with stream:
        xd = to_device(x)
        out = _outputs(d, True)
        amax_d = cupy.asarray(np.asarray([1.0], np.float32))
        seed_d = cupy.asarray(np.asarray([17], np.int64))
        offset_d = cupy.asarray(np.asarray([0], np.int64))
    stream.synchronize()
    amax_arg: Any = {"device": amax_d, "computed": None, "number": 5.0}[source]
    rng_args = dict(rng_seed=seed_d, rng_offset=offset_d) if stochastic else {}
    args = qp.BlockScaledQuantizeArgs(xd, **out, global_amax=amax_arg, **rng_args)
    plan.run(stream, ws, args)  # warm-up: the call's signature remembered before the capture
    stream.synchronize()
    with stream:
        stream.begin_capture()
        plan.run(stream, ws, args)
        graph = stream.end_capture()
    for step, amax in enumerate((3.0, 1e-3, 0.0, 6e4)):
        x = _data(rng, shape, EK.BF16, 16) if source != "device" else x
        seed, offset = 17 + step, 2**33 * step + 1
        with stream:
            xd.set(x.view(np.uint16), stream=stream)
            amax_d.set(np.asarray([amax], np.float32), stream=stream)
            seed_d.set(np.asarray([seed], np.int64), stream=stream)
            offset_d.set(np.asarray([offset], np.int64), stream=stream)
            for v in out.values():
                v.fill(0x4D if v.dtype != cupy.float32 else -7.0)
        graph.launch(stream)
        stream.synchronize()
        ref = _outputs(d, False)
        given = {"device": np.asarray([amax], np.float32), "computed": None, "number": 5.0}[source]
        ref_rng = dict(rng_seed=seed, rng_offset=offset) if stochastic else {}
        ref_plan.run(None, None, qp.BlockScaledQuantizeArgs(x, **ref, global_amax=given, **ref_rng))
        _assert_same(ref, {k: v.get() for k, v in out.items()}, f"replay {step} {source} amax {amax}")


def test_nvfp4_run_is_captured_in_a_torch_graph(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    shape = (257, 160)
    d = qp.BlockScaledQuantizeDescriptor(
        shape=shape, format="nvfp4", input_element=EK.BF16, rounding=qp.Rounding.STOCHASTIC
    )
    plan = qp.BlockScaledQuantizePlan.select(None, d, CUDA)
    ref_plan = qp.BlockScaledQuantizePlan.select(None, d, REF)
    ws = qp.Workspace.allocate(plan.workspace_size())
    x = _data(rng, shape, EK.BF16, 16)
    xt = torch.from_numpy(x.view(np.int16).copy()).cuda().view(torch.bfloat16)
    out = {k: torch.from_numpy(v).cuda() for k, v in _outputs(d, False).items()}
    amax_t = torch.ones(1, dtype=torch.float32, device="cuda")
    seed_t = torch.tensor([4], dtype=torch.int64, device="cuda")
    offset_t = torch.tensor([5], dtype=torch.int64, device="cuda")
    args = qp.BlockScaledQuantizeArgs(xt, **out, global_amax=amax_t, rng_seed=seed_t, rng_offset=offset_t)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture
        plan.run(side, ws, args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(torch.cuda.current_stream(), ws, args)
    for amax, offset in ((2.5, 9), (1e4, 2**40), (0.0, 0)):
        amax_t.fill_(amax)
        offset_t.fill_(offset)
        graph.replay()
        torch.cuda.synchronize()
        ref = _outputs(d, False)
        ref_plan.run(
            None, None,
            qp.BlockScaledQuantizeArgs(x, **ref, global_amax=np.asarray([amax], np.float32), rng_seed=4, rng_offset=offset),
        )  # fmt: skip
        _assert_same(ref, {k: v.cpu().numpy() for k, v in out.items()}, f"torch graph amax {amax} offset {offset}")
