// Bitwise comparison of two device buffers, for checks of large outputs without a download: a
// grid-stride pass counting differing 32-bit words (one atomic per differing word — fine for a
// check that expects none) and keeping the smallest differing index.
#include "weft/abi/word_compare.h"

extern "C" __global__ void weft_word_compare(const __grid_constant__ weft_word_compare_params p) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.words; i += stride) {
    if (reinterpret_cast<const uint32_t*>(p.a)[i] != reinterpret_cast<const uint32_t*>(p.b)[i]) {
      unsigned long long* result = reinterpret_cast<unsigned long long*>(p.result);
      atomicAdd(result, 1ull);
      atomicMin(result + 1, static_cast<unsigned long long>(i));
    }
  }
}
