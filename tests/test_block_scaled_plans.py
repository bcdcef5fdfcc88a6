"""Block-scaled plans and one-liners on the reference backend (CPU).

* descriptors: every bad combination raises a QuantPlanError before anything runs, outputs untouched;
* ``BlockScaledQuantizePlan`` equals :mod:`quantplan.reference.block_scaled` byte for byte on fresh
  ragged random data, for every format, scale mode, block geometry, axis and scale layout (the
  expected layouts built here from the reference's own layout helpers);
* ``BlockScaledDequantizePlan`` equals the reference dequantization of the same codes;
* ``qp.quantize(x, "mxfp8" | ... )`` on NumPy arrays and PyTorch CPU tensors: the plan's bytes,
  torch's own dtypes, ``.dequantize()``; the affine path of ``qp.quantize`` is unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import quantplan as qp
from quantplan.ops.block_scaled import BLOCK_FORMATS, SCALE_LAYOUTS, compact_scales, layout_scales, resolve
from quantplan.reference import block_scaled as rb
from quantplan.vocabulary.types import ElementKind as EK

REF = qp.PlanPreference(backend=qp.BackendKind.REFERENCE)
DTYPES = {EK.F16: np.float16, EK.BF16: ml_dtypes.bfloat16, EK.F32: np.float32}
MX = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "mxint8"]
MX_ELEMENT = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2", "mxfp6_e2m3": "e2m3", "mxfp6_e3m2": "e3m2"}
MX_ELEMENT.update(mxfp4="e2m1", mxint8="int8")
FP8 = ["fp8_block_e4m3", "fp8_block_e5m2", "fp8_block_e4m3_ue8m0", "fp8_block_e5m2_ue8m0"]
SENTINEL = 0x4D


def _data(rng: np.random.Generator, shape: tuple[int, ...], kind: EK, specials: bool = True) -> np.ndarray:
    """Normal data whose rows span decades, with a NaN, an Inf and an all-zero stretch when room allows."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, size=shape[:-1] + (1,)))
    flat = x.reshape(-1)
    if specials and flat.size > 300:
        flat[rng.integers(flat.size)] = np.nan
        flat[rng.integers(flat.size)] = -np.inf
        start = int(rng.integers(flat.size - 40))
        flat[start : start + 40] = 0.0
    with np.errstate(over="ignore"):
        return x.astype(DTYPES[kind])


def _shape(rng: np.random.Generator, rank: int, block: int) -> tuple[int, ...]:
    """A ragged shape: the extents are not multiples of the block (partial blocks), some are small."""
    last = int(rng.integers(1, 3 * block)) | 1
    lead = [int(rng.integers(1, 7)) for _ in range(rank - 1)]
    return (*lead, last)


def _outputs(d: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(
        codes=np.full(d.codes_shape, SENTINEL, np.uint8), scales=np.full(d.scales_shape, SENTINEL, d.scales_dtype)
    )
    if d.tensor_scale_shape is not None:
        out["tensor_scale"] = np.full(d.tensor_scale_shape, 7.0, np.float32)
    return out


def _run(d: Any, x: np.ndarray, **extra: Any) -> dict[str, Any]:
    plan = qp.BlockScaledQuantizePlan.select(None, d, REF)
    out = _outputs(d)
    plan.run(None, None, qp.BlockScaledQuantizeArgs(x, **out, **extra))
    return out


def _expected_layout(compact: np.ndarray, layout: str, matrix: tuple[int, int]) -> np.ndarray:
    s = compact.reshape(matrix)
    if layout == "compact":
        return compact
    if layout == "blocked":
        return rb.to_blocked(s)
    if layout == "column_major":
        return rb.col_major_tma_aligned(s)
    return rb.deepgemm_sf_layout(s)


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 4: np.uint32}[a.dtype.itemsize])


# ---- plans equal the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("mode", rb.MX_SCALE_MODES)
def test_mx_plan_equals_reference(rng: np.random.Generator, fmt: str, mode: str) -> None:
    for trial in range(4):
        kind = list(DTYPES)[trial % 3]
        shape = _shape(rng, 1 + trial % 3, 32)
        axis = -1 if trial % 2 == 0 else int(rng.integers(len(shape)))
        layout = SCALE_LAYOUTS[trial % 4]
        x = _data(rng, shape, kind)
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format=fmt, input_element=kind, axis=axis, scale_mode=mode, scale_layout=layout
        )
        ref = rb.mx_quantize(x, MX_ELEMENT[fmt], axis=axis, scale_mode=mode)
        out = _run(d, x)
        np.testing.assert_array_equal(out["codes"], ref.codes, err_msg=f"{fmt} {mode} {shape} axis {axis}")
        ax = axis % len(shape)
        moved = np.moveaxis(ref.scales, ax, -1)
        matrix = (math.prod(moved.shape[:-1]), moved.shape[-1])
        want = _expected_layout(np.ascontiguousarray(moved) if layout != "compact" else ref.scales, layout, matrix)
        np.testing.assert_array_equal(_bits(out["scales"]).reshape(-1), _bits(want).reshape(-1), err_msg=layout)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2"])
def test_mx_tiles_32x32_equal_reference(rng: np.random.Generator, fmt: str) -> None:
    for shape in [(70, 45), (3, 33, 40), (32, 32)]:
        x = _data(rng, shape, EK.BF16)
        d = qp.BlockScaledQuantizeDescriptor(shape=shape, format=fmt, input_element=EK.BF16, block=(32, 32))
        ref = rb.mx_quantize(x, MX_ELEMENT[fmt], block_2d=True)
        out = _run(d, x)
        np.testing.assert_array_equal(out["codes"], ref.codes)
        np.testing.assert_array_equal(out["scales"], ref.scales)


@pytest.mark.parametrize("mode", rb.NVFP4_MODES)
@pytest.mark.parametrize("two_level", [True, False])
def test_nvfp4_plan_equals_reference(rng: np.random.Generator, mode: str, two_level: bool) -> None:
    for trial in range(4):
        kind = list(DTYPES)[trial % 3]
        shape = _shape(rng, 1 + trial % 3, 16)
        layout = ("compact", "blocked", "column_major")[trial % 3]
        block = (16, 16) if trial == 3 else None
        x = _data(rng, shape, kind)
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format="nvfp4", input_element=kind, scale_mode=mode, two_level=two_level,
            scale_layout=layout, block=block,
        )  # fmt: skip
        ref = rb.nvfp4_quantize(x, mode=mode, two_level=two_level, block_2d=block is not None)
        out = _run(d, x)
        np.testing.assert_array_equal(out["codes"], ref.codes)
        matrix = (math.prod(shape[:-1]), ref.scales.shape[-1])
        np.testing.assert_array_equal(
            out["scales"].reshape(-1), _expected_layout(ref.scales, layout, matrix).reshape(-1)
        )
        assert out["tensor_scale"].view(np.uint32)[0] == np.float32(ref.tensor_scale).view(np.uint32)


def test_nvfp4_given_amax_and_stochastic_equal_reference(rng: np.random.Generator) -> None:
    shape = (5, 70)
    x = _data(rng, shape, EK.F32, specials=False)
    d = qp.BlockScaledQuantizeDescriptor(shape=shape, format="nvfp4", input_element=EK.F32)
    for amax in (3.5, np.ones(1, np.float32) * 1000.0, float("inf")):
        ref = rb.nvfp4_quantize(x, global_amax=float(np.asarray(amax).reshape(-1)[0]))
        out = _run(d, x, global_amax=amax)
        np.testing.assert_array_equal(out["codes"], ref.codes)
        np.testing.assert_array_equal(out["scales"], ref.scales)
        assert out["tensor_scale"][0] == ref.tensor_scale
    ds = qp.BlockScaledQuantizeDescriptor(
        shape=shape, format="nvfp4", input_element=EK.F32, rounding=qp.Rounding.STOCHASTIC
    )
    for seed, offset in [(1, 0), (2**63 + 5, 77)]:
        ref = rb.nvfp4_quantize(x, rounding="stochastic", seed=seed, offset=offset)
        out = _run(ds, x, rng_seed=seed, rng_offset=offset)
        np.testing.assert_array_equal(out["codes"], ref.codes)
    dm = qp.BlockScaledQuantizeDescriptor(shape=shape, format="mxfp4", input_element=EK.F32, rounding="stochastic")
    ref = rb.mx_quantize(x, "e2m1", rounding="stochastic", seed=9, offset=3)
    out = _run(dm, x, rng_seed=np.array([9], np.int64), rng_offset=3)
    np.testing.assert_array_equal(out["codes"], ref.codes)


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
def test_fp8_block_plan_equals_reference(rng: np.random.Generator, fmt: str, block: tuple[int, int]) -> None:
    ue8m0 = fmt.endswith("ue8m0")
    modes = ("rceil",) if ue8m0 else rb.FP8_ELEM_OPS
    layouts = ("compact", "blocked", "column_major", "packed_ue8m0") if ue8m0 else ("compact", "column_major")
    element = "e5m2" if "e5m2" in fmt else "e4m3"
    for trial, (mode, floor) in enumerate((m, f) for m in modes for f in (0.0, 1e-10, 1e-4)):
        kind = list(DTYPES)[trial % 3]
        shape = (int(rng.integers(1, 300)), int(rng.integers(1, 400))) if trial % 2 else _shape(rng, 3, 128)
        layout = layouts[trial % len(layouts)]
        x = _data(rng, shape, kind)
        d = qp.BlockScaledQuantizeDescriptor(
            shape=shape, format=fmt, input_element=kind, block=block, scale_mode=None if ue8m0 else mode,
            amax_floor=floor, scale_layout=layout,
        )  # fmt: skip
        ref = rb.fp8_block_quantize(
            x, block=block, element=element, scale_format="ue8m0" if ue8m0 else "f32",
            elem_op="div" if ue8m0 else mode, amax_floor=floor,
        )  # fmt: skip
        out = _run(d, x)
        np.testing.assert_array_equal(out["codes"], ref.codes, err_msg=f"{fmt} {mode} {floor} {shape}")
        want = _expected_layout(ref.scales, layout, ref.scales.shape)
        np.testing.assert_array_equal(_bits(out["scales"]).reshape(-1), _bits(want).reshape(-1), err_msg=layout)


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_dequantize_plan_equals_reference(rng: np.random.Generator, fmt: str) -> None:
    for layout in SCALE_LAYOUTS:
        shape = _shape(rng, 2, 64)
        try:
            resolve(shape, fmt, EK.F32, None, -1, layout)
        except qp.QuantPlanError:
            continue  # a layout this format does not take (checked in the validation tests)
        x = _data(rng, shape, EK.F32)
        d = qp.BlockScaledQuantizeDescriptor(shape=shape, format=fmt, input_element=EK.F32, scale_layout=layout)
        out = _run(d, x)
        compact = compact_scales(d._problem(), out["scales"])
        for out_kind in (EK.F32, EK.F16, EK.BF16):
            dd = qp.BlockScaledDequantizeDescriptor(
                shape=shape, format=fmt, scale_layout=layout, output_element=out_kind
            )
            plan = qp.BlockScaledDequantizePlan.select(None, dd, REF)
            y = np.full(shape, 3.0, DTYPES[out_kind])
            plan.run(None, None, qp.BlockScaledDequantizeArgs(out["codes"], out["scales"], y, out.get("tensor_scale")))
            if fmt.startswith("mx"):
                q: Any = rb.MXQuantized(out["codes"], compact, MX_ELEMENT[fmt], 1, shape, "rceil")
                want = rb.mx_dequantize(q, DTYPES[out_kind])
            elif fmt == "nvfp4":
                q = rb.NVFP4Quantized(out["codes"], compact, out["tensor_scale"][0], np.float32(0), shape, "te", True)
                want = rb.nvfp4_dequantize(q, DTYPES[out_kind])
            else:
                ue8m0 = fmt.endswith("ue8m0")
                element = "e5m2" if "e5m2" in fmt else "e4m3"
                q = rb.FP8BlockQuantized(
                    out["codes"], compact, element, (1, 128), "ue8m0" if ue8m0 else "f32", "div", shape
                )
                want = rb.fp8_block_dequantize(q, DTYPES[out_kind])
            np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8), err_msg=f"{fmt} {layout} {out_kind}")


@pytest.mark.parametrize("layout", SCALE_LAYOUTS)
def test_layouts_invert(rng: np.random.Generator, layout: str) -> None:
    for fmt, shape, axis in [
        ("mxfp8_e4m3", (3, 5, 70), 1),
        ("fp8_block_e4m3_ue8m0", (300, 1000), -1),
        ("nvfp4", (9, 50), -1),
    ]:
        try:
            p = resolve(shape, fmt, EK.F32, None, axis, layout)
        except qp.QuantPlanError:
            continue
        compact = rng.integers(0, 255, size=p.compact_shape).astype(np.uint8)
        buf = layout_scales(p, compact)
        assert buf.shape == p.scales_shape
        np.testing.assert_array_equal(compact_scales(p, buf), compact)


def test_empty_problems_run() -> None:
    for fmt, shape in [("mxfp8_e4m3", (0, 64)), ("mxfp4", (5, 0)), ("fp8_block_e4m3", (0, 3)), ("nvfp4", (0, 16))]:
        d = qp.BlockScaledQuantizeDescriptor(shape=shape, format=fmt, input_element=EK.F32)
        out = _run(d, np.zeros(shape, np.float32))
        assert out["codes"].size == 0 and out["scales"].size == 0
        if fmt == "nvfp4":
            assert out["tensor_scale"][0] == 1.0


def test_sku_and_introspection() -> None:
    d = qp.BlockScaledQuantizeDescriptor(shape=(4, 64), format="mxfp4", input_element=EK.BF16)
    plan = qp.BlockScaledQuantizePlan.select(None, d, REF)
    sku = plan.sku()
    assert (sku.element, sku.aux_element, sku.backend, sku.variant) == (
        EK.BF16,
        EK.FP4_E2M1,
        qp.BackendKind.REFERENCE,
        "numpy",
    )
    assert plan.workspace_size() == 0 and plan.precision_guarantee().matches_reference
    assert d.codes_shape == (4, 32) and d.scales_shape == (4, 2) and d.format_spec.name == "mxfp4"
    blocked = d.model_copy(update={"scale_layout": "blocked"})
    assert blocked.scales_shape == (512,) and blocked.compact_scales_shape == (4, 2)
    w = qp.BlockScaledQuantizeDescriptor(
        shape=(300, 1000), format="fp8_block_e4m3", input_element=EK.F32, block=(128, 128)
    )
    assert w.scales_shape == (3, 8) and w.scales_dtype == np.float32
    assert w.model_copy(update={"scale_layout": "column_major"}).scales_shape == (8, 4)
    packed = qp.BlockScaledQuantizeDescriptor(
        shape=(7, 1000), format="fp8_block_e4m3_ue8m0", input_element=EK.F32, scale_layout="packed_ue8m0"
    )
    assert packed.scales_shape == (2, 8) and packed.scales_dtype == np.int32


# ---- validation ----------------------------------------------------------------------------------

BAD_DESCRIPTORS: list[tuple[dict[str, Any], type[qp.QuantPlanError], str]] = [
    (dict(format="mxfp3"), qp.InvalidProblem, "mxfp3"),
    (dict(format="e4m3"), qp.InvalidProblem, "block-scaled"),
    (dict(input_element=EK.F64), qp.InvalidProblem, "F64"),
    (dict(input_element=EK.FP8_E4M3), qp.InvalidProblem, "input_element"),
    (dict(shape=()), qp.InvalidProblem, "dimension"),
    (dict(block=(32, 32), format="mxfp6_e2m3"), qp.InvalidProblem, "block"),
    (dict(block=(16, 16)), qp.InvalidProblem, "block"),
    (dict(block=(1, 128), format="nvfp4"), qp.InvalidProblem, "block"),
    (dict(block=(128, 1), format="fp8_block_e4m3"), qp.InvalidProblem, "block"),
    (dict(axis=-3), qp.InvalidProblem, "axis"),
    (dict(axis=0, format="nvfp4"), qp.Unsupported, "last axis"),
    (dict(scale_mode="te"), qp.InvalidProblem, "rceil"),
    (dict(scale_mode="enc", format="fp8_block_e5m2_ue8m0"), qp.InvalidProblem, "rceil"),
    (dict(scale_mode="rceil", format="nvfp4"), qp.InvalidProblem, "torchao"),
    (dict(amax_floor=1e-4, format="nvfp4"), qp.InvalidProblem, "FP8"),
    (dict(amax_floor=float("nan"), format="fp8_block_e4m3"), qp.InvalidProblem, "amax_floor"),
    (dict(amax_floor=1e39, format="fp8_block_e4m3"), qp.InvalidProblem, "float32"),
    (dict(two_level=False, format="fp8_block_e4m3"), qp.InvalidProblem, "NVFP4"),
    (dict(rounding=qp.Rounding.STOCHASTIC, format="fp8_block_e4m3_ue8m0"), qp.Unsupported, "nearest"),
    (dict(scale_layout="row_major"), qp.InvalidProblem, "compact"),
    (dict(scale_layout="blocked", format="fp8_block_e5m2"), qp.InvalidProblem, "byte"),
    (dict(scale_layout="packed_ue8m0", format="fp8_block_e4m3"), qp.InvalidProblem, "E8M0"),
]


@pytest.mark.parametrize("change,error,fragment", BAD_DESCRIPTORS, ids=[str(c[0]) for c in BAD_DESCRIPTORS])
def test_bad_descriptor_raises_before_anything_runs(change: dict[str, Any], error: type, fragment: str) -> None:
    fields: dict[str, Any] = {**dict(shape=(4, 70), format="mxfp8_e4m3", input_element=EK.F32), **change}
    with pytest.raises(error, match=fragment):
        qp.BlockScaledQuantizePlan.select(None, qp.BlockScaledQuantizeDescriptor(**fields), REF)


def test_bad_arguments_leave_outputs_untouched(rng: np.random.Generator) -> None:
    d = qp.BlockScaledQuantizeDescriptor(shape=(4, 70), format="nvfp4", input_element=EK.F32)
    plan = qp.BlockScaledQuantizePlan.select(None, d, REF)
    x = _data(rng, (4, 70), EK.F32)
    mistakes: list[tuple[dict[str, Any], str]] = [
        (dict(scales=np.zeros((4, 5), np.float32)), "scales"),
        (dict(codes=np.zeros((4, 70), np.uint8)), "codes"),
        (dict(tensor_scale=None), "tensor_scale"),
        (dict(global_amax=-2.0), "global_amax"),
        (dict(global_amax=np.ones(1, np.float64)), "global_amax"),
        (dict(rng_seed=1, rng_offset=0), "rng_seed"),
        (dict(input=x.astype(np.float64)), "input"),
    ]
    for change, fragment in mistakes:
        out = _outputs(d)
        before = {k: v.copy() for k, v in out.items()}
        fields = {"input": x, **out, **change}
        with pytest.raises(qp.QuantPlanError, match=fragment):
            plan.run(None, None, qp.BlockScaledQuantizeArgs(**fields))
        for k, v in before.items():
            np.testing.assert_array_equal(out[k], v, err_msg=f"{change}: {k} written")


# ---- one-liners ----------------------------------------------------------------------------------

ONE_LINERS: list[tuple[str, dict[str, Any]]] = [
    ("mxfp8", {}),
    ("mxfp8_e5m2", dict(scale_mode="floor")),
    ("mxfp6_e2m3", dict(layout="blocked")),
    ("mxfp6_e3m2", dict(axis=0)),
    ("mxfp4", dict(layout="column_major")),
    ("mxint8", dict(scale_mode="even")),
    ("nvfp4", {}),
    ("nvfp4", dict(scale_mode="torchao", global_amax=40.0, layout="blocked")),
    ("fp8_block", {}),
    ("fp8_block", dict(block=(128, 128), scale_format="ue8m0", layout="packed_ue8m0")),
    ("fp8_block_e5m2", dict(scale_mode="enc", amax_floor=1e-4, layout="column_major")),
]


def _reference_of(name: str, opts: dict[str, Any], x: np.ndarray) -> tuple[Any, np.ndarray]:
    """(codes, compact scales) the reference gives for the one-liner ``name`` with ``opts``."""
    if name.startswith("mx"):
        element = MX_ELEMENT["mxfp8_e4m3" if name == "mxfp8" else name]
        q = rb.mx_quantize(x, element, axis=opts.get("axis", -1), scale_mode=opts.get("scale_mode", "rceil"))
        return q.codes, q.scales
    if name == "nvfp4":
        q2 = rb.nvfp4_quantize(x, mode=opts.get("scale_mode", "te"), global_amax=opts.get("global_amax"))
        return q2.codes, q2.scales
    q3 = rb.fp8_block_quantize(
        x,
        block=opts.get("block", (1, 128)),
        element="e5m2" if "e5m2" in name else "e4m3",
        scale_format=opts.get("scale_format", "f32"),
        elem_op=opts.get("scale_mode", "div"),
        amax_floor=opts.get("amax_floor", 0.0),
    )
    return q3.codes, q3.scales


@pytest.mark.parametrize("name,opts", ONE_LINERS, ids=[f"{n}-{o}" for n, o in ONE_LINERS])
def test_one_liner_numpy(rng: np.random.Generator, name: str, opts: dict[str, Any]) -> None:
    kind = EK.BF16 if name.startswith("mx") else EK.F32
    x = _data(rng, (37, 300), kind)
    qt = qp.quantize(x, name, **opts)
    assert isinstance(qt, qp.BlockQuantizedTensor) and qt.backend is qp.BackendKind.REFERENCE
    codes, scales = _reference_of(name, opts, x)
    np.testing.assert_array_equal(np.asarray(qt.codes).view(np.uint8), codes)
    np.testing.assert_array_equal(_bits(qt.compact_scales()), _bits(scales))
    assert qt.layout == opts.get("layout", "compact") and qt.shape == x.shape
    if name in ("mxfp8", "fp8_block"):
        assert qt.codes.dtype == ml_dtypes.float8_e4m3fn
    y = qt.dequantize()
    assert y.dtype == x.dtype and y.shape == x.shape
    y32 = qp.dequantize(qt, "float32")
    dd = qp.BlockScaledDequantizeDescriptor(
        shape=x.shape, format=qt.format, block=qt.descriptor.block, axis=qt.descriptor.axis, scale_layout=qt.layout
    )
    want = np.empty(x.shape, np.float32)
    qp.BlockScaledDequantizePlan.select(None, dd, REF).run(
        None, None, qp.BlockScaledDequantizeArgs(np.asarray(qt.codes).view(np.uint8), qt.scales, want, qt.tensor_scale)
    )
    np.testing.assert_array_equal(y32.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(y.view(np.uint16), want.astype(x.dtype).view(np.uint16))


@pytest.mark.parametrize("name,opts", ONE_LINERS, ids=[f"{n}-{o}" for n, o in ONE_LINERS])
def test_one_liner_torch_cpu(rng: np.random.Generator, name: str, opts: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    x = _data(rng, (9, 200), EK.BF16)
    t = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    qt = qp.quantize(t, name, **opts)
    codes, scales = _reference_of(name, opts, x)
    expect_codes = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e2m1": "float4_e2m1fn_x2"}
    element = qt.descriptor.format_spec.element.name
    if element in expect_codes and hasattr(torch, expect_codes[element]):
        assert qt.codes.dtype == getattr(torch, expect_codes[element])
    if qt.descriptor.format_spec.scale_element(EK.BF16) is EK.E8M0 and qt.layout != "packed_ue8m0":
        if hasattr(torch, "float8_e8m0fnu"):
            assert qt.scales.dtype == torch.float8_e8m0fnu
    np.testing.assert_array_equal(qt.codes.view(torch.uint8).numpy(), codes)
    np.testing.assert_array_equal(_bits(qt.compact_scales()), _bits(scales))
    y = qt.dequantize()
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == x.shape
    ny = qp.quantize(x, name, **opts).dequantize()
    np.testing.assert_array_equal(y.view(torch.int16).numpy(), ny.view(np.int16))


def test_one_liner_options_and_errors(rng: np.random.Generator) -> None:
    x = _data(rng, (4, 64), EK.F32)
    with pytest.raises(qp.InvalidProblem, match="affine"):
        qp.quantize(x, "mxfp8", group_size=32)
    with pytest.raises(qp.InvalidProblem, match="block-scaled"):
        qp.quantize(x, "int8", layout="blocked")
    with pytest.raises(qp.InvalidProblem, match="scale_format"):
        qp.quantize(x, "mxfp4", scale_format="ue8m0")
    with pytest.raises(qp.InvalidProblem, match="NVFP4"):
        qp.quantize(x, "mxfp8", global_amax=3.0)
    with pytest.raises(qp.InvalidProblem, match="dtype"):
        qp.quantize(x.astype(np.float64), "mxfp8")
    with pytest.raises(qp.InvalidProblem, match="float16"):
        qp.quantize(x, "mxfp8").dequantize("int8")
    with pytest.raises(qp.InvalidArgumentType):
        qp.quantize([[1.0]], "mxfp8")
    bad = x.copy()
    bad[1, 3] = np.nan
    with pytest.warns(RuntimeWarning, match="NaN"):
        qp.quantize(bad, "mxfp8", nonfinite="warn")
    with pytest.raises(qp.InvalidProblem, match="NaN"):
        qp.quantize(bad, "fp8_block", nonfinite="raise")
    a = qp.quantize(x, "nvfp4", rounding=qp.Rounding.STOCHASTIC, seed=5, offset=2)
    b = rb.nvfp4_quantize(x, rounding="stochastic", seed=5, offset=2)
    np.testing.assert_array_equal(a.codes, b.codes)
    # the affine path is untouched
    qt = qp.quantize(x, "int8", scope=qp.TokenScope())
    assert isinstance(qt, qp.QuantizedTensor)
