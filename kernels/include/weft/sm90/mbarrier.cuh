// Shared-memory mbarriers (sm_90): the one set of wrappers every weft kernel uses, for TMA
// completion (tma/bulk_copy.cuh) and for intra-SM hand-offs (sync/mbarrier_wait.cuh). Device-only C++.
// mbarrier.arrive has release semantics and a successful try_wait acquire semantics, at CTA scope.
#pragma once
#include <stdint.h>

namespace weft {

// The shared-state-space address of a generic pointer into this CTA's shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initialise `bar` for `arrivals` arrivals per phase; the current phase is phase 0 (parity 0).
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes preceding mbarrier inits visible to the async proxy (and to the cluster) before any bulk
// copy signals them. One CTA is a cluster of one, so the cluster form is valid without clusters.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Arrives once (release, CTA scope) and raises the current phase's expected transaction count by
// `bytes`; the phase completes when every arrival is in and `bytes` more have been completed by
// complete_tx. Issue it before the bulk copy that completes the bytes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// True once the phase of parity `parity` has completed (acquire, CTA scope: data the completing
// operations wrote to shared memory is visible to this thread afterwards). May suspend briefly.
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n"
      " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits for the phase of parity `parity`, at most `budget_cycles` SM clock cycles; false when the
// budget ran out (the caller reports and traps: waits in weft are bounded).
__device__ __forceinline__ bool mbar_wait_bounded(uint64_t* bar, uint32_t parity, uint64_t budget_cycles) {
  if (mbar_try_wait(bar, parity)) return true;
  const uint64_t start = clock64();
  while (!mbar_try_wait(bar, parity)) {
    if (static_cast<uint64_t>(clock64()) - start > budget_cycles) return false;
  }
  return true;
}

// Arrives once (release, CTA scope) on `bar`.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n\t.reg .b64 state;\n\tmbarrier.arrive.shared::cta.b64 state, [%0];\n\t}" ::"r"(smem_addr(bar)) : "memory");
}

}  // namespace weft
