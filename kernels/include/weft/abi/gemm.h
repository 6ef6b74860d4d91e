// weft's Hopper GEMM (crates/signal-gemm): the tile scheduler and the kernel parameters. Plain C,
// read by bindgen: the scheduler below is the ONE definition of which tile a CTA computes when,
// called by the kernel (kernels/include/weft/gemm/kernel.cuh), by the Rust plan (which lists the
// schedule) and, in later issues, by reorder maps and the tuner.
//
// Schedule. The output's tiles (tile_m x tile_n) are visited in a linear *order*. CTA c of the
// persistent grid computes orders c, c + ctas, c + 2*ctas, ...; its i-th tile is in *wave* i, and
// wave = order / ctas for every tile. With dynamic scheduling (weft_gemm_params.claim_counter)
// the orders and their tiles are the same, but each CTA claims its next order from a counter, so a
// CTA that starts late (its SM held by another kernel) computes fewer tiles. Orders are grouped for L2 locality: tiles are taken in
// groups of group_m cluster rows (M direction), column by column (N direction) inside a group, so
// the CTAs of one wave share a few A row panels and a few B column panels. With clusters of
// cluster_m CTAs along M, the cluster_m tiles of one cluster unit have consecutive orders (the
// CTAs of one cluster run them together, sharing the B tile); a unit's row beyond M is a
// *phantom*: its CTA runs the loads (for its partner) and the epilogue, whose TMA stores lie wholly
// outside D and are clipped, and signals and traces nothing.
#pragma once
#include <stdint.h>
#include "weft/abi/hd.h"
#include "weft/abi/sync.h"

// Fixed tile geometry (kernels/include/weft/gemm/config.cuh builds on these; the host sizes
// launches from them): every tile is 128 rows by 128, 192 (plain kernels only) or 256 columns,
// K steps of 64.
#define WEFT_GEMM_TILE_M 128
#define WEFT_GEMM_TILE_K 64
#define WEFT_GEMM_THREADS 384          // loader warpgroup + 2 consumer warpgroups
#define WEFT_GEMM_CONSUMERS 2          // consumer warpgroups: each adds 1 to a finished tile's flag
#define WEFT_GEMM_EPI_BUF_BYTES 8192   // one epilogue buffer: 64 rows x 128 bytes
#define WEFT_GEMM_NO_TILE 0xFFFFFFFFu  // the order the loader hands the consumers after its last tile
#define WEFT_GEMM_SIGNAL_SLOTS 4       // per consumer: releases handed to its signaller thread (storer.cuh)

// Epilogue variants. PIPELINED: each consumer stores its rows chunk by chunk through 2 buffers
// (a chunk is 128 bytes of columns), leaving room for the deepest pipeline. WHOLE_TILE (16-bit
// outputs, 128 x 256 tiles): one buffer per chunk, so a consumer writes its whole 64 x 256 half
// tile and issues every store after a single barrier, with one stage fewer.
#define WEFT_GEMM_EPI_PIPELINED 0
#define WEFT_GEMM_EPI_WHOLE_TILE 1

// Pipeline stages: as many as fit next to the epilogue buffers (128 x 192 tiles: 4 of 40 KB; a
// fifth would need 233 KB with the pipelined epilogue's buffers).
WEFT_HD_CONSTEXPR uint32_t weft_gemm_stages(uint32_t tile_n, uint32_t epilogue) {
  return tile_n == 256 ? (epilogue == WEFT_GEMM_EPI_WHOLE_TILE ? 3u : 4u) : tile_n == 192 ? 4u : 6u;
}
// Epilogue buffers per consumer warpgroup (chunks of a 16-bit 64 x tile_n half tile when whole).
WEFT_HD_CONSTEXPR uint32_t weft_gemm_epi_bufs(uint32_t tile_n, uint32_t epilogue) {
  return epilogue == WEFT_GEMM_EPI_WHOLE_TILE ? tile_n * 2u / 128u : 2u;
}
// Dynamic shared memory of one CTA with 2-byte inputs: 1024 bytes of alignment slack, the
// stages, the epilogue buffers, a full and an empty mbarrier per stage, a work unit and its tile
// per stage (16 bytes, the kernels' StageWork), per consumer a ring of signal slots (16 bytes and a full and an
// empty mbarrier each), and 16 bytes for the PEER_REDUCE epilogue's barrier.
WEFT_HD_CONSTEXPR uint32_t weft_gemm_smem_bytes(uint32_t tile_n, uint32_t epilogue) {
  const uint32_t stages = weft_gemm_stages(tile_n, epilogue);
  return 1024u + stages * (WEFT_GEMM_TILE_M + tile_n) * WEFT_GEMM_TILE_K * 2u +
         WEFT_GEMM_CONSUMERS * weft_gemm_epi_bufs(tile_n, epilogue) * WEFT_GEMM_EPI_BUF_BYTES + 2u * stages * 8u +
         stages * 16u /* a StageWork per stage */ + WEFT_GEMM_CONSUMERS * WEFT_GEMM_SIGNAL_SLOTS * 32u + 16u;
}

typedef struct weft_gemm_schedule {
  uint32_t m, n, k;        // problem: D (m x n) = A (m x k) * B
  uint32_t tile_m, tile_n; // output tile
  uint32_t tile_k;         // K step of the main loop
  uint32_t cluster_m;      // CTAs per cluster along M (1 or 2)
  uint32_t group_m;        // cluster rows per L2 group (>= 1)
  uint32_t ctas;           // compute CTAs of the persistent grid (a multiple of cluster_m)
  uint32_t tm_offset;      // tile rows the order is rotated by (0; the fused AllGather + GEMM
                           // starts each rank at its own shard): a multiple of cluster_m, and
                           // then tiles_m is one too (no phantoms)
  uint32_t tm_blocks;      // 0 or 1: none; B > 1: the tile rows are B equal blocks (the fused
                           // ReduceScatter's owners) visited in turn, cluster row u of the order
                           // landing in block u % B (units_m a multiple of B, no phantoms);
                           // applied before the rotation
  uint32_t k_splits;       // 0 or 1: each tile's K in one work unit; S > 1 (split-K, cluster_m 1,
                           // standard layout, no signals): S work units per tile ("Split-K" below)
} weft_gemm_schedule;

typedef struct weft_gemm_tile {
  uint32_t tm, tn; // tile row and column
  uint32_t valid;  // 0 for a phantom (tm beyond the last tile row)
} weft_gemm_tile;

WEFT_HD uint32_t weft_gemm_div_up(uint32_t a, uint32_t b) { return (a + b - 1) / b; }
WEFT_HD uint32_t weft_gemm_tiles_m(weft_gemm_schedule s) { return weft_gemm_div_up(s.m, s.tile_m); }
WEFT_HD uint32_t weft_gemm_tiles_n(weft_gemm_schedule s) { return weft_gemm_div_up(s.n, s.tile_n); }
WEFT_HD uint32_t weft_gemm_k_blocks(weft_gemm_schedule s) { return weft_gemm_div_up(s.k, s.tile_k); }
// Cluster rows (units along M) and the number of scheduled orders (phantoms included).
WEFT_HD uint32_t weft_gemm_units_m(weft_gemm_schedule s) { return weft_gemm_div_up(weft_gemm_tiles_m(s), s.cluster_m); }
WEFT_HD uint32_t weft_gemm_order_count(weft_gemm_schedule s) {
  return weft_gemm_units_m(s) * weft_gemm_tiles_n(s) * s.cluster_m;
}
// Index of a tile in row-major tile order (tm * tiles_n + tn): the slot of its signal flag.
WEFT_HD uint32_t weft_gemm_tile_index(weft_gemm_schedule s, weft_gemm_tile t) { return t.tm * weft_gemm_tiles_n(s) + t.tn; }
WEFT_HD uint32_t weft_gemm_wave_of(weft_gemm_schedule s, uint32_t order) { return order / s.ctas; }

// The tile of `order` (0 <= order < weft_gemm_order_count(s)).
WEFT_HD weft_gemm_tile weft_gemm_tile_at(weft_gemm_schedule s, uint32_t order) {
  const uint32_t unit = order / s.cluster_m, rank = order % s.cluster_m;
  const uint32_t units_m = weft_gemm_units_m(s), tiles_n = weft_gemm_tiles_n(s);
  const uint32_t per_group = s.group_m * tiles_n;
  const uint32_t group = unit / per_group, in_group = unit % per_group;
  const uint32_t first = group * s.group_m;
  const uint32_t rows = (units_m - first < s.group_m) ? units_m - first : s.group_m;
  weft_gemm_tile t;
  t.tm = (first + in_group % rows) * s.cluster_m + rank;
  t.tn = in_group / rows;
  t.valid = t.tm < weft_gemm_tiles_m(s) ? 1u : 0u;
  if (s.tm_blocks > 1 && t.valid) {
    // Cluster row u -> block u % B, row u / B of that block (units_m / B cluster rows a block).
    const uint32_t u = t.tm / s.cluster_m, per_block = units_m / s.tm_blocks;
    t.tm = ((u % s.tm_blocks) * per_block + u / s.tm_blocks) * s.cluster_m + rank;
  }
  if (s.tm_offset != 0 && t.valid) t.tm = (t.tm + s.tm_offset) % weft_gemm_tiles_m(s);
  return t;
}

// Split-K. With k_splits = S > 1 the CTAs walk *work units* instead of orders: work w is split
// w % S of the tile of order w / S, and split j multiplies the K blocks [begin(j), begin(j + 1)).
// A tile's S units are consecutive, so they run side by side, and its last split comes last:
// splits 0..S-2 leave their fp32 accumulators in the launch's partials and release the tile's
// flag; the last split waits for them, adds them to its own and stores the tile (the only one
// that does). Every wait is on a lower work unit, which a running CTA has claimed or will reach
// first: with every CTA resident, no cycle. Without splits works are orders (S = 1).
WEFT_HD uint32_t weft_gemm_splits(weft_gemm_schedule s) { return s.k_splits > 1u ? s.k_splits : 1u; }
WEFT_HD uint32_t weft_gemm_work_count(weft_gemm_schedule s) { return weft_gemm_order_count(s) * weft_gemm_splits(s); }
// First K block of split `split` (split = S: the end); balanced, each split gets
// floor or ceil of k_blocks / S (the host keeps S <= k_blocks: no split is empty). 32-bit
// arithmetic (k_blocks < 2^25, S <= WEFT_GEMM_MAX_K_SPLITS): a 64-bit division is a call, which
// makes the consumers spill their accumulators around it.
WEFT_HD uint32_t weft_gemm_split_begin(weft_gemm_schedule s, uint32_t split) {
  return split * weft_gemm_k_blocks(s) / weft_gemm_splits(s);
}
#define WEFT_GEMM_MAX_K_SPLITS 16

// Wave groups (signal-gemm II, FlashOverlap's signalling timing): the orders are cut into
// `count` consecutive ranges, group g ending (exclusive) at end_order[g]; the last ends at the order
// count. The host cuts at wave boundaries (multiples of ctas). Every order of group g, phantoms
// included, adds WEFT_GEMM_CONSUMERS to group_counters[g] once its stores are complete (each
// consumer warpgroup adds its count of a group's stored tiles in one release, see storer.cuh), so
// a group is finished when its counter reaches WEFT_GEMM_CONSUMERS x (its order count).
#define WEFT_GEMM_MAX_WAVE_GROUPS 32
typedef struct weft_gemm_wave_groups {
  uint32_t count;                                // 0: no group signals
  uint32_t end_order[WEFT_GEMM_MAX_WAVE_GROUPS]; // exclusive end of group g, increasing
} weft_gemm_wave_groups;

// The group of `order`, searching from group `from` (its first order must not exceed `order`):
// the first g >= from whose range ends after it (the last group takes any beyond). A CTA's orders
// rise, so the kernel starts from its previous tile's group instead of reading every range again.
WEFT_HD uint32_t weft_gemm_group_of_from(const weft_gemm_wave_groups* g, uint32_t order, uint32_t from) {
  uint32_t i = from;
  while (i + 1 < g->count && order >= g->end_order[i]) ++i;
  return i;
}
// The group of `order` (the one definition of the grouping; the host lists groups through it).
WEFT_HD uint32_t weft_gemm_group_of(const weft_gemm_wave_groups* g, uint32_t order) {
  return weft_gemm_group_of_from(g, order, 0u);
}

// Output layouts. STANDARD: D is m x n row-major. TILE_ORDER (the AllReduce reorder map): D is a
// column of whole tiles in execution order, tile of `order` at rows [order * tile_m, + tile_m) of
// an (order count x tile_m) x tile_n row-major matrix, so each wave group is one contiguous range.
// Rows and columns a ragged tile lacks hold zeros there (TMA loads zero-fill outside A and B).
// RANK_BANDS (the ReduceScatter reorder map, `bands` = the world size): a tile's 128 rows, as 16
// atoms of 8 rows, are dealt in order to `bands` row bands, band r getting 16 / bands atoms plus
// one if r < 16 % bands. D is a column of band slots of weft_gemm_band_rows (the largest band) x
// tile_n; band r of the tile of order o goes to slot weft_gemm_band_slots_of(o) (first + r x stride): inside o's wave
// group [start, end), the group's range holds `bands` parts of end - start slots each, part r
// holding band r of every tile of the group in order. So ncclReduceScatter over a group's range
// hands rank r band r of each of the group's tiles: whole rows. A shorter band leaves its slot's
// last rows unwritten (when `bands` does not divide 16, slots carry up to 8 rows of padding).
//
// Why atoms: a TMA store cannot start at a negative coordinate (illegal instruction; measured), so
// a box must start at a band's row; and with the 128-byte swizzle its shared source must start on
// a 1024-byte (8-row) boundary. Boxes of weft_gemm_band_box_rows rows never cross a band or
// a consumer's 64-row half.
//
// ROW_SLOTS (the All-to-All reorder map): every row of a tile — its tile_n columns, a subtoken —
// goes to its own slot of a (slots x tile_n) buffer, slot = row_slots[tile index x 128 + row in
// the tile] (UINT32_MAX: not stored, rows beyond m). The host lays the slots out as contiguous
// per-group, per-destination pools from a row -> rank routing. Rows scatter, so no TMA box fits:
// the warpgroup's threads copy the shared chunk with 16-byte stores, then meet at a barrier before
// the leader's release (the generic-proxy stores are ordered by it).
//
// Wide stores (whole-tile epilogue, d_wide = 1; STANDARD when n is a multiple of 128 bytes of
// columns, TILE_ORDER, RANK_BANDS): `d` views D as 4-D, innermost first (128 bytes of columns,
// row, 128-byte column chunk, slot), the chunk dimension's stride 128 bytes, so one box (128
// bytes, box rows, every chunk of the tile's width, 1) stores a run of a warpgroup's rows across
// the whole tile from shared memory laid out [run][chunk][run's rows][128 bytes] (storer.cuh,
// wide_offset). Box rows: 64 (STANDARD, TILE_ORDER: one box per warpgroup and tile) or
// weft_gemm_band_box_rows (RANK_BANDS); slot 0 except for RANK_BANDS. Every store is one box
// instead of one per chunk: fewer TMA instructions in the epilogue, the same bytes written.
#define WEFT_GEMM_LAYOUT_STANDARD 0
#define WEFT_GEMM_LAYOUT_TILE_ORDER 1
#define WEFT_GEMM_LAYOUT_RANK_BANDS 2
#define WEFT_GEMM_LAYOUT_ROW_SLOTS 3
// PEER_REDUCE (signal-gemm III, fused GEMM + ReduceScatter): rank q of `peer_bar`'s world owns
// standard rows [q * peer_rows, (q + 1) * peer_rows) and holds them as its D (peer_rows x n,
// d_ptr). Each consumer's 64 rows of a tile are reduce-added by TMA (cp.reduce.async.bulk.tensor
// .add) into their owner's D, local or peer, through peer_maps[owner] (a tensor map per rank, in
// global memory, box as the standard D's). peer_rows is a multiple of 64, so a consumer's rows
// have one owner; rows beyond m are clipped by the owner's extent. Orderings
// (kernels/include/weft/gemm/peer_reduce.cuh): every compute CTA zeroes its share of its own D,
// then arrives on every rank's START counter; a consumer's first reduce waits until its own START
// counter holds every CTA of every rank (all D zeroed); after its last reduce completed, every CTA
// arrives on every rank's END counter, and CTA 0 waits for all of them, so when the kernel ends
// this rank's D holds the sum of every rank's rows.
#define WEFT_GEMM_LAYOUT_PEER_REDUCE 4
// PEER_ROWS (fused GEMM + All-to-All): row i of this rank's product goes to row
// (row_slots[i] & WEFT_GEMM_PEER_ROW_MASK) of rank (row_slots[i] >> WEFT_GEMM_PEER_ROW_BITS)'s D,
// a peer_rows x n row-major buffer at peer_ptrs[rank] (u64 per rank, global memory, each address
// as mapped here). row_slots holds one uint32_t per row of A (m entries; WEFT_GEMM_NO_SLOT: not
// stored). Rows scatter, so no TMA box fits: as for ROW_SLOTS the warpgroup's threads copy each
// shared chunk with 16-byte stores, local or through peer memory (n is a multiple of 16, so a
// piece never straddles n; pieces past n and rows past m are skipped). Barriers as PEER_REDUCE's,
// without the zeroing: every rank's START arrival says its stream reached the launch (so its D's
// previous contents were read); a consumer's first store waits for all of them; END as there.
#define WEFT_GEMM_LAYOUT_PEER_ROWS 5
#define WEFT_GEMM_PEER_ROW_BITS 28
#define WEFT_GEMM_PEER_ROW_MASK 0x0FFFFFFFu  // (1 << WEFT_GEMM_PEER_ROW_BITS) - 1
#define WEFT_GEMM_PEER_BAR_START 0  // counter rows of peer_bar: shape (1, 1, 2, 1)
#define WEFT_GEMM_PEER_BAR_END 1
#define WEFT_GEMM_NO_SLOT 0xFFFFFFFFu
#define WEFT_GEMM_BAND_ATOM 8u
#define WEFT_GEMM_BAND_ATOMS (WEFT_GEMM_TILE_M / WEFT_GEMM_BAND_ATOM)

WEFT_HD uint32_t weft_gemm_band_atoms(uint32_t bands, uint32_t band) {
  return WEFT_GEMM_BAND_ATOMS / bands + (band < WEFT_GEMM_BAND_ATOMS % bands ? 1u : 0u);
}
// First tile row of band `band`, and its rows.
WEFT_HD uint32_t weft_gemm_band_start(uint32_t bands, uint32_t band) {
  const uint32_t extra = WEFT_GEMM_BAND_ATOMS % bands;
  return WEFT_GEMM_BAND_ATOM * (band * (WEFT_GEMM_BAND_ATOMS / bands) + (band < extra ? band : extra));
}
WEFT_HD uint32_t weft_gemm_band_len(uint32_t bands, uint32_t band) { return WEFT_GEMM_BAND_ATOM * weft_gemm_band_atoms(bands, band); }
// Rows of a band slot (the largest band).
WEFT_HD uint32_t weft_gemm_band_rows(uint32_t bands) { return weft_gemm_band_len(bands, 0); }
// The band of tile row `row` (closed form: the first 16 % bands bands have one atom more).
WEFT_HD uint32_t weft_gemm_band_of_row(uint32_t bands, uint32_t row) {
  const uint32_t q = WEFT_GEMM_BAND_ATOMS / bands, extra = WEFT_GEMM_BAND_ATOMS % bands;
  const uint32_t atom = row / WEFT_GEMM_BAND_ATOM, long_atoms = extra * (q + 1);
  return atom < long_atoms ? atom / (q + 1) : extra + (atom - long_atoms) / q;
}
// Rows of one TMA store box: 8 x the largest power of two (<= 8) dividing every band's atoms.
WEFT_HD uint32_t weft_gemm_band_box_rows(uint32_t bands) {
  if (WEFT_GEMM_BAND_ATOMS % bands != 0) return WEFT_GEMM_BAND_ATOM;
  uint32_t g = WEFT_GEMM_BAND_ATOMS / bands;
  while (g > 8u) g /= 2u;
  return WEFT_GEMM_BAND_ATOM * g;
}
// The first order of wave group `group` (count 0: one group of every order).
WEFT_HD uint32_t weft_gemm_group_start(const weft_gemm_wave_groups* g, uint32_t group) {
  return (g->count == 0 || group == 0) ? 0u : g->end_order[group - 1];
}
// Where the bands of the tile of `order` go (RANK_BANDS): band r to slot first + r * stride. The
// kernel computes it once per tile (the group search reads the parameters).
typedef struct weft_gemm_band_slots {
  uint32_t first;  // slot of band 0
  uint32_t stride; // slots between consecutive bands: the group's order count
} weft_gemm_band_slots;
// The same, searching the group from `from` (weft_gemm_group_of_from; 0 searches them all).
WEFT_HD weft_gemm_band_slots weft_gemm_band_slots_from(weft_gemm_schedule s, const weft_gemm_wave_groups* g,
                                                        uint32_t bands, uint32_t order, uint32_t from) {
  const uint32_t group = g->count == 0 ? 0u : weft_gemm_group_of_from(g, order, from);
  const uint32_t start = weft_gemm_group_start(g, group);
  const uint32_t end = g->count == 0 ? weft_gemm_order_count(s) : g->end_order[group];
  weft_gemm_band_slots out;
  out.first = start * bands + (order - start);
  out.stride = end - start;
  return out;
}
WEFT_HD weft_gemm_band_slots weft_gemm_band_slots_of(weft_gemm_schedule s, const weft_gemm_wave_groups* g, uint32_t bands,
                                                      uint32_t order) {
  return weft_gemm_band_slots_from(s, g, bands, order, 0u);
}

// A TMA descriptor (CUtensorMap), encoded by the host with cuTensorMapEncodeTiled; opaque here.
typedef struct __attribute__((aligned(64))) weft_tensor_map {
  uint64_t words[16];
} weft_tensor_map;

// Fused GEMM + AllReduce (signal-gemm III, kernels/include/weft/gemm/tile_allreduce.cuh): every
// rank's GEMM stores its partial D (standard layout, bf16) in a PGL and raises the tile's flag
// (release, system scope); the tile's owner (tile index % world) waits for every rank's flag,
// sums the world partials in fp32 in rank order (so every rank gets the same bits) with peer
// loads and stores the bf16 result into every rank's output with peer stores. Run by `workers`
// CTAs: the GEMM's communicator CTAs (fused-inter) or a kernel of their own on a second stream
// (weft_gemm_tile_allreduce, DistFuse's method). After its last tile each worker arrives on every
// rank's END counter (bar, shape (1, 1, 1, 1)); worker 0 waits for world x workers x epoch.
typedef struct weft_tile_allreduce_params {
  weft_pgl_view partial;   // m x n bf16 per rank: the GEMM's output
  weft_pgl_view out;       // m x n bf16 per rank: the sum
  weft_pgl_view flags;     // uint64_t per tile (weft_gemm_tile_index) per rank
  weft_sync_counters bar;  // the END counter
  weft_gemm_schedule sched;// the GEMM's schedule: tiles in execution order
  uint64_t flag_target;    // a tile's flag in this launch (epochs rise)
  uint64_t epoch;          // this launch's END barrier epoch, from 1
  uint64_t owned_orders;   // uint32_t per tile this rank owns (tile index % world == rank), its
                           // order, ascending: listed once by the host with weft_gemm_tile_at
                           // (a walk of every order per worker costs more than the reduction)
  uint32_t owned_count;    // entries of owned_orders
  uint32_t workers;        // CTAs running the reduction
} weft_tile_allreduce_params;

// Inter-SM AllGather + GEMM (kernels/include/weft/gemm/ag_copy.cuh): the communicator CTAs copy
// the peers' A shards into `gathered` (this GPU's m x k A, the launch's `a`), one chunk of tile_m
// rows (one tile row of A) at a time, in the order the rotated schedule first reads them (from the
// shard after this rank's on), chunk j by communicator j % comm_ctas; each chunk's flag is
// released (GPU scope) at flag_target once its rows landed, and the loader waits for it before a
// tile of that row. This rank's own rows the loader reads from its own shard (ag_maps[rank]).
// The communicators start after START (every rank's shards written); END, arrived by the compute
// CTAs once their loads are done, covers the copies (every chunk was waited for by some loader).
// With comm_ctas = 0 the host copies instead (copy engines, fused AllGather's CopyEngine method):
// one copy and one flag per `flag_rows` tile rows of an owner's shard, the flag written after the
// copy by a stream memory operation (its memory barrier orders the copy's writes before it).
// The copy engines may also cut each group along K into `k_chunks` column chunks of
// `k_chunk_blocks` K blocks (the last may be shorter), one copy and one flag each: the loader then
// waits for a chunk's flag before the first K block of it, so a tile of a peer's rows starts once
// the group's first chunk has landed instead of all of it (one-wave GEMMs, where every tile starts
// at once). Flag of (group, chunk): chunk_flags[group's first tile row * k_chunks + chunk].
typedef struct weft_gemm_ag_copy {
  weft_pgl_view shards;    // every rank's A shard (ag_rows x k), as mapped on this GPU
  uint64_t gathered;       // the gathered A (m x k, row-major, this GPU): the launch's `a`
  uint64_t chunk_flags;    // uint64_t per tile row of A and K chunk, on this GPU
  uint64_t flag_target;    // a copied chunk's flag in this launch (epochs rise)
  uint32_t row_bytes;      // bytes of an A row (k x element size), a multiple of 16
  uint32_t flag_rows;      // tile rows one flag covers, from an owner's first (0 or 1: each its own)
  uint32_t k_chunks;       // flags per group along K (0 or 1: one, all of K)
  uint32_t k_chunk_blocks; // K blocks per chunk when k_chunks > 1: k_chunks = ceil(k blocks / this)
} weft_gemm_ag_copy;

// The flags of a gathered A: per tile row of A, one per K chunk (weft_gemm_ag_copy).
WEFT_HD uint32_t weft_gemm_ag_k_chunks(weft_gemm_ag_copy c) { return c.k_chunks > 1u ? c.k_chunks : 1u; }

// Kernel parameters (passed by value as a __grid_constant__, so the tensor maps' addresses can be
// given to TMA). D = alpha * A*B + beta * D (D read only when beta != 0).
typedef struct weft_gemm_params {
  weft_tensor_map a; // A, m x k row-major, box tile_k x tile_m, 128-byte swizzle
  weft_tensor_map b; // B, n x k (box tile_k x tile_n / cluster_m) or k x n (box 64 x tile_k), 128-byte swizzle
  weft_tensor_map d; // D as `layout` places it, 128-byte swizzle: STANDARD m x n row-major, box (128 bytes
                    // of columns) x 64 rows; TILE_ORDER likewise over its tile column; RANK_BANDS 3-D
                    // (columns, band rows, slots); with d_wide the 4-D view of "Wide stores" (above)
  weft_gemm_schedule sched;
  float alpha, beta;
  uint64_t d_ptr;      // D's device address (for beta and the communicator)
  uint64_t tile_flags; // 0, or uint64_t per tile (weft_gemm_tile_index): each consumer warpgroup
                       // adds 1 (release, GPU scope) once its half of the tile is stored
  uint64_t flag_target;// the value a finished tile's flag reaches in this launch (epochs rise)
  uint64_t trace;      // 0, or 2 x uint32_t per tile: order + 1 and blockIdx.x + 1 of the CTA that stored it
  uint64_t copy_dst;   // test communicator: a second m x n buffer every finished tile is copied to
  uint64_t claim_counter; // 0: static schedule. Else a uint32_t the compute CTAs claim orders from
                          // (atomicAdd - claim_base; an order >= the order count ends the CTA).
                          // Every launch adds exactly orders + ctas to it (each CTA's last claim
                          // fails once), so the host knows the next launch's base: no memset.
  uint64_t timeline;   // 0, or 2 x uint64_t %globaltimer ns: [0] min over compute CTAs of their
                       // start, [1] max of their end (after their last stores completed)
  uint64_t group_counters; // 0, or uint64_t per wave group (see weft_gemm_wave_groups)
  uint64_t row_slots;  // ROW_SLOTS: uint32_t per (tile, row): the row's slot, or WEFT_GEMM_NO_SLOT
  uint32_t comm_ctas;  // CTAs after the compute CTAs that run the communicator role
  uint32_t claim_base; // the counter's value at this launch's start (dynamic scheduling)
  uint32_t layout;     // WEFT_GEMM_LAYOUT_*: where D's tiles are stored
  uint32_t bands;      // RANK_BANDS: bands per tile (the world size, 1..=8)
  uint32_t band_box_shift;  // RANK_BANDS: log2 of weft_gemm_band_box_rows(bands)
  uint32_t d_wide;     // whole-tile epilogue only, 0 or 1: `d` is the wide view of D ("Wide stores", above the layouts)
  int32_t rank;        // the launching rank in its job (0 outside one): the rank its give-up reports name
  uint8_t band_of_box[16];  // RANK_BANDS: store box i (tile rows [i << shift, + box rows)) -> its band
  uint8_t row_of_box[16];   //             and its first row within that band (the host fills both
                            //             from the functions above: no divisions in the epilogue)
  weft_sync_bound bound; // every pipeline and flag wait
  weft_gemm_wave_groups groups; // read when group_counters != 0, and by the RANK_BANDS layout
  // PEER_REDUCE only (see above): per rank a weft_tensor_map of its D (64-byte aligned array in
  // this GPU's global memory), the rows each rank owns, the START / END barrier counters (their
  // world is the reduction's) and this launch's barrier epoch (from 1; each launch arrives once
  // at each counter, so epoch e waits for world x ctas x e arrivals).
  uint64_t peer_maps;
  uint64_t peer_ptrs;  // PEER_ROWS only: u64 per rank, its D's address as mapped here (global memory);
                       // peer_rows is then the rows of every rank's D
  uint32_t peer_rows;
  uint32_t peer_reserved;
  uint64_t peer_epoch;
  weft_sync_counters peer_bar;
  // Tile flags released at system scope (peers read them: fused AllReduce), and the
  // communicator role the communicator CTAs run (WEFT_GEMM_COMM_*).
  uint32_t flags_sys;
  uint32_t comm_op;
  // Fused AllGather + GEMM (kernels/include/weft/gemm/peer_reduce.cuh has its barriers): A is
  // sharded by rows over peer_bar's ranks, rank q holding rows [q * ag_rows, + ag_rows) in its
  // PGL; the loader reads each A tile from its owner through ag_maps[owner] (a tensor map per
  // rank, global memory, box as `a`'s), waiting once, before its first peer load, for every CTA
  // of every rank to have arrived at START (their shards written). ag_rows is a multiple of
  // tile_m. 0: A is `a`. With comm_op ALLGATHER only this rank's rows come from ag_maps[rank],
  // the others from `a`, the copy the communicators gather (weft_gemm_ag_copy).
  uint64_t ag_maps;
  uint32_t ag_rows;
  uint32_t ag_reserved;
  weft_tile_allreduce_params allreduce;  // comm_op ALLREDUCE
  weft_gemm_ag_copy ag_copy;             // comm_op ALLGATHER
  // Split-K (sched.k_splits > 1, "Split-K" above): split_partials holds, per (tile index,
  // consumer, split < S - 1), that consumer's fp32 accumulators (WEFT_GEMM_TILE_M / 2 x tile_n floats,
  // as float4 j of thread i at [j x 128 + i]); split_flags a uint64_t per (tile index, consumer)
  // that each earlier split adds 1 to (release, GPU scope) once its partial is written and the
  // last split resets to 0 once it has read them (launches are stream-ordered): 0 between launches.
  uint64_t split_partials;
  uint64_t split_flags;
} weft_gemm_params;
#define WEFT_GEMM_COMM_TILE_COPY 0   // the test communicator (copy_dst)
#define WEFT_GEMM_COMM_ALLREDUCE 1   // fused-inter GEMM + AllReduce
#define WEFT_GEMM_COMM_ALLGATHER 2   // fused-inter AllGather + GEMM

// Post-communication reorder (kernels/gemm/restore.cu): a buffer of slots in execution order ->
// the standard row-major layout, bit for bit, optionally fused with a residual add or an RMSNorm.
// slot_of_tile[tm * tiles_n + tn] is the order of that tile (the host lists it from
// weft_gemm_tile_at). Output row i comes from tile row i / tile_rows, row i % tile_rows of that
// tile's slot, and a slot holds slot_rows x tile_n elements. TILE_ORDER: tile_rows = slot_rows =
// tile_m, m rows. A ReduceScatter's received bands (band r of the tile of order o in slot o):
// tile_rows = weft_gemm_band_len(r), slot_rows = weft_gemm_band_rows, m = rank r's row count.
#define WEFT_GEMM_RESTORE_COPY 0      // dst = src (any 2- or 4-byte dtype: raw 16-byte vectors)
#define WEFT_GEMM_RESTORE_ADD 1       // dst = bf16(src + residual), fp32 add
#define WEFT_GEMM_RESTORE_RMSNORM 2   // x = src (+ residual); dst = bf16(x * rsqrt(mean(x^2) + eps) * gamma)
typedef struct weft_gemm_restore_params {
  uint64_t src;          // TILE_ORDER buffer (order count x tile_m x tile_n elements)
  uint64_t dst;          // m x n row-major
  uint64_t residual;     // 0 or m x n bf16 (ADD: required; RMSNORM: optional)
  uint64_t gamma;        // RMSNORM: n bf16
  uint64_t slot_of_tile; // uint32_t per tile, row-major tile index -> order
  uint32_t m, n;         // the output: m rows of n
  uint32_t tile_n;       // columns of a tile and of a slot
  uint32_t tiles_n;      // tiles per tile row (of the GEMM's n)
  uint32_t tile_rows;    // output rows per tile row
  uint32_t slot_rows;    // rows of a slot
  uint32_t elem_bytes;   // COPY: 2 or 4; ADD and RMSNORM: 2 (bf16)
  uint32_t op;           // WEFT_GEMM_RESTORE_*
  float eps;             // RMSNORM
  uint32_t reserved;
} weft_gemm_restore_params;

// The All-to-All's post-communication step (kernels/gemm/restore.cu, weft_gemm_slot_scatter):
// received subtoken i (tile_n elements at src + i x tile_n) goes to row dst_of_slot[2i] of the
// output, columns from dst_of_slot[2i + 1] x tile_n (those below n), as raw 16-byte vectors.
typedef struct weft_gemm_slot_scatter_params {
  uint64_t src;          // slots x tile_n elements
  uint64_t dst;          // rows x n, row-major
  uint64_t dst_of_slot;  // 2 x uint32_t per slot: output row, tile column
  uint32_t slots, n, tile_n, elem_bytes;
} weft_gemm_slot_scatter_params;

// The All-to-All's sequential path (kernels/gemm/restore.cu, weft_gemm_row_gather): output row i
// is row src_rows[i] of src, as raw 16-byte vectors (n x elem_bytes is a multiple of 16: n is a
// multiple of 16 elements). Gathers each destination's rows into one contiguous send range.
typedef struct weft_gemm_row_gather_params {
  uint64_t src;       // m x n, row-major
  uint64_t dst;       // rows x n, row-major
  uint64_t src_rows;  // uint32_t per output row, each below m
  uint32_t rows, n, elem_bytes, reserved;
} weft_gemm_row_gather_params;

// The wave-group wait kernel (kernels/gemm/group_wait.cu): 1 thread on the communication stream
// spins (acquire, GPU scope, bounded) until a group's counter reaches `target`, then rearms it to
// 0 for the next launch. It is the counter's only reader; the next GEMM launch must be ordered
// after it (the overlap orchestration joins the streams), so no memset is ever needed.
typedef struct weft_gemm_group_wait_params {
  uint64_t counter; // device address of the group's uint64_t counter
  uint64_t target;  // WEFT_GEMM_CONSUMERS x the group's order count
  uint32_t group;   // for the report
  uint32_t rank;    // for the report
  weft_sync_bound bound;
} weft_gemm_group_wait_params;

// The copy-engine All-to-All's flag wait (kernels/gemm/peer_flags.cu): a row of `world` flags on
// this rank, flag i written (to 1) by rank i's stream after its copies into this rank's buffer
// (row 0, "ready") or after it consumed this rank's copies (row 1, "free"). Thread i != rank spins
// (acquire, system scope, bounded) until flag i is 1, then rearms it to 0: the flag's only reader,
// and its writer writes it again only after this rank's next acknowledgement, which the host
// orders after this wait (crates/signal-gemm/src/overlap/all_to_all_ce.rs).
typedef struct weft_gemm_peer_flags_params {
  uint64_t flags;    // device address of this rank's row: world uint64_t
  uint32_t world;    // at most 32
  uint32_t rank;
  uint32_t row;      // for the report: 0 ready, 1 free
  uint32_t reserved;
  weft_sync_bound bound;
} weft_gemm_peer_flags_params;

// The row-slots layout's table check (kernels/gemm/row_slots_check.cu), launched before every
// ROW_SLOTS GEMM on its stream: the table is the caller's, and an entry at or past D's slots
// (other than WEFT_GEMM_NO_SLOT) is reported (WEFT_SYNC_STATUS_BAD_INDEX, role GEMM_ROW_SLOTS,
// coord (0, 0, tile index, row in tile), expected = slots, observed = the entry) and traps, so the GEMM never runs
// with it. Kept out of the GEMM's storer: the check there cost the consumers registers.
typedef struct weft_gemm_row_slots_check_params {
  uint64_t table;    // device address of `entries` uint32_t: tile index x 128 + row -> slot
  uint64_t entries;
  uint32_t slots;    // D's slots
  int32_t rank;      // for the report
  weft_sync_bound bound;
} weft_gemm_row_slots_check_params;
