// Group collectives (crates/grpcoll): the per-rank work lists and launch parameters of the
// GroupCast / GroupReduce kernels (kernels/grpcoll/grpcoll.cu). Plain C (bindgen).
#pragma once
#include <stdint.h>
#include "weft/abi/hd.h"
#include "weft/abi/kernel_barrier.h"
#include "weft/abi/pgl.h"
#include "weft/abi/sync.h"

// At most this many peers per work item (one per rank: a PGL spans at most WEFT_PGL_MAX_RANKS).
#define WEFT_GRPCOLL_MAX_PEERS WEFT_PGL_MAX_RANKS
// Tensors moved by one launch with one set of metadata (packed transfer, e.g. K and V).
#define WEFT_GRPCOLL_MAX_TENSORS 3

// weft_grpcoll_params.op (pull kernels only).
#define WEFT_GRPCOLL_OP_SUM 0
#define WEFT_GRPCOLL_OP_AVG 1
#define WEFT_GRPCOLL_OP_LSE 2
#define WEFT_GRPCOLL_OP_COPY 3  // GroupCast pulled through a communication dtype: one source, converted

// weft_grpcoll_params.flags.
#define WEFT_GRPCOLL_SYNCED 1u      // cross-rank barriers over `bar` (native path); else local only (baseline)
#define WEFT_GRPCOLL_CONVERT 2u     // phase 1: this rank's input rows -> `staging` in the communication dtype
#define WEFT_GRPCOLL_TRANSFER 4u    // phase 2: the work items (push copy or pull reduce)
#define WEFT_GRPCOLL_ACCUMULATE 8u  // reduce into the existing output (and output lse) instead of overwriting

// Counter rows of `bar` (shape (1, 1, 4, blocks)): one column per block for the cross-rank rows.
#define WEFT_GRPCOLL_BAR_BEFORE 0  // every rank's block b has reached the transfer (its sources are ready)
#define WEFT_GRPCOLL_BAR_END 1     // every rank's block b has finished its writes / reads
#define WEFT_GRPCOLL_BAR_GRID 2    // column 0: this rank's blocks, after phase 1 (GPU scope)

// One chunk of rows, precomputed by the plan and kept in device memory.
//  push (cast):  rows [row, row + rows) of input.base[input.rank] are written to rows
//                [peer_row[k], + rows) of output.base[peer[k]] for k < npeers (one read, k writes).
//  pull (reduce, or cast through a comm dtype): rows [row, row + rows) of output.base[output.rank]
//                are the reduction over k < npeers of rows [peer_row[k], + rows) of
//                input.base[peer[k]] (the sources' staging when converted) and their lse.
typedef struct weft_grpcoll_item {
  uint32_t row;
  uint32_t rows;
  uint32_t npeers;
  uint32_t reserved;
  int32_t peer[WEFT_GRPCOLL_MAX_PEERS];
  uint32_t peer_row[WEFT_GRPCOLL_MAX_PEERS];
} weft_grpcoll_item;

// Items of one launch: fewer than this (checked by the plan), so the walk's positions below stay
// within 32 bits. (2^31 items would take 309 GB of item list.)
#define WEFT_GRPCOLL_MAX_ITEMS (1u << 31)

// The native transfer's walk over its n items (kernels/grpcoll/grpcoll.cu): blocks take positions
// blockIdx.x, + gridDim.x, ... below weft_grpcoll_walk_length(n, world), and position j is item
// weft_grpcoll_walk_item(j, ...), or n where the last run is short. The list is cut into `world`
// runs of ceil(n / world) items, taken from run rank + 1 on: interleaved (one item of each run in
// turn: push) or run after run (pull). Item lists follow the split order, which in the usual
// patterns is the peer order: walked in order, every rank's blocks push into (or pull from) the
// same peer at once and one GPU's links carry the job while the others idle. Rotated by rank, no
// two ranks start on the same run; interleaved, each rank's blocks also spread over every peer at
// once. Pulls keep whole runs: interleaving their reads measured 17 % slower on a varlen reduce
// and 6 % on a cast through bf16, 5 % faster on a uniform f32 reduce (crates/grpcoll/README.md).
// Every item is taken once. World 1 (the baseline's local copies) walks in order, and so do the
// 1-element pull kernels (rows that are not whole 16-byte vectors), where the walk's registers
// would spill. n < WEFT_GRPCOLL_MAX_ITEMS, rank < world.
WEFT_HD uint32_t weft_grpcoll_walk_length(uint32_t n, uint32_t world) { return (n + world - 1) / world * world; }
WEFT_HD uint32_t weft_grpcoll_walk_item(uint32_t j, uint32_t n, uint32_t world, uint32_t rank, uint32_t interleave) {
  const uint32_t run = (n + world - 1) / world;
  // Interleaved: run j % world at step j / world; else run after run.
  const uint32_t lane = interleave ? j % world : j / run, step = interleave ? j / world : j % run;
  uint32_t r = lane + rank + 1;
  if (r >= world) r -= world;
  const uint32_t index = r * run + step;  // < world * run <= n + world - 1: no wrap
  return index < n ? index : n;
}

// One tensor of a packed launch. The pull kernels read `input` (data dtype) or, with CONVERT,
// phase 1 writes `staging` (communication dtype, same rows) and phase 2 reads peers' staging.
typedef struct weft_grpcoll_tensor {
  weft_pgl_view input;
  weft_pgl_view output;
  weft_pgl_view staging;
  uint32_t row_elems;       // elements per row
  uint32_t row_bytes;       // bytes per row of input / output (push kernels copy bytes)
  uint32_t convert_rows;    // phase 1: rows of this rank's input to convert (from row 0)
  uint32_t reserved;
} weft_grpcoll_tensor;

typedef struct weft_grpcoll_params {
  weft_grpcoll_tensor tensor[WEFT_GRPCOLL_MAX_TENSORS];
  weft_pgl_view input_lse;   // op LSE (one tensor): f32, lse_per_row per row
  weft_pgl_view output_lse;
  weft_sync_counters bar;    // (1, 1, 3, blocks), rows WEFT_GRPCOLL_BAR_*
  weft_kernel_barrier_view arrive;  // KernelBarrier the launch arrives on (counter 0: none)
  uint64_t items;            // device address of nitems weft_grpcoll_item
  uint64_t nitems_at;        // nonzero: device address of a u32 that holds nitems (device metadata)
  uint64_t epoch;            // barrier epoch of this launch (Counters::begin(1) + 1)
  uint32_t nitems;
  uint32_t ntensors;         // 1 to WEFT_GRPCOLL_MAX_TENSORS
  uint32_t lse_per_row;      // op LSE: lse values per row (each covers row_elems / lse_per_row elements)
  int32_t op;                // WEFT_GRPCOLL_OP_*
  uint32_t flags;            // WEFT_GRPCOLL_* flags
  // Native pull kernels (vN, one tensor, not LSE): nonzero = bytes of each of the shared-memory
  // buffers (a ring of bulk_stages) the sources' rows are bulk-loaded into — a
  // multiple of 128 below 2^20 (the host passes whole KiB below 1024: buffer offsets stay 128-byte
  // aligned and a buffer's transaction count fits an mbarrier phase) (weft_grpcoll_pull_smem_bytes of dynamic shared
  // memory); 0 = the sources are read straight from peer memory.
  uint32_t bulk_buffer_bytes;
  uint32_t bulk_stages;      // buffers in the ring with bulk_buffer_bytes: 2 to WEFT_GRPCOLL_BULK_MAX_STAGES
                             // (set only from crates/grpcoll's BulkRing, which checks it)
} weft_grpcoll_params;

// Dynamic shared memory of a pull launch with a ring of `stages` bulk buffers of `buffer_bytes`:
// the buffers, then their FULL and EMPTY mbarriers and unit descriptions (kernels/grpcoll/grpcoll.cu,
// BulkShared, sized for WEFT_GRPCOLL_BULK_MAX_STAGES), padded.
#define WEFT_GRPCOLL_BULK_MAX_STAGES 4u
// Threads of a pull block (whole warps; with bulk buffers the last warp is the producer).
#define WEFT_GRPCOLL_PULL_THREADS 512u
#define WEFT_GRPCOLL_BULK_SHARED_BYTES 2048u
WEFT_HD uint32_t weft_grpcoll_pull_smem_bytes(uint32_t buffer_bytes, uint32_t stages) {
  return buffer_bytes == 0 ? 0u : stages * buffer_bytes + WEFT_GRPCOLL_BULK_SHARED_BYTES;
}

// ---- device-resident metadata (kernels/grpcoll/layout.cu) ----
//
// A plan built for device metadata owns a PGL of u32 words per rank that the caller fills before
// each run (from a kernel or a stream-ordered copy): word 0 the number of input splits, word 1
// of output splits, then four arrays of `cap` words: input split rows, input peer masks (bit r:
// rank r), output split rows, output peer masks. Cast: input masks the destinations, output masks
// one source bit; reduce: input masks one destination bit, output masks the sources.
WEFT_HD uint32_t weft_grpcoll_meta_words(uint32_t cap) { return 2u + 4u * cap; }
// Scratch words of the layout kernel: every rank's metadata, every rank's input and output
// offsets, per (source, destination) pair the matched split lists and their counts, and this
// rank's peer rows per (split, peer).
WEFT_HD uint64_t weft_grpcoll_layout_scratch_words(uint32_t cap, uint32_t world) {
  return (uint64_t)world * weft_grpcoll_meta_words(cap) + 2ull * world * (cap + 1u) +
         (uint64_t)world * world * (2ull * cap + 2u) + (uint64_t)cap * world;
}
#define WEFT_GRPCOLL_BAR_LAYOUT 3  // counter row of the layout kernel's barrier (column 0)

// weft_grpcoll_layout_report.code: what the layout kernel rejected (no rows move then).
#define WEFT_GRPCOLL_BAD_SPLIT_COUNT 1  // rank a, side: a_split = count, expected = cap
#define WEFT_GRPCOLL_BAD_ROWS 2         // rank a, side: observed = rows, expected = capacity rows
#define WEFT_GRPCOLL_BAD_MASK 3         // rank a, side, split a_split: observed = mask (a rank outside the world)
#define WEFT_GRPCOLL_BAD_PEER_COUNT 4   // rank a, side, split a_split: observed = peers (one required, or none for a reduce output)
#define WEFT_GRPCOLL_BAD_PAIR_COUNT 5   // a sends expected splits to b, b expects observed from a
#define WEFT_GRPCOLL_BAD_PAIR_ROWS 6    // a's input split a_split (expected rows) is b's output split b_split (observed rows)

// What the layout kernel found wrong, in device memory (the first report wins); zero: nothing.
typedef struct weft_grpcoll_layout_report {
  uint32_t code;
  uint32_t side;      // 0 input, 1 output
  int32_t a, b;       // ranks
  uint32_t a_split, b_split;
  uint32_t expected, observed;
} weft_grpcoll_layout_report;

typedef struct weft_grpcoll_layout_params {
  weft_pgl_view meta;        // u32, weft_grpcoll_meta_words(cap) per rank
  weft_sync_counters bar;    // the plan's counters: row WEFT_GRPCOLL_BAR_LAYOUT, column 0
  uint64_t scratch;          // weft_grpcoll_layout_scratch_words(cap, world) u32
  uint64_t items;            // max_items weft_grpcoll_item, written here
  uint64_t nitems;           // one u32: the items written (0 when rejected)
  uint64_t report;           // a weft_grpcoll_layout_report
  uint64_t epoch;
  uint32_t cap;              // splits per side
  uint32_t max_items;
  uint32_t max_input_rows;
  uint32_t max_output_rows;
  uint32_t chunk;            // rows per item
  uint32_t pull;             // 1: pull items (per output split, sources); 0: push items (per input split, destinations)
  uint32_t reduce;           // 1: reduce metadata (one destination per input split); 0: cast (one source per output split)
  uint32_t reserved;
} weft_grpcoll_layout_params;
