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

// Scale and zero point of one segment, with the clamp bounds precomputed.
template <class Acc> struct IntQuantParam {
  Acc scale, lo, hi;
  int zp;
  __device__ __forceinline__ void set(Acc s, int z, int q_min, int q_max) {
    scale = s;
    zp = z;
    lo = acc_from_i64_up((i64)q_min - z, Acc());
    hi = acc_from_i64_down((i64)q_max - z, Acc());
  }
};

// rne(v) + zp clamped to [q_min, q_max]; NaN -> zp.
template <class Acc>
__device__ __forceinline__ int clamp_rounded_code(Acc v, const IntQuantParam<Acc>& p, int q_min, int q_max) {
  const Acc r = acc_rint(v);
  if (r != r) return p.zp;
  if (r < p.lo) return q_min;
  if (r > p.hi) return q_max;
  return (int)(acc_to_i64(r) + p.zp);
}

template <class Acc>
__device__ __forceinline__ int quantize_int_code(Acc x, const IntQuantParam<Acc>& p, int q_min, int q_max) {
  return clamp_rounded_code(acc_div(x, p.scale), p, q_min, q_max);
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

}  // namespace qp
