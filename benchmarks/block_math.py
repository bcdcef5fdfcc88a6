"""Plain PyTorch implementations of block-scaled formats that torchao 0.18 lacks, for the
``torch.compile`` column of ``bench_peers.py``'s block-scaled rows.

Each follows the project's MICROSCALING.md in plain tensor ops, so ``torch.compile`` of it is the
"same math" a user would write: MX with E8M0 scales (``rceil`` and ``floor`` rules; any element,
MXFP6 e2m3 and MXINT8 included), FP8 1x128 blocks (``div`` f32 scales, UE8M0 scales), and the scale
layouts the GEMMs read (cuBLAS / CUTLASS 128x4 ``blocked``, DeepGEMM column-major TMA-aligned and
packed UE8M0 int32). ``tests/test_bench_block_math.py`` checks their bytes against
``quantplan.reference.block_scaled`` on the CPU.

Arithmetic (§1.1): inputs upcast to f32; every rounding step is one f32 operation. Constants that
divide are passed in as tensors (``limit``), because inductor rewrites a division by a constant
into a multiplication by its reciprocal, which is not the same f32 operation. Partial blocks are
zero padded (§1.4: the same amax); non-finite blocks get the NaN scale and zero codes.

Element encoding (§1.3, round to nearest even, saturating): the magnitude's f32 exponent, clamped
to the element's smallest normal exponent, gives the step 2^(e - mbits); ``torch.round`` (half to
even) of |v| / step, times step, is the rounded magnitude (both exact: powers of two), clamped to
the largest finite value; the code is read from that value's f32 exponent and top mantissa bits.
"""

from __future__ import annotations

from typing import Any

#: element -> (exponent bits, mantissa bits, bias, largest finite value, emax_elem) (§1.2).
FP_ELEMENTS: dict[str, tuple[int, int, int, float, int]] = {
    "e4m3": (4, 3, 7, 448.0, 8),
    "e5m2": (5, 2, 15, 57344.0, 15),
    "e2m3": (2, 3, 1, 7.5, 2),
    "e3m2": (3, 2, 3, 28.0, 4),
    "e2m1": (2, 1, 1, 6.0, 2),
}
#: MXINT8: largest element 127/64, emax_elem 0 (§2.7).
INT8_MAX = 127.0 / 64.0
MX_BLOCK = 32
FP8_BLOCK = 128


def max_element(element: str) -> float:
    """The largest finite value of ``element`` (``int8``: MXINT8's 127/64)."""
    return INT8_MAX if element == "int8" else FP_ELEMENTS[element][3]


def limit_tensor(element: str, device: Any = "cpu") -> Any:
    """The one-element f32 tensor ``limit`` the functions divide by: the element's largest value."""
    import torch

    return torch.tensor([max_element(element)], dtype=torch.float32, device=device)


def _pow2(exponent: Any) -> Any:
    """2**exponent as f32, for integer tensors in [-127, 127] (2^-127 is the subnormal 0x00400000)."""
    import torch

    bits = torch.where(exponent <= -127, 0x00400000, (exponent + 127) << 23)
    return bits.to(torch.int32).view(torch.float32)


def encode_fp(v: Any, element: str) -> Any:
    """f32 tensor ``v`` (finite) -> uint8 codes of ``element``, RNE, saturating (§1.3)."""
    import torch

    ebits, mbits, bias, max_finite, _ = FP_ELEMENTS[element]
    emin = 1 - bias
    mag = v.abs()
    exp = ((mag.view(torch.int32) >> 23) & 0xFF) - 127
    exp = torch.clamp(exp, min=emin)
    # |v| / step and back: exact products with powers of two; round half to even in between.
    r = torch.round(mag * _pow2(mbits - exp)) * _pow2(exp - mbits)
    r = torch.clamp(r, max=max_finite)
    rbits = r.view(torch.int32)
    r_exp = ((rbits >> 23) & 0xFF) - 127
    normal = r_exp >= emin
    subnormal_code = (r * _pow2(torch.full_like(r_exp, mbits - emin))).to(torch.int32)
    normal_code = ((r_exp + bias) << mbits) | ((rbits >> (23 - mbits)) & ((1 << mbits) - 1))
    code = torch.where(normal, normal_code, subnormal_code)
    code = code | torch.where(torch.signbit(v), 1 << (ebits + mbits), 0)
    return code.to(torch.uint8)


def encode_int8(v: Any) -> Any:
    """MXINT8 codes: clamp(rne(v * 64), -127, 127) as int8 (§1.3)."""
    import torch

    return torch.clamp(torch.round(v * 64.0), -127, 127).to(torch.int8)


def _blocks(x: Any, block: int) -> tuple[Any, int]:
    """x as f32 [rows, blocks, block] (the last axis zero padded to a multiple of ``block``) and its length."""
    import torch

    n = x.shape[-1]
    xf = x.reshape(-1, n).to(torch.float32)
    pad = -n % block
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.reshape(xf.shape[0], -1, block), n


def _finite_amax(xb: Any) -> tuple[Any, Any]:
    """(amax over the finite elements of each block, whether the block holds NaN or ±Inf)."""
    import torch

    finite = torch.isfinite(xb)
    amax = torch.where(finite, xb.abs(), 0.0).amax(dim=-1)
    return amax, ~finite.all(dim=-1)


def _rceil_byte(d: Any) -> Any:
    """§2.3 rceil: the E8M0 byte of the smallest power of two >= d (d >= 0 finite f32), capped at 254."""
    import torch

    bits = d.view(torch.int32)
    f = (bits >> 23) & 0xFF
    m = bits & 0x7FFFFF
    normal = torch.clamp(f + (m != 0).to(torch.int32), max=254)
    return torch.where(f == 0, (m > 0x400000).to(torch.int32), normal)


def _codes_out(codes: Any, x_shape: tuple[int, ...], n: int, packed: bool) -> Any:
    """[rows, blocks, block] codes -> x's shape (cut to n), FP4 packed two per byte (§1.5)."""
    import torch

    flat = codes.reshape(codes.shape[0], -1)
    if packed:
        if flat.shape[1] % 2:
            flat = torch.nn.functional.pad(flat, (0, 1))
        flat = flat[:, 0::2] | (flat[:, 1::2] << 4)
        return flat[:, : (n + 1) // 2].reshape(*x_shape[:-1], (n + 1) // 2)
    return flat[:, :n].reshape(*x_shape[:-1], n)


def mx_quantize(x: Any, limit: Any, element: str = "e4m3", rule: str = "rceil") -> tuple[Any, Any]:
    """MX along the last axis (§2): (codes, E8M0 scales [..., ⌈n/32⌉] uint8).

    ``rule`` ``rceil``: byte = rceil(fl(amax / limit)); ``floor``: byte = clamp(e(amax) - emax_elem,
    -127, 127) + 127. Elements: enc(fl(x * 2^(127 - byte))). ``limit``: :func:`limit_tensor`.
    """
    import torch

    xb, n = _blocks(x, MX_BLOCK)
    amax, bad = _finite_amax(xb)
    if rule == "rceil":
        byte = _rceil_byte(amax / limit)
    elif rule == "floor":
        emax = 0 if element == "int8" else FP_ELEMENTS[element][4]
        e = ((amax.view(torch.int32) >> 23) & 0xFF) - 127
        byte = torch.clamp(e - emax, -127, 127) + 127
    else:
        raise ValueError(f"rule {rule!r}: rceil or floor")
    v = xb * _pow2(127 - byte).unsqueeze(-1)
    v = torch.where(bad.unsqueeze(-1), 0.0, v)
    codes = encode_int8(v) if element == "int8" else encode_fp(v, element)
    scales = torch.where(bad, 0xFF, byte).to(torch.uint8)
    out_codes = _codes_out(codes, tuple(x.shape), n, element == "e2m1")
    return out_codes, scales.reshape(*x.shape[:-1], -1)


def fp8_block_quantize(x: Any, limit: Any, scale_format: str = "f32") -> tuple[Any, Any]:
    """FP8 e4m3 in 1x128 blocks along the last axis (§4.2, amax floor 0): (codes uint8, scales).

    ``f32`` (``div``): s = 1 if amax = 0 else fl(amax / limit), v = fl(x / s), scales f32 [rows,
    ⌈n/128⌉]; ``ue8m0``: byte = clamp(rceil(fl(amax / limit)), 1, 254), 127 if amax = 0,
    v = x * 2^(127 - byte), scales uint8. Non-finite blocks: NaN / 0xFF, codes 0.
    """
    import torch

    xb, n = _blocks(x, FP8_BLOCK)
    amax, bad = _finite_amax(xb)
    if scale_format == "f32":
        s = torch.where(amax == 0, 1.0, amax / limit)
        v = xb / s.unsqueeze(-1)
        scales = torch.where(bad, float("nan"), s)
    elif scale_format == "ue8m0":
        byte = torch.where(amax == 0, 127, torch.clamp(_rceil_byte(amax / limit), 1, 254))
        v = xb * _pow2(127 - byte).unsqueeze(-1)
        scales = torch.where(bad, 0xFF, byte).to(torch.uint8)
    else:
        raise ValueError(f"scale_format {scale_format!r}: f32 or ue8m0")
    v = torch.where(bad.unsqueeze(-1), 0.0, v)
    return _codes_out(encode_fp(v, "e4m3"), tuple(x.shape), n, False), scales


def to_blocked(scales: Any) -> Any:
    """The cuBLAS / CUTLASS 128x4 layout (§5) of the byte scale matrix [R, C], flat, zero padded."""
    import torch

    r, c = scales.shape
    rp, cp = -(-r // 128) * 128, -(-c // 4) * 4
    padded = torch.nn.functional.pad(scales, (0, cp - c, 0, rp - r))
    return padded.reshape(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)


def col_major_tma_aligned(scales: Any) -> Any:
    """DeepGEMM's column-major TMA-aligned buffer (§4.3) of f32 scales [R, C]: [C, align(R, 4)], zero padded."""
    import torch

    r = scales.shape[0]
    return torch.nn.functional.pad(scales.t(), (0, -r % 4)).contiguous()


def packed_ue8m0(scales: Any) -> Any:
    """DeepGEMM's packed UE8M0 layout (§4.3) of byte scales [R, C]: four bytes per little-endian
    int32 (group 4w + j in byte j of word w), MN-major TMA-aligned: int32 [⌈C/4⌉, align(R, 4)]."""
    import torch

    r, c = scales.shape
    words = torch.nn.functional.pad(scales, (0, -c % 4)).contiguous().view(torch.int32)
    return torch.nn.functional.pad(words.t(), (0, -r % 4)).contiguous()


__all__ = [
    "FP_ELEMENTS",
    "col_major_tma_aligned",
    "encode_fp",
    "encode_int8",
    "fp8_block_quantize",
    "limit_tensor",
    "max_element",
    "mx_quantize",
    "packed_ue8m0",
    "to_blocked",
]
