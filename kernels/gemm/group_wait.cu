// The wave-group wait kernel (weft_gemm_group_wait_params in weft/abi/gemm.h): one thread, enqueued
// on the communication stream before the collective of one wave group. Its acquire load pairs
// with the storers' release adds, so the collective that follows in stream order reads the
// group's finished tiles. Then it rearms the counter (relaxed store of 0): it is the only reader,
// and the next GEMM launch is ordered after it. Bounded: past the budget it records group,
// target and observed count in the error slot and traps.
#include "weft/abi/gemm.h"
#include "weft/sync/wait.cuh"

extern "C" __global__ void __launch_bounds__(1, 1) weft_gemm_group_wait(const __grid_constant__ weft_gemm_group_wait_params p) {
  uint64_t* counter = reinterpret_cast<uint64_t*>(p.counter);
  const int32_t rank = static_cast<int32_t>(p.rank);
  weft::sync::wait_flag<weft::sync::FlagScope::Gpu>(
      counter, p.target, p.bound, weft::sync::WaitSite{rank, WEFT_SYNC_PRIM_WAVE_GROUP, rank, weft_tile_coord{p.group, 0, 0, 0}});
  weft::sync::mo::st_relaxed_gpu(counter, 0);
}
