// Intra-SM synchronization through shared-memory mbarrier objects (sm_90), with a bounded wait.
// Used for the intra-SM latency reference; warps of one block hand off through it without leaving
// the SM. mbarrier.arrive has release semantics and a successful try_wait acquire semantics, at
// CTA scope. (The asm here is mbarrier operations, not free-standing ordering; fences live in
// memory_order.cuh.)
#pragma once
#include <stdint.h>
#include "weft/sync.h"
#include "weft/sync/clock.cuh"
#include "weft/sync/error.cuh"

namespace weft::sync {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// `count` arrivals complete a phase. Make the init visible (__syncthreads()) before any use.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared::cta.b64 state, [%0];\n\t}" ::"r"(smem_addr(bar))
               : "memory");
}

// True once the phase with parity `parity` has completed.
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits for the phase of parity `parity` to complete, bounded by `bound`; on expiry reports
// MBARRIER_WAIT (expected = parity, observed = the raw mbarrier word, coord = `coord`) and traps.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity, const weft_sync_bound& bound, int32_t rank,
                                              weft_tile_coord coord) {
  if (mbarrier_try_wait_parity(bar, parity)) return;
  const long long c0 = clock64();
  const uint64_t t0 = globaltimer_ns();
  while (!mbarrier_try_wait_parity(bar, parity)) {
    const uint64_t spent = uint64_t(clock64() - c0);
    if (spent > bound.budget_cycles) {
      failure f{};
      f.status = WEFT_SYNC_STATUS_TIMEOUT;
      f.primitive = WEFT_SYNC_PRIM_MBARRIER_WAIT;
      f.target_rank = rank;
      f.coord = coord;
      f.expected = parity;
      f.observed = *reinterpret_cast<volatile uint64_t*>(bar);
      f.elapsed_cycles = spent;
      f.elapsed_ns = globaltimer_ns() - t0;
      fail(bound, rank, f);
    }
  }
}

}  // namespace weft::sync
