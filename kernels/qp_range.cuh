// qp_range.cuh: the range (min, max, non-finite flag) of segments, and the parameters it gives.
//
// Two ways to reduce, both exact and independent of the order of elements:
//  * RangeAccumulator: order-preserving integer keys combined by integer atomics across blocks
//    (the multi-pass path of dynamic_range.cu);
//  * RangeScan + team_reduce_range: a team of threads that holds a whole segment scans its
//    registers on the storage words (16-bit floats two at a time) and combines by shuffles and
//    shared memory (the fused single pass).
// The non-finite flag is the maximum of |x|'s bit pattern: NaN and Inf patterns exceed every
// finite one, so max |bits| >= the Inf pattern exactly when the segment holds NaN or +-Inf.
#pragma once
#include "qp_elements.cuh"
#include "qp_vector_io.cuh"
#include "qp_rounding.cuh"
#include "qp_team.cuh"

namespace qp {

// Order-preserving integer key of a non-NaN float / double (signed compare).
__device__ __forceinline__ int range_key(float v) {
  const int b = __float_as_int(v);
  return b >= 0 ? b : b ^ 0x7FFFFFFF;
}
__device__ __forceinline__ i64 range_key(double v) {
  const i64 b = __double_as_longlong(v);
  return b >= 0 ? b : b ^ 0x7FFFFFFFFFFFFFFFll;
}
__device__ __forceinline__ float range_value(int k) { return __int_as_float(k >= 0 ? k : k ^ 0x7FFFFFFF); }
__device__ __forceinline__ double range_value(i64 k) {
  return __longlong_as_double(k >= 0 ? k : k ^ 0x7FFFFFFFFFFFFFFFll);
}

template <class Acc> struct RangeKey;
template <> struct RangeKey<float> { typedef int type; };
template <> struct RangeKey<double> { typedef long long type; };

// Running statistics of one thread for one segment.
template <class Acc> struct RangeAccumulator {
  typedef typename RangeKey<Acc>::type key_t;
  key_t lo, hi;
  int bad;
  __device__ __forceinline__ void reset() {
    lo = hi = range_key((Acc)0);
    bad = 0;
  }
  __device__ __forceinline__ void add(Acc v) {
    if (isfinite(v)) {
      const key_t k = range_key(v);
      lo = min(lo, k);
      hi = max(hi, k);
    } else {
      bad = 1;
    }
  }
  // Statistics slot s: [3 s] lo, [3 s + 1] hi, [3 s + 2] flag.
  __device__ __forceinline__ void publish(key_t* stats, i64 s) const {
    const key_t zero = range_key((Acc)0);
    if (lo < zero) atomicMin(stats + 3 * s, lo);
    if (hi > zero) atomicMax(stats + 3 * s + 1, hi);
    if (bad) stats[3 * s + 2] = 1;  // every writer stores the same value: no atomic needed
  }
};

template <class Acc>
__device__ __forceinline__ void warp_reduce_range(RangeAccumulator<Acc>& a) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    a.lo = min(a.lo, __shfl_xor_sync(0xFFFFFFFFu, a.lo, d));
    a.hi = max(a.hi, __shfl_xor_sync(0xFFFFFFFFu, a.hi, d));
    a.bad |= __shfl_xor_sync(0xFFFFFFFFu, a.bad, d);
  }
}

// ---- the scan of a team's registers ----

// Bits of |x| and their limits per float element: `abs_mask` clears the sign, `inf` is +Inf.
template <class In> struct FloatBits;
template <> struct FloatBits<f16> { typedef u32 type; static const u32 abs_mask = 0x7FFFu, inf = 0x7C00u; };
template <> struct FloatBits<bf16> { typedef u32 type; static const u32 abs_mask = 0x7FFFu, inf = 0x7F80u; };
template <> struct FloatBits<f32> { typedef u32 type; static const u32 abs_mask = 0x7FFFFFFFu, inf = 0x7F800000u; };
template <> struct FloatBits<f64> {
  typedef u64 type;
  static const u64 abs_mask = 0x7FFFFFFFFFFFFFFFull, inf = 0x7FF0000000000000ull;
};

// The range of a thread's (then a team's) elements: lo = min(min x, 0), hi = max(max x, 0)
// (NaN ignored), amax_bits = max of |x|'s bit pattern (NaN / Inf detection, and |x|max itself).
template <class Acc, class Bits> struct SegmentRange {
  Acc lo, hi;
  Bits amax_bits;
};

// The range of a team of `team` threads (a power of two, aligned; every thread of the block
// calls this): an unrolled xor butterfly inside the warp, then, for teams spanning warps, one
// slot per warp in shared memory. lo / hi take part only when `asym`. The butterfly steps at or
// above the width are skipped (BranchFree false), or exchange with the lane itself (BranchFree:
// d & (width - 1) is 0 there, which leaves the range unchanged; the qgZ pass's form).
template <bool BranchFree>
__device__ __forceinline__ void team_range_reduce(SegmentRange<float, u32>& r, bool asym, int team,
                                                  SegmentRange<float, u32>* slots) {
  auto step = [&](int d) {
    r.amax_bits = max(r.amax_bits, __shfl_xor_sync(0xFFFFFFFFu, r.amax_bits, d));
    if (asym) {
      r.lo = fminf(r.lo, __shfl_xor_sync(0xFFFFFFFFu, r.lo, d));
      r.hi = fmaxf(r.hi, __shfl_xor_sync(0xFFFFFFFFu, r.hi, d));
    }
  };
  auto butterfly = [&](int width) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      if (BranchFree)
        step(d & (width - 1));
      else if (d < width)
        step(d);
    }
  };
  butterfly(team);
  if (team <= 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the previous segment's readers are done with the slots
  if (lane == 0) slots[warp] = r;
  __syncthreads();
  const int warps = team >> 5;
  r = slots[(warp & ~(warps - 1)) + (lane & (warps - 1))];
  butterfly(warps);
}

// Packed pairs of 16-bit floats: per-half min / max in the storage format (PTX, sm_80+) and the
// per-half unsigned max of |x| bits (one instruction on sm_90).
// NaN-propagating forms (.NaN: a NaN in either half gives a NaN half) serve scans that need no
// separate non-finite test (dynamic_quantize_dense).
#define QP_HALF_PAIR_OP(name, instruction)                              \
  static __device__ __forceinline__ u32 name(u32 a, u32 b) {            \
    u32 d;                                                              \
    asm(instruction " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));         \
    return d;                                                           \
  }
// NAME_halves(a): the operation of a word's two halves, in the low half (the high half: the
// operation of the high half with itself).
#define QP_HALF_HALVES_OP(NAME, OP)                                                                         \
  static __device__ __forceinline__ u32 NAME(u32 a) {                                                      \
    u32 d;                                                                                                 \
    asm("{.reg .b16 l, h; .reg .b32 hh; mov.b32 {l, h}, %1; mov.b32 hh, {h, h}; " OP " %0, %1, hh;}" \
        : "=r"(d)                                                                                          \
        : "r"(a));                                                                                         \
    return d;                                                                                              \
  }
template <class In> struct HalfPairs;
template <> struct HalfPairs<f16> {
  QP_HALF_PAIR_OP(min2, "min.f16x2")
  QP_HALF_PAIR_OP(max2, "max.f16x2")
  QP_HALF_PAIR_OP(min_nan, "min.NaN.f16x2")
  QP_HALF_PAIR_OP(max_nan, "max.NaN.f16x2")
  QP_HALF_HALVES_OP(min_nan_halves, "min.NaN.f16x2")
  QP_HALF_HALVES_OP(max_nan_halves, "max.NaN.f16x2")
};
template <> struct HalfPairs<bf16> {
  QP_HALF_PAIR_OP(min2, "min.bf16x2")
  QP_HALF_PAIR_OP(max2, "max.bf16x2")
  QP_HALF_PAIR_OP(min_nan, "min.NaN.bf16x2")
  QP_HALF_PAIR_OP(max_nan, "max.NaN.bf16x2")
  QP_HALF_HALVES_OP(min_nan_halves, "min.NaN.bf16x2")
  QP_HALF_HALVES_OP(max_nan_halves, "max.NaN.bf16x2")
};
#undef QP_HALF_PAIR_OP
#undef QP_HALF_HALVES_OP

__device__ __forceinline__ u32 max_u16x2(u32 a, u32 b) {
#if __CUDA_ARCH__ >= 900
  u32 d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return max(a & 0xFFFFu, b & 0xFFFFu) | (max(a >> 16, b >> 16) << 16);
#endif
}

// One thread's scan. ASYMMETRIC needs lo and hi; SYMMETRIC only amax_bits. reset() starts lo
// and hi at 0 (SPEC section 4: the range always holds zero); reset(true) starts them at +Inf /
// -Inf, so they become the segment's own minimum and maximum (the DeepSpeed-format formulas).
template <class In> struct RangeScan {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  typedef typename FloatBits<In>::type bits_t;
  acc_t lo, hi;
  bits_t amax_bits;
  __device__ __forceinline__ void reset(bool own_range = false) {
    const acc_t inf = (acc_t)__int_as_float(0x7F800000);
    lo = own_range ? inf : (acc_t)0;
    hi = own_range ? -inf : (acc_t)0;
    amax_bits = 0;
  }
  template <int VEC>
  __device__ __forceinline__ void add(const ElementVector<in_t, VEC>& xv, bool asym) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const acc_t v = FE::to_acc(xv.v[k]);
      bits_t b;
      if constexpr (sizeof(in_t) == 8) {
        b = (bits_t)__double_as_longlong(v);
      } else {
        b = __float_as_uint(v);
      }
      amax_bits = max(amax_bits, b & FloatBits<In>::abs_mask);
      if (asym) {
        lo = fmin(lo, v);
        hi = fmax(hi, v);
      }
    }
  }
  __device__ __forceinline__ SegmentRange<acc_t, bits_t> result() const { return {lo, hi, amax_bits}; }
};

template <class Half> struct RangeScanHalf {
  typedef FloatElement<Half> FE;
  typedef u16 in_t;
  typedef float acc_t;
  typedef u32 bits_t;
  u32 lo2, hi2, amax2;  // two halves each; +0.0 pairs (or +Inf / -Inf pairs: own range) at the start
  __device__ __forceinline__ void reset(bool own_range = false) {
    lo2 = own_range ? FloatBits<Half>::inf * 0x10001u : 0u;
    hi2 = own_range ? (FloatBits<Half>::inf | 0x8000u) * 0x10001u : 0u;
    amax2 = 0;
  }
  __device__ __forceinline__ void add_word(u32 w, bool asym) {
    amax2 = max_u16x2(amax2, w & 0x7FFF7FFFu);
    if (asym) {
      lo2 = HalfPairs<Half>::min2(lo2, w);
      hi2 = HalfPairs<Half>::max2(hi2, w);
    }
  }
  template <int VEC>
  __device__ __forceinline__ void add(const ElementVector<u16, VEC>& xv, bool asym) {
    if constexpr (VEC == 1) {
      add_word((u32)xv.v[0] * 0x10001u, asym);  // the value in both halves: neutral for every start
    } else {
#pragma unroll
      for (int k = 0; k < VEC / 2; ++k) add_word(xv.words[k], asym);
    }
  }
  __device__ __forceinline__ SegmentRange<float, u32> result() const {
    const float lo = fminf(FE::to_acc((u16)(lo2 & 0xFFFFu)), FE::to_acc((u16)(lo2 >> 16)));
    const float hi = fmaxf(FE::to_acc((u16)(hi2 & 0xFFFFu)), FE::to_acc((u16)(hi2 >> 16)));
    return {lo, hi, max(amax2 & 0xFFFFu, amax2 >> 16)};
  }
};
template <> struct RangeScan<f16> : RangeScanHalf<f16> {};
template <> struct RangeScan<bf16> : RangeScanHalf<bf16> {};

// |x|max of a range (the bits are those of the storage format) and whether it is non-finite.
template <class In>
__device__ __forceinline__ bool range_nonfinite(typename FloatBits<In>::type amax_bits) {
  return amax_bits >= FloatBits<In>::inf;
}
template <class In>
__device__ __forceinline__ typename FloatElement<In>::acc range_amax(typename FloatBits<In>::type amax_bits) {
  if constexpr (sizeof(typename FloatElement<In>::storage) == 2) {
    return FloatElement<In>::to_acc((u16)amax_bits);
  } else if constexpr (sizeof(typename FloatElement<In>::storage) == 8) {
    return __longlong_as_double((long long)amax_bits);
  } else {
    return __uint_as_float(amax_bits);
  }
}

// Combine two threads' ranges; lo / hi take part only when `asym`.
template <class Acc, class Bits>
__device__ __forceinline__ void combine_range(SegmentRange<Acc, Bits>& r, const SegmentRange<Acc, Bits>& o, bool asym) {
  r.amax_bits = max(r.amax_bits, o.amax_bits);
  if (asym) {
    r.lo = fmin(r.lo, o.lo);
    r.hi = fmax(r.hi, o.hi);
  }
}

// Butterfly over `width` lanes (xor shuffles): every lane ends with the group's range.
template <class Acc, class Bits>
__device__ __forceinline__ void shuffle_reduce_range(SegmentRange<Acc, Bits>& r, bool asym, int width) {
  for (int d = width >> 1; d > 0; d >>= 1) {
    SegmentRange<Acc, Bits> o;
    o.amax_bits = __shfl_xor_sync(0xFFFFFFFFu, r.amax_bits, d);
    if (asym) {
      o.lo = __shfl_xor_sync(0xFFFFFFFFu, r.lo, d);
      o.hi = __shfl_xor_sync(0xFFFFFFFFu, r.hi, d);
    }
    combine_range(r, o, asym);
  }
}

// Combine the ranges of a team of 1 << team_log2 threads (every thread of the block calls this;
// teams are aligned; see team_reduce in qp_team.cuh). Every thread of a team ends with the
// team's range; lo / hi take part only when `asym`.
template <class Acc, class Bits>
__device__ __forceinline__ void team_reduce_range(SegmentRange<Acc, Bits>& r, bool asym, int team_log2,
                                                  SegmentRange<Acc, Bits>* slots) {
  team_reduce(r, team_log2, slots,
              [asym](SegmentRange<Acc, Bits>& v, int width) { shuffle_reduce_range(v, asym, width); });
}

// ---- parameters ----

// scale (and zero point) of a segment from its range (SPEC section 4). mode 0: SYMMETRIC,
// scale = max(hi, -lo) / divisor; mode 1: ASYMMETRIC, scale = (hi - lo) / divisor,
// zp = clamp(q_min - rne(lo / scale)). scale == 0 -> 1; a non-finite segment (`bad`) -> scale
// NaN, zp 0.
template <class Acc>
__device__ __forceinline__ Acc segment_params(Acc lo, Acc hi, bool bad, int mode, int q_min, int q_max, Acc divisor,
                                              int& zp) {
  Acc scale;
  zp = 0;
  if (mode == 0) {
    scale = acc_div(max(hi, -lo), divisor);
    if (scale == (Acc)0) scale = (Acc)1;
  } else {
    scale = acc_div(hi - lo, divisor);
    if (scale == (Acc)0) scale = (Acc)1;
    const Acc r = acc_rint(acc_div(lo, scale));
    const double z = (double)q_min - (double)r;
    zp = (z == z) ? (int)fmin(fmax(z, (double)q_min), (double)q_max) : 0;
  }
  if (bad) {
    scale = (Acc)__int_as_float(0x7FC00000);  // quiet NaN
    zp = 0;
  }
  return scale;
}

// ---- rows of 16-bit floats reduced on packed words ----
// The fused passes that hold 16-bit data as 16-byte vectors (dynamic_range.cu: dense_lanes,
// dense_cluster, dense_rows; fake_quantize.cu: dynamic_fake_quantize_rows) reduce a segment's
// range on the storage words, two elements per instruction, into one 32-bit range word:
// SYMMETRIC the |x| bit maxima per half; ASYMMETRIC the NaN-propagating (-lo, hi) from +0 (a NaN
// or +-Inf shows in either half), so that two words combine by one per-half maximum.

// rn(1 / s) for s in [2^-126, 2^125]: the sequence __frcp_rn runs there (one MUFU.RCP and its
// correction; __frcp_rn leaves it only for extreme exponents), without its out-of-line slow path.
__device__ __forceinline__ float rcp_rn_normal(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(s));
  const float e = -__fmaf_rn(s, r, -1.0f);
  return __fmaf_rn(r, e, r);
}

// rn(a / d) for a in [2^-80, 2^100] and the divisor d in [1, 2^20], inv_d = rn(1 / d):
// Markstein's correction (qp_rounding.cuh, quotient_fast: exact in this range).
__device__ __forceinline__ float div_by_divisor(float a, float d, float inv_d) {
  const float t = __fmul_rn(a, inv_d);
  const float r = -__fmaf_rn(t, d, -a);
  return __fmaf_rn(r, inv_d, t);
}

// The packed range word of a thread's 8 elements (SYMMETRIC: the |x| bit maxima per half;
// ASYMMETRIC: NaN-propagating (-lo, hi) from +0) and its combination (both maxima per half).
template <class In, int MODE>
__device__ __forceinline__ u32 range_word(const uint4& v) {
  if constexpr (MODE == 0) {
    u32 a = max_u16x2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu);
    a = max_u16x2(a, v.z & 0x7FFF7FFFu);
    return max_u16x2(a, v.w & 0x7FFF7FFFu);
  } else {
    typedef HalfPairs<In> HP;
    const u32 lo2 = HP::min_nan(HP::min_nan(HP::min_nan(HP::min_nan(0u, v.x), v.y), v.z), v.w);
    const u32 hi2 = HP::max_nan(HP::max_nan(HP::max_nan(HP::max_nan(0u, v.x), v.y), v.z), v.w);
    const u32 lo_h = HP::min_nan(lo2, lo2 >> 16) & 0xFFFFu;
    const u32 hi_h = HP::max_nan(hi2, hi2 >> 16) & 0xFFFFu;
    return (lo_h ^ 0x8000u) | (hi_h << 16);
  }
}
template <class In, int MODE>
__device__ __forceinline__ u32 range_combine(u32 a, u32 b) {
  if constexpr (MODE == 0) {
    return max_u16x2(a, b);
  } else {
    return HalfPairs<In>::max_nan(a, b);
  }
}

// The range word of NV vectors (the words of every vector first, one finish). Asymmetric:
// `lo_seed` / `hi_seed` start the packed minima / maxima (0: a range that holds zero, as the plans'
// segments do; +Inf / -Inf pairs: the values' own range, as DeepSpeed's groups take it).
template <class In, int MODE, int NV>
__device__ __forceinline__ u32 range_word_n(const uint4 (&v)[NV], u32 lo_seed = 0u, u32 hi_seed = 0u) {
  if constexpr (MODE == 0) {
    u32 a = 0;
#pragma unroll
    for (int w = 0; w < NV; ++w) {
      a = max_u16x2(a, v[w].x & 0x7FFF7FFFu);
      a = max_u16x2(a, v[w].y & 0x7FFF7FFFu);
      a = max_u16x2(a, v[w].z & 0x7FFF7FFFu);
      a = max_u16x2(a, v[w].w & 0x7FFF7FFFu);
    }
    return a;  // both halves: combined by the caller's per-half maxima, split in RowRange
  } else {
    typedef HalfPairs<In> HP;
    u32 lo2 = lo_seed, hi2 = hi_seed;
#pragma unroll
    for (int w = 0; w < NV; ++w) {
      lo2 = HP::min_nan(HP::min_nan(lo2, v[w].x), v[w].y);
      lo2 = HP::min_nan(HP::min_nan(lo2, v[w].z), v[w].w);
      hi2 = HP::max_nan(HP::max_nan(hi2, v[w].x), v[w].y);
      hi2 = HP::max_nan(HP::max_nan(hi2, v[w].z), v[w].w);
    }
    const u32 lo_h = HP::min_nan(lo2, lo2 >> 16) & 0xFFFFu;
    const u32 hi_h = HP::max_nan(hi2, hi2 >> 16) & 0xFFFFu;
    return (lo_h ^ 0x8000u) | (hi_h << 16);
  }
}

// The range word of a block of WARPS warps (every thread calls it with its own word): an xor
// butterfly in each warp, one slot per warp in `slots` (WARPS words, 16-byte aligned), one
// barrier, then every thread combines the slots. A caller that reduces again before every
// thread has read the slots passes the other of two slot sets (alternating per row), so one
// barrier per row suffices: a thread writing a set again has passed the barrier of the row in
// between, which every reader of that set reached after reading it.
template <class In, int MODE, int WARPS>
__device__ __forceinline__ u32 block_range_word(u32 r, u32* slots) {
  static_assert(WARPS % 4 == 0, "slots read as 16-byte words");
#pragma unroll
  for (int s = 1; s < 32; s <<= 1) r = range_combine<In, MODE>(r, __shfl_xor_sync(0xFFFFFFFFu, r, s));
  if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = r;
  __syncthreads();
  const uint4* s4 = reinterpret_cast<const uint4*>(slots);
  uint4 w = s4[0];
  u32 acc = range_combine<In, MODE>(range_combine<In, MODE>(w.x, w.y), range_combine<In, MODE>(w.z, w.w));
#pragma unroll
  for (int i = 1; i < WARPS / 4; ++i) {
    w = s4[i];
    acc = range_combine<In, MODE>(acc, range_combine<In, MODE>(range_combine<In, MODE>(w.x, w.y),
                                                               range_combine<In, MODE>(w.z, w.w)));
  }
  return acc;
}

// A segment's range from its range word: lo, hi (SYMMETRIC: lo = 0, hi = |x|max), the width
// hi - lo (SYMMETRIC: |x|max) and the non-finite flag.
template <class In, int MODE> struct RowRange {
  float lo, hi, range;
  bool bad;
  __device__ __forceinline__ explicit RowRange(u32 acc) {
    typedef FloatElement<In> FE;
    typedef FloatBits<In> FB;
    if constexpr (MODE == 0) {
      acc = max(acc & 0xFFFFu, acc >> 16);
      bad = acc >= FB::inf;
      lo = 0.0f;
      range = hi = FE::to_acc((u16)acc);
    } else {
      const u32 nlo = acc & 0xFFFFu, hi_bits = acc >> 16;
      bad = (nlo & 0x7FFFu) >= FB::inf || (hi_bits & 0x7FFFu) >= FB::inf;
      lo = -FE::to_acc((u16)nlo);
      hi = FE::to_acc((u16)hi_bits);
      range = __fsub_rn(hi, lo);
    }
  }

  // The division-free parameters of dynamic_quantize_lanes (SPEC section 4): scale =
  // rn(range / d) by div_by_divisor (1 for a zero range), inv = rn(1 / scale), and ASYMMETRIC
  // zp = clamp(q_min - rne(lo / scale)) by the division-free quotient. False (p and zp
  // meaningless) for a non-finite segment, a range outside [2^-80, 2^100] or a scale outside
  // [2^-60, 2^100]: those take segment_params.
  __device__ __forceinline__ bool fast_params(float d, float inv_d, int q_min, int q_max, IntQuantParam<float>& p,
                                              int& zp) const {
    p.scale = range == 0.0f ? 1.0f : div_by_divisor(range, d, inv_d);
    p.zp = 0;
    zp = 0;
    if (bad || !(range == 0.0f || (range >= 8.271806125530277e-25f && range <= 1.2676506002282294e+30f)) ||
        !(p.scale >= 8.673617379884035e-19f && p.scale <= 1.2676506002282294e+30f))
      return false;
    p.inv = rcp_rn_normal(p.scale);
    p.fast = true;
    if constexpr (MODE != 0) {
      bool unused = true;
      const float rb = __fadd_rn(quotient_fast(lo, p, unused), QP_RNE_MAGIC);
      zp = min(max(q_min - (__float_as_int(rb) - QP_RNE_MAGIC_BITS), q_min), q_max);
    }
    return true;
  }
};

// ---- whole rows held in registers by a block (dense-rows) ----
// The schedule of dynamic_quantize_rows and dynamic_fake_quantize_rows: a block of BLOCK threads
// takes segments blockIdx.x, blockIdx.x + gridDim.x, ... (below `segments`) of
// S = BLOCK * 8 * NV 16-bit floats; thread t loads the segment's 16-byte vectors t, t + BLOCK, ...
// into v (they stay in registers), and the block reduces the segment's range on packed words
// (range_word_n, block_range_word with two alternating slot sets: one barrier per segment).
// Then fast(seg, v, p, zp) with the division-free parameters (RowRange::fast_params), or, where
// they do not hold, rare(seg, range): the segment out of line.
template <class In, int MODE, int NV, int BLOCK, class Rare, class Fast>
__device__ __forceinline__ void for_each_row_segment(const typename FloatElement<In>::storage* x, i64 segments,
                                                     int q_min, int q_max, float divisor, Rare rare, Fast fast) {
  constexpr int S = BLOCK * 8 * NV;
  constexpr int WARPS = BLOCK / 32;
  __shared__ __align__(16) u32 slots[2][WARPS];
  const int tid = threadIdx.x;
  const float d = divisor, inv_d = rcp_rn_normal(divisor);
  int par = 0;
  for (i64 seg = blockIdx.x; seg < segments; seg += gridDim.x, par ^= 1) {
    uint4 v[NV];
    const uint4* src = reinterpret_cast<const uint4*>(x + seg * S);
#pragma unroll
    for (int w = 0; w < NV; ++w) v[w] = src[tid + w * BLOCK];
    const RowRange<In, MODE> range(block_range_word<In, MODE, WARPS>(range_word_n<In, MODE, NV>(v), slots[par]));
    IntQuantParam<float> p;
    int zp;
    if (!range.fast_params(d, inv_d, q_min, q_max, p, zp)) {
      rare(seg, range);
      continue;
    }
    fast(seg, v, p, zp);
  }
}

// ---- one segment over a thread-block cluster (sm_90) ----
// Blocks of a cluster that holds one segment (dynamic_quantize_cluster,
// dynamic_fake_quantize_cluster); the kernels carry QP_CLUSTER_DIMS.
static const int kClusterBlocks = QP_CLUSTER_BLOCKS;

#if __CUDA_ARCH__ >= 900
#define QP_CLUSTER_DIMS __cluster_dims__(qp::kClusterBlocks, 1, 1)
#else
#define QP_CLUSTER_DIMS
#endif

#if __CUDA_ARCH__ >= 900
// Phase 1 of the cluster barrier of cluster_range_word, issued before the loads (arrive now,
// wait before the first remote store): every block of the cluster has started, so its shared
// memory may be written.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// A 32-bit word reduced over a segment held by a cluster of CLUSTER blocks (blockDim.x a
// multiple of 32; every thread calls it with its own word, after cluster_arrive_relaxed):
// `combine(a, b)` is associative and commutative with neutral `identity`. Every block reduces
// its share (shuffles, one slot per warp in `warp_slots`, 32 words) and stores it into slot
// `rank` of `shares` (CLUSTER words) in every block of the cluster (distributed shared memory);
// after one cluster barrier every thread combines the shares locally, in rank order. No block
// touches another's memory after it, so no barrier is needed before exiting.
template <int CLUSTER, class Combine>
__device__ __forceinline__ u32 cluster_reduce_word(u32 r, u32 identity, u32* warp_slots, u32* shares,
                                                   Combine combine) {
  const int rank = blockIdx.x % CLUSTER;
#pragma unroll
  for (int s = 1; s < 32; s <<= 1) r = combine(r, __shfl_xor_sync(0xFFFFFFFFu, r, s));
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) warp_slots[warp] = r;
  __syncthreads();
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  if (warp == 0) {
    r = (threadIdx.x < warps) ? warp_slots[threadIdx.x] : identity;
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) r = combine(r, __shfl_xor_sync(0xFFFFFFFFu, r, s));
    // Lane b stores the block's share in slot `rank` of block b of the cluster.
    if (threadIdx.x < CLUSTER) {
      const u32 local = (u32)__cvta_generic_to_shared(&shares[rank]);
      u32 remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"((int)threadIdx.x));
      asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(remote), "r"(r) : "memory");
    }
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
  u32 acc = shares[0];
#pragma unroll
  for (int b = 1; b < CLUSTER; ++b) acc = combine(acc, shares[b]);
  return acc;
}

// The range word (range_word / range_combine) of a segment held by a cluster of CLUSTER blocks.
template <class In, int MODE, int CLUSTER>
__device__ __forceinline__ u32 cluster_range_word(u32 r, u32* warp_slots, u32* shares) {
  return cluster_reduce_word<CLUSTER>(r, 0u, warp_slots, shares,
                                      [](u32 a, u32 b) { return range_combine<In, MODE>(a, b); });
}

// The schedule of dynamic_quantize_cluster and dynamic_fake_quantize_cluster: segment `seg` of
// S elements takes the kClusterBlocks blocks of one cluster (this one has rank `rank`), one
// 16-byte vector v per thread at column `col` of the segment; the range by cluster_range_word.
// Then fn(rank, seg, col, v, range).
template <class In, int MODE, class Fn>
__device__ __forceinline__ void cluster_segment(const typename FloatElement<In>::storage* x, int S, Fn fn) {
  __shared__ u32 warp_slots[32];
  __shared__ u32 shares[kClusterBlocks];  // every block's share of this segment's range
  const int rank = blockIdx.x % kClusterBlocks;
  const i64 seg = blockIdx.x / kClusterBlocks;
  const int col = (rank * blockDim.x + threadIdx.x) * 8;
  // Phase 1 (arrive now, wait before the first remote store): every block of the cluster has
  // started, so its shared memory may be written.
  cluster_arrive_relaxed();
  const uint4 v = *reinterpret_cast<const uint4*>(x + seg * S + col);
  const RowRange<In, MODE> range(
      cluster_range_word<In, MODE, kClusterBlocks>(range_word<In, MODE>(v), warp_slots, shares));
  fn(rank, seg, col, v, range);
}
#endif

}  // namespace qp
