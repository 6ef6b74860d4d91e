// Parallel global layout (PGL): a buffer of the same (batch, depth, rows, cols) shape on every
// rank. The view is passed to kernels by value; base[r] is rank r's buffer mapped into this
// process (base[rank] is the local one). Tile coordinates address (b, d, tile row, tile col) for a
// tile shape chosen by the kernel; edge tiles are ragged when rows or cols are not multiples.
#pragma once
#include <stdint.h>
#include "weft/abi/hd.h"

// Enough for an 8-GPU NVLink domain and beyond; a view is 16 * 8 + 32 bytes.
#define WEFT_PGL_MAX_RANKS 16

typedef struct weft_pgl_shape {
  uint32_t batch;
  uint32_t depth;
  uint32_t rows;
  uint32_t cols;
} weft_pgl_shape;

typedef struct weft_tile_coord {
  uint32_t b;
  uint32_t d;
  uint32_t r;  // tile row
  uint32_t c;  // tile column
} weft_tile_coord;

typedef struct weft_pgl_view {
  uint64_t base[WEFT_PGL_MAX_RANKS];
  weft_pgl_shape shape;
  int32_t rank;
  int32_t world;
  uint32_t elem_bytes;
  uint32_t reserved;
} weft_pgl_view;

WEFT_HD uint32_t weft_div_up(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

WEFT_HD uint64_t weft_pgl_elems(weft_pgl_shape s) {
  return (uint64_t)s.batch * s.depth * s.rows * s.cols;
}

// Row-major element offset of (b, d, row, col).
WEFT_HD uint64_t weft_elem_offset(weft_pgl_shape s, uint32_t b, uint32_t d, uint32_t row, uint32_t col) {
  return (((uint64_t)b * s.depth + d) * s.rows + row) * s.cols + col;
}

WEFT_HD uint64_t weft_tile_count(weft_pgl_shape s, uint32_t tile_rows, uint32_t tile_cols) {
  return (uint64_t)s.batch * s.depth * weft_div_up(s.rows, tile_rows) * weft_div_up(s.cols, tile_cols);
}

// Tiles in row-major order over (b, d, r, c): linear index -> coordinate.
WEFT_HD weft_tile_coord weft_tile_coord_of(weft_pgl_shape s, uint32_t tile_rows, uint32_t tile_cols, uint64_t linear) {
  const uint32_t tc = weft_div_up(s.cols, tile_cols), tr = weft_div_up(s.rows, tile_rows);
  weft_tile_coord t;
  t.c = (uint32_t)(linear % tc);
  linear /= tc;
  t.r = (uint32_t)(linear % tr);
  linear /= tr;
  t.d = (uint32_t)(linear % s.depth);
  t.b = (uint32_t)(linear / s.depth);
  return t;
}

WEFT_HD uint64_t weft_tile_linear(weft_pgl_shape s, uint32_t tile_rows, uint32_t tile_cols, weft_tile_coord t) {
  const uint32_t tc = weft_div_up(s.cols, tile_cols), tr = weft_div_up(s.rows, tile_rows);
  return (((uint64_t)t.b * s.depth + t.d) * tr + t.r) * tc + t.c;
}

// Element offset of the tile's first element.
WEFT_HD uint64_t weft_tile_origin(weft_pgl_shape s, uint32_t tile_rows, uint32_t tile_cols, weft_tile_coord t) {
  return weft_elem_offset(s, t.b, t.d, t.r * tile_rows, t.c * tile_cols);
}

// Rows and columns of the tile that lie inside the shape (smaller than the tile at ragged edges).
WEFT_HD uint32_t weft_tile_valid_rows(weft_pgl_shape s, uint32_t tile_rows, weft_tile_coord t) {
  const uint32_t left = s.rows - t.r * tile_rows;
  return left < tile_rows ? left : tile_rows;
}

WEFT_HD uint32_t weft_tile_valid_cols(weft_pgl_shape s, uint32_t tile_cols, weft_tile_coord t) {
  const uint32_t left = s.cols - t.c * tile_cols;
  return left < tile_cols ? left : tile_cols;
}
