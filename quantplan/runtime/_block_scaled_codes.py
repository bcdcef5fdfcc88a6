"""The block-scaled kernels' codes: element and input tags, scale-rule and scale-layout codes of
``kernels/qp_block_scaled.cuh``, the scale-layout geometry (:func:`scale_geometry`), the input
dtypes' largest finite values and the leading arguments both quantize kernels take
(:func:`quantize_arguments`). Plain data below both launchers (``_block_scaled_kernels`` for 1-D blocks, ``_block_scaled_tile_kernels``
for 2-D tiles), so neither imports the other and the kernel-family table reads them side by side."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantplan.vocabulary.errors import InvalidProblem, Unsupported

#: Element tags of the kernel, by the reference's element names.
ELEMENT_TAGS = {
    "e4m3": "qp::mx_e4m3",
    "e5m2": "qp::mx_e5m2",
    "e2m3": "qp::mx_e2m3",
    "e3m2": "qp::mx_e3m2",
    "e2m1": "qp::mx_e2m1",
    "int8": "qp::mx_int8",
    "nvfp4": "qp::nv_e2m1",
    "nvfp4_sr": "qp::nv_e2m1_sr",  # NVFP4 with stochastic rounding (§1.6)
}
#: Input tags by NumPy dtype name.
INPUT_TAGS = {"float16": "qp::f16", "bfloat16": "qp::bf16", "float32": "qp::f32"}
#: ``ScaleRule`` of qp_block_scaled.cuh.
MX_RULES = {"rceil": 0, "floor": 1, "ceil": 2, "even": 3}
FP8_RULES = {"div": 4, "mul_rcp": 5, "enc": 6, "ue8m0": 7}
NVFP4_RULES = {"te": 8}
#: Largest finite value of each input dtype (the ``enc`` rule's stand-in for an infinite 448/a).
INPUT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}
#: ``ScaleLayout`` of qp_block_scaled.cuh.
LAYOUTS = {"compact": 0, "blocked": 1, "column_major": 2, "packed_ue8m0": 3}


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


def quantize_arguments(
    x: Any,
    codes: Any,
    scales: Any,
    rows: int,
    cols: int,
    third: int,
    rule_code: int,
    geo: ScaleGeometry,
    amax_floor: float,
    dtype: str,
) -> tuple[Any, ...]:
    """The leading arguments both quantize kernels take, ``block_scaled_quantize`` (1-D blocks) and
    ``block_scaled_tiles``: x, codes, scales, rows, cols, ``third`` (blocks per row; the first row
    tile), the rule code, the scale layout and its dim (``geo``), the amax floor and the largest
    finite value of the input dtype (:data:`INPUT_MAX`), each as the kernel's C type."""
    import numpy as np

    return (
        x, codes, scales, np.int64(rows), np.int64(cols), np.int64(third), np.int32(rule_code), np.int32(geo.layout),
        np.int64(geo.dim), np.float32(amax_floor), np.float32(INPUT_MAX[dtype]),
    )  # fmt: skip


__all__ = [
    "ELEMENT_TAGS",
    "FP8_RULES",
    "INPUT_MAX",
    "INPUT_TAGS",
    "LAYOUTS",
    "MX_RULES",
    "NVFP4_RULES",
    "ScaleGeometry",
    "quantize_arguments",
    "scale_geometry",
]
