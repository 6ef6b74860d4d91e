// The error slot protocol: the first thread whose wait expires (or that is handed a coordinate
// outside the counter layout) records what it saw in the rank's weft_error_slot and stops the
// kernel with __trap(). The slot is host-mapped pinned memory, so the host reads it even though
// the trap kills the kernel's context.
//
// First writer wins: a failing thread claims its module's device-memory claim word with
// atomicCAS (device-memory atomics; no atomics on host memory, which PCIe hosts may not support),
// checks the slot is still empty, marks it WRITING, writes the fields, fences at system scope and
// only then publishes the final status. The claim word is never reset: the trap that follows ends
// the context and the module with it. Threads that lose the claim wait (bounded) for the winner
// to publish before trapping, so their trap cannot cut the winner's report short.
#pragma once
#include <stdint.h>
#include "weft/abi/sync.h"
#include "weft/sync/clock.cuh"

namespace weft::sync {

struct failure {
  int32_t status;    // WEFT_SYNC_STATUS_TIMEOUT or _BAD_COORD
  int32_t primitive; // WEFT_SYNC_PRIM_*
  int32_t target_rank;
  weft_tile_coord coord;
  uint64_t expected;
  uint64_t observed;
  uint64_t elapsed_cycles;
  uint64_t elapsed_ns;
  uint32_t role;     // WEFT_ROLE_*: the part of the kernel whose wait or check gave up
};

// One per loaded module (each kernels/**/*.cu is its own module): 0 until a thread claims it.
static __device__ int weft_sync_error_claim;

// How long a thread that lost the claim waits for the winner's report (~10 ms at 2 GHz).
constexpr uint64_t kReportGraceCycles = 20'000'000;

// Records `f` for `rank` (unless another thread already did) and traps. Never returns. Inlined
// into the caller: use it (through fail_inline) in code that runs after setmaxnreg, where ptxas
// ignores the register reallocation if the region calls a function.
__device__ __forceinline__ void fail_inline(const weft_sync_bound& bound, int32_t rank, const failure& f) {
  volatile weft_error_slot* slot = reinterpret_cast<volatile weft_error_slot*>(bound.error_slot);
  if (slot != nullptr) {
    if (atomicCAS(&weft_sync_error_claim, 0, 1) == 0 && slot->status == WEFT_SYNC_STATUS_NONE) {
      slot->status = WEFT_SYNC_STATUS_WRITING;
      slot->primitive = f.primitive;
      slot->rank = rank;
      slot->target_rank = f.target_rank;
      slot->coord.b = f.coord.b;
      slot->coord.d = f.coord.d;
      slot->coord.r = f.coord.r;
      slot->coord.c = f.coord.c;
      slot->expected = f.expected;
      slot->observed = f.observed;
      slot->elapsed_cycles = f.elapsed_cycles;
      slot->budget_cycles = bound.budget_cycles;
      slot->elapsed_ns = f.elapsed_ns;
      slot->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
      slot->thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
      slot->smid = smid();
      slot->role = f.role;
      __threadfence_system();  // the fields reach host memory before the status that vouches for them
      slot->status = f.status;
      __threadfence_system();
    } else {
      // The winner may not even have marked the slot yet: wait until it holds a final status.
      const long long c0 = clock64();
      for (int32_t st = slot->status; (st == WEFT_SYNC_STATUS_NONE || st == WEFT_SYNC_STATUS_WRITING) &&
                                      uint64_t(clock64() - c0) < kReportGraceCycles;
           st = slot->status) {
      }
    }
  }
  __trap();
}

// fail_inline as one out-of-line function: the cold path stays out of the callers' code.
inline __device__ __noinline__ void fail(const weft_sync_bound& bound, int32_t rank, const failure& f) {
  fail_inline(bound, rank, f);
}

}  // namespace weft::sync
