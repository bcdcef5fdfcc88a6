"""Shared machinery of the affine plans: the validated problem, the quantize / dequantize
descriptors, and the static row kernels' launch (``quantize_rows`` / ``dequantize_rows``).

QuantizePlan and DequantizePlan map between a float tensor and a tensor of codes through
per-segment parameters (scale, zero point) with the same row kernels; the dynamic-range plan's
multi-pass path runs the quantize row kernel after computing the parameters; the gradient plans
validate the same descriptors. What they share lives here once.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict

from ._device import device_info
from ._families import ROW_DENSE_FLOAT_KINDS, dense_row_kernel_name, dequantize_unit, quantize_unit, row_kernel_name
from ._launch import LaunchPair, PreparedLaunch, device_arg, fields, launch_on, occupancy_grid, params_struct, set_rng
from ._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, dense_row_layout, param_shape, row_layout
from ._operands import Operand, TensorArgs
from ._plan import check_descriptor
from ._tuning import kernel_options
from .compiler import load_kernels
from .elements import ELEMENTS, acc_ctype
from .errors import InvalidProblem
from .types import ElementKind, MathPrecision, Model, NibbleOrder, QuantMode, Rounding, Scope, Shape

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def storage_shape(shape: tuple[int, ...], kind: ElementKind) -> tuple[int, ...]:
    """Shape of the array holding ``shape`` elements of ``kind`` (4-bit kinds: last axis halved, rounded up)."""
    if not ELEMENTS[kind].is_packed:
        return shape
    dims = shape if shape else (1,)
    return (*dims[:-1], (dims[-1] + 1) // 2)


class ScopedProblem:
    """What every validated problem derives from its ``shape``, ``scope`` and ``float_kind``."""

    shape: tuple[int, ...]
    scope: Scope
    float_kind: ElementKind

    @property
    def precision(self) -> MathPrecision:
        return ELEMENTS[self.float_kind].math_precision

    @property
    def param_shape(self) -> tuple[int, ...]:
        return param_shape(self.shape, self.scope)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class CodeRangeProblem(ScopedProblem):
    """A validated problem over integer codes ``[q_min, q_max]``: the float data (``float_kind``,
    in and out for fake quantization), its scope and mode."""

    shape: tuple[int, ...]
    scope: Scope
    mode: QuantMode
    float_kind: ElementKind
    q_min: int
    q_max: int


@dataclass(frozen=True)
class AffineProblem(CodeRangeProblem):
    """A validated affine problem: float side, code side, scope, parameters, code range, rounding."""

    code_kind: ElementKind
    nibble_order: NibbleOrder
    #: Round half to even, or Philox stochastic rounding (quantize direction only).
    rounding: Rounding = Rounding.NEAREST_EVEN
    #: RowLayout.flags of the kernel (quantize.cu bit 0: NaN scale -> FP8 code 0, dynamic range).
    layout_flags: int = 0

    @property
    def code_shape(self) -> tuple[int, ...]:
        return storage_shape(self.shape, self.code_kind)

    @property
    def stochastic(self) -> bool:
        """True for ``Rounding.STOCHASTIC``."""
        return self.rounding is Rounding.STOCHASTIC

    @property
    def high_first(self) -> bool:
        """4-bit codes with the high nibble first (the kernels' template flag)."""
        return ELEMENTS[self.code_kind].is_packed and self.nibble_order is NibbleOrder.HIGH_FIRST


def _range_hint(kind: ElementKind, code_range: tuple[int, int]) -> str:
    """An example range of ``kind``: the symmetric one of a signed kind, the full one otherwise."""
    lo, hi = code_range
    if lo < 0:
        return f"e.g. symmetric {kind.name} uses q_min={-hi}, q_max={hi}"
    return f"e.g. {kind.name} uses q_min={lo}, q_max={hi}"


def resolve_affine_problem(
    shape: tuple[int, ...],
    scope: Scope,
    mode: QuantMode,
    float_kind: ElementKind,
    code_kind: ElementKind,
    q_min: int | None,
    q_max: int | None,
    nibble_order: NibbleOrder,
) -> AffineProblem:
    """Validate the descriptor fields shared by the affine plans; raise InvalidProblem / Unsupported."""
    if any(e < 0 for e in shape):
        raise InvalidProblem(f"shape {shape} has a negative extent")
    if not ELEMENTS[float_kind].is_float:
        raise InvalidProblem(f"float element must be one of F16, BF16, F32, F64, got {float_kind.name}")
    code = ELEMENTS[code_kind]
    if not code.is_code:
        raise InvalidProblem(
            f"quantized element must be one of S8, U8, S4, U4, FP8_E4M3, FP8_E5M2, got {code_kind.name}"
        )
    param_shape(shape, scope)  # validates axis and group divisibility
    if code.is_fp8:
        if mode is QuantMode.ASYMMETRIC:
            raise InvalidProblem(f"{code_kind.name} codes are symmetric only; use QuantMode.SYMMETRIC")
        if q_min is not None or q_max is not None:
            raise InvalidProblem(f"q_min/q_max do not apply to {code_kind.name}; leave them None")
        lo, hi = 0, 0
    else:
        assert code.code_range is not None
        lo, hi = code.code_range
        lo = lo if q_min is None else q_min
        hi = hi if q_max is None else q_max
        if not (code.code_range[0] <= lo <= code.code_range[1] and code.code_range[0] <= hi <= code.code_range[1]):
            raise InvalidProblem(
                f"q_min={lo}, q_max={hi} fall outside the {code_kind.name} range {code.code_range}; "
                f"narrow within it ({_range_hint(code_kind, code.code_range)})"
            )
        if lo > hi:
            raise InvalidProblem(f"q_min={lo} > q_max={hi}; q_min must not exceed q_max")
    return AffineProblem(tuple(shape), scope, mode, float_kind, lo, hi, code_kind, nibble_order)


class ScopedDescriptor(Model):
    """The fields every scoped descriptor starts with: ``shape`` (any rank), ``scope`` (Tensor /
    Token / Channel / GroupScope: which elements share a scale and zero point) and ``mode``
    (SYMMETRIC: zero point 0; ASYMMETRIC: an integer zero point). Frozen, hashable, no extra fields.
    """

    shape: Shape
    scope: Scope
    mode: QuantMode = QuantMode.SYMMETRIC

    @property
    def param_shape(self) -> tuple[int, ...]:
        """Shape of the scale / zero-point tensors (SPEC section 3)."""
        return param_shape(self.shape, self.scope)


_Gradient = TypeVar("_Gradient", bound="GradientOf")


class GradientOf:
    """Mixin of a gradient descriptor: the forward descriptor's fields, built by :meth:`from_forward`."""

    shape: tuple[int, ...]

    @classmethod
    def from_forward(cls: type[_Gradient], desc: BaseModel) -> _Gradient:
        """The backward descriptor of the forward problem ``desc`` (every field copied)."""
        return cls(**dict(desc))

    @property
    def grad_shape(self) -> tuple[int, ...]:
        """Shape of the gradient tensors: the float shape (4-bit codes unpacked)."""
        return self.shape


class QuantizeDescriptor(ScopedDescriptor):
    """A static quantization problem: ``q = clamp(rne(x / scale) + zp, q_min, q_max)``.

    Fields: ``shape`` of the float input (any rank); ``scope`` (Tensor/Token/Channel/GroupScope);
    ``mode`` SYMMETRIC (no zero point) or ASYMMETRIC (int32 zero point); ``input_element`` F16,
    BF16, F32 or F64; ``output_element`` S8, U8, S4, U4, FP8_E4M3 or FP8_E5M2; ``q_min`` /
    ``q_max`` narrow the integer code range (default: the full range of the output);
    ``nibble_order`` for S4 / U4; ``rounding`` NEAREST_EVEN or STOCHASTIC (Philox4x32-10, SPEC
    section 4: ``q = floor(v) + (u < v - floor(v))`` with ``v = x / scale``; FP8 picks between
    the two neighbouring FP8 values the same way; the run's ``rng_seed`` / ``rng_offset`` make
    it reproducible, independent of the launch configuration).

    Shapes it implies: ``output_shape`` (4-bit codes packed two per byte along the last axis,
    odd rows padded with a zero nibble) and ``param_shape`` (SPEC section 3).
    """

    input_element: ElementKind
    output_element: ElementKind
    q_min: int | None = None
    q_max: int | None = None
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST
    rounding: Rounding = Rounding.NEAREST_EVEN

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of the output storage array."""
        return storage_shape(self.shape, self.output_element)


class DequantizeDescriptor(ScopedDescriptor):
    """A dequantization problem: ``y = (q - zp) * scale`` rounded once to ``output_element``.

    Fields: ``shape`` of the float output (the logical element shape; 4-bit inputs are stored
    packed, see ``input_shape``); ``scope``; ``mode``; ``input_element`` S8, U8, S4, U4,
    FP8_E4M3 or FP8_E5M2; ``output_element`` F16, BF16, F32 or F64; ``nibble_order`` for S4 / U4.
    """

    input_element: ElementKind
    output_element: ElementKind
    nibble_order: NibbleOrder = NibbleOrder.LOW_FIRST

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of the quantized input storage array."""
        return storage_shape(self.shape, self.input_element)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of the float output."""
        return self.shape


def quantize_problem(desc: QuantizeDescriptor) -> AffineProblem:
    """The validated problem of a quantize descriptor (also a dynamic-range one); InvalidProblem if malformed."""
    check_descriptor(desc, QuantizeDescriptor)
    problem = resolve_affine_problem(
        desc.shape,
        desc.scope,
        desc.mode,
        desc.input_element,
        desc.output_element,
        desc.q_min,
        desc.q_max,
        desc.nibble_order,
    )
    return replace(problem, rounding=desc.rounding)


def dequantize_problem(desc: DequantizeDescriptor) -> AffineProblem:
    """The validated problem of a dequantize descriptor (the forward's rules); InvalidProblem if malformed."""
    check_descriptor(desc, DequantizeDescriptor)
    return resolve_affine_problem(
        desc.shape, desc.scope, desc.mode, desc.output_element, desc.input_element, None, None, desc.nibble_order
    )


@dataclass(slots=True)
class AffineArgs(TensorArgs):
    """Tensors of one static affine run: ``input``, ``output``, ``scale``, ``zero_point`` and,
    for stochastic rounding, ``rng_seed`` / ``rng_offset``.

    ``rng_seed``, ``rng_offset``: Python ints in [0, 2**64) or one-element int64 device arrays
    (read by the kernel, so a captured graph replays with whatever the caller stored there);
    required with ``Rounding.STOCHASTIC``, None otherwise. ``scale``: array of the descriptor's
    ``param_shape`` (float32; float64 for F64 plans) or, for TensorScope, a Python float or a
    one-element device array. ``zero_point``: None for SYMMETRIC; for ASYMMETRIC an int32 array
    of ``param_shape`` or, for TensorScope, a Python int or one-element array.
    """

    scale: Any
    zero_point: Any = None
    rng_seed: Any = None
    rng_offset: Any = None


class AffineOperands(NamedTuple):
    """Operands of one affine run (static, dynamic-range and dynamic fake quantization): input,
    output, scale and zero point (arrays, Python scalars, or None where absent), Philox seed and
    offset (None with round-to-nearest-even)."""

    x: Operand
    y: Operand
    scale: Any
    zp: Any
    seed: Operand | int | None
    offset: Operand | int | None


_ROW_FIELDS: list[tuple[str, Any]] = [
    *fields(ctypes.c_uint64, "src", "dst", "scale_ptr", "zp_ptr"),
]
#: Argument blocks of ``dequantize_rows`` (rng False) / ``quantize_rows`` (rng True) per precision.
_ROW_KERNEL_PARAMS = {
    (precision, rng): params_struct(
        "RowKernelParams",
        [
            *_ROW_FIELDS,
            ("scale_value", acc_ctype(precision)),
            ("zp_value", ctypes.c_int32),
            ("layout", RowLayoutArgs),
            *(
                [("seed_ptr", ctypes.c_uint64), ("offset_ptr", ctypes.c_uint64)]
                + [("seed_value", ctypes.c_uint64), ("offset_value", ctypes.c_uint64)]
                if rng
                else []
            ),
        ],
    )
    for precision in MathPrecision
    for rng in (False, True)
}


class AffineRows:
    """The prepared row kernel of a static affine problem (quantize or dequantize direction):
    aligned vector I/O and its twin, with the row layout the variant names."""

    __slots__ = ("device_id", "layout", "pair", "stochastic")

    def __init__(self, pair: LaunchPair, layout: RowLayout, device_id: int, stochastic: bool) -> None:
        self.pair, self.layout, self.device_id, self.stochastic = pair, layout, device_id, stochastic

    @classmethod
    def prepare(cls, problem: AffineProblem, float_to_code: bool, device_id: int) -> AffineRows:
        """Compile (first use) and prepare the row kernel of ``problem`` on ``device_id``.

        One NVRTC program per (input, output, nibble order[, rounding]) holds every vector width,
        so plans of other shapes with the same dtypes reuse the loaded module.
        """
        info = device_info(device_id)
        float_info, code_info = ELEMENTS[problem.float_kind], ELEMENTS[problem.code_kind]
        high_first = problem.high_first
        if float_to_code:
            kernel, rounding = "quantize_rows", problem.rounding
            unit = quantize_unit(problem.float_kind, problem.code_kind, high_first, problem.rounding)
        else:
            kernel, rounding = "dequantize_rows", None
            unit = dequantize_unit(problem.float_kind, problem.code_kind, high_first)
        functions = load_kernels(kernel.partition("_")[0], unit, info.arch, device_id, kernel_options())
        params_type = _ROW_KERNEL_PARAMS[problem.precision, float_to_code]
        packed = code_info.is_packed

        def prepare(layout: RowLayout) -> PreparedLaunch:
            name = row_kernel_name(
                kernel, float_to_code, problem.float_kind, problem.code_kind, layout.vec, layout.vector_io,
                high_first, rounding,
            )  # fmt: skip
            fn = functions[name]
            grid = occupancy_grid(fn, BLOCK_THREADS, layout.blocks(2**62), info)
            args = layout.args(problem.q_min, problem.q_max, problem.layout_flags)
            return PreparedLaunch(fn, grid, BLOCK_THREADS, params_type, layout=args)

        primary = row_layout(problem.shape, problem.scope, float_info.vec_max, packed, info.busy_threads)
        fallback = row_layout(problem.shape, problem.scope, 1, packed, info.busy_threads)
        primary_launch: PreparedLaunch | None = None
        dense_kernel = "quantize_dense" if float_to_code else "dequantize_dense"
        if problem.float_kind in ROW_DENSE_FLOAT_KINDS and rounding is not Rounding.STOCHASTIC:
            dense = dense_row_layout(problem.shape, problem.scope, dense_kernel, packed, info.sm_count)
            if dense is not None:
                # The hot layouts: one (row, chunk) item per block (kernels/qp_row_layout.cuh, dense_item).
                primary = dense
                fn = functions[
                    dense_row_kernel_name(dense_kernel, problem.float_kind, problem.code_kind, high_first, dense.vec)
                ]
                args = dense.args(problem.q_min, problem.q_max, problem.layout_flags)
                primary_launch = PreparedLaunch(fn, dense.items, dense.threads, params_type, layout=args)
        in_bits, out_bits = float_info.storage_bits, code_info.storage_bits
        if not float_to_code:
            in_bits, out_bits = out_bits, in_bits
        v = primary.vec
        pair = LaunchPair(
            primary_launch or prepare(primary),
            prepare(fallback),
            min(16, v * in_bits // 8),
            min(16, max(1, v * out_bits // 8)),
        )
        return cls(pair, primary, device_id, float_to_code and problem.stochastic)

    def launch(
        self,
        handle: int,
        src: int,
        dst: int,
        scale: Operand | float,
        zp: Operand | int | None,
        seed: Operand | int | None = None,
        offset: Operand | int | None = None,
    ) -> None:
        """Enqueue the kernel on raw stream ``handle``: ``scale`` / ``zp`` device arrays or values."""
        launch = self.pair.pick(src, dst)
        params = launch.params
        params.src = src
        params.dst = dst
        params.scale_ptr, params.scale_value = device_arg(scale)
        params.zp_ptr, params.zp_value = device_arg(zp)
        if self.stochastic:
            set_rng(params, seed, offset)
        launch_on(self.device_id, handle, launch)


__all__ = [
    "AffineArgs",
    "AffineOperands",
    "AffineProblem",
    "AffineRows",
    "CodeRangeProblem",
    "GradientOf",
    "ScopedDescriptor",
    "DequantizeDescriptor",
    "QuantizeDescriptor",
    "ScopedProblem",
    "dequantize_problem",
    "quantize_problem",
    "resolve_affine_problem",
    "storage_shape",
]
