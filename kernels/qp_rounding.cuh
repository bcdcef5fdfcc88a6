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

// The accumulator type's arithmetic, each operation correctly rounded (no FMA contraction).
__device__ __forceinline__ float acc_rint(float v) { return rintf(v); }
__device__ __forceinline__ double acc_rint(double v) { return rint(v); }
__device__ __forceinline__ float acc_rcp(float v) { return __frcp_rn(v); }
__device__ __forceinline__ double acc_rcp(double v) { return __drcp_rn(v); }
__device__ __forceinline__ float acc_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double acc_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float acc_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double acc_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float acc_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double acc_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float acc_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double acc_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float acc_from_i64_up(i64 v, float) { return __ll2float_ru(v); }
__device__ __forceinline__ float acc_from_i64_down(i64 v, float) { return __ll2float_rd(v); }
__device__ __forceinline__ double acc_from_i64_up(i64 v, double) { return __ll2double_ru(v); }
__device__ __forceinline__ double acc_from_i64_down(i64 v, double) { return __ll2double_rd(v); }
__device__ __forceinline__ i64 acc_to_i64(float v) { return __float2ll_rz(v); }
__device__ __forceinline__ i64 acc_to_i64(double v) { return __double2ll_rz(v); }

// ---- the division-free quotient ----
// A division per element is expensive (MUFU.RCP, a refinement and a range check on every
// element), so float data computes the IEEE quotient fl(x / scale) from the segment's
// correctly rounded reciprocal inv = rn(1/scale) with Markstein's correction:
//   t = rn(x * inv),  r = x - t * scale (exact, one FMA),  q = rn(t + r * inv).
// Markstein's theorem (inv within half an ulp of 1/scale, t within one ulp of x / scale, no
// underflow) gives q = fl(x / scale). The plan guarantees scale in [2^-60, 2^100] (`fast`);
// then q is exact whenever |x| >= 2^-100 and |q| >= 2^-100, and elsewhere |x / scale| < 2^-40,
// where q and the IEEE quotient are both below every code's rounding threshold and carry x's
// sign (r is formed as -(t * scale - x) so that a zero x keeps its sign), so every code equals
// the reference's. Checked against __fdiv_rn on 10^11 pairs on the GPU (every bf16 and f16
// value against scales amax / {7, 127, 448} of random amax, and random float32 bit patterns).
// |t| >= 2^21 (large quotients, Inf, NaN) clears `ok`: those elements take the division.
#define QP_RNE_MAGIC 12582912.0f          // 1.5 * 2^23: v + MAGIC rounds |v| < 2^22 to an integer
#define QP_RNE_MAGIC_BITS 0x4B400000      // bits of MAGIC; (bits of v + MAGIC) - this = rne(v)
#define QP_QUOTIENT_LIMIT 2097152.0f      // 2^21

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
  // scale in [2^-60, 2^100] (false for NaN): the quotient's exactness conditions (above);
  // |zp| <= 2^30 keeps code + zp in int32.
  fast = s >= 8.673617379884035e-19f && s <= 1.2676506002282294e+30f && z >= -(1 << 30) && z <= (1 << 30);
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
// r + zp clamped to [q_min, q_max] for an integral r; NaN -> zp. Exact for any int32 zero point:
// r is compared with q_min - zp and q_max - zp rounded outwards, which is exact because r is an
// integer and no float lies strictly between a bound and its outward rounding.
template <class Acc>
__device__ __forceinline__ int clamp_integral_code(Acc r, int zp, int q_min, int q_max) {
  if (r != r) return zp;
  if (r < acc_from_i64_up((i64)q_min - zp, Acc())) return q_min;
  if (r > acc_from_i64_down((i64)q_max - zp, Acc())) return q_max;
  return (int)(acc_to_i64(r) + zp);
}

// rne(v) + zp clamped to [q_min, q_max]; NaN -> zp; +-Inf clamps.
template <class Acc>
__device__ __forceinline__ int clamp_rounded_code(Acc v, int zp, int q_min, int q_max) {
  return clamp_integral_code(acc_rint(v), zp, q_min, q_max);
}

// fl(x / scale) without a division (see above); clears `ok` where |x / scale| >= 2^21 or NaN.
__device__ __forceinline__ float quotient_fast(float x, const IntQuantParam<float>& p, bool& ok) {
  const float t = __fmul_rn(x, p.inv);
  const float r = -__fmaf_rn(t, p.scale, -x);
  // Bitwise &: no short-circuit branch; the flag stays a predicate.
  ok = ok & (fabsf(t) < QP_QUOTIENT_LIMIT);
  return __fmaf_rn(r, p.inv, t);
}

// Division-free rne(x / scale) + zp before the clamp, as an int (no overflow where `ok` holds:
// |x / scale| < 2^21 and |zp| <= 2^30). Clears `ok` when the element must be redone exactly.
__device__ __forceinline__ int unclamped_code_fast(float x, const IntQuantParam<float>& p, bool& ok) {
  const float rb = __fadd_rn(quotient_fast(x, p, ok), QP_RNE_MAGIC);
  return (int)((u32)__float_as_int(rb) - (u32)QP_RNE_MAGIC_BITS + (u32)p.zp);
}

// Division-free clamp(rne(x / scale) + zp, q_min, q_max). Clears `ok` when the element must be
// redone exactly; the returned code is then meaningless.
__device__ __forceinline__ int quantize_int_code_fast(float x, const IntQuantParam<float>& p, int q_min, int q_max,
                                                      bool& ok) {
  return min(max(unclamped_code_fast(x, p, ok), q_min), q_max);
}

// The exact path, kept out of line: it is rare in float data, and inlining it at every element
// would multiply the kernel's code size (instruction-cache misses).
template <class Acc>
__device__ __noinline__ int quantize_int_code_exact(Acc x, Acc scale, int zp, int q_min, int q_max) {
  return clamp_rounded_code(acc_div(x, scale), zp, q_min, q_max);
}

template <class Acc>
__device__ __forceinline__ int quantize_int_code(Acc x, const IntQuantParam<Acc>& p, int q_min, int q_max) {
  if constexpr (sizeof(Acc) == 4) {
    bool ok = p.fast;
    const int code = quantize_int_code_fast(x, p, q_min, q_max, ok);
    if (ok) return code;
  }
  return quantize_int_code_exact(x, p.scale, p.zp, q_min, q_max);
}

// ---- fp8 from the accumulator: a double is rounded once, straight from its bits (no detour
// through float) ----
template <class Fp8> __device__ __forceinline__ u8 fp8_from_acc(float v) { return Fp8Element<Fp8>::from_f32(v); }
template <class Fp8> __device__ __forceinline__ u8 fp8_from_acc(double v) { return fp8_from_float_bits<Fp8>(v); }

// Division-free fp8_rne_saturate(x / scale): the exact quotient (see above), converted once.
// Clears `ok` when the element must be redone exactly.
template <class Fp8>
__device__ __forceinline__ u8 quantize_fp8_code_fast(float x, const IntQuantParam<float>& p, bool& ok) {
  return Fp8Element<Fp8>::from_f32(quotient_fast(x, p, ok));
}

// fp8_rne_saturate(x / scale) by the division (out of line: the rare path).
template <class Fp8, class Acc>
__device__ __noinline__ u8 quantize_fp8_code_exact(Acc x, Acc scale) {
  return fp8_from_acc<Fp8>(acc_div(x, scale));
}

template <class Fp8, class Acc>
__device__ __forceinline__ u8 quantize_fp8_code(Acc x, const IntQuantParam<Acc>& p) {
  if constexpr (sizeof(Acc) == 4) {
    bool ok = p.fast;
    const u8 code = quantize_fp8_code_fast<Fp8>(x, p, ok);
    if (ok) return code;
  }
  return quantize_fp8_code_exact<Fp8>(x, p.scale);
}

// ---- stochastic rounding (SPEC section 4) ----
// v = x / scale (IEEE); integer codes: q = clamp(floor(v) + (u < v - floor(v)) + zp), the
// subtraction and comparison in the accumulator type. NaN -> zp, +-Inf clamp.
template <class Acc>
__device__ __forceinline__ int quantize_int_code_stochastic(Acc x, Acc scale, int zp, int q_min, int q_max, float u) {
  const Acc v = acc_div(x, scale);
  const Acc f = floor(v);
  const Acc r = (Acc)u < v - f ? f + (Acc)1 : f;
  return clamp_integral_code(r, zp, q_min, q_max);
}

// FP8 codes: NaN -> canonical NaN; |v| >= max saturates; otherwise lo = the largest FP8 value
// <= v, hi = the next one, and q = hi if u < (v - lo) / (hi - lo) else lo (the spacing is a power
// of two, so the division is exact); a zero result keeps v's sign.
template <class Fp8, class Acc>
__device__ __forceinline__ u8 quantize_fp8_code_stochastic(Acc x, Acc scale, float u) {
  typedef Fp8Format<Fp8> F;
  const Acc v = acc_div(x, scale);
  if (v != v) return QP_FP8_CANONICAL_NAN;
  const Acc a = fabs(v);
  if (a >= (Acc)F::max) return fp8_from_acc<Fp8>(v);  // saturates to +-max
  int e;
  frexp(a, &e);  // a = m 2^e, m in [0.5, 1): binade [2^(e-1), 2^e)
  const int step_exp = max(e - 1, 1 - F::bias) - F::mant;
  const Acc spacing = ldexp((Acc)1, step_exp);
  const Acc a_lo = floor(ldexp(a, -step_exp)) * spacing;
  const Acc a_hi = a_lo + spacing;
  const bool neg = signbit(v);
  const Acc lo = neg ? -a_hi : a_lo;
  const Acc hi = neg ? -a_lo : a_hi;
  const Acc frac = ldexp(v - lo, -step_exp);
  const Acc chosen = copysign(fabs((Acc)u < frac ? hi : lo), v);
  return fp8_from_acc<Fp8>(chosen);
}

// ---- the straight-through mask of quantization (QuantizeBackwardPlan) ----
// True where the forward's pre-clamp value lies inside the code range, from the same quotient,
// rounding and exact-division fallback as the codes above, so it agrees with them bit for bit:
//   integer: q_min <= rne(x / scale) + zp <= q_max   (inclusive; NaN outside, +-Inf outside)
//   fp8:     |x / scale| <= largest finite            (NaN outside, +-Inf outside)
// Where the division-free quotient is not exact (|x / scale| < 2^-40) it is inside the range
// exactly when the IEEE quotient is (both round to a signed zero; both are below the FP8 max).

// q_min <= r + zp <= q_max for an integral r, exactly for any int32 zero point (the outward
// rounded bounds of clamp_integral_code); NaN compares false.
template <class Acc>
__device__ __forceinline__ bool integral_code_inside(Acc r, int zp, int q_min, int q_max) {
  return r >= acc_from_i64_up((i64)q_min - zp, Acc()) && r <= acc_from_i64_down((i64)q_max - zp, Acc());
}

__device__ __forceinline__ bool quantize_int_inside_fast(float x, const IntQuantParam<float>& p, int q_min, int q_max,
                                                         bool& ok) {
  const int code = unclamped_code_fast(x, p, ok);
  return code >= q_min && code <= q_max;
}

template <class Acc>
__device__ __noinline__ bool quantize_int_inside_exact(Acc x, Acc scale, int zp, int q_min, int q_max) {
  return integral_code_inside(acc_rint(acc_div(x, scale)), zp, q_min, q_max);
}

template <class Acc>
__device__ __forceinline__ bool quantize_int_inside(Acc x, const IntQuantParam<Acc>& p, int q_min, int q_max) {
  if constexpr (sizeof(Acc) == 4) {
    bool ok = p.fast;
    const bool inside = quantize_int_inside_fast(x, p, q_min, q_max, ok);
    if (ok) return inside;
  }
  return quantize_int_inside_exact(x, p.scale, p.zp, q_min, q_max);
}

template <class Fp8>
__device__ __forceinline__ bool quantize_fp8_inside_fast(float x, const IntQuantParam<float>& p, bool& ok) {
  return fabsf(quotient_fast(x, p, ok)) <= (float)Fp8Format<Fp8>::max;
}

template <class Fp8, class Acc>
__device__ __noinline__ bool quantize_fp8_inside_exact(Acc x, Acc scale) {
  return fabs(acc_div(x, scale)) <= (Acc)Fp8Format<Fp8>::max;
}

template <class Fp8, class Acc>
__device__ __forceinline__ bool quantize_fp8_inside(Acc x, const IntQuantParam<Acc>& p) {
  if constexpr (sizeof(Acc) == 4) {
    bool ok = p.fast;
    const bool inside = quantize_fp8_inside_fast<Fp8>(x, p, ok);
    if (ok) return inside;
  }
  return quantize_fp8_inside_exact<Fp8>(x, p.scale);
}

// ---- dequantize: (q - zp) as an exact float without the conversion pipe ----
// The zero point splits as zp = hi + lo with hi a multiple of 2^21 (exact in float) and
// |lo| <= 2^20. The bits of MAGIC + (q - lo) are (q - lo) + MAGIC_BITS (|q - lo| < 2^22), and one
// subtraction of offset = MAGIC + hi (exact) leaves (q - lo) - hi = q - zp rounded once: the
// reference's float(q - zp) for every int32 zero point, in two full-rate instructions.
template <class Acc> struct DequantParam;

template <> struct DequantParam<float> {
  float scale, offset;
  int zp_lo;
  __device__ __forceinline__ void set(float s, int z) {
    const i64 hi = ((i64)z + (1 << 20)) & ~(i64)((1 << 21) - 1);
    scale = s;
    zp_lo = (int)((i64)z - hi);
    offset = __fadd_rn(QP_RNE_MAGIC, (float)hi);
  }
};

template <> struct DequantParam<double> {
  double scale;
  int zp;
  __device__ __forceinline__ void set(double s, int z) {
    scale = s;
    zp = z;
  }
};

__device__ __forceinline__ float centered_code(int code, const DequantParam<float>& p) {
  return __fsub_rn(__int_as_float(code - p.zp_lo + QP_RNE_MAGIC_BITS), p.offset);
}

__device__ __forceinline__ double centered_code(int code, const DequantParam<double>& p) {
  return (double)((i64)code - p.zp);
}

}  // namespace qp
