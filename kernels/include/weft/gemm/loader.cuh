// The loader role: one thread of warpgroup 0 takes the CTA's work units (tiles, or with split-K
// their K ranges) in schedule order and, for each K block, waits for a free stage and issues the
// TMA loads of the A and B tiles into it. It tells the consumers which unit comes next through
// the stage of the unit's first K block (with its tile), and ends with a stage that carries WEFT_GEMM_NO_TILE and
// no bytes.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/sm90/cluster.cuh"
#include "weft/gemm/ag_chunk.cuh"
#include "weft/gemm/config.cuh"
#include "weft/gemm/peer_reduce.cuh"
#include "weft/sync/mbarrier_wait.cuh"
#include "weft/tma/tensor_copy.cuh"

namespace weft::gemm {


// The CTA's next work unit (its tile's order unless split-K): static, `current` + ctas; dynamic, a
// claim on the launch's counter (a relaxed atomic: the claim carries no data). `current` =
// WEFT_GEMM_NO_TILE asks for the first.
__device__ __forceinline__ uint32_t next_order(const weft_gemm_params& p, uint32_t current) {
  if (p.claim_counter == 0) return current == WEFT_GEMM_NO_TILE ? blockIdx.x : current + p.sched.ctas;
  return atomicAdd(reinterpret_cast<unsigned int*>(p.claim_counter), 1u) - p.claim_base;
}

template <class Cfg>
__device__ __forceinline__ void run_loader(const weft_gemm_params& p, const SharedTiles<Cfg>& sm) {
  const weft_gemm_schedule& s = p.sched;
  const uint32_t splits = work_splits<Cfg>(p), works = weft_gemm_order_count(s) * splits;
  PipelineState<Cfg::kStages> ps;
  uint32_t work = next_order(p, WEFT_GEMM_NO_TILE);  // a work unit: the order itself unless split-K
  bool peers_ready = false;  // AllGather: every rank's shard written (START passed)
  while (work < works) {
    const uint32_t next = next_order(p, work);  // the claim's latency hides behind this tile's loads
    const KBlocks kbs = work_k_blocks<Cfg>(p, work);
    const weft_gemm_tile t = weft_gemm_tile_at(s, work / splits);
    const int32_t m0 = static_cast<int32_t>(t.tm * Cfg::kBM), n0 = static_cast<int32_t>(t.tn * Cfg::kBN);
    // Where the A tile comes from: `a`, or (AllGather) its owner's shard, local or peer. A peer's
    // shard only after START (acquire, system scope), then a proxy fence: its generic writes
    // before this thread's TMA reads. Inter-SM (ag_copy.cuh) and copy engines: a peer's rows
    // from `a`, the gathered copy, once their chunk was flagged.
    const void* a_map = &p.a;
    int32_t a_row = m0;
    // The K block that starts the gathered copy's next K chunk (kNoPoll: no more polls).
    constexpr uint32_t kNoPoll = 0xFFFFFFFFu;
    uint32_t poll_kb = kNoPoll;
    if (uses_all_gather_a<Cfg>(p)) {
      const uint32_t owner = t.tm * Cfg::kBM / p.ag_rows;
      if (static_cast<int32_t>(owner) == p.peer_bar.view.rank || !ag_inter(p)) {
        if (static_cast<int32_t>(owner) != p.peer_bar.view.rank && !peers_ready) {
          // A poll only (a report inline spills the loader's 40 registers): a give-up raises the
          // START-stall flag, which the peer-barrier thread reports once the consumers drained.
          if (!peer_bar_poll(p, WEFT_GEMM_PEER_BAR_START)) *sm.peer_flag() = 1;
          weft::sync::mo::fence_proxy_async_global();
          peers_ready = true;
        }
        a_map = ag_map(p, owner);
        a_row = m0 - static_cast<int32_t>(owner * p.ag_rows);
      } else {
        // The gathered copy: the chunk of the unit's first K block now, and with K chunks
        // (copy engines, the AllGather's own kernel) each later one before its first K block.
        // A poll that gave up ends the tile's polls (at most one give-up per tile, as without K
        // chunks).
        const uint32_t k_chunk = ag_k_chunked<Cfg>(p) ? kbs.begin / p.ag_copy.k_chunk_blocks : 0u;
        const bool landed = ag_chunk_poll<Cfg>(p, t.tm, k_chunk);
        if (!landed) *sm.ag_stall() = ag_stall_code(p, t.tm, k_chunk);
        poll_kb = ag_k_chunked<Cfg>(p) && landed ? (k_chunk + 1) * p.ag_copy.k_chunk_blocks : kNoPoll;
      }
    }
    for (uint32_t kb = kbs.begin; kb < kbs.end; ++kb) {
      if (ag_k_chunked<Cfg>(p) && kb == poll_kb) {
        const uint32_t k_chunk = kb / p.ag_copy.k_chunk_blocks;
        if (ag_chunk_poll<Cfg>(p, t.tm, k_chunk)) {
          poll_kb += p.ag_copy.k_chunk_blocks;
        } else {
          *sm.ag_stall() = ag_stall_code(p, t.tm, k_chunk);
          poll_kb = kNoPoll;
        }
      }
      // Parity phase ^ 1: a fresh barrier counts as having completed the phase before phase 0.
      weft::sync::mbarrier_wait<true>(sm.empty(ps.stage), ps.phase ^ 1u, p.bound, p.rank,
                                      weft_tile_coord{0, static_cast<uint32_t>(ps.stage), t.tm, t.tn}, WEFT_ROLE_GEMM_LOADER);
      uint64_t* full = sm.full(ps.stage);
      if (kb == kbs.begin) *sm.work(ps.stage) = StageWork{work, t};  // released to the consumers by the arrival below
      mbar_arrive_expect_tx(full, Cfg::kABytes + Cfg::kBBytes);
      const int32_t k0 = static_cast<int32_t>(kb * Cfg::kBK);
      tensor_load_2d(sm.a(ps.stage), a_map, full, k0, a_row);
      if constexpr (Cfg::kClusterM == 1) {
        if constexpr (Cfg::kBNK) {
          tensor_load_2d(sm.b(ps.stage), &p.b, full, k0, n0);
        } else {
#pragma unroll
          for (int j = 0; j < Cfg::kBN / 64; ++j)
            tensor_load_2d(sm.b(ps.stage) + j * Cfg::kBColBlockBytes, &p.b, full, n0 + 64 * j, k0);
        }
      } else {
        // This CTA's share of the B tile, multicast into every CTA of the cluster (same offset,
        // each completing on its own full[stage]; the empty wait above covered all of them).
        constexpr uint16_t kAll = (1u << Cfg::kClusterM) - 1;
        const uint32_t rank = cluster_cta_rank();
        if constexpr (Cfg::kBNK) {
          constexpr int kRows = Cfg::kBN / Cfg::kClusterM;  // the B map's box is kRows x 64
          tensor_load_2d_multicast(sm.b(ps.stage) + rank * kRows * 128, &p.b, full, k0, n0 + rank * kRows, kAll);
        } else {
          constexpr int kBlocks = Cfg::kBN / 64 / Cfg::kClusterM;
#pragma unroll
          for (int i = 0; i < kBlocks; ++i) {
            const int j = rank * kBlocks + i;
            tensor_load_2d_multicast(sm.b(ps.stage) + j * Cfg::kBColBlockBytes, &p.b, full, n0 + 64 * j, k0, kAll);
          }
        }
      }
      ps.advance();
    }
    work = next;
  }
  // No more tiles: a stage with no bytes whose order says so (with clusters both CTAs of a cluster
  // run the same number of tiles, so no peer multicasts into it).
  weft::sync::mbarrier_wait<true>(sm.empty(ps.stage), ps.phase ^ 1u, p.bound, p.rank,
                                  weft_tile_coord{0, static_cast<uint32_t>(ps.stage), WEFT_GEMM_NO_TILE, 0}, WEFT_ROLE_GEMM_LOADER);
  sm.work(ps.stage)->work = WEFT_GEMM_NO_TILE;
  mbar_arrive(sm.full(ps.stage));
}

}  // namespace weft::gemm
