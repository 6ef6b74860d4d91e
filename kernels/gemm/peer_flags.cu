// The copy-engine All-to-All's flag wait (weft_gemm_peer_flags_params in weft/abi/gemm.h): thread i
// (i < world, i != rank) spins (acquire, system scope: the flag and the data before it were
// written by another GPU's stream) until flag i is 1, then rearms it (relaxed store of 0; see the
// header for why no writer can race it). Bounded: past the budget it records the flag's row and
// peer and the value it saw in the error slot, and traps.
#include "weft/abi/gemm.h"
#include "weft/sync/wait.cuh"

extern "C" __global__ void __launch_bounds__(32, 1) weft_gemm_peer_flags_wait(const __grid_constant__ weft_gemm_peer_flags_params p) {
  const uint32_t i = threadIdx.x;
  if (i >= p.world || i == p.rank) return;
  uint64_t* flag = reinterpret_cast<uint64_t*>(p.flags) + i;
  weft::sync::wait_flag<weft::sync::FlagScope::Sys>(
      flag, 1, p.bound,
      weft::sync::WaitSite{static_cast<int32_t>(p.rank), WEFT_SYNC_PRIM_WAIT, static_cast<int32_t>(i), weft_tile_coord{p.row, i, 0, 0}});
  weft::sync::mo::st_relaxed_sys(flag, 0);
}
