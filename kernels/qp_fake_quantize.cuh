// qp_fake_quantize.cuh: the per-element arithmetic of fake quantization (SPEC section 4,
// PyTorch's fake_quantize_per_{tensor,channel}_affine) and of its gradients.
//
//   inv = rn(1 / scale)
//   q   = rne(x * inv) + zp           (each operation rounded; a NaN q counts as below q_min: PyTorch's
//                                      CUDA kernels convert it to int64, which gives INT64_MIN)
//   y   = (clamp(q, q_min, q_max) - zp) * scale        rounded once more to the data type
//   mask = q_min <= q <= q_max                         (straight-through estimator)
// Learnable parameters (LSQ, PyTorch's _fake_quantize_learnable_*_backward), with gf the grad factor:
//   inside:  dscale_i = ((dy * (y - x)) * inv) * gf,    dzp_i = 0
//   below:   dscale_i = (dy * (q_min - zp)) * gf,       dzp_i = ((-dy) * scale) * gf
//   above:   dscale_i = (dy * (q_max - zp)) * gf,       dzp_i = ((-dy) * scale) * gf
// where y is the unrounded-to-dtype fake-quantized value (accumulator type).
// Stochastic rounding (dynamic-range fake quantization) replaces rne(x * inv) by
// floor(v) + (u < v - floor(v)) with v = x * inv and u the element's Philox uniform.
// The accumulator is float for f16/bf16/f32 data and double for f64. No FMA contraction: every
// product and sum is rounded separately, as in the reference.
#pragma once
#include "qp_elements.cuh"
#include "qp_rounding.cuh"

namespace qp {

// rne(t) without the conversion pipe (FRND runs at a quarter of the FMA rate): below 2^23 in
// magnitude, t +- 2^23 lands where the float spacing is 1, so the addition rounds half to even
// and the subtraction is exact; from 2^23 up (Inf included) t is already an integer, and NaN
// stays NaN. A zero result may lose the sign of a negative t; q = r + zp is +0 either way.
__device__ __forceinline__ float acc_rint_fast(float t) {
  const float m = copysignf(8388608.0f, t);
  const float r = __fsub_rn(__fadd_rn(t, m), m);
  return fabsf(t) < 8388608.0f ? r : t;
}
__device__ __forceinline__ double acc_rint_fast(double t) { return rint(t); }

// rne(t) for |t| < 2^22 (2^51 for double), and NaN: adding and subtracting 1.5 * 2^23 (1.5 * 2^52)
// lands where the spacing is 1, the parity of the sum is t's, and the subtraction is exact; a zero
// result is +0 (as rne(t) + zp is for zp = 0). Two additions, nothing on the conversion pipe.
__device__ __forceinline__ float acc_rint_small(float t) { return __fsub_rn(__fadd_rn(t, 12582912.0f), 12582912.0f); }
__device__ __forceinline__ double acc_rint_small(double t) {
  return __dsub_rn(__dadd_rn(t, 6755399441055744.0), 6755399441055744.0);
}

// floor(t) for |t| < 2^22 (2^51 for double), and NaN: the same two additions with the first
// rounded down (to -Inf), so the sum is floor(t) + 1.5 * 2^23 exactly. A zero result is +0.
__device__ __forceinline__ float acc_floor_small(float t) { return __fsub_rn(__fadd_rd(t, 12582912.0f), 12582912.0f); }
__device__ __forceinline__ double acc_floor_small(double t) {
  return __dsub_rn(__dadd_rd(t, 6755399441055744.0), 6755399441055744.0);
}

// Where the zero point comes from (a runtime choice, uniform across the launch).
enum ZeroPointSource { kZpValue = 0, kZpInt32 = 1, kZpFloat = 2 };

// One segment's parameters in the accumulator type. A float (learnable) zero point is rounded
// half to even and clamped to [q_min, q_max] (NaN -> q_min), the same way forward and backward.
template <class Acc> struct FakeQuantParam {
  Acc scale, inv, zp, lo, hi;

  __device__ __forceinline__ void set(Acc s, Acc z, int q_min, int q_max) {
    scale = s;
    inv = acc_rcp(s);
    lo = (Acc)q_min;
    hi = (Acc)q_max;
    zp = z;
  }

  static __device__ __forceinline__ Acc rounded_zero_point(Acc z, int q_min, int q_max) {
    return fmin(fmax(acc_rint(z), (Acc)q_min), (Acc)q_max);
  }

  // Parameter `index` from the arrays (or the scalar values when a pointer is null).
  static __device__ __forceinline__ FakeQuantParam load(const Acc* scale_ptr, const void* zp_ptr, int zp_source,
                                                       Acc scale_value, int zp_value, i64 index, int q_min,
                                                       int q_max) {
    FakeQuantParam p;
    Acc z = (Acc)zp_value;
    if (zp_source == kZpInt32) z = (Acc)static_cast<const int*>(zp_ptr)[index];
    if (zp_source == kZpFloat) z = rounded_zero_point(static_cast<const Acc*>(zp_ptr)[index], q_min, q_max);
    p.set(scale_ptr ? scale_ptr[index] : scale_value, z, q_min, q_max);
    return p;
  }

  // q = rne(x * inv) + zp, NaN -> q_min - 1 (below the range; the reference uses -Inf, which
  // acts the same in every use of q).
  __device__ __forceinline__ Acc code(Acc x) const {
    const Acc q = acc_add(acc_rint_fast(acc_mul(x, inv)), zp);
    return q != q ? lo - (Acc)1 : q;
  }

  // Stochastic rounding instead of rne (SPEC section 4): v = x * inv, q = floor(v) + (u < v - floor(v)) + zp,
  // NaN -> below the range as in code(); +-Inf stay infinite (Inf - Inf is NaN, which compares false).
  __device__ __forceinline__ Acc stochastic_code(Acc x, float u) const {
    const Acc v = acc_mul(x, inv);
    const Acc f = floor(v);
    const Acc q = acc_add((Acc)u < acc_sub(v, f) ? acc_add(f, (Acc)1) : f, zp);
    return q != q ? lo - (Acc)1 : q;
  }

  // fake() and fake_stochastic() where |x * inv| < 2^22 or NaN is known (dynamic ranges: a
  // finite inv bounds |x * inv| by about q_max - q_min). A NaN q needs no replacement here: the
  // clamp's fmax turns it into q_min, as code()'s q_min - 1 does.
  __device__ __forceinline__ Acc fake_small(Acc x) const {
    return dequantized(acc_add(acc_rint_small(acc_mul(x, inv)), zp));
  }
  __device__ __forceinline__ Acc fake_stochastic_small(Acc x, float u) const {
    const Acc v = acc_mul(x, inv);
    const Acc f = acc_floor_small(v);  // floor(v) (a -0 / +0 difference cancels in + zp)
    return dequantized(acc_add((Acc)u < acc_sub(v, f) ? acc_add(f, (Acc)1) : f, zp));
  }

  __device__ __forceinline__ bool inside(Acc q) const { return q >= lo && q <= hi; }

  // (clamp(q) - zp) * scale
  __device__ __forceinline__ Acc dequantized(Acc q) const { return acc_mul(acc_sub(fmin(fmax(q, lo), hi), zp), scale); }

  // The clamp's fmax maps a NaN q to q_min, as code()'s q_min - 1 does (no NaN test needed).
  __device__ __forceinline__ Acc fake(Acc x) const { return dequantized(acc_add(acc_rint_fast(acc_mul(x, inv)), zp)); }
  __device__ __forceinline__ Acc fake_stochastic(Acc x, float u) const { return dequantized(stochastic_code(x, u)); }

  // The straight-through gradient: dy * (mask ? 1 : 0) (a negative dy outside gives -0, NaN stays NaN).
  // A NaN q compares false in inside(), as code()'s q_min - 1 does (no NaN test needed).
  __device__ __forceinline__ Acc ste(Acc x, Acc dy) const {
    return acc_mul(dy, inside(acc_add(acc_rint_fast(acc_mul(x, inv)), zp)) ? (Acc)1 : (Acc)0);
  }

  // dx, and this element's contributions to dscale and dzp (LSQ; header comment).
  __device__ __forceinline__ Acc learnable_grads(Acc x, Acc dy, Acc grad_factor, Acc& dscale, Acc& dzp) const {
    const Acc q = code(x);
    if (q < lo || q > hi) {
      dscale = acc_mul(acc_mul(dy, acc_sub(q < lo ? lo : hi, zp)), grad_factor);
      dzp = acc_mul(acc_mul(-dy, scale), grad_factor);
      return acc_mul(dy, (Acc)0);
    }
    dscale = acc_mul(acc_mul(acc_mul(dy, acc_sub(dequantized(q), x)), inv), grad_factor);
    dzp = (Acc)0;
    return dy;
  }
};

// FakeQuantParam's fake() and ste() in fewer operations, for a parameter whose shifted bounds
// l = q_min - zp and h = q_max - zp lie within +-2^21 and whose q_min, q_max lie within +-2^23
// (`ok`; every 8-bit range with its zero point inside). Then
//   (clamp(rne(t) + zp, q_min, q_max) - zp) = clamp(rne(t), l, h) = rne(clamp(t, l - 1/4, h + 1/4))
// exactly: rne(t) + zp is exact wherever it lies inside [q_min, q_max] and rounds monotonically
// outside; l - 1/4 and h + 1/4 are exact and round to l and h; t below l - 1/4 gives rne(t) <= l
// (likewise above); a NaN t takes the lower bound through fmax, as the clamp of a NaN q does.
// The mask: q_min <= rne(t) + zp <= q_max  <=>  l <= rne(t) <= h (|q_min|, |q_max| < 2^24: no
// rounding of rne(t) + zp can reach a bound from outside). Both keep every result bit.
template <class Acc> struct FakeShortParam {
  Acc scale, inv, l, h;
  bool ok;

  __device__ __forceinline__ void set(const FakeQuantParam<Acc>& p) {
    scale = p.scale;
    inv = p.inv;
    l = acc_sub(p.lo, p.zp);
    h = acc_sub(p.hi, p.zp);
    ok = fabs(l) <= (Acc)2097152 && fabs(h) <= (Acc)2097152 && fabs(p.lo) <= (Acc)8388608 &&
         fabs(p.hi) <= (Acc)8388608;
  }

  __device__ __forceinline__ Acc fake(Acc x) const {
    const Acc c = fmin(fmax(acc_mul(x, inv), acc_sub(l, (Acc)0.25)), acc_add(h, (Acc)0.25));
    return acc_mul(acc_rint_small(c), scale);
  }

  __device__ __forceinline__ Acc ste(Acc x, Acc dy) const {
    const Acc r = acc_rint_fast(acc_mul(x, inv));
    return acc_mul(dy, r >= l && r <= h ? (Acc)1 : (Acc)0);
  }
};

// The parameters of dynamic-range fake quantization (the fused passes), where every code and
// zero point is an integer of at most 8 bits: (clamp(q + zp, q_min, q_max) - zp) * scale is
// clamp(q, q_min - zp, q_max - zp) * scale exactly (q, zp and the bounds are small integers, so
// every sum is exact; a NaN q still gives the lower bound; q is never -0), two operations fewer
// per element. |x * inv| < 2^22 or NaN (a finite inv: the caller checks `short_path()`).
template <class Acc> struct DynamicFakeParam {
  Acc scale, inv, lo, hi;  // lo / hi: q_min - zp, q_max - zp

  __device__ __forceinline__ void set(Acc s, int zp, int q_min, int q_max) { set(s, acc_rcp(s), zp, q_min, q_max); }

  // With the reciprocal already known (rn(1 / s)).
  __device__ __forceinline__ void set(Acc s, Acc inv_s, int zp, int q_min, int q_max) {
    scale = s;
    inv = inv_s;
    lo = (Acc)(q_min - zp);
    hi = (Acc)(q_max - zp);
  }

  // A finite inv bounds |x * inv| by about q_max - q_min (NaN: a non-finite segment); an inv of
  // +Inf (a scale below 2^-128) needs FakeQuantParam's general path.
  __device__ __forceinline__ bool short_path() const { return !(isinf(inv)); }

  __device__ __forceinline__ Acc nearest(Acc x) const {
    return acc_mul(fmin(fmax(acc_rint_small(acc_mul(x, inv)), lo), hi), scale);
  }
  __device__ __forceinline__ Acc stochastic(Acc x, float u) const {
    const Acc v = acc_mul(x, inv);
    const Acc f = acc_floor_small(v);
    const Acc q = (Acc)u < acc_sub(v, f) ? acc_add(f, (Acc)1) : f;
    return acc_mul(fmin(fmax(q, lo), hi), scale);
  }
};

}  // namespace qp
