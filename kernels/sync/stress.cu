// Stress: data plus signal between ranks (or between two blocks of one GPU), many rounds, random
// payload sizes, every element checked by the receiver against the pattern it recomputes.
//
// For each (sender, receiver) pair there is one sender block and one receiver block. Round g
// (global: first_round + r) uses payload slot g % slots, on the receiver:
//   sender:   wait free[receiver] (on itself) >= g - slots + 1   -- the receiver consumed round g - slots
//             plain stores of the payload into the receiver's slot; __syncthreads()
//             signal ready[sender] on the receiver                 -- release: payload before counter
//   receiver: wait ready[sender] (on itself) >= g + 1            -- acquire: counter before reads
//             __syncthreads(); check every element, overwrite it with poison; __syncthreads()
//             signal free[receiver] on the sender                  -- release: reads/poison before reuse
// A missing release or acquire shows up as stale elements (the previous use of the slot, or
// poison) or as poison landing on top of the next payload. The RELAXED ordering runs the same
// protocol with unordered signals and polls, as a negative control. BULK sends the payload by TMA
// bulk stores (the fused GEMM epilogues' path) and releases it once they are complete. RELAY
// puts each payload slot on the rank after the receiver, so data, flag and reads take three
// different NVLink paths.
#include "weft/tma/bulk_copy.cuh"
#include "weft/pgl/view.cuh"
#include "weft/sync.cuh"
#include "weft/abi/sync_checks.h"

using namespace weft::sync;

namespace {

struct pair_role {
  bool sender;
  int32_t peer;  // the receiver (for a sender block) or the sender (for a receiver block)
};

// Blocks [0, n) send, [n, 2n) receive; n = 1 (ring, inter-SM) or world (all-to-all).
__device__ pair_role role_of(const weft_stress_params& p) {
  const int32_t rank = p.counters.view.rank, world = p.counters.view.world;
  const int32_t n = p.mode == WEFT_STRESS_ALL_TO_ALL ? world : 1;
  const int32_t k = int32_t(blockIdx.x) % n;
  const bool sender = int32_t(blockIdx.x) < n;
  int32_t peer = rank;  // inter-SM: a block of this GPU on either side
  if (p.mode == WEFT_STRESS_RING || p.mode == WEFT_STRESS_RELAY) peer = sender ? (rank + 1) % world : (rank + world - 1) % world;
  if (p.mode == WEFT_STRESS_ALL_TO_ALL) peer = k;
  return {sender, peer};
}

__device__ bool bulk(const weft_stress_params& p) { return p.ordering == WEFT_STRESS_BULK; }

// The relaxed negative control's signals and polls.
__device__ bool unordered(const weft_stress_params& p) { return p.ordering == WEFT_STRESS_RELAXED; }

// Release signal / acquire wait in the pair's scope and ordering.
__device__ void notify(const weft_stress_params& p, weft_tile_coord c, int32_t dst) {
  if (p.mode == WEFT_STRESS_INTER_SM) {
    if (unordered(p)) {
      mo::red_add_relaxed_gpu(counter_or_trap(p.counters, c, dst, WEFT_SYNC_PRIM_SIGNAL), 1);
    } else {
      signal_gpu(p.counters, c, 1);
    }
  } else if (unordered(p)) {
    unordered::signal(p.counters, c, dst, 1);
  } else {
    signal(p.counters, c, dst, 1);
  }
}

__device__ void await(const weft_stress_params& p, weft_tile_coord c, uint64_t target) {
  const int32_t rank = p.counters.view.rank;
  if (unordered(p)) {
    unordered::wait(p.counters, c, rank, target);
  } else if (p.mode == WEFT_STRESS_INTER_SM) {
    wait_gpu(p.counters, c, target);
  } else {
    wait(p.counters, c, rank, target);
  }
}

// Elements staged in shared memory per bulk store (8 KiB).
constexpr uint32_t kBulkChunkElems = 2048;

// The payload's n elements (padded to whole 16-byte units, within the slot: max_elems is a
// multiple of 4) through shared memory and bulk stores issued by thread 0. On return thread 0's
// stores are complete and ordered before its release.
__device__ void send_bulk(uint32_t* dst, uint64_t key, uint32_t n) {
  __shared__ alignas(128) uint32_t chunk[kBulkChunkElems];
  const uint32_t padded = (n + 3) & ~3u;
  for (uint32_t at = 0; at < padded; at += kBulkChunkElems) {
    const uint32_t len = min(kBulkChunkElems, padded - at);
    for (uint32_t i = threadIdx.x; i < len; i += blockDim.x) chunk[i] = at + i < n ? weft_stress_value(key, at + i) : 0u;
    weft::fence_proxy_async_smem();  // each writer's generic stores before the async proxy reads
    __syncthreads();
    if (threadIdx.x == 0) {
      weft::bulk_store_s2g(dst + at, chunk, len * 4);
      weft::bulk_commit_group();
      weft::bulk_wait_group_read<0>();  // the chunk may be rewritten
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    weft::bulk_wait_group<0>();    // the writes are performed...
    mo::fence_proxy_async_global();  // ...and ordered before the generic-proxy release
  }
}

// The rank whose memory holds `receiver`'s payload slots: itself, or (RELAY) the next rank.
__device__ int32_t slot_owner(const weft_stress_params& p, int32_t receiver) {
  return p.mode == WEFT_STRESS_RELAY ? (receiver + 1) % p.counters.view.world : receiver;
}

__device__ uint32_t* slot_of(const weft_stress_params& p, int32_t owner, uint64_t g, int32_t sender) {
  return weft::pgl::element<uint32_t>(p.data, owner, 0, uint32_t(g % p.slots), uint32_t(sender), 0);
}

__device__ void send(const weft_stress_params& p, int32_t receiver) {
  const int32_t rank = p.counters.view.rank;
  for (uint32_t r = 0; r < p.rounds; ++r) {
    const uint64_t g = p.first_round + r;
    if (threadIdx.x == 0 && g >= p.slots) {
      await(p, coord4(0, 0, WEFT_STRESS_FREE_ROW, receiver), g - p.slots + 1);
      // The receiver's poison (generic stores it released) before this thread's bulk stores.
      if (bulk(p)) mo::fence_proxy_async_global();
    }
    __syncthreads();  // the block stores only after the slot is free
    const uint64_t key = weft_stress_message_key(p.seed, g, rank, receiver);
    const uint32_t n = weft_stress_elems(p.seed, g, rank, receiver, p.max_elems);
    uint32_t* dst = slot_of(p, slot_owner(p, receiver), g, rank);
    if (bulk(p)) {
      send_bulk(dst, key, n);  // thread 0 issued every store and releases below
    } else {
      for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = weft_stress_value(key, i);
    }
    __syncthreads();  // every thread's payload stores precede thread 0's release
    if (threadIdx.x == 0) notify(p, coord4(0, 0, WEFT_STRESS_READY_ROW, rank), receiver);
  }
}

__device__ void receive(const weft_stress_params& p, int32_t sender, weft_stress_result* out) {
  const int32_t rank = p.counters.view.rank;
  uint64_t mismatches = 0, checked = 0;
  for (uint32_t r = 0; r < p.rounds; ++r) {
    const uint64_t g = p.first_round + r;
    if (threadIdx.x == 0) await(p, coord4(0, 0, WEFT_STRESS_READY_ROW, sender), g + 1);
    __syncthreads();  // the block reads only after thread 0's acquire
    const uint64_t key = weft_stress_message_key(p.seed, g, sender, rank);
    const uint32_t n = weft_stress_elems(p.seed, g, sender, rank, p.max_elems);
    uint32_t* src = slot_of(p, slot_owner(p, rank), g, sender);
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t got = src[i], want = weft_stress_value(key, i);
      src[i] = WEFT_STRESS_POISON;
      if (got != want) {
        ++mismatches;
        if (atomicCAS(&out->bad_claimed, 0u, 1u) == 0u) {
          out->bad_round = g;
          out->bad_sender = sender;
          out->bad_index = i;
          out->bad_got = got;
          out->bad_want = want;
        }
      }
    }
    if (threadIdx.x == 0) checked += n;
    __syncthreads();  // every thread's reads and poison stores precede thread 0's release
    if (threadIdx.x == 0) notify(p, coord4(0, 0, WEFT_STRESS_FREE_ROW, rank), sender);
  }
  if (mismatches) atomicAdd(reinterpret_cast<unsigned long long*>(&out->mismatches), mismatches);
  if (threadIdx.x == 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&out->checked), checked);
    atomicAdd(reinterpret_cast<unsigned long long*>(&out->rounds_received), p.rounds);
  }
}

}  // namespace

// Grid: 2 blocks (ring, inter-SM) or 2 * world blocks (all-to-all), all resident at once.
extern "C" __global__ void weft_sync_stress(const __grid_constant__ weft_stress_params p) {
  const pair_role role = role_of(p);
  auto* out = reinterpret_cast<weft_stress_result*>(p.result);
  if (role.sender) {
    send(p, role.peer);
  } else {
    receive(p, role.peer, out);
  }
}
