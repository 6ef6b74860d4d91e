// Bounded device synchronization (crates/sync): the counter layout handed to kernels, the bound on
// every wait, and the error slot a wait fills when the bound expires. Plain C (bindgen reads it).
// The device primitives over these structs are in weft/sync/*.cuh (umbrella: weft/sync.cuh).
#pragma once
#include <stdint.h>
#include "weft/abi/pgl.h"

// weft_error_slot.status. The first failing thread (weft/sync/error.cuh) marks the slot WRITING,
// fills the fields, then publishes one of the final codes. The host clears it to NONE.
#define WEFT_SYNC_STATUS_NONE 0
#define WEFT_SYNC_STATUS_WRITING 1
#define WEFT_SYNC_STATUS_TIMEOUT 2    // a wait ran past its cycle budget
#define WEFT_SYNC_STATUS_BAD_COORD 3  // a coordinate or rank outside the counter layout
#define WEFT_SYNC_STATUS_SMEM 4       // launched with less dynamic shared memory (observed) than the kernel needs (expected)
#define WEFT_SYNC_STATUS_BAD_INDEX 5  // a table entry (observed) indexes past its target's count (expected); coord names the entry

// weft_error_slot.primitive: which primitive gave up.
#define WEFT_SYNC_PRIM_WAIT 1           // wait(): poll one rank's counter, .sys scope acquire
#define WEFT_SYNC_PRIM_BARRIER 2        // barrier(): all ranks, .sys scope
#define WEFT_SYNC_PRIM_SIGNAL 3         // signal() / signal_all() (bad coordinates only)
#define WEFT_SYNC_PRIM_WAIT_GPU 4       // wait_gpu(): this rank's counter, .gpu scope acquire
#define WEFT_SYNC_PRIM_BARRIER_GPU 5    // barrier_gpu(): blocks of one GPU
#define WEFT_SYNC_PRIM_MBARRIER_WAIT 6  // mbarrier parity wait inside one SM
#define WEFT_SYNC_PRIM_WAIT_UNORDERED 7 // unordered::wait() (relaxed poll, no acquire)
#define WEFT_SYNC_PRIM_WAVE_GROUP 8     // signal-gemm's wave-group wait kernel (coord.b = group)
#define WEFT_SYNC_PRIM_GEMM_ROW_SLOTS 9 // the GEMM's row-slots table check (coord: 0, 0, tile index, row in tile)
#define WEFT_SYNC_PRIM_GEMM_SPLIT_K 10  // the GEMM's last split waiting for the earlier splits' partials (coord: 0, consumer, tile row, tile column; expected = splits - 1, observed = the tile's flag)

// weft_error_slot.role: the part of a kernel whose wait or check gave up (0 in kernels without
// roles). The GEMM's (kernels/include/weft/gemm/); coordinates (0, stage, tile row, tile column)
// unless the line says otherwise:
#define WEFT_ROLE_NONE 0
#define WEFT_ROLE_GEMM_LOADER 1        // the TMA loader: a stage's empty barrier; the fused AllGather's
                                       // shard chunk flags (coord: 0, 0, tile row, K chunk)
#define WEFT_ROLE_GEMM_CONSUMER 2      // a consumer warpgroup: a stage's full barrier, split-K partials
                                       // (coord: 0, consumer, ...), a post to its signaller (0, slot, consumer, 0)
#define WEFT_ROLE_GEMM_COMMUNICATOR 3  // the test communicator CTAs: a tile's flag (coord: 0, order, ...)
#define WEFT_ROLE_GEMM_SIGNALLER 4     // a consumer's signaller thread: its ring (coord: 0, slot, consumer, 1)
#define WEFT_ROLE_GEMM_ALLREDUCE 5     // the fused AllReduce's communicator CTAs: a rank's tile flag (0, order, ...)
#define WEFT_ROLE_GEMM_ROW_SLOTS 6     // the row-slots table check kernel (coord: 0, 0, tile index, row in tile)
#define WEFT_ROLE_GEMM_PEER_BARRIER 7  // the fused methods' START / END barrier among ranks (coord: peer_bar's)
#define WEFT_ROLE_GEMM_SETUP 8         // the kernel's entry check of its dynamic shared memory

// What the first thread whose wait expired saw. Lives in host-mapped pinned memory so the host can
// read it after the kernel trapped and its context died.
typedef struct weft_error_slot {
  int32_t status;          // WEFT_SYNC_STATUS_*
  int32_t primitive;       // WEFT_SYNC_PRIM_*
  int32_t rank;            // the rank whose thread gave up (as the launch was told it)
  int32_t target_rank;     // the rank whose counter it polled (or signalled, for BAD_COORD)
  weft_tile_coord coord;   // element coordinate (b, d, row, col) in the counter layout
  uint64_t expected;       // the target the counter had to reach (>=)
  uint64_t observed;       // the counter's last value read
  uint64_t elapsed_cycles; // clock64 cycles spent polling
  uint64_t budget_cycles;  // the bound it ran under
  uint64_t elapsed_ns;     // %globaltimer nanoseconds spent polling
  uint32_t block;          // linear block index of the thread
  uint32_t thread;         // linear thread index in its block
  uint32_t smid;
  uint32_t role;           // WEFT_ROLE_*: the part of the kernel the thread belongs to
} weft_error_slot;

// The bound every wait runs under.
typedef struct weft_sync_bound {
  uint64_t error_slot;    // device address of a weft_error_slot (host-mapped pinned memory)
  uint64_t budget_cycles; // SM clock cycles (clock64) one wait may poll before it reports and traps
} weft_sync_bound;

// What kernels receive as `bar`: a PGL of uint64_t counters (elem_bytes 8, same shape on every
// rank) plus the bound of its waits. Counters only ever rise (see crates/sync/README.md, "epochs").
typedef struct weft_sync_counters {
  weft_pgl_view view;
  weft_sync_bound bound;
} weft_sync_counters;

// The value a barrier counter reaches once every rank has arrived `epoch` times (epochs count
// from 1 since the counters were zeroed): each arrival adds 1 on every rank.
WEFT_HD uint64_t weft_barrier_target(int32_t world, uint64_t epoch) { return (uint64_t)world * epoch; }
