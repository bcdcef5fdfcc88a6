// dynamic_range.cu: the range passes of DynamicRangeQuantizePlan (SPEC section 4).
//
//   range_stats_init   every segment's statistics := (lo key of 0, hi key of 0, not flagged)
//   range_stats_rows   over the canonical row layout: lo = min(min x, 0), hi = max(max x, 0) and
//                      a flag for NaN / +-Inf, per segment (parameter index), by integer atomics
//   range_params       scale (and zero point) of each segment from its statistics
// quantize.cu's quantize_rows then quantizes with those parameters (RowLayout.flags bit 0).
//
// Determinism: min, max and or are exact and commutative, so the order in which blocks reach a
// segment cannot change its result; floats are compared as order-preserving integer keys.
#include "qp_elements.cuh"
#include "qp_vector_io.cuh"
#include "qp_rounding.cuh"
#include "qp_row_layout.cuh"

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

// scale (and zero point) of every segment. mode 0: SYMMETRIC, scale = max(hi, -lo) / divisor;
// mode 1: ASYMMETRIC, scale = (hi - lo) / divisor, zp = clamp(q_min - rne(lo / scale)).
// scale == 0 -> 1; a flagged (non-finite) segment -> scale NaN, zp 0.
template <class Acc>
__global__ void __launch_bounds__(256)
range_params(const typename qp::RangeKey<Acc>::type* __restrict__ stats, Acc* __restrict__ scale_out,
             int* __restrict__ zp_out, qp::i64 count, int mode, int q_min, int q_max, Acc divisor) {
  for (qp::i64 s = (qp::i64)blockIdx.x * blockDim.x + threadIdx.x; s < count; s += (qp::i64)gridDim.x * blockDim.x) {
    const Acc lo = qp::range_value(stats[3 * s]);
    const Acc hi = qp::range_value(stats[3 * s + 1]);
    const bool bad = stats[3 * s + 2] != 0;
    Acc scale;
    int zp = 0;
    if (mode == 0) {
      scale = qp::acc_div(max(hi, -lo), divisor);
      if (scale == (Acc)0) scale = (Acc)1;
    } else {
      scale = qp::acc_div(hi - lo, divisor);
      if (scale == (Acc)0) scale = (Acc)1;
      const Acc r = qp::acc_rint(qp::acc_div(lo, scale));
      const double z = (double)q_min - (double)r;
      zp = (z == z) ? (int)fmin(fmax(z, (double)q_min), (double)q_max) : 0;
    }
    if (bad) {
      scale = (Acc)__int_as_float(0x7FC00000);  // quiet NaN
      zp = 0;
    }
    scale_out[s] = scale;
    if (zp_out) zp_out[s] = zp;
  }
}
