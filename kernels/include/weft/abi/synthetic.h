// Synthetic kernels of the overlap-order bench and the barrier trials (kernels/barrier/
// persistent_compute.cu, comm_copy.cu; host side crates/barrier/src/synthetic.rs): a persistent
// compute kernel whose every output the host recomputes in closed form, a copy kernel that
// arrives on a KernelBarrier, and the %globaltimer stamps both leave.
#pragma once
#include <stdint.h>
#include "weft/abi/hd.h"
#include "weft/abi/kernel_barrier.h"

#define WEFT_OVERLAP_THREADS 1024  // threads per block of both kernels
#define WEFT_OVERLAP_CHAINS 56     // independent affine chains per thread: 64 registers, the whole file at 1024 threads

// Indices into the stamps buffer (uint64 %globaltimer ns). The host sets starts to UINT64_MAX
// and ends to 0; blocks atomicMin their start and atomicMax their end.
#define WEFT_STAMP_COMPUTE_START 0
#define WEFT_STAMP_COMPUTE_END 1
#define WEFT_STAMP_COMM_START 2
#define WEFT_STAMP_COMM_END 3
#define WEFT_STAMP_COMM_ARRIVE 4  // taken by the arriving thread just before it arrives
#define WEFT_STAMP_WAIT_EXIT 5   // the KernelBarrier wait kernel's exit (barrier mode only)
#define WEFT_STAMP_COUNT 6

// Tile t (taken from *tile_counter, dynamic scheduling) writes out[t * THREADS + thread]: the sum
// over CHAINS chains of `rounds` steps x -> mul * x + add (mod 2^32) from weft_overlap_chain_start.
typedef struct weft_persistent_compute_params {
  uint64_t out;            // device address: u32, tiles * WEFT_OVERLAP_THREADS elements
  uint64_t tile_counter;   // device address: u32, zeroed before the launch
  uint64_t stamps;         // device address: u64, WEFT_STAMP_COUNT entries
  uint32_t tiles;
  uint32_t rounds;
  uint32_t mul;            // odd
  uint32_t add;
  uint32_t seed;
  uint32_t reserved;
} weft_persistent_compute_params;

// dst[0..bytes) = src[0..bytes) by 16-byte vectors, grid-stride; src, dst 16-byte aligned, bytes a
// multiple of 16, disjoint. Arrives on `barrier` first.
typedef struct weft_comm_copy_params {
  weft_kernel_barrier_view barrier;
  uint64_t src;            // device address
  uint64_t dst;            // device address
  uint64_t bytes;
  uint64_t stamps;         // device address: u64, WEFT_STAMP_COUNT entries
} weft_comm_copy_params;

WEFT_HD uint32_t weft_overlap_mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The start value of chain `chain` of element `elem`.
WEFT_HD uint32_t weft_overlap_chain_start(uint32_t seed, uint32_t elem, uint32_t chain) {
  return weft_overlap_mix(seed ^ (elem * 0x9e3779b9u)) ^ (chain * 0x85ebca6bu);
}

// Sum of the start values of an element's chains. The steps are affine, so after `rounds` steps
// the element is mul^rounds * start_sum + CHAINS * add_rounds (the host's closed form).
WEFT_HD uint32_t weft_overlap_start_sum(uint32_t seed, uint32_t elem) {
  uint32_t s = 0;
  for (uint32_t j = 0; j < WEFT_OVERLAP_CHAINS; ++j) s += weft_overlap_chain_start(seed, elem, j);
  return s;
}
