// A kernel of your own on weft's primitives: rank r writes n floats into rank r+1's buffer (a PGL:
// every rank's buffer mapped here, `data.base[r]`), signals rank r+1's counter, waits for rank
// r-1's signal on its own counter, and checks what rank r-1 wrote. One block.
#include "weft/sync.cuh"  // from weft-kernels' exported include folder

using namespace weft::sync;

// Must match value() in src/main.rs.
__device__ float value(int32_t writer, uint32_t i) { return (float)(writer * 100000 + (int32_t)i); }

// `bar` and `data` by value (__grid_constant__: no local copy of the views); `base`: the epoch
// Counters::begin returned; `wrong`: one counter of mismatches, zeroed by the host.
extern "C" __global__ void ring_put(const __grid_constant__ weft_sync_counters bar, uint64_t base,
                                    const __grid_constant__ weft_pgl_view data, uint32_t n, uint32_t* wrong) {
  const int32_t rank = bar.view.rank, world = bar.view.world;
  const int32_t next = (rank + 1) % world, prev = (rank + world - 1) % world;
  float* to_next = reinterpret_cast<float*>(data.base[next]);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) to_next[i] = value(rank, i);
  // Every thread's stores are ordered before thread 0's release (the block barrier, then a
  // system-scope release add on the peer's counter).
  __syncthreads();
  if (threadIdx.x == 0) {
    signal(bar, coord4(0, 0, 0, 0), next);
    wait(bar, coord4(0, 0, 0, 0), rank, base + 1);  // bounded: a lost signal is reported, not a hang
  }
  __syncthreads();
  const float* mine = reinterpret_cast<const float*>(data.base[rank]);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
    if (mine[i] != value(prev, i)) atomicAdd(wrong, 1u);
}
