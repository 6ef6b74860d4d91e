// The PEER_REDUCE epilogue's barriers (fused GEMM + ReduceScatter, abi/gemm.h): every rank's D is
// zeroed before any rank adds into it, and this rank's D is complete when the kernel ends. The
// PEER_ROWS epilogue (fused GEMM + All-to-All) uses them as they are, without the zeroing: START
// is thread 96's arrival as the kernel begins (the stream has run what read this rank's D), the
// ready wait comes before a consumer's first peer store instead of its first reduce, and the
// drain's warpgroup barrier orders every thread's stores before the leader's arrival.
//
// Run by warps 1..3 of the loader warpgroup (zeroing, START arrival, END) and the consumers'
// leaders (START wait, drained). Orderings:
//   start:  each zeroing thread zeroes its share of this rank's D (generic stores) and fences
//           them against later async-proxy operations; barrier kPeerBarrier; thread 32 arrives
//           on every rank's START counter (signal_all: fence.acq_rel.sys, then the adds). The
//           consumers' main loops run meanwhile.
//   ready:  before a consumer's first TMA reduce, its leader waits (acquire, system scope) for its
//           own START counter to hold world x ctas arrivals of this launch, then fences the async
//           proxy; the warpgroup barrier that follows in the storer orders its issuers after it.
//   finish: after the drain (every issuer did bulk_wait_group<0> and fence.proxy.async.global,
//           then the warpgroup barrier), each consumer's leader arrives on the CTA's peer_done
//           mbarrier; the peer-barrier thread of the loader warpgroup waits for both, then
//           arrives on every rank's END counter; CTA 0's waits for its own END counter to hold
//           world x ctas arrivals: every rank's reduces into this D are complete.
// Epochs: launch e waits for world x ctas x e. A rank reaches launch e + 1's START arrival only
// after its own launch e ended, i.e. after CTA 0 saw all of launch e's END arrivals. Those do not
// all follow the same CTA's START arrival (a CTA with no tile may arrive at END first), but every
// rank's END needs its CTAs with tiles, whose first reduce, peer store or peer load waited for
// every START arrival of launch e: so launch e + 1's arrivals never complete a target of launch e.
// Every wait is bounded by peer_bar's budget and reports the counter row (START / END) it was on.
// Everything here is inline, reports included (fail_inline): one call to the out-of-line
// weft::sync::fail anywhere in the consumer makes ptxas ignore setmaxnreg and spill the
// accumulators, so weft/sync's signal_all / wait are not used as such.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/gemm/ag_chunk.cuh"
#include "weft/gemm/config.cuh"
#include "weft/sm90/mbarrier.cuh"
#include "weft/sync/counter.cuh"
#include "weft/sync/error.cuh"
#include "weft/sync/memory_order.cuh"
#include "weft/sm90/warpgroup.cuh"

namespace weft::gemm {

constexpr uint32_t kPeerBarrier = 1 + WEFT_GEMM_CONSUMERS;  // ids 1..kConsumers: one per consumer warpgroup

__device__ __forceinline__ bool peer_reduce(const weft_gemm_params& p) { return p.layout == WEFT_GEMM_LAYOUT_PEER_REDUCE; }
// The fused AllGather + GEMM (A read from its owners' shards; ag_maps in abi/gemm.h) uses the same
// START / END counters: START = every rank's shard written, END = every rank's loads done.
__device__ __forceinline__ bool all_gather_a(const weft_gemm_params& p) { return p.ag_maps != 0; }
// The fused All-to-All (PEER_ROWS, abi/gemm.h): the same counters, START = every rank's D was read,
// END = every rank's stores into this D done.
__device__ __forceinline__ bool peer_rows(const weft_gemm_params& p) { return p.layout == WEFT_GEMM_LAYOUT_PEER_ROWS; }
// Layouts whose epilogue writes into peers' D, its first write after START.
__device__ __forceinline__ bool peer_writes(const weft_gemm_params& p) { return peer_reduce(p) || peer_rows(p); }
__device__ __forceinline__ bool peer_barriers(const weft_gemm_params& p) { return peer_writes(p) || all_gather_a(p); }

// The same for a kernel of fusion set Cfg::kFusions (config.cuh): the fused ReduceScatter's own
// kernel knows its layout at compile time, the kernel with every fusion reads the parameters, and
// the plain kernel has none.
template <class Cfg>
__device__ __forceinline__ bool uses_peer_reduce(const weft_gemm_params& p) {
  return Cfg::kPeerReduceOnly || (Cfg::kAllFusions && peer_reduce(p));
}
template <class Cfg>
__device__ __forceinline__ bool uses_peer_rows(const weft_gemm_params& p) {
  return Cfg::kPeerRowsOnly || (Cfg::kAllFusions && peer_rows(p));
}
template <class Cfg>
__device__ __forceinline__ bool uses_all_gather_a(const weft_gemm_params& p) {
  return Cfg::kAllGatherOnly || (Cfg::kAllFusions && all_gather_a(p));
}
// The START / END barriers: every fusion that writes into peers or reads from them (the method
// sets' at compile time; the same as uses_peer_reduce || uses_peer_rows || uses_all_gather_a,
// written so that the kernel with every fusion keeps the code its trials ran).
template <class Cfg>
__device__ __forceinline__ bool uses_peer_barriers(const weft_gemm_params& p) {
  return Cfg::kPeerReduceOnly || Cfg::kAllGatherOnly || Cfg::kPeerRowsOnly || (Cfg::kAllFusions && peer_barriers(p));
}

__device__ __forceinline__ weft_tile_coord peer_bar_coord(uint32_t row) { return weft::sync::coord4(0, 0, row, 0); }

__device__ __forceinline__ uint64_t peer_bar_target(const weft_gemm_params& p) {
  return uint64_t(p.peer_bar.view.world) * p.sched.ctas * p.peer_epoch;
}

// The tensor map of `owner`'s A shard (all_gather_a).
__device__ __forceinline__ const void* ag_map(const weft_gemm_params& p, uint32_t owner) {
  return reinterpret_cast<const weft_tensor_map*>(p.ag_maps) + owner;
}

// The tensor map of `owner`'s D.
__device__ __forceinline__ const void* peer_map(const weft_gemm_params& p, uint32_t owner) {
  return reinterpret_cast<const weft_tensor_map*>(p.peer_maps) + owner;
}

// Reports a barrier failure at counter `row` of `rank` and traps.
__device__ __forceinline__ void peer_bar_fail(const weft_gemm_params& p, int32_t status, int32_t primitive, uint32_t row,
                                              int32_t rank, uint64_t expected, uint64_t observed, uint64_t cycles) {
  weft::sync::failure f{};
  f.status = status;
  f.primitive = primitive;
  f.role = WEFT_ROLE_GEMM_PEER_BARRIER;
  f.target_rank = rank;
  f.coord = peer_bar_coord(row);
  f.expected = expected;
  f.observed = observed;
  f.elapsed_cycles = cycles;
  weft::sync::fail_inline(p.peer_bar.bound, p.peer_bar.view.rank, f);
}

// `rank`'s counter at `row` (reported as a bad coordinate when the layout lacks it).
__device__ __forceinline__ uint64_t* peer_counter(const weft_gemm_params& p, uint32_t row, int32_t rank, int32_t primitive) {
  uint64_t* c = weft::sync::counter_ptr(p.peer_bar.view, peer_bar_coord(row), rank);
  if (c == nullptr) peer_bar_fail(p, WEFT_SYNC_STATUS_BAD_COORD, primitive, row, rank, 0, 0, 0);
  return c;
}

// signal_all: one fence.acq_rel.sys, then a relaxed add on every rank's counter at `row`.
__device__ __forceinline__ void peer_bar_arrive(const weft_gemm_params& p, uint32_t row) {
  const int32_t world = p.peer_bar.view.world, rank = p.peer_bar.view.rank;
  weft::sync::mo::fence_acq_rel_sys();
  for (int32_t i = 1; i <= world; ++i) {
    const int32_t r = (rank + i) % world;
    weft::sync::mo::red_add_relaxed_sys(peer_counter(p, row, r, WEFT_SYNC_PRIM_SIGNAL), 1);
  }
}

// Polls this rank's counter at `row` (acquire, system scope) until it reaches this launch's
// target; false when the budget ran out (nothing reported).
__device__ __forceinline__ bool peer_bar_poll(const weft_gemm_params& p, uint32_t row) {
  const uint64_t* c = weft::sync::counter_ptr(p.peer_bar.view, peer_bar_coord(row), p.peer_bar.view.rank);
  if (c == nullptr) return false;
  const uint64_t target = peer_bar_target(p);
  const long long c0 = clock64();
  while (weft::sync::mo::ld_acquire_sys(c) < target) {
    if (uint64_t(clock64() - c0) > p.peer_bar.bound.budget_cycles) return false;
  }
  return true;
}

// The same, reporting a timeout (or a bad layout) and trapping.
__device__ __forceinline__ void peer_bar_wait(const weft_gemm_params& p, uint32_t row) {
  const long long c0 = clock64();
  if (peer_bar_poll(p, row)) return;
  const int32_t rank = p.peer_bar.view.rank;
  const uint64_t observed = weft::sync::mo::ld_relaxed_sys(peer_counter(p, row, rank, WEFT_SYNC_PRIM_WAIT));
  peer_bar_fail(p, WEFT_SYNC_STATUS_TIMEOUT, WEFT_SYNC_PRIM_WAIT, row, rank, peer_bar_target(p), observed,
                uint64_t(clock64() - c0));
}

// The zeroing threads of a compute CTA (warps 1..3 of the loader warpgroup, idle otherwise in a
// PEER_REDUCE launch: the consumers start their main loop meanwhile): zero this CTA's share of
// this rank's D, then arrive at START.
constexpr uint32_t kZeroThreads = 96;
template <class Cfg>
__device__ __forceinline__ void peer_reduce_start(const weft_gemm_params& p) {
  const uint64_t vectors = uint64_t(p.peer_rows) * p.sched.n * sizeof(typename Cfg::Out) / 16;
  const uint32_t t = threadIdx.x - 32;
  int4* d = reinterpret_cast<int4*>(p.d_ptr);
  for (uint64_t i = uint64_t(blockIdx.x) * kZeroThreads + t; i < vectors; i += uint64_t(p.sched.ctas) * kZeroThreads)
    d[i] = make_int4(0, 0, 0, 0);
  weft::sync::mo::fence_proxy_async_global();  // the zeros before any async-proxy add to them
  named_barrier_sync(kPeerBarrier, kZeroThreads);
  if (t == 0) peer_bar_arrive(p, WEFT_GEMM_PEER_BAR_START);
}

// A consumer's leader, before its warpgroup's first reduce or peer store (a barrier of the
// warpgroup follows).
// Runs with the accumulators live, so it only polls: false when the budget ran out, and the
// consumer reports it after its loop (report_peer_start_stall), as for ConsumerStall.
__device__ __forceinline__ bool peer_reduce_ready(const weft_gemm_params& p) {
  if (!peer_bar_poll(p, WEFT_GEMM_PEER_BAR_START)) return false;
  weft::sync::mo::fence_proxy_async_global();
  return true;
}

// A consumer's leader after its drain (its warpgroup's reduces complete and fenced, then the
// warpgroup barrier): flags a START wait that gave up, then arrives on peer_done (release, CTA
// scope). Nothing else: code here that reports or signals makes ptxas spill the consumers.
template <class Cfg>
__device__ __forceinline__ void peer_reduce_drained(const SharedTiles<Cfg>& sm, bool start_stalled) {
  if (start_stalled) *sm.peer_flag() = 1;
  mbar_arrive(sm.peer_done());
}

// The peer-barrier thread (thread 96, after its share of the zeroing): once every consumer has
// drained (acquire, CTA scope), reports a START wait a consumer gave up on, or arrives at END on
// every rank; CTA 0's then waits for every rank's CTAs. Its fence.acq_rel.sys is cumulative over
// the reduces the consumers' leaders saw complete before their arrivals.
template <class Cfg>
__device__ __forceinline__ void run_peer_barrier(const weft_gemm_params& p, const SharedTiles<Cfg>& sm) {
  const long long c0 = clock64();
  // The consumers' whole run is in this wait: bounded by one budget per stage wait they may do
  // (each of those is bounded itself and reports a stall), not by one budget in all.
  const uint64_t stage_waits = uint64_t(weft_gemm_order_count(p.sched)) * weft_gemm_k_blocks(p.sched) + 2;
  const uint64_t bound = p.peer_bar.bound.budget_cycles * stage_waits;
  if (!mbar_wait_bounded(sm.peer_done(), 0, bound)) {
    // A consumer never drained: its own stall report names why; this one names the wait here.
    peer_bar_fail(p, WEFT_SYNC_STATUS_TIMEOUT, WEFT_SYNC_PRIM_MBARRIER_WAIT, WEFT_GEMM_PEER_BAR_END, p.peer_bar.view.rank,
                  WEFT_GEMM_CONSUMERS, 0, uint64_t(clock64() - c0));
  }
  if (const uint32_t code = *sm.ag_stall(); code != 0) ag_chunk_fail<Cfg>(p, code);
  if (*sm.peer_flag() != 0) {
    // A consumer gave up waiting for every rank's D to be zeroed (its reduces went out), or the
    // loader for every rank's A shard to be written (its loads went out).
    const int32_t rank = p.peer_bar.view.rank;
    const uint64_t observed =
        weft::sync::mo::ld_relaxed_sys(peer_counter(p, WEFT_GEMM_PEER_BAR_START, rank, WEFT_SYNC_PRIM_WAIT));
    peer_bar_fail(p, WEFT_SYNC_STATUS_TIMEOUT, WEFT_SYNC_PRIM_WAIT, WEFT_GEMM_PEER_BAR_START, rank, peer_bar_target(p),
                  observed, p.peer_bar.bound.budget_cycles);
  }
  peer_bar_arrive(p, WEFT_GEMM_PEER_BAR_END);
  if (blockIdx.x == 0) peer_bar_wait(p, WEFT_GEMM_PEER_BAR_END);
}

}  // namespace weft::gemm
