// Stream-K's fix-up (abi/gemm.h, "Stream-K"; split-K is its special case), run by each consumer
// warpgroup on its own 64 rows once a work item's main loop is done: an item that does not hold
// its tile's first K block hands its fp32 accumulators to the tile's storer through global memory
// (its unit's partial slot); the storer adds them to its own before the storer role runs.
//
// Ordering (CUTLASS's generic barrier, per tile and consumer): every thread of a contributing item
// stores its partial, the warpgroup meets at a named barrier, then the leader adds 1 to the flag
// with a GPU-scope release (the barrier puts the other threads' stores before it). The storer's
// leader polls the flag with GPU-scope acquire until every contributor has added, then resets it
// for the next launch; the warpgroup meets at a barrier before any thread reads a partial.
// Partials move through L2 (.cg): they are written once and read once, by another SM.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/gemm/config.cuh"
#include "weft/gemm/consumer.cuh"
#include "weft/sync/clock.cuh"
#include "weft/sync/memory_order.cuh"
#include "weft/sm90/warpgroup.cuh"

namespace weft::gemm {

// Unit `unit`'s partial of consumer `consumer` (float4 j of thread i at [j * 128 + i]).
template <class Cfg>
__device__ __forceinline__ float4* unit_partial(const weft_gemm_params& p, int consumer, uint32_t unit) {
  const uint64_t slot = uint64_t(unit) * Cfg::kConsumers + consumer;
  return reinterpret_cast<float4*>(p.split_partials) + slot * (Cfg::kAccumulators / 4) * kWarpgroupThreads;
}

// The flag of stream-K tile `order` (an order at or after the data-parallel ones) for `consumer`.
template <class Cfg>
__device__ __forceinline__ uint64_t* tile_flag(const weft_gemm_params& p, int consumer, uint32_t order) {
  const uint32_t sk_tile = order - weft_gemm_dp_orders(p.sched);
  return reinterpret_cast<uint64_t*>(p.split_flags) + uint64_t(sk_tile) * Cfg::kConsumers + consumer;
}

// A contributing item (k_begin > 0, the first item of its unit): its accumulators to the unit's
// partial, then the tile's flag.
template <class Cfg>
__device__ __forceinline__ void hand_over_partial(const weft_gemm_params& p, int consumer, const weft_gemm_work& w,
                                                  const float (&acc)[Cfg::kAccumulators]) {
  float4* out = unit_partial<Cfg>(p, consumer, w.unit) + thread_in_warpgroup();
#pragma unroll
  for (int j = 0; j < Cfg::kAccumulators / 4; ++j)
    __stcg(out + j * kWarpgroupThreads, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  named_barrier_sync(1 + consumer, kWarpgroupThreads);  // every thread's stores before the release
  if (thread_in_warpgroup() == 0) weft::sync::mo::red_add_release_gpu(tile_flag<Cfg>(p, consumer, w.order), 1);
}

// A storer with contributors: waits (bounded) until the w.contributors units that start inside
// its tile released their partials, then adds them to `acc` in unit order. False, with `stall`
// filled (GEMM_SPLIT_K), when the leader gave up; every thread of the warpgroup learns it from
// the barrier.
template <class Cfg>
__device__ __forceinline__ bool add_partials(const weft_gemm_params& p, int consumer, const weft_gemm_work& w,
                                             float (&acc)[Cfg::kAccumulators], ConsumerStall& stall) {
  bool gave_up = false;
  if (thread_in_warpgroup() == 0) {
    uint64_t* flag = tile_flag<Cfg>(p, consumer, w.order);
    uint64_t seen = weft::sync::mo::ld_acquire_gpu(flag);
    if (seen < w.contributors) {
      const uint64_t c0 = clock64(), t0 = weft::sync::globaltimer_ns();
      while ((seen = weft::sync::mo::ld_acquire_gpu(flag)) < w.contributors) {
        const uint64_t spent = static_cast<uint64_t>(clock64()) - c0;
        if (spent > p.bound.budget_cycles) {
          stall = ConsumerStall{1, static_cast<uint32_t>(consumer), w.contributors, weft_gemm_tile_at(p.sched, w.order),
                                spent, weft::sync::globaltimer_ns() - t0, WEFT_SYNC_PRIM_GEMM_SPLIT_K,
                                static_cast<uint32_t>(seen)};
          gave_up = true;
          break;
        }
      }
    }
    // Read by no one else in this launch: the next launch (stream order) finds 0.
    if (!gave_up) weft::sync::mo::st_relaxed_gpu(flag, 0);
  }
  if (named_barrier_or(1 + consumer, kWarpgroupThreads, gave_up)) return false;
  const float4* in = unit_partial<Cfg>(p, consumer, w.unit + 1u) + thread_in_warpgroup();
  for (uint32_t c = 0; c < w.contributors; ++c, in += Cfg::kConsumers * (Cfg::kAccumulators / 4) * kWarpgroupThreads) {
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
