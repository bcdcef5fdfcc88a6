// qp_team.cuh: reductions over a team of 1 << team_log2 consecutive threads of a block (a
// power of two up to the block size), in a fixed order: the same inputs give the same result
// bits on every run, whatever the grid.
//
//   team_reduce(v, team_log2, slots, warp_reduce)   generic: warp_reduce(v, width) is a butterfly
//                                                   over `width` lanes (xor shuffles)
//   team_sum2(a, b, team_log2, slots)               two double sums at once
// Teams within a warp combine by shuffles only; larger teams publish one value per warp in
// `slots` (shared memory, one per warp of the block) and every warp of the team combines its
// team's slots, one per lane, by shuffles again. Every thread of the block must call it (it
// holds barriers when a team spans warps); every thread of a team ends with the team's value.
#pragma once
#include "qp_elements.cuh"

namespace qp {

template <class T, class WarpReduce>
__device__ __forceinline__ void team_reduce(T& v, int team_log2, T* slots, WarpReduce warp_reduce) {
  warp_reduce(v, min(1 << team_log2, 32));
  if (team_log2 <= 5) return;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // the previous segment's readers are done with the slots
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  const int warps = 1 << (team_log2 - 5);
  v = slots[(warp & ~(warps - 1)) + (lane & (warps - 1))];  // each run of `warps` lanes: every slot once
  warp_reduce(v, warps);
}

struct DoublePair {
  double a, b;
};

// Butterfly sum over `width` lanes: lanes i and i ^ d add the same two values, so every lane
// of the group ends with the same bits.
__device__ __forceinline__ void shuffle_sum2(DoublePair& v, int width) {
  for (int d = width >> 1; d > 0; d >>= 1) {
    v.a += __shfl_xor_sync(0xFFFFFFFFu, v.a, d);
    v.b += __shfl_xor_sync(0xFFFFFFFFu, v.b, d);
  }
}

__device__ __forceinline__ void team_sum2(DoublePair& v, int team_log2, DoublePair* slots) {
  team_reduce(v, team_log2, slots, [](DoublePair& p, int width) { shuffle_sum2(p, width); });
}

}  // namespace qp
