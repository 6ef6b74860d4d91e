// Tolerance checks of large bf16 results on their GPU (no download): a grid-stride pass counting
// the elements outside their bound (one atomic per bad element — fine for a check that expects
// none) and keeping the smallest bad index; and |x| of a bf16 buffer as f32 (the bound's base).
#include <cuda_bf16.h>
#include "weft/abi/bound_compare.h"

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

extern "C" __global__ void weft_bound_compare(const __grid_constant__ weft_bound_compare_params p) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += stride) {
    const float got = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p.got)[i]);
    const float want = bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p.want)[i]);
    float bound = p.rel * fabsf(want) + p.abs;
    if (p.bound != 0) bound += reinterpret_cast<const float*>(p.bound)[i] * p.bound_scale;
    // Written so that a NaN on either side fails.
    if (!(fabsf(got - want) <= bound)) {
      unsigned long long* result = reinterpret_cast<unsigned long long*>(p.result);
      atomicAdd(result, 1ull);
      atomicMin(result + 1, static_cast<unsigned long long>(i));
    }
  }
}

extern "C" __global__ void weft_abs_to_f32(const __grid_constant__ weft_abs_to_f32_params p) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += stride) {
    reinterpret_cast<float*>(p.dst)[i] = fabsf(bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p.src)[i]));
  }
}
