"""The enums of the vocabulary (modes, rounding, nibble order, backends, op categories), apart from
the validated models of :mod:`quantplan.vocabulary.types`, which re-exports them: they import
nothing, so the format table (:mod:`quantplan.vocabulary.formats`) reads them without the
descriptors' pydantic machinery and error family. The element kinds and the arithmetic precision
are defined beside their dtype table, in :mod:`quantplan.vocabulary.elements`."""

from __future__ import annotations

import enum


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
    "NibbleOrder",
    "OpCategory",
    "QuantMode",
    "QuantizeKind",
    "Rounding",
]
