// The gathered A's chunk flags (weft_gemm_ag_copy, abi/gemm.h; copied by the communicators,
// ag_copy.cuh, or by copy engines): the loader's poll before a K chunk of a copied row, and
// the report of a poll that gave up. The loader
// only polls (its 40 registers leave no room for a report inline): a give-up leaves the chunk's
// tile row in shared memory (ag_stall), and the peer-barrier thread reports it once the consumers
// drained (peer_reduce.cuh). Device-only C++.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/sync/error.cuh"
#include "weft/sync/memory_order.cuh"

namespace weft::gemm {


__device__ __forceinline__ bool ag_inter(const weft_gemm_params& p) { return p.comm_op == WEFT_GEMM_COMM_ALLGATHER; }

// Whether this launch polls a flag per K chunk: the copy engines cut K, and only the AllGather's
// own kernel does (the host refuses K chunks on the kernel with every fusion, whose code stays as
// it was).
template <class Cfg>
__device__ __forceinline__ bool ag_k_chunked(const weft_gemm_params& p) {
  return Cfg::kAllGatherOnly && p.ag_copy.k_chunks > 1;
}

// The flag of tile row `tm` and K chunk `k_chunk`: its own, or with flag_rows = g > 1 the flag of
// the first row of its group (groups of g tile rows from each owner's first row; the last group may
// be shorter); with k_chunks > 1 one per K chunk of the row (K chunk 0 without K chunks).
template <class Cfg>
__device__ __forceinline__ uint64_t* ag_chunk_flag(const weft_gemm_params& p, uint32_t tm, uint32_t k_chunk) {
  const uint32_t g = p.ag_copy.flag_rows;
  if (g > 1) {
    const uint32_t own = p.ag_rows / Cfg::kBM, first = tm / own * own;
    tm = first + (tm - first) / g * g;
  }
  const uint32_t per_row = Cfg::kAllGatherOnly ? weft_gemm_ag_k_chunks(p.ag_copy) : 1u;
  return reinterpret_cast<uint64_t*>(p.ag_copy.chunk_flags) + uint64_t(tm) * per_row + k_chunk;
}

// The loader, before the first load of a K chunk of a tile in row `tm` (not this rank's): polls the
// chunk's flag (acquire, GPU scope), then fences the async proxy; false when the budget ran out.
template <class Cfg>
__device__ __forceinline__ bool ag_chunk_poll(const weft_gemm_params& p, uint32_t tm, uint32_t k_chunk) {
  const uint64_t* flag = ag_chunk_flag<Cfg>(p, tm, k_chunk);
  const long long c0 = clock64();
  bool ready = true;
  while (weft::sync::mo::ld_acquire_gpu(flag) < p.ag_copy.flag_target) {
    if (uint64_t(clock64() - c0) > p.peer_bar.bound.budget_cycles) {
      ready = false;
      break;
    }
  }
  weft::sync::mo::fence_proxy_async_global();
  return ready;
}

// What the loader leaves in shared memory (SharedTiles::ag_stall) for a chunk wait it gave up on,
// and the report's decoding of it: 1 + k_chunk * tiles_m + tm (0: none).
__device__ __forceinline__ uint32_t ag_stall_code(const weft_gemm_params& p, uint32_t tm, uint32_t k_chunk) {
  return 1u + k_chunk * weft_gemm_tiles_m(p.sched) + tm;
}

// Reports a chunk wait the loader gave up on (ag_stall_code `code`, role LOADER, coord {0, 0, tile
// row, K chunk}) and traps.
template <class Cfg>
__device__ __forceinline__ void ag_chunk_fail(const weft_gemm_params& p, uint32_t code) {
  const uint32_t tiles_m = weft_gemm_tiles_m(p.sched), tm = (code - 1u) % tiles_m, chunk = (code - 1u) / tiles_m;
  weft::sync::failure f{};
  f.status = WEFT_SYNC_STATUS_TIMEOUT;
  f.primitive = WEFT_SYNC_PRIM_WAIT_GPU;
  f.target_rank = p.peer_bar.view.rank;
  f.role = WEFT_ROLE_GEMM_LOADER;
  f.coord = weft_tile_coord{0, 0, tm, chunk};
  f.expected = p.ag_copy.flag_target;
  f.observed = weft::sync::mo::ld_relaxed_gpu(ag_chunk_flag<Cfg>(p, tm, chunk));
  f.elapsed_cycles = p.peer_bar.bound.budget_cycles;
  weft::sync::fail_inline(p.bound, p.peer_bar.view.rank, f);
}

}  // namespace weft::gemm
