// wgmma (sm_90a) around the instruction forms of weft/gemm/wgmma_ops.cuh: shared-memory matrix
// descriptors for the 128-byte-swizzled tiles TMA writes, and the fence / commit / wait protocol.
//
// Protocol, per warpgroup: wgmma_fence() before the first wgmma of a batch (orders earlier
// register and shared-memory accesses before the tensor cores read); the wgmmas; wgmma_commit()
// closes them into a group; wgmma_wait<N>() returns once at most N groups are pending, after which
// the retired groups' shared-memory operands may be overwritten and their accumulators read.
// accumulator_fence() pins register accesses of the accumulators on their side of a wait (the
// compiler does not otherwise know the asm of a wait touches them).
#pragma once
#include <stdint.h>
#include "weft/gemm/wgmma_ops.cuh"

namespace weft::gemm {

// Descriptor of a 128-byte-swizzled operand at shared address `saddr` (the swizzle pattern repeats
// every 1024 bytes, so tile bases are 1024-byte aligned; `saddr` may be offset inside the atom
// along K for the k16 steps). K-major: `lbo` unused (16), `sbo` = bytes between 8-row groups.
// MN-major: `lbo` = bytes between 64-element column blocks, `sbo` = bytes between 8-row K groups.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

template <int kCount>
__device__ __forceinline__ void accumulator_fence(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace weft::gemm
