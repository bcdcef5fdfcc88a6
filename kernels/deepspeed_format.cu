// deepspeed_format.cu: the DeepSpeed-format plans of quantplan.compat (quantize / swizzle_quant /
// loco_swizzle_quant, quantized_reduction / loco_quantized_reduction, asymmetric dequantize, MoQ
// fake quantization), on the qgZ loops of qp_qgz.cuh with the sinks of qp_deepspeed_format.cuh.
//
//   deepspeed_quantize_segments / _group_params / _elements   (swizzled) group quantization
//   deepspeed_reduce_segments / _group_params / _elements     dequantize N peers, sum, re-quantize
//   deepspeed_dequantize                                      codes -> floats (q * p0 (+ p1))
//   moq_fake_quantize_segments / _group_params / _elements    MoQ fake quantization
//   deepspeed_quantize_dense / moq_fake_quantize_dense        the fused pass specialised for
//                                                             aligned 16-bit groups of team * 8 * NV
//   deepspeed_quantize_lanes                                  and for teams within a warp, one vector
//                                                             per thread, unswizzled
//   deepspeed_reduce_dense                                    and for output groups of team * 8 * NV
//   deepspeed_quantize_cluster / moq_fake_quantize_cluster    few long groups: a thread-block
//                                                             cluster per group (sm_90)
//                                                             (qp_deepspeed_format.cuh)
// *_segments: one read, a team holds each group (groups of up to 32768 elements); otherwise
// *_group_params (parameters, and a float2 workspace row per group) then *_elements.
// In: the input float; Err: the LoCo buffer's float or qp::no_error; Code: qp::s8 or qp::s4
// (signed, high nibble first) on both sides of the reduction.
#include "qp_deepspeed_format.cuh"

template <class In, class Err, class Code, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(QP_QGZ_SEGMENT_BOUND)
deepspeed_quantize_segments(const typename qp::FloatElement<In>::storage* __restrict__ x,
                            const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay, const qp::SwizzleMap map) {
  typedef qp::SwizzleSource<In, Err, VEC, VECTOR_IO> S;
  const qp::DeepSpeedCodeSink<typename S::scan, Code, Err, VEC, VECTOR_IO> sink{out};
  qp::qgz_fused_segments<typename S::scan, VEC>(S::make(x, out.error), sink, map, lay);
}

// The parameters do not depend on the code element: the sink's Code is a placeholder.
template <class In, class Err>
__global__ void __launch_bounds__(1024)
deepspeed_quantize_group_params(const typename qp::FloatElement<In>::storage* __restrict__ x,
                                const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay,
                                const qp::SwizzleMap map) {
  typedef qp::SwizzleSource<In, Err, 1, false> S;
  const qp::DeepSpeedCodeSink<typename S::scan, qp::s8, Err, 1, false> sink{out};
  qp::qgz_group_params<typename S::scan>(S::make(x, out.error), sink, map, lay);
}

template <class In, class Err, class Code>
__global__ void __launch_bounds__(256)
deepspeed_quantize_elements(const typename qp::FloatElement<In>::storage* __restrict__ x,
                            const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay, const qp::SwizzleMap map) {
  typedef qp::SwizzleSource<In, Err, 1, false> S;
  const qp::DeepSpeedCodeSink<typename S::scan, Code, Err, 1, false> sink{out};
  qp::qgz_elements<typename S::scan, qp::QuantElement<Code>::kind == 1>(S::make(x, out.error), sink, map, lay);
}

template <class Code, class Err, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(QP_QGZ_SEGMENT_BOUND)
deepspeed_reduce_segments(const qp::PeerSumArgs in, const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay) {
  const qp::DeepSpeedCodeSink<qp::f32, Code, Err, VEC, VECTOR_IO> sink{out};
  qp::qgz_fused_segments<qp::f32, VEC>(qp::DeepSpeedReduceSource<Code, Err, VEC, VECTOR_IO>::make(in, out), sink,
                                       qp::SameGroups(), lay);
}

template <class Code, class Err>
__global__ void __launch_bounds__(1024)
deepspeed_reduce_group_params(const qp::PeerSumArgs in, const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay) {
  const qp::DeepSpeedCodeSink<qp::f32, Code, Err, 1, false> sink{out};
  qp::qgz_group_params<qp::f32>(qp::DeepSpeedReduceSource<Code, Err, 1, false>::make(in, out), sink, qp::SameGroups(),
                                lay);
}

template <class Code, class Err>
__global__ void __launch_bounds__(256)
deepspeed_reduce_elements(const qp::PeerSumArgs in, const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay) {
  const qp::DeepSpeedCodeSink<qp::f32, Code, Err, 1, false> sink{out};
  qp::qgz_elements<qp::f32, qp::QuantElement<Code>::kind == 1>(
      qp::DeepSpeedReduceSource<Code, Err, 1, false>::make(in, out), sink, qp::SameGroups(), lay);
}

// n codes -> floats, VEC per step (VEC divides the group size): one peer of the reduction's source.
template <class Code, class Out, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256)
deepspeed_dequantize(const qp::PeerSumArgs in, typename qp::FloatElement<Out>::storage* __restrict__ y, qp::i64 n) {
  const qp::PeerSumSource<Code, qp::no_error, VEC, VECTOR_IO, true, qp::DeepSpeedPeerDecode> src{in, nullptr};
  qp::qgz_float_values<Out, VEC, VECTOR_IO>(src, y, n);
}

// MoQ: out.q is the float output (may be x itself: in place).
template <class In, bool STOCHASTIC, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(QP_QGZ_SEGMENT_BOUND)
moq_fake_quantize_segments(const typename qp::FloatElement<In>::storage* x, const qp::DeepSpeedOutputArgs out,
                           const qp::SegmentLayout lay) {
  const qp::DirectSource<In, VEC, VECTOR_IO> src{x};
  const qp::MoQSink<In, VEC, VECTOR_IO, STOCHASTIC> sink{out};
  qp::qgz_fused_segments<In, VEC>(src, sink, qp::SameGroups(), lay);
}

template <class In>
__global__ void __launch_bounds__(1024)
moq_fake_quantize_group_params(const typename qp::FloatElement<In>::storage* x, const qp::DeepSpeedOutputArgs out,
                               const qp::SegmentLayout lay) {
  const qp::DirectSource<In, 1, false> src{x};
  const qp::MoQSink<In, 1, false, false> sink{out};
  qp::qgz_group_params<In>(src, sink, qp::SameGroups(), lay);
}

template <class In, bool STOCHASTIC>
__global__ void __launch_bounds__(256)
moq_fake_quantize_elements(const typename qp::FloatElement<In>::storage* x, const qp::DeepSpeedOutputArgs out,
                           const qp::SegmentLayout lay) {
  const qp::DirectSource<In, 1, false> src{x};
  const qp::MoQSink<In, 1, false, STOCHASTIC> sink{out};
  qp::qgz_elements<In, false>(src, sink, qp::SameGroups(), lay);
}

// The dense pass of quantize / swizzle_quant (qp_deepspeed_format.cuh): 16-bit input, no LoCo
// buffer, groups of exactly team * 8 * NV elements, 16-byte aligned input; ASYM and the code's
// bits are template constants (out.asym / out.bits unused). deepspeed_quantize_segments' parameters.
template <class In, class Code, bool ASYM, int NV>
__global__ void __launch_bounds__(QP_DS_DENSE_BLOCK, QP_DS_DENSE_MIN_BLOCKS)
deepspeed_quantize_dense(const typename qp::FloatElement<In>::storage* __restrict__ x,
                         const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay, const qp::SwizzleMap map) {
  constexpr bool packed = qp::QuantElement<Code>::kind == 1;
  constexpr int bits = packed ? 4 : 8;
  qp::ds_dense_groups<In, ASYM, NV>(x, lay, [&](qp::u32 seg, int lane, const uint4 (&v)[NV], qp::u32 r) {
    const int team = 1 << lay.seg_log2;
    float lo, hi, absmax;
    bool bad;
    qp::ds_range_values<In, ASYM>(r, lo, hi, absmax, bad);
    const qp::u32 og = qp::ds_map32(map, seg);
    qp::u8* qs = out.q + (packed ? (qp::i64)og * (lay.S / 2) : (qp::i64)og * lay.S);
    const qp::DeepSpeedDenseParam p = qp::deepspeed_dense_params<ASYM, bits>(lo, hi, absmax, bad);
    if (!p.fast) {
      qp::deepspeed_dense_generic<In, Code, NV>(x + (qp::i64)seg * lay.S, qs, out.params, og, lane, team, lo, hi,
                                                absmax, bad, ASYM);
      return;
    }
    qp::deepspeed_dense_store<Code, ASYM, NV>(qs, out.params, og, lane, team, p, [&](int w, int(&c)[8]) {
      qp::deepspeed_dense_codes<In, ASYM, bits>(v[w], p, c);
    });
  });
}

// The dense pass of quantize for teams within a warp (TEAM a compile-time power of two up to 32,
// one 16-byte vector per thread: groups of TEAM * 8 elements, e.g. 16 x 8 = 128), selected when
// the group map is the identity (plain quantize, or a swizzle of one slice): its parameters and
// codes are deepspeed_quantize_dense's, bit for bit. Against it, on small problems (16 x 8192 f16,
// groups of 128), where one group's latency chain is the kernel's time:
//  * one pass: the grid covers every group (_dense_pass), a thread's group follows from its block
//    and lane in 32 bits, and its load is the kernel's first memory instruction, no branch before
//    it (a thread past the last group loads the last one and stores nothing);
//  * the team's range by xor shuffles alone, unrolled at TEAM (no shared stage, no barrier);
//  * no swizzle map (the identity: `map` unused);
//  * the codes stored first, then lane 0's parameters; a group outside the division-free path
//    then takes deepspeed_dense_generic, out of line, which overwrites the same bytes and words
//    (each thread its own, in program order).
template <class In, class Code, bool ASYM, int TEAM>
__global__ void __launch_bounds__(QP_DS_DENSE_BLOCK, QP_DS_DENSE_MIN_BLOCKS)
deepspeed_quantize_lanes(const typename qp::FloatElement<In>::storage* __restrict__ x,
                         const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay, const qp::SwizzleMap) {
  using qp::u32;
  constexpr bool packed = qp::QuantElement<Code>::kind == 1;
  constexpr int bits = packed ? 4 : 8;
  static_assert(TEAM >= 1 && TEAM <= 32 && (TEAM & (TEAM - 1)) == 0, "a team within a warp");
  const int lane = threadIdx.x & (TEAM - 1);
  const u32 seg = blockIdx.x * (blockDim.x / TEAM) + threadIdx.x / TEAM;
  const u32 segments = (u32)lay.segments;
  const u32 at = min(seg, segments - 1u) * TEAM + lane;  // 16-byte vectors: below 2^28
  const uint4 v[1] = {reinterpret_cast<const uint4*>(x)[at]};
  u32 r = qp::ds_range_word<In, ASYM, 1>(v);
#pragma unroll
  for (int d = 1; d < TEAM; d <<= 1) r = qp::ds_range_combine<In, ASYM>(r, __shfl_xor_sync(0xFFFFFFFFu, r, d));
  if (seg >= segments) return;
  float lo, hi, absmax;
  bool bad;
  qp::ds_range_values<In, ASYM>(r, lo, hi, absmax, bad);
  const qp::DeepSpeedDenseParam p = qp::deepspeed_dense_params<ASYM, bits>(lo, hi, absmax, bad);
  qp::u8* qs = out.q + (packed ? seg * (u32)(TEAM * 4) : seg * (u32)(TEAM * 8));
  int c[8];
  qp::deepspeed_dense_codes<In, ASYM, bits>(v[0], p, c);
  qp::qgz_dense_store_codes<Code, true, 8>(qs + (packed ? lane * 4 : lane * 8), c);
  if (lane == 0) qp::store_group_params(out.params, seg, p.inv, p.offset, ASYM);
  if (!p.fast)
    qp::deepspeed_dense_generic<In, Code, 1>(x + (qp::i64)seg * (TEAM * 8), qs, out.params, seg, lane, TEAM, lo, hi,
                                             absmax, bad, ASYM);
}

// The dense pass of MoQ, SYMMETRIC with nearest rounding (out.q: the float output, may be x
// itself): groups with a scale in the fast range division-free, the others by MoQSink::value_of.
template <class In, int NV>
__global__ void __launch_bounds__(QP_DS_DENSE_BLOCK, QP_DS_DENSE_MIN_BLOCKS)
moq_fake_quantize_dense(const typename qp::FloatElement<In>::storage* x, const qp::DeepSpeedOutputArgs out,
                        const qp::SegmentLayout lay) {
  typedef typename qp::FloatElement<In>::storage in_t;
  qp::ds_dense_groups<In, false, NV>(x, lay, [&](qp::u32 seg, int lane, const uint4 (&v)[NV], qp::u32 r) {
    const int team = 1 << lay.seg_log2;
    float lo, hi, absmax;
    bool bad;
    qp::ds_range_values<In, false>(r, lo, hi, absmax, bad);
    const qp::MoQParam p = qp::MoQSink<In, 8, true, false>::params_of(lo, hi, absmax, bad, out.bits, false);
    in_t* ys = reinterpret_cast<in_t*>(out.q) + (qp::i64)seg * lay.S;
    if (p.bad || !(p.a >= 8.673617379884035e-19f && p.a <= 1.2676506002282294e+30f)) {
      qp::moq_dense_generic<In, NV>(x + (qp::i64)seg * lay.S, ys, lane, team, p, out.bits, false);
      return;
    }
    const float inv = qp::ds_rcp_rn(p.a), top = (float)((1 << (out.bits - 1)) - 1);
#pragma unroll
    for (int w = 0; w < NV; ++w) {
      const int col = (lane + w * team) * 8;
      *reinterpret_cast<uint4*>(ys + col) = qp::moq_dense_values<In>(v[w], p.a, inv, top);
    }
  });
}

// The dense pass of quantized_reduction (qp_deepspeed_format.cuh): output groups of exactly team
// * 8 * NV elements, input groups a multiple of 8, no LoCo buffer, aligned codes; ASYM and the
// code's bits are template constants. deepspeed_reduce_segments' parameters.
template <class Code, bool ASYM, int NV>
__global__ void __launch_bounds__(QP_DS_DENSE_BLOCK, QP_DS_REDUCE_MIN_BLOCKS)
deepspeed_reduce_dense(const qp::PeerSumArgs in, const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay) {
  using qp::u32;
  constexpr bool packed = qp::QuantElement<Code>::kind == 1;
  constexpr int bits = packed ? 4 : 8;
  __shared__ qp::DsFloatRange slots[2][QP_DS_DENSE_BLOCK / 32];
  qp::ds_dense_group_loop(lay, [&](u32 seg, int lane, int team, bool active, int parity) {
    float s[NV][8];
    qp::DsFloatRange r;
    r.amax = 0u;
    r.lo = __int_as_float(0x7F800000);
    r.hi = -r.lo;
#pragma unroll
    for (int w = 0; w < NV; ++w) {
      if (active) {
        qp::ds_peer_sum8<Code, ASYM>(in, seg * (u32)lay.S + (lane + w * team) * 8, s[w]);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) s[w][k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        r.amax = max(r.amax, __float_as_uint(s[w][k]) & 0x7FFFFFFFu);
        if (ASYM) {
          r.lo = fminf(r.lo, s[w][k]);
          r.hi = fmaxf(r.hi, s[w][k]);
        }
      }
    }
    r = qp::ds_team_float_range<ASYM>(r, team, slots[parity]);
    if (!active) return;
    const bool bad = r.amax >= 0x7F800000u;
    const float absmax = __uint_as_float(r.amax);
    const qp::DeepSpeedDenseParam p = qp::deepspeed_dense_params<ASYM, bits>(r.lo, r.hi, absmax, bad);
    qp::u8* qs = out.q + (packed ? (qp::i64)seg * (lay.S / 2) : (qp::i64)seg * lay.S);
    if (!p.fast) {
      typedef qp::DeepSpeedCodeSink<qp::f32, Code, qp::no_error, 8, true> Sink;
      const qp::DeepSpeedParam g = Sink::params_of(r.lo, r.hi, absmax, bad, bits, ASYM);
      if (lane == 0) qp::store_group_params(out.params, seg, g.inv, g.offset, ASYM);
#pragma unroll
      for (int w = 0; w < NV; ++w) {
        const int col = (lane + w * team) * 8;
        qp::DsFloat8 v;
#pragma unroll
        for (int k = 0; k < 8; ++k) v.v[k] = s[w][k];
        qp::deepspeed_float_generic_codes<Code>(v, qs + (packed ? col / 2 : col), g, ASYM);
      }
      return;
    }
    qp::deepspeed_dense_store<Code, ASYM, NV>(qs, out.params, seg, lane, team, p, [&](int w, int(&c)[8]) {
#pragma unroll
      for (int k = 0; k < 8; ++k) c[k] = qp::deepspeed_dense_code<ASYM, bits>(s[w][k], p);
    });
  });
}

// One group per thread-block cluster (qp_deepspeed_format.cuh), sm_90: groups of
// QP_DS_CLUSTER_BLOCKS * blockDim.x * 8 16-bit floats (blockDim.x a multiple of 32), one vector per
// thread, the grid QP_DS_CLUSTER_BLOCKS blocks per group; otherwise as deepspeed_quantize_dense.
// Other architectures: never selected (the body traps).
template <class In, class Code, bool ASYM>
__global__ void QP_DS_CLUSTER_DIMS __launch_bounds__(1024)
deepspeed_quantize_cluster(const typename qp::FloatElement<In>::storage* __restrict__ x,
                           const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay, const qp::SwizzleMap map) {
#if __CUDA_ARCH__ >= 900
  constexpr bool packed = qp::QuantElement<Code>::kind == 1;
  constexpr int bits = packed ? 4 : 8;
  __shared__ qp::u32 warp_slots[32];
  __shared__ qp::u32 shares[QP_DS_CLUSTER_BLOCKS];
  const qp::u32 rank = blockIdx.x % QP_DS_CLUSTER_BLOCKS, seg = blockIdx.x / QP_DS_CLUSTER_BLOCKS;
  const int col = (rank * blockDim.x + threadIdx.x) * 8;
  const typename qp::FloatElement<In>::storage* xs = x + (qp::i64)seg * lay.S;
  qp::ds_cluster_arrive();
  const uint4 v[1] = {*reinterpret_cast<const uint4*>(xs + col)};
  const qp::u32 r = qp::ds_cluster_range<In, ASYM>(qp::ds_range_word<In, ASYM, 1>(v), warp_slots, shares);
  float lo, hi, absmax;
  bool bad;
  qp::ds_range_values<In, ASYM>(r, lo, hi, absmax, bad);
  const qp::u32 og = qp::ds_map32(map, seg);
  qp::u8* qs = out.q + (packed ? ((qp::i64)og * lay.S + col) / 2 : (qp::i64)og * lay.S + col);
  const bool writer = rank == 0 && threadIdx.x == 0;
  const qp::DeepSpeedDenseParam p = qp::deepspeed_dense_params<ASYM, bits>(lo, hi, absmax, bad);
  if (!p.fast) {
    qp::deepspeed_dense_generic<In, Code, 1>(xs + col, qs, writer ? out.params : nullptr, og, 0, 1, lo, hi, absmax,
                                             bad, ASYM);
    return;
  }
  if (writer) qp::store_group_params(out.params, og, p.inv, p.offset, ASYM);
  int c[8];
  qp::deepspeed_dense_codes<In, ASYM, bits>(v[0], p, c);
  qp::qgz_dense_store_codes<Code, true, 8>(qs, c);
#else
  __trap();
#endif
}

// MoQ SYMMETRIC nearest, one group per thread-block cluster (as deepspeed_quantize_cluster).
template <class In>
__global__ void QP_DS_CLUSTER_DIMS __launch_bounds__(1024)
moq_fake_quantize_cluster(const typename qp::FloatElement<In>::storage* x, const qp::DeepSpeedOutputArgs out,
                          const qp::SegmentLayout lay) {
#if __CUDA_ARCH__ >= 900
  typedef typename qp::FloatElement<In>::storage in_t;
  __shared__ qp::u32 warp_slots[32];
  __shared__ qp::u32 shares[QP_DS_CLUSTER_BLOCKS];
  const qp::u32 rank = blockIdx.x % QP_DS_CLUSTER_BLOCKS, seg = blockIdx.x / QP_DS_CLUSTER_BLOCKS;
  const int col = (rank * blockDim.x + threadIdx.x) * 8;
  const in_t* xs = x + (qp::i64)seg * lay.S + col;
  in_t* ys = reinterpret_cast<in_t*>(out.q) + (qp::i64)seg * lay.S + col;
  qp::ds_cluster_arrive();
  const uint4 v[1] = {*reinterpret_cast<const uint4*>(xs)};
  const qp::u32 r = qp::ds_cluster_range<In, false>(qp::ds_range_word<In, false, 1>(v), warp_slots, shares);
  float lo, hi, absmax;
  bool bad;
  qp::ds_range_values<In, false>(r, lo, hi, absmax, bad);
  const qp::MoQParam p = qp::MoQSink<In, 8, true, false>::params_of(lo, hi, absmax, bad, out.bits, false);
  if (p.bad || !(p.a >= 8.673617379884035e-19f && p.a <= 1.2676506002282294e+30f)) {
    qp::moq_dense_generic<In, 1>(xs, ys, 0, 1, p, out.bits, false);
    return;
  }
  const float inv = qp::ds_rcp_rn(p.a), top = (float)((1 << (out.bits - 1)) - 1);
  *reinterpret_cast<uint4*>(ys) = qp::moq_dense_values<In>(v[0], p.a, inv, top);
#else
  __trap();
#endif
}
