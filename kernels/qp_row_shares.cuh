// qp_row_shares.cuh: the loads of the row-shares kernels (dynamic_quantize_row_shares,
// dynamic_fake_quantize_row_shares): a row of BLOCKS shares, one per block, every block reading
// all of it, one 16-byte vector per share and thread. The row's vectors load in order at constant
// offsets from one address (so the loads issue early: no address depends on the block's share),
// and the block's own vector is selected afterwards.
#pragma once
#include "qp_elements.cuh"

namespace qp {

// The BLOCKS vectors of a thread in a row of BLOCKS shares of THREADS vectors each (`row`: the
// thread's vector of share 0) into v, in an order that puts share j in v[j] when part == 0, and
// the vector of share `part` returned. `load` reads one vector.
template <int BLOCKS, int THREADS, class Load>
__device__ __forceinline__ uint4 load_row_shares(const uint4* row, u32 part, uint4 (&v)[BLOCKS], Load load) {
#pragma unroll
  for (int j = 0; j < BLOCKS; ++j) v[j] = load(row + j * THREADS);
  uint4 own = v[0];
#pragma unroll
  for (int k = 1; k < BLOCKS; ++k)
    if (part == (u32)k) own = v[k];
  return own;
}

}  // namespace qp
