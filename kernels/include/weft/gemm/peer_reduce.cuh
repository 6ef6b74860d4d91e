// The PEER_REDUCE epilogue's barriers (fused GEMM + ReduceScatter, abi/gemm.h): every rank's D is
// zeroed before any rank adds into it, and this rank's D is complete when the kernel ends. The
// PEER_ROWS epilogue (fused GEMM + All-to-All) uses them as they are, without the zeroing: START
// is thread 96's arrival as the kernel begins (the stream has run what read this rank's D), the
// ready wait comes before a consumer's first peer store instead of its first reduce, and the
// drain's warpgroup barrier orders every thread's stores before the leader's arrival.
//
// Zero rounds (PEER_REDUCE). Zeroing the whole D before the first add sent the zeros to HBM and
// the adds read them back (L2 holds far less than D: one H100 at world 1, 8192 x 8192 x 2048,
// fused 0.465 ms against 0.393 for the GEMM alone, crates/signal-gemm/README.md). So each rank
// zeroes its D in rounds of about a wave of tiles, one round ahead of its own loader, and every
// rank's adds into a tile wait for that tile's round only: the zeros are still in L2 when the adds
// come. START counts the rounds: round r of launch e is complete when the counter holds
// world x ctas x (R (e - 1) + r + 1), R rounds per launch (zero_rounds).
//
// Run by warps 1..3 of the loader warpgroup (zeroing, START arrivals, END) and the consumers'
// leaders (START waits, drained). Orderings:
//   start:  per round, each zeroing thread zeroes its share of the round's part of this rank's D
//           (generic stores) and fences them against later async-proxy operations; barrier
//           kPeerBarrier; thread 32 waits (acquire) until START shows the previous round complete,
//           then arrives on every rank's START counter (signal_all: fence.acq_rel.sys, then the
//           adds). The consumers' main loops run meanwhile.
//   ready:  before a consumer's first TMA reduce into a tile of a round it has not waited for, its
//           leader waits (acquire, system scope) for its own START counter to reach that round's
//           target, then fences the async proxy; the warpgroup barrier that follows in the storer
//           orders its issuers after it. (PEER_ROWS and the fused AllGather: one round, waited for
//           once.)
//   finish: after the drain (every issuer did bulk_wait_group<0> and fence.proxy.async.global,
//           then the warpgroup barrier), each consumer's leader arrives on the CTA's peer_done
//           mbarrier; the peer-barrier thread of the loader warpgroup waits for both, then
//           arrives on every rank's END counter; CTA 0's waits for its own END counter to hold
//           world x ctas arrivals: every rank's reduces into this D are complete.
// Epochs: launch e waits for world x ctas x e at END and for the round targets above at START. A
// rank reaches launch e + 1 only after its own launch e ended, i.e. after CTA 0 saw all of launch
// e's END arrivals, and every CTA makes all its START arrivals of a launch before its END arrival
// (a barrier of the zeroing threads, thread 96 among them, after thread 32's last one): so launch
// e + 1's arrivals never complete a target of launch e (the counters already hold every launch-e
// arrival when they begin).
// No deadlock: a consumer waits only for the round of its own tile; take the lowest round k any
// consumer of any rank is at: every loader is at k or past it (or done), so every CTA's zeroing
// may run rounds up to k + 1, and they complete in turn (round j once every CTA arrived for it,
// which each does once j - 1 completed).
// Every wait is bounded by peer_bar's budget and reports the counter row (START / END) it was on
// and its target; the zeroing's pacing gives up silently (zeroing early is only slower, never
// wrong).
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

__device__ __forceinline__ weft_tile_coord peer_bar_coord(uint32_t row) { return weft::sync::coord4(0, 0, row, 0); }

__device__ __forceinline__ uint64_t peer_bar_target(const weft_gemm_params& p) {
  return uint64_t(p.peer_bar.view.world) * p.sched.ctas * p.peer_epoch;
}

// The zero rounds of this launch (weft/abi/gemm.h; the host's, in the parameters): PEER_REDUCE's,
// else one.
__device__ __forceinline__ weft_gemm_zero_rounds zero_rounds(const weft_gemm_params& p) {
  if (!peer_reduce(p)) return weft_gemm_zero_rounds{1u, 1u, 1u, 0u, 1u, 1u};
  return p.zero;
}

// START's target for `round` of this launch (PEER_ROWS and the fused AllGather: round 0 of one).
__device__ __forceinline__ uint64_t start_target(const weft_gemm_params& p, const weft_gemm_zero_rounds& z, uint32_t round) {
  return uint64_t(p.peer_bar.view.world) * p.sched.ctas * (uint64_t(z.count) * (p.peer_epoch - 1) + round + 1);
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

// Polls this rank's counter at `row` (acquire, system scope) until it reaches `target` (by
// default this launch's: world x ctas x epoch); false when the budget ran out (nothing reported).
__device__ __forceinline__ bool peer_bar_poll(const weft_gemm_params& p, uint32_t row, uint64_t target) {
  const uint64_t* c = weft::sync::counter_ptr(p.peer_bar.view, peer_bar_coord(row), p.peer_bar.view.rank);
  if (c == nullptr) return false;
  const long long c0 = clock64();
  while (weft::sync::mo::ld_acquire_sys(c) < target) {
    if (uint64_t(clock64() - c0) > p.peer_bar.bound.budget_cycles) return false;
  }
  return true;
}
__device__ __forceinline__ bool peer_bar_poll(const weft_gemm_params& p, uint32_t row) {
  return peer_bar_poll(p, row, peer_bar_target(p));
}

// The same, reporting a timeout (or a bad layout) and trapping.
__device__ __forceinline__ void peer_bar_wait(const weft_gemm_params& p, uint32_t row, uint64_t target) {
  const long long c0 = clock64();
  if (peer_bar_poll(p, row, target)) return;
  const int32_t rank = p.peer_bar.view.rank;
  const uint64_t observed = weft::sync::mo::ld_relaxed_sys(peer_counter(p, row, rank, WEFT_SYNC_PRIM_WAIT));
  peer_bar_fail(p, WEFT_SYNC_STATUS_TIMEOUT, WEFT_SYNC_PRIM_WAIT, row, rank, target, observed, uint64_t(clock64() - c0));
}
__device__ __forceinline__ void peer_bar_wait(const weft_gemm_params& p, uint32_t row) {
  peer_bar_wait(p, row, peer_bar_target(p));
}

// How many rounds the zeroing runs ahead of its CTA's loader: zeroes round r once the loader
// has reached round r - kZeroAhead (a tile of it), so the zeros are a round old when the adds
// come, and the adds of every rank's round r find it zeroed unless a CTA lags a round behind.
constexpr uint32_t kZeroAhead = 1;

// Warp 1 (all lanes): waits until this CTA's loader is near `round` (zero_pace: the round of its
// latest tile, or WEFT_GEMM_NO_TILE when it ran out); gives up silently after the budget. Lane 0
// decides and the warp follows (a lane-0-only wait right before a named barrier let lanes 1-31
// pass it early with nvcc 13.0: kernels/grpcoll/grpcoll.cu); warps 2 and 3 wait at the barrier
// after it, issuing nothing. Rounds are tens of microseconds apart: a microsecond's sleep between
// polls keeps the poll off the consumers' issue slots.
template <class Cfg>
__device__ __forceinline__ void zero_pace(const weft_gemm_params& p, const SharedTiles<Cfg>& sm,
                                          const weft_gemm_zero_rounds& z, uint32_t round) {
  if (z.keyed == 0 || round <= kZeroAhead) return;
  const long long c0 = clock64();
  for (;;) {
    uint32_t go = 0;
    if (threadIdx.x % 32 == 0) {
      const uint32_t at = *sm.zero_pace();  // WEFT_GEMM_NO_TILE: done
      go = at == WEFT_GEMM_NO_TILE || at + kZeroAhead >= round ||
           uint64_t(clock64() - c0) > p.peer_bar.bound.budget_cycles;
    }
    if (__shfl_sync(0xffffffffu, go, 0) != 0) return;
    __nanosleep(1000);
  }
}

// The zeroing threads of a compute CTA (warps 1..3 of the loader warpgroup, idle otherwise in a
// PEER_REDUCE launch: the consumers run their main loops meanwhile): per round, once the loader is
// near it, zero this CTA's share of the round's part of this rank's D (a row per warp, the lanes
// along it), then arrive at START — from round 1 on only once every CTA of every rank arrived for
// the round before (thread 32 waits for its own START counter to show it). That keeps the arrivals
// in round order across the job, so START holding round r's target means every CTA zeroed rounds
// 0..r: the first counter to reach it had only arrivals of rounds up to r (a later round's needs an
// earlier observation of r's target), hence all of them, and any later observer of it synchronizes,
// through the arrivals it read, with every zeroing thread's release (the counter's adds form one
// release sequence; happens-before is transitive). A sum of arrivals in any order would not: one
// CTA's rounds 0..3 count as much as four CTAs' round 0.
constexpr uint32_t kZeroThreads = 96;
template <class Cfg>
__device__ __forceinline__ void peer_reduce_start(const weft_gemm_params& p, const SharedTiles<Cfg>& sm) {
  const weft_gemm_zero_rounds z = zero_rounds(p);
  const uint32_t t = threadIdx.x - 32, lane = t % 32;
  const uint32_t warp = blockIdx.x * (kZeroThreads / 32) + t / 32, warps = p.sched.ctas * (kZeroThreads / 32);
  // D's rows are whole 16-byte vectors (the TMA maps' row pitch is a multiple of 16 bytes), and
  // so is every column range below (whole tiles, or n).
  const uint64_t row_vectors = uint64_t(p.sched.n) * sizeof(typename Cfg::Out) / 16;
  int4* d = reinterpret_cast<int4*>(p.d_ptr);
  for (uint32_t round = 0; round < z.count; ++round) {
    if (t < 32) zero_pace<Cfg>(p, sm, z, round);
    __syncwarp();
    named_barrier_sync(kPeerBarrier, kZeroThreads);
    const weft_gemm_zero_region r = weft_gemm_zero_region_of(p.sched, z, round, p.peer_rows);
    const uint32_t v0 = r.col0 * sizeof(typename Cfg::Out) / 16, v1 = r.col1 * sizeof(typename Cfg::Out) / 16;
    for (uint32_t row = r.row0 + warp; row < r.row1; row += warps) {
      int4* line = d + uint64_t(row) * row_vectors;
      for (uint32_t v = v0 + lane; v < v1; v += 32) line[v] = make_int4(0, 0, 0, 0);
    }
    weft::sync::mo::fence_proxy_async_global();  // the zeros before any async-proxy add to them
    __syncwarp();
    named_barrier_sync(kPeerBarrier, kZeroThreads);
    if (t == 0) {
      if (round > 0) {
        peer_bar_wait(p, WEFT_GEMM_PEER_BAR_START, start_target(p, z, round - 1));
        weft::sync::mo::st_release_cta_shared(sm.zero_done(), round);  // rounds 0..round-1 zeroed
      }
      peer_bar_arrive(p, WEFT_GEMM_PEER_BAR_START);
    }
  }
  // Thread 96 arrives at END next: after this barrier, so after every START arrival of this CTA
  // (its fence.acq_rel.sys is cumulative over them). Warp 1 reconverged first (thread 32 alone
  // waited and arrived).
  __syncwarp();
  named_barrier_sync(kPeerBarrier, kZeroThreads);
}

// A consumer's leader, before its warpgroup's first reduce into a tile of `round` (PEER_ROWS:
// round 0, before its first peer store); a barrier of the warpgroup follows.
// Runs with the accumulators live, so it only polls: false when the budget ran out, and the
// peer-barrier thread reports it once the consumers drained (peer_flag), as for ConsumerStall.
// With zero rounds it first asks shared memory whether thread 32 has already seen the round
// complete (acquire, CTA scope: thread 32's acquire of START makes that transitive).
template <class Cfg>
__device__ __forceinline__ bool peer_reduce_ready(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, uint32_t round) {
  if (!(peer_reduce(p) && weft::sync::mo::ld_acquire_cta_shared(sm.zero_done()) > round) &&
      !peer_bar_poll(p, WEFT_GEMM_PEER_BAR_START, start_target(p, zero_rounds(p), round)))
    return false;
  weft::sync::mo::fence_proxy_async_global();
  return true;
}

// A consumer's leader after its drain (its warpgroup's reduces complete and fenced, then the
// warpgroup barrier): flags a START wait that gave up (1 + its round), then arrives on peer_done
// (release, CTA scope). Nothing else: code here that reports or signals makes ptxas spill the
// consumers.
template <class Cfg>
__device__ __forceinline__ void peer_reduce_drained(const SharedTiles<Cfg>& sm, bool start_stalled, uint32_t round) {
  if (start_stalled) *sm.peer_flag() = 1 + round;
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
  if (const uint32_t row = *sm.ag_stall(); row != 0) ag_chunk_fail<Cfg>(p, row - 1);
  if (const uint32_t flag = *sm.peer_flag(); flag != 0) {
    // A consumer gave up waiting for every rank's D to be zeroed (its reduces went out; flag - 1:
    // the zero round), or the loader for every rank's A shard to be written (its loads went out).
    const int32_t rank = p.peer_bar.view.rank;
    const uint64_t observed =
        weft::sync::mo::ld_relaxed_sys(peer_counter(p, WEFT_GEMM_PEER_BAR_START, rank, WEFT_SYNC_PRIM_WAIT));
    peer_bar_fail(p, WEFT_SYNC_STATUS_TIMEOUT, WEFT_SYNC_PRIM_WAIT, WEFT_GEMM_PEER_BAR_START, rank,
                  start_target(p, zero_rounds(p), flag - 1), observed, p.peer_bar.bound.budget_cycles);
  }
  peer_bar_arrive(p, WEFT_GEMM_PEER_BAR_END);
  if (blockIdx.x == 0) peer_bar_wait(p, WEFT_GEMM_PEER_BAR_END);
}

}  // namespace weft::gemm
