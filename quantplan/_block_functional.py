"""The block-scaled one-liners behind ``qp.quantize(x, "mxfp8")``: :class:`BlockQuantizedTensor`.

```python
qt = qp.quantize(x, "mxfp8")                                   # MXFP8 e4m3, rceil scales, blocks of 32
qt = qp.quantize(x, "mxfp4", layout="blocked")                 # scales in the cuBLAS 128x4 layout
qt = qp.quantize(x, "nvfp4")                                   # e2m1, E4M3 block scales, f32 tensor scale
qt = qp.quantize(w, "fp8_block", block=(128, 128), scale_format="ue8m0")   # DeepSeek weights
y = qt.dequantize()                                            # back to x's dtype
```

A thin layer over :class:`~quantplan.BlockScaledQuantizePlan` / :class:`~quantplan.BlockScaledDequantizePlan`:
the plan is selected once per problem and device and kept in the front-ends' plan cache, the outputs
are allocated by x's library on x's device, and the plan runs on that library's current stream.

Where the arrays live: NumPy arrays and PyTorch CPU tensors run on the reference backend; CuPy
arrays and PyTorch CUDA tensors on the CUDA kernels where they serve the problem
(:func:`~quantplan.ops.block_scaled.cuda_refusal`: MX 1x32, NVFP4 1x16 ``te`` and FP8 1x128 blocks
along the last axis, MXFP8 32x32 and FP8 128x128 tiles, nearest rounding, and NVFP4 1x16 with
stochastic rounding too; dequantize: :func:`~quantplan.ops.block_scaled.dequantize_refusal`, compact
scales along the last axis except FP8 128x128). The other calls on device arrays (MX stochastic
rounding, other axes, NVFP4 ``torchao`` and 16x16, ...) run the reference on a host copy and
return device arrays: the same bytes, at host speed (``qt.backend`` says which ran).

Dtypes returned: PyTorch codes and scales carry torch's own dtypes where they exist
(``float8_e4m3fn``, ``float8_e5m2``, ``float4_e2m1fn_x2``, ``float8_e8m0fnu``; checked with
``hasattr``, uint8 otherwise); NumPy FP8 codes are ml_dtypes ``float8_e4m3fn`` / ``float8_e5m2``
(as the affine formats), other NumPy and all CuPy codes and byte scales uint8; MXINT8 codes int8;
f32 scales float32; ``packed_ue8m0`` scales int32.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantplan._frontend import NUMPY, TORCH, Target, dtype_name, remember_replay, replay
from quantplan.ops.block_scaled import (
    BlockScaledDequantizeArgs,
    BlockScaledDequantizeDescriptor,
    BlockScaledDequantizePlan,
    BlockScaledProblem,
    BlockScaledQuantizeArgs,
    BlockScaledQuantizeDescriptor,
    BlockScaledQuantizePlan,
    compact_scales,
    cuda_refusal,
    dequantize_refusal,
)
from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.errors import InvalidArgumentType, InvalidProblem
from quantplan.vocabulary.types import BackendKind, ElementKind, PlanPreference, Rounding

#: One-liner names of the block-scaled formats -> :data:`quantplan.vocabulary.formats.FORMATS` rows (f32 scales
#: for the FP8 blocks; ``scale_format="ue8m0"`` picks the UE8M0 row).
BLOCK_NAMES: dict[str, str] = {
    "mxfp8": "mxfp8_e4m3",
    "mxfp8_e4m3": "mxfp8_e4m3",
    "mxfp8_e5m2": "mxfp8_e5m2",
    "mxfp6_e2m3": "mxfp6_e2m3",
    "mxfp6_e3m2": "mxfp6_e3m2",
    "mxfp4": "mxfp4",
    "mxint8": "mxint8",
    "nvfp4": "nvfp4",
    "fp8_block": "fp8_block_e4m3",
    "fp8_block_e4m3": "fp8_block_e4m3",
    "fp8_block_e5m2": "fp8_block_e5m2",
    "fp8_block_e4m3_ue8m0": "fp8_block_e4m3_ue8m0",
    "fp8_block_e5m2_ue8m0": "fp8_block_e5m2_ue8m0",
}
#: The keywords of ``qp.quantize`` for the block-scaled formats beyond the shared ones.
BLOCK_OPTIONS = ("block", "layout", "scale_mode", "scale_format", "amax_floor", "two_level", "global_amax")
_INPUT_KINDS = {"float16": ElementKind.F16, "bfloat16": ElementKind.BF16, "uint16": ElementKind.BF16}
_INPUT_KINDS["float32"] = ElementKind.F32
_OUTPUT_NAMES = {"float16": ElementKind.F16, "half": ElementKind.F16, "bfloat16": ElementKind.BF16}
_OUTPUT_NAMES.update(float32=ElementKind.F32, float=ElementKind.F32)
_REFERENCE = PlanPreference(backend=BackendKind.REFERENCE)
#: torch dtype names of typed codes / scales, by element kind (checked with hasattr at use).
_TORCH_TYPED = {
    ElementKind.FP8_E4M3: "float8_e4m3fn",
    ElementKind.FP8_E5M2: "float8_e5m2",
    ElementKind.FP4_E2M1: "float4_e2m1fn_x2",
    ElementKind.E8M0: "float8_e8m0fnu",
}
#: NaN scale test per scale element (NVFP4 E4M3 0x7F, E8M0 0xFF, f32 NaN).
_NAN_BYTE = {ElementKind.E8M0: 0xFF, ElementKind.FP8_E4M3: 0x7F}


def _format_name(name: str, scale_format: str | None) -> str:
    """The FORMATS row of one-liner ``name`` and ``scale_format`` (FP8 blocks: ``f32`` or ``ue8m0``)."""
    row = BLOCK_NAMES[name]
    if not row.startswith("fp8_block"):
        if scale_format is not None:
            raise InvalidProblem(f"scale_format= applies to the FP8 block formats; {name!r} has fixed scales")
        return row
    if scale_format is None:
        return row
    if scale_format not in ("f32", "ue8m0"):
        raise InvalidProblem(f"scale_format={scale_format!r}: pass 'f32' or 'ue8m0'")
    base = row.removesuffix("_ue8m0")
    if row.endswith("_ue8m0") and scale_format == "f32":
        raise InvalidProblem(f"{name!r} names UE8M0 scales; scale_format='f32' contradicts it")
    return base + "_ue8m0" if scale_format == "ue8m0" else base


@dataclass(frozen=True)
class _Job:
    """One cached problem: its descriptor, resolved problem, quantize plan, and whether it runs on
    a host copy (a device array whose problem the CUDA backend does not serve yet)."""

    desc: BlockScaledQuantizeDescriptor
    problem: BlockScaledProblem
    plan: BlockScaledQuantizePlan
    host: bool
    codes_dtype: str
    scales_dtype: str


def _job(target: Target, key: tuple[Any, ...], fields: dict[str, Any]) -> _Job:
    def build() -> _Job:
        desc = BlockScaledQuantizeDescriptor(**fields)
        problem = desc._problem()  # validation first: a bad problem raises on every backend
        host = target.cuda and cuda_refusal(problem) is not None
        plan = (
            BlockScaledQuantizePlan.select(None, desc, _REFERENCE)
            if host
            else target.select(BlockScaledQuantizePlan, desc)
        )
        codes_dtype = "int8" if problem.code_kind is ElementKind.S8 else "uint8"
        scales_dtype = {ElementKind.F32: "float32", ElementKind.I32: "int32"}.get(problem.scale_kind, "uint8")
        return _Job(desc, problem, plan, host, codes_dtype, scales_dtype)

    return target.cached((_Job, *key), build)  # type: ignore[no-any-return]


# ---- arrays across libraries ---------------------------------------------------------------------


def _raw_host(a: Any, dtype: Any) -> np.ndarray:
    """The bytes of array ``a`` (any library, C-contiguous) as a NumPy array of ``dtype`` and a's shape."""
    dtype = np.dtype(dtype)
    shape = tuple(a.shape)
    if hasattr(a, "detach"):  # PyTorch (typed float8 / float4 included)
        import torch

        t = a.detach().cpu().contiguous().reshape(-1)
        flat = t.view(torch.uint8).numpy()
    elif hasattr(a, "get"):  # CuPy
        flat = np.ascontiguousarray(a.get()).reshape(-1).view(np.uint8)
    else:
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return flat.view(dtype).reshape(shape)


def _to_target(target: Target, a: np.ndarray) -> Any:
    """NumPy array ``a`` (uint8 / int8 / int32 / float16 / bfloat16 / float32) as an array of the
    target's library and device (bfloat16: a torch bfloat16 tensor, uint16 bits in CuPy)."""
    a = np.ascontiguousarray(a)
    bf16 = a.dtype.itemsize == 2 and a.dtype.kind not in "fiu"
    if target.library == NUMPY:
        return a
    if target.library == TORCH:
        import torch

        t = torch.from_numpy(a.view(np.int16) if bf16 else a)
        t = t if target.device is None or target.device.type == "cpu" else t.to(target.device)
        return t.view(torch.bfloat16) if bf16 else t
    import cupy

    with cupy.cuda.Device(target.index):
        return cupy.asarray(a.view(np.uint16) if bf16 else a)


def _typed(target: Target, a: Any, kind: ElementKind, codes: bool) -> Any:
    """Codes / scales of element ``kind`` typed where the library has the type (module docstring):
    PyTorch codes and scales, NumPy FP8 codes."""
    if target.library == TORCH:
        name = _TORCH_TYPED.get(kind)
        if name is not None:
            import torch

            dtype = getattr(torch, name, None)
            if dtype is not None:
                return a.view(dtype)
        return a
    if codes and target.library == NUMPY and kind in (ElementKind.FP8_E4M3, ElementKind.FP8_E5M2):
        return a.view(ELEMENTS[kind].numpy_dtype)
    return a


def _bytes_of(a: Any) -> Any:
    """A device array of one-byte typed elements (torch float8 / float4) as uint8 bytes (others as they are)."""
    if hasattr(a, "element_size") and a.element_size() == 1:
        import torch

        return a.view(torch.uint8)
    return a


def _host_args(target: Target, a: Any) -> Any:
    """What the plan takes for ``a`` on the host: PyTorch CPU tensors as NumPy views."""
    return target.arg(a) if target.library == TORCH else a


# ---- the tensor ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockQuantizedTensor:
    """A block-scaled tensor: codes, scales in their layout, and what decodes them.

    ``codes``: the element codes (x's shape; FP4 packed two per byte along the block axis);
    ``scales``: the scale buffer of ``layout`` (:class:`~quantplan.BlockScaledQuantizeDescriptor`:
    compact, blocked, column_major, packed_ue8m0); ``tensor_scale``: NVFP4's f32 S_dec (a
    one-element array), None otherwise; ``descriptor``: the quantization problem; ``backend``: the
    backend that ran (REFERENCE for a host copy of device arrays whose kernel has not landed).
    All arrays are of the input's library and device.

    Value: MX ``2**(s - 127) * element``; NVFP4 ``element * f32(s) * tensor_scale``; FP8 blocks
    ``element * s``.
    """

    codes: Any
    scales: Any
    tensor_scale: Any
    descriptor: BlockScaledQuantizeDescriptor
    backend: BackendKind

    @property
    def format(self) -> str:
        """The :data:`quantplan.vocabulary.formats.FORMATS` row (``mxfp8_e4m3``, ``nvfp4``, ``fp8_block_e4m3_ue8m0``, ...)."""
        return self.descriptor.format

    @property
    def layout(self) -> str:
        """The scale layout: ``compact``, ``blocked``, ``column_major`` or ``packed_ue8m0``."""
        return self.descriptor.scale_layout

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape of the quantized data (not of the packed codes)."""
        return self.descriptor.shape

    @property
    def block(self) -> tuple[int, int]:
        """(rows, cols) of one block: (1, 32), (32, 32), (1, 16), (16, 16), (1, 128), (128, 128)."""
        return self.descriptor._problem().block

    @property
    def nbytes(self) -> int:
        """Bytes held: codes, scales and the tensor scale."""
        return sum(int(getattr(a, "nbytes", 0)) for a in (self.codes, self.scales, self.tensor_scale))

    def compact_scales(self) -> np.ndarray:
        """The scales in the compact (row-major) layout, as NumPy (a host copy for device arrays)."""
        p = self.descriptor._problem()
        return compact_scales(p, _raw_host(self.scales, ELEMENTS[p.scale_kind].numpy_dtype))

    def dequantize(self, dtype: ElementKind | str | None = None) -> Any:
        """The float tensor (default: x's dtype; or ``dtype``: float16, bfloat16, float32), a new
        array of the codes' library and device. :class:`~quantplan.BlockScaledDequantizePlan`, bit for bit."""
        return dequantize_block(self, dtype)

    def __repr__(self) -> str:
        target = Target.of(self.codes)
        where = "host" if target.index is None else f"cuda:{target.index}"
        return (
            f"BlockQuantizedTensor({self.format} codes of {self.shape}, block {self.block}, {self.layout} scales "
            f"{tuple(self.scales.shape)}, {self.nbytes} bytes, {target.library} on {where})"
        )


def quantize_block(
    x: Any,
    name: str,
    *,
    axis: int | None = None,
    block: tuple[int, int] | None = None,
    layout: str | None = None,
    scale_mode: str | None = None,
    scale_format: str | None = None,
    amax_floor: float | None = None,
    two_level: bool | None = None,
    global_amax: Any = None,
    rounding: Rounding = Rounding.NEAREST_EVEN,
    seed: int | None = None,
    offset: int = 0,
    nonfinite: str = "propagate",
    replay_key: Any = None,
) -> BlockQuantizedTensor:
    """``qp.quantize(x, name, ...)`` for the block-scaled names of :data:`BLOCK_NAMES` (see ``qp.quantize``).

    ``replay_key``: the key ``qp.quantize`` looks replays up under (None: no replay); a call served
    by the CUDA kernel is remembered there, so the next call of the same signature is a replay
    (allocate, launch) without this layer."""
    target = Target.of(x, None if global_amax is None or isinstance(global_amax, (int, float)) else global_amax,
                       names=("x", "global_amax"))  # fmt: skip
    x = target.contiguous(x)
    kind = _INPUT_KINDS.get(dtype_name(x))
    if kind is None:
        raise InvalidProblem(
            f"input has dtype {dtype_name(x)}; block-scaled formats read float16, bfloat16 or float32 "
            f"(CuPy bfloat16 as uint16 bits)"
        )
    row = _format_name(name, scale_format)
    if rounding is Rounding.STOCHASTIC:
        seed = int.from_bytes(os.urandom(8), "little") if seed is None else seed
    elif seed is not None:
        raise InvalidProblem("seed= applies to rounding=Rounding.STOCHASTIC only")
    shape = tuple(x.shape)
    fields: dict[str, Any] = dict(shape=shape, format=row, input_element=kind, rounding=rounding)
    for field, value in (
        ("axis", axis),
        ("block", block),
        ("scale_layout", layout),
        ("scale_mode", scale_mode),
        ("amax_floor", amax_floor),
        ("two_level", two_level),
    ):
        if value is not None:
            fields[field] = value
    try:
        key = tuple(fields.items())
        hash(key)
    except TypeError:
        raise InvalidProblem(f"qp.quantize({name!r}): an option is not a plain value ({fields})") from None
    job = _job(target, key, fields)
    p = job.problem
    if global_amax is not None and not p.is_nvfp4:
        raise InvalidProblem(f"global_amax= applies to NVFP4 only, not {row}")
    stochastic = rounding is Rounding.STOCHASTIC
    if job.host:  # no CUDA kernel yet: the reference on a host copy, results back on the device
        host = Target(NUMPY, None, None)
        xs = _raw_host(x, ELEMENTS[kind].numpy_dtype)
        amax = (
            global_amax
            if global_amax is None or isinstance(global_amax, (int, float))
            else _raw_host(global_amax, np.float32)
        )
        codes = np.empty(p.codes_shape, job.codes_dtype)
        scales = np.empty(p.scales_shape, job.scales_dtype)
        ts = np.empty((1,), np.float32) if p.is_nvfp4 else None
        args = BlockScaledQuantizeArgs(
            xs, codes, scales, ts, amax, seed if stochastic else None, offset if stochastic else None
        )
        host.run(job.plan, args)
        codes_t, scales_t = _to_target(target, codes), _to_target(target, scales)
        ts_t = None if ts is None else _to_target(target, ts)
        backend = BackendKind.REFERENCE
    else:
        outputs = [(p.codes_shape, job.codes_dtype), (p.scales_shape, job.scales_dtype)]
        if p.is_nvfp4:
            outputs.append(((1,), "float32"))
        (codes_t, scales_t, *tensor_scale), ws = target.empty_many(outputs, job.plan.workspace_size())
        ts_t = tensor_scale[0] if tensor_scale else None
        arg = target.arg
        amax = global_amax if global_amax is None or isinstance(global_amax, (int, float)) else arg(global_amax)
        args = BlockScaledQuantizeArgs(
            arg(x),
            arg(codes_t),
            arg(scales_t),
            arg(ts_t),
            amax,
            seed if stochastic else None,
            offset if stochastic else None,
        )
        target.run(job.plan, args, ws)  # NVFP4: the device f32 tensor amax
        backend = job.plan.backend
        if replay_key is not None and nonfinite == "propagate" and not p.is_nvfp4 and p.numel:
            desc, code_kind, scale_kind = job.desc, p.code_kind, p.scale_kind

            def finish(x: Any, codes: Any, scales: Any) -> BlockQuantizedTensor:
                typed = _typed(target, codes, code_kind, True), _typed(target, scales, scale_kind, False)
                return BlockQuantizedTensor(*typed, None, desc, backend)

            remember_replay(replay_key, target, lambda: replay(target, job.plan, args, 1, outputs, finish))
    codes_t, scales_t = _typed(target, codes_t, p.code_kind, True), _typed(target, scales_t, p.scale_kind, False)
    qt = BlockQuantizedTensor(codes_t, scales_t, ts_t, job.desc, backend)
    if nonfinite != "propagate":
        _check_nonfinite(qt, nonfinite)
    return qt


def _check_nonfinite(qt: BlockQuantizedTensor, nonfinite: str) -> None:
    """``nonfinite="warn" | "raise"``: the NaN scales of blocks that held NaN or +-Inf."""
    p = qt.descriptor._problem()
    s = qt.compact_scales()
    with np.errstate(invalid="ignore"):
        bad = np.isnan(s) if s.dtype.kind == "f" else s == _NAN_BYTE[p.format.scale_element(p.input_element)]
    count = int(np.count_nonzero(bad))
    if not count:
        return
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    message = (
        f"qp.quantize: {count} of {s.size} block scales are NaN (first at compact index {first}): those blocks of the "
        f"input hold NaN or +-Inf, so their codes are 0 and they dequantize to NaN; clean the input (e.g. nan_to_num), "
        f"or pass nonfinite='propagate' to accept it"
    )
    if nonfinite == "raise":
        raise InvalidProblem(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def dequantize_block(qt: BlockQuantizedTensor, dtype: ElementKind | str | None = None) -> Any:
    """The float tensor of ``qt`` (:class:`~quantplan.BlockScaledDequantizePlan`: on the CUDA
    kernel for device arrays it serves, else on the reference backend, device arrays through a
    host copy)."""
    if not isinstance(qt, BlockQuantizedTensor):
        raise InvalidArgumentType(f"expected a BlockQuantizedTensor (from qp.quantize), got {type(qt).__name__}")
    d = qt.descriptor
    if dtype is None:
        out_kind = d.input_element
    else:
        found = dtype if isinstance(dtype, ElementKind) else _OUTPUT_NAMES.get(str(dtype).lower())
        if found not in (ElementKind.F16, ElementKind.BF16, ElementKind.F32):
            raise InvalidProblem(f"dtype={dtype!r}: dequantize to 'float16', 'bfloat16' or 'float32'")
        out_kind = found
    target = Target.of(qt.codes)
    key = (BlockScaledDequantizePlan, d, out_kind)

    def build() -> Any:
        desc = BlockScaledDequantizeDescriptor(
            shape=d.shape,
            format=d.format,
            block=d.block,
            axis=d.axis,
            scale_layout=d.scale_layout,
            output_element=out_kind,
        )
        if target.cuda and dequantize_refusal(desc._problem()) is None:
            return target.select(BlockScaledDequantizePlan, desc)
        return BlockScaledDequantizePlan.select(None, desc, _REFERENCE)

    plan = target.cached(key, build)
    p = plan.problem
    if plan.backend is BackendKind.CUDA:
        names = {ElementKind.F16: "float16", ElementKind.F32: "float32"}
        bf16 = "bfloat16" if target.library == TORCH else "uint16"  # CuPy: bfloat16 as its uint16 bits
        y_t = target.empty(d.shape, names.get(out_kind, bf16))
        ts_t = qt.tensor_scale
        target.run(plan, BlockScaledDequantizeArgs(_bytes_of(qt.codes), _bytes_of(qt.scales), y_t, ts_t))
        return y_t
    codes = _raw_host(qt.codes, np.uint8)
    scales = _raw_host(
        qt.scales, ELEMENTS[p.scale_kind].numpy_dtype if p.scale_kind is not ElementKind.FP8_E4M3 else np.uint8
    )
    ts = None if qt.tensor_scale is None else _raw_host(qt.tensor_scale, np.float32)
    y = np.empty(d.shape, ELEMENTS[out_kind].numpy_dtype)
    plan.run(None, None, BlockScaledDequantizeArgs(codes, scales, y, ts))
    if target.library == TORCH and target.index is None:
        import torch

        t = torch.from_numpy(y.view(np.int16) if out_kind is ElementKind.BF16 else y)
        return t.view(torch.bfloat16) if out_kind is ElementKind.BF16 else t
    return _to_target(target, y)


def is_block_name(dtype: Any) -> bool:
    """True when ``dtype`` is a one-liner name of a block-scaled format."""
    return type(dtype) is str and dtype in BLOCK_NAMES


__all__ = [
    "BLOCK_NAMES",
    "BLOCK_OPTIONS",
    "BlockQuantizedTensor",
    "dequantize_block",
    "is_block_name",
    "quantize_block",
]
