// qp_deepspeed_format.cuh: DeepSpeed's quantizer formulas as sinks and a peer decoding for the
// qgZ loops of qp_qgz.cuh (kernels/deepspeed_format.cu; quantplan/ops/deepspeed_format.py).
// Facts: DEEPSPEED_FORMAT.md; the NumPy twin is quantplan/reference/deepspeed_format.py.
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

// Mirrored by DeepSpeedOutputArgs in quantplan/ops/deepspeed_format.py.
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

// One group's stored parameters in DeepSpeed's layout: rows of 1 float (1/scale; SYMMETRIC) or 2
// (1/scale, offset; ASYMMETRIC). The row index is computed in the caller's index type.
template <class Index>
__device__ __forceinline__ void store_group_params(float* params, Index g, float inv, float offset, bool asym) {
  if (asym) {
    params[2 * g] = inv;
    params[2 * g + 1] = offset;
  } else {
    params[g] = inv;
  }
}

template <class Scan, class Out, class Err, int VEC, bool VECTOR_IO>
struct DeepSpeedCodeSink {
  typedef VectorQuantizer<Scan, Out, VEC, true> VQ;  // storage only: signed codes, high nibble first
  typedef typename VQ::vector_t vector_t;
  typedef DeepSpeedParam param_t;
  static const bool loco = ErrorStorage<Err>::loco;
  DeepSpeedOutputArgs o;

  static __device__ __forceinline__ param_t finish(float mult, float offset, bool bad) {
    param_t p;
    p.bad = bad;
    p.mult = mult;
    p.offset = bad ? quiet_nan() : offset;
    p.inv = bad ? quiet_nan() : __fdiv_rn(1.0f, mult);
    return p;
  }

  // DeepSpeed's parameters of a group with range (lo, hi) (ASYMMETRIC) or |x|max absmax, `bad`
  // when it holds a NaN / +-Inf: IEEE divisions (deepspeed_dense_params is the division-free form).
  static __device__ __forceinline__ param_t params_of(float lo, float hi, float absmax, bool bad, int bits,
                                                      bool asym) {
    if (!asym) {
      const float mult = absmax == 0.0f ? 1.0f : __fdiv_rn((float)(1 << (bits - 1)), absmax);
      return finish(mult, 0.0f, bad);
    }
    const float span = __fsub_rn(hi, lo);
    const float offset = __fdiv_rn(__fadd_rn(hi, lo), 2.0f);
    bad = bad || !isfinite(span) || !isfinite(offset);
    const float mult = span == 0.0f ? 1.0f : __fdiv_rn((float)(1 << bits), span);
    return finish(mult, offset, bad);
  }

  template <class S, class Range>
  __device__ __forceinline__ param_t group_params(const Range& r) const {
    return params_of(r.lo, r.hi, range_amax<S>(r.amax_bits), range_nonfinite<S>(r.amax_bits), o.bits, o.asym);
  }

  __device__ __forceinline__ void params(i64 g, const param_t& p) const {
    store_group_params(o.params, g, p.inv, p.offset, o.asym != 0);
    if (o.work) o.work[g] = make_float2(p.bad ? quiet_nan() : p.mult, p.offset);
  }

  __device__ __forceinline__ param_t load_params(i64 g) const {
    const float2 w = o.work[g];
    return finish(w.x, w.y, w.x != w.x);
  }

  static __device__ __forceinline__ int code_of(float v, const param_t& p, int bits, bool asym) {
    if (p.bad) return 0;
    return deepspeed_clamped_code(__fmul_rn(asym ? __fsub_rn(v, p.offset) : v, p.mult), -(1 << (bits - 1)),
                                  (1 << (bits - 1)) - 1);
  }

  __device__ __forceinline__ int code(float v, const param_t& p) const { return code_of(v, p, o.bits, o.asym); }

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
    store_sink_unit<U, true, loco, Err>(
        o, i, out, v, [&](int k) { return code(v[k], p[k]); },
        [&](int k, const int (&codes)[U]) { return dequantized(codes[k], p[k]); });
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

  // MoQ's parameters of a group with range (lo, hi) (ASYMMETRIC) or |x|max absmax.
  static __device__ __forceinline__ param_t params_of(float lo, float hi, float absmax, bool bad, int bits,
                                                      bool asym) {
    param_t p;
    p.bad = bad;
    const float levels = (float)(1 << bits);
    if (!asym) {
      const float den = __fadd_rn(__fmul_rn(2.0f, absmax), 1e-5f);
      p.a = __fdiv_rn(levels, den);
      p.lo = 0.0f;
      p.bad = p.bad || !isfinite(den);
    } else {
      p.a = __fdiv_rn(__fadd_rn(__fsub_rn(hi, lo), 1e-5f), levels);
      p.lo = lo;
      p.bad = p.bad || !isfinite(p.a);
    }
    return p;
  }

  template <class S, class Range>
  __device__ __forceinline__ param_t group_params(const Range& r) const {
    return params_of(r.lo, r.hi, range_amax<S>(r.amax_bits), range_nonfinite<S>(r.amax_bits), o.bits, o.asym);
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
    return value_of(v, p, u, o.bits, o.asym);
  }

  static __device__ __forceinline__ float value_of(float v, const param_t& p, float u, int bits, bool asym) {
    if (p.bad) return quiet_nan();
    if (!asym) {
      const float w = __fmul_rn(v, p.a);
      float q;
      if constexpr (STOCHASTIC) {
        const float t = truncf(w);
        const float up = (u < fabsf(__fsub_rn(w, t))) ? 1.0f : 0.0f;
        q = __fadd_rn(t, w > 0.0f ? up : (w < 0.0f ? -up : 0.0f));
      } else {
        q = rintf(w);
      }
      const float lo = (float)(-(1 << (bits - 1))), hi = (float)((1 << (bits - 1)) - 1);
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

// The source of the DeepSpeed-format reduction: the peers' codes of `in` decoded with their
// stored rows (DeepSpeedPeerDecode) and summed, plus the LoCo buffer of `out` (Err).
template <class Code, class Err, int VEC, bool VECTOR_IO>
struct DeepSpeedReduceSource {
  typedef PeerSumSource<Code, Err, VEC, VECTOR_IO, true, DeepSpeedPeerDecode> type;
  static __device__ __forceinline__ type make(const PeerSumArgs& in, const DeepSpeedOutputArgs& out) {
    return type{in, reinterpret_cast<const typename type::err_t*>(out.error)};
  }
};

// ---- the dense passes: DeepSpeed's formulas on the hot layout ----
// deepspeed_quantize_dense / moq_fake_quantize_dense (deepspeed_format.cu): the fused pass
// specialised for 16-bit input in groups of exactly team * 8 * NV elements (team a power of
// two, at most one block of QP_DS_DENSE_BLOCK threads), 16-byte aligned operands, no LoCo
// buffer, fewer than 2^31 elements; MoQ with nearest rounding. Against the generic fused pass
// (qgz_fused_segments: 57 registers, 50% occupancy, 64-bit addressing and bounds tests per
// vector, IEEE divisions per group) it
//  * holds the thread's NV 16-byte vectors in registers (loaded together, then scanned) and
//    reduces the group's range as one packed word: SYMMETRIC the |x| bit maxima of two halves,
//    ASYMMETRIC (the group's own range) the NaN-propagating pair (-min, max) (a NaN or +-Inf
//    shows in it), xor shuffles within a warp and, for teams spanning warps, one slot per warp
//    in shared memory (double-buffered: one barrier per group);
//  * computes the parameters without a division (below) and quantizes with one multiply, the
//    rounding add and an integer clamp per element; the codes are the low bytes (nibbles) of the
//    rounding words, packed by byte permutes (qgz_dense_store_codes);
//  * takes a group outside the division-free range (NaN / +-Inf, an extreme range) on the
//    generic formulas, out of line, reading its elements again.
// Division-free parameters (DeepSpeedCodeSink's, bit for bit): c = 2^(b-1) (SYMMETRIC, over
// |x|max) or 2^b (ASYMMETRIC, over the span max - min) is a power of two, so for a base B in
// [2^-100, 2^100] rn(c / B) = c * rn(1 / B) exactly (scaling by a power of two commutes with
// rounding in the normal range); the stored 1 / mult is rn(1 / mult) (__frcp_rn is IEEE); the
// offset rn(rn(max + min) / 2) is rn(max + min) * 0.5 (the same real number). A base of 0 gives
// mult 1 (every element equals the offset: codes 0).
// Codes: w = rn(v * mult) (SYMMETRIC) or rn(rn(v - offset) * mult). SYMMETRIC |v| <= B and
// mult <= (c / B)(1 + 2^-24) bound |w| <= c (1 + 2^-23), so rne(w) lies in [-c, c] and only
// the upper bound c - 1 can bind; ASYMMETRIC clamps both ends. |w| < 2^22, so the rounding word
// rn(w + 1.5 * 2^23) holds rne(w) in its low bits (QP_RNE_MAGIC).
// MoQ SYMMETRIC nearest: q = min(rne(rn(v * scale)), 2^(b-1) - 1) (the same bound: |q| <= 2^(b-1)),
// y = fl(q / scale) by Markstein's correction from rn(1 / scale) (qp_rounding.cuh: exact for
// scale in [2^-60, 2^100], |q| >= 1; q = +-0 keeps its sign); other MoQ groups (ASYMMETRIC, or a
// scale outside that range) take MoQSink::value_of, the IEEE formulas.

// Resident blocks per multiprocessor the dense passes are compiled for (32 registers).

// A thread's packed range word of NV vectors of 8 16-bit floats (see above): qp_range.cuh's
// range_word_n, the asymmetric minima / maxima started from +Inf / -Inf pairs.
template <class In, bool ASYM, int NV>
__device__ __forceinline__ u32 ds_range_word(const uint4 (&v)[NV]) {
  typedef FloatBits<In> FB;
  return range_word_n<In, ASYM ? 1 : 0, NV>(v, FB::inf * 0x10001u, (FB::inf | 0x8000u) * 0x10001u);
}

// Two range words combined (qp_range.cuh's range_combine).
template <class In, bool ASYM>
__device__ __forceinline__ u32 ds_range_combine(u32 a, u32 b) {
  return range_combine<In, ASYM ? 1 : 0>(a, b);
}

// A value reduced over a team of `team` threads (aligned, a power of two) in a fixed order:
// `step(r, d)` combines r with lane ^ d's (shuffles), `combine(r, o)` combines r with o; BREAK:
// the shuffle loop leaves at the team's size instead of skipping the steps above it. Every
// thread of the block calls this with the same team; `slots` holds one value per warp (this
// group's buffer).
template <bool BREAK, class T, class Step, class Combine>
__device__ __forceinline__ T ds_team_reduce(T r, int team, T* slots, Step step, Combine combine) {
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {  // steps at or above the team are skipped (uniform branches)
    if (BREAK && d >= team) break;    // each caller takes the loop form that suits it
    if (BREAK || d < team) step(r, d);
  }
  if (team <= 32) return r;
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) slots[warp] = r;
  __syncthreads();
  const int warps = team >> 5, first = warp & ~(warps - 1);
  r = slots[first];
#pragma unroll
  for (int k = 1; k < QP_DS_DENSE_BLOCK / 32; ++k)
    if (k < warps) combine(r, slots[first + k]);
  return r;
}

// The range word of a team of `team` threads (ds_team_reduce of ds_range_combine).
template <class In, bool ASYM>
__device__ __forceinline__ u32 ds_team_range(u32 r, int team, u32* slots) {
  return ds_team_reduce<false>(
      r, team, slots, [](u32& w, int d) { w = ds_range_combine<In, ASYM>(w, __shfl_xor_sync(0xFFFFFFFFu, w, d)); },
      [](u32& w, const u32& o) { w = ds_range_combine<In, ASYM>(w, o); });
}

// The group range of a reduced word: (lo, hi) (ASYMMETRIC) or |x|max, and whether it is not finite.
template <class In, bool ASYM>
__device__ __forceinline__ void ds_range_values(u32 r, float& lo, float& hi, float& absmax, bool& bad) {
  typedef FloatElement<In> FE;
  typedef FloatBits<In> FB;
  if constexpr (ASYM) {
    const u32 nlo = r & 0xFFFFu, hb = r >> 16;
    bad = (nlo & 0x7FFFu) >= FB::inf || (hb & 0x7FFFu) >= FB::inf;
    lo = -FE::to_acc((u16)nlo);
    hi = FE::to_acc((u16)hb);
    absmax = 0.0f;
  } else {
    const u32 a = max(r & 0xFFFFu, r >> 16);
    bad = a >= FB::inf;
    absmax = FE::to_acc((u16)a);
    lo = hi = 0.0f;
  }
}

// The group loop of the dense passes: groups of team = 1 << lay.seg_log2 threads, per block and
// step blockDim.x / team groups (block-uniform, so every thread reaches a team reduction's
// barriers). step(seg, lane, team, active, parity): this thread's part of group seg (which exists
// when active), lane its rank in the team, parity the step's shared-slot half.
template <class Step>
__device__ __forceinline__ void ds_dense_group_loop(const SegmentLayout& lay, Step step) {
  const int team_log2 = lay.seg_log2, team = 1 << team_log2;
  const int lane = threadIdx.x & (team - 1);
  const u32 per_block = blockDim.x >> team_log2;
  const u32 segments = (u32)lay.segments;
  const u32 stride = gridDim.x * per_block;
  int parity = 0;
  for (u32 base = blockIdx.x * per_block; base < segments; base += stride, parity ^= 1) {
    const u32 seg = base + (threadIdx.x >> team_log2);
    step(seg, lane, team, seg < segments, parity);
  }
}

// The dense passes over 16-bit input: groups of S = team * 8 * NV elements (ds_dense_group_loop).
// body(seg, lane, v, r): the thread's vectors (columns (lane + w * team) * 8) and the group's range
// word, for the threads of a group that exists. Plain loads: MoQ's pass may write x in place.
template <class In, bool ASYM, int NV, class Body>
__device__ __forceinline__ void ds_dense_groups(const typename FloatElement<In>::storage* x, const SegmentLayout& lay,
                                                Body body) {
  __shared__ u32 slots[2][QP_DS_DENSE_BLOCK / 32];
  ds_dense_group_loop(lay, [&](u32 seg, int lane, int team, bool active, int parity) {
    uint4 v[NV];
    if (active) {
      const uint4* src = reinterpret_cast<const uint4*>(x + (i64)seg * lay.S) + lane;
#pragma unroll
      for (int w = 0; w < NV; ++w) v[w] = src[w * team];
    } else {
#pragma unroll
      for (int w = 0; w < NV; ++w) v[w] = make_uint4(0u, 0u, 0u, 0u);
    }
    const u32 r = ds_team_range<In, ASYM>(ds_range_word<In, ASYM, NV>(v), team, slots[parity]);
    if (active) body(seg, lane, v, r);
  });
}

// The two 16-bit floats of a word as floats (element 0 in the low half).
template <class In>
__device__ __forceinline__ void ds_pair(u32 w, float& a, float& b) {
  a = FloatElement<In>::to_acc((u16)(w & 0xFFFFu));
  b = FloatElement<In>::to_acc((u16)(w >> 16));
}

// rn(1 / s) for s in [2^-126, 2^125]: the sequence __frcp_rn runs there (MUFU.RCP and its
// correction), without the out-of-line slow path it keeps for other exponents.
__device__ __forceinline__ float ds_rcp_rn(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  const float e = -__fmaf_rn(s, r, -1.0f);
  return __fmaf_rn(r, e, r);
}

// SwizzleMap's group map in 32-bit arithmetic (its quotients for groups below 2^31; the dense
// passes serve fewer than 2^31 elements).
__device__ __forceinline__ u32 ds_map32(const SwizzleMap& m, u32 g) {
  if (m.pipeline == 1 && (m.nodes == 1 || m.devices_per_node == 1)) return g;
  const u32 sg = (u32)m.slice_groups, k = g / sg, r = g - k * sg;
  const u32 p = k % (u32)m.pipeline, z = k / (u32)m.pipeline;
  const u32 node = z / (u32)m.devices_per_node, device = z - node * (u32)m.devices_per_node;
  return ((p * (u32)m.devices_per_node + device) * (u32)m.nodes + node) * sg + r;
}

// Division-free DeepSpeed parameters (see above): `fast` false sends the group to the generic path.
struct DeepSpeedDenseParam {
  float mult, offset, inv;
  bool fast;
};

template <bool ASYM, int BITS>
__device__ __forceinline__ DeepSpeedDenseParam deepspeed_dense_params(float lo, float hi, float absmax, bool bad) {
  DeepSpeedDenseParam p;
  const float base = ASYM ? __fsub_rn(hi, lo) : absmax;
  p.offset = ASYM ? __fmul_rn(__fadd_rn(hi, lo), 0.5f) : 0.0f;
  p.fast = !bad && isfinite(p.offset) &&
           (base == 0.0f || (base >= 7.888609052210118e-31f && base <= 1.2676506002282294e+30f));
  // Fast: base and mult within [2^-100, 2^108], where ds_rcp_rn is __frcp_rn.
  p.mult = base == 0.0f ? 1.0f : __fmul_rn(ds_rcp_rn(base), (float)(1 << (ASYM ? BITS : BITS - 1)));
  p.inv = ds_rcp_rn(p.mult);
  return p;
}

// The code of v (in the low byte / nibble of the result), division-free.
template <bool ASYM, int BITS>
__device__ __forceinline__ int deepspeed_dense_code(float v, const DeepSpeedDenseParam& p) {
  const int hi_bits = QP_RNE_MAGIC_BITS + (1 << (BITS - 1)) - 1, lo_bits = QP_RNE_MAGIC_BITS - (1 << (BITS - 1));
  const float t = ASYM ? __fsub_rn(v, p.offset) : v;
  const int b = min(__float_as_int(__fadd_rn(__fmul_rn(t, p.mult), QP_RNE_MAGIC)), hi_bits);
  return ASYM ? max(b, lo_bits) : b;
}

// The codes of the 8 elements of v (their low byte / nibble), division-free.
template <class In, bool ASYM, int BITS>
__device__ __forceinline__ void deepspeed_dense_codes(const uint4& v, const DeepSpeedDenseParam& p, int (&c)[8]) {
  const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float e[2];
    ds_pair<In>(words[k], e[0], e[1]);
    c[2 * k] = deepspeed_dense_code<ASYM, BITS>(e[0], p);
    c[2 * k + 1] = deepspeed_dense_code<ASYM, BITS>(e[1], p);
  }
}

// A dense group on the division-free path: lane 0 stores the group's parameters (row g), then
// each of the thread's NV vectors of 8 (columns (lane + w * team) * 8 of the group, whose codes
// start at qs) is coded by codes(w, c) and stored.
template <class Code, bool ASYM, int NV, class Index, class Codes>
__device__ __forceinline__ void deepspeed_dense_store(u8* qs, float* params, Index g, int lane, int team,
                                                      const DeepSpeedDenseParam& p, Codes codes) {
  constexpr bool packed = QuantElement<Code>::kind == 1;
  if (lane == 0) store_group_params(params, g, p.inv, p.offset, ASYM);
#pragma unroll
  for (int w = 0; w < NV; ++w) {
    const int col = (lane + w * team) * 8;
    int c[8];
    codes(w, c);
    qgz_dense_store_codes<Code, true, 8>(qs + (packed ? col / 2 : col), c);
  }
}

// A group of deepspeed_quantize_dense outside the division-free path: DeepSpeedCodeSink's
// formulas (IEEE divisions), the thread's NV vectors read again from xs; lane 0 writes the row
// (when `params` is not null).
template <class In, class Code, int NV>
__device__ __noinline__ void deepspeed_dense_generic(const typename FloatElement<In>::storage* xs, u8* qs,
                                                     float* params, i64 og, int lane, int team, float lo, float hi,
                                                     float absmax, bool bad, bool asym) {
  typedef DeepSpeedCodeSink<In, Code, no_error, 8, true> Sink;
  typedef VectorQuantizer<In, Code, 8, true> VQ;
  constexpr int bits = QuantElement<Code>::kind == 1 ? 4 : 8;
  const DeepSpeedParam p = Sink::params_of(lo, hi, absmax, bad, bits, asym);
  if (lane == 0 && params != nullptr) store_group_params(params, og, p.inv, p.offset, asym);
  typedef ElementVector<typename FloatElement<In>::storage, 8> Vector;
  for_each_team_vector8<NV>(xs, lane, team, [&](int col, const Vector& xv) {
    int c[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) c[k] = Sink::code_of(FloatElement<In>::to_acc(xv.v[k]), p, bits, asym);
    VQ::template store<true>(qs + (VQ::packed ? col / 2 : col), 8, c);
  });
}

// A group of moq_fake_quantize_dense outside the fast path: MoQSink::value_of (IEEE formulas),
// the thread's NV vectors read again (in place: this thread has written none of them yet).
template <class In, int NV>
__device__ __noinline__ void moq_dense_generic(const typename FloatElement<In>::storage* xs,
                                               typename FloatElement<In>::storage* ys, int lane, int team,
                                               const MoQParam p, int bits, bool asym) {
  typedef MoQSink<In, 8, true, false> Sink;
  typedef ElementVector<typename FloatElement<In>::storage, 8> Vector;
  for_each_team_vector8<NV>(xs, lane, team, [&](int col, const Vector& xv) {
    float y[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) y[k] = Sink::value_of(FloatElement<In>::to_acc(xv.v[k]), p, 0.0f, bits, asym);
    vector_from_acc<In, 8>(y).template store<true>(ys + col, 8);
  });
}

// MoQ SYMMETRIC nearest of the 8 elements of v under scale a (inv = rn(1 / a), `fast`), hi the
// top code 2^(b-1) - 1: the 8 values, rounded to In.
template <class In>
__device__ __forceinline__ uint4 moq_dense_values(const uint4& v, float a, float inv, float hi) {
  const u32 words[4] = {v.x, v.y, v.z, v.w};
  float y[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float e[2];
    ds_pair<In>(words[k], e[0], e[1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float q = fminf(rintf(__fmul_rn(e[h], a)), hi);
      const float t = __fmul_rn(q, inv);
      const float r = -__fmaf_rn(t, a, -q);
      y[2 * k + h] = __fmaf_rn(r, inv, t);
    }
  }
  ElementVector<typename FloatElement<In>::storage, 8> out = vector_from_acc<In, 8>(y);
  return out.bytes.w[0];
}

// ---- one group over a thread-block cluster (sm_90) ----
// deepspeed_quantize_cluster / moq_fake_quantize_cluster (deepspeed_format.cu): few long groups
// (16 rows of 8192: a block per group would keep 16 multiprocessors busy). A group of S =
// QP_DS_CLUSTER_BLOCKS * blockDim.x * 8 16-bit floats takes a cluster of QP_DS_CLUSTER_BLOCKS
// blocks, one 16-byte vector per thread: each block reduces its share of the range word (shuffles,
// a slot per warp), warp 0 stores it into every block of the cluster (distributed shared
// memory), and after one cluster barrier every thread combines the shares locally. Parameters,
// codes and the out-of-line generic path are those of the dense passes.
#if __CUDA_ARCH__ >= 900
#define QP_DS_CLUSTER_DIMS __cluster_dims__(QP_DS_CLUSTER_BLOCKS, 1, 1)
#else
#define QP_DS_CLUSTER_DIMS
#endif

// The neutral range word: SYMMETRIC 0; ASYMMETRIC a pair of -Inf halves (the (-min, max) pair
// holds any sign with the group's own range).
template <class In, bool ASYM>
__device__ __forceinline__ u32 ds_range_identity() {
  return ASYM ? (FloatBits<In>::inf | 0x8000u) * 0x10001u : 0u;
}

// Phase 1 of the cluster reduction: arrive before the loads (waited on before the first remote store).
__device__ __forceinline__ void ds_cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  cluster_arrive_relaxed();
#endif
}

// The range word of the cluster's group (every thread of every block of the cluster calls this,
// after ds_cluster_arrive): qp_range.cuh's cluster_reduce_word with DeepSpeed's range combine;
// `warp_slots` one word per warp, `shares` one per block of the cluster.
template <class In, bool ASYM>
__device__ __forceinline__ u32 ds_cluster_range(u32 r, u32* warp_slots, u32* shares) {
#if __CUDA_ARCH__ >= 900
  return cluster_reduce_word<QP_DS_CLUSTER_BLOCKS>(r, ds_range_identity<In, ASYM>(), warp_slots, shares,
                                                   [](u32 a, u32 b) { return ds_range_combine<In, ASYM>(a, b); });
#else
  return r;
#endif
}

// ---- the dense reduction: quantized_reduction on the hot layout ----
// deepspeed_reduce_dense (deepspeed_format.cu): output groups of exactly team * 8 * NV elements,
// input groups a multiple of 8 (a thread's 8 consecutive codes share one input group), no LoCo
// buffer, aligned codes, fewer than 2^31 codes. Each thread sums its NV vectors of 8 elements
// over the peers in peer order (DeepSpeedPeerDecode's q * p0 (+ p1), float32), keeps the sums in
// registers, reduces the group's range over the team (|x| bit maxima as the non-finite flag,
// own min / max) and writes the codes with deepspeed_dense_params / deepspeed_dense_code; a
// group outside the division-free path takes DeepSpeedCodeSink's formulas, out of line.
// A code becomes a float without a conversion instruction: the biased code (q + 8, or q + 128:
// the unsigned nibble / byte with its top bit flipped) is placed in the low mantissa bits of
// 2^23 by one logic operation, and 2^23 + bias subtracted exactly.

// Resident blocks per multiprocessor deepspeed_reduce_dense is compiled for (its float sums and
// the peers' loads in flight need 40 registers).

struct DsFloatRange {
  u32 amax;      // the largest |x| bit pattern (>= the Inf pattern: NaN / +-Inf in the group)
  float lo, hi;  // the group's own minimum / maximum (ASYMMETRIC)
};

template <bool ASYM>
__device__ __forceinline__ void ds_float_range_combine(DsFloatRange& r, const DsFloatRange& o) {
  r.amax = max(r.amax, o.amax);
  if (ASYM) {
    r.lo = fminf(r.lo, o.lo);
    r.hi = fmaxf(r.hi, o.hi);
  }
}

// The range of a team of `team` threads (ds_team_reduce of ds_float_range_combine; `slots`:
// this group's buffer).
template <bool ASYM>
__device__ __forceinline__ DsFloatRange ds_team_float_range(DsFloatRange r, int team, DsFloatRange* slots) {
  return ds_team_reduce<true>(
      r, team, slots,
      [](DsFloatRange& x, int d) {
        DsFloatRange o;
        o.amax = __shfl_xor_sync(0xFFFFFFFFu, x.amax, d);
        if (ASYM) {
          o.lo = __shfl_xor_sync(0xFFFFFFFFu, x.lo, d);
          o.hi = __shfl_xor_sync(0xFFFFFFFFu, x.hi, d);
        }
        ds_float_range_combine<ASYM>(x, o);
      },
      [](DsFloatRange& x, const DsFloatRange& o) { ds_float_range_combine<ASYM>(x, o); });
}

// s[k] = sum over peers j (in order) of DeepSpeed's dequantization of code i + k of peer j.
template <class Code, bool ASYM>
__device__ __forceinline__ void ds_peer_sum8(const PeerSumArgs& a, u32 i, float (&s)[8]) {
  constexpr bool packed = QuantElement<Code>::kind == 1;
  const u32 g = a.in_group_shift >= 0 ? i >> a.in_group_shift : i / (u32)a.in_group;
#pragma unroll 4
  for (int j = 0; j < a.peers; ++j) {
    const u8* q = a.q + (i64)j * a.peer_bytes;
    const i64 at = (i64)j * a.peer_params + g;
    const float inv = a.scale[ASYM ? 2 * at : at];
    const float off = ASYM ? a.scale[2 * at + 1] : 0.0f;
    float c[8];
    if constexpr (packed) {
      const u32 w = *reinterpret_cast<const u32*>(q + i / 2);
#pragma unroll
      for (int m = 0; m < 4; ++m) {  // byte m: element 2m in the high nibble
        c[2 * m] = __fsub_rn(__int_as_float(((w >> (8 * m + 4)) & 0xFu) ^ 0x4B000008u), 8388616.0f);
        c[2 * m + 1] = __fsub_rn(__int_as_float(((w >> (8 * m)) & 0xFu) ^ 0x4B000008u), 8388616.0f);
      }
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(q + i);
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        c[m] = __fsub_rn(__int_as_float(((w.x >> (8 * m)) & 0xFFu) ^ 0x4B000080u), 8388736.0f);
        c[m + 4] = __fsub_rn(__int_as_float(((w.y >> (8 * m)) & 0xFFu) ^ 0x4B000080u), 8388736.0f);
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float y = __fmul_rn(c[k], inv);
      if (ASYM) y = __fadd_rn(y, off);
      s[k] = j == 0 ? y : __fadd_rn(s[k], y);
    }
  }
}

struct DsFloat8 {
  float v[8];
};

// A group of deepspeed_reduce_dense outside the division-free path: the codes of 8 sums by
// DeepSpeedCodeSink's formulas (the parameter row is written by the caller's lane 0).
template <class Code>
__device__ __noinline__ void deepspeed_float_generic_codes(const DsFloat8 v, u8* dst, const DeepSpeedParam p,
                                                           bool asym) {
  typedef DeepSpeedCodeSink<f32, Code, no_error, 8, true> Sink;
  constexpr int bits = QuantElement<Code>::kind == 1 ? 4 : 8;
  int c[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) c[k] = Sink::code_of(v.v[k], p, bits, asym);
  VectorQuantizer<f32, Code, 8, true>::template store<true>(dst, 8, c);
}

}  // namespace qp
