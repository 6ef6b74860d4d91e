// The GEMM kernel template: a persistent, warp-specialized sm_90a GEMM assembled from roles.
//
//   CTA < ctas (compute):  warpgroup 0 = loader (TMA, one thread, registers released) and, when
//                          the launch signals, a signaller thread per consumer (signaller.cuh);
//                          with the PEER_REDUCE layout, warps 1..3 zero the output and run the
//                          cross-rank barriers instead (peer_reduce.cuh; PEER_ROWS and the
//                          fused AllGather: the barriers only)
//                          warpgroups 1..kConsumers = consumers (wgmma) + Storer (epilogue)
//   CTA >= ctas:           Communicator (reserved SMs; see communicator.cuh)
//
// With clusters of kClusterM CTAs along M, the CTAs of a cluster compute vertically adjacent
// tiles of one column in lockstep and share the B tile through TMA multicast; every thread of
// the cluster meets at a cluster barrier after initialisation and before exit.
//
// Every compute CTA walks the same schedule (weft_gemm_tile_at: orders blockIdx.x, + ctas, ...,
// or orders claimed from a counter with dynamic scheduling; with split-K, work units of an order's
// K range, split_k.cuh): the loader picks the orders and hands each to the consumers with the
// tile's first stage, through a ring of kStages shared-memory
// stages paced by mbarriers (full: TMA bytes landed; empty: all consumer warps done). New epilogues (signals,
// reorder maps, peer stores) and communicators plug in as the Storer / Communicator parameters
// without touching the main loop. Cfg::kFusions (config.cuh) says which fused roles the kernel
// has: the plain kernel none (no signallers, peer barriers, fused AllGather source or
// communicator), a fused method's own only that method's roles.
#pragma once
#include "weft/sm90/cluster.cuh"
#include "weft/abi/gemm.h"
#include "weft/gemm/communicator.cuh"
#include "weft/gemm/config.cuh"
#include "weft/gemm/consumer.cuh"
#include "weft/gemm/loader.cuh"
#include "weft/gemm/peer_reduce.cuh"
#include "weft/gemm/split_k.cuh"
#include "weft/gemm/storer.cuh"
#include "weft/sm90/mbarrier.cuh"
#include "weft/tma/tensor_copy.cuh"
#include "weft/sm90/warpgroup.cuh"

namespace weft::gemm {

// Register budget per thread after reallocation: 40 for the loader warpgroup, the rest shared by
// the consumers (2 consumers: 40*128 + 232*256 = 64512 <= 65536).
constexpr uint32_t kLoaderRegs = 40;
constexpr uint32_t kConsumerRegs = 232;

template <class Cfg, class Storer, class Communicator>
__device__ __forceinline__ void gemm_kernel_body(const weft_gemm_params& p) {
  extern __shared__ uint8_t smem_raw[];
  const SharedTiles<Cfg> sm(smem_raw);
  if (blockIdx.x >= p.sched.ctas) {
    Communicator::template run<Cfg>(p, sm);
    return;
  }
  if (threadIdx.x == 0) {
    // The host sizes shared memory with weft_gemm_smem_bytes: a mismatch is a build bug, reported
    // (status SMEM, expected = bytes needed, observed = bytes given) rather than a corrupt run.
    uint32_t given;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < Cfg::kSmemBytes) {
      weft::sync::failure f{};
      f.status = WEFT_SYNC_STATUS_SMEM;
      f.role = WEFT_ROLE_GEMM_SETUP;
      f.target_rank = p.rank;
      f.expected = Cfg::kSmemBytes;
      f.observed = given;
      weft::sync::fail_inline(p.bound, p.rank, f);
    }
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(sm.full(s), 1);                      // the loader's expect_tx arrival
      mbar_init(sm.empty(s), Cfg::kConsumers * 4 * Cfg::kClusterM);  // per consumer warp of the cluster
    }
    for (int c = 0; c < Cfg::kConsumers; ++c) {
      for (int s = 0; s < Cfg::kSignalSlots; ++s) {
        mbar_init(sm.signal_full(c, s), 1);   // the consumer's leader, once it wrote the slot
        mbar_init(sm.signal_empty(c, s), 1);  // the signaller, once it issued the release
      }
    }
    mbar_init(sm.peer_done(), Cfg::kConsumers);  // peer barriers: each consumer's leader, drained
    *sm.peer_flag() = 0;
    *sm.ag_stall() = 0;
    mbar_fence_init();
    if (p.timeline != 0) atomicMin(reinterpret_cast<unsigned long long*>(p.timeline), weft::sync::globaltimer_ns());
    tensor_map_prefetch(&p.a);
    tensor_map_prefetch(&p.b);
    tensor_map_prefetch(&p.d);
  }
  // The last block-wide barrier: the roles below diverge for good. With clusters, the peer's
  // barriers must be initialised before this CTA multicasts into them or arrives on them.
  if constexpr (Cfg::kClusterM == 1) {
    __syncthreads();
  } else {
    cluster_sync();
  }

  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<kLoaderRegs>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
    if (threadIdx.x == 0) {
      run_loader<Cfg>(p, sm);
    } else if (warp >= 1 && uses_peer_barriers<Cfg>(p)) {  // warps 1..3; no signallers then (uses_signals is false)
      if (uses_peer_reduce<Cfg>(p)) {
        peer_reduce_start<Cfg>(p);
      } else if (threadIdx.x == 96) {
        // AllGather: this rank's shard was written before the launch (stream order); PEER_ROWS:
        // this rank's D was read before it.
        peer_bar_arrive(p, WEFT_GEMM_PEER_BAR_START);
      }
      if (threadIdx.x == 96) run_peer_barrier<Cfg>(p, sm);
    } else if (threadIdx.x % 32 == 0 && warp >= 1 && warp <= Cfg::kConsumers && uses_signals<Cfg>(p)) {
      run_signaller<Cfg>(p, sm, warp - 1);
    }
    __syncwarp();
  } else {
    warpgroup_claim_registers<kConsumerRegs>();
    const int consumer = wg - 1;
    PipelineState<Cfg::kStages> ps;
    StoreState store_state;
    ConsumerStall stall;
    {
      float acc[Cfg::kAccumulators];
      const uint32_t splits = work_splits<Cfg>(p);
      for (;;) {
        const StageWork next = next_work<Cfg>(p, sm, ps, stall);
        const uint32_t work = next.work;
        if (work == WEFT_GEMM_NO_TILE) break;
        const KBlocks kbs = work_k_blocks<Cfg>(p, work);
        const weft_gemm_tile t = next.tile;
        if (!mma_tile<Cfg>(p, sm, consumer, t, kbs.end - kbs.begin, ps, acc, stall)) break;
        const uint32_t order = work / splits, split = work % splits;
        if (splits > 1) {
          // Split-K: an earlier split hands its partial over; the last adds them and stores.
          if (split + 1 < splits) {
            hand_over_partial<Cfg>(p, consumer, t, split, acc);
            continue;
          }
          if (!add_partials<Cfg>(p, consumer, t, acc, stall)) break;
        }
        Storer::template store<Cfg>(p, sm, consumer, t, order, acc, store_state);
      }
    }
    Storer::template drain<Cfg>(p, sm, consumer, store_state, stall.stalled != 0);
    if (uses_peer_barriers<Cfg>(p) && !stall.stalled && thread_in_warpgroup() == 0)
      peer_reduce_drained(sm, store_state.peer_stalled);
    // After drain: this warpgroup's stores have completed and its last signals are handed to its
    // signaller (which issues them a moment later: the timeline's end leaves that out).
    if (p.timeline != 0 && thread_in_warpgroup() == 0)
      atomicMax(reinterpret_cast<unsigned long long*>(p.timeline) + 1, weft::sync::globaltimer_ns());
    if (stall.stalled) report_stall(p, stall);
  }
  // No CTA leaves while a peer may still arrive on its empty barriers.
  if constexpr (Cfg::kClusterM > 1) cluster_sync();
}

}  // namespace weft::gemm
