"""The element kinds, and the one dtype table: everything quantplan knows about each :class:`ElementKind`.

Kernel template instantiations, operand dtype checks, NumPy storage types and default code
ranges are all read from :data:`ELEMENTS`. Adding an element kind means adding one row here
(and its C++ traits in ``kernels/qp_elements.cuh``). What a code *means* (encoding, scale
element, block geometry, packing, zero point) is in :mod:`quantplan.vocabulary.formats`, which refers to
these rows.
"""

from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np


class ElementKind(str, enum.Enum):
    """Element types of inputs, outputs and parameters.

    Floats: F16, BF16, F32, F64. Quantized codes: S8, U8, S4 and U4 (the 4-bit kinds are packed
    two per byte along the last axis, see :class:`~quantplan.NibbleOrder`), FP8_E4M3 (OCP e4m3fn, largest
    finite 448, no infinities) and FP8_E5M2 (largest finite 57344). I32 is the zero-point type.

    Data only, for the block-scaled formats (:mod:`quantplan.vocabulary.formats`; no plan accepts them yet,
    every plan raises :class:`~quantplan.Unsupported`): FP6_E2M3 (max 7.5) and FP6_E3M2 (max 28),
    one code per byte in bits 0-5; FP4_E2M1 (max 6), packed two per byte, element 2i in bits 0-3;
    E8M0, the MX scale byte ``2**(s - 127)`` (0xFF NaN).
    """

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    S8 = "s8"
    U8 = "u8"
    S4 = "s4"
    U4 = "u4"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    I32 = "i32"
    FP6_E2M3 = "fp6_e2m3"
    FP6_E3M2 = "fp6_e3m2"
    FP4_E2M1 = "fp4_e2m1"
    E8M0 = "e8m0"


class MathPrecision(str, enum.Enum):
    """Arithmetic type a plan computes in: F32 for F16/BF16/F32 data, F64 for F64 data."""

    F32 = "f32"
    F64 = "f64"


@dataclass(frozen=True)
class ElementInfo:
    """Facts about one element kind.

    ``cpp_tag``: the C++ tag type used in kernel name expressions (empty for the data-only kinds
    of the block-scaled formats, which no kernel takes yet). ``storage_bits``: bits per
    element in memory (4 for packed kinds). ``numpy_dtype``: the NumPy dtype of the storage the
    reference backend reads and writes (uint8 bytes for packed kinds). ``dtype_names``: dtype
    names accepted for operands of this kind (NumPy / CuPy / PyTorch names; raw-bit views such as
    uint16 for BF16 are accepted because CuPy has no bfloat16). ``code_range``: default
    [q_min, q_max] of integer codes. ``fp8_max``: largest finite value of FP8 kinds.
    """

    kind: ElementKind
    cpp_tag: str
    storage_bits: int
    numpy_dtype: np.dtype
    dtype_names: frozenset[str]
    is_float: bool = False
    is_integer_code: bool = False
    is_fp8: bool = False
    is_packed: bool = False
    code_range: tuple[int, int] | None = None
    fp8_max: float | None = None

    @property
    def math_precision(self) -> MathPrecision:
        """Arithmetic type for data of this kind (F64 only for F64)."""
        return MathPrecision.F64 if self.kind is ElementKind.F64 else MathPrecision.F32

    @property
    def vec_max(self) -> int:
        """Widest vector (elements) the element-wise kernels move of this kind: 8, 4 for F64."""
        return 4 if self.kind is ElementKind.F64 else 8

    @property
    def widths(self) -> tuple[int, ...]:
        """Vector widths the kernels are instantiated for, widest first: 8, 4, 2, 1 (F64 from 4)."""
        return tuple(v for v in (8, 4, 2, 1) if v <= self.vec_max)

    @property
    def is_code(self) -> bool:
        """True for quantized kinds (integer codes and FP8)."""
        return self.is_integer_code or self.is_fp8


def _names(*names: str) -> frozenset[str]:
    return frozenset(names)


def _nibbles(kind: ElementKind, tag: str, code_range: tuple[int, int]) -> ElementInfo:
    """A 4-bit integer code kind: two codes per uint8 byte."""
    return ElementInfo(
        kind, tag, 4, np.dtype(np.uint8), _names("uint8"), is_integer_code=True, is_packed=True, code_range=code_range
    )


def _fp8(kind: ElementKind, tag: str, dtype: Any, max_finite: float) -> ElementInfo:
    """An FP8 kind: its ml_dtypes storage (torch's name of the same dtype), or its bits as uint8."""
    storage = np.dtype(dtype)
    return ElementInfo(kind, tag, 8, storage, _names(storage.name, "uint8"), is_fp8=True, fp8_max=max_finite)


ELEMENTS: dict[ElementKind, ElementInfo] = {
    ElementKind.F16: ElementInfo(
        ElementKind.F16, "qp::f16", 16, np.dtype(np.float16), _names("float16"), is_float=True
    ),
    ElementKind.BF16: ElementInfo(
        ElementKind.BF16, "qp::bf16", 16, np.dtype(ml_dtypes.bfloat16), _names("bfloat16", "uint16"), is_float=True
    ),
    ElementKind.F32: ElementInfo(
        ElementKind.F32, "qp::f32", 32, np.dtype(np.float32), _names("float32"), is_float=True
    ),
    ElementKind.F64: ElementInfo(
        ElementKind.F64, "qp::f64", 64, np.dtype(np.float64), _names("float64"), is_float=True
    ),
    ElementKind.S8: ElementInfo(
        ElementKind.S8, "qp::s8", 8, np.dtype(np.int8), _names("int8"), is_integer_code=True, code_range=(-128, 127)
    ),
    ElementKind.U8: ElementInfo(
        ElementKind.U8, "qp::u8q", 8, np.dtype(np.uint8), _names("uint8"), is_integer_code=True, code_range=(0, 255)
    ),
    ElementKind.S4: _nibbles(ElementKind.S4, "qp::s4", (-8, 7)),
    ElementKind.U4: _nibbles(ElementKind.U4, "qp::u4", (0, 15)),
    ElementKind.FP8_E4M3: _fp8(ElementKind.FP8_E4M3, "qp::e4m3", ml_dtypes.float8_e4m3fn, 448.0),
    ElementKind.FP8_E5M2: _fp8(ElementKind.FP8_E5M2, "qp::e5m2", ml_dtypes.float8_e5m2, 57344.0),
    ElementKind.I32: ElementInfo(ElementKind.I32, "int", 32, np.dtype(np.int32), _names("int32")),
    # Data only (the block-scaled formats of quantplan.vocabulary.formats): stored as uint8 bytes, no kernel
    # tag yet, neither float nor code kinds here, so no kernel family or plan takes them.
    ElementKind.FP6_E2M3: ElementInfo(ElementKind.FP6_E2M3, "", 8, np.dtype(np.uint8), _names("uint8")),
    ElementKind.FP6_E3M2: ElementInfo(ElementKind.FP6_E3M2, "", 8, np.dtype(np.uint8), _names("uint8")),
    ElementKind.FP4_E2M1: ElementInfo(
        ElementKind.FP4_E2M1, "", 4, np.dtype(np.uint8), _names("uint8", "float4_e2m1fn_x2"), is_packed=True
    ),
    ElementKind.E8M0: ElementInfo(ElementKind.E8M0, "", 8, np.dtype(np.uint8), _names("uint8", "float8_e8m0fnu")),
}

FLOAT_KINDS: tuple[ElementKind, ...] = tuple(k for k, v in ELEMENTS.items() if v.is_float)
CODE_KINDS: tuple[ElementKind, ...] = tuple(k for k, v in ELEMENTS.items() if v.is_code)


def element_info(kind: ElementKind) -> ElementInfo:
    """The table row of ``kind``."""
    return ELEMENTS[kind]


def acc_element(precision: MathPrecision) -> ElementKind:
    """Accumulator element kind of arithmetic ``precision``: F32, or F64 for F64 arithmetic.

    (The scale element of a problem is not this: it comes from the problem's format,
    :mod:`quantplan.vocabulary.formats`.)
    """
    return ElementKind.F64 if precision is MathPrecision.F64 else ElementKind.F32


def acc_cpp(precision: MathPrecision) -> str:
    """C++ accumulator type of ``precision`` in kernel name expressions: ``float`` or ``double``."""
    return "double" if precision is MathPrecision.F64 else "float"


def acc_ctype(precision: MathPrecision) -> type[ctypes.c_float] | type[ctypes.c_double]:
    """ctypes accumulator type of ``precision`` in kernel argument blocks: ``c_float`` or ``c_double``."""
    return ctypes.c_double if precision is MathPrecision.F64 else ctypes.c_float


__all__ = [
    "CODE_KINDS",
    "ELEMENTS",
    "FLOAT_KINDS",
    "ElementInfo",
    "ElementKind",
    "MathPrecision",
    "acc_cpp",
    "acc_ctype",
    "acc_element",
    "element_info",
]
