// deepspeed_format.cu: the DeepSpeed-format plans of quantplan.compat (quantize / swizzle_quant /
// loco_swizzle_quant, quantized_reduction / loco_quantized_reduction, asymmetric dequantize, MoQ
// fake quantization), on the qgZ loops of qp_qgz.cuh with the sinks of qp_deepspeed_format.cuh.
//
//   deepspeed_quantize_segments / _group_params / _elements   (swizzled) group quantization
//   deepspeed_reduce_segments / _group_params / _elements     dequantize N peers, sum, re-quantize
//   deepspeed_dequantize                                      codes -> floats (q * p0 (+ p1))
//   moq_fake_quantize_segments / _group_params / _elements    MoQ fake quantization
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
  typedef qp::PeerSumSource<Code, Err, VEC, VECTOR_IO, true, qp::DeepSpeedPeerDecode> Source;
  const Source src{in, reinterpret_cast<const typename Source::err_t*>(out.error)};
  const qp::DeepSpeedCodeSink<qp::f32, Code, Err, VEC, VECTOR_IO> sink{out};
  qp::qgz_fused_segments<qp::f32, VEC>(src, sink, qp::SameGroups(), lay);
}

template <class Code, class Err>
__global__ void __launch_bounds__(1024)
deepspeed_reduce_group_params(const qp::PeerSumArgs in, const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay) {
  typedef qp::PeerSumSource<Code, Err, 1, false, true, qp::DeepSpeedPeerDecode> Source;
  const Source src{in, reinterpret_cast<const typename Source::err_t*>(out.error)};
  const qp::DeepSpeedCodeSink<qp::f32, Code, Err, 1, false> sink{out};
  qp::qgz_group_params<qp::f32>(src, sink, qp::SameGroups(), lay);
}

template <class Code, class Err>
__global__ void __launch_bounds__(256)
deepspeed_reduce_elements(const qp::PeerSumArgs in, const qp::DeepSpeedOutputArgs out, const qp::SegmentLayout lay) {
  typedef qp::PeerSumSource<Code, Err, 1, false, true, qp::DeepSpeedPeerDecode> Source;
  const Source src{in, reinterpret_cast<const typename Source::err_t*>(out.error)};
  const qp::DeepSpeedCodeSink<qp::f32, Code, Err, 1, false> sink{out};
  qp::qgz_elements<qp::f32, qp::QuantElement<Code>::kind == 1>(src, sink, qp::SameGroups(), lay);
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
