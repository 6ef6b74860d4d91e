// Named memory-order operations (PTX memory model, sm_70+): the one place weft writes inline asm
// for ordering. Every other sync header calls these.
//
// Scopes: `sys` orders against other GPUs and the host (peer memory over NVLink, host-mapped
// memory); `gpu` orders between SMs of one GPU and is cheaper. A release operation makes the
// calling thread's earlier memory operations (and those it has observed, e.g. its block's stores
// before a __syncthreads()) visible to any thread that acquires the released value at that scope.
// An acquire operation orders the thread's later loads and stores after it.
// All asm statements clobber "memory" so the compiler neither moves nor caches memory accesses
// across them.
#pragma once
#include <stdint.h>

namespace weft::sync::mo {

// ---- loads ----

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t ld_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Strong but unordered: sees other GPUs' writes eventually, orders nothing around it.
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t ld_relaxed_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// ---- stores ----

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// ---- atomic adds (red: no result returned; atom: returns the old value) ----

__device__ __forceinline__ void red_add_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void red_add_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Unordered add: combine with fence_acq_rel_* before it to make a release pattern.
__device__ __forceinline__ void red_add_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void red_add_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t atom_add_release_sys(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.release.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint64_t atom_add_release_gpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.release.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

__device__ __forceinline__ uint64_t atom_add_acq_rel_gpu(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// ---- fences ----

// Orders all of the thread's earlier memory operations before all later ones at system scope.
// Followed by a relaxed write it forms a release pattern; preceded by a relaxed read that
// observed a release, an acquire pattern.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Orders generic-proxy writes (plain st.global / st.shared) before later async-proxy operations
// (TMA, cp.async.bulk) of this thread: needed when TMA reads data written with plain stores.
// Data written *by* TMA must instead be complete (cp.async.bulk.wait_group 0, not only .read)
// before a signal releases it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async;" ::: "memory"); }

// The same, restricted to global memory: orders this thread's async-proxy global writes (TMA
// stores it saw complete) with its later generic-proxy operations, without touching shared memory,
// where the CTA's TMA loads are in flight.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace weft::sync::mo
