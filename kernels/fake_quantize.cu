// fake_quantize.cu: fake quantization for quantization-aware training (FakeQuantizePlan,
// FakeQuantizeBackwardPlan). Element arithmetic in qp_fake_quantize.cuh.
//
//   fake_quantize_rows          y = (clamp(rne(x * inv) + zp, q_min, q_max) - zp) * scale
//   fake_quantize_ste_rows      dx = dy * mask                (straight-through estimator)
//   fake_quantize_stochastic_rows  y as fake_quantize_rows with stochastic rounding (Philox)
//   fake_quantize{,_ste,_stochastic}_dense_rows   the three on the hot row layouts (contiguous
//                               rows, parameters per row or per whole vector; see below)
//   fake_quantize_flat          any of the three with one parameter for the whole tensor
//                               (TensorScope): a flat walk over vectors, one tile per block
//   dynamic_fake_quantize_segments  range -> parameters -> fake quantization of contiguous
//                               segments in one pass (DynamicRangeFakeQuantizePlan)
//   dynamic_fake_quantize_dense     the same for 16-bit segments of team x 8 x NV elements,
//                               staged in shared memory (32 registers; see below)
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
#include "qp_row_shares.cuh"
#include "qp_stage.cuh"
#include "qp_team.cuh"
#include "qp_vector_io.cuh"

namespace qp {

static const int kFakeUnroll = QP_FAKE_FLAT_UNROLL;

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
// LsqLayoutArgs in quantplan/ops/fake_quantize.py.
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

// ---- the hot row layouts ----
// The row kernels specialised for contiguous rows of L elements (L % VEC == 0, 16-byte vectors,
// aligned operands) whose parameter index is row * lay.Co + (col / gc) * cs, with cs == 0 (one
// parameter per row: per-token, a leading channel axis) or gc % VEC == 0 (a vector never
// straddles a group). quantplan/runtime/_fake_rows.py (dense_row_layout) decides when a layout
// qualifies and fills lay.Co with the row coefficient; lay.M, A, Ca, Cm, g_rows and seg_log2 are
// not read. One (row, chunk) item per block at a time (chunk_cols = blockDim.x * VEC * unroll
// columns, unroll <= fake_dense_unroll<OP>(); vector u of thread t at chunk * chunk_cols +
// (u * blockDim.x + t) * VEC; `unroll` may be below the kernel's U), grid-stride over items (fewer than 2^31). No 64-bit index
// arithmetic per element: one row base per item, 32-bit columns; the parameter of a row is
// loaded once per item; parameters with 8-bit-like ranges take FakeShortParam's forms (six
// operations per element forward). Against the generic rows kernel (92 registers, 25% occupancy, 64-bit
// divisions per item) these hold 40 registers forward (6 blocks of 256 per SM) and 32 for the
// straight-through backward (8 blocks): QP_FAKE_DENSE_ROWS_MIN_BLOCKS (16-bit data: 40 registers
// at two vectors per thread), QP_FAKE_DENSE_ROWS_WIDE_MIN_BLOCKS (32- and 64-bit data; f64 spills
// at 8), QP_FAKE_DENSE_STE_MIN_BLOCKS (one vector of each input per thread: 32 registers).
// Bytes of each input one thread takes per item (QP_FAKE_DENSE_*THREAD_BYTES): the nearest and
// stochastic forwards (one input) 32, the straight-through backward (two inputs) 16, so a thread
// moves 32 bytes of input either way.

namespace qp {

// Vectors per thread and item of op OP (at most; dense_unroll in quantplan/runtime/_fake_rows.py mirrors
// it): the op's bytes of each input (above), at least one vector; four vectors spill.
template <class T, int VEC, int OP> __host__ __device__ constexpr int fake_dense_unroll() {
  constexpr int bytes = OP == kFakeSte          ? QP_FAKE_DENSE_STE_THREAD_BYTES
                        : OP == kFakeStochastic ? QP_FAKE_DENSE_STOCHASTIC_THREAD_BYTES
                                                : QP_FAKE_DENSE_THREAD_BYTES;
  return (int)sizeof(T) * VEC >= bytes ? 1 : bytes / (int)(sizeof(T) * VEC);
}

// The general forms of one vector of the dense-rows kernels (nearest rounding or the
// straight-through mask) with parameter `index`, out of line: the vector read again from xs (and
// gs), computed as the row kernels compute it, stored at ys. In place is safe: nothing of this
// vector was written before.
template <class In, int VEC, int OP>
__device__ __noinline__ void fake_dense_vector_general(const typename FloatElement<In>::storage* xs,
                                                       const typename FloatElement<In>::storage* gs,
                                                       typename FloatElement<In>::storage* ys,
                                                       const typename FloatElement<In>::acc* scale_ptr,
                                                       const void* zp_ptr, int zp_source,
                                                       typename FloatElement<In>::acc scale_value, int zp_value,
                                                       i64 index, int q_min, int q_max) {
  typedef typename FloatElement<In>::acc acc_t;
  const FakeQuantParam<acc_t> p =
      FakeQuantParam<acc_t>::load(scale_ptr, zp_ptr, zp_source, scale_value, zp_value, index, q_min, q_max);
  ElementVector<typename FloatElement<In>::storage, VEC> xv, gv;
  xv.template load<true>(xs, VEC);
  if constexpr (OP == kFakeSte) gv.template load<true>(gs, VEC);
  float uni[VEC];
  acc_t vals[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) fake_values<In, VEC, OP>(p, xv, gv, uni, k, vals);
  vector_from_acc<In, VEC>(vals).template store<true>(ys, VEC);
}

// One (row, chunk) item of the dense-rows kernels: its vectors (loaded first), then computed and
// stored with one parameter per row (PER_VECTOR false: `rp`) or one per vector (loaded there).
template <class In, int VEC, int OP>
struct FakeDenseItem {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  typedef FakeQuantParam<acc_t> Param;
  static constexpr int U = fake_dense_unroll<in_t, VEC, OP>();
  static constexpr bool ste = OP == kFakeSte;

  const acc_t* scale_ptr;
  const void* zp_ptr;
  acc_t scale_value;
  int zp_value;
  const RowLayout& lay;
  i64 base, pbase;
  int col0, end, step;
  ElementVector<in_t, VEC> xv[U], gv[ste ? U : 1];

  __device__ __forceinline__ void load(const in_t* x, const in_t* dy) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = col0 + u * step;
      if (col < end) {
        xv[u].load_dense(x + base + col);
        if constexpr (ste) gv[u].load_dense(dy + base + col);
      }
    }
  }

  __device__ __forceinline__ Param param(i64 index) const {
    return Param::load(scale_ptr, zp_ptr, lay.flags, scale_value, zp_value, index, lay.q_min, lay.q_max);
  }

  // The short forms when the parameter allows them (FakeShortParam::ok), else the general ones
  // with the parameter loaded again: inline for stochastic rounding (its only form), out of line
  // for the others (rare: the hot loop keeps its registers and its code stays short, which is
  // most of a small problem's time). x / dy: the operands, read again by the out-of-line path.
  template <bool PER_VECTOR>
  __device__ __forceinline__ void finish(const FakeShortParam<acc_t>& row_sp, const in_t* x, const in_t* dy, in_t* out,
                                         u64 seed, u64 offset) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = col0 + u * step;
      if (col < end) {
        // col / gc by the division magic (gc >= VEC >= 2 here)
        const i64 index = PER_VECTOR ? pbase + (i64)(__umulhi((u32)col, lay.gc_magic) >> lay.gc_shift) * lay.cs : pbase;
        FakeShortParam<acc_t> sp = row_sp;
        if (PER_VECTOR) sp.set(param(index));
        acc_t vals[VEC];
        if (OP != kFakeStochastic && sp.ok) {  // the usual ranges
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const acc_t v = FE::to_acc(xv[u].v[k]);
            vals[k] = ste ? sp.ste(v, FE::to_acc(gv[ste ? u : 0].v[k])) : sp.fake(v);
          }
        } else if constexpr (OP == kFakeStochastic) {
          const Param p = param(index);
          float uni[VEC];
          fake_uniforms<VEC, OP>((u64)(base + col), seed, offset, uni);
#pragma unroll
          for (int k = 0; k < VEC; ++k) fake_values<In, VEC, OP>(p, xv[u], gv[0], uni, k, vals);
        } else {
          const i64 at = base + col;
          fake_dense_vector_general<In, VEC, OP>(x + at, ste ? dy + at : nullptr, out + at, scale_ptr, zp_ptr, lay.flags,
                                                 scale_value, zp_value, index, lay.q_min, lay.q_max);
          continue;
        }
        vector_from_acc<In, VEC>(vals).store_dense(out + base + col);
      }
    }
  }
};

template <class In, int VEC, int OP>
__device__ __forceinline__ void fake_dense_rows(const typename FloatElement<In>::storage* x,
                                                const typename FloatElement<In>::storage* dy,
                                                typename FloatElement<In>::storage* out,
                                                const typename FloatElement<In>::acc* __restrict__ scale_ptr,
                                                const void* __restrict__ zp_ptr,
                                                typename FloatElement<In>::acc scale_value, int zp_value,
                                                const RowLayout& lay, u64 seed, u64 offset) {
  typedef FakeDenseItem<In, VEC, OP> Item;
  const int step = (int)blockDim.x * VEC;
  for (u32 item = blockIdx.x; item < (u32)lay.items; item += gridDim.x) {
    u32 row = item;
    int start = 0;
    if (lay.chunks_per_row != 1) {  // item / chunks_per_row without a division (division_magic)
      row = __umulhi(item, lay.chunk_magic) >> lay.chunk_shift;
      start = (int)(item - row * (u32)lay.chunks_per_row) * lay.chunk_cols;
    }
    // end: the plan may give fewer than U vectors per thread
    Item it{scale_ptr, zp_ptr, scale_value, zp_value, lay, (i64)row * lay.L, (i64)row * lay.Co,
            start + (int)threadIdx.x * VEC, min(lay.L, start + lay.chunk_cols), step};
    it.load(x, dy);
    FakeShortParam<typename Item::acc_t> sp;
    if (lay.cs == 0) {  // one parameter per row, loaded once per item
      sp.set(it.param(it.pbase));
      it.template finish<false>(sp, x, dy, out, seed, offset);
    } else {  // one per vector (gc % VEC == 0)
      it.template finish<true>(sp, x, dy, out, seed, offset);
    }
  }
}

}  // namespace qp

template <class In, int VEC>
__global__ void __launch_bounds__(QP_FAKE_DENSE_ROWS_BLOCK, sizeof(typename qp::FloatElement<In>::storage) == 2
                                           ? QP_FAKE_DENSE_ROWS_MIN_BLOCKS
                                           : QP_FAKE_DENSE_ROWS_WIDE_MIN_BLOCKS)
fake_quantize_dense_rows(const typename qp::FloatElement<In>::storage* x, typename qp::FloatElement<In>::storage* y,
                         const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                         const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc scale_value,
                         int zp_value, const qp::RowLayout lay) {
  qp::fake_dense_rows<In, VEC, qp::kFakeNearest>(x, nullptr, y, scale_ptr, zp_ptr, scale_value, zp_value, lay, 0, 0);
}

template <class In, int VEC>
__global__ void __launch_bounds__(QP_FAKE_DENSE_ROWS_BLOCK, QP_FAKE_DENSE_STE_MIN_BLOCKS)
fake_quantize_ste_dense_rows(const typename qp::FloatElement<In>::storage* x,
                             const typename qp::FloatElement<In>::storage* dy,
                             typename qp::FloatElement<In>::storage* dx,
                             const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                             const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc scale_value,
                             int zp_value, const qp::RowLayout lay) {
  qp::fake_dense_rows<In, VEC, qp::kFakeSte>(x, dy, dx, scale_ptr, zp_ptr, scale_value, zp_value, lay, 0, 0);
}

template <class In, int VEC>
__global__ void __launch_bounds__(QP_FAKE_DENSE_ROWS_BLOCK, 6)
fake_quantize_stochastic_dense_rows(const typename qp::FloatElement<In>::storage* x,
                                    typename qp::FloatElement<In>::storage* y,
                                    const typename qp::FloatElement<In>::acc* __restrict__ scale_ptr,
                                    const void* __restrict__ zp_ptr, typename qp::FloatElement<In>::acc scale_value,
                                    int zp_value, const qp::RowLayout lay, const qp::i64* __restrict__ seed_ptr,
                                    const qp::i64* __restrict__ offset_ptr, qp::u64 seed_value,
                                    qp::u64 offset_value) {
  qp::fake_dense_rows<In, VEC, qp::kFakeStochastic>(x, nullptr, y, scale_ptr, zp_ptr, scale_value, zp_value, lay,
                                                   qp::rng_word(seed_ptr, seed_value),
                                                   qp::rng_word(offset_ptr, offset_value));
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
                               qp::u64 seed_value, qp::u64 offset_value, float /* divisor_inverse */) {
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

// ---- DynamicRangeFakeQuantizePlan's fused pass on the hot layouts ----
// dynamic_fake_quantize_dense: the same results as dynamic_fake_quantize_segments for
// contiguous segments of S = team * 8 * NV 16-bit elements (a team of 1 << seg_log2 threads per
// segment, team <= 256, each thread NV vectors of 8 elements, all of them data), 16-byte aligned
// operands, blocks of 256 threads, one segment per team and loop trip (grid-stride).
//  * staging: the thread's share of the segment goes global -> shared memory by cp.async
//    (qp_stage.cuh), so no data register lives across the range reduction, and is read back
//    from there to fake-quantize (in place is safe: every element is staged before it is written,
//    by the thread that writes it, and the prefetch reads other segments);
//  * addressing: one 64-bit segment base per segment, 32-bit columns, no bounds tests;
//  * arithmetic: DynamicFakeParam (the zero point folded into the clamp bounds, rne and floor
//    by two additions); stochastic rounding draws one Philox call per 4 elements from a
//    PhiloxStream (round 0's offset product hoisted);
//  * a segment whose inv is +Inf (scale below 2^-128: bf16 data below about 2^-121) takes the
//    general per-element path, out of line.
//  * pipelining: a persistent grid (the plan sizes it to the resident blocks) double-buffers the
//    staging: the next segment's copies are issued before this one is scanned, so every SM keeps
//    its loads in flight through the reduction and the writes;
// 6 blocks per SM (two 16 KiB buffers each at NV = 4), 40 registers.

namespace qp {

static const int kFakeDenseBlock = QP_DENSE_BLOCK;  // threads of a dynamic_fake_quantize_dense block

// A staged vector of 8 16-bit elements (slot u of this thread).
__device__ __forceinline__ ElementVector<u16, 8> staged_vector(const uint4* stage, int u) {
  ElementVector<u16, 8> v;
  v.bytes.w[0] = stage[u * kFakeDenseBlock + threadIdx.x];
  return v;
}

// The rare path of dynamic_fake_quantize_dense (inv = +Inf): FakeQuantParam's general formulas,
// from the staged vectors, out of line so that the hot loop keeps its registers.
template <class In, int NV, bool STOCHASTIC>
__device__ __noinline__ void dense_fake_general(const uint4* stage, u16* ys, i64 first, int lane, int team,
                                                float scale, int zp, int q_min, int q_max, PhiloxStream rng) {
  FakeQuantParam<float> p;
  p.set(scale, (float)zp, q_min, q_max);
  for (int u = 0; u < NV; ++u) {
    const int col = (lane + u * team) * 8;
    const ElementVector<u16, 8> xv = staged_vector(stage, u);
    float vals[8];
    for (int k = 0; k < 8; ++k) {
      const float v = FloatElement<In>::to_acc(xv.v[k]);
      if constexpr (STOCHASTIC) {
        const Philox4 w = rng((u64)(first + col + k) >> 2);
        vals[k] = p.fake_stochastic(v, philox_uniform(w.v[k & 3]));
      } else {
        vals[k] = p.fake(v);
      }
    }
    vector_from_acc<In, 8>(vals).template store<true>(ys + col, 8);
  }
}

}  // namespace qp

template <class In, int NV, bool STOCHASTIC>
__global__ void __launch_bounds__(qp::kFakeDenseBlock, QP_FAKE_DENSE_MIN_BLOCKS)
dynamic_fake_quantize_dense(const typename qp::FloatElement<In>::storage* x, typename qp::FloatElement<In>::storage* y,
                            float* __restrict__ scale_out, int* __restrict__ zp_out, const qp::SegmentLayout lay,
                            float divisor, const qp::i64* __restrict__ seed_ptr,
                            const qp::i64* __restrict__ offset_ptr, qp::u64 seed_value, qp::u64 offset_value,
                            float /* divisor_inverse */) {
  typedef qp::FloatElement<In> FE;
  typedef qp::u16 in_t;
  typedef qp::SegmentRange<float, qp::u32> Range;
  static_assert(sizeof(typename FE::storage) == 2, "16-bit floats");
  constexpr int VEC = 8;
  constexpr int SLOTS = NV * qp::kFakeDenseBlock;  // 16-byte words of one buffer
  __shared__ uint4 stage[2 * SLOTS];
  __shared__ Range team_slots[qp::kFakeDenseBlock / 32];
  const qp::PhiloxStream rng(STOCHASTIC ? qp::rng_word(seed_ptr, seed_value) : 0,
                             STOCHASTIC ? qp::rng_word(offset_ptr, offset_value) : 0);
  const int team_log2 = lay.seg_log2;
  const int team = 1 << team_log2;
  const int lane = threadIdx.x & (team - 1);
  const int teams_per_block = qp::kFakeDenseBlock >> team_log2;
  const bool asym = lay.mode != 0;
  const qp::i64 stride = (qp::i64)gridDim.x * teams_per_block;
  // The thread's share of segment s -> buffer b (one commit group; empty past the end).
  auto prefetch = [&](qp::i64 s, int b) {
    if (s < lay.segments) {
      const in_t* xs = x + s * lay.S + lane * VEC;
#pragma unroll
      for (int u = 0; u < NV; ++u) qp::stage_16(&stage[b * SLOTS + u * qp::kFakeDenseBlock + threadIdx.x], xs + u * team * VEC);
    }
    qp::stage_commit();
  };
  qp::i64 seg = (qp::i64)blockIdx.x * teams_per_block + (threadIdx.x >> team_log2);
  prefetch(seg, 0);
  int buf = 0;
  for (qp::i64 base = (qp::i64)blockIdx.x * teams_per_block; base < lay.segments; base += stride, seg += stride) {
    prefetch(seg + stride, buf ^ 1);  // the next segment streams in while this one is processed
    qp::stage_wait_prior<1>();        // this segment's copies have landed
    const bool active = seg < lay.segments;
    const uint4* staged = stage + buf * SLOTS;
    qp::RangeScan<In> scan;
    scan.reset();
    if (active) {
#pragma unroll
      for (int u = 0; u < NV; ++u) scan.add(qp::staged_vector(staged, u), asym);
    }
    Range range = scan.result();
    qp::team_reduce_range(range, asym, team_log2, team_slots);
    buf ^= 1;
    if (!active) continue;
    int zp;
    const float scale = qp::team_segment_params<In>(range, asym, lay, divisor, lane, seg, scale_out, zp_out, zp);
    qp::DynamicFakeParam<float> p;
    p.set(scale, zp, lay.q_min, lay.q_max);
    const qp::i64 first = seg * lay.S;
    in_t* ys = y + first;
    if (!p.short_path()) {
      qp::dense_fake_general<In, NV, STOCHASTIC>(staged, ys, first, lane, team, scale, zp, lay.q_min, lay.q_max, rng);
      continue;
    }
#pragma unroll 1
    for (int u = 0; u < NV; ++u) {
      const int col = (lane + u * team) * VEC;
      const qp::ElementVector<in_t, VEC> xv = qp::staged_vector(staged, u);
      float vals[VEC];
      if constexpr (STOCHASTIC) {
        const qp::u64 j = (qp::u64)(first + col) >> 2;  // first + col is a multiple of 8
#pragma unroll
        for (int h = 0; h < VEC; h += 4) {
          const qp::Philox4 w = rng(j + (h >> 2));
#pragma unroll
          for (int t = 0; t < 4; ++t) vals[h + t] = p.stochastic(FE::to_acc(xv.v[h + t]), qp::philox_uniform(w.v[t]));
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) vals[k] = p.nearest(FE::to_acc(xv.v[k]));
      }
      qp::vector_from_acc<In, VEC>(vals).template store<true>(ys + col, VEC);
    }
  }
  qp::stage_wait();  // no copy outlives the block
}

// ---- shared by the nearest-rounding row kernels (rows, cluster, row shares) ----
// fake_segment_param: a segment's parameters on the division-free path: the `writer` thread stores
// the scale and zero point; returns the value parameters (DynamicFakeParam).
__device__ __forceinline__ qp::DynamicFakeParam<float> fake_segment_param(const qp::IntQuantParam<float>& ip, int zp,
                                                                         int q_min, int q_max, bool writer,
                                                                         float* scale_out, int* zp_out, qp::i64 seg) {
  if (writer) {
    if (scale_out) scale_out[seg] = ip.scale;
    if (zp_out) zp_out[seg] = zp;
  }
  qp::DynamicFakeParam<float> p;
  p.set(ip.scale, ip.inv, zp, q_min, q_max);
  return p;
}

// fake_vector8_nearest: one 16-byte vector of 16-bit floats fake-quantized (nearest) and stored at y.
template <class In>
__device__ __forceinline__ void fake_vector8_nearest(const qp::DynamicFakeParam<float>& p, const uint4& v,
                                                     typename qp::FloatElement<In>::storage* y) {
  typedef qp::FloatElement<In> FE;
  qp::ElementVector<qp::u16, 8> xv;
  xv.bytes.w[0] = v;
  float vals[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) vals[k] = p.nearest(FE::to_acc(xv.v[k]));
  qp::vector_from_acc<In, 8>(vals).template store<true>(y, 8);
}

// ---- DynamicRangeFakeQuantizePlan, nearest: whole rows held in registers by a block ----
// dynamic_fake_quantize_rows: the same results as dynamic_fake_quantize_segments for contiguous
// segments of S = kFakeRowsBlock * 8 * NV 16-bit elements (rows of 2048, 4096, 8192), nearest
// rounding, 16-byte aligned operands; the structure of dynamic_range.cu's dynamic_quantize_rows:
//  * one block per segment (the grid strides past 2^31 - 1 segments), each thread's NV vectors
//    in registers from the load to the store; in place is safe (every thread reads its own
//    vectors before it writes them, and no other thread writes them);
//  * the range on packed words and one barrier per segment (qp_range.cuh: range_word_n,
//    block_range_word); the division-free scale and zero point of RowRange::fast_params, inv =
//    rn(1 / scale) (the value DynamicFakeParam::set computes there); any other segment (NaN /
//    Inf, extreme range) takes segment_params and DynamicFakeParam / FakeQuantParam out of line.
static const int kFakeRowsBlock = QP_ROWS_BLOCK;

namespace qp {

// The rare segment of dynamic_fake_quantize_rows: segment_params, the parameters' store (lane 0),
// then the values by DynamicFakeParam (finite inv) or FakeQuantParam's general formulas, each
// thread from its own input vectors again (in place: read before written).
template <class In, int NV>
__device__ __noinline__ void fake_rows_rare_segment(const u16* xs, u16* ys, float* scale_out, int* zp_out, i64 seg,
                                                    int lane, int team, float lo, float hi, bool bad, int mode,
                                                    int q_min, int q_max, float divisor) {
  int zp;
  const float scale = segment_params<float>(lo, hi, bad, mode, q_min, q_max, divisor, zp);
  if (lane == 0) {
    if (scale_out) scale_out[seg] = scale;
    if (zp_out) zp_out[seg] = zp;
  }
  DynamicFakeParam<float> dp;
  dp.set(scale, zp, q_min, q_max);
  FakeQuantParam<float> gp;
  gp.set(scale, (float)zp, q_min, q_max);
  const bool short_path = dp.short_path();
  for (int u = 0; u < NV; ++u) {
    const int col = (lane + u * team) * 8;
    ElementVector<u16, 8> xv;
    xv.template load<true>(xs + col, 8);
    float vals[8];
    for (int k = 0; k < 8; ++k) {
      const float v = FloatElement<In>::to_acc(xv.v[k]);
      vals[k] = short_path ? dp.nearest(v) : gp.fake(v);
    }
    vector_from_acc<In, 8>(vals).template store<true>(ys + col, 8);
  }
}

}  // namespace qp

template <class In, int MODE, int NV>
__global__ void __launch_bounds__(kFakeRowsBlock, QP_FAKE_ROWS_MIN_BLOCKS)
dynamic_fake_quantize_rows(const typename qp::FloatElement<In>::storage* x, typename qp::FloatElement<In>::storage* y,
                           float* __restrict__ scale_out, int* __restrict__ zp_out, const qp::SegmentLayout lay,
                           float divisor, const qp::i64*, const qp::i64*, qp::u64, qp::u64, float) {
  using qp::i64;
  typedef qp::FloatElement<In> FE;
  constexpr int S = kFakeRowsBlock * 8 * NV;  // elements per segment (lay.S)
  static_assert(sizeof(typename FE::storage) == 2, "16-bit floats");
  const int tid = threadIdx.x;
  const int q_min = lay.q_min, q_max = lay.q_max;
  qp::for_each_row_segment<In, MODE, NV, kFakeRowsBlock>(
      x, lay.segments, q_min, q_max, divisor,
      [&](i64 seg, const qp::RowRange<In, MODE>& range) {
        qp::fake_rows_rare_segment<In, NV>(x + seg * S, y + seg * S, scale_out, zp_out, seg, tid, kFakeRowsBlock,
                                           range.lo, range.hi, range.bad, MODE, q_min, q_max, divisor);
      },
      [&](i64 seg, const uint4(&v)[NV], const qp::IntQuantParam<float>& ip, int zp) {
        typename FE::storage* ys = y + seg * S;
        const qp::DynamicFakeParam<float> p =
            fake_segment_param(ip, zp, q_min, q_max, tid == 0, scale_out, zp_out, seg);
#pragma unroll
        for (int w = 0; w < NV; ++w) fake_vector8_nearest<In>(p, v[w], ys + (tid + w * kFakeRowsBlock) * 8);
      });
}

// ---- DynamicRangeFakeQuantizePlan, nearest: one row over a thread-block cluster (sm_90) ----
// dynamic_fake_quantize_cluster: few long rows (16 rows of 8192: one block per row keeps 16 SMs
// busy). Each segment of S = kClusterBlocks * blockDim.x * 8 16-bit elements takes a cluster of
// kClusterBlocks blocks (qp_range.cuh), one 16-byte vector per thread: the range by
// cluster_range_word (distributed shared memory, one cluster barrier), the parameters of
// dynamic_fake_quantize_rows (RowRange::fast_params, the rare segment out of line), the values
// by DynamicFakeParam. In place is safe: each thread reads its vector before writing it.
// blockDim.x a multiple of 32, at most 1024; kClusterBlocks blocks per segment. Other
// architectures: never selected (the body traps).
template <class In, int MODE>
__global__ void QP_CLUSTER_DIMS __launch_bounds__(1024)
dynamic_fake_quantize_cluster(const typename qp::FloatElement<In>::storage* x,
                              typename qp::FloatElement<In>::storage* y, float* __restrict__ scale_out,
                              int* __restrict__ zp_out, const qp::SegmentLayout lay, float divisor, const qp::i64*,
                              const qp::i64*, qp::u64, qp::u64, float) {
#if __CUDA_ARCH__ >= 900
  typedef qp::FloatElement<In> FE;
  using qp::i64;
  static_assert(sizeof(typename FE::storage) == 2, "16-bit floats");
  const int S = lay.S, q_min = lay.q_min, q_max = lay.q_max;
  qp::cluster_segment<In, MODE>(
      x, S, [&](int rank, i64 seg, int col, const uint4& v, const qp::RowRange<In, MODE>& range) {
        const i64 first = seg * S;
        const float d = divisor, inv_d = qp::rcp_rn_normal(divisor);
        qp::IntQuantParam<float> ip;
        int zp;
        const bool writer = rank == 0 && threadIdx.x == 0;
        if (!range.fast_params(d, inv_d, q_min, q_max, ip, zp)) {
          // This thread's one vector (lane 0 of a team of one; only the writer stores parameters).
          qp::fake_rows_rare_segment<In, 1>(x + first + col, y + first + col, writer ? scale_out : nullptr,
                                            writer ? zp_out : nullptr, seg, 0, 1, range.lo, range.hi, range.bad, MODE,
                                            q_min, q_max, d);
          return;
        }
        fake_vector8_nearest<In>(fake_segment_param(ip, zp, q_min, q_max, writer, scale_out, zp_out, seg), v,
                                 y + first + col);
      });
#else
  __trap();
#endif
}

// ---- DynamicRangeFakeQuantizePlan, nearest: one row over a few blocks that each read all of it ----
// dynamic_fake_quantize_row_shares: the row-shares layout of dynamic_quantize_row_shares
// (dynamic_range.cu) for fake quantization. Each segment of S = BLOCKS * kFakeSharesBlock * 8
// 16-bit elements takes BLOCKS consecutive blocks; every block loads the whole segment (its own
// vector first), reduces the range alone (one barrier) and writes only its share: the parameters
// of dynamic_fake_quantize_cluster, the values by DynamicFakeParam.
// In place (y == x) a block must not write its share while another block may still read it, so
// there block 0 of each segment writes every share (it holds the whole segment: each thread reads
// its vectors before writing them) and the others return before loading. The plan sends in-place
// calls to an in-place kernel (dynamic_fake_quantize_cluster / _rows); this branch keeps a call
// that still arrives here in place correct (run(check=False) replaying an out-of-place launch).
static const int kFakeSharesBlock = QP_SHARES_BLOCK;

template <class In, int MODE, int BLOCKS>
__global__ void __launch_bounds__(kFakeSharesBlock)
dynamic_fake_quantize_row_shares(const typename qp::FloatElement<In>::storage* x,
                                 typename qp::FloatElement<In>::storage* y, float* __restrict__ scale_out,
                                 int* __restrict__ zp_out, const qp::SegmentLayout lay, float divisor, const qp::i64*,
                                 const qp::i64*, qp::u64, qp::u64, float) {
  typedef qp::FloatElement<In> FE;
  using qp::i64;
  using qp::u32;
  constexpr int S = BLOCKS * kFakeSharesBlock * 8;  // elements per segment (lay.S)
  constexpr int WARPS = kFakeSharesBlock / 32;
  static_assert(sizeof(typename FE::storage) == 2, "16-bit floats");
  static_assert(BLOCKS >= 2 && (BLOCKS & (BLOCKS - 1)) == 0, "a power of two of blocks per segment");
  __shared__ __align__(16) u32 slots[WARPS];
  const bool in_place = static_cast<const void*>(x) == static_cast<const void*>(y);
  const u32 part = blockIdx.x % BLOCKS;  // this block's share of the segment
  if (in_place && part != 0) return;
  const i64 seg = blockIdx.x / BLOCKS;
  const i64 first = seg * S;
  const uint4* row = reinterpret_cast<const uint4*>(x + first) + threadIdx.x;
  uint4 v[BLOCKS];  // the whole row (in place: share j in v[j]); `own`: this block's share
  // Read-only loads (ld.global.nc): in place too, no block reads what a block has written.
  const uint4 own =
      qp::load_row_shares<BLOCKS, kFakeSharesBlock>(row, part, v, [](const uint4* a) { return __ldg(a); });
  const qp::RowRange<In, MODE> range(
      qp::block_range_word<In, MODE, WARPS>(qp::range_word_n<In, MODE, BLOCKS>(v), slots));
  const int q_min = lay.q_min, q_max = lay.q_max;
  const float d = divisor, inv_d = qp::rcp_rn_normal(divisor);
  const int col = (part * kFakeSharesBlock + threadIdx.x) * 8;
  qp::IntQuantParam<float> ip;
  int zp;
  const bool writer = part == 0 && threadIdx.x == 0;
  if (!range.fast_params(d, inv_d, q_min, q_max, ip, zp)) {
    if (in_place) {  // every share of the segment, as dynamic_fake_quantize_rows
      qp::fake_rows_rare_segment<In, BLOCKS>(x + first, y + first, scale_out, zp_out, seg, threadIdx.x,
                                             kFakeSharesBlock, range.lo, range.hi, range.bad, MODE, q_min, q_max, d);
      return;
    }
    // This thread's one vector (lane 0 of a team of one; only the writer stores parameters).
    qp::fake_rows_rare_segment<In, 1>(x + first + col, y + first + col, writer ? scale_out : nullptr,
                                      writer ? zp_out : nullptr, seg, 0, 1, range.lo, range.hi, range.bad, MODE, q_min,
                                      q_max, d);
    return;
  }
  const qp::DynamicFakeParam<float> p = fake_segment_param(ip, zp, q_min, q_max, writer, scale_out, zp_out, seg);
#pragma unroll
  for (int j = 0; j < BLOCKS; ++j) {
    if (j > 0 && !in_place) break;
    // in place: part 0, own == v[0]
    fake_vector8_nearest<In>(p, j == 0 ? own : v[j], y + first + col + j * (kFakeSharesBlock * 8));
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
