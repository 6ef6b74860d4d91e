// TMA bulk copies (non-tensor `cp.async.bulk`, sm_90); the global -> shared direction completes on
// an mbarrier (weft/sm90/mbarrier.cuh). Device-only C++ (not read by bindgen): named wrappers so
// kernels never carry inline PTX of their own.
//
// Orderings, in one place:
// - A bulk load global -> shared (`bulk_load_g2s`) is issued by one thread and performed by the
//   async proxy; it signals the mbarrier with complete_tx(bytes) when the bytes are in shared
//   memory. A thread that sees the phase complete through `mbar_try_wait` (acquire, CTA scope)
//   then sees those bytes, and may hand them to a bulk store with no proxy fence: both sides are
//   the async proxy.
// - Shared memory written by ordinary (generic-proxy) stores and then read by a bulk store needs
//   `fence_proxy_async_smem()` between the two (the writing threads, then a CTA barrier, then the
//   issuing thread).
// - A bulk store shared -> global (`bulk_store_s2g`) joins the thread's current bulk group;
//   `bulk_commit_group()` closes the group. `bulk_wait_group_read<N>()` returns once all but the N
//   most recent groups have finished READING shared memory: their source may be overwritten, but
//   their global writes may still be in flight. `bulk_wait_group<N>()` returns once all but the N
//   most recent groups are COMPLETE: the writes are performed. Only after `bulk_wait_group<0>()`
//   may a thread signal (with a release at the consumer's scope, `.sys` for a peer GPU) that the
//   data is there, and a kernel must not exit with groups still pending.
// - mbarrier initialisation is a generic-proxy write that the async proxy later updates:
//   `mbar_fence_init()` after the inits and before the first bulk load that names the barrier.
// - Addresses: shared operands 16-byte aligned (128 recommended), global operands 16-byte
//   aligned, sizes multiples of 16 bytes. One transaction count is at most 2^20 - 1 bytes.
#pragma once
#include <stdint.h>
#include "weft/sm90/mbarrier.cuh"

namespace weft {

// ---------------------------------------------------------------------------------------------
// Proxy fence

// Orders this thread's preceding generic-proxy accesses to shared memory before its subsequent
// async-proxy (bulk copy) accesses: needed when ordinary stores fill a buffer a bulk store reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Orders this thread's preceding generic-proxy accesses, in every state space, before its
// subsequent async-proxy accesses: a thread that acquired data written by ordinary stores (this
// GPU's or a peer's, e.g. through a barrier) issues it before bulk-loading that data.
__device__ __forceinline__ void fence_proxy_async_all() {
  asm volatile("fence.proxy.async;" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// Bulk copies (cp.async.bulk, non-tensor)

// global (local or a mapped peer address) -> this CTA's shared memory, `bytes` bytes; completes
// complete_tx(bytes) on `bar`, which must already expect them (mbar_arrive_expect_tx).
__device__ __forceinline__ void bulk_load_g2s(void* smem_dst, const void* gmem_src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(smem_dst)), "l"(gmem_src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// This CTA's shared memory -> global (local or a mapped peer address), `bytes` bytes, in the
// calling thread's current bulk group (see bulk_commit_group / bulk_wait_group*).
__device__ __forceinline__ void bulk_store_s2g(void* gmem_dst, const void* smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               ::"l"(gmem_dst), "r"(smem_addr(smem_src)), "r"(bytes)
               : "memory");
}

// Closes the calling thread's current bulk group (every bulk store issued since the last commit).
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Returns once at most N of this thread's committed bulk groups have not finished reading their
// shared-memory source (their global writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Returns once at most N of this thread's committed bulk groups are incomplete; with N = 0 every
// write this thread issued by bulk store is performed.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace weft
