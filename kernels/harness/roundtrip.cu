// Round trip through an embedded kernel: proves the build, the embedding, the shared ABI header
// and the launch path end to end. Grid-stride, so any grid size covers any n.
#include "weft/abi/roundtrip.h"

extern "C" __global__ void weft_roundtrip(const __grid_constant__ weft_roundtrip_params p) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride) {
    reinterpret_cast<float*>(p.output)[i] = reinterpret_cast<const float*>(p.input)[i] * p.scale + float(p.rank);
  }
}
