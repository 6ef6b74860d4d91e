// Group collectives (crates/grpcoll): the per-rank work lists and launch parameters of the
// GroupCast push and GroupReduce pull kernels (kernels/grpcoll/grpcoll.cu). Plain C (bindgen).
#pragma once
#include <stdint.h>
#include "weft/pgl.h"
#include "weft/sync.h"

// At most this many peers per work item (one per rank: a PGL spans at most WEFT_PGL_MAX_RANKS).
#define WEFT_GRPCOLL_MAX_PEERS WEFT_PGL_MAX_RANKS

// weft_grpcoll_params.op (reduce kernels only).
#define WEFT_GRPCOLL_OP_SUM 0
#define WEFT_GRPCOLL_OP_AVG 1
#define WEFT_GRPCOLL_OP_LSE 2

// One chunk of rows, precomputed by the plan and kept in device memory.
//  cast (push):  rows [row, row + rows) of input.base[input.rank] are written to rows
//                [peer_row[k], + rows) of output.base[peer[k]] for k < npeers (one read, k writes).
//  reduce (pull): rows [row, row + rows) of output.base[output.rank] are the reduction over k <
//                npeers of rows [peer_row[k], + rows) of input.base[peer[k]] (and their lse).
typedef struct weft_grpcoll_item {
  uint32_t row;
  uint32_t rows;
  uint32_t npeers;
  uint32_t reserved;
  int32_t peer[WEFT_GRPCOLL_MAX_PEERS];
  uint32_t peer_row[WEFT_GRPCOLL_MAX_PEERS];
} weft_grpcoll_item;

typedef struct weft_grpcoll_params {
  weft_pgl_view input;       // data rows, row_bytes each (cast) / row_elems elements (reduce)
  weft_pgl_view output;
  weft_pgl_view input_lse;   // reduce with op LSE: f32, lse_per_row per row
  weft_pgl_view output_lse;
  weft_sync_counters bar;    // (1, 1, 2, blocks): row 0 start barrier, row 1 end barrier, one column per block
  uint64_t items;            // device address of nitems weft_grpcoll_item
  uint64_t epoch;            // barrier epoch of this launch (Counters::begin(1) + 1)
  uint32_t nitems;
  uint32_t row_bytes;        // cast: bytes per row
  uint32_t row_elems;        // reduce: elements per row
  uint32_t lse_per_row;      // reduce with LSE: lse values per row (each covers row_elems / lse_per_row elements)
  int32_t op;                // WEFT_GRPCOLL_OP_*
  uint32_t synced;           // 1: start and end barriers over `bar` (native); 0: local only (baseline gather/scatter)
} weft_grpcoll_params;
