// weft's GEMM for fp16 inputs: every output dtype, both B layouts, 128x256 and 128x128 tiles.
#include "instantiate.cuh"
WEFT_GEMM_KERNELS_FOR_INPUT(f16, __half)
