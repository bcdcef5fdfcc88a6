// dequant_reduce.cu: DequantReducePlan (ZeRO++ qgZ): dequantize N peers' chunks, sum in float32
// in peer order, optionally average, then re-quantize with fresh group parameters (optional LoCo
// error feedback), or write the float sum (qp_qgz.cuh: PeerSumSource).
//
//   dequant_reduce_segments      one read: a team holds each output group (up to 32768 elements)
//   dequant_reduce_group_params  any output group size, pass 1: the parameters of every group
//   dequant_reduce_elements      any output group size, pass 2: codes (and the error update)
//   dequant_reduce_floats        float output: the sum (averaged) rounded once to Out
//   dequant_reduce_dense         the hot layout (SYMMETRIC, no LoCo, aligned, groups of team *
//                                EPT elements): EPT elements per thread, PEERS unrolled (0: any N)
// Code: the input code element; Out: the output code (or float) element; Err: the LoCo buffer's
// float or qp::no_error. 4-bit codes on both sides share one nibble order (HIGH_FIRST).
#include "qp_qgz.cuh"

template <class Code, class Err, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
__global__ void __launch_bounds__(QP_QGZ_SEGMENT_BOUND)
dequant_reduce_segments(const qp::PeerSumArgs in, const qp::QgzOutputArgs out, const qp::SegmentLayout lay,
                        float divisor) {
  typedef qp::PeerSumSource<Code, Err, VEC, VECTOR_IO, HIGH_FIRST> Source;
  const Source src{in, reinterpret_cast<const typename Source::err_t*>(out.error)};
  const qp::QgzCodeSink<qp::f32, Out, Err, VEC, VECTOR_IO, HIGH_FIRST> sink{out, lay.q_min, lay.q_max, lay.mode, divisor};
  qp::qgz_fused_segments<qp::f32, VEC>(src, sink, qp::SameGroups(), lay);
}

template <class Code, class Out, int EPT, bool HIGH_FIRST, int PEERS>
__global__ void __launch_bounds__(QP_REDUCE_DENSE_BLOCK, QP_REDUCE_DENSE_MIN_BLOCKS)
dequant_reduce_dense(const qp::PeerSumArgs in, const qp::QgzOutputArgs out, const qp::SegmentLayout lay,
                     float divisor) {
  qp::dense_reduce<Code, Out, EPT, HIGH_FIRST, PEERS>(in, out, lay, divisor);
}

// The parameters do not depend on the output code element: the sink's Out is a placeholder.
template <class Code, class Err, bool HIGH_FIRST>
__global__ void __launch_bounds__(1024)
dequant_reduce_group_params(const qp::PeerSumArgs in, const qp::QgzOutputArgs out, const qp::SegmentLayout lay,
                            float divisor) {
  typedef qp::PeerSumSource<Code, Err, 1, false, HIGH_FIRST> Source;
  const Source src{in, reinterpret_cast<const typename Source::err_t*>(out.error)};
  const qp::QgzCodeSink<qp::f32, qp::s8, Err, 1, false, false> sink{out, lay.q_min, lay.q_max, lay.mode, divisor};
  qp::qgz_group_params<qp::f32>(src, sink, qp::SameGroups(), lay);
}

template <class Code, class Err, class Out, bool HIGH_FIRST>
__global__ void __launch_bounds__(256)
dequant_reduce_elements(const qp::PeerSumArgs in, const qp::QgzOutputArgs out, const qp::SegmentLayout lay,
                        float divisor) {
  typedef qp::PeerSumSource<Code, Err, 1, false, HIGH_FIRST> Source;
  const Source src{in, reinterpret_cast<const typename Source::err_t*>(out.error)};
  const qp::QgzCodeSink<qp::f32, Out, Err, 1, false, HIGH_FIRST> sink{out, lay.q_min, lay.q_max, lay.mode, divisor};
  qp::qgz_elements<qp::f32, qp::QuantElement<Out>::kind == 1>(src, sink, qp::SameGroups(), lay);
}

// Float output: n elements, VEC per step (VEC divides the input group size).
template <class Code, class Out, int VEC, bool VECTOR_IO, bool HIGH_FIRST>
__global__ void __launch_bounds__(256)
dequant_reduce_floats(const qp::PeerSumArgs in, typename qp::FloatElement<Out>::storage* __restrict__ y, qp::i64 n) {
  const qp::PeerSumSource<Code, qp::no_error, VEC, VECTOR_IO, HIGH_FIRST> src{in, nullptr};
  qp::qgz_float_values<Out, VEC, VECTOR_IO>(src, y, n);
}
