// GroupCast (push) and GroupReduce (pull) over pgl peer buffers (crates/grpcoll).
//
// One block per SM of the configured count; blocks take the plan's work items (chunks of rows,
// weft/abi/grpcoll.h) round-robin — natively in a rank-rotated order spread over the peers
// (weft_grpcoll_walk_item) — and each item moves every tensor of a packed launch. Every launch
// first arrives on its KernelBarrier (if any).
//
// Ordering with WEFT_GRPCOLL_SYNCED (the native path): before the transfer every block meets the
// same block of every rank (row BEFORE of the counters, column = block): after it, every rank's
// stream has reached this launch, so its inputs are written and nobody still uses its output
// from before. After its items, the block meets them again (row END): when the launch completes,
// every block of every rank has finished its writes (push) or reads (pull), and the writes into
// this rank are visible here (release by the writer's arrival, acquire by the pass). The barriers
// are weft::sync's (bounded waits, error slot); epochs come from the host.
//
// With WEFT_GRPCOLL_CONVERT (a communication dtype narrower than the data), phase 1 converts this
// rank's input rows into its staging PGL, then all of this rank's blocks meet (row GRID, GPU
// scope) before block b's cross-rank BEFORE barrier, so once block b of rank d passes it, every
// block of every rank has finished phase 1 (the chain grid release -> acquire -> system release
// is cumulative). Phase 2 pulls the staging rows, converting them back.
//
//   weft_grpcoll_cast_v{16,8,4,2,1}: push: rows copied as bytes in vectors of that many bytes:
//     each vector is read once from this rank's input and written to every destination.
//   weft_grpcoll_reduce_{in}_{out}_v{N,1}: pull: output rows (type out) = sum / avg / lse / copy
//     of the sources' rows (type in: the data, or the staging in the communication dtype),
//     accumulated in fp32 (fp64 when out is f64); N elements per 16-byte load of `in`, or 1.
// Without SYNCED (the AlltoAll-v baseline), the same kernels are its convert, range-gather,
// range-scatter and scatter-reduce over hand-built views of local staging buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "weft/abi/grpcoll.h"
#include "weft/pgl/view.cuh"
#include "weft/barrier/kernel_barrier.cuh"
#include "weft/sync.cuh"
#include "weft/sync/mbarrier_wait.cuh"
#include "weft/tma/bulk_copy.cuh"

using namespace weft::sync;

namespace {

constexpr int kPushUnroll = 4;
constexpr int kPullBatch = 4;
constexpr int kConvertUnroll = 4;  // sources loaded together at fan-in 3 and more

__device__ __forceinline__ bool has(const weft_grpcoll_params& p, uint32_t flag) { return (p.flags & flag) != 0; }

// Block-wide: thread 0 meets the other ranks (after the block's earlier writes), optionally after
// all of this rank's blocks met at GPU scope; every thread continues after the pass.
__device__ __forceinline__ void cross_barrier(const weft_grpcoll_params& p, int32_t row, bool grid_first) {
  __syncthreads();
  if (threadIdx.x < 32) {
    uint32_t passed = 0;
    if (threadIdx.x == 0) {
      if (grid_first) barrier_gpu(p.bar, coord4(0, 0, WEFT_GRPCOLL_BAR_GRID, 0), gridDim.x, p.epoch);
      barrier(p.bar, coord4(0, 0, row, blockIdx.x), p.epoch);
      passed = 1;
    }
    // Reconverge warp 0 before the CTA barrier (the shuffle waits for every lane): with a
    // lane-0-only wait right before __syncthreads, nvcc 13.0 / sm_90a let lanes 1-31 pass early
    // in a similar kernel (kernels/barrier/persistent_compute.cu) — here they would touch peers'
    // buffers before the cross-rank barrier.
    if (__shfl_sync(0xffffffffu, passed, 0) == 0) __trap();
  }
  __syncthreads();
}

// Items of this launch: from the plan, or (device metadata) as the layout kernel counted them
// just before on this stream.
__device__ __forceinline__ uint32_t item_count(const weft_grpcoll_params& p) {
  return p.nitems_at != 0 ? *reinterpret_cast<const uint32_t*>(p.nitems_at) : p.nitems;
}

// The walk over the launch's n items (weft_grpcoll_walk_item, abi/grpcoll.h): spread over the peers
// natively (pushes interleaved, pulls by whole runs); in order (world 1) without SYNCED, the
// baseline's local copies.
__device__ __forceinline__ uint32_t walk_world(const weft_grpcoll_params& p) {
  return has(p, WEFT_GRPCOLL_SYNCED) ? uint32_t(p.bar.view.world) : 1u;
}
__device__ __forceinline__ uint32_t walk_item(const weft_grpcoll_params& p, uint32_t j, uint32_t n, bool interleave) {
  const uint32_t rank = has(p, WEFT_GRPCOLL_SYNCED) ? uint32_t(p.bar.view.rank) : 0u;
  return weft_grpcoll_walk_item(j, n, walk_world(p), rank, interleave ? 1u : 0u);
}

// Every thread reads the (read-only, L1-cached) item from global memory: no lane-0-only copy into
// shared memory followed by a barrier inside the item loop (see cross_barrier).
__device__ __forceinline__ const weft_grpcoll_item& item(const weft_grpcoll_params& p, uint32_t it) {
  return reinterpret_cast<const weft_grpcoll_item*>(p.items)[it];
}

// ---- push (GroupCast, comm dtype = data dtype) ----

template <int BYTES> struct Raw;
template <> struct Raw<16> { using T = uint4; };
template <> struct Raw<8> { using T = uint2; };
template <> struct Raw<4> { using T = uint32_t; };
template <> struct Raw<2> { using T = uint16_t; };
template <> struct Raw<1> { using T = uint8_t; };

template <int BYTES>
__device__ __forceinline__ void push_rows(const weft_grpcoll_tensor& t, const weft_grpcoll_item& s) {
  using V = typename Raw<BYTES>::T;
  const uint64_t vpr = t.row_bytes / BYTES;
  const V* src = reinterpret_cast<const V*>(weft::pgl::on_rank<const char>(t.input, t.input.rank) + uint64_t(s.row) * t.row_bytes);
  const uint64_t n = uint64_t(s.rows) * vpr;
  const uint32_t npeers = s.npeers;
  for (uint64_t i0 = threadIdx.x; i0 < n; i0 += uint64_t(blockDim.x) * kPushUnroll) {
    V v[kPushUnroll];
#pragma unroll
    for (int u = 0; u < kPushUnroll; ++u) {
      const uint64_t i = i0 + uint64_t(u) * blockDim.x;
      if (i < n) v[u] = src[i];
    }
    for (uint32_t k = 0; k < npeers; ++k) {
      V* dst = reinterpret_cast<V*>(weft::pgl::on_rank<char>(t.output, s.peer[k]) + uint64_t(s.peer_row[k]) * t.row_bytes);
#pragma unroll
      for (int u = 0; u < kPushUnroll; ++u) {
        const uint64_t i = i0 + uint64_t(u) * blockDim.x;
        if (i < n) dst[i] = v[u];
      }
    }
  }
}

template <int BYTES>
__device__ __forceinline__ void push(const weft_grpcoll_params& p) {
  weft::kernel_barrier_arrive(p.arrive);
  const bool synced = has(p, WEFT_GRPCOLL_SYNCED);
  if (synced) cross_barrier(p, WEFT_GRPCOLL_BAR_BEFORE, false);
  const uint32_t n = item_count(p);
  for (uint32_t j = blockIdx.x; j < weft_grpcoll_walk_length(n, walk_world(p)); j += gridDim.x) {
    const uint32_t it = walk_item(p, j, n, true);
    if (it >= n) continue;
    const weft_grpcoll_item& s = item(p, it);
    for (uint32_t t = 0; t < p.ntensors; ++t) push_rows<BYTES>(p.tensor[t], s);
  }
  if (synced) {
    __syncthreads();
    if (threadIdx.x == 0) barrier(p.bar, coord4(0, 0, WEFT_GRPCOLL_BAR_END, blockIdx.x), p.epoch);
  }
}

// ---- element types and conversions ----

using bf16 = __nv_bfloat16;
using f16 = __half;

// Accumulation type: fp64 for fp64 outputs, fp32 otherwise.
template <typename Out> struct AccOf { using T = float; };
template <> struct AccOf<double> { using T = double; };

// Exact widening of any element type to the accumulator.
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float widen(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(f16 x) { return __half2float(x); }
__device__ __forceinline__ double widen(double x) { return x; }

// Round-to-nearest-even narrowing (NaN stays NaN), from fp32 or fp64 in one rounding.
template <typename To> __device__ __forceinline__ To narrow(float x);
template <> __device__ __forceinline__ float narrow<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 narrow<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f16 narrow<f16>(float x) { return __float2half_rn(x); }
template <typename To> __device__ __forceinline__ To narrow(double x);
template <> __device__ __forceinline__ double narrow<double>(double x) { return x; }
template <> __device__ __forceinline__ float narrow<float>(double x) { return __double2float_rn(x); }
template <> __device__ __forceinline__ bf16 narrow<bf16>(double x) { return __double2bfloat16(x); }
template <> __device__ __forceinline__ f16 narrow<f16>(double x) { return __double2half(x); }

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }
__device__ __forceinline__ float acc_log(float x) { return logf(x); }
__device__ __forceinline__ double acc_log(double x) { return log(x); }

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// ---- pull (GroupReduce; GroupCast through a communication dtype) ----

// Phase 1: this rank's input rows (Out) -> its staging (In), every tensor, grid-strided.
template <typename In, typename Out, int VEC>
__device__ __forceinline__ void convert_inputs(const weft_grpcoll_params& p) {
  for (uint32_t t = 0; t < p.ntensors; ++t) {
    const weft_grpcoll_tensor& tt = p.tensor[t];
    const auto* src = weft::pgl::on_rank<const Pack<Out, VEC>>(tt.input, tt.input.rank);
    auto* dst = weft::pgl::on_rank<Pack<In, VEC>>(tt.staging, tt.staging.rank);
    const uint64_t n = uint64_t(tt.convert_rows) * (tt.row_elems / VEC);
    const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
    // kConvertUnroll loads in flight per thread: the few SMs of the launch stream local memory.
    for (uint64_t i0 = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i0 < n; i0 += stride * kConvertUnroll) {
      Pack<Out, VEC> x[kConvertUnroll];
#pragma unroll
      for (int u = 0; u < kConvertUnroll; ++u) {
        if (i0 + u * stride < n) x[u] = src[i0 + u * stride];
      }
#pragma unroll
      for (int u = 0; u < kConvertUnroll; ++u) {
        if (i0 + u * stride >= n) continue;
        Pack<In, VEC> y;
#pragma unroll
        for (int e = 0; e < VEC; ++e) y.v[e] = narrow<In>(widen(x[u].v[e]));
        dst[i0 + u * stride] = y;
      }
    }
  }
}

// The running lse combination of one element group: m = max of the lse seen, sum = Σ exp(l - m);
// data accumulate Σ exp(l - m) · x (rescaled when m grows). -inf contributes nothing.
template <typename Acc>
struct LseRun {
  Acc m, sum;
  __device__ __forceinline__ LseRun() : m(-INFINITY), sum(0) {}
  // Adds a source of lse l; returns (scale for what was accumulated, weight of the new term).
  __device__ __forceinline__ void add(Acc l, Acc& scale, Acc& w) {
    if (l == Acc(-INFINITY)) {
      scale = 1;
      w = 0;
    } else if (l > m) {
      scale = acc_exp(m - l);  // 0 while m is -inf
      sum = sum * scale + Acc(1);
      w = 1;
      m = l;
    } else {
      scale = 1;
      w = acc_exp(l - m);
      sum += w;
    }
  }
  __device__ __forceinline__ Acc lse() const { return sum > Acc(0) ? m + acc_log(sum) : Acc(-INFINITY); }
  __device__ __forceinline__ Acc inv() const { return sum > Acc(0) ? Acc(1) / sum : Acc(0); }
};

// The threads that share an item's rows: thread `tid` of `n` (the whole block, or the bulk
// pull's consumer warps).
struct Workers {
  uint32_t tid, n;
};

// Stores one output vector: v narrowed, or (accumulate) the existing output plus v, in one rounding.
template <typename Out, typename Acc, int VEC>
__device__ __forceinline__ void store_out(Pack<Out, VEC>* dst, const Acc (&v)[VEC], bool accumulate) {
  Pack<Out, VEC> y;
  if (accumulate) {
    const Pack<Out, VEC> o = *dst;
#pragma unroll
    for (int e = 0; e < VEC; ++e) y.v[e] = narrow<Out>(Acc(widen(o.v[e])) + v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) y.v[e] = narrow<Out>(v[e]);
  }
  *dst = y;
}

// The data of one item for one tensor: U vectors per thread per step, its sources loaded KB at a
// time (U x KB loads in flight per thread).
template <typename In, typename Out, int VEC, int U, int KB>
__device__ __forceinline__ void pull_rows(const weft_grpcoll_params& p, const weft_grpcoll_tensor& t,
                                          const weft_grpcoll_item& s, const weft_pgl_view& src_view,
                                          const weft_pgl_view& lse_view, Workers w) {
  using Acc = typename AccOf<Out>::T;
  using PI = Pack<In, VEC>;
  using PO = Pack<Out, VEC>;
  const bool accumulate = has(p, WEFT_GRPCOLL_ACCUMULATE);
  const bool lse = p.op == WEFT_GRPCOLL_OP_LSE;
  const uint32_t vpr = t.row_elems / VEC;
  const uint32_t group = lse ? t.row_elems / p.lse_per_row : t.row_elems;
  Out* out = weft::pgl::on_rank<Out>(t.output, t.output.rank);
  const float* out_lse = lse ? weft::pgl::on_rank<const float>(p.output_lse, p.output_lse.rank) : nullptr;
  // An item is one chunk (about 64 KiB, or one row): its vector count fits 32 bits.
  const uint32_t n = s.rows * vpr;
  const uint32_t npeers = s.npeers;
  for (uint32_t i0 = w.tid; i0 < n; i0 += w.n * U) {
    uint32_t r[U];
    uint32_t col[U];
    bool live[U];
    Acc acc[U][VEC];
    LseRun<Acc> run[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = i0 + u * w.n;
      live[u] = i < n;
      r[u] = live[u] ? i / vpr : 0;
      col[u] = live[u] ? (i - r[u] * vpr) * VEC : 0;
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[u][e] = 0;
      if (lse && accumulate && live[u]) {
        // The existing (output, lse) is one more source of the combination.
        const Acc l = out_lse[uint64_t(s.row + r[u]) * p.lse_per_row + col[u] / group];
        Acc scale, w;
        run[u].add(l, scale, w);
        if (w != Acc(0)) {
          const PO o = *reinterpret_cast<const PO*>(out + uint64_t(s.row + r[u]) * t.row_elems + col[u]);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[u][e] = widen(o.v[e]);
        }
      }
    }
    for (uint32_t k0 = 0; k0 < npeers; k0 += KB) {
      PI x[U][KB];
      Acc l[U][KB];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
          const uint32_t k = k0 + kk;
          if (live[u] && k < npeers) {
            const uint64_t row = uint64_t(s.peer_row[k]) + r[u];
            if (lse) l[u][kk] = weft::pgl::on_rank<const float>(lse_view, s.peer[k])[row * p.lse_per_row + col[u] / group];
            x[u][kk] = *reinterpret_cast<const PI*>(weft::pgl::on_rank<const In>(src_view, s.peer[k]) + row * t.row_elems + col[u]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int kk = 0; kk < KB; ++kk) {
          if (!live[u] || k0 + kk >= npeers) continue;
          if (lse) {
            Acc scale, w;
            run[u].add(l[u][kk], scale, w);
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[u][e] = acc[u][e] * scale + w * Acc(widen(x[u][kk].v[e]));
          } else if (k0 + kk == 0) {  // assigned, not added to 0: a copy keeps -0.0
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[u][e] = Acc(widen(x[u][kk].v[e]));
          } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[u][e] += Acc(widen(x[u][kk].v[e]));
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!live[u]) continue;
      Out* dst = out + uint64_t(s.row + r[u]) * t.row_elems + col[u];
      Acc scale = 1;
      if (lse) scale = run[u].inv();
      if (p.op == WEFT_GRPCOLL_OP_AVG && npeers > 0) scale = Acc(1) / Acc(npeers);
      Acc v[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = acc[u][e] * scale;
      // Sum / avg accumulate into the existing output; lse already combined it as a source.
      store_out<Out>(reinterpret_cast<PO*>(dst), v, accumulate && !lse);
    }
  }
}

// One source, no lse (a cast through a comm dtype, a fan-in-1 sum or average): no accumulator
// state, so each thread keeps kSingleUnroll loads in flight (the general path: 2), converted
// when stored.
constexpr int kSingleUnroll = 4;

template <typename In, typename Out, int VEC>
__device__ __forceinline__ void pull_single(const weft_grpcoll_params& p, const weft_grpcoll_tensor& t,
                                            const weft_grpcoll_item& s, const weft_pgl_view& src_view, Workers w) {
  using Acc = typename AccOf<Out>::T;
  using PI = Pack<In, VEC>;
  using PO = Pack<Out, VEC>;
  // Half as many when the output is wider than the input (its stores hold more registers).
  constexpr int U = sizeof(Out) > sizeof(In) ? kSingleUnroll / 2 : kSingleUnroll;
  const bool accumulate = has(p, WEFT_GRPCOLL_ACCUMULATE);
  // Rows are contiguous on both sides: the item is one run of rows x row_elems elements.
  const PI* src = reinterpret_cast<const PI*>(weft::pgl::on_rank<const In>(src_view, s.peer[0]) + uint64_t(s.peer_row[0]) * t.row_elems);
  PO* dst = reinterpret_cast<PO*>(weft::pgl::on_rank<Out>(t.output, t.output.rank) + uint64_t(s.row) * t.row_elems);
  const uint32_t n = s.rows * (t.row_elems / VEC);
  for (uint32_t i0 = w.tid; i0 < n; i0 += w.n * U) {
    PI x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = i0 + u * w.n;
      if (i < n) x[u] = src[i];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = i0 + u * w.n;
      if (i >= n) continue;
      Acc v[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = Acc(widen(x[u].v[e]));
      store_out<Out>(dst + i, v, accumulate);
    }
  }
}

// One item of one tensor, its sources' rows in `src_view` (their lse in `lse_view`): the
// single-source path, or the general one with U vectors per step (2, or 1 when a vector's
// accumulators take 32 bytes or more: 8 floats for 16-bit data, 8 doubles for bf16 -> f64) and
// kPullBatch sources per batch, which keeps every instance within 128 registers (512 threads)
// without spills.
template <typename In, typename Out, int VEC>
__device__ __forceinline__ void pull_item(const weft_grpcoll_params& p, const weft_grpcoll_tensor& t,
                                          const weft_grpcoll_item& s, const weft_pgl_view& src_view,
                                          const weft_pgl_view& lse_view, Workers w) {
  if (s.npeers == 1 && p.op != WEFT_GRPCOLL_OP_LSE) {
    pull_single<In, Out, VEC>(p, t, s, src_view, w);
  } else {
    pull_rows<In, Out, VEC, (sizeof(typename AccOf<Out>::T) * VEC >= 16 ? 1 : 2), kPullBatch>(p, t, s, src_view,
                                                                                             lse_view, w);
  }
}

// The lse of one item's rows (the sources' lse in `lse_view`), after its data (which read the old
// output lse when accumulating).
template <typename Acc>
__device__ __forceinline__ void pull_lse(const weft_grpcoll_params& p, const weft_grpcoll_item& s,
                                         const weft_pgl_view& lse_view) {
  float* out_lse = weft::pgl::on_rank<float>(p.output_lse, p.output_lse.rank);
  const uint64_t n = uint64_t(s.rows) * p.lse_per_row;
  for (uint64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const uint64_t r = j / p.lse_per_row, h = j - r * p.lse_per_row;
    LseRun<Acc> run;
    Acc scale, w;
    float* dst = out_lse + (s.row + r) * p.lse_per_row + h;
    if (has(p, WEFT_GRPCOLL_ACCUMULATE)) run.add(*dst, scale, w);
    for (uint32_t k = 0; k < s.npeers; ++k)
      run.add(weft::pgl::on_rank<const float>(lse_view, s.peer[k])[(s.peer_row[k] + r) * p.lse_per_row + h], scale, w);
    *dst = float(run.lse());
  }
}


// ---- pull through shared memory (bulk loads) ----
//
// A pulling block keeps only a few 16-byte loads per thread in flight when it reads its sources
// straight from peer memory: latency-bound (crates/grpcoll/README.md, "Measured"). With
// bulk_buffer_bytes set, the block's last warp is a producer: its lane 0 walks the block's units
// and bulk-loads (cp.async.bulk, the TMA) each unit's source rows into a ring of
// p.bulk_stages shared-memory buffers — a unit is a slice of an item: as many of its rows
// as fit one buffer with every source's copy — while the other warps (the consumers) reduce each
// unit from shared memory as one flat run of vectors (reduce_unit). An item whose one row from
// every source does not fit a buffer is pulled directly by the consumers (pull_item). The
// producer's walk (global item loads, about as long as a unit's reduce) thus overlaps the reduce
// instead of preceding it. Orderings: the loads start after the BEFORE barrier's acquire and the
// producer's proxy fence (the sources were written by ordinary stores); a buffer's FULL mbarrier
// completes when its bytes and the producer's description of the unit are there (acquire for
// every waiting thread); its EMPTY mbarrier completes when every consumer warp has finished with
// the unit (each warp's lane 0 arrives after a __syncwarp), and only then does the producer
// describe and refill the buffer.

// One unit of the block's work: item `it`, its rows [r0, r0 + rows), through a buffer or direct;
// `end`: the block's work is done.
// A bulk unit also carries its first output row and its source count (the buffer holds source
// k's rows at k x rows x row bytes).
struct BulkUnit {
  uint32_t it, r0, rows;
  uint32_t bulk, end;
  uint32_t out_row, npeers;
};

struct BulkShared {
  uint64_t full[WEFT_GRPCOLL_BULK_MAX_STAGES];   // FULL: the unit's bytes and description are there
  uint64_t empty[WEFT_GRPCOLL_BULK_MAX_STAGES];  // EMPTY: every consumer warp is done with the unit
  BulkUnit unit[WEFT_GRPCOLL_BULK_MAX_STAGES];
};
static_assert(sizeof(BulkShared) <= WEFT_GRPCOLL_BULK_SHARED_BYTES, "WEFT_GRPCOLL_BULK_SHARED_BYTES holds BulkShared");

// The producer's walk over the block's units: walk position j (whole runs, as the direct path) and the
// next slice's first row r0.
struct BulkCursor {
  uint32_t j, r0;
};

__device__ __forceinline__ BulkUnit next_unit(const weft_grpcoll_params& p, uint32_t n, uint32_t row_bytes, BulkCursor& c) {
  const uint32_t len = weft_grpcoll_walk_length(n, walk_world(p));
  while (c.j < len) {
    const uint32_t it = walk_item(p, c.j, n, false);
    if (it >= n) {
      c.j += gridDim.x;
      continue;
    }
    const weft_grpcoll_item& s = item(p, it);
    const uint64_t per_row = uint64_t(s.npeers) * row_bytes;
    if (per_row == 0 || per_row > p.bulk_buffer_bytes) {
      c.j += gridDim.x;
      return BulkUnit{it, 0, s.rows, 0u, 0u, 0u, 0u};
    }
    const uint32_t fit = uint32_t(p.bulk_buffer_bytes / per_row);
    const uint32_t r0 = c.r0, rows = fit < s.rows - r0 ? fit : s.rows - r0;
    c.r0 += rows;
    if (c.r0 >= s.rows) {
      c.r0 = 0;
      c.j += gridDim.x;
    }
    return BulkUnit{it, r0, rows, 1u, 0u, s.row + r0, s.npeers};
  }
  return BulkUnit{0, 0, 0, 0u, 1u, 0u, 0u};
}

// The producer: describes the block's next unit in buffer b and starts its loads (a direct unit or
// the end completes the buffer's phase with no bytes).
template <typename In>
__device__ __forceinline__ void issue_unit(const weft_grpcoll_params& p, const weft_pgl_view& src, uint8_t* buf,
                                           BulkShared* sh, uint32_t b, uint32_t n, uint32_t row_bytes, BulkCursor& c) {
  const BulkUnit u = next_unit(p, n, row_bytes, c);
  sh->unit[b] = u;
  if (!u.bulk) {
    weft::mbar_arrive(&sh->full[b]);
    return;
  }
  const weft_grpcoll_item& s = item(p, u.it);
  const uint32_t row_elems = p.tensor[0].row_elems;
  const uint32_t bytes = u.rows * row_bytes;
  uint8_t* dst = buf + uint64_t(b) * p.bulk_buffer_bytes;
  weft::mbar_arrive_expect_tx(&sh->full[b], bytes * s.npeers);
  for (uint32_t k = 0; k < s.npeers; ++k) {
    const In* from = weft::pgl::on_rank<const In>(src, s.peer[k]) + (uint64_t(s.peer_row[k]) + u.r0) * row_elems;
    weft::bulk_load_g2s(dst + uint64_t(k) * bytes, from, bytes, &sh->full[b]);
  }
}

// One bulk unit (sum or average; lse never comes here): its sources' rows lie in the buffer one
// after another (source k at k x bytes) and its output rows are contiguous, so the unit is one
// flat run of vectors: out[i] = sum over k of source k's [i], read by ld.shared, U vectors per
// thread per step (4; 2 or 1 where a vector's accumulators take 32 or 64 bytes: no spills within
// the 128 registers of 512 threads), the sources added in the item's order as pull_rows and
// pull_single do (the same values, bit for bit).
template <typename In, typename Out, int VEC>
__device__ __forceinline__ void reduce_unit(const weft_grpcoll_params& p, const weft_grpcoll_tensor& t,
                                            const BulkUnit& m, const uint8_t* buf, Workers w) {
  using Acc = typename AccOf<Out>::T;
  using PI = Pack<In, VEC>;
  using PO = Pack<Out, VEC>;
  constexpr int U = sizeof(Acc) * VEC >= 64 ? 1 : (sizeof(Acc) * VEC >= 32 ? 2 : 4);
  const bool accumulate = has(p, WEFT_GRPCOLL_ACCUMULATE);
  const uint32_t n = m.rows * (t.row_elems / VEC), npeers = m.npeers;
  const PI* src = reinterpret_cast<const PI*>(buf);
  PO* dst = reinterpret_cast<PO*>(weft::pgl::on_rank<Out>(t.output, t.output.rank) + uint64_t(m.out_row) * t.row_elems);
  // Scaled only where pull_rows averages (a one-source unit is copied as pull_single copies it:
  // a NaN keeps its bits).
  const bool scaled = p.op == WEFT_GRPCOLL_OP_AVG && npeers > 1;
  const Acc scale = scaled ? Acc(1) / Acc(npeers) : Acc(1);
  for (uint32_t i0 = w.tid; i0 < n; i0 += w.n * U) {
    Acc acc[U][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = i0 + u * w.n;
      if (i < n) {
        const PI x = src[i];
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[u][e] = Acc(widen(x.v[e]));  // assigned: a copy keeps -0.0
      }
    }
    for (uint32_t k = 1; k < npeers; ++k) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint32_t i = i0 + u * w.n;
        if (i < n) {
          const PI x = src[uint64_t(k) * n + i];
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[u][e] += Acc(widen(x.v[e]));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t i = i0 + u * w.n;
      if (i >= n) continue;
      Acc v[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = scaled ? acc[u][e] * scale : acc[u][e];
      store_out<Out>(dst + i, v, accumulate);
    }
  }
}

template <typename In, typename Out, int VEC>
__device__ __forceinline__ void pull_bulk(const weft_grpcoll_params& p) {
  extern __shared__ __align__(128) uint8_t bulk_smem[];
  const uint32_t stages = p.bulk_stages;  // 2 to WEFT_GRPCOLL_BULK_MAX_STAGES (crates/grpcoll/src/bulk_ring.rs)
  BulkShared* sh = reinterpret_cast<BulkShared*>(bulk_smem + uint64_t(stages) * p.bulk_buffer_bytes);
  const weft_grpcoll_tensor& t = p.tensor[0];
  const weft_pgl_view& src = has(p, WEFT_GRPCOLL_CONVERT) ? t.staging : t.input;
  const uint32_t n = item_count(p), row_bytes = t.row_elems * uint32_t(sizeof(In));
  // Pull blocks have WEFT_GRPCOLL_PULL_THREADS threads: the consumer warps and the producer.
  static_assert(WEFT_GRPCOLL_PULL_THREADS % 32 == 0 && WEFT_GRPCOLL_PULL_THREADS >= 64,
                "the bulk pull needs whole warps: at least one consumer warp and the producer");
  const uint32_t consumers = WEFT_GRPCOLL_PULL_THREADS - 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    // The host sizes shared memory with weft_grpcoll_pull_smem_bytes: a mismatch is a build bug,
    // reported (status SMEM) rather than a corrupt run.
    uint32_t given;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(given));
    if (given < weft_grpcoll_pull_smem_bytes(p.bulk_buffer_bytes, stages)) {
      weft::sync::failure f{};
      f.status = WEFT_SYNC_STATUS_SMEM;
      f.expected = weft_grpcoll_pull_smem_bytes(p.bulk_buffer_bytes, stages);
      f.observed = given;
      weft::sync::fail(p.bar.bound, p.bar.view.rank, f);
    }
    for (uint32_t b = 0; b < stages; ++b) {
      weft::mbar_init(&sh->full[b], 1);
      weft::mbar_init(&sh->empty[b], consumers / 32);
    }
    weft::mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == consumers) {
    // The producer. The sources were written by ordinary stores (before this launch, or by phase
    // 1), acquired by the BEFORE barrier; the bulk loads read them through the async proxy.
    weft::fence_proxy_async_all();
    BulkCursor cursor{blockIdx.x, 0};
    for (uint32_t i = 0;; ++i) {
      const uint32_t b = i % stages;
      // Buffer b last held unit i - stages: wait until every consumer warp is done with it. A
      // give-up reports (block, buffer, unit, 1).
      if (i >= stages)
        weft::sync::mbarrier_wait(&sh->empty[b], (i / stages - 1) & 1u, p.bar.bound, p.bar.view.rank,
                                  coord4(blockIdx.x, b, i, 1));
      issue_unit<In>(p, src, bulk_smem, sh, b, n, row_bytes, cursor);
      if (sh->unit[b].end) break;
    }
  } else if (threadIdx.x < consumers) {
    for (uint32_t i = 0;; ++i) {
      const uint32_t b = i % stages;
      // A give-up reports (block, buffer, unit, 0).
      weft::sync::mbarrier_wait(&sh->full[b], (i / stages) & 1u, p.bar.bound, p.bar.view.rank,
                                coord4(blockIdx.x, b, i, 0));
      const BulkUnit u = sh->unit[b];
      if (u.end) break;  // uniform: every consumer read the same description
      const Workers w{threadIdx.x, consumers};
      if (u.bulk) {
        reduce_unit<In, Out, VEC>(p, t, u, bulk_smem + uint64_t(b) * p.bulk_buffer_bytes, w);
      } else {
        pull_item<In, Out, VEC>(p, t, item(p, u.it), src, p.input_lse, w);
      }
      __syncwarp();
      if (lane == 0) weft::mbar_arrive(&sh->empty[b]);
    }
  }
  // Reconverge the producer's warp before the block barrier that follows (see cross_barrier).
  __syncwarp();
}

template <typename In, typename Out, int VEC>
__device__ __forceinline__ void pull(const weft_grpcoll_params& p) {
  weft::kernel_barrier_arrive(p.arrive);
  const bool synced = has(p, WEFT_GRPCOLL_SYNCED);
  const bool convert = has(p, WEFT_GRPCOLL_CONVERT);
  if (convert) convert_inputs<In, Out, VEC>(p);
  if (!has(p, WEFT_GRPCOLL_TRANSFER)) return;  // the baseline's convert-only launch (never synced)
  if (synced) cross_barrier(p, WEFT_GRPCOLL_BAR_BEFORE, convert);
  const auto pull_one = [&](uint32_t it) {
    const weft_grpcoll_item& s = item(p, it);
    for (uint32_t t = 0; t < p.ntensors; ++t)
      pull_item<In, Out, VEC>(p, p.tensor[t], s, convert ? p.tensor[t].staging : p.tensor[t].input, p.input_lse,
                              Workers{threadIdx.x, blockDim.x});
    if (p.op == WEFT_GRPCOLL_OP_LSE) {
      // Every thread has read the item's old output lse (accumulate) before any is rewritten.
      __syncthreads();
      pull_lse<typename AccOf<Out>::T>(p, s, p.input_lse);
    }
  };
  if constexpr (VEC > 1) {
    if (p.bulk_buffer_bytes != 0 && synced && p.op != WEFT_GRPCOLL_OP_LSE && p.ntensors == 1) {
      pull_bulk<In, Out, VEC>(p);
    } else {
      const uint32_t n = item_count(p);
      for (uint32_t j = blockIdx.x; j < weft_grpcoll_walk_length(n, walk_world(p)); j += gridDim.x) {
        const uint32_t it = walk_item(p, j, n, false);
        if (it < n) pull_one(it);  // uniform across the block: pull_one's __syncthreads stays safe
      }
    }
  } else {
    // The 1-element kernels (rows that are not whole 16-byte vectors, the slow path) walk in
    // order: the walk's registers would make them spill.
    for (uint32_t it = blockIdx.x; it < item_count(p); it += gridDim.x) pull_one(it);
  }
  if (synced) {
    __syncthreads();
    if (threadIdx.x == 0) barrier(p.bar, coord4(0, 0, WEFT_GRPCOLL_BAR_END, blockIdx.x), p.epoch);
  }
}

}  // namespace

#define WEFT_CAST(B) \
  extern "C" __global__ void __launch_bounds__(1024) weft_grpcoll_cast_v##B(const __grid_constant__ weft_grpcoll_params p) { push<B>(p); }
WEFT_CAST(16)
WEFT_CAST(8)
WEFT_CAST(4)
WEFT_CAST(2)
WEFT_CAST(1)

// weft_grpcoll_reduce_<in>_<out>_v<16 / sizeof(in)> and _v1.
#define WEFT_PULL(IN_NAME, IN, OUT_NAME, OUT)                                                              \
  extern "C" __global__ void __launch_bounds__(WEFT_GRPCOLL_PULL_THREADS)                                 \
      weft_grpcoll_reduce_##IN_NAME##_##OUT_NAME##_v1(const __grid_constant__ weft_grpcoll_params p) {    \
    pull<IN, OUT, 1>(p);                                                                                  \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(WEFT_GRPCOLL_PULL_THREADS)                                 \
      weft_grpcoll_reduce_##IN_NAME##_##OUT_NAME##_vN(const __grid_constant__ weft_grpcoll_params p) {    \
    pull<IN, OUT, 16 / sizeof(IN)>(p);                                                                    \
  }
WEFT_PULL(bf16, bf16, bf16, bf16)
WEFT_PULL(f16, f16, f16, f16)
WEFT_PULL(f32, float, f32, float)
WEFT_PULL(f64, double, f64, double)
WEFT_PULL(bf16, bf16, f32, float)
WEFT_PULL(f16, f16, f32, float)
WEFT_PULL(bf16, bf16, f64, double)
WEFT_PULL(f16, f16, f64, double)
WEFT_PULL(f32, float, f64, double)
