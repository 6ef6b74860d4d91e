// GroupCast (push) and GroupReduce (pull) over pgl peer buffers (crates/grpcoll).
//
// One block per SM of the configured count; blocks take the plan's work items (chunks of rows,
// weft/grpcoll.h) round-robin. With params.synced (the native path), every block first meets the
// same block of every rank at a start barrier (row 0 of the counters, column = block): after it,
// every rank's stream has reached this launch, so its inputs are written and nobody still uses
// its output from before. After its items, the block meets them again at the end barrier (row 1):
// when the launch completes, every block of every rank has finished its writes (cast) or reads
// (reduce), and those writes are visible here (release by the writer's arrival, acquire by the
// pass). The barriers are weft::sync's (bounded waits, error slot); epochs come from the host.
//
//   weft_grpcoll_cast_v{16,8,4,2,1}: copies rows of row_bytes bytes in vectors of that many
//     bytes: each vector is read once from this rank's input and written to every destination.
//   weft_grpcoll_reduce_{f32,bf16}_v{N,1}: output rows = sum / avg / lse-weighted combination of
//     the sources' rows, fp32 accumulation; N elements (16 bytes) per vector or 1.
// Without synced (the AlltoAll-v baseline), the same kernels are its range-gather, range-scatter
// and scatter-reduce over hand-built views of local staging buffers.
#include <stdint.h>
#include "weft/grpcoll.h"
#include "weft/sync.cuh"

using namespace weft::sync;

namespace {

constexpr int kUnroll = 4;

__device__ __forceinline__ void start_barrier(const weft_grpcoll_params& p) {
  if (!p.synced) return;
  if (threadIdx.x < 32) {
    uint32_t passed = 0;
    if (threadIdx.x == 0) {
      barrier(p.bar, coord4(0, 0, 0, blockIdx.x), p.epoch);
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

__device__ __forceinline__ void end_barrier(const weft_grpcoll_params& p) {
  if (p.synced) {
    __syncthreads();
    if (threadIdx.x == 0) barrier(p.bar, coord4(0, 0, 1, blockIdx.x), p.epoch);
  }
}

// Every thread reads the (read-only, L1-cached) item from global memory: no lane-0-only copy into
// shared memory followed by a barrier inside the item loop (see start_barrier).
__device__ __forceinline__ const weft_grpcoll_item& item(const weft_grpcoll_params& p, uint32_t it) {
  return reinterpret_cast<const weft_grpcoll_item*>(p.items)[it];
}

template <int BYTES> struct Raw;
template <> struct Raw<16> { using T = uint4; };
template <> struct Raw<8> { using T = uint2; };
template <> struct Raw<4> { using T = uint32_t; };
template <> struct Raw<2> { using T = uint16_t; };
template <> struct Raw<1> { using T = uint8_t; };

template <int BYTES>
__device__ __forceinline__ void cast(const weft_grpcoll_params& p) {
  using V = typename Raw<BYTES>::T;
  start_barrier(p);
  const uint64_t vpr = p.row_bytes / BYTES;
  const char* in = reinterpret_cast<const char*>(p.input.base[p.input.rank]);
  for (uint32_t it = blockIdx.x; it < p.nitems; it += gridDim.x) {
    const weft_grpcoll_item& s = item(p, it);
    const V* src = reinterpret_cast<const V*>(in + uint64_t(s.row) * p.row_bytes);
    const uint64_t n = uint64_t(s.rows) * vpr;
    const uint32_t npeers = s.npeers;
    for (uint64_t i0 = threadIdx.x; i0 < n; i0 += uint64_t(blockDim.x) * kUnroll) {
      V v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t i = i0 + uint64_t(u) * blockDim.x;
        if (i < n) v[u] = src[i];
      }
      for (uint32_t k = 0; k < npeers; ++k) {
        V* dst = reinterpret_cast<V*>(reinterpret_cast<char*>(p.output.base[s.peer[k]]) + uint64_t(s.peer_row[k]) * p.row_bytes);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint64_t i = i0 + uint64_t(u) * blockDim.x;
          if (i < n) dst[i] = v[u];
        }
      }
    }
  }
  end_barrier(p);
}

struct Bf16 {
  uint16_t bits;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(Bf16 x) { return __uint_as_float(uint32_t(x.bits) << 16); }
template <typename T> __device__ __forceinline__ T from_f32(float f);
template <> __device__ __forceinline__ float from_f32<float>(float f) { return f; }
// Round to nearest even, NaN kept quiet (what half::bf16::from_f32 does on the host).
template <> __device__ __forceinline__ Bf16 from_f32<Bf16>(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{uint16_t(u >> 16)};
}

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void reduce(const weft_grpcoll_params& p) {
  using P = Pack<T, VEC>;
  start_barrier(p);
  const uint32_t vpr = p.row_elems / VEC;
  const uint32_t group = p.op == WEFT_GRPCOLL_OP_LSE ? p.row_elems / p.lse_per_row : p.row_elems;
  T* out = reinterpret_cast<T*>(p.output.base[p.output.rank]);
  float* out_lse = reinterpret_cast<float*>(p.output_lse.base[p.output_lse.rank]);
  for (uint32_t it = blockIdx.x; it < p.nitems; it += gridDim.x) {
    const weft_grpcoll_item& s = item(p, it);
    const uint64_t n = uint64_t(s.rows) * vpr;
    const uint32_t npeers = s.npeers;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint64_t r = i / vpr;
      const uint32_t col = uint32_t(i - r * vpr) * VEC;
      float acc[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] = 0.f;
      if (p.op == WEFT_GRPCOLL_OP_LSE) {
        // One pass, max-subtracted: m = running max of the lse, sum = Σ exp(lse_k - m),
        // acc = Σ exp(lse_k - m) · x_k; at the end lse = m + log(sum), out = acc / sum.
        // Sources at -inf contribute nothing; all at -inf give lse -inf and out 0.
        const uint32_t h = col / group;
        float m = -INFINITY, sum = 0.f;
        for (uint32_t k = 0; k < npeers; ++k) {
          const float* lse_in = reinterpret_cast<const float*>(p.input_lse.base[s.peer[k]]);
          const float l = lse_in[uint64_t(s.peer_row[k] + r) * p.lse_per_row + h];
          if (l == -INFINITY) continue;
          const T* in = reinterpret_cast<const T*>(p.input.base[s.peer[k]]);
          const P x = *reinterpret_cast<const P*>(in + uint64_t(s.peer_row[k] + r) * p.row_elems + col);
          if (l > m) {
            const float scale = expf(m - l);  // 0 when m is -inf
            sum = sum * scale + 1.f;
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] = acc[e] * scale + to_f32(x.v[e]);
            m = l;
          } else {
            const float w = expf(l - m);
            sum += w;
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[e] += w * to_f32(x.v[e]);
          }
        }
        const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[e] *= inv;
        if (col % group == 0) out_lse[uint64_t(s.row + r) * p.lse_per_row + h] = sum > 0.f ? m + logf(sum) : -INFINITY;
      } else {
        for (uint32_t k = 0; k < npeers; ++k) {
          const T* in = reinterpret_cast<const T*>(p.input.base[s.peer[k]]);
          const P x = *reinterpret_cast<const P*>(in + uint64_t(s.peer_row[k] + r) * p.row_elems + col);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] += to_f32(x.v[e]);
        }
        if (p.op == WEFT_GRPCOLL_OP_AVG && npeers > 0) {
          const float inv = 1.f / float(npeers);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] *= inv;
        }
      }
      P y;
#pragma unroll
      for (int e = 0; e < VEC; ++e) y.v[e] = from_f32<T>(acc[e]);
      *reinterpret_cast<P*>(out + uint64_t(s.row + r) * p.row_elems + col) = y;
    }
  }
  end_barrier(p);
}

}  // namespace

#define WEFT_CAST(B) \
  extern "C" __global__ void __launch_bounds__(1024) weft_grpcoll_cast_v##B(const __grid_constant__ weft_grpcoll_params p) { cast<B>(p); }
WEFT_CAST(16)
WEFT_CAST(8)
WEFT_CAST(4)
WEFT_CAST(2)
WEFT_CAST(1)

#define WEFT_REDUCE(NAME, T, VEC)                                                                             \
  extern "C" __global__ void __launch_bounds__(512) weft_grpcoll_reduce_##NAME(const __grid_constant__ weft_grpcoll_params p) { \
    reduce<T, VEC>(p);                                                                                        \
  }
WEFT_REDUCE(f32_v4, float, 4)
WEFT_REDUCE(f32_v1, float, 1)
WEFT_REDUCE(bf16_v8, Bf16, 8)
WEFT_REDUCE(bf16_v1, Bf16, 1)
