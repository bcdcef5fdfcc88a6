"""The kernel side of 2-D block-scaled tiles and the fused quantize + transpose
(``kernels/block_scaled_tiles.cu``).

Machinery: the instantiation names, the tuning table, the launch geometry, and two CuPy
launchers that the block-scaled plans build on; the semantics are
:mod:`quantplan.reference.block_scaled` (MICROSCALING.md §2.8, §4, §6), bit for bit.

* :func:`quantize_block_scaled_2d`: one scale per tile of x [M, K] (N-D: leading dims flattened
  into M). ``block=(128, 128)``: FP8 e4m3 / e5m2 weight tiles (DeepSeek / DeepGEMM), scales
  [⌈M/128⌉, ⌈K/128⌉] in the rules ``div`` / ``mul_rcp`` / ``enc`` (f32) or ``ue8m0``, with an amax
  floor; ``block=(32, 32)``: MX tiles (TE 2-D MXFP8 weights), E8M0 scales [M, ⌈K/32⌉] with each
  tile's byte repeated over its 32 rows, any MX element and rule.
* :func:`quantize_transpose_block_scaled`: from one read of x, the rowwise copy (blocks along K:
  codes [M, K], scales [M, ⌈K/b⌉]) and the columnwise copy (blocks along M, stored transposed:
  codes [K, M], scales [K, ⌈M/b⌉]); ``block=32`` MXFP8 (e4m3 / e5m2, every MX rule),
  ``block=128`` FP8 1x128 rowwise with 128x1 columnwise (every FP8 rule).

Formula (per block or tile, amax over its valid elements; a = max(amax, amax_floor) for FP8):
MX ``code = enc(x * 2**(127 - s))`` with the E8M0 byte s of the rule; FP8 ``div`` ``enc(x / s)``,
``mul_rcp`` ``enc(x * fl(1 / s))``, ``enc`` ``enc(x * e)``, ``ue8m0`` a power-of-two byte; a block
holding NaN or +-Inf stores the NaN scale and zero codes.

**When to use:** FP8 128x128 / MX 32x32 weight operands, and the rowwise + columnwise backward
operands of a training step, from 16-bit or f32 tensors on a GPU.

**Dtypes:** x float16, bfloat16 (uint16 bits in CuPy) or float32; codes uint8 (e2m1 two per byte
along K, 2-D tiles only); scales uint8 (E8M0 / UE8M0) or float32.

**Shape limits:** any M and K (partial tiles and blocks on both axes); more than 2**31 elements
(64-bit offsets; more than 65535 row tiles launch in slices).

**Workspace:** none.

**Precision guarantee:** bit-exact to the reference; IEEE f32 arithmetic, no FMA contraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quantplan.runtime._block_scaled_codes import (
    ELEMENT_TAGS,
    FP8_RULES,
    INPUT_MAX,
    INPUT_TAGS,
    MX_RULES,
    quantize_arguments,
    scale_geometry,
)
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.vocabulary.errors import InvalidProblem, Unsupported

#: Threads per CTA of both kernels.
THREADS = 256
#: Most CTAs along the grid's y axis (row tiles) of one launch; taller tensors launch in slices.
MAX_GRID_Y = 65535
#: Edge of the fused transpose's tile (rows and columns).
TRANSPOSE_TILE = 128


@dataclass(frozen=True)
class TileSchedule:
    """The tuning of one 2-D tile instantiation: a CTA covers ``tile_rows`` x ``tile_cols`` of x,
    scale tiles of ``tile_rows`` x ``block_cols`` side by side; ``repeat``: the scale matrix has a
    row per x row (MX 2-D) instead of one per tile row (FP8); ``vecs`` consecutive 16-byte vectors
    per thread and pass; ``min_blocks`` resident CTAs per multiprocessor (``__launch_bounds__``)."""

    tile_rows: int
    tile_cols: int
    block_cols: int
    repeat: bool
    vecs: int
    min_blocks: int


@dataclass(frozen=True)
class TransposeSchedule:
    """The tuning of one fused transpose instantiation: ``min_blocks`` resident CTAs of 256 threads
    per multiprocessor; the tile is 128 x 128 (shared memory: the tile, plus 2 KiB of column keys
    for 128-row blocks). ``prefetch`` > 0 (aligned launches; 2 is the 16-bit default): each CTA prefetches into
    L2 the tile ``prefetch`` / 4 waves (``min_blocks`` CTAs per multiprocessor) ahead in launch order."""

    min_blocks: int
    prefetch: int = 0


#: (2-D block, input dtype) -> TileSchedule.
TILE_SCHEDULES: dict[tuple[tuple[int, int], str], TileSchedule] = {
    ((128, 128), "bfloat16"): TileSchedule(128, 128, 128, False, 2, 3),
    ((128, 128), "float16"): TileSchedule(128, 128, 128, False, 2, 3),
    ((128, 128), "float32"): TileSchedule(128, 128, 128, False, 2, 2),
    ((32, 32), "bfloat16"): TileSchedule(32, 256, 32, True, 2, 3),
    ((32, 32), "float16"): TileSchedule(32, 256, 32, True, 2, 3),
    ((32, 32), "float32"): TileSchedule(32, 128, 32, True, 2, 3),
}
#: input dtype -> TransposeSchedule.
TRANSPOSE_SCHEDULES: dict[str, TransposeSchedule] = {
    "bfloat16": TransposeSchedule(3, prefetch=2),
    "float16": TransposeSchedule(3, prefetch=2),
    "float32": TransposeSchedule(2),
}
#: input dtype -> {tag: TransposeSchedule}: the schedules the probe times side by side and the GPU
#: tests cover (the tuning table's first). ``pf0``: no L2 prefetch; ``pf2``: L2 prefetch of the
#: tile half a wave ahead (the 16-bit default); ``m4``: four resident CTAs (64 registers) instead of
#: three (72), the 16-bit default until session 19.
TRANSPOSE_CANDIDATES: dict[str, dict[str, TransposeSchedule]] = {
    dtype: {"default": sched}
    | {
        tag: other
        for tag, other in (
            ("pf0", TransposeSchedule(sched.min_blocks)),
            ("pf2", TransposeSchedule(sched.min_blocks, 2)),
            *((("m4", TransposeSchedule(4, sched.prefetch)),) if sched.min_blocks == 3 else ()),
        )
        if other != sched
    }
    for dtype, sched in TRANSPOSE_SCHEDULES.items()
}
#: Elements of each 2-D block; rules and elements of the fused transpose.
TILE_ELEMENTS = {(128, 128): ("e4m3", "e5m2"), (32, 32): ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1", "int8")}
TRANSPOSE_ELEMENTS = ("e4m3", "e5m2")
#: Scale layouts each kernel writes.
TILE_LAYOUTS = {(128, 128): ("compact", "column_major"), (32, 32): ("compact", "blocked")}
TRANSPOSE_LAYOUTS = {32: ("compact", "blocked"), 128: ("compact", "column_major", "packed_ue8m0")}


def tile_kernel_name(input_dtype: str, element: str, divide: bool, aligned: bool, sched: TileSchedule) -> str:
    """The instantiation of ``block_scaled_tiles`` for one problem."""
    return template_name(
        "block_scaled_tiles",
        INPUT_TAGS[input_dtype],
        ELEMENT_TAGS[element],
        sched.tile_rows,
        sched.tile_cols,
        sched.block_cols,
        sched.repeat,
        sched.vecs,
        divide,
        aligned,
        sched.min_blocks,
    )


def transpose_kernel_name(
    input_dtype: str, element: str, block: int, te: bool, divide: bool, aligned: bool, sched: TransposeSchedule
) -> str:
    """The instantiation of ``block_scaled_transpose`` for one problem (``te``: TE's MXFP8 layout)."""
    return template_name(
        "block_scaled_transpose",
        INPUT_TAGS[input_dtype],
        ELEMENT_TAGS[element],
        block,
        te,
        divide,
        aligned,
        sched.min_blocks,
        *((sched.prefetch,) if sched.prefetch else ()),
    )


def instantiations() -> list[str]:
    """Every instantiation the two launchers can select (the NVRTC sweep's list)."""
    names = []
    for (block, dtype), sched in TILE_SCHEDULES.items():
        divides = (False, True) if block == (128, 128) else (False,)
        for element in TILE_ELEMENTS[block]:
            for divide in divides:
                for aligned in (True, False):
                    names.append(tile_kernel_name(dtype, element, divide, aligned, sched))
    for dtype, tsched in TRANSPOSE_SCHEDULES.items():
        for size, te, divides in ((32, False, (False,)), (32, True, (False,)), (128, False, (False, True))):
            for element in TRANSPOSE_ELEMENTS:
                for divide in divides:
                    for aligned in (True, False):
                        names.append(transpose_kernel_name(dtype, element, size, te, divide, aligned, tsched))
    return names


def transpose_shared_bytes(input_dtype: str, block: int, te: bool = False) -> int:
    """Dynamic shared memory of one fused-transpose CTA: the tile, and the column keys (block 128),
    the column factors (TE layout) or the staged columnwise byte scales (block 32) of its four row
    quarters."""
    itemsize = 2 if input_dtype in ("float16", "bfloat16") else 4
    return TRANSPOSE_TILE * TRANSPOSE_TILE * itemsize + 4 * TRANSPOSE_TILE * 4


def row_tile_slices(row_tiles: int) -> list[tuple[int, int]]:
    """(first row tile, row tiles) of each launch: at most :data:`MAX_GRID_Y` per launch."""
    return [(b, min(MAX_GRID_Y, row_tiles - b)) for b in range(0, row_tiles, MAX_GRID_Y)] or [(0, 0)]


def _input_dtype(x: Any, input_dtype: str | None) -> str:
    dtype = input_dtype or str(x.dtype)
    if dtype == "bfloat16" and x.dtype.itemsize != 2:
        raise InvalidProblem(f"bfloat16 input travels as uint16 bits in CuPy; got an array of {x.dtype}")
    if dtype not in INPUT_TAGS:
        raise InvalidProblem(f"x has dtype {dtype}; block-scaled quantization reads float16, bfloat16 or float32")
    if x.ndim < 1 or not x.flags.c_contiguous:
        raise InvalidProblem("x must be a C-contiguous array of rank >= 1")
    return dtype


def _rule_code(mx: bool, rule: str, element: str) -> int:
    if mx:
        if rule not in MX_RULES:
            raise InvalidProblem(f"MX scale rule {rule!r} is not one of {sorted(MX_RULES)}")
        return MX_RULES[rule]
    if rule not in FP8_RULES or element not in ("e4m3", "e5m2"):
        raise InvalidProblem(f"FP8 blocks take e4m3 / e5m2 and a rule of {sorted(FP8_RULES)}")
    return FP8_RULES[rule]


def _matrix(x: Any, rule: str, amax_floor: float) -> tuple[int, int, float, bool]:
    """What both launchers read first: ``amax_floor`` checked (finite, >= 0), ``x`` [..., K] as
    ``rows`` (M, the leading dims) x ``cols`` (K), and whether ``rule`` writes float32 scales
    (E8M0 bytes otherwise). Returns ``(rows, cols, floor, f32_scales)``."""
    floor = float(amax_floor)
    if not (math.isfinite(floor) and floor >= 0):
        raise InvalidProblem(f"amax_floor must be a finite number >= 0, got {floor!r}")
    return int(math.prod(x.shape[:-1])), int(x.shape[-1]), floor, rule in ("div", "mul_rcp", "enc")


def quantize_block_scaled_2d(
    x: Any,
    *,
    element: str = "e4m3",
    block: tuple[int, int] = (128, 128),
    rule: str = "div",
    layout: str = "compact",
    amax_floor: float = 0.0,
    input_dtype: str | None = None,
    stream: Any = None,
) -> tuple[Any, Any]:
    """Quantize CuPy array ``x`` [..., K] with one scale per 2-D tile; returns ``(codes, scales)``.

    ``block=(128, 128)``: FP8 (``element`` e4m3 / e5m2, ``rule`` ``div`` / ``mul_rcp`` / ``enc`` /
    ``ue8m0``, ``amax_floor``), scales [⌈M/128⌉, ⌈K/128⌉] ``compact`` or the ``column_major``
    TMA-aligned buffer [⌈K/128⌉, align(⌈M/128⌉)]. ``block=(32, 32)``: MX (any element, ``rule``
    ``rceil`` / ``floor`` / ``ceil`` / ``even``), scales [M, ⌈K/32⌉] (each tile's byte on its 32
    rows), ``compact`` or the flat cuBLAS 128x4 ``blocked`` buffer. ``codes`` has x's shape (e2m1:
    ⌈K/2⌉ bytes per row). ``input_dtype``: ``"bfloat16"`` for uint16 bfloat16 bits.
    """
    import cupy
    import numpy as np

    from quantplan.runtime._device import device_info

    dtype = _input_dtype(x, input_dtype)
    blk = (int(block[0]), int(block[1]))
    if blk not in TILE_ELEMENTS:
        raise Unsupported(f"2-D blocks of {block}: (128, 128) (FP8) and (32, 32) (MX) are served")
    mx = blk == (32, 32)
    if element not in TILE_ELEMENTS[blk]:
        raise InvalidProblem(f"{blk} tiles take element {' / '.join(TILE_ELEMENTS[blk])}, got {element!r}")
    rule_code = _rule_code(mx, rule, element)
    if layout not in TILE_LAYOUTS[blk]:
        raise Unsupported(f"{blk} tiles write the scale layouts {TILE_LAYOUTS[blk]}, not {layout!r}")
    rows, cols, floor, f32_scales = _matrix(x, rule, amax_floor)
    scale_rows = rows if mx else -(-rows // blk[0])
    scale_cols = -(-cols // blk[1])
    geo = scale_geometry(layout, scale_rows, scale_cols, f32_scales)
    per_byte = 2 if element == "e2m1" else 1
    codes = cupy.empty((*x.shape[:-1], -(-cols // per_byte)), cupy.uint8)
    scales = cupy.empty(geo.size, cupy.float32 if f32_scales else cupy.uint8)
    if rows * cols == 0:
        return codes, scales
    sched = TILE_SCHEDULES[blk, dtype]
    aligned = cols % 16 == 0 and x.data.ptr % 16 == 0 and codes.data.ptr % 16 == 0
    name = tile_kernel_name(dtype, element, rule == "div", aligned, sched)
    info = device_info(x.device.id)
    fn = load_kernels("block_scaled_tiles", [name], info.arch, x.device.id, kernel_options())[name]
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    for grid, base, pad_rows, pad_cols in tile_slices(rows, cols, sched, geo, scale_rows, scale_cols):
        args = (
            *quantize_arguments(x, codes, scales, rows, cols, base, rule_code, geo, floor, dtype),
            np.int64(scale_rows),
            np.int64(scale_cols),
            np.int64(pad_rows),
            np.int64(pad_cols),
        )
        fn(grid, (THREADS,), args, stream=stream)
    return codes, scales


def tile_slices(
    rows: int, cols: int, sched: TileSchedule, geo: Any, scale_rows: int, scale_cols: int
) -> list[tuple[tuple[int, int], int, int, int]]:
    """The launches of ``block_scaled_tiles`` over an [rows, cols] matrix: ``(grid, row_tile_base,
    pad_rows, pad_cols)`` each, one per :data:`MAX_GRID_Y` row tiles; the first zero-fills the scale
    layout's padding (``geo``: :func:`scale_geometry`), the others pad nothing."""
    col_tiles = -(-cols // sched.tile_cols)
    return [
        ((col_tiles, count), base, *((geo.pad_rows, geo.pad_cols) if i == 0 else (scale_rows, scale_cols)))
        for i, (base, count) in enumerate(row_tile_slices(-(-rows // sched.tile_rows)))
    ]


def transpose_slices(
    rows: int, cols: int, block: int, geo_r: Any, geo_c: Any
) -> list[tuple[tuple[int, int], int, tuple[int, int], tuple[int, int]]]:
    """The launches of ``block_scaled_transpose`` over an [rows, cols] matrix: ``(grid,
    row_tile_base, (pad_rows_r, pad_cols_r), (pad_rows_c, pad_cols_c))`` each, one per
    :data:`MAX_GRID_Y` row tiles of :data:`TRANSPOSE_TILE`; the first zero-fills both scale
    layouts' padding, the others pad nothing."""
    col_tiles = -(-cols // TRANSPOSE_TILE)
    out = []
    for i, (base, count) in enumerate(row_tile_slices(-(-rows // TRANSPOSE_TILE))):
        first = i == 0
        pads_r = (geo_r.pad_rows, geo_r.pad_cols) if first else (rows, -(-cols // block))
        pads_c = (geo_c.pad_rows, geo_c.pad_cols) if first else (cols, -(-rows // block))
        out.append(((col_tiles, count), base, pads_r, pads_c))
    return out


_shared_set: set[int] = set()


def _allow_shared(fn: Any, nbytes: int) -> None:
    """Let ``fn`` launch with ``nbytes`` of dynamic shared memory (above 48 KiB needs an opt-in) and
    prefer the largest shared-memory carveout (the resident CTAs are bounded by shared memory)."""
    if fn.ptr in _shared_set:
        return
    import cupy

    driver = cupy.cuda.driver
    if nbytes > 48 * 1024:
        driver.funcSetAttribute(fn.ptr, getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8), nbytes)
    driver.funcSetAttribute(fn.ptr, getattr(driver, "CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", 9), 100)
    _shared_set.add(fn.ptr)


def quantize_transpose_block_scaled(
    x: Any,
    *,
    element: str = "e4m3",
    block: int = 32,
    rule: str | None = None,
    layout: str = "transposed",
    scale_layout: str = "compact",
    amax_floor: float = 0.0,
    input_dtype: str | None = None,
    stream: Any = None,
    schedule: TransposeSchedule | None = None,
) -> tuple[Any, Any, Any, Any]:
    """Rowwise and columnwise copies of CuPy array ``x`` [..., K] (M = leading dims) from one read.

    Returns ``(codes_r, scales_r, codes_c, scales_c)``: codes_r [M, K], scales_r [M, ⌈K/b⌉];
    ``layout="transposed"``: codes_c [K, M], scales_c [K, ⌈M/b⌉] (each scale matrix in
    ``scale_layout``, flat for ``blocked``); ``layout="te_mxfp8"`` (MXFP8, compact scales): TE's
    physical layout, codes_c [M, K] untransposed, scales_c [⌈M/32⌉, K]. ``block=32``: MXFP8
    (``rule`` default ``rceil``); ``block=128``: FP8 1x128 / 128x1 (``rule`` default ``div``,
    ``amax_floor``). ``element`` e4m3 or e5m2. ``schedule``: a :class:`TransposeSchedule` other than
    the tuning table's (probes and tests; every schedule gives the same bytes).
    """
    import cupy
    import numpy as np

    from quantplan.runtime._device import device_info

    dtype = _input_dtype(x, input_dtype)
    if x.ndim < 2:
        raise InvalidProblem(f"the fused transpose needs x of rank >= 2 ([M, K]), got shape {x.shape}")
    if block not in TRANSPOSE_LAYOUTS:
        raise Unsupported(f"fused transpose blocks of {block}: 32 (MXFP8) and 128 (FP8 1x128) are served")
    if element not in TRANSPOSE_ELEMENTS:
        raise InvalidProblem(f"the fused transpose takes element e4m3 or e5m2, got {element!r}")
    mx = block == 32
    rule = rule or ("rceil" if mx else "div")
    rule_code = _rule_code(mx, rule, element)
    if layout not in ("transposed", "te_mxfp8"):
        raise InvalidProblem(f"layout {layout!r} is not 'transposed' or 'te_mxfp8'")
    te = layout == "te_mxfp8"
    if te and (block != 32 or scale_layout != "compact"):
        raise Unsupported("layout 'te_mxfp8' is TE's MXFP8 layout: block 32 with compact scales")
    if scale_layout not in TRANSPOSE_LAYOUTS[block]:
        raise Unsupported(f"blocks of {block} write the scale layouts {TRANSPOSE_LAYOUTS[block]}, not {scale_layout!r}")
    rows, cols, floor, f32_scales = _matrix(x, rule, amax_floor)
    geo_r = scale_geometry(scale_layout, rows, -(-cols // block), f32_scales)
    geo_c = scale_geometry(scale_layout, cols, -(-rows // block), f32_scales)
    sdt = cupy.float32 if f32_scales else cupy.uint8
    codes_r = cupy.empty((rows, cols), cupy.uint8)
    codes_c = cupy.empty((rows, cols) if te else (cols, rows), cupy.uint8)
    scales_r = cupy.empty(geo_r.size, sdt)
    scales_c = cupy.empty(geo_c.size, sdt)
    if rows * cols == 0:
        return codes_r, scales_r, codes_c, scales_c
    sched = schedule or TRANSPOSE_SCHEDULES[dtype]
    aligned = cols % 16 == 0 and rows % 16 == 0 and all(a.data.ptr % 16 == 0 for a in (x, codes_r, codes_c))
    name = transpose_kernel_name(dtype, element, block, te, rule == "div", aligned, sched)
    info = device_info(x.device.id)
    fn = load_kernels("block_scaled_tiles", [name], info.arch, x.device.id, kernel_options())[name]
    shared = transpose_shared_bytes(dtype, block, te)
    _allow_shared(fn, shared)
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    for grid, base, pads_r, pads_c in transpose_slices(rows, cols, block, geo_r, geo_c):
        args = (
            x,
            codes_r,
            scales_r,
            codes_c,
            scales_c,
            np.int64(rows),
            np.int64(cols),
            np.int64(base),
            np.int32(rule_code),
            np.float32(floor),
            np.float32(INPUT_MAX[dtype]),
            np.int32(geo_r.layout),
            np.int64(geo_r.dim),
            np.int64(pads_r[0]),
            np.int64(pads_r[1]),
            np.int64(geo_c.dim),
            np.int64(pads_c[0]),
            np.int64(pads_c[1]),
        )
        fn(grid, (THREADS,), args, shared_mem=shared, stream=stream)
    return codes_r, scales_r, codes_c, scales_c


__all__ = [
    "MAX_GRID_Y",
    "THREADS",
    "TILE_SCHEDULES",
    "TRANSPOSE_CANDIDATES",
    "TRANSPOSE_SCHEDULES",
    "TRANSPOSE_TILE",
    "TileSchedule",
    "TransposeSchedule",
    "instantiations",
    "quantize_block_scaled_2d",
    "quantize_transpose_block_scaled",
    "row_tile_slices",
    "tile_kernel_name",
    "tile_slices",
    "transpose_kernel_name",
    "transpose_slices",
    "transpose_shared_bytes",
]
