"""Shared machinery of the affine plans: the validated problem, the quantize / dequantize
descriptors, and the static row kernels' launch (``quantize_rows`` / ``dequantize_rows``).

QuantizePlan and DequantizePlan map between a float tensor and a tensor of codes through
per-segment parameters (scale, zero point) with the same row kernels; the dynamic-range plan's
multi-pass path runs the quantize row kernel after computing the parameters; the gradient plans
validate the same descriptors. What they share lives here once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

from quantplan.runtime._device import device_info
from quantplan.runtime._kernel_names import dense_row_kernel_name, dequantize_unit, quantize_unit, row_kernel_name
from quantplan.runtime._launch import (
    LaunchPair,
    PreparedLaunch,
    device_arg,
    fields,
    launch_on,
    occupancy_grid,
    params_struct,
    set_rng,
)
from quantplan.runtime._layout import BLOCK_THREADS, RowLayout, RowLayoutArgs, param_shape, row_layout
from quantplan.runtime._operands import Operand, TensorArgs
from quantplan.runtime._problems import AffineProblem, CodeRangeProblem, ScopedProblem, storage_shape
from quantplan.runtime._tuning import kernel_options
from quantplan.runtime.compiler import load_kernels
from quantplan.vocabulary.elements import ELEMENTS, acc_ctype
from quantplan.vocabulary.errors import InvalidProblem, Unsupported, check_descriptor
from quantplan.vocabulary.formats import BLOCK_ONLY_KINDS, Format, format_of, is_served_code
from quantplan.vocabulary.types import ElementKind, MathPrecision, Model, NibbleOrder, QuantMode, Rounding, Scope, Shape

_FROZEN = ConfigDict(frozen=True, extra="forbid")


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
    if code_kind in BLOCK_ONLY_KINDS:
        raise Unsupported(
            f"{code_kind.name} is an element of the block-scaled formats, which no plan serves yet; "
            f"quantized element must be one of S8, U8, S4, U4, FP8_E4M3, FP8_E5M2"
        )
    if not is_served_code(code_kind):
        raise InvalidProblem(
            f"quantized element must be one of S8, U8, S4, U4, FP8_E4M3, FP8_E5M2, got {code_kind.name}"
        )
    element = format_of(code_kind).element
    param_shape(shape, scope)  # validates axis and group divisibility
    if element.code_range is None:
        if mode is QuantMode.ASYMMETRIC:
            raise InvalidProblem(f"{code_kind.name} codes are symmetric only; use QuantMode.SYMMETRIC")
        if q_min is not None or q_max is not None:
            raise InvalidProblem(f"q_min/q_max do not apply to {code_kind.name}; leave them None")
        lo, hi = 0, 0
    else:
        code_range = element.code_range
        lo, hi = code_range
        lo = lo if q_min is None else q_min
        hi = hi if q_max is None else q_max
        if not (code_range[0] <= lo <= code_range[1] and code_range[0] <= hi <= code_range[1]):
            raise InvalidProblem(
                f"q_min={lo}, q_max={hi} fall outside the {code_kind.name} range {code_range}; "
                f"narrow within it ({_range_hint(code_kind, code_range)})"
            )
        if lo > hi:
            raise InvalidProblem(f"q_min={lo} > q_max={hi}; q_min must not exceed q_max")
    return AffineProblem(tuple(shape), scope, mode, float_kind, lo, hi, code_kind, nibble_order)


_Resolved = TypeVar("_Resolved", bound="ResolvedCodeRange")


class ResolvedCodeRange(Model):
    """Mixin of the descriptors with optional ``q_min`` / ``q_max`` next to an ``output_element``:
    at validation, a range left None is filled with the full range of an integer output kind
    (S8: -128 / 127, U4: 0 / 15, ...), so the fields read the range the plan will use and a
    descriptor built with ``q_min=None`` equals (and hashes as) one built with the explicit
    default. FP8 and float outputs keep None (no integer range applies). ``model_copy(update=...)``
    validates again, resolving the range afresh when ``output_element`` changes."""

    @model_validator(mode="after")
    def _resolve_code_range(self: _Resolved) -> _Resolved:
        values = self.__dict__
        code_range = ELEMENTS[values["output_element"]].code_range
        if code_range is not None:
            if values["q_min"] is None:
                values["q_min"] = code_range[0]
            if values["q_max"] is None:
                values["q_max"] = code_range[1]
        return self

    def model_copy(self: _Resolved, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> _Resolved:
        """A validated copy with ``update`` applied (a range that was resolved, not given, is resolved again)."""
        if not update:
            return super().model_copy(deep=deep)
        data = dict(self.__dict__)
        for name in ("q_min", "q_max"):
            if name not in self.model_fields_set and name not in update:
                data[name] = None
        data.update(update)
        return type(self)(**data)


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


class QuantizeDescriptor(ResolvedCodeRange, ScopedDescriptor):
    """A static quantization problem: ``q = clamp(rne(x / scale) + zp, q_min, q_max)``.

    Fields: ``shape`` of the float input (any rank); ``scope`` (Tensor/Token/Channel/GroupScope);
    ``mode`` SYMMETRIC (no zero point) or ASYMMETRIC (int32 zero point); ``input_element`` F16,
    BF16, F32 or F64; ``output_element`` S8, U8, S4, U4, FP8_E4M3 or FP8_E5M2; ``q_min`` /
    ``q_max`` narrow the integer code range (default None: the full range of the output, filled
    in at validation, so ``desc.q_max`` reads 127 for S8; FP8 keeps None);
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

    @property
    def format(self) -> Format:
        """The code format of ``output_element`` (:mod:`quantplan.vocabulary.formats`): its element, scale
        element per float kind, block geometries, packing and zero point. Unsupported for kinds
        no plan serves."""
        return format_of(self.output_element)


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
    def format(self) -> Format:
        """The code format of ``input_element`` (:mod:`quantplan.vocabulary.formats`). Unsupported for kinds
        no plan serves."""
        return format_of(self.input_element)

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

    @property
    def launches(self) -> tuple[PreparedLaunch, ...]:
        return self.pair.launches

    @classmethod
    def prepare(
        cls, problem: AffineProblem, float_to_code: bool, device_id: int, dense: RowLayout | None
    ) -> AffineRows:
        """Compile (first use) and prepare the row kernel of ``problem`` on ``device_id``:
        ``dense``, the layout of the ``dense-rows`` schedule, or None for ``row-layout``
        (:func:`quantplan.runtime._selection.choose_rows` chooses).

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
        if dense is not None:
            # The hot layouts: one (row, chunk) item per block (kernels/qp_row_layout.cuh, dense_item).
            dense_kernel = "quantize_dense" if float_to_code else "dequantize_dense"
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
