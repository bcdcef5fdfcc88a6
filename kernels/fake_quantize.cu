// fake_quantize.cu: fake quantization for quantization-aware training (FakeQuantizePlan,
// FakeQuantizeBackwardPlan). Element arithmetic in qp_fake_quantize.cuh.
//
//   fake_quantize_rows          y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale
//   fake_quantize_ste_rows      dx = dy * mask                (straight-through estimator)
//   fake_quantize_flat          either of the two with one parameter for the whole tensor
//                               (TensorScope): a flat walk over vectors, one tile per block
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
#include "qp_elements.cuh"
#include "qp_fake_quantize.cuh"
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

// Forward (STE = false) or straight-through backward (STE = true): reads x (and dy), writes y / dx.
template <class In, int VEC, bool VECTOR_IO, bool STE>
struct FakeQuantizeBody {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;

  const in_t* x;
  const in_t* dy;
  in_t* out;
  FakeParamSource<acc_t> params;
  FakeQuantParam<acc_t> row_param;
  ElementVector<in_t, VEC> xv[kFakeUnroll];
  ElementVector<in_t, VEC> gv[STE ? kFakeUnroll : 1];

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    if (params.lay.cs == 0) row_param = params(pbase);
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    const i64 at = row * params.lay.L + col;
    xv[u].template load<VECTOR_IO>(x + at, valid);
    if constexpr (STE) gv[u].template load<VECTOR_IO>(dy + at, valid);
  }

  __device__ __forceinline__ void finish(int u, i64 row, i64 pbase, int col, int valid) {
    acc_t vals[VEC];
    params.template for_each<VEC>(row_param, pbase, col, valid, [&](int k, const FakeQuantParam<acc_t>& p) {
      const acc_t v = FE::to_acc(xv[u].v[k]);
      if constexpr (STE) {
        vals[k] = p.ste(v, FE::to_acc(gv[u].v[k]));
      } else {
        vals[k] = p.fake(v);
      }
    });
    vector_from_acc<In, VEC>(vals).template store<VECTOR_IO>(out + row * params.lay.L + col, valid);
  }
};

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
  qp::FakeQuantizeBody<In, VEC, VECTOR_IO, false> body{x, nullptr, y, {scale_ptr, zp_ptr, scale_value, zp_value, lay}};
  qp::for_each_row_vector<VEC, qp::kFakeUnroll>(lay, body);
}

template <class In, int VEC, bool VECTOR_IO>
__global__ void __launch_bounds__(256, QP_FAKE_MIN_BLOCKS)
fake_quantize_ste_rows(const typename qp::FloatElement<In>::storage* x, const typename qp::FloatElement<In>::storage* dy,
                       typename qp::FloatElement<In>::storage* dx,
                       const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                       const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc scale_value, int zp_value,
                       const qp::RowLayout lay) {
  qp::FakeQuantizeBody<In, VEC, VECTOR_IO, true> body{x, dy, dx, {scale_ptr, zp_ptr, scale_value, zp_value, lay}};
  qp::for_each_row_vector<VEC, qp::kFakeUnroll>(lay, body);
}

// TensorScope, forward (STE false) or straight-through backward: one parameter; the tensor is
// n elements, walked as vectors of VEC, `per_thread` (1 to kFakeUnroll) per thread and tile of
// blockDim.x * per_thread vectors (grid-stride past the grid); the last vector may be partial
// (element I/O). Few registers and no per-item index arithmetic; the plan sizes the grid to the
// tensor, with smaller tiles for small tensors so that every SM gets work.
template <class In, int VEC, bool STE>
__global__ void __launch_bounds__(256)
fake_quantize_flat(const typename qp::FloatElement<In>::storage* x, const typename qp::FloatElement<In>::storage* dy,
                   typename qp::FloatElement<In>::storage* out,
                   const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr, const void* __restrict__ zp_ptr,
                   typename qp::FloatElement<In>::acc scale_value, int zp_value, int zp_source, int q_min, int q_max,
                   qp::i64 n, int per_thread) {
  typedef qp::FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  const qp::FakeQuantParam<acc_t> p =
      qp::FakeQuantParam<acc_t>::load(scale_ptr, zp_ptr, zp_source, scale_value, zp_value, 0, q_min, q_max);
  const qp::i64 n_vectors = (n + VEC - 1) / VEC;
  const qp::i64 stride = (qp::i64)gridDim.x * blockDim.x * per_thread;
  for (qp::i64 base = (qp::i64)blockIdx.x * blockDim.x * per_thread + threadIdx.x; base < n_vectors;
       base += stride) {
    qp::ElementVector<in_t, VEC> xv[qp::kFakeUnroll], gv[STE ? qp::kFakeUnroll : 1];
#pragma unroll
    for (int u = 0; u < qp::kFakeUnroll; ++u) {
      const qp::i64 v = base + (qp::i64)u * blockDim.x;
      if (u < per_thread && v < n_vectors) {
        const bool full = (v + 1) * VEC <= n;
        const int valid = full ? VEC : (int)(n - v * VEC);
        if (full) {
          xv[u].template load<true>(x + v * VEC, VEC);
          if constexpr (STE) gv[u].template load<true>(dy + v * VEC, VEC);
        } else {
          xv[u].template load<false>(x + v * VEC, valid);
          if constexpr (STE) gv[u].template load<false>(dy + v * VEC, valid);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < qp::kFakeUnroll; ++u) {
      const qp::i64 v = base + (qp::i64)u * blockDim.x;
      if (u < per_thread && v < n_vectors) {
        acc_t vals[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const acc_t a = FE::to_acc(xv[u].v[k]);
          if constexpr (STE) {
            vals[k] = p.ste(a, FE::to_acc(gv[u].v[k]));
          } else {
            vals[k] = p.fake(a);
          }
        }
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
