// qp_vector_io.cuh: aligned vector loads and stores of N bytes (N a power of two).
//
// A vector of N bytes moves as ceil(N/16) 16-byte words (or one 8/4/2/1-byte word), so a
// thread's VEC elements cost one or two memory instructions. Callers guarantee alignment.
#pragma once
#include "qp_elements.cuh"

namespace qp {

// A hint: fetch the line holding p into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <int BYTES> struct VectorWord;
template <> struct VectorWord<1> { typedef u8 type; };
template <> struct VectorWord<2> { typedef u16 type; };
template <> struct VectorWord<4> { typedef u32 type; };
template <> struct VectorWord<8> { typedef uint2 type; };
template <> struct VectorWord<16> { typedef uint4 type; };

// BYTES bytes viewed as words of at most 16 bytes.
template <int BYTES> struct ByteVector {
  static const int word_bytes = BYTES < 16 ? BYTES : 16;
  static const int words = BYTES / word_bytes;
  typedef typename VectorWord<word_bytes>::type word;
  union {
    word w[words];
    u8 b[BYTES];
  };
  __device__ __forceinline__ void load(const void* p) {
    const word* src = reinterpret_cast<const word*>(p);
#pragma unroll
    for (int i = 0; i < words; ++i) w[i] = src[i];
  }
  __device__ __forceinline__ void store(void* p) const {
    word* dst = reinterpret_cast<word*>(p);
#pragma unroll
    for (int i = 0; i < words; ++i) dst[i] = w[i];
  }
};

// VEC elements of storage type T, loaded and stored as one aligned vector when VECTOR_IO,
// or one element at a time (with a bound) otherwise.
template <class T, int VEC> struct ElementVector {
  union {
    ByteVector<sizeof(T) * VEC> bytes;
    T v[VEC];
    u32 words[(sizeof(T) * VEC + 3) / 4];  // 32-bit view (e.g. two 16-bit elements per word)
  };
  __device__ __forceinline__ ElementVector() {}
  template <bool VECTOR_IO>
  __device__ __forceinline__ void load(const T* p, int valid) {
    if (VECTOR_IO) {
      bytes.load(p);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[k] = (k < valid) ? p[k] : T(0);
    }
  }
  // Aligned vector I/O of the dense kernels (the default cache policy).
  __device__ __forceinline__ void load_dense(const T* p) { bytes.load(p); }
  __device__ __forceinline__ void store_dense(T* p) const { bytes.store(p); }
  template <bool VECTOR_IO>
  __device__ __forceinline__ void store(T* p, int valid) const {
    if (VECTOR_IO) {
      bytes.store(p);
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (k < valid) p[k] = v[k];
    }
  }
};

// The NV 8-element vectors of lane `lane` of a team of `team` threads over a segment xs: columns
// (lane + w * team) * 8 for w < NV, each loaded as one aligned vector; fn(col, xv).
template <int NV, class T, class Fn>
__device__ __forceinline__ void for_each_team_vector8(const T* xs, int lane, int team, Fn fn) {
  for (int w = 0; w < NV; ++w) {
    const int col = (lane + w * team) * 8;
    ElementVector<T, 8> xv;
    xv.template load<true>(xs + col, 8);
    fn(col, xv);
  }
}

// A vector of floats rounded from accumulator values: 16-bit floats two per conversion.
template <class In, int VEC>
__device__ __forceinline__ ElementVector<typename FloatElement<In>::storage, VEC> vector_from_acc(
    const typename FloatElement<In>::acc (&vals)[VEC]) {
  typedef FloatElement<In> FE;
  ElementVector<typename FE::storage, VEC> out;
  if constexpr (FE::has_pair && VEC % 2 == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 2) out.words[k / 2] = FE::pair_from_acc(vals[k], vals[k + 1]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = FE::from_acc(vals[k]);
  }
  return out;
}

}  // namespace qp
