// The communicator role: CTAs launched after the compute CTAs (on SMs the plan reserved, see
// sm_margin) that consume finished tiles while the GEMM runs. A communicator is a struct with
// `run(params, shared tiles)`, executed by every thread of a communicator CTA; it may use the
// CTA's shared memory freely (the compute roles do not run in that CTA).
//
// TileCopyCommunicator proves the role: it walks the schedule in order (communicator CTA i takes
// orders i, i + comm_ctas, ...), waits for each tile's flag (acquire, GPU scope, bounded) to reach
// the launch's target, and copies the tile from D to copy_dst with 16-byte loads and stores. The
// result is checked against D by the harness: a missing or early signal shows as a wrong copy.
#pragma once
#include "weft/abi/gemm.h"
#include "weft/gemm/ag_copy.cuh"
#include "weft/gemm/loader.cuh"
#include "weft/gemm/tile_allreduce.cuh"
#include "weft/sync/wait.cuh"

namespace weft::gemm {

struct NoCommunicator {
  template <class Cfg>
  __device__ __forceinline__ static void run(const weft_gemm_params&, const SharedTiles<Cfg>&) {}
};

struct TileCopyCommunicator {
  template <class Cfg>
  __device__ __forceinline__ static void run(const weft_gemm_params& p, const SharedTiles<Cfg>&) {
    if (p.tile_flags == 0 || p.copy_dst == 0) return;
    const weft_gemm_schedule& s = p.sched;
    const uint32_t orders = weft_gemm_order_count(s);
    const uint32_t row_bytes = s.n * sizeof(typename Cfg::Out);
    const uint32_t tile_row_bytes = Cfg::kBN * sizeof(typename Cfg::Out);
    const int32_t rank = p.rank;
    for (uint32_t order = blockIdx.x - s.ctas; order < orders; order += p.comm_ctas) {
      const weft_gemm_tile t = weft_gemm_tile_at(s, order);
      if (!t.valid) continue;
      if (threadIdx.x == 0) {
        const uint64_t* flag = reinterpret_cast<const uint64_t*>(p.tile_flags) + weft_gemm_tile_index(s, t);
        weft::sync::wait_flag<weft::sync::FlagScope::Gpu>(
            flag, p.flag_target, p.bound,
            weft::sync::WaitSite{rank, WEFT_SYNC_PRIM_WAIT_GPU, rank, weft_tile_coord{0, order, t.tm, t.tn},
                                 WEFT_ROLE_GEMM_COMMUNICATOR});
      }
      __syncthreads();  // extends thread 0's acquire to the block
      const uint32_t rows = min(s.m - t.tm * Cfg::kBM, uint32_t(Cfg::kBM));
      const uint32_t bytes = min(row_bytes - t.tn * tile_row_bytes, tile_row_bytes);  // multiple of 16
      const uint64_t origin = uint64_t(t.tm) * Cfg::kBM * row_bytes + uint64_t(t.tn) * tile_row_bytes;
      const uint32_t vec_per_row = bytes / 16;
      for (uint32_t i = threadIdx.x; i < rows * vec_per_row; i += blockDim.x) {
        const uint64_t off = origin + uint64_t(i / vec_per_row) * row_bytes + (i % vec_per_row) * 16;
        const int4 v = *reinterpret_cast<const int4*>(p.d_ptr + off);
        *reinterpret_cast<int4*>(p.copy_dst + off) = v;
      }
      __syncthreads();  // thread 0 polls the next flag only after this tile's reads were issued
    }
  }
};

// The fused AllGather's own kernel (config.cuh, kFusionsAllGather): the inter-SM copy, if asked.
struct AllGatherCommunicator {
  template <class Cfg>
  __device__ __forceinline__ static void run(const weft_gemm_params& p, const SharedTiles<Cfg>&) {
    if (p.comm_op == WEFT_GEMM_COMM_ALLGATHER) run_ag_copy<Cfg>(p);
  }
};

// The fused AllReduce's own kernel (kFusionsAllReduce): the inter-SM reduction, if asked.
struct AllReduceCommunicator {
  template <class Cfg>
  __device__ __forceinline__ static void run(const weft_gemm_params& p, const SharedTiles<Cfg>&) {
    if (p.comm_op == WEFT_GEMM_COMM_ALLREDUCE) run_tile_allreduce_any_world(p.allreduce, blockIdx.x - p.sched.ctas);
  }
};

// The communicator the kernel with every fusion is built with: the launch's comm_op picks the role.
struct LaunchCommunicator {
  template <class Cfg>
  __device__ __forceinline__ static void run(const weft_gemm_params& p, const SharedTiles<Cfg>& sm) {
    if (p.comm_op == WEFT_GEMM_COMM_ALLREDUCE) {
      run_tile_allreduce_any_world(p.allreduce, blockIdx.x - p.sched.ctas);
    } else if (p.comm_op == WEFT_GEMM_COMM_ALLGATHER) {
      run_ag_copy<Cfg>(p);
    } else {
      TileCopyCommunicator::run<Cfg>(p, sm);
    }
  }
};

}  // namespace weft::gemm
