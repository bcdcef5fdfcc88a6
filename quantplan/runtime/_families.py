"""The kernel families: which template instantiations each ``kernels/<family>.cu`` is compiled for.

:data:`FAMILIES` is the declarative table ``family -> units`` (a *compile unit*: the C++ name
expressions NVRTC compiles together, one program, one loaded module). The affine, dynamic-range,
fake-quantize, qgZ and DeepSpeed-format names and units are built in
:mod:`quantplan.runtime._kernel_names` (re-exported here); the block-scaled families' come from their
launchers' schedule tables. The CPU compile test and ``python -m quantplan precompile`` read the
table, plans read the unit functions.

The units hold what the plans' ``select`` can ask for and nothing else:
``tests/test_instantiations.py`` selects every plan over a grid of descriptors on simulated
sm_80 and sm_90 GPUs and checks that every unit a plan loads is one of :data:`FAMILIES` and
every listed instantiation is looked up by some plan, so the NVRTC sweep compiles that set.
"""

from __future__ import annotations

from collections.abc import Callable

from quantplan.runtime._block_scaled_kernels import instantiations as block_scaled_instantiations
from quantplan.runtime._block_scaled_tile_kernels import instantiations as block_scaled_tile_instantiations
from quantplan.runtime._kernel_names import (
    CLUSTER_BLOCKS,
    DEEPSPEED_LANES_TEAMS,
    DEEPSPEED_REDUCE_DENSE_NV,
    DENSE_FLOAT_KINDS,
    DENSE_NV,
    DENSE_REDUCE_EPT,
    DENSE_REDUCE_PEERS,
    FAKE_DENSE_ROW_KERNELS,
    FAKE_ROW_KERNELS,
    LANES_SHAPES,
    QGZ_CODE_KINDS,
    QGZ_DENSE_NV,
    QGZ_FLOAT_KINDS,
    QGZ_WIDTHS,
    ROW_DENSE_FLOAT_KINDS,
    ROWS_BLOCK,
    ROWS_NV,
    SHARES_BLOCK,
    SHARES_BLOCKS,
    Unit,
    cluster_kernel_name,
    deepspeed_cluster_name,
    deepspeed_code_kind,
    deepspeed_dense_name,
    deepspeed_dequantize_unit,
    deepspeed_format_units,
    deepspeed_lanes_name,
    deepspeed_quantize_unit,
    deepspeed_reduce_dense_name,
    deepspeed_reduce_unit,
    dense_kernel_name,
    dense_row_kernel_name,
    dense_row_kernel_names,
    dequant_reduce_dense_name,
    dequant_reduce_unit,
    dequant_reduce_units,
    dequantize_backward_names,
    dequantize_unit,
    dequantize_units,
    dynamic_fake_cluster_name,
    dynamic_fake_dense_name,
    dynamic_fake_quantize_unit,
    dynamic_fake_rows_name,
    dynamic_fake_shares_name,
    dynamic_range_unit,
    dynamic_range_units,
    dynamic_segments_unit,
    error_tag,
    fake_quantize_unit,
    fake_quantize_units,
    float_values_shapes,
    lanes_kernel_name,
    moq_cluster_name,
    moq_dense_name,
    moq_fake_quantize_unit,
    quantize_backward_names,
    quantize_unit,
    quantize_units,
    row_kernel_name,
    row_kernel_unit,
    rows_kernel_name,
    segment_names,
    shares_kernel_name,
    swizzled_dense_name,
    swizzled_quantize_unit,
    swizzled_quantize_units,
    vector_shapes,
)


#: family (``kernels/<family>.cu``) -> its compile units.
def block_scaled_units() -> list[Unit]:
    """``block_scaled.cu``: every instantiation the block-scaled launcher and plans select
    (:func:`quantplan.runtime._block_scaled_kernels.instantiations`, built from its schedule table), one
    per unit: a plan or launch loads each kernel on its own."""
    return [[name] for name in block_scaled_instantiations()]


def block_scaled_tiles_units() -> list[Unit]:
    """``block_scaled_tiles.cu``: the 2-D tile and fused-transpose kernels
    (:func:`quantplan.runtime._block_scaled_tile_kernels.instantiations`), one per unit."""
    return [[name] for name in block_scaled_tile_instantiations()]


FAMILIES: dict[str, Callable[[], list[Unit]]] = {
    "block_scaled": block_scaled_units,
    "block_scaled_tiles": block_scaled_tiles_units,
    "quantize": quantize_units,
    "dequantize": dequantize_units,
    "dynamic_range": dynamic_range_units,
    "fake_quantize": fake_quantize_units,
    "swizzled_quantize": swizzled_quantize_units,
    "dequant_reduce": dequant_reduce_units,
    "deepspeed_format": deepspeed_format_units,
}


def compile_units(family: str) -> list[Unit]:
    """The groups of name expressions ``family``'s plans compile together (one NVRTC program each)."""
    return FAMILIES[family]()


def all_instantiations(family: str) -> list[str]:
    """Every name expression ``family`` may ask for, once each (units may share kernels)."""
    return list(dict.fromkeys(name for unit in compile_units(family) for name in unit))


__all__ = [
    "FAKE_ROW_KERNELS",
    "Unit",
    "deepspeed_dequantize_unit",
    "deepspeed_format_units",
    "deepspeed_quantize_unit",
    "deepspeed_reduce_unit",
    "dequant_reduce_units",
    "dequantize_backward_names",
    "dequantize_units",
    "dynamic_range_units",
    "fake_quantize_units",
    "moq_fake_quantize_unit",
    "quantize_backward_names",
    "quantize_units",
    "swizzled_quantize_units",
    "DENSE_FLOAT_KINDS",
    "DENSE_NV",
    "dense_kernel_name",
    "dense_row_kernel_name",
    "dense_row_kernel_names",
    "ROW_DENSE_FLOAT_KINDS",
    "lanes_kernel_name",
    "cluster_kernel_name",
    "LANES_SHAPES",
    "CLUSTER_BLOCKS",
    "ROWS_BLOCK",
    "ROWS_NV",
    "rows_kernel_name",
    "dynamic_fake_rows_name",
    "dynamic_fake_cluster_name",
    "dynamic_fake_shares_name",
    "SHARES_BLOCK",
    "SHARES_BLOCKS",
    "shares_kernel_name",
    "FAMILIES",
    "QGZ_CODE_KINDS",
    "QGZ_DENSE_NV",
    "QGZ_FLOAT_KINDS",
    "QGZ_WIDTHS",
    "DENSE_REDUCE_EPT",
    "DENSE_REDUCE_PEERS",
    "all_instantiations",
    "compile_units",
    "deepspeed_code_kind",
    "deepspeed_cluster_name",
    "deepspeed_dense_name",
    "deepspeed_lanes_name",
    "DEEPSPEED_LANES_TEAMS",
    "deepspeed_reduce_dense_name",
    "DEEPSPEED_REDUCE_DENSE_NV",
    "moq_cluster_name",
    "moq_dense_name",
    "dequant_reduce_dense_name",
    "dequant_reduce_unit",
    "dequantize_unit",
    "FAKE_DENSE_ROW_KERNELS",
    "dynamic_fake_dense_name",
    "dynamic_fake_quantize_unit",
    "dynamic_range_unit",
    "dynamic_segments_unit",
    "error_tag",
    "float_values_shapes",
    "vector_shapes",
    "fake_quantize_unit",
    "quantize_unit",
    "row_kernel_name",
    "row_kernel_unit",
    "segment_names",
    "swizzled_dense_name",
    "swizzled_quantize_unit",
]
