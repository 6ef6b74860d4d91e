// A synthetic persistent compute kernel for the overlap-order bench and the barrier trials: one
// "greedy" block per SM (1024 threads with 64 registers each take the whole register file, and
// the host adds ~200 KB of dynamic shared memory), grid = SMs - sm_margin, tiles taken from a
// global counter (dynamic scheduling: a block that starts late does fewer tiles). Each tile is
// exact integer work the host recomputes in closed form (weft/abi/synthetic.h).
#include <stdint.h>
#include "weft/sync/clock.cuh"
#include "weft/abi/synthetic.h"

namespace {

using weft::sync::globaltimer_ns;

__device__ __forceinline__ unsigned long long* stamp(const weft_persistent_compute_params& p, int i) {
  return reinterpret_cast<unsigned long long*>(p.stamps) + i;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(WEFT_OVERLAP_THREADS, 1) weft_persistent_compute(const __grid_constant__ weft_persistent_compute_params p) {
  __shared__ uint32_t tile;
  bool first = true;
  for (;;) {
    // Warp 0 as a whole takes the next tile: lane 0 alone does the atomics, and the shuffle
    // reconverges the warp before every lane stores the (same) index, so no lane meets the CTA
    // barrier diverged. (A lane-0-only store right before __syncthreads let lanes 1-31 of warp 0
    // pass the barrier first and read a stale index on sm_90a / nvcc 13.0.)
    if (threadIdx.x < 32) {
      uint32_t next = 0;
      if (threadIdx.x == 0) {
        if (first) atomicMin(stamp(p, WEFT_STAMP_COMPUTE_START), globaltimer_ns());
        next = atomicAdd(reinterpret_cast<uint32_t*>(p.tile_counter), 1u);
      }
      tile = __shfl_sync(0xffffffffu, next, 0);
    }
    first = false;
    __syncthreads();
    const uint32_t t = tile;
    __syncthreads();  // every thread has read `tile` before thread 0 takes the next one
    if (t >= p.tiles) break;
    const uint32_t elem = t * WEFT_OVERLAP_THREADS + threadIdx.x;
    uint32_t x[WEFT_OVERLAP_CHAINS];
#pragma unroll
    for (uint32_t j = 0; j < WEFT_OVERLAP_CHAINS; ++j) x[j] = weft_overlap_chain_start(p.seed, elem, j);
    for (uint32_t r = 0; r < p.rounds; ++r) {
#pragma unroll
      for (uint32_t j = 0; j < WEFT_OVERLAP_CHAINS; ++j) x[j] = x[j] * p.mul + p.add;
    }
    uint32_t sum = 0;
#pragma unroll
    for (uint32_t j = 0; j < WEFT_OVERLAP_CHAINS; ++j) sum += x[j];
    reinterpret_cast<uint32_t*>(p.out)[elem] = sum;
  }
  // Every thread's last store precedes the loop's final __syncthreads.
  if (threadIdx.x == 0) atomicMax(stamp(p, WEFT_STAMP_COMPUTE_END), globaltimer_ns());
}
