// The inter-SM AllGather's chunk flags (weft_gemm_ag_copy, abi/gemm.h; the copy is ag_copy.cuh): the
// loader's poll before a tile of a copied row, and the report of a poll that gave up. The loader
// only polls (its 40 registers leave no room for a report inline): a give-up leaves the chunk's
// tile row in shared memory (ag_stall), and the peer-barrier thread reports it once the consumers
// drained (peer_reduce.cuh). Device-only C++.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/sync/error.cuh"
#include "weft/sync/memory_order.cuh"

namespace weft::gemm {

constexpr uint32_t kRoleAllGather = 6;  // error reports: coord.b (kRoleAllReduce = 5, tile_allreduce.cuh)

__device__ __forceinline__ bool ag_inter(const weft_gemm_params& p) { return p.comm_op == WEFT_GEMM_COMM_ALLGATHER; }

// The flag of tile row `tm`: its own, or with flag_rows = g > 1 the flag of the first row of its
// group (groups of g tile rows from each owner's first row; the last group may be shorter).
template <class Cfg>
__device__ __forceinline__ uint64_t* ag_chunk_flag(const weft_gemm_params& p, uint32_t tm) {
  const uint32_t g = p.ag_copy.flag_rows;
  if (g > 1) {
    const uint32_t own = p.ag_rows / Cfg::kBM, first = tm / own * own;
    tm = first + (tm - first) / g * g;
  }
  return reinterpret_cast<uint64_t*>(p.ag_copy.chunk_flags) + tm;
}

// The loader, before the first load of a tile in row `tm` (not this rank's): polls the chunk's flag
// (acquire, GPU scope), then fences the async proxy; false when the budget ran out.
template <class Cfg>
__device__ __forceinline__ bool ag_chunk_poll(const weft_gemm_params& p, uint32_t tm) {
  const uint64_t* flag = ag_chunk_flag<Cfg>(p, tm);
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

// Reports a chunk wait the loader gave up on (tile row `tm`) and traps.
template <class Cfg>
__device__ __forceinline__ void ag_chunk_fail(const weft_gemm_params& p, uint32_t tm) {
  weft::sync::failure f{};
  f.status = WEFT_SYNC_STATUS_TIMEOUT;
  f.primitive = WEFT_SYNC_PRIM_WAIT_GPU;
  f.target_rank = p.peer_bar.view.rank;
  f.coord = weft_tile_coord{kRoleAllGather, 0, tm, 0};
  f.expected = p.ag_copy.flag_target;
  f.observed = weft::sync::mo::ld_relaxed_gpu(ag_chunk_flag<Cfg>(p, tm));
  f.elapsed_cycles = p.peer_bar.bound.budget_cycles;
  weft::sync::fail_inline(p.bound, p.peer_bar.view.rank, f);
}

}  // namespace weft::gemm
