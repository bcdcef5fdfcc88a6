// dequantize.cu: static-parameter dequantization (DequantizePlan).
//
//   y = (q - zp) * scale     computed in the accumulator type (float; double for f64 output),
//                            rounded once to the output type
//   y = fp8_to_float(q) * scale   for FP8 codes (exact widening, then the same product)
// Template arguments: In (s8, u8q, s4, u4, e4m3, e5m2), Out (f16, bf16, f32, f64), VEC,
// VECTOR_IO, HIGH_FIRST nibble order for packed inputs.
//
// dequantize_backward_rows (DequantizeBackwardPlan): the gradient of dequantize_rows w.r.t. the
// codes (taken as floats), dq = dy * scale in the accumulator type, rounded once to Out; no mask
// (the forward is affine in q). Template arguments: Out (f16, bf16, f32, f64: dy and dq), VEC.
// dy and dq may be the same array.
#include "qp_elements.cuh"
#include "qp_vector_io.cuh"
#include "qp_packing.cuh"
#include "qp_rounding.cuh"
#include "qp_row_layout.cuh"

namespace qp {

static const int kDequantizeUnroll = QP_ROW_UNROLL;

template <class In, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
struct DequantizeBody {
  typedef FloatElement<Out> FE;
  typedef typename FE::storage out_t;
  typedef typename FE::acc acc_t;
  static const int kind = QuantElement<In>::kind;
  static const bool is_signed = QuantElement<In>::is_signed;
  static const bool packed = (kind == 1);
  static const int in_bytes = packed ? VEC / 2 : VEC;

  const u8* __restrict__ q;
  out_t* __restrict__ y;
  AffineParamSource<DequantParam<acc_t>, acc_t> params;
  const RowLayout& lay;
  DequantParam<acc_t> row_param;
  ElementVector<u8, in_bytes> qv[kDequantizeUnroll];

  __device__ __forceinline__ DequantizeBody(const u8* q_, out_t* y_, const acc_t* sp, const int* zp, acc_t sv, int zv,
                                            const RowLayout& l)
      : q(q_), y(y_), params{sp, zp, sv, zv}, lay(l) {}

  __device__ __forceinline__ DequantParam<acc_t> param(i64 index) const { return params(index); }

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    if (lay.cs == 0) row_param = param(pbase);
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    if constexpr (packed) {
      const i64 row_bytes = (lay.L + 1) / 2;
      qv[u].template load<VECTOR_IO>(q + row * row_bytes + col / 2, (valid + 1) / 2);
    } else {
      qv[u].template load<VECTOR_IO>(q + row * lay.L + col, valid);
    }
  }

  __device__ __forceinline__ int code(int k, int u) const {
    if constexpr (packed) return unpack_nibble<HIGH_FIRST, is_signed>(qv[u].v[k / 2], k & 1);
    return is_signed ? (int)(i8)qv[u].v[k] : (int)qv[u].v[k];
  }

  // (q - zp) * scale in the accumulator type (FP8: q * scale).
  __device__ __forceinline__ acc_t dequant(int k, int u, const DequantParam<acc_t>& p) const {
    if constexpr (kind == 2) return (acc_t)Fp8Element<In>::to_f32(qv[u].v[k]) * p.scale;
    return centered_code(code(k, u), p) * p.scale;
  }

  __device__ __forceinline__ void finish(int u, i64 row, i64 pbase, int col, int valid) {
    acc_t vals[VEC];
    if (lay.cs == 0) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) vals[k] = dequant(k, u, row_param);
    } else if ((lay.gc & (VEC - 1)) == 0) {  // groups are whole vectors: one parameter per vector
      const DequantParam<acc_t> p = param(pbase + (i64)column_group(lay, col) * lay.cs);
#pragma unroll
      for (int k = 0; k < VEC; ++k) vals[k] = dequant(k, u, p);
    } else {
      for_each_column_param<VEC, DequantParam<acc_t>>(
          lay, pbase, col, valid, column_group(lay, col), param(pbase + (i64)column_group(lay, col) * lay.cs),
          [&](i64 index) { return param(index); },
          [&](int k, const DequantParam<acc_t>& p) { vals[k] = dequant(k, u, p); });
    }
    const ElementVector<out_t, VEC> out = vector_from_acc<Out, VEC>(vals);
    out.template store<VECTOR_IO>(y + row * lay.L + col, valid);
  }
};

// Dequantize backward: reads dy, writes dq = dy * scale (vector I/O; misaligned operands take VEC = 1).
template <class Out, int VEC>
struct DequantizeBackwardBody {
  typedef FloatElement<Out> FE;
  typedef typename FE::storage out_t;
  typedef typename FE::acc acc_t;

  const out_t* dy;
  out_t* dq;
  const acc_t* __restrict__ scale_ptr;
  acc_t scale_value;
  const RowLayout& lay;
  acc_t row_scale;
  ElementVector<out_t, VEC> gv[kDequantizeUnroll];

  __device__ __forceinline__ acc_t scale(i64 index) const { return scale_ptr ? scale_ptr[index] : scale_value; }

  __device__ __forceinline__ void begin_item(i64, i64 pbase) {
    if (lay.cs == 0) row_scale = scale(pbase);
  }

  __device__ __forceinline__ void load(int u, i64 row, i64, int col, int valid) {
    gv[u].template load<true>(dy + row * lay.L + col, valid);
  }

  __device__ __forceinline__ void finish(int u, i64 row, i64 pbase, int col, int valid) {
    acc_t vals[VEC];
    if (lay.cs == 0 || (lay.gc & (VEC - 1)) == 0) {  // one scale for the whole vector
      const acc_t s = lay.cs == 0 ? row_scale : scale(pbase + (i64)column_group(lay, col) * lay.cs);
#pragma unroll
      for (int k = 0; k < VEC; ++k) vals[k] = FE::to_acc(gv[u].v[k]) * s;
    } else {
      for_each_column_param<VEC, acc_t>(
          lay, pbase, col, valid, column_group(lay, col), scale(pbase + (i64)column_group(lay, col) * lay.cs),
          [&](i64 index) { return scale(index); },
          [&](int k, acc_t s) { vals[k] = FE::to_acc(gv[u].v[k]) * s; });
    }
    vector_from_acc<Out, VEC>(vals).template store<true>(dq + row * lay.L + col, valid);
  }
};

}  // namespace qp

template <class In, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
__global__ void __launch_bounds__(256)
dequantize_rows(const qp::u8* __restrict__ q, typename qp::FloatElement<Out>::storage* __restrict__ y,
                const typename qp::FloatElement<Out>::acc* __restrict__ scale_ptr, const int* __restrict__ zp_ptr,
                typename qp::FloatElement<Out>::acc scale_value, int zp_value, const qp::RowLayout lay) {
  qp::DequantizeBody<In, Out, VEC, VECTOR_IO, HIGH_FIRST> body(q, y, scale_ptr, zp_ptr, scale_value, zp_value, lay);
  qp::for_each_row_vector<VEC, qp::kDequantizeUnroll>(lay, body);
}

template <class Out, int VEC>
__global__ void __launch_bounds__(256)
dequantize_backward_rows(const typename qp::FloatElement<Out>::storage* dy, typename qp::FloatElement<Out>::storage* dq,
                         const typename qp::FloatElement<Out>::acc* __restrict__ scale_ptr,
                         typename qp::FloatElement<Out>::acc scale_value, const qp::RowLayout lay) {
  qp::DequantizeBackwardBody<Out, VEC> body{dy, dq, scale_ptr, scale_value, lay};
  qp::for_each_row_vector<VEC, qp::kDequantizeUnroll>(lay, body);
}

// ---- the hot layouts, specialised ----
// dequantize_dense: dequantize_rows on a dense row layout (qp_row_layout.cuh, dense_item), 16-bit
// float outputs: one (row, chunk) item per block, VEC-element vectors (8: an 8-byte load of 8-bit
// codes or a 4-byte load of 4-bit codes, a 16-byte store, every warp access contiguous; small
// problems too), kDenseDequantizeUnroll per thread, each vector's parameter loaded beside its codes.
// FP8 codes widen exactly to half precision (sm_89+: two per cvt; e5m2 is the high byte of a
// half) before the product. Same parameters as dequantize_rows. 256-thread blocks at most, 32
// registers.
// dequantize_backward_dense: dequantize_backward_rows on a dense layout (VEC 8, or 4), one vector
// per thread (kDenseDequantizeBackwardUnroll).

namespace qp {

// Vectors per thread of dequantize_dense / dequantize_backward_dense (quantplan/runtime/_layout.py
// DENSE_ROW_SHAPES mirrors them).
static const int kDenseDequantizeUnroll = QP_DENSE_DEQUANTIZE_UNROLL;
static const int kDenseDequantizeBackwardUnroll = QP_DENSE_DEQUANTIZE_BACKWARD_UNROLL;

// Two FP8 codes (byte 0: element 2i) as exact floats.
template <class Fp8> struct Fp8Pair;
template <> struct Fp8Pair<e4m3> {
  static __device__ __forceinline__ void to_f32(u16 pair, float& lo, float& hi) {
#if __CUDA_ARCH__ >= 890
    u32 halves;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(pair));
    lo = FloatElement<f16>::to_acc((u16)(halves & 0xFFFFu));
    hi = FloatElement<f16>::to_acc((u16)(halves >> 16));
#else
    lo = Fp8Element<e4m3>::to_f32((u8)(pair & 0xFFu));
    hi = Fp8Element<e4m3>::to_f32((u8)(pair >> 8));
#endif
  }
};
template <> struct Fp8Pair<e5m2> {
  static __device__ __forceinline__ void to_f32(u16 pair, float& lo, float& hi) {
    lo = FloatElement<f16>::to_acc((u16)(pair << 8));
    hi = FloatElement<f16>::to_acc((u16)(pair & 0xFF00u));
  }
};

}  // namespace qp

template <class In, class Out, bool HIGH_FIRST, int VEC>
__global__ void __launch_bounds__(QP_DENSE_ROWS_BLOCK, QP_DENSE_ROWS_MIN_BLOCKS)
dequantize_dense(const qp::u8* __restrict__ q, typename qp::FloatElement<Out>::storage* __restrict__ y,
                 const float* __restrict__ scale_ptr, const int* __restrict__ zp_ptr, float scale_value, int zp_value,
                 const qp::RowLayout lay) {
  constexpr int U = qp::kDenseDequantizeUnroll;
  constexpr int kind = qp::QuantElement<In>::kind;
  constexpr bool is_signed = qp::QuantElement<In>::is_signed;
  constexpr bool packed = kind == 1;
  constexpr int in_bytes = packed ? VEC / 2 : VEC;
  typedef typename qp::FloatElement<Out>::storage out_t;
  const qp::DenseItem item = qp::dense_item<Out, VEC>(lay);
  const qp::u8* qr = q + item.row * (packed ? lay.L / 2 : lay.L);
  out_t* yr = y + item.row * lay.L;
  qp::ElementVector<qp::u8, in_bytes> qv[U];
  float s[U];
  int z[U];
  item.vectors<U>(
      [&](int u, int col) {
        qv[u].load_dense(qr + (packed ? col / 2 : col));
        qp::dense_affine_param(scale_ptr, zp_ptr, scale_value, zp_value, qp::dense_param_index(lay, item.pbase, col),
                               s[u], z[u]);
      },
      [&](int u, int col) {
        float vals[VEC];
        if constexpr (kind == 2) {
#pragma unroll
          for (int k = 0; k < VEC; k += 2) {
            qp::Fp8Pair<In>::to_f32((qp::u16)(qv[u].v[k] | (qv[u].v[k + 1] << 8)), vals[k], vals[k + 1]);
            vals[k] *= s[u];
            vals[k + 1] *= s[u];
          }
        } else {
          qp::DequantParam<float> p;
          p.set(s[u], z[u]);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const int code = packed ? qp::unpack_nibble<HIGH_FIRST, is_signed>(qv[u].v[k / 2], k & 1)
                                    : (is_signed ? (int)(qp::i8)qv[u].v[k] : (int)qv[u].v[k]);
            vals[k] = qp::centered_code(code, p) * p.scale;
          }
        }
        qp::vector_from_acc<Out, VEC>(vals).store_dense(yr + col);
      });
}

template <class Out, int VEC>
__global__ void __launch_bounds__(QP_DENSE_ROWS_BLOCK, QP_DENSE_ROWS_MIN_BLOCKS)
dequantize_backward_dense(const typename qp::FloatElement<Out>::storage* dy, typename qp::FloatElement<Out>::storage* dq,
                          const float* __restrict__ scale_ptr, float scale_value, const qp::RowLayout lay) {
  constexpr int U = qp::kDenseDequantizeBackwardUnroll;
  typedef qp::FloatElement<Out> FE;
  typedef typename FE::storage out_t;
  const qp::DenseItem item = qp::dense_item<Out, VEC>(lay);
  const qp::i64 base = item.row * lay.L;
  qp::ElementVector<out_t, VEC> gv[U];
  float s[U];
  item.vectors<U>(
      [&](int u, int col) {
        gv[u].load_dense(dy + base + col);
        s[u] = scale_ptr ? scale_ptr[qp::dense_param_index(lay, item.pbase, col)] : scale_value;
      },
      [&](int u, int col) {
        float vals[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) vals[k] = FE::to_acc(gv[u].v[k]) * s[u];
        qp::vector_from_acc<Out, VEC>(vals).store_dense(dq + base + col);
      });
}
