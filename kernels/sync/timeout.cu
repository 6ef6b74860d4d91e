// A wait for a signal nobody sends: the bounded wait must give up after its cycle budget, record
// rank, primitive, coordinate, expected and observed value in the error slot, and trap. Run it in
// a throwaway context (the trap ends the context it runs in).
#include "weft/sync.cuh"
#include "weft/abi/sync_checks.h"

using namespace weft::sync;

// Grid: one block of 32 threads; thread 0 waits.
extern "C" __global__ void weft_sync_missing_signal(const __grid_constant__ weft_timeout_params p) {
  if (threadIdx.x != 0) return;
  wait(p.counters, p.coord, p.counters.view.rank, p.expected);
}
