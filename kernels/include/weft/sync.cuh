// weft's device synchronization primitives (crates/sync/README.md): include this from a kernel.
//
//   signal(bar, coord, dst_rank, val)   release add on dst_rank's counter      (signal.cuh)
//   signal_all(bar, coord, val)         release add on every rank's counter    (signal.cuh)
//   publish(bar, coord, dst_rank, v)    release store of a monotone value      (signal.cuh)
//   wait(bar, coord, rank, expected)    bounded acquire poll until >= expected (wait.cuh)
//   barrier(bar, coord, epoch)          all ranks, epoch-numbered              (barrier.cuh)
//   signal_gpu / wait_gpu / barrier_gpu the same between SMs of one GPU (.gpu scope)
//
// `bar` is a weft_sync_counters (weft/abi/sync.h) passed to the kernel by value; the host side
// (crates/sync: Counters) allocates it through pgl and tracks its epochs.
#pragma once
#include "weft/abi/sync.h"
#include "weft/sync/barrier.cuh"
#include "weft/sync/clock.cuh"
#include "weft/sync/counter.cuh"
#include "weft/sync/error.cuh"
#include "weft/sync/mbarrier_wait.cuh"
#include "weft/sync/memory_order.cuh"
#include "weft/sync/signal.cuh"
#include "weft/sync/wait.cuh"
