// dynamic_range.cu: the range passes of DynamicRangeQuantizePlan (SPEC section 4).
//
//   range_stats_init   every segment's statistics := (lo key of 0, hi key of 0, not flagged)
//   range_stats_rows   over the canonical row layout: lo = min(min x, 0), hi = max(max x, 0) and
//                      a flag for NaN / +-Inf, per segment (parameter index), by integer atomics
//   range_params       scale (and zero point) of each segment from its statistics
// quantize.cu's quantize_rows then quantizes with those parameters (RowLayout.flags bit 0).
//   dynamic_quantize_segments   the fused single pass for contiguous segments: range,
//                      parameters and codes in one launch, one read of the input
//
// Determinism: min, max and or are exact and commutative, so the order in which blocks reach a
// segment cannot change its result; floats are compared as order-preserving integer keys.
#include "qp_dynamic_segments.cuh"
#include "qp_elements.cuh"
#include "qp_quantize_vector.cuh"
#include "qp_range.cuh"
#include "qp_row_layout.cuh"

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
                          qp::u64 seed_value, qp::u64 offset_value) {
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

// 16 bytes global -> shared memory without a register (sm_80+), and the wait for them.
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
  const u32 dst = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// The range of a team of `team` threads (a power of two, aligned; every thread of the block
// calls this): an unrolled xor butterfly inside the warp (steps at or above the team width are
// skipped), then, for teams spanning warps, one slot per warp in shared memory. lo / hi take
// part only when `asym`.
__device__ __forceinline__ void dense_team_reduce(SegmentRange<float, u32>& r, bool asym, int team,
                                                  SegmentRange<float, u32>* slots) {
  auto step = [&](int d) {
    r.amax_bits = max(r.amax_bits, __shfl_xor_sync(0xFFFFFFFFu, r.amax_bits, d));
    if (asym) {
      r.lo = fminf(r.lo, __shfl_xor_sync(0xFFFFFFFFu, r.lo, d));
      r.hi = fmaxf(r.hi, __shfl_xor_sync(0xFFFFFFFFu, r.hi, d));
    }
  };
#pragma unroll
  for (int d = 1; d < 32; d <<= 1)
    if (d < team) step(d);
  if (team <= 32) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the previous segment's readers are done with the slots
  if (lane == 0) slots[warp] = r;
  __syncthreads();
  const int warps = team >> 5;
  r = slots[(warp & ~(warps - 1)) + (lane & (warps - 1))];
#pragma unroll
  for (int d = 1; d < 32; d <<= 1)
    if (d < warps) step(d);
}

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
// floats. Blocks of 256 threads, 32 registers, 8 blocks per SM. Against the generic kernel
// (ncu, H200, 8192 x 8192 f16 per-token int8: 48.2 M warp instructions, 55 registers, 39% warps
// active, DRAM 58%) it runs 34.6 M instructions at 93% warps active, DRAM 78%, by:
//  * staging: the thread's share of the segment goes global -> shared memory by cp.async, so no
//    data register lives across the reduction (the generic kernel holds 16 and runs at 55+);
//  * addressing: one 64-bit segment base per segment, 32-bit column offsets, no bounds tests;
//  * one segment per team and launch slot (no grid-stride prefetch; double-buffering the next
//    segment was measured slower: 6 blocks per SM);
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
static const int kDenseBlock = 256;  // threads of a dynamic_quantize_dense block

#ifndef QP_DENSE_MIN_BLOCKS
#define QP_DENSE_MIN_BLOCKS 8
#endif
template <class In, class Out, bool HIGH_FIRST, int NV>
__global__ void __launch_bounds__(kDenseBlock, QP_DENSE_MIN_BLOCKS)
dynamic_quantize_dense(const typename qp::FloatElement<In>::storage* __restrict__ x, qp::u8* __restrict__ q,
                       typename qp::FloatElement<In>::acc* __restrict__ scale_out, int* __restrict__ zp_out,
                       const qp::SegmentLayout lay, typename qp::FloatElement<In>::acc divisor,
                       const qp::i64*, const qp::i64*, qp::u64, qp::u64) {  // dynamic_quantize_segments' parameters
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
    // held across the reduction), is scanned from there and read again to quantize. (Measured:
    // double-buffering the next segment lowers occupancy to 6 blocks and runs slower.)
    if (active) {
#pragma unroll
      for (int u = 0; u < NV; ++u) qp::copy_async_16(&stage[u * kDenseBlock + threadIdx.x], xs + (lane + u * team) * VEC);
    }
    qp::copy_async_wait_all();
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
    qp::dense_team_reduce(range, asym, team, team_slots);
    if (!active) continue;
    int zp;
    const acc_t scale = qp::segment_params<acc_t>(range.lo, asym ? range.hi : qp::range_amax<In>(range.amax_bits),
                                                  qp::range_nonfinite<In>(range.amax_bits), lay.mode, lay.q_min,
                                                  lay.q_max, divisor, zp);
    if (lane == 0) {
      if (scale_out) scale_out[seg] = scale;
      if (zp_out) zp_out[seg] = zp;
    }
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
    // One copy of the vector loop body (not unrolled): measured on H200 with ncu, 93% against
    // 86% warp occupancy and up to 7% faster than the unrolled loop, at ~7% more instructions.
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
