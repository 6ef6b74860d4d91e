// Counter addressing: a weft_sync_counters is a PGL of uint64_t counters; a coordinate is an
// element coordinate (b, d, row, col) in its shape, and `rank` picks whose buffer. Every primitive
// checks the coordinate and rank against the layout; a bad one is reported (BAD_COORD) and traps
// instead of writing into someone else's memory.
#pragma once
#include <stdint.h>
#include "weft/abi/pgl.h"
#include "weft/abi/sync.h"
#include "weft/pgl/view.cuh"
#include "weft/sync/error.cuh"

namespace weft::sync {

// The counter at `coord` in `rank`'s buffer, or nullptr when outside the layout.
__device__ __forceinline__ uint64_t* counter_ptr(const weft_pgl_view& v, weft_tile_coord coord, int32_t rank) {
  const bool inside = rank >= 0 && rank < v.world && rank < WEFT_PGL_MAX_RANKS && v.elem_bytes == sizeof(uint64_t) && coord.b < v.shape.batch &&
                      coord.d < v.shape.depth && coord.r < v.shape.rows && coord.c < v.shape.cols &&
                      v.base[rank] != 0;
  if (!inside) return nullptr;
  return weft::pgl::element<uint64_t>(v, rank, coord.b, coord.d, coord.r, coord.c);
}

// As counter_ptr, but a bad coordinate or rank is reported for `primitive` and traps.
__device__ __forceinline__ uint64_t* counter_or_trap(const weft_sync_counters& bar, weft_tile_coord coord, int32_t rank,
                                                     int32_t primitive) {
  uint64_t* p = counter_ptr(bar.view, coord, rank);
  if (p == nullptr) {
    failure f{};
    f.status = WEFT_SYNC_STATUS_BAD_COORD;
    f.primitive = primitive;
    f.target_rank = rank;
    f.coord = coord;
    fail(bar.bound, bar.view.rank, f);
  }
  return p;
}

__device__ __forceinline__ weft_tile_coord coord4(uint32_t b, uint32_t d, uint32_t r, uint32_t c) {
  weft_tile_coord t;
  t.b = b;
  t.d = d;
  t.r = r;
  t.c = c;
  return t;
}

}  // namespace weft::sync
