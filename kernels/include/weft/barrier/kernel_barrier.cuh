// Device side of KernelBarrier (weft/abi/kernel_barrier.h, crates/barrier/README.md).
//
// Arrival orders no data: it says "this kernel holds its SMs and runs", nothing about what it has
// written, so it is a relaxed GPU-scope atomic (the waiter and the arriving kernels run on one
// GPU). The compute kernel released by the wait must not read the communication kernel's
// results; for that use events or weft::sync signals.
#pragma once
#include <stdint.h>
#include "weft/abi/kernel_barrier.h"

namespace weft {

// The view's counter (a device address in the C ABI) as a pointer.
__device__ __forceinline__ int32_t* kernel_barrier_counter(weft_kernel_barrier_view v) {
  return reinterpret_cast<int32_t*>(v.counter);
}

__device__ __forceinline__ void kernel_barrier_add(int32_t* counter) {
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], 1;" ::"l"(counter) : "memory");
}

__device__ __forceinline__ int32_t kernel_barrier_load(const int32_t* counter) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// Early release (programmatic dependent launch): lets the kernel enqueued next on the stream, if
// it was launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, start now instead of
// after this grid has completed and flushed. Without that attribute it does nothing. Only for a
// grid that writes nothing the next kernel reads (the wait kernel).
__device__ __forceinline__ void kernel_barrier_release_next() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// One arrival per launch: the first thread of the first block. Call it at the very top of the
// communication kernel, before any early return. A counter of 0 is no barrier.
__device__ __forceinline__ void kernel_barrier_arrive(weft_kernel_barrier_view v) {
  if (v.counter == 0) return;
  if ((blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0) kernel_barrier_add(kernel_barrier_counter(v));
}

// One arrival per cluster (the first thread of each cluster's block rank 0), for cluster launches
// whose every cluster must be resident before compute starts: expect one arrival per cluster.
__device__ __forceinline__ void kernel_barrier_arrive_per_cluster(weft_kernel_barrier_view v) {
  if (v.counter == 0) return;
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if ((rank | threadIdx.x | threadIdx.y | threadIdx.z) == 0) kernel_barrier_add(kernel_barrier_counter(v));
}

}  // namespace weft
