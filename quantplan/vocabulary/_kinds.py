"""The enums of the vocabulary (element kinds, modes, rounding, nibble order, backends, precision,
op categories), apart from the validated models of :mod:`quantplan.vocabulary.types`, which re-exports them:
they import nothing, so the dtype table (:mod:`quantplan.vocabulary.elements`) reads them without the
descriptors' pydantic machinery and error family."""

from __future__ import annotations

import enum


class ElementKind(str, enum.Enum):
    """Element types of inputs, outputs and parameters.

    Floats: F16, BF16, F32, F64. Quantized codes: S8, U8, S4 and U4 (the 4-bit kinds are packed
    two per byte along the last axis, see :class:`NibbleOrder`), FP8_E4M3 (OCP e4m3fn, largest
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


class QuantMode(str, enum.Enum):
    """SYMMETRIC: zero point 0 (no zero-point tensor). ASYMMETRIC: an int32 zero point per segment."""

    SYMMETRIC = "symmetric"
    ASYMMETRIC = "asymmetric"


class Rounding(str, enum.Enum):
    """NEAREST_EVEN: round half to even (default). STOCHASTIC: Philox-driven, see SPEC section 4."""

    NEAREST_EVEN = "nearest_even"
    STOCHASTIC = "stochastic"


class NibbleOrder(str, enum.Enum):
    """Order of two 4-bit codes in a byte.

    LOW_FIRST (default): element 2i in bits 0-3, as PyTorch ``float4_e2m1fn_x2`` and CUTLASS.
    HIGH_FIRST: element 2i in bits 4-7, as DeepSpeed and bitsandbytes.
    """

    LOW_FIRST = "low_first"
    HIGH_FIRST = "high_first"


class BackendKind(str, enum.Enum):
    """CUDA: the kernels of ``kernels/*.cu``. REFERENCE: the NumPy implementation of the same semantics."""

    CUDA = "cuda"
    REFERENCE = "reference"


class MathPrecision(str, enum.Enum):
    """Arithmetic type a plan computes in: F32 for F16/BF16/F32 data, F64 for F64 data."""

    F32 = "f32"
    F64 = "f64"


class OpCategory(str, enum.Enum):
    """Broad family of an operation."""

    QUANTIZE = "quantize"
    DEQUANTIZE = "dequantize"
    FAKE_QUANTIZE = "fake_quantize"
    GRADIENT = "gradient"
    COLLECTIVE = "collective"


class QuantizeKind(str, enum.Enum):
    """How parameters are obtained: given (STATIC) or computed from the data (DYNAMIC_RANGE)."""

    STATIC = "static"
    DYNAMIC_RANGE = "dynamic_range"


class FakeOp(enum.IntEnum):
    """What an elementwise fake-quantization kernel computes (``FakeOp`` of ``kernels/fake_quantize.cu``)."""

    NEAREST = 0  #: y = fake(x), rne
    STE = 1  #: dx = dy * mask
    STOCHASTIC = 2  #: y = fake(x), Philox stochastic rounding

    @classmethod
    def forward(cls, rounding: Rounding) -> FakeOp:
        """The forward kernel op of ``rounding``."""
        return cls.STOCHASTIC if rounding is Rounding.STOCHASTIC else cls.NEAREST


__all__ = [
    "FakeOp",
    "BackendKind",
    "ElementKind",
    "MathPrecision",
    "NibbleOrder",
    "OpCategory",
    "QuantMode",
    "QuantizeKind",
    "Rounding",
]
