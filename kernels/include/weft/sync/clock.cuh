// Clocks for bounds and timing: clock64() counts this SM's cycles (budgets are in these), the
// %globaltimer counts nanoseconds on the whole GPU (delays and reports).
#pragma once
#include <stdint.h>

namespace weft::sync {

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// Busy-waits `ns` nanoseconds (bounded by construction: the timer only moves forward).
__device__ __forceinline__ void spin_ns(uint64_t ns) {
  const uint64_t t0 = globaltimer_ns();
  while (globaltimer_ns() - t0 < ns) {
  }
}

}  // namespace weft::sync
