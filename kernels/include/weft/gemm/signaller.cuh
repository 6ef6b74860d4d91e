// The signaller role: one thread of the loader warpgroup per consumer (lane 0 of warps 1 and 2)
// that issues the consumer's GPU-scope releases (tile flags, wave-group counters), so that the
// consumer warpgroup does not wait for them. A release costs its thread about a microsecond
// under a running GEMM's memory traffic; issued by the consumer's leader, the whole warpgroup
// waited for it at its next epilogue barrier (4-11 % of a short-K GEMM with a group per wave).
//
// Hand-off, through a ring of WEFT_GEMM_SIGNAL_SLOTS slots per consumer (SharedTiles::signal_*):
//   leader:     once every thread that issued the signalled stores did bulk_wait_group<0> (they
//               are complete) and fence.proxy.async.global (async-proxy writes before generic-
//               proxy operations), and a barrier since: per release, wait for the slot's empty
//               phase, write {address, value}, arrive on full (release, CTA scope).
//   signaller:  wait on full (acquire, CTA scope), red.release.gpu of value at address, arrive on
//               empty. Address 0 ends the role (posted by the leader's drain).
// The signaller's GPU-scope release is cumulative: the stores the issuers saw complete happen
// before the barrier and the leader's arrival, which the signaller acquired, so a reader that
// acquires the counter sees them — the same guarantee as the leader's own release had.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/gemm/config.cuh"
#include "weft/sm90/mbarrier.cuh"
#include "weft/sync/mbarrier_wait.cuh"
#include "weft/sync/error.cuh"
#include "weft/sync/memory_order.cuh"

namespace weft::gemm {

// Whether this launch signals at all (else the signallers exit at once and nothing is posted).
__device__ __forceinline__ bool launch_signals(const weft_gemm_params& p) {
  return p.tile_flags != 0 || p.group_counters != 0;
}
// The same for a kernel of fusion set Cfg::kFusions (config.cuh): the kernels with every fusion
// and with the fused AllReduce's tile flags; the others have the signallers compiled out.
template <class Cfg>
__device__ __forceinline__ bool uses_signals(const weft_gemm_params& p) {
  return (Cfg::kAllFusions || Cfg::kAllReduceOnly) && launch_signals(p);
}

// A position in a consumer's signal ring (the leader's and the signaller's own copies): slot and
// phase parity, advanced like the stages of the operand pipeline.
using SignalRing = PipelineState<WEFT_GEMM_SIGNAL_SLOTS>;

// Leader of `consumer`: hands the release of `value` at `address` to its signaller (address 0:
// no more). The caller has made the covered stores complete and fenced the async proxy. False
// when the slot never came free within the budget (nothing posted): the caller reports it once
// its accumulators are dead (report_signal_stall; a report here, with them live, spills).
template <class Cfg>
__device__ __forceinline__ bool post_signal(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                            SignalRing& ring, uint64_t address, uint64_t value) {
  // Parity phase ^ 1: a fresh barrier counts as having completed the phase before phase 0.
  if (!mbar_wait_bounded(sm.signal_empty(consumer, ring.stage), ring.phase ^ 1u, p.bound.budget_cycles)) return false;
  uint64_t* slot = sm.signal_slot(consumer, ring.stage);
  slot[0] = address;
  slot[1] = value;
  mbar_arrive(sm.signal_full(consumer, ring.stage));  // release (CTA scope): the slot and what came before
  ring.advance();
  return true;
}

// Reports a leader's post that found no free slot within the budget (MBARRIER_WAIT on the
// slot's empty barrier, coord {0, slot, consumer, 0}; the leader is a consumer's) and traps.
__device__ __forceinline__ void report_signal_stall(const weft_gemm_params& p, int consumer, const SignalRing& ring) {
  weft::sync::failure f{};
  f.status = WEFT_SYNC_STATUS_TIMEOUT;
  f.primitive = WEFT_SYNC_PRIM_MBARRIER_WAIT;
  f.role = WEFT_ROLE_GEMM_CONSUMER;
  f.target_rank = p.rank;  // its own CTA's ring
  f.coord = weft_tile_coord{0, static_cast<uint32_t>(ring.stage), static_cast<uint32_t>(consumer), 0};
  f.expected = ring.phase ^ 1u;
  f.observed = ring.phase;
  f.elapsed_cycles = p.bound.budget_cycles;
  weft::sync::fail_inline(p.bound, p.rank, f);
}

// The signaller of `consumer`: issues each posted release until the leader posts address 0.
// Its wait for the next post is bounded by the launch's budget (WEFT_SYNC_TIMEOUT_MS, 10 s by
// default): with group signals batched, the gap between two posts can be all of a CTA's tiles of
// one group, so a CTA that spends longer than the budget on them would be reported as stuck.
template <class Cfg>
__device__ __forceinline__ void run_signaller(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer) {
  SignalRing ring;
  for (;;) {
    weft::sync::mbarrier_wait<true>(sm.signal_full(consumer, ring.stage), ring.phase, p.bound, p.rank,
                                    weft_tile_coord{0, static_cast<uint32_t>(ring.stage), static_cast<uint32_t>(consumer), 1},
                                    WEFT_ROLE_GEMM_SIGNALLER);
    const uint64_t* slot = sm.signal_slot(consumer, ring.stage);
    const uint64_t address = slot[0], value = slot[1];
    if (address == 0) return;
    if (p.flags_sys != 0) {
      weft::sync::mo::red_add_release_sys(reinterpret_cast<uint64_t*>(address), value);  // peers read it
    } else {
      weft::sync::mo::red_add_release_gpu(reinterpret_cast<uint64_t*>(address), value);
    }
    mbar_arrive(sm.signal_empty(consumer, ring.stage));  // the slot may be rewritten
    ring.advance();
  }
}

}  // namespace weft::gemm
