"""Static quantization and dequantization: QuantizePlan and DequantizePlan.

Formulas (SPEC section 4; arithmetic in float32, float64 for F64 data; rne = round half to even):

* quantize, integer codes: ``q = clamp(rne(x / scale) + zp, q_min, q_max)``; NaN -> ``zp``;
  +-Inf clamps to ``q_max`` / ``q_min``.
* quantize, FP8 codes: ``q = fp8_rne_saturate(x / scale)``; +-Inf saturate to +-max; NaN -> 0x7F.
* dequantize: ``y = (q - zp) * scale`` (FP8: ``y = q * scale``), rounded once to the output type.

Kernels: ``kernels/quantize.cu`` (``quantize_rows``) and ``kernels/dequantize.cu``
(``dequantize_rows``); reference: :func:`quantplan.reference.quantize` / ``dequantize``; tests:
``tests/test_quantize_*.py``. Their gradients (``quantize_backward_rows``,
``dequantize_backward_rows``, compiled in the same units) are planned by
:mod:`quantplan.quantize_backward`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from . import reference
from ._affine import AffineArgs, AffineProblem, StaticAffinePlan, resolve_affine_problem, storage_shape
from ._layout import param_shape
from .compiler import register_family, template_name
from .elements import CODE_KINDS, ELEMENTS, FLOAT_KINDS
from .types import (
    ElementKind,
    NibbleOrder,
    OpCategory,
    PlanPreference,
    QuantMode,
    Rounding,
    Scope,
)

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class QuantizeDescriptor(BaseModel):
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

    model_config = _FROZEN
    shape: tuple[int, ...]
    scope: Scope
    mode: QuantMode = QuantMode.SYMMETRIC
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
    def param_shape(self) -> tuple[int, ...]:
        """Shape of ``scale`` / ``zero_point``."""
        return param_shape(self.shape, self.scope)


def quantize_problem(desc: QuantizeDescriptor) -> AffineProblem:
    """The validated problem of a quantize descriptor (also a dynamic-range one); InvalidProblem if malformed."""
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
    return replace(problem, stochastic=desc.rounding is Rounding.STOCHASTIC)


class DequantizeDescriptor(BaseModel):
    """A dequantization problem: ``y = (q - zp) * scale`` rounded once to ``output_element``.

    Fields: ``shape`` of the float output (the logical element shape; 4-bit inputs are stored
    packed, see ``input_shape``); ``scope``; ``mode``; ``input_element`` S8, U8, S4, U4,
    FP8_E4M3 or FP8_E5M2; ``output_element`` F16, BF16, F32 or F64; ``nibble_order`` for S4 / U4.
    """

    model_config = _FROZEN
    shape: tuple[int, ...]
    scope: Scope
    mode: QuantMode = QuantMode.SYMMETRIC
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

    @property
    def param_shape(self) -> tuple[int, ...]:
        """Shape of ``scale`` / ``zero_point``."""
        return param_shape(self.shape, self.scope)


class QuantizeArgs(AffineArgs):
    """Arguments of :class:`QuantizePlan`: ``input`` (floats), ``output`` (codes), ``scale``,
    ``zero_point`` and, for STOCHASTIC rounding, ``rng_seed`` / ``rng_offset`` (Python ints in
    [0, 2**64) or one-element int64 device arrays; element ``i`` of the flattened input uses
    Philox counter ``(i // 4, offset)`` and key ``seed``).

    Arrays may be CuPy arrays, PyTorch CUDA tensors (bfloat16 and float8 included) or, for the
    reference backend, NumPy arrays. CuPy has no bfloat16 / float8: pass uint16 / uint8 views.
    """

    __slots__ = ()


class DequantizeArgs(AffineArgs):
    """Arguments of :class:`DequantizePlan`: ``input`` (codes), ``output`` (floats), ``scale``, ``zero_point``."""

    __slots__ = ()


class QuantizePlan(StaticAffinePlan):
    """Static-parameter quantization of a float tensor to integer or FP8 codes.

    Formula: ``q = clamp(rne(x / scale) + zp, q_min, q_max)`` (integer codes; NaN -> zp, +-Inf
    clamp), ``q = fp8_rne_saturate(x / scale)`` (FP8; NaN -> 0x7F).

    **When to use:** you already hold the scale (and zero point) — calibrated activations, weights
    quantized offline — and want one pass over memory. If the scale comes from the data itself,
    use the dynamic-range plan instead.

    **Dtypes:** input F16 / BF16 / F32 / F64; output S8 / U8 / S4 / U4 (packed, either nibble
    order) / FP8_E4M3 / FP8_E5M2. ``scale`` float32 (float64 for F64 input); ``zero_point`` int32.

    **Shape limits:** any rank, any extents; 64-bit indexing; no limit on rows. The last axis (or
    the axes merged into a row) must be shorter than 2**31 elements.

    **Workspace:** none (``workspace_size() == 0``).

    **Precision guarantee:** float32 arithmetic (float64 for F64), IEEE division, round half to
    even; equal bit for bit to :func:`quantplan.reference.quantize`; deterministic.
    """

    _family = "quantize"
    _kernel = "quantize_rows"
    _category = OpCategory.QUANTIZE
    _float_to_code = True

    @classmethod
    def _compile_unit(cls, problem: AffineProblem) -> list[str]:
        high_first = problem.nibble_order is NibbleOrder.HIGH_FIRST
        return quantize_unit(problem.float_kind, problem.code_kind, high_first, problem.stochastic)

    @classmethod
    def select(cls, stream: Any, desc: QuantizeDescriptor, pref: PlanPreference | None = None) -> QuantizePlan:
        """Validate ``desc``, pick the backend and kernel variant, compile it on first use.

        ``stream`` decides the device (None: CuPy's current device). Raises InvalidProblem for a
        malformed descriptor and Unsupported for a valid one this library does not serve.
        """
        plan = cls._select(stream, quantize_problem(desc), pref or PlanPreference())
        assert isinstance(plan, QuantizePlan)
        return plan

    def _reference(
        self,
        src: np.ndarray,
        scale: np.ndarray,
        zp: np.ndarray | int,
        shape: tuple[int, ...],
        uniform: np.ndarray | None = None,
    ) -> np.ndarray:
        p = self.problem
        return reference.quantize(
            src, scale, zp, p.code_kind, p.q_min, p.q_max, p.precision, p.nibble_order, uniform=uniform
        )


class DequantizePlan(StaticAffinePlan):
    """Dequantization of integer or FP8 codes to a float tensor.

    Formula: ``y = (q - zp) * scale`` (FP8: ``y = q * scale``), computed in float32 (float64 for
    F64 output), rounded once to the output type.

    **When to use:** reconstructing weights or activations stored as codes (W8A16, W4A16, FP8
    checkpoints), or checking a quantizer's error.

    **Dtypes:** input S8 / U8 / S4 / U4 (packed, either nibble order) / FP8_E4M3 / FP8_E5M2;
    output F16 / BF16 / F32 / F64. ``scale`` float32 (float64 for F64 output); ``zero_point`` int32.

    **Shape limits:** as QuantizePlan.

    **Workspace:** none.

    **Precision guarantee:** one product in the accumulator type, one rounding to the output;
    equal bit for bit to :func:`quantplan.reference.dequantize` (NaN payloads aside); deterministic.
    """

    _family = "dequantize"
    _kernel = "dequantize_rows"
    _category = OpCategory.DEQUANTIZE
    _float_to_code = False

    @classmethod
    def _compile_unit(cls, problem: AffineProblem) -> list[str]:
        high_first = problem.nibble_order is NibbleOrder.HIGH_FIRST
        return dequantize_unit(problem.float_kind, problem.code_kind, high_first)

    @classmethod
    def select(cls, stream: Any, desc: DequantizeDescriptor, pref: PlanPreference | None = None) -> DequantizePlan:
        """Validate ``desc``, pick the backend and kernel variant, compile it on first use."""
        problem = resolve_affine_problem(
            desc.shape, desc.scope, desc.mode, desc.output_element, desc.input_element, None, None, desc.nibble_order
        )
        plan = cls._select(stream, problem, pref or PlanPreference())
        assert isinstance(plan, DequantizePlan)
        return plan

    def _reference(
        self,
        src: np.ndarray,
        scale: np.ndarray,
        zp: np.ndarray | int,
        shape: tuple[int, ...],
        uniform: np.ndarray | None = None,
    ) -> np.ndarray:
        p = self.problem
        return reference.dequantize(src, scale, zp, p.code_kind, p.float_kind, shape[-1], p.precision, p.nibble_order)


def row_kernel_unit(
    kernel: str,
    float_to_code: bool,
    float_kind: ElementKind,
    code_kind: ElementKind,
    high_first: bool,
    stochastic: bool = False,
) -> list[str]:
    """Every vector-width instantiation of one (float, code, nibble order[, stochastic]) combination.

    Vector widths: the largest is 8 elements (4 for F64), halved while it does not divide the
    row; packed codes need at least 2; (2, scalar-io) serves odd rows and misaligned pointers.
    ``stochastic`` (quantize direction only) selects the Philox-rounding instantiations.
    """
    vec_max = 4 if float_kind is ElementKind.F64 else 8
    packed = ELEMENTS[code_kind].is_packed
    shapes = [(v, True) for v in (8, 4, 2, 1) if v <= vec_max and (v >= 2 or not packed)]
    if packed:
        shapes.append((2, False))
    f_tag, c_tag = ELEMENTS[float_kind].cpp_tag, ELEMENTS[code_kind].cpp_tag
    in_tag, out_tag = (f_tag, c_tag) if float_to_code else (c_tag, f_tag)
    extra = (stochastic,) if float_to_code else ()
    return [
        template_name(kernel, in_tag, out_tag, vec, vector_io, high_first and packed, *extra)
        for vec, vector_io in shapes
    ]


def backward_widths(float_kind: ElementKind) -> list[int]:
    """Vector widths of the gradient row kernels: 8, 4, 2, 1 (F64 from 4); width 1 serves misaligned operands."""
    vec_max = 4 if float_kind is ElementKind.F64 else 8
    return [v for v in (8, 4, 2, 1) if v <= vec_max]


def quantize_backward_names(float_kind: ElementKind, code_kind: ElementKind) -> list[str]:
    """``quantize_backward_rows`` (QuantizeBackwardPlan) of one (float, code) pair at every vector width."""
    f_tag, c_tag = ELEMENTS[float_kind].cpp_tag, ELEMENTS[code_kind].cpp_tag
    return [template_name("quantize_backward_rows", f_tag, c_tag, v) for v in backward_widths(float_kind)]


def dequantize_backward_names(float_kind: ElementKind) -> list[str]:
    """``dequantize_backward_rows`` (DequantizeBackwardPlan) of one float kind at every vector width."""
    tag = ELEMENTS[float_kind].cpp_tag
    return [template_name("dequantize_backward_rows", tag, v) for v in backward_widths(float_kind)]


def quantize_unit(float_kind: ElementKind, code_kind: ElementKind, high_first: bool, stochastic: bool) -> list[str]:
    """The compile unit of one (float, code, nibble order, rounding): ``quantize_rows`` at every
    width and, with round-to-nearest-even, ``quantize_backward_rows`` of the same pair, so a
    forward plan and its backward plan load one module."""
    names = row_kernel_unit("quantize_rows", True, float_kind, code_kind, high_first, stochastic)
    return names if stochastic else names + quantize_backward_names(float_kind, code_kind)


def dequantize_unit(float_kind: ElementKind, code_kind: ElementKind, high_first: bool) -> list[str]:
    """The compile unit of one (code, float, nibble order): ``dequantize_rows`` and
    ``dequantize_backward_rows`` of the float kind (shared by DequantizePlan and DequantizeBackwardPlan)."""
    return row_kernel_unit("dequantize_rows", False, float_kind, code_kind, high_first) + dequantize_backward_names(
        float_kind
    )


def _orders(code_kind: ElementKind) -> tuple[bool, ...]:
    return (False, True) if ELEMENTS[code_kind].is_packed else (False,)


@register_family("quantize")
def quantize_units() -> list[list[str]]:
    """Compile units of ``kernels/quantize.cu`` (QuantizePlan, QuantizeBackwardPlan): one per
    (float, code, nibble order, rounding)."""
    return [
        quantize_unit(float_kind, code_kind, high_first, stochastic)
        for float_kind in FLOAT_KINDS
        for code_kind in CODE_KINDS
        for high_first in _orders(code_kind)
        for stochastic in (False, True)
    ]


@register_family("dequantize")
def dequantize_units() -> list[list[str]]:
    """Compile units of ``kernels/dequantize.cu`` (DequantizePlan, DequantizeBackwardPlan): one per
    (float, code, nibble order)."""
    return [
        dequantize_unit(float_kind, code_kind, high_first)
        for float_kind in FLOAT_KINDS
        for code_kind in CODE_KINDS
        for high_first in _orders(code_kind)
    ]


__all__ = [
    "DequantizeArgs",
    "DequantizeDescriptor",
    "DequantizePlan",
    "QuantizeArgs",
    "QuantizeDescriptor",
    "QuantizePlan",
]
