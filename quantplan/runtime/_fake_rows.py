"""The elementwise fake-quantization launches shared by FakeQuantizePlan, FakeQuantizeBackwardPlan
and DynamicRangeFakeQuantizePlan's multi-pass path (``kernels/fake_quantize.cu``).

:class:`FakeRowLaunches` is one elementwise kernel (forward with either rounding, or the
straight-through backward) for aligned operands and its element-I/O twin: the row kernels for
Token / Channel / GroupScope (``*_dense_rows`` on the hot layouts, :func:`dense_rows`, where
:func:`quantplan.runtime._selection.choose_fake_rows` chooses them),
``fake_quantize_flat`` for TensorScope.
"""

from __future__ import annotations

import ctypes
from typing import Any

from quantplan.runtime._device import device_info
from quantplan.runtime._kernel_names import FAKE_DENSE_ROW_KERNELS, FAKE_ROW_KERNELS, fake_quantize_unit
from quantplan.runtime._launch import (
    RNG_FIELDS,
    LaunchPair,
    PreparedLaunch,
    device_arg,
    fields,
    occupancy_grid,
    params_struct,
)
from quantplan.runtime._layout import (
    BLOCK_THREADS,
    DenseRows,
    RowLayout,
    RowLayoutArgs,
    dense_block,
    dense_rows,
    dense_unroll,
    row_layout,
)
from quantplan.runtime._operands import Operand
from quantplan.runtime._problems import CodeRangeProblem
from quantplan.runtime._tuning import TUNING, kernel_options
from quantplan.runtime.compiler import load_kernels, template_name
from quantplan.vocabulary._kinds import FakeOp
from quantplan.vocabulary.elements import ELEMENTS, acc_ctype
from quantplan.vocabulary.types import MathPrecision, TensorScope

#: ZeroPointSource of ``qp_fake_quantize.cuh``: the scalar value, an int32 array, a float array.
ZP_VALUE, ZP_INT32, ZP_FLOAT = 0, 1, 2
#: Vectors one thread of ``fake_quantize_flat`` takes per tile (kFakeUnroll in the kernel).
_FLAT_UNROLL = TUNING.fake_flat_unroll
#: Most blocks of one ``fake_quantize_flat`` launch (grid-stride beyond).
_FLAT_MAX_BLOCKS = 1 << 20
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


def prepare_fake_rows(
    problem: FakeQuantizeProblem, op: FakeOp, device_id: int, dense: DenseRows | None
) -> tuple[FakeRowLaunches, str]:
    """The elementwise kernel of ``op`` for ``problem`` and its variant tag: ``fake_quantize_flat``
    for TensorScope, the row kernels for the other scopes: ``dense``, the geometry of the
    ``dense-rows`` schedule, or None for ``row-layout`` (:func:`quantplan.runtime._selection.choose_fake_rows`
    chooses)."""
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
