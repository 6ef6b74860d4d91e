// One extern "C" entry point per (input, output, B layout, tile width, cluster, epilogue, fusions):
// the host picks a kernel by name (GemmPlan::kernel_name in crates/signal-gemm/src/plan.rs spells
// them). Included by the per-input .cu files of this folder, which the build compiles in parallel.
#pragma once
#include "weft/gemm/kernel.cuh"

// Name: weft_gemm_<in>_<out>_<B layout>_<tile width>_c<cluster CTAs>[_w: whole-tile epilogue]
// [_plain: the fusions compiled out (GemmConfig's kFusions, config.cuh); _plain_split: the same
// with split-K, for split launches (clusters of 1 only); _pr, _ag, _ar, _a2a: one fused method's
// fusion alone — the ReduceScatter's PEER_REDUCE, the AllGather's A source, the AllReduce's tile
// flags, the All-to-All's PEER_ROWS (pipelined epilogue only: a whole-tile _pr was slower,
// crates/signal-gemm/README.md)]. The kernel with
// every fusion has the communicator the launch's comm_op picks, _ag and _ar their method's, the
// others none.
#define WEFT_GEMM_KERNEL_NAMED(NAME, IN, OUT, BNK, BN, CM, EPI, FUSIONS, SPLIT, COMM)                       \
  extern "C" __global__ void __launch_bounds__(WEFT_GEMM_THREADS, 1) NAME(const __grid_constant__ weft_gemm_params p) { \
    weft::gemm::gemm_kernel_body<weft::gemm::GemmConfig<IN, OUT, BN, BNK, CM, EPI, weft::gemm::FUSIONS, SPLIT>,    \
                                 weft::gemm::TmaStorer, weft::gemm::COMM>(p);                                      \
  }
// The split variant exists for clusters of 1 (CM pasted: _1 defines it, _2 nothing).
#define WEFT_GEMM_PLAIN_SPLIT_1(NAME, IN, OUT, BNK, BN, EPI) \
  WEFT_GEMM_KERNEL_NAMED(NAME##_plain_split, IN, OUT, BNK, BN, 1, EPI, kFusionsNone, true, NoCommunicator)
#define WEFT_GEMM_PLAIN_SPLIT_2(NAME, IN, OUT, BNK, BN, EPI)
// A kernel's variants: every fusion, plain and (clusters of 1) plain with split-K.
#define WEFT_GEMM_KERNEL_VARIANTS(NAME, IN, OUT, BNK, BN, CM, EPI)                                           \
  WEFT_GEMM_KERNEL_NAMED(NAME, IN, OUT, BNK, BN, CM, EPI, kFusionsAll, true, LaunchCommunicator)       \
  WEFT_GEMM_KERNEL_NAMED(NAME##_plain, IN, OUT, BNK, BN, CM, EPI, kFusionsNone, false, NoCommunicator) \
  WEFT_GEMM_PLAIN_SPLIT_##CM(NAME, IN, OUT, BNK, BN, EPI)
// Pipelined-epilogue kernels (what fused launches plan) also come with each fused method's own.
#define WEFT_GEMM_KERNEL_METHODS(NAME, IN, OUT, BNK, BN, CM)                                                               \
  WEFT_GEMM_KERNEL_NAMED(NAME##_pr, IN, OUT, BNK, BN, CM, WEFT_GEMM_EPI_PIPELINED, kFusionsPeerReduce, false, NoCommunicator) \
  WEFT_GEMM_KERNEL_NAMED(NAME##_ag, IN, OUT, BNK, BN, CM, WEFT_GEMM_EPI_PIPELINED, kFusionsAllGather, false,                 \
                         AllGatherCommunicator)                                                                          \
  WEFT_GEMM_KERNEL_NAMED(NAME##_ar, IN, OUT, BNK, BN, CM, WEFT_GEMM_EPI_PIPELINED, kFusionsAllReduce, false,                 \
                         AllReduceCommunicator)                                                                          \
  WEFT_GEMM_KERNEL_NAMED(NAME##_a2a, IN, OUT, BNK, BN, CM, WEFT_GEMM_EPI_PIPELINED, kFusionsPeerRows, false, NoCommunicator)
#define WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, LAYOUT, BNK, BN, CM)                                                   \
  WEFT_GEMM_KERNEL_VARIANTS(weft_gemm_##IN_NAME##_##OUT_NAME##_##LAYOUT##_##BN##_c##CM, IN, OUT, BNK, BN, CM,               \
                            WEFT_GEMM_EPI_PIPELINED)                                                                     \
  WEFT_GEMM_KERNEL_METHODS(weft_gemm_##IN_NAME##_##OUT_NAME##_##LAYOUT##_##BN##_c##CM, IN, OUT, BNK, BN, CM)
#define WEFT_GEMM_KERNEL_WHOLE(IN_NAME, IN, OUT_NAME, OUT, LAYOUT, BNK, CM) \
  WEFT_GEMM_KERNEL_VARIANTS(weft_gemm_##IN_NAME##_##OUT_NAME##_##LAYOUT##_256_c##CM##_w, IN, OUT, BNK, 256, CM, WEFT_GEMM_EPI_WHOLE_TILE)
#define WEFT_GEMM_WHOLE_FOR_OUT(IN_NAME, IN, OUT_NAME, OUT)    \
  WEFT_GEMM_KERNEL_WHOLE(IN_NAME, IN, OUT_NAME, OUT, nk, true, 1)  \
  WEFT_GEMM_KERNEL_WHOLE(IN_NAME, IN, OUT_NAME, OUT, kn, false, 1) \
  WEFT_GEMM_KERNEL_WHOLE(IN_NAME, IN, OUT_NAME, OUT, nk, true, 2)  \
  WEFT_GEMM_KERNEL_WHOLE(IN_NAME, IN, OUT_NAME, OUT, kn, false, 2)

// 128 x 192 tiles: plain kernels only, clusters of 1 (and their split variant). The width fills
// the SMs where 128 x 256 tiles leave a wave short and 128 x 128 ones reload A too often
// (crates/signal-gemm/README.md, "128 x 192 tiles"); fused launches plan 128 or 256.
#define WEFT_GEMM_KERNEL_PLAIN_192(IN_NAME, IN, OUT_NAME, OUT, LAYOUT, BNK)                                          \
  WEFT_GEMM_KERNEL_NAMED(weft_gemm_##IN_NAME##_##OUT_NAME##_##LAYOUT##_192_c1_plain, IN, OUT, BNK, 192, 1,             \
                         WEFT_GEMM_EPI_PIPELINED, kFusionsNone, false, NoCommunicator)                                \
  WEFT_GEMM_PLAIN_SPLIT_1(weft_gemm_##IN_NAME##_##OUT_NAME##_##LAYOUT##_192_c1, IN, OUT, BNK, 192, WEFT_GEMM_EPI_PIPELINED)
#define WEFT_GEMM_PLAIN_192_FOR_OUT(IN_NAME, IN, OUT_NAME, OUT)       \
  WEFT_GEMM_KERNEL_PLAIN_192(IN_NAME, IN, OUT_NAME, OUT, nk, true) \
  WEFT_GEMM_KERNEL_PLAIN_192(IN_NAME, IN, OUT_NAME, OUT, kn, false)

#define WEFT_GEMM_KERNELS_FOR_OUT(IN_NAME, IN, OUT_NAME, OUT)     \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, nk, true, 256, 1)  \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, nk, true, 128, 1)  \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, kn, false, 256, 1) \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, kn, false, 128, 1) \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, nk, true, 256, 2)  \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, nk, true, 128, 2)  \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, kn, false, 256, 2) \
  WEFT_GEMM_KERNEL(IN_NAME, IN, OUT_NAME, OUT, kn, false, 128, 2)

#define WEFT_GEMM_KERNELS_FOR_INPUT(IN_NAME, IN)              \
  WEFT_GEMM_KERNELS_FOR_OUT(IN_NAME, IN, bf16, __nv_bfloat16) \
  WEFT_GEMM_KERNELS_FOR_OUT(IN_NAME, IN, f16, __half)         \
  WEFT_GEMM_KERNELS_FOR_OUT(IN_NAME, IN, f32, float)          \
  WEFT_GEMM_WHOLE_FOR_OUT(IN_NAME, IN, bf16, __nv_bfloat16)   \
  WEFT_GEMM_WHOLE_FOR_OUT(IN_NAME, IN, f16, __half)           \
  WEFT_GEMM_PLAIN_192_FOR_OUT(IN_NAME, IN, bf16, __nv_bfloat16) \
  WEFT_GEMM_PLAIN_192_FOR_OUT(IN_NAME, IN, f16, __half)         \
  WEFT_GEMM_PLAIN_192_FOR_OUT(IN_NAME, IN, f32, float)
