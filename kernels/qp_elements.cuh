// qp_elements.cuh: element tags, storage types and exact conversions.
//
// Self-contained: no CUDA headers are needed, so NVRTC compiles every kernel without a
// CUDA toolkit on the machine. Conversions use PTX `cvt` (IEEE round-to-nearest-even) or
// exact bit manipulation; nothing here depends on fast-math.
#pragma once
#include "qp_tuning.cuh"

namespace qp {

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// ---- element tags (the names Python's dtype table uses in name expressions) ----
struct f16 {};
struct bf16 {};
struct f32 {};
struct f64 {};
struct s8 {};
struct u8q {};
struct s4 {};
struct u4 {};
struct e4m3 {};
struct e5m2 {};

// ---- float elements: storage and accumulator types, exact up-conversion ----
template <class T> struct FloatElement;

// The 16-bit floats (BF16: bfloat16, else float16): u16 storage, float accumulator; from_acc
// rounds one element (rne), pair_from_acc two in one instruction (element `lo` in bits 0-15).
template <bool BF16> struct HalfElement {
  typedef u16 storage;
  typedef float acc;
  static __device__ __forceinline__ u16 from_acc(float f) {
    u16 h;
    if constexpr (BF16) {
      asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    } else {
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    }
    return h;
  }
  static __device__ __forceinline__ u32 pair_from_acc(float lo, float hi) {
    u32 d;
    if constexpr (BF16) {
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    } else {
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    }
    return d;
  }
  static const bool has_pair = true;
};

template <> struct FloatElement<f16> : HalfElement<false> {
  static __device__ __forceinline__ float to_acc(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
};

template <> struct FloatElement<bf16> : HalfElement<true> {
  static __device__ __forceinline__ float to_acc(u16 h) { return __uint_as_float(((u32)h) << 16); }
};

// f32 and f64: stored as their accumulator type (float, double), no conversion.
template <class T> struct SameAsAccElement {
  typedef T storage;
  typedef T acc;
  static __device__ __forceinline__ T to_acc(T v) { return v; }
  static __device__ __forceinline__ T from_acc(T v) { return v; }
  static __device__ __forceinline__ u32 pair_from_acc(T, T) { return 0; }
  static const bool has_pair = false;
};

template <> struct FloatElement<f32> : SameAsAccElement<float> {};
template <> struct FloatElement<f64> : SameAsAccElement<double> {};

// ---- FP8 (OCP e4m3fn and e5m2): round to nearest even, saturate to the largest finite ----
// NaN becomes the canonical 0x7F in both formats; +-Inf saturates like any large value.
#define QP_FP8_CANONICAL_NAN 0x7F

// The bit layout of each format: mantissa bits, exponent bias, largest finite value and its code,
// smallest normal value, the subnormal step 2^(1 - bias - mant) and its inverse.
template <class Fp8> struct Fp8Format;
template <> struct Fp8Format<e4m3> {
  static const int mant = 3, bias = 7;
  static constexpr double max = 448.0;
  static const u32 max_code = 0x7Eu;
  static constexpr float min_normal = 0.015625f, subnormal_step = 0.001953125f, subnormal_inverse = 512.0f;
};
template <> struct Fp8Format<e5m2> {
  static const int mant = 2, bias = 15;
  static constexpr double max = 57344.0;
  static const u32 max_code = 0x7Bu;
  static constexpr float min_normal = 6.103515625e-05f, subnormal_step = 1.52587890625e-05f,
                         subnormal_inverse = 65536.0f;
};

// The bits of an IEEE binary float: storage word, mantissa bits, exponent bias; its bits and its
// conversion to int with round-half-to-even.
template <class T> struct IeeeBits;
template <> struct IeeeBits<float> {
  typedef u32 word;
  static const int mant = 23, bias = 127;
  static __device__ __forceinline__ u32 of(float v) { return __float_as_uint(v); }
  static __device__ __forceinline__ int rint_int(float v) { return __float2int_rn(v); }
};
template <> struct IeeeBits<double> {
  typedef u64 word;
  static const int mant = 52, bias = 1023;
  static __device__ __forceinline__ u64 of(double v) { return (u64)__double_as_longlong(v); }
  static __device__ __forceinline__ int rint_int(double v) { return __double2int_rn(v); }
};

// One rounding of a float or double v to the FP8 format, in integer arithmetic on v's bits (any
// architecture; the f32 one is the portable conversion): below the smallest normal, the exact
// scaling to subnormal steps rounded by the integer conversion; above it, the bits rounded to
// the format's mantissa bits (rne) and the exponent rebiased.
template <class Fp8, class T> __device__ __forceinline__ u8 fp8_from_float_bits(T v) {
  typedef Fp8Format<Fp8> F;
  typedef IeeeBits<T> B;
  typedef typename B::word word;
  constexpr int DROP = B::mant - F::mant;  // mantissa bits dropped
  const u32 sign = (u32)(B::of(v) >> (8 * sizeof(T) - 8)) & 0x80u;
  const T a = fabs(v);
  if (a != a) return QP_FP8_CANONICAL_NAN;
  if (a >= (T)F::max) return (u8)(sign | F::max_code);  // rne(>= max) saturates
  if (a < (T)F::min_normal) return (u8)(sign | (u32)B::rint_int(a * (T)F::subnormal_inverse));
  const word ua = B::of(a);
  const word r = (ua + (((word)1 << (DROP - 1)) - 1) + ((ua >> DROP) & 1)) >> DROP;
  return (u8)(sign | (u32)(r - ((word)(B::bias - F::bias) << F::mant)));
}

template <class Fp8> struct Fp8Element {
  typedef Fp8Format<Fp8> F;
#if __CUDA_ARCH__ >= 890
  // Two conversions in one instruction: low byte from lo, high byte from hi.
  static __device__ __forceinline__ u16 pair_from_f32(float lo, float hi) {
    u16 pair;
    if constexpr (F::mant == 3) {
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    } else {
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    }
    return pair;
  }
#endif
  static __device__ __forceinline__ u8 from_f32(float v) {
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
    return (v != v) ? (u8)QP_FP8_CANONICAL_NAN : (u8)(pair_from_f32(v, 0.0f) & 0xFFu);
#else
    return fp8_from_float_bits<Fp8>(v);
#endif
  }
  // Exact widening: e4m3fn has no Inf and one NaN (S.1111.111); e5m2 has IEEE Inf and NaN.
  static __device__ __forceinline__ float to_f32(u8 b) {
    constexpr int M = F::mant;
    const u32 sign = ((u32)b & 0x80u) << 24;
    const u32 e = (b >> M) & (0x7Fu >> M), m = b & ((1u << M) - 1u);
    if constexpr (M == 3) {
      if ((b & 0x7Fu) == 0x7Fu) return __uint_as_float(0x7FC00000u | sign);
    } else {
      if (e == 31u) return __uint_as_float(sign | (m ? 0x7FC00000u : 0x7F800000u));
    }
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * F::subnormal_step));
    return __uint_as_float(sign | ((e + (127u - F::bias)) << 23) | (m << (23 - M)));
  }
};

// ---- quantized elements: storage unit and code <-> byte/nibble ----
// kind: 0 = integer (8-bit), 1 = integer packed two per byte, 2 = fp8
template <class T> struct QuantElement;
template <> struct QuantElement<s8> { static const int kind = 0; static const bool is_signed = true; };
template <> struct QuantElement<u8q> { static const int kind = 0; static const bool is_signed = false; };
template <> struct QuantElement<s4> { static const int kind = 1; static const bool is_signed = true; };
template <> struct QuantElement<u4> { static const int kind = 1; static const bool is_signed = false; };
template <> struct QuantElement<e4m3> { static const int kind = 2; static const bool is_signed = true; };
template <> struct QuantElement<e5m2> { static const int kind = 2; static const bool is_signed = true; };

}  // namespace qp
