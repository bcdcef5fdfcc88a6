// qp_row_shares.cuh: the loads of the row-shares kernels (dynamic_quantize_row_shares,
// dynamic_fake_quantize_row_shares): a row of BLOCKS shares, one per block, every block reading
// all of it, one 16-byte vector per share and thread.
//
// QP_SHARES_LOADS (a tuning knob, set through QUANTPLAN_NVRTC_OPTIONS): 1 (the default) loads the
// row's vectors in order at constant offsets from one address (the loads issue from the 9th
// instruction, sm_90 SASS) and selects the own vector afterwards; 0 loads the own share's vector
// first, then the other shares' vectors, each at an address computed from the block's share (the
// loads from the 21st instruction). Measured on H200, 16 x 8192 f16 (bench_small_floors and
// bench_peers, alternating processes): per-token S8 the same (4.10-4.22 us either way), the MoQ
// row 4.22 / 4.37 us against 4.26-4.35 / 4.48 us.
#pragma once
#include "qp_elements.cuh"

#ifndef QP_SHARES_LOADS
#define QP_SHARES_LOADS 1
#endif

namespace qp {

// The BLOCKS vectors of a thread in a row of BLOCKS shares of THREADS vectors each (`row`: the
// thread's vector of share 0) into v, in an order that puts share j in v[j] when part == 0, and
// the vector of share `part` returned. `load` reads one vector.
template <int BLOCKS, int THREADS, class Load>
__device__ __forceinline__ uint4 load_row_shares(const uint4* row, u32 part, uint4 (&v)[BLOCKS], Load load) {
  if constexpr (QP_SHARES_LOADS == 0) {
#pragma unroll
    for (int j = 0; j < BLOCKS; ++j) v[j] = load(row + ((part + j) & (BLOCKS - 1)) * THREADS);
    return v[0];
  } else {
#pragma unroll
    for (int j = 0; j < BLOCKS; ++j) v[j] = load(row + j * THREADS);
    uint4 own = v[0];
#pragma unroll
    for (int k = 1; k < BLOCKS; ++k)
      if (part == (u32)k) own = v[k];
    return own;
  }
}

}  // namespace qp
