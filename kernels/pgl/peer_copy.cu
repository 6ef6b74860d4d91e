// Peer-memory copy kernels: the kernel-driven side of the pgl bandwidth bench
// (crates/harness/src/bench/pgl.rs). Each copies `bytes` bytes from `src` to `dst`, where one of
// the two is a peer GPU's buffer mapped into this process (a PGL peer pointer) and the other is
// local; any grid size covers any size.
//
// Preconditions (checked by the host): `src`, `dst` 16-byte aligned, `bytes` a multiple of 16,
// the two ranges disjoint.
//
// - weft_peer_write_plain / weft_peer_read_plain: 16-byte vector loads and stores by every thread
//   (blocks of kPlainThreads), grid-stride; each thread keeps UNROLL independent loads in flight
//   before it stores them. Writes stream the local source (ld.global.cs) and store to the peer
//   with plain st.global; reads load the peer (ld.global.cg, no L1) and stream to local memory
//   (st.global.cs).
// - weft_peer_write_bulk / weft_peer_read_bulk: one thread per block drives the TMA through a
//   `stages`-deep ring of `chunk`-byte shared-memory buffers (dynamic shared memory, stages *
//   chunk bytes): bulk load global -> shared completing on the stage's mbarrier, then bulk store
//   shared -> global in its own bulk group; a stage is refilled once its store has read it, with
//   `inflight` stores allowed to be reading at once. Chunk c of the message goes to block
//   c % gridDim.x; the last chunk may be short (the tail). The kernel ends with
//   cp.async.bulk.wait_group 0, so every byte is written when it exits.
#include <stdint.h>
#include <stdio.h>
#include "weft/tma/bulk_copy.cuh"

namespace {

constexpr int kPlainThreads = 1024;
// Independent 16-byte loads in flight per thread. Reads cross NVLink on the load side, whose
// latency (~1-2 us) needs more bytes in flight than a local load does.
constexpr int kWriteUnroll = 4;
constexpr int kReadUnroll = 8;
constexpr uint32_t kMaxStages = 8;
// Bound on one mbarrier wait: about 2 s at Hopper clocks, far above any single chunk's latency.
constexpr uint64_t kWaitBudgetCycles = 1ull << 32;

// dst[i] = src[i] for i < n vectors. PEER_SRC selects the cache operators of a read (peer source,
// local destination) or a write (local source, peer destination).
template <int UNROLL, bool PEER_SRC>
__device__ __forceinline__ void copy_vectors(const uint4* __restrict__ src, uint4* __restrict__ dst, uint64_t n) {
  const uint64_t threads = uint64_t(gridDim.x) * blockDim.x;
  uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Whole rounds: UNROLL vectors per thread, a warp's accesses contiguous (512 B) in each.
  for (; i + (UNROLL - 1) * threads < n; i += UNROLL * threads) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) v[k] = PEER_SRC ? __ldcg(src + i + k * threads) : __ldcs(src + i + k * threads);
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
      if (PEER_SRC) {
        __stcs(dst + i + k * threads, v[k]);
      } else {
        dst[i + k * threads] = v[k];
      }
    }
  }
  // The tail: fewer than UNROLL vectors left for this thread.
  for (; i < n; i += threads) {
    if (PEER_SRC) {
      __stcs(dst + i, __ldcg(src + i));
    } else {
      dst[i] = __ldcs(src + i);
    }
  }
}

// The TMA pipeline of one block, run by one thread. INFLIGHT stores may still be reading shared
// memory when a stage is refilled; 1 <= INFLIGHT < stages.
template <int INFLIGHT>
__device__ __forceinline__ void bulk_pipeline(const uint8_t* src, uint8_t* dst, uint64_t bytes, uint32_t chunk,
                                              uint32_t stages, uint8_t* buf, uint64_t* bars) {
  const uint64_t n_chunks = (bytes + chunk - 1) / chunk;
  const uint64_t first = blockIdx.x, step = gridDim.x;
  // This block's chunks: first, first + step, ... (j-th of them: first + j * step).
  const uint64_t mine = n_chunks > first ? (n_chunks - first - 1) / step + 1 : 0;
  if (mine == 0) return;

  for (uint32_t s = 0; s < stages; ++s) weft::mbar_init(&bars[s], 1);
  weft::mbar_fence_init();

  auto offset = [&](uint64_t j) { return (first + j * step) * chunk; };
  auto length = [&](uint64_t j) {
    const uint64_t left = bytes - offset(j);
    return left < chunk ? uint32_t(left) : chunk;
  };
  // Stage j % stages receives the block's j-th chunk; its mbarrier's (j / stages)-th phase
  // completes when the bytes have landed.
  auto load = [&](uint64_t j) {
    const uint32_t s = uint32_t(j % stages), len = length(j);
    weft::mbar_arrive_expect_tx(&bars[s], len);
    weft::bulk_load_g2s(buf + uint64_t(s) * chunk, src + offset(j), len, &bars[s]);
  };

  const uint64_t prologue = mine < stages ? mine : stages;
  for (uint64_t j = 0; j < prologue; ++j) load(j);
  for (uint64_t j = 0; j < mine; ++j) {
    const uint32_t s = uint32_t(j % stages), parity = uint32_t((j / stages) & 1);
    if (!weft::mbar_wait_bounded(&bars[s], parity, kWaitBudgetCycles)) {
      printf("weft_peer_copy bulk: block %u: chunk %llu (stage %u, parity %u) never landed\n", blockIdx.x,
             (unsigned long long)j, s, parity);
      __trap();
    }
    // The load completed through the async proxy and the store reads through it too: no fence.
    weft::bulk_store_s2g(dst + offset(j), buf + uint64_t(s) * chunk, length(j));
    weft::bulk_commit_group();
    // Refill the stage of chunk j - INFLIGHT with chunk j - INFLIGHT + stages, once every store
    // but the INFLIGHT most recent (j - INFLIGHT + 1 .. j) has read its buffer.
    if (j >= INFLIGHT && j - INFLIGHT + stages < mine) {
      weft::bulk_wait_group_read<INFLIGHT>();
      load(j - INFLIGHT + stages);
    }
  }
  // Every store performed before the kernel may end (and before anything could be signalled).
  weft::bulk_wait_group<0>();
}

__device__ __forceinline__ void bulk_copy(const void* src, void* dst, uint64_t bytes, uint32_t chunk, uint32_t stages,
                                          uint32_t inflight) {
  __shared__ uint64_t bars[kMaxStages];
  extern __shared__ __align__(128) uint8_t buf[];
  if (threadIdx.x != 0) return;
  // The host keeps 1 <= inflight < stages <= kMaxStages; anything else would index past bars[].
  if (stages > kMaxStages || inflight == 0 || inflight >= stages) __trap();
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* d = static_cast<uint8_t*>(dst);
  switch (inflight) {
    case 1: bulk_pipeline<1>(s, d, bytes, chunk, stages, buf, bars); break;
    case 2: bulk_pipeline<2>(s, d, bytes, chunk, stages, buf, bars); break;
    case 3: bulk_pipeline<3>(s, d, bytes, chunk, stages, buf, bars); break;
    case 4: bulk_pipeline<4>(s, d, bytes, chunk, stages, buf, bars); break;
    case 5: bulk_pipeline<5>(s, d, bytes, chunk, stages, buf, bars); break;
    case 6: bulk_pipeline<6>(s, d, bytes, chunk, stages, buf, bars); break;
    case 7: bulk_pipeline<7>(s, d, bytes, chunk, stages, buf, bars); break;
    default: __trap();  // the host keeps 1 <= inflight < stages <= kMaxStages
  }
}

}  // namespace

// Local source -> peer destination by 16-byte stores. Blocks of kPlainThreads threads.
extern "C" __global__ void __launch_bounds__(kPlainThreads, 1) weft_peer_write_plain(const uint4* src, uint4* dst, uint64_t bytes) {
  copy_vectors<kWriteUnroll, false>(src, dst, bytes / 16);
}

// Peer source -> local destination by 16-byte loads. Blocks of kPlainThreads threads.
extern "C" __global__ void __launch_bounds__(kPlainThreads, 1) weft_peer_read_plain(const uint4* src, uint4* dst, uint64_t bytes) {
  copy_vectors<kReadUnroll, true>(src, dst, bytes / 16);
}

// Local source -> peer destination through shared memory by TMA bulk copies. One thread of each
// block works (launch 32); dynamic shared memory stages * chunk bytes; chunk a multiple of 16,
// 2 <= stages <= 8, 1 <= inflight < stages.
extern "C" __global__ void __launch_bounds__(32, 1) weft_peer_write_bulk(const void* src, void* dst, uint64_t bytes, uint32_t chunk,
                                                                         uint32_t stages, uint32_t inflight) {
  bulk_copy(src, dst, bytes, chunk, stages, inflight);
}

// Peer source -> local destination, same pipeline as weft_peer_write_bulk.
extern "C" __global__ void __launch_bounds__(32, 1) weft_peer_read_bulk(const void* src, void* dst, uint64_t bytes, uint32_t chunk,
                                                                        uint32_t stages, uint32_t inflight) {
  bulk_copy(src, dst, bytes, chunk, stages, inflight);
}
