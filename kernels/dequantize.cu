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

static const int kDequantizeUnroll = 4;

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
  const acc_t* __restrict__ scale_ptr;
  const int* __restrict__ zp_ptr;
  acc_t scale_value;
  int zp_value;
  const RowLayout& lay;
  DequantParam<acc_t> row_param;
  ElementVector<u8, in_bytes> qv[kDequantizeUnroll];

  __device__ __forceinline__ DequantizeBody(const u8* q_, out_t* y_, const acc_t* sp, const int* zp, acc_t sv, int zv,
                                            const RowLayout& l)
      : q(q_), y(y_), scale_ptr(sp), zp_ptr(zp), scale_value(sv), zp_value(zv), lay(l) {}

  __device__ __forceinline__ DequantParam<acc_t> param(i64 index) const {
    DequantParam<acc_t> p;
    p.set(scale_ptr ? scale_ptr[index] : scale_value, zp_ptr ? zp_ptr[index] : zp_value);
    return p;
  }

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
