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
