// Standalone collectives over PGLs (crates/collectives): AllReduce (one-shot and two-shot),
// ReduceScatter and AllGather, pushed through a staging PGL with per-block round flags.
// Plain C (bindgen reads it); the kernels are in kernels/collectives/collectives.cu.
#pragma once
#include <stdint.h>
#include "weft/abi/hd.h"
#include "weft/abi/pgl.h"
#include "weft/abi/sync.h"

// weft_collective_params.algo
#define WEFT_COLL_ALL_REDUCE_ONE_SHOT 1  // every rank pushes its whole input to every peer, sums locally
#define WEFT_COLL_ALL_REDUCE_TWO_SHOT 2  // reduce-scatter push, owner sums its shard, all-gather push
#define WEFT_COLL_REDUCE_SCATTER 3       // shard p of every rank's input pushed to rank p, summed there
#define WEFT_COLL_ALL_GATHER 4           // every rank's input pushed to every peer, copied out

// weft_collective_params.protocol
#define WEFT_COLL_PROTO_SIMPLE 0  // data into slots, then a release flag per block and round
#define WEFT_COLL_PROTO_LL 1      // low latency, one round: every 4-byte word travels with its round
                                  // number in one 8-byte store (low half data, high half the round),
                                  // the receiver polls the words themselves: no flag, no fence
#define WEFT_COLL_PROTO_SENTINEL 2  // one round (two-shot AllReduce: two), Lamport-style: data pushed in place (16-byte stores)
                                    // into slots that hold the sentinel (every bit set) where no
                                    // data is; the receiver polls until no element of a vector is
                                    // the sentinel, uses it and sets it back; full link bandwidth

// Flag layout (a weft_sync_counters of shape (WEFT_COLL_PHASES, 1, world, WEFT_COLL_MAX_BLOCKS)):
// the counter (phase, 0, sender, block) on the receiver holds the last round sequence number whose
// staging data `sender`'s block `block` has pushed there in `phase` (release store; monotone).
#define WEFT_COLL_PHASES 2
#define WEFT_COLL_MAX_BLOCKS 128
// Staging slots per (phase, sender): round `seq` uses slot seq % WEFT_COLL_DEPTH. Three, because a
// block pushes round i + 1 as soon as its peers' round-i data arrived, while a peer may still be
// reading round i - 1 (the slot of round i - 2 is free by then: see collectives.cu).
#define WEFT_COLL_DEPTH 3

typedef struct weft_collective_params {
  uint64_t input;            // this rank's input (local device memory, 16-byte aligned)
  uint64_t output;           // this rank's output (local device memory, 16-byte aligned)
  weft_pgl_view staging;     // u8 PGL: [slot WEFT_COLL_DEPTH][phase 2][sender world][slot_bytes], then
                             // the LL rows and the sentinel area (the offset functions below)
  weft_sync_counters flags;  // round flags (layout above) and the bound of every wait
  uint64_t count;            // elements: AllReduce the buffer, ReduceScatter the output (per rank),
                             // AllGather the input (per rank)
  uint64_t shard;            // elements per shard (two-shot AllReduce, ReduceScatter); else count
  uint64_t window;           // elements of one round per shard: min(slot_bytes / element size, the
                             // shard rounded up to whole 16-byte vectors)
  uint64_t slot_bytes;       // bytes of one staging slot (multiple of 16)
  uint64_t state;            // device address of this rank's weft_collective_state
  uint64_t sentinel_bytes;   // bytes of one sentinel slot (multiple of 16)
  uint32_t rounds;           // ceil(shard or count / window), at least 1 (LL, sentinel: 1;
                             // sentinel two-shot: 2, its two phases)
  int32_t algo;              // WEFT_COLL_*
  int32_t protocol;          // WEFT_COLL_PROTO_*
  uint32_t reserved;
} weft_collective_params;

// Per rank, in device memory, zeroed at creation: where the round numbers stand. Kept on the
// device (not passed by the host) so that a launch captured in a CUDA graph takes fresh round
// numbers at every replay. One copy per possible block, all equal between launches: block b of a
// launch of G blocks reads seq[b] at its start and, at its end, writes the advanced value into
// seq[b], seq[b + G], seq[b + 2G], ... (its threads' stores strided by the grid's thread count,
// so every copy is written whatever the grid and block sizes). No block of the launch reads what
// another writes (block b reads only seq[b]), so no atomic or fence is needed; the next launch on
// the stream reads its copy after this one ended (stream order, or, under programmatic dependent
// launch, its griddepcontrol.wait) and finds every copy advanced. (A last-block counter
// with an acq_rel add did the same for 0.5-1 us more per call: its release waited for the
// block's NVLink stores.)
typedef struct weft_collective_state {
  uint64_t seq[WEFT_COLL_MAX_BLOCKS];  // rounds done so far by this rank's launches (a launch's first is seq + 1)
} weft_collective_state;

// Byte offset of the staging slot of round `seq`, `phase` and `sender` in a rank's staging buffer.
WEFT_HD uint64_t weft_collective_slot_offset(uint64_t seq, uint32_t phase, uint32_t sender, uint32_t world,
                                             uint64_t slot_bytes) {
  return ((uint64_t)((uint32_t)(seq % WEFT_COLL_DEPTH) * WEFT_COLL_PHASES + phase) * world + sender) * slot_bytes;
}

// Byte offset of the LL slot of round `seq` written by `sender`: an area of its own after the
// simple protocol's slots, so that no word there ever carries anything but an LL round number.
WEFT_HD uint64_t weft_collective_ll_slot_offset(uint64_t seq, uint32_t sender, uint32_t world, uint64_t slot_bytes) {
  return ((uint64_t)WEFT_COLL_DEPTH * WEFT_COLL_PHASES * world + (uint32_t)(seq % WEFT_COLL_DEPTH) * world + sender) *
         slot_bytes;
}

// Byte offset of the sentinel slot of round `seq` written by `sender`: after the simple and LL
// slots, rows of `sentinel_bytes`; every byte of this area is 0xff (the sentinel) except where a
// round's data sit between their arrival and their use.
WEFT_HD uint64_t weft_collective_sentinel_slot_offset(uint64_t seq, uint32_t sender, uint32_t world,
                                                      uint64_t slot_bytes, uint64_t sentinel_bytes) {
  return ((uint64_t)WEFT_COLL_DEPTH * WEFT_COLL_PHASES * world + (uint64_t)WEFT_COLL_DEPTH * world) * slot_bytes +
         ((uint64_t)(uint32_t)(seq % WEFT_COLL_DEPTH) * world + sender) * sentinel_bytes;
}

// Rows of `slot_bytes` in a rank's staging before the sentinel area: the simple slots, then the
// LL slots.
WEFT_HD uint32_t weft_collective_staging_rows(uint32_t world) {
  return WEFT_COLL_DEPTH * WEFT_COLL_PHASES * world + WEFT_COLL_DEPTH * world;
}

// Bytes of the sentinel area (after the rows above).
WEFT_HD uint64_t weft_collective_sentinel_area_bytes(uint32_t world, uint64_t sentinel_bytes) {
  return (uint64_t)WEFT_COLL_DEPTH * world * sentinel_bytes;
}
