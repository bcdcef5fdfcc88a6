// fake_quantize.cu: fake quantization for quantization-aware training (FakeQuantizePlan,
// FakeQuantizeBackwardPlan). Element arithmetic in qp_fake_quantize.cuh.
//
//   fake_quantize_rows          y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale
//   fake_quantize_ste_rows      dx = dy * mask                (straight-through estimator)
//   fake_quantize_stochastic_rows  y as fake_quantize_rows with stochastic rounding (Philox)
//   fake_quantize_flat          any of the three with one parameter for the whole tensor
//                               (TensorScope): a flat walk over vectors, one tile per block
//   dynamic_fake_quantize_segments  range -> parameters -> fake quantization of contiguous
//                               segments in one pass (DynamicRangeFakeQuantizePlan)
//   fake_quantize_lsq_segments  dx, and dscale / dzp per segment (learnable parameters, LSQ),
//                               reduced in a fixed order (deterministic), one chunk per team
//   fake_quantize_lsq_finish    chunk partial sums -> per-segment gradients, in chunk order
// The row kernels run on the canonical row layout (qp_row_layout.cuh, every scope); the
// learnable backward on contiguous segments (segment i = elements [i S, (i + 1) S)).
// In place (y == x, dx == dy) is allowed: every element is read before it is written, by the
// thread that writes it.
// Parameters: `scale_ptr` (null: scale_value), `zp_ptr` read as ZeroPointSource `zp_source`
// (RowLayout.flags for the row kernels). Template arguments: In (f16, bf16, f32, f64), VEC
// elements per thread-vector, VECTOR_IO (aligned vectors, or a bounded element loop).
#include "qp_dynamic_segments.cuh"
#include "qp_elements.cuh"
#include "qp_fake_quantize.cuh"
#include "qp_philox.cuh"
#include "qp_row_layout.cuh"
#include "qp_team.cuh"
#include "qp_vector_io.cuh"

#ifndef QP_FAKE_MIN_BLOCKS
// Resident 256-thread blocks per SM asked of the register allocator for the row kernels.
#define QP_FAKE_MIN_BLOCKS 1
#endif

namespace qp {

static const int kFakeUnroll = 4;

// The parameters of the row-layout bodies: one per item when constant along the row (cs == 0),
// else per vector (groups of whole vectors) or per element.
template <class Acc> struct FakeParamSource {
  const Acc* scale_ptr;
  const void* zp_ptr;
  Acc scale_value;
  int zp_value;
  const RowLayout& lay;

  __device__ __forceinline__ FakeQuantParam<Acc> operator()(i64 index) const {
    return FakeQuantParam<Acc>::load(scale_ptr, zp_ptr, lay.flags, scale_value, zp_value, index, lay.q_min, lay.q_max);
  }

  // fn(k, param) for every element k of the vector at (pbase, col).
  template <int VEC, class Fn>
  __device__ __forceinline__ void for_each(const FakeQuantParam<Acc>& row_param, i64 pbase, int col, int valid,
                                           Fn fn) const {
    if (lay.cs == 0) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) fn(k, row_param);
    } else if ((lay.gc & (VEC - 1)) == 0) {
      const FakeQuantParam<Acc> p = (*this)(pbase + (i64)column_group(lay, col) * lay.cs);
#pragma unroll
      for (int k = 0; k < VEC; ++k) fn(k, p);
    } else {
      const int gi = column_group(lay, col);
      for_each_column_param<VEC, FakeQuantParam<Acc>>(lay, pbase, col, valid, gi, (*this)(pbase + (i64)gi * lay.cs),
                                                      *this, fn);
    }
  }
};

// What a fake-quantization body computes per element (a template argument).
enum FakeOp { kFakeNearest = 0, kFakeSte = 1, kFakeStochastic = 2 };

// y = fake(x) rounded to nearest (kFakeNearest) or stochastically (kFakeStochastic, the Philox
// uniform of flat element index i for element i), or the straight-through dx = dy * mask (kFakeSte).
template <class In, int VEC, int OP>
__device__ __forceinline__ void fake_values(const FakeQuantParam<typename FloatElement<In>::acc>& p,
                                            const ElementVector<typename FloatElement<In>::storage, VEC>& xv,
                                            const ElementVector<typename FloatElement<In>::storage, VEC>& gv,
                                            const float (&uni)[VEC], int k, typename FloatElement<In>::acc (&vals)[VEC]) {
  typedef FloatElement<In> FE;
  const typename FE::acc v = FE::to_acc(xv.v[k]);
  if constexpr (OP == kFakeSte) {
    vals[k] = p.ste(v, FE::to_acc(gv.v[k]));
  } else if constexpr (OP == kFakeStochastic) {
    vals[k] = p.fake_stochastic(v, uni[k]);
  } else {
    vals[k] = p.fake(v);
  }
}

// The uniforms of VEC elements from flat index i0 (only kFakeStochastic draws them).
template <int VEC, int OP>
__device__ __forceinline__ void fake_uniforms(u64 i0, u64 seed, u64 offset, float (&uni)[VEC]) {
  if constexpr (OP == kFakeStochastic) philox_uniforms<VEC>(i0, seed, offset, uni);
}

// The body of the row kernels (every scope): reads x (and dy), writes y / dx.
template <class In, int VEC, bool VECTOR_IO, int OP>
struct FakeQuantizeBody {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  static const bool ste = OP == kFakeSte;

  const in_t* x;
  const in_t* dy;
  in_t* out;
  FakeParamSource<acc_t> params;
  u64 seed, offset;
  FakeQuantParam<acc_t> row_param;
  ElementVector<in_t, VEC> xv[kFakeUnroll];
  ElementVector<in_t, VEC> gv[ste ? kFakeUnroll : 1];

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    if (params.lay.cs == 0) row_param = params(pbase);
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    const i64 at = row * params.lay.L + col;
    xv[u].template load<VECTOR_IO>(x + at, valid);
    if constexpr (ste) gv[u].template load<VECTOR_IO>(dy + at, valid);
  }

  __device__ __forceinline__ void finish(int u, i64 row, i64 pbase, int col, int valid) {
    const i64 at = row * params.lay.L + col;
    float uni[VEC];
    fake_uniforms<VEC, OP>((u64)at, seed, offset, uni);
    acc_t vals[VEC];
    params.template for_each<VEC>(row_param, pbase, col, valid, [&](int k, const FakeQuantParam<acc_t>& p) {
      fake_values<In, VEC, OP>(p, xv[u], gv[ste ? u : 0], uni, k, vals);
    });
    vector_from_acc<In, VEC>(vals).template store<VECTOR_IO>(out + at, valid);
  }
};

// Seed and offset of stochastic rounding: from device scalars when the pointers are set.
__device__ __forceinline__ u64 rng_word(const i64* ptr, u64 value) { return ptr ? (u64)*ptr : value; }

// Geometry of the learnable backward: `segments` contiguous segments of S elements, cut into
// chunks of `chunk` elements (chunks_per_segment of them; chunk = team * VEC * kFakeUnroll);
// item = (segment, chunk), one team of 1 << team_log2 threads per item. Mirrored by
// LsqLayoutArgs in quantplan/fake_quantize.py.
struct LsqLayout {
  i64 segments, items;
  int S, chunk, chunks_per_segment, team_log2, q_min, q_max, zp_source, pad;
};

}  // namespace qp

template <class In, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256, QP_FAKE_MIN_BLOCKS)
fake_quantize_rows(const typename qp::FloatElement<In>::storage* x, typename qp::FloatElement<In>::storage* y,
                   const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr, const void* __restrict__ zp_ptr,
                   typename qp::FloatElement<In>::acc scale_value, int zp_value, const qp::RowLayout lay) {
  qp::FakeQuantizeBody<In, VEC, VECTOR_IO, qp::kFakeNearest> body{
      x, nullptr, y, {scale_ptr, zp_ptr, scale_value, zp_value, lay}, 0, 0};
  qp::for_each_row_vector<VEC, qp::kFakeUnroll>(lay, body);
}

template <class In, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256, QP_FAKE_MIN_BLOCKS)
fake_quantize_ste_rows(const typename qp::FloatElement<In>::storage* x, const typename qp::FloatElement<In>::storage* dy,
                       typename qp::FloatElement<In>::storage* dx,
                       const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                       const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc scale_value, int zp_value,
                       const qp::RowLayout lay) {
  qp::FakeQuantizeBody<In, VEC, VECTOR_IO, qp::kFakeSte> body{
      x, dy, dx, {scale_ptr, zp_ptr, scale_value, zp_value, lay}, 0, 0};
  qp::for_each_row_vector<VEC, qp::kFakeUnroll>(lay, body);
}

template <class In, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256, QP_FAKE_MIN_BLOCKS)
fake_quantize_stochastic_rows(const typename qp::FloatElement<In>::storage* x, typename qp::FloatElement<In>::storage* y,
                              const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                              const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc scale_value,
                              int zp_value, const qp::RowLayout lay, const qp::i64* __restrict__ seed_ptr,
                              const qp::i64* __restrict__ offset_ptr, qp::u64 seed_value, qp::u64 offset_value) {
  qp::FakeQuantizeBody<In, VEC, VECTOR_IO, qp::kFakeStochastic> body{
      x, nullptr, y, {scale_ptr, zp_ptr, scale_value, zp_value, lay},
      qp::rng_word(seed_ptr, seed_value), qp::rng_word(offset_ptr, offset_value)};
  qp::for_each_row_vector<VEC, qp::kFakeUnroll>(lay, body);
}

// TensorScope (OP a FakeOp): one parameter; the tensor is n elements, walked as vectors of VEC,
// `per_thread` (1 to kFakeUnroll) per thread and tile of blockDim.x * per_thread vectors
// (grid-stride past the grid); the last vector may be partial (element I/O). Few registers and
// no per-item index arithmetic; the plan sizes the grid to the tensor, with smaller tiles for
// small tensors so that every SM gets work. The rng arguments matter only to kFakeStochastic.
template <class In, int VEC, int OP>
__global__ void __launch_bounds__(256)
fake_quantize_flat(const typename qp::FloatElement<In>::storage* x, const typename qp::FloatElement<In>::storage* dy,
                   typename qp::FloatElement<In>::storage* out,
                   const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr, const void* __restrict__ zp_ptr,
                   typename qp::FloatElement<In>::acc scale_value, int zp_value, int zp_source, int q_min, int q_max,
                   qp::i64 n, int per_thread, const qp::i64* __restrict__ seed_ptr,
                   const qp::i64* __restrict__ offset_ptr, qp::u64 seed_value, qp::u64 offset_value) {
  typedef qp::FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  constexpr bool ste = OP == qp::kFakeSte;
  const qp::FakeQuantParam<acc_t> p =
      qp::FakeQuantParam<acc_t>::load(scale_ptr, zp_ptr, zp_source, scale_value, zp_value, 0, q_min, q_max);
  qp::u64 seed = 0, offset = 0;
  if constexpr (OP == qp::kFakeStochastic) {
    seed = qp::rng_word(seed_ptr, seed_value);
    offset = qp::rng_word(offset_ptr, offset_value);
  }
  const qp::i64 n_vectors = (n + VEC - 1) / VEC;
  const qp::i64 stride = (qp::i64)gridDim.x * blockDim.x * per_thread;
  for (qp::i64 base = (qp::i64)blockIdx.x * blockDim.x * per_thread + threadIdx.x; base < n_vectors;
       base += stride) {
    qp::ElementVector<in_t, VEC> xv[qp::kFakeUnroll], gv[ste ? qp::kFakeUnroll : 1];
#pragma unroll
    for (int u = 0; u < qp::kFakeUnroll; ++u) {
      const qp::i64 v = base + (qp::i64)u * blockDim.x;
      if (u < per_thread && v < n_vectors) {
        const bool full = (v + 1) * VEC <= n;
        const int valid = full ? VEC : (int)(n - v * VEC);
        if (full) {
          xv[u].template load<true>(x + v * VEC, VEC);
          if constexpr (ste) gv[u].template load<true>(dy + v * VEC, VEC);
        } else {
          xv[u].template load<false>(x + v * VEC, valid);
          if constexpr (ste) gv[u].template load<false>(dy + v * VEC, valid);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < qp::kFakeUnroll; ++u) {
      const qp::i64 v = base + (qp::i64)u * blockDim.x;
      if (u < per_thread && v < n_vectors) {
        float uni[VEC];
        qp::fake_uniforms<VEC, OP>((qp::u64)(v * VEC), seed, offset, uni);
        acc_t vals[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) qp::fake_values<In, VEC, OP>(p, xv[u], gv[ste ? u : 0], uni, k, vals);
        const qp::ElementVector<in_t, VEC> result = qp::vector_from_acc<In, VEC>(vals);
        if ((v + 1) * VEC <= n) {
          result.template store<true>(out + v * VEC, VEC);
        } else {
          result.template store<false>(out + v * VEC, (int)(n - v * VEC));
        }
      }
    }
  }
}

// DynamicRangeFakeQuantizePlan's fused single pass (qp_dynamic_segments.cuh): each segment's
// range -> scale, zero point (written to scale_out / zp_out when not null) -> fake-quantized
// values from registers, rounded to nearest or stochastically. In place allowed (y == x).
template <class In, int VEC, bool VECTOR_IO, bool STOCHASTIC>
__global__ void __launch_bounds__(1024)
dynamic_fake_quantize_segments(const typename qp::FloatElement<In>::storage* x,
                               typename qp::FloatElement<In>::storage* y,
                               typename qp::FloatElement<In>::acc* __restrict__ scale_out, int* __restrict__ zp_out,
                               const qp::SegmentLayout lay, typename qp::FloatElement<In>::acc divisor,
                               const qp::i64* __restrict__ seed_ptr, const qp::i64* __restrict__ offset_ptr,
                               qp::u64 seed_value, qp::u64 offset_value) {
  typedef qp::FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  typedef qp::ElementVector<in_t, VEC> vector_t;
  constexpr int NV = qp::segment_vectors<in_t, VEC>();
  constexpr int OP = STOCHASTIC ? qp::kFakeStochastic : qp::kFakeNearest;
  qp::u64 seed = 0, offset = 0;
  if constexpr (STOCHASTIC) {
    seed = qp::rng_word(seed_ptr, seed_value);
    offset = qp::rng_word(offset_ptr, offset_value);
  }
  qp::for_each_dynamic_segment<In, VEC, VECTOR_IO, sizeof(in_t) == 2>(
      x, lay, divisor, scale_out, zp_out,
      [&](qp::i64 first, int lane, int team, const vector_t (&xv)[NV], acc_t scale, int zp) {
        qp::FakeQuantParam<acc_t> p;
        p.set(scale, (acc_t)zp, lay.q_min, lay.q_max);
        // A finite inv bounds |x * inv| by about q_max - q_min (<= 255): the short rounding applies.
        // An inv of Inf (a scale below 2^-128) takes the general path.
        const bool small = isfinite(p.inv) || p.inv != p.inv;
#pragma unroll
        for (int u = 0; u < NV; ++u) {
          const int col = (lane + u * team) * VEC;
          if (col < lay.S) {
            float uni[VEC];
            qp::fake_uniforms<VEC, OP>((qp::u64)(first + col), seed, offset, uni);
            acc_t vals[VEC];
            if (small) {
#pragma unroll
              for (int k = 0; k < VEC; ++k) {
                const acc_t v = FE::to_acc(xv[u].v[k]);
                if constexpr (STOCHASTIC) {
                  vals[k] = p.fake_stochastic_small(v, uni[k]);
                } else {
                  vals[k] = p.fake_small(v);
                }
              }
            } else {
#pragma unroll
              for (int k = 0; k < VEC; ++k) qp::fake_values<In, VEC, OP>(p, xv[u], xv[u], uni, k, vals);
            }
            qp::vector_from_acc<In, VEC>(vals).template store<VECTOR_IO>(y + first + col, VEC);
          }
        }
      });
}

// Learnable backward, pass 1. Each team takes one (segment, chunk) item at a time (the loop is
// block-uniform, so every thread reaches every barrier): dx for its elements, and the chunk's
// sums of the dscale / dzp contributions (double), each thread over its vectors in order, then
// the team's fixed butterfly. One chunk per segment: the sums, rounded to the parameter type,
// are the gradients (grad_scale / grad_zp); several: they go to `partials` (two doubles per item)
// for fake_quantize_lsq_finish. grad_zp / dzp are skipped when grad_zp is null (symmetric).
template <class In, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256)
fake_quantize_lsq_segments(const typename qp::FloatElement<In>::storage* x,
                           const typename qp::FloatElement<In>::storage* dy,
                           typename qp::FloatElement<In>::storage* dx,
                           const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                           const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc grad_factor,
                           typename qp::FloatElement<In>::acc* __restrict__ grad_scale,
                           typename qp::FloatElement<In>::acc* __restrict__ grad_zp, double* __restrict__ partials,
                           const qp::LsqLayout lay) {
  typedef qp::FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  __shared__ qp::DoublePair slots[32];
  const int team = 1 << lay.team_log2;
  const int lane = threadIdx.x & (team - 1);
  const int teams_per_block = blockDim.x >> lay.team_log2;
  const qp::i64 stride = (qp::i64)gridDim.x * teams_per_block;
  for (qp::i64 base = (qp::i64)blockIdx.x * teams_per_block; base < lay.items; base += stride) {
    const qp::i64 item = base + (threadIdx.x >> lay.team_log2);
    const bool active = item < lay.items;
    const qp::i64 seg = active ? item / lay.chunks_per_segment : 0;
    const int chunk = (int)(item - seg * lay.chunks_per_segment);
    const int chunk_start = chunk * lay.chunk;
    const int chunk_end = min(lay.S, chunk_start + lay.chunk);
    const qp::i64 first = seg * (qp::i64)lay.S;
    qp::ElementVector<in_t, VEC> xv[qp::kFakeUnroll], gv[qp::kFakeUnroll];
#pragma unroll
    for (int u = 0; u < qp::kFakeUnroll; ++u) {
      const int col = chunk_start + (lane + u * team) * VEC;
      if (active && col < chunk_end) {
        xv[u].template load<VECTOR_IO>(x + first + col, VEC);
        gv[u].template load<VECTOR_IO>(dy + first + col, VEC);
      }
    }
    qp::DoublePair sums{0.0, 0.0};
    if (active) {
      const qp::FakeQuantParam<acc_t> p =
          qp::FakeQuantParam<acc_t>::load(scale_ptr, zp_ptr, lay.zp_source, (acc_t)1, 0, seg, lay.q_min, lay.q_max);
#pragma unroll
      for (int u = 0; u < qp::kFakeUnroll; ++u) {
        const int col = chunk_start + (lane + u * team) * VEC;
        if (col < chunk_end) {
          acc_t vals[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            acc_t ds, dz;
            vals[k] = p.learnable_grads(FE::to_acc(xv[u].v[k]), FE::to_acc(gv[u].v[k]), grad_factor, ds, dz);
            sums.a += (double)ds;
            sums.b += (double)dz;
          }
          qp::vector_from_acc<In, VEC>(vals).template store<VECTOR_IO>(dx + first + col, VEC);
        }
      }
    }
    qp::team_sum2(sums, lay.team_log2, slots);
    if (!active || lane != 0) continue;
    if (lay.chunks_per_segment == 1) {
      grad_scale[seg] = (acc_t)sums.a;
      if (grad_zp) grad_zp[seg] = (acc_t)sums.b;
    } else {
      partials[2 * item] = sums.a;
      partials[2 * item + 1] = sums.b;
    }
  }
}

// Learnable backward, pass 2: per segment, the sum of its chunks' partials in a fixed order (each
// lane of a warp sums every 32nd chunk in order, then the warp's butterfly), rounded once.
template <class Acc>
__global__ void __launch_bounds__(256)
fake_quantize_lsq_finish(const double* __restrict__ partials, Acc* __restrict__ grad_scale, Acc* __restrict__ grad_zp,
                         qp::i64 segments, int chunks_per_segment) {
  const int lane = threadIdx.x & 31;
  const qp::i64 warps = (qp::i64)gridDim.x * (blockDim.x >> 5);
  for (qp::i64 seg = (qp::i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); seg < segments; seg += warps) {
    qp::DoublePair sums{0.0, 0.0};
    const double* p = partials + 2 * seg * (qp::i64)chunks_per_segment;
    for (int c = lane; c < chunks_per_segment; c += 32) {
      sums.a += p[2 * c];
      sums.b += p[2 * c + 1];
    }
    qp::shuffle_sum2(sums, 32);
    if (lane == 0) {
      grad_scale[seg] = (Acc)sums.a;
      if (grad_zp) grad_zp[seg] = (Acc)sums.b;
    }
  }
}
