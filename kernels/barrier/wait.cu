// The KernelBarrier wait kernel (crates/barrier): 1 block, 1 thread, enqueued on the compute
// stream before the compute kernel. It spins on a relaxed load until the counter reaches the
// target; the compute kernel starts when it exits (stream order), or as soon as the target is
// reached when it was launched for early release (weft::kernel_barrier_release_next). No data is
// handed over, so no acquire is needed. Bounded: past its cycle budget it fills the report and returns (no trap: the
// context must stay usable); the host turns the report into an error.
#include <stdint.h>
#include "weft/sync/clock.cuh"
#include "weft/barrier/kernel_barrier.cuh"

namespace {

using weft::sync::globaltimer_ns;

}  // namespace

extern "C" __global__ void __launch_bounds__(1, 1) weft_kernel_barrier_wait(const __grid_constant__ weft_kernel_barrier_wait_params p) {
  const uint64_t c0 = clock64();
  int32_t seen = weft::kernel_barrier_load(weft::kernel_barrier_counter(p.view));  // often already reached (comm started first)
  const uint64_t t0 = globaltimer_ns();
  while (seen < p.target) {
    const uint64_t spent = clock64() - c0;
    if (spent > p.budget_cycles) {
      volatile weft_kernel_barrier_report* r = reinterpret_cast<volatile weft_kernel_barrier_report*>(p.report);
      if (r->status == WEFT_KERNEL_BARRIER_STATUS_NONE) {  // keep the first failure
        r->target = p.target;
        r->observed = seen;
        r->elapsed_ns = globaltimer_ns() - t0;
        r->elapsed_cycles = spent;
        r->budget_cycles = p.budget_cycles;
        __threadfence_system();  // the fields before the status (the host reads after a sync anyway)
        r->status = WEFT_KERNEL_BARRIER_STATUS_TIMEOUT;
      }
      weft::kernel_barrier_release_next();  // the compute kernel then runs unordered (reported)
      return;
    }
    seen = weft::kernel_barrier_load(weft::kernel_barrier_counter(p.view));
  }
  if (p.exit_stamp != 0) *reinterpret_cast<uint64_t*>(p.exit_stamp) = globaltimer_ns();
  weft::kernel_barrier_release_next();  // after the stamp: the hand-off is not understated
}
