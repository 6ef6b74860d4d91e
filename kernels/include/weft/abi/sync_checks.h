// Parameters and results of weft's own sync test and timing kernels (kernels/sync/*.cu), and the
// payload / delay functions both the kernels and the host evaluate (one definition, WEFT_HD).
#pragma once
#include <stdint.h>
#include "weft/abi/hd.h"
#include "weft/abi/pgl.h"
#include "weft/abi/sync.h"

// ---- stress: data + signal between ranks (kernels/sync/stress.cu) ----------------------------

#define WEFT_STRESS_RING 0        // rank -> rank + 1 (mod world), .sys scope
#define WEFT_STRESS_ALL_TO_ALL 1  // every rank -> every rank (itself included), .sys scope
#define WEFT_STRESS_INTER_SM 2    // one block -> another block of the same GPU, .gpu scope
// rank -> rank + 1 as the ring, but the payload slot lives on rank + 2 (world >= 3): data, flag
// and the receiver's reads take three different NVLink paths, .sys scope.
#define WEFT_STRESS_RELAY 3

#define WEFT_STRESS_ORDERED 0 // release signals, acquire waits (the real primitives)
#define WEFT_STRESS_RELAXED 1 // negative control: relaxed signals and polls, no fences
// Payload by TMA bulk stores (staged through shared memory), released as ORDERED once every bulk
// store is complete (cp.async.bulk.wait_group 0, then the async-proxy fence).
#define WEFT_STRESS_BULK 2
// (Released after cp.async.bulk.wait_group.read 0 only — their writes maybe still in flight — the
// same runs never showed a wrong element on H200s, so no negative control of that can fail: see
// crates/sync/README.md.)

// Written by the receiver into a slot it has checked, before it frees the slot.
#define WEFT_STRESS_POISON 0xDEADBEEFu

// Counter coordinates (row, col) in the (1, 1, 2, world) counter layout.
#define WEFT_STRESS_READY_ROW 0 // ready[sender] on the receiver: rounds the sender has published
#define WEFT_STRESS_FREE_ROW 1  // free[receiver] on the sender: rounds the receiver has consumed

typedef struct weft_stress_params {
  weft_pgl_view data;          // uint32, shape (1, slots, world, max_elems): [slot][sender] on the receiver
  weft_sync_counters counters; // uint64, shape (1, 1, 2, world)
  uint64_t result;             // device address of a zeroed weft_stress_result
  uint64_t seed;
  uint64_t first_round;        // global index of this launch's first round (the epoch base)
  uint32_t rounds;             // rounds in this launch, per (sender, receiver) pair
  uint32_t max_elems;          // payloads hold 1 ..= max_elems elements
  uint32_t slots;              // payload buffers per pair (round g uses slot g % slots)
  int32_t mode;                // WEFT_STRESS_RING / _ALL_TO_ALL / _INTER_SM / _RELAY
  int32_t ordering;            // WEFT_STRESS_ORDERED / _RELAXED / _BULK
  uint32_t reserved;
} weft_stress_params;

typedef struct weft_stress_result {
  uint64_t mismatches;      // payload elements that differed from the recomputed pattern
  uint64_t checked;         // payload elements compared
  uint64_t rounds_received; // (pair, round) payloads consumed
  uint64_t bad_round;       // first mismatch recorded (claimed with bad_claimed)
  int32_t bad_sender;
  uint32_t bad_index;
  uint32_t bad_got;
  uint32_t bad_want;
  uint32_t bad_claimed;
  uint32_t reserved;
} weft_stress_result;

// splitmix64's finalizer: a bijective 64-bit mix.
WEFT_HD uint64_t weft_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One hash per (seed, round, sender, receiver) message.
WEFT_HD uint64_t weft_stress_message_key(uint64_t seed, uint64_t round, uint32_t sender, uint32_t receiver) {
  return weft_mix64(weft_mix64(seed ^ weft_mix64(round)) ^ ((uint64_t)sender << 32 | receiver));
}

// The payload length of a message: 1 ..= max_elems; one message in 8 is short (<= 32 elements).
WEFT_HD uint32_t weft_stress_elems(uint64_t seed, uint64_t round, uint32_t sender, uint32_t receiver, uint32_t max_elems) {
  const uint64_t h = weft_mix64(weft_stress_message_key(seed, round, sender, receiver));
  const uint32_t span = (h & 7) == 0 && max_elems > 32 ? 32 : max_elems;
  return 1 + (uint32_t)((h >> 8) % span);
}

// Element `index` of a message (never WEFT_STRESS_POISON, so a poisoned slot never passes).
WEFT_HD uint32_t weft_stress_value(uint64_t key, uint32_t index) {
  const uint32_t v = (uint32_t)weft_mix64(key + index);
  return v == WEFT_STRESS_POISON ? v ^ 1u : v;
}

// ---- barrier laps with random per-rank delays (kernels/sync/laps.cu) ---------------------------

typedef struct weft_laps_params {
  weft_sync_counters barrier; // uint64, shape (1, 1, 1, blocks): one barrier per block
  weft_pgl_view seen;         // uint64, shape (1, 1, blocks, world): seen[block][r] = last lap rank r announced
  uint64_t result;            // device address of a zeroed weft_laps_result
  uint64_t seed;
  uint64_t first_lap;         // barriers already completed at every coordinate (the epoch base)
  uint32_t laps;
  uint32_t max_delay_ns;      // most laps wait 0 ..= max_delay_ns; one in 64 waits up to 10x that
} weft_laps_params;

typedef struct weft_laps_result {
  uint64_t violations; // seen[block][p] outside [lap, lap + 1] right after barrier `lap`
  uint64_t checks;     // seen values checked
  uint64_t delay_ns;   // delay actually spent (globaltimer), summed over blocks
  uint64_t bad_lap;    // first violation recorded (claimed with bad_claimed)
  uint64_t bad_seen;
  int32_t bad_block;
  int32_t bad_peer;
  uint32_t bad_claimed;
  uint32_t reserved;
} weft_laps_result;

// Delay of (lap, rank, block) in nanoseconds.
WEFT_HD uint32_t weft_laps_delay_ns(uint64_t seed, uint64_t lap, uint32_t rank, uint32_t block, uint32_t max_delay_ns) {
  const uint64_t h = weft_mix64(weft_stress_message_key(seed, lap, rank, block));
  const uint64_t span = (h & 63) == 0 ? 10ull * max_delay_ns : max_delay_ns;
  return (uint32_t)((h >> 8) % (span + 1));
}

// ---- latency (kernels/sync/latency.cu) -------------------------------------------------------

#define WEFT_LATENCY_RING 0      // a token passed rank 0 -> 1 -> ... -> 0; one lap = world one-way hops
#define WEFT_LATENCY_PING_PONG 1 // ranks 0 and 1; one iteration = one round trip
#define WEFT_LATENCY_BARRIER 2   // every rank; one iteration = one barrier
#define WEFT_LATENCY_INTER_SM 3  // two blocks of one GPU, .gpu scope; one iteration = one round trip
#define WEFT_LATENCY_MBARRIER 4  // two warps of one block, shared-memory mbarriers; one round trip
// Reference paths timed beside the primitives (not weft's API): what an ordered hop costs with a
// plain store instead of weft's atomic add, the unordered floor, and a barrier built from stores.
#define WEFT_LATENCY_PING_PONG_STORE 5   // ranks 0 and 1: st.release.sys of the epoch / ld.acquire.sys
#define WEFT_LATENCY_PING_PONG_RELAXED 6 // ranks 0 and 1: st.relaxed.sys / ld.relaxed.sys (no ordering)
#define WEFT_LATENCY_BARRIER_STORE 7     // every rank: one fence.acq_rel.sys, then st.relaxed.sys of
                                         // the epoch into its slot on each peer; ld.acquire.sys of
                                         // each peer's slot on its own GPU

typedef struct weft_latency_params {
  weft_sync_counters counters; // uint64, shape (1, 1, 1, max(2, world)): BARRIER_STORE's slot per rank
  uint64_t samples;            // device address: uint32 clock64 cycles per timed iteration
  uint64_t summary;            // device address of a weft_latency_summary
  uint64_t first;              // iterations already done on these counters (the epoch base)
  uint32_t warmup;             // untimed iterations before the timed ones
  uint32_t iters;              // timed iterations
  int32_t kind;                // WEFT_LATENCY_*
  uint32_t reserved;
} weft_latency_params;

// Written by the timing thread: the timed loop measured by both clocks, so the host converts
// per-iteration cycles to nanoseconds at the clock the SM actually ran.
typedef struct weft_latency_summary {
  uint64_t total_ns;
  uint64_t total_cycles;
  uint32_t smid[2]; // the SMs of the two sides (INTER_SM: must differ)
} weft_latency_summary;

// ---- deliberately missing signal (kernels/sync/timeout.cu) -----------------------------------

typedef struct weft_timeout_params {
  weft_sync_counters counters; // only base[rank] is read
  weft_tile_coord coord;       // the counter waited on
  uint64_t expected;           // a value nobody will make it reach
} weft_timeout_params;
