// L2 prefetch of a region of a GEMM operand (weft_l2_prefetch_params in weft/abi/gemm.h), issued
// while a collective runs so the GEMM after it finds its first k-steps of B in L2. Every thread
// issues bulk prefetches of up to kChunk bytes and the CTAs exit: the prefetch is a hint that
// changes no memory, nothing waits for its lines, and a line evicted before use costs only the
// bandwidth it took.
#include <stdint.h>
#include "weft/abi/gemm.h"

namespace {
constexpr uint32_t kChunk = 16 * 1024;

__device__ __forceinline__ void prefetch_l2_bulk(uint64_t addr, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(addr), "r"(bytes) : "memory");
}
}  // namespace

extern "C" __global__ void weft_l2_prefetch(const __grid_constant__ weft_l2_prefetch_params p) {
  const uint32_t per_row = (p.row_bytes + kChunk - 1) / kChunk;
  const uint64_t total = uint64_t(p.rows) * per_row;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t row = uint32_t(i / per_row), off = uint32_t(i % per_row) * kChunk;
    const uint32_t bytes = p.row_bytes - off < kChunk ? p.row_bytes - off : kChunk;
    prefetch_l2_bulk(p.base + uint64_t(row) * p.pitch + off, bytes);
  }
}
