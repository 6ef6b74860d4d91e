// Group collectives (crates/grpcoll): the per-rank work lists and launch parameters of the
// GroupCast / GroupReduce kernels (kernels/grpcoll/grpcoll.cu). Plain C (bindgen).
#pragma once
#include <stdint.h>
#include "weft/kernel_barrier.h"
#include "weft/pgl.h"
#include "weft/sync.h"

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

// Counter rows of `bar` (shape (1, 1, 3, blocks)): one column per block for the cross-rank rows.
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
  weft_kernel_barrier_view arrive;  // KernelBarrier the launch arrives on (NULL counter: none)
  uint64_t items;            // device address of nitems weft_grpcoll_item
  uint64_t epoch;            // barrier epoch of this launch (Counters::begin(1) + 1)
  uint32_t nitems;
  uint32_t ntensors;         // 1 to WEFT_GRPCOLL_MAX_TENSORS
  uint32_t lse_per_row;      // op LSE: lse values per row (each covers row_elems / lse_per_row elements)
  int32_t op;                // WEFT_GRPCOLL_OP_*
  uint32_t flags;            // WEFT_GRPCOLL_* flags
  uint32_t reserved;
} weft_grpcoll_params;
