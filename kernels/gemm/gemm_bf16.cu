// weft's GEMM for bf16 inputs: every output dtype, both B layouts, 128x256 and 128x128 tiles.
#include "instantiate.cuh"
WEFT_GEMM_KERNELS_FOR_INPUT(bf16, __nv_bfloat16)
