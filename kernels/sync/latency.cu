// Latency of the sync primitives, timed inside the kernel by one thread per side: each timed
// iteration's clock64 cycles go to `samples`, and the whole timed loop is measured by both
// clock64 and %globaltimer so the host converts cycles to nanoseconds at the clock the SM ran.
//
//   RING       token around all ranks: rank 0 signals rank 1, ..., rank world-1 signals rank 0;
//              one iteration = one lap = world one-way signal->wait hops (every rank records it)
//   PING_PONG  rank 0 signals rank 1, rank 1 waits then signals back; one round trip
//   BARRIER    barrier() on every rank, back to back; one barrier per iteration
//   INTER_SM   the ping-pong between two blocks of one GPU, signal_gpu / wait_gpu
//   MBARRIER   the ping-pong between two warps of one block through shared-memory mbarriers
//   PING_PONG_STORE / _RELAXED, BARRIER_STORE   reference paths built from stores (abi/sync_checks.h)
// Counter targets continue from `first` (iterations done on these counters by earlier launches).
#include "weft/sync.cuh"
#include "weft/abi/sync_checks.h"

using namespace weft::sync;

namespace {

// Records iteration times of one thread; the first `warmup` iterations are not recorded.
struct iteration_timer {
  const weft_latency_params& p;
  long long last;
  long long c0 = 0;
  uint64_t t0 = 0;

  __device__ explicit iteration_timer(const weft_latency_params& params) : p(params), last(clock64()) {
    if (p.warmup == 0) start();
  }
  __device__ void start() {
    t0 = globaltimer_ns();
    c0 = clock64();
    last = c0;
  }
  // Call at the end of iteration i.
  __device__ void lap(uint32_t i) {
    const long long now = clock64();
    if (i >= p.warmup) reinterpret_cast<uint32_t*>(p.samples)[i - p.warmup] = uint32_t(now - last);
    last = now;
    if (i + 1 == p.warmup) start();
  }
  __device__ void finish(uint32_t side) {
    auto* s = reinterpret_cast<weft_latency_summary*>(p.summary);
    s->total_cycles = uint64_t(clock64() - c0);
    s->total_ns = globaltimer_ns() - t0;
    s->smid[side] = smid();
  }
};

__device__ void ring(const weft_latency_params& p) {
  const int32_t rank = p.counters.view.rank, world = p.counters.view.world;
  const weft_tile_coord token = coord4(0, 0, 0, 0);
  const int32_t next = rank + 1 == world ? 0 : rank + 1;  // outside the timed loop
  iteration_timer t(p);
  for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
    const uint64_t j = p.first + i + 1;
    if (rank == 0) {
      signal(p.counters, token, next, 1);
      wait(p.counters, token, rank, j);
    } else {
      wait(p.counters, token, rank, j);
      signal(p.counters, token, next, 1);
    }
    t.lap(i);
  }
  t.finish(0);
}

__device__ void ping_pong(const weft_latency_params& p) {
  const int32_t rank = p.counters.view.rank;
  if (rank > 1) return;
  const weft_tile_coord ball = coord4(0, 0, 0, 0);
  iteration_timer t(p);
  for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
    const uint64_t j = p.first + i + 1;
    if (rank == 0) {
      signal(p.counters, ball, 1, 1);
      wait(p.counters, ball, 0, j);
    } else {
      wait(p.counters, ball, 1, j);
      signal(p.counters, ball, 0, 1);
    }
    t.lap(i);
  }
  t.finish(0);
}

__device__ void barriers(const weft_latency_params& p) {
  iteration_timer t(p);
  for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
    barrier(p.counters, coord4(0, 0, 0, 0), p.first + i + 1);
    t.lap(i);
  }
  t.finish(0);
}

// Reference ping-pongs: the ball is the epoch itself, stored (not added) into the other rank's
// counter, with release/acquire (`ordered`) or with relaxed accesses and no ordering at all.
template <bool kOrdered>
__device__ void ping_pong_store(const weft_latency_params& p) {
  const int32_t rank = p.counters.view.rank;
  if (rank > 1) return;
  const weft_tile_coord ball = coord4(0, 0, 0, 0);
  uint64_t* theirs = counter_or_trap(p.counters, ball, 1 - rank, WEFT_SYNC_PRIM_SIGNAL);
  auto hand_over = [&](uint64_t j) {
    if constexpr (kOrdered) mo::st_release_sys(theirs, j);
    else mo::st_relaxed_sys(theirs, j);
  };
  auto await = [&](uint64_t j) {
    if constexpr (kOrdered) wait(p.counters, ball, rank, j);
    else unordered::wait(p.counters, ball, rank, j);
  };
  iteration_timer t(p);
  for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
    const uint64_t j = p.first + i + 1;
    if (rank == 1) await(j);
    hand_over(j);
    if (rank == 0) await(j);
    t.lap(i);
  }
  t.finish(0);
}

// Reference barrier from stores: counter (0, 0, 0, r) on every rank is rank r's slot; a rank
// releases its epoch into its slot on every peer (one system fence, then relaxed stores), then
// acquires every peer's slot on its own GPU. No atomics, one writer per slot.
__device__ void barriers_store(const weft_latency_params& p) {
  const int32_t rank = p.counters.view.rank, world = p.counters.view.world;
  iteration_timer t(p);
  for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
    const uint64_t e = p.first + i + 1;
    mo::fence_acq_rel_sys();
    for (int32_t d = 1; d < world; ++d) {
      const int32_t r = rank + d < world ? rank + d : rank + d - world;
      mo::st_relaxed_sys(counter_or_trap(p.counters, coord4(0, 0, 0, rank), r, WEFT_SYNC_PRIM_BARRIER), e);
    }
    for (int32_t d = 1; d < world; ++d) {
      const int32_t r = rank + d < world ? rank + d : rank + d - world;
      wait(p.counters, coord4(0, 0, 0, r), rank, e);
    }
    t.lap(i);
  }
  t.finish(0);
}

// Block 0 pings on counter 1, block 1 pongs on counter 0 (both on this GPU).
__device__ void inter_sm(const weft_latency_params& p) {
  const weft_tile_coord ping = coord4(0, 0, 0, 1), pong = coord4(0, 0, 0, 0);
  if (blockIdx.x == 0) {
    iteration_timer t(p);
    for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
      signal_gpu(p.counters, ping, 1);
      wait_gpu(p.counters, pong, p.first + i + 1);
      t.lap(i);
    }
    t.finish(0);
  } else {
    for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
      wait_gpu(p.counters, ping, p.first + i + 1);
      signal_gpu(p.counters, pong, 1);
    }
    reinterpret_cast<weft_latency_summary*>(p.summary)->smid[1] = smid();
  }
}

// Warp 0 arrives on bars[0] and waits on bars[1]; warp 1 the other way round.
__device__ void mbarrier_ping_pong(const weft_latency_params& p) {
  __shared__ uint64_t bars[2];
  if (threadIdx.x == 0) {
    weft::mbar_init(&bars[0], 1);
    weft::mbar_init(&bars[1], 1);
  }
  __syncthreads();
  const int32_t rank = p.counters.view.rank;
  const uint32_t warp = threadIdx.x / 32;
  if (threadIdx.x % 32 != 0 || warp > 1) return;
  if (warp == 0) {
    iteration_timer t(p);
    for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
      weft::mbar_arrive(&bars[0]);
      mbarrier_wait(&bars[1], i & 1, p.counters.bound, rank, coord4(0, 0, 0, 1));
      t.lap(i);
    }
    t.finish(0);
  } else {
    for (uint32_t i = 0; i < p.warmup + p.iters; ++i) {
      mbarrier_wait(&bars[0], i & 1, p.counters.bound, rank, coord4(0, 0, 0, 0));
      weft::mbar_arrive(&bars[1]);
    }
  }
}

}  // namespace

// Grid: RING / PING_PONG* / BARRIER* one block of 32 threads (thread 0 works); INTER_SM two blocks
// of 32 (on different SMs: the host checks summary.smid); MBARRIER one block of 64.
extern "C" __global__ void weft_sync_latency(const __grid_constant__ weft_latency_params p) {
  if (p.kind == WEFT_LATENCY_MBARRIER) {
    mbarrier_ping_pong(p);
    return;
  }
  if (threadIdx.x != 0) return;
  switch (p.kind) {
    case WEFT_LATENCY_RING: ring(p); break;
    case WEFT_LATENCY_PING_PONG: ping_pong(p); break;
    case WEFT_LATENCY_BARRIER: barriers(p); break;
    case WEFT_LATENCY_INTER_SM: inter_sm(p); break;
    case WEFT_LATENCY_PING_PONG_STORE: ping_pong_store<true>(p); break;
    case WEFT_LATENCY_PING_PONG_RELAXED: ping_pong_store<false>(p); break;
    case WEFT_LATENCY_BARRIER_STORE: barriers_store(p); break;
    default: break;
  }
}
