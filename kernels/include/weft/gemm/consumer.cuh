// The consumer role's main loop: a warpgroup multiplies its 64 rows of the tile into fp32
// registers, one wgmma batch per K block, keeping one batch in flight while it waits for the next
// stage, and hands each stage back to the loader as soon as its batch has retired.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/sm90/cluster.cuh"
#include "weft/gemm/config.cuh"
#include "weft/gemm/loader.cuh"
#include "weft/sync/mbarrier_wait.cuh"

namespace weft::gemm {

// Frees `stage` for the loaders: one arrival per consumer warp on the empty barrier of every CTA
// of the cluster (each counts kConsumers * 4 * kClusterM), after the warp's wgmma_wait retired
// every batch that read the stage: any of the cluster's loaders may multicast into it next.
template <class Cfg>
__device__ __forceinline__ void release_stage(const SharedTiles<Cfg>& sm, int stage) {
  if (threadIdx.x % 32 != 0) return;
  if constexpr (Cfg::kClusterM == 1) {
    mbar_arrive(sm.empty(stage));
  } else {
#pragma unroll
    for (uint32_t cta = 0; cta < Cfg::kClusterM; ++cta) mbar_arrive_cluster(sm.empty(stage), cta);
  }
}

// A consumer's wait that ran past its budget: reported by report_stall() once the accumulators
// are dead (a report inside the main loop, with 128 accumulators live, makes ptxas spill).
// A split-K wait (split_k.cuh) reports itself here too: primitive GEMM_SPLIT_K, `stage` = the
// consumer, `parity` = the flag value awaited, `observed` the last value seen.
struct ConsumerStall {
  uint32_t stalled = 0;
  uint32_t stage = 0, parity = 0;
  weft_gemm_tile tile{};
  uint64_t cycles = 0, ns = 0;
  uint32_t primitive = WEFT_SYNC_PRIM_MBARRIER_WAIT;
  uint32_t observed = 0;
};

// The consumer's next work unit and its tile (work WEFT_GEMM_NO_TILE after the last), from the
// stage the loader filled next; work WEFT_GEMM_NO_TILE and `stall` filled when it never arrived
// within the budget.
template <class Cfg>
__device__ __forceinline__ StageWork next_work(const weft_gemm_params& p, const SharedTiles<Cfg>& sm,
                                               const PipelineState<Cfg::kStages>& ps, ConsumerStall& stall) {
  if (!mbar_try_wait(sm.full(ps.stage), ps.phase)) {
    const uint64_t t0 = weft::sync::globaltimer_ns();
    if (!mbar_wait_bounded(sm.full(ps.stage), ps.phase, p.bound.budget_cycles)) {
      stall = ConsumerStall{1, static_cast<uint32_t>(ps.stage), ps.phase, weft_gemm_tile{WEFT_GEMM_NO_TILE, 0, 0},
                            p.bound.budget_cycles, weft::sync::globaltimer_ns() - t0};
      return StageWork{WEFT_GEMM_NO_TILE, weft_gemm_tile{WEFT_GEMM_NO_TILE, 0, 0}};
    }
  }
  // The full barrier's phase completed after the loader's arrival, which followed its write. Lane
  // 0 alone reads the slot: its read is then program-ordered before its own release of the stage
  // (release_stage), after which the loader may rewrite it; the warp gets the values by shuffle.
  uint32_t w = 0, tm = 0, tn = 0, valid = 0;
  if (threadIdx.x % 32 == 0) {
    const volatile StageWork* slot = sm.work(ps.stage);
    w = slot->work;
    tm = slot->tile.tm;
    tn = slot->tile.tn;
    valid = slot->tile.valid;
  }
  return StageWork{__shfl_sync(0xffffffffu, w, 0),
                   weft_gemm_tile{__shfl_sync(0xffffffffu, tm, 0), __shfl_sync(0xffffffffu, tn, 0),
                                  __shfl_sync(0xffffffffu, valid, 0)}};
}

// acc = A[tile rows of consumer c] * B[tile columns], over the `k_blocks` K blocks of the work unit
// of `tile` (all of K unless split-K) as the loader fills them. False (and `stall` filled) when a
// stage never arrived within the budget.
template <class Cfg>
__device__ __forceinline__ bool mma_tile(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                         weft_gemm_tile tile, uint32_t k_blocks, PipelineState<Cfg::kStages>& ps,
                                         float (&acc)[Cfg::kAccumulators], ConsumerStall& stall) {
  int prev_stage = -1;
  for (uint32_t kb = 0; kb < k_blocks; ++kb) {
    if (!mbar_try_wait(sm.full(ps.stage), ps.phase)) {
      const uint64_t t0 = weft::sync::globaltimer_ns();
      if (!mbar_wait_bounded(sm.full(ps.stage), ps.phase, p.bound.budget_cycles)) {
        // Waited at least the whole budget (mbar_wait_bounded does not return its count).
        stall = ConsumerStall{1, static_cast<uint32_t>(ps.stage), ps.phase,
                              tile, p.bound.budget_cycles,
                              weft::sync::globaltimer_ns() - t0};
        wgmma_wait<0>();  // leave no batch in flight on the way out
        accumulator_fence(acc);
        return false;
      }
    }
    const uint32_t a_base = smem_addr(sm.a(ps.stage)) + consumer * 64 * 128;
    const uint32_t b_base = smem_addr(sm.b(ps.stage));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK / 16; ++kk) {
      // A (K-major): a k16 step is 32 bytes along the swizzled row. B K-major likewise; B N-major:
      // a k16 step is 16 rows of 128 bytes, column blocks kBColBlockBytes apart.
      const uint64_t da = smem_desc_sw128(a_base + kk * 32, 16, 1024);
      const uint64_t db = Cfg::kBNK ? smem_desc_sw128(b_base + kk * 32, 16, 1024)
                                    : smem_desc_sw128(b_base + kk * 16 * 128, Cfg::kBColBlockBytes, 1024);
      Cfg::Mma::mma(acc, da, db, (kb > 0 || kk > 0) ? 1u : 0u);
    }
    wgmma_commit();
    if (prev_stage >= 0) {
      wgmma_wait<1>();  // the previous batch has retired: its stage may be refilled
      release_stage(sm, prev_stage);
    }
    prev_stage = ps.stage;
    ps.advance();
  }
  wgmma_wait<0>();
  accumulator_fence(acc);
  release_stage(sm, prev_stage);
  return true;
}

// Reports a consumer stall (MBARRIER_WAIT on a full barrier, or GEMM_SPLIT_K) and traps.
__device__ __forceinline__ void report_stall(const weft_gemm_params& p, const ConsumerStall& stall) {
  weft::sync::failure f{};
  f.status = WEFT_SYNC_STATUS_TIMEOUT;
  f.primitive = static_cast<int32_t>(stall.primitive);
  f.role = WEFT_ROLE_GEMM_CONSUMER;
  f.target_rank = p.rank;  // its own CTA's barriers (split-K: its own partials)
  f.coord = weft_tile_coord{0, stall.stage, stall.tile.tm, stall.tile.tn};
  f.expected = stall.parity;
  f.observed = stall.primitive == WEFT_SYNC_PRIM_MBARRIER_WAIT ? stall.parity ^ 1u : stall.observed;
  f.elapsed_cycles = stall.cycles;
  f.elapsed_ns = stall.ns;
  weft::sync::fail_inline(p.bound, p.rank, f);
}

}  // namespace weft::gemm
