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

template <> struct FloatElement<f16> {
  typedef u16 storage;
  typedef float acc;
  static __device__ __forceinline__ float to_acc(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
  static __device__ __forceinline__ u16 from_acc(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
  // Two roundings in one instruction: element `lo` in bits 0-15.
  static __device__ __forceinline__ u32 pair_from_acc(float lo, float hi) {
    u32 d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
  }
  static const bool has_pair = true;
};

template <> struct FloatElement<bf16> {
  typedef u16 storage;
  typedef float acc;
  static __device__ __forceinline__ float to_acc(u16 h) { return __uint_as_float(((u32)h) << 16); }
  static __device__ __forceinline__ u16 from_acc(float f) {
    u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
  static __device__ __forceinline__ u32 pair_from_acc(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
  }
  static const bool has_pair = true;
};

template <> struct FloatElement<f32> {
  typedef float storage;
  typedef float acc;
  static __device__ __forceinline__ float to_acc(float v) { return v; }
  static __device__ __forceinline__ float from_acc(float v) { return v; }
  static __device__ __forceinline__ u32 pair_from_acc(float, float) { return 0; }
  static const bool has_pair = false;
};

template <> struct FloatElement<f64> {
  typedef double storage;
  typedef double acc;
  static __device__ __forceinline__ double to_acc(double v) { return v; }
  static __device__ __forceinline__ double from_acc(double v) { return v; }
  static __device__ __forceinline__ u32 pair_from_acc(double, double) { return 0; }
  static const bool has_pair = false;
};

// ---- FP8 (OCP e4m3fn and e5m2): round to nearest even, saturate to the largest finite ----
// NaN becomes the canonical 0x7F in both formats; +-Inf saturates like any large value.
#define QP_FP8_CANONICAL_NAN 0x7F

__device__ __forceinline__ u8 fp8_e4m3_from_f32_software(float v) {
  const u32 sign = (__float_as_uint(v) >> 24) & 0x80u;
  const float a = fabsf(v);
  if (a != a) return QP_FP8_CANONICAL_NAN;
  if (a >= 448.0f) return (u8)(sign | 0x7Eu);          // 448 = largest finite; rne(>=448) saturates
  if (a < 0.015625f) {                                  // below 2^-6: subnormal step 2^-9
    return (u8)(sign | (u32)__float2int_rn(a * 512.0f));   // exact scaling; 8 encodes 2^-6
  }
  const u32 ua = __float_as_uint(a);
  const u32 r = (ua + 0x7FFFFu + ((ua >> 20) & 1u)) >> 20;  // keep 3 mantissa bits, rne
  return (u8)(sign | (r - (120u << 3)));                // rebias exponent 127 -> 7
}

__device__ __forceinline__ u8 fp8_e5m2_from_f32_software(float v) {
  const u32 sign = (__float_as_uint(v) >> 24) & 0x80u;
  const float a = fabsf(v);
  if (a != a) return QP_FP8_CANONICAL_NAN;
  if (a >= 57344.0f) return (u8)(sign | 0x7Bu);         // 57344 = largest finite
  if (a < 6.103515625e-05f) {                           // below 2^-14: subnormal step 2^-16
    return (u8)(sign | (u32)__float2int_rn(a * 65536.0f));
  }
  const u32 ua = __float_as_uint(a);
  const u32 r = (ua + 0xFFFFFu + ((ua >> 21) & 1u)) >> 21;  // keep 2 mantissa bits, rne
  return (u8)(sign | (r - (112u << 2)));                // rebias exponent 127 -> 15
}

template <class T> struct Fp8Element;

template <> struct Fp8Element<e4m3> {
#if __CUDA_ARCH__ >= 890
  // Two conversions in one instruction: low byte from lo, high byte from hi.
  static __device__ __forceinline__ u16 pair_from_f32(float lo, float hi) {
    u16 pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return pair;
  }
#endif
  static __device__ __forceinline__ u8 from_f32(float v) {
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
    return (v != v) ? (u8)QP_FP8_CANONICAL_NAN : (u8)(pair_from_f32(v, 0.0f) & 0xFFu);
#else
    return fp8_e4m3_from_f32_software(v);
#endif
  }
  static __device__ __forceinline__ float to_f32(u8 b) {
    const u32 sign = ((u32)b & 0x80u) << 24;
    const u32 e = (b >> 3) & 0xFu, m = b & 7u;
    if ((b & 0x7Fu) == 0x7Fu) return __uint_as_float(0x7FC00000u | sign);
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
  }
};

template <> struct Fp8Element<e5m2> {
#if __CUDA_ARCH__ >= 890
  static __device__ __forceinline__ u16 pair_from_f32(float lo, float hi) {
    u16 pair;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
    return pair;
  }
#endif
  static __device__ __forceinline__ u8 from_f32(float v) {
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
    return (v != v) ? (u8)QP_FP8_CANONICAL_NAN : (u8)(pair_from_f32(v, 0.0f) & 0xFFu);
#else
    return fp8_e5m2_from_f32_software(v);
#endif
  }
  static __device__ __forceinline__ float to_f32(u8 b) {
    const u32 sign = ((u32)b & 0x80u) << 24;
    const u32 e = (b >> 2) & 0x1Fu, m = b & 3u;
    if (e == 31u) return __uint_as_float(sign | (m ? 0x7FC00000u : 0x7F800000u));
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 1.52587890625e-05f));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 21));
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
