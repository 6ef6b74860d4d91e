// wait: poll a counter until it reaches a target, bounded by the counters' cycle budget.
//
// Consumer side of a signal: wait() returns once the counter is >= `expected`, and its acquire
// load orders every later load and store of the calling thread after the producers' release
// signals that brought the counter there, so the data they wrote before signalling is visible.
// When other threads of the block read that data, make them wait for the polling thread with a
// __syncthreads() (bar.sync extends the ordering to the block).
//
// Targets are monotonic: counters only rise, so waiting for ">= expected" stays correct when a
// fast producer has already added the next round's signal (see README.md, "epochs").
//
// Bounded: after bound.budget_cycles SM cycles the thread records rank, primitive, coordinate,
// expected and observed value in the error slot and traps (error.cuh).
#pragma once
#include <stdint.h>
#include "weft/abi/sync.h"
#include "weft/sync/clock.cuh"
#include "weft/sync/counter.cuh"
#include "weft/sync/error.cuh"
#include "weft/sync/memory_order.cuh"

namespace weft::sync {

// Where a wait is, for its give-up report: the waiting rank, the primitive it reports as
// (WEFT_SYNC_PRIM_*), the rank whose flag or counter it polls, the site's coordinate and the part
// of the kernel that waits (WEFT_ROLE_*; none by default).
struct WaitSite {
  int32_t rank;
  int32_t primitive;
  int32_t target_rank;
  weft_tile_coord coord;
  uint32_t role = WEFT_ROLE_NONE;
};

namespace detail {

struct AcquireSys {
  __device__ __forceinline__ uint64_t operator()(const uint64_t* p) const { return mo::ld_acquire_sys(p); }
};
struct AcquireGpu {
  __device__ __forceinline__ uint64_t operator()(const uint64_t* p) const { return mo::ld_acquire_gpu(p); }
};
struct RelaxedSys {
  __device__ __forceinline__ uint64_t operator()(const uint64_t* p) const { return mo::ld_relaxed_sys(p); }
};

// Polls `counter` with `load` until it is >= expected; past bound.budget_cycles reports `site`
// and traps.
template <typename Load>
__device__ __forceinline__ uint64_t spin_until(const uint64_t* counter, uint64_t expected, const weft_sync_bound& bound,
                                               const WaitSite& site, Load load) {
  uint64_t v = load(counter);
  if (v >= expected) return v;
  const long long c0 = clock64();
  const uint64_t t0 = globaltimer_ns();
  for (;;) {
    v = load(counter);
    if (v >= expected) return v;
    const uint64_t spent = uint64_t(clock64() - c0);
    if (spent > bound.budget_cycles) {
      failure f{};
      f.status = WEFT_SYNC_STATUS_TIMEOUT;
      f.primitive = site.primitive;
      f.role = site.role;
      f.target_rank = site.target_rank;
      f.coord = site.coord;
      f.expected = expected;
      f.observed = v;
      f.elapsed_cycles = spent;
      f.elapsed_ns = globaltimer_ns() - t0;
      fail(bound, site.rank, f);
    }
  }
}

}  // namespace detail

// The scope of a flag wait's acquire: Gpu for producers on this GPU's SMs, Sys for producers on
// another GPU or a stream memory operation.
enum class FlagScope { Gpu, Sys };

// Waits until the flag at `flag` (any u64 in device or peer memory, not a counters PGL's slot:
// those have wait() / wait_gpu()) is >= expected, with an acquire at `kScope`; returns the value
// seen. Bounded: past bound.budget_cycles it records the site, expected and observed value in
// the error slot and traps.
template <FlagScope kScope>
__device__ __forceinline__ uint64_t wait_flag(const uint64_t* flag, uint64_t expected, const weft_sync_bound& bound,
                                              const WaitSite& site) {
  if constexpr (kScope == FlagScope::Gpu) {
    return detail::spin_until(flag, expected, bound, site, detail::AcquireGpu{});
  } else {
    return detail::spin_until(flag, expected, bound, site, detail::AcquireSys{});
  }
}

// Waits until `rank`'s counter at `coord` is >= expected (acquire, system scope), returns the value
// seen. `rank` is usually bar.view.rank: signals are pushed to the waiter's own memory, so the
// poll stays local; polling a peer's counter works too, at NVLink latency per poll.
__device__ __forceinline__ uint64_t wait(const weft_sync_counters& bar, weft_tile_coord coord, int32_t rank,
                                         uint64_t expected) {
  const uint64_t* c = counter_or_trap(bar, coord, rank, WEFT_SYNC_PRIM_WAIT);
  return detail::spin_until(c, expected, bar.bound, WaitSite{bar.view.rank, WEFT_SYNC_PRIM_WAIT, rank, coord},
                            detail::AcquireSys{});
}

// GPU scope: waits on this rank's own counter for signals from other SMs of the same GPU
// (signal_gpu). Cheaper than wait(); does not order against other GPUs' writes.
__device__ __forceinline__ uint64_t wait_gpu(const weft_sync_counters& bar, weft_tile_coord coord, uint64_t expected) {
  const uint64_t* c = counter_or_trap(bar, coord, bar.view.rank, WEFT_SYNC_PRIM_WAIT_GPU);
  return detail::spin_until(c, expected, bar.bound, WaitSite{bar.view.rank, WEFT_SYNC_PRIM_WAIT_GPU, bar.view.rank, coord},
                            detail::AcquireGpu{});
}

namespace unordered {

// Relaxed poll with no acquire: the data a producer wrote before signalling is NOT guaranteed
// visible afterwards. For negative controls, or for callers that issue mo::fence_acq_rel_sys()
// themselves after the wait returns (which turns it into an acquire pattern).
__device__ __forceinline__ uint64_t wait(const weft_sync_counters& bar, weft_tile_coord coord, int32_t rank,
                                         uint64_t expected) {
  const uint64_t* c = counter_or_trap(bar, coord, rank, WEFT_SYNC_PRIM_WAIT_UNORDERED);
  return detail::spin_until(c, expected, bar.bound, WaitSite{bar.view.rank, WEFT_SYNC_PRIM_WAIT_UNORDERED, rank, coord},
                            detail::RelaxedSys{});
}

}  // namespace unordered
}  // namespace weft::sync
