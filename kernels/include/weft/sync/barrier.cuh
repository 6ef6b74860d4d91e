// barrier: every rank arrives, then waits until all have, at one counter coordinate.
//
// Arrival = signal_all(+1) (release, system scope); passing = wait for the rank's own counter to
// reach world * epoch (acquire). So everything any rank wrote before its arrival is visible to
// every rank after it passes. `epoch` counts the barriers completed at this coordinate since the
// counters were zeroed, starting at 1; kernels get their first epoch from the host (Counters keeps
// it across launches), so no memset is needed between uses. A fast rank that passes barrier k and
// arrives at k + 1 adds to the counters early; the others still pass k since the targets only
// compare >= (the counter may read world * k + 1 there), and nobody passes k + 1 before every
// rank has begun arriving at k + 1. A fast rank's early add can even complete a slower rank's
// count for k before a third rank's add for k lands there; the third rank's writes are still
// visible, because the fast rank acquired them (its counter included the third rank's release)
// before its own release add: releases and acquires are cumulative. crates/sync/src/epoch.rs
// model-checks both properties over random interleavings.
//
// One thread per rank (per coordinate) calls it; for a whole block, __syncthreads() before (so the
// block's writes precede the arrival) and after (so the block reads after the pass).
#pragma once
#include <stdint.h>
#include "weft/abi/sync.h"
#include "weft/sync/signal.cuh"
#include "weft/sync/wait.cuh"

namespace weft::sync {

__device__ __forceinline__ void barrier(const weft_sync_counters& bar, weft_tile_coord coord, uint64_t epoch) {
  signal_all(bar, coord, 1);
  const uint64_t* own = counter_or_trap(bar, coord, bar.view.rank, WEFT_SYNC_PRIM_BARRIER);
  detail::spin_until(own, weft_barrier_target(bar.view.world, epoch), bar.bound,
                     WaitSite{bar.view.rank, WEFT_SYNC_PRIM_BARRIER, bar.view.rank, coord}, detail::AcquireSys{});
}

// GPU scope: `participants` threads (one per block, typically) of this GPU meet at this rank's own
// counter; barrier number `epoch` (from 1) passes once the counter reaches participants * epoch.
// All participants must be resident at once (a persistent or cooperative grid).
__device__ __forceinline__ void barrier_gpu(const weft_sync_counters& bar, weft_tile_coord coord, uint32_t participants,
                                            uint64_t epoch) {
  uint64_t* own = counter_or_trap(bar, coord, bar.view.rank, WEFT_SYNC_PRIM_BARRIER_GPU);
  mo::red_add_release_gpu(own, 1);
  detail::spin_until(own, uint64_t(participants) * epoch, bar.bound,
                     WaitSite{bar.view.rank, WEFT_SYNC_PRIM_BARRIER_GPU, bar.view.rank, coord}, detail::AcquireGpu{});
}

}  // namespace weft::sync
