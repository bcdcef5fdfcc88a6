"""The elementwise fake-quantization launches shared by FakeQuantizePlan, FakeQuantizeBackwardPlan
and DynamicRangeFakeQuantizePlan's multi-pass path (``kernels/fake_quantize.cu``).

:class:`FakeRowLaunches` is one elementwise kernel (forward with either rounding, or the
straight-through backward) for aligned operands and its element-I/O twin: the row kernels for
Token / Channel / GroupScope (``*_dense_rows`` on the hot layouts, :func:`dense_rows`),
``fake_quantize_flat`` for TensorScope.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import Any

from ._device import device_info
from ._kernel_names import FAKE_DENSE_ROW_KERNELS, FAKE_ROW_KERNELS, fake_quantize_unit
from ._launch import RNG_FIELDS, LaunchPair, PreparedLaunch, device_arg, fields, occupancy_grid, params_struct
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, division_magic, row_layout
from ._operands import Operand
from ._problems import CodeRangeProblem
from ._tuning import TUNING, kernel_options
from .compiler import load_kernels, template_name
from .elements import ELEMENTS, acc_ctype
from .types import MathPrecision, Rounding, TensorScope

#: ZeroPointSource of ``qp_fake_quantize.cuh``: the scalar value, an int32 array, a float array.
ZP_VALUE, ZP_INT32, ZP_FLOAT = 0, 1, 2
#: Vectors one thread of ``fake_quantize_flat`` takes per tile (kFakeUnroll in the kernel).
_FLAT_UNROLL = TUNING.fake_flat_unroll
#: Most blocks of one ``fake_quantize_flat`` launch (grid-stride beyond).
_FLAT_MAX_BLOCKS = 1 << 20
#: Most threads of a dense-rows block (``__launch_bounds__`` of the kernels), fewest, and the
#: shortest row the dense kernels take (32 vectors: a warp's worth).
_DENSE_BLOCK, _DENSE_MIN_BLOCK, _DENSE_MIN_VECTORS = TUNING.fake_dense_rows_block, 64, 32
#: A small problem's dense-rows block narrows while its grid holds fewer blocks than 1 /
#: _DENSE_SM_SHARE of the SMs (fewer, wider blocks win on small problems).
_DENSE_SM_SHARE = 4
#: Bytes of each input one thread of a dense-rows kernel takes per item, by op: nearest forward,
#: straight-through backward, stochastic forward (QP_FAKE_DENSE_THREAD_BYTES,
#: QP_FAKE_DENSE_STE_THREAD_BYTES, QP_FAKE_DENSE_STOCHASTIC_THREAD_BYTES in the kernel).
_DENSE_THREAD_BYTES = TUNING.fake_dense_thread_bytes
_DENSE_STE_THREAD_BYTES = TUNING.fake_dense_ste_thread_bytes
_DENSE_STOCHASTIC_THREAD_BYTES = TUNING.fake_dense_stochastic_thread_bytes
#: Most threads of a nearest-forward dense-rows block on 16-bit data (the others take
#: _DENSE_BLOCK; an experiment sets another here, e.g. ``benchmarks/probe_l2_state.py``).
_DENSE_NEAREST_BLOCK = _DENSE_BLOCK


class FakeOp(enum.IntEnum):
    """What an elementwise fake-quantization kernel computes (``FakeOp`` of ``kernels/fake_quantize.cu``)."""

    NEAREST = 0  #: y = fake(x), rne
    STE = 1  #: dx = dy * mask
    STOCHASTIC = 2  #: y = fake(x), Philox stochastic rounding

    @classmethod
    def forward(cls, rounding: Rounding) -> FakeOp:
        """The forward kernel op of ``rounding``."""
        return cls.STOCHASTIC if rounding is Rounding.STOCHASTIC else cls.NEAREST


def dense_unroll(vec: int, element_bytes: int, op: FakeOp = FakeOp.NEAREST) -> int:
    """Vectors per thread and item of the dense-rows kernels (``fake_dense_unroll`` in the kernel)
    for FakeOp ``op``: 32 bytes of the input for the forwards (_DENSE_THREAD_BYTES,
    _DENSE_STOCHASTIC_THREAD_BYTES), 16 of each input for the straight-through backward, at least
    one vector."""
    per_thread = {FakeOp.STE: _DENSE_STE_THREAD_BYTES, FakeOp.STOCHASTIC: _DENSE_STOCHASTIC_THREAD_BYTES}.get(
        op, _DENSE_THREAD_BYTES
    )
    return max(1, per_thread // (vec * element_bytes))


def dense_block(op: FakeOp, element_bytes: int = 2) -> int:
    """Most threads of a dense-rows block for FakeOp ``op`` on data of ``element_bytes`` bytes
    (the nearest forward on 16-bit data: _DENSE_NEAREST_BLOCK; the others _DENSE_BLOCK)."""
    return _DENSE_NEAREST_BLOCK if op is FakeOp.NEAREST and element_bytes == 2 else _DENSE_BLOCK


#: A validated fake quantization problem (``float_kind``: the data type, in and out).
FakeQuantizeProblem = CodeRangeProblem


def _row_params(precision: MathPrecision, op: FakeOp) -> type[ctypes.Structure]:
    """Argument block of the row kernel of ``op``."""
    data = [("x", ctypes.c_uint64)] + ([("dy", ctypes.c_uint64)] if op is FakeOp.STE else [])
    return params_struct(
        "FakeRowParams",
        data
        + [
            *fields(ctypes.c_uint64, "out", "scale_ptr", "zp_ptr"),
            ("scale_value", acc_ctype(precision)),
            ("zp_value", ctypes.c_int32),
            ("layout", RowLayoutArgs),
        ]
        + (RNG_FIELDS if op is FakeOp.STOCHASTIC else []),
    )


_ROW_PARAMS = {(p, op): _row_params(p, op) for p in MathPrecision for op in FakeOp}
_FLAT_PARAMS = {
    p: params_struct(
        "FakeFlatParams",
        [
            *fields(ctypes.c_uint64, "x", "dy", "out", "scale_ptr", "zp_ptr"),
            ("scale_value", acc_ctype(p)),
            *fields(ctypes.c_int32, "zp_value", "zp_source", "q_min", "q_max"),
            ("n", ctypes.c_int64),
            ("per_thread", ctypes.c_int32),
            *RNG_FIELDS,
        ],
    )
    for p in MathPrecision
}


class FakeRowLaunches(LaunchPair):
    """An elementwise kernel with aligned vector I/O and its one-element-vector twin for misaligned
    operands; ``flat``: ``fake_quantize_flat`` (zero-point source in its own argument) rather than
    a row kernel (source in ``layout.flags``)."""

    __slots__ = ("flat",)

    def __init__(self, primary: PreparedLaunch, fallback: PreparedLaunch, align: int, flat: bool) -> None:
        super().__init__(primary, fallback, align)
        self.flat = flat

    def set_params(self, params: Any, scale: Operand | float, zp: Operand | int, zp_source: int) -> None:
        """Write the per-call parameter fields (pointer or value, zero-point source)."""
        params.scale_ptr, params.scale_value = device_arg(scale)
        params.zp_ptr, params.zp_value = device_arg(zp)
        if self.flat:
            params.zp_source = zp_source
        else:
            params.layout.flags = zp_source


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
    layout: RowLayout, vec_max: int, unroll_max: int, sm_count: int, block_max: int = _DENSE_BLOCK
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
    if not layout.vector_io or vec != vec_max or L % vec or L < _DENSE_MIN_VECTORS * vec or layout.rows == 0:
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
    while block > _DENSE_MIN_VECTORS and block * vec > L:
        block //= 2
    while unroll > 1 and block * vec * unroll >= 2 * L:
        unroll //= 2

    def blocks(b: int, u: int) -> int:
        return layout.rows * -(-L // (b * vec * u))

    while unroll > 1 and blocks(block, unroll) < 2 * sm_count:
        unroll //= 2
    while block > _DENSE_MIN_BLOCK and _DENSE_SM_SHARE * blocks(block, unroll) < sm_count:
        block //= 2
    geometry = DenseRows(layout.rows, L, vec, row_coef, layout.gc, layout.cs, block, unroll)
    return geometry if geometry.items < 2**31 else None


def flat_geometry(n_vectors: int, sm_count: int) -> tuple[int, int]:
    """``(block threads, vectors per thread)`` of ``fake_quantize_flat``: 256 x 4 for large
    tensors; for small ones fewer vectors per thread, then smaller blocks, until the grid has
    two blocks per SM (16 x 8192 bf16: 128 blocks of 128 threads, one vector each)."""
    block, per_thread = BLOCK_THREADS, _FLAT_UNROLL
    while per_thread > 1 and -(-n_vectors // (block * per_thread)) < 2 * sm_count:
        per_thread //= 2
    while block > 64 and -(-n_vectors // (block * per_thread)) < 2 * sm_count:
        block //= 2
    return block, per_thread


def prepare_fake_rows(problem: FakeQuantizeProblem, op: FakeOp, device_id: int) -> tuple[FakeRowLaunches, str]:
    """The elementwise kernel of ``op`` for ``problem`` and its variant tag: ``fake_quantize_flat``
    for TensorScope, the row kernels for the other scopes."""
    info = device_info(device_id)
    functions = load_kernels(
        "fake_quantize", fake_quantize_unit(problem.float_kind), info.arch, device_id, kernel_options()
    )
    float_info = ELEMENTS[problem.float_kind]
    tag, in_bytes, vec = float_info.cpp_tag, float_info.storage_bits // 8, float_info.vec_max
    if isinstance(problem.scope, TensorScope):

        def flat(v: int) -> PreparedLaunch:
            n_vectors = -(-problem.numel // v)
            block, per_thread = flat_geometry(n_vectors, info.sm_count)
            return PreparedLaunch(
                functions[template_name("fake_quantize_flat", tag, v, int(op))],
                max(1, min(_FLAT_MAX_BLOCKS, -(-n_vectors // (block * per_thread)))),
                block,
                _FLAT_PARAMS[problem.precision],
                q_min=problem.q_min,
                q_max=problem.q_max,
                n=problem.numel,
                per_thread=per_thread,
            )

        block, per_thread = flat_geometry(-(-problem.numel // vec), info.sm_count)
        variant = f"tensor/{problem.mode.value}/flat[vec{vec},{block}t,{per_thread}vec-per-thread]"
        return FakeRowLaunches(flat(vec), flat(1), min(16, vec * in_bytes), True), variant
    kernel = FAKE_ROW_KERNELS[op]
    params_type = _ROW_PARAMS[problem.precision, op]

    def rows(layout: RowLayout) -> PreparedLaunch:
        fn = functions[template_name(kernel, tag, layout.vec, True)]
        grid = occupancy_grid(fn, BLOCK_THREADS, layout.blocks(2**62), info)
        return PreparedLaunch(fn, grid, BLOCK_THREADS, params_type, layout=layout.args(problem.q_min, problem.q_max))

    primary = row_layout(problem.shape, problem.scope, vec, False, info.busy_threads)
    fallback = row_layout(problem.shape, problem.scope, 1, False, info.busy_threads)
    align = min(16, primary.vec * in_bytes)
    dense = dense_rows(primary, vec, dense_unroll(vec, in_bytes, op), info.sm_count, dense_block(op, in_bytes))
    prefix = f"{problem.scope.kind}/{problem.mode.value}/"
    if dense is not None:
        fn = functions[template_name(FAKE_DENSE_ROW_KERNELS[op], tag, vec)]
        launch = PreparedLaunch(
            fn, dense.items, dense.block, params_type, layout=dense.args(problem.q_min, problem.q_max)
        )
        return FakeRowLaunches(launch, rows(fallback), align, False), prefix + dense.describe()
    launches = FakeRowLaunches(rows(primary), rows(fallback), align, False)
    return launches, prefix + primary.describe()


__all__ = [
    "DenseRows",
    "ZP_FLOAT",
    "ZP_INT32",
    "ZP_VALUE",
    "FakeOp",
    "FakeQuantizeProblem",
    "FakeRowLaunches",
    "dense_block",
    "dense_rows",
    "dense_unroll",
    "flat_geometry",
    "prepare_fake_rows",
]
