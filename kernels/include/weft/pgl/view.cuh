// Typed access to one rank's memory of a PGL view (weft_pgl_view, weft/abi/pgl.h). The C ABI keeps
// every rank's base as a uint64_t address; these helpers are where device code turns one into a
// pointer. They check nothing: callers stay inside the view's shape, which the host validated
// (a counter's coordinate is checked by weft/sync/counter.cuh, which uses them).
#pragma once
#include <stdint.h>
#include "weft/abi/pgl.h"

namespace weft::pgl {

// Rank `rank`'s buffer as a device address, for byte arithmetic before a cast. The collectives use
// it: through at_bytes ptxas scheduled their slot arithmetic differently and the calls ran up to
// 1 % slower under graph replay (results/collectives/pgl-accessor-ab-*/README.md).
__device__ __forceinline__ uint64_t address(const weft_pgl_view& v, int32_t rank) { return v.base[rank]; }

// Rank `rank`'s buffer (this GPU's own, or a peer's as mapped here) as T*; T may be const.
template <typename T>
__device__ __forceinline__ T* on_rank(const weft_pgl_view& v, int32_t rank) {
  return reinterpret_cast<T*>(v.base[rank]);
}

// `bytes` into rank `rank`'s buffer, as T*: for layouts addressed in bytes (staging slots, chunks).
template <typename T>
__device__ __forceinline__ T* at_bytes(const weft_pgl_view& v, int32_t rank, uint64_t bytes) {
  return reinterpret_cast<T*>(v.base[rank] + bytes);
}

// Element (b, d, row, col) of rank `rank`'s buffer, row-major in the view's shape.
template <typename T>
__device__ __forceinline__ T* element(const weft_pgl_view& v, int32_t rank, uint32_t b, uint32_t d, uint32_t row,
                                      uint32_t col) {
  return on_rank<T>(v, rank) + weft_elem_offset(v.shape, b, d, row, col);
}

}  // namespace weft::pgl
