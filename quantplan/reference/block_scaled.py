"""NumPy reference of the block-scaled formats: MX, NVFP4, FP8 blocks, their scale layouts and the fused transpose.

This module is the bit-exact semantics of the block-scaled contract (``MICROSCALING.md`` of the
project's shared specification, sections cited as §n). The CUDA kernels are checked against these
functions byte for byte. Every arithmetic step is one IEEE binary32 operation in NumPy float32,
round to nearest even, in the order the contract writes it: no fused multiply-add, no flush to
zero (NumPy keeps f32 subnormals, and E8M0 byte 0 is the subnormal 2**-127).

Contents:

* element formats (:data:`ELEMENT_FORMATS`, one table), :func:`encode_elements` (RNE, saturating),
  :func:`encode_elements_stochastic` (§1.6), :func:`decode_elements`, E8M0 (:func:`e8m0_to_float`,
  :func:`e8m0_reciprocal`, :func:`e8m0_scale_byte`);
* MX (§2): :func:`mx_quantize` / :func:`mx_dequantize`;
* NVFP4 (§3): :func:`nvfp4_quantize` / :func:`nvfp4_dequantize`, :func:`nvfp4_tensor_scales`;
* FP8 blocks (§4): :func:`fp8_block_quantize` / :func:`fp8_block_dequantize`;
* scale layouts (§4.3, §5): :func:`to_blocked`, :func:`from_blocked`, :func:`swizzle_offset`,
  :func:`col_major_tma_aligned`, :func:`pack_ue8m0_int32`, :func:`deepgemm_sf_layout`,
  :func:`broadcast_block_rows`;
* fused quantize + transpose (§6): :func:`quantize_transpose`;
* FP4 packing (§1.5): :func:`pack_fp4`, :func:`unpack_fp4`.

Inputs are NumPy arrays of float32, float16 or bfloat16 (``ml_dtypes.bfloat16``), upcast exactly
to float32 first. Codes are uint8, E8M0 and E4M3 scales uint8 bytes, FP8-block f32 scales float32,
packed UE8M0 int32.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import ml_dtypes
import numpy as np

from quantplan.vocabulary.errors import InvalidProblem, Unsupported
from quantplan.vocabulary.philox import uniform_for_elements
from quantplan.vocabulary.types import Rounding

# --------------------------------------------------------------------------------------------
# Element formats (§1.2): the one table. Keyed by element name; the lead may later point these
# rows at ``quantplan.vocabulary.formats``.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ElementFormat:
    """Bit layout of one block-scaled element format (§1.2).

    ``bits``: storage bits of a code (sign included). ``exp_bits`` / ``mant_bits`` / ``bias``: the
    IEEE-like fields (``mant_bits`` = 6 and ``exp_bits`` = 0 for MXINT8, whose grid is k·2**-6).
    ``max_finite``: the largest finite magnitude; ``max_code``: its code (sign bit clear);
    ``emax_elem``: the exponent of the largest power of two ≤ max_finite (OCP's emax_elem);
    ``is_int``: MXINT8 (two's complement k in [-127, 127]).
    """

    name: str
    bits: int
    exp_bits: int
    mant_bits: int
    bias: int
    max_finite: float
    max_code: int
    emax_elem: int
    is_int: bool = False

    @property
    def sign_bit(self) -> int:
        """The sign bit of a code (0x80, 0x20 or 0x8); 0 for MXINT8 (two's complement)."""
        return 0 if self.is_int else 1 << (self.bits - 1)

    @property
    def min_normal_exp(self) -> int:
        """Exponent of the smallest normal value, 1 - bias."""
        return 1 - self.bias


#: Element formats of §1.2, keyed by the names the contract uses.
ELEMENT_FORMATS: dict[str, ElementFormat] = {
    "e4m3": ElementFormat("e4m3", 8, 4, 3, 7, 448.0, 0x7E, 8),
    "e5m2": ElementFormat("e5m2", 8, 5, 2, 15, 57344.0, 0x7B, 15),
    "e2m3": ElementFormat("e2m3", 6, 2, 3, 1, 7.5, 0x1F, 2),
    "e3m2": ElementFormat("e3m2", 6, 3, 2, 3, 28.0, 0x1F, 4),
    "e2m1": ElementFormat("e2m1", 4, 2, 1, 1, 6.0, 0x7, 2),
    "int8": ElementFormat("int8", 8, 0, 6, 0, 127.0 / 64.0, 127, 0, is_int=True),
}

#: MX block length (§2.1), NVFP4 block length (§3.1), FP8 block tile edge (§4.1).
MX_BLOCK = 32
NVFP4_BLOCK = 16
FP8_BLOCK = 128

MX_SCALE_MODES = ("rceil", "floor", "ceil", "even")
NVFP4_MODES = ("te", "torchao")
FP8_ELEM_OPS = ("div", "mul_rcp", "enc")
FP8_SCALE_FORMATS = ("f32", "ue8m0")
TRANSPOSE_LAYOUTS = ("transposed", "te_mxfp8")

#: E8M0 NaN byte, E4M3 NaN byte (NaN scales of non-finite blocks, §1.4).
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F

_FLT_MAX = np.float32(np.finfo(np.float32).max)
_F32_NAN = np.uint32(0x7FC00000).view(np.float32)
#: fl32(1/6) = 0x3E2AAAAB (§1.1).
_F32_ONE_SIXTH = np.float32(1.0) / np.float32(6.0)
_INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_OUTPUT_DTYPES = _INPUT_DTYPES


def element_format(name: str) -> ElementFormat:
    """The :data:`ELEMENT_FORMATS` row of ``name``; InvalidProblem for an unknown name."""
    try:
        return ELEMENT_FORMATS[name]
    except (KeyError, TypeError):
        raise InvalidProblem(f"element must be one of {sorted(ELEMENT_FORMATS)}, got {name!r}") from None


# --------------------------------------------------------------------------------------------
# Argument helpers
# --------------------------------------------------------------------------------------------


def _as_f32(x: Any, name: str = "x") -> np.ndarray:
    """Exact upcast of a float32 / float16 / bfloat16 array to float32 (§1.1)."""
    if not isinstance(x, np.ndarray):
        raise InvalidProblem(f"{name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise InvalidProblem(
            f"{name} must be float32, float16 or bfloat16 (ml_dtypes.bfloat16), got {x.dtype}; cast it first"
        )
    return x.astype(np.float32)


def _out_dtype(dtype: Any) -> np.dtype:
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    if d not in _OUTPUT_DTYPES:
        raise InvalidProblem(f"out_dtype must be float32, float16 or bfloat16, got {dtype!r}")
    assert d is not None
    return d


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise InvalidProblem(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def _axis(axis: Any, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise InvalidProblem(f"axis must be an integer, got {axis!r}")
    if ndim == 0:
        raise InvalidProblem("x must have at least one dimension (a 0-d array has no block axis)")
    a = int(axis)
    if not -ndim <= a < ndim:
        raise InvalidProblem(f"axis {a} is out of range for an array of rank {ndim}")
    return a % ndim


def _rounding(rounding: Any) -> Rounding:
    try:
        return Rounding(rounding)
    except ValueError:
        raise InvalidProblem(f"rounding must be 'nearest_even' or 'stochastic' (Rounding), got {rounding!r}") from None


#: Elements per row chunk of the vectorised passes (temporaries stay in cache; seconds at 8192x8192).
_CHUNK_ELEMENTS = 1 << 18


class _Words:
    """The §1.6 uniforms u = (word >> 8)·2**-24 of x, indexed by x's row-major flat index.

    ``rows(r0, r1)`` gives rows r0..r1 of the (rows, n) view a core works on, float32. When that
    view is x's own rows (``view=None``) they are drawn on demand; otherwise (a moved axis, the
    transposed copy) the whole stream of x is drawn once and ``view`` maps it to the core's rows.
    """

    def __init__(self, shape: tuple[int, ...], seed: int, offset: int) -> None:
        self.shape = shape
        self.seed = seed
        self.offset = offset
        self.table: np.ndarray | None = None

    def full(self) -> np.ndarray:
        """u of every element of x, float32 with x's shape (drawn in chunks)."""
        if self.table is None:
            count = math.prod(self.shape)
            out = np.empty(count, np.float32)
            for start in range(0, count, _CHUNK_ELEMENTS):
                stop = min(count, start + _CHUNK_ELEMENTS)
                out[start:stop] = uniform_for_elements(stop - start, self.seed, self.offset, start)
            self.table = out.reshape(self.shape)
        return self.table

    def contiguous_rows(self, n: int) -> RowSource:
        """Rows of length n of x itself (row r covers flat indices r·n .. r·n + n − 1)."""

        def rows(r0: int, r1: int) -> np.ndarray:
            u = uniform_for_elements((r1 - r0) * n, self.seed, self.offset, r0 * n)
            return u.astype(np.float32).reshape(r1 - r0, n)

        return rows

    def view_rows(self, view: np.ndarray) -> RowSource:
        """Rows of ``view``, an index-preserving view (moveaxis / transpose, reshaped to 2-D) of :meth:`full`."""
        return lambda r0, r1: view[r0:r1]


#: Rows r0..r1 of a core's uniforms (float32, (r1 − r0, n)).
RowSource = Callable[[int, int], np.ndarray]


def _words(shape: tuple[int, ...], rounding: Rounding, seed: Any, offset: Any) -> _Words | None:
    """The §1.6 word source of x, or None for RNE (seed and offset checked)."""
    if rounding is not Rounding.STOCHASTIC:
        return None
    for name, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 2**64:
            raise InvalidProblem(f"{name} must be an integer in [0, 2**64), got {value!r}")
    return _Words(shape, int(seed), int(offset))


def _chunks(n_rows: int, n_cols: int, row_multiple: int) -> list[tuple[int, int]]:
    """Row ranges of about _CHUNK_ELEMENTS elements, each a multiple of ``row_multiple`` rows (but the last)."""
    per = max(row_multiple, (_CHUNK_ELEMENTS // max(n_cols, 1)) // row_multiple * row_multiple)
    return [(r0, min(n_rows, r0 + per)) for r0 in range(0, n_rows, per)]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _as_rows(a: np.ndarray) -> np.ndarray:
    """``a`` as (product of the leading dims, last dim); works for zero-size arrays."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _pad_last(a: np.ndarray, multiple: int) -> np.ndarray:
    """Zero-pad the last axis of ``a`` up to a multiple of ``multiple``."""
    n = a.shape[-1]
    extra = _ceil_div(n, multiple) * multiple - n
    if extra == 0:
        return a
    return np.concatenate([a, np.zeros((*a.shape[:-1], extra), a.dtype)], axis=-1)


def _pad_axis0(a: np.ndarray, multiple: int) -> np.ndarray:
    n = a.shape[0]
    extra = _ceil_div(n, multiple) * multiple - n
    if extra == 0:
        return a
    return np.concatenate([a, np.zeros((extra, *a.shape[1:]), a.dtype)], axis=0)


# --------------------------------------------------------------------------------------------
# Element conversion (§1.3, §1.6) and decoding
# --------------------------------------------------------------------------------------------


def _encode_fp_magnitude(mag: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """Saturated RNE codes (uint32, sign clear) of f32 magnitudes given as uint32 bits (Inf included)."""
    m = fmt.mant_bits
    shift = np.uint32(23 - m)
    # Normal element range: round the f32 mantissa to m bits, half to even, on the bits (exact), then
    # rebias. Magnitudes in the element's subnormal range wrap around here and are replaced below.
    t = mag >> shift
    t &= np.uint32(1)
    t += mag
    t += np.uint32((1 << (22 - m)) - 1)
    t >>= shift
    t -= np.uint32((127 - fmt.bias) << m)
    np.minimum(t, np.uint32(fmt.max_code), out=t)
    # Subnormal element range: a * 2**(bias - 1 + m) is exact in f32; rint rounds half to even.
    sub = mag < np.uint32((127 + fmt.min_normal_exp) << 23)
    n_sub = int(np.count_nonzero(sub))
    k = np.float32(2.0 ** (fmt.bias - 1 + m))
    if n_sub * 8 > sub.size:  # many (e2m1): one dense pass beats gathering
        with np.errstate(over="ignore", invalid="ignore"):
            dense = np.rint(mag.view(np.float32) * k).astype(np.uint32)
        np.copyto(t, dense, where=sub)
    elif n_sub:
        t[sub] = np.rint(mag[sub].view(np.float32) * k).astype(np.uint32)
    return t


def encode_elements(v: np.ndarray, element: str) -> np.ndarray:
    """``enc(v)``: round float32 ``v`` to element codes, nearest even, saturating (§1.3) -> uint8.

    Formula: one rounding of ``|v|``'s exact value to the element grid (subnormals included), half
    to even; a result above max finite, or ``v`` = ±Inf, becomes ±max finite ("satfinite"); the
    sign bit is ``v``'s (−0.0 and negative values rounding to 0 give negative zero 0x80 / 0x20 /
    0x8). MXINT8: ``k = clamp(rne(v·64), −127, 127)`` stored as its two's complement byte.

    When to use: the element step of every block format here; the kernels' ``cvt.rn.satfinite``.

    Dtypes: ``v`` is converted to float32 (pass float32 values; a wider value would round twice).
    NaN (never passed by the block functions, §1.4) gives 0x7F for e4m3 / e5m2 (as the H100
    ``cvt``), +max (0x1F, 0x7) for fp6 / fp4 (as CUDA's converters) and 0 for int8.

    Shape limits: any shape; the output has ``v``'s shape (fp4 codes unpacked, one per byte).

    Precision guarantee: exactly RNE; equals ml_dtypes' casts on in-range values.
    """
    fmt = element_format(element)
    x = np.asarray(v, dtype=np.float32)
    if fmt.is_int:
        with np.errstate(over="ignore", invalid="ignore"):
            k = np.clip(np.rint(x * np.float32(64.0)), -127, 127)
        k = np.where(np.isnan(k), 0, k)
        return k.astype(np.int8).view(np.uint8)
    bits = np.ascontiguousarray(x).view(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    code = _encode_fp_magnitude(mag, fmt).astype(np.uint8)
    sign = (bits >> np.uint32(32 - fmt.bits)).astype(np.uint8)
    sign &= np.uint8(fmt.sign_bit)
    code |= sign
    nan = mag > np.uint32(0x7F800000)
    if nan.any():
        code[nan] = E4M3_NAN if fmt.bits == 8 else fmt.max_code
    return code


def _magnitude_table(fmt: ElementFormat, count: int | None = None) -> np.ndarray:
    """f32 magnitudes of the non-negative codes 0 .. count − 1 (default max_code + 1: one past max, for SR's hi)."""
    codes = np.arange(fmt.max_code + 2 if count is None else count, dtype=np.int64)
    e = codes >> fmt.mant_bits
    mant = codes & ((1 << fmt.mant_bits) - 1)
    sub = mant * 2.0 ** (fmt.min_normal_exp - fmt.mant_bits)
    normal = (1.0 + mant * 2.0**-fmt.mant_bits) * np.exp2(e.astype(np.float64) - fmt.bias)
    return np.where(e == 0, sub, normal).astype(np.float32)


def encode_elements_stochastic(v: np.ndarray, uniform: np.ndarray, element: str) -> np.ndarray:
    """Stochastic rounding of float32 ``v`` to element codes (§1.6) -> uint8.

    Formula: ``lo`` = ``|v|`` rounded toward zero to the grid, ``hi`` = the next grid magnitude,
    ``frac = (|v| − lo) / (hi − lo)`` (exact in f32: Sterbenz, then a power-of-two division);
    the magnitude is ``hi`` iff ``u < frac``, else ``lo``; ``|v| ≥ max`` gives max (Inf
    included); the sign bit is ``v``'s (a negative value rounding to 0 gives negative zero).

    When to use: NVFP4 stochastic rounding, MX fp elements with ``rounding="stochastic"``.

    Dtypes: ``v`` float32; ``uniform`` in [0, 1), multiples of 2**-24 (``(word >> 8)·2**-24`` of
    the project Philox stream), broadcastable to ``v``. fp formats only (MXINT8: Unsupported).

    Shape limits: any shape; output shape of ``v`` (codes unpacked).

    Precision guarantee: exact; P(hi) = frac to within 2**-24.
    """
    fmt = element_format(element)
    if fmt.is_int:
        raise Unsupported("stochastic rounding is defined for floating-point elements only, not int8 (MXINT8)")
    x = np.asarray(v, dtype=np.float32)
    u = np.broadcast_to(np.asarray(uniform, dtype=np.float32), x.shape)
    bits = x.view(np.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    a = mag.view(np.float32)
    m = fmt.mant_bits
    # Truncated code: the normal range drops the low mantissa bits, the subnormal range floors.
    trunc_normal = (mag >> np.uint32(23 - m)).astype(np.int32) - np.int32((127 - fmt.bias) << m)
    with np.errstate(over="ignore", invalid="ignore"):
        trunc_sub = np.floor(a * np.float32(2.0 ** (fmt.bias - 1 + m))).astype(np.int32)
    in_range = a < np.float32(fmt.max_finite)  # False for NaN, Inf and the saturating range
    lo_code = np.where(mag < np.uint32((127 + fmt.min_normal_exp) << 23), trunc_sub, trunc_normal)
    lo_code = np.where(in_range, lo_code, 0)
    table = _magnitude_table(fmt)
    lo = table[lo_code]
    hi = table[lo_code + 1]
    frac = (a - lo) / (hi - lo)
    code = np.where(u < frac, lo_code + 1, lo_code)
    code = np.where(in_range, code, fmt.max_code)
    code = code | np.where(bits >> np.uint32(31) != 0, np.int32(fmt.sign_bit), np.int32(0))
    nan = mag > np.uint32(0x7F800000)
    if nan.any():
        code = np.where(nan, E4M3_NAN if fmt.bits == 8 else fmt.max_code, code)
    return code.astype(np.uint8)


def _decode_table(fmt: ElementFormat) -> np.ndarray:
    """float32 value of every byte 0..255 (codes beyond the format's bits decode as NaN)."""
    b = np.arange(256, dtype=np.int64)
    if fmt.is_int:
        return (b.astype(np.uint8).view(np.int8).astype(np.float64) / 64.0).astype(np.float32)
    nbits = fmt.bits
    mag_code = b & ((1 << (nbits - 1)) - 1)
    sign = np.where(b & (1 << (nbits - 1)), -1.0, 1.0)
    table = _magnitude_table(fmt, 1 << (nbits - 1))
    values = (sign * table[mag_code].astype(np.float64)).astype(np.float32)
    values[b >= (1 << nbits)] = np.nan
    if fmt.name == "e4m3":
        values[(b & 0x7F) == 0x7F] = np.nan
    elif fmt.name == "e5m2":
        values[(b & 0x7F) == 0x7C] = np.inf
        values[b == 0xFC] = -np.inf
        values[((b & 0x7F) > 0x7C) & (b < 256)] = np.nan
    return values


_DECODE_TABLES: dict[str, np.ndarray] = {}


def decode_elements(codes: np.ndarray, element: str) -> np.ndarray:
    """Exact float32 values of element codes (uint8, one code per byte; fp4 unpacked).

    e4m3 0x7F / 0xFF and e5m2 0x7D–0x7F (either sign) decode to NaN, e5m2 0x7C / 0xFC to ±Inf;
    MXINT8 bytes are two's complement k, value k·2**-6; bytes beyond a 6- or 4-bit format's codes
    decode to NaN.

    When to use: dequantization, and checking codes. Dtypes: uint8 in, float32 out.
    Shape limits: any shape. Precision guarantee: exact.
    """
    fmt = element_format(element)
    table = _DECODE_TABLES.get(fmt.name)
    if table is None:
        table = _DECODE_TABLES.setdefault(fmt.name, _decode_table(fmt))
    return table[np.asarray(codes).astype(np.uint8, copy=False)]


# --------------------------------------------------------------------------------------------
# E8M0 (§2.2) and the MX scale rules (§2.3)
# --------------------------------------------------------------------------------------------


def e8m0_to_float(s: np.ndarray) -> np.ndarray:
    """E8M0 bytes -> float32 ``2**(s−127)``: byte 0 is the subnormal 2**-127 (0x00400000), 0xFF NaN (§2.2).

    When to use: dequantizing MX scales. Dtypes: uint8 in, float32 out. Shape limits: any.
    Precision guarantee: exact (no dtype cast, which would flush or round).
    """
    b = np.asarray(s).astype(np.uint32)
    bits = np.where(b == 0, np.uint32(0x00400000), b << np.uint32(23))
    bits = np.where(b == 0xFF, np.uint32(0x7FC00000), bits)
    return bits.astype(np.uint32).view(np.float32)


def e8m0_reciprocal(s: np.ndarray) -> np.ndarray:
    """Exact reciprocal ``2**(127−s)`` of E8M0 bytes as float32 (§2.2): 254 -> 2**-127 (subnormal), 0 -> 2**127.

    0xFF gives NaN. When to use: MX element scaling (``v = fl(x · 2**(127−s))``, §2.4).
    Dtypes: uint8 in, float32 out. Shape limits: any. Precision guarantee: exact.
    """
    b = np.asarray(s).astype(np.uint32)
    bits = np.where(b >= 254, np.uint32(0x00400000), (np.uint32(254) - np.minimum(b, 253)) << np.uint32(23))
    bits = np.where(b == 0xFF, np.uint32(0x7FC00000), bits)
    return bits.astype(np.uint32).view(np.float32)


def e8m0_scale_byte(amax: np.ndarray, element: str, mode: str = "rceil") -> np.ndarray:
    """The MX scale byte of finite, non-negative float32 block amaxes (§2.3) -> uint8.

    With F, M the exponent and mantissa fields of amax's f32 bits and e = F − 127 (−127 for zero
    and subnormal amax):

    * ``rceil`` (default; TE, cuBLAS, Blackwell ``cvt.rp.satfinite.ue8m0x2``): d = fl(amax /
      max_elem); byte = F_d + (M_d ≠ 0) for normal d, capped at 254; for F_d = 0,
      byte = (M_d > 0x400000). X is the smallest power of two ≥ d.
    * ``floor`` (OCP v1.0 §6.3, torchao FLOOR): clamp(e − emax_elem, −127, 127) + 127.
    * ``ceil`` (torchao CEIL): clamp(e + (M ≠ 0) − emax_elem, −127, 127) + 127.
    * ``even`` (torchao EVEN): floor on the bits (bits + 2**(22 − mbits)) & 0x7F800000 (amax
      rounded half-up to the element's mantissa width; mbits = 6 for int8), carry into
      exponent 255 included.

    An all-zero block gives byte 0 in every mode. Non-finite amax is the caller's case (0xFF).

    When to use: MX scales; FP8-block UE8M0 scales use ``rceil`` of fl(amax / 448) (then clamped).
    Dtypes: float32 amax, uint8 out. Shape limits: any shape.
    Precision guarantee: exact integer rules on the f32 bits.
    """
    fmt = element_format(element)
    mode = _choice("scale_mode", mode, MX_SCALE_MODES)
    a = np.asarray(amax, dtype=np.float32)
    if mode == "rceil":
        d = a / np.float32(fmt.max_finite)
        return _rceil_byte(d)
    bits = a.view(np.uint32).astype(np.int64)
    if mode == "even":
        bits = (bits + (1 << (22 - fmt.mant_bits))) & 0x7F800000
    f = (bits >> 23) & 0xFF
    e = f - 127
    if mode == "ceil":
        e = e + ((bits & 0x7FFFFF) != 0)
    return (np.clip(e - fmt.emax_elem, -127, 127) + 127).astype(np.uint8)


def _rceil_byte(d: np.ndarray) -> np.ndarray:
    """RCEIL E8M0 byte of finite non-negative f32 ``d``: the smallest 2**(b−127) ≥ d, b in [0, 254]."""
    bits = np.asarray(d, dtype=np.float32).view(np.uint32).astype(np.int64)
    f = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = np.minimum(f + (mant != 0), 254)
    sub = (mant > 0x400000).astype(np.int64)
    return np.where(f == 0, sub, normal).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# FP4 packing (§1.5)
# --------------------------------------------------------------------------------------------


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """Pack e2m1 codes two per byte along the last axis: element 2i -> bits 0–3, 2i+1 -> bits 4–7 (§1.5).

    An odd length gets a zero high nibble. When to use: MXFP4 / NVFP4 storage (PyTorch
    ``float4_e2m1fn_x2``). Dtypes: uint8 codes (low nibble used) -> uint8. Shape limits: last axis
    n -> ⌈n/2⌉. Precision guarantee: lossless.
    """
    c = np.asarray(codes).astype(np.uint8) & np.uint8(0xF)
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.zeros((*c.shape[:-1], 1), np.uint8)], axis=-1)
    return (c[..., 0::2] | (c[..., 1::2] << np.uint8(4))).astype(np.uint8)


def unpack_fp4(packed: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: uint8 (..., ⌈n/2⌉) -> uint8 codes (..., n).

    When to use: dequantizing MXFP4 / NVFP4. Dtypes: uint8. Shape limits: ``packed.shape[-1]``
    must be ⌈n/2⌉ (InvalidProblem otherwise). Precision guarantee: lossless.
    """
    p = np.asarray(packed).astype(np.uint8, copy=False)
    if p.shape[-1] != _ceil_div(n, 2):
        raise InvalidProblem(f"packed fp4 last axis {p.shape[-1]} does not hold {n} codes (expected {_ceil_div(n, 2)})")
    both = np.stack([p & np.uint8(0xF), p >> np.uint8(4)], axis=-1)
    return both.reshape(*p.shape[:-1], p.shape[-1] * 2)[..., :n]


# --------------------------------------------------------------------------------------------
# MX (§2)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MXQuantized:
    """An MX-quantized tensor (§2): ``value = 2**(scale − 127) · element``.

    ``codes``: uint8 with the input's shape, e2m1 packed two per byte along ``axis`` (length
    ⌈n/2⌉). ``scales``: E8M0 uint8, the input's shape with ``axis`` replaced by ⌈n/32⌉ (compact,
    row-major; for ``block_2d`` each 32×32 tile's byte repeated over its 32 rows). ``shape``: the
    input's shape; ``axis``: the block axis (non-negative).
    """

    codes: np.ndarray
    scales: np.ndarray
    element: str
    axis: int
    shape: tuple[int, ...]
    scale_mode: str
    block_2d: bool = False


def _block_amax(xb: np.ndarray, block_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(amax over finite elements, all-finite flag) per block of ``xb`` (rows, nb, block).

    With ``block_rows`` > 1, blocks of ``block_rows`` consecutive rows are merged into tiles and
    each row gets its tile's values.
    """
    a = np.abs(xb)
    finite = np.isfinite(a)
    amax = np.where(finite, a, np.float32(0)).max(axis=-1, initial=np.float32(0))
    ok = finite.all(axis=-1)
    if block_rows > 1:
        rows = amax.shape[0]
        tiles = _ceil_div(rows, block_rows)
        amax_t = _pad_axis0(amax, block_rows).reshape(tiles, block_rows, amax.shape[1]).max(axis=1)
        ok_pad = np.concatenate([ok, np.ones((amax_t.shape[0] * block_rows - rows, ok.shape[1]), bool)], axis=0)
        ok_t = ok_pad.reshape(tiles, block_rows, ok.shape[1]).all(axis=1)
        amax = np.repeat(amax_t, block_rows, axis=0)[:rows]
        ok = np.repeat(ok_t, block_rows, axis=0)[:rows]
    return amax, ok


def _encode(v: np.ndarray, element: str, u: np.ndarray | None) -> np.ndarray:
    return encode_elements(v, element) if u is None else encode_elements_stochastic(v, u, element)


def _mx_rows(
    rows: np.ndarray,
    element: str,
    scale_mode: str,
    u_rows: RowSource | None,
    block_2d: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """MX codes (packed for e2m1) and E8M0 scales of the blocks along the last axis of ``rows`` (R, n)."""
    fmt = element_format(element)
    n_rows, n = rows.shape
    nb = _ceil_div(n, MX_BLOCK)
    codes = np.empty((n_rows, _ceil_div(n, 2) if fmt.bits == 4 else n), np.uint8)
    scales = np.empty((n_rows, nb), np.uint8)
    for r0, r1 in _chunks(n_rows, n, MX_BLOCK if block_2d else 1):
        xb = _pad_last(rows[r0:r1], MX_BLOCK).reshape(r1 - r0, nb, MX_BLOCK)
        amax, ok = _block_amax(xb, MX_BLOCK if block_2d else 1)
        s = np.where(ok, e8m0_scale_byte(amax, element, scale_mode), np.uint8(E8M0_NAN)).astype(np.uint8)
        rcp = e8m0_reciprocal(np.where(ok, s, np.uint8(127)))
        with np.errstate(over="ignore", invalid="ignore"):
            v = (xb * rcp[..., None]).reshape(r1 - r0, nb * MX_BLOCK)
        u = None if u_rows is None else _pad_last(u_rows(r0, r1), MX_BLOCK)
        c = _encode(v, element, u).reshape(r1 - r0, nb, MX_BLOCK)
        c = (c * ok[..., None]).reshape(r1 - r0, nb * MX_BLOCK)[:, :n]
        codes[r0:r1] = pack_fp4(c) if fmt.bits == 4 else c
        scales[r0:r1] = s
    return codes, scales


def _mx_core(
    x32: np.ndarray,
    axis: int,
    element: str,
    scale_mode: str,
    words: _Words | None,
    block_2d: bool,
    transposed_words: bool = False,
) -> MXQuantized:
    """MX of ``x32`` along ``axis``; ``transposed_words``: x32 is the transpose of the 2-D x the words index."""
    shape = x32.shape
    xm = np.moveaxis(x32, axis, -1)
    moved_shape = xm.shape
    rows = _as_rows(xm)
    u_rows: RowSource | None = None
    if words is not None:
        if transposed_words:
            u_rows = words.view_rows(words.full().T)
        elif axis == x32.ndim - 1:
            u_rows = words.contiguous_rows(rows.shape[1])
        else:
            u_rows = words.view_rows(_as_rows(np.moveaxis(words.full(), axis, -1)))
    codes, scales = _mx_rows(rows, element, scale_mode, u_rows, block_2d)
    codes_nd = np.moveaxis(codes.reshape(*moved_shape[:-1], codes.shape[-1]), -1, axis)
    scales_nd = np.moveaxis(scales.reshape(*moved_shape[:-1], scales.shape[-1]), -1, axis)
    return MXQuantized(
        np.ascontiguousarray(codes_nd), np.ascontiguousarray(scales_nd), element, axis, shape, scale_mode, block_2d
    )


def mx_quantize(
    x: np.ndarray,
    element: str = "e4m3",
    *,
    axis: int = -1,
    scale_mode: str = "rceil",
    rounding: Rounding | str = Rounding.NEAREST_EVEN,
    seed: int = 0,
    offset: int = 0,
    block_2d: bool = False,
) -> MXQuantized:
    """OCP MX quantization (§2): blocks of 32 along ``axis``, one E8M0 scale per block.

    Formula, per block: amax = max |x| over its elements (a partial last block uses its valid
    elements only, ≡ zero padding); byte s = :func:`e8m0_scale_byte` (amax, mode); v = fl(x ·
    2**(127 − s)) (exact); code = enc(v) (RNE, saturating, §1.3) or §1.6 stochastic. A block with
    NaN or ±Inf gets byte 0xFF and codes 0; an all-zero block byte 0 and codes 0 (±0).

    Modes: ``element`` ``e4m3`` / ``e5m2`` (MXFP8), ``e2m3`` / ``e3m2`` (MXFP6, a code per byte in
    bits 0–5), ``e2m1`` (MXFP4, packed: element 2i in the low nibble), ``int8`` (MXINT8,
    k ∈ [−127, 127]); ``scale_mode`` ``rceil`` (default), ``floor``, ``ceil``, ``even``;
    ``rounding`` nearest even or stochastic (fp elements; words of the project Philox stream by the
    row-major flat index of x, key ``seed``, counter offset ``offset``); ``block_2d``: one scale
    per 32×32 tile (§2.8): x viewed as (rows, n) with ``axis`` last and the other dims flattened
    row-major, tiles of 32 rows × 32 elements, each tile's byte repeated over its rows.

    When to use: MXFP8 / MXFP6 / MXFP4 / MXINT8 GEMM operands (lay the scales out with
    :func:`to_blocked`), TE MXFP8 weights (``block_2d``).

    Dtypes: x float32 / float16 / bfloat16; codes uint8; scales uint8 (E8M0).

    Shape limits: any rank ≥ 1, any extent (partial last block); ``axis`` any.

    Precision guarantee: bit-exact to §2 (the kernels equal it byte for byte);
    |dequantize − x| ≤ half an element ulp at the block's scale for ``rceil`` (no saturation).
    """
    x32 = _as_f32(x)
    ax = _axis(axis, x32.ndim)
    element_format(element)
    mode = _choice("scale_mode", scale_mode, MX_SCALE_MODES)
    r = _rounding(rounding)
    if r is Rounding.STOCHASTIC and element == "int8":
        raise Unsupported("stochastic rounding is defined for MX fp elements, not MXINT8 (use nearest_even)")
    words = _words(x32.shape, r, seed, offset)
    return _mx_core(x32, ax, element, mode, words, bool(block_2d))


def _to_out(y: np.ndarray, out_dtype: Any) -> np.ndarray:
    d = _out_dtype(out_dtype)
    with np.errstate(over="ignore"):
        return y.astype(d)


def _element_values(codes: np.ndarray, element: str, n: int, axis: int) -> np.ndarray:
    if element_format(element).bits == 4:
        codes = np.moveaxis(unpack_fp4(np.moveaxis(codes, axis, -1), n), -1, axis)
    return decode_elements(codes, element)


def mx_dequantize(q: MXQuantized, out_dtype: Any = np.float32) -> np.ndarray:
    """Dequantize an :class:`MXQuantized` (§2.9): y = fl(dec(code) · 2**(s − 127)) in f32, rounded once to ``out_dtype``.

    Byte 0xFF gives NaN over its block. When to use: checking and consuming MX tensors.
    Dtypes: ``out_dtype`` float32 (default), float16 or bfloat16 (RNE). Shape limits: q.shape.
    Precision guarantee: exact in f32 unless the product overflows; one rounding to out_dtype.
    """
    n = q.shape[q.axis]
    values = _element_values(q.codes, q.element, n, q.axis)
    scale = np.take(e8m0_to_float(q.scales), np.arange(n) // MX_BLOCK, axis=q.axis)
    with np.errstate(over="ignore", invalid="ignore"):
        y = values * scale
    return _to_out(y, out_dtype)


# --------------------------------------------------------------------------------------------
# NVFP4 (§3)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class NVFP4Quantized:
    """An NVFP4 tensor (§3): ``value = e2m1 · f32(e4m3 scale) · tensor_scale``.

    ``codes``: uint8 (..., ⌈K/2⌉), e2m1 packed along the last axis. ``scales``: E4M3 bytes
    (..., ⌈K/16⌉) (for ``block_2d`` each 16×16 tile's byte repeated over its 16 rows).
    ``tensor_scale``: S_dec (f32). ``amax``: the tensor amax used (f32; over finite elements,
    or the caller's). ``shape``: the input's shape.
    """

    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: np.float32
    amax: np.float32
    shape: tuple[int, ...]
    mode: str
    two_level: bool
    block_2d: bool = False


def nvfp4_tensor_scales(
    amax: float | np.floating[Any], mode: str = "te", two_level: bool = True
) -> tuple[np.float32, np.float32]:
    """(S_enc, S_dec) of NVFP4's second level (§3.2), float32.

    ``te``: S_enc = 1 if amax == 0, else min(fl(2688 / amax), FLT_MAX), then 1 if that is 0
    (amax = Inf); S_dec = fl(1 / S_enc). ``torchao``: S_dec = fl(amax / 2688) (its
    per_tensor_scale), S_enc = fl(1 / S_dec). ``two_level=False``: (1, 1).

    When to use: the tensor scale of :func:`nvfp4_quantize`; a GEMM's alpha. Dtypes: f32.
    Shape limits: a scalar. Precision guarantee: correctly rounded f32 steps, in this order.
    """
    mode = _choice("mode", mode, NVFP4_MODES)
    one = np.float32(1.0)
    if not two_level:
        return one, one
    a = np.float32(amax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if mode == "torchao":
            s_dec = a / np.float32(2688.0)
            return np.float32(one / s_dec), np.float32(s_dec)
        if a == 0:
            return one, one
        s_enc = np.minimum(np.float32(2688.0) / a, _FLT_MAX)
        if s_enc == 0:
            s_enc = one
        return np.float32(s_enc), np.float32(one / s_enc)


def _finite_amax(x32: np.ndarray) -> np.float32:
    """max |x| over the finite elements (0 for none), exact."""
    flat = x32.reshape(-1)
    best = np.float32(0.0)
    for start in range(0, flat.size, _CHUNK_ELEMENTS):
        a = np.abs(flat[start : start + _CHUNK_ELEMENTS])
        a[~np.isfinite(a)] = 0
        best = max(best, np.float32(a.max()))
    return np.float32(best)


def _nvfp4_core(
    x32: np.ndarray,
    mode: str,
    two_level: bool,
    amax: np.float32,
    words: _Words | None,
    block_2d: bool,
    transposed_words: bool = False,
) -> NVFP4Quantized:
    """NVFP4 of ``x32`` along its last axis; ``transposed_words``: x32 is the transpose of the 2-D x the words index."""
    shape = x32.shape
    k = shape[-1]
    nb = _ceil_div(k, NVFP4_BLOCK)
    rows = _as_rows(x32)
    n_rows = rows.shape[0]
    u_rows: RowSource | None = None
    if words is not None:
        u_rows = words.view_rows(words.full().T) if transposed_words else words.contiguous_rows(k)
    s_enc, s_dec = nvfp4_tensor_scales(amax, mode, two_level)
    codes = np.empty((n_rows, _ceil_div(k, 2)), np.uint8)
    scales = np.empty((n_rows, nb), np.uint8)
    for r0, r1 in _chunks(n_rows, k, NVFP4_BLOCK if block_2d else 1):
        xb = _pad_last(rows[r0:r1], NVFP4_BLOCK).reshape(r1 - r0, nb, NVFP4_BLOCK)
        bamax, ok = _block_amax(xb, NVFP4_BLOCK if block_2d else 1)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            if mode == "te":
                m = s_enc * _F32_ONE_SIXTH
                s = encode_elements(bamax * m, "e4m3")
                inv = np.minimum(np.float32(1.0) / (decode_elements(s, "e4m3") * s_dec), _FLT_MAX)
                v = xb * inv[..., None]
            else:
                bs = bamax / np.float32(6.0)
                lo, hi = np.float32(2.0**-6), np.float32(448.0)
                if two_level:
                    s = encode_elements(np.clip(bs / s_dec, lo, hi), "e4m3")
                    inv = (np.float32(1.0) / s_dec) / decode_elements(s, "e4m3")
                else:
                    s = encode_elements(np.clip(bs, lo, hi), "e4m3")
                    inv = np.float32(1.0) / decode_elements(s, "e4m3")
                v = np.clip(xb * inv[..., None], np.float32(-6.0), np.float32(6.0))
        # Non-finite blocks (and torchao's 0/0 scales of an all-zero tensor) get the NaN scale and codes 0.
        ok = ok & (s != E4M3_NAN)
        u = None if u_rows is None else _pad_last(u_rows(r0, r1), NVFP4_BLOCK)
        c = _encode(v.reshape(r1 - r0, nb * NVFP4_BLOCK), "e2m1", u).reshape(r1 - r0, nb, NVFP4_BLOCK)
        c = (c * ok[..., None]).reshape(r1 - r0, nb * NVFP4_BLOCK)[:, :k]
        codes[r0:r1] = pack_fp4(c)
        scales[r0:r1] = np.where(ok, s, np.uint8(E4M3_NAN))
    return NVFP4Quantized(
        codes.reshape(*shape[:-1], codes.shape[-1]),
        scales.reshape(*shape[:-1], nb),
        s_dec,
        amax,
        shape,
        mode,
        two_level,
        block_2d,
    )


def nvfp4_quantize(
    x: np.ndarray,
    *,
    mode: str = "te",
    two_level: bool = True,
    global_amax: float | None = None,
    block_2d: bool = False,
    rounding: Rounding | str = Rounding.NEAREST_EVEN,
    seed: int = 0,
    offset: int = 0,
) -> NVFP4Quantized:
    """NVFP4 quantization (§3): e2m1 in blocks of 16 along the last axis, E4M3 block scales, an f32 tensor scale.

    Formula, mode ``te`` (default; TransformerEngine's kernel and reference):
    ``amax`` = max |x| over finite elements (or ``global_amax``); (S_enc, S_dec) =
    :func:`nvfp4_tensor_scales`; per block m = fl(S_enc · fl32(1/6)), s_raw = fl(bamax · m),
    s = e4m3_rn_satfinite(s_raw), inv = min(fl(1 / fl(f32(s) · S_dec)), FLT_MAX), v = fl(x · inv),
    code = e2m1_rn_satfinite(v) or §1.6 stochastic.
    Mode ``torchao`` (``nvfp4_tensor.nvfp4_quantize``): S_dec = fl(amax / 2688); bs = fl(bamax / 6);
    two-level s = e4m3(clamp(fl(bs / S_dec), 2**-6, 448)), inv = fl(fl(1 / S_dec) / f32(s));
    single-level s = e4m3(clamp(bs, 2**-6, 448)), inv = fl(1 / f32(s)); v = clamp(fl(x · inv), ±6).
    ``two_level=False``: S_enc = S_dec = 1. ``block_2d``: bamax over 16×16 tiles (rows = the
    flattened leading dims), each tile's scale repeated over its 16 rows (§3.4).
    Special values (§3.7): a block with NaN / ±Inf gets scale 0x7F and codes 0 (the tensor amax
    ignores them); all-zero tensor: S_enc = 1, scales 0, codes 0 (``te``); ``torchao`` with amax 0
    gives NaN scales (0/0): stored 0x7F with codes 0.

    When to use: NVFP4 GEMM operands (scales through :func:`to_blocked`, C = ⌈K/16⌉); stochastic
    rounding for gradients.

    Dtypes: x float32 / float16 / bfloat16; codes uint8 (packed, element 2i low nibble); scales
    uint8 (E4M3); tensor_scale float32. ``global_amax``: a finite or +Inf number ≥ 0.

    Shape limits: rank ≥ 1 (rows = product of the leading dims), any K (partial last block).

    Precision guarantee: bit-exact to §3; every step a correctly rounded f32 operation.
    """
    x32 = _as_f32(x)
    if x32.ndim == 0:
        raise InvalidProblem("x must have at least one dimension (blocks run along the last axis)")
    mode = _choice("mode", mode, NVFP4_MODES)
    r = _rounding(rounding)
    words = _words(x32.shape, r, seed, offset)
    return _nvfp4_core(x32, mode, bool(two_level), _global_amax(x32, global_amax), words, bool(block_2d))


def _global_amax(x32: np.ndarray, global_amax: float | None) -> np.float32:
    if global_amax is None:
        return _finite_amax(x32)
    if isinstance(global_amax, bool) or not isinstance(global_amax, numbers.Real):
        raise InvalidProblem(f"global_amax must be a number >= 0 or None, got {global_amax!r}")
    g = np.float32(global_amax)
    if not (g >= 0):
        raise InvalidProblem(f"global_amax must be >= 0 (and not NaN), got {global_amax!r}")
    return g


def nvfp4_dequantize(q: NVFP4Quantized, out_dtype: Any = np.float32) -> np.ndarray:
    """Dequantize an :class:`NVFP4Quantized` (§3.8): y = fl(fl(e2m1 · f32(s)) · S_dec), rounded once to ``out_dtype``.

    Scale 0x7F (NaN) gives NaN over its block. When to use: checking and consuming NVFP4 tensors.
    Dtypes: float32 (default), float16 or bfloat16. Shape limits: q.shape.
    Precision guarantee: the first product is exact; one f32 rounding, one to out_dtype.
    """
    k = q.shape[-1]
    values = decode_elements(unpack_fp4(q.codes, k), "e2m1")
    s = np.repeat(decode_elements(q.scales, "e4m3"), NVFP4_BLOCK, axis=-1)[..., :k]
    with np.errstate(over="ignore", invalid="ignore"):
        y = (values * s) * q.tensor_scale
    return _to_out(y, out_dtype)


# --------------------------------------------------------------------------------------------
# FP8 blocks (§4)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FP8BlockQuantized:
    """A DeepSeek-style FP8 block-quantized tensor (§4): ``value = element · s``.

    ``codes``: e4m3 / e5m2 bytes with the input's shape. ``scales``: compact row-major
    [⌈M/bm⌉, ⌈K/bk⌉] (M = product of the leading dims): float32 ``s`` (``scale_format="f32"``) or
    UE8M0 bytes (``"ue8m0"``, s = 2**(byte − 127)). ``block``: (bm, bk).
    """

    codes: np.ndarray
    scales: np.ndarray
    element: str
    block: tuple[int, int]
    scale_format: str
    elem_op: str
    shape: tuple[int, ...]


def _fp8_core(
    x32: np.ndarray,
    block: tuple[int, int],
    element: str,
    scale_format: str,
    elem_op: str,
    amax_floor: np.float32,
    input_max: np.float32,
) -> FP8BlockQuantized:
    fmt = element_format(element)
    shape = x32.shape
    k = shape[-1]
    rows = _as_rows(x32)
    n_rows = rows.shape[0]
    bm, bk = block
    g = _ceil_div(k, bk)
    fmax = np.float32(fmt.max_finite)
    codes = np.empty((n_rows, k), np.uint8)
    ue8m0 = scale_format == "ue8m0"
    scales = np.empty((_ceil_div(n_rows, bm), g), np.uint8 if ue8m0 else np.float32)
    for r0, r1 in _chunks(n_rows, k, bm):
        xb = _pad_last(rows[r0:r1], bk).reshape(r1 - r0, g, bk)
        amax, ok = _block_amax(xb, bm)
        a = np.maximum(amax, amax_floor)
        zero = a == 0
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            if ue8m0:
                byte = np.where(zero, np.uint8(127), np.clip(_rceil_byte(a / fmax), 1, 254)).astype(np.uint8)
                v = xb * e8m0_reciprocal(byte)[..., None]
                s_rows = np.where(ok, byte, np.uint8(E8M0_NAN)).astype(np.uint8)
            elif elem_op == "enc":
                e = np.where(zero, np.float32(1.0), fmax / a)
                e = np.where(np.isinf(e), input_max, e).astype(np.float32)
                v = xb * e[..., None]
                s_rows = np.where(ok, np.float32(1.0) / e, _F32_NAN).astype(np.float32)
            else:
                s = np.where(zero, np.float32(1.0), a / fmax).astype(np.float32)
                v = xb / s[..., None] if elem_op == "div" else xb * (np.float32(1.0) / s)[..., None]
                s_rows = np.where(ok, s, _F32_NAN).astype(np.float32)
            c = encode_elements(v, element)
        codes[r0:r1] = (c * ok[..., None]).reshape(r1 - r0, g * bk)[:, :k]
        # Every row of a tile holds the tile's scale: keep the tile's first row.
        scales[r0 // bm : _ceil_div(r1, bm)] = s_rows[::bm]
    return FP8BlockQuantized(codes.reshape(shape), scales, element, block, scale_format, elem_op, shape)


def fp8_block_quantize(
    x: np.ndarray,
    *,
    block: tuple[int, int] = (1, 128),
    element: str = "e4m3",
    scale_format: str = "f32",
    elem_op: str = "div",
    amax_floor: float = 0.0,
) -> FP8BlockQuantized:
    """DeepSeek-V3 / DeepGEMM FP8 block quantization (§4): 1×128 activation or 128×128 weight tiles.

    Formula, per tile (a = max(amax, amax_floor), amax over the tile's valid elements, 448 the
    element's max — 57344 for e5m2):

    * ``scale_format="f32"``, ``elem_op="div"`` (default; DeepSeek-V3, vLLM): s = 1 if a == 0 else
      fl(a / 448); v = fl(x / s).
    * ``elem_op="mul_rcp"`` (DeepGEMM's reference): same s; v = fl(x · fl(1 / s)).
    * ``elem_op="enc"`` (TE, torchao training): e = 1 if a == 0 else fl(448 / a), Inf → the input
      dtype's max; v = fl(x · e); stored s = fl(1 / e).
    * ``scale_format="ue8m0"``: byte = clamp(RCEIL(fl(a / 448)), 1, 254), 127 if a == 0;
      v = x · 2**(127 − byte) (exact); ``elem_op`` is ignored.

    code = e4m3 (or e5m2) RNE satfinite(v). A tile with NaN / ±Inf: s = NaN (0x7FC00000) or byte
    0xFF, codes 0.

    When to use: DeepGEMM / vLLM / TE FP8 block GEMM operands; lay the scales out with
    :func:`col_major_tma_aligned` or :func:`deepgemm_sf_layout`.

    Dtypes: x float32 / float16 / bfloat16; codes uint8; scales float32 or uint8.
    ``amax_floor``: a finite float ≥ 0, rounded to f32 (0, 1e-10 for vLLM, 1e-4 for DeepGEMM).

    Shape limits: rank ≥ 1; N-D inputs have their leading dims flattened into M (rows); any M
    and K (partial tiles, §4.4). ``block``: (1, 128) or (128, 128).

    Precision guarantee: bit-exact to §4.2.
    """
    x32 = _as_f32(x)
    if x32.ndim == 0:
        raise InvalidProblem("x must have at least one dimension")
    blk = _fp8_block_shape(block)
    if element not in ("e4m3", "e5m2"):
        raise InvalidProblem(f"FP8 block element must be 'e4m3' or 'e5m2', got {element!r}")
    sf = _choice("scale_format", scale_format, FP8_SCALE_FORMATS)
    op = _choice("elem_op", elem_op, FP8_ELEM_OPS)
    floor = _amax_floor(amax_floor)
    input_max = np.float32(ml_dtypes.finfo(x.dtype).max) if x.dtype != np.float32 else _FLT_MAX
    return _fp8_core(x32, blk, element, sf, op, floor, input_max)


def _fp8_block_shape(block: Any) -> tuple[int, int]:
    try:
        blk = (int(block[0]), int(block[1]))
        ok = len(block) == 2
    except (TypeError, ValueError, IndexError):
        ok = False
    if not ok or blk not in ((1, FP8_BLOCK), (FP8_BLOCK, FP8_BLOCK)):
        raise Unsupported(f"FP8 block must be (1, 128) or (128, 128), got {block!r}")
    return blk


def _amax_floor(amax_floor: Any) -> np.float32:
    if isinstance(amax_floor, bool) or not isinstance(amax_floor, numbers.Real):
        raise InvalidProblem(f"amax_floor must be a finite number >= 0, got {amax_floor!r}")
    f = np.float32(amax_floor)
    if not (np.isfinite(f) and f >= 0):
        raise InvalidProblem(f"amax_floor must be a finite number >= 0, got {amax_floor!r}")
    return f


def fp8_block_dequantize(q: FP8BlockQuantized, out_dtype: Any = np.float32) -> np.ndarray:
    """Dequantize an :class:`FP8BlockQuantized`: y = fl(dec(code) · s) in f32, rounded once to ``out_dtype``.

    s is the f32 scale, or 2**(byte − 127) for UE8M0 (0xFF → NaN). A NaN scale gives NaN over its
    tile. When to use: checking FP8 block tensors. Dtypes: float32 (default), float16, bfloat16.
    Shape limits: q.shape. Precision guarantee: one f32 product (exact for UE8M0 unless it
    overflows), one rounding to out_dtype.
    """
    k = q.shape[-1]
    bm, bk = q.block
    values = _as_rows(decode_elements(q.codes, q.element))
    s = e8m0_to_float(q.scales) if q.scale_format == "ue8m0" else np.asarray(q.scales, np.float32)
    s_full = np.repeat(np.repeat(s, bm, axis=0)[: values.shape[0]], bk, axis=1)[:, :k]
    with np.errstate(over="ignore", invalid="ignore"):
        y = values * s_full
    return _to_out(y.reshape(q.shape), out_dtype)


# --------------------------------------------------------------------------------------------
# Scale layouts (§4.3, §5)
# --------------------------------------------------------------------------------------------


def swizzle_offset(r: Any, c: Any, n_cols: int) -> Any:
    """Byte offset of scale (r, c) in the cuBLAS / CUTLASS 128×4 blocked layout (§5).

    offset = ((r // 128) · ⌈C/4⌉ + c // 4) · 512 + (r % 32) · 16 + ((r % 128) // 32) · 4 + c % 4,
    C = ``n_cols``. When to use: addressing scales in a kernel or a test. Dtypes: Python ints or
    integer arrays (broadcast). Shape limits: 0 ≤ c < C. Precision guarantee: exact integers.
    """
    r = np.asarray(r, dtype=np.int64) if not isinstance(r, int) else r
    c = np.asarray(c, dtype=np.int64) if not isinstance(c, int) else c
    tiles_c = _ceil_div(int(n_cols), 4)
    return ((r // 128) * tiles_c + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def _batched(s: np.ndarray, name: str) -> tuple[np.ndarray, tuple[int, ...]]:
    a = np.asarray(s)
    if a.ndim < 2:
        raise InvalidProblem(f"{name} must have at least 2 dimensions ([R, C] or batched [..., R, C]), got {a.shape}")
    lead = a.shape[:-2]
    return a.reshape(math.prod(lead), *a.shape[-2:]), lead


def to_blocked(scales: np.ndarray) -> np.ndarray:
    """The cuBLAS / CUTLASS 128×4 blocked (swizzled) layout of a scale matrix (§5).

    S [R, C] is zero-padded to [roundup(R, 128), roundup(C, 4)], cut into 128×4 tiles stored
    row-of-tiles major, each tile 512 contiguous entries: entry (r, c) lands at
    :func:`swizzle_offset` (r, c, C). Batched input [..., R, C]: each matrix separately, output
    [..., 512 · ⌈R/128⌉ · ⌈C/4⌉] (cuBLAS batch stride = size).

    When to use: MX / NVFP4 scales for cuBLAS / CUTLASS block-scaled GEMMs (columnwise operands:
    the scales of the transposed operand, §5). Dtypes: any (uint8 E8M0 / E4M3 bytes); padding is
    zero. Shape limits: rank ≥ 2. Precision guarantee: a permutation (lossless).
    """
    a, lead = _batched(scales, "scales")
    b, r, c = a.shape
    rt, ct = _ceil_div(r, 128), _ceil_div(c, 4)
    padded = np.zeros((b, rt * 128, ct * 4), a.dtype)
    padded[:, :r, :c] = a
    # r = rt·128 + i·32 + j, c = ct·4 + l  ->  offset (rt, ct, j, i, l)
    tiles = padded.reshape(b, rt, 4, 32, ct, 4).transpose(0, 1, 4, 3, 2, 5)
    return np.ascontiguousarray(tiles).reshape(*lead, rt * ct * 512)


def from_blocked(blocked: np.ndarray, n_rows: int, n_cols: int) -> np.ndarray:
    """Inverse of :func:`to_blocked`: the [..., R, C] scale matrix (padding dropped).

    When to use: reading swizzled scales back. Dtypes: any. Shape limits: the last axis must be
    512 · ⌈R/128⌉ · ⌈C/4⌉ (InvalidProblem otherwise). Precision guarantee: lossless.
    """
    a = np.asarray(blocked)
    rt, ct = _ceil_div(n_rows, 128), _ceil_div(n_cols, 4)
    if a.ndim < 1 or a.shape[-1] != rt * ct * 512:
        raise InvalidProblem(
            f"blocked scales of a {n_rows}x{n_cols} matrix need a last axis of {rt * ct * 512}, got {a.shape}"
        )
    lead = a.shape[:-1]
    b = math.prod(lead)
    tiles = a.reshape(b, rt, ct, 32, 4, 4).transpose(0, 1, 4, 3, 2, 5)
    full = tiles.reshape(b, rt * 128, ct * 4)[:, :n_rows, :n_cols]
    return np.ascontiguousarray(full).reshape(*lead, n_rows, n_cols)


def col_major_tma_aligned(scales: np.ndarray) -> np.ndarray:
    """DeepGEMM's column-major TMA-aligned scale buffer (§4.3): [..., G, align(MN, 16 / itemsize)].

    Element (m, g) of S [MN, G] sits at g · align(MN) + m (MN padded to a multiple of 4 for
    f32 / int32, of 16 for bytes); padding is zero. Batched [B, MN, G] -> [B, G, align(MN)].
    The logical tensor is ``buffer[..., :MN]`` transposed (strides (1, align(MN))).

    When to use: DeepGEMM SM90 / vLLM ``column_major_scales``, TE 1×128 rowwise scale shape.
    Dtypes: float32, int32 or uint8. Shape limits: rank ≥ 2. Precision guarantee: lossless.
    """
    a, lead = _batched(scales, "scales")
    b, mn, g = a.shape
    align = 16 // a.dtype.itemsize
    buf = np.zeros((b, g, _ceil_div(mn, align) * align), a.dtype)
    buf[:, :, :mn] = a.transpose(0, 2, 1)
    return buf.reshape(*lead, g, buf.shape[-1])


def pack_ue8m0_int32(scales: np.ndarray) -> np.ndarray:
    """Pack UE8M0 bytes four per int32, little-endian (§4.3): [..., MN, G] uint8 -> int32 [..., MN, ⌈G/4⌉].

    Byte j (LSB = 0) of word w holds group 4w + j; padding bytes are 0 (DeepGEMM
    ``pack_ue8m0_to_int``). When to use: DeepGEMM SM100 scale operands. Dtypes: uint8 in, int32
    out. Shape limits: rank ≥ 2. Precision guarantee: lossless.
    """
    a = np.asarray(scales)
    if a.dtype != np.uint8:
        raise InvalidProblem(f"UE8M0 scales must be uint8 bytes, got {a.dtype}")
    if a.ndim < 2:
        raise InvalidProblem(f"scales must have at least 2 dimensions, got {a.shape}")
    p = _pad_last(a, 4).astype(np.uint32)
    words = p[..., 0::4] | (p[..., 1::4] << 8) | (p[..., 2::4] << 16) | (p[..., 3::4] << 24)
    return words.astype(np.uint32).view(np.int32)


def deepgemm_sf_layout(scales: np.ndarray) -> np.ndarray:
    """DeepGEMM SM100 scale buffer: :func:`pack_ue8m0_int32` then :func:`col_major_tma_aligned`.

    [..., MN, G] uint8 -> int32 [..., ⌈G/4⌉, align(MN, 4)] (§4.3). When to use: DeepGEMM SM100
    FP8 GEMM operands (for 128×128 weights broadcast the scales to rows first with
    :func:`broadcast_block_rows`). Dtypes: uint8 in, int32 out. Shape limits: rank ≥ 2.
    Precision guarantee: lossless.
    """
    return col_major_tma_aligned(pack_ue8m0_int32(scales))


def broadcast_block_rows(scales: np.ndarray, n_rows: int, block: int = FP8_BLOCK) -> np.ndarray:
    """Broadcast block scales [⌈N/block⌉, G] to every row: row n takes block row n // block -> [N, G].

    When to use: DeepGEMM SM100 weights (128×128 scales to per-row before packing, §4.3).
    Dtypes: any. Shape limits: ``scales.shape[0]`` must be ⌈n_rows/block⌉ (InvalidProblem
    otherwise). Precision guarantee: lossless.
    """
    a = np.asarray(scales)
    if a.ndim != 2 or a.shape[0] != _ceil_div(n_rows, block):
        raise InvalidProblem(
            f"scales of {n_rows} rows in blocks of {block} must be [{_ceil_div(n_rows, block)}, G], got {a.shape}"
        )
    return np.repeat(a, block, axis=0)[:n_rows]


# --------------------------------------------------------------------------------------------
# Fused quantize + transpose (§6)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QuantizedPair:
    """The rowwise and columnwise copies of one x (§6).

    ``rowwise``: blocks along K of x [M, K]. ``columnwise``: blocks along M; with
    ``layout="transposed"`` it is the quantization of xᵀ ([K, M] codes, [K, ⌈M/b⌉] scales); with
    ``layout="te_mxfp8"`` (MXFP8 only) the same bytes kept untransposed ([M, K] codes, block axis 0,
    [⌈M/32⌉, K] scales).
    """

    rowwise: MXQuantized | NVFP4Quantized | FP8BlockQuantized
    columnwise: MXQuantized | NVFP4Quantized | FP8BlockQuantized
    layout: str


def quantize_transpose(
    x: np.ndarray,
    fmt: Literal["mx", "nvfp4", "fp8_block"] = "mx",
    layout: str = "transposed",
    **options: Any,
) -> QuantizedPair:
    """Fused quantize + transpose (§6): rowwise R = Q(x) and columnwise C = Q(xᵀ), both from the high-precision x.

    Formula: R is ``fmt``'s quantization of x [M, K] (N-D: leading dims flattened into M) with
    blocks along K; C quantizes the same values with blocks along M, stored transposed
    ([K, M], the K-major operand of xᵀ). Stochastic rounding uses the word of x[i, j] for both
    copies. NVFP4: one tensor amax (S_enc shared); 16×16 tiles give C the transposed tile scales.
    FP8 128×128: C.codes = R.codesᵀ, C.scales = R.scalesᵀ; FP8 1×128: C has 128×1 blocks of x.

    Modes: ``fmt`` ``mx`` (options of :func:`mx_quantize` except ``axis``), ``nvfp4`` (options of
    :func:`nvfp4_quantize`), ``fp8_block`` (options of :func:`fp8_block_quantize`); ``layout``
    ``transposed`` (default) or ``te_mxfp8`` (``mx`` with e4m3 / e5m2 only: TE's physical MXFP8
    layout, columnwise codes untransposed [M, K] with scales [⌈M/32⌉, K]).

    When to use: the backward operands of a training step (dgrad / wgrad GEMMs).

    Dtypes: as the format's quantize function. Shape limits: rank ≥ 2.

    Precision guarantee: each copy bit-exact to its format's function on x or xᵀ.
    """
    x32 = _as_f32(x)
    kind = _choice("fmt", fmt, ("mx", "nvfp4", "fp8_block"))
    layout = _choice("layout", layout, TRANSPOSE_LAYOUTS)
    if x32.ndim < 2:
        raise InvalidProblem(f"quantize_transpose needs x of rank >= 2 ([M, K]), got shape {x32.shape}")
    x2 = _as_rows(x32)
    opts = dict(options)
    if kind == "mx":
        if "axis" in opts:
            raise InvalidProblem("quantize_transpose fixes the block axes: do not pass axis")
        element = opts.pop("element", "e4m3")
        element_format(element)
        mode = _choice("scale_mode", opts.pop("scale_mode", "rceil"), MX_SCALE_MODES)
        r = _rounding(opts.pop("rounding", Rounding.NEAREST_EVEN))
        seed, offset = opts.pop("seed", 0), opts.pop("offset", 0)
        block_2d = bool(opts.pop("block_2d", False))
        _no_more(opts)
        if layout == "te_mxfp8" and element not in ("e4m3", "e5m2"):
            raise InvalidProblem(
                f"layout 'te_mxfp8' is TE's MXFP8 layout: element must be e4m3 or e5m2, got {element!r}"
            )
        if r is Rounding.STOCHASTIC and element == "int8":
            raise Unsupported("stochastic rounding is defined for MX fp elements, not MXINT8")
        words = _words(x2.shape, r, seed, offset)
        row = _mx_core(x2, 1, element, mode, words, block_2d)
        if layout == "te_mxfp8":
            col = _mx_core(x2, 0, element, mode, words, block_2d)
        else:
            col = _mx_core(x2.T, 1, element, mode, words, block_2d, transposed_words=True)
        return QuantizedPair(row, col, layout)
    if layout != "transposed":
        raise InvalidProblem(f"layout {layout!r} applies to fmt='mx' (MXFP8) only; use 'transposed'")
    if kind == "nvfp4":
        mode = _choice("mode", opts.pop("mode", "te"), NVFP4_MODES)
        two_level = bool(opts.pop("two_level", True))
        amax = _global_amax(x2, opts.pop("global_amax", None))
        block_2d = bool(opts.pop("block_2d", False))
        r = _rounding(opts.pop("rounding", Rounding.NEAREST_EVEN))
        seed, offset = opts.pop("seed", 0), opts.pop("offset", 0)
        _no_more(opts)
        words = _words(x2.shape, r, seed, offset)
        row4 = _nvfp4_core(x2, mode, two_level, amax, words, block_2d)
        col4 = _nvfp4_core(x2.T, mode, two_level, amax, words, block_2d, transposed_words=True)
        return QuantizedPair(row4, col4, layout)
    blk = _fp8_block_shape(opts.pop("block", (1, FP8_BLOCK)))
    element = opts.pop("element", "e4m3")
    if element not in ("e4m3", "e5m2"):
        raise InvalidProblem(f"FP8 block element must be 'e4m3' or 'e5m2', got {element!r}")
    sf = _choice("scale_format", opts.pop("scale_format", "f32"), FP8_SCALE_FORMATS)
    op = _choice("elem_op", opts.pop("elem_op", "div"), FP8_ELEM_OPS)
    floor = _amax_floor(opts.pop("amax_floor", 0.0))
    _no_more(opts)
    input_max = np.float32(ml_dtypes.finfo(x.dtype).max) if x.dtype != np.float32 else _FLT_MAX
    row8 = _fp8_core(x2, blk, element, sf, op, floor, input_max)
    col8 = _fp8_core(x2.T, blk, element, sf, op, floor, input_max)
    return QuantizedPair(row8, col8, layout)


def _no_more(opts: dict[str, Any]) -> None:
    if opts:
        raise InvalidProblem(f"unknown option(s) for this format: {sorted(opts)}")


__all__ = [
    "E4M3_NAN",
    "E8M0_NAN",
    "ELEMENT_FORMATS",
    "FP8_BLOCK",
    "FP8_ELEM_OPS",
    "FP8_SCALE_FORMATS",
    "MX_BLOCK",
    "MX_SCALE_MODES",
    "NVFP4_BLOCK",
    "NVFP4_MODES",
    "TRANSPOSE_LAYOUTS",
    "ElementFormat",
    "FP8BlockQuantized",
    "MXQuantized",
    "NVFP4Quantized",
    "QuantizedPair",
    "broadcast_block_rows",
    "col_major_tma_aligned",
    "decode_elements",
    "deepgemm_sf_layout",
    "e8m0_reciprocal",
    "e8m0_scale_byte",
    "e8m0_to_float",
    "element_format",
    "encode_elements",
    "encode_elements_stochastic",
    "fp8_block_dequantize",
    "fp8_block_quantize",
    "from_blocked",
    "mx_dequantize",
    "mx_quantize",
    "nvfp4_dequantize",
    "nvfp4_quantize",
    "nvfp4_tensor_scales",
    "pack_fp4",
    "pack_ue8m0_int32",
    "quantize_transpose",
    "swizzle_offset",
    "to_blocked",
    "unpack_fp4",
]
