// The fused AllReduce's worker (weft_tile_allreduce_params, weft/gemm.h), run by every thread of
// each worker CTA: the GEMM's communicator CTAs (fused-inter) or the CTAs of
// weft_gemm_tile_allreduce (DistFuse). Device-only C++.
//
// The tiles this rank owns (tile index % world == rank), in the GEMM's order (the order they
// finish; the host's list owned_orders), are dealt round-robin to the workers. Per tile: thread 0 waits until every rank's
// flag reaches the target (acquire, system scope: the peers' signallers released them after their
// TMA stores completed), __syncthreads extends that to the block; the threads sum the world
// partials (16-byte peer loads, fp32, rank order 0..world-1) and store the bf16 sum to every
// rank's output (16-byte peer stores); __syncthreads before thread 0 polls the next tile.
// After the last tile: __syncthreads, thread 0 arrives on every rank's END counter (signal_all:
// fence.acq_rel.sys, then the adds, ordering the block's stores before them); worker 0 waits for
// world x workers arrivals of this epoch, so when its kernel ends every rank's sums of this rank's
// output have landed, and every rank has finished reading this rank's partials (the next GEMM,
// ordered after this kernel, may overwrite them).
#pragma once
#include <cuda_bf16.h>
#include "weft/gemm.h"
#include "weft/sync/signal.cuh"
#include "weft/sync/wait.cuh"

namespace weft::gemm {

constexpr uint32_t kRoleAllReduce = 5;  // error reports: coord.b (loader.cuh, signaller.cuh have the others)

// kVectors 16-byte vectors per thread in flight: a peer load takes NVLink latency, so one at a
// time leaves a worker CTA far below its bandwidth. Measured on one H100 (8192 x 8192, 32
// workers, the worker kernel alone under ncu): 4 vectors 380 us, 8 vectors 361 us; staging
// chunks in shared memory by bulk copies instead (a stager warp, 4 x 32 KB in flight) 485 us.
constexpr int kVectors = 4;

// Adds the 8 bf16 of `v` to acc[0..8).
__device__ __forceinline__ void add_bf16x8(float* acc, const int4& v) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

__device__ __forceinline__ int4 to_bf16x8(const float* acc) {
  int4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return out;
}

__device__ __forceinline__ void run_tile_allreduce(const weft_tile_allreduce_params& p, uint32_t worker) {
  const weft_gemm_schedule& s = p.sched;
  const int32_t world = p.partial.world, rank = p.partial.rank;
  const uint32_t row_bytes = s.n * 2;
  const uint32_t tile_row_bytes = s.tile_n * 2;
  weft_sync_counters flag_bound{};
  flag_bound.bound = p.bar.bound;
  flag_bound.view.rank = rank;
  // The owned tiles in order, dealt round-robin to the workers (dealing orders instead would
  // leave workers idle whenever workers and world share a factor).
  const uint32_t* owned = reinterpret_cast<const uint32_t*>(p.owned_orders);
  for (uint32_t j = worker; j < p.owned_count; j += p.workers) {
    const uint32_t order = owned[j];
    const weft_gemm_tile t = weft_gemm_tile_at(s, order);
    const uint32_t index = weft_gemm_tile_index(s, t);
    if (threadIdx.x == 0) {
      for (int32_t r = 0; r < world; ++r) {
        const uint64_t* flag = reinterpret_cast<const uint64_t*>(p.flags.base[r]) + index;
        weft::sync::detail::spin_until(flag, p.flag_target, flag_bound, WEFT_SYNC_PRIM_WAIT, r,
                                       weft_tile_coord{kRoleAllReduce, order, t.tm, t.tn}, weft::sync::detail::AcquireSys{});
      }
    }
    __syncthreads();  // extends thread 0's acquires to the block
    const uint32_t rows = min(s.m - t.tm * s.tile_m, s.tile_m);
    const uint32_t bytes = min(row_bytes - t.tn * tile_row_bytes, tile_row_bytes);  // a multiple of 32
    const uint64_t origin = uint64_t(t.tm) * s.tile_m * row_bytes + uint64_t(t.tn) * tile_row_bytes;
    const uint32_t vec_per_row = bytes / 16;
    const uint32_t vectors = rows * vec_per_row;
    for (uint32_t first = threadIdx.x; first < vectors; first += blockDim.x * kVectors) {
      // Vectors first + u * blockDim.x: per rank, every load issued before any is summed; the
      // sum runs in rank order 0..world-1 on every owner.
      uint64_t off[kVectors];
      float acc[kVectors][8];
#pragma unroll
      for (int u = 0; u < kVectors; ++u) {
        const uint32_t i = min(first + u * blockDim.x, vectors - 1);  // a repeat past the end: not stored
        off[u] = origin + uint64_t(i / vec_per_row) * row_bytes + (i % vec_per_row) * 16;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u][e] = 0.0f;
      }
      for (int32_t r = 0; r < world; ++r) {
        int4 v[kVectors];
#pragma unroll
        for (int u = 0; u < kVectors; ++u) v[u] = *reinterpret_cast<const int4*>(p.partial.base[r] + off[u]);
#pragma unroll
        for (int u = 0; u < kVectors; ++u) add_bf16x8(acc[u], v[u]);
      }
#pragma unroll
      for (int u = 0; u < kVectors; ++u) {
        if (first + u * blockDim.x >= vectors) break;
        const int4 sum = to_bf16x8(acc[u]);
        for (int32_t j = 1; j <= world; ++j) {
          const int32_t r = (rank + j) % world;  // peers first, this rank last: spread the stores
          *reinterpret_cast<int4*>(p.out.base[r] + off[u]) = sum;
        }
      }
    }
    __syncthreads();  // thread 0 polls the next tile only after this one's loads were issued
  }
  __syncthreads();  // every thread's stores before thread 0's arrival
  if (threadIdx.x == 0) {
    const weft_tile_coord end = weft::sync::coord4(0, 0, 0, 0);
    weft::sync::signal_all(p.bar, end, 1);
    if (worker == 0) weft::sync::wait(p.bar, end, rank, uint64_t(world) * p.workers * p.epoch);
  }
}

}  // namespace weft::gemm
