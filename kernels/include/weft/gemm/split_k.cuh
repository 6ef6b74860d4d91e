// Split-K's fix-up (abi/gemm.h, "Split-K"), run by each consumer warpgroup on its own 64 rows once its
// work unit's main loop is done: an earlier split hands its fp32 accumulators to the tile's last
// split through global memory; the last split adds them to its own before the storer runs.
//
// Ordering (CUTLASS's generic barrier, per tile and consumer): every thread of an earlier split
// stores its partial, the warpgroup meets at a named barrier, then the leader adds 1 to the flag
// with a GPU-scope release (the barrier puts the other threads' stores before it). The last
// split's leader polls the flag with GPU-scope acquire until every earlier split has added, then
// resets it for the next launch; the warpgroup meets at a barrier before any thread reads a
// partial. Partials move through L2 (.cg): they are written once and read once, by another SM.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/gemm/config.cuh"
#include "weft/gemm/consumer.cuh"
#include "weft/sync/clock.cuh"
#include "weft/sync/memory_order.cuh"
#include "weft/sm90/warpgroup.cuh"

namespace weft::gemm {

// Split `split`'s partial of consumer `consumer` of tile `t` (float4 j of thread i at [j * 128 + i]);
// a consumer's partials of one tile are consecutive, in split order.
template <class Cfg>
__device__ __forceinline__ float4* split_partial(const weft_gemm_params& p, int consumer, weft_gemm_tile t, uint32_t split) {
  const uint64_t earlier = work_splits<Cfg>(p) - 1u;
  const uint64_t slot = (uint64_t(weft_gemm_tile_index(p.sched, t)) * Cfg::kConsumers + consumer) * earlier + split;
  return reinterpret_cast<float4*>(p.split_partials) + slot * (Cfg::kAccumulators / 4) * kWarpgroupThreads;
}

template <class Cfg>
__device__ __forceinline__ uint64_t* split_flag(const weft_gemm_params& p, int consumer, weft_gemm_tile t) {
  return reinterpret_cast<uint64_t*>(p.split_flags) + uint64_t(weft_gemm_tile_index(p.sched, t)) * Cfg::kConsumers + consumer;
}

// An earlier split (split < S - 1): its accumulators to its partial, then the tile's flag.
template <class Cfg>
__device__ __forceinline__ void hand_over_partial(const weft_gemm_params& p, int consumer, weft_gemm_tile t,
                                                  uint32_t split, const float (&acc)[Cfg::kAccumulators]) {
  float4* out = split_partial<Cfg>(p, consumer, t, split) + thread_in_warpgroup();
#pragma unroll
  for (int j = 0; j < Cfg::kAccumulators / 4; ++j)
    __stcg(out + j * kWarpgroupThreads, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  named_barrier_sync(1 + consumer, kWarpgroupThreads);  // every thread's stores before the release
  if (thread_in_warpgroup() == 0) weft::sync::mo::red_add_release_gpu(split_flag<Cfg>(p, consumer, t), 1);
}

// The last split: waits (bounded) until the S - 1 earlier splits released their partials, then
// adds them to `acc` in split order. False, with `stall` filled (GEMM_SPLIT_K), when the leader
// gave up; every thread of the warpgroup learns it from the barrier.
template <class Cfg>
__device__ __forceinline__ bool add_partials(const weft_gemm_params& p, int consumer, weft_gemm_tile t,
                                             float (&acc)[Cfg::kAccumulators], ConsumerStall& stall) {
  const uint32_t earlier = work_splits<Cfg>(p) - 1u;
  bool gave_up = false;
  if (thread_in_warpgroup() == 0) {
    uint64_t* flag = split_flag<Cfg>(p, consumer, t);
    uint64_t seen = weft::sync::mo::ld_acquire_gpu(flag);
    if (seen < earlier) {
      const uint64_t c0 = clock64(), t0 = weft::sync::globaltimer_ns();
      while ((seen = weft::sync::mo::ld_acquire_gpu(flag)) < earlier) {
        const uint64_t spent = static_cast<uint64_t>(clock64()) - c0;
        if (spent > p.bound.budget_cycles) {
          stall = ConsumerStall{1, static_cast<uint32_t>(consumer), earlier, t, spent, weft::sync::globaltimer_ns() - t0,
                                WEFT_SYNC_PRIM_GEMM_SPLIT_K, static_cast<uint32_t>(seen)};
          gave_up = true;
          break;
        }
      }
    }
    // Read by no one else in this launch: the next launch (stream order) finds 0.
    if (!gave_up) weft::sync::mo::st_relaxed_gpu(flag, 0);
  }
  if (named_barrier_or(1 + consumer, kWarpgroupThreads, gave_up)) return false;
  const float4* in = split_partial<Cfg>(p, consumer, t, 0) + thread_in_warpgroup();
  for (uint32_t s = 0; s < earlier; ++s, in += (Cfg::kAccumulators / 4) * kWarpgroupThreads) {
#pragma unroll
    for (int j = 0; j < Cfg::kAccumulators / 4; ++j) {
      const float4 v = __ldcg(in + j * kWarpgroupThreads);
      acc[4 * j] += v.x;
      acc[4 * j + 1] += v.y;
      acc[4 * j + 2] += v.z;
      acc[4 * j + 3] += v.w;
    }
  }
  return true;
}

}  // namespace weft::gemm
