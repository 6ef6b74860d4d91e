// PGL correctness pattern: rank r writes, through the view, batch slice r of every rank's buffer
// (its own included). The buffer's shape is (world, depth, rows, cols), so every element of every
// rank's buffer is written by exactly one rank and checked by its owner against an independent
// host computation. The writes walk tiles with the shared tile-coordinate helpers, so a wrong
// origin, ragged-edge extent or peer base shows up as wrong or unwritten elements.
#include "weft/abi/pgl.h"
#include "weft/pgl/view.cuh"

// Must match pattern_value() in crates/harness/src/suites/pgl.rs.
__device__ __forceinline__ uint32_t pattern_value(uint32_t writer, uint32_t owner, uint64_t offset) {
  uint64_t x = offset * 0x9E3779B97F4A7C15ull + (uint64_t(writer) << 40) + (uint64_t(owner) << 48) + 1;
  x ^= x >> 29;
  return uint32_t(x) | 1u;  // never 0: zero-filled memory never passes for written
}

extern "C" __global__ void weft_pgl_pattern(const __grid_constant__ weft_pgl_view view, uint32_t tile_rows, uint32_t tile_cols) {
  weft_pgl_shape slice = view.shape;  // one batch entry: this rank's slice
  slice.batch = 1;
  const uint64_t tiles = weft_tile_count(slice, tile_rows, tile_cols);
  for (uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    weft_tile_coord c = weft_tile_coord_of(slice, tile_rows, tile_cols, t);
    const uint32_t rows = weft_tile_valid_rows(slice, tile_rows, c);
    const uint32_t cols = weft_tile_valid_cols(slice, tile_cols, c);
    c.b = uint32_t(view.rank);
    const uint64_t origin = weft_tile_origin(view.shape, tile_rows, tile_cols, c);
    for (uint32_t i = threadIdx.x; i < rows * cols; i += blockDim.x) {
      const uint64_t offset = origin + uint64_t(i / cols) * view.shape.cols + (i % cols);
      for (int p = 0; p < view.world; ++p) {
        weft::pgl::on_rank<uint32_t>(view, p)[offset] = pattern_value(uint32_t(view.rank), uint32_t(p), offset);
      }
    }
  }
}
