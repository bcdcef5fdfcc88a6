// qp_quantize_vector.cuh: the codes of one thread-vector of floats under one parameter, and
// their store (bytes, or nibbles packed two per byte). Shared by quantize.cu (static
// parameters) and dynamic_range.cu (parameters from the data, fused single pass).
//
//   integer codes: clamp(rne(x / scale) + zp, q_min, q_max)     (NaN -> zp, +-Inf clamp)
//   FP8 codes:     fp8_rne_saturate(x / scale)                   (NaN -> 0x7F)
// `inside` / `inside_mask`: the straight-through mask of the same codes (quantize backward).
// `zero_fp8` (dynamic range: the NaN scale of a non-finite segment) makes every FP8 code 0.
// STOCHASTIC codes take the Philox uniforms of the elements (qp_philox.cuh).
#pragma once
#include "qp_elements.cuh"
#include "qp_vector_io.cuh"
#include "qp_packing.cuh"
#include "qp_rounding.cuh"
#include "qp_philox.cuh"

namespace qp {

template <class In, class Out, int VEC, bool HIGH_FIRST>
struct VectorQuantizer {
  typedef FloatElement<In> FE;
  typedef typename FE::storage in_t;
  typedef typename FE::acc acc_t;
  typedef ElementVector<in_t, VEC> vector_t;
  static const int kind = QuantElement<Out>::kind;
  static const bool packed = (kind == 1);
  static const int out_bytes = packed ? VEC / 2 : VEC;

  // One element, exact path included.
  static __device__ __forceinline__ int code(acc_t v, const IntQuantParam<acc_t>& p, int q_min, int q_max,
                                             bool zero_fp8) {
    if constexpr (kind == 2) return zero_fp8 ? 0 : quantize_fp8_code<Out>(v, p);
    return quantize_int_code(v, p, q_min, q_max);
  }

  static __device__ __forceinline__ int stochastic_code(acc_t v, const IntQuantParam<acc_t>& p, int q_min, int q_max,
                                                        bool zero_fp8, float u) {
    if constexpr (kind == 2) return zero_fp8 ? 0 : quantize_fp8_code_stochastic<Out>(v, p.scale, u);
    return quantize_int_code_stochastic(v, p.scale, p.zp, q_min, q_max, u);
  }

  // All VEC codes under one parameter: the division-free path for the whole vector with one
  // branch, and the per-element division for the rare vector it does not cover (a quotient
  // of 2^21 or more, NaN, Inf, a scale outside [2^-60, 2^100]; a NaN scale is never `fast`,
  // so zero_fp8 takes that path).
  static __device__ __forceinline__ void codes(const vector_t& xv, const IntQuantParam<acc_t>& p, int q_min,
                                               int q_max, bool zero_fp8, int (&c)[VEC]) {
    bool ok = false;
    if constexpr (sizeof(acc_t) == 4) ok = fast_codes(xv, p, q_min, q_max, c);
    if (!ok) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) c[k] = code(FE::to_acc(xv.v[k]), p, q_min, q_max, zero_fp8);
    }
  }

  // The division-free half of `codes` alone (float accumulators): true when every code of the
  // vector is final, false when the vector must take `codes` (its codes are then meaningless).
  // Callers keep the exact path out of line (the dense row kernels re-read the vector there).
  static __device__ __forceinline__ bool fast_codes(const vector_t& xv, const IntQuantParam<float>& p, int q_min,
                                                    int q_max, int (&c)[VEC]) {
    bool ok = p.fast;
    if constexpr (kind == 2) {
#if __CUDA_ARCH__ >= 890 && !defined(QP_FP8_SOFTWARE)
      // Quotients first, then one hardware conversion per pair (no NaN where ok holds).
      float qv[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) qv[k] = quotient_fast(FE::to_acc(xv.v[k]), p, ok);
#pragma unroll
      for (int k = 0; k < VEC; k += 2) {
        const u16 pair = Fp8Element<Out>::pair_from_f32(qv[k], k + 1 < VEC ? qv[k + 1] : 0.0f);
        c[k] = pair & 0xFFu;
        if (k + 1 < VEC) c[k + 1] = pair >> 8;
      }
#else
#pragma unroll
      for (int k = 0; k < VEC; ++k) c[k] = quantize_fp8_code_fast<Out>(FE::to_acc(xv.v[k]), p, ok);
#endif
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) c[k] = quantize_int_code_fast(FE::to_acc(xv.v[k]), p, q_min, q_max, ok);
    }
    return ok;
  }

  // The division-free half of `inside_mask` alone, as fast_codes.
  static __device__ __forceinline__ bool fast_inside_mask(const vector_t& xv, const IntQuantParam<float>& p,
                                                          int q_min, int q_max, bool (&m)[VEC]) {
    bool ok = p.fast;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      if constexpr (kind == 2) {
        m[k] = quantize_fp8_inside_fast<Out>(FE::to_acc(xv.v[k]), p, ok);
      } else {
        m[k] = quantize_int_inside_fast(FE::to_acc(xv.v[k]), p, q_min, q_max, ok);
      }
    }
    return ok;
  }

  // The straight-through mask of one element (quantize backward): the pre-clamp code of `code`
  // inside [q_min, q_max], FP8: |v / scale| <= max; NaN and +-Inf outside (qp_rounding.cuh).
  static __device__ __forceinline__ bool inside(acc_t v, const IntQuantParam<acc_t>& p, int q_min, int q_max) {
    if constexpr (kind == 2) return quantize_fp8_inside<Out>(v, p);
    return quantize_int_inside(v, p, q_min, q_max);
  }

  // All VEC masks under one parameter, as `codes`: the division-free path for the whole vector,
  // the per-element division for the rare vector it does not cover.
  static __device__ __forceinline__ void inside_mask(const vector_t& xv, const IntQuantParam<acc_t>& p, int q_min,
                                                     int q_max, bool (&m)[VEC]) {
    bool ok = false;
    if constexpr (sizeof(acc_t) == 4) ok = fast_inside_mask(xv, p, q_min, q_max, m);
    if (!ok) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) m[k] = inside(FE::to_acc(xv.v[k]), p, q_min, q_max);
    }
  }

  // Stochastic codes of the VEC elements whose flat indices start at i0.
  static __device__ __forceinline__ void stochastic_codes(const vector_t& xv, const IntQuantParam<acc_t>& p, int q_min,
                                                          int q_max, bool zero_fp8, u64 i0, u64 seed, u64 offset,
                                                          int (&c)[VEC]) {
    float uni[VEC];
    philox_uniforms<VEC>(i0, seed, offset, uni);
#pragma unroll
    for (int k = 0; k < VEC; ++k) c[k] = stochastic_code(FE::to_acc(xv.v[k]), p, q_min, q_max, zero_fp8, uni[k]);
  }

  // Store the first `valid` codes at dst (the byte of code 0; packed: code 0 is an even element,
  // and an odd `valid` pads its last byte with a zero nibble).
  template <bool VECTOR_IO>
  static __device__ __forceinline__ void store(u8* dst, int valid, const int (&c)[VEC]) {
    ElementVector<u8, out_bytes> out;
    if constexpr (packed) {
#pragma unroll
      for (int k = 0; k < VEC; k += 2) out.v[k / 2] = pack_nibbles<HIGH_FIRST>(c[k], k + 1 < valid ? c[k + 1] : 0);
      out.template store<VECTOR_IO>(dst, (valid + 1) / 2);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = (u8)c[k];
      out.template store<VECTOR_IO>(dst, valid);
    }
  }
};

}  // namespace qp
