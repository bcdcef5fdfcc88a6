"""The kernel names and compile units of the affine, dynamic-range, fake-quantize, qgZ and
DeepSpeed-format families: the C++ name expression of every instantiation a plan asks for, and
each family's units (``<family>_units``). :mod:`quantplan.runtime._families` gathers them, with the
block-scaled families, into the table :data:`~quantplan.runtime._families.FAMILIES`; the plans' launch
machinery reads the names here, below the block-scaled launchers.

A *compile unit* is a list of C++ name expressions NVRTC compiles together (one program, one
loaded module); a plan's ``select`` loads the unit holding its kernels, so plans of other shapes
with the same element kinds reuse the module. The units are built from the dtype table in
:mod:`quantplan.vocabulary.elements` (element tags) and the served code formats of :mod:`quantplan.vocabulary.formats`
(code kinds, nibble orders).

Vector widths: the element-wise kernels are instantiated at every width of
:attr:`ElementInfo.widths <quantplan.vocabulary.elements.ElementInfo.widths>` (8, 4, 2, 1; F64 from 4),
packed 4-bit codes at 2 or more, plus an element-I/O twin for misaligned operands where the
geometry asks for one (:func:`vector_shapes`, :func:`float_values_shapes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from quantplan.runtime._tuning import TUNING, dense_row_widths
from quantplan.runtime.compiler import template_name
from quantplan.vocabulary.elements import ELEMENTS, FLOAT_KINDS, acc_cpp
from quantplan.vocabulary.formats import SERVED_CODE_KINDS as CODE_KINDS
from quantplan.vocabulary.formats import format_of, is_served_code
from quantplan.vocabulary.types import ElementKind, NibbleOrder, Rounding

#: Float kinds the qgZ plans read and the error buffers they keep.
QGZ_FLOAT_KINDS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
#: Code kinds the qgZ plans write (integer codes; 4-bit packed two per byte).
QGZ_CODE_KINDS = (ElementKind.S8, ElementKind.U8, ElementKind.S4, ElementKind.U4)
#: Vector widths of the qgZ fused passes and float passes (elements); 4-bit codes need at least 2.
QGZ_WIDTHS = (8, 4, 2, 1)

Unit = list[str]


def _orders(*kinds: ElementKind) -> tuple[bool, ...]:
    """Nibble orders to instantiate (high first or not): both when the format of one of ``kinds``
    accepts HIGH_FIRST (the 4-bit integer codes)."""
    high = any(is_served_code(k) and NibbleOrder.HIGH_FIRST in format_of(k).nibble_orders for k in kinds)
    return (False, True) if high else (False,)


def _roundings() -> tuple[Rounding, ...]:
    return (Rounding.NEAREST_EVEN, Rounding.STOCHASTIC)


def vector_shapes(widths: Sequence[int], packed: bool) -> list[tuple[int, bool]]:
    """The ``(vector width, vector I/O)`` pairs a row or segment geometry can take
    (``_layout.row_layout``, ``_segments.fused_segment_geometry``): the widest vector halved
    while it does not divide the row, each with aligned vector I/O; for 4-bit codes only widths
    of 2 or more, and ``(2, False)`` (element loads, nibbles paired) where no width of 2 divides.
    Without 4-bit codes the misaligned operands take the width-1 vector, which is already vector
    I/O: no ``(1, False)`` twin exists."""
    shapes = [(v, True) for v in widths if v >= 2 or not packed]
    if packed:
        shapes.append((2, False))
    return shapes


def float_values_shapes(widths: Sequence[int] = QGZ_WIDTHS) -> list[tuple[int, bool]]:
    """The ``(vector width, vector I/O)`` pairs of a kernel launched by
    ``_qgz_launch.prepare_float_values`` (``dequant_reduce_floats``, ``deepspeed_dequantize``):
    every width above 1 with vector I/O, and the element-I/O launch ``(1, False)`` (which also
    serves a widest dividing width of 1)."""
    return [*((v, True) for v in widths if v > 1), (1, False)]


def error_tag(kind: ElementKind | None) -> str:
    """The qgZ kernels' ``Err`` template argument: the buffer's element tag, or ``qp::no_error``."""
    return "qp::no_error" if kind is None else ELEMENTS[kind].cpp_tag


# ---- quantize.cu / dequantize.cu: static row kernels and their gradients -----------------------


def row_kernel_name(
    kernel: str, float_to_code: bool, float_kind: ElementKind, code_kind: ElementKind, vec: int, vector_io: bool,
    high_first: bool, rounding: Rounding | None = None,
) -> str:  # fmt: skip
    """One instantiation of a static row kernel (``quantize_rows`` signature): ``rounding`` only
    in the quantize direction."""
    f_tag, c_tag = ELEMENTS[float_kind].cpp_tag, ELEMENTS[code_kind].cpp_tag
    in_tag, out_tag = (f_tag, c_tag) if float_to_code else (c_tag, f_tag)
    extra = () if rounding is None else (rounding is Rounding.STOCHASTIC,)
    return template_name(kernel, in_tag, out_tag, vec, vector_io, high_first, *extra)


def row_kernel_unit(
    kernel: str,
    float_to_code: bool,
    float_kind: ElementKind,
    code_kind: ElementKind,
    high_first: bool,
    rounding: Rounding | None = None,
) -> Unit:
    """Every vector-width instantiation of one (float, code, nibble order[, rounding]) combination.

    Vector widths: the largest is 8 elements (4 for F64), halved while it does not divide the
    row; packed codes need at least 2; (2, scalar-io) serves odd rows and misaligned pointers.
    ``rounding`` (quantize direction only) selects the nearest-even or Philox instantiations.
    """
    packed = ELEMENTS[code_kind].is_packed
    shapes = vector_shapes(ELEMENTS[float_kind].widths, packed)
    return [
        row_kernel_name(kernel, float_to_code, float_kind, code_kind, vec, io, high_first and packed, rounding)
        for vec, io in shapes
    ]


#: Float kinds the dense row kernels serve (``quantize_dense`` and friends: 16-bit floats).
ROW_DENSE_FLOAT_KINDS = (ElementKind.F16, ElementKind.BF16)


def dense_row_kernel_name(
    kernel: str, float_kind: ElementKind, code_kind: ElementKind, high_first: bool, vec: int
) -> str:
    """One instantiation of a dense row kernel (``kernels/qp_row_layout.cuh``, ``dense_item``):
    ``quantize_dense<float, code, high_first, vec>``, ``dequantize_dense<code, float, high_first,
    vec>``, ``quantize_backward_dense<float, code, vec>`` or ``dequantize_backward_dense<float, vec>``."""
    f_tag, code = ELEMENTS[float_kind].cpp_tag, ELEMENTS[code_kind]
    order = high_first and code.is_packed
    if kernel == "quantize_dense":
        return template_name(kernel, f_tag, code.cpp_tag, order, vec)
    if kernel == "dequantize_dense":
        return template_name(kernel, code.cpp_tag, f_tag, order, vec)
    if kernel == "quantize_backward_dense":
        return template_name(kernel, f_tag, code.cpp_tag, vec)
    assert kernel == "dequantize_backward_dense", kernel
    return template_name(kernel, f_tag, vec)


def dense_row_kernel_names(kernel: str, float_kind: ElementKind, code_kind: ElementKind, high_first: bool) -> Unit:
    """``kernel`` at each of its vector widths on ``float_kind`` (:func:`quantplan.runtime._tuning.dense_row_shape`)."""
    widths = dense_row_widths(kernel, float_kind)
    return [dense_row_kernel_name(kernel, float_kind, code_kind, high_first, v) for v in widths]


def quantize_backward_names(float_kind: ElementKind, code_kind: ElementKind) -> Unit:
    """``quantize_backward_rows`` (QuantizeBackwardPlan) of one (float, code) pair at every vector width."""
    f_tag, c_tag = ELEMENTS[float_kind].cpp_tag, ELEMENTS[code_kind].cpp_tag
    names = [template_name("quantize_backward_rows", f_tag, c_tag, v) for v in ELEMENTS[float_kind].widths]
    if float_kind in ROW_DENSE_FLOAT_KINDS:
        names += dense_row_kernel_names("quantize_backward_dense", float_kind, code_kind, False)
    return names


def dequantize_backward_names(float_kind: ElementKind) -> Unit:
    """``dequantize_backward_rows`` (DequantizeBackwardPlan) of one float kind at every vector width."""
    tag = ELEMENTS[float_kind].cpp_tag
    names = [template_name("dequantize_backward_rows", tag, v) for v in ELEMENTS[float_kind].widths]
    if float_kind in ROW_DENSE_FLOAT_KINDS:
        names += dense_row_kernel_names("dequantize_backward_dense", float_kind, float_kind, False)
    return names


def quantize_unit(float_kind: ElementKind, code_kind: ElementKind, high_first: bool, rounding: Rounding) -> Unit:
    """The compile unit of one (float, code, nibble order, rounding): ``quantize_rows`` at every
    width and, with round-to-nearest-even, ``quantize_backward_rows`` of the same pair, so a
    forward plan and its backward plan load one module."""
    names = row_kernel_unit("quantize_rows", True, float_kind, code_kind, high_first, rounding)
    if rounding is Rounding.STOCHASTIC:
        return names
    if float_kind in ROW_DENSE_FLOAT_KINDS:
        names += dense_row_kernel_names("quantize_dense", float_kind, code_kind, high_first)
    return names + quantize_backward_names(float_kind, code_kind)


def dequantize_unit(float_kind: ElementKind, code_kind: ElementKind, high_first: bool) -> Unit:
    """The compile unit of one (code, float, nibble order): ``dequantize_rows`` and
    ``dequantize_backward_rows`` of the float kind (shared by DequantizePlan and DequantizeBackwardPlan)."""
    names = row_kernel_unit("dequantize_rows", False, float_kind, code_kind, high_first)
    if float_kind in ROW_DENSE_FLOAT_KINDS:
        names += dense_row_kernel_names("dequantize_dense", float_kind, code_kind, high_first)
    return names + dequantize_backward_names(float_kind)


def quantize_units() -> list[Unit]:
    """``kernels/quantize.cu`` (QuantizePlan, QuantizeBackwardPlan, the dynamic-range multi-pass):
    one unit per (float, code, nibble order, rounding)."""
    return [
        quantize_unit(f, c, high_first, rounding)
        for f in FLOAT_KINDS
        for c in CODE_KINDS
        for high_first in _orders(c)
        for rounding in _roundings()
    ]


def dequantize_units() -> list[Unit]:
    """``kernels/dequantize.cu`` (DequantizePlan, DequantizeBackwardPlan): one per (float, code, nibble order)."""
    return [dequantize_unit(f, c, high_first) for f in FLOAT_KINDS for c in CODE_KINDS for high_first in _orders(c)]


# ---- dynamic_range.cu ---------------------------------------------------------------------------


def dynamic_range_unit(float_kind: ElementKind) -> Unit:
    """The range kernels of one input kind: reset, every vector width of the statistics passes
    (row layout, and whole tensor), parameters."""
    info = ELEMENTS[float_kind]
    acc = acc_cpp(info.math_precision)
    rows = [template_name("range_stats_rows", info.cpp_tag, v, True) for v in info.widths]
    tensor = [template_name("range_stats_tensor", info.cpp_tag, v) for v in info.widths]
    return [template_name("range_stats_init", acc), *rows, *tensor, template_name("range_params", acc)]


#: Input kinds and vectors (of 8 elements) per thread of ``dynamic_quantize_dense``, the fused pass
#: specialised for segments of exactly ``team * 8 * nv`` 16-bit elements with nearest rounding.
DENSE_FLOAT_KINDS = (ElementKind.F16, ElementKind.BF16)
DENSE_NV = (1, 2, 4)


def dense_kernel_name(float_kind: ElementKind, code_kind: ElementKind, high_first: bool, nv: int) -> str:
    """One instantiation of ``dynamic_quantize_dense`` (``nv`` vectors of 8 elements per thread)."""
    code = ELEMENTS[code_kind]
    return template_name(
        "dynamic_quantize_dense", ELEMENTS[float_kind].cpp_tag, code.cpp_tag, high_first and code.is_packed, nv
    )


#: Shapes ``(lanes, nv, unroll)`` of ``dynamic_quantize_lanes``: segments of ``lanes * 8 * nv``
#: 16-bit elements held by ``lanes`` threads of one warp, ``unroll`` segments per thread and
#: iteration. The first shape serving a segment length is the one for large problems; the second
#: (more threads per segment) spreads small ones over more multiprocessors.
LANES_SHAPES = ((4, 4, 1), (16, 1, 1))
#: Blocks of a thread-block cluster of ``dynamic_quantize_cluster`` (``kClusterBlocks``).
CLUSTER_BLOCKS = TUNING.cluster_blocks


def _mode_codes(code_kind: ElementKind) -> tuple[int, ...]:
    """``SegmentLayout.mode`` values a code kind takes in DynamicRangeQuantizePlan (FP8: SYMMETRIC only)."""
    return (0,) if ELEMENTS[code_kind].is_fp8 else (0, 1)


def lanes_kernel_name(
    float_kind: ElementKind, code_kind: ElementKind, high_first: bool, mode: int, shape: tuple[int, int, int]
) -> str:
    """One instantiation of ``dynamic_quantize_lanes`` (``mode``: 0 SYMMETRIC, 1 ASYMMETRIC; ``shape``:
    one of :data:`LANES_SHAPES`)."""
    code = ELEMENTS[code_kind]
    flag = high_first and code.is_packed
    return template_name("dynamic_quantize_lanes", ELEMENTS[float_kind].cpp_tag, code.cpp_tag, flag, mode, *shape)


def cluster_kernel_name(float_kind: ElementKind, code_kind: ElementKind, high_first: bool, mode: int) -> str:
    """One instantiation of ``dynamic_quantize_cluster`` (sm_90: one segment per thread-block cluster)."""
    code = ELEMENTS[code_kind]
    flag = high_first and code.is_packed
    return template_name("dynamic_quantize_cluster", ELEMENTS[float_kind].cpp_tag, code.cpp_tag, flag, mode)


#: Blocks per segment of ``dynamic_quantize_row_shares`` / ``dynamic_fake_quantize_row_shares``
#: (``BLOCKS``: segments of ``SHARES_BLOCK * 8 * blocks`` 16-bit elements, 4096 / 8192 / 16384).
SHARES_BLOCKS = (2, 4, 8)
#: Threads per block of the row-shares kernels (``kSharesBlock`` / ``kFakeSharesBlock``).
SHARES_BLOCK = TUNING.shares_block


def shares_kernel_name(
    float_kind: ElementKind, code_kind: ElementKind, high_first: bool, mode: int, blocks: int
) -> str:
    """One instantiation of ``dynamic_quantize_row_shares`` (``mode``: 0 SYMMETRIC, 1 ASYMMETRIC;
    ``blocks``: one of :data:`SHARES_BLOCKS`)."""
    code = ELEMENTS[code_kind]
    flag = high_first and code.is_packed
    return template_name("dynamic_quantize_row_shares", ELEMENTS[float_kind].cpp_tag, code.cpp_tag, flag, mode, blocks)


#: Vectors (of 8 elements) per thread of ``dynamic_quantize_rows`` / ``dynamic_fake_quantize_rows``
#: (whole rows of ``ROWS_BLOCK * 8 * nv`` 16-bit elements held in registers by one block).
ROWS_NV = (1, 2, 4)
#: Threads per block of the rows kernels (``kRowsBlock`` / ``kFakeRowsBlock``).
ROWS_BLOCK = TUNING.rows_block


def rows_kernel_name(float_kind: ElementKind, code_kind: ElementKind, high_first: bool, mode: int, nv: int) -> str:
    """One instantiation of ``dynamic_quantize_rows`` (``mode``: 0 SYMMETRIC, 1 ASYMMETRIC; ``nv``:
    one of :data:`ROWS_NV`)."""
    code = ELEMENTS[code_kind]
    flag = high_first and code.is_packed
    return template_name("dynamic_quantize_rows", ELEMENTS[float_kind].cpp_tag, code.cpp_tag, flag, mode, nv)


def dynamic_segments_unit(
    float_kind: ElementKind, code_kind: ElementKind, high_first: bool, rounding: Rounding
) -> Unit:
    """The fused single-pass kernels of one (input, code, nibble order, rounding):
    ``dynamic_quantize_segments`` has the template signature and the widths of ``quantize_rows``;
    F16 / BF16 with nearest rounding add ``dynamic_quantize_dense`` at every ``DENSE_NV``,
    ``dynamic_quantize_lanes`` at every :data:`LANES_SHAPES`, ``dynamic_quantize_cluster``,
    ``dynamic_quantize_row_shares`` at every :data:`SHARES_BLOCKS` and ``dynamic_quantize_rows`` at
    every :data:`ROWS_NV`, per mode."""
    unit = row_kernel_unit("dynamic_quantize_segments", True, float_kind, code_kind, high_first, rounding)
    if rounding is Rounding.NEAREST_EVEN and float_kind in DENSE_FLOAT_KINDS:
        unit += [dense_kernel_name(float_kind, code_kind, high_first, nv) for nv in DENSE_NV]
        for mode in _mode_codes(code_kind):
            unit += [lanes_kernel_name(float_kind, code_kind, high_first, mode, shape) for shape in LANES_SHAPES]
            unit.append(cluster_kernel_name(float_kind, code_kind, high_first, mode))
            unit += [shares_kernel_name(float_kind, code_kind, high_first, mode, b) for b in SHARES_BLOCKS]
            unit += [rows_kernel_name(float_kind, code_kind, high_first, mode, nv) for nv in ROWS_NV]
    return unit


def dynamic_range_units() -> list[Unit]:
    """``kernels/dynamic_range.cu``: the range passes per input float kind, and the fused pass
    per (input, code, nibble order, rounding)."""
    units = [dynamic_range_unit(k) for k in FLOAT_KINDS]
    units += [
        dynamic_segments_unit(f, c, high_first, rounding)
        for f in FLOAT_KINDS
        for c in CODE_KINDS
        for high_first in _orders(c)
        for rounding in _roundings()
    ]
    return units


# ---- fake_quantize.cu ---------------------------------------------------------------------------

#: The row kernel of each elementwise fake-quantization op (``FakeOp`` of ``kernels/fake_quantize.cu``,
#: in its order: nearest, straight-through backward, stochastic).
FAKE_ROW_KERNELS = ("fake_quantize_rows", "fake_quantize_ste_rows", "fake_quantize_stochastic_rows")
#: The row kernels of the hot layouts (contiguous rows, one parameter per row or per whole vector),
#: in the same order; instantiated at the widest vector only.
FAKE_DENSE_ROW_KERNELS = (
    "fake_quantize_dense_rows",
    "fake_quantize_ste_dense_rows",
    "fake_quantize_stochastic_dense_rows",
)


def fake_quantize_unit(element: ElementKind) -> Unit:
    """The elementwise and learnable kernels of one data type: the row kernel of every fake op at
    each vector width and its dense-rows twin at the widest, the flat TensorScope kernel of every op (widest vector, and 1), the
    learnable backward at each width with vector and element I/O, and its finishing sum."""
    info = ELEMENTS[element]
    tag, widths = info.cpp_tag, info.widths
    rows = [template_name(k, tag, v, True) for k in FAKE_ROW_KERNELS for v in widths]
    dense = [template_name(k, tag, widths[0]) for k in FAKE_DENSE_ROW_KERNELS]
    flat = [template_name("fake_quantize_flat", tag, v, op) for v in (widths[0], 1) for op in range(3)]
    lsq = [template_name("fake_quantize_lsq_segments", tag, v, io) for v in widths for io in (True, False)]
    return [*rows, *dense, *flat, *lsq, template_name("fake_quantize_lsq_finish", acc_cpp(info.math_precision))]


def dynamic_fake_dense_name(element: ElementKind, nv: int, stochastic: bool) -> str:
    """One instantiation of ``dynamic_fake_quantize_dense`` (``nv`` vectors of 8 elements per thread)."""
    return template_name("dynamic_fake_quantize_dense", ELEMENTS[element].cpp_tag, nv, stochastic)


def dynamic_fake_rows_name(element: ElementKind, mode: int, nv: int) -> str:
    """One instantiation of ``dynamic_fake_quantize_rows`` (nearest rounding; ``mode``: 0 SYMMETRIC,
    1 ASYMMETRIC; ``nv``: one of :data:`ROWS_NV`)."""
    return template_name("dynamic_fake_quantize_rows", ELEMENTS[element].cpp_tag, mode, nv)


def dynamic_fake_cluster_name(element: ElementKind, mode: int) -> str:
    """One instantiation of ``dynamic_fake_quantize_cluster`` (sm_90, nearest rounding: one row per
    thread-block cluster; ``mode``: 0 SYMMETRIC, 1 ASYMMETRIC)."""
    return template_name("dynamic_fake_quantize_cluster", ELEMENTS[element].cpp_tag, mode)


def dynamic_fake_shares_name(element: ElementKind, mode: int, blocks: int) -> str:
    """One instantiation of ``dynamic_fake_quantize_row_shares`` (nearest rounding; ``mode``: 0
    SYMMETRIC, 1 ASYMMETRIC; ``blocks``: one of :data:`SHARES_BLOCKS`)."""
    return template_name("dynamic_fake_quantize_row_shares", ELEMENTS[element].cpp_tag, mode, blocks)


def dynamic_fake_quantize_unit(element: ElementKind) -> Unit:
    """The fused single pass of DynamicRangeFakeQuantizePlan for one data type: each vector width
    (the widest dividing the segment; 1 for misaligned operands), nearest and stochastic; F16 /
    BF16 add ``dynamic_fake_quantize_dense`` at every ``DENSE_NV``, both roundings, and
    ``dynamic_fake_quantize_rows`` (nearest) per mode and :data:`ROWS_NV`,
    ``dynamic_fake_quantize_cluster`` (nearest) per mode, and ``dynamic_fake_quantize_row_shares``
    (nearest) per mode and :data:`SHARES_BLOCKS`."""
    info = ELEMENTS[element]
    unit = [
        template_name("dynamic_fake_quantize_segments", info.cpp_tag, v, True, stochastic)
        for v in info.widths
        for stochastic in (False, True)
    ]
    if element in DENSE_FLOAT_KINDS:
        unit += [dynamic_fake_dense_name(element, nv, s) for nv in DENSE_NV for s in (False, True)]
        unit += [dynamic_fake_rows_name(element, mode, nv) for mode in (0, 1) for nv in ROWS_NV]
        unit += [dynamic_fake_cluster_name(element, mode) for mode in (0, 1)]
        unit += [dynamic_fake_shares_name(element, mode, b) for mode in (0, 1) for b in SHARES_BLOCKS]
    return unit


def fake_quantize_units() -> list[Unit]:
    """``kernels/fake_quantize.cu``: per float data type, the elementwise and learnable kernels,
    and the dynamic-range fused pass."""
    return [unit(k) for unit in (fake_quantize_unit, dynamic_fake_quantize_unit) for k in FLOAT_KINDS]


# ---- qgZ: swizzled_quantize.cu, dequant_reduce.cu, deepspeed_format.cu ----------------------------


#: Vectors of 8 elements per thread of ``swizzled_quantize_dense`` (16-bit input, no LoCo buffer).
QGZ_DENSE_NV = (4, 2, 1)


def segment_names(kernel: str, tags: tuple[object, ...], packed: bool, order: tuple[bool, ...] = ()) -> Unit:
    """A qgZ fused pass at every :func:`vector_shapes` of :data:`QGZ_WIDTHS` (the element-I/O twin
    for 4-bit codes only); ``order``: trailing template arguments (the nibble order)."""
    return [template_name(kernel, *tags, v, io, *order) for v, io in vector_shapes(QGZ_WIDTHS, packed)]


def swizzled_quantize_unit(
    input_kind: ElementKind, error_kind: ElementKind | None, code_kind: ElementKind, high_first: bool
) -> Unit:
    """The kernels of one (input, error buffer, code, nibble order): the fused pass
    (:func:`segment_names`), then the two-pass kernels;
    F16 / BF16 without a LoCo buffer add ``swizzled_quantize_dense`` at every ``QGZ_DENSE_NV``."""
    tags = (ELEMENTS[input_kind].cpp_tag, error_tag(error_kind), ELEMENTS[code_kind].cpp_tag)
    unit = [
        *segment_names("swizzled_quantize_segments", tags, ELEMENTS[code_kind].is_packed, (high_first,)),
        template_name("swizzled_quantize_group_params", tags[0], tags[1]),
        template_name("swizzled_quantize_elements", *tags, high_first),
    ]
    if error_kind is None and input_kind in DENSE_FLOAT_KINDS:
        unit += [swizzled_dense_name(input_kind, code_kind, high_first, nv) for nv in QGZ_DENSE_NV]
    return unit


def swizzled_dense_name(input_kind: ElementKind, code_kind: ElementKind, high_first: bool, nv: int) -> str:
    """One instantiation of ``swizzled_quantize_dense`` (``nv`` vectors of 8 elements per thread)."""
    return template_name(
        "swizzled_quantize_dense", ELEMENTS[input_kind].cpp_tag, ELEMENTS[code_kind].cpp_tag, high_first, nv
    )


def swizzled_quantize_units() -> list[Unit]:
    """``kernels/swizzled_quantize.cu``: one unit per (input, error buffer, code, nibble order)."""
    return [
        swizzled_quantize_unit(i, e, c, high_first)
        for i in QGZ_FLOAT_KINDS
        for e in (None, *QGZ_FLOAT_KINDS)
        for c in QGZ_CODE_KINDS
        for high_first in _orders(c)
    ]


def dequant_reduce_unit(
    input_kind: ElementKind, error_kind: ElementKind | None, output_kind: ElementKind, high_first: bool
) -> Unit:
    """The kernels of one (input code, error buffer, output, nibble order).

    Code outputs: the fused pass (:func:`segment_names`) and the two-pass kernels. Float
    outputs: the float pass at every :func:`float_values_shapes`.
    """
    code, out = ELEMENTS[input_kind], ELEMENTS[output_kind]
    if out.is_float:
        pair = (code.cpp_tag, out.cpp_tag)
        return [template_name("dequant_reduce_floats", *pair, v, io, high_first) for v, io in float_values_shapes()]
    tags = (code.cpp_tag, error_tag(error_kind), out.cpp_tag)
    unit = [
        *segment_names("dequant_reduce_segments", tags, code.is_packed or out.is_packed, (high_first,)),
        template_name("dequant_reduce_group_params", tags[0], tags[1], high_first),
        template_name("dequant_reduce_elements", *tags, high_first),
    ]
    if error_kind is None:
        unit += [
            dequant_reduce_dense_name(input_kind, output_kind, high_first, ept, peers)
            for ept in DENSE_REDUCE_EPT
            for peers in DENSE_REDUCE_PEERS
        ]
    return unit


#: Elements per thread of ``dequant_reduce_dense`` (one load of that many codes per peer): 16,
#: or 8 for chunks too small to give every SM a block.
DENSE_REDUCE_EPT = (16, 8, 4)
#: Peer counts ``dequant_reduce_dense`` is unrolled for; 0: any count (a loop).
DENSE_REDUCE_PEERS = (0, 2, 4, 8, 16)


def dequant_reduce_dense_name(
    input_kind: ElementKind, output_kind: ElementKind, high_first: bool, ept: int, peers: int
) -> str:
    """``dequant_reduce_dense`` for (input code, output code, nibble order, elements per thread,
    unrolled peer count or 0)."""
    return template_name(
        "dequant_reduce_dense", ELEMENTS[input_kind].cpp_tag, ELEMENTS[output_kind].cpp_tag, ept, high_first, peers
    )


def dequant_reduce_units() -> list[Unit]:
    """``kernels/dequant_reduce.cu``: one unit per (input code, error buffer, output, nibble order)."""
    units = []
    for i in QGZ_CODE_KINDS:
        for o in (*QGZ_CODE_KINDS, *QGZ_FLOAT_KINDS):
            errors = (None,) if ELEMENTS[o].is_float else (None, *QGZ_FLOAT_KINDS)
            units += [dequant_reduce_unit(i, e, o, high_first) for e in errors for high_first in _orders(i, o)]
    return units


def deepspeed_code_kind(bits: int) -> ElementKind:
    """DeepSpeed's code kind of ``bits``: signed 4-bit nibbles, else int8."""
    return ElementKind.S4 if bits == 4 else ElementKind.S8


def deepspeed_quantize_unit(input_kind: ElementKind, error_kind: ElementKind | None, bits: int) -> Unit:
    """The kernels of one (input, error buffer, bits): fused pass, then the two-pass kernels; F16 /
    BF16 without a LoCo buffer add ``deepspeed_quantize_dense`` per mode at every ``QGZ_DENSE_NV``,
    the cluster passes and ``deepspeed_quantize_lanes`` per mode at every ``DEEPSPEED_LANES_TEAMS``."""
    code = ELEMENTS[deepspeed_code_kind(bits)]
    tags = (ELEMENTS[input_kind].cpp_tag, error_tag(error_kind), code.cpp_tag)
    unit = [
        *segment_names("deepspeed_quantize_segments", tags, code.is_packed),
        template_name("deepspeed_quantize_group_params", tags[0], tags[1]),
        template_name("deepspeed_quantize_elements", *tags),
    ]
    if input_kind in DENSE_FLOAT_KINDS and error_kind is None:
        unit += [deepspeed_dense_name(input_kind, bits, asym, nv) for asym in (False, True) for nv in QGZ_DENSE_NV]
        unit += [deepspeed_cluster_name(input_kind, bits, asym) for asym in (False, True)]
        unit += [
            deepspeed_lanes_name(input_kind, bits, asym, t) for asym in (False, True) for t in DEEPSPEED_LANES_TEAMS
        ]
    return unit


#: Teams of ``deepspeed_quantize_lanes`` (one vector of 8 elements per thread, a team within a warp):
#: 16 serves groups of 128 on small problems (16 x 8192).
DEEPSPEED_LANES_TEAMS = (16,)


def deepspeed_lanes_name(input_kind: ElementKind, bits: int, asym: bool, team: int) -> str:
    """One instantiation of ``deepspeed_quantize_lanes`` (``team`` threads per group of ``team * 8``)."""
    code = ELEMENTS[deepspeed_code_kind(bits)]
    return template_name("deepspeed_quantize_lanes", ELEMENTS[input_kind].cpp_tag, code.cpp_tag, asym, team)


def deepspeed_cluster_name(input_kind: ElementKind, bits: int, asym: bool) -> str:
    """One instantiation of ``deepspeed_quantize_cluster`` (sm_90: one group per thread-block cluster)."""
    code = ELEMENTS[deepspeed_code_kind(bits)]
    return template_name("deepspeed_quantize_cluster", ELEMENTS[input_kind].cpp_tag, code.cpp_tag, asym)


def deepspeed_dense_name(input_kind: ElementKind, bits: int, asym: bool, nv: int) -> str:
    """One instantiation of ``deepspeed_quantize_dense`` (``nv`` vectors of 8 elements per thread)."""
    code = ELEMENTS[deepspeed_code_kind(bits)]
    return template_name("deepspeed_quantize_dense", ELEMENTS[input_kind].cpp_tag, code.cpp_tag, asym, nv)


def moq_dense_name(kind: ElementKind, nv: int) -> str:
    """One instantiation of ``moq_fake_quantize_dense`` (SYMMETRIC, nearest rounding)."""
    return template_name("moq_fake_quantize_dense", ELEMENTS[kind].cpp_tag, nv)


def moq_cluster_name(kind: ElementKind) -> str:
    """The instantiation of ``moq_fake_quantize_cluster`` of ``kind`` (sm_90; SYMMETRIC, nearest rounding)."""
    return template_name("moq_fake_quantize_cluster", ELEMENTS[kind].cpp_tag)


#: Vectors (of 8 elements) per thread of ``deepspeed_reduce_dense`` (its float sums stay in registers:
#: two vectors spill at 40 registers).
DEEPSPEED_REDUCE_DENSE_NV = (1,)


def deepspeed_reduce_unit(bits: int, error_kind: ElementKind | None) -> Unit:
    """The kernels of one (bits, error buffer) of the quantized reduction; without a LoCo buffer
    ``deepspeed_reduce_dense`` per mode at every ``DEEPSPEED_REDUCE_DENSE_NV``."""
    code = ELEMENTS[deepspeed_code_kind(bits)]
    tags = (code.cpp_tag, error_tag(error_kind))
    unit = [
        *segment_names("deepspeed_reduce_segments", tags, code.is_packed),
        template_name("deepspeed_reduce_group_params", *tags),
        template_name("deepspeed_reduce_elements", *tags),
    ]
    if error_kind is None:
        unit += [
            deepspeed_reduce_dense_name(bits, asym, nv) for asym in (False, True) for nv in DEEPSPEED_REDUCE_DENSE_NV
        ]
    return unit


def deepspeed_reduce_dense_name(bits: int, asym: bool, nv: int) -> str:
    """One instantiation of ``deepspeed_reduce_dense`` (``nv`` vectors of 8 elements per thread)."""
    return template_name("deepspeed_reduce_dense", ELEMENTS[deepspeed_code_kind(bits)].cpp_tag, asym, nv)


def deepspeed_dequantize_unit(bits: int, output_kind: ElementKind) -> Unit:
    """The dequantization kernels of one (bits, output float): widths 8, 4, 2 and the element-I/O one."""
    tags = (ELEMENTS[deepspeed_code_kind(bits)].cpp_tag, ELEMENTS[output_kind].cpp_tag)
    return [template_name("deepspeed_dequantize", *tags, v, io) for v, io in float_values_shapes()]


def moq_fake_quantize_unit(kind: ElementKind, rounding: Rounding) -> Unit:
    """The MoQ kernels of one (float, rounding)."""
    tag, stochastic = ELEMENTS[kind].cpp_tag, rounding is Rounding.STOCHASTIC
    unit = [
        *segment_names("moq_fake_quantize_segments", (tag, stochastic), False),
        template_name("moq_fake_quantize_group_params", tag),
        template_name("moq_fake_quantize_elements", tag, stochastic),
    ]
    if not stochastic and kind in DENSE_FLOAT_KINDS:
        unit += [moq_dense_name(kind, nv) for nv in QGZ_DENSE_NV]
        unit.append(moq_cluster_name(kind))
    return unit


def deepspeed_format_units() -> list[Unit]:
    """``kernels/deepspeed_format.cu`` (the DeepSpeed-format plans of :mod:`quantplan.compat`)."""
    errors = (None, *QGZ_FLOAT_KINDS)
    return [
        *(deepspeed_quantize_unit(k, e, b) for k in QGZ_FLOAT_KINDS for e in errors for b in (8, 4)),
        *(deepspeed_reduce_unit(b, e) for b in (8, 4) for e in errors),
        *(deepspeed_dequantize_unit(b, k) for b in (8, 4) for k in QGZ_FLOAT_KINDS),
        *(moq_fake_quantize_unit(k, r) for k in QGZ_FLOAT_KINDS for r in _roundings()),
    ]


__all__ = [
    "CLUSTER_BLOCKS",
    "DEEPSPEED_LANES_TEAMS",
    "DEEPSPEED_REDUCE_DENSE_NV",
    "DENSE_FLOAT_KINDS",
    "DENSE_NV",
    "DENSE_REDUCE_EPT",
    "DENSE_REDUCE_PEERS",
    "FAKE_DENSE_ROW_KERNELS",
    "FAKE_ROW_KERNELS",
    "LANES_SHAPES",
    "QGZ_CODE_KINDS",
    "QGZ_DENSE_NV",
    "QGZ_FLOAT_KINDS",
    "QGZ_WIDTHS",
    "ROWS_BLOCK",
    "ROWS_NV",
    "ROW_DENSE_FLOAT_KINDS",
    "SHARES_BLOCK",
    "SHARES_BLOCKS",
    "Unit",
    "cluster_kernel_name",
    "deepspeed_cluster_name",
    "deepspeed_code_kind",
    "deepspeed_dense_name",
    "deepspeed_dequantize_unit",
    "deepspeed_format_units",
    "deepspeed_lanes_name",
    "deepspeed_quantize_unit",
    "deepspeed_reduce_dense_name",
    "deepspeed_reduce_unit",
    "dense_kernel_name",
    "dense_row_kernel_name",
    "dense_row_kernel_names",
    "dequant_reduce_dense_name",
    "dequant_reduce_unit",
    "dequant_reduce_units",
    "dequantize_backward_names",
    "dequantize_unit",
    "dequantize_units",
    "dynamic_fake_cluster_name",
    "dynamic_fake_dense_name",
    "dynamic_fake_quantize_unit",
    "dynamic_fake_rows_name",
    "dynamic_fake_shares_name",
    "dynamic_range_unit",
    "dynamic_range_units",
    "dynamic_segments_unit",
    "error_tag",
    "fake_quantize_unit",
    "fake_quantize_units",
    "float_values_shapes",
    "lanes_kernel_name",
    "moq_cluster_name",
    "moq_dense_name",
    "moq_fake_quantize_unit",
    "quantize_backward_names",
    "quantize_unit",
    "quantize_units",
    "row_kernel_name",
    "row_kernel_unit",
    "rows_kernel_name",
    "segment_names",
    "shares_kernel_name",
    "swizzled_dense_name",
    "swizzled_quantize_unit",
    "swizzled_quantize_units",
    "vector_shapes",
]
