// swizzled_quantize.cu: SwizzledQuantizePlan (ZeRO++ qgZ), group quantization written in the order
// of a hierarchical all-to-all, with optional LoCo error feedback (qp_qgz.cuh).
//
//   swizzled_quantize_segments      one read: a team holds each group (groups up to 32768 elements)
//   swizzled_quantize_group_params  any group size, pass 1: the parameters of every group
//   swizzled_quantize_elements      any group size, pass 2: codes (and the error update)
//   swizzled_quantize_dense         the fused pass specialised for aligned 16-bit groups of
//                                   team * 8 * NV elements without LoCo (qp_qgz.cuh)
// In: the input float; Err: the LoCo buffer's float or qp::no_error; Out: the code element.
#include "qp_qgz.cuh"

template <class In, class Err, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
__global__ void __launch_bounds__(QP_QGZ_SEGMENT_BOUND)
swizzled_quantize_segments(const typename qp::FloatElement<In>::storage* __restrict__ x, const qp::QgzOutputArgs out,
                           const qp::SegmentLayout lay, float divisor, const qp::SwizzleMap map) {
  typedef qp::SwizzleSource<In, Err, VEC, VECTOR_IO> S;
  const typename S::type src = S::make(x, out.error);
  const qp::QgzCodeSink<typename S::scan, Out, Err, VEC, VECTOR_IO, HIGH_FIRST> sink{out, lay.q_min, lay.q_max, lay.mode, divisor};
  qp::qgz_fused_segments<typename S::scan, VEC>(src, sink, map, lay);
}

// The parameters do not depend on the code element: the sink's Out is a placeholder.
template <class In, class Err>
__global__ void __launch_bounds__(1024)
swizzled_quantize_group_params(const typename qp::FloatElement<In>::storage* __restrict__ x,
                               const qp::QgzOutputArgs out, const qp::SegmentLayout lay, float divisor,
                               const qp::SwizzleMap map) {
  typedef qp::SwizzleSource<In, Err, 1, false> S;
  const typename S::type src = S::make(x, out.error);
  const qp::QgzCodeSink<typename S::scan, qp::s8, Err, 1, false, false> sink{out, lay.q_min, lay.q_max, lay.mode, divisor};
  qp::qgz_group_params<typename S::scan>(src, sink, map, lay);
}

template <class In, class Err, class Out, bool HIGH_FIRST>
__global__ void __launch_bounds__(256)
swizzled_quantize_elements(const typename qp::FloatElement<In>::storage* __restrict__ x, const qp::QgzOutputArgs out,
                           const qp::SegmentLayout lay, float divisor, const qp::SwizzleMap map) {
  typedef qp::SwizzleSource<In, Err, 1, false> S;
  const typename S::type src = S::make(x, out.error);
  const qp::QgzCodeSink<typename S::scan, Out, Err, 1, false, HIGH_FIRST> sink{out, lay.q_min, lay.q_max, lay.mode, divisor};
  qp::qgz_elements<typename S::scan, qp::QuantElement<Out>::kind == 1>(src, sink, map, lay);
}

// The dense pass (qp_qgz.cuh: qgz_dense_quantize): 16-bit input, no LoCo buffer, groups of
// exactly team * 8 * NV elements, 16-byte aligned input. The parameters of
// swizzled_quantize_segments.
template <class In, class Out, bool HIGH_FIRST, int NV>
__global__ void __launch_bounds__(QP_QGZ_DENSE_BLOCK, QP_QGZ_DENSE_QUANTIZE_MIN_BLOCKS)
swizzled_quantize_dense(const typename qp::FloatElement<In>::storage* __restrict__ x, const qp::QgzOutputArgs out,
                        const qp::SegmentLayout lay, float divisor, const qp::SwizzleMap map) {
  qp::qgz_dense_quantize<In, Out, HIGH_FIRST, NV>(x, out, lay, divisor, map);
}
