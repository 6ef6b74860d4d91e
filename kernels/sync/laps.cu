// Barrier laps with random per-rank delays: nobody passes barrier k before every rank arrived.
//
// Block b runs its own barrier at counter (0, 0, 0, b). Lap k (global epoch e = first_lap + k + 1):
//   spin a random delay (weft_laps_delay_ns: different per rank, block and lap)
//   write e into seen[b][rank] on every rank (plain stores to peer memory)
//   barrier(e)                      -- release: the stores above precede this rank's arrival
//   read seen[b][p] for every p     -- after the acquire: must be e or e + 1
// A value below e means rank p had not arrived (or its store was not visible) when this rank
// passed; above e + 1 means p passed barrier e + 1 before this rank arrived at it.
#include "weft/pgl/view.cuh"
#include "weft/sync.cuh"
#include "weft/abi/sync_checks.h"

using namespace weft::sync;

// Grid: one block per barrier coordinate (all resident); thread 0 of each block runs the laps.
extern "C" __global__ void weft_sync_laps(const __grid_constant__ weft_laps_params p) {
  if (threadIdx.x != 0) return;
  const int32_t rank = p.barrier.view.rank, world = p.barrier.view.world;
  const uint32_t b = blockIdx.x;
  auto* out = reinterpret_cast<weft_laps_result*>(p.result);
  const weft_tile_coord at = coord4(0, 0, 0, b);
  uint64_t violations = 0, checks = 0, delayed = 0;
  for (uint32_t k = 0; k < p.laps; ++k) {
    const uint64_t e = p.first_lap + k + 1;
    const uint64_t t0 = globaltimer_ns();
    spin_ns(weft_laps_delay_ns(p.seed, e, uint32_t(rank), b, p.max_delay_ns));
    delayed += globaltimer_ns() - t0;
    for (int32_t r = 0; r < world; ++r) {
      mo::st_relaxed_sys(weft::pgl::element<uint64_t>(p.seen, r, 0, 0, b, uint32_t(rank)), e);
    }
    barrier(p.barrier, at, e);
    const uint64_t* mine = weft::pgl::element<const uint64_t>(p.seen, rank, 0, 0, b, 0);
    for (int32_t q = 0; q < world; ++q) {
      const uint64_t v = mo::ld_relaxed_sys(mine + q);  // peers may be writing e + 1 concurrently
      ++checks;
      if (v < e || v > e + 1) {
        ++violations;
        if (atomicCAS(&out->bad_claimed, 0u, 1u) == 0u) {
          out->bad_lap = e;
          out->bad_seen = v;
          out->bad_block = int32_t(b);
          out->bad_peer = q;
        }
      }
    }
  }
  atomicAdd(reinterpret_cast<unsigned long long*>(&out->violations), violations);
  atomicAdd(reinterpret_cast<unsigned long long*>(&out->checks), checks);
  atomicAdd(reinterpret_cast<unsigned long long*>(&out->delay_ns), delayed);
}
