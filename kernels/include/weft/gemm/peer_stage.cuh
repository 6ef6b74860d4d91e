// Deferred peer adds of the fused GEMM + ReduceScatter (PEER_REDUCE with p.peer_stage != 0,
// abi/gemm.h): a consumer warpgroup whose 64 rows of a tile belong to another rank stores them by
// TMA into a staging slot in this GPU's memory (fast, local) instead of reduce-adding them into
// the owner over NVLink, and goes on to its next tile; a warp of the loader warpgroup (warp 1 for
// consumer 0, warp 2 for consumer 1, after their share of the zeroing) adds each staged slot into
// its owner with 16-byte vector reductions through peer memory while the GEMM goes on. The
// consumer's own rows still go by TMA reduce-add into this rank's D. Why: a tile's epilogue waits
// for its chunks to leave its two shared buffers, and with every SM's epilogue at once the link
// gives each only a share of its bandwidth (crates/signal-gemm/README.md).
//
// Per consumer a ring of kStageSlots slots in the shared signal ring (the `_pr` kernel raises no
// signals): signal_full(c, s) completes when the consumer posted slot s, signal_empty(c, s) when
// its pusher has read it; signal_slot(c, s) holds the destination (owner << 32 | row within the
// owner's D, and the first column), or kNoStage: the consumer drained, nothing follows.
// Orderings:
//   stage:  the consumer's leader waits for the slot's empty phase (bounded), fences the async
//           proxy (the pusher's generic reads before the TMA writes), writes the destination,
//           and the warpgroup's barriers order its TMA stores after; its stores are committed;
//   post:   at the start of the warpgroup's next epilogue (or its drain) every issuer waits for
//           its bulk groups to COMPLETE and fences async-proxy writes against generic reads
//           (fence.proxy.async.global); after a warpgroup barrier (several issuers) the leader
//           arrives on the slot's full barrier (release, CTA scope): a tile later, when the waits
//           cost nothing;
//   push:   the pusher waits on full (acquire, CTA scope), before its first add for every rank's
//           START (its D zeroed), reads the slot (generic loads) and adds it into the owner with
//           red.relaxed.sys; __syncwarp, then lane 0 arrives on empty;
//   finish: after the terminator every pusher lane fences (fence.acq_rel.sys: its adds performed
//           at system scope), then __syncwarp and lane 0 arrives on peer_done; the peer-barrier
//           thread waits for every consumer and pusher, then arrives at END.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "weft/abi/gemm.h"
#include "weft/gemm/config.cuh"
#include "weft/gemm/peer_reduce.cuh"
#include "weft/sm90/mbarrier.cuh"
#include "weft/sync/memory_order.cuh"
#include "weft/tma/bulk_copy.cuh"

namespace weft::gemm {

constexpr uint32_t kStageSlots = WEFT_GEMM_STAGE_SLOTS;
static_assert(kStageSlots <= WEFT_GEMM_SIGNAL_SLOTS, "the staging ring lives in the signal ring");
constexpr uint64_t kNoStage = ~uint64_t(0);

__device__ __forceinline__ bool stage_enabled(const weft_gemm_params& p) { return p.peer_stage != 0; }

// Row of slot `slot` of consumer `consumer` of this CTA in the staging buffer (64 rows a slot).
__device__ __forceinline__ uint32_t stage_row(uint32_t consumer, uint32_t slot) {
  return ((blockIdx.x * WEFT_GEMM_CONSUMERS + consumer) * kStageSlots + slot) * 64u;
}

// The staging buffer's tensor map: after every rank's D map.
__device__ __forceinline__ const void* stage_map(const weft_gemm_params& p) {
  return peer_map(p, static_cast<uint32_t>(p.peer_bar.view.world));
}

// Adds the 16 bytes `v` into `dst` (peer memory), relaxed, system scope. No "memory" clobber:
// the compiler may issue later loads of the staging slot before it (they never alias the
// owners' D), so several are in flight; every asm volatile (the mbarrier operations that
// order the slot's use) keeps its place relative to these.
__device__ __forceinline__ void red_add_16b(__nv_bfloat16*, uint8_t* dst, int4 v) {
  asm volatile("red.relaxed.sys.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void red_add_16b(__half*, uint8_t* dst, int4 v) {
  asm volatile("red.relaxed.sys.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ void red_add_16b(float*, uint8_t* dst, int4 v) {
  asm volatile("red.relaxed.sys.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(__int_as_float(v.x)),
               "f"(__int_as_float(v.y)), "f"(__int_as_float(v.z)), "f"(__int_as_float(v.w)));
}

// Consumer side. The warpgroup's count of staged slots and whether the last is yet to be posted:
// every thread keeps the same (the issuers of a whole-tile epilogue, lane 0 of each warp, each
// store a share of the slot's chunks).
struct StageState {
  uint32_t staged = 0;
  bool pending = false;
};

// The leader, before staging its rows of a tile (a warpgroup barrier orders the other issuers
// after it): waits (bounded) until the pusher has read the slot's previous use and writes the
// destination; false when the budget ran out (reported after the drain, as for START).
template <class Cfg>
__device__ __forceinline__ bool stage_claim(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                            const StageState& ss, uint64_t where, uint32_t col0) {
  const uint32_t slot = ss.staged % kStageSlots, use = ss.staged / kStageSlots;
  if (use > 0 && !mbar_wait_bounded(sm.signal_empty(consumer, slot), (use - 1) & 1u, p.peer_bar.bound.budget_cycles))
    return false;
  weft::sync::mo::fence_proxy_async_global();
  uint64_t* pay = sm.signal_slot(consumer, slot);
  pay[0] = where;
  pay[1] = col0;
  return true;
}

// An issuer of the pending slot's stores: they completed, ordered before generic reads.
__device__ __forceinline__ void stage_complete() {
  bulk_wait_group<0>();
  weft::sync::mo::fence_proxy_async_global();
}

// Every thread, once every issuer completed (stage_complete, then a warpgroup barrier where
// there are several): the leader hands the pending slot to the pusher.
template <class Cfg>
__device__ __forceinline__ void stage_post(const SharedTiles<Cfg>& sm, int consumer, StageState& ss, bool leader) {
  if (leader) mbar_arrive(sm.signal_full(consumer, ss.staged % kStageSlots));
  ++ss.staged;
  ss.pending = false;
}

// The leader at its drain, after posting any pending slot: tells the pusher nothing follows.
template <class Cfg>
__device__ __forceinline__ bool stage_finish(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                             StageState& ss) {
  if (!stage_claim<Cfg>(p, sm, consumer, ss, kNoStage, 0)) return false;
  mbar_arrive(sm.signal_full(consumer, ss.staged % kStageSlots));
  ++ss.staged;
  return true;
}

// The pusher's bound on a wait for its consumer's next post: one budget per stage wait of the
// consumer's whole run, as run_peer_barrier's.
__device__ __forceinline__ uint64_t stage_pusher_bound(const weft_gemm_params& p) {
  return p.peer_bar.bound.budget_cycles * (uint64_t(weft_gemm_order_count(p.sched)) * weft_gemm_k_blocks(p.sched) + 2);
}

// The pusher: warp 1 + consumer of the loader warpgroup, until its consumer's terminator. A wait
// that ran out is reported after the loop (reporting inside it makes ptxas spill: 40 registers).
template <class Cfg>
__device__ __forceinline__ void run_stage_pusher(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer) {
  using Out = typename Cfg::Out;
  const uint32_t lane = threadIdx.x % 32;
  // Every rank's D zeroed before any add into it (its first post comes later anyway).
  bool start_passed = true;
  if (lane == 0) start_passed = peer_bar_poll(p, WEFT_GEMM_PEER_BAR_START);
  start_passed = __shfl_sync(0xffffffffu, start_passed, 0);
  bool stalled = !start_passed;
  uint32_t k = 0;
  for (; start_passed; ++k) {
    const uint32_t slot = k % kStageSlots;
    // The consumer's whole run may come before its first post: bounded as run_peer_barrier's wait.
    if (!mbar_wait_bounded(sm.signal_full(consumer, slot), (k / kStageSlots) & 1u, stage_pusher_bound(p))) {
      stalled = true;
      break;
    }
    const volatile uint64_t* pay = sm.signal_slot(consumer, slot);
    const uint64_t where = pay[0];
    if (where == kNoStage) break;
    const uint32_t col0 = static_cast<uint32_t>(pay[1]);
    const uint32_t pitch = p.sched.tile_n * sizeof(Out);  // a staging row
    const uint8_t* src = reinterpret_cast<const uint8_t*>(p.peer_stage) + uint64_t(stage_row(consumer, slot)) * pitch;
    uint8_t* dst = reinterpret_cast<uint8_t*>(reinterpret_cast<const uint64_t*>(p.peer_ptrs)[where >> 32]) +
                   (uint64_t(uint32_t(where)) * p.sched.n + col0) * sizeof(Out);
    // Whole 16-byte vectors (n is a multiple of 16 elements), a staged row's run of them at a
    // time: lane l takes vector l of each row (rows of more than 32 vectors: l and l + 32).
    const uint32_t vpr = min(p.sched.tile_n, p.sched.n - col0) * uint32_t(sizeof(Out)) / 16u;
    const uint64_t d_row = uint64_t(p.sched.n) * sizeof(Out);
    constexpr uint32_t kRows = 4;
    for (uint32_t c = lane; c < vpr; c += 32u) {
      for (uint32_t r = 0; r < 64u; r += kRows) {
        int4 x[kRows];
#pragma unroll
        for (uint32_t i = 0; i < kRows; ++i) x[i] = *reinterpret_cast<const int4*>(src + (r + i) * pitch + c * 16u);
#pragma unroll
        for (uint32_t i = 0; i < kRows; ++i) red_add_16b(static_cast<Out*>(nullptr), dst + (r + i) * d_row + c * 16u, x[i]);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(sm.signal_empty(consumer, slot));
  }
  if (stalled) {
    // START never came (reported as the consumers' START wait is), or a post never came.
    if (!start_passed) {
      peer_bar_wait(p, WEFT_GEMM_PEER_BAR_START);
    } else {
      peer_bar_fail(p, WEFT_SYNC_STATUS_TIMEOUT, WEFT_SYNC_PRIM_MBARRIER_WAIT, WEFT_GEMM_PEER_BAR_STAGE,
                    p.peer_bar.view.rank, k, 0, stage_pusher_bound(p));
    }
  }
  // Every lane's adds performed at system scope before the END arrival they precede: the fence
  // waits for this thread's own outstanding writes (another warp's fence would not; without it
  // the owner read its D with most of a one-wave run's adds still in flight).
  weft::sync::mo::fence_acq_rel_sys();
  __syncwarp();
  if (lane == 0) mbar_arrive(sm.peer_done());
}

}  // namespace weft::gemm
