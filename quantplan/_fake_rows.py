"""The elementwise fake-quantization launches shared by FakeQuantizePlan, FakeQuantizeBackwardPlan
and DynamicRangeFakeQuantizePlan's multi-pass path (``kernels/fake_quantize.cu``).

:class:`FakeRowLaunches` is one elementwise kernel (forward with either rounding, or the
straight-through backward) for aligned operands and its element-I/O twin: the row kernels for
Token / Channel / GroupScope, ``fake_quantize_flat`` for TensorScope.
"""

from __future__ import annotations

import ctypes
import enum
from typing import Any

from ._affine import CodeRangeProblem
from ._device import device_info
from ._families import FAKE_ROW_KERNELS, fake_quantize_unit
from ._launch import RNG_FIELDS, LaunchPair, PreparedLaunch, device_arg, fields, occupancy_grid, params_struct
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, row_layout
from ._operands import Operand
from .compiler import compile_options, load_kernels, template_name
from .elements import ELEMENTS, acc_ctype
from .types import MathPrecision, Rounding, TensorScope

#: ZeroPointSource of ``qp_fake_quantize.cuh``: the scalar value, an int32 array, a float array.
ZP_VALUE, ZP_INT32, ZP_FLOAT = 0, 1, 2
#: Vectors one thread of ``fake_quantize_flat`` takes per tile (kFakeUnroll in the kernel).
_FLAT_UNROLL = 4
#: Most blocks of one ``fake_quantize_flat`` launch (grid-stride beyond).
_FLAT_MAX_BLOCKS = 1 << 20


class FakeOp(enum.IntEnum):
    """What an elementwise fake-quantization kernel computes (``FakeOp`` of ``kernels/fake_quantize.cu``)."""

    NEAREST = 0  #: y = fake(x), rne
    STE = 1  #: dx = dy * mask
    STOCHASTIC = 2  #: y = fake(x), Philox stochastic rounding

    @classmethod
    def forward(cls, rounding: Rounding) -> FakeOp:
        """The forward kernel op of ``rounding``."""
        return cls.STOCHASTIC if rounding is Rounding.STOCHASTIC else cls.NEAREST


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


def prepare_fake_rows(problem: FakeQuantizeProblem, op: FakeOp, device_id: int) -> tuple[FakeRowLaunches, str]:
    """The elementwise kernel of ``op`` for ``problem`` and its variant tag: ``fake_quantize_flat``
    for TensorScope, the row kernels for the other scopes."""
    info = device_info(device_id)
    functions = load_kernels(
        "fake_quantize", fake_quantize_unit(problem.float_kind), info.arch, device_id, compile_options()
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
    launches = FakeRowLaunches(rows(primary), rows(fallback), min(16, primary.vec * in_bytes), False)
    return launches, f"{problem.scope.kind}/{problem.mode.value}/{primary.describe()}"


__all__ = [
    "ZP_FLOAT",
    "ZP_INT32",
    "ZP_VALUE",
    "FakeOp",
    "FakeQuantizeProblem",
    "FakeRowLaunches",
    "flat_geometry",
    "prepare_fake_rows",
]
