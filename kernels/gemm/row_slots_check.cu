// The row-slots table check (weft_gemm_row_slots_check_params in weft/abi/gemm.h): every entry is
// WEFT_GEMM_NO_SLOT or below D's slot count; the first bad one seen is reported and traps.
#include "weft/abi/gemm.h"
#include "weft/sync/error.cuh"

extern "C" __global__ void __launch_bounds__(256) weft_gemm_row_slots_check(const __grid_constant__ weft_gemm_row_slots_check_params p) {
  const uint32_t* table = reinterpret_cast<const uint32_t*>(p.table);
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < p.entries; i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t slot = table[i];
    if (slot != WEFT_GEMM_NO_SLOT && slot >= p.slots) {
      weft::sync::failure f{};
      f.status = WEFT_SYNC_STATUS_BAD_INDEX;
      f.primitive = WEFT_SYNC_PRIM_GEMM_ROW_SLOTS;
      f.role = WEFT_ROLE_GEMM_ROW_SLOTS;
      f.target_rank = p.rank;
      f.coord = weft_tile_coord{0, 0, uint32_t(i / WEFT_GEMM_TILE_M), uint32_t(i % WEFT_GEMM_TILE_M)};
      f.expected = p.slots;
      f.observed = slot;
      weft::sync::fail(p.bound, p.rank, f);
    }
  }
}
