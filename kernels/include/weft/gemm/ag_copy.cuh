// Inter-SM AllGather + GEMM (weft_gemm_ag_copy, abi/gemm.h): the communicator CTAs copy the peers'
// A shards into this GPU's gathered A, a tile row (chunk) at a time, and release a flag per chunk;
// the loader waits for a chunk's flag before it loads a tile of that row. Device-only C++.
//
// Orderings:
//   copy:   thread 0 of a communicator waits for START (acquire, system scope: every rank's CTAs
//           launched, so their shards are written), __syncthreads extends that to the block; the
//           threads copy the chunk with 16-byte loads (peer memory) and stores (this GPU), fence
//           their stores against later async-proxy reads, __syncthreads; thread 0 releases the
//           chunk's flag at GPU scope (cumulative over the block's stores by the barrier).
//   load:   the loader polls the flag (acquire, GPU scope), then fences the async proxy before its
//           TMA loads of the chunk's rows.
//   END:    the compute CTAs arrive once their loads are done (peer_reduce.cuh); every chunk was
//           waited for by some loader first, so every rank's END covers this rank's reads of the
//           peers' shards, and a peer's next shard is written only after them.
// The chunk flags' poll and report: ag_chunk.cuh.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/gemm/ag_chunk.cuh"
#include "weft/gemm/config.cuh"
#include "weft/gemm/peer_reduce.cuh"
#include "weft/pgl/view.cuh"
#include "weft/sync/memory_order.cuh"

namespace weft::gemm {

// The copy's 16-byte vectors per thread in flight (peer loads take NVLink latency).
constexpr int kCopyVectors = 8;

// A communicator CTA (every thread): copies chunks j = comm, comm + comm_ctas, ... where chunk j
// is tile row (tm_offset + own tile rows + j) mod tiles_m, the rows the rotated schedule reads next.
template <class Cfg>
__device__ __forceinline__ void run_ag_copy(const weft_gemm_params& p) {
  const weft_gemm_ag_copy& c = p.ag_copy;
  const weft_gemm_schedule& s = p.sched;
  const uint32_t comm = blockIdx.x - s.ctas;
  const uint32_t tiles_m = weft_gemm_tiles_m(s), own = p.ag_rows / Cfg::kBM;
  const uint32_t chunks = tiles_m - own;
  if (comm >= chunks) return;
  if (threadIdx.x == 0) peer_bar_wait(p, WEFT_GEMM_PEER_BAR_START);
  __syncthreads();  // extends thread 0's acquire to the block
  const uint64_t chunk_bytes = uint64_t(Cfg::kBM) * c.row_bytes;
  const uint32_t vectors = static_cast<uint32_t>(chunk_bytes / 16);
  for (uint32_t j = comm; j < chunks; j += p.comm_ctas) {
    const uint32_t tm = (s.tm_offset + own + j) % tiles_m;
    const uint32_t owner = tm / own;
    const int4* src = weft::pgl::at_bytes<const int4>(c.shards, int32_t(owner), uint64_t(tm - owner * own) * chunk_bytes);
    int4* dst = reinterpret_cast<int4*>(c.gathered + uint64_t(tm) * chunk_bytes);
    for (uint32_t first = threadIdx.x; first < vectors; first += blockDim.x * kCopyVectors) {
      int4 v[kCopyVectors];
#pragma unroll
      for (int u = 0; u < kCopyVectors; ++u) {
        const uint32_t i = first + u * blockDim.x;
        if (i < vectors) v[u] = src[i];
      }
#pragma unroll
      for (int u = 0; u < kCopyVectors; ++u) {
        const uint32_t i = first + u * blockDim.x;
        if (i < vectors) dst[i] = v[u];
      }
    }
    weft::sync::mo::fence_proxy_async_global();  // the stores before the loaders' TMA reads of them
    __syncthreads();  // every thread's stores before thread 0's release
    if (threadIdx.x == 0) weft::sync::mo::st_release_gpu(ag_chunk_flag<Cfg>(p, tm, 0), c.flag_target);
  }
}

}  // namespace weft::gemm
