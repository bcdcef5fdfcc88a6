"""Code formats as data: what a quantized tensor's bytes mean, one table row per format.

A :class:`Format` names four things, each by reference to the dtype table of
:mod:`quantplan.vocabulary.elements` (C++ tag, NumPy storage, code range, widths live there only):

* its **element** (:class:`ElementFormat`): how one code encodes a value -- integer codes
  (int8, uint8, int4, uint4; MXINT8's fixed point ``k * 2**-6``), or a small float with sign,
  exponent and mantissa bits, bias and special codes (e4m3, e5m2; e2m3 / e3m2 / e2m1 next);
  its largest finite value, ``emax_elem`` and smallest subnormal are computed from those bits;
* its **scale element**: the element kind of the scale tensor, per element kind of the float
  data. Today's affine formats store float32 scales (float64 for float64 data, SPEC section 4);
  the MX formats an E8M0 byte, NVFP4 an E4M3 byte (plus one f32 tensor scale), FP8 block
  scaling f32 or UE8M0 (MICROSCALING.md);
* its **block geometry** (:class:`BlockGeometry`): which elements share one scale -- the scopes
  of :mod:`quantplan.vocabulary.types` (tensor, channel, token, group), 1-D blocks of ``n`` along an axis
  (MX 1x32, NVFP4 1x16, FP8 1x128) and 2-D tiles (MX 32x32, NVFP4 16x16, FP8 128x128);
* its **packing** (codes per byte from the element's storage bits, nibble orders accepted) and
  its **zero point** (:class:`ZeroPoint`: none, or int32 for asymmetric integer codes).

:data:`FORMATS` holds every format; ``served`` marks the ones a plan of this package accepts
today (the six code kinds of the affine plans). The others are data only, for the block-scaled
plans that come next: no kernel or plan reads them yet, and every existing plan rejects their
element kinds with :class:`~quantplan.Unsupported`.

Plans, descriptors, the reference and the front-ends take the scale element of a problem from
here (:func:`format_of`, :meth:`Format.scale_element`), never from the arithmetic precision.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from quantplan.vocabulary._kinds import NibbleOrder, QuantMode
from quantplan.vocabulary.elements import ELEMENTS, ElementInfo, ElementKind
from quantplan.vocabulary.errors import Unsupported


class Encoding(str, enum.Enum):
    """How a code maps to a value.

    INTEGER: ``value = code * 2**-fraction_bits`` (two's complement when signed).
    FLOAT: sign, exponent and mantissa fields with a bias; exponent field 0 holds the subnormals
    ``mantissa * 2**(1 - bias - mantissa_bits)``, others ``(1 + mantissa / 2**mantissa_bits) *
    2**(exponent - bias)``. EXPONENT: an unsigned biased exponent alone, ``value = 2**(code -
    bias)`` (E8M0: no sign, no zero, no subnormals).
    """

    INTEGER = "integer"
    FLOAT = "float"
    EXPONENT = "exponent"


class Specials(str, enum.Enum):
    """Which codes are not finite values.

    NONE: every code is a finite value (integers, FP6, FP4). IEEE: the all-ones exponent holds
    +-Inf (mantissa 0) and NaN (any other mantissa), as e5m2, f32, f64. FN ("finite, NaN"): no
    infinities; only the all-ones exponent with the all-ones mantissa is NaN, as OCP e4m3fn and
    E8M0 (0xFF).
    """

    NONE = "none"
    IEEE = "ieee"
    FN = "fn"


@dataclass(frozen=True)
class ElementFormat:
    """The encoding of one code, and the elements-table row that stores it (``kind``).

    ``exponent_bits`` / ``mantissa_bits`` / ``bias`` / ``signed``: the fields (FLOAT, EXPONENT).
    ``fraction_bits``: INTEGER codes are ``code * 2**-fraction_bits`` (MXINT8: 6; plain integer
    codes 0). ``narrow_range``: the integer codes allowed when narrower than the storage's range
    (MXINT8 [-127, 127]); None takes the elements table's ``code_range``. ``code_bits``: bits of
    a code inside its storage (FP6: 6 in the low bits of a byte, the two high bits zero).
    """

    name: str
    kind: ElementKind
    encoding: Encoding
    exponent_bits: int = 0
    mantissa_bits: int = 0
    bias: int = 0
    signed: bool = True
    specials: Specials = Specials.NONE
    fraction_bits: int = 0
    narrow_range: tuple[int, int] | None = None
    code_bits: int | None = None

    @property
    def info(self) -> ElementInfo:
        """The elements-table row of the storage (C++ tag, NumPy dtype, storage bits, range)."""
        return ELEMENTS[self.kind]

    @property
    def bits(self) -> int:
        """Bits of one code: sign + exponent + mantissa, or the integer storage width."""
        if self.encoding is Encoding.INTEGER:
            return self.info.storage_bits
        return int(self.signed) + self.exponent_bits + self.mantissa_bits

    @property
    def stored_bits(self) -> int:
        """Bits a code occupies in memory: 4 when packed two per byte, else the storage width."""
        return self.info.storage_bits

    @property
    def codes_per_byte(self) -> int:
        """Codes in one byte of storage (2 for packed 4-bit kinds; 1 for every wider one)."""
        return max(1, 8 // self.info.storage_bits)

    @property
    def code_mask(self) -> int:
        """Mask of the bits of one stored code (FP6: 0x3F in a byte whose two high bits are zero)."""
        return (1 << (self.code_bits or self.bits)) - 1

    @property
    def code_range(self) -> tuple[int, int] | None:
        """[min, max] integer code (INTEGER encodings); None for float encodings."""
        if self.encoding is not Encoding.INTEGER:
            return None
        return self.narrow_range or self.info.code_range

    @property
    def max_code(self) -> int:
        """The code (sign bit clear) of the largest finite value."""
        if self.encoding is Encoding.INTEGER:
            code_range = self.code_range
            assert code_range is not None
            return code_range[1]
        top = (1 << (self.exponent_bits + self.mantissa_bits)) - 1
        if self.specials is Specials.IEEE:
            return top - (1 << self.mantissa_bits)  # exponent all ones - 1, mantissa all ones
        if self.specials is Specials.FN:
            return top - 1  # all ones is the NaN
        return top

    def decode(self, code: int) -> float:
        """The exact value of ``code`` (sign bit included; NaN and +-Inf for special codes)."""
        if self.encoding is Encoding.INTEGER:
            value = code - (1 << self.bits) if self.signed and code >= 1 << (self.bits - 1) else code
            return math.ldexp(float(value), -self.fraction_bits)
        if self.encoding is Encoding.EXPONENT:
            return math.nan if code == self.max_code + 1 else math.ldexp(1.0, code - self.bias)
        magnitude_bits = self.exponent_bits + self.mantissa_bits
        sign = -1.0 if self.signed and code >> magnitude_bits & 1 else 1.0
        magnitude = code & ((1 << magnitude_bits) - 1)
        exponent, mantissa = magnitude >> self.mantissa_bits, magnitude & ((1 << self.mantissa_bits) - 1)
        if self.specials is not Specials.NONE and exponent == (1 << self.exponent_bits) - 1:
            if self.specials is Specials.IEEE:
                return sign * math.inf if mantissa == 0 else math.nan
            if magnitude == (1 << magnitude_bits) - 1:
                return math.nan
        if exponent == 0:
            return sign * math.ldexp(float(mantissa), 1 - self.bias - self.mantissa_bits)
        return sign * math.ldexp(float((1 << self.mantissa_bits) + mantissa), exponent - self.bias - self.mantissa_bits)

    @property
    def max_finite(self) -> float:
        """The largest finite value (e4m3 448, e5m2 57344, e2m3 7.5, e3m2 28, e2m1 6, E8M0 2**127)."""
        return self.decode(self.max_code)

    @property
    def emax_elem(self) -> int:
        """Exponent of the largest power of two <= :attr:`max_finite` (OCP's ``emax_elem``)."""
        return math.frexp(self.max_finite)[1] - 1

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value (E8M0: 2**-127, code 0; MXINT8: 2**-6)."""
        if self.encoding is Encoding.INTEGER:
            return math.ldexp(1.0, -self.fraction_bits)
        if self.encoding is Encoding.EXPONENT:
            return math.ldexp(1.0, -self.bias)
        return math.ldexp(1.0, 1 - self.bias - self.mantissa_bits)

    @property
    def nan_codes(self) -> tuple[int, ...]:
        """Every NaN code of a format of at most 8 bits (empty when it has none)."""
        if self.bits > 8:
            raise ValueError(f"{self.name} has {self.bits}-bit codes; list NaN codes of formats of <= 8 bits only")
        return tuple(c for c in range(1 << self.bits) if math.isnan(self.decode(c)))

    @property
    def inf_codes(self) -> tuple[int, ...]:
        """Every infinite code of a format of at most 8 bits (empty when it has none)."""
        if self.bits > 8:
            raise ValueError(f"{self.name} has {self.bits}-bit codes; list Inf codes of formats of <= 8 bits only")
        return tuple(c for c in range(1 << self.bits) if math.isinf(self.decode(c)))


def _float(
    name: str, kind: ElementKind, e: int, m: int, bias: int, specials: Specials, code_bits: int | None = None
) -> ElementFormat:
    return ElementFormat(name, kind, Encoding.FLOAT, e, m, bias, specials=specials, code_bits=code_bits)


def _integer(name: str, kind: ElementKind, signed: bool) -> ElementFormat:
    return ElementFormat(name, kind, Encoding.INTEGER, signed=signed)


#: Every element encoding, by name (MICROSCALING.md section 1.2 for the block-scaled ones).
ELEMENT_FORMATS: dict[str, ElementFormat] = {
    f.name: f
    for f in (
        _integer("int8", ElementKind.S8, True),
        _integer("uint8", ElementKind.U8, False),
        _integer("int4", ElementKind.S4, True),
        _integer("uint4", ElementKind.U4, False),
        _float("e4m3", ElementKind.FP8_E4M3, 4, 3, 7, Specials.FN),
        _float("e5m2", ElementKind.FP8_E5M2, 5, 2, 15, Specials.IEEE),
        _float("e2m3", ElementKind.FP6_E2M3, 2, 3, 1, Specials.NONE, code_bits=6),
        _float("e3m2", ElementKind.FP6_E3M2, 3, 2, 3, Specials.NONE, code_bits=6),
        _float("e2m1", ElementKind.FP4_E2M1, 2, 1, 1, Specials.NONE),
        ElementFormat("mxint8", ElementKind.S8, Encoding.INTEGER, fraction_bits=6, narrow_range=(-127, 127)),
        ElementFormat("e8m0", ElementKind.E8M0, Encoding.EXPONENT, 8, 0, 127, signed=False, specials=Specials.FN),
        _float("f32", ElementKind.F32, 8, 23, 127, Specials.IEEE),
        _float("f64", ElementKind.F64, 11, 52, 1023, Specials.IEEE),
    )
}


def element_format(kind: ElementKind) -> ElementFormat:
    """The encoding of ``kind``'s codes (S8 is plain int8; MXINT8 is :data:`ELEMENT_FORMATS` ``"mxint8"``).

    Raises KeyError for kinds with no encoding row (F16, BF16, I32).
    """
    return _BY_KIND[kind]


_BY_KIND: dict[ElementKind, ElementFormat] = {}
for _f in ELEMENT_FORMATS.values():
    _BY_KIND.setdefault(_f.kind, _f)


# ---- block geometry ------------------------------------------------------------------------------


class BlockKind(str, enum.Enum):
    """Which elements share one scale.

    TENSOR / CHANNEL / TOKEN / GROUP: the scopes of :mod:`quantplan.vocabulary.types` (the scope object gives
    the axis and group size). BLOCK: ``cols`` consecutive elements along one axis, the last block
    of a row possibly partial. TILE: ``rows x cols`` tiles of a 2-D view.
    """

    TENSOR = "tensor"
    CHANNEL = "channel"
    TOKEN = "token"
    GROUP = "group"
    BLOCK = "block"
    TILE = "tile"


@dataclass(frozen=True)
class BlockGeometry:
    """A block shape: ``kind``, and for BLOCK / TILE its ``rows x cols`` (rows 1 for 1-D blocks).

    The scopes leave ``cols`` None: their extents come from the problem's shape and scope.
    """

    kind: BlockKind
    rows: int = 1
    cols: int | None = None

    @property
    def elements(self) -> int | None:
        """Elements of one full block (BLOCK / TILE), None for the scopes."""
        return None if self.cols is None else self.rows * self.cols

    @property
    def is_2d(self) -> bool:
        """True for 2-D tiles."""
        return self.kind is BlockKind.TILE


TENSOR = BlockGeometry(BlockKind.TENSOR)
CHANNEL = BlockGeometry(BlockKind.CHANNEL)
TOKEN = BlockGeometry(BlockKind.TOKEN)
GROUP = BlockGeometry(BlockKind.GROUP)
#: The four scopes of today's plans.
SCOPES: tuple[BlockGeometry, ...] = (TENSOR, CHANNEL, TOKEN, GROUP)
MX_BLOCK = BlockGeometry(BlockKind.BLOCK, 1, 32)
MX_TILE = BlockGeometry(BlockKind.TILE, 32, 32)
NVFP4_BLOCK = BlockGeometry(BlockKind.BLOCK, 1, 16)
NVFP4_TILE = BlockGeometry(BlockKind.TILE, 16, 16)
FP8_BLOCK = BlockGeometry(BlockKind.BLOCK, 1, 128)
FP8_TILE = BlockGeometry(BlockKind.TILE, 128, 128)


class _Scoped(Protocol):
    """A scope of :mod:`quantplan.vocabulary.types` (``TensorScope`` ...), read by its ``kind`` tag only:
    the formats sit below the validated models."""

    @property
    def kind(self) -> str: ...


#: A scope's ``kind`` tag -> its geometry.
_SCOPE_GEOMETRY: dict[str, BlockGeometry] = {"tensor": TENSOR, "channel": CHANNEL, "token": TOKEN, "group": GROUP}


def geometry_of(scope: _Scoped) -> BlockGeometry:
    """The block geometry of a scope (its axis and group size stay on the scope)."""
    return _SCOPE_GEOMETRY[scope.kind]


# ---- zero point, formats -------------------------------------------------------------------------


class ZeroPoint(str, enum.Enum):
    """NONE: symmetric codes, no zero-point tensor. I32: an int32 zero point per segment."""

    NONE = "none"
    I32 = "i32"

    @classmethod
    def of_mode(cls, mode: QuantMode) -> ZeroPoint:
        """SYMMETRIC -> NONE, ASYMMETRIC -> I32."""
        return cls.I32 if mode is QuantMode.ASYMMETRIC else cls.NONE


#: Scale element per float data element of today's affine formats: float32 for 16- and 32-bit
#: data, float64 for float64 data (SPEC section 4; the scale type equals the arithmetic type).
AFFINE_SCALES: tuple[tuple[ElementKind, ElementKind], ...] = (
    (ElementKind.F16, ElementKind.F32),
    (ElementKind.BF16, ElementKind.F32),
    (ElementKind.F32, ElementKind.F32),
    (ElementKind.F64, ElementKind.F64),
)


def _block_scales(scale: ElementKind) -> tuple[tuple[ElementKind, ElementKind], ...]:
    """The block-scaled formats: one scale element for f16 / bf16 / f32 data (no f64 data)."""
    return tuple((data, scale) for data in (ElementKind.F16, ElementKind.BF16, ElementKind.F32))


@dataclass(frozen=True)
class Format:
    """One code format: element, scale element per data element, block geometries, packing, zero point.

    ``scales``: (float data element, scale element) pairs, the scale element being a row of the
    elements table. ``geometries``: the block shapes the format is defined for. ``nibble_orders``:
    the orders a packed 4-bit element accepts (the first is the default; empty for byte
    elements). ``zero_points``: NONE and, for integer codes, I32. ``tensor_scale``: the element
    of a second, per-tensor scale (NVFP4: F32), None without one. ``served``: a plan of this
    package accepts the format today.
    """

    name: str
    element: ElementFormat
    scales: tuple[tuple[ElementKind, ElementKind], ...]
    geometries: tuple[BlockGeometry, ...]
    zero_points: tuple[ZeroPoint, ...] = (ZeroPoint.NONE,)
    nibble_orders: tuple[NibbleOrder, ...] = ()
    tensor_scale: ElementKind | None = None
    served: bool = False

    @property
    def code_kind(self) -> ElementKind:
        """The element kind of the codes' storage."""
        return self.element.kind

    @property
    def data_kinds(self) -> tuple[ElementKind, ...]:
        """The float data elements the format is defined for."""
        return tuple(data for data, _ in self.scales)

    def scale_element(self, data: ElementKind) -> ElementKind:
        """The scale element of this format for float data of kind ``data``.

        Raises KeyError when the format has no scale for ``data`` (plans validate ``data`` first).
        """
        for d, scale in self.scales:
            if d is data:
                return scale
        raise KeyError(f"format {self.name} has no scale for {data.name} data")

    def scale_dtype(self, data: ElementKind) -> np.dtype:
        """NumPy dtype of the scale tensor for ``data`` (the elements table's storage dtype)."""
        return ELEMENTS[self.scale_element(data)].numpy_dtype


def _affine(name: str, zero_points: tuple[ZeroPoint, ...], nibble_orders: tuple[NibbleOrder, ...] = ()) -> Format:
    element = ELEMENT_FORMATS[name]
    return Format(name, element, AFFINE_SCALES, SCOPES, zero_points, nibble_orders, served=True)


_INT_ZP = (ZeroPoint.NONE, ZeroPoint.I32)
_BOTH_ORDERS = (NibbleOrder.LOW_FIRST, NibbleOrder.HIGH_FIRST)
_E8M0 = _block_scales(ElementKind.E8M0)
_LOW = (NibbleOrder.LOW_FIRST,)


def _mx(name: str, element: str, *geometries: BlockGeometry, orders: tuple[NibbleOrder, ...] = ()) -> Format:
    return Format(name, ELEMENT_FORMATS[element], _E8M0, (MX_BLOCK, *geometries), nibble_orders=orders)


def _fp8_block(name: str, element: str, scale: ElementKind) -> Format:
    return Format(name, ELEMENT_FORMATS[element], _block_scales(scale), (FP8_BLOCK, FP8_TILE))


#: Every code format by name. The served ones first, in the elements table's code order.
FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        _affine("int8", _INT_ZP),
        _affine("uint8", _INT_ZP),
        _affine("int4", _INT_ZP, _BOTH_ORDERS),
        _affine("uint4", _INT_ZP, _BOTH_ORDERS),
        _affine("e4m3", (ZeroPoint.NONE,)),
        _affine("e5m2", (ZeroPoint.NONE,)),
        # MICROSCALING.md section 2 (OCP MX v1.0): blocks of 32 with an E8M0 scale; 2-D 32x32 for MXFP8.
        _mx("mxfp8_e4m3", "e4m3", MX_TILE),
        _mx("mxfp8_e5m2", "e5m2", MX_TILE),
        _mx("mxfp6_e2m3", "e2m3"),
        _mx("mxfp6_e3m2", "e3m2"),
        _mx("mxfp4", "e2m1", orders=_LOW),
        _mx("mxint8", "mxint8"),
        # Section 3: e2m1 in blocks of 16 with an E4M3 scale and an f32 tensor scale.
        Format(
            "nvfp4",
            ELEMENT_FORMATS["e2m1"],
            _block_scales(ElementKind.FP8_E4M3),
            (NVFP4_BLOCK, NVFP4_TILE),
            nibble_orders=_LOW,
            tensor_scale=ElementKind.F32,
        ),
        # Section 4 (DeepSeek-V3 / DeepGEMM): 1x128 and 128x128 tiles, f32 or UE8M0 scales.
        _fp8_block("fp8_block_e4m3", "e4m3", ElementKind.F32),
        _fp8_block("fp8_block_e5m2", "e5m2", ElementKind.F32),
        _fp8_block("fp8_block_e4m3_ue8m0", "e4m3", ElementKind.E8M0),
        _fp8_block("fp8_block_e5m2_ue8m0", "e5m2", ElementKind.E8M0),
    )
}

#: The code kinds today's plans write and read, in the elements table's order.
SERVED_CODE_KINDS: tuple[ElementKind, ...] = tuple(f.code_kind for f in FORMATS.values() if f.served)
_SERVED: dict[ElementKind, Format] = {f.code_kind: f for f in FORMATS.values() if f.served}


def format_of(code_kind: ElementKind) -> Format:
    """The served format whose codes are stored as ``code_kind`` (S8 -> int8, FP8_E4M3 -> e4m3, ...).

    Raises :class:`~quantplan.Unsupported` for any other kind (:func:`is_served_code` tells first).
    """
    fmt = _SERVED.get(code_kind)
    if fmt is None:
        served = ", ".join(k.name for k in _SERVED)
        raise Unsupported(f"no plan serves codes of {code_kind.name}; quantized elements are {served}")
    return fmt


def is_served_code(kind: ElementKind) -> bool:
    """True for the code kinds today's plans accept (S8, U8, S4, U4, FP8_E4M3, FP8_E5M2)."""
    return kind in _SERVED


#: Element kinds only the block-scaled formats use (FP6, FP4, E8M0): data for the plans that come
#: next; today's plans reject them with :class:`~quantplan.Unsupported`.
BLOCK_ONLY_KINDS: tuple[ElementKind, ...] = tuple(
    dict.fromkeys(
        k
        for f in FORMATS.values()
        if not f.served
        for k in (f.code_kind, *(s for _, s in f.scales))
        if k not in _SERVED and not ELEMENTS[k].is_float
    )
)


def affine_scale_element(data: ElementKind) -> ElementKind:
    """The scale element of today's affine formats (and fake quantization) for ``data``:
    F32 for F16 / BF16 / F32 data, F64 for F64 data. KeyError for other kinds."""
    return dict(AFFINE_SCALES)[data]


def affine_scale_dtype(data: ElementKind) -> np.dtype:
    """NumPy dtype of :func:`affine_scale_element`."""
    return ELEMENTS[affine_scale_element(data)].numpy_dtype


__all__ = [
    "AFFINE_SCALES",
    "BLOCK_ONLY_KINDS",
    "CHANNEL",
    "ELEMENT_FORMATS",
    "FORMATS",
    "FP8_BLOCK",
    "FP8_TILE",
    "GROUP",
    "MX_BLOCK",
    "MX_TILE",
    "NVFP4_BLOCK",
    "NVFP4_TILE",
    "SCOPES",
    "SERVED_CODE_KINDS",
    "TENSOR",
    "TOKEN",
    "BlockGeometry",
    "BlockKind",
    "ElementFormat",
    "Encoding",
    "Format",
    "Specials",
    "ZeroPoint",
    "affine_scale_dtype",
    "affine_scale_element",
    "element_format",
    "format_of",
    "geometry_of",
    "is_served_code",
]
