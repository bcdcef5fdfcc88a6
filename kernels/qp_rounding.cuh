// qp_rounding.cuh: the per-element quantize / dequantize arithmetic of SPEC section 4.
//
//   integer: q = clamp(rne(x / scale) + zp, q_min, q_max); NaN -> zp; +-Inf clamps
//   fp8:     q = fp8_rne_saturate(x / scale); NaN -> canonical NaN
//   dequant: y = (q - zp) * scale in the accumulator type, rounded once to the output
// The accumulator is float for f16/bf16/f32 and double for f64. Division is IEEE (no fast
// math). The clamp is exact for any int32 zero point: r is compared against q_min - zp and
// q_max - zp rounded outwards to the accumulator type, which is exact because r is an integer
// and no float lies strictly between a bound and its outward rounding.
#pragma once
#include "qp_elements.cuh"

namespace qp {

__device__ __forceinline__ float acc_rint(float v) { return rintf(v); }
__device__ __forceinline__ double acc_rint(double v) { return rint(v); }
__device__ __forceinline__ float acc_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double acc_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float acc_from_i64_up(i64 v, float) { return __ll2float_ru(v); }
__device__ __forceinline__ float acc_from_i64_down(i64 v, float) { return __ll2float_rd(v); }
__device__ __forceinline__ double acc_from_i64_up(i64 v, double) { return __ll2double_ru(v); }
__device__ __forceinline__ double acc_from_i64_down(i64 v, double) { return __ll2double_rd(v); }
__device__ __forceinline__ i64 acc_to_i64(float v) { return __float2ll_rz(v); }
__device__ __forceinline__ i64 acc_to_i64(double v) { return __double2ll_rz(v); }

// ---- fast exact quotient rounding ----
// A division per element is expensive (MUFU.RCP plus a fix-up on the slow conversion pipe), so
// the float path computes t = x * (1/scale) and brackets the exact IEEE quotient q = x / scale:
// |t - q| <= |t| * 2^-22, so q lies in [t - m, t + m] with m = |t| * 2^-20 (a 4x margin). Any
// monotone rounding f (rne to an integer, rne-saturate to FP8) gives f(q) = f(t - m) when
// f(t - m) == f(t + m). When the two differ (t within a few ulps of a rounding boundary,
// probability ~2^-20) or t is not finite, the element takes the exact division. The result is
// therefore always f(x / scale) with IEEE division: bit-identical to the reference.
#define QP_RNE_MAGIC 12582912.0f          // 1.5 * 2^23: v + MAGIC rounds |v| < 2^22 to an integer
#define QP_RNE_MAGIC_BITS 0x4B400000      // bits of MAGIC; (bits of v + MAGIC) - this = rne(v)
#define QP_MARGIN 9.5367431640625e-07f    // 2^-20

// Scale and zero point of one segment, with what the fast path needs.
template <class Acc> struct IntQuantParam {
  Acc scale, inv;
  int zp;
  bool fast;
  __device__ __forceinline__ void set(Acc s, int z);
};

template <> __device__ __forceinline__ void IntQuantParam<float>::set(float s, int z) {
  scale = s;
  zp = z;
  inv = __frcp_rn(s);
  // inv normal and finite keeps t's relative error <= 2^-23; |zp| <= 2^30 keeps code + zp in int32.
  fast = inv >= 1.17549435e-38f && inv <= 3.40282347e+38f && z >= -(1 << 30) && z <= (1 << 30);
}

template <> __device__ __forceinline__ void IntQuantParam<double>::set(double s, int z) {
  scale = s;
  zp = z;
  inv = 0.0;
  fast = false;  // f64 data always takes the exact division
}

// rne(v) + zp clamped to [q_min, q_max]; NaN -> zp. Exact for any int32 zero point: r is
// compared with q_min - zp and q_max - zp rounded outwards, which is exact because r is an
// integer and no float lies strictly between a bound and its outward rounding.
template <class Acc>
__device__ __forceinline__ int clamp_rounded_code(Acc v, int zp, int q_min, int q_max) {
  const Acc r = acc_rint(v);
  if (r != r) return zp;
  if (r < acc_from_i64_up((i64)q_min - zp, Acc())) return q_min;
  if (r > acc_from_i64_down((i64)q_max - zp, Acc())) return q_max;
  return (int)(acc_to_i64(r) + zp);
}

template <class Acc>
__device__ __forceinline__ int quantize_int_code(Acc x, const IntQuantParam<Acc>& p, int q_min, int q_max) {
  if constexpr (sizeof(Acc) == 4) {
    if (p.fast) {
      const float t = __fmul_rn(x, p.inv);
      const float m = __fmul_rn(fabsf(t), QP_MARGIN);
      const int a = __float_as_int(__fadd_rn(__fsub_rn(t, m), QP_RNE_MAGIC));
      const int b = __float_as_int(__fadd_rn(__fadd_rn(t, m), QP_RNE_MAGIC));
      if (a == b && fabsf(t) < 2097152.0f) return min(max(a - QP_RNE_MAGIC_BITS + p.zp, q_min), q_max);
    }
  }
  return clamp_rounded_code(acc_div(x, p.scale), p.zp, q_min, q_max);
}

// ---- fp8 from double: one rounding straight from the double (no detour through float) ----
template <class Fp8> struct Fp8FromDouble;
template <> struct Fp8FromDouble<e4m3> {
  static __device__ __forceinline__ u8 convert(double v) {
    const u32 sign = (u32)(__double_as_longlong(v) >> 56) & 0x80u;
    const double a = fabs(v);
    if (a != a) return QP_FP8_CANONICAL_NAN;
    if (a >= 448.0) return (u8)(sign | 0x7Eu);
    if (a < 0.015625) return (u8)(sign | (u32)__double2int_rn(a * 512.0));
    const u64 ua = (u64)__double_as_longlong(a);
    const u64 r = (ua + 0xFFFFFFFFFFFFull + ((ua >> 49) & 1ull)) >> 49;
    return (u8)(sign | (u32)(r - (1016ull << 3)));
  }
};
template <> struct Fp8FromDouble<e5m2> {
  static __device__ __forceinline__ u8 convert(double v) {
    const u32 sign = (u32)(__double_as_longlong(v) >> 56) & 0x80u;
    const double a = fabs(v);
    if (a != a) return QP_FP8_CANONICAL_NAN;
    if (a >= 57344.0) return (u8)(sign | 0x7Bu);
    if (a < 6.103515625e-05) return (u8)(sign | (u32)__double2int_rn(a * 65536.0));
    const u64 ua = (u64)__double_as_longlong(a);
    const u64 r = (ua + 0x1FFFFFFFFFFFFull + ((ua >> 50) & 1ull)) >> 50;
    return (u8)(sign | (u32)(r - (1008ull << 2)));
  }
};

template <class Fp8> __device__ __forceinline__ u8 fp8_from_acc(float v) { return Fp8Element<Fp8>::from_f32(v); }
template <class Fp8> __device__ __forceinline__ u8 fp8_from_acc(double v) { return Fp8FromDouble<Fp8>::convert(v); }

// fp8_rne_saturate(x / scale), with the bracketing fast path where the GPU converts in hardware.
template <class Fp8, class Acc>
__device__ __forceinline__ u8 quantize_fp8_code(Acc x, const IntQuantParam<Acc>& p) {
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
  if constexpr (sizeof(Acc) == 4) {
    if (p.fast) {
      const float t = __fmul_rn(x, p.inv);
      const float m = __fmul_rn(fabsf(t), QP_MARGIN);
      const u16 pair = Fp8Element<Fp8>::pair_from_f32(__fsub_rn(t, m), __fadd_rn(t, m));
      if ((pair >> 8) == (pair & 0xFFu) && t == t) return (u8)(pair & 0xFFu);
    }
  }
#endif
  return fp8_from_acc<Fp8>(acc_div(x, p.scale));
}

// ---- dequantize: (q - zp) as an exact float without the conversion pipe ----
template <class Acc> struct DequantParam {
  Acc scale;
  int zp;
  bool fast;  // |zp| <= 2^21: code - zp fits the magic-number conversion
  __device__ __forceinline__ void set(Acc s, int z) {
    scale = s;
    zp = z;
    fast = z >= -(1 << 21) && z <= (1 << 21);
  }
};

template <class Acc>
__device__ __forceinline__ Acc centered_code(int code, const DequantParam<Acc>& p) {
  if constexpr (sizeof(Acc) == 4) {
    if (p.fast) return __fsub_rn(__int_as_float(code - p.zp + QP_RNE_MAGIC_BITS), QP_RNE_MAGIC);
  }
  return (Acc)((i64)code - p.zp);
}

}  // namespace qp
