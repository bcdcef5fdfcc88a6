// qp_packing.cuh: two 4-bit codes per byte.
//
// LOW_FIRST (HIGH_FIRST = false): element 2i in bits 0-3, element 2i+1 in bits 4-7, as PyTorch
// float4_e2m1fn_x2 and CUTLASS. HIGH_FIRST: element 2i in bits 4-7, as DeepSpeed and bitsandbytes.
// Signed codes are stored as 4-bit two's complement.
#pragma once
#include "qp_elements.cuh"

namespace qp {

template <bool HIGH_FIRST>
__device__ __forceinline__ u8 pack_nibbles(int even_code, int odd_code) {
  const u32 e = (u32)even_code & 0xFu, o = (u32)odd_code & 0xFu;
  return HIGH_FIRST ? (u8)((e << 4) | o) : (u8)((o << 4) | e);
}

template <bool HIGH_FIRST, bool SIGNED>
__device__ __forceinline__ int unpack_nibble(u8 byte, int which /* 0 = even element */) {
  const int shift = ((which == 0) == HIGH_FIRST) ? 4 : 0;
  const int code = (byte >> shift) & 0xF;
  return SIGNED ? ((code ^ 8) - 8) : code;
}

}  // namespace qp
