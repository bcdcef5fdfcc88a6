// qp_vector_io.cuh: aligned vector loads and stores of N bytes (N a power of two).
//
// A vector of N bytes moves as ceil(N/16) 16-byte words (or one 8/4/2/1-byte word), so a
// thread's VEC elements cost one or two memory instructions. Callers guarantee alignment.
#pragma once
#include "qp_elements.cuh"

namespace qp {

// A hint: fetch the line holding p into L2 (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Cache policies of a streamed operand (the dense kernels' QP_DENSE_LOAD_MODE / QP_DENSE_STORE_MODE):
// the default (0), evict-first (ld.global.cs / st.global.cs: 1), and for 16-byte loads the
// read-only path without L1 allocation and with a 256-byte L2 prefetch (2). Measured on H200
// (8192 x 8192, 16-bit, the dense quantize / dequantize / fake-quant rows): both load policies are
// slower (quantize backward 98.2 -> 111.6 / 114.4 us, fake per-channel 69.8 -> 73.8 / 73.9 us,
// dequantize per-token int8 within 1%), evict-first stores within 1% either way: plain by default.
enum StreamMode { kStreamDefault = 0, kStreamEvictFirst = 1, kStreamNoL1Prefetch = 2 };
#ifndef QP_DENSE_LOAD_MODE
#define QP_DENSE_LOAD_MODE 0
#endif
#ifndef QP_DENSE_STORE_MODE
#define QP_DENSE_STORE_MODE 0
#endif

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
  // Cache-policy variants (StreamMode): MODE 0 is load() / store().
  template <int MODE> __device__ __forceinline__ void load_mode(const void* p) {
    const word* src = reinterpret_cast<const word*>(p);
    if constexpr (MODE == kStreamEvictFirst) {
#pragma unroll
      for (int i = 0; i < words; ++i) w[i] = __ldcs(src + i);
    } else if constexpr (MODE == kStreamNoL1Prefetch && word_bytes == 16) {
#pragma unroll
      for (int i = 0; i < words; ++i) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(src + i));
        w[i] = v;
      }
    } else {
      load(p);
    }
  }
  template <int MODE> __device__ __forceinline__ void store_mode(void* p) const {
    word* dst = reinterpret_cast<word*>(p);
    if constexpr (MODE == kStreamEvictFirst) {
#pragma unroll
      for (int i = 0; i < words; ++i) __stcs(dst + i, w[i]);
    } else {
      store(p);
    }
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
  // Aligned vector I/O under the dense kernels' cache policies (StreamMode).
  __device__ __forceinline__ void load_dense(const T* p) { bytes.template load_mode<QP_DENSE_LOAD_MODE>(p); }
  __device__ __forceinline__ void store_dense(T* p) const { bytes.template store_mode<QP_DENSE_STORE_MODE>(p); }
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
