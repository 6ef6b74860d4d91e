// Post-communication reorder (weft_gemm_restore_params in weft/abi/gemm.h): reads a buffer of slots
// (TILE_ORDER, or a ReduceScatter's received bands) through the tile -> slot table and writes the
// standard row-major layout, in 16-byte vectors (a vector never crosses a tile: tile_n and n are
// multiples of 16 elements). COPY moves raw bytes,
// so the round trip is bit-exact; ADD and RMSNORM compute in fp32 and round once to bf16.
#include <cuda_bf16.h>
#include <stdint.h>
#include "weft/abi/gemm.h"

namespace {

constexpr int kThreads = 256;

// Byte offset in the slot buffer of element (row, col) of the output.
__device__ __forceinline__ uint64_t slot_offset(const weft_gemm_restore_params& p, uint32_t row, uint32_t col) {
  const uint32_t tm = row / p.tile_rows, tn = col / p.tile_n;
  const uint32_t slot = reinterpret_cast<const uint32_t*>(p.slot_of_tile)[tm * p.tiles_n + tn];
  const uint64_t elem = (uint64_t(slot) * p.slot_rows + row % p.tile_rows) * p.tile_n + col % p.tile_n;
  return elem * p.elem_bytes;
}

// 8 bf16 of a 16-byte vector as fp32.
__device__ __forceinline__ void unpack(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}
__device__ __forceinline__ uint4 pack(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ uint4 load_src(const weft_gemm_restore_params& p, uint32_t row, uint32_t col) {
  return *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(p.src) + slot_offset(p, row, col));
}

// x = src (+ residual) for the 8 bf16 at (row, col).
__device__ __forceinline__ void load_sum(const weft_gemm_restore_params& p, uint32_t row, uint32_t col, float (&x)[8]) {
  unpack(load_src(p, row, col), x);
  if (p.residual != 0) {
    float r[8];
    unpack(*reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(p.residual) + uint64_t(row) * p.n + col), r);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] += r[i];
  }
}

}  // namespace

// COPY and ADD: a grid-stride loop over the 16-byte vectors of the standard layout.
extern "C" __global__ void __launch_bounds__(kThreads) weft_gemm_restore(const __grid_constant__ weft_gemm_restore_params p) {
  const uint32_t per_vec = 16 / p.elem_bytes;
  const uint32_t vec_per_row = p.n / per_vec;
  const uint64_t total = uint64_t(p.m) * vec_per_row;
  for (uint64_t i = blockIdx.x * uint64_t(kThreads) + threadIdx.x; i < total; i += uint64_t(gridDim.x) * kThreads) {
    const uint32_t row = static_cast<uint32_t>(i / vec_per_row), col = static_cast<uint32_t>(i % vec_per_row) * per_vec;
    uint4* out = reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.dst) + (uint64_t(row) * p.n + col) * p.elem_bytes);
    if (p.op == WEFT_GEMM_RESTORE_COPY) {
      *out = load_src(p, row, col);
    } else {
      float x[8];
      load_sum(p, row, col, x);
      *out = pack(x);
    }
  }
}

// RMSNORM: one block per row (grid-stride over rows); the row is read twice (the second time
// from L1/L2): once for the mean of squares, once to normalise.
extern "C" __global__ void __launch_bounds__(kThreads) weft_gemm_restore_rmsnorm(const __grid_constant__ weft_gemm_restore_params p) {
  __shared__ float partial[kThreads / 32];
  const uint32_t vec_per_row = p.n / 8;
  for (uint32_t row = blockIdx.x; row < p.m; row += gridDim.x) {
    float ss = 0.0f;
    for (uint32_t v = threadIdx.x; v < vec_per_row; v += kThreads) {
      float x[8];
      load_sum(p, row, v * 8, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += x[i] * x[i];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
    __syncthreads();  // partial is rewritten by the next row
    const float scale = rsqrtf(total / float(p.n) + p.eps);
    for (uint32_t v = threadIdx.x; v < vec_per_row; v += kThreads) {
      float x[8], g[8];
      load_sum(p, row, v * 8, x);
      unpack(*reinterpret_cast<const uint4*>(reinterpret_cast<const __nv_bfloat16*>(p.gamma) + v * 8), g);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = x[i] * scale * g[i];
      *reinterpret_cast<uint4*>(reinterpret_cast<__nv_bfloat16*>(p.dst) + uint64_t(row) * p.n + v * 8) = pack(x);
    }
  }
}

// All-to-All: received subtokens -> their output rows (weft_gemm_slot_scatter_params). A
// grid-stride loop over the 16-byte vectors of the slots; vectors at columns >= n are skipped.
extern "C" __global__ void __launch_bounds__(kThreads) weft_gemm_slot_scatter(const __grid_constant__ weft_gemm_slot_scatter_params p) {
  const uint32_t per_vec = 16 / p.elem_bytes;
  const uint32_t vec_per_slot = p.tile_n / per_vec;
  const uint64_t total = uint64_t(p.slots) * vec_per_slot;
  const uint32_t* table = reinterpret_cast<const uint32_t*>(p.dst_of_slot);
  for (uint64_t i = blockIdx.x * uint64_t(kThreads) + threadIdx.x; i < total; i += uint64_t(gridDim.x) * kThreads) {
    const uint32_t slot = static_cast<uint32_t>(i / vec_per_slot), v = static_cast<uint32_t>(i % vec_per_slot);
    const uint32_t col = table[2 * slot + 1] * p.tile_n + v * per_vec;
    if (col >= p.n) continue;
    const uint64_t row = table[2 * slot];
    const uint4 x = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(p.src) + (uint64_t(slot) * p.tile_n + v * per_vec) * p.elem_bytes);
    *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.dst) + (row * p.n + col) * p.elem_bytes) = x;
  }
}

// All-to-All, sequential path: rows gathered by a list (weft_gemm_row_gather_params). A
// grid-stride loop over the 16-byte vectors of the output.
extern "C" __global__ void __launch_bounds__(kThreads) weft_gemm_row_gather(const __grid_constant__ weft_gemm_row_gather_params p) {
  const uint32_t per_vec = 16 / p.elem_bytes;
  const uint32_t vec_per_row = p.n / per_vec;
  const uint64_t total = uint64_t(p.rows) * vec_per_row;
  const uint32_t* rows = reinterpret_cast<const uint32_t*>(p.src_rows);
  for (uint64_t i = blockIdx.x * uint64_t(kThreads) + threadIdx.x; i < total; i += uint64_t(gridDim.x) * kThreads) {
    const uint32_t out_row = static_cast<uint32_t>(i / vec_per_row), v = static_cast<uint32_t>(i % vec_per_row);
    const uint64_t row_bytes = uint64_t(p.n) * p.elem_bytes;
    const uint4 x = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(p.src) + rows[out_row] * row_bytes + v * 16ull);
    *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.dst) + out_row * row_bytes + v * 16ull) = x;
  }
}
