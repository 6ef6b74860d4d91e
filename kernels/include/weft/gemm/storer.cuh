// The storer role (run by each consumer warpgroup on its own 64 rows): accumulators -> alpha/beta
// -> output dtype -> a 128-byte-swizzled shared chunk -> TMA store, chunk by chunk with two
// buffers per warpgroup, or with the whole-tile epilogue all chunks first, then their stores (one
// wide box per run of rows where D's map allows: abi/gemm.h, "Wide stores"); then, when the launch
// asks for tile signals, the per-tile flag.
//
// Signal ordering (docs/DESIGN.md §2): every thread that issued a tile's TMA stores waits for its
// bulk groups to COMPLETE (bulk_wait_group<0>, not .read) and orders the async-proxy writes before
// generic-proxy operations (fence.proxy.async.global); after a barrier the warpgroup's leader hands
// the GPU-scope release that adds to the tile's flag or its wave group's counter to the consumer's
// signaller thread (signaller.cuh) through shared memory, so the warpgroup does not wait for it.
// A consumer of the tile (same GPU) polls with acquire until the flag or counter reaches the
// launch's target.
//
// Deferred: a tile is signalled when the warpgroup starts its NEXT tile's epilogue (or drains),
// not right after its own stores. By then a whole main loop has passed, the stores have long
// completed and the wait costs nothing; waiting right away stalled every tile by the store
// latency (6-12 % of a short-K GEMM). The price: a tile's signal comes one tile later.
//
// Batched by wave group: a group's counter is only read once it reaches its target, so the
// warpgroup counts its stored tiles of the current group and adds them in one release when its
// next tile belongs to another group (or it drains) — the moment the per-tile deferral would have
// signalled the group's last tile, so a group completes no later. (Per tile, the leader's own
// releases cost 7-15 % of a short-K GEMM with 2 groups: weft bench interference.) Tile flags
// (per-tile consumers) are still signalled tile by tile.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include "weft/tma/bulk_copy.cuh"
#include "weft/abi/gemm.h"
#include "weft/gemm/config.cuh"
#include "weft/gemm/peer_reduce.cuh"
#include "weft/gemm/signaller.cuh"
#include "weft/sync/memory_order.cuh"
#include "weft/tma/tensor_copy.cuh"
#include "weft/sm90/stmatrix.cuh"
#include "weft/sm90/warpgroup.cuh"

namespace weft::gemm {

// Two adjacent output elements (columns c, c + 1), converted with round-to-nearest.
__device__ __forceinline__ void store_pair(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(__half* p, float a, float b) { *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b); }
__device__ __forceinline__ void store_pair(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load_pair(const __half* p) { return __half22float2(*reinterpret_cast<const __half2*>(p)); }
__device__ __forceinline__ float2 load_pair(const float* p) { return *reinterpret_cast<const float2*>(p); }

// Byte offset of (row, byte-in-row) in a 128-byte-swizzled box: 16-byte chunks XOR row % 8 (what
// TMA's CU_TENSOR_MAP_SWIZZLE_128B expects of a 1024-byte aligned box).
__device__ __forceinline__ uint32_t swizzle128(uint32_t row, uint32_t byte) {
  return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}

// Two floats as one 32-bit word of 16-bit values (the first in the low half), round-to-nearest.
__device__ __forceinline__ uint32_t pack_pair(__nv_bfloat16*, float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_pair(__half*, float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Chunk c (columns [64 c, 64 c + 64)) of a warpgroup's accumulators times alpha, as 16-bit values
// into the 128-byte-swizzled 64-row box at `buf`: one stmatrix per pair of n8 blocks (j, j + 1),
// its four matrices (j, rows 0-7 of the warp's 16), (j, rows 8-15), (j + 1, 0-7), (j + 1, 8-15).
// Lane 8 m + i addresses row i of matrix m. The epilogue of a 16-bit output without beta: the
// general writer (per pair a store, its address and the beta branch) made the epilogue about 30 KB
// of code, refetched by the instruction cache at every tile (Nsight Compute at 4096 x 8192 x 1024:
// 15 % of the kernel's warp samples in the epilogue, 40 % of those waiting for instructions).
template <class Cfg>
__device__ __forceinline__ void write_chunk_stmatrix(const float (&acc)[Cfg::kAccumulators], int c, uint8_t* buf,
                                                     float alpha) {
  using Out = typename Cfg::Out;
  static_assert(sizeof(Out) == 2 && Cfg::kEpiCols == 64, "stmatrix stores 16-bit chunks of 64 columns");
  // stmatrix is .sync.aligned: every lane of the warp must execute it together. Lanes may arrive
  // apart (the leader alone issued the previous chunk's store): converge first.
  __syncwarp();
  const uint32_t lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const uint32_t m = lane / 8, i = lane % 8;
  const uint32_t row = warp * 16 + (m & 1) * 8 + i;  // row % 8 == i
  // Matrix m's 16-byte column block in pair q is 2q + m / 2; swizzled with the row, (2q + m / 2) ^ i
  // == 2q ^ key (2q has no low bit).
  const uint32_t key = ((m >> 1) ^ i) & 7;
  const uint32_t base = smem_addr(buf) + row * 128;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = c * 8 + 2 * q;
    stmatrix_x4(base + (((2u * q) ^ key) << 4), pack_pair(static_cast<Out*>(nullptr), alpha * acc[4 * j], alpha * acc[4 * j + 1]),
                pack_pair(static_cast<Out*>(nullptr), alpha * acc[4 * j + 2], alpha * acc[4 * j + 3]),
                pack_pair(static_cast<Out*>(nullptr), alpha * acc[4 * j + 4], alpha * acc[4 * j + 5]),
                pack_pair(static_cast<Out*>(nullptr), alpha * acc[4 * j + 6], alpha * acc[4 * j + 7]));
  }
}

// A warpgroup's epilogue state across the tiles of a launch.
struct StoreState {
  uint32_t epi_count = 0;                 // chunks stored so far (selects the buffer)
  uint32_t pending = WEFT_GEMM_NO_TILE;   // the order whose tile flag is deferred, if any
  uint32_t group = 0;                     // the wave group of the tiles counted in group_tiles
  uint32_t group_tiles = 0;               // stored tiles of `group` not yet added to its counter
  SignalRing ring;                        // the leader's position in its signaller's ring
  bool signal_stalled = false;            // a post found no free slot: reported at the drain
  bool peer_ready = false;                // PEER_REDUCE / PEER_ROWS: START passed (every rank's D zeroed / read)
  bool peer_stalled = false;              // PEER_REDUCE / PEER_ROWS: the leader's wait for that gave up
};

// The deferred signals due before storing the tile of `next` (WEFT_GEMM_NO_TILE when draining):
// the pending tile flag, and the counted tiles of a group `next` is not in. Every thread of the
// warpgroup computes the same (its StoreState evolves identically).
struct DueSignals {
  uint32_t flag_order = WEFT_GEMM_NO_TILE;  // the tile whose flag is due, if any
  uint32_t group = 0;                       // the group whose counted tiles are due
  uint32_t group_tiles = 0;                 // their count (0: none due)
  uint32_t next_group = 0;                  // the group of `next`
  __device__ __forceinline__ bool any() const { return flag_order != WEFT_GEMM_NO_TILE || group_tiles != 0; }
};

template <class Cfg>
__device__ __forceinline__ DueSignals signals_due(const weft_gemm_params& p, const StoreState& st, uint32_t next) {
  DueSignals d;
  const bool groups = Cfg::kAllFusions && p.group_counters != 0;
  // st.group is the group of this warpgroup's previous tile (0 before the first), and its orders
  // rise (static: + ctas; dynamic: successive claims), so the search starts there.
  d.next_group = groups && next != WEFT_GEMM_NO_TILE ? weft_gemm_group_of_from(&p.groups, next, st.group) : 0;
  d.flag_order = st.pending;
  if (st.group_tiles > 0 && (next == WEFT_GEMM_NO_TILE || d.next_group != st.group)) {
    d.group = st.group;
    d.group_tiles = st.group_tiles;
  }
  return d;
}

// Every thread: `due` is handed over; counts the tile of `next` for its group.
template <class Cfg>
__device__ __forceinline__ void count_tile(const weft_gemm_params& p, StoreState& st, const DueSignals& due, uint32_t next) {
  st.pending = WEFT_GEMM_NO_TILE;
  if (due.group_tiles != 0) st.group_tiles = 0;
  // Phantoms count for their group too: its order count includes them (their TILE_ORDER slot is
  // written, with zeros, inside the group's range).
  if (Cfg::kAllFusions && p.group_counters != 0 && next != WEFT_GEMM_NO_TILE) {
    st.group = due.next_group;
    ++st.group_tiles;  // its stores are issued after this, before any later hand-over
  }
}

// A thread that issued TMA stores, before the signals that cover them: its stores complete (issued
// at least a main loop ago), its async-proxy global writes ordered before what follows.
__device__ __forceinline__ void complete_stores(const DueSignals& due) {
  if (due.any()) {
    bulk_wait_group<0>();
    weft::sync::mo::fence_proxy_async_global();
  }
}

// The leader, once every thread that issued the covered stores has completed them (itself, or
// the others before a barrier it passed since): hands `due` to the signaller.
template <class Cfg>
__device__ __forceinline__ void post_due(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                         StoreState& st, const DueSignals& due) {
  if (due.flag_order != WEFT_GEMM_NO_TILE && !st.signal_stalled) {
    const weft_gemm_tile t = weft_gemm_tile_at(p.sched, due.flag_order);
    if (t.valid)
      st.signal_stalled = !post_signal(p, sm, consumer, st.ring, p.tile_flags + 8ull * weft_gemm_tile_index(p.sched, t), 1);
  }
  if (due.group_tiles != 0 && !st.signal_stalled)
    st.signal_stalled = !post_signal(p, sm, consumer, st.ring, p.group_counters + 8ull * due.group, due.group_tiles);
}

// RANK_BANDS: the chunk of tile rows [row, row + 64) in boxes of weft_gemm_band_box_rows rows,
// each inside one band: a box (shared rows from a multiple of box_rows, 1024-byte aligned) goes
// to (col, its row within the band, the band's slot) of D, the 3-D tensor (tile_n columns, band
// slot rows, slots), band and row from the parameters' table. Every coordinate is >= 0 (abi/gemm.h).
// Issues the boxes k (counted from `first_box`, one per box of the chunk) with k % `issuers` ==
// `share`; returns whether it issued any.
__device__ __forceinline__ bool store_bands(const weft_gemm_params& p, const uint8_t* buf, int32_t col, uint32_t row,
                                            weft_gemm_band_slots slots, uint32_t first_box, uint32_t share,
                                            uint32_t issuers) {
  const uint32_t box_rows = 1u << p.band_box_shift;
  bool issued = false;
  for (uint32_t y = row, k = first_box; y < row + 64; y += box_rows, ++k) {
    if (k % issuers != share) continue;
    const uint32_t i = y >> p.band_box_shift;
    tensor_store_3d(&p.d, buf + (y - row) * 128, col, static_cast<int32_t>(p.row_of_box[i]),
                    static_cast<int32_t>(slots.first + p.band_of_box[i] * slots.stride));
    issued = true;
  }
  return issued;
}

// Whole-tile epilogue: where row r (of the warpgroup's 64), byte `byte` of chunk c lives in the
// warpgroup's buffers, which are laid out [run of 2^shift rows][chunk][run's rows][128 bytes],
// each run's chunk a 128-byte-swizzled box (shift >= 3: runs keep the 1024-byte alignment and the
// swizzle's row % 8). shift = 6 is one run: chunk c is buffer c (sm.epi(consumer, c)), as the
// narrow whole-tile stores, ROW_SLOTS and PEER_REDUCE read them (the pipelined epilogue does not
// use this: it rotates two buffers). Smaller runs (wide stores of bands) keep each run's chunks
// adjacent, as one wide box reads them (abi/gemm.h, "Wide stores").
template <class Cfg>
__device__ __forceinline__ uint32_t wide_offset(uint32_t r, uint32_t c, uint32_t byte, uint32_t shift) {
  const uint32_t run_bytes = 128u << shift;
  return (r >> shift) * Cfg::kEpiChunks * run_bytes + c * run_bytes + swizzle128(r & ((1u << shift) - 1u), byte);
}

// Wide stores (p.d_wide): the warpgroup's 64 rows from `wg_buf` (wide_offset with `shift`) in
// boxes of 2^shift rows across every chunk: one at (row `row`, chunk `chunk`) of slot 0, or with
// bands one per band box, to (its row within the band, its band's slot). Box k is issued by the
// issuer with k % issuers == share; returns whether this thread issued any.
template <class Cfg>
__device__ __forceinline__ bool store_wide(const weft_gemm_params& p, const uint8_t* wg_buf, uint32_t shift, bool bands,
                                          int32_t row, int32_t chunk, uint32_t consumer, weft_gemm_band_slots slots,
                                          uint32_t share, uint32_t issuers) {
  if (!bands) {
    if (share != 0) return false;
    tensor_store_4d(&p.d, wg_buf, 0, row, chunk, 0);
    return true;
  }
  bool issued = false;
  const uint32_t boxes = 64u >> shift, first = (consumer * 64u) >> shift;
  for (uint32_t k = share; k < boxes; k += issuers) {
    const uint32_t i = first + k;
    tensor_store_4d(&p.d, wg_buf + k * Cfg::kEpiChunks * (128u << shift), 0, static_cast<int32_t>(p.row_of_box[i]), 0,
                    static_cast<int32_t>(slots.first + p.band_of_box[i] * slots.stride));
    issued = true;
  }
  return issued;
}

// ROW_SLOTS: the warpgroup's threads copy chunk `c` (64 rows x 128 bytes, swizzled) of tile `t`
// rows [row, row + 64) to each row's slot with 16-byte stores (the table gives the slot).
__device__ __forceinline__ void store_row_slots(const weft_gemm_params& p, const uint8_t* buf, uint32_t chunk_byte,
                                                weft_gemm_tile t, uint32_t row, uint32_t out_bytes) {
  if (!t.valid) return;  // a phantom stores nothing (it still signals its group)
  const uint32_t* table = reinterpret_cast<const uint32_t*>(p.row_slots) +
                          uint64_t(weft_gemm_tile_index(p.sched, t)) * WEFT_GEMM_TILE_M + row;
  const uint64_t slot_bytes = uint64_t(p.sched.tile_n) * out_bytes;
  for (uint32_t j = thread_in_warpgroup(); j < 64 * 8; j += kWarpgroupThreads) {
    const uint32_t r = j / 8, piece = j % 8;
    const uint32_t slot = table[r];
    if (slot == WEFT_GEMM_NO_SLOT) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(buf + swizzle128(r, piece * 16));
    *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(p.d_ptr) + slot * slot_bytes + chunk_byte + piece * 16) = v;
  }
}

// PEER_ROWS: the warpgroup's threads copy chunk `chunk` (64 rows x 128 bytes, swizzled) of the
// tile rows [row0, row0 + 64), columns from col0, to each row's destination (abi/gemm.h): 8 threads
// per row, each a 16-byte piece, so a row's 128 bytes go out as one coalesced write.
__device__ __forceinline__ void store_peer_rows(const weft_gemm_params& p, const uint8_t* buf, uint32_t chunk,
                                                uint32_t row0, uint32_t col0, uint32_t out_bytes) {
  const uint32_t* table = reinterpret_cast<const uint32_t*>(p.row_slots);
  const uint64_t* bases = reinterpret_cast<const uint64_t*>(p.peer_ptrs);
  const uint64_t row_bytes = uint64_t(p.sched.n) * out_bytes;
  const uint64_t col_byte = uint64_t(col0) * out_bytes + chunk * 128u;
  for (uint32_t j = thread_in_warpgroup(); j < 64 * 8; j += kWarpgroupThreads) {
    const uint32_t r = j / 8, piece = j % 8;
    const uint32_t row = row0 + r;
    if (row >= p.sched.m || col_byte + piece * 16 >= row_bytes) continue;
    const uint32_t slot = table[row];
    if (slot == WEFT_GEMM_NO_SLOT) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(buf + swizzle128(r, piece * 16));
    uint8_t* dst = reinterpret_cast<uint8_t*>(bases[slot >> WEFT_GEMM_PEER_ROW_BITS]);
    *reinterpret_cast<uint4*>(dst + uint64_t(slot & WEFT_GEMM_PEER_ROW_MASK) * row_bytes + col_byte + piece * 16) = v;
  }
}

struct TmaStorer {
  template <class Cfg>
  __device__ __forceinline__ static void store(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                               weft_gemm_tile t, uint32_t order, const float (&acc)[Cfg::kAccumulators],
                                               StoreState& st) {
    using Out = typename Cfg::Out;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const bool leader = thread_in_warpgroup() == 0;
    // Who issues the TMA stores: with the whole-tile epilogue lane 0 of each of the 4 warps, a
    // share each (one thread issuing them all held the warpgroup about 1 % of a short-K tile per
    // box and chunk: weft bench interference, bands-3/4/8), and with wide stores (p.d_wide) one
    // box per run of rows across all chunks; pipelined, the leader alone (its buffers are reused
    // two chunks later, which one issuer's wait_group_read<1> covers).
    constexpr bool kWhole = Cfg::kEpiBufs >= Cfg::kEpiChunks;
    constexpr uint32_t kIssuers = kWhole ? 4u : 1u;
    const bool issuer = kWhole ? lane == 0 : leader;
    uint32_t& epi_count = st.epi_count;
    // A plain kernel has the standard layout, no signals and no trace; the fused ReduceScatter's
    // own kernel reduces into the owners and nothing else (config.cuh, kFusions).
    const bool peer = uses_peer_reduce<Cfg>(p);
    const bool to_peer_rows = uses_peer_rows<Cfg>(p);
    // The warpgroup barriers below order every issuer (PEER_ROWS: every thread) after the
    // leader's wait.
    if ((peer || to_peer_rows) && !st.peer_ready) {
      if (leader) st.peer_stalled = !peer_reduce_ready(p);
      st.peer_ready = true;
    }
    const DueSignals due = signals_due<Cfg>(p, st, order);
    if (issuer) complete_stores(due);
    count_tile<Cfg>(p, st, due, order);
    if (!kWhole && leader) post_due(p, sm, consumer, st, due);  // the leader is the only issuer
    const uint32_t bar_id = 1 + consumer;
    const uint32_t row0 = t.tm * Cfg::kBM + consumer * 64;  // in D's standard layout (beta reads)
    const uint32_t col0 = t.tn * Cfg::kBN;
    // Where the stores go: the standard position, the tile's slot in execution order, or (bands)
    // the slots of the bands the warpgroup's 64 rows cross.
    const bool tile_order = Cfg::kAllFusions && p.layout == WEFT_GEMM_LAYOUT_TILE_ORDER;
    const bool bands = Cfg::kAllFusions && p.layout == WEFT_GEMM_LAYOUT_RANK_BANDS;
    const bool row_slots = Cfg::kAllFusions && p.layout == WEFT_GEMM_LAYOUT_ROW_SLOTS;
    const int32_t store_row = static_cast<int32_t>(tile_order ? order * Cfg::kBM + consumer * 64 : row0);
    const int32_t store_col = static_cast<int32_t>(tile_order || bands ? 0 : col0);
    weft_gemm_band_slots slots{0, 0};
    // With group counters, count_tile just set st.group to this tile's group (a search from it
    // ends at once); without them there is one group.
    if (bands && issuer) slots = weft_gemm_band_slots_from(p.sched, &p.groups, p.bands, order, st.group);
    const bool with_beta = p.beta != 0.0f;
    // Whole tile: the buffers' runs of rows (wide_offset); 6 (one run) unless wide band stores.
    const bool wide = kWhole && p.d_wide != 0;
    const uint32_t run_shift = wide && bands ? p.band_box_shift : 6u;
    // Chunk c of this warpgroup's accumulators -> `buf` (alpha, beta, conversion, swizzle), or
    // with the whole tile -> the warpgroup's buffers from `buf` = sm.epi(consumer, 0).
    auto write_chunk_general = [&](int c, uint8_t* buf) {
#pragma unroll
      for (int jj = 0; jj < Cfg::kEpiCols / 8; ++jj) {
        const int j = c * (Cfg::kEpiCols / 8) + jj;  // n8 block of the accumulator fragment
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t r = warp * 16 + lane / 4 + h * 8;
          const uint32_t lc = jj * 8 + (lane % 4) * 2;
          float v0 = p.alpha * acc[4 * j + 2 * h], v1 = p.alpha * acc[4 * j + 2 * h + 1];
          if (with_beta) {
            const uint32_t gr = row0 + r, gc = col0 + c * Cfg::kEpiCols + lc;
            if (gr < p.sched.m && gc < p.sched.n) {
              const float2 old = load_pair(reinterpret_cast<const Out*>(p.d_ptr) + uint64_t(gr) * p.sched.n + gc);
              v0 += p.beta * old.x;
              v1 += p.beta * old.y;
            }
          }
          const uint32_t at = kWhole ? wide_offset<Cfg>(r, c, lc * sizeof(Out), run_shift) : swizzle128(r, lc * sizeof(Out));
          store_pair(reinterpret_cast<Out*>(buf + at), v0, v1);
        }
      }
    };
    // 16-bit output without beta, chunks in the standard boxes: stmatrix (write_chunk_stmatrix).
    // The choice is made once per tile, outside the chunk loops, so that only one writer's code runs.
    // Plain kernels only. With it the ReduceScatter's own kernel (_pr) trapped with an illegal
    // instruction on two H200s and hung with two ranks sharing one; the other method kernels were
    // never seen to pass or fail (the first fault poisoned the context), and the all-fusion kernel,
    // which passed its trials with it, would also run it under a peer reduce and spills when told
    // apart at run time. Cause not found (crates/signal-gemm/README.md, "stmatrix epilogue"): every
    // fused kernel keeps the general writer.
    const bool stmatrix_chunks = Cfg::kFusions == kFusionsNone && sizeof(Out) == 2 && !with_beta && run_shift == 6u;
    auto write_chunk_fast = [&](int c, uint8_t* buf) {
      if constexpr (sizeof(Out) == 2) write_chunk_stmatrix<Cfg>(acc, c, kWhole ? buf + c * Cfg::kEpiBufBytes : buf, p.alpha);
    };
    // This issuer's share of chunk c's boxes (one box per chunk unless bands); whether it issued.
    const uint32_t share = kWhole ? static_cast<uint32_t>(warp) : 0u;
    auto store_chunk = [&](int c, const uint8_t* buf) -> bool {
      if (bands) {
        const uint32_t boxes = 64u >> p.band_box_shift;
        return store_bands(p, buf, c * Cfg::kEpiCols, consumer * 64, slots, c * boxes, share, kIssuers);
      }
      if (static_cast<uint32_t>(c) % kIssuers != share) return false;
      if (peer) {
        if (row0 >= p.sched.m) return false;  // a phantom's or a ragged tile's missing rows
        const uint32_t owner = row0 / p.peer_rows;
        tensor_reduce_add_2d(peer_map(p, owner), buf, static_cast<int32_t>(col0) + c * Cfg::kEpiCols,
                             static_cast<int32_t>(row0 - owner * p.peer_rows));
        return true;
      }
      tensor_store_2d(&p.d, buf, store_col + c * Cfg::kEpiCols, store_row);
      return true;
    };
    if constexpr (Cfg::kEpiBufs >= Cfg::kEpiChunks) {
      // Whole tile: every chunk has its own buffer. One wait (the previous tile's stores have
      // read them), one barrier, all writes, one proxy fence and barrier, all stores.
      if (issuer) bulk_wait_group_read<0>();
      named_barrier_sync(bar_id, kWarpgroupThreads);
      // Every issuer completed the covered stores before the barrier.
      if (leader) post_due(p, sm, consumer, st, due);
      // The buffers are contiguous: chunk c at sm.epi(consumer, c) when run_shift is 6.
      if (stmatrix_chunks) {
#pragma unroll
        for (int c = 0; c < Cfg::kEpiChunks; ++c) write_chunk_fast(c, sm.epi(consumer, 0));
      } else {
#pragma unroll
        for (int c = 0; c < Cfg::kEpiChunks; ++c) write_chunk_general(c, sm.epi(consumer, 0));
      }
      fence_proxy_async_smem();  // each writer: its generic stores before the TMA stores read them
      named_barrier_sync(bar_id, kWarpgroupThreads);
      if (row_slots) {
#pragma unroll
        for (int c = 0; c < Cfg::kEpiChunks; ++c) store_row_slots(p, sm.epi(consumer, c), c * 128, t, consumer * 64, sizeof(Out));
      } else if (to_peer_rows) {
        // A phantom stores nothing.
#pragma unroll
        for (int c = 0; c < Cfg::kEpiChunks; ++c)
          if (t.valid) store_peer_rows(p, sm.epi(consumer, c), c, row0, col0, sizeof(Out));
      } else if (issuer) {
        bool issued = false;
        if (wide) {
          issued = store_wide<Cfg>(p, sm.epi(consumer, 0), run_shift, bands, store_row, store_col / Cfg::kEpiCols,
                                   consumer, slots, share, kIssuers);
        } else {
#pragma unroll
          for (int c = 0; c < Cfg::kEpiChunks; ++c) issued |= store_chunk(c, sm.epi(consumer, c));
        }
        if (issued) bulk_commit_group();
      }
      epi_count += Cfg::kEpiChunks;
    } else {
      // Pipelined: two buffers, the store of one chunk overlapping the writing of the next; the
      // loop once per writer (stmatrix_chunks).
      auto pipelined = [&](auto write_chunk) {
#pragma unroll
        for (int c = 0; c < Cfg::kEpiChunks; ++c) {
          uint8_t* buf = sm.epi(consumer, epi_count & 1u);
          if (leader) bulk_wait_group_read<1>();  // the store that used `buf` two chunks ago has read it
          named_barrier_sync(bar_id, kWarpgroupThreads);
          write_chunk(c, buf);
          fence_proxy_async_smem();  // each writer: its generic stores before the TMA store reads them
          named_barrier_sync(bar_id, kWarpgroupThreads);
          if (row_slots) {
            store_row_slots(p, buf, c * 128, t, consumer * 64, sizeof(Out));  // read before the next write's barrier
          } else if (to_peer_rows) {
            if (t.valid) store_peer_rows(p, buf, c, row0, col0, sizeof(Out));  // likewise
          } else if (leader) {
            store_chunk(c, buf);  // the only issuer: its share is every box
            bulk_commit_group();
          }
          ++epi_count;
        }
      };
      if (stmatrix_chunks) {
        pipelined(write_chunk_fast);
      } else {
        pipelined(write_chunk_general);
      }
    }
    // ROW_SLOTS: every thread's stores of this tile before the leader's (deferred) release.
    // (PEER_ROWS signals only at the drain, whose barrier orders them.)
    if (row_slots) named_barrier_sync(bar_id, kWarpgroupThreads);
    // Not gated by the fusion set (only launches with tile flags set them): with it
    // compiled out ptxas spilled the 16-bit 128 x 256 pipelined plain kernels' accumulators and
    // serialized their wgmma (CUDA 13.0).
    if (p.tile_flags != 0) st.pending = order;
    if (Cfg::kAllFusions && leader && consumer == 0 && p.trace != 0 && t.valid) {
      uint32_t* slot = reinterpret_cast<uint32_t*>(p.trace) + 2 * weft_gemm_tile_index(p.sched, t);
      slot[0] = order + 1;
      slot[1] = blockIdx.x + 1;
    }
  }

  // Before the warpgroup exits: its stores' writes complete, shared sources no longer needed;
  // then the last deferred signals, and the end of its signaller. `stalled`: this thread's main
  // loop gave up waiting for a stage and will report and trap; the warps' waits are bounded one by
  // one, so the others may not be here (the barrier below may pair with one in `store`) and their
  // stores may be incomplete: nothing is handed over then, only the signaller is ended.
  template <class Cfg>
  __device__ __forceinline__ static void drain(const weft_gemm_params& p, const SharedTiles<Cfg>& sm, int consumer,
                                               StoreState& st, bool stalled) {
    // Every issuer (lane 0 of each warp, see store): its stores complete, then a barrier, then the
    // leader hands the last signals over.
    if (threadIdx.x % 32 == 0) {
      bulk_wait_group<0>();
      weft::sync::mo::fence_proxy_async_global();
    }
    named_barrier_sync(1 + consumer, kWarpgroupThreads);
    if (thread_in_warpgroup() == 0) {
      const DueSignals due = signals_due<Cfg>(p, st, WEFT_GEMM_NO_TILE);
      if (!stalled) post_due(p, sm, consumer, st, due);
      count_tile<Cfg>(p, st, due, WEFT_GEMM_NO_TILE);
      if (uses_signals<Cfg>(p) && !st.signal_stalled) st.signal_stalled = !post_signal(p, sm, consumer, st.ring, 0, 0);
      if (st.signal_stalled) report_signal_stall(p, consumer, st.ring);
    }
  }
};

}  // namespace weft::gemm
