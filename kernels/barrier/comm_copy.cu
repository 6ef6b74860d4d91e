// The communication kernel of the overlap-order bench and the barrier trials: arrives on a
// KernelBarrier first thing, then copies `bytes` from a local buffer to a (peer) buffer by 16-byte
// vectors, grid-stride, blocks of WEFT_OVERLAP_THREADS. Stamps its arrival, start and end.
#include <stdint.h>
#include "weft/sync/clock.cuh"
#include "weft/barrier/kernel_barrier.cuh"
#include "weft/abi/synthetic.h"

namespace {

using weft::sync::globaltimer_ns;

constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread

__device__ __forceinline__ unsigned long long* stamp(const weft_comm_copy_params& p, int i) {
  return reinterpret_cast<unsigned long long*>(p.stamps) + i;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(WEFT_OVERLAP_THREADS, 1) weft_comm_copy(const __grid_constant__ weft_comm_copy_params p) {
  // At the very top, before anything could return: the stamp, then the arrival (one thread).
  if ((blockIdx.x | threadIdx.x) == 0) *stamp(p, WEFT_STAMP_COMM_ARRIVE) = globaltimer_ns();
  weft::kernel_barrier_arrive(p.barrier);
  if (threadIdx.x == 0) atomicMin(stamp(p, WEFT_STAMP_COMM_START), globaltimer_ns());

  const uint4* __restrict__ src = reinterpret_cast<const uint4*>(p.src);
  uint4* __restrict__ dst = reinterpret_cast<uint4*>(p.dst);
  const uint64_t n = p.bytes / 16, threads = uint64_t(gridDim.x) * blockDim.x;
  uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * threads < n; i += kUnroll * threads) {
    uint4 v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = __ldcs(src + i + k * threads);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) dst[i + k * threads] = v[k];
  }
  for (; i < n; i += threads) dst[i] = __ldcs(src + i);

  __syncthreads();  // the block's stores issued before its end stamp
  if (threadIdx.x == 0) atomicMax(stamp(p, WEFT_STAMP_COMM_END), globaltimer_ns());
}
