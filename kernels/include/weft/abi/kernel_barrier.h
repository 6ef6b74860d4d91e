// KernelBarrier (crates/barrier): communication kernels arrive on a device int32 counter when they
// start; a 1-block, 1-thread wait kernel on the compute stream spins until the counter reaches a
// target, so the compute kernel queued behind it cannot take the SMs the communication kernels
// need. Plain C (bindgen reads it); the device side is weft/barrier/kernel_barrier.cuh.
#pragma once
#include <stdint.h>

// weft_kernel_barrier_report.status. The host clears the report to NONE.
#define WEFT_KERNEL_BARRIER_STATUS_NONE 0
#define WEFT_KERNEL_BARRIER_STATUS_TIMEOUT 1  // a wait ran past its cycle budget and returned

// What communication kernels take (by value): the counter they arrive on. A counter of 0 means
// "no barrier": arrive does nothing.
typedef struct weft_kernel_barrier_view {
  uint64_t counter;  // device address: int32
} weft_kernel_barrier_view;

// What a wait that gave up saw. Lives in host-mapped pinned memory; the wait kernel writes it and
// returns (no trap, so the context stays usable) and the host turns it into an error.
typedef struct weft_kernel_barrier_report {
  int32_t status;          // WEFT_KERNEL_BARRIER_STATUS_*
  int32_t target;          // the count the counter had to reach (>=)
  int32_t observed;        // the counter's last value read
  int32_t reserved;
  uint64_t elapsed_ns;     // %globaltimer nanoseconds spent polling
  uint64_t elapsed_cycles; // clock64 cycles spent polling
  uint64_t budget_cycles;  // the bound it ran under
} weft_kernel_barrier_report;

// The wait kernel's parameters.
typedef struct weft_kernel_barrier_wait_params {
  weft_kernel_barrier_view view;
  int32_t target;
  int32_t reserved;
  uint64_t budget_cycles;  // SM clock cycles the wait may poll
  uint64_t report;         // device address of a weft_kernel_barrier_report (host-mapped)
  uint64_t exit_stamp;     // optional (0: none): device address where the wait writes its exit
                           // %globaltimer, to measure the hand-off to the next kernel
} weft_kernel_barrier_wait_params;
