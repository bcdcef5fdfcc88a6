// dynamic_range.cu: the range passes of DynamicRangeQuantizePlan (SPEC section 4).
//
//   range_stats_init   every segment's statistics := (lo key of 0, hi key of 0, not flagged)
//   range_stats_rows   over the canonical row layout: lo = min(min x, 0), hi = max(max x, 0) and
//                      a flag for NaN / +-Inf, per segment (parameter index), by integer atomics
//   range_params       scale (and zero point) of each segment from its statistics
// quantize.cu's quantize_rows then quantizes with those parameters (RowLayout.flags bit 0).
//   dynamic_quantize_segments   the fused single pass for contiguous segments: range,
//                      parameters and codes in one launch, one read of the input
//   dynamic_quantize_dense / _lanes / _cluster / _row_shares / _rows   the same pass specialised
//                      for 16-bit segments of a block-sized team / of a few lanes of a warp / over
//                      a thread-block cluster / over a few blocks that each read all of it / of
//                      one block (below)
//
// Determinism: min, max and or are exact and commutative, so the order in which blocks reach a
// segment cannot change its result; floats are compared as order-preserving integer keys.
#include "qp_dynamic_segments.cuh"
#include "qp_elements.cuh"
#include "qp_quantize_vector.cuh"
#include "qp_range.cuh"
#include "qp_row_layout.cuh"
#include "qp_row_shares.cuh"
#include "qp_stage.cuh"

namespace qp {

template <class In, int VEC, bool VECTOR_IO>
struct RangeStatsBody {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  typedef typename RangeKey<acc_t>::type key_t;

  const in_t* __restrict__ x;
  key_t* __restrict__ stats;
  const RowLayout& lay;
  RangeAccumulator<acc_t> row_acc;  // cs == 0: the item's one segment
  i64 row_slot;
  ElementVector<in_t, VEC> xv[4];

  __device__ __forceinline__ RangeStatsBody(const in_t* x_, key_t* s, const RowLayout& l) : x(x_), stats(s), lay(l) {}

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    row_acc.reset();
    row_slot = pbase;
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    xv[u].template load<VECTOR_IO>(x + row * lay.L + col, valid);
  }

  __device__ __forceinline__ void finish(int u, i64, i64 pbase, int col, int valid) {
    if (lay.cs == 0) {
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (k < valid) row_acc.add(FE::to_acc(xv[u].v[k]));
      return;
    }
    // Column-varying segments: publish per run of elements sharing one segment.
    int gi = column_group(lay, col);
    int rem = col - gi * lay.gc;
    RangeAccumulator<acc_t> acc;
    acc.reset();
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if (k < valid) acc.add(FE::to_acc(xv[u].v[k]));
      if (++rem == lay.gc || k + 1 == VEC) {
        acc.publish(stats, pbase + (i64)gi * lay.cs);
        acc.reset();
        rem = 0;
        ++gi;
      }
    }
  }

  // After the item: one publication per thread, or per warp when the warp shares the segment.
  __device__ __forceinline__ void end_item(bool warp_uniform) {
    if (lay.cs != 0) return;
    if constexpr (sizeof(acc_t) == 4) {
      if (warp_uniform) {
        warp_reduce_range(row_acc);
        if ((threadIdx.x & 31) == 0) row_acc.publish(stats, row_slot);
        return;
      }
    }
    row_acc.publish(stats, row_slot);
  }
};


}  // namespace qp

template <class Acc>
__global__ void __launch_bounds__(256) range_stats_init(typename qp::RangeKey<Acc>::type* stats, qp::i64 count) {
  const typename qp::RangeKey<Acc>::type zero = qp::range_key((Acc)0);
  for (qp::i64 s = (qp::i64)blockIdx.x * blockDim.x + threadIdx.x; s < count; s += (qp::i64)gridDim.x * blockDim.x) {
    stats[3 * s] = zero;
    stats[3 * s + 1] = zero;
    stats[3 * s + 2] = 0;
  }
}

// The row loop of qp_row_layout.cuh, with an end-of-item hook for the per-segment publication.
template <class In, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256)
range_stats_rows(const typename qp::FloatElement<In>::storage* __restrict__ x,
                 typename qp::RangeKey<typename qp::FloatElement<In>::acc>::type* __restrict__ stats,
                 const qp::RowLayout lay) {
  qp::RangeStatsBody<In, VEC, VECTOR_IO> body(x, stats, lay);
  const int seg_threads = 1 << lay.seg_log2;
  const int segs_per_block = blockDim.x >> lay.seg_log2;
  const qp::i64 seg_stride = (qp::i64)gridDim.x * segs_per_block;
  // Every lane of a warp walks the same number of items when segments are >= 32 threads, so the
  // warp stays converged for the shuffle reduction.
  const bool warp_uniform = seg_threads >= 32;
  const qp::i64 first = (qp::i64)blockIdx.x * segs_per_block + (threadIdx.x >> lay.seg_log2);
  for (qp::i64 item = first; item < lay.items; item += seg_stride) {
    qp::i64 row = item;
    int chunk = 0;
    if (lay.chunks_per_row != 1) {
      row = item / lay.chunks_per_row;
      chunk = (int)(item - row * lay.chunks_per_row);
    }
    const qp::i64 pbase = lay.row_param_base(row);
    const int lane = threadIdx.x & (seg_threads - 1);
    const int start = chunk * lay.chunk_cols;
    const int end = start + min(lay.chunk_cols, lay.L - start);
    body.begin_item(row, pbase);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int col = start + lane * VEC + u * seg_threads * VEC;
      if (col < end) body.load(u, row, pbase, col, min(VEC, lay.L - col));
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int col = start + lane * VEC + u * seg_threads * VEC;
      if (col < end) body.finish(u, row, pbase, col, min(VEC, lay.L - col));
    }
    body.end_item(warp_uniform);
  }
}

// TensorScope: the whole tensor is one segment. Every thread scans a grid-stride share of its
// vectors (kTensorUnroll loads in flight), the block combines its threads' ranges, and one
// thread publishes them to statistics slot 0: a few atomics per block instead of per warp.
// n_vectors vectors of VEC elements (VEC divides the element count and the pointer's alignment).
static const int kTensorUnroll = 4;

template <class In, int VEC>
__global__ void __launch_bounds__(256)
range_stats_tensor(const typename qp::FloatElement<In>::storage* __restrict__ x,
                   typename qp::RangeKey<typename qp::FloatElement<In>::acc>::type* __restrict__ stats,
                   qp::i64 n_vectors, int mode) {
  typedef qp::RangeScan<In> Scan;
  typedef typename Scan::acc_t acc_t;
  typedef qp::SegmentRange<acc_t, typename Scan::bits_t> Range;
  __shared__ Range slots[32];
  const bool asym = mode != 0;
  Scan scan;
  scan.reset();
  const qp::i64 stride = (qp::i64)gridDim.x * blockDim.x;
  for (qp::i64 i = (qp::i64)blockIdx.x * blockDim.x + threadIdx.x; i < n_vectors; i += kTensorUnroll * stride) {
    qp::ElementVector<typename Scan::in_t, VEC> v[kTensorUnroll];
#pragma unroll
    for (int u = 0; u < kTensorUnroll; ++u)
      if (i + u * stride < n_vectors) v[u].template load<true>(x + (i + u * stride) * VEC, VEC);
#pragma unroll
    for (int u = 0; u < kTensorUnroll; ++u)
      if (i + u * stride < n_vectors) scan.add(v[u], asym);
  }
  Range r = scan.result();
  int log2_threads = 0;
  while ((1 << log2_threads) < (int)blockDim.x) ++log2_threads;
  qp::team_reduce_range(r, asym, log2_threads, slots);
  if (threadIdx.x != 0) return;
  typedef typename qp::RangeKey<acc_t>::type key_t;
  const key_t zero = qp::range_key((acc_t)0);
  const acc_t lo = asym ? r.lo : (acc_t)0;
  const acc_t hi = asym ? r.hi : qp::range_amax<In>(r.amax_bits);
  if (qp::range_nonfinite<In>(r.amax_bits)) {
    stats[2] = 1;
    return;
  }
  if (qp::range_key(lo) < zero) atomicMin(stats, qp::range_key(lo));
  if (qp::range_key(hi) > zero) atomicMax(stats + 1, qp::range_key(hi));
}

// scale (and zero point) of every segment from its statistics (segment_params).
template <class Acc>
__global__ void __launch_bounds__(256)
range_params(const typename qp::RangeKey<Acc>::type* __restrict__ stats, Acc* __restrict__ scale_out,
             int* __restrict__ zp_out, qp::i64 count, int mode, int q_min, int q_max, Acc divisor) {
  for (qp::i64 s = (qp::i64)blockIdx.x * blockDim.x + threadIdx.x; s < count; s += (qp::i64)gridDim.x * blockDim.x) {
    int zp;
    const Acc scale = qp::segment_params<Acc>(qp::range_value(stats[3 * s]), qp::range_value(stats[3 * s + 1]),
                                              stats[3 * s + 2] != 0, mode, q_min, q_max, divisor, zp);
    scale_out[s] = scale;
    if (zp_out) zp_out[s] = zp;
  }
}

// The fused single pass over contiguous segments (qp_dynamic_segments.cuh): range, parameters
// and codes in one launch, one read of the input.
template <class In, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST, bool STOCHASTIC>
__global__ void __launch_bounds__(1024)
dynamic_quantize_segments(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                          typename qp::FloatElement<In>::acc* __restrict__ scale_out, int* __restrict__ zp_out,
                          const qp::SegmentLayout lay, typename qp::FloatElement<In>::acc divisor,
                          const qp::i64* __restrict__ seed_ptr, const qp::i64* __restrict__ offset_ptr,
                          qp::u64 seed_value, qp::u64 offset_value, float /* divisor_inverse */) {
  typedef qp::VectorQuantizer<In, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::acc_t acc_t;
  constexpr int NV = qp::segment_vectors<typename VQ::in_t, VEC>();
  qp::u64 seed = 0, offset = 0;
  if constexpr (STOCHASTIC) {
    seed = seed_ptr ? (qp::u64)*seed_ptr : seed_value;
    offset = offset_ptr ? (qp::u64)*offset_ptr : offset_value;
  }
  qp::for_each_dynamic_segment<In, VEC, VECTOR_IO, false>(
      x, lay, divisor, scale_out, zp_out,
      [&](qp::i64 first, int lane, int team, const typename VQ::vector_t (&xv)[NV], acc_t scale, int zp) {
        qp::IntQuantParam<acc_t> p;
        p.set(scale, zp);
        const bool zero_fp8 = scale != scale;
#pragma unroll
        for (int u = 0; u < NV; ++u) {
          const int col = (lane + u * team) * VEC;
          if (col < lay.S) {
            int codes[VEC];
            if constexpr (STOCHASTIC) {
              VQ::stochastic_codes(xv[u], p, lay.q_min, lay.q_max, zero_fp8, (qp::u64)(first + col), seed, offset,
                                   codes);
            } else {
              VQ::codes(xv[u], p, lay.q_min, lay.q_max, zero_fp8, codes);
            }
            VQ::template store<VECTOR_IO>(q + (VQ::packed ? (first + col) / 2 : first + col), VEC, codes);
          }
        }
      });
}

namespace qp {

// The codes of one segment's thread share by VectorQuantizer::codes (checked quotients, exact
// division where needed), reading the input again: dynamic_quantize_dense's rare path.
template <class In, class Out, bool HIGH_FIRST, int NV>
__device__ __noinline__ void dense_checked_codes(const typename FloatElement<In>::storage* xs, u8* qs, int lane,
                                                 int team, int q_min, int q_max, typename FloatElement<In>::acc scale,
                                                 int zp) {
  typedef VectorQuantizer<In, Out, 8, HIGH_FIRST> VQ;
  IntQuantParam<typename FloatElement<In>::acc> p;
  p.set(scale, zp);
  for (int u = 0; u < NV; ++u) {
    const int col = (lane + u * team) * 8;
    typename VQ::vector_t xv;
    xv.template load<true>(xs + col, 8);
    int codes[8];
    VQ::codes(xv, p, q_min, q_max, scale != scale, codes);
    VQ::template store<true>(qs + (VQ::packed ? col / 2 : col), 8, codes);
  }
}

}  // namespace qp

// ---- the fused single pass, specialised for the hot layouts ----
// dynamic_quantize_dense: the same result as dynamic_quantize_segments for contiguous segments
// of S = team * 8 * NV elements (a team of 1 << seg_log2 threads per segment, each holding NV
// vectors of 8 elements, all of them data), 16-byte aligned operands, nearest rounding, 16-bit
// floats. Blocks of kDenseBlock threads, 32 registers, QP_DENSE_MIN_BLOCKS blocks per SM. Against
// the generic kernel it holds fewer registers and issues fewer instructions by:
//  * staging: the thread's share of the segment goes global -> shared memory by cp.async, so no
//    data register lives across the reduction (the generic kernel holds 16 and runs at 55+);
//  * addressing: one 64-bit segment base per segment, 32-bit column offsets, no bounds tests;
//  * one segment per team and launch slot (no grid-stride prefetch: double-buffering the next
//    segment costs occupancy);
//  * the scan: SYMMETRIC |x| bits by pairs; ASYMMETRIC NaN-propagating pair min / max, whose
//    result also flags NaN / Inf (no |x| scan); an unrolled butterfly for the team reduction;
//  * the quotient check: SYMMETRIC / ASYMMETRIC ranges of SPEC section 4 bound every quotient
//    (below), so a segment whose parameter is `fast` takes the division-free path for all its
//    elements with no per-element test; other segments take VectorQuantizer::codes (exact),
//    out of line;
//  * the clamp and zero-point add where they cannot change a code (SYMMETRIC, q_min <= -q_max):
//    the low byte of the rounding word (bits of rn(q) + 1.5 * 2^23, whose low byte is 0 for
//    q = 0) is the two's-complement code itself.
// The bound: SYMMETRIC scale = rn(amax / d), so |x / scale| <= amax / scale <= d (1 + 2^-23);
// ASYMMETRIC scale = rn(rn(hi - lo) / d) with lo <= 0 <= hi, so |x| <= max(hi, -lo) <= rn(hi - lo)
// and the same bound holds. d <= 57344 (FP8 e5m2) < 2^20, so t = rn(x * inv) stays below 2^21,
// the limit quotient_fast checks, and |rne(x / scale)| <= d: SYMMETRIC codes lie in
// [-q_max, q_max] and need no clamp when q_min <= -q_max. A scale of 1 (an all-zero or
// underflowing range) bounds the quotient the same way (|x| < d * 2^-126 < 1).
// (The DeepSpeed-format own range, mode 2, has no such bound: it always takes the checked path.)
static const int kDenseBlock = QP_DENSE_BLOCK;  // threads of a dynamic_quantize_dense block

template <class In, class Out, bool HIGH_FIRST, int NV>
__global__ void __launch_bounds__(kDenseBlock, QP_DENSE_MIN_BLOCKS)
dynamic_quantize_dense(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                       typename qp::FloatElement<In>::acc* __restrict__ scale_out, int* __restrict__ zp_out,
                       const qp::SegmentLayout lay, typename qp::FloatElement<In>::acc divisor,
                       const qp::i64*, const qp::i64*, qp::u64, qp::u64,
                       float) {  // dynamic_quantize_segments' parameters
  constexpr int VEC = 8;
  typedef qp::VectorQuantizer<In, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::acc_t acc_t;
  typedef typename VQ::in_t in_t;
  typedef qp::SegmentRange<float, qp::u32> Range;
  static_assert(sizeof(in_t) == 2, "16-bit floats");
  __shared__ Range team_slots[kDenseBlock / 32];
  __shared__ uint4 stage[NV * kDenseBlock];
  auto staged = [&](int u) {
    typename VQ::vector_t v;
    v.bytes.w[0] = stage[u * kDenseBlock + threadIdx.x];
    return v;
  };
  const int team_log2 = lay.seg_log2;
  const int team = 1 << team_log2;
  const int lane = threadIdx.x & (team - 1);
  const int teams_per_block = kDenseBlock >> team_log2;
  const bool asym = lay.mode != 0;
  const bool own_range = lay.mode == 2;
  const qp::i64 stride = (qp::i64)gridDim.x * teams_per_block;
  for (qp::i64 base = (qp::i64)blockIdx.x * teams_per_block; base < lay.segments; base += stride) {
    const qp::i64 seg = base + (threadIdx.x >> team_log2);
    const bool active = seg < lay.segments;
    const qp::i64 first = seg * lay.S;
    const in_t* xs = x + first;
    // The thread's share of the segment goes global -> shared memory (cp.async, no registers
    // held across the reduction), is scanned from there and read again to quantize.
    if (active) {
#pragma unroll
      for (int u = 0; u < NV; ++u) qp::stage_16(&stage[u * kDenseBlock + threadIdx.x], xs + (lane + u * team) * VEC);
    }
    qp::stage_wait();
    // Scan. SYMMETRIC: the largest |x| bit pattern (pairs of halves). ASYMMETRIC: NaN-propagating
    // pair min / max from +0 (own range: from +-Inf); a NaN or +-Inf shows in lo or hi, so the
    // non-finite flag needs no |x| scan (amax_bits := the Inf pattern when set, 0 otherwise).
    Range range;
    {
      typedef qp::FloatBits<In> FB;
      qp::u32 a2 = 0, lo2 = own_range ? FB::inf * 0x10001u : 0u, hi2 = own_range ? (FB::inf | 0x8000u) * 0x10001u : 0u;
      if (active) {
#pragma unroll
        for (int u = 0; u < NV; ++u) {
          const typename VQ::vector_t v = staged(u);
#pragma unroll
          for (int w = 0; w < VEC / 2; ++w) {
            if (asym) {
              lo2 = qp::HalfPairs<In>::min_nan(lo2, v.words[w]);
              hi2 = qp::HalfPairs<In>::max_nan(hi2, v.words[w]);
            } else {
              a2 = qp::max_u16x2(a2, v.words[w] & 0x7FFF7FFFu);
            }
          }
        }
      }
      if (asym) {
        const qp::u32 lo_h = qp::HalfPairs<In>::min_nan(lo2, lo2 >> 16) & 0xFFFFu;
        const qp::u32 hi_h = qp::HalfPairs<In>::max_nan(hi2, hi2 >> 16) & 0xFFFFu;
        range.lo = VQ::FE::to_acc((qp::u16)lo_h);
        range.hi = VQ::FE::to_acc((qp::u16)hi_h);
        const bool bad = (lo_h & 0x7FFFu) >= FB::inf || (hi_h & 0x7FFFu) >= FB::inf;
        range.amax_bits = bad ? FB::inf : 0u;
      } else {
        range.lo = range.hi = 0.0f;
        range.amax_bits = max(a2 & 0xFFFFu, a2 >> 16);
      }
    }
    qp::team_range_reduce<false>(range, asym, team, team_slots);
    if (!active) continue;
    int zp;
    const acc_t scale = qp::team_segment_params<In>(range, asym, lay, divisor, lane, seg, scale_out, zp_out, zp);
    qp::IntQuantParam<acc_t> p;
    p.set(scale, zp);
    qp::u8* qs = q + (VQ::packed ? first / 2 : first);
    if (!p.fast || own_range) {
      // Rare: a scale outside the division-free range, or a non-finite segment. Out of line,
      // from the (cached) input again, so the hot loop keeps its registers.
      qp::dense_checked_codes<In, Out, HIGH_FIRST, NV>(xs, qs, lane, team, lay.q_min, lay.q_max, scale, zp);
      continue;
    }
    const bool raw = VQ::kind != 2 && lay.mode == 0 && lay.q_min <= -lay.q_max;
    // One copy of the vector loop body (not unrolled): higher warp occupancy than the unrolled
    // loop, for a few more instructions.
#pragma unroll 1
    for (int u = 0; u < NV; ++u) {
      const int col = (lane + u * team) * VEC;
      const typename VQ::vector_t xv = staged(u);
      int codes[VEC];
      if constexpr (VQ::kind == 2) {
        float qv[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          bool unused = true;
          qv[k] = qp::quotient_fast(VQ::FE::to_acc(xv.v[k]), p, unused);
        }
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
#pragma unroll
        for (int k = 0; k < VEC; k += 2) {
          const qp::u16 pair = qp::Fp8Element<Out>::pair_from_f32(qv[k], qv[k + 1]);
          codes[k] = pair & 0xFFu;
          codes[k + 1] = pair >> 8;
        }
#else
#pragma unroll
        for (int k = 0; k < VEC; ++k) codes[k] = qp::Fp8Element<Out>::from_f32(qv[k]);
#endif
      } else if (raw) {
        // Low byte (nibble) of the rounding word = the code (zp = 0, no clamp needed).
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          bool unused = true;
          codes[k] = __float_as_int(__fadd_rn(qp::quotient_fast(VQ::FE::to_acc(xv.v[k]), p, unused), QP_RNE_MAGIC));
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          bool unused = true;
          codes[k] = qp::quantize_int_code_fast(VQ::FE::to_acc(xv.v[k]), p, lay.q_min, lay.q_max, unused);
        }
      }
      VQ::template store<true>(qs + (VQ::packed ? col / 2 : col), VEC, codes);
    }
  }
}

// ---- the fused single pass for segments held by one warp's lanes ----
// dynamic_quantize_lanes: the same result as dynamic_quantize_segments for contiguous segments of
// S = LANES * 8 * NV 16-bit floats (LANES <= 32: last-axis groups such as 128), 16-byte aligned
// operands, nearest rounding. MODE (0 SYMMETRIC, 1 ASYMMETRIC with the range widened to hold
// zero), LANES, NV and U are template constants. 4 lanes x 4 vectors serve large problems; 16
// lanes x 1 vector (four times the per-segment work per element) serves small ones, where it keeps
// more multiprocessors busy.
// Against dynamic_quantize_dense, which stages a segment in shared memory for teams spanning warps:
//  * registers only, no barrier: a warp's loads cover 32 consecutive 16-byte vectors, each team
//    reduces its range by xor shuffles alone (SYMMETRIC: the pair of |x| bit maxima;
//    ASYMMETRIC: the pair (-lo, hi), both maxima, one shuffle per step);
//  * U segments per thread (template), their loads issued together: 1 is the instantiated shape
//    (2 spills at 32 registers);
//  * one pass, no grid-stride loop: the grid covers every segment (lanes_geometry), a thread's
//    segment follows from its block and team in 32 bits, and its load is the kernel's first
//    memory instruction, no branch before it (16 x 8192 f16 U4, sm_90 SASS: the 16th
//    instruction; the 41st with the loop's 64-bit bounds and its spilled segment count);
//  * the rare-path test off the chain: the parameters and codes are computed and stored first, a
//    rare segment then overwrites them (lanes_rare_segment), so the division-free inverse and the
//    codes do not wait for the range / scale tests; rn(1 / divisor) comes from the host;
//  * the parameters without a division: scale = rn(range / divisor) by Markstein's correction
//    from rn(1 / divisor) (exact where range lies in [2^-80, 2^100], the division elsewhere),
//    zp from the division-free quotient rn(lo / scale) (qp_rounding.cuh: exact in the `fast`
//    range); a segment outside it (or non-finite) takes segment_params and the checked codes,
//    out of line;
//  * per element: the quotient (one multiply, two FMAs), the rounding add, and for ASYMMETRIC one
//    add-and-min: rne(x / scale) >= rne(lo / scale) for every x of the segment, so the code is at
//    least q_min and only the upper bound can bind (below); codes are packed by byte permutes.
// ASYMMETRIC bound: lo <= x gives fl(x / scale) >= fl(lo / scale) (division is monotonic), so
// rne(x / scale) + zp >= rne(lo / scale) + q_min - rne(lo / scale) = q_min, where zp = q_min -
// rne(lo / scale) is not clamped: rne(lo / scale) <= 0 and |lo / scale| <= rn(hi - lo) / scale
// <= d (1 + 2^-22) < d + 1/2.
// The small shape (16 lanes x 1 vector, U = 1: SMALL) is one dependent chain per thread, load ->
// range -> parameters -> codes -> store, so it shortens that chain (sm_90 SASS, f16 U4): the
// vector index is the grid's thread index (3 instructions from the thread / block ids to the
// load); both teams of a warp reduce by four redux.sync maxima of 16-bit keys (sm_80+),
// not four shuffle rounds; the zero-range test leaves the chain (the scale's constants no longer
// load behind it: the code of zero is stored after the codes); and the zero point comes as the
// bits of rn((MAGIC + q_min) - lo / scale) = MAGIC_BITS + zp, added to each code's rounding word
// with the upper clamp in one add-and-min (FOLD; even q_min: rne's ties to even are those of the
// sum; an odd q_min takes the out-of-line path).
namespace qp {

// A segment of dynamic_quantize_lanes outside its division-free path (a non-finite range, or a
// range or scale outside it): segment_params, the parameters' store (lane 0) and the checked
// codes. Out of line: it is rare, and its divisions would cost the hot loop registers.
template <class In, class Out, bool HIGH_FIRST, int NV>
__device__ __noinline__ void lanes_rare_segment(const typename FloatElement<In>::storage* xs, u8* qs, float* scale_out,
                                                int* zp_out, i64 seg, int lane, int lanes, float lo, float hi,
                                                bool bad, int mode, int q_min, int q_max, float divisor) {
  int zp;
  const float scale = segment_params<float>(lo, hi, bad, mode, q_min, q_max, divisor, zp);
  if (lane == 0) {
    if (scale_out) scale_out[seg] = scale;
    if (zp_out) zp_out[seg] = zp;
  }
  dense_checked_codes<In, Out, HIGH_FIRST, NV>(xs, qs, lane, lanes, q_min, q_max, scale, zp);
}

// The two 16-bit floats of a word (element 0 in the low half) as floats: f16 by two half-to-float
// conversions, bf16 by a shift and a mask.
template <class In> __device__ __forceinline__ float pair_lo(u32 w);
template <class In> __device__ __forceinline__ float pair_hi(u32 w);
template <> __device__ __forceinline__ float pair_lo<f16>(u32 w) { return FloatElement<f16>::to_acc((u16)(w & 0xFFFFu)); }
template <> __device__ __forceinline__ float pair_hi<f16>(u32 w) { return FloatElement<f16>::to_acc((u16)(w >> 16)); }
template <> __device__ __forceinline__ float pair_lo<bf16>(u32 w) { return __uint_as_float(w << 16); }
template <> __device__ __forceinline__ float pair_hi<bf16>(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

// The low bytes of four words, in order, as one word.
__device__ __forceinline__ u32 low_bytes4(u32 a, u32 b, u32 c, u32 d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// Eight codes (their low byte, or low nibble for 4-bit) stored at dst: 8 bytes, or 4 bytes of
// nibble pairs in the HIGH_FIRST / low-first order of qp_packing.cuh. NONNEG: every code lies in
// [0, 15] (unsigned 4-bit codes: q_min >= 0), so a nibble pair is one shift-and-add, no masks.
template <int KIND, bool HIGH_FIRST, bool NONNEG = false>
__device__ __forceinline__ void store_codes8(u8* dst, const u32 (&c)[8]) {
  if constexpr (KIND == 1 && NONNEG) {
    u32 pair[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) pair[k] = HIGH_FIRST ? (c[2 * k] << 4) + c[2 * k + 1] : (c[2 * k + 1] << 4) + c[2 * k];
    *reinterpret_cast<u32*>(dst) = low_bytes4(pair[0], pair[1], pair[2], pair[3]);
  } else if constexpr (KIND == 1) {
    const u32 even = low_bytes4(c[0], c[2], c[4], c[6]), odd = low_bytes4(c[1], c[3], c[5], c[7]);
    const u32 lo = HIGH_FIRST ? odd : even, hi = HIGH_FIRST ? even : odd;
    *reinterpret_cast<u32*>(dst) = (lo & 0x0F0F0F0Fu) | ((hi << 4) & 0xF0F0F0F0u);
  } else {
    uint2 w;
    w.x = low_bytes4(c[0], c[1], c[2], c[3]);
    w.y = low_bytes4(c[4], c[5], c[6], c[7]);
    *reinterpret_cast<uint2*>(dst) = w;
  }
}

// Eight copies of one integer code stored at dst (8 bytes, or 4 bytes of nibbles), as a
// separate store after the codes' own (volatile: not merged into it, which would put the
// choice between the two on the codes' chain).
template <int KIND>
__device__ __forceinline__ void store_same_code8(u8* dst, int code) {
  if constexpr (KIND == 1) {
    asm volatile("st.global.b32 [%0], %1;" ::"l"(dst), "r"(((u32)code & 0xFu) * 0x11111111u) : "memory");
  } else {
    const u32 w = ((u32)code & 0xFFu) * 0x01010101u;
    asm volatile("st.global.v2.b32 [%0], {%1, %1};" ::"l"(dst), "r"(w) : "memory");
  }
}

// The codes of 8 elements (one 16-byte vector) under a division-free parameter p (`fast`, zp its
// zero point, zp_bias = zp - QP_RNE_MAGIC_BITS, which the caller may have at hand), stored at dst: the quotient by Markstein's correction, the rounding add, then
// SYMMETRIC integer codes with q_min <= -q_max: the low byte / nibble of the rounding word (the
// two's-complement code; |rne(x / scale)| <= q_max needs no clamp); other SYMMETRIC integer
// codes: the clamp; ASYMMETRIC: the zero point and the upper clamp only (the lower bound holds:
// dynamic_quantize_lanes); FP8: the pair conversion.
template <class In, class Out, bool HIGH_FIRST, int MODE, bool FOLDED = false>
__device__ __forceinline__ void quantize_vector8(const uint4& v, const IntQuantParam<float>& p, int zp, int q_min,
                                                 int q_max, u8* dst, int zp_bias) {
  constexpr int KIND = QuantElement<Out>::kind;
  const u32 words[4] = {v.x, v.y, v.z, v.w};
  float xf[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    xf[2 * k] = pair_lo<In>(words[k]);
    xf[2 * k + 1] = pair_hi<In>(words[k]);
  }
  u32 c[8];
  if constexpr (KIND == 2) {
    float qv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      bool unused = true;
      qv[k] = quotient_fast(xf[k], p, unused);
    }
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
#pragma unroll
    for (int k = 0; k < 8; k += 2) {
      const u16 pair = Fp8Element<Out>::pair_from_f32(qv[k], qv[k + 1]);
      c[k] = pair & 0xFFu;
      c[k + 1] = pair >> 8;
    }
#else
#pragma unroll
    for (int k = 0; k < 8; ++k) c[k] = Fp8Element<Out>::from_f32(qv[k]);
#endif
  } else {
    const bool raw = MODE == 0 && q_min <= -q_max;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      bool unused = true;
      const int bits = __float_as_int(__fadd_rn(quotient_fast(xf[k], p, unused), QP_RNE_MAGIC));
      if (MODE != 0 && FOLDED) {
        // zp_bias = MAGIC_BITS + zp: the sum is 2 MAGIC_BITS + the code (modulo 2^32, no signed
        // wrap between the two), whose low byte / nibble is the code's.
        c[k] = (u32)min((int)((u32)bits + (u32)zp_bias), (int)(2u * (u32)QP_RNE_MAGIC_BITS + (u32)q_max));
      } else if (MODE != 0) {
        c[k] = (u32)min(bits + zp_bias, q_max);
      } else if (raw) {
        c[k] = (u32)bits;
      } else {
        c[k] = (u32)min(max(bits - QP_RNE_MAGIC_BITS, q_min), q_max);
      }
    }
  }
  store_codes8<KIND, HIGH_FIRST, KIND == 1 && !QuantElement<Out>::is_signed>(dst, c);
}

}  // namespace qp

template <class In, class Out, bool HIGH_FIRST, int MODE, int LANES, int NV, int U>
__global__ void __launch_bounds__(256, QP_LANES_MIN_BLOCKS)
dynamic_quantize_lanes(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                       float* __restrict__ scale_out, int* __restrict__ zp_out, const qp::SegmentLayout lay,
                       float divisor, const qp::i64*, const qp::i64*, qp::u64, qp::u64, float divisor_inverse) {
  typedef qp::FloatElement<In> FE;
  typedef qp::FloatBits<In> FB;
  typedef qp::HalfPairs<In> HP;
  using qp::i64;
  using qp::u32;
  constexpr int KIND = qp::QuantElement<Out>::kind;
  constexpr int S = LANES * 8 * NV;  // elements per segment (lay.S)
  static_assert(sizeof(typename FE::storage) == 2, "16-bit floats");
  static_assert(MODE == 0 || KIND != 2, "FP8 codes are symmetric");
  static_assert(LANES >= 1 && LANES <= 32 && (LANES & (LANES - 1)) == 0, "a team within a warp");
  // SMALL: two teams of 16 lanes per warp, one vector per thread (small problems: one dependent
  // chain per thread, latency-bound); the other shapes keep the throughput form.
  constexpr bool SMALL = LANES == 16 && NV == 1 && U == 1;
#if __CUDA_ARCH__ >= 800
  constexpr bool REDUX = SMALL;
#else
  constexpr bool REDUX = false;
#endif
  constexpr bool FOLD = SMALL && MODE != 0;
  // One pass: the grid covers every segment (lanes_geometry), so a thread's segments follow from
  // its block and team alone, in 32 bits (segments < 2^31, vectors < 2^32), and its loads issue
  // first.
  const int lane = threadIdx.x & (LANES - 1);
  const u32 teams = blockDim.x / LANES;
  const u32 first = blockIdx.x * (teams * U) + threadIdx.x / LANES;
  const u32 segments = (u32)lay.segments;
  // inv_d = rn(1 / divisor) from the host (quantplan/runtime/_segments.py divisor_inverse), a constant
  // operand: no reciprocal on the chain.
  const float d = divisor, inv_d = divisor_inverse;
  uint4 v[U][NV];
  if constexpr (SMALL) {
    // The thread's vector is the grid's thread index (segment * 16 + lane), clamped to the last
    // vector: a team past the last segment loads it (no predicate or branch before the load) and
    // stores nothing.
    v[0][0] = reinterpret_cast<const uint4*>(x)[min(blockIdx.x * blockDim.x + threadIdx.x, segments * (S / 8) - 1)];
  } else {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // A team past the last segment loads the last one (no branch before the loads) and stores
      // nothing.
      const u32 seg = min(first + u * teams, segments - 1);
      const uint4* src = reinterpret_cast<const uint4*>(x) + ((qp::u64)seg * (S / 8) + lane);
#pragma unroll
      for (int w = 0; w < NV; ++w) v[u][w] = src[w * LANES];
    }
  }
  const int q_min = lay.q_min, q_max = lay.q_max;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const u32 seg = first + u * teams;
    // Scan and reduce: SYMMETRIC the |x| bit maxima per half; ASYMMETRIC the NaN-propagating
    // min and max from +0 (a NaN or +-Inf shows in lo or hi), as (-lo, hi): two maxima.
    u32 acc, nlo, hi_bits;  // SYMMETRIC: acc; ASYMMETRIC: the bits of -lo and hi (low halves)
    if constexpr (REDUX) {
      // Both teams of the warp by warp-wide maxima (redux.sync, one instruction each, against
      // four shuffle rounds) of 16-bit keys, each lane's key masked to zero in the other team's:
      // SYMMETRIC |x| bits, ASYMMETRIC |lo| and |hi| bits (lo <= 0 <= hi, or NaN: a zero's sign
      // drops, a NaN stays above Inf above every finite value, as in the pair maxima).
      const bool upper = threadIdx.x & 16;
      const u32 key_mask = MODE == 0 ? 0xFFFFu : 0x7FFFu;
      const u32 mask_a = upper ? 0u : key_mask, mask_b = upper ? key_mask : 0u;
      const uint4& w = v[0][0];
      if constexpr (MODE == 0) {
        u32 a = qp::max_u16x2(w.x & 0x7FFF7FFFu, w.y & 0x7FFF7FFFu);
        a = qp::max_u16x2(a, w.z & 0x7FFF7FFFu);
        a = HP::max_nan_halves(qp::max_u16x2(a, w.w & 0x7FFF7FFFu));
        const u32 ka = __reduce_max_sync(0xFFFFFFFFu, a & mask_a), kb = __reduce_max_sync(0xFFFFFFFFu, a & mask_b);
        acc = upper ? kb : ka;
      } else {
        const u32 lo1 = HP::min_nan_halves(HP::min_nan(HP::min_nan(HP::min_nan(HP::min_nan(0u, w.x), w.y), w.z), w.w));
        const u32 hi1 = HP::max_nan_halves(HP::max_nan(HP::max_nan(HP::max_nan(HP::max_nan(0u, w.x), w.y), w.z), w.w));
        const u32 ha = __reduce_max_sync(0xFFFFFFFFu, hi1 & mask_a), la = __reduce_max_sync(0xFFFFFFFFu, lo1 & mask_a);
        const u32 hb = __reduce_max_sync(0xFFFFFFFFu, hi1 & mask_b), lb = __reduce_max_sync(0xFFFFFFFFu, lo1 & mask_b);
        nlo = upper ? lb : la;
        hi_bits = upper ? hb : ha;
      }
    } else if constexpr (MODE == 0) {
      u32 a = 0;
#pragma unroll
      for (int w = 0; w < NV; ++w) {
        a = qp::max_u16x2(a, v[u][w].x & 0x7FFF7FFFu);
        a = qp::max_u16x2(a, v[u][w].y & 0x7FFF7FFFu);
        a = qp::max_u16x2(a, v[u][w].z & 0x7FFF7FFFu);
        a = qp::max_u16x2(a, v[u][w].w & 0x7FFF7FFFu);
      }
#pragma unroll
      for (int s = 1; s < LANES; s <<= 1) a = qp::max_u16x2(a, __shfl_xor_sync(0xFFFFFFFFu, a, s));
      acc = max(a & 0xFFFFu, a >> 16);
    } else {
      u32 lo2 = 0, hi2 = 0;
#pragma unroll
      for (int w = 0; w < NV; ++w) {
        lo2 = HP::min_nan(HP::min_nan(lo2, v[u][w].x), v[u][w].y);
        lo2 = HP::min_nan(HP::min_nan(lo2, v[u][w].z), v[u][w].w);
        hi2 = HP::max_nan(HP::max_nan(hi2, v[u][w].x), v[u][w].y);
        hi2 = HP::max_nan(HP::max_nan(hi2, v[u][w].z), v[u][w].w);
      }
      // (-lo, hi) per half pair: the halves' negated minima (sign flips) beside their maxima,
      // combined by one pair maximum (the sign of a zero lo does not reach the parameters).
      const u32 nlo2 = lo2 ^ 0x80008000u;
      u32 p = HP::max_nan(__byte_perm(nlo2, hi2, 0x5410), __byte_perm(nlo2, hi2, 0x7632));
#pragma unroll
      for (int s = 1; s < LANES; s <<= 1) p = HP::max_nan(p, __shfl_xor_sync(0xFFFFFFFFu, p, s));
      nlo = p & 0xFFFFu;
      hi_bits = p >> 16;
    }
    if (seg >= segments) continue;
    // Parameters (stored by lane 0 as soon as known): the division-free path where the range lies in [2^-80, 2^100] (or is 0:
    // scale 1, SPEC section 4), the scale in the `fast` range of qp_rounding.cuh, [2^-60,
    // 2^100], and ASYMMETRIC the unclamped zero point in [q_min, q_max]. The parameters and codes
    // are computed and stored without waiting for that test; a segment that fails it (`rare`)
    // then takes lanes_rare_segment, out of line, which overwrites the same words and bytes
    // (lane 0 the parameters, each lane its own vectors: one thread's stores, in program order).
    float lo = 0.0f, range, hi;
    bool bad;
    if constexpr (MODE == 0) {
      bad = acc >= FB::inf;
      range = hi = FE::to_acc((qp::u16)acc);
    } else {
      bad = (nlo & 0x7FFFu) >= FB::inf || (hi_bits & 0x7FFFu) >= FB::inf;
      lo = -FE::to_acc((qp::u16)nlo);
      hi = FE::to_acc((qp::u16)hi_bits);
      range = __fsub_rn(hi, lo);
    }
    qp::u8* qs = q + (KIND == 1 ? (qp::u64)seg * (S / 2) : (qp::u64)seg * S);
    qp::IntQuantParam<float> p;
    // SMALL, integer codes: a zero range (every element +-0; scale 1 and the code of zero, SPEC
    // section 4) is tested off the chain: the chain runs with the scale rn(0 / d) = 0 (garbage
    // codes), the parameters' stores select 1 and q_min, and the code of zero overwrites the codes
    // after their store. (Otherwise the test gates the scale: its constants load behind it.)
    constexpr bool ZERO_AFTER = SMALL && KIND != 2;
    const bool zero = range == 0.0f;
    p.scale = ZERO_AFTER ? qp::div_by_divisor(range, d, inv_d) : zero ? 1.0f : qp::div_by_divisor(range, d, inv_d);
    p.zp = 0;
    p.inv = qp::rcp_rn_normal(p.scale);
    p.fast = true;
    bool rare;
    if constexpr (ZERO_AFTER) {
      // (Bitwise: predicates, no branch.)
      rare = bad | !(zero | ((range >= 8.271806125530277e-25f) & (range <= 1.2676506002282294e+30f) &
                             (p.scale >= 8.673617379884035e-19f) & (p.scale <= 1.2676506002282294e+30f)));
    } else {
      rare = bad || !(range == 0.0f || (range >= 8.271806125530277e-25f && range <= 1.2676506002282294e+30f)) ||
             !(p.scale >= 8.673617379884035e-19f && p.scale <= 1.2676506002282294e+30f);
    }
    if (lane == 0 && scale_out) scale_out[seg] = ZERO_AFTER && zero ? 1.0f : p.scale;
    int zp = 0, zp_bias = -QP_RNE_MAGIC_BITS;  // zp_bias = zp - QP_RNE_MAGIC_BITS (FOLD: + 2 MAGIC_BITS)
    if constexpr (MODE != 0) {
      bool unused = true;
      if constexpr (FOLD) {
        // The zero point as the bits of rn((MAGIC + q_min) - lo / scale) = MAGIC_BITS + zp (ties
        // to even as rne(lo / scale) when q_min is even; an odd q_min takes the rare path): the
        // codes add these bits to theirs, no subtraction between (quantize_vector8 FOLDED).
        const float zb = __fsub_rn(__int_as_float(QP_RNE_MAGIC_BITS + q_min), qp::quotient_fast(lo, p, unused));
        zp_bias = __float_as_int(zb);
        zp = zp_bias - QP_RNE_MAGIC_BITS;
      } else {
        const float rb = __fadd_rn(qp::quotient_fast(lo, p, unused), QP_RNE_MAGIC);
        zp_bias = q_min - __float_as_int(rb);
        zp = zp_bias + QP_RNE_MAGIC_BITS;
      }
      if constexpr (ZERO_AFTER) {
        rare = rare | (!zero & ((zp < q_min) | (zp > q_max))) | (FOLD && (q_min & 1) != 0);
        if (lane == 0 && zp_out) zp_out[seg] = zero ? q_min : zp;
      } else {
        rare = rare || zp < q_min || zp > q_max;
        if (lane == 0 && zp_out) zp_out[seg] = zp;
      }
    }
#pragma unroll
    for (int w = 0; w < NV; ++w) {
      const int col = (lane + w * LANES) * 8;
      qp::quantize_vector8<In, Out, HIGH_FIRST, MODE, FOLD>(v[u][w], p, zp, q_min, q_max,
                                                            qs + (KIND == 1 ? col / 2 : col), zp_bias);
    }
    if constexpr (ZERO_AFTER) {
      if (zero & !rare) {
        // The code of zero in every element: zp = q_min (ASYMMETRIC), clamp(0) (SYMMETRIC).
        const int code = MODE != 0 ? q_min : min(max(0, q_min), q_max);
        qp::store_same_code8<KIND>(qs + (KIND == 1 ? lane * 4 : lane * 8), code);
      }
    }
    if (rare)
      qp::lanes_rare_segment<In, Out, HIGH_FIRST, NV>(x + (i64)seg * S, qs, scale_out, zp_out, seg, lane, LANES, lo, hi,
                                                      bad, MODE, q_min, q_max, d);
  }
}

// ---- the end of a segment held across blocks (cluster and row-shares kernels) ----
// quantize_segment_vector: this thread's one vector `v` (16-bit floats) at column `col` of segment
// `seg` (input xs, codes qs), quantized with the segment's range: the division-free parameters
// where the range allows them (the `writer` thread stores them), else the checked codes of this
// vector out of line (lanes_rare_segment, a team of one, from the input again; only the writer
// stores parameters).
template <class In, class Out, bool HIGH_FIRST, int MODE>
__device__ __forceinline__ void quantize_segment_vector(const qp::RowRange<In, MODE>& range, const uint4& v,
                                                        const typename qp::FloatElement<In>::storage* xs, qp::u8* qs,
                                                        int col, float* scale_out, int* zp_out, qp::i64 seg,
                                                        bool writer, int q_min, int q_max, float d) {
  constexpr int KIND = qp::QuantElement<Out>::kind;
  const float inv_d = qp::rcp_rn_normal(d);
  qp::IntQuantParam<float> p;
  int zp;
  qp::u8* qv = qs + (KIND == 1 ? col / 2 : col);
  if (!range.fast_params(d, inv_d, q_min, q_max, p, zp)) {
    qp::lanes_rare_segment<In, Out, HIGH_FIRST, 1>(xs + col, qv, writer ? scale_out : nullptr,
                                                   writer ? zp_out : nullptr, seg, 0, 1, range.lo, range.hi,
                                                   range.bad, MODE, q_min, q_max, d);
    return;
  }
  if (writer) {
    if (scale_out) scale_out[seg] = p.scale;
    if (MODE != 0 && zp_out) zp_out[seg] = zp;
  }
  qp::quantize_vector8<In, Out, HIGH_FIRST, MODE>(v, p, zp, q_min, q_max, qv, zp - QP_RNE_MAGIC_BITS);
}

// ---- one segment over a thread-block cluster (sm_90) ----
// dynamic_quantize_cluster: few long segments (16 rows of 8192 elements: one block per row
// would keep 16 SMs busy). Rows of 4096 / 8192 / 16384 take dynamic_quantize_row_shares (below:
// blocks that each read the whole row, no exchange between blocks); this kernel serves the other
// lengths. Each segment of S = kClusterBlocks * blockDim.x * 8 16-bit floats
// takes a cluster of kClusterBlocks blocks, one 16-byte vector per thread: every block reduces
// its share (shuffles, one slot per warp) and stores it into every block of the cluster
// (distributed shared memory); after one cluster barrier every thread combines the shares locally.
// The parameters and codes are those of dynamic_quantize_lanes (same division-free path, same
// out-of-line rare path). blockDim.x is a multiple of 32, at most 1024; the grid has
// kClusterBlocks blocks per segment (qp_range.cuh). Other architectures: never selected (the body
// traps).
template <class In, class Out, bool HIGH_FIRST, int MODE>
__global__ void QP_CLUSTER_DIMS __launch_bounds__(1024)
dynamic_quantize_cluster(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                         float* __restrict__ scale_out, int* __restrict__ zp_out, const qp::SegmentLayout lay,
                         float divisor, const qp::i64*, const qp::i64*, qp::u64, qp::u64, float) {
#if __CUDA_ARCH__ >= 900
  using qp::i64;
  constexpr int KIND = qp::QuantElement<Out>::kind;
  const int S = lay.S, q_min = lay.q_min, q_max = lay.q_max;
  qp::cluster_segment<In, MODE>(
      x, S, [&](int rank, i64 seg, int col, const uint4& v, const qp::RowRange<In, MODE>& range) {
        quantize_segment_vector<In, Out, HIGH_FIRST, MODE>(range, v, x + seg * S,
                                                           q + (KIND == 1 ? seg * (S / 2) : seg * S), col, scale_out,
                                                           zp_out, seg, rank == 0 && threadIdx.x == 0, q_min, q_max,
                                                           divisor);
      });
#else
  __trap();
#endif
}


// ---- one segment over a few blocks that each read all of it (row shares) ----
// dynamic_quantize_row_shares: few long segments without a cluster (any architecture). Each
// segment of S = BLOCKS * kSharesBlock * 8 16-bit floats takes BLOCKS consecutive blocks of
// kSharesBlock threads; every block loads the whole segment (its own vector first, then one
// vector of each other block's share: BLOCKS vectors per thread; the repeats come from L2),
// reduces the range alone (range_word_n, block_range_word: shuffles and one barrier) and
// quantizes only its share, one vector per thread. No exchange between blocks, so no cluster
// barrier on the chain.
// The parameters and codes are those of dynamic_quantize_cluster (RowRange::fast_params, the rare
// segment out of line; block 0 of the segment stores the parameters). The grid has BLOCKS blocks
// per segment (segments * BLOCKS < 2^31). The input must not overlap the output: a block reads
// every share of its segment, and another block may have written its share already.
static const int kSharesBlock = QP_SHARES_BLOCK;

template <class In, class Out, bool HIGH_FIRST, int MODE, int BLOCKS>
__global__ void __launch_bounds__(kSharesBlock)
dynamic_quantize_row_shares(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                            float* __restrict__ scale_out, int* __restrict__ zp_out, const qp::SegmentLayout lay,
                            float divisor, const qp::i64*, const qp::i64*, qp::u64, qp::u64, float) {
  using qp::i64;
  using qp::u32;
  constexpr int KIND = qp::QuantElement<Out>::kind;
  constexpr int S = BLOCKS * kSharesBlock * 8;  // elements per segment (lay.S)
  constexpr int WARPS = kSharesBlock / 32;
  static_assert(sizeof(typename qp::FloatElement<In>::storage) == 2, "16-bit floats");
  static_assert(MODE == 0 || KIND != 2, "FP8 codes are symmetric");
  static_assert(BLOCKS >= 2 && (BLOCKS & (BLOCKS - 1)) == 0, "a power of two of blocks per segment");
  __shared__ __align__(16) u32 slots[WARPS];
  const u32 part = blockIdx.x % BLOCKS;  // this block's share of the segment
  const i64 seg = blockIdx.x / BLOCKS;
  const uint4* row = reinterpret_cast<const uint4*>(x + seg * S) + threadIdx.x;
  uint4 v[BLOCKS];  // the whole row; `own`: this block's share (the vector quantized below)
  const uint4 own = qp::load_row_shares<BLOCKS, kSharesBlock>(row, part, v, [](const uint4* a) { return *a; });
  const qp::RowRange<In, MODE> range(
      qp::block_range_word<In, MODE, WARPS>(qp::range_word_n<In, MODE, BLOCKS>(v), slots));
  quantize_segment_vector<In, Out, HIGH_FIRST, MODE>(range, own, x + seg * S, q + (KIND == 1 ? seg * (S / 2) : seg * S),
                                                     (part * kSharesBlock + threadIdx.x) * 8, scale_out, zp_out, seg,
                                                     part == 0 && threadIdx.x == 0, lay.q_min, lay.q_max, divisor);
}

// ---- whole rows held in registers by a block (dense-rows) ----
// dynamic_quantize_rows: the same result as dynamic_quantize_segments for contiguous segments of
// S = kRowsBlock * 8 * NV 16-bit floats (per-token rows and channel(axis 0) rows of 2048, 4096,
// 8192 elements), 16-byte aligned operands, nearest rounding. One block of kRowsBlock threads per
// segment (the grid strides past 2^31 - 1 segments), every thread NV 16-byte vectors:
//  * the vectors stay in registers from the load to the store (dynamic_quantize_dense stages
//    them in shared memory and reads them twice; its per-segment parameters ran with divisions);
//  * the range on packed words (qp_range.cuh, range_word_n), one barrier per segment
//    (block_range_word with two alternating slot sets);
//  * the parameters and codes of dynamic_quantize_lanes: division-free scale / inverse / zero
//    point where the range allows it (RowRange::fast_params), the checked codes out of line
//    otherwise (lanes_rare_segment, from the input again), quantize_vector8 per vector.
static const int kRowsBlock = QP_ROWS_BLOCK;

template <class In, class Out, bool HIGH_FIRST, int MODE, int NV>
__global__ void __launch_bounds__(kRowsBlock, QP_ROWS_MIN_BLOCKS)
dynamic_quantize_rows(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                      float* __restrict__ scale_out, int* __restrict__ zp_out, const qp::SegmentLayout lay,
                      float divisor, const qp::i64*, const qp::i64*, qp::u64, qp::u64, float) {
  using qp::i64;
  constexpr int KIND = qp::QuantElement<Out>::kind;
  constexpr int S = kRowsBlock * 8 * NV;  // elements per segment (lay.S)
  static_assert(sizeof(typename qp::FloatElement<In>::storage) == 2, "16-bit floats");
  static_assert(MODE == 0 || KIND != 2, "FP8 codes are symmetric");
  const int tid = threadIdx.x;
  const int q_min = lay.q_min, q_max = lay.q_max;
  qp::for_each_row_segment<In, MODE, NV, kRowsBlock>(
      x, lay.segments, q_min, q_max, divisor,
      [&](i64 seg, const qp::RowRange<In, MODE>& range) {
        qp::lanes_rare_segment<In, Out, HIGH_FIRST, NV>(x + seg * S, q + (KIND == 1 ? seg * (S / 2) : seg * S),
                                                        scale_out, zp_out, seg, tid, kRowsBlock, range.lo, range.hi,
                                                        range.bad, MODE, q_min, q_max, divisor);
      },
      [&](i64 seg, const uint4(&v)[NV], const qp::IntQuantParam<float>& p, int zp) {
        qp::u8* qs = q + (KIND == 1 ? seg * (S / 2) : seg * S);
        if (tid == 0) {
          if (scale_out) scale_out[seg] = p.scale;
          if (MODE != 0 && zp_out) zp_out[seg] = zp;
        }
#pragma unroll
        for (int w = 0; w < NV; ++w) {
          const int col = (tid + w * kRowsBlock) * 8;
          qp::quantize_vector8<In, Out, HIGH_FIRST, MODE>(v[w], p, zp, q_min, q_max,
                                                          qs + (KIND == 1 ? col / 2 : col), zp - QP_RNE_MAGIC_BITS);
        }
      });
}
