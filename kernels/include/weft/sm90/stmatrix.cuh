// stmatrix (sm_90): a warp stores four 8 x 8 matrices of 16-bit elements to shared memory in one
// instruction. Device-only C++.
#pragma once
#include <stdint.h>

namespace weft {

// Matrix i's element pair (row lane / 4, columns 2 (lane % 4) and + 1) is r_i (lower column in the
// low half); lane 8 i + k gives the shared address of matrix i's row k (16 bytes, 16-byte aligned).
// The layout of a wgmma accumulator fragment's 8 x 8 blocks once converted to 16 bits, which is why
// the GEMM's epilogue uses it.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace weft
