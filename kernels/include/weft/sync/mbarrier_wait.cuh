// Intra-SM synchronization through shared-memory mbarriers (weft/sm90/mbarrier.cuh), with a wait
// bounded by the sync budget that reports through the error slot. Used for the intra-SM latency
// reference; warps of one block hand off through it without leaving the SM.
#pragma once
#include <stdint.h>
#include "weft/sm90/mbarrier.cuh"
#include "weft/abi/sync.h"
#include "weft/sync/clock.cuh"
#include "weft/sync/error.cuh"

namespace weft::sync {

// Waits for the phase of parity `parity` to complete, bounded by `bound`; on expiry reports
// MBARRIER_WAIT (expected = the awaited parity, observed = the other parity, coord = `coord`, the
// waiting thread's `role`) and traps. kInlineReport: report without a function call (for code
// after setmaxnreg; see fail_inline).
template <bool kInlineReport = false>
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity, const weft_sync_bound& bound, int32_t rank,
                                              weft_tile_coord coord, uint32_t role = WEFT_ROLE_NONE) {
  if (weft::mbar_try_wait(bar, parity)) return;
  const long long c0 = clock64();
  const uint64_t t0 = globaltimer_ns();
  while (!weft::mbar_try_wait(bar, parity)) {
    const uint64_t spent = uint64_t(clock64() - c0);
    if (spent > bound.budget_cycles) {
      failure f{};
      f.status = WEFT_SYNC_STATUS_TIMEOUT;
      f.primitive = WEFT_SYNC_PRIM_MBARRIER_WAIT;
      f.role = role;
      f.target_rank = rank;
      f.coord = coord;
      f.expected = parity;
      f.observed = parity ^ 1u;  // the mbarrier word is opaque: report the phase still pending
      f.elapsed_cycles = spent;
      f.elapsed_ns = globaltimer_ns() - t0;
      if constexpr (kInlineReport) {
        fail_inline(bound, rank, f);
      } else {
        fail(bound, rank, f);
      }
    }
  }
}

}  // namespace weft::sync
