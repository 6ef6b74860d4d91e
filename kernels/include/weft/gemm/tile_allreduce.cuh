// The fused AllReduce's worker (weft_tile_allreduce_params, weft/abi/gemm.h), run by every thread of
// each worker CTA: the GEMM's communicator CTAs (fused-inter) or the CTAs of
// weft_gemm_tile_allreduce (DistFuse). Device-only C++.
//
// The tiles this rank owns (tile index % world == rank), in the GEMM's order (the order they
// finish; the host's list owned_orders), are dealt round-robin to the workers. Per tile: thread 0
// waits until every rank's flag reaches the target (acquire, system scope: the peers' signallers
// released them after their TMA stores completed), __syncthreads extends that to the block; the
// threads sum the world partials (16-byte peer loads, fp32, rank order 0..world-1) and store the
// bf16 sum to every rank's output (16-byte peer stores); __syncthreads before thread 0 polls the
// next tile.
// After the last tile: __syncthreads, thread 0 arrives on every rank's END counter (signal_all:
// fence.acq_rel.sys, then the adds, ordering the block's stores before them); worker 0 waits for
// world x workers arrivals of this epoch, so when its kernel ends every rank's sums of this rank's
// output have landed, and every rank has finished reading this rank's partials (the next GEMM,
// ordered after this kernel, may overwrite them).
#pragma once
#include <cuda_bf16.h>
#include "weft/abi/gemm.h"
#include "weft/pgl/view.cuh"
#include "weft/sync/signal.cuh"
#include "weft/sync/wait.cuh"

namespace weft::gemm {


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

// A thread's walk over the 16-byte vectors of a tile (row-major, vec_per_row per row), from
// vector `first`, blockDim.x at a time: one division per tile, none per vector.
struct ArVectorWalk {
  uint32_t row, col, step_rows, step_cols, vec_per_row;
  __device__ __forceinline__ ArVectorWalk(uint32_t first, uint32_t stride, uint32_t vpr)
      : row(first / vpr), col(first % vpr), step_rows(stride / vpr), step_cols(stride % vpr), vec_per_row(vpr) {}
  __device__ __forceinline__ void advance() {
    row += step_rows;
    col += step_cols;
    if (col >= vec_per_row) {
      col -= vec_per_row;
      ++row;
    }
  }
};

// One of this rank's owned tiles: entry j of owned_orders.
struct OwnedTile {
  uint32_t order, index;
  weft_gemm_tile t;
  uint32_t rows;    // rows inside D (fewer in the last tile row)
  uint32_t bytes;   // bytes of a row inside D (fewer in the last tile column); a multiple of 32
  uint64_t origin;  // byte offset of the tile's first element in D
};

__device__ __forceinline__ OwnedTile owned_tile(const weft_tile_allreduce_params& p, uint32_t j) {
  const weft_gemm_schedule& s = p.sched;
  const uint32_t row_bytes = s.n * 2, tile_row_bytes = s.tile_n * 2;
  OwnedTile a;
  a.order = reinterpret_cast<const uint32_t*>(p.owned_orders)[j];
  a.t = weft_gemm_tile_at(s, a.order);
  a.index = weft_gemm_tile_index(s, a.t);
  a.rows = min(s.m - a.t.tm * s.tile_m, s.tile_m);
  a.bytes = min(row_bytes - a.t.tn * tile_row_bytes, tile_row_bytes);
  a.origin = uint64_t(a.t.tm) * s.tile_m * row_bytes + uint64_t(a.t.tn) * tile_row_bytes;
  return a;
}

// Thread 0 waits until every rank's flag of tile `a` reaches the launch's target (acquire, system
// scope); the __syncthreads extends its acquires to the block.
__device__ __forceinline__ void await_tile(const weft_tile_allreduce_params& p, int32_t world, const OwnedTile& a) {
  if (threadIdx.x == 0) {
    for (int32_t r = 0; r < world; ++r) {
      const uint64_t* flag = weft::pgl::on_rank<const uint64_t>(p.flags, r) + a.index;
      weft::sync::wait_flag<weft::sync::FlagScope::Sys>(
          flag, p.flag_target, p.bar.bound,
          weft::sync::WaitSite{p.partial.rank, WEFT_SYNC_PRIM_WAIT, r, weft_tile_coord{0, a.order, a.t.tm, a.t.tn},
                               WEFT_ROLE_GEMM_ALLREDUCE});
    }
  }
  __syncthreads();
}

// After a worker's last tile: every thread's stores before thread 0's arrival on every rank's END
// counter; worker 0 waits for world x workers arrivals of this epoch.
__device__ __forceinline__ void arrive_end(const weft_tile_allreduce_params& p, uint32_t worker, int32_t world) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const weft_tile_coord end = weft::sync::coord4(0, 0, 0, 0);
    weft::sync::signal_all(p.bar, end, 1);
    if (worker == 0) weft::sync::wait(p.bar, end, p.partial.rank, uint64_t(world) * p.workers * p.epoch);
  }
}

// The worker for a world of W ranks: the ranks' base addresses sit in registers (loops over
// ranks are unrolled), and each thread keeps kVectors = 8 / W (at least 1) 16-byte loads of
// each rank in flight: per iteration every load is issued before any is summed. Measured on one
// H100 (the worker kernel alone under ncu, 8192 x 8192, 8 workers): 1.05 ms against 1.43 for
// run_tile_allreduce_any_world below (a division and a rank-indexed parameter load per vector,
// loads summed rank by rank: about 126 instructions per vector, issue-bound). Staging chunks in
// shared memory by bulk copies instead was slower (32 workers: 485 against 380 us).
template <int W>
__device__ __forceinline__ void run_tile_allreduce_world(const weft_tile_allreduce_params& p, uint32_t worker) {
  constexpr int kVectors = W >= 8 ? 1 : 8 / W;
  const int32_t rank = p.partial.rank;
  const uint32_t row_bytes = p.sched.n * 2;
  // The owned tiles in order, dealt round-robin to the workers (dealing orders instead would
  // leave workers idle whenever workers and world share a factor).
  for (uint32_t j = worker; j < p.owned_count; j += p.workers) {
    const OwnedTile a = owned_tile(p, j);
    await_tile(p, W, a);
    const uint8_t* in[W];
    uint8_t* out[W];  // peers first, this rank last (spreads the stores)
#pragma unroll
    for (int r = 0; r < W; ++r) {
      in[r] = weft::pgl::on_rank<const uint8_t>(p.partial, r);
      out[r] = weft::pgl::on_rank<uint8_t>(p.out, (rank + 1 + r) % W);
    }
    const uint32_t rows = a.rows;
    const uint64_t origin = a.origin;
    ArVectorWalk walk(threadIdx.x, blockDim.x, a.bytes / 16);
    while (walk.row < rows) {
      // Vectors of rows past the tile's end repeat the tile's first row (loaded, not stored).
      uint64_t off[kVectors];
      uint32_t live = 0;  // bit u: vector u is inside the tile
#pragma unroll
      for (int u = 0; u < kVectors; ++u) {
        const bool inside = walk.row < rows;
        live |= uint32_t(inside) << u;
        off[u] = origin + (inside ? uint64_t(walk.row) * row_bytes + walk.col * 16 : 0);
        walk.advance();
      }
      int4 v[kVectors][W];
#pragma unroll
      for (int u = 0; u < kVectors; ++u) {
#pragma unroll
        for (int r = 0; r < W; ++r) v[u][r] = __ldcg(reinterpret_cast<const int4*>(in[r] + off[u]));
      }
#pragma unroll
      for (int u = 0; u < kVectors; ++u) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int r = 0; r < W; ++r) add_bf16x8(acc, v[u][r]);  // rank order 0..W-1 on every owner
        if (!((live >> u) & 1u)) continue;
        const int4 sum = to_bf16x8(acc);
#pragma unroll
        for (int r = 0; r < W; ++r) __stcg(reinterpret_cast<int4*>(out[r] + off[u]), sum);
      }
    }
    __syncthreads();  // thread 0 polls the next tile only after this one's loads were issued
  }
  arrive_end(p, worker, W);
}

// The host refuses worlds outside 1..8 (FusedAllReduce::plan_gemm).
//
// Specialised per world, for DistFuse's kernel (a translation unit of its own).
__device__ __forceinline__ void run_tile_allreduce_per_world(const weft_tile_allreduce_params& p, uint32_t worker) {
  switch (p.partial.world) {
    case 1: run_tile_allreduce_world<1>(p, worker); break;
    case 2: run_tile_allreduce_world<2>(p, worker); break;
    case 3: run_tile_allreduce_world<3>(p, worker); break;
    case 4: run_tile_allreduce_world<4>(p, worker); break;
    case 5: run_tile_allreduce_world<5>(p, worker); break;
    case 6: run_tile_allreduce_world<6>(p, worker); break;
    case 7: run_tile_allreduce_world<7>(p, worker); break;
    case 8: run_tile_allreduce_world<8>(p, worker); break;
    default: __trap();
  }
}

// Any world up to 8 in one loop, for the GEMM kernels' communicator CTAs: with
// run_tile_allreduce_world's eight specialisations in them (inlined or not), or one generic
// instantiation of it with more than one vector per rank, ptxas spilled in the GEMM kernels with a
// k x n B (crates/kernels' spill test refuses that). Per iteration 4 vectors of one rank at a
// time are in flight; a division and a rank-indexed parameter load per vector (the slower loop
// measured against above).
__device__ __forceinline__ void run_tile_allreduce_any_world(const weft_tile_allreduce_params& p, uint32_t worker) {
  constexpr int kVectors = 4;  // per rank, summed rank by rank
  const int32_t world = p.partial.world, rank = p.partial.rank;
  const uint32_t row_bytes = p.sched.n * 2;
  // The owned tiles in order, dealt round-robin to the workers (dealing orders instead would
  // leave workers idle whenever workers and world share a factor).
  for (uint32_t j = worker; j < p.owned_count; j += p.workers) {
    const OwnedTile a = owned_tile(p, j);
    await_tile(p, world, a);
    const uint32_t rows = a.rows;
    const uint64_t origin = a.origin;
    const uint32_t vec_per_row = a.bytes / 16;
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
        for (int u = 0; u < kVectors; ++u) v[u] = *weft::pgl::at_bytes<const int4>(p.partial, r, off[u]);
#pragma unroll
        for (int u = 0; u < kVectors; ++u) add_bf16x8(acc[u], v[u]);
      }
#pragma unroll
      for (int u = 0; u < kVectors; ++u) {
        if (first + u * blockDim.x >= vectors) break;
        const int4 sum = to_bf16x8(acc[u]);
        for (int32_t q = 1; q <= world; ++q) {
          const int32_t r = (rank + q) % world;  // peers first, this rank last: spread the stores
          *weft::pgl::at_bytes<int4>(p.out, r, off[u]) = sum;
        }
      }
    }
    __syncthreads();  // thread 0 polls the next tile only after this one's loads were issued
  }
  arrive_end(p, worker, world);
}

}  // namespace weft::gemm
