// Compile-time shape of one GEMM kernel: element types, tile, pipeline depth and the shared-memory
// layout every role agrees on. Device-only C++.
//
// Block: warpgroup 0 is the loader (one thread issues TMA), warpgroups 1..kConsumers are the
// consumers (wgmma) and store their own rows of the tile (the storer role runs on them). Tile
// kBM x kBN x kBK; consumer c owns rows [64c, 64c + 64) of the tile.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "weft/abi/gemm.h"
#include "weft/gemm/wgmma.cuh"

namespace weft::gemm {

template <class T> struct InputTag;
template <> struct InputTag<__nv_bfloat16> { using type = Bf16Tag; };
template <> struct InputTag<__half> { using type = F16Tag; };

// The fusion set a kernel carries (its type, GemmConfig's kFusions):
//   kFusionsNone         the plain kernel: standard layout, no signals, no trace (`_plain`);
//   kFusionsAll          every fusion, picked at run time from the parameters: output layouts
//                        other than the standard one, tile and wave-group signals, peer stores and
//                        reduces, the fused AllGather, the communicator CTAs, the trace;
//   kFusionsPeerReduce   the fused GEMM + ReduceScatter alone (`_pr`): the PEER_REDUCE layout and
//                        its barriers known at compile time, every other fusion compiled out;
//   kFusionsAllGather    the fused AllGather alone (`_ag`): A read from the owners' shards or
//                        the gathered copy, the START / END barriers, its communicator CTAs;
//   kFusionsAllReduce    the fused AllReduce alone (`_ar`): standard layout, tile flags raised
//                        by the signallers, its communicator CTAs;
//   kFusionsPeerRows     the fused All-to-All alone (`_a2a`): the PEER_ROWS layout and its
//                        barriers known at compile time.
// The fused code made every plain launch pay (about 176 KB of kernel against 57 KB, up to 1.5x the
// time of a short GEMM), and each fused method paid for the others' (crates/signal-gemm/README.md).
constexpr int kFusionsNone = 0;
constexpr int kFusionsAll = 1;
constexpr int kFusionsPeerReduce = 2;
constexpr int kFusionsAllGather = 3;
constexpr int kFusionsAllReduce = 4;
constexpr int kFusionsPeerRows = 5;

// kBNK: B is n x k row-major (K-major, the usual weight layout); otherwise k x n row-major.
template <class In_, class Out_, int kBN_, bool kBNK_, int kClusterM_, int kEpilogue_, int kFusions_, bool kSplit_>
struct GemmConfig {
  using In = In_;
  using Out = Out_;
  static constexpr int kBM = WEFT_GEMM_TILE_M, kBN = kBN_, kBK = WEFT_GEMM_TILE_K;
  static constexpr bool kBNK = kBNK_;
  static_assert(kFusions_ >= kFusionsNone && kFusions_ <= kFusionsPeerRows, "a fusion set");
  static constexpr int kFusions = kFusions_;
  static constexpr bool kAllFusions = kFusions == kFusionsAll;      // chosen at run time
  static constexpr bool kPeerReduceOnly = kFusions == kFusionsPeerReduce;
  static constexpr bool kAllGatherOnly = kFusions == kFusionsAllGather;
  static constexpr bool kAllReduceOnly = kFusions == kFusionsAllReduce;
  static constexpr bool kPeerRowsOnly = kFusions == kFusionsPeerRows;
  // Epilogue variant (WEFT_GEMM_EPI_*, abi/gemm.h) and the pipeline depth that fits beside it: the
  // mirrors of weft_gemm_stages / weft_gemm_epi_bufs (the host's sizes), checked against them with
  // the whole layout below (kSmemBytes == weft_gemm_smem_bytes); the kernel also checks
  // %dynamic_smem_size against kSmemBytes at run time.
  static constexpr int kEpilogue = kEpilogue_;
  static constexpr int kStages = kBN_ == 256 ? (kEpilogue == WEFT_GEMM_EPI_WHOLE_TILE ? 3 : 4) : kBN_ == 192 ? 4 : 6;
  // CTAs per cluster along M: they compute vertically adjacent tiles of one column and share its
  // B tile, each loading 1/kClusterM of it with TMA multicast to all.
  static constexpr int kClusterM = kClusterM_;
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs");
  static_assert(kBN == 128 || kBN == 192 || kBN == 256, "tiles 128, 192 or 256 columns wide (whole 64-column B blocks)");
  static constexpr int kConsumers = kBM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static_assert(kThreads == WEFT_GEMM_THREADS && kConsumers == WEFT_GEMM_CONSUMERS, "the host launches WEFT_GEMM_THREADS threads");
  static constexpr int kAccumulators = kBN / 2;  // fp32 per thread for a 64 x kBN warpgroup tile
  // Split-K (split_k.cuh) in this kernel: where asked (kSplit_: the kernel with every fusion and the
  // `_plain_split` ones; the `_plain` ones run unsplit launches without its code), not with
  // clusters (the host refuses them), nor with 16-bit outputs, 128 x 256 tiles and the pipelined
  // epilogue, whose consumers then spill their accumulators (the host plans split 128 x 256
  // 16-bit GEMMs with the whole-tile epilogue instead; GemmPlan::new).
  static constexpr bool kSplitK = kSplit_ && kClusterM_ == 1 &&
                                  !(kBN == 256 && sizeof(Out) == 2 && kEpilogue == WEFT_GEMM_EPI_PIPELINED);
  using Mma = WgmmaSS<kBN, typename InputTag<In>::type, kBNK ? 0 : 1>;

  // One 128-byte swizzle row per operand row: kBK elements of 2 bytes.
  static_assert(kBK * sizeof(In) == 128, "tiles are 128-byte swizzled along K");
  static constexpr uint32_t kABytes = kBM * kBK * sizeof(In);
  static constexpr uint32_t kBBytes = kBN * kBK * sizeof(In);
  // k x n B arrives as kBN / 64 column blocks of kBK rows x 128 bytes.
  static constexpr uint32_t kBColBlockBytes = kBK * 128;

  // Epilogue: each consumer stores its 64 rows in chunks of one 128-byte swizzle row of columns,
  // double-buffered so the TMA store of one chunk overlaps the writing of the next.
  static constexpr int kEpiCols = 128 / sizeof(Out);
  static constexpr int kEpiChunks = kBN / kEpiCols;
  static constexpr uint32_t kEpiBufBytes = WEFT_GEMM_EPI_BUF_BYTES;
  static constexpr int kEpiBufs = kEpilogue == WEFT_GEMM_EPI_WHOLE_TILE ? kBN * 2 / 128 : 2;
  static_assert(kEpilogue != WEFT_GEMM_EPI_WHOLE_TILE || (sizeof(Out) == 2 && kEpiBufs == kEpiChunks),
                "the whole-tile epilogue holds a 16-bit half tile, one buffer per chunk");

  // Shared memory (offsets from a 1024-byte aligned base; swizzled tiles need that alignment).
  static constexpr uint32_t kOffA = 0;
  static constexpr uint32_t kOffB = kOffA + kStages * kABytes;
  static constexpr uint32_t kOffEpi = kOffB + kStages * kBBytes;
  static constexpr uint32_t kOffBars = kOffEpi + kConsumers * kEpiBufs * kEpiBufBytes;
  static constexpr uint32_t kBarBytes = 2 * kStages * 8;
  static constexpr uint32_t kOffOrders = kOffBars + kBarBytes;  // a StageWork (16 bytes) per stage
  // Per consumer, a ring of WEFT_GEMM_SIGNAL_SLOTS signal slots: full and empty mbarriers, then
  // the slots (address and value, 16 bytes each).
  static constexpr int kSignalSlots = WEFT_GEMM_SIGNAL_SLOTS;
  static constexpr uint32_t kOffSignals = kOffOrders + kStages * 16;
  static constexpr uint32_t kSignalBytes = kConsumers * kSignalSlots * 32;
  // PEER_REDUCE (peer_reduce.cuh): the consumers-drained mbarrier, the START-stall flag and the
  // gathered A's chunk stall (ag_chunk.cuh).
  static constexpr uint32_t kOffPeer = kOffSignals + kSignalBytes;
  static constexpr uint32_t kPeerBytes = 16;
  static constexpr uint32_t kSmemBytes = 1024 + kOffPeer + kPeerBytes;  // + alignment slack
  static_assert(kSmemBytes <= 232448, "shared memory over the sm_90 per-block limit");
  static_assert(sizeof(In) != 2 || kSmemBytes == weft_gemm_smem_bytes(kBN, kEpilogue),
                "the host sizes shared memory with weft_gemm_smem_bytes (abi/gemm.h): keep it the layout above");
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "stage buffers keep 1024-byte alignment");
};

// Work units per tile order in this launch: the schedule's splits where the kernel has split-K.
template <class Cfg>
__device__ __forceinline__ uint32_t work_splits(const weft_gemm_params& p) {
  return Cfg::kSplitK ? weft_gemm_splits(p.sched) : 1u;
}

// The K blocks [begin, end) of work unit `work` (all of K without split-K): the one definition
// the loader and the consumers share.
struct KBlocks {
  uint32_t begin, end;
};
template <class Cfg>
__device__ __forceinline__ KBlocks work_k_blocks(const weft_gemm_params& p, uint32_t work) {
  const uint32_t splits = work_splits<Cfg>(p);
  if (splits == 1) return KBlocks{0u, weft_gemm_k_blocks(p.sched)};
  const uint32_t split = work % splits;
  return KBlocks{weft_gemm_split_begin(p.sched, split), weft_gemm_split_begin(p.sched, split + 1)};
}

// The work unit (the tile's order unless split-K; WEFT_GEMM_NO_TILE after the last) whose first K
// block a stage holds, with its tile: the loader computes the tile for its loads and hands it over,
// so the consumers do not repeat the schedule's divisions after every main loop.
struct StageWork {
  uint32_t work;
  weft_gemm_tile tile;
};
static_assert(sizeof(StageWork) == 16, "a StageWork per stage takes 16 bytes of shared memory");

// Shared-memory view of one CTA, from the dynamic shared memory base.
template <class Cfg>
struct SharedTiles {
  uint8_t* base;
  __device__ __forceinline__ explicit SharedTiles(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))) {}
  __device__ __forceinline__ uint8_t* a(int stage) const { return base + Cfg::kOffA + stage * Cfg::kABytes; }
  __device__ __forceinline__ uint8_t* b(int stage) const { return base + Cfg::kOffB + stage * Cfg::kBBytes; }
  __device__ __forceinline__ uint8_t* epi(int consumer, int buf) const {
    return base + Cfg::kOffEpi + (consumer * Cfg::kEpiBufs + buf) * Cfg::kEpiBufBytes;
  }
  // full[s]: the TMA bytes of stage s have landed (this CTA's loads and, with clusters, the
  // peers' multicast share). empty[s]: every consumer warp of every CTA of the cluster is done
  // reading stage s (any of the cluster's loaders may write it next).
  __device__ __forceinline__ uint64_t* full(int stage) const { return reinterpret_cast<uint64_t*>(base + Cfg::kOffBars) + stage; }
  __device__ __forceinline__ uint64_t* empty(int stage) const {
    return reinterpret_cast<uint64_t*>(base + Cfg::kOffBars) + Cfg::kStages + stage;
  }
  // The work unit whose first K block is in stage s, and its tile: written by the loader before
  // its arrival on full[s], read by the consumers after their wait on it.
  __device__ __forceinline__ StageWork* work(int stage) const {
    return reinterpret_cast<StageWork*>(base + Cfg::kOffOrders) + stage;
  }
  // Consumer c's signal ring (storer.cuh): signal_full(c, s) completes when the consumer's leader
  // has written slot s; signal_empty(c, s) when its signaller has issued the slot's release.
  __device__ __forceinline__ uint64_t* signal_full(int consumer, int slot) const {
    return reinterpret_cast<uint64_t*>(base + Cfg::kOffSignals) + consumer * Cfg::kSignalSlots + slot;
  }
  __device__ __forceinline__ uint64_t* signal_empty(int consumer, int slot) const {
    return reinterpret_cast<uint64_t*>(base + Cfg::kOffSignals) + (Cfg::kConsumers + consumer) * Cfg::kSignalSlots + slot;
  }
  // PEER_REDUCE: peer_done completes when every consumer's leader has drained (its reduces
  // complete); peer_flag is set by a leader whose wait for START gave up.
  __device__ __forceinline__ uint64_t* peer_done() const { return reinterpret_cast<uint64_t*>(base + Cfg::kOffPeer); }
  __device__ __forceinline__ volatile uint32_t* peer_flag() const {
    return reinterpret_cast<volatile uint32_t*>(base + Cfg::kOffPeer + 8);
  }
  // Fused AllGather's gathered A: 0, or the chunk the loader gave up waiting for (ag_stall_code).
  __device__ __forceinline__ volatile uint32_t* ag_stall() const {
    return reinterpret_cast<volatile uint32_t*>(base + Cfg::kOffPeer + 12);
  }
  __device__ __forceinline__ uint64_t* signal_slot(int consumer, int slot) const {
    return reinterpret_cast<uint64_t*>(base + Cfg::kOffSignals) + 2 * Cfg::kConsumers * Cfg::kSignalSlots +
           2 * (consumer * Cfg::kSignalSlots + slot);
  }
};

// Position in the ring of stages: stage index and the parity of its current phase.
template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

}  // namespace weft::gemm
