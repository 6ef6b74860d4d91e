// Thread-block clusters (sm_90): rank inside the cluster, cluster-wide barrier, and arriving on a
// peer CTA's shared-memory mbarrier. Device-only C++. On-chip only: this is the SM-to-SM
// distributed shared memory of one cluster, unrelated to NVLink multicast.
#pragma once
#include <stdint.h>
#include "weft/sm90/mbarrier.cuh"

namespace weft {

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every non-exited thread of the cluster: arrive (release: this thread's earlier memory accesses,
// shared memory included, are ordered before the others' wait returns), then wait (acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Arrives once on the mbarrier at `bar`'s offset in CTA `cta` of this cluster (this CTA
// included), with the instruction's default semantics (release, CTA scope), as a consumer's "done
// reading this stage" signal to the loaders. Not `.release.cluster`: that form costs a GPU-wide
// MEMBAR per arrival (seen in the SASS: the GEMM ran at half speed), and the ordering that
// matters here, wgmma's shared-memory reads before the next TMA write, is already given by the
// wgmma_wait that precedes the arrival. The target CTA must not have exited: end kernels that do
// this with cluster_sync().
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

}  // namespace weft
