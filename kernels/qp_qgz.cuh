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
// and qgz_dense_quantize specialises the first for aligned 16-bit groups without LoCo (below).
// The loops are formula-agnostic: a *sink* owns the group formula (its param_t, parameters from
// a group's range, codes, where parameters go). QgzCodeSink is SPEC section 4's; the
// DeepSpeed-format sinks (qp_deepspeed_format.cuh) plug into the same loops. A sink has:
//   param_t; group_params<Scan>(range) -> param_t; params(g, p) (store, lane 0 / thread 0);
//   vector(src, out, v, p, valid) (VEC elements of one group); load_params(g) (two-pass: read
//   back what params stored); store_unit<U>(i, out, v[U], p[U]) (U = 1, or 2 for 4-bit pairs).
// The source owns how a peer's codes are decoded (PeerDecode: SpecPeerDecode here).
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
#include "qp_stage.cuh"
#include "qp_vector_io.cuh"

// Threads a fused-pass kernel is compiled for (its register budget: 64 per thread at 1024).

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
    // One stage and one node (or one device per node): partition z goes to slice z, the identity.
    if (pipeline == 1 && (nodes == 1 || devices_per_node == 1)) return g;
    if (g <= 0x7FFFFFFF && slice_groups <= 0x7FFFFFFF) {  // 32-bit quotients (the usual sizes)
      const u32 sg = (u32)slice_groups, k = (u32)g / sg, r = (u32)g - k * sg;
      const u32 p = k % (u32)pipeline, z = k / (u32)pipeline;
      const u32 node = z / (u32)devices_per_node, device = z - node * (u32)devices_per_node;
      return ((i64)(p * (u32)devices_per_node + device) * nodes + node) * slice_groups + r;
    }
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

// The source of swizzled quantization: x itself, or v = x + e with error feedback (then the
// scan is float32). Err: the error buffer's float or no_error.
template <class In, class Err, int VEC, bool VECTOR_IO>
struct SwizzleSource {
  typedef ErrorFeedbackSource<In, Err, VEC, VECTOR_IO> type;
  typedef f32 scan;
  static __device__ __forceinline__ type make(const typename FloatElement<In>::storage* x, const void* e) {
    return type{x, reinterpret_cast<const typename FloatElement<Err>::storage*>(e)};
  }
};
template <class In, int VEC, bool VECTOR_IO>
struct SwizzleSource<In, no_error, VEC, VECTOR_IO> {
  typedef DirectSource<In, VEC, VECTOR_IO> type;
  typedef In scan;
  static __device__ __forceinline__ type make(const typename FloatElement<In>::storage* x, const void*) {
    return type{x};
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

// Mirrored by PeerSumArgs in quantplan/ops/dequant_reduce.py.
struct PeerSumArgs {
  const u8* q;             // peer j's codes at q + j * peer_bytes
  const float* scale;      // peer j's parameters at j * peer_params
  const int* zp;           // null: SYMMETRIC
  i64 peer_bytes, peer_params, in_group;
  int peers, average;
  float peers_f;           // float32(peers)
  int in_group_shift;      // log2(in_group) when a power of two, else -1
};

// SPEC section 4's decoding of a peer's code: y = (q - zp) * scale (zp null: SYMMETRIC).
struct SpecPeerDecode {
  typedef DequantParam<float> param_t;
  static __device__ __forceinline__ param_t param(const PeerSumArgs& a, i64 at) {
    param_t p;
    p.set(a.scale[at], a.zp ? a.zp[at] : 0);
    return p;
  }
  static __device__ __forceinline__ float value(int code, const param_t& p) { return dequantized_code(code, p); }
};

// s = ((y_0 + y_1) + ...) in peer order, y_j = Decode::value(q_j, params of peer j's group);
// average: s / f32(N); LoCo: v = s + e. The VEC elements share one input group (the plan keeps
// VEC a divisor of in_group).
template <class Code, class Err, int VEC, bool VECTOR_IO, bool HIGH_FIRST, class Decode = SpecPeerDecode>
struct PeerSumSource {
  typedef f32 scan_element;
  typedef typename ErrorStorage<Err>::type err_t;
  static const bool loco = ErrorStorage<Err>::loco;
  PeerSumArgs a;
  const err_t* e;
  __device__ __forceinline__ typename Decode::param_t param(int j, i64 g) const {
    return Decode::param(a, (i64)j * a.peer_params + g);
  }
  __device__ __forceinline__ void load(ElementVector<float, VEC>& dst, i64 i, int valid) const {
    float s[VEC];
    const i64 g = a.in_group_shift >= 0 ? i >> a.in_group_shift : i / a.in_group;
    // Wide vectors keep four peers' loads in flight; narrow ones (many per thread) stay compact.
#pragma unroll(VEC >= 8 ? 4 : 1)
    for (int j = 0; j < a.peers; ++j) {
      CodeVector<Code, VEC, VECTOR_IO, HIGH_FIRST> cv;
      cv.load(a.q + j * a.peer_bytes, i, valid);
      const typename Decode::param_t p = param(j, g);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float y = Decode::value(cv.code(k, i), p);
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

// LoCo over N consecutive elements of the error buffer (Err elements at error + i):
// e' = (b * e) + (c * (v - d)), d the dequantized codes, each operation rounded once in float32,
// e' rounded once to Err. Shared by every code sink (their dequantization formulas differ).
template <class Err, int N, bool VECTOR_IO>
__device__ __forceinline__ void loco_update(void* error, i64 i, int valid, float b, float c, const float (&v)[N],
                                            const float (&d)[N]) {
  typedef typename FloatElement<Err>::storage err_t;
  err_t* e = reinterpret_cast<err_t*>(error) + i;
  ElementVector<err_t, N> ev;
  ev.template load<VECTOR_IO>(e, valid);
  float ne[N];
#pragma unroll
  for (int k = 0; k < N; ++k)
    ne[k] = __fadd_rn(__fmul_rn(b, FloatElement<Err>::to_acc(ev.v[k])), __fmul_rn(c, __fsub_rn(v[k], d[k])));
  const ElementVector<err_t, N> nv = vector_from_acc<Err, N>(ne);
  nv.template store<VECTOR_IO>(e, valid);
}

// U codes of the element loop written as one byte at output element `out` (U = 2: a 4-bit pair).
template <int U, bool HIGH_FIRST>
__device__ __forceinline__ void store_code_unit(u8* q, i64 out, const int (&codes)[U]) {
  if constexpr (U == 2) {
    q[out / 2] = pack_nibbles<HIGH_FIRST>(codes[0], codes[1]);
  } else {
    q[out] = (u8)codes[0];
  }
}

// A code sink's element-loop unit: U consecutive source elements i.. (values v) get codes
// code(k); with LOCO, their dequantized values dequantized(k, codes) update the error feedback
// (loco_update); the codes are written as one byte at output element `out` (store_code_unit).
// O: the sink's output arguments (q, error, beta, one_minus_beta).
template <int U, bool HIGH_FIRST, bool LOCO, class Err, class O, class Code, class Dequantized>
__device__ __forceinline__ void store_sink_unit(const O& o, i64 i, i64 out, const float (&v)[U], Code code,
                                                Dequantized dequantized) {
  int codes[U];
  float d[U];
#pragma unroll
  for (int k = 0; k < U; ++k) {
    codes[k] = code(k);
    d[k] = dequantized(k, codes);
  }
  if constexpr (LOCO) loco_update<Err, U, false>(o.error, i, U, o.beta, o.one_minus_beta, v, d);
  store_code_unit<U, HIGH_FIRST>(o.q, out, codes);
}

// SPEC section 4's group formula (segment_params) and code storage; lay.mode 0 / 1.
template <class Scan, class Out, class Err, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
struct QgzCodeSink {
  typedef VectorQuantizer<Scan, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::vector_t vector_t;
  typedef IntQuantParam<float> param_t;
  static const bool loco = ErrorStorage<Err>::loco;
  QgzOutputArgs o;
  int q_min, q_max, mode;
  float divisor;

  template <class S, class Range>
  __device__ __forceinline__ param_t group_params(const Range& r) const {
    int zp;
    const float scale = segment_params<float>(r.lo, mode != 0 ? r.hi : range_amax<S>(r.amax_bits),
                                              range_nonfinite<S>(r.amax_bits), mode, q_min, q_max, divisor, zp);
    param_t p;
    p.set(scale, zp);
    return p;
  }

  __device__ __forceinline__ void params(i64 g, const param_t& p) const {
    o.scale_out[g] = p.scale;
    if (o.zp_out) o.zp_out[g] = p.zp;
  }

  __device__ __forceinline__ param_t load_params(i64 g) const {
    param_t p;
    p.set(o.scale_out[g], o.zp_out ? o.zp_out[g] : 0);
    return p;
  }

  // The VEC source elements at src (one group: one parameter), written at output element out.
  __device__ __forceinline__ void vector(i64 src, i64 out, const vector_t& v, const param_t& p, int valid) const {
    int codes[VEC];
    VQ::codes(v, p, q_min, q_max, false, codes);
    VQ::template store<VECTOR_IO>(o.q + (VQ::packed ? out / 2 : out), valid, codes);
    if constexpr (loco) {
      DequantParam<float> dp;
      dp.set(p.scale, p.zp);
      float vf[VEC], d[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        vf[k] = FloatElement<Scan>::to_acc(v.v[k]);
        d[k] = dequantized_code(codes[k], dp);
      }
      loco_update<Err, VEC, VECTOR_IO>(o.error, src, valid, o.beta, o.one_minus_beta, vf, d);
    }
  }

  // U consecutive source elements i.. (U = 2: a 4-bit pair, i even) with their own parameters,
  // written as one byte at output element `out` (the element loop).
  template <int U>
  __device__ __forceinline__ void store_unit(i64 i, i64 out, const float (&v)[U], const param_t (&p)[U]) const {
    store_sink_unit<U, HIGH_FIRST, loco, Err>(
        o, i, out, v, [&](int k) { return VQ::code(v[k], p[k], q_min, q_max, false); },
        [&](int k, const int (&codes)[U]) {
          DequantParam<float> dp;
          dp.set(p[k].scale, p[k].zp);
          return dequantized_code(codes[k], dp);
        });
  }
};

// ---- the loops ----

// One team per group, one read (for_each_segment_range_of); groups written through `map`.
template <class Scan, int VEC, class Source, class Sink, class Map>
__device__ __forceinline__ void qgz_fused_segments(const Source& src, const Sink& sink, const Map& map,
                                                   const SegmentLayout& lay) {
  typedef typename FloatElement<Scan>::storage in_t;
  typedef SegmentRange<float, typename RangeScan<Scan>::bits_t> Range;
  constexpr int NV = segment_vectors<in_t, VEC>();
  for_each_segment_range_of<Scan, VEC, false>(
      src, lay, [&](i64 first, int lane, int team, const ElementVector<in_t, VEC> (&xv)[NV], const Range& range) {
        const i64 g = first / lay.S;
        const i64 out = map(g);
        const typename Sink::param_t p = sink.template group_params<Scan>(range);
        if (lane == 0) sink.params(out, p);
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
                                                 const SegmentLayout& lay) {
  typedef RangeScan<Scan> ScanT;
  typedef SegmentRange<float, typename ScanT::bits_t> Range;
  typedef typename FloatElement<Scan>::storage in_t;
  __shared__ Range slots[32];
  const bool asym = lay.mode != 0;
  int log2_threads = 0;
  while ((1 << log2_threads) < (int)blockDim.x) ++log2_threads;
  for (i64 g = blockIdx.x; g < lay.segments; g += gridDim.x) {
    ScanT scan;
    scan.reset(lay.mode == 2);
    for (i64 col = threadIdx.x; col < lay.S; col += blockDim.x) {
      ElementVector<in_t, 1> v;
      src.load(v, g * lay.S + col, 1);
      scan.add(v, asym);
    }
    Range r = scan.result();
    team_reduce_range(r, asym, log2_threads, slots);
    if (threadIdx.x == 0) sink.params(map(g), sink.template group_params<Scan>(r));
  }
}

// After qgz_group_params: every element again, with its group's parameters (read back through
// `map`). PAIR (4-bit codes): units of two elements, i even, written as one byte (the two may
// belong to neighbouring groups, which the map keeps neighbours).
template <class Scan, bool PAIR, class Source, class Sink, class Map>
__device__ __forceinline__ void qgz_elements(const Source& src, const Sink& sink, const Map& map,
                                             const SegmentLayout& lay) {
  typedef typename FloatElement<Scan>::storage in_t;
  constexpr int U = PAIR ? 2 : 1;
  const i64 n = lay.segments * lay.S;
  const i64 stride = (i64)gridDim.x * blockDim.x * U;
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * U; i < n; i += stride) {
    float v[U];
    typename Sink::param_t p[U];
    i64 out = 0;
#pragma unroll
    for (int k = 0; k < U; ++k) {
      ElementVector<in_t, 1> x;
      src.load(x, i + k, 1);
      const i64 g = (i + k) / lay.S;
      const i64 og = map(g);
      if (k == 0) out = og * lay.S + (i - g * lay.S);
      v[k] = FloatElement<Scan>::to_acc(x.v[0]);
      p[k] = sink.load_params(og);
    }
    sink.template store_unit<U>(i, out, v, p);
  }
}

// The float value of a source, VEC elements per step, rounded once to Out: n elements.
template <class Out, int VEC, bool VECTOR_IO, class Source>
__device__ __forceinline__ void qgz_float_values(const Source& src, typename FloatElement<Out>::storage* y, i64 n) {
  const i64 stride = (i64)gridDim.x * blockDim.x * VEC;
  for (i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += stride) {
    ElementVector<float, VEC> v;
    src.load(v, i, VEC);
    const ElementVector<typename FloatElement<Out>::storage, VEC> r = vector_from_acc<Out, VEC>(v.v);
    r.template store<VECTOR_IO>(y + i, VEC);
  }
}


// ---- the dense pass: the fused pass specialised for the hot layout ----
// swizzled_quantize_dense: 16-bit input in groups of exactly team * 8 * nv elements, team a
// power of two up to one block of QP_QGZ_DENSE_BLOCK threads, 16-byte aligned input, no LoCo
// buffer. Against the generic fused pass (for_each_segment_range_of: 57 registers, 50%
// occupancy, a thread's vectors held across the reduction, a 64-bit swizzle quotient per group)
// it
//  * stages the thread's share global -> shared memory by cp.async (qp_stage.cuh), so no data
//    register lives across the team's reduction (32 registers, 100% occupancy);
//  * keeps one base per group and 32-bit offsets, no bounds tests; warps of small teams are
//    independent units of work spread evenly over the blocks (DenseSchedule);
//  * skips the per-element quotient check: the SPEC section 4 range bounds every quotient of
//    the group (qp_rounding.cuh: a `fast` scale, |v / scale| <= d (1 + 2^-23), d < 2^20), so
//    the division-free code is the IEEE one; a group whose scale is not `fast` (NaN / Inf in
//    the group, an extreme scale) takes the exact division, out of line;
//  * SYMMETRIC codes with q_min <= -q_max: the low byte (nibble) of the rounding word is the
//    two's-complement code (|code| <= q_max by the same bound), no clamp; codes are packed by
//    byte permutes.

// Resident blocks per SM the dense pass is compiled for: 8 (32 registers).

// The groups a thread of a dense pass works on: seg = first + k * stride + sub, k = 0, 1, ...
// (32-bit: the dense passes serve fewer than 2^31 elements).
// Teams of up to a warp hold no barrier, so each warp is its own unit of work (32 / team groups
// per step), interleaved across blocks (warp w of block b takes unit w * gridDim + b): every
// block, and so every SM, gets nearly the same number of groups, without the tail of blocks
// holding one group more than the rest. Larger teams keep a block-uniform loop (their reduction
// holds barriers).
struct DenseSchedule {
  u32 first, stride;
  int sub;
  __device__ __forceinline__ DenseSchedule(int team_log2, int block) {
    if (team_log2 <= 5) {
      const u32 per = 32u >> team_log2;
      first = ((threadIdx.x >> 5) * gridDim.x + blockIdx.x) * per;
      stride = gridDim.x * (u32)(block >> 5) * per;
      sub = (threadIdx.x & 31) >> team_log2;
    } else {
      const u32 per = (u32)block >> team_log2;
      first = blockIdx.x * per;
      stride = gridDim.x * per;
      sub = threadIdx.x >> team_log2;
    }
  }
};

// The largest of a team's u32 values (dense_reduce; team a power of two up to the block; every
// thread of the block calls this in step, teams aligned): one redux.sync over the team's lanes (at most a
// warp: a team of fewer lanes names its own lanes in the member mask), then, for teams spanning
// warps (at most 8), one shared-memory slot per warp. The slots come in two sets taken in turn (`parity`
// flips every call), so one barrier per call suffices: a warp writes a set again only after the
// next call's barrier, which every reader of this call's set has reached.
__device__ __forceinline__ u32 dense_team_max(u32 v, int team, u32 (*slots)[32], int& parity) {
  const int lane = threadIdx.x & 31;
#if __CUDA_ARCH__ >= 800
  const u32 mask = team >= 32 ? 0xFFFFFFFFu : ((0xFFFFFFFFu >> (32 - team)) << (lane & ~(team - 1)));
  asm volatile("redux.sync.max.u32 %0, %0, %1;" : "+r"(v) : "r"(mask));
#else
#pragma unroll
  for (int d = 1; d < 32; d <<= 1)
    if (d < team) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, d));
#endif
  if (team <= 32) return v;
  const int warp = threadIdx.x >> 5, warps = team >> 5;
  u32* set = slots[parity];
  parity ^= 1;
  if (lane == 0) set[warp] = v;
  __syncthreads();
  const int w0 = warp & ~(warps - 1);
#pragma unroll
  for (int k = 0; k < 8; ++k)  // teams of up to 256 threads (QP_QGZ_DENSE_BLOCK, QP_REDUCE_DENSE_BLOCK)
    if (k < warps) v = max(v, set[w0 + k]);
  return v;
}

// The dense passes' codes of N float values under one group parameter p: the division-free
// code (no per-element check: p.fast and the group's range bound every quotient, see above),
// `raw`: SYMMETRIC with q_min <= -q_max (the rounding word's low bits are the code).
template <int N>
__device__ __forceinline__ void qgz_dense_codes(const float (&v)[N], const IntQuantParam<float>& p, bool raw,
                                                int q_min, int q_max, int (&c)[N]) {
  if (raw) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      bool unused = true;
      c[k] = __float_as_int(__fadd_rn(quotient_fast(v[k], p, unused), QP_RNE_MAGIC));
    }
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      bool unused = true;
      c[k] = quantize_int_code_fast(v[k], p, q_min, q_max, unused);
    }
  }
}

// N codes (N a multiple of 8) stored at dst as VectorQuantizer<., Out, N, HIGH_FIRST>::store
// stores them (bytes, or nibbles two per byte), from codes whose low byte (nibble) is the code:
// byte permutes gather four low bytes per word, and for 4-bit codes one shift and one
// three-input logic operation merge the even and odd elements' words.
template <class Out, bool HIGH_FIRST, int N>
__device__ __forceinline__ void qgz_dense_store_codes(u8* dst, const int (&c)[N]) {
  constexpr bool packed = QuantElement<Out>::kind == 1;
  auto gather4 = [&](int a, int b, int d, int e) {  // the low bytes of c[a], c[b], c[d], c[e]
    return __byte_perm(__byte_perm((u32)c[a], (u32)c[b], 0x0040), __byte_perm((u32)c[d], (u32)c[e], 0x0040), 0x5410);
  };
  if constexpr (packed) {
    ElementVector<u32, N / 8> out;
#pragma unroll
    for (int w = 0; w < N / 8; ++w) {
      const int k = 8 * w;
      const u32 even = gather4(k, k + 2, k + 4, k + 6), odd = gather4(k + 1, k + 3, k + 5, k + 7);
      const u32 lo = HIGH_FIRST ? odd : even, hi = HIGH_FIRST ? even : odd;
      out.v[w] = (lo & 0x0F0F0F0Fu) | ((hi << 4) & 0xF0F0F0F0u);
    }
    out.template store<true>(reinterpret_cast<u32*>(dst), N / 8);
  } else {
    ElementVector<u32, N / 4> out;
#pragma unroll
    for (int w = 0; w < N / 4; ++w) out.v[w] = gather4(4 * w, 4 * w + 1, 4 * w + 2, 4 * w + 3);
    out.template store<true>(reinterpret_cast<u32*>(dst), N / 4);
  }
}

// The rare path of the dense passes (a group whose scale is not `fast`: NaN / Inf in the group,
// an extreme scale): N values read from shared memory (value k at v[(k / W) * row + k % W]), the
// exact codes, stored at dst as VectorQuantizer<In, Out, N> stores them. Out of line, so the hot
// loop keeps its registers.
template <class In, class Out, int N, bool HIGH_FIRST, int W>
__device__ __noinline__ void qgz_dense_exact_codes(const typename FloatElement<In>::storage* v, int row, u8* dst,
                                                   float scale, int zp, int q_min, int q_max) {
  int c[N];
#pragma unroll
  for (int k = 0; k < N; ++k)
    c[k] = quantize_int_code_exact(FloatElement<In>::to_acc(v[(k / W) * row + k % W]), scale, zp, q_min, q_max);
  VectorQuantizer<In, Out, N, HIGH_FIRST>::template store<true>(dst, N, c);
}

// Swizzled quantization of 16-bit floats (fewer than 2^31 elements): groups of S = team * 8 * NV
// elements, each thread's NV vectors of 8 staged in shared memory (columns (lane + u * team) *
// 8), scanned from there and read again to quantize; codes and parameters written through `map`.
template <class In, class Out, bool HIGH_FIRST, int NV, class Map>
__device__ __forceinline__ void qgz_dense_quantize(const typename FloatElement<In>::storage* __restrict__ x,
                                                   const QgzOutputArgs& o, const SegmentLayout& lay, float divisor,
                                                   const Map& map) {
  constexpr int VEC = 8;
  constexpr int BLOCK = QP_QGZ_DENSE_BLOCK;
  typedef VectorQuantizer<In, Out, VEC, HIGH_FIRST> VQ;
  typedef typename VQ::in_t in_t;
  typedef SegmentRange<float, u32> Range;
  typedef FloatBits<In> FB;
  static_assert(sizeof(in_t) == 2, "16-bit floats");
  __shared__ Range team_slots[BLOCK / 32];
  __shared__ uint4 stage[NV * BLOCK];
  const int team = 1 << lay.seg_log2;
  const int lane = threadIdx.x & (team - 1);
  const bool asym = lay.mode != 0;
  const bool raw = lay.mode == 0 && lay.q_min <= -lay.q_max;
  const DenseSchedule sched(lay.seg_log2, BLOCK);
  const u32 segments = (u32)lay.segments;
  for (u32 base = sched.first; base < segments; base += sched.stride) {
    const u32 seg = base + sched.sub;
    const bool active = seg < segments;
    if (active) {
      const in_t* xs = x + seg * (u32)lay.S;
#pragma unroll
      for (int u = 0; u < NV; ++u) stage_16(&stage[u * BLOCK + threadIdx.x], xs + (lane + u * team) * VEC);
    }
    stage_wait();
    // SYMMETRIC: the largest |x| bit pattern, pairs of halves. ASYMMETRIC: NaN-propagating pair
    // min / max from +0 (the range holds zero); a NaN or +-Inf shows in lo or hi.
    Range range;
    {
      u32 a2 = 0, lo2 = 0, hi2 = 0;
      if (active) {
#pragma unroll
        for (int u = 0; u < NV; ++u) {
          ElementVector<in_t, VEC> v;
          v.bytes.w[0] = stage[u * BLOCK + threadIdx.x];
#pragma unroll
          for (int w = 0; w < VEC / 2; ++w) {
            if (asym) {
              lo2 = HalfPairs<In>::min_nan(lo2, v.words[w]);
              hi2 = HalfPairs<In>::max_nan(hi2, v.words[w]);
            } else {
              a2 = max_u16x2(a2, v.words[w] & 0x7FFF7FFFu);
            }
          }
        }
      }
      if (asym) {
        const u32 lo_h = HalfPairs<In>::min_nan(lo2, lo2 >> 16) & 0xFFFFu;
        const u32 hi_h = HalfPairs<In>::max_nan(hi2, hi2 >> 16) & 0xFFFFu;
        range.lo = FloatElement<In>::to_acc((u16)lo_h);
        range.hi = FloatElement<In>::to_acc((u16)hi_h);
        range.amax_bits = ((lo_h & 0x7FFFu) >= FB::inf || (hi_h & 0x7FFFu) >= FB::inf) ? FB::inf : 0u;
      } else {
        range.lo = range.hi = 0.0f;
        range.amax_bits = max(a2 & 0xFFFFu, a2 >> 16);
      }
    }
    team_range_reduce<true>(range, asym, team, team_slots);
    if (!active) continue;
    int zp;
    const float scale = segment_params<float>(range.lo, asym ? range.hi : range_amax<In>(range.amax_bits),
                                              range_nonfinite<In>(range.amax_bits), lay.mode, lay.q_min, lay.q_max,
                                              divisor, zp);
    const u32 og = (u32)map(seg);
    if (lane == 0) {
      o.scale_out[og] = scale;
      if (o.zp_out) o.zp_out[og] = zp;
    }
    IntQuantParam<float> p;
    p.set(scale, zp);
    u8* qs = o.q + (VQ::packed ? og * (u32)lay.S / 2 : og * (u32)lay.S);
#pragma unroll 1
    for (int u = 0; u < NV; ++u) {
      const int col = (lane + u * team) * VEC;
      ElementVector<in_t, VEC> xv;
      xv.bytes.w[0] = stage[u * BLOCK + threadIdx.x];
      float v[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = FloatElement<In>::to_acc(xv.v[k]);
      u8* dst = qs + (VQ::packed ? col / 2 : col);
      if (!p.fast) {
        const in_t* staged = reinterpret_cast<const in_t*>(&stage[u * BLOCK + threadIdx.x]);
        qgz_dense_exact_codes<In, Out, VEC, HIGH_FIRST, VEC>(staged, 0, dst, scale, zp, lay.q_min, lay.q_max);
        continue;
      }
      int codes[VEC];
      qgz_dense_codes<VEC>(v, p, raw, lay.q_min, lay.q_max, codes);
      qgz_dense_store_codes<Out, HIGH_FIRST, VEC>(dst, codes);
    }
  }
}


// ---- the dense reduction: dequant-reduce specialised for the hot layout ----
// dequant_reduce_dense: SYMMETRIC codes on both sides, no LoCo buffer, fewer than 2^31 elements
// per chunk, a thread's EPT elements inside one input group (EPT divides the input group size),
// output groups of exactly team * EPT elements (team a power of two up to the block), operands
// aligned to a thread's bytes. Each thread owns EPT consecutive elements: one load of EPT codes
// per peer, the peer's scale loaded once, the sum held in registers (no staging, no spills).
// Decoding a code costs no integer conversion: XOR with the sign bit turns two's-complement
// codes into offset binary n = q + 2^(b-1) (a three-input logic op masks the even and the odd
// nibbles of a word into bytes at once), a byte permute puts n into the low mantissa bits of
// 2^23 (even nibbles, bytes) or, for the odd nibbles (n * 16 in the byte), of 2^19 (one ulp
// 1/16), and one float subtraction of that power plus the offset gives q exactly; then
// y = q * scale (one rounding, as (q - 0) * scale) and the float32 sum in peer order, peer 0
// first (the sum starts as y_0). PEERS > 0: the peer loop fully unrolled for that N. About 4.25
// instructions per element and peer (byte permute, subtraction, product, sum; masks per word), no
// local memory. Warps are units of work over a full-residency grid (DenseSchedule); the team's
// maximum is a redux.sync.

// QP_REDUCE_DENSE_MIN_BLOCKS: blocks of QP_REDUCE_DENSE_BLOCK threads kept resident per SM (the
// register cap: 4 leaves 64 registers, no spills; more loads in flight per warp hide the latency
// better than more resident warps).

// 4-bit codes under scales of magnitude below 0.5 take one fused multiply-add per code and peer
// (DenseCodes::products_fma) instead of a subtraction and a product (fewer instructions), from
// QP_REDUCE_DENSE_FMA_MIN_EPT elements per thread.

// Streamed codes: read once, kept out of L1.
__device__ __forceinline__ u8 load_stream(const u8* p) {
  u16 v;
  asm("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=h"(v) : "l"(p));
  return (u8)v;
}
__device__ __forceinline__ u16 load_stream(const u16* p) {
  u16 v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 load_stream(const u32* p) {
  u32 v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 load_stream(const uint2* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// NaN-propagating max of |v| and m (the symmetric range of float32 values: NaN and Inf exceed
// every finite value, so the result's bits are range_nonfinite's test too).
__device__ __forceinline__ float max_abs_nan(float m, float v) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(m), "f"(fabsf(v)));
  return d;
}

// A thread's EPT codes of one peer (in `words` 32-bit words; fewer than 4 bytes sit in the low
// bytes of w[0]) and their exact values q as floats.
template <class Code, int EPT, bool HIGH_FIRST>
struct DenseCodes {
  static const bool packed = QuantElement<Code>::kind == 1;
  static const bool is_signed = QuantElement<Code>::is_signed;
  static const int bytes = packed ? EPT / 2 : EPT;
  static const int words = bytes < 4 ? 1 : bytes / 4;
  typedef typename VectorWord<bytes < 16 ? bytes : 16>::type word_t;
  static const int loads = bytes < 16 ? 1 : bytes / 16;
  u32 w[words];

  __device__ __forceinline__ void load(const u8* q) {
    if constexpr (bytes < 4) {
      w[0] = load_stream(reinterpret_cast<const word_t*>(q));
    } else {
#pragma unroll
      for (int i = 0; i < loads; ++i) {
        const word_t v = load_stream(reinterpret_cast<const word_t*>(q) + i);
        const u32* vw = reinterpret_cast<const u32*>(&v);
#pragma unroll
        for (int k = 0; k < (int)(sizeof(word_t) / 4); ++k) w[i * (sizeof(word_t) / 4) + k] = vw[k];
      }
    }
  }

  // The values q of the EPT codes (exact integers as floats). two23 / two19: the words of 2^23
  // and 2^19, passed in registers (so every byte permute takes its selector as an immediate).
  __device__ __forceinline__ void values(float (&q)[EPT], u32 two23, u32 two19) const {
    if constexpr (packed) {
      // Low nibbles (n in 0..15) under 2^23; high nibbles (16 n) under 2^19 (ulp 1/16).
      const float k23 = __uint_as_float(0x4B000000u + (is_signed ? 8u : 0u));
      const float k19 = __uint_as_float(0x49000000u + (is_signed ? 128u : 0u));
#pragma unroll
      for (int i = 0; i < words; ++i) {
        const u32 x = w[i] ^ (is_signed ? 0x88888888u : 0u);
        const u32 lo = x & 0x0F0F0F0Fu, hi = x & 0xF0F0F0F0u;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          if (8 * i + 2 * b >= EPT) break;
          const float fl = __fsub_rn(__uint_as_float(__byte_perm(lo, two23, 0x7440 | b)), k23);
          const float fh = __fsub_rn(__uint_as_float(__byte_perm(hi, two19, 0x7440 | b)), k19);
          q[8 * i + 2 * b] = HIGH_FIRST ? fh : fl;
          q[8 * i + 2 * b + 1] = HIGH_FIRST ? fl : fh;
        }
      }
    } else {
      const float k23 = __uint_as_float(0x4B000000u + (is_signed ? 128u : 0u));
#pragma unroll
      for (int i = 0; i < words; ++i) {
        const u32 n = w[i] ^ (is_signed ? 0x80808080u : 0u);
#pragma unroll
        for (int b = 0; b < 4; ++b)
          if (4 * i + b < EPT) q[4 * i + b] = __fsub_rn(__uint_as_float(__byte_perm(n, two23, 0x7440 | b)), k23);
      }
    }
  }

  // 4-bit codes, |scale| < 0.5: the products y = q * scale, each rounded once, by one fused
  // multiply-add per code and peer. Offset binary n = q + 8 (signed; n = q unsigned) times 16, as
  // the third byte of a word whose other bytes are zero, is the float n * 2^-129 (bit patterns
  // below 2^24 are the multiples of 2^-149: subnormals and the first normal binade, one linear
  // scale; --ftz is off), so fma(n * 2^-129, scale * 2^129, -8 * scale) rounds
  // n * scale - 8 * scale = q * scale exactly once. Both scalings are exact for |scale| < 0.5;
  // unsigned codes add -0 (x + -0 = x). A zero product may be +0 where q * scale is -0 (signed
  // q = 0, negative scale): the sum's sign of zero never reaches the codes or the scale (both
  // see |sum|; a zero sum gives code 0). The sign flip is one immediate XOR per word, before the
  // two masks (no mask constant lives in a register).
  __device__ __forceinline__ void products_fma(float (&y)[EPT], float scale) const {
    static_assert(packed, "4-bit codes");
    const float big = __fmul_rn(__fmul_rn(scale, 0x1p64f), 0x1p65f);
    const float offset = is_signed ? __fmul_rn(scale, -8.0f) : -0.0f;
#pragma unroll
    for (int i = 0; i < words; ++i) {
      const u32 x = w[i] ^ (is_signed ? 0x88888888u : 0u);
      const u32 lo = (x << 4) & 0xF0F0F0F0u, hi = x & 0xF0F0F0F0u;  // 16 n of the even / odd nibbles
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        if (8 * i + 2 * b >= EPT) break;
        const float fl = __fmaf_rn(__uint_as_float(__byte_perm(lo, 0u, 0x4044 | (b << 8))), big, offset);
        const float fh = __fmaf_rn(__uint_as_float(__byte_perm(hi, 0u, 0x4044 | (b << 8))), big, offset);
        y[8 * i + 2 * b] = HIGH_FIRST ? fh : fl;
        y[8 * i + 2 * b + 1] = HIGH_FIRST ? fl : fh;
      }
    }
  }
};


// acc = acc + y (or y, first), y = q * scale of one peer's codes c: FMA products (4-bit codes,
// EPT >= QP_REDUCE_DENSE_FMA_MIN_EPT) where `small` (|scale| < 0.5), else the decoded values
// times the scale.
template <class Code, int EPT, bool HIGH_FIRST>
__device__ __forceinline__ void dense_add_peer(const DenseCodes<Code, EPT, HIGH_FIRST>& c, float scale, bool first,
                                               bool small, float (&acc)[EPT], u32 two23, u32 two19) {
  typedef DenseCodes<Code, EPT, HIGH_FIRST> Codes;
  if constexpr (Codes::packed && EPT >= QP_REDUCE_DENSE_FMA_MIN_EPT) {
    if (small) {
      float y[EPT];
      c.products_fma(y, scale);
#pragma unroll
      for (int k = 0; k < EPT; ++k) acc[k] = first ? y[k] : __fadd_rn(acc[k], y[k]);
      return;
    }
  }
  float v[EPT];
  c.values(v, two23, two19);
#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    const float y = __fmul_rn(v[k], scale);
    acc[k] = first ? y : __fadd_rn(acc[k], y);
  }
}

// The unrolled peer sum of PEERS peers already in registers (c, sc), in peer order.
template <class Code, int EPT, bool HIGH_FIRST, int PEERS>
__device__ __forceinline__ void dense_sum_loaded(const DenseCodes<Code, EPT, HIGH_FIRST> (&c)[PEERS],
                                                 const float (&sc)[PEERS], float (&acc)[EPT], u32 two23,
                                                 u32 two19) {
  typedef DenseCodes<Code, EPT, HIGH_FIRST> Codes;
  // With PEERS unrolled, the FMA products' condition is tested once for all the peers of a pass
  // (the largest |scale|, NaN-propagating), not per peer.
  if constexpr (Codes::packed && EPT >= QP_REDUCE_DENSE_FMA_MIN_EPT) {
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < PEERS; ++j) m = max_abs_nan(m, sc[j]);
    if (m < 0.5f) {  // false for NaN and +-Inf
#pragma unroll
      for (int j = 0; j < PEERS; ++j) dense_add_peer(c[j], sc[j], j == 0, true, acc, two23, two19);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < PEERS; ++j)
    dense_add_peer(c[j], sc[j], j == 0, fabsf(sc[j]) < 0.5f, acc, two23, two19);
}

// acc = ((y_0 + y_1) + ...) for peers [0, peers) (PEERS > 0: that many, unrolled), y_j = q_j * s_j;
// q points at this thread's codes of peer 0, s at its scale of peer 0; two23 / two19 as
// DenseCodes::values takes them.
template <class Code, int EPT, bool HIGH_FIRST, int PEERS>
__device__ __forceinline__ void dense_peer_sum(const PeerSumArgs& in, const u8* q, const float* s, float (&acc)[EPT],
                                               u32 two23, u32 two19) {
  typedef DenseCodes<Code, EPT, HIGH_FIRST> Codes;
  if constexpr (PEERS > 0) {
    // Batches of B peers (at most QP_REDUCE_DENSE_BATCH_BYTES of codes per thread): loads
    // first, then the sums.
    constexpr int B0 = QP_REDUCE_DENSE_BATCH_BYTES / Codes::bytes, B = B0 < 1 ? 1 : (B0 > PEERS ? PEERS : B0);
#pragma unroll
    for (int j0 = 0; j0 < PEERS; j0 += B) {
      Codes c[B];
      float sc[B];
#pragma unroll
      for (int j = 0; j < B; ++j) {
        if (j0 + j < PEERS) {
          c[j].load(q + (i64)(j0 + j) * in.peer_bytes);
          sc[j] = __ldg(s + (i64)(j0 + j) * in.peer_params);
        }
      }
      if constexpr (B == PEERS) {
        dense_sum_loaded<Code, EPT, HIGH_FIRST, PEERS>(c, sc, acc, two23, two19);
      } else {
#pragma unroll
        for (int j = 0; j < B; ++j)
          if (j0 + j < PEERS)
            dense_add_peer(c[j], sc[j], j0 + j == 0, fabsf(sc[j]) < 0.5f, acc, two23, two19);
      }
    }
  } else {
    {
      Codes c0;
      c0.load(q);
      const float s0 = __ldg(s);
      dense_add_peer(c0, s0, true, fabsf(s0) < 0.5f, acc, two23, two19);
    }
#pragma unroll 4
    for (int j = 1; j < in.peers; ++j) {
      Codes c;
      c.load(q + (i64)j * in.peer_bytes);
      const float sj = __ldg(s + (i64)j * in.peer_params);
      dense_add_peer(c, sj, false, fabsf(sj) < 0.5f, acc, two23, two19);
    }
  }
}

// The rare path of the dense reduction (a group whose scale is not `fast`: NaN / Inf in the
// group, an extreme scale): the exact codes of one pair of values (out of line).
template <class Out, bool HIGH_FIRST>
__device__ __noinline__ void dense_reduce_exact_pair(u8* dst, float v0, float v1, float scale, int q_min, int q_max) {
  const int c[2] = {quantize_int_code_exact(v0, scale, 0, q_min, q_max),
                    quantize_int_code_exact(v1, scale, 0, q_min, q_max)};
  VectorQuantizer<f32, Out, 2, HIGH_FIRST>::template store<false>(dst, 2, c);
}

// N codes (N = 2 or 4) stored at dst as VectorQuantizer<., Out, N, HIGH_FIRST>::store stores
// them, from codes whose low byte (nibble) is the code (qgz_dense_store_codes for fewer than 8).
template <class Out, bool HIGH_FIRST, int N>
__device__ __forceinline__ void dense_store_few_codes(u8* dst, const int (&c)[N]) {
  constexpr bool packed = QuantElement<Out>::kind == 1;
  if constexpr (packed) {
    u32 word = 0;
#pragma unroll
    for (int k = 0; k < N; k += 2) {
      const u32 lo = (u32)c[HIGH_FIRST ? k + 1 : k] & 0xFu, hi = (u32)c[HIGH_FIRST ? k : k + 1] & 0xFu;
      word |= (lo | (hi << 4)) << (4 * k);
    }
    if constexpr (N == 4) {
      *reinterpret_cast<u16*>(dst) = (u16)word;
    } else {
      *dst = (u8)word;
    }
  } else if constexpr (N == 4) {
    *reinterpret_cast<u32*>(dst) = __byte_perm(__byte_perm((u32)c[0], (u32)c[1], 0x0040),
                                               __byte_perm((u32)c[2], (u32)c[3], 0x0040), 0x5410);
  } else {
    *reinterpret_cast<u16*>(dst) = (u16)__byte_perm((u32)c[0], (u32)c[1], 0x0040);
  }
}

// The dense reduction over a chunk of lay.segments groups of lay.S = team * EPT elements, the
// groups spread as DenseSchedule spreads them (teams of up to a warp: each warp its own unit of
// work, interleaved over the blocks; wider teams: a block-uniform loop, their reduction holds
// barriers).
template <class Code, class Out, int EPT, bool HIGH_FIRST, int PEERS>
__device__ __forceinline__ void dense_reduce(const PeerSumArgs& in, const QgzOutputArgs& o, const SegmentLayout& lay,
                                             float divisor) {
  typedef DenseCodes<Code, EPT, HIGH_FIRST> Codes;
  constexpr bool out_packed = QuantElement<Out>::kind == 1;
  // pipe: with PEERS unrolled and at most 16 code words per thread in all, the codes and scales of
  // a thread's next pass are loaded into registers right after this pass's sums, so the loads are
  // in flight while the pass quantizes and stores; otherwise each pass prefetches the thread's
  // codes of its next pass into L2.
  constexpr bool pipe = PEERS > 0 && PEERS * Codes::words <= 16;
  __shared__ u32 amax_slots[2][32];
  int parity = 0;
  const int team = 1 << lay.seg_log2;
  const int lane = threadIdx.x & (team - 1);
  const bool raw = lay.q_min <= -lay.q_max;
  const DenseSchedule sched(lay.seg_log2, blockDim.x);
  const u32 segments = (u32)lay.segments;
  // lay.pad is 0 at run time: the compiler cannot fold these words into the byte permutes.
  const u32 two23 = 0x4B000000u | (u32)lay.pad, two19 = 0x49000000u | (u32)lay.pad;
  // The unit (thread of elements) a thread takes at pass `base`: an idle thread (past the last
  // group) reads the last group, writes nothing.
  auto unit_of = [&](u32 base) {
    const u32 seg = base + sched.sub < segments ? base + sched.sub : segments - 1;
    return (seg << lay.seg_log2) + (u32)lane;
  };
  auto group_of = [&](u32 first) {
    return in.in_group_shift >= 0 ? first >> in.in_group_shift : first / (u32)in.in_group;
  };
  constexpr int PN = pipe ? PEERS : 1;
  Codes pc[PN];
  float ps[PN];
  auto load_all = [&](u32 unit) {
    if constexpr (pipe) {
      const u8* q = in.q + (size_t)unit * Codes::bytes;
      const float* s = in.scale + group_of(unit * EPT);
#pragma unroll
      for (int j = 0; j < PEERS; ++j) {
        pc[j].load(q + (i64)j * in.peer_bytes);
        ps[j] = __ldg(s + (i64)j * in.peer_params);
      }
    }
  };
  // The L2 prefetch of a pass's codes (every peer's).
  auto prefetch_pass = [&](u32 base) {
    const u8* q = in.q + (size_t)unit_of(base) * Codes::bytes;
    if constexpr (PEERS > 0) {
#pragma unroll
      for (int j = 0; j < PEERS; ++j) prefetch_l2(q + (i64)j * in.peer_bytes);
    } else {
      for (int j = 0; j < in.peers; ++j) prefetch_l2(q + (i64)j * in.peer_bytes);
    }
  };
  if (sched.first < segments) load_all(unit_of(sched.first));
  for (u32 base = sched.first; base < segments; base += sched.stride) {
    const bool active = base + sched.sub < segments;
    const u32 unit = unit_of(base);
    const u32 first = unit * EPT;
    const bool more = base + sched.stride < segments;
    float acc[EPT];
    if (!pipe && more) prefetch_pass(base + sched.stride);
    if constexpr (pipe) {
      dense_sum_loaded<Code, EPT, HIGH_FIRST, PEERS>(pc, ps, acc, two23, two19);
      if (more) load_all(unit_of(base + sched.stride));
    } else {
      dense_peer_sum<Code, EPT, HIGH_FIRST, PEERS>(in, in.q + (size_t)unit * Codes::bytes, in.scale + group_of(first),
                                                   acc, two23, two19);
    }
    if (in.average) {
#pragma unroll
      for (int k = 0; k < EPT; ++k) acc[k] = __fdiv_rn(acc[k], in.peers_f);
    }
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < EPT; ++k) amax = max_abs_nan(amax, acc[k]);
    const u32 amax_bits = dense_team_max(__float_as_uint(amax), team, amax_slots, parity);
    if (!active) continue;
    int zp;
    const float scale = segment_params<float>(0.0f, range_amax<f32>(amax_bits), range_nonfinite<f32>(amax_bits), 0,
                                              lay.q_min, lay.q_max, divisor, zp);
    const u32 g = unit >> lay.seg_log2;
    if (lane == 0) o.scale_out[g] = scale;
    IntQuantParam<float> p;
    p.set(scale, 0);
    u8* dst = o.q + (out_packed ? first / 2 : first);
    if (!p.fast) {
#pragma unroll
      for (int k = 0; k < EPT; k += 2)
        dense_reduce_exact_pair<Out, HIGH_FIRST>(dst + (out_packed ? k / 2 : k), acc[k], acc[k + 1], scale,
                                                 lay.q_min, lay.q_max);
      continue;
    }
    int codes[EPT];
    qgz_dense_codes<EPT>(acc, p, raw, lay.q_min, lay.q_max, codes);
    if constexpr (EPT >= 8) {
      qgz_dense_store_codes<Out, HIGH_FIRST, EPT>(dst, codes);
    } else {
      dense_store_few_codes<Out, HIGH_FIRST, EPT>(dst, codes);
    }
  }
}

}  // namespace qp
