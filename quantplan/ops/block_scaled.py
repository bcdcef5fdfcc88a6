"""Block-scaled quantization plans: MX (MXFP8, MXFP6, MXFP4, MXINT8), NVFP4 and DeepSeek FP8 blocks.

The contract is the project's ``MICROSCALING.md`` (sections cited as §n); the semantics, bit for
bit, are :mod:`quantplan.reference.block_scaled`. A problem names a row of
:data:`quantplan.vocabulary.formats.FORMATS` (``"mxfp8_e4m3"``, ``"mxfp4"``, ``"nvfp4"``,
``"fp8_block_e4m3"``, ``"fp8_block_e4m3_ue8m0"``, ...), a block geometry of that row, the block
axis, a scale rule and the layout the scales are written in:

* :class:`BlockScaledQuantizePlan`: x -> (codes, scales[, NVFP4 tensor scale]);
* :class:`BlockScaledDequantizePlan`: (codes, scales[, tensor scale]) -> y.

Backends. The CUDA backend serves, with nearest rounding and blocks along the last axis
(:func:`cuda_refusal`, :func:`dequantize_refusal`): quantize of MX 1x32, NVFP4 1x16 (``te``;
stochastic rounding too) and FP8 1x128 blocks in every scale layout (``kernels/block_scaled.cu``,
NVFP4's tensor amax by its ``block_scaled_tensor_amax``, S_dec written by the quantize kernel),
MXFP8 32x32 and FP8 128x128 tiles and the fused columnwise copy of MXFP8 1x32 / FP8 1x128
(``kernels/block_scaled_tiles.cu``), and dequantize from compact scales
(``block_scaled_dequantize``). MX stochastic rounding, other axes, NVFP4 ``torchao`` and 16x16
tiles, FP8 128x128 dequantize and the layouts a kernel does not write run on the REFERENCE
backend; on CUDA their ``select`` raises :class:`~quantplan.Unsupported` naming what is served.

Scale layouts (``scale_layout``), of the 2-D scale matrix S [R, C] (C blocks per row; R the
product of the other extents: the rows of the K-major GEMM operand; FP8 blocks: R = ⌈M/bm⌉):

* ``compact`` (default): the reference's scale tensor (MX: x's shape with the block axis
  replaced by ⌈n/32⌉; NVFP4: (..., ⌈K/16⌉); FP8 blocks: [⌈M/bm⌉, ⌈K/bk⌉]);
* ``blocked``: the cuBLAS / CUTLASS 128x4 layout of S, flat, zero padded (byte scales only);
* ``column_major``: DeepGEMM's TMA-aligned buffer [C, align(R, 16 / itemsize)], zero padded;
* ``packed_ue8m0``: four E8M0 bytes per int32, column-major TMA-aligned [⌈C/4⌉, align(R, 4)]
  (DeepGEMM SM100; E8M0 scales only).

Kernels: ``kernels/block_scaled.cu`` and ``kernels/block_scaled_tiles.cu`` (+
``qp_block_scaled.cuh``), named by :mod:`quantplan.runtime._block_scaled_kernels` and
:mod:`quantplan.runtime._block_scaled_tile_kernels`; tests: ``tests/test_block_scaled_plans.py``
(reference backend, descriptors, one-liners), ``tests/test_block_scaled_plans_select.py`` (CUDA
selection on a simulated GPU, the columnwise reference) and ``tests/test_block_scaled_plans_gpu.py``.
"""

from __future__ import annotations

import ctypes
import functools
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
from pydantic import ConfigDict

from quantplan.reference import block_scaled as rb
from quantplan.runtime._block_scaled_kernels import (
    BLOCK_THREADS,
    FP8_RULES,
    MX_RULES,
    NVFP4_RULES,
    VECTOR_ELEMENTS,
    Schedule,
    amax_kernel_name,
    choose_schedule,
    dequantize_kernel_name,
    kernel_name,
    launch_shape,
    scale_geometry,
)
from quantplan.runtime._block_scaled_tile_kernels import THREADS as TILE_THREADS
from quantplan.runtime._block_scaled_tile_kernels import (
    TILE_LAYOUTS,
    TILE_SCHEDULES,
    TRANSPOSE_ELEMENTS,
    TRANSPOSE_LAYOUTS,
    TRANSPOSE_SCHEDULES,
    tile_kernel_name,
    tile_slices,
    transpose_kernel_name,
    transpose_shared_bytes,
    transpose_slices,
)
from quantplan.runtime._block_scaled_tile_kernels import _allow_shared as allow_shared
from quantplan.runtime._device import device_info, stream_device_id
from quantplan.runtime._launch import (
    RNG_FIELDS,
    PreparedLaunch,
    fields,
    launch_on,
    occupancy_grid,
    params_struct,
    set_rng,
)
from quantplan.runtime._operands import (
    Operand,
    OperandChecks,
    check_outputs,
    host_values,
    host_view,
    is_scalar,
    operand,
)
from quantplan.runtime._plan import Plan, check_descriptor, choose_backend, preferred
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels
from quantplan.runtime.workspace import Workspace
from quantplan.vocabulary.elements import ELEMENTS, ElementInfo
from quantplan.vocabulary.errors import InvalidProblem, Unsupported
from quantplan.vocabulary.formats import FORMATS, FP8_BLOCK, MX_BLOCK, Format
from quantplan.vocabulary.types import (
    BackendKind,
    ElementKind,
    Model,
    OpCategory,
    PlanPreference,
    QuantizeKind,
    Rounding,
    Shape,
)

_FROZEN = ConfigDict(frozen=True, extra="forbid")

#: The block-scaled rows of :data:`quantplan.vocabulary.formats.FORMATS` (every row no affine plan serves).
BLOCK_FORMATS: tuple[str, ...] = tuple(name for name, f in FORMATS.items() if not f.served)
#: Scale layouts (module docstring).
SCALE_LAYOUTS: tuple[str, ...] = ("compact", "blocked", "column_major", "packed_ue8m0")
#: Input elements of the block-scaled formats.
INPUT_ELEMENTS: tuple[ElementKind, ...] = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
#: Scale modes per family: the first is the default (``fp8_block``: f32 scales; UE8M0 scales have one rule).
MODES: dict[str, tuple[str, ...]] = {
    "mx": rb.MX_SCALE_MODES,
    "nvfp4": rb.NVFP4_MODES,
    "fp8_block": rb.FP8_ELEM_OPS,
    "fp8_block_ue8m0": ("rceil",),
}
#: The reference's element names by :mod:`quantplan.vocabulary.formats` element name.
_REFERENCE_ELEMENT = {"e4m3": "e4m3", "e5m2": "e5m2", "e2m3": "e2m3", "e3m2": "e3m2", "e2m1": "e2m1", "mxint8": "int8"}
_SERVED_ON_CUDA = (
    "the CUDA backend serves, with nearest rounding along the last axis, MX 1x32, NVFP4 1x16 (te; stochastic "
    "rounding too) and FP8 1x128 blocks in every layout, MXFP8 32x32 and FP8 128x128 tiles, and the fused "
    "transpose of MXFP8 1x32 and FP8 1x128 (see cuda_refusal); run this problem with "
    "PlanPreference(backend=BackendKind.REFERENCE)"
)
_F32 = ELEMENTS[ElementKind.F32]
_FLT_MAX = float(np.finfo(np.float32).max)


def _family(fmt: Format) -> str:
    """``mx``, ``nvfp4``, ``fp8_block`` or ``fp8_block_ue8m0`` from the row's geometry and scales."""
    if fmt.tensor_scale is not None:
        return "nvfp4"
    if MX_BLOCK in fmt.geometries:
        return "mx"
    if FP8_BLOCK in fmt.geometries:
        return "fp8_block_ue8m0" if fmt.scale_element(ElementKind.F32) is ElementKind.E8M0 else "fp8_block"
    raise Unsupported(f"format {fmt.name} has no block-scaled geometry")  # pragma: no cover - table rows


@dataclass(frozen=True)
class BlockScaledProblem:
    """A validated block-scaled problem: everything ``run`` and the reference read, resolved once.

    ``family``: ``mx`` / ``nvfp4`` / ``fp8_block`` / ``fp8_block_ue8m0``; ``element``: the
    reference's element name; ``block``: (rows, cols) of a block (1 for 1-D blocks); ``axis``:
    the block axis (non-negative); ``mode``: the resolved scale mode; ``matrix``: (R, C) of the
    2-D scale matrix; ``compact_shape``: the reference's scale shape; ``scales_shape`` /
    ``scale_kind``: the layout's buffer (I32 for ``packed_ue8m0``).
    """

    shape: tuple[int, ...]
    format: Format
    family: str
    element: str
    input_element: ElementKind
    block: tuple[int, int]
    axis: int
    mode: str
    amax_floor: float
    two_level: bool
    rounding: Rounding
    layout: str
    codes_shape: tuple[int, ...]
    compact_shape: tuple[int, ...]
    matrix: tuple[int, int]
    scales_shape: tuple[int, ...]
    scale_kind: ElementKind
    output_element: ElementKind | None = None
    #: The fused columnwise copy (:func:`quantplan.reference.block_scaled.quantize_transpose`):
    #: None, ``transposed`` or ``te_mxfp8``; its codes' shape, scale matrix and scale buffer shape.
    columnwise: str | None = None
    columnwise_codes_shape: tuple[int, ...] = ()
    columnwise_matrix: tuple[int, int] = (0, 0)
    columnwise_scales_shape: tuple[int, ...] = ()

    @property
    def numel(self) -> int:
        """Elements of x."""
        return math.prod(self.shape)

    @property
    def code_kind(self) -> ElementKind:
        """The element kind of the codes' storage."""
        return self.format.code_kind

    @property
    def stochastic(self) -> bool:
        return self.rounding is Rounding.STOCHASTIC

    @property
    def is_nvfp4(self) -> bool:
        return self.family == "nvfp4"

    @property
    def ue8m0(self) -> bool:
        """Scales are E8M0 bytes (MX, FP8 blocks with UE8M0 scales)."""
        return self.format.scale_element(self.input_element) is ElementKind.E8M0


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _layout_shape(layout: str, r: int, c: int, itemsize: int) -> tuple[int, ...]:
    """The buffer shape of ``layout`` for an [r, c] scale matrix of ``itemsize``-byte scales (module docstring)."""
    if layout == "blocked":
        return (512 * _ceil(r, 128) * _ceil(c, 4),)
    if layout == "column_major":
        align = 16 // itemsize
        return (c, _ceil(r, align) * align)
    return (_ceil(c, 4), _ceil(r, 4) * 4)  # packed_ue8m0


#: Columnwise copies of the fused quantize + transpose (``columnwise``; None: rowwise only).
COLUMNWISE: tuple[str, ...] = rb.TRANSPOSE_LAYOUTS


def resolve(
    shape: tuple[int, ...],
    format: str,
    input_element: Any,
    block: tuple[int, int] | None,
    axis: int,
    scale_layout: str,
    scale_mode: str | None = None,
    amax_floor: float = 0.0,
    two_level: bool = True,
    rounding: Rounding = Rounding.NEAREST_EVEN,
    columnwise: str | None = None,
) -> BlockScaledProblem:
    """Validate a block-scaled problem (InvalidProblem / Unsupported naming the field) and resolve it."""
    fmt = FORMATS.get(format) if isinstance(format, str) else None
    if fmt is None or format not in BLOCK_FORMATS:
        raise InvalidProblem(f"format={format!r} is not a block-scaled format; use one of {', '.join(BLOCK_FORMATS)}")
    family = _family(fmt)
    if input_element not in INPUT_ELEMENTS:
        raise InvalidProblem(
            f"input_element={getattr(input_element, 'name', input_element)}: block-scaled formats read F16, BF16 or F32"
        )
    if len(shape) == 0:
        raise InvalidProblem(f"shape {shape}: x must have at least one dimension (blocks run along an axis)")
    geometries = {(g.rows, g.cols): g for g in fmt.geometries}
    blk = fmt.geometries[0] if block is None else geometries.get(tuple(block))  # type: ignore[arg-type]
    if blk is None or blk.cols is None:
        shapes = ", ".join(f"({g.rows}, {g.cols})" for g in fmt.geometries)
        raise InvalidProblem(f"block={block!r}: {fmt.name} is defined for blocks {shapes}")
    bm, bk = blk.rows, int(blk.cols)
    ndim = len(shape)
    if not -ndim <= axis < ndim:
        raise InvalidProblem(f"axis {axis} is out of range for shape {shape} (rank {ndim})")
    ax = axis % ndim
    if family != "mx" and ax != ndim - 1:
        raise Unsupported(f"axis={axis}: {fmt.name} blocks run along the last axis (MX formats take any axis)")
    modes = MODES[family]
    mode = modes[0] if scale_mode is None else scale_mode
    if mode not in modes:
        raise InvalidProblem(f"scale_mode={scale_mode!r} is not one of {fmt.name}'s modes {modes} (default {modes[0]})")
    if isinstance(amax_floor, bool) or not isinstance(amax_floor, numbers.Real):
        raise InvalidProblem(f"amax_floor={amax_floor!r} must be a finite number >= 0")
    floor = float(amax_floor)
    if not (math.isfinite(floor) and 0 <= floor <= _FLT_MAX):
        raise InvalidProblem(f"amax_floor={amax_floor!r} must be a finite number >= 0 (in float32)")
    if floor and not family.startswith("fp8_block"):
        raise InvalidProblem(f"amax_floor={amax_floor!r} applies to FP8 blocks only; {fmt.name} takes 0")
    if not two_level and family != "nvfp4":
        raise InvalidProblem(f"two_level=False applies to NVFP4 only; {fmt.name} has one scale level")
    if rounding is Rounding.STOCHASTIC and (family.startswith("fp8_block") or fmt.element.name == "mxint8"):
        raise Unsupported(
            f"rounding=STOCHASTIC: {fmt.name} rounds to nearest even only (stochastic rounding is defined for "
            f"NVFP4 and the MX float elements)"
        )
    if scale_layout not in SCALE_LAYOUTS:
        raise InvalidProblem(f"scale_layout={scale_layout!r} is not one of {SCALE_LAYOUTS}")
    scale_kind = fmt.scale_element(input_element)
    if scale_layout == "blocked" and scale_kind is ElementKind.F32:
        raise InvalidProblem(
            "scale_layout='blocked': the 128x4 layout holds byte scales; f32 scales take compact or column_major"
        )
    if scale_layout == "packed_ue8m0" and scale_kind is not ElementKind.E8M0:
        raise InvalidProblem(
            f"scale_layout='packed_ue8m0' packs E8M0 bytes; {fmt.name} has {scale_kind.name} scales "
            f"(use an MX format or fp8_block_*_ue8m0)"
        )
    n = shape[ax]
    packed = fmt.element.codes_per_byte == 2
    codes_shape = tuple(_ceil(e, 2) if packed and i == ax else e for i, e in enumerate(shape))
    if family.startswith("fp8_block"):
        m = math.prod(shape[:-1])
        compact: tuple[int, ...] = (_ceil(m, bm), _ceil(n, bk))
        matrix = compact
    else:
        compact = tuple(_ceil(e, bk) if i == ax else e for i, e in enumerate(shape))
        matrix = (math.prod(e for i, e in enumerate(shape) if i != ax), _ceil(n, bk))
    r, c = matrix
    itemsize = ELEMENTS[scale_kind].numpy_dtype.itemsize
    scales_shape = compact if scale_layout == "compact" else _layout_shape(scale_layout, r, c, itemsize)
    col_codes: tuple[int, ...] = ()
    col_matrix, col_scales = (0, 0), ()
    if columnwise is not None:
        if columnwise not in COLUMNWISE:
            raise InvalidProblem(f"columnwise={columnwise!r} is not None or one of {COLUMNWISE}")
        if ndim < 2 or ax != ndim - 1:
            raise InvalidProblem(
                f"columnwise={columnwise!r}: the fused transpose takes x of rank >= 2 ([M, K], leading dims "
                f"flattened into M) with blocks along the last axis; got shape {shape}, axis {axis}"
            )
        m = math.prod(shape[:-1])
        if columnwise == "te_mxfp8":
            if family != "mx" or fmt.element.name not in ("e4m3", "e5m2") or bm > 1 or scale_layout != "compact":
                raise InvalidProblem(
                    "columnwise='te_mxfp8' is TransformerEngine's MXFP8 layout: an MXFP8 format, 1x32 blocks, "
                    "compact scales"
                )
            col_codes, col_matrix = (m, n), (_ceil(m, bk), n)
            col_scales = col_matrix
        else:  # the quantization of x^T [K, M] with the same block
            col_codes = (n, _ceil(m, 2) if packed else m)
            col_matrix = (_ceil(n, bm), _ceil(m, bk)) if family.startswith("fp8_block") else (n, _ceil(m, bk))
            cr, cc = col_matrix
            col_scales = col_matrix if scale_layout == "compact" else _layout_shape(scale_layout, cr, cc, itemsize)
    if scale_layout == "packed_ue8m0":
        scale_kind = ElementKind.I32
    return BlockScaledProblem(
        tuple(shape),
        fmt,
        family,
        _REFERENCE_ELEMENT[fmt.element.name],
        input_element,
        (bm, bk),
        ax,
        mode,
        float(np.float32(floor)),
        bool(two_level),
        rounding,
        scale_layout,
        codes_shape,
        compact,
        (r, c),
        scales_shape,
        scale_kind,
        columnwise=columnwise,
        columnwise_codes_shape=col_codes,
        columnwise_matrix=col_matrix,
        columnwise_scales_shape=col_scales,
    )


# ---- descriptors ---------------------------------------------------------------------------------


class _BlockScaledFields(Model):
    model_config = _FROZEN
    shape: Shape
    format: str
    block: tuple[int, int] | None = None
    axis: int = -1
    scale_layout: str = "compact"

    @property
    def format_spec(self) -> Format:
        """The :data:`quantplan.vocabulary.formats.FORMATS` row named by ``format``."""
        fmt = FORMATS.get(self.format)
        if fmt is None or self.format not in BLOCK_FORMATS:
            raise InvalidProblem(f"format={self.format!r} is not one of {', '.join(BLOCK_FORMATS)}")
        return fmt

    @property
    def numel(self) -> int:
        """Elements of the float tensor."""
        return math.prod(self.shape)

    def _problem(self) -> BlockScaledProblem:
        raise NotImplementedError

    @property
    def codes_shape(self) -> tuple[int, ...]:
        """Shape of the codes: x's shape, FP4 (MXFP4, NVFP4) packed two per byte along the block axis."""
        return self._problem().codes_shape

    @property
    def scales_shape(self) -> tuple[int, ...]:
        """Shape of the scale buffer of ``scale_layout`` (module docstring)."""
        return self._problem().scales_shape

    @property
    def compact_scales_shape(self) -> tuple[int, ...]:
        """Shape of the compact (row-major) scale tensor, whatever the layout."""
        return self._problem().compact_shape

    @property
    def scales_dtype(self) -> np.dtype:
        """NumPy dtype of the scale buffer: uint8 (E8M0 / E4M3 bytes), float32, or int32 (packed_ue8m0)."""
        kind = self._problem().scale_kind
        return np.dtype(np.uint8) if kind is ElementKind.FP8_E4M3 else ELEMENTS[kind].numpy_dtype

    @property
    def tensor_scale_shape(self) -> tuple[int, ...] | None:
        """(1,) for NVFP4 (its f32 tensor scale S_dec), None otherwise."""
        return (1,) if self.format_spec.tensor_scale is not None else None


class BlockScaledQuantizeDescriptor(_BlockScaledFields):
    """A block-scaled quantization problem (see :class:`BlockScaledQuantizePlan`).

    Fields: ``shape`` of x (any rank >= 1); ``format``: a block-scaled row of
    :data:`quantplan.vocabulary.formats.FORMATS` (``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp6_e2m3``,
    ``mxfp6_e3m2``, ``mxfp4``, ``mxint8``, ``nvfp4``, ``fp8_block_e4m3``, ``fp8_block_e5m2``,
    ``fp8_block_e4m3_ue8m0``, ``fp8_block_e5m2_ue8m0``); ``input_element`` F16, BF16 or F32;
    ``block`` None (the format's 1-D block: 1x32, 1x16, 1x128) or one of its geometries ((32, 32)
    for MXFP8, (16, 16) for NVFP4, (1, 128) / (128, 128) for FP8 blocks); ``axis`` the block axis
    (MX: any; NVFP4 and FP8 blocks: the last); ``scale_mode`` None (the default) or: MX ``rceil``
    (default), ``floor``, ``ceil``, ``even``; NVFP4 ``te`` (default), ``torchao``; FP8 blocks with
    f32 scales ``div`` (default), ``mul_rcp``, ``enc`` (UE8M0 scales: ``rceil`` only);
    ``amax_floor`` (FP8 blocks: a = max(amax, amax_floor); 0, 1e-10 as vLLM, 1e-4 as DeepGEMM);
    ``two_level`` (NVFP4: False for S = 1); ``rounding`` NEAREST_EVEN or STOCHASTIC (NVFP4 and MX
    float elements); ``scale_layout`` ``compact`` (default), ``blocked``, ``column_major``,
    ``packed_ue8m0``; ``columnwise`` None (default: the rowwise copy only) or the fused
    quantize + transpose (§6, x of rank >= 2 as [M, K], blocks along the last axis): ``transposed``
    also writes Q(xᵀ) ([K, M] codes, the scales of xᵀ's blocks in ``scale_layout``);
    ``te_mxfp8`` (MXFP8, 1x32, compact) TransformerEngine's untransposed columnwise copy ([M, K]
    codes, [⌈M/32⌉, K] scales).

    When to use: for a GEMM operand, the ``scale_layout`` the GEMM reads (``blocked`` for cuBLAS /
    CUTLASS MX operands, ``column_major`` or ``packed_ue8m0`` for DeepGEMM): no second pass lays the
    scales out, and with ``columnwise`` the fused kernel runs faster in these layouts (a tile's
    scales are contiguous) than in ``compact`` (about 95.6% against 88% of a copy on an H100).

    Shapes it implies: ``codes_shape``, ``scales_shape`` (the layout's buffer),
    ``compact_scales_shape``, ``tensor_scale_shape`` (NVFP4); ``scales_dtype``;
    ``columnwise_codes_shape`` / ``columnwise_scales_shape`` (None without ``columnwise``).
    """

    input_element: ElementKind
    scale_mode: str | None = None
    amax_floor: float = 0.0
    two_level: bool = True
    rounding: Rounding = Rounding.NEAREST_EVEN
    columnwise: str | None = None

    @property
    def columnwise_codes_shape(self) -> tuple[int, ...] | None:
        """Codes of the columnwise copy: [K, M] (``transposed``; FP4 [K, ⌈M/2⌉]) or [M, K] (``te_mxfp8``)."""
        p = self._problem()
        return p.columnwise_codes_shape if p.columnwise else None

    @property
    def columnwise_scales_shape(self) -> tuple[int, ...] | None:
        """Scale buffer of the columnwise copy in ``scale_layout`` (``te_mxfp8``: [⌈M/32⌉, K])."""
        p = self._problem()
        return p.columnwise_scales_shape if p.columnwise else None

    def _problem(self) -> BlockScaledProblem:
        return resolve(
            self.shape,
            self.format,
            self.input_element,
            self.block,
            self.axis,
            self.scale_layout,
            self.scale_mode,
            self.amax_floor,
            self.two_level,
            self.rounding,
            self.columnwise,
        )


class BlockScaledDequantizeDescriptor(_BlockScaledFields):
    """A block-scaled dequantization problem (see :class:`BlockScaledDequantizePlan`).

    Fields: ``shape`` of the float output (the logical shape, not the packed one), ``format``,
    ``block``, ``axis`` and ``scale_layout`` as the quantization that made the codes, and
    ``output_element`` F16, BF16 or F32. Implied: ``codes_shape``, ``scales_shape``,
    ``tensor_scale_shape``, ``scales_dtype``.
    """

    output_element: ElementKind = ElementKind.F32

    def _problem(self) -> BlockScaledProblem:
        p = resolve(self.shape, self.format, self.output_element, self.block, self.axis, self.scale_layout)
        return replace(p, output_element=self.output_element)


# ---- arguments -----------------------------------------------------------------------------------


@dataclass(slots=True)
class BlockScaledQuantizeArgs:
    """Arguments of :class:`BlockScaledQuantizePlan`.

    ``input``: x (the descriptor's shape; float16, bfloat16 or its uint16 bits, float32).
    ``codes``: ``codes_shape``, uint8 (or the element's own dtype: float8_e4m3fn / float8_e5m2,
    float4_e2m1fn_x2, int8 for MXINT8). ``scales``: ``scales_shape`` of the layout: uint8 or
    float8_e8m0fnu (E8M0), uint8 or float8_e4m3fn (NVFP4), float32 (FP8 f32 scales), int32
    (``packed_ue8m0``). NVFP4: ``tensor_scale`` (a one-element float32 output, shape (1,): S_dec)
    and ``global_amax`` (None: the amax of x over its finite elements; or a number >= 0, or a
    one-element float32 array: a calibrated amax). STOCHASTIC rounding: ``rng_seed`` /
    ``rng_offset`` (Python ints in [0, 2**64) or one-element int64 arrays). ``columnwise_codes`` /
    ``columnwise_scales``: the columnwise copy's outputs when the descriptor names ``columnwise``
    (``columnwise_codes_shape`` / ``columnwise_scales_shape``, dtypes as ``codes`` / ``scales``).
    """

    input: Any
    codes: Any
    scales: Any
    tensor_scale: Any = None
    global_amax: Any = None
    rng_seed: Any = None
    rng_offset: Any = None
    columnwise_codes: Any = None
    columnwise_scales: Any = None


@dataclass(slots=True)
class BlockScaledDequantizeArgs:
    """Arguments of :class:`BlockScaledDequantizePlan`: ``codes`` and ``scales`` as the quantize
    plan wrote them, ``tensor_scale`` (NVFP4: the one-element float32 S_dec; else None) and
    ``output`` (the descriptor's shape; float16, bfloat16 or uint16 bits, float32)."""

    codes: Any
    scales: Any
    output: Any
    tensor_scale: Any = None


class BlockScaledOperands(NamedTuple):
    """The operands of one quantize call, checked."""

    x: Operand
    codes: Operand
    scales: Operand
    tensor_scale: Operand | None
    global_amax: Operand | float | None
    seed: Operand | int
    offset: Operand | int
    col_codes: Operand | None = None
    col_scales: Operand | None = None


class BlockScaledDequantizeOperands(NamedTuple):
    """The operands of one dequantize call, checked."""

    codes: Operand
    scales: Operand
    y: Operand
    tensor_scale: Operand | None


def _info(kind: ElementKind, *extra: str) -> ElementInfo:
    """The elements-table row of ``kind``, accepting the dtype names ``extra`` too."""
    info = ELEMENTS[kind]
    return replace(info, dtype_names=info.dtype_names | frozenset(extra))


def _codes_info(p: BlockScaledProblem) -> ElementInfo:
    return _info(p.code_kind, "uint8")


def _scales_info(p: BlockScaledProblem) -> ElementInfo:
    return _info(p.scale_kind) if p.scale_kind is ElementKind.I32 else _info(p.scale_kind, "uint8")


# ---- the scale layouts on the host -----------------------------------------------------------


def _scale_matrix(p: BlockScaledProblem, compact: np.ndarray) -> np.ndarray:
    """The compact scales as the 2-D scale matrix S [R, C] of the layouts."""
    if p.family == "mx":
        return np.moveaxis(compact, p.axis, -1).reshape(p.matrix)
    return compact.reshape(p.matrix)


def layout_scales(p: BlockScaledProblem, compact: np.ndarray) -> np.ndarray:
    """The compact scales of ``p`` laid out in ``p.layout`` (NumPy; the reference backend's writer)."""
    if p.layout == "compact":
        return compact
    return _layout_matrix(p.layout, _scale_matrix(p, compact))


def compact_scales(p: BlockScaledProblem, buffer: np.ndarray) -> np.ndarray:
    """Inverse of :func:`layout_scales`: the compact scales from the layout's buffer (padding dropped)."""
    if p.layout == "compact":
        return buffer.reshape(p.compact_shape)
    r, c = p.matrix
    if p.layout == "blocked":
        s = rb.from_blocked(buffer.reshape(-1), r, c)
    elif p.layout == "column_major":
        s = np.ascontiguousarray(buffer.reshape(p.scales_shape)[:, :r].T)
    else:
        words = np.ascontiguousarray(buffer.reshape(p.scales_shape)[:, :r].T).view(np.int32).astype("<i4")
        s = np.ascontiguousarray(words.view(np.uint8).reshape(r, -1)[:, :c])
    if p.family == "mx":
        moved = tuple(e for i, e in enumerate(p.compact_shape) if i != p.axis) + (c,)
        return np.ascontiguousarray(np.moveaxis(s.reshape(moved), -1, p.axis))
    return s.reshape(p.compact_shape)


def _scalar_of(value: Operand | float | int | None) -> Any:
    """A scalar argument's value (a one-element array read on the host)."""
    if isinstance(value, Operand):
        return host_values(value)[0].item()
    return value


def reference_quantize(
    p: BlockScaledProblem, x: np.ndarray, global_amax: float | None = None, seed: int = 0, offset: int = 0
) -> tuple[np.ndarray, np.ndarray, np.float32 | None]:
    """(codes, scale buffer, NVFP4 tensor scale S_dec or None) of ``p`` on the NumPy reference."""
    rounding = p.rounding
    if p.family == "mx":
        q: Any = rb.mx_quantize(
            x,
            p.element,
            axis=p.axis,
            scale_mode=p.mode,
            rounding=rounding,
            seed=seed,
            offset=offset,
            block_2d=p.block[0] > 1,
        )
        return q.codes, layout_scales(p, q.scales), None
    if p.family == "nvfp4":
        q = rb.nvfp4_quantize(
            x,
            mode=p.mode,
            two_level=p.two_level,
            global_amax=global_amax,
            block_2d=p.block[0] > 1,
            rounding=rounding,
            seed=seed,
            offset=offset,
        )
        return q.codes, layout_scales(p, q.scales), np.float32(q.tensor_scale)
    ue8m0 = p.family == "fp8_block_ue8m0"
    q = rb.fp8_block_quantize(
        x,
        block=p.block,
        element=p.element,
        scale_format="ue8m0" if ue8m0 else "f32",
        elem_op="div" if ue8m0 else p.mode,
        amax_floor=p.amax_floor,
    )
    return q.codes, layout_scales(p, q.scales), None


def reference_dequantize(
    p: BlockScaledProblem, codes: np.ndarray, buffer: np.ndarray, tensor_scale: float | None, out_dtype: Any
) -> np.ndarray:
    """The float tensor of ``p``'s codes and scale buffer on the NumPy reference (``out_dtype``)."""
    codes = np.asarray(codes).view(np.uint8).reshape(p.codes_shape)
    scales = compact_scales(p, np.asarray(buffer))
    if p.family == "mx":
        mq = rb.MXQuantized(codes, scales.view(np.uint8), p.element, p.axis, p.shape, p.mode, p.block[0] > 1)
        return rb.mx_dequantize(mq, out_dtype)
    if p.family == "nvfp4":
        s_dec = np.float32(1.0 if tensor_scale is None else tensor_scale)
        nq = rb.NVFP4Quantized(
            codes, scales.view(np.uint8), s_dec, np.float32(0), p.shape, p.mode, True, p.block[0] > 1
        )
        return rb.nvfp4_dequantize(nq, out_dtype)
    ue8m0 = p.family == "fp8_block_ue8m0"
    fq = rb.FP8BlockQuantized(
        codes,
        scales.view(np.uint8) if ue8m0 else scales.view(np.float32),
        p.element,
        p.block,
        "ue8m0" if ue8m0 else "f32",
        "div",
        p.shape,
    )
    return rb.fp8_block_dequantize(fq, out_dtype)


def _layout_matrix(layout: str, s: np.ndarray) -> np.ndarray:
    """A 2-D scale matrix S [R, C] laid out in ``layout`` (NumPy)."""
    if layout == "compact":
        return s
    if layout == "blocked":
        return rb.to_blocked(s)
    if layout == "column_major":
        return rb.col_major_tma_aligned(s)
    return rb.deepgemm_sf_layout(s)


def reference_columnwise(
    p: BlockScaledProblem, x: np.ndarray, global_amax: float | None = None, seed: int = 0, offset: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scale buffer) of the columnwise copy of ``p`` (``p.columnwise`` set) on the NumPy
    reference: :func:`quantplan.reference.block_scaled.quantize_transpose`'s columnwise copy, its
    scales laid out in ``p.layout`` (``te_mxfp8``: compact)."""
    assert p.columnwise is not None
    block_2d = p.block[0] > 1
    if p.family == "mx":
        pair = rb.quantize_transpose(
            x, "mx", p.columnwise, element=p.element, scale_mode=p.mode, rounding=p.rounding, seed=seed,
            offset=offset, block_2d=block_2d,
        )  # fmt: skip
    elif p.family == "nvfp4":
        pair = rb.quantize_transpose(
            x, "nvfp4", p.columnwise, mode=p.mode, two_level=p.two_level, global_amax=global_amax,
            block_2d=block_2d, rounding=p.rounding, seed=seed, offset=offset,
        )  # fmt: skip
    else:
        ue8m0 = p.family == "fp8_block_ue8m0"
        pair = rb.quantize_transpose(
            x, "fp8_block", p.columnwise, block=p.block, element=p.element,
            scale_format="ue8m0" if ue8m0 else "f32", elem_op="div" if ue8m0 else p.mode, amax_floor=p.amax_floor,
        )  # fmt: skip
    col = pair.columnwise
    scales = np.asarray(col.scales)
    if p.columnwise == "transposed":
        scales = _layout_matrix(p.layout, scales.reshape(p.columnwise_matrix))
    return np.asarray(col.codes), scales


# ---- the CUDA launch -----------------------------------------------------------------------------

_QUANTIZE_PARAMS = params_struct(
    "BlockScaledQuantizeParams",
    [
        *fields(ctypes.c_uint64, "x", "codes", "scales"),
        *fields(ctypes.c_int64, "rows", "cols", "blocks_per_row"),
        *fields(ctypes.c_int32, "rule", "layout"),
        ("layout_dim", ctypes.c_int64),
        *fields(ctypes.c_float, "amax_floor", "enc_overflow"),
        *fields(ctypes.c_int64, "pad_rows", "pad_cols"),
        ("tensor_amax", ctypes.c_uint64),
        *RNG_FIELDS,  # the Philox seed and offset of NVFP4's stochastic rounding (zero: nearest)
        ("s_dec_out", ctypes.c_uint64),  # NVFP4: where the kernel writes S_dec (null: not written)
    ],
)
_AMAX_PARAMS = params_struct(
    "BlockScaledTensorAmaxParams",
    [("x", ctypes.c_uint64), *fields(ctypes.c_int64, "n", "vector_elements"), ("amax", ctypes.c_uint64)],
)
_TILE_PARAMS = params_struct(
    "BlockScaledTileParams",
    [
        *fields(ctypes.c_uint64, "x", "codes", "scales"),
        *fields(ctypes.c_int64, "rows", "cols", "row_tile_base"),
        *fields(ctypes.c_int32, "rule", "layout"),
        ("layout_dim", ctypes.c_int64),
        *fields(ctypes.c_float, "amax_floor", "enc_overflow"),
        *fields(ctypes.c_int64, "scale_rows", "scale_cols", "pad_rows", "pad_cols"),
    ],
)
_TRANSPOSE_PARAMS = params_struct(
    "BlockScaledTransposeParams",
    [
        *fields(ctypes.c_uint64, "x", "codes", "scales", "col_codes", "col_scales"),
        *fields(ctypes.c_int64, "rows", "cols", "row_tile_base"),
        ("rule", ctypes.c_int32),
        *fields(ctypes.c_float, "amax_floor", "enc_overflow"),
        ("layout", ctypes.c_int32),
        *fields(ctypes.c_int64, "dim_r", "pad_rows_r", "pad_cols_r", "dim_c", "pad_rows_c", "pad_cols_c"),
    ],
)
_DEQUANTIZE_PARAMS = params_struct(
    "BlockScaledDequantizeParams",
    [
        *fields(ctypes.c_uint64, "codes", "scales"),
        ("scale_kind", ctypes.c_int32),
        ("tensor_scale", ctypes.c_uint64),
        *fields(ctypes.c_int64, "rows", "cols", "blocks_per_row"),
        ("out", ctypes.c_uint64),
    ],
)
#: Largest finite value of each input (the ``enc`` rule's replacement of an infinite 448 / amax).
_INPUT_MAX = {ElementKind.F16: 65504.0, ElementKind.BF16: 3.3895313892515355e38, ElementKind.F32: 3.4028234663852886e38}
_INPUT_DTYPE = {ElementKind.F16: "float16", ElementKind.BF16: "bfloat16", ElementKind.F32: "float32"}
#: The dequantize kernel's ``ScaleKind`` (qp_block_scaled.cuh) by scale element.
_SCALE_KIND_CODES = {ElementKind.E8M0: 0, ElementKind.F32: 1, ElementKind.FP8_E4M3: 2}
#: Bytes of the NVFP4 workspace: the device f32 tensor amax the quantize kernel reads.
NVFP4_WORKSPACE = 4


def _f32_byte_runs(value: float) -> tuple[tuple[int, int, int], ...]:
    """(byte offset, byte, count) runs of the little-endian float32 bits of ``value`` (rounded to
    nearest, +-Inf past the f32 range, as the reference's ``np.float32``): the memsets that store
    it on the device with no host buffer, so the store is stream-ordered and graph-capturable."""
    return _byte_runs(ctypes.c_uint32.from_buffer(ctypes.c_float(value)).value)


@functools.lru_cache(maxsize=256)
def _byte_runs(bits: int) -> tuple[tuple[int, int, int], ...]:
    """(byte offset, byte, count) runs of equal bytes of the little-endian 32-bit word ``bits``."""
    raw = bits.to_bytes(4, "little")
    runs: list[tuple[int, int, int]] = []
    for i, byte in enumerate(raw):
        if runs and runs[-1][1] == byte:
            runs[-1] = (runs[-1][0], byte, runs[-1][2] + 1)
        else:
            runs.append((i, byte, 1))
    return tuple(runs)


def cuda_refusal(p: BlockScaledProblem) -> str | None:
    """Why the CUDA backend does not serve quantization problem ``p`` (None: a kernel does).

    Served: 1-D blocks along the last axis (MX 1x32, NVFP4 1x16 ``te``, FP8 1x128) in every scale
    layout (``block_scaled.cu``); 2-D tiles MXFP8 32x32 (compact, blocked) and FP8 128x128
    (compact, column_major) (``block_scaled_tiles.cu``); the fused columnwise copy of MXFP8 1x32
    (``transposed`` in compact / blocked scales, ``te_mxfp8``) and FP8 1x128 (``transposed`` in
    compact / column_major / packed_ue8m0 scales); nearest rounding, and stochastic rounding for
    NVFP4 1x16 (``te``)."""
    last = p.axis == len(p.shape) - 1
    if p.stochastic and not p.is_nvfp4:
        return f"stochastic rounding of {p.format.name} has no CUDA kernel (NVFP4 1x16 has one)"
    if not last:
        return f"blocks along axis {p.axis} of a rank-{len(p.shape)} tensor have no CUDA kernel yet"
    if p.is_nvfp4 and p.mode != "te":
        return f"NVFP4 scale_mode={p.mode!r}: the CUDA kernel computes the te order only"
    tile = p.block[0] > 1
    if p.columnwise is not None:
        if tile or p.is_nvfp4:
            return (
                f"the fused transpose of {p.format.name} {p.block[0]}x{p.block[1]} has no CUDA kernel "
                f"(block_scaled_transpose serves MXFP8 1x32 and FP8 1x128)"
            )
        if p.element not in TRANSPOSE_ELEMENTS:
            return f"the fused transpose of {p.format.name} has no CUDA kernel (MXFP8 e4m3 / e5m2 and FP8 only)"
        if p.layout not in TRANSPOSE_LAYOUTS[p.block[1]]:
            return (
                f"the fused transpose of {p.block[0]}x{p.block[1]} blocks writes the scale layouts "
                f"{TRANSPOSE_LAYOUTS[p.block[1]]}, not {p.layout!r}"
            )
        return None
    if tile:
        if p.is_nvfp4:
            return "NVFP4 16x16 tiles have no CUDA kernel (block_scaled_tiles.cu serves FP8 128x128 and MX 32x32)"
        if p.layout not in TILE_LAYOUTS[p.block]:
            return f"{p.block[0]}x{p.block[1]} tiles write the scale layouts {TILE_LAYOUTS[p.block]}, not {p.layout!r}"
    return None


def dequantize_refusal(p: BlockScaledProblem) -> str | None:
    """Why the CUDA backend does not serve dequantization problem ``p`` (None: ``block_scaled_dequantize`` does).

    The kernel reads compact scales with one row of scales per row of x along the last axis: every
    1-D block, and the 2-D tiles whose compact scales repeat over the tile's rows (MX 32x32, NVFP4
    16x16); not FP8 128x128 (one scale row per 128 rows) or the other layouts."""
    if p.axis != len(p.shape) - 1:
        return f"blocks along axis {p.axis} of a rank-{len(p.shape)} tensor have no CUDA dequantize kernel"
    if p.layout != "compact":
        return f"the dequantize kernel reads compact scales, not {p.layout!r}"
    if p.family.startswith("fp8_block") and p.block[0] > 1:
        return "FP8 128x128 tiles have no CUDA dequantize kernel (its scales are one row per 128 rows)"
    return None


class _GridLaunch(PreparedLaunch):
    """A prepared launch on a 2-D grid (``grid`` x ``grid_y``) with ``shared`` bytes of dynamic shared memory."""

    __slots__ = ("grid_y", "shared")

    def __init__(
        self, function: Any, grid: tuple[int, int], block: int, shared: int, params_type: Any, **fixed: Any
    ) -> None:
        super().__init__(function, grid[0], block, params_type, **fixed)
        self.grid_y = int(grid[1])
        self.shared = int(shared)

    def launch(self, stream_handle: int) -> None:
        """Enqueue the kernel with the current field values on ``stream_handle``."""
        self._driver_launch(
            self.function_ptr, self.grid, self.grid_y, 1, self.block, 1, 1, self.shared, stream_handle,
            self._kernel_params, 0,
        )  # fmt: skip


@dataclass(frozen=True)
class _Launches:
    """The prepared launches of one problem, resolved at ``select``.

    ``aligned`` (empty: none) runs when x and every codes buffer are 16-byte aligned, ``general``
    otherwise; each is the launches of one call in order (row-tile slices of the tile kernels).
    ``amax``: NVFP4's tensor-amax launch (computed amax). ``names``: the instantiations loaded.
    """

    aligned: tuple[PreparedLaunch, ...]
    general: tuple[PreparedLaunch, ...]
    describe: str
    names: tuple[str, ...]
    amax: PreparedLaunch | None = None

    @property
    def launches(self) -> tuple[PreparedLaunch, ...]:
        return (*self.aligned, *self.general, *(() if self.amax is None else (self.amax,)))


def _load(family: str, names: list[str], device_id: int) -> dict[str, Any]:
    info = device_info(device_id)
    return {name: load_kernels(family, [name], info.arch, device_id, kernel_options())[name] for name in names}


def _rule(p: BlockScaledProblem) -> tuple[str, int]:
    """The scale rule's name and ``ScaleRule`` code."""
    if p.family == "nvfp4":
        return "te", NVFP4_RULES["te"]
    if p.family == "mx":
        return p.mode, MX_RULES[p.mode]
    rule = "ue8m0" if p.family == "fp8_block_ue8m0" else p.mode
    return rule, FP8_RULES[rule]


def _prepare_lanes(p: BlockScaledProblem, device_id: int) -> _Launches:
    """``block_scaled_quantize`` (1-D blocks; NVFP4 with the tensor-amax kernel) for ``p``."""
    info = device_info(device_id)
    block = p.block[1]
    rule, rule_code = _rule(p)
    element = ("nvfp4_sr" if p.stochastic else "nvfp4") if p.is_nvfp4 else p.element
    dtype = _INPUT_DTYPE[p.input_element]
    cols = p.shape[-1]
    rows = p.numel // cols if cols else 0
    per_row = _ceil(cols, block)
    geo = scale_geometry(p.layout, rows, per_row, p.scale_kind is ElementKind.F32)
    contiguous = cols % block == 0
    teams = rows * per_row
    divide = rule == "div"
    schedules = [choose_schedule(dtype, block, False, teams, info.sm_count, p.stochastic, divide)]
    if contiguous:
        schedules.append(choose_schedule(dtype, block, True, teams, info.sm_count, p.stochastic, divide))
    names = [kernel_name(dtype, element, block, divide, i == 1, sched) for i, sched in enumerate(schedules)]
    amax_name = amax_kernel_name(dtype) if p.is_nvfp4 and p.two_level else None
    functions = _load("block_scaled", names + ([amax_name] if amax_name else []), device_id)
    fixed = dict(
        rows=rows, cols=cols, blocks_per_row=per_row, rule=rule_code, layout=geo.layout, layout_dim=geo.dim,
        amax_floor=p.amax_floor, enc_overflow=_INPUT_MAX[p.input_element], pad_rows=geo.pad_rows,
        pad_cols=geo.pad_cols, tensor_amax=0, seed_ptr=0, offset_ptr=0, seed_value=0, offset_value=0, s_dec_out=0,
    )  # fmt: skip

    def prepared(name: str, sched: Schedule) -> PreparedLaunch:
        fn = functions[name]
        resident = occupancy_grid(fn, 256, 1 << 30, info) // info.sm_count if sched.persistent else 0
        threads, grid = launch_shape(sched.slots(dtype, block, teams), info.sm_count, resident, sched.unroll)
        return PreparedLaunch(fn, grid, threads, _QUANTIZE_PARAMS, **fixed)

    general = prepared(names[0], schedules[0])
    aligned = (prepared(names[1], schedules[1]),) if contiguous else ()
    amax = None
    if amax_name is not None:
        n, vec = p.numel, VECTOR_ELEMENTS[dtype]
        grid = max(1, min(_ceil(max(n // vec, 1), BLOCK_THREADS), 4 * info.sm_count))
        amax = PreparedLaunch(functions[amax_name], grid, BLOCK_THREADS, _AMAX_PARAMS, n=n, vector_elements=0)
    tag = f"lanes[{p.format.name},1x{block},{rule},{p.layout}" + (",stochastic" if p.stochastic else "")
    tag += ",contiguous|general]" if contiguous else ",general]"
    if amax is not None:
        tag = "tensor_amax+" + tag
    return _Launches(aligned, (general,), tag, tuple(functions), amax)


def _sliced_launches(
    functions: dict[str, Any],
    names: list[str],
    shared: int,
    params_type: Any,
    slices: list[tuple[tuple[int, int], dict[str, int]]],
    tag: str,
    **fixed: Any,
) -> _Launches:
    """The launches of a tile kernel run as row-tile slices: per instantiation (``names[0]`` the
    general one, ``names[1]`` where loaded the aligned one) one launch per slice, on the slice's
    grid with its own fields (row-tile base, padding) over ``fixed``; ``tag``: the describe string
    up to the variants it ends with."""

    def launches(name: str) -> tuple[PreparedLaunch, ...]:
        return tuple(
            _GridLaunch(functions[name], grid, TILE_THREADS, shared, params_type, **fixed, **own)
            for grid, own in slices
        )

    general = launches(names[0])
    aligned = launches(names[1]) if len(names) > 1 else ()
    return _Launches(aligned, general, tag + (",aligned|general]" if aligned else ",general]"), tuple(names))


def _prepare_tiles(p: BlockScaledProblem, device_id: int) -> _Launches:
    """``block_scaled_tiles`` (MX 32x32, FP8 128x128) for ``p``: one launch per slice of row tiles."""
    dtype = _INPUT_DTYPE[p.input_element]
    rule, rule_code = _rule(p)
    sched = TILE_SCHEDULES[p.block, dtype]
    cols = p.shape[-1]
    rows = math.prod(p.shape[:-1])
    scale_rows, scale_cols = (rows if p.family == "mx" else _ceil(rows, p.block[0])), _ceil(cols, p.block[1])
    geo = scale_geometry(p.layout, scale_rows, scale_cols, p.scale_kind is ElementKind.F32)
    variants = (False, True) if cols % 16 == 0 else (False,)
    names = [tile_kernel_name(dtype, p.element, rule == "div", aligned, sched) for aligned in variants]
    functions = _load("block_scaled_tiles", names, device_id)
    slices = [
        (grid, {"row_tile_base": base, "pad_rows": pad_rows, "pad_cols": pad_cols})
        for grid, base, pad_rows, pad_cols in tile_slices(rows, cols, sched, geo, scale_rows, scale_cols)
    ]
    return _sliced_launches(
        functions, names, 0, _TILE_PARAMS, slices,
        f"tiles[{p.format.name},{p.block[0]}x{p.block[1]},{rule},{p.layout}",
        rows=rows, cols=cols, rule=rule_code, layout=geo.layout, layout_dim=geo.dim, amax_floor=p.amax_floor,
        enc_overflow=_INPUT_MAX[p.input_element], scale_rows=scale_rows, scale_cols=scale_cols,
    )  # fmt: skip


def _prepare_transpose(p: BlockScaledProblem, device_id: int) -> _Launches:
    """``block_scaled_transpose`` (MXFP8 1x32, FP8 1x128 with 128x1 columnwise) for ``p``."""
    dtype = _INPUT_DTYPE[p.input_element]
    rule, rule_code = _rule(p)
    block = p.block[1]
    te = p.columnwise == "te_mxfp8"
    cols = p.shape[-1]
    rows = math.prod(p.shape[:-1])
    f32 = p.scale_kind is ElementKind.F32
    geo_r = scale_geometry(p.layout, rows, _ceil(cols, block), f32)
    geo_c = scale_geometry(p.layout, cols, _ceil(rows, block), f32)
    sched = TRANSPOSE_SCHEDULES[dtype]
    variants = (False, True) if cols % 16 == 0 and rows % 16 == 0 else (False,)
    names = [transpose_kernel_name(dtype, p.element, block, te, rule == "div", aligned, sched) for aligned in variants]
    functions = _load("block_scaled_tiles", names, device_id)
    shared = transpose_shared_bytes(dtype, block, te)
    for fn in functions.values():
        allow_shared(fn, shared)
    slices = [
        (grid, {"row_tile_base": base, "pad_rows_r": pads_r[0], "pad_cols_r": pads_r[1],
                "pad_rows_c": pads_c[0], "pad_cols_c": pads_c[1]})
        for grid, base, pads_r, pads_c in transpose_slices(rows, cols, block, geo_r, geo_c)
    ]  # fmt: skip
    return _sliced_launches(
        functions, names, shared, _TRANSPOSE_PARAMS, slices,
        f"transpose[{p.format.name},1x{block},{rule},{p.layout},{p.columnwise}",
        rows=rows, cols=cols, rule=rule_code, amax_floor=p.amax_floor, enc_overflow=_INPUT_MAX[p.input_element],
        layout=geo_r.layout, dim_r=geo_r.dim, dim_c=geo_c.dim,
    )  # fmt: skip


def _prepare(p: BlockScaledProblem, device_id: int) -> _Launches:
    """Compile (first use) and prepare the quantize launches of ``p`` on ``device_id`` (``cuda_refusal`` is None)."""
    if p.columnwise is not None:
        return _prepare_transpose(p, device_id)
    if p.block[0] > 1:
        return _prepare_tiles(p, device_id)
    return _prepare_lanes(p, device_id)


def _prepare_dequantize(p: BlockScaledProblem, device_id: int) -> _Launches:
    """``block_scaled_dequantize`` for ``p`` (``dequantize_refusal`` is None)."""
    assert p.output_element is not None
    info = device_info(device_id)
    dtype = _INPUT_DTYPE[p.output_element]
    element, block = ("nvfp4" if p.is_nvfp4 else p.element), p.block[1]
    name = dequantize_kernel_name(dtype, element, block)
    fn = _load("block_scaled", [name], device_id)[name]
    cols = p.shape[-1]
    rows = p.numel // cols if cols else 0
    grid = max(1, min(_ceil(rows * _ceil(cols, 8), BLOCK_THREADS), 32 * info.sm_count))
    scale_kind = _SCALE_KIND_CODES[p.format.scale_element(p.output_element)]
    launch = PreparedLaunch(
        fn, grid, BLOCK_THREADS, _DEQUANTIZE_PARAMS, scale_kind=scale_kind, rows=rows, cols=cols,
        blocks_per_row=_ceil(cols, block), tensor_scale=0,
    )  # fmt: skip
    return _Launches((), (launch,), f"dequantize[{p.format.name},{p.block[0]}x{block},{dtype}]", (name,))


# ---- plans -------------------------------------------------------------------------------------


#: The end of the Unsupported message of a dequantize the CUDA backend does not serve.
_REFERENCE_ADVICE = "; select this dequantize with PlanPreference(backend=BackendKind.REFERENCE) on host arrays"


def _problem_on(
    stream: Any,
    desc: _BlockScaledFields,
    desc_type: type[_BlockScaledFields],
    pref: PlanPreference | None,
    refusal: Callable[[BlockScaledProblem], str | None],
    advice: str,
) -> tuple[BlockScaledProblem, int | None]:
    """What both plans' ``select`` do first: ``desc`` checked (a ``desc_type``), its problem, and
    the device it runs on (None: the reference backend). On CUDA, Unsupported with ``refusal``'s
    reason followed by ``advice`` for a problem no kernel serves."""
    check_descriptor(desc, desc_type)
    problem = desc._problem()
    if choose_backend(pref, stream) is BackendKind.REFERENCE:
        return problem, None
    reason = refusal(problem)
    if reason is not None:
        raise Unsupported(reason + advice)
    return problem, stream_device_id(stream)


class _BlockScaledChecks(OperandChecks):
    """The operand checks the quantize and dequantize plans share."""

    _codes_info: ElementInfo
    _scales_info: ElementInfo

    def _codes_and_scales(
        self, codes: Any, scales: Any, prefix: str, codes_shape: tuple[int, ...], scales_shape: tuple[int, ...]
    ) -> tuple[Operand, Operand]:
        """A codes buffer and its scales (named ``prefix + "codes"`` / ``prefix + "scales"``), each
        required, of its shape and of the format's storage dtype."""
        return (
            self._required(codes, prefix + "codes", codes_shape, self._codes_info),
            self._required(scales, prefix + "scales", scales_shape, self._scales_info),
        )


class BlockScaledQuantizePlan(_BlockScaledChecks, Plan[BlockScaledQuantizeArgs, BlockScaledOperands]):
    """Block-scaled quantization: MX, NVFP4 or FP8 blocks, scales from the data, in the GEMM's layout.

    Formulas (MICROSCALING.md; every step one IEEE f32 operation, no FMA, no flush to zero;
    amax over a block's finite valid elements; a partial last block uses its valid elements):

    * MX (blocks of 32, E8M0 byte s): ``rceil`` s = RCEIL(fl(amax / max_elem)), ``floor`` /
      ``ceil`` / ``even`` from amax's exponent (§2.3); ``code = enc(fl(x * 2**(127 - s)))``.
    * NVFP4 ``te`` (§3.2-3.3): ``S_enc = fl(2688 / amax)`` (1 if amax is 0), ``S_dec = fl(1 / S_enc)``;
      per block of 16 ``s = e4m3(fl(bamax * fl(S_enc * fl32(1/6))))``,
      ``code = e2m1(fl(x * min(fl(1 / fl(f32(s) * S_dec)), FLT_MAX)))``; ``torchao``: §3.3.
    * FP8 blocks (§4.2, a = max(amax, amax_floor)): ``div`` s = fl(a / 448), ``code = e4m3(fl(x / s))``;
      ``mul_rcp`` ``e4m3(fl(x * fl(1 / s)))``; ``enc`` e = fl(448 / a), ``code = e4m3(fl(x * e))``,
      s = fl(1 / e); UE8M0 byte = clamp(RCEIL(fl(a / 448)), 1, 254); all-zero tile: s = 1.
    * ``enc`` is RNE with saturation to ±max (stochastic rounding: §1.6, Philox words by the
      row-major flat index of x). A block holding NaN or ±Inf gets the NaN scale (E8M0 0xFF,
      E4M3 0x7F, f32 0x7FC00000) and codes 0.
    * ``columnwise`` (§6): also C = the same quantization of xᵀ (blocks along M; FP8 1x128: 128x1
      blocks of x), from the same x (one read on CUDA), stored [K, M] or TE's ``te_mxfp8``.

    **When to use:** producing MX / NVFP4 / FP8-block GEMM operands (cuBLAS / CUTLASS block-scaled
    GEMMs, DeepGEMM, TransformerEngine recipes) with the scales already in the layout the GEMM
    reads. One-liners: ``qp.quantize(x, "mxfp8")``, ``"mxfp4"``, ``"nvfp4"``, ``"fp8_block"``.

    **Dtypes:** input F16 / BF16 / F32; codes uint8 (or float8_e4m3fn / float8_e5m2 /
    float4_e2m1fn_x2 / int8 views); scales per ``scale_layout`` (see the descriptor).

    **Shape limits:** rank >= 1, any extents (partial blocks), 64-bit indexing. CUDA, blocks
    along the last axis (:func:`cuda_refusal`): MX 1x32, NVFP4 1x16 (``te``, nearest or
    stochastic rounding) and FP8 1x128 in every scale layout; MXFP8 32x32 tiles (compact,
    blocked) and FP8 128x128 tiles (compact, column_major); the fused columnwise copy of MXFP8
    1x32 and FP8 1x128. Everything else (MX stochastic rounding, other axes, NVFP4 ``torchao`` and
    16x16, the other tile and transpose combinations) runs on the REFERENCE backend: on CUDA
    ``select`` raises Unsupported.

    **Kernel variants** (``sku().variant``): ``lanes[format,1xB,rule,layout,...]``
    (``block_scaled.cu``): each thread holds 16-byte vectors of one block (the tuning table
    ``_block_scaled_kernels.SCHEDULES``), a team of threads per block, amax by shuffles of integer
    keys, the scale written in the layout by the team's first thread; a contiguous twin (vector
    loads) when the last extent is a multiple of B and x and the codes are 16-byte aligned;
    ``tensor_amax+lanes[...]``: NVFP4, first the tensor amax (``block_scaled_tensor_amax``)
    unless ``global_amax`` is given; ``lanes[nvfp4,...,stochastic,...]``: NVFP4 with §1.6
    stochastic rounding (element ``nv_e2m1_sr``; seed and offset values, or one-element int64
    device arrays the kernel reads at launch). ``tiles[format,RxC,rule,layout,...]`` and
    ``transpose[format,1xB,rule,layout,columnwise,...]`` (``block_scaled_tiles.cu``): a CTA per
    tile of x, one launch per 65535 row tiles; an aligned twin when the last extent (and, for the
    transpose, the row count) is a multiple of 16 and x and the codes are 16-byte aligned.
    ``numpy`` on the reference backend.

    **Workspace:** none, except NVFP4 two-level on CUDA: 4 bytes of device memory (the f32 tensor
    amax the quantize kernel reads, computed by the amax kernel or stored from a number
    ``global_amax`` by byte memsets, no host buffer). NVFP4's ``tensor_scale`` output
    S_dec = fl(1 / S_enc) is written by the quantize kernel from the amax it reads (1 for one
    level), so ``run`` never synchronizes the stream and is capturable in a CUDA graph for every
    amax source (a device ``global_amax`` is read at each replay).

    **Precision guarantee:** bit-exact to :mod:`quantplan.reference.block_scaled` (codes, scales,
    layout padding zero); deterministic.
    """

    _args_type = BlockScaledQuantizeArgs
    _category = OpCategory.QUANTIZE
    _op = QuantizeKind.DYNAMIC_RANGE
    _checked = BlockScaledOperands
    _extract_fields = (
        "input", "codes", "scales", "tensor_scale", "global_amax", "rng_seed", "rng_offset",
        "columnwise_codes", "columnwise_scales",
    )  # fmt: skip

    def __init__(
        self,
        desc: BlockScaledQuantizeDescriptor,
        problem: BlockScaledProblem,
        device_id: int | None = None,
        variant: str = "numpy",
        launches: _Launches | None = None,
    ) -> None:
        prepared = () if launches is None else launches.launches
        cuda_nvfp4 = device_id is not None and problem.is_nvfp4
        super().__init__(
            problem, device_id, problem.input_element, problem.code_kind, variant, prepared=prepared,
            workspace_bytes=NVFP4_WORKSPACE if cuda_nvfp4 and problem.two_level else 0,
            empty=problem.numel == 0 and not cuda_nvfp4,  # an empty NVFP4 problem still writes S_dec
        )  # fmt: skip
        self.descriptor = desc
        self._launches = launches
        self._in_info = ELEMENTS[problem.input_element]
        self._codes_info = _codes_info(problem)
        self._scales_info = _scales_info(problem)
        self._nvfp4 = problem.is_nvfp4
        self._stochastic = problem.stochastic

    @classmethod
    def select(
        cls, stream: Any, desc: BlockScaledQuantizeDescriptor, pref: PlanPreference | None = None
    ) -> BlockScaledQuantizePlan:
        """Validate ``desc`` (InvalidProblem / Unsupported naming the field), pick the backend,
        compile and prepare the kernels (CUDA, first use): the instantiations, grids, row-tile
        slices, argument blocks and workspace. On CUDA, Unsupported for the combinations without
        a kernel (:func:`cuda_refusal`)."""
        problem, device_id = _problem_on(
            stream, desc, BlockScaledQuantizeDescriptor, pref, cuda_refusal, ": " + _SERVED_ON_CUDA
        )
        if device_id is None:
            return preferred(cls(desc, problem), pref)
        launches = _prepare(problem, device_id)
        return preferred(cls(desc, problem, device_id, launches.describe, launches), pref)

    # ---- arguments ----------------------------------------------------------------------------

    def _check(self, args: BlockScaledQuantizeArgs) -> BlockScaledOperands:
        p = self.problem
        x = self._required(args.input, "input", p.shape, self._in_info)
        codes, scales = self._codes_and_scales(args.codes, args.scales, "", p.codes_shape, p.scales_shape)
        tensor_scale: Operand | None = None
        global_amax: Operand | float | None = None
        if self._nvfp4:
            tensor_scale = self._required(args.tensor_scale, "tensor_scale", (1,), _F32)
            global_amax = self._global_amax(args.global_amax)
        elif args.tensor_scale is not None or args.global_amax is not None:
            raise InvalidProblem(f"tensor_scale / global_amax apply to NVFP4 only; leave them None for {p.format.name}")
        seed, offset = self._rng(self._stochastic, args.rng_seed, args.rng_offset)
        col_codes = col_scales = None
        if p.columnwise:
            col_codes, col_scales = self._codes_and_scales(
                args.columnwise_codes,
                args.columnwise_scales,
                "columnwise_",
                p.columnwise_codes_shape,
                p.columnwise_scales_shape,
            )
        elif args.columnwise_codes is not None or args.columnwise_scales is not None:
            raise InvalidProblem(
                "columnwise_codes / columnwise_scales are the fused transpose's outputs; the descriptor has "
                "columnwise=None (pass columnwise='transposed' or 'te_mxfp8' to write them)"
            )
        check_outputs(
            (
                ("codes", codes), ("scales", scales), ("tensor_scale", tensor_scale),
                ("columnwise_codes", col_codes), ("columnwise_scales", col_scales),
            ),
            (("input", x), ("global_amax", global_amax)),
        )  # fmt: skip
        return BlockScaledOperands(x, codes, scales, tensor_scale, global_amax, seed, offset, col_codes, col_scales)

    def _global_amax(self, value: Any) -> Operand | float | None:
        """NVFP4's calibrated amax: None, a number >= 0 (+Inf allowed), or a one-element float32 array."""
        if value is None:
            return None
        if is_scalar(value):
            amax = float(value)
            if not amax >= 0:
                raise InvalidProblem(f"global_amax={value!r} must be >= 0 (and not NaN), or None to compute it")
            return value  # type: ignore[no-any-return]
        op = operand(value, "global_amax")
        if op.device_id != self.device_id or (self.backend is BackendKind.REFERENCE and type(op.obj) is not np.ndarray):
            self._check_residence(op, "global_amax")
        if op.size != 1 or op.dtype_name != "float32":
            raise InvalidProblem(
                f"global_amax must be None, a number or a one-element float32 array, got {op.dtype_name} {op.shape}"
            )
        return op

    # ---- execution --------------------------------------------------------------------------

    def _launch(self, handle: int, workspace: Workspace | None, a: BlockScaledOperands) -> None:
        k = self._launches
        assert k is not None and self.device_id is not None
        col = a.col_codes
        if k.aligned and not (a.x.ptr | a.codes.ptr | (0 if col is None else col.ptr)) & 15:
            launches = k.aligned
        else:
            launches = k.general
        for launch in launches:
            params = launch.params
            params.x = a.x.ptr
            params.codes = a.codes.ptr
            params.scales = a.scales.ptr
            if col is not None:
                params.col_codes = col.ptr
                params.col_scales = a.col_scales.ptr  # type: ignore[union-attr]
            if self._stochastic:
                set_rng(params, a.seed, a.offset)
        if self._nvfp4:
            self._launch_nvfp4(handle, workspace, a, launches)
        else:
            launch_on(self.device_id, handle, *launches)

    def _launch_nvfp4(
        self, handle: int, workspace: Workspace | None, a: BlockScaledOperands, launches: tuple[PreparedLaunch, ...]
    ) -> None:
        """NVFP4: the tensor amax the kernel reads (none: one level; a device array; a number stored
        into the workspace; or computed into it), then the quantize launch, which also writes S_dec
        into ``tensor_scale`` (an empty problem too: its launch has no block to quantize). Memsets,
        stores and launches, stream-ordered: no host round trip, capturable in a CUDA graph."""
        p, k = self.problem, self._launches
        assert k is not None and self.device_id is not None and a.tensor_scale is not None
        # This call (the fast path's generic tail of a memset signature, too) writes the argument
        # blocks: a traced signature's function must store its constants again.
        self._tail_owner[0] = None
        amax = a.global_amax
        amax_ptr = 0
        if p.two_level:
            if type(amax) is Operand:
                amax_ptr = amax.ptr
            else:
                assert workspace is not None
                amax_ptr = workspace.ptr
                import cupy

                memset = cupy.cuda.runtime.memsetAsync
                with cupy.cuda.Device(self.device_id):
                    if amax is None:  # max |x| by atomic maxima of f32 bits over a zeroed word
                        memset(amax_ptr, 0, 4, handle)
                    else:
                        for start, byte, count in _f32_byte_runs(float(amax)):  # type: ignore[arg-type]
                            memset(amax_ptr + start, byte, count, handle)
                if amax is None and k.amax is not None and p.numel:
                    k.amax.params.x = a.x.ptr
                    n = p.numel
                    vec = VECTOR_ELEMENTS[_INPUT_DTYPE[p.input_element]]
                    k.amax.params.vector_elements = 0 if a.x.ptr % 16 else n // vec * vec
                    k.amax.params.amax = amax_ptr
                    launch_on(self.device_id, handle, k.amax)
        for launch in launches:
            launch.params.tensor_amax = amax_ptr
            launch.params.s_dec_out = a.tensor_scale.ptr
        launch_on(self.device_id, handle, *launches)

    def _run_reference(self, a: BlockScaledOperands) -> None:
        p = self.problem
        amax = _scalar_of(a.global_amax)
        if p.numel == 0:
            if a.tensor_scale is not None:
                empty_s_dec = rb.nvfp4_tensor_scales(0.0 if amax is None else amax, p.mode, p.two_level)[1]
                self._write_host(a.tensor_scale, np.asarray([empty_s_dec], np.float32))
            return
        x = host_view(a.x, self._in_info).reshape(p.shape)
        seed, offset = int(_scalar_of(a.seed) or 0), int(_scalar_of(a.offset) or 0)
        codes, scales, s_dec = reference_quantize(p, x, amax, seed, offset)
        self._write_host(a.codes, codes)
        self._write_host(a.scales, scales)
        if a.tensor_scale is not None and s_dec is not None:
            self._write_host(a.tensor_scale, np.asarray([s_dec], np.float32))
        if a.col_codes is not None and a.col_scales is not None:
            col_codes, col_scales = reference_columnwise(p, x, amax, seed, offset)
            self._write_host(a.col_codes, col_codes)
            self._write_host(a.col_scales, col_scales)


class BlockScaledDequantizePlan(_BlockScaledChecks, Plan[BlockScaledDequantizeArgs, BlockScaledDequantizeOperands]):
    """Block-scaled dequantization: (codes, scales[, tensor scale]) -> y, for every block-scaled format.

    Formulas (every product one f32 operation, then one rounding to the output dtype):
    MX ``y = fl(dec(code) * 2**(s - 127))`` (§2.9); NVFP4 ``y = fl(fl(e2m1 * f32(s)) * S_dec)``
    (§3.8); FP8 blocks ``y = fl(dec(code) * s)`` (s = 2**(byte - 127) for UE8M0). A NaN scale
    (E8M0 0xFF, E4M3 0x7F, f32 NaN) gives NaN over its block.

    **When to use:** checking or consuming block-scaled tensors outside a GEMM (the one-liner is
    ``qt.dequantize()`` of ``qp.quantize(x, "mxfp8")``).

    **Dtypes:** codes and scales as :class:`BlockScaledQuantizePlan` writes them; output F16 /
    BF16 (or its uint16 bits) / F32.

    **Shape limits:** as the quantization. CUDA (``block_scaled_dequantize``, variant
    ``dequantize[format,RxC,dtype]``): compact scales, blocks along the last axis, every 1-D block
    and the MX 32x32 / NVFP4 16x16 tiles (their compact scales repeat over the tile's rows); FP8
    128x128 tiles and the other layouts run on the REFERENCE backend (:func:`dequantize_refusal`;
    on CUDA ``select`` raises Unsupported).

    **Workspace:** none.

    **Precision guarantee:** exact in f32 unless a product overflows; one rounding to the output
    dtype; bit-exact to :mod:`quantplan.reference.block_scaled`.
    """

    _args_type = BlockScaledDequantizeArgs
    _category = OpCategory.DEQUANTIZE
    _op = QuantizeKind.STATIC
    _checked = BlockScaledDequantizeOperands
    _extract_fields = ("codes", "scales", "output", "tensor_scale")

    def __init__(
        self,
        desc: BlockScaledDequantizeDescriptor,
        problem: BlockScaledProblem,
        device_id: int | None = None,
        launches: _Launches | None = None,
    ) -> None:
        assert problem.output_element is not None
        variant = "numpy" if launches is None else launches.describe
        prepared = () if launches is None else launches.launches
        super().__init__(problem, device_id, problem.output_element, problem.code_kind, variant, prepared=prepared)
        self.descriptor = desc
        self._launches = launches
        self._out_info = ELEMENTS[problem.output_element]
        self._codes_info = _codes_info(problem)
        self._scales_info = _scales_info(problem)

    @classmethod
    def select(
        cls, stream: Any, desc: BlockScaledDequantizeDescriptor, pref: PlanPreference | None = None
    ) -> BlockScaledDequantizePlan:
        """Validate ``desc`` and pick the backend; on CUDA resolve the dequantize kernel, grid and
        argument block (Unsupported for what it does not serve: :func:`dequantize_refusal`)."""
        problem, device_id = _problem_on(
            stream, desc, BlockScaledDequantizeDescriptor, pref, dequantize_refusal, _REFERENCE_ADVICE
        )
        if device_id is None:
            return preferred(cls(desc, problem), pref)
        return preferred(cls(desc, problem, device_id, _prepare_dequantize(problem, device_id)), pref)

    def _check(self, args: BlockScaledDequantizeArgs) -> BlockScaledDequantizeOperands:
        p = self.problem
        codes, scales = self._codes_and_scales(args.codes, args.scales, "", p.codes_shape, p.scales_shape)
        y = self._required(args.output, "output", p.shape, self._out_info)
        tensor_scale: Operand | None = None
        if p.is_nvfp4:
            tensor_scale = self._required(args.tensor_scale, "tensor_scale", (1,), _F32)
        elif args.tensor_scale is not None:
            raise InvalidProblem(f"tensor_scale applies to NVFP4 only; leave it None for {p.format.name}")
        check_outputs((("output", y),), (("codes", codes), ("scales", scales), ("tensor_scale", tensor_scale)))
        return BlockScaledDequantizeOperands(codes, scales, y, tensor_scale)

    def _run_reference(self, a: BlockScaledDequantizeOperands) -> None:
        p = self.problem
        if p.numel == 0:
            return
        s_dec = None if a.tensor_scale is None else float(host_values(a.tensor_scale)[0])
        codes = host_view(a.codes, ELEMENTS[ElementKind.U8])
        scales = np.asarray(a.scales.obj).view(ELEMENTS[p.scale_kind].numpy_dtype)
        y = reference_dequantize(p, codes, scales, s_dec, self._out_info.numpy_dtype)
        self._write_host(a.y, y)

    def _launch(self, handle: int, workspace: Workspace | None, a: BlockScaledDequantizeOperands) -> None:
        k = self._launches
        assert k is not None and self.device_id is not None
        launch = k.general[0]
        params = launch.params
        params.codes = a.codes.ptr
        params.scales = a.scales.ptr
        params.out = a.y.ptr
        params.tensor_scale = 0 if a.tensor_scale is None else a.tensor_scale.ptr
        launch_on(self.device_id, handle, launch)


__all__ = [
    "BLOCK_FORMATS",
    "SCALE_LAYOUTS",
    "BlockScaledDequantizeArgs",
    "BlockScaledDequantizeDescriptor",
    "BlockScaledDequantizePlan",
    "BlockScaledProblem",
    "BlockScaledQuantizeArgs",
    "BlockScaledQuantizeDescriptor",
    "BlockScaledQuantizePlan",
    "COLUMNWISE",
    "compact_scales",
    "cuda_refusal",
    "dequantize_refusal",
    "layout_scales",
    "reference_columnwise",
    "reference_dequantize",
    "reference_quantize",
    "resolve",
]
