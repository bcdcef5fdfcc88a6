"""The kernel side of block-scaled quantization (``kernels/block_scaled.cu``): MX (e4m3, e5m2,
e2m3, e3m2, e2m1, int8) and FP8 blocks of 1x128 along the contiguous axis.

Machinery: the instantiation names, the scale-rule and scale-layout codes the kernel reads, the
launch geometry, and :func:`quantize_block_scaled`, which quantizes a CuPy array in one pass and
writes the scales in the requested layout (the block-scaled plans build on it). The semantics are
:mod:`quantplan.reference_block_scaled` (MICROSCALING.md), bit for bit.

Formula (per block of ``block`` consecutive elements along the last axis, amax over the valid
elements of the block):

* MX (``block=32``, E8M0 byte s from the scale rule ``rceil`` / ``floor`` / ``ceil`` / ``even``):
  ``code = enc(x * 2**(127 - s))``;
* FP8 blocks (``block=128``, e4m3 / e5m2): ``div`` ``code = enc(x / s)``, ``mul_rcp``
  ``enc(x * fl(1 / s))``, ``enc`` ``enc(x * e)``, or a UE8M0 byte; ``a = max(amax, amax_floor)``;
* a block holding NaN or +-Inf stores the NaN scale and zero codes.

**When to use:** producing MX / FP8-block GEMM operands from a 16-bit or f32 activation or weight
on a GPU; the scales land in the layout the GEMM reads (compact, cuBLAS 128x4 blocked, DeepGEMM
column-major TMA-aligned, UE8M0 packed in int32) without a second pass.

**Dtypes:** x float16, bfloat16 or float32; codes uint8 (e2m1 two per byte, element 2i low);
scales uint8 (E8M0 / UE8M0) or float32.

**Shape limits:** x of any rank, blocks along the last axis; any extent (a partial last block);
more than 2**31 elements (64-bit indexing).

**Workspace:** none.

**Precision guarantee:** bit-exact to the reference; IEEE f32 arithmetic, no FMA contraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .compiler import load_kernels, template_name
from .errors import InvalidProblem, Unsupported

#: Element tags of the kernel, by the reference's element names.
ELEMENT_TAGS = {
    "e4m3": "qp::mx_e4m3",
    "e5m2": "qp::mx_e5m2",
    "e2m3": "qp::mx_e2m3",
    "e3m2": "qp::mx_e3m2",
    "e2m1": "qp::mx_e2m1",
    "int8": "qp::mx_int8",
}
#: Input tags by NumPy dtype name.
INPUT_TAGS = {"float16": "qp::f16", "bfloat16": "qp::bf16", "float32": "qp::f32"}
#: ``ScaleRule`` of qp_block_scaled.cuh.
MX_RULES = {"rceil": 0, "floor": 1, "ceil": 2, "even": 3}
FP8_RULES = {"div": 4, "mul_rcp": 5, "enc": 6, "ue8m0": 7}
#: ``ScaleLayout`` of qp_block_scaled.cuh.
LAYOUTS = {"compact": 0, "blocked": 1, "column_major": 2, "packed_ue8m0": 3}
#: Vectors each thread keeps in flight in the contiguous schedule (the general one keeps 1).
CONTIGUOUS_UNROLL = 2
#: Threads per block.
BLOCK_THREADS = 256


def kernel_name(input_dtype: str, element: str, block: int, divide: bool, contiguous: bool) -> str:
    """The instantiation of ``block_scaled_quantize`` for one problem."""
    unroll = CONTIGUOUS_UNROLL if contiguous else 1
    return template_name(
        "block_scaled_quantize", INPUT_TAGS[input_dtype], ELEMENT_TAGS[element], block, divide, contiguous, unroll
    )


def instantiations() -> list[str]:
    """Every instantiation :func:`quantize_block_scaled` can select (the NVRTC sweep's list)."""
    names = []
    for dtype in INPUT_TAGS:
        for contiguous in (True, False):
            for element in ELEMENT_TAGS:
                names.append(kernel_name(dtype, element, 32, False, contiguous))
            for element in ("e4m3", "e5m2"):
                for divide in (False, True):
                    names.append(kernel_name(dtype, element, 128, divide, contiguous))
    return names


@dataclass(frozen=True)
class ScaleGeometry:
    """Where the scales of an [R, C] scale matrix go: the layout code, its ``dim`` argument, the
    padded grid [pad_rows, pad_cols] the kernel zero-fills, and the buffer's element count."""

    layout: int
    dim: int
    pad_rows: int
    pad_cols: int
    size: int


def scale_geometry(layout: str, rows: int, cols: int, f32: bool) -> ScaleGeometry:
    """The kernel's view of ``layout`` for an [rows, cols] scale matrix (cols = blocks per row)."""
    if layout == "compact":
        return ScaleGeometry(0, 0, rows, cols, rows * cols)
    if layout == "blocked":
        if f32:
            raise Unsupported("the 128x4 blocked layout holds byte scales (E8M0), not float32")
        rt, ct = -(-rows // 128), -(-cols // 4)
        return ScaleGeometry(1, ct, rt * 128, ct * 4, rt * ct * 512)
    if layout == "column_major":
        align = 4 if f32 else 16
        dim = -(-rows // align) * align
        return ScaleGeometry(2, dim, dim, cols, dim * cols)
    if layout == "packed_ue8m0":
        if f32:
            raise Unsupported("packed_ue8m0 packs UE8M0 bytes, not float32 scales")
        dim = -(-rows // 4) * 4
        words = -(-cols // 4)
        return ScaleGeometry(3, dim, dim, words * 4, dim * words * 4)
    raise InvalidProblem(f"scale layout {layout!r} is not one of {sorted(LAYOUTS)}")


def quantize_block_scaled(
    x: Any,
    *,
    element: str = "e4m3",
    block: int = 32,
    rule: str = "rceil",
    layout: str = "compact",
    amax_floor: float = 0.0,
    input_dtype: str | None = None,
    stream: Any = None,
) -> tuple[Any, Any]:
    """Quantize CuPy array ``x`` along its last axis; returns ``(codes, scales)`` (CuPy arrays).

    ``block=32`` takes an MX ``rule``; ``block=128`` an FP8 ``rule`` (``div``, ``mul_rcp``,
    ``enc``, ``ue8m0``) with ``element`` e4m3 or e5m2. ``scales`` is the layout's buffer (flat
    for ``blocked``; [cols, dim] for ``column_major``; int32 words for ``packed_ue8m0``).
    ``input_dtype``: ``"bfloat16"`` for a uint16 array holding bfloat16 bits (CuPy has no
    bfloat16); otherwise x's own dtype.
    """
    import cupy
    import numpy as np

    from ._device import device_info

    dtype = input_dtype or str(x.dtype)
    if dtype == "bfloat16" and x.dtype.itemsize != 2:
        raise InvalidProblem(f"bfloat16 input travels as uint16 bits in CuPy; got an array of {x.dtype}")
    if dtype not in INPUT_TAGS:
        raise InvalidProblem(f"x has dtype {dtype}; block-scaled quantization reads float16, bfloat16 or float32")
    if element not in ELEMENT_TAGS:
        raise InvalidProblem(f"element {element!r} is not one of {sorted(ELEMENT_TAGS)}")
    if block == 32:
        if rule not in MX_RULES:
            raise InvalidProblem(f"MX scale rule {rule!r} is not one of {sorted(MX_RULES)}")
        rule_code = MX_RULES[rule]
    elif block == 128:
        if rule not in FP8_RULES or element not in ("e4m3", "e5m2"):
            raise InvalidProblem(f"FP8 blocks take e4m3 / e5m2 and a rule of {sorted(FP8_RULES)}")
        rule_code = FP8_RULES[rule]
    else:
        raise Unsupported(f"blocks of {block} elements: 32 (MX) and 128 (FP8) are served")
    if x.ndim < 1 or not x.flags.c_contiguous:
        raise InvalidProblem("x must be a C-contiguous array of rank >= 1")
    cols = int(x.shape[-1])
    rows = int(math.prod(x.shape[:-1]))
    blocks_per_row = -(-cols // block)
    per_byte = 2 if element == "e2m1" else 1
    f32_scales = rule in ("div", "mul_rcp", "enc")
    geo = scale_geometry(layout, rows, blocks_per_row, f32_scales)
    codes = cupy.empty((*x.shape[:-1], -(-cols // per_byte)), cupy.uint8)
    scales = cupy.empty(geo.size, cupy.float32 if f32_scales else cupy.uint8)
    if rows * cols == 0:
        return codes, scales
    contiguous = cols % block == 0 and x.data.ptr % 16 == 0 and codes.data.ptr % 16 == 0
    divide = rule == "div"
    info = device_info(x.device.id)
    name = kernel_name(dtype, element, block, divide, contiguous)
    fn = load_kernels("block_scaled", [name], info.arch, x.device.id)[name]
    vec = 4 if dtype == "float32" else 8
    slots = rows * blocks_per_row * (block // vec)
    unroll = CONTIGUOUS_UNROLL if contiguous else 1
    per_sm = max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, BLOCK_THREADS, 0))
    grid = max(1, min(-(-slots // (BLOCK_THREADS * unroll)), per_sm * info.sm_count))
    input_max = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}[dtype]
    args = (
        x,
        codes,
        scales,
        np.int64(rows),
        np.int64(cols),
        np.int64(blocks_per_row),
        np.int32(rule_code),
        np.int32(geo.layout),
        np.int64(geo.dim),
        np.float32(amax_floor),
        np.float32(input_max),
        np.int64(geo.pad_rows),
        np.int64(geo.pad_cols),
    )
    stream = stream if stream is not None else cupy.cuda.get_current_stream()
    fn((grid,), (BLOCK_THREADS,), args, stream=stream)
    return codes, scales
