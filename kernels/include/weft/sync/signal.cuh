// signal / signal_all: release-ordered atomic adds on counters in peer (or local) memory.
//
// Producer side: every store the calling thread made before signal() (and every store it has
// observed, e.g. its block's stores before a __syncthreads()) is visible to a consumer that
// wait()s for the counter to include this add. So: write the data, __syncthreads() if other
// threads wrote it, then one thread signals. Data written by TMA / cp.async.bulk must first be
// complete (cp.async.bulk.wait_group 0, not .read); plain stores that a later TMA will read need
// mo::fence_proxy_async().
//
// Adds never reset a counter: a counter at a coordinate is the running total of what was signalled
// there since it was zeroed, which is what makes monotonic targets work (README.md, "epochs").
#pragma once
#include <stdint.h>
#include "weft/abi/sync.h"
#include "weft/sync/counter.cuh"
#include "weft/sync/memory_order.cuh"

namespace weft::sync {

// Adds `val` to `dst_rank`'s counter at `coord`, release at system scope (red.release.sys).
__device__ __forceinline__ void signal(const weft_sync_counters& bar, weft_tile_coord coord, int32_t dst_rank,
                                       uint64_t val = 1) {
  mo::red_add_release_sys(counter_or_trap(bar, coord, dst_rank, WEFT_SYNC_PRIM_SIGNAL), val);
}

// Adds `val` to every rank's counter at `coord` (this rank's included): a loop of peer atomics,
// starting after this rank so that ranks do not all hit rank 0 first. One fence.acq_rel.sys then
// relaxed adds: each add forms a release pattern with the fence, at the cost of one fence.
// (A multicast variant would be one multimem.red; weft never emits multimem in default builds.)
__device__ __forceinline__ void signal_all(const weft_sync_counters& bar, weft_tile_coord coord, uint64_t val = 1) {
  const int32_t world = bar.view.world;
  counter_or_trap(bar, coord, bar.view.rank, WEFT_SYNC_PRIM_SIGNAL);  // same offset on every rank
  mo::fence_acq_rel_sys();
  for (int32_t i = 1; i <= world; ++i) {
    const int32_t r = (bar.view.rank + i) % world;
    mo::red_add_relaxed_sys(counter_or_trap(bar, coord, r, WEFT_SYNC_PRIM_SIGNAL), val);
  }
}

// Stores `value` into `dst_rank`'s counter at `coord`, release at system scope (st.release.sys):
// for flags that carry a monotone sequence number written by one producer only (a waiter asks for
// >= its round's number, so a producer that is already a round ahead does not hold it back).
__device__ __forceinline__ void publish(const weft_sync_counters& bar, weft_tile_coord coord, int32_t dst_rank,
                                        uint64_t value) {
  mo::st_release_sys(counter_or_trap(bar, coord, dst_rank, WEFT_SYNC_PRIM_SIGNAL), value);
}

// GPU scope: adds `val` to this rank's own counter at `coord` for a waiter on another SM of the
// same GPU (wait_gpu). Orders the thread's earlier stores at GPU scope only.
__device__ __forceinline__ void signal_gpu(const weft_sync_counters& bar, weft_tile_coord coord, uint64_t val = 1) {
  mo::red_add_release_gpu(counter_or_trap(bar, coord, bar.view.rank, WEFT_SYNC_PRIM_SIGNAL), val);
}

namespace unordered {

// Relaxed add with no release: earlier stores may become visible after the counter moves.
// For negative controls, or after an explicit mo::fence_acq_rel_sys().
__device__ __forceinline__ void signal(const weft_sync_counters& bar, weft_tile_coord coord, int32_t dst_rank,
                                       uint64_t val = 1) {
  mo::red_add_relaxed_sys(counter_or_trap(bar, coord, dst_rank, WEFT_SYNC_PRIM_SIGNAL), val);
}

}  // namespace unordered
}  // namespace weft::sync
