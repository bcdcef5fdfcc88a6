// qp_block_scaled.cuh: the element encoders and scale rules of the block-scaled formats
// (MX, FP8 blocks), written as data: an element is its bit layout, a rule is an enum value.
//
// Every step is one IEEE f32 operation in the order of the microscaling contract; inputs of a
// block are finite whenever an encoder runs (a block holding NaN or +-Inf stores the NaN scale and
// zero codes instead), so no encoder has a NaN case.
#pragma once
#include "qp_elements.cuh"

namespace qp {

// ---- elements: sign, EBITS exponent bits, MBITS mantissa bits, largest finite code MAX_CODE ----
// enc(v): |v| rounded to the element grid with round-half-to-even (subnormals included), results
// past the largest finite value saturate to it, the sign bit is v's (negative zero stays negative).
template <int EBITS, int MBITS, u32 MAX_CODE> struct MiniFloat {
  static const int bits = 1 + EBITS + MBITS;
  static const int bias = (1 << (EBITS - 1)) - 1;
  // f32 bits of the largest finite value and of the smallest normal.
  static const u32 max_bits = (((MAX_CODE >> MBITS) + 127u - bias) << 23) | ((MAX_CODE & ((1u << MBITS) - 1u)) << (23 - MBITS));
  static const u32 min_normal_bits = (u32)(128 - bias) << 23;

  // One rounding add for every range: |v| (clamped to the largest finite, which saturates) plus
  // M = 2^(e + 23 - MBITS), e the exponent of |v| (at least the smallest normal's), rounds |v| to
  // its grid step with ties to even and leaves the step count in M's low bits; the exponent's
  // distance from the smallest normal, times 2^MBITS, completes the code.
  static __device__ __forceinline__ u32 encode(float v) {
    const u32 ux = __float_as_uint(v);
    const u32 ua = min(ux & 0x7FFFFFFFu, max_bits);
    const u32 exponent = max(ua, min_normal_bits) & 0x7F800000u;
    const u32 magic = exponent + ((u32)(23 - MBITS) << 23);
    const u32 steps = __float_as_uint(__fadd_rn(__uint_as_float(ua), __uint_as_float(magic))) - magic;
    return ((ux >> 31) << (EBITS + MBITS)) | (steps + ((exponent - min_normal_bits) >> (23 - MBITS)));
  }
};

typedef MiniFloat<4, 3, 0x7Eu> E4M3Bits;  // max 448
typedef MiniFloat<5, 2, 0x7Bu> E5M2Bits;  // max 57344
typedef MiniFloat<2, 3, 0x1Fu> E2M3Bits;  // FP6, max 7.5
typedef MiniFloat<3, 2, 0x1Fu> E3M2Bits;  // FP6, max 28
typedef MiniFloat<2, 1, 0x7u> E2M1Bits;   // FP4, max 6

// Element tags of the block-scaled kernels (name expressions); each names its encoder, the
// largest finite value (f32 bits), emax_elem, the mantissa width of the `even` rule, and the
// codes per byte.
struct mx_e4m3 {};
struct mx_e5m2 {};
struct mx_e2m3 {};
struct mx_e3m2 {};
struct mx_e2m1 {};
struct mx_int8 {};
struct nv_e2m1 {};  // NVFP4's elements: e2m1 under an E4M3 block scale (no power-of-two factor)

template <class T> struct BlockElement;

template <> struct BlockElement<mx_e4m3> {
  static const u32 max_bits = E4M3Bits::max_bits;
  static const int emax = 8, mbits = 3, per_byte = 1;
  // Two codes at once: cvt.rn.satfinite on sm_89 and later (the same RNE and saturation).
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return pair;
#else
    return E4M3Bits::encode(lo) | (E4M3Bits::encode(hi) << 8);
#endif
  }
};

template <> struct BlockElement<mx_e5m2> {
  static const u32 max_bits = E5M2Bits::max_bits;
  static const int emax = 15, mbits = 2, per_byte = 1;
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
    u16 pair;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return pair;
#else
    return E5M2Bits::encode(lo) | (E5M2Bits::encode(hi) << 8);
#endif
  }
};

template <> struct BlockElement<mx_e2m3> {
  static const u32 max_bits = E2M3Bits::max_bits;
  static const int emax = 2, mbits = 3, per_byte = 1;
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
    return E2M3Bits::encode(lo) | (E2M3Bits::encode(hi) << 8);
  }
};

template <> struct BlockElement<mx_e3m2> {
  static const u32 max_bits = E3M2Bits::max_bits;
  static const int emax = 4, mbits = 2, per_byte = 1;
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
    return E3M2Bits::encode(lo) | (E3M2Bits::encode(hi) << 8);
  }
};

// FP4 codes in 16-bit lanes (sm_90 and later): a word of two lanes gives the codes of both, lane
// 0's in bits 0-3 and lane 1's in bits 16-19; two such words join into 16 bits of codes.
//
// fp4_lane_codes<BF16>(v): v holds two values of the lane format (bfloat16, or float16) already
// scaled, each exact or far below every grid point; |v| is clamped to 6 (saturation), and the
// rounding add of MiniFloat::encode runs in the lanes: M = 2^(e + mantissa bits - 1), e the lane's
// exponent (at least 1.0's), rounds |v| to its E2M1 step with ties to even.
template <bool BF16> __device__ __forceinline__ u32 fp4_lane_codes(u32 v) {
#if __CUDA_ARCH__ >= 900
  constexpr u32 six = BF16 ? 0x40C040C0u : 0x46004600u, one = BF16 ? 0x3F803F80u : 0x3C003C00u;
  constexpr u32 exp_mask = BF16 ? 0x7F807F80u : 0x7C007C00u, ulp = BF16 ? 0x03000300u : 0x24002400u;
  constexpr int mant = BF16 ? 6 : 9;  // lane mantissa bits - 1: the code step between exponents
  u32 a, e, sum;
  asm("min.u16x2 %0, %1, %2;" : "=r"(a) : "r"(v & 0x7FFF7FFFu), "r"(six));
  asm("max.u16x2 %0, %1, %2;" : "=r"(e) : "r"(a), "r"(one));
  e &= exp_mask;
  const u32 magic = e + ulp;
  if (BF16)
    asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(sum) : "r"(a), "r"(magic));
  else
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(sum) : "r"(a), "r"(magic));
  return (sum - magic) + ((e - one) >> mant) + ((v & 0x80008000u) >> 12);
#else
  return 0;
#endif
}

#if __CUDA_ARCH__ >= 900
static const bool kFp4Lanes = true;
#else
static const bool kFp4Lanes = false;
#endif

// Two lane-code words (elements 0, 1 in a; 2, 3 in b) to 16 bits of codes, element 0 in bits 0-3.
__device__ __forceinline__ u32 fp4_join(u32 a, u32 b) {
  const u32 t = a | (b << 8);  // codes 0, 2, 1, 3 in bits 0, 8, 16, 24
  return (t | (t >> 12)) & 0xFFFFu;
}

// FP4: two codes per byte, element 2i in bits 0-3.
template <> struct BlockElement<mx_e2m1> {
  static const u32 max_bits = E2M1Bits::max_bits;
  static const int emax = 2, mbits = 1, per_byte = 2;
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
    return E2M1Bits::encode(lo) | (E2M1Bits::encode(hi) << 4);
  }
};

// v rounded to odd at three mantissa bits: the bits below are cut, and the lowest kept bit is set
// when any of them was set. Rounding that to nearest at one mantissa bit (E2M1) gives what rounding
// v itself would: round-to-odd with two or more extra bits leaves no double-rounding error.
__device__ __forceinline__ float round_odd_m3(float v) {
  const u32 b = __float_as_uint(v);
  return __uint_as_float((b | ((b & 0xFFFFFu) + 0xFFFFFu)) & 0xFFF00000u);
}

template <> struct BlockElement<nv_e2m1> {
  static const u32 max_bits = E2M1Bits::max_bits;
  static const int emax = 2, mbits = 1, per_byte = 2;
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
    return E2M1Bits::encode(lo) | (E2M1Bits::encode(hi) << 4);
  }
};

// MXINT8: k = clamp(rne(v * 64), -127, 127), value k / 64 (largest 127/64).
template <> struct BlockElement<mx_int8> {
  static const u32 max_bits = 0x3FFE0000u;  // 127/64
  static const int emax = 0, mbits = 6, per_byte = 1;
  // rne(v * 64) by the 1.5 * 2^23 rounding add (|v * 64| <= 2^22 after the scaling).
  static __device__ __forceinline__ u32 encode_one(float v) {
    const int k = (int)(__float_as_uint(__fadd_rn(__fmul_rn(v, 64.0f), 12582912.0f)) - 0x4B400000u);
    return (u32)max(-127, min(127, k)) & 0xFFu;
  }
  static __device__ __forceinline__ u32 encode_pair(float lo, float hi) {
    return encode_one(lo) | (encode_one(hi) << 8);
  }
};

// ---- scale rules ----
// MX rules give an E8M0 byte; the FP8 block rules an f32 scale or a UE8M0 byte.
enum ScaleRule {
  kMxRceil = 0,
  kMxFloor = 1,
  kMxCeil = 2,
  kMxEven = 3,
  kBlockF32Div = 4,
  kBlockF32MulRcp = 5,
  kBlockF32Enc = 6,
  kBlockUe8m0 = 7,
  kNvfp4Te = 8,
};

// NVFP4's tensor-level factors (te order): from the tensor amax (finite, >= 0; none: one level),
// S_enc = 1 if amax == 0 else min(fl(2688 / amax), FLT_MAX) (1 again if that is 0), S_dec =
// fl(1 / S_enc), and the block scale's multiplier m = fl(S_enc * fl(1/6)).
struct Nvfp4Tensor {
  float s_dec, m;
};

__device__ __forceinline__ Nvfp4Tensor nvfp4_tensor(const float* amax_ptr) {
  const float sixth = __uint_as_float(0x3E2AAAABu);
  Nvfp4Tensor t;
  float s_enc = 1.0f;
  if (amax_ptr != nullptr) {
    const float amax = *amax_ptr;
    if (amax != 0.0f) s_enc = fminf(__fdiv_rn(2688.0f, amax), __uint_as_float(0x7F7FFFFFu));
    if (s_enc == 0.0f) s_enc = 1.0f;
  }
  t.s_dec = __fdiv_rn(1.0f, s_enc);
  t.m = __fmul_rn(s_enc, sixth);
  return t;
}

// The E8M0 byte of fl(d) rounded up to a power of two (RCEIL), for finite d >= 0.
__device__ __forceinline__ int e8m0_rceil(float d) {
  const u32 bits = __float_as_uint(d);
  const u32 f = bits >> 23, m = bits & 0x7FFFFFu;
  if (f == 0) return m > 0x400000u ? 1 : 0;
  return min((int)(f + (m != 0)), 254);
}

// 2^(127 - s): the exact reciprocal of the E8M0 scale byte s in [0, 254] (s = 254: 2^-127, subnormal).
__device__ __forceinline__ float e8m0_reciprocal(int s) {
  return s == 254 ? __uint_as_float(0x00400000u) : __uint_as_float((u32)(254 - s) << 23);
}

// The scale of one block: what is stored (a byte, or f32 bits) and what every element is
// multiplied by (or, for kBlockF32Div, divided by).
struct BlockScale {
  u32 stored;
  float factor;
};

// NVFP4's elements take the two-level scale (kNvfp4Te) and no other rule.
template <class E> struct TwoLevelScale {
  static const bool value = false;
};
template <> struct TwoLevelScale<BlockElement<nv_e2m1> > {
  static const bool value = true;
};
struct nv_e2m1_sr;  // NVFP4 with stochastic rounding (below)
template <> struct TwoLevelScale<BlockElement<nv_e2m1_sr> > {
  static const bool value = true;
};

template <class E>
__device__ __forceinline__ BlockScale block_scale(u32 amax_bits, int rule, float amax_floor, float enc_overflow,
                                                  Nvfp4Tensor nv = Nvfp4Tensor()) {
  const float max_elem = __uint_as_float(E::max_bits);
  BlockScale r;
  if (TwoLevelScale<E>::value) {
    // s = e4m3(fl(bamax * m)); every element times min(fl(1 / fl(f32(s) * S_dec)), FLT_MAX).
    const float s_raw = __fmul_rn(__uint_as_float(amax_bits), nv.m);
#if __CUDA_ARCH__ >= 890
    // The conversions in hardware (s_raw is finite or +Inf and >= 0: the same RNE and saturation).
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(s_raw));
    const u32 s = pair & 0xFFu;
    u32 halves;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"((u16)s));
    const float s_f = FloatElement<f16>::to_acc((u16)(halves & 0xFFFFu));
#else
    const u32 s = E4M3Bits::encode(s_raw);
    const float s_f = Fp8Element<e4m3>::to_f32((u8)s);
#endif
    r.stored = s;
    // fl(1 / y) is the correctly rounded reciprocal: __frcp_rn.
    r.factor = fminf(__frcp_rn(__fmul_rn(s_f, nv.s_dec)), __uint_as_float(0x7F7FFFFFu));
    return r;
  }
  if (rule <= kMxEven) {
    int e;
    if (rule == kMxRceil) {
      const int s = e8m0_rceil(__fdiv_rn(__uint_as_float(amax_bits), max_elem));
      r.stored = (u32)s;
      r.factor = e8m0_reciprocal(s);
      return r;
    } else if (rule == kMxEven) {
      const u32 rounded = (amax_bits + (1u << (22 - E::mbits))) & 0x7F800000u;
      e = (int)(rounded >> 23) - 127;
    } else {
      e = (int)(amax_bits >> 23) - 127 + ((rule == kMxCeil && (amax_bits & 0x7FFFFFu)) ? 1 : 0);
    }
    const int s = max(-127, min(127, e - E::emax)) + 127;
    r.stored = (u32)s;
    r.factor = e8m0_reciprocal(s);
    return r;
  }
  const float a = fmaxf(__uint_as_float(amax_bits), amax_floor);
  if (rule == kBlockUe8m0) {
    const int s = a == 0.0f ? 127 : max(1, min(254, e8m0_rceil(__fdiv_rn(a, max_elem))));
    r.stored = (u32)s;
    r.factor = e8m0_reciprocal(s);
  } else if (rule == kBlockF32Enc) {
    float e = a == 0.0f ? 1.0f : __fdiv_rn(max_elem, a);
    if (__float_as_uint(e) == 0x7F800000u) e = enc_overflow;
    r.factor = e;
    r.stored = __float_as_uint(__fdiv_rn(1.0f, e));
  } else {
    const float s = a == 0.0f ? 1.0f : __fdiv_rn(a, max_elem);
    r.stored = __float_as_uint(s);
    r.factor = rule == kBlockF32MulRcp ? __fdiv_rn(1.0f, s) : s;  // kBlockF32Div divides by s
  }
  return r;
}

// The NaN scale of a block holding NaN or +-Inf: E8M0 / UE8M0 0xFF, E4M3 0x7F, f32 quiet NaN.
__device__ __forceinline__ u32 nonfinite_scale(int rule) {
  if (rule == kNvfp4Te) return 0x7Fu;
  return (rule >= kBlockF32Div && rule <= kBlockF32Enc) ? 0x7FC00000u : 0xFFu;
}

// ---- scale layouts: where the scale of block (r, c) of an [R, C] scale matrix goes ----
// kCompact: row-major [R, C]. kBlocked128x4: the cuBLAS / CUTLASS tiles of 128 x 4 (512 bytes each,
// row of tiles major; dim = ceil(C/4) tiles per row). kColumnMajor: [C][dim] with dim = align(R, 4)
// (DeepGEMM's TMA-aligned layout). kPackedUe8m0: bytes of four consecutive c in one int32, words
// [ceil(C/4)][dim] column-major with dim = align(R, 4). Offsets are in scale elements (bytes, or
// f32 for the f32 rules in the compact and column-major layouts).
enum ScaleLayout { kCompact = 0, kBlocked128x4 = 1, kColumnMajor = 2, kPackedUe8m0 = 3 };

__device__ __forceinline__ i64 scale_offset(int layout, i64 r, i64 c, i64 cols, i64 dim) {
  if (layout == kCompact) return r * cols + c;
  if (layout == kBlocked128x4)
    return ((r >> 7) * dim + (c >> 2)) * 512 + (r & 31) * 16 + ((r & 127) >> 5) * 4 + (c & 3);
  if (layout == kColumnMajor) return c * dim + r;
  return ((c >> 2) * dim + r) * 4 + (c & 3);
}

}  // namespace qp

// ---- shared by the 1-D block kernels (block_scaled.cu), the 2-D tile and fused transpose kernels
// (block_scaled_tiles.cu) ----
namespace qp {

// Input words: a run of elements held as 32-bit words in element order (two 16-bit elements per
// word, element 2i low), and |x| keys that order like |x| (sign cleared; NaN and Inf above every
// finite value). key_bits turns a key into the f32 bits of |x|.
template <class In> struct InputWords;

template <> struct InputWords<bf16> {
  static const int vec = 8, bytes = 2;
  static __device__ __forceinline__ u32 word_key(u32 w) {
    const u32 m = w & 0x7FFF7FFFu;
    return max(m & 0xFFFFu, m >> 16);
  }
  static __device__ __forceinline__ u32 half_key(u32 w, int h) { return (w >> (16 * h)) & 0x7FFFu; }
  static __device__ __forceinline__ u32 key_bits(u32 key) { return key << 16; }
  static __device__ __forceinline__ float element(const u32* w, int k) {
    return __uint_as_float(k & 1 ? (w[k / 2] & 0xFFFF0000u) : (w[k / 2] << 16));
  }
  static __device__ __forceinline__ void put(u32* w, int k, const void* p) {
    const u32 h = *static_cast<const u16*>(p);
    w[k / 2] |= k & 1 ? h << 16 : h;
  }
};

template <> struct InputWords<f16> {
  static const int vec = 8, bytes = 2;
  static __device__ __forceinline__ u32 word_key(u32 w) {
    const u32 m = w & 0x7FFF7FFFu;
    return max(m & 0xFFFFu, m >> 16);
  }
  static __device__ __forceinline__ u32 half_key(u32 w, int h) { return (w >> (16 * h)) & 0x7FFFu; }
  static __device__ __forceinline__ u32 key_bits(u32 key) {
    return __float_as_uint(FloatElement<f16>::to_acc((u16)key));
  }
  static __device__ __forceinline__ float element(const u32* w, int k) {
    return FloatElement<f16>::to_acc((u16)(k & 1 ? w[k / 2] >> 16 : w[k / 2] & 0xFFFFu));
  }
  static __device__ __forceinline__ void put(u32* w, int k, const void* p) {
    const u32 h = *static_cast<const u16*>(p);
    w[k / 2] |= k & 1 ? h << 16 : h;
  }
};

template <> struct InputWords<f32> {
  static const int vec = 4, bytes = 4;
  static __device__ __forceinline__ u32 word_key(u32 w) { return w & 0x7FFFFFFFu; }
  static __device__ __forceinline__ u32 half_key(u32 w, int) { return w & 0x7FFFFFFFu; }
  static __device__ __forceinline__ u32 key_bits(u32 key) { return key; }
  static __device__ __forceinline__ float element(const u32* w, int k) { return __uint_as_float(w[k]); }
  static __device__ __forceinline__ void put(u32* w, int k, const void* p) { w[k] = *static_cast<const u32*>(p); }
};

// The |x| keys of two 16-bit elements in one word, both lanes at once (the larger per lane over
// words by __vmaxu2): the sign bits cleared.
__device__ __forceinline__ u32 lane_keys(u32 w) { return w & 0x7FFF7FFFu; }

// The largest |x| key over N input words (InputWords::word_key of each, combined). 16-bit inputs
// take two maxima per lane over the raw words, unsigned and signed: a negative element's word
// (sign bit set) is above every nonnegative one unsigned and below it signed, so the unsigned
// maximum holds the largest negative magnitude (or the largest nonnegative one when none is
// negative) and the signed one the largest nonnegative (or the largest negative magnitude when
// none is nonnegative); the key is the larger of the two, sign cleared, over both lanes. No mask
// per word, three-input maxima.
template <class In, int N> __device__ __forceinline__ u32 run_key(const u32* w) {
  if constexpr (In::bytes == 2) {
    u32 hi = w[0], lo = w[0];
#pragma unroll
    for (int i = 1; i < N; ++i) {
      hi = __vmaxu2(hi, w[i]);
      lo = __vmaxs2(lo, w[i]);
    }
    const u32 lanes = __vmaxu2(lane_keys(hi), lane_keys(lo));
    return max(lanes & 0xFFFFu, lanes >> 16);
  } else {
    u32 key = In::word_key(w[0]);
#pragma unroll
    for (int i = 1; i < N; ++i) key = max(key, In::word_key(w[i]));
    return key;
  }
}

// ---- x / s for many x over one divisor (the FP8 `div` rule) ----
// divide_rn(x, s, y) == __fdiv_rn(x, s) for s >= kDivideFastMin, y = __frcp_rn(s) (fl(1 / s)):
// q = fl(x * y) is within 1.5 ulp of x / s; one FMA correction q + (x - s * q) * y makes it
// faithful, and a second one rounds it correctly (Markstein's theorem: y within half an ulp of
// 1 / s, q faithful, the remainder x - s * q exact, which holds while exponent(s) + exponent(q) >=
// -103). With s >= 2^-83 that covers every |x / s| >= 2^-20; a smaller quotient stays below 2^-17
// and encodes to a signed zero in every FP8 element whatever its last bits. The sign is x's
// (s > 0), also for a zero quotient.
static const float kDivideFastMin = 0x1p-83f;

__device__ __forceinline__ float divide_rn(float x, float s, float y) {
  float q = __fmul_rn(x, y);
  q = __fmaf_rn(__fmaf_rn(-s, q, x), y, q);
  q = __fmaf_rn(__fmaf_rn(-s, q, x), y, q);
  return __uint_as_float((__float_as_uint(q) & 0x7FFFFFFFu) | (__float_as_uint(x) & 0x80000000u));
}

// N code bytes (N = 2, 4, 8 or a multiple of 16) from words to dst, aligned to min(N, 16).
template <int N> __device__ __forceinline__ void store_code_run(u8* dst, const u32* w) {
  if constexpr (N % 16 == 0) {
#pragma unroll
    for (int i = 0; i < N / 16; ++i)
      reinterpret_cast<uint4*>(dst)[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  } else if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else if constexpr (N == 4) {
    *reinterpret_cast<u32*>(dst) = w[0];
  } else {
    *reinterpret_cast<u16*>(dst) = (u16)w[0];
  }
}

// The scale of a block from the f32 bits of its amax (NaN / Inf bits: a non-finite block, which
// stores the NaN scale and whose factor is unused: its codes are 0).
template <class E>
__device__ __forceinline__ BlockScale block_scale_or_nan(u32 amax_bits, int rule, float amax_floor, float enc_overflow) {
  if (amax_bits >= 0x7F800000u) {
    BlockScale r;
    r.stored = nonfinite_scale(rule);
    r.factor = 0.0f;
    return r;
  }
  return block_scale<E>(amax_bits, rule, amax_floor, enc_overflow);
}

// Zero bytes (or f32 zeros) at every position of the padded scale grid [pad_rows, pad_cols]
// outside the scale matrix [rows, cols]; this thread takes positions first, first + stride, ...
__device__ __forceinline__ void zero_scale_padding(void* scales, bool f32_scale, int layout, i64 rows, i64 cols,
                                                   i64 dim, i64 pad_rows, i64 pad_cols, i64 first, i64 stride) {
  const i64 extra_rows = (pad_rows - rows) * pad_cols;
  const i64 pads = extra_rows + rows * (pad_cols - cols);
  for (i64 p = first; p < pads; p += stride) {
    i64 r, c;
    if (p < extra_rows) {
      r = rows + p / pad_cols;
      c = p - (r - rows) * pad_cols;
    } else {
      const i64 q = p - extra_rows, width = pad_cols - cols;
      r = q / width;
      c = cols + (q - r * width);
    }
    const i64 off = scale_offset(layout, r, c, cols, dim);
    if (f32_scale)
      static_cast<u32*>(scales)[off] = 0u;
    else
      static_cast<u8*>(scales)[off] = 0;
  }
}

}  // namespace qp

namespace qp {

// ---- decoding: a stored code to its f32 value (FP4 from one nibble) ----
template <int EBITS, int MBITS, bool SPECIALS_E4M3, bool SPECIALS_IEEE>
__device__ __forceinline__ float decode_minifloat(u32 code) {
  const int bias = (1 << (EBITS - 1)) - 1;
  const u32 sign = ((code >> (EBITS + MBITS)) & 1u) << 31;
  const u32 e = (code >> MBITS) & ((1u << EBITS) - 1u), m = code & ((1u << MBITS) - 1u);
  if (SPECIALS_E4M3 && e == 15u && m == 7u) return __uint_as_float(sign | 0x7FC00000u);
  if (SPECIALS_IEEE && e == (1u << EBITS) - 1u) return __uint_as_float(sign | (m ? 0x7FC00000u : 0x7F800000u));
  if (e == 0) return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)m, __uint_as_float((u32)(128 - bias - MBITS) << 23))));
  return __uint_as_float(sign | ((e + 127u - bias) << 23) | (m << (23 - MBITS)));
}

// The quiet NaN a dequantized NaN is stored as (the f32 0x7FC00000 rounded to the output format,
// as the reference writes it), whatever NaN the arithmetic produced (the GPU's is 0x7FFFFFFF).
template <class Out> __device__ __forceinline__ typename FloatElement<Out>::storage quiet_nan_storage();
template <> __device__ __forceinline__ u16 quiet_nan_storage<f16>() { return 0x7E00u; }
template <> __device__ __forceinline__ u16 quiet_nan_storage<bf16>() { return 0x7FC0u; }
template <> __device__ __forceinline__ float quiet_nan_storage<f32>() { return __uint_as_float(0x7FC00000u); }

template <class T> struct BlockDecode;
template <> struct BlockDecode<mx_e4m3> {
  static __device__ __forceinline__ float value(u32 c) { return decode_minifloat<4, 3, true, false>(c); }
};
template <> struct BlockDecode<mx_e5m2> {
  static __device__ __forceinline__ float value(u32 c) { return decode_minifloat<5, 2, false, true>(c); }
};
template <> struct BlockDecode<mx_e2m3> {
  static __device__ __forceinline__ float value(u32 c) { return decode_minifloat<2, 3, false, false>(c); }
};
template <> struct BlockDecode<mx_e3m2> {
  static __device__ __forceinline__ float value(u32 c) { return decode_minifloat<3, 2, false, false>(c); }
};
template <> struct BlockDecode<mx_e2m1> {
  static __device__ __forceinline__ float value(u32 c) { return decode_minifloat<2, 1, false, false>(c); }
};
template <> struct BlockDecode<nv_e2m1> {
  static __device__ __forceinline__ float value(u32 c) { return decode_minifloat<2, 1, false, false>(c); }
};
template <> struct BlockDecode<mx_int8> {
  static __device__ __forceinline__ float value(u32 c) { return __fmul_rn((float)(int)(signed char)c, 0.015625f); }
};

// What a stored scale means: E8M0 / UE8M0 bytes (2^(s - 127), 0xFF NaN), f32, or NVFP4's E4M3
// block scale (times S_dec after the exact first product).
enum ScaleKind { kScaleE8m0 = 0, kScaleF32 = 1, kScaleE4m3 = 2 };

__device__ __forceinline__ float e8m0_value(u32 s) {
  return s == 0xFFu ? __uint_as_float(0x7FC00000u) : (s == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(s << 23));
}

}  // namespace qp

// ---- NVFP4 with stochastic rounding (MICROSCALING section 1.6) ----
#include "qp_philox.cuh"

namespace qp {

// NVFP4's elements rounded stochastically: the same format as nv_e2m1 (e2m1 under an E4M3 block
// scale), codes from the Philox word of each element instead of RNE.
struct nv_e2m1_sr {};

template <> struct BlockElement<nv_e2m1_sr> {
  static const u32 max_bits = E2M1Bits::max_bits;
  static const int emax = 2, mbits = 1, per_byte = 2;
};

// Whether an element tag rounds stochastically (the encode loop's stochastic branch).
template <class T> struct StochasticElement {
  static const bool value = false;
};
template <> struct StochasticElement<nv_e2m1_sr> {
  static const bool value = true;
};

// NVFP4-SR's block factors by E4M3 scale byte s: min(fl(1 / fl(f32(s) * S_dec)), FLT_MAX), the
// two-level scale's (block_scale), for every byte below 0x7F (the NaN byte is never a finite
// block's), filled by each thread block at launch (S_dec is the launch's): a block's scale is then
// a conversion and a shared-memory load.
__shared__ float nvfp4_sr_factors[128];

__device__ __forceinline__ void nvfp4_sr_fill_factors(const Nvfp4Tensor& nv) {
  for (int i = threadIdx.x; i < 128; i += blockDim.x)
    nvfp4_sr_factors[i] =
        fminf(__frcp_rn(__fmul_rn(Fp8Element<e4m3>::to_f32((u8)i), nv.s_dec)), __uint_as_float(0x7F7FFFFFu));
  __syncthreads();
}

// The two-level scale (block_scale's kNvfp4Te case, bit for bit) with its factor from the table.
template <>
__device__ __forceinline__ BlockScale block_scale<BlockElement<nv_e2m1_sr> >(u32 amax_bits, int, float, float,
                                                                            Nvfp4Tensor nv) {
  const float s_raw = __fmul_rn(__uint_as_float(amax_bits), nv.m);
#if __CUDA_ARCH__ >= 890
  u16 pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(s_raw));
  const u32 s = pair & 0xFFu;
#else
  const u32 s = E4M3Bits::encode(s_raw);
#endif
  BlockScale r;
  r.stored = s;
  r.factor = nvfp4_sr_factors[s];
  return r;
}

// The §1.6 nibble of a finite scaled value v from the complement nw = ~word of its Philox word,
// in bits 28-31 of the result (sign bit 31 = v's, magnitude code in bits 28-30; the bits below are
// not part of it). With a = min(|v|, 6), E' = max(exponent of a, 0), s = 2^(E'-25) (the grid step
// of a's binade, 0.5 below 2, times 2^-24) and U' = nw >> 8 = 2^24 - 1 - (word >> 8): u < frac
// holds iff the grid point above a is at most ceil_s(a) + U' * s (ceil_s: up to a multiple of s,
// which a already is from 2^-2 up), so the code is the count of positive grid points <= that sum.
// In f32 at scale 2^-124, where s * 2^-124 = 2^(E'-149) makes U' * s the subnormal of bits U'
// times 2^E':
//   b = fl_ru(a * 2^-124)            ceil_s(a) * 2^-124: below 2^-125 the floats are the multiples
//                                    of 2^-149 (subnormals, first binade); exact from a = 2^-2 up
//   y = fl_rd(U' * 2^(E'-149) + b)   one fma; rounding down keeps "grid point <= y" (grid points
//                                    are floats)
//   d = fl_rz(y / 4)                 the same count at scale 2^-126, where the E2M1 grid is every
//                                    f32 whose low 22 bits are zero, subnormals included
// so the code is bits(d) >> 22, at most 7 (a <= 6 keeps y below 8 * 2^-124), shifted to bit 28.
__device__ __forceinline__ u32 nvfp4_sr_nibble(float x, float factor, u32 nw) {
  const float v = __fmul_rn(x, factor);
  const float a = fminf(fabsf(v), 6.0f);
  const float b = __fmul_ru(a, __uint_as_float(0x01800000u));                              // 2^-124
  const float step = __uint_as_float(max(__float_as_uint(a), 0x3F800000u) & 0x7F800000u);  // 2^E'
  const float y = __fmaf_rd(__uint_as_float(__umulhi(nw, 1u << 24)), step, b);             // nw >> 8
  const float d = __fmul_rz(y, 0.25f);
  // v's sign (factor > 0) as the bits of x * 0 (x is finite in a finite block; v may be +-Inf).
  u32 t;
  asm("mad.lo.u32 %0, %1, 64, %2;" : "=r"(t) : "r"(__float_as_uint(d)), "r"(__float_as_uint(__fmul_rn(x, 0.0f))));
  return t;
}

// Philox4x32-10 (shared/SPEC.md section 4) for this kernel's draws, returning each word's
// complement (what nvfp4_sr_nibble takes). The round keys and round 0's offset terms are the
// launch's; draw(j) is the full generator. A slot of DRAWS consecutive draws from j0, a multiple
// of DRAWS (a power of two), shares j's high word, so round 0's counter word 0 and round 1's
// product of it are the slot's (slot()), and each draw of it (draw_in_slot) starts from its
// counter's low word: the same operations bit for bit, the constant ones done once.
struct NvSrPhilox {
  static const u32 kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  u32 ka[10], kb[10];  // round r's keys: seed halves + r * (0x9E3779B9, 0xBB67AE85); round 9's complemented
  u32 lo1_0, x0, x2;   // round 0: lo(M1 * offset lo), hi(M1 * offset lo) ^ k0, offset hi ^ k1
  u32 k1a;             // round 1: lo1_0 ^ ka[1]

  struct Slot {
    u32 k1b, k2b;  // round 1: hi(M0 * c0) ^ kb[1]; round 2: lo(M0 * c0) ^ kb[2] (c0 = x0 ^ j_hi)
  };

  // hi and lo of a * b in one instruction.
  static __device__ __forceinline__ void mul_wide(u32 a, u32 b, u32& hi, u32& lo) {
    asm("{\n\t.reg .b64 p;\n\tmul.wide.u32 p, %2, %3;\n\tmov.b64 {%1, %0}, p;\n\t}" : "=r"(hi), "=r"(lo) : "r"(a), "r"(b));
  }

  __device__ __forceinline__ NvSrPhilox(u64 seed, u64 offset) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
      ka[r] = (u32)seed + (u32)r * 0x9E3779B9u;
      kb[r] = (u32)(seed >> 32) + (u32)r * 0xBB67AE85u;
    }
    lo1_0 = kM1 * (u32)offset;
    x0 = __umulhi(kM1, (u32)offset) ^ ka[0];
    x2 = (u32)(offset >> 32) ^ kb[0];
    k1a = lo1_0 ^ ka[1];
    ka[9] = ~ka[9];  // round 9 writes words 0 and 2 complemented
    kb[9] = ~kb[9];
  }

  __device__ __forceinline__ Slot slot(u32 j_hi) const {
    u32 hi, lo;
    mul_wide(kM0, x0 ^ j_hi, hi, lo);
    Slot s;
    s.k1b = hi ^ kb[1];
    s.k2b = lo ^ kb[2];
    return s;
  }

  // Rounds 2..9 from the state after round 1 (c3 after round 1 folded into k2b); the words out
  // complemented.
  __device__ __forceinline__ void rounds_2_9(u32 c0, u32 c1, u32 c2, u32 k2b, u32 (&nw)[4]) const {
    u32 h0, l0, h1, l1;
    mul_wide(kM0, c0, h0, l0);
    mul_wide(kM1, c2, h1, l1);
    c0 = h1 ^ c1 ^ ka[2];
    c1 = l1;
    c2 = h0 ^ k2b;
    u32 c3 = l0;
#pragma unroll
    for (int r = 3; r < 9; ++r) {
      mul_wide(kM0, c0, h0, l0);
      mul_wide(kM1, c2, h1, l1);
      c0 = h1 ^ c1 ^ ka[r];
      c1 = l1;
      c2 = h0 ^ c3 ^ kb[r];
      c3 = l0;
    }
    // Round 9: words 0 and 2 complemented by the complemented keys; words 1 and 3 are the low
    // products complemented, ~lo(M * c) = lo(c * (2^32 - M) + 2^32 - 1): one multiply-add each
    // beside the high product, on the multiplier rather than the logic unit (the busier one).
    nw[0] = __umulhi(kM1, c2) ^ c1 ^ ka[9];
    nw[1] = c2 * (0u - kM1) + 0xFFFFFFFFu;
    nw[2] = __umulhi(kM0, c0) ^ c3 ^ kb[9];
    nw[3] = c0 * (0u - kM0) + 0xFFFFFFFFu;
  }

  // Draw j_lo of a slot (j's high word given to slot()).
  __device__ __forceinline__ void draw_in_slot(const Slot& s, u32 j_lo, u32 (&nw)[4]) const {
    u32 h0, l0, h1, l1;
    mul_wide(kM0, j_lo, h0, l0);       // round 0: c2 = h0 ^ x2, c3 = l0
    mul_wide(kM1, h0 ^ x2, h1, l1);    // round 1
    rounds_2_9(h1 ^ k1a, l1, l0 ^ s.k1b, s.k2b, nw);
  }

  // Any draw j.
  __device__ __forceinline__ void draw(u64 j, u32 (&nw)[4]) const { draw_in_slot(slot((u32)(j >> 32)), (u32)j, nw); }
};

// The packed codes (element 2i in bits 0-3 of byte i) of a thread's ELEMS elements, from the
// input words raw (In's element order), their blocks' scales s and finiteness (block k / BLOCK %
// SUB), and the Philox words of flat indices first .. first + ELEMS - 1 (element i takes word
// i % 4 of draw i / 4): code = §1.6 of fl(x * factor); a non-finite block's codes are 0. ALIGNED
// (first a multiple of ELEMS): the draws of one slot (NvSrPhilox::slot); otherwise ELEMS / 4 + 1
// draws shifted by first % 4. Each code word takes its eight nibbles highest first (a funnel shift
// of four bits per element).
template <class In, int ELEMS, int BLOCK, int SUB, bool ALIGNED, int CODE_WORDS>
__device__ __forceinline__ void nvfp4_stochastic_codes(const u32* raw, const BlockScale* s, const bool* finite,
                                                       u64 first, const NvSrPhilox& rng, u32 (&packed)[CODE_WORDS]) {
  constexpr int VEC = In::vec;
  constexpr int DRAWS = ELEMS / 4;
  static_assert(ELEMS % 4 == 0 && (DRAWS & (DRAWS - 1)) == 0, "whole draws; a power-of-two slot of them");
  if constexpr (ALIGNED) {
    const u64 j0 = first >> 2;  // a multiple of DRAWS
    const NvSrPhilox::Slot slot = rng.slot((u32)(j0 >> 32));
#pragma unroll
    for (int g = DRAWS - 1; g >= 0; --g) {
      u32 nw[4];
      rng.draw_in_slot(slot, (u32)j0 + (u32)g, nw);
#pragma unroll
      for (int t = 3; t >= 0; --t) {
        const int k = 4 * g + t;
        const float x = In::element(raw + (k / VEC) * 4, k % VEC);
        packed[k / 8] = __funnelshift_l(nvfp4_sr_nibble(x, s[k / BLOCK % SUB].factor, nw[t]), packed[k / 8], 4);
      }
    }
  } else {
    const u64 j0 = first >> 2;
    const int shift = (int)(first & 3);
    u32 w[ELEMS + 4];
#pragma unroll
    for (int g = 0; g <= DRAWS; ++g) {
      u32 nw[4];
      rng.draw(j0 + g, nw);
#pragma unroll
      for (int h = 0; h < 4; ++h) w[4 * g + h] = nw[h];
    }
#pragma unroll
    for (int k = ELEMS - 1; k >= 0; --k) {
      const u32 word = shift == 0 ? w[k] : shift == 1 ? w[k + 1] : shift == 2 ? w[k + 2] : w[k + 3];
      const float x = In::element(raw + (k / VEC) * 4, k % VEC);
      packed[k / 8] = __funnelshift_l(nvfp4_sr_nibble(x, s[k / BLOCK % SUB].factor, word), packed[k / 8], 4);
    }
  }
  // A non-finite block's codes are 0 (its factor is 0: the values above were NaN or 0).
#pragma unroll
  for (int w = 0; w < CODE_WORDS; ++w)
    if (!finite[w * 8 / BLOCK % SUB]) packed[w] = 0;
}

// A Philox seed or offset kernel argument: the one-element device int64 at ptr, else value (a
// captured graph replays with the offset the caller advances on the device).
__device__ __forceinline__ u64 block_rng_word(const i64* ptr, u64 value) { return ptr ? (u64)*ptr : value; }

}  // namespace qp

// ---- the fused quantize + transpose's block factors (block_scaled_tiles.cu) ----
namespace qp {

// fl32(1 / max_elem) of the FP8 elements: 1/448 = 2^-6 / 7 and 1/57344 = 2^-13 / 7.
template <class E> struct RcpMaxBits;
template <> struct RcpMaxBits<BlockElement<mx_e4m3> > {
  static const u32 value = 0x3B124925u;
};
template <> struct RcpMaxBits<BlockElement<mx_e5m2> > {
  static const u32 value = 0x37924925u;
};

// The factor a block's elements are encoded with: x * f, or x / f for the FP8 `div` rule; f < 0
// marks a non-finite block (its codes are 0). y (div): fl(1 / f) when a division sequence over it
// is exact for the block (divide_rn; divide_rn1 for 16-bit inputs), else 0 (__fdiv_rn per element).
struct EncodeFactor {
  float f, y;
};

// x / s correctly rounded in one Markstein correction of q = fl(x * y), y = fl(1 / s): exact when x
// and the block amax a >= |x| are float16 / bfloat16 values and s = fl(a / max_elem) >= kDivideFastMin
// (every pair of 16-bit values checked against the IEEE quotient, e4m3 and e5m2 maxima, one amax
// binade per exponent class: the steps scale exactly by powers of two). The sign is x's.
__device__ __forceinline__ float divide_rn1(float x, float s, float y) {
  const float q = __fmul_rn(x, y);
  const float r = __fmaf_rn(__fmaf_rn(-s, q, x), y, q);
  return __uint_as_float((__float_as_uint(r) & 0x7FFFFFFFu) | (__float_as_uint(x) & 0x80000000u));
}

// The scale of a block (block_scale_or_nan, bit for bit) with the rule fixed at compile time
// (RULE >= 0; the rule argument is ignored) or read at run time (RULE < 0), and its encode factor.
// MX rceil takes d = fl(amax * fl(1 / max_elem)), the same byte as fl(amax / max_elem) for every
// finite amax and every fp element (MICROSCALING.md section 2.3), then the byte F + (M != 0)
// (0 for d <= 2^-127, at most 254) and the factor 2^(127 - byte) (2^-127 for byte 254) in integer
// operations. SHORT (div, 16-bit input): y only where the amax floor left the amax unchanged (the
// divisor then comes from a 16-bit value, which divide_rn1 needs).
template <class E, int RULE, bool DIVIDE, bool SHORT>
__device__ __forceinline__ BlockScale transpose_block_scale(u32 amax_bits, int rule, float amax_floor,
                                                            float enc_overflow, EncodeFactor& ef) {
  BlockScale s;
  ef.y = 0.0f;
  if constexpr (RULE == kMxRceil) {
    const u32 d = __float_as_uint(__fmul_rn(__uint_as_float(amax_bits), __uint_as_float(RcpMaxBits<E>::value)));
    const u32 byte = d <= 0x400000u ? 0u : min((d + 0x7FFFFFu) >> 23, 254u);
    s.stored = byte;
    s.factor = __uint_as_float(max((254u - byte) << 23, 0x400000u));
    if (amax_bits >= 0x7F800000u) {
      s.stored = 0xFFu;
      s.factor = -1.0f;
    }
    ef.f = s.factor;
    return s;
  } else {
    s = block_scale_or_nan<E>(amax_bits, RULE >= 0 ? RULE : rule, amax_floor, enc_overflow);
    const bool finite = amax_bits < 0x7F800000u;
    ef.f = finite ? s.factor : -1.0f;
    if (DIVIDE && finite && s.factor >= kDivideFastMin && (!SHORT || __uint_as_float(amax_bits) >= amax_floor))
      ef.y = __frcp_rn(s.factor);
    return s;
  }
}

// N consecutive elements (N a multiple of 4) to their codes, four per word little-endian, under
// factor ef (all zero for a non-finite block); element k is at(k).
template <class E, bool DIVIDE, bool SHORT, int N, class At>
__device__ __forceinline__ void encode_with_factor(At at, EncodeFactor ef, u32* out) {
  static_assert(E::per_byte == 1 && N % 4 == 0, "one code per byte, whole words");
#pragma unroll
  for (int i = 0; i < N / 4; ++i) out[i] = 0;
  if (!(ef.f >= 0.0f)) return;
  if (DIVIDE && ef.y > 0.0f) {
#pragma unroll
    for (int k = 0; k < N; k += 2) {
      const float lo = SHORT ? divide_rn1(at(k), ef.f, ef.y) : divide_rn(at(k), ef.f, ef.y);
      const float hi = SHORT ? divide_rn1(at(k + 1), ef.f, ef.y) : divide_rn(at(k + 1), ef.f, ef.y);
      out[k / 4] |= E::encode_pair(lo, hi) << (8 * (k % 4));
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; k += 2) {
    const float lo = DIVIDE ? __fdiv_rn(at(k), ef.f) : __fmul_rn(at(k), ef.f);
    const float hi = DIVIDE ? __fdiv_rn(at(k + 1), ef.f) : __fmul_rn(at(k + 1), ef.f);
    out[k / 4] |= E::encode_pair(lo, hi) << (8 * (k % 4));
  }
}

// Keys of P passes held by each of TEAM consecutive lanes (a power of two), reduced over the team
// with each lane ending up with whole maxima of its own passes: in every round the lane keeps half
// of its passes and sends the other half to its partner, so lane j of the team holds the maxima of
// passes (j / DUP) * KP + i, i < KP (KP = max(1, P / TEAM), DUP = max(1, TEAM / P) lanes per pass),
// in k[i]: P - 1 shuffles for TEAM >= P instead of P * log2(TEAM).
template <int P, int TEAM> __device__ __forceinline__ void exchange_keys(u32 (&k)[P], int lane) {
#pragma unroll
  for (int r = 0; (TEAM >> (r + 1)) > 0; ++r) {
    const int o = TEAM >> (r + 1);
    const int n = P >> r;
    if (n > 1) {
      const bool up = (lane & o) != 0;
#pragma unroll
      for (int i = 0; i < n / 2; ++i) {
        const u32 send = up ? k[i] : k[i + n / 2];
        const u32 keep = up ? k[i + n / 2] : k[i];
        k[i] = max(keep, __shfl_xor_sync(0xFFFFFFFFu, send, o));
      }
    } else {
      k[0] = max(k[0], __shfl_xor_sync(0xFFFFFFFFu, k[0], o));
    }
  }
}

}  // namespace qp
