// qp_philox.cuh: Philox4x32-10 (Random123's definition) and the per-element uniform stream of
// SPEC section 4, shared by every stochastic-rounding kernel.
//
//   key = (seed low 32, seed high 32), counter = (j low 32, j high 32, offset low 32, offset high 32),
//   j = i / 4 for flat element index i, word i % 4, u = (word >> 8) * 2^-24.
// quantplan/vocabulary/philox.py is the NumPy twin (tests compare the two bit for bit).
#pragma once
#include "qp_elements.cuh"

namespace qp {

struct Philox4 {
  u32 v[4];
};

// The four output words of a Philox call.
__device__ __forceinline__ Philox4 philox_words(u32 c0, u32 c1, u32 c2, u32 c3) {
  Philox4 out;
  out.v[0] = c0;
  out.v[1] = c1;
  out.v[2] = c2;
  out.v[3] = c3;
  return out;
}

__device__ __forceinline__ Philox4 philox4x32_10(u64 j, u64 offset, u64 seed) {
  u32 c0 = (u32)j, c1 = (u32)(j >> 32), c2 = (u32)offset, c3 = (u32)(offset >> 32);
  u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    const u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    const u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return philox_words(c0, c1, c2, c3);
}

// The same generator with the per-launch part of round 0 hoisted (a kernel draws every counter
// with one seed and offset): counter words 2 and 3 are the offset, so round 0's product
// mulhilo(0xCD9E8D57, offset low) and its xor with the key are constants of the stream.
// operator()(j) equals philox4x32_10(j, offset, seed) bit for bit (the same operations, the
// constant ones done once); five registers instead of recomputing one product per call.
struct PhiloxStream {
  u32 k0, k1, lo1_0, x0, x2;  // keys; round 0: lo(M1 * c2), hi(M1 * c2) ^ k0, c3 ^ k1

  __device__ __forceinline__ PhiloxStream(u64 seed, u64 offset) {
    k0 = (u32)seed;
    k1 = (u32)(seed >> 32);
    lo1_0 = 0xCD9E8D57u * (u32)offset;
    x0 = __umulhi(0xCD9E8D57u, (u32)offset) ^ k0;
    x2 = (u32)(offset >> 32) ^ k1;
  }

  __device__ __forceinline__ Philox4 operator()(u64 j) const {
    const u32 j0 = (u32)j;
    // round 0
    u32 c0 = x0 ^ (u32)(j >> 32);
    u32 c1 = lo1_0;
    u32 c2 = __umulhi(0xD2511F53u, j0) ^ x2;
    u32 c3 = 0xD2511F53u * j0;
    u32 a = k0, b = k1;
#pragma unroll
    for (int r = 1; r < 10; ++r) {
      a += 0x9E3779B9u;
      b += 0xBB67AE85u;
      const u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
      const u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
      c0 = hi1 ^ c1 ^ a;
      c1 = lo1;
      c2 = hi0 ^ c3 ^ b;
      c3 = lo0;
    }
    return philox_words(c0, c1, c2, c3);
  }
};

// u in [0, 1), a multiple of 2^-24 (exact in float and double).
__device__ __forceinline__ float philox_uniform(u32 word) { return (float)(word >> 8) * 5.9604644775390625e-08f; }

// The uniforms of VEC consecutive elements starting at flat index i0: one Philox call per four
// elements when i0 is a multiple of 4 (and VEC of 4), else one per element.
template <int VEC>
__device__ __forceinline__ void philox_uniforms(u64 i0, u64 seed, u64 offset, float (&u)[VEC]) {
  if (VEC % 4 == 0 && (i0 & 3) == 0) {
#pragma unroll
    for (int k = 0; k < VEC; k += 4) {
      const Philox4 w = philox4x32_10((i0 + k) >> 2, offset, seed);
#pragma unroll
      for (int t = 0; t < 4 && k + t < VEC; ++t) u[k + t] = philox_uniform(w.v[t]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const u64 i = i0 + k;
      const Philox4 w = philox4x32_10(i >> 2, offset, seed);
      const int t = (int)(i & 3);
      u[k] = philox_uniform(t == 0 ? w.v[0] : t == 1 ? w.v[1] : t == 2 ? w.v[2] : w.v[3]);
    }
  }
}

}  // namespace qp
