// Standalone collectives over PGLs (crates/collectives, weft/abi/collectives.h): AllReduce one-shot and
// two-shot, ReduceScatter, AllGather; f32, bf16 and f16 (sums accumulated in f32, in rank order
// 0..world-1 on every rank, so every rank of an AllReduce gets the same bits).
//
// Data move by push: a block writes its part of a round straight into the receivers' staging
// slots (peer memory over NVLink, plain 16-byte stores), then publishes the round's sequence number
// in each receiver's flag (phase, 0, sender, block) with a release store. The receiver's block of
// the same index waits (bounded, acquire) for every sender's flag, then reads its staging slots
// locally. Each block only ever reads what the same-index blocks of its peers wrote, so blocks never
// wait for other blocks of their own GPU.
//
// Rounds and slots: a launch moves `rounds` windows of at most `window` elements per shard; round
// `seq` (numbered across launches from 1, kept on the device: weft_collective_state) uses slot
// seq % WEFT_COLL_DEPTH. A block
// pushes round i + 1 right after its peers' round-i data arrived, before it combines round i, so
// the link stays busy while it sums or copies. Why three slots suffice: a peer publishes its round-i
// flag in its iteration i - 1, after it finished iteration i - 2 (including reading round i - 2's
// slots); so once this block has seen the peer's round-i flag it may overwrite the slot of round
// i - 2, which is the slot of round i + 1. The first round of a launch follows the same rule: the
// previous launch on this rank ended after seeing every peer's flag of its last round.
//
// Two-shot AllReduce, per round: phase 0 pushes shard p of the input to rank p; rank p sums its
// shard (its own input and the slots) into its output and pushes the sum to every peer (phase 1);
// every rank copies the peers' sums from its phase-1 slots into its output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "weft/abi/collectives.h"
#include "weft/pgl/view.cuh"
#include "weft/sync.cuh"

using namespace weft::sync;

namespace {

// Threads a block of the simple and LL protocols has, exactly (the simple protocol's copy and
// reduce loops stride by it); a sentinel launch may have fewer (the host's choice, whole warps).
constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 16-byte vectors in flight per thread

using bf16 = __nv_bfloat16;
using f16 = __half;

// 16 bytes of T as floats and back.
template <typename T> struct Vec;
template <> struct Vec<float> {
  static constexpr int N = 4;
  __device__ static void widen(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
  }
  __device__ static uint4 narrow(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
  __device__ static float to_f(float x) { return x; }
  __device__ static float from_f(float x) { return x; }
};
template <typename H, typename H2> struct HalfVec {
  static constexpr int N = 8;
  __device__ static void widen(const uint4& v, float* f) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 p = Vec<H>::to_f2(u[k]);
      f[2 * k] = p.x, f[2 * k + 1] = p.y;
    }
  }
  __device__ static uint4 narrow(const float* f) {
    uint32_t u[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) u[k] = Vec<H>::from_f2(make_float2(f[2 * k], f[2 * k + 1]));
    return make_uint4(u[0], u[1], u[2], u[3]);
  }
};
template <> struct Vec<bf16> : HalfVec<bf16, __nv_bfloat162> {
  __device__ static float2 to_f2(uint32_t u) {
    __nv_bfloat162 h;
    memcpy(&h, &u, 4);
    return __bfloat1622float2(h);
  }
  __device__ static uint32_t from_f2(float2 f) {
    const __nv_bfloat162 h = __float22bfloat162_rn(f);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
  __device__ static float to_f(bf16 x) { return __bfloat162float(x); }
  __device__ static bf16 from_f(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Vec<f16> : HalfVec<f16, __half2> {
  __device__ static float2 to_f2(uint32_t u) {
    __half2 h;
    memcpy(&h, &u, 4);
    return __half22float2(h);
  }
  __device__ static uint32_t from_f2(float2 f) {
    const __half2 h = __float22half2_rn(f);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
  __device__ static float to_f(f16 x) { return __half2float(x); }
  __device__ static f16 from_f(float x) { return __float2half_rn(x); }
};

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Staging is written by peers between rounds: read it through L2 only (ld.global.cg), never L1.
__device__ __forceinline__ uint4 load_vec(const uint4* p, bool staged) { return staged ? __ldcg(p) : *p; }

// Pointers a block works with in one call of a helper: at most one per rank.
template <typename T> struct Ptrs {
  T* p[WEFT_PGL_MAX_RANKS];
  int n = 0;
  __device__ void add(T* x) { p[n++] = x; }
};

// dst[d][i] = src[i] for i < n, every d. `staged`: src is a staging slot.
template <typename T>
__device__ __forceinline__ void copy_to(const T* src, bool staged, const Ptrs<T>& dst, uint64_t n) {
  constexpr int N = Vec<T>::N;
  bool vec = aligned16(src);
  for (int d = 0; d < dst.n; ++d) vec = vec && aligned16(dst.p[d]);
  uint64_t done = 0;
  if (vec) {
    const uint64_t nv = n / N;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (uint64_t i0 = threadIdx.x; i0 < nv; i0 += uint64_t(kThreads) * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t i = i0 + uint64_t(u) * kThreads;
        if (i < nv) v[u] = load_vec(s + i, staged);
      }
      for (int d = 0; d < dst.n; ++d) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint64_t i = i0 + uint64_t(u) * kThreads;
          if (i < nv) reinterpret_cast<uint4*>(dst.p[d])[i] = v[u];
        }
      }
    }
    done = nv * N;
  }
  for (uint64_t i = done + threadIdx.x; i < n; i += kThreads) {
    const T x = staged ? __ldcg(src + i) : src[i];
    for (int d = 0; d < dst.n; ++d) dst.p[d][i] = x;
  }
}

// dst[d][i] = sum over k in order of src[k][i], accumulated in f32, for every d. Source `unstaged`
// is this rank's input (plain loads); every other source is a staging slot.
template <typename T>
__device__ __forceinline__ void reduce_to(const Ptrs<const T>& src, int unstaged, const Ptrs<T>& dst, uint64_t n) {
  constexpr int N = Vec<T>::N;
  bool vec = true;
  for (int k = 0; k < src.n; ++k) vec = vec && aligned16(src.p[k]);
  for (int d = 0; d < dst.n; ++d) vec = vec && aligned16(dst.p[d]);
  uint64_t done = 0;
  if (vec) {
    const uint64_t nv = n / N;
    for (uint64_t i0 = threadIdx.x; i0 < nv; i0 += uint64_t(kThreads) * kUnroll) {
      float acc[kUnroll][N];
      for (int k = 0; k < src.n; ++k) {
        const uint4* s = reinterpret_cast<const uint4*>(src.p[k]);
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint64_t i = i0 + uint64_t(u) * kThreads;
          if (i < nv) v[u] = load_vec(s + i, k != unstaged);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          float f[N];
          Vec<T>::widen(v[u], f);
#pragma unroll
          for (int e = 0; e < N; ++e) acc[u][e] = k == 0 ? f[e] : acc[u][e] + f[e];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint64_t i = i0 + uint64_t(u) * kThreads;
        if (i >= nv) continue;
        const uint4 out = Vec<T>::narrow(acc[u]);
        for (int d = 0; d < dst.n; ++d) reinterpret_cast<uint4*>(dst.p[d])[i] = out;
      }
    }
    done = nv * N;
  }
  for (uint64_t i = done + threadIdx.x; i < n; i += kThreads) {
    float acc = 0.f;
    for (int k = 0; k < src.n; ++k) {
      const float x = Vec<T>::to_f(k != unstaged ? __ldcg(src.p[k] + i) : src.p[k][i]);
      acc = k == 0 ? x : acc + x;
    }
    const T out = Vec<T>::from_f(acc);
    for (int d = 0; d < dst.n; ++d) dst.p[d][i] = out;
  }
}

// One block's share of a round: elements [lo, hi) of a shard of length `len` (clamped).
struct Part {
  uint64_t lo, n;  // offset in the shard, elements
  uint64_t at;     // offset in the round's staging slot
};

template <typename T>
struct Collective {
  const weft_collective_params& p;
  uint64_t seq_base;  // this launch's first round number (from the state, see weft/abi/collectives.h)
  int32_t me, world;
  uint64_t per_block;  // elements per block per round (a multiple of the vector width)

  __device__ Collective(const weft_collective_params& params, uint64_t first) : p(params), seq_base(first) {
    me = p.staging.rank;
    world = p.staging.world;
    const uint64_t N = Vec<T>::N;
    per_block = (p.window + gridDim.x - 1) / gridDim.x;
    per_block = (per_block + N - 1) / N * N;
  }

  __device__ Part part(uint32_t round, uint64_t len) const {
    const uint64_t at = uint64_t(blockIdx.x) * per_block;
    const uint64_t lo = uint64_t(round) * p.window + at;
    uint64_t hi = uint64_t(round) * p.window + min(p.window, at + per_block);
    hi = min(hi, len);
    return Part{lo, hi > lo ? hi - lo : 0, at};
  }

  // Shard s: its offset in the input (two-shot, ReduceScatter) and its length.
  __device__ uint64_t shard_offset(int32_t s) const {
    return p.algo == WEFT_COLL_ALL_REDUCE_TWO_SHOT || p.algo == WEFT_COLL_REDUCE_SCATTER ? uint64_t(s) * p.shard : 0;
  }
  __device__ uint64_t shard_len(int32_t s) const {
    if (p.algo != WEFT_COLL_ALL_REDUCE_TWO_SHOT) return p.shard;
    const uint64_t off = uint64_t(s) * p.shard;
    return off >= p.count ? 0 : min(p.shard, p.count - off);
  }

  // `owner`'s slot of round `seq`, `phase`, written by `sender`.
  __device__ T* slot(uint64_t seq, uint32_t phase, int32_t owner, int32_t sender) const {
    return reinterpret_cast<T*>(weft::pgl::address(p.staging, owner) + weft_collective_slot_offset(seq, phase, sender, world, p.slot_bytes));
  }

  __device__ const T* input() const { return reinterpret_cast<const T*>(p.input); }
  __device__ T* output() const { return reinterpret_cast<T*>(p.output); }

  // After the block's pushes of `phase` for round `seq`: tell every peer's same-index block.
  __device__ void publish_round(uint32_t phase, uint64_t seq) const {
    __syncthreads();
    const int32_t t = threadIdx.x;
    if (t < world && t != me) publish(p.flags, coord4(phase, 0, me, blockIdx.x), t, seq);
  }

  // Until every peer's same-index block published `seq` for `phase` here (bounded waits).
  __device__ void wait_round(uint32_t phase, uint64_t seq) const {
    __syncthreads();
    if (threadIdx.x < 32) {
      const int32_t t = threadIdx.x;
      if (t < world && t != me) wait(p.flags, coord4(phase, 0, t, blockIdx.x), me, seq);
      // Reconverge warp 0 before the CTA barrier (see kernels/grpcoll/grpcoll.cu, cross_barrier).
      if (__all_sync(0xffffffffu, 1) == 0) __trap();
    }
    __syncthreads();
  }

  // Phase 0 of round `i` (sequence `seq`): this block's part of what each peer receives.
  __device__ void push(uint32_t i, uint64_t seq) const {
    const bool sharded = p.algo == WEFT_COLL_ALL_REDUCE_TWO_SHOT || p.algo == WEFT_COLL_REDUCE_SCATTER;
    if (sharded) {
      for (int32_t k = 1; k < world; ++k) {
        const int32_t peer = (me + k) % world;
        const Part q = part(i, shard_len(peer));
        Ptrs<T> dst;
        dst.add(slot(seq, 0, peer, me) + q.at);
        copy_to<T>(input() + shard_offset(peer) + q.lo, false, dst, q.n);
      }
    } else {
      const Part q = part(i, p.count);
      Ptrs<T> dst;
      for (int32_t k = 1; k < world; ++k) dst.add(slot(seq, 0, (me + k) % world, me) + q.at);
      copy_to<T>(input() + q.lo, false, dst, q.n);
    }
    publish_round(0, seq);
  }

  // Round `i`'s local work once every peer's phase-0 data is here.
  __device__ void combine(uint32_t i, uint64_t seq) const {
    switch (p.algo) {
      case WEFT_COLL_ALL_REDUCE_ONE_SHOT:
      case WEFT_COLL_REDUCE_SCATTER: {
        const Part q = part(i, shard_len(me));
        Ptrs<const T> src;
        for (int32_t r = 0; r < world; ++r) src.add(r == me ? input() + shard_offset(me) + q.lo : slot(seq, 0, me, r) + q.at);
        Ptrs<T> dst;
        dst.add(output() + q.lo);
        reduce_to<T>(src, me, dst, q.n);
        break;
      }
      case WEFT_COLL_ALL_GATHER: {
        const Part q = part(i, p.count);
        for (int32_t r = 0; r < world; ++r) {
          Ptrs<T> dst;
          dst.add(output() + uint64_t(r) * p.count + q.lo);
          if (r == me) {
            copy_to<T>(input() + q.lo, false, dst, q.n);
          } else {
            copy_to<T>(slot(seq, 0, me, r) + q.at, true, dst, q.n);
          }
        }
        break;
      }
      case WEFT_COLL_ALL_REDUCE_TWO_SHOT: {
        const Part q = part(i, shard_len(me));
        Ptrs<const T> src;
        for (int32_t r = 0; r < world; ++r) src.add(r == me ? input() + shard_offset(me) + q.lo : slot(seq, 0, me, r) + q.at);
        Ptrs<T> dst;
        dst.add(output() + shard_offset(me) + q.lo);
        for (int32_t k = 1; k < world; ++k) dst.add(slot(seq, 1, (me + k) % world, me) + q.at);
        reduce_to<T>(src, me, dst, q.n);
        publish_round(1, seq);
        wait_round(1, seq);
        for (int32_t k = 1; k < world; ++k) {
          const int32_t peer = (me + k) % world;
          const Part r = part(i, shard_len(peer));
          Ptrs<T> out;
          out.add(output() + shard_offset(peer) + r.lo);
          copy_to<T>(slot(seq, 1, me, peer) + r.at, true, out, r.n);
        }
        break;
      }
      default:
        __trap();
    }
  }

  __device__ void run() const {
    push(0, seq_base);
    for (uint32_t i = 0; i < p.rounds; ++i) {
      const uint64_t seq = seq_base + i;
      wait_round(0, seq);
      if (i + 1 < p.rounds) push(i + 1, seq + 1);
      combine(i, seq);
    }
  }
};

// ---- LL protocol (one round): 8-byte words (data | round << 32) pushed and polled in place ----

__device__ __forceinline__ void st_ll(uint64_t* p, uint32_t data, uint32_t tag) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"((uint64_t(tag) << 32) | data) : "memory");
}

__device__ __forceinline__ uint64_t ld_ll_once(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// A poll of LL or sentinel data that ran past its bound: reported as an unordered wait (LL and
// sentinel data have no flag: the coordinate names the word or vector polled, column, and its
// sender, row), then the thread traps.
__device__ __forceinline__ void give_up_poll(const weft_collective_params& prm, int32_t sender, uint64_t index,
                                             uint64_t expected, uint64_t observed, uint64_t spent, uint64_t t0) {
  failure f{};
  f.status = WEFT_SYNC_STATUS_TIMEOUT;
  f.primitive = WEFT_SYNC_PRIM_WAIT_UNORDERED;
  f.target_rank = sender;
  f.coord = coord4(0, 0, uint32_t(sender), uint32_t(index));
  f.expected = expected;
  f.observed = observed;
  f.elapsed_cycles = spent;
  f.elapsed_ns = globaltimer_ns() - t0;
  fail(prm.flags.bound, prm.staging.rank, f);
}

// Polls the word until it carries `tag`; bounded like every weft wait (reports into the flags'
// error slot as an unordered wait on coordinate (0, 0, sender, word)).
__device__ __forceinline__ uint32_t ld_ll(const uint64_t* p, uint32_t tag, const weft_collective_params& prm,
                                          int32_t sender, uint64_t word) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  if (uint32_t(v >> 32) == tag) return uint32_t(v);
  const long long c0 = clock64();
  const uint64_t t0 = globaltimer_ns();
  for (;;) {
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (uint32_t(v >> 32) == tag) return uint32_t(v);
    const uint64_t spent = uint64_t(clock64() - c0);
    if (spent > prm.flags.bound.budget_cycles) give_up_poll(prm, sender, word, tag, v >> 32, spent, t0);
  }
}

// 4-byte words of T: f32 one element, bf16 / f16 two.
template <typename T> struct Words {
  static constexpr int E = 4 / sizeof(T);
  __device__ static void widen(uint32_t w, float* f) {
    if constexpr (E == 1) {
      f[0] = __uint_as_float(w);
    } else {
      const float2 x = Vec<T>::to_f2(w);
      f[0] = x.x, f[1] = x.y;
    }
  }
  __device__ static uint32_t narrow(const float* f) {
    if constexpr (E == 1) {
      return __float_as_uint(f[0]);
    } else {
      return Vec<T>::from_f2(make_float2(f[0], f[1]));
    }
  }
};

// Word `w` of the n-element array at `src`: one 4-byte load where the word is whole and aligned;
// else (2-byte types: an odd count's last word, or a shard starting at an odd element) its
// elements one by one, the missing half zero.
template <typename T>
__device__ __forceinline__ uint32_t load_word(const T* src, uint64_t w, uint64_t n) {
  constexpr int E = Words<T>::E;
  const T* e = src + w * E;
  if (E == 1 || ((w + 1) * E <= n && (reinterpret_cast<uintptr_t>(e) & 3) == 0)) return *reinterpret_cast<const uint32_t*>(e);
  uint16_t lo, hi = 0;
  memcpy(&lo, e, 2);
  if (w * E + 1 < n) memcpy(&hi, e + 1, 2);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

// Writes the elements of word `w` that lie inside n (element by element where unaligned).
template <typename T>
__device__ __forceinline__ void store_word(T* dst, uint64_t w, uint64_t n, uint32_t v) {
  constexpr int E = Words<T>::E;
  T* e = dst + w * E;
  if (E == 1 || ((w + 1) * E <= n && (reinterpret_cast<uintptr_t>(e) & 3) == 0)) {
    *reinterpret_cast<uint32_t*>(e) = v;
    return;
  }
  const uint16_t lo = uint16_t(v), hi = uint16_t(v >> 16);
  memcpy(e, &lo, 2);
  if (w * E + 1 < n) memcpy(e + 1, &hi, 2);
}

constexpr int kLLUnroll = 4;  // words per thread in flight (loads, stores and polls)

template <typename T>
__device__ void run_ll(const weft_collective_params& p, uint64_t seq) {
  constexpr int E = Words<T>::E, U = kLLUnroll;
  const int32_t me = p.staging.rank, world = p.staging.world;
  // Never 0 (the value of a word never written): seq counts from 1; the tag cycles 1..2^32-1.
  const uint32_t tag = uint32_t((seq - 1) % 0xFFFFFFFFull) + 1;
  const uint64_t n = p.count;  // elements per shard (one-shot, AllGather: the input; ReduceScatter: the output)
  const uint64_t words = (n + E - 1) / E;
  const bool scatter = p.algo == WEFT_COLL_REDUCE_SCATTER;
  auto slot = [&](int32_t owner, int32_t sender) {
    return reinterpret_cast<uint64_t*>(weft::pgl::address(p.staging, owner) + weft_collective_ll_slot_offset(seq, sender, world, p.slot_bytes));
  };
  const T* in = reinterpret_cast<const T*>(p.input);
  T* out = reinterpret_cast<T*>(p.output);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t first = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Words w0 + u * stride, u < U, of this thread: loads (and polls) issued together, then used.
  for (uint64_t w0 = first; w0 < words; w0 += U * stride) {
    // Send: to every peer (ReduceScatter: peer p's shard to peer p).
    for (int32_t k = 1; k < world; ++k) {
      const int32_t peer = (me + k) % world;
      const T* src = scatter ? in + uint64_t(peer) * n : in;
      uint32_t v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (w0 + u * stride < words) v[u] = load_word(src, w0 + u * stride, n);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (w0 + u * stride < words) st_ll(slot(peer, me) + w0 + u * stride, v[u], tag);
    }
  }
  // Receive the same words from every peer, then sum (rank order) or copy.
  for (uint64_t w0 = first; w0 < words; w0 += U * stride) {
    float acc[U][E];
    for (int32_t r = 0; r < world; ++r) {
      uint32_t v[U];
      if (r == me) {
        const T* src = scatter ? in + uint64_t(me) * n : in;
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (w0 + u * stride < words) v[u] = load_word(src, w0 + u * stride, n);
      } else {
        const uint64_t* from = slot(me, r);
        uint64_t x[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (w0 + u * stride < words) x[u] = ld_ll_once(from + w0 + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint64_t w = w0 + u * stride;
          if (w < words) v[u] = uint32_t(x[u] >> 32) == tag ? uint32_t(x[u]) : ld_ll(from + w, tag, p, r, w);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint64_t w = w0 + u * stride;
        if (w >= words) continue;
        if (p.algo == WEFT_COLL_ALL_GATHER) {
          store_word(out + uint64_t(r) * n, w, n, v[u]);
        } else {
          float f[E];
          Words<T>::widen(v[u], f);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[u][e] = r == 0 ? f[e] : acc[u][e] + f[e];
        }
      }
    }
    if (p.algo != WEFT_COLL_ALL_GATHER) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (w0 + u * stride < words) store_word(out, w0 + u * stride, n, Words<T>::narrow(acc[u]));
    }
  }
  // No acquire fence here: LL slots are written only by LL launches, and a peer overwrites this
  // rank's LL slot of round S - 3 only after seeing its round S - 1 words, which this rank sends
  // after its launch of round S - 3 ended — its loads of that slot had returned their values
  // (they were summed into the output) before the launch could end. A fence.acq_rel.sys here
  // cost 2.4 us per call (nvidia-h100-x2, 4 KiB AllReduce under graph replay: 6.9 -> 9.4 us).
}

// ---- Sentinel protocol (one round, Lamport-style) ----
// Sentinel slots hold 0xff bytes wherever no data is. A sender pushes its vectors in place with
// 16-byte stores; the receiver polls each vector until none of its elements is the sentinel (an
// element is written whole, so a vector seen in pieces just waits for the rest), uses it, and
// writes the sentinel back. That reset is safe: the sender wrote the slot of round S before this
// rank read it (coherence), and writes it next in round S + 3, after seeing this rank's round S + 2
// data, which this rank sends after its launch of round S (resets included) ended.
// An element whose bits are all ones (one NaN pattern) is sent as 0x7f..f, another NaN: the only
// change of bits this protocol makes (every rank's own elements go through the same change, so all
// ranks still get the same bits).

__device__ __forceinline__ uint4 ld_v4_relaxed(const uint4* p) {
  uint4 v;
  asm volatile("ld.relaxed.sys.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void st_v4_relaxed(uint4* p, uint4 v) {
  asm volatile("st.relaxed.sys.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

template <typename T> struct SentinelBits {
  // The word with every element that is the sentinel replaced by 0x7f..f.
  __device__ static uint32_t canon(uint32_t w) {
    if constexpr (sizeof(T) == 4) {
      return w == 0xFFFFFFFFu ? 0x7FFFFFFFu : w;
    } else {
      return w & ~(__vcmpeq2(w, 0xFFFFFFFFu) & 0x80008000u);  // a 0xffff half loses its top bit
    }
  }
  // Whether any element of the word is the sentinel.
  __device__ static bool has(uint32_t w) {
    if constexpr (sizeof(T) == 4) {
      return w == 0xFFFFFFFFu;
    } else {
      return __vcmpeq2(w, 0xFFFFFFFFu) != 0;
    }
  }
  __device__ static uint4 canon(uint4 v) { return make_uint4(canon(v.x), canon(v.y), canon(v.z), canon(v.w)); }
  __device__ static bool has(uint4 v) { return has(v.x) || has(v.y) || has(v.z) || has(v.w); }
};

// Polls the vector until no element is the sentinel; bounded like every weft wait (reported as an
// unordered wait on coordinate (0, 0, sender, vector), expected 0 sentinel elements).
template <typename T>
__device__ __noinline__ uint4 poll_sentinel(const uint4* p, const weft_collective_params& prm, int32_t sender, uint64_t vec) {
  const long long c0 = clock64();
  const uint64_t t0 = globaltimer_ns();
  for (;;) {
    const uint4 v = ld_v4_relaxed(p);
    if (!SentinelBits<T>::has(v)) return v;
    const uint64_t spent = uint64_t(clock64() - c0);
    if (spent > prm.flags.bound.budget_cycles) give_up_poll(prm, sender, vec, 0, (uint64_t(v.y) << 32) | v.x, spent, t0);
  }
}

constexpr int kSentinelUnroll = 2;  // vectors per thread in flight

// One-shot AllReduce, ReduceScatter, AllGather of n elements per shard, n · sizeof(T) a multiple
// of 16 (the host's condition for this protocol). Reads the launch's round number from `seq_copy`
// after its first input loads are out (neither waits for the other) and returns it.
template <typename T>
__device__ uint64_t run_sentinel(const weft_collective_params& p, const volatile uint64_t* seq_copy) {
  constexpr int N = Vec<T>::N, U = kSentinelUnroll;
  using Bits = SentinelBits<T>;
  const int32_t me = p.staging.rank, world = p.staging.world;
  const uint64_t n = p.count, nv = n / N;
  const bool scatter = p.algo == WEFT_COLL_REDUCE_SCATTER, gather = p.algo == WEFT_COLL_ALL_GATHER;
  auto source = [&](int32_t shard) {
    return reinterpret_cast<const uint4*>(reinterpret_cast<const T*>(p.input) + (scatter ? uint64_t(shard) * n : 0));
  };
  uint4* out = reinterpret_cast<uint4*>(p.output);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t first = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // Vectors v0 + u · stride (u < U) of a pass; `x` holds them for one peer.
  uint4 x[U];
  auto load = [&](uint64_t v0, const uint4* src) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (v0 + u * stride < nv) x[u] = src[v0 + u * stride];
  };
  load(first, source((me + 1) % world));
  const uint64_t seq = *seq_copy + 1;
  auto slot = [&](int32_t owner, int32_t sender) {
    return reinterpret_cast<uint4*>(weft::pgl::address(p.staging, owner) + weft_collective_sentinel_slot_offset(seq, sender, world, p.slot_bytes, p.sentinel_bytes));
  };
  // Send: to every peer (ReduceScatter: peer p's shard to peer p; else the input, loaded once).
  for (uint64_t v0 = first; v0 < nv; v0 += U * stride) {
    for (int32_t k = 1; k < world; ++k) {
      const int32_t peer = (me + k) % world;
      // (first, k = 1) is loaded above; without scatter, k > 1 sends what k = 1 loaded.
      if ((k == 1 || scatter) && !(v0 == first && k == 1)) load(v0, source(peer));
      uint4* dst = slot(peer, me);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (v0 + u * stride < nv) st_v4_relaxed(dst + v0 + u * stride, Bits::canon(x[u]));
    }
  }
  // Receive the same vectors from every peer (rank order), then sum or copy; reset what was read.
  const uint4 sentinel = make_uint4(~0u, ~0u, ~0u, ~0u);
  for (uint64_t v0 = first; v0 < nv; v0 += U * stride) {
    float acc[U][N];
    for (int32_t r = 0; r < world; ++r) {
      uint4 x[U];
      if (r == me) {
        const uint4* src = source(me);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (v0 + u * stride < nv) x[u] = Bits::canon(src[v0 + u * stride]);
      } else {
        uint4* from = slot(me, r);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (v0 + u * stride < nv) x[u] = ld_v4_relaxed(from + v0 + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const uint64_t v = v0 + u * stride;
          if (v >= nv) continue;
          if (Bits::has(x[u])) x[u] = poll_sentinel<T>(from + v, p, r, v);
          from[v] = sentinel;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint64_t v = v0 + u * stride;
        if (v >= nv) continue;
        if (gather) {
          out[uint64_t(r) * nv + v] = x[u];
        } else {
          float f[N];
          Vec<T>::widen(x[u], f);
#pragma unroll
          for (int e = 0; e < N; ++e) acc[u][e] = r == 0 ? f[e] : acc[u][e] + f[e];
        }
      }
    }
    if (!gather) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (v0 + u * stride < nv) out[v0 + u * stride] = Vec<T>::narrow(acc[u]);
    }
  }
  return seq;
}

// Receives vector `v` of `slot` from `sender` (polled until no element is the sentinel) and sets
// it back to the sentinel.
template <typename T>
__device__ __forceinline__ uint4 take_sentinel(uint4* slot, uint64_t v, const weft_collective_params& p, int32_t sender) {
  uint4 x = ld_v4_relaxed(slot + v);
  if (SentinelBits<T>::has(x)) x = poll_sentinel<T>(slot + v, p, sender, v);
  slot[v] = make_uint4(~0u, ~0u, ~0u, ~0u);
  return x;
}

// Two-shot AllReduce by the sentinel protocol: two rounds per launch (seq for phase 0, seq + 1
// for phase 1; the host advances the state by 2). Phase 0 pushes shard p of the input to rank p;
// rank p sums its shard (rank order, f32) per vector as the peers' vectors arrive, writes it to its
// output and pushes it to every peer (phase 1); every rank takes the peers' sums into its output.
// Per vector, with no barrier: a thread owns vectors v, v + stride, … of every shard. The slot
// argument of the one-shot path holds per round: a sender writes this rank's slot of round R + 3
// only after its launch took data this rank sent after the launch holding round R ended (its own
// shard's phase-0 vectors from this rank for a phase-0 round; this rank's phase-1 sums, which
// follow this rank's phase-0 receipt, for a phase-1 round). That needs every shard to hold data:
// the host takes this path only then (geometry.rs). Shards of p.shard elements (whole vectors),
// the last one shorter; count whole vectors.
// A kernel of its own (weft_collective_two_shot_*): inlined into the other paths' kernel it
// changed their code, and the simple protocol lost 7–13 % of its bandwidth from 64 MiB (A/B on
// four H200s: results/collectives/codegen-nvidia-h200-x4-2026-11-27/).
template <typename T>
__device__ uint64_t run_sentinel_two_shot(const weft_collective_params& p, const volatile uint64_t* seq_copy) {
  constexpr int N = Vec<T>::N;
  using Bits = SentinelBits<T>;
  const int32_t me = p.staging.rank, world = p.staging.world;
  const uint64_t sv = p.shard / N, cv = p.count / N;  // vectors per shard, in all
  auto shard_vectors = [&](int32_t s) { return uint64_t(s) * sv >= cv ? 0 : min(sv, cv - uint64_t(s) * sv); };
  const uint4* in = reinterpret_cast<const uint4*>(p.input);
  uint4* out = reinterpret_cast<uint4*>(p.output);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t first = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t seq = *seq_copy + 1;
  auto slot = [&](int32_t owner, int32_t sender, uint64_t round) {
    return reinterpret_cast<uint4*>(weft::pgl::address(p.staging, owner) + weft_collective_sentinel_slot_offset(round, sender, world, p.slot_bytes, p.sentinel_bytes));
  };
  // Phase 0: shard `peer` of the input to `peer`.
  for (int32_t k = 1; k < world; ++k) {
    const int32_t peer = (me + k) % world;
    uint4* dst = slot(peer, me, seq);
    for (uint64_t v = first; v < shard_vectors(peer); v += stride) st_v4_relaxed(dst + v, Bits::canon(in[uint64_t(peer) * sv + v]));
  }
  // This rank's shard: sum, keep, push (phase 1).
  for (uint64_t v = first; v < shard_vectors(me); v += stride) {
    float acc[N];
    for (int32_t r = 0; r < world; ++r) {
      const uint4 x = r == me ? Bits::canon(in[uint64_t(me) * sv + v]) : take_sentinel<T>(slot(me, r, seq), v, p, r);
      float f[N];
      Vec<T>::widen(x, f);
#pragma unroll
      for (int e = 0; e < N; ++e) acc[e] = r == 0 ? f[e] : acc[e] + f[e];
    }
    const uint4 sum = Bits::canon(Vec<T>::narrow(acc));
    out[uint64_t(me) * sv + v] = sum;
    for (int32_t k = 1; k < world; ++k) {
      const int32_t peer = (me + k) % world;
      st_v4_relaxed(slot(peer, me, seq + 1) + v, sum);
    }
  }
  // The peers' sums.
  for (int32_t k = 1; k < world; ++k) {
    const int32_t peer = (me + k) % world;
    uint4* from = slot(me, peer, seq + 1);
    for (uint64_t v = first; v < shard_vectors(peer); v += stride) out[uint64_t(peer) * sv + v] = take_sentinel<T>(from, v, p, peer);
  }
  return seq;
}

// Programmatic dependent launch (the host sets the attribute unless ranks share a GPU): this grid
// may be scheduled before the previous kernel on the stream ended, so it waits for that kernel's
// end (and its memory) before touching anything; then it lets the next kernel be scheduled, which
// waits in turn. A launch without the attribute passes both at once.
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The launch's round numbers (weft/abi/collectives.h, weft_collective_state): block b reads its
// own copy seq[b] at its start; after the CTA barrier (every thread's read is done) its threads
// write the advanced value into the copies b, b + G, b + 2G, ... — in parallel, a store each
// where the grid has enough threads (sentinel launches may have as few as 32 a block). Copies a
// launch's own blocks do not read matter only to a later launch with more blocks, which weft's
// choices never follow with fewer than 4 (G · 32 ≥ 128 copies): the loop is a safeguard no trial
// can tell from a single pass.
__device__ __forceinline__ void advance_rounds(weft_collective_state* state, uint64_t first, uint32_t rounds) {
  __syncthreads();
  for (uint32_t copy = blockIdx.x + threadIdx.x * gridDim.x; copy < WEFT_COLL_MAX_BLOCKS; copy += blockDim.x * gridDim.x)
    state->seq[copy] = first - 1 + rounds;
}

// Every path but the sentinel two-shot AllReduce.
template <typename T>
__device__ __forceinline__ void collective(const weft_collective_params& p) {
  wait_for_previous_grid();
  allow_next_grid();
  weft_collective_state* state = reinterpret_cast<weft_collective_state*>(p.state);
  uint64_t first;
  if (p.protocol == WEFT_COLL_PROTO_SENTINEL) {
    first = run_sentinel<T>(p, &state->seq[blockIdx.x]);
  } else if (p.protocol == WEFT_COLL_PROTO_LL) {
    // Every thread reads the round number itself: its first sends need not wait for a barrier.
    first = *reinterpret_cast<volatile uint64_t*>(&state->seq[blockIdx.x]) + 1;
    run_ll<T>(p, first);
  } else {
    __shared__ uint64_t shared_first;
    if (threadIdx.x == 0) shared_first = *reinterpret_cast<volatile uint64_t*>(&state->seq[blockIdx.x]) + 1;
    __syncthreads();
    first = shared_first;
    Collective<T>(p, first).run();
  }
  advance_rounds(state, first, p.rounds);
}

// The sentinel two-shot AllReduce (algo two-shot, protocol sentinel, rounds 2).
template <typename T>
__device__ __forceinline__ void collective_two_shot(const weft_collective_params& p) {
  wait_for_previous_grid();
  allow_next_grid();
  weft_collective_state* state = reinterpret_cast<weft_collective_state*>(p.state);
  if (p.protocol != WEFT_COLL_PROTO_SENTINEL || p.algo != WEFT_COLL_ALL_REDUCE_TWO_SHOT) __trap();
  advance_rounds(state, run_sentinel_two_shot<T>(p, &state->seq[blockIdx.x]), p.rounds);
}

}  // namespace

// __grid_constant__: the kernel takes the params' address (references to them, indexing
// staging.base[] by rank), which without it makes every thread copy the whole struct (about 400
// bytes) to its stack first.
#define WEFT_COLLECTIVE_KERNEL(NAME, T)                                                      \
  extern "C" __global__ void __launch_bounds__(kThreads) NAME(const __grid_constant__ weft_collective_params p) { \
    collective<T>(p);                                                                         \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(kThreads, 1) NAME##_two_shot(const __grid_constant__ weft_collective_params p) { \
    collective_two_shot<T>(p);                                                                \
  }

WEFT_COLLECTIVE_KERNEL(weft_collective_f32, float)
WEFT_COLLECTIVE_KERNEL(weft_collective_bf16, bf16)
WEFT_COLLECTIVE_KERNEL(weft_collective_f16, f16)
