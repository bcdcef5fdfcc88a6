// qp_row_layout.cuh: the canonical (rows x L) view every elementwise plan runs on, and the
// row-segment work loop shared by the quantize and dequantize families.
//
// A contiguous tensor is viewed as `rows` rows of `L` elements. The parameter (scale, zero
// point) of element (row, col) is params[row_param_base(row) + (col / gc) * cs] with
//   row_param_base(row) = o * Co + ((row / M) % A / g_rows) * Ca + (row % M) * Cm,
//   o = row / (M * A),
// which expresses tensor, token, channel(axis) and group(axis, g) scopes of any rank (the
// Python side derives the coefficients). Rows are split into chunks of
// `seg_threads * VEC * u` columns (u <= UNROLL vectors per thread, fewer for small problems so
// that more threads share the work); a segment of seg_threads consecutive threads takes one
// (row, chunk) item at a time in a grid-stride loop, so there is no limit on rows and every
// index is 64-bit.
#pragma once
#include "qp_elements.cuh"

namespace qp {

// Passed to the kernel by value (no dependent load before the first data load). Mirrored field
// for field, in this order, by RowLayoutArgs in quantplan/runtime/_layout.py (keep in sync).
struct RowLayout {
  i64 rows, items, chunks_per_row, M, A, Co, Ca, Cm;
  int L, chunk_cols, seg_log2, g_rows, gc, cs, q_min, q_max;
  int flags;  // family-specific options (quantize.cu: bit 0, NaN scale -> FP8 code 0)
  // n / chunks_per_row and n / gc for 0 <= n < 2^31 without a division: (umulhi(n, magic) >> shift)
  // (divisors above 1; quantplan/runtime/_layout.py division_magic). Read by the dense kernels.
  u32 chunk_magic, chunk_shift, gc_magic, gc_shift;

  __device__ __forceinline__ i64 row_param_base(i64 row) const {
    if (M == 1 && A == 1) return row * Co;
    const i64 t = row / M;
    const i64 m = row - t * M;
    const i64 o = t / A;
    const i64 a = t - o * A;
    return o * Co + (a / g_rows) * Ca + m * Cm;
  }
};

// Runs body over every (row, column-vector) of the layout. Body provides
//   begin_item(row, pbase)                 once per (row, chunk) item
//   load(u, row, pbase, col, valid)        issue the loads of vector u (all loads first)
//   finish<u>(row, pbase, col, valid)      compute and store vector u
// `valid` is min(VEC, L - col): the elements of the vector inside the row.
template <int VEC, int UNROLL, class Body>
__device__ __forceinline__ void for_each_row_vector(const RowLayout& lay, Body& body) {
  const int seg_threads = 1 << lay.seg_log2;
  const int lane = threadIdx.x & (seg_threads - 1);
  const int segs_per_block = blockDim.x >> lay.seg_log2;
  const i64 seg_stride = (i64)gridDim.x * segs_per_block;
  for (i64 item = (i64)blockIdx.x * segs_per_block + (threadIdx.x >> lay.seg_log2); item < lay.items;
       item += seg_stride) {
    i64 row = item;
    int chunk = 0;
    if (lay.chunks_per_row != 1) {
      row = item / lay.chunks_per_row;
      chunk = (int)(item - row * lay.chunks_per_row);
    }
    const i64 pbase = lay.row_param_base(row);
    const int start = chunk * lay.chunk_cols;
    const int end = start + min(lay.chunk_cols, lay.L - start);  // chunks may hold fewer than UNROLL vectors
    const int col0 = start + lane * VEC;
    body.begin_item(row, pbase);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int col = col0 + u * seg_threads * VEC;
      if (col < end) body.load(u, row, pbase, col, min(VEC, lay.L - col));
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int col = col0 + u * seg_threads * VEC;
      if (col < end) body.finish(u, row, pbase, col, min(VEC, lay.L - col));
    }
  }
}

// Column-varying parameters (cs != 0): the group index of a vector's first element, and the
// walk over its elements that reloads a parameter only where a group boundary falls inside
// the vector. The first parameter is loaded in the load phase (its latency overlaps the data
// loads); fn(k, param) runs for every k (elements k >= valid are never stored).
__device__ __forceinline__ int column_group(const RowLayout& lay, int col) { return (unsigned)col / (unsigned)lay.gc; }

template <int VEC, class Param, class Load, class Fn>
__device__ __forceinline__ void for_each_column_param(const RowLayout& lay, i64 pbase, int col, int valid, int gi,
                                                      Param p, Load load, Fn fn) {
  int rem = col - gi * lay.gc;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    fn(k, p);
    if (++rem == lay.gc && k + 1 < valid) {
      rem = 0;
      ++gi;
      p = load(pbase + (i64)gi * lay.cs);
    }
  }
}

// The affine parameters (scale, zero point) of a row layout's segments, as the row kernels'
// bodies read them: from the device arrays, or the scalar values where an array is null, in the
// form Param that the body computes with (Param::set(scale, zp)).
template <class Param, class Acc>
struct AffineParamSource {
  const Acc* __restrict__ scale_ptr;
  const int* __restrict__ zp_ptr;
  Acc scale_value;
  int zp_value;

  __device__ __forceinline__ Param operator()(i64 index) const {
    Param p;
    p.set(scale_ptr ? scale_ptr[index] : scale_value, zp_ptr ? zp_ptr[index] : zp_value);
    return p;
  }
};

// ---- dense rows: the hot layouts, specialised (quantize_dense, dequantize_dense, ...) ----
// Contiguous rows of L elements whose parameter index is row * Co + (col / gc) * cs (Co: the
// row coefficient; cs == 0: one parameter per row), with L % VEC == 0, every operand aligned for
// VEC-element vectors, and cs == 0 or gc % VEC == 0 (a vector never straddles a group);
// quantplan/runtime/_layout.py (dense_row_layout) decides when a layout qualifies and fills Co. The
// dense kernels take 16-bit floats. Block b takes item b, the (row, chunk) pair b = row *
// chunks_per_row + chunk, of chunk_cols = blockDim.x * VEC * UNROLL columns (the grid is exactly
// `items` blocks, below 2^31): DenseItem holds the row, its parameter index base pbase = row * Co,
// and the thread's vectors: the first at col0 = chunk start + threadIdx.x * VEC, then every
// step = blockDim.x * VEC columns below end. No loop state and no 64-bit arithmetic per element:
// one row base per block, 32-bit columns.
struct DenseItem {
  i64 row, pbase;
  int col0, step, end;

  // The thread's U vectors, in two unrolled passes: load(u, col) issues every load (data and
  // parameters) first, so that their latencies overlap; then finish(u, col) computes and stores
  // each vector.
  template <int U, class Load, class Finish>
  __device__ __forceinline__ void vectors(Load load, Finish finish) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = col0 + u * step;
      if (col < end) load(u, col);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = col0 + u * step;
      if (col < end) finish(u, col);
    }
  }
};

template <class F, int VEC>
__device__ __forceinline__ DenseItem dense_item(const RowLayout& lay) {
  static_assert(sizeof(typename FloatElement<F>::storage) == 2, "16-bit floats");
  const int step = (int)blockDim.x * VEC;
  const u32 item = blockIdx.x;
  u32 row = item, chunk = 0;
  if (lay.chunks_per_row != 1) {
    row = __umulhi(item, lay.chunk_magic) >> lay.chunk_shift;
    chunk = item - row * (u32)lay.chunks_per_row;
  }
  const int start = (int)chunk * lay.chunk_cols;
  return DenseItem{(i64)row, (i64)row * lay.Co, start + (int)threadIdx.x * VEC, step,
                   start + min(lay.chunk_cols, lay.L - start)};
}

// The parameter index of the vector at column `col` of a dense row whose index base is `pbase`.
__device__ __forceinline__ i64 dense_param_index(const RowLayout& lay, i64 pbase, int col) {
  return lay.cs == 0 ? pbase : pbase + (i64)(__umulhi((u32)col, lay.gc_magic) >> lay.gc_shift) * lay.cs;
}

// The scale and zero point at parameter index pi: from the device arrays, or the scalar values
// where an array is null.
__device__ __forceinline__ void dense_affine_param(const float* scale_ptr, const int* zp_ptr, float scale_value,
                                                   int zp_value, i64 pi, float& s, int& z) {
  s = scale_ptr ? scale_ptr[pi] : scale_value;
  z = zp_ptr ? zp_ptr[pi] : zp_value;
}

}  // namespace qp
