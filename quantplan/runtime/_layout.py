"""Scopes -> parameter shapes and the canonical (rows x L) launch layout.

(``param_shape`` is the vocabulary's, :mod:`quantplan.vocabulary.types`; the dense row kernels'
shapes and ``BLOCK_THREADS`` are the tuning table's, :mod:`quantplan.runtime._tuning`: both are
re-exported here.)

Every elementwise plan runs on a contiguous tensor viewed as ``rows`` rows of ``L`` elements;
``kernels/qp_row_layout.cuh`` documents how (row, col) maps to a parameter index. This module
derives those coefficients from a scope, merges short rows where the mapping allows it, picks
the vector width and threads per row, and packs everything into the ``RowLayoutArgs`` structure
the kernel takes by value (field order must match ``struct RowLayout`` in the header).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace

from quantplan.runtime._tuning import (
    BLOCK_THREADS,
    DENSE_MAX_THREADS,
    DENSE_ROW_SHAPES,
    DENSE_ROW_SHAPES_BY_FLOAT,
    DENSE_ROW_THREADS,
    DENSE_SMALL_VEC,
    TUNING,
    dense_row_shape,
    dense_row_threads,
    dense_row_widths,
)
from quantplan.vocabulary._kinds import FakeOp
from quantplan.vocabulary.errors import Unsupported
from quantplan.vocabulary.types import (
    ChannelScope,
    ElementKind,
    GroupScope,
    Scope,
    TensorScope,
    TokenScope,
    normalize_axis,
)

# Re-exported: the scopes' parameter shapes were this module's before they moved to the vocabulary.
from quantplan.vocabulary.types import expand_params as expand_params
from quantplan.vocabulary.types import param_shape as param_shape

#: Vectors each thread handles per (row, chunk) item (kQuantizeUnroll / kDequantizeUnroll).
UNROLL = TUNING.row_unroll
#: Rows shorter than this are merged with their neighbours where the scope allows.
MERGE_BELOW = 2048
_MAX_ROW = 2**31 - 1


class RowLayoutArgs(ctypes.Structure):
    """``struct RowLayout`` of ``kernels/qp_row_layout.cuh``, field for field (passed by value)."""

    _fields_ = [
        *((name, ctypes.c_int64) for name in ("rows", "items", "chunks_per_row", "M", "A", "Co", "Ca", "Cm")),
        *(
            (name, ctypes.c_int32)
            for name in ("L", "chunk_cols", "seg_log2", "g_rows", "gc", "cs", "q_min", "q_max", "flags")
        ),
        *((name, ctypes.c_uint32) for name in ("chunk_magic", "chunk_shift", "gc_magic", "gc_shift")),
    ]


def division_magic(d: int) -> tuple[int, int]:
    """``(magic, shift)`` with ``n // d == (n * magic >> 32) >> shift`` for every ``0 <= n < 2**31``
    (``d >= 2``; ``(0, 0)`` for ``d <= 1``, which the kernels never divide by).

    A power of two ``2**k`` takes ``magic = 2**(32 - k)``; any other ``d`` takes ``shift = floor(log2 d)``
    and ``magic = 2**(32 + shift) // d + 1`` (below 2**32): with ``e = magic * d - 2**(32 + shift)``
    in ``(0, d]``, ``n * e < 2**31 * 2**(shift + 1)``, so the error term stays below ``1 / d``.
    """
    if d <= 1:
        return 0, 0
    k = d.bit_length() - 1
    if d == 1 << k:
        return 1 << (32 - k), 0
    return (1 << (32 + k)) // d + 1, k


@dataclass(frozen=True)
class RowLayout:
    """The launch geometry of one elementwise problem (see ``kernels/qp_row_layout.cuh``)."""

    rows: int
    L: int
    M: int
    A: int
    g_rows: int
    Co: int
    Ca: int
    Cm: int
    gc: int
    cs: int
    vec: int
    vector_io: bool
    seg_log2: int
    chunks_per_row: int
    chunk_cols: int
    #: A dense layout (:func:`dense_row_layout`): one (row, chunk) item per block of
    #: ``1 << seg_log2`` threads, parameter index ``row * Co + (col // gc) * cs``.
    dense: bool = False

    @property
    def items(self) -> int:
        return self.rows * self.chunks_per_row

    def args(self, q_min: int, q_max: int, flags: int = 0) -> RowLayoutArgs:
        """The kernel's by-value ``RowLayout`` argument (``flags``: family-specific option bits)."""
        return RowLayoutArgs(
            self.rows,
            self.items,
            self.chunks_per_row,
            self.M,
            self.A,
            self.Co,
            self.Ca,
            self.Cm,
            self.L,
            self.chunk_cols,
            self.seg_log2,
            self.g_rows,
            self.gc,
            self.cs,
            q_min,
            q_max,
            flags,
            *division_magic(self.chunks_per_row),
            *division_magic(self.gc),
        )

    @property
    def threads(self) -> int:
        """Threads of a segment (a dense layout: of a block)."""
        return 1 << self.seg_log2

    def blocks(self, max_blocks: int) -> int:
        """Grid size: enough blocks for every item, at most ``max_blocks`` (grid-stride beyond)."""
        segs = BLOCK_THREADS >> self.seg_log2
        return max(1, min(max_blocks, -(-self.items // segs)))

    def describe(self) -> str:
        """Short variant tag for KernelSku.variant."""
        threads = 1 << self.seg_log2
        if self.dense:
            unroll = self.chunk_cols // (threads * self.vec)
            return f"rows[dense,{threads}t-per-block,vec{self.vec},unroll{unroll},chunks{self.chunks_per_row}]"
        unit = "block" if threads == BLOCK_THREADS else f"{threads}t"
        io = "" if self.vector_io else ",scalar-io"
        unroll = self.chunk_cols // (threads * self.vec)
        return f"rows[{unit}-per-row,vec{self.vec}{io},unroll{unroll},chunks{self.chunks_per_row}]"


def row_layout(shape: tuple[int, ...], scope: Scope, vec_max: int, packed: bool, busy_threads: int = 0) -> RowLayout:
    """Canonical layout of ``scope`` on a contiguous tensor of ``shape``.

    ``vec_max``: widest vector (elements) the kernel family is instantiated for. ``packed``:
    one operand holds 4-bit codes packed along the last axis (rows of odd length keep their own
    padding nibble, so such rows are never merged). ``busy_threads``: threads that keep the GPU
    busy (SMs x resident threads); a problem too small to give each of them ``UNROLL`` vectors
    gets shorter chunks (2 or 1 vectors per thread), trading loop overhead for parallelism.
    """
    dims = shape if shape else (1,)
    rank = len(dims)
    n = math.prod(dims)
    L = dims[-1]
    rows = n // L if L else 0

    def mergeable_length(start_axis: int) -> int:
        """Merge trailing axes (down to start_axis) into the row while the row is short."""
        length = L
        axis = rank - 2
        while length < MERGE_BELOW and axis >= start_axis and (not packed or length % 2 == 0):
            length *= dims[axis]
            axis -= 1
        return length

    M = A = g_rows = 1
    Co = Ca = Cm = 0
    gc, cs = 1, 0
    if isinstance(scope, TensorScope):
        L = mergeable_length(0)
    elif isinstance(scope, TokenScope):
        if L < MERGE_BELOW:
            g = L
            L = mergeable_length(0)
            gc, cs, Co = max(g, 1), 1, L // max(g, 1)
        else:
            Co = 1
    elif isinstance(scope, ChannelScope):
        axis = normalize_axis(scope.axis, rank, "channel scope")
        if axis == rank - 1:
            gc, cs = 1, 1
        else:
            # Parameter constant along each row; rows after the axis merge into one.
            A = dims[axis]
            inner = math.prod(dims[axis + 1 :])
            if not packed or L % 2 == 0:
                L = inner
            else:
                M = inner // L
            Ca = 1
    else:
        assert isinstance(scope, GroupScope)
        axis = normalize_axis(scope.axis, rank, "group scope")
        g = scope.group_size
        if axis == rank - 1:
            L = mergeable_length(0)
            gc, cs, Co = g, 1, L // g
        else:
            A = dims[axis]
            M = math.prod(dims[axis + 1 : -1])
            g_rows = g
            Co, Ca, Cm = (A // g) * M * L, M * L, L
            gc, cs = 1, 1
    if L > _MAX_ROW:
        raise Unsupported(
            f"a row (merged last axes) of {L} elements exceeds 2**31 - 1; reshape the tensor so its last "
            f"axis is shorter (e.g. (-1, 4096)) with a scope that means the same"
        )
    rows = n // L if L else 0

    vec = vec_max
    while vec > 1 and L % vec:
        vec //= 2
    vector_io = True
    if packed and vec < 2:
        vec, vector_io = 2, False  # odd rows: bounded element loads, nibbles paired per row
    threads = 1
    while threads < BLOCK_THREADS and threads * vec * UNROLL < L:
        threads *= 2
    unroll = UNROLL
    while unroll > 1 and rows * -(-L // (threads * vec * unroll)) * threads < busy_threads:
        unroll //= 2
    chunk_cols = threads * vec * unroll
    chunks = max(1, -(-L // chunk_cols)) if L else 1
    return RowLayout(
        rows, L, M, A, g_rows, Co, Ca, Cm, gc, cs, vec, vector_io, int(math.log2(threads)), chunks, chunk_cols
    )


#: Fewest threads of a dense block (small problems take smaller blocks so that more SMs share them).
_DENSE_MIN_THREADS = 64
#: A small problem's block narrows while its grid holds fewer blocks than 1 / _DENSE_SM_SHARE of
#: the SMs: fewer, wider blocks win on small problems (a block launched is a cost of its own when
#: the whole problem is latency), down to about a quarter of the SMs.
_DENSE_SM_SHARE = 4


def dense_row_layout(
    shape: tuple[int, ...],
    scope: Scope,
    kernel: str,
    packed: bool,
    sm_count: int,
    float_kind: ElementKind | None = None,
) -> RowLayout | None:
    """The dense layout of ``kernels/qp_row_layout.cuh`` (``dense_item``) for ``kernel``, or None
    when the problem is not one: contiguous rows whose parameter index is ``row * Co + (col //
    gc) * cs`` (tensor, token and last-axis group scopes; a channel scope over whole rows), rows a
    multiple of the vector, groups of whole vectors, fewer than 2**31 blocks.

    Vectors: the kernel's width on ``float_kind`` (:func:`dense_row_shape`), or its
    :data:`DENSE_SMALL_VEC` for a problem of fewer elements than ``sm_count`` blocks of 256
    full-width vectors. Blocks: :func:`dense_row_threads` threads, each taking the kernel's vectors
    per thread; a row shorter than that takes fewer threads; a problem whose grid would cover less
    than a quarter of the SMs halves the threads (down to 64).
    """
    vec, unroll = dense_row_shape(kernel, float_kind)
    if math.prod(shape) < sm_count * BLOCK_THREADS * vec:
        vec = DENSE_SMALL_VEC[kernel]
    base = row_layout(shape, scope, vec, packed)
    if base.vec != vec or not base.vector_io or base.M != 1 or base.rows == 0 or base.L == 0:
        return None
    if base.A == 1:
        coefficient = base.Co
    elif base.g_rows == 1 and base.rows <= base.A:  # channel(axis) over whole rows: parameter = row
        coefficient = base.Ca
    else:
        return None
    if base.cs != 0 and base.gc % vec:
        return None
    vectors = base.L // vec
    threads = dense_row_threads(kernel)
    while threads > 32 and (threads // 2) * unroll >= vectors:
        threads //= 2

    def blocks(t: int) -> int:
        return base.rows * -(-vectors // (t * unroll))

    while threads > _DENSE_MIN_THREADS and _DENSE_SM_SHARE * blocks(threads) < sm_count:
        threads //= 2
    chunk_cols = threads * vec * unroll
    chunks = -(-base.L // chunk_cols)
    if base.rows * chunks > _MAX_ROW:
        return None
    return replace(
        base, Co=coefficient, seg_log2=int(math.log2(threads)), chunks_per_row=chunks, chunk_cols=chunk_cols, dense=True
    )


def contiguous_segment_length(shape: tuple[int, ...], scope: Scope) -> int | None:
    """Elements per segment when ``scope``'s segments are contiguous runs of the flattened tensor
    taken in parameter order (segment ``i`` is elements ``[i S, (i + 1) S)`` and has parameter
    ``i``), else None.

    True for TensorScope (one segment), TokenScope, ChannelScope whose axis has only extent-1
    axes before it (a weight's output channels, axis 0), and GroupScope whose axis has only
    extent-1 axes after it (groups along the last axis).
    """
    dims = shape if shape else (1,)
    n = math.prod(dims)
    if isinstance(scope, TensorScope):
        return n
    rank = len(dims)
    if isinstance(scope, TokenScope):
        return dims[-1]
    if isinstance(scope, ChannelScope):
        axis = normalize_axis(scope.axis, rank, "channel scope")
        return math.prod(dims[axis + 1 :]) if math.prod(dims[:axis]) == 1 else None
    assert isinstance(scope, GroupScope)
    axis = normalize_axis(scope.axis, rank, "group scope")
    return scope.group_size if math.prod(dims[axis + 1 :]) == 1 else None


# ---- fake quantization's dense rows (``*_dense_rows`` of ``kernels/fake_quantize.cu``) -----------

#: Most threads of a dense-rows block (``__launch_bounds__`` of the kernels), fewest, and the
#: shortest row the dense kernels take (32 vectors: a warp's worth).
_FAKE_DENSE_BLOCK, _FAKE_DENSE_MIN_BLOCK, _FAKE_DENSE_MIN_VECTORS = TUNING.fake_dense_rows_block, 64, 32
#: Bytes of each input one thread of a dense-rows kernel takes per item, by op: nearest forward,
#: straight-through backward, stochastic forward (QP_FAKE_DENSE_THREAD_BYTES,
#: QP_FAKE_DENSE_STE_THREAD_BYTES, QP_FAKE_DENSE_STOCHASTIC_THREAD_BYTES in the kernel).
_FAKE_DENSE_THREAD_BYTES = TUNING.fake_dense_thread_bytes
_FAKE_DENSE_STE_THREAD_BYTES = TUNING.fake_dense_ste_thread_bytes
_FAKE_DENSE_STOCHASTIC_THREAD_BYTES = TUNING.fake_dense_stochastic_thread_bytes
#: Most threads of a nearest-forward dense-rows block on 16-bit data (the others take
#: _FAKE_DENSE_BLOCK; an experiment sets another here, e.g. ``benchmarks/probe_l2_state.py``).
_FAKE_DENSE_NEAREST_BLOCK = _FAKE_DENSE_BLOCK


def dense_unroll(vec: int, element_bytes: int, op: FakeOp = FakeOp.NEAREST) -> int:
    """Vectors per thread and item of the dense-rows kernels (``fake_dense_unroll`` in the kernel)
    for FakeOp ``op``: 32 bytes of the input for the forwards (_FAKE_DENSE_THREAD_BYTES,
    _FAKE_DENSE_STOCHASTIC_THREAD_BYTES), 16 of each input for the straight-through backward, at least
    one vector."""
    per_thread = {FakeOp.STE: _FAKE_DENSE_STE_THREAD_BYTES, FakeOp.STOCHASTIC: _FAKE_DENSE_STOCHASTIC_THREAD_BYTES}.get(
        op, _FAKE_DENSE_THREAD_BYTES
    )
    return max(1, per_thread // (vec * element_bytes))


def dense_block(op: FakeOp, element_bytes: int = 2) -> int:
    """Most threads of a dense-rows block for FakeOp ``op`` on data of ``element_bytes`` bytes
    (the nearest forward on 16-bit data: _FAKE_DENSE_NEAREST_BLOCK; the others _FAKE_DENSE_BLOCK)."""
    return _FAKE_DENSE_NEAREST_BLOCK if op is FakeOp.NEAREST and element_bytes == 2 else _FAKE_DENSE_BLOCK


@dataclass(frozen=True)
class DenseRows:
    """Geometry of the ``*_dense_rows`` kernels (``kernels/fake_quantize.cu``): ``rows`` contiguous
    rows of ``L`` elements, parameter index ``row * row_coef + (col // gc) * cs``; one (row, chunk)
    item per block of ``block`` threads, ``unroll`` vectors of ``vec`` per thread and item."""

    rows: int
    L: int
    vec: int
    row_coef: int
    gc: int
    cs: int
    block: int
    unroll: int

    @property
    def chunk_cols(self) -> int:
        return self.block * self.vec * self.unroll

    @property
    def chunks_per_row(self) -> int:
        return -(-self.L // self.chunk_cols)

    @property
    def items(self) -> int:
        return self.rows * self.chunks_per_row

    def args(self, q_min: int, q_max: int) -> RowLayoutArgs:
        """The kernels' by-value ``RowLayout`` (the fields they read; ``Co`` holds the row coefficient)."""
        a = RowLayoutArgs()
        a.rows, a.items, a.chunks_per_row, a.L, a.chunk_cols = (
            self.rows, self.items, self.chunks_per_row, self.L, self.chunk_cols
        )  # fmt: skip
        a.M = a.A = a.g_rows = 1
        a.Co, a.gc, a.cs, a.q_min, a.q_max = self.row_coef, self.gc, self.cs, q_min, q_max
        a.chunk_magic, a.chunk_shift = division_magic(self.chunks_per_row)
        a.gc_magic, a.gc_shift = division_magic(self.gc)
        return a

    def describe(self) -> str:
        """Short variant tag for KernelSku.variant."""
        return f"dense-rows[{self.block}t-per-item,vec{self.vec},unroll{self.unroll},chunks{self.chunks_per_row}]"


def dense_rows(
    layout: RowLayout, vec_max: int, unroll_max: int, sm_count: int, block_max: int = _FAKE_DENSE_BLOCK
) -> DenseRows | None:
    """The dense-rows geometry of ``layout``, or None where the kernels do not apply.

    They apply to aligned vector I/O at the widest vector (``L % vec_max == 0``, rows of at least
    32 vectors) when the parameter index is ``row * c + (col // gc) * cs`` for every row (no outer
    or inner axis around a channel / group axis) and a vector never straddles a group (``cs == 0``
    or ``gc % vec == 0``). Blocks of ``block_max`` threads with ``unroll_max`` vectors each (at most
    :func:`dense_unroll`), narrowed to the row; fewer vectors per thread while the grid has fewer
    than two blocks per SM, then smaller blocks (down to 64 threads) while it covers less than a
    quarter of the SMs.
    """
    vec, L = layout.vec, layout.L
    if not layout.vector_io or vec != vec_max or L % vec or L < _FAKE_DENSE_MIN_VECTORS * vec or layout.rows == 0:
        return None
    if layout.M != 1:
        return None
    if layout.A == 1:
        row_coef = layout.Co
    elif layout.g_rows == 1 and layout.A == layout.rows:  # a leading channel axis: row // A == 0
        row_coef = layout.Ca
    else:
        return None
    if layout.cs and layout.gc % vec:
        return None
    block, unroll = block_max, unroll_max
    while block > _FAKE_DENSE_MIN_VECTORS and block * vec > L:
        block //= 2
    while unroll > 1 and block * vec * unroll >= 2 * L:
        unroll //= 2

    def blocks(b: int, u: int) -> int:
        return layout.rows * -(-L // (b * vec * u))

    while unroll > 1 and blocks(block, unroll) < 2 * sm_count:
        unroll //= 2
    while block > _FAKE_DENSE_MIN_BLOCK and _DENSE_SM_SHARE * blocks(block, unroll) < sm_count:
        block //= 2
    geometry = DenseRows(layout.rows, L, vec, row_coef, layout.gc, layout.cs, block, unroll)
    return geometry if geometry.items < 2**31 else None


__all__ = [
    "BLOCK_THREADS",
    "DenseRows",
    "RowLayout",
    "RowLayoutArgs",
    "DENSE_MAX_THREADS",
    "DENSE_ROW_SHAPES",
    "DENSE_ROW_SHAPES_BY_FLOAT",
    "DENSE_ROW_THREADS",
    "contiguous_segment_length",
    "dense_row_layout",
    "dense_row_shape",
    "dense_row_threads",
    "dense_row_widths",
    "dense_block",
    "dense_rows",
    "dense_unroll",
    "division_magic",
    "expand_params",
    "normalize_axis",
    "param_shape",
    "row_layout",
]
