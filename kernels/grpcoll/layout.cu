// The layout of a group collective whose metadata lives on the GPU (crates/grpcoll, device
// metadata): one block, launched on the plan's stream right before the transfer kernel.
//
//  1. Meets every rank (row WEFT_GRPCOLL_BAR_LAYOUT, column 0): every rank's metadata for this
//     launch is written (its stream reached this launch), and acquired here.
//  2. Copies every rank's metadata into local scratch (parallel peer loads).
//  3. Checks every rank's metadata and takes its input and output row offsets (warp scans).
//  4. For every (source s, destination d) pair, lists s's input splits that name d and d's output
//     splits that name s, in index order: the matching rule pairs them k-th with k-th; counts and
//     row counts must agree. Every rank checks every pair, so every rank reaches the same verdict.
//  5. Writes this rank's work items (push: per input split, every destination's first row;
//     pull: per output split, every source's first row) in chunks of `chunk` rows, and their count.
// A rejected layout writes a report (first one wins) and zero items: the transfer kernel still
// runs its barriers with nothing to move, so no rank waits for another.
#include <stdint.h>
#include "weft/abi/grpcoll.h"
#include "weft/pgl/view.cuh"
#include "weft/sync.cuh"

using namespace weft::sync;

namespace {

struct Layout {
  const weft_grpcoll_layout_params& p;
  uint32_t world, me, cap, words;
  uint32_t* copy;      // world x words: every rank's metadata
  uint32_t* in_off;    // world x (cap + 1)
  uint32_t* out_off;   // world x (cap + 1)
  uint32_t* lists;     // world x world x 2cap: s's splits to d, then d's splits from s
  uint32_t* counts;    // world x world x 2
  uint32_t* peer_row;  // cap x world: this rank's peer rows per (split, peer)

  __device__ Layout(const weft_grpcoll_layout_params& params)
      : p(params), world(uint32_t(params.meta.world)), me(uint32_t(params.meta.rank)), cap(params.cap),
        words(weft_grpcoll_meta_words(params.cap)) {
    copy = reinterpret_cast<uint32_t*>(p.scratch);
    in_off = copy + world * words;
    out_off = in_off + world * (cap + 1);
    lists = out_off + world * (cap + 1);
    counts = lists + world * world * 2 * cap;
    peer_row = counts + world * world * 2;
  }
  __device__ uint32_t splits(uint32_t r, uint32_t side) const { return copy[r * words + side]; }
  __device__ const uint32_t* rows(uint32_t r, uint32_t side) const { return copy + r * words + 2 + side * 2 * cap; }
  __device__ const uint32_t* masks(uint32_t r, uint32_t side) const { return rows(r, side) + cap; }
  __device__ uint32_t* offsets(uint32_t r, uint32_t side) const { return (side == 0 ? in_off : out_off) + r * (cap + 1); }
};

// Records the first problem (device memory, first writer wins) and flags the block.
__device__ void reject(const weft_grpcoll_layout_params& p, uint32_t* bad, uint32_t code, uint32_t side, uint32_t a,
                       uint32_t b, uint32_t a_split, uint32_t b_split, uint32_t expected, uint32_t observed) {
  atomicOr(bad, 1u);
  auto* r = reinterpret_cast<weft_grpcoll_layout_report*>(p.report);
  if (atomicCAS(&r->code, 0u, 0xffffffffu) == 0u) {
    r->side = side;
    r->a = int32_t(a);
    r->b = int32_t(b);
    r->a_split = a_split;
    r->b_split = b_split;
    r->expected = expected;
    r->observed = observed;
    __threadfence();
    atomicExch(&r->code, code);
  }
}

// Exclusive prefix sum of v over the warp; returns it and sets `total` to the warp's sum. In 64
// bits: 32 row counts of up to 2^32 - 1 cannot wrap it, so a split list whose 32-bit sum wraps
// to a small number is seen at its true size (and refused against the capacity).
__device__ __forceinline__ uint64_t warp_scan(uint64_t v, uint64_t& total) {
  const uint32_t lane = threadIdx.x & 31;
  uint64_t x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= uint32_t(o)) x += y;
  }
  total = __shfl_sync(0xffffffffu, x, 31);
  return x - v;
}

__device__ __forceinline__ uint32_t popcount(uint32_t m) { return uint32_t(__popc(m)); }

}  // namespace

extern "C" __global__ void __launch_bounds__(1024) weft_grpcoll_layout(const __grid_constant__ weft_grpcoll_layout_params p) {
  __shared__ uint32_t bad;
  const Layout L(p);
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (threadIdx.x == 0) bad = 0;
  // 1. Every rank's metadata for this launch is written (see cross_barrier in grpcoll.cu for the
  //    warp-0 reconvergence before the CTA barrier).
  if (threadIdx.x < 32) {
    uint32_t passed = 0;
    if (threadIdx.x == 0) {
      barrier(p.bar, coord4(0, 0, WEFT_GRPCOLL_BAR_LAYOUT, 0), p.epoch);
      passed = 1;
    }
    if (__shfl_sync(0xffffffffu, passed, 0) == 0) __trap();
  }
  __syncthreads();

  // 2. Local copies of every rank's metadata.
  for (uint32_t w = threadIdx.x; w < L.world * L.words; w += blockDim.x) {
    L.copy[w] = weft::pgl::on_rank<const uint32_t>(p.meta, int32_t(w / L.words))[w % L.words];
  }
  __syncthreads();

  // 3. Per (rank, side): bounds, masks, offsets.
  const uint32_t all = L.world >= 32 ? 0xffffffffu : (1u << L.world) - 1u;
  for (uint32_t task = warp; task < 2 * L.world; task += warps) {
    const uint32_t r = task / 2, side = task % 2;
    const uint32_t n = L.splits(r, side);
    if (n > L.cap) {
      if (lane == 0) reject(p, &bad, WEFT_GRPCOLL_BAD_SPLIT_COUNT, side, r, r, n, 0, L.cap, n);
      continue;
    }
    // One peer per split on the side that names a single rank: cast outputs, reduce inputs.
    const bool single = (side == 1) != (p.reduce != 0);
    uint32_t* off = L.offsets(r, side);
    uint64_t base = 0;
    for (uint32_t i0 = 0; i0 < n; i0 += 32) {
      const uint32_t i = i0 + lane;
      const uint32_t rows = i < n ? L.rows(r, side)[i] : 0u, mask = i < n ? L.masks(r, side)[i] : 0u;
      if (i < n && (mask & ~all) != 0) reject(p, &bad, WEFT_GRPCOLL_BAD_MASK, side, r, r, i, 0, all, mask);
      if (i < n && single && popcount(mask) != 1) reject(p, &bad, WEFT_GRPCOLL_BAD_PEER_COUNT, side, r, r, i, 0, 1, popcount(mask));
      if (i < n && !single && side == 1 && mask == 0) reject(p, &bad, WEFT_GRPCOLL_BAD_PEER_COUNT, side, r, r, i, 0, 1, 0);
      uint64_t total;
      const uint64_t before = warp_scan(rows, total);
      if (i < n) off[i] = uint32_t(base + before);  // only used when base stays within the limit
      base += total;
    }
    const uint64_t limit = side == 0 ? p.max_input_rows : p.max_output_rows;
    if (lane == 0) {
      off[n] = uint32_t(base);
      if (base > limit) reject(p, &bad, WEFT_GRPCOLL_BAD_ROWS, side, r, r, n, 0, uint32_t(limit), uint32_t(base > 0xffffffffu ? 0xffffffffu : base));
    }
  }
  __syncthreads();

  // 4. Per (source, destination) pair: the matched split lists, their counts and row counts.
  if (bad == 0) {
    for (uint32_t pair = warp; pair < L.world * L.world; pair += warps) {
      const uint32_t s = pair / L.world, d = pair % L.world;
      uint32_t* list = L.lists + pair * 2 * L.cap;
      for (uint32_t side = 0; side < 2; ++side) {
        const uint32_t owner = side == 0 ? s : d, peer = side == 0 ? d : s;
        const uint32_t n = L.splits(owner, side);
        uint32_t at = 0;
        for (uint32_t i0 = 0; i0 < n; i0 += 32) {
          const uint32_t i = i0 + lane;
          const bool named = i < n && (L.masks(owner, side)[i] >> peer & 1u);
          const uint32_t ballot = __ballot_sync(0xffffffffu, named);
          if (named) list[side * L.cap + at + popcount(ballot & ((1u << lane) - 1u))] = i;
          at += popcount(ballot);
        }
        if (lane == 0) L.counts[pair * 2 + side] = at;
      }
      __syncwarp();
      const uint32_t sends = L.counts[pair * 2], recvs = L.counts[pair * 2 + 1];
      if (sends != recvs) {
        if (lane == 0) reject(p, &bad, WEFT_GRPCOLL_BAD_PAIR_COUNT, 0, s, d, 0, 0, sends, recvs);
        continue;
      }
      for (uint32_t k = lane; k < sends; k += 32) {
        const uint32_t i = list[k], j = list[L.cap + k];
        const uint32_t a = L.rows(s, 0)[i], b = L.rows(d, 1)[j];
        if (a != b) reject(p, &bad, WEFT_GRPCOLL_BAD_PAIR_ROWS, 0, s, d, i, j, a, b);
      }
    }
  }
  __syncthreads();

  // 5. This rank's peer rows, then its items.
  if (bad == 0) {
    for (uint32_t peer = warp; peer < L.world; peer += warps) {
      const uint32_t pair = p.pull ? peer * L.world + L.me : L.me * L.world + peer;
      const uint32_t* list = L.lists + pair * 2 * L.cap;
      for (uint32_t k = lane; k < L.counts[pair * 2]; k += 32) {
        const uint32_t i = list[k], j = list[L.cap + k];
        if (p.pull) L.peer_row[j * L.world + peer] = L.offsets(peer, 0)[i];  // source rows of my output split j
        else L.peer_row[i * L.world + peer] = L.offsets(peer, 1)[j];        // destination rows of my input split i
      }
    }
  }
  __syncthreads();
  if (warp == 0) {
    const uint32_t side = p.pull ? 1 : 0;
    const uint32_t n = bad == 0 ? L.splits(L.me, side) : 0u;
    const uint32_t* rows = L.rows(L.me, side);
    const uint32_t* masks = L.masks(L.me, side);
    const uint32_t* off = L.offsets(L.me, side);
    auto* items = reinterpret_cast<weft_grpcoll_item*>(p.items);
    uint64_t at = 0;
    for (uint32_t i0 = 0; i0 < n; i0 += 32) {
      const uint32_t i = i0 + lane;
      const uint32_t mask = i < n ? masks[i] : 0u;
      const uint32_t chunks = (i < n && mask != 0) ? uint32_t((uint64_t(rows[i]) + p.chunk - 1) / p.chunk) : 0u;
      uint64_t total;
      const uint64_t first = at + warp_scan(chunks, total);
      for (uint32_t c = 0; c < chunks && first + c < p.max_items; ++c) {
        // Written field by field in place (entries past npeers are never read).
        weft_grpcoll_item& it = items[first + c];
        it.row = off[i] + c * p.chunk;
        it.rows = min(p.chunk, rows[i] - c * p.chunk);
        uint32_t np = 0;
        for (uint32_t r = 0; r < L.world; ++r) {
          if (mask >> r & 1u) {
            it.peer[np] = int32_t(r);
            it.peer_row[np] = L.peer_row[i * L.world + r] + c * p.chunk;
            ++np;
          }
        }
        it.npeers = np;
        it.reserved = 0;
      }
      at += total;
    }
    // Capacity sizing makes this impossible; a report beats a silent truncation all the same.
    if (lane == 0 && at > p.max_items) {
      const uint32_t seen = uint32_t(at > 0xffffffffu ? 0xffffffffu : at);
      reject(p, &bad, WEFT_GRPCOLL_BAD_ROWS, 2, L.me, L.me, seen, 0, p.max_items, seen);
    }
    if (lane == 0) *reinterpret_cast<uint32_t*>(p.nitems) = bad == 0 ? at : 0u;
  }
}
