"""The validated problems every affine plan shares: shape, scope and float side (:class:`ScopedProblem`),
the integer code range (:class:`CodeRangeProblem`), the code side (:class:`AffineProblem`), and the
storage shape of packed codes. Plain data over the vocabulary and the scope layout, so the launch
geometry (``_segments``, ``_fake_rows``) reads a problem without importing the descriptors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantplan.vocabulary.elements import ELEMENTS
from quantplan.vocabulary.formats import Format, affine_scale_element, format_of
from quantplan.vocabulary.types import ElementKind, MathPrecision, NibbleOrder, QuantMode, Rounding, Scope, param_shape


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
    def scale_kind(self) -> ElementKind:
        """The scale element: the affine formats' scale for ``float_kind`` (:mod:`quantplan.vocabulary.formats`)."""
        return affine_scale_element(self.float_kind)

    @property
    def scale_dtype(self) -> np.dtype:
        """NumPy dtype of the scale tensor (the elements table's storage of :attr:`scale_kind`)."""
        return ELEMENTS[self.scale_kind].numpy_dtype

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
    def format(self) -> Format:
        """The code format (:func:`quantplan.vocabulary.formats.format_of` of ``code_kind``)."""
        return format_of(self.code_kind)

    @property
    def scale_kind(self) -> ElementKind:
        """The scale element of :attr:`format` for ``float_kind``."""
        return self.format.scale_element(self.float_kind)

    @property
    def stochastic(self) -> bool:
        """True for ``Rounding.STOCHASTIC``."""
        return self.rounding is Rounding.STOCHASTIC

    @property
    def high_first(self) -> bool:
        """4-bit codes with the high nibble first (the kernels' template flag)."""
        return ELEMENTS[self.code_kind].is_packed and self.nibble_order is NibbleOrder.HIGH_FIRST


__all__ = ["AffineProblem", "CodeRangeProblem", "ScopedProblem", "storage_shape"]
