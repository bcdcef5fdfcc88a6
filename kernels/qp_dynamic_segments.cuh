// qp_dynamic_segments.cuh: the fused single pass of dynamic-range ops over contiguous segments
// (token rows, last-axis groups, a leading channel axis, a small tensor), shared by
// dynamic_quantize_segments (dynamic_range.cu: codes) and dynamic_fake_quantize_segments
// (fake_quantize.cu: fake-quantized floats). PIPELINE (the next segment loaded before this one
// is reduced) suits the fake-quantization pass; the code-writing pass, whose kernels sit at the
// 64-register limit, spills with it and does without.
//
// A team of 1 << seg_log2 threads (a power of two <= 1024) holds one segment of S elements in
// registers (at most segment_vectors() vectors of VEC per thread), reduces its range (warp
// shuffles, then shared memory across the team's warps), computes the parameters
// (segment_params), writes them (when asked), and hands the registers to the op's `emit`: one
// read of the input. S % VEC == 0; the loop over segments is block-uniform, so every thread
// reaches every barrier. A segment is read completely before any of it is written (the team's
// reduction is a barrier), so emit may write over the input (in place).
#pragma once
#include "qp_elements.cuh"
#include "qp_range.cuh"
#include "qp_vector_io.cuh"

namespace qp {

// Geometry of the fused pass: `segments` contiguous segments of S elements, a team of
// 1 << seg_log2 threads per segment. Mirrored by SegmentLayoutArgs in quantplan/dynamic.py.
struct SegmentLayout {
  i64 segments;
  int S, seg_log2, q_min, q_max, mode, pad;
};

// Vectors of VEC elements one thread of the fused pass holds: 32 elements (16 for 8-byte
// floats), so a team of 1024 threads covers a segment of up to 32768 (16384) elements.
// quantplan/dynamic.py (segment_elements_per_thread) mirrors this.
template <class T, int VEC> __host__ __device__ constexpr int segment_vectors() { return (sizeof(T) == 8 ? 16 : 32) / VEC; }

// The scale (returned) and zero point of segment `seg` from its team's reduced range under lay's
// mode and code range (segment_params; asym == (lay.mode != 0)), stored by the team's lane 0
// where asked (scale_out / zp_out non-null).
template <class In, class Acc, class Range>
__device__ __forceinline__ Acc team_segment_params(const Range& range, bool asym, const SegmentLayout& lay,
                                                   Acc divisor, int lane, i64 seg, Acc* scale_out, int* zp_out,
                                                   int& zp) {
  const Acc scale = segment_params<Acc>(range.lo, asym ? range.hi : range_amax<In>(range.amax_bits),
                                        range_nonfinite<In>(range.amax_bits), lay.mode, lay.q_min, lay.q_max, divisor,
                                        zp);
  if (lane == 0) {
    if (scale_out) scale_out[seg] = scale;
    if (zp_out) zp_out[seg] = zp;
  }
  return scale;
}

// The elements a segment loop reads, VEC at a time: x itself. Other sources (qp_qgz.cuh: x + e,
// or a sum of dequantized peers) have the same two members and produce vectors of their scan
// element.
template <class In, int VEC, bool VECTOR_IO>
struct DirectSource {
  typedef In scan_element;
  typedef typename FloatElement<In>::storage in_t;
  const in_t* x;
  __device__ __forceinline__ void load(ElementVector<in_t, VEC>& dst, i64 i, int valid) const {
    dst.template load<VECTOR_IO>(x + i, valid);
  }
  __device__ __forceinline__ void prefetch(i64 i) const { prefetch_l2(x + i); }
};

// For each segment of the team: emit(first, lane, team, xv, range), with `first` the flat index
// of the segment's element 0, the thread's vectors xv[u] at columns (lane + u * team) * VEC
// (those below S), read from `src` (elements of In, the source's scan element), and the
// segment's range, reduced over the team (every lane holds it). ASYMMETRIC ranges (lay.mode != 0)
// hold zero (SPEC section 4) for mode 1 and are the segment's own min / max for mode 2
// (RangeScan::reset).
template <class In, int VEC, bool PIPELINE, class Source, class Emit>
__device__ __forceinline__ void for_each_segment_range_of(const Source& src, const SegmentLayout& lay, Emit emit) {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  typedef RangeScan<In> Scan;
  typedef SegmentRange<acc_t, typename Scan::bits_t> Range;
  constexpr int NV = segment_vectors<in_t, VEC>();
  __shared__ Range team_slots[32];
  const int team = 1 << lay.seg_log2;
  const int lane = threadIdx.x & (team - 1);
  const int teams_per_block = blockDim.x >> lay.seg_log2;
  const i64 stride = (i64)gridDim.x * teams_per_block;
  const bool asym = lay.mode != 0;
  const bool own_range = lay.mode == 2;
  // PIPELINE (16-bit data, whose segment takes at most 16 registers per thread): the next
  // segment's loads are issued before this one is reduced and written (two register buffers).
  // Otherwise a hint asks L2 for the next segment.
  constexpr bool kPipelined = PIPELINE;
  ElementVector<in_t, VEC> xv[NV];
  ElementVector<in_t, VEC> nx[kPipelined ? NV : 1];
  auto load_segment = [&](ElementVector<in_t, VEC>* dst, i64 s) {
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int col = (lane + u * team) * VEC;
      if (col < lay.S) src.load(dst[u], s * lay.S + col, VEC);
    }
  };
  if constexpr (kPipelined) {
    const i64 seg0 = (i64)blockIdx.x * teams_per_block + (threadIdx.x >> lay.seg_log2);
    if (seg0 < lay.segments) load_segment(xv, seg0);
  }
  for (i64 base = (i64)blockIdx.x * teams_per_block; base < lay.segments; base += stride) {
    const i64 seg = base + (threadIdx.x >> lay.seg_log2);
    const bool active = seg < lay.segments;
    const i64 next = seg + stride;
    if constexpr (kPipelined) {
      if (next < lay.segments) load_segment(nx, next);
    } else {
      if (active) load_segment(xv, seg);
      if (next < lay.segments) {
#pragma unroll
        for (int u = 0; u < NV; ++u) {
          const int col = (lane + u * team) * VEC;
          if (col < lay.S) src.prefetch(next * lay.S + col);
        }
      }
    }
    Scan scan;
    scan.reset(own_range);
#pragma unroll
    for (int u = 0; u < NV; ++u) {
      const int col = (lane + u * team) * VEC;
      if (active && col < lay.S) scan.add(xv[u], asym);
    }
    Range range = scan.result();
    team_reduce_range(range, asym, lay.seg_log2, team_slots);
    if (active) emit(seg * lay.S, lane, team, xv, range);
    if constexpr (kPipelined) {
#pragma unroll
      for (int u = 0; u < NV; ++u) xv[u] = nx[u];
    }
  }
}

// for_each_segment_range_of with SPEC section 4's parameters: emit(first, lane, team, xv, scale,
// zp) (scale = NaN, zp = 0 for a non-finite segment). Lane 0 writes scale_out[seg] (and
// zp_out[seg]) unless the pointer is null.
template <class In, int VEC, bool PIPELINE, class Source, class Emit>
__device__ __forceinline__ void for_each_dynamic_segment_of(const Source& src, const SegmentLayout& lay,
                                                            typename FloatElement<In>::acc divisor,
                                                            typename FloatElement<In>::acc* scale_out, int* zp_out,
                                                            Emit emit) {
  typedef typename FloatElement<In>::acc acc_t;
  typedef typename FloatElement<In>::storage in_t;
  typedef SegmentRange<acc_t, typename RangeScan<In>::bits_t> Range;
  constexpr int NV = segment_vectors<in_t, VEC>();
  for_each_segment_range_of<In, VEC, PIPELINE>(src, lay, [&](i64 first, int lane, int team,
                                                              const ElementVector<in_t, VEC> (&xv)[NV],
                                                              const Range& range) {
    int zp;
    const bool asym = lay.mode != 0;
    const acc_t scale = segment_params<acc_t>(range.lo, asym ? range.hi : range_amax<In>(range.amax_bits),
                                              range_nonfinite<In>(range.amax_bits), lay.mode, lay.q_min, lay.q_max,
                                              divisor, zp);
    if (lane == 0) {
      const i64 seg = first / lay.S;
      if (scale_out) scale_out[seg] = scale;
      if (zp_out) zp_out[seg] = zp;
    }
    emit(first, lane, team, xv, scale, zp);
  });
}

// for_each_dynamic_segment_of over x itself.
template <class In, int VEC, bool VECTOR_IO, bool PIPELINE, class Emit>
__device__ __forceinline__ void for_each_dynamic_segment(const typename FloatElement<In>::storage* x,
                                                         const SegmentLayout& lay,
                                                         typename FloatElement<In>::acc divisor,
                                                         typename FloatElement<In>::acc* scale_out, int* zp_out,
                                                         Emit emit) {
  const DirectSource<In, VEC, VECTOR_IO> src{x};
  for_each_dynamic_segment_of<In, VEC, PIPELINE>(src, lay, divisor, scale_out, zp_out, emit);
}

}  // namespace qp
