// qp_deepspeed_format.cuh: DeepSpeed's quantizer formulas as sinks and a peer decoding for the
// qgZ loops of qp_qgz.cuh (kernels/deepspeed_format.cu; quantplan/compat/_deepspeed_plans.py).
// Facts: DEEPSPEED_FORMAT.md; the NumPy twin is quantplan/compat/_deepspeed_reference.py.
//
//   DeepSpeedCodeSink   quantize / swizzle_quant / quantized_reduction (+ LoCo): per group,
//                       SYMMETRIC  mult = 2^(b-1) / absmax (absmax 0 -> 1), q = clamp(rne(v * mult))
//                       ASYMMETRIC mult = 2^b / (max - min) (max = min -> 1), offset = (max + min) / 2,
//                                  q = clamp(rne((v - offset) * mult))
//                       codes in [-2^(b-1), 2^(b-1) - 1] (int8, or signed nibbles, element 2i high);
//                       stored 1 / mult (and offset) as float32 rows [g][1|2]; a group with a
//                       NaN / +-Inf (or an overflowing max - min, max + min) gets NaN rows, codes 0.
//                       LoCo: dequant(q) = q * (1 / mult) (+ offset).
//   MoQSink             MoQ fake quantization (ds_[sr_]quantize[_asym]), floats out, bits 1..8:
//                       SYMMETRIC  scale = 2^b / ((2 * absmax) + 1e-5), y = clamp(round(v * scale)) / scale
//                       ASYMMETRIC step = ((max - min) + 1e-5) / 2^b, y = (round((v - min) / step) * step) + min
//                       round: nearest (SYMMETRIC half to even, ASYMMETRIC half away from zero, no
//                       clamp) or stochastic with SPEC section 4's Philox uniform of flat element i.
//   DeepSpeedPeerDecode y = q * p0 (+ p1): the stored rows, read by PeerSumSource.
// Ranges: lay.mode 0 (absmax) or 2 (the group's own min / max, RangeScan::reset(true)). Float32,
// each operation rounded once (no FMA). The two-pass loops keep each group's (mult | scale | step,
// offset | min) in a float2 workspace row, since 1 / (1 / mult) need not be mult.
#pragma once
#include "qp_philox.cuh"
#include "qp_qgz.cuh"

namespace qp {

// Mirrored by DeepSpeedOutputArgs in quantplan/compat/_deepspeed_plans.py.
struct DeepSpeedOutputArgs {
  u8* q;                 // codes (int8 / packed signed nibbles); MoQ: the float output
  float* params;         // rows of 1 (SYMMETRIC) or 2 (ASYMMETRIC) floats; null for MoQ
  float2* work;          // two-pass only: (mult | scale | step, offset | min) per group
  void* error;           // the LoCo buffer (null without error feedback)
  float beta, one_minus_beta;
  u64 seed, offset;      // MoQ stochastic rounding
  int bits, asym;
};

// rne(w) clamped to [lo, hi]; NaN -> 0 (as quantplan.reference.round_and_clamp).
__device__ __forceinline__ int deepspeed_clamped_code(float w, int lo, int hi) {
  const float r = rintf(w);
  if (r != r) return 0;
  return (int)fminf(fmaxf(r, (float)lo), (float)hi);
}

// One group's DeepSpeed parameters: the multiplier, the midpoint offset, the stored 1 / mult.
struct DeepSpeedParam {
  float mult, offset, inv;
  bool bad;
};

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7FC00000); }

template <class Scan, class Out, class Err, int VEC, bool VECTOR_IO>
struct DeepSpeedCodeSink {
  typedef VectorQuantizer<Scan, Out, VEC, true> VQ;  // storage only: signed codes, high nibble first
  typedef typename VQ::vector_t vector_t;
  typedef DeepSpeedParam param_t;
  static const bool loco = ErrorStorage<Err>::loco;
  DeepSpeedOutputArgs o;

  __device__ __forceinline__ int q_lo() const { return -(1 << (o.bits - 1)); }
  __device__ __forceinline__ int q_hi() const { return (1 << (o.bits - 1)) - 1; }

  static __device__ __forceinline__ param_t finish(float mult, float offset, bool bad) {
    param_t p;
    p.bad = bad;
    p.mult = mult;
    p.offset = bad ? quiet_nan() : offset;
    p.inv = bad ? quiet_nan() : __fdiv_rn(1.0f, mult);
    return p;
  }

  template <class S, class Range>
  __device__ __forceinline__ param_t group_params(const Range& r) const {
    bool bad = range_nonfinite<S>(r.amax_bits);
    if (!o.asym) {
      const float absmax = range_amax<S>(r.amax_bits);
      const float mult = absmax == 0.0f ? 1.0f : __fdiv_rn((float)(1 << (o.bits - 1)), absmax);
      return finish(mult, 0.0f, bad);
    }
    const float span = __fsub_rn(r.hi, r.lo);
    const float offset = __fdiv_rn(__fadd_rn(r.hi, r.lo), 2.0f);
    bad = bad || !isfinite(span) || !isfinite(offset);
    const float mult = span == 0.0f ? 1.0f : __fdiv_rn((float)(1 << o.bits), span);
    return finish(mult, offset, bad);
  }

  __device__ __forceinline__ void params(i64 g, const param_t& p) const {
    if (o.asym) {
      o.params[2 * g] = p.inv;
      o.params[2 * g + 1] = p.offset;
    } else {
      o.params[g] = p.inv;
    }
    if (o.work) o.work[g] = make_float2(p.bad ? quiet_nan() : p.mult, p.offset);
  }

  __device__ __forceinline__ param_t load_params(i64 g) const {
    const float2 w = o.work[g];
    return finish(w.x, w.y, w.x != w.x);
  }

  __device__ __forceinline__ int code(float v, const param_t& p) const {
    if (p.bad) return 0;
    return deepspeed_clamped_code(__fmul_rn(o.asym ? __fsub_rn(v, p.offset) : v, p.mult), q_lo(), q_hi());
  }

  // DeepSpeed's dequantization: q * (1 / mult) (+ offset).
  __device__ __forceinline__ float dequantized(int code, const param_t& p) const {
    const float d = __fmul_rn((float)code, p.inv);
    return o.asym ? __fadd_rn(d, p.offset) : d;
  }

  __device__ __forceinline__ void vector(i64 src, i64 out, const vector_t& v, const param_t& p, int valid) const {
    int codes[VEC];
    float vf[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      vf[k] = FloatElement<Scan>::to_acc(v.v[k]);
      codes[k] = code(vf[k], p);
    }
    VQ::template store<VECTOR_IO>(o.q + (VQ::packed ? out / 2 : out), valid, codes);
    if constexpr (loco) {
      float d[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) d[k] = dequantized(codes[k], p);
      loco_update<Err, VEC, VECTOR_IO>(o.error, src, valid, o.beta, o.one_minus_beta, vf, d);
    }
  }

  template <int U>
  __device__ __forceinline__ void store_unit(i64 i, i64 out, const float (&v)[U], const param_t (&p)[U]) const {
    int codes[U];
    float d[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      codes[k] = code(v[k], p[k]);
      d[k] = dequantized(codes[k], p[k]);
    }
    if constexpr (loco) loco_update<Err, U, false>(o.error, i, U, o.beta, o.one_minus_beta, v, d);
    store_code_unit<U, true>(o.q, out, codes);
  }
};

// MoQ: one group's scale (SYMMETRIC) or step (ASYMMETRIC) and minimum.
struct MoQParam {
  float a, lo;
  bool bad;
};

template <class In, int VEC, bool VECTOR_IO, bool STOCHASTIC>
struct MoQSink {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef ElementVector<in_t, VEC> vector_t;
  typedef MoQParam param_t;
  DeepSpeedOutputArgs o;

  template <class S, class Range>
  __device__ __forceinline__ param_t group_params(const Range& r) const {
    param_t p;
    p.bad = range_nonfinite<S>(r.amax_bits);
    const float levels = (float)(1 << o.bits);
    if (!o.asym) {
      const float den = __fadd_rn(__fmul_rn(2.0f, range_amax<S>(r.amax_bits)), 1e-5f);
      p.a = __fdiv_rn(levels, den);
      p.lo = 0.0f;
      p.bad = p.bad || !isfinite(den);
    } else {
      p.a = __fdiv_rn(__fadd_rn(__fsub_rn(r.hi, r.lo), 1e-5f), levels);
      p.lo = r.lo;
      p.bad = p.bad || !isfinite(p.a);
    }
    return p;
  }

  __device__ __forceinline__ void params(i64 g, const param_t& p) const {
    if (o.work) o.work[g] = make_float2(p.bad ? quiet_nan() : p.a, p.lo);
  }

  __device__ __forceinline__ param_t load_params(i64 g) const {
    const float2 w = o.work[g];
    param_t p;
    p.a = w.x;
    p.lo = w.y;
    p.bad = w.x != w.x;
    return p;
  }

  // The fake-quantized value of v (u: its uniform when STOCHASTIC).
  __device__ __forceinline__ float value(float v, const param_t& p, float u) const {
    if (p.bad) return quiet_nan();
    if (!o.asym) {
      const float w = __fmul_rn(v, p.a);
      float q;
      if constexpr (STOCHASTIC) {
        const float t = truncf(w);
        const float up = (u < fabsf(__fsub_rn(w, t))) ? 1.0f : 0.0f;
        q = __fadd_rn(t, w > 0.0f ? up : (w < 0.0f ? -up : 0.0f));
      } else {
        q = rintf(w);
      }
      const float lo = (float)(-(1 << (o.bits - 1))), hi = (float)((1 << (o.bits - 1)) - 1);
      return __fdiv_rn(fminf(fmaxf(q, lo), hi), p.a);
    }
    const float w = __fdiv_rn(__fsub_rn(v, p.lo), p.a);
    float q;
    if constexpr (STOCHASTIC) {
      const float f = floorf(w);
      q = __fadd_rn(f, (u < __fsub_rn(w, f)) ? 1.0f : 0.0f);
    } else {
      q = roundf(w);
    }
    return __fadd_rn(__fmul_rn(q, p.a), p.lo);
  }

  __device__ __forceinline__ void vector(i64 src, i64, const vector_t& v, const param_t& p, int valid) const {
    float u[VEC];
    if constexpr (STOCHASTIC) philox_uniforms<VEC>((u64)src, o.seed, o.offset, u);
    float y[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) y[k] = value(FE::to_acc(v.v[k]), p, STOCHASTIC ? u[k] : 0.0f);
    const ElementVector<in_t, VEC> r = vector_from_acc<In, VEC>(y);
    r.template store<VECTOR_IO>(reinterpret_cast<in_t*>(o.q) + src, valid);
  }

  template <int U>
  __device__ __forceinline__ void store_unit(i64 i, i64, const float (&v)[U], const param_t (&p)[U]) const {
#pragma unroll
    for (int k = 0; k < U; ++k) {
      float u[1] = {0.0f};
      if constexpr (STOCHASTIC) philox_uniforms<1>((u64)(i + k), o.seed, o.offset, u);
      reinterpret_cast<in_t*>(o.q)[i + k] = FE::from_acc(value(v[k], p[k], u[0]));
    }
  }
};

// DeepSpeed's dequantization of a peer's code: y = q * p0 (SYMMETRIC) or (q * p0) + p1
// (ASYMMETRIC, two roundings). PeerSumArgs.scale points at the rows ([g][1] or [g][2] floats);
// a non-null zp marks ASYMMETRIC (its value is not read).
struct DeepSpeedPeerDecode {
  struct param_t {
    float inv, offset;
    bool asym;
  };
  static __device__ __forceinline__ param_t param(const PeerSumArgs& a, i64 at) {
    param_t p;
    p.asym = a.zp != nullptr;
    p.inv = a.scale[p.asym ? 2 * at : at];
    p.offset = p.asym ? a.scale[2 * at + 1] : 0.0f;
    return p;
  }
  static __device__ __forceinline__ float value(int code, const param_t& p) {
    const float y = __fmul_rn((float)code, p.inv);
    return p.asym ? __fadd_rn(y, p.offset) : y;
  }
};

}  // namespace qp
