// qp_qgz.cuh: the ZeRO++ qgZ kernels' shared device code (swizzled_quantize.cu, dequant_reduce.cu).
//
// Both ops are "dynamic-range group quantization of a source, written through a group map, with
// optional LoCo error feedback":
//   SwizzledQuantizePlan   source x (or v = x + e), groups written in swizzled order (SwizzleMap)
//   DequantReducePlan      source sum_j dequant(q_j) (averaged; + e), groups in place
// Three loops serve every problem:
//   qgz_fused_segments    one team holds a group in registers: one read (groups of at most
//                         segment_vectors() * 1024 elements; qp_dynamic_segments.cuh)
//   qgz_group_params      any group size: a block scans a group (one element per thread per step)
//                         and writes its parameters through the map
//   qgz_elements          then every element (pairs for 4-bit codes) is read again, quantized with
//                         its group's parameters and written (and its error updated)
// Arithmetic (SPEC section 4, float32, each operation rounded once, no FMA): dequantize
// (q - zp) * scale; sums in peer order; average by IEEE division; v = x + e; the LoCo update
// e' = (b * e) + (c * (v - (q - zp) * scale)) rounded once to the buffer's element.
#pragma once
#include "qp_dynamic_segments.cuh"
#include "qp_elements.cuh"
#include "qp_packing.cuh"
#include "qp_quantize_vector.cuh"
#include "qp_range.cuh"
#include "qp_rounding.cuh"
#include "qp_vector_io.cuh"

// Threads a fused-pass kernel is compiled for (its register budget: 64 per thread at 1024).
#ifndef QP_QGZ_SEGMENT_BOUND
#define QP_QGZ_SEGMENT_BOUND 1024
#endif
// 1: the fused pass loads the next group of 16-bit data before reducing the current one.
#ifndef QP_QGZ_PIPELINE
#define QP_QGZ_PIPELINE 0
#endif

namespace qp {

// Tag: no LoCo error buffer.
struct no_error {};

template <class Err> struct ErrorStorage {
  typedef typename FloatElement<Err>::storage type;
  static const bool loco = true;
};
template <> struct ErrorStorage<no_error> {
  typedef u8 type;
  static const bool loco = false;
};

// ---- group maps: where group g of the source is written ----

// Identity (DequantReducePlan).
struct SameGroups {
  __device__ __forceinline__ i64 operator()(i64 g) const { return g; }
};

// The swizzle of SwizzledQuantizePlan: source group g is group r of slice k = z * pipeline + p
// (partition z = node * devices_per_node + device); it goes to group r of output slice
// (p * devices_per_node + device) * nodes + node. Mirrored by SwizzleMapArgs in Python.
struct SwizzleMap {
  i64 slice_groups;
  int nodes, devices_per_node, pipeline, pad;
  __device__ __forceinline__ i64 operator()(i64 g) const {
    if (nodes * devices_per_node * pipeline == 1) return g;
    const i64 k = g / slice_groups;
    const i64 r = g - k * slice_groups;
    const int p = (int)(k % pipeline);
    const int z = (int)(k / pipeline);
    const int node = z / devices_per_node;
    const int device = z - node * devices_per_node;
    return ((i64)(p * devices_per_node + device) * nodes + node) * slice_groups + r;
  }
};

// ---- sources (the members DirectSource of qp_dynamic_segments.cuh has) ----

// v = x + e in float32 (each upcast exactly, one rounding): the LoCo input of swizzled quantization.
template <class In, class Err, int VEC, bool VECTOR_IO>
struct ErrorFeedbackSource {
  typedef f32 scan_element;
  typedef typename FloatElement<In>::storage in_t;
  typedef typename FloatElement<Err>::storage err_t;
  const in_t* x;
  const err_t* e;
  __device__ __forceinline__ void load(ElementVector<float, VEC>& dst, i64 i, int valid) const {
    ElementVector<in_t, VEC> xv;
    ElementVector<err_t, VEC> ev;
    xv.template load<VECTOR_IO>(x + i, valid);
    ev.template load<VECTOR_IO>(e + i, valid);
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      dst.v[k] = __fadd_rn(FloatElement<In>::to_acc(xv.v[k]), FloatElement<Err>::to_acc(ev.v[k]));
  }
  __device__ __forceinline__ void prefetch(i64 i) const {
    prefetch_l2(x + i);
    prefetch_l2(e + i);
  }
};

// The codes of one peer, VEC at a time (4-bit: VEC even, element i even), decoded to ints.
template <class Code, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
struct CodeVector {
  static const bool packed = QuantElement<Code>::kind == 1;
  static const bool is_signed = QuantElement<Code>::is_signed;
  static const int bytes = packed ? (VEC + 1) / 2 : VEC;
  ElementVector<u8, bytes> b;
  __device__ __forceinline__ void load(const u8* q, i64 i, int valid) {
    if constexpr (packed) {
      b.template load<VECTOR_IO>(q + i / 2, (valid + 1) / 2);
    } else {
      b.template load<VECTOR_IO>(q + i, valid);
    }
  }
  // Code of element i + k. 4-bit: with VEC >= 2, i is even (static nibble indices, so the vector
  // stays in registers); with VEC == 1, element i's own nibble of the one byte.
  __device__ __forceinline__ int code(int k, i64 i) const {
    if constexpr (packed) {
      if constexpr (VEC == 1) return unpack_nibble<HIGH_FIRST, is_signed>(b.v[0], (int)(i & 1));
      return unpack_nibble<HIGH_FIRST, is_signed>(b.v[k / 2], k & 1);
    }
    return is_signed ? (int)(i8)b.v[k] : (int)b.v[k];
  }
};

// (q - zp) * scale in float32, one rounding.
__device__ __forceinline__ float dequantized_code(int code, const DequantParam<float>& p) {
  return __fmul_rn(centered_code(code, p), p.scale);
}

// Mirrored by PeerSumArgs in quantplan/dequant_reduce.py.
struct PeerSumArgs {
  const u8* q;             // peer j's codes at q + j * peer_bytes
  const float* scale;      // peer j's parameters at j * peer_params
  const int* zp;           // null: SYMMETRIC
  i64 peer_bytes, peer_params, in_group;
  int peers, average;
  float peers_f;           // float32(peers)
  int in_group_shift;      // log2(in_group) when a power of two, else -1
};

// s = ((y_0 + y_1) + ...) in peer order, y_j = (q_j - zp_j) * scale_j; average: s / f32(N); LoCo:
// v = s + e. The VEC elements share one input group (the plan keeps VEC a divisor of in_group).
template <class Code, class Err, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
struct PeerSumSource {
  typedef f32 scan_element;
  typedef typename ErrorStorage<Err>::type err_t;
  static const bool loco = ErrorStorage<Err>::loco;
  PeerSumArgs a;
  const err_t* e;
  __device__ __forceinline__ DequantParam<float> param(int j, i64 g) const {
    DequantParam<float> p;
    const i64 at = (i64)j * a.peer_params + g;
    p.set(a.scale[at], a.zp ? a.zp[at] : 0);
    return p;
  }
  __device__ __forceinline__ void load(ElementVector<float, VEC>& dst, i64 i, int valid) const {
    float s[VEC];
    const i64 g = a.in_group_shift >= 0 ? i >> a.in_group_shift : i / a.in_group;
    // Wide vectors keep four peers' loads in flight; narrow ones (many per thread) stay compact.
#pragma unroll(VEC >= 8 ? 4 : 1)
    for (int j = 0; j < a.peers; ++j) {
      CodeVector<Code, VEC, VECTOR_IO, HIGH_FIRST> cv;
      cv.load(a.q + j * a.peer_bytes, i, valid);
      const DequantParam<float> p = param(j, g);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float y = dequantized_code(cv.code(k, i), p);
        s[k] = j == 0 ? y : __fadd_rn(s[k], y);
      }
    }
    if (a.average) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) s[k] = __fdiv_rn(s[k], a.peers_f);
    }
    if constexpr (loco) {
      ElementVector<err_t, VEC> ev;
      ev.template load<VECTOR_IO>(e + i, valid);
#pragma unroll
      for (int k = 0; k < VEC; ++k) s[k] = __fadd_rn(s[k], FloatElement<Err>::to_acc(ev.v[k]));
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) dst.v[k] = s[k];
  }
  __device__ __forceinline__ void prefetch(i64) const {}
};

// ---- the output side: codes, parameters, and the LoCo update ----

// Mirrored by QgzOutputArgs in Python.
struct QgzOutputArgs {
  u8* q;
  float* scale_out;
  int* zp_out;           // null: SYMMETRIC
  void* error;           // the LoCo buffer (null without error feedback), in the source's order
  float beta, one_minus_beta;
};

template <class Scan, class Out, class Err, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
struct QgzCodeSink {
  typedef VectorQuantizer<Scan, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::vector_t vector_t;
  typedef typename ErrorStorage<Err>::type err_t;
  static const bool loco = ErrorStorage<Err>::loco;
  static const bool high_first = HIGH_FIRST;
  QgzOutputArgs o;
  int q_min, q_max;

  __device__ __forceinline__ void params(i64 g, float scale, int zp) const {
    o.scale_out[g] = scale;
    if (o.zp_out) o.zp_out[g] = zp;
  }

  // e' = (b * e) + (c * (v - (q - zp) * scale)), each operation rounded once in float32.
  __device__ __forceinline__ float error_update(float e, float v, int code, const DequantParam<float>& dp) const {
    const float r = __fsub_rn(v, dequantized_code(code, dp));
    return __fadd_rn(__fmul_rn(o.beta, e), __fmul_rn(o.one_minus_beta, r));
  }

  // The VEC source elements at src (one group: one parameter), written at output element out.
  __device__ __forceinline__ void vector(i64 src, i64 out, const vector_t& v, const IntQuantParam<float>& p,
                                         int valid) const {
    int codes[VEC];
    VQ::codes(v, p, q_min, q_max, false, codes);
    VQ::template store<VECTOR_IO>(o.q + (VQ::packed ? out / 2 : out), valid, codes);
    if constexpr (loco) {
      DequantParam<float> dp;
      dp.set(p.scale, p.zp);
      err_t* e = reinterpret_cast<err_t*>(o.error) + src;
      ElementVector<err_t, VEC> ev;
      ev.template load<VECTOR_IO>(e, valid);
      float ne[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) ne[k] = error_update(FloatElement<Err>::to_acc(ev.v[k]), v.v[k], codes[k], dp);
      const ElementVector<err_t, VEC> nv = vector_from_acc<Err, VEC>(ne);
      nv.template store<VECTOR_IO>(e, valid);
    }
  }

  // One element with its own parameters (the element loop; 4-bit codes go through `pair`).
  __device__ __forceinline__ int element(i64 src, float v, float scale, int zp) const {
    IntQuantParam<float> p;
    p.set(scale, zp);
    const int code = VQ::code(v, p, q_min, q_max, false);
    if constexpr (loco) {
      DequantParam<float> dp;
      dp.set(scale, zp);
      err_t* e = reinterpret_cast<err_t*>(o.error) + src;
      *e = FloatElement<Err>::from_acc(error_update(FloatElement<Err>::to_acc(*e), v, code, dp));
    }
    return code;
  }
};

// ---- the loops ----

// One team per group, one read (for_each_dynamic_segment_of); groups written through `map`.
template <class Scan, int VEC, class Source, class Sink, class Map>
__device__ __forceinline__ void qgz_fused_segments(const Source& src, const Sink& sink, const Map& map,
                                                   const SegmentLayout& lay, float divisor) {
  typedef typename FloatElement<Scan>::storage in_t;
  constexpr int NV = segment_vectors<in_t, VEC>();
  for_each_dynamic_segment_of<Scan, VEC, QP_QGZ_PIPELINE && sizeof(in_t) == 2>(
      src, lay, divisor, (float*)nullptr, (int*)nullptr,
      [&](i64 first, int lane, int team, const ElementVector<in_t, VEC> (&xv)[NV], float scale, int zp) {
        const i64 g = first / lay.S;
        const i64 out = map(g);
        if (lane == 0) sink.params(out, scale, zp);
        IntQuantParam<float> p;
        p.set(scale, zp);
#pragma unroll
        for (int u = 0; u < NV; ++u) {
          const int col = (lane + u * team) * VEC;
          if (col < lay.S) sink.vector(first + col, out * lay.S + col, xv[u], p, VEC);
        }
      });
}

// Any group size: one block per group scans it an element at a time (source of VEC == 1) and
// writes the parameters through `map`. blockDim.x is a power of two.
template <class Scan, class Source, class Sink, class Map>
__device__ __forceinline__ void qgz_group_params(const Source& src, const Sink& sink, const Map& map,
                                                 const SegmentLayout& lay, float divisor) {
  typedef RangeScan<Scan> ScanT;
  typedef SegmentRange<float, typename ScanT::bits_t> Range;
  typedef typename FloatElement<Scan>::storage in_t;
  __shared__ Range slots[32];
  const bool asym = lay.mode != 0;
  int log2_threads = 0;
  while ((1 << log2_threads) < (int)blockDim.x) ++log2_threads;
  for (i64 g = blockIdx.x; g < lay.segments; g += gridDim.x) {
    ScanT scan;
    scan.reset();
    for (i64 col = threadIdx.x; col < lay.S; col += blockDim.x) {
      ElementVector<in_t, 1> v;
      src.load(v, g * lay.S + col, 1);
      scan.add(v, asym);
    }
    Range r = scan.result();
    team_reduce_range(r, asym, log2_threads, slots);
    if (threadIdx.x == 0) {
      int zp;
      const float scale = segment_params<float>(r.lo, asym ? r.hi : range_amax<Scan>(r.amax_bits),
                                                range_nonfinite<Scan>(r.amax_bits), lay.mode, lay.q_min, lay.q_max,
                                                divisor, zp);
      sink.params(map(g), scale, zp);
    }
  }
}

// After qgz_group_params: every element again, quantized with its group's parameters (read
// back through `map`). PAIR (4-bit codes): units of two elements, i even, written as one byte
// (the two may belong to neighbouring groups, which the map keeps neighbours).
template <class Scan, bool PAIR, class Source, class Sink, class Map>
__device__ __forceinline__ void qgz_elements(const Source& src, const Sink& sink, const Map& map,
                                             const SegmentLayout& lay) {
  typedef typename FloatElement<Scan>::storage in_t;
  constexpr int U = PAIR ? 2 : 1;
  const i64 n = lay.segments * lay.S;
  const i64 stride = (i64)gridDim.x * blockDim.x * U;
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * U; i < n; i += stride) {
    int codes[U];
    i64 out = 0;
#pragma unroll
    for (int k = 0; k < U; ++k) {
      ElementVector<in_t, 1> v;
      src.load(v, i + k, 1);
      const i64 g = (i + k) / lay.S;
      const i64 og = map(g);
      if (k == 0) out = og * lay.S + (i - g * lay.S);
      const float scale = sink.o.scale_out[og];
      const int zp = sink.o.zp_out ? sink.o.zp_out[og] : 0;
      codes[k] = sink.element(i + k, FloatElement<Scan>::to_acc(v.v[0]), scale, zp);
    }
    if constexpr (PAIR) {
      sink.o.q[out / 2] = pack_nibbles<Sink::high_first>(codes[0], codes[1]);
    } else {
      sink.o.q[out] = (u8)codes[0];
    }
  }
}

}  // namespace qp
