// Warpgroups (4 consecutive warps, the unit of wgmma) and the per-role tools that go with them:
// register reallocation between warpgroups and named barriers among a subset of the block's
// threads. Device-only C++.
#pragma once
#include <stdint.h>

namespace weft {

constexpr int kWarpgroupThreads = 128;

__device__ __forceinline__ int warpgroup_index() { return static_cast<int>(threadIdx.x) / kWarpgroupThreads; }
__device__ __forceinline__ int thread_in_warpgroup() { return static_cast<int>(threadIdx.x) % kWarpgroupThreads; }

// setmaxnreg (sm_90a): every warp of the warpgroup executes the same one, and the kernel needs a
// register cap at entry (__launch_bounds__(threads, 1)). Release registers in the producer
// warpgroup, claim them in the consumers; the total must fit the SM's register file.
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple of 32). Orders
// ordinary shared-memory accesses among the participants, like __syncthreads.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// named_barrier_sync that also returns, to every participant, whether any of them passed true.
__device__ __forceinline__ bool named_barrier_or(uint32_t id, uint32_t threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\tbar.red.or.pred q, %2, %3, p;\n\tselp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace weft
