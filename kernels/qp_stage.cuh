// qp_stage.cuh: staging global memory in shared memory without registers (cp.async, sm_80+).
//
// A thread copies its own 16-byte words global -> shared, waits for its copies, and reads them
// back when needed: nothing is held in registers while the data is in flight or while the block
// reduces over it (the fused fake-quantization passes of fake_quantize.cu).
#pragma once
#include "qp_elements.cuh"

namespace qp {

// 16 bytes global -> shared (both 16-byte aligned), bypassing L1 (.cg).
__device__ __forceinline__ void stage_16(void* smem, const void* gmem) {
  const u32 dst = (u32)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}

// Wait for every copy this thread issued (after it, the thread may read its staged words).
__device__ __forceinline__ void stage_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Close the group of copies issued since the last commit (an empty group is allowed).
__device__ __forceinline__ void stage_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight (the older ones
// have landed): with two buffers, stage_wait_prior<1>() waits for the current one only.
template <int N> __device__ __forceinline__ void stage_wait_prior() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace qp
