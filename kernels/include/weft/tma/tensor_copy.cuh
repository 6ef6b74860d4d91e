// TMA tensor copies (cp.async.bulk.tensor, sm_90) through a CUtensorMap the host encoded
// (weft_tensor_map, passed in a __grid_constant__ kernel parameter so its address is valid here).
// Device-only C++. Orderings are those of weft/tma/bulk_copy.cuh: a load completes complete_tx(bytes)
// on an mbarrier whose current phase counts the box's full size (out-of-bounds elements are
// zero-filled and still counted): the expect_tx may come before or, while an arrival of the phase
// is still pending (a cluster peer's multicast), after the bytes land; a store joins the issuing thread's bulk group, and only
// bulk_wait_group<0>() makes its global writes complete (bulk_wait_group_read<N>() only frees the
// shared source). Elements of a stored box outside the tensor are not written.
#pragma once
#include <stdint.h>
#include "weft/tma/bulk_copy.cuh"

namespace weft {

// Brings the descriptor into the constant cache ahead of the first copy that uses it.
__device__ __forceinline__ void tensor_map_prefetch(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Box at (c0 = innermost coordinate, c1) of the 2-D tensor `map` -> this CTA's shared memory.
__device__ __forceinline__ void tensor_load_2d(void* smem_dst, const void* map, uint64_t* bar, int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      ::"r"(smem_addr(smem_dst)), "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// The same box into the shared memory of every CTA of this cluster named in `cta_mask` (bit i =
// cluster rank i), at the same offset, each completing complete_tx on its own mbarrier at `bar`'s
// offset. On-chip TMA multicast inside a thread-block cluster (not NVLink multicast).
__device__ __forceinline__ void tensor_load_2d_multicast(void* smem_dst, const void* map, uint64_t* bar, int32_t c0,
                                                         int32_t c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5}], [%2], %3;"
      ::"r"(smem_addr(smem_dst)), "l"(map), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1)
      : "memory");
}

// This CTA's shared box -> the 2-D tensor `map` at (c0, c1), in the calling thread's bulk group.
// The box must have been written before with fence_proxy_async_smem() by each writing thread and
// a barrier between them and the issuing thread.
__device__ __forceinline__ void tensor_store_2d(const void* map, const void* smem_src, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];"
               ::"l"(map), "r"(smem_addr(smem_src)), "r"(c0), "r"(c1)
               : "memory");
}

// This CTA's shared box added element-wise into the 2-D tensor `map` at (c0, c1) (TMA reduction,
// the tensor's element type: f32 / f16 / bf16 adds), in the calling thread's bulk group. The
// tensor may be in a peer GPU's memory. Same preconditions as tensor_store_2d; each element's add
// is atomic, adds from different boxes or GPUs to one element happen in some order.
__device__ __forceinline__ void tensor_reduce_add_2d(const void* map, const void* smem_src, int32_t c0, int32_t c1) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];"
               ::"l"(map), "r"(smem_addr(smem_src)), "r"(c0), "r"(c1)
               : "memory");
}

// The same for a 3-D tensor at (c0, c1, c2). Every coordinate must be >= 0: a store at a negative
// coordinate is an illegal instruction (measured on H200, driver 580); the box's elements beyond
// the tensor's end in any dimension are not written.
__device__ __forceinline__ void tensor_store_3d(const void* map, const void* smem_src, int32_t c0, int32_t c1, int32_t c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
               ::"l"(map), "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// The same for a 4-D tensor at (c0, c1, c2, c3); the same rules as tensor_store_3d.
__device__ __forceinline__ void tensor_store_4d(const void* map, const void* smem_src, int32_t c0, int32_t c1, int32_t c2,
                                                int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
               ::"l"(map), "r"(smem_addr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

}  // namespace weft
