// DistFuse's method: the fused AllReduce's worker as a kernel of its own, launched on a second
// stream next to the GEMM (which leaves it SMs through sm_margin and raises system-scope tile
// flags). One CTA per worker; see weft/gemm/tile_allreduce.cuh.
#include "weft/gemm/tile_allreduce.cuh"

extern "C" __global__ void __launch_bounds__(512, 1) weft_gemm_tile_allreduce(const __grid_constant__ weft_tile_allreduce_params p) {
  weft::gemm::run_tile_allreduce_per_world(p, blockIdx.x);
}
