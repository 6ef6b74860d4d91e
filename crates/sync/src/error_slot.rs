//! The error slot: where a device wait that ran past its budget records what it saw before it
//! traps. It lives in pinned host memory mapped into the device (portable, so any context of the
//! process can use it), which stays readable after the trap has ended the kernel's context.

use crate::error::{DeviceFailure, KernelEnd, SyncError};

use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;
use weft_kernels::abi::{self, weft_error_slot};

/// One rank's error slot (RAII: freed on drop, in the context that allocated it).
pub struct ErrorSlot {
    host: *mut weft_error_slot,
    ctx: Arc<CudaContext>,
    clock_khz: u32,
}

// SAFETY: the pointer is to pinned host memory owned by this value; reads and writes are volatile
// copies of a plain-old-data struct.
unsafe impl Send for ErrorSlot {}
unsafe impl Sync for ErrorSlot {}

impl ErrorSlot {
    /// Allocates a cleared slot with `ctx` current (cuMemHostAlloc, PORTABLE | DEVICEMAP). Use the
    /// rank's long-lived context: the slot must outlive any throwaway context that traps on it.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, SyncError> {
        ctx.bind_to_thread().map_err(SyncError::setup(
            "binding the context for the sync error slot",
        ))?;
        let clock_khz = crate::budget::sm_clock_khz(ctx)?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a fresh allocation of the struct's size; cleared below before any use.
        let host = unsafe { result::malloc_host(std::mem::size_of::<weft_error_slot>(), flags) }
            .map_err(SyncError::setup(
                "allocating the sync error slot (cuMemHostAlloc, portable + device-mapped)",
            ))? as *mut weft_error_slot;
        let slot = Self {
            host,
            ctx: ctx.clone(),
            clock_khz,
        };
        slot.clear();
        Ok(slot)
    }

    /// The slot's device address as seen by kernels of `ctx` (any context of this process).
    pub fn device_ptr(&self, ctx: &Arc<CudaContext>) -> Result<u64, SyncError> {
        ctx.bind_to_thread().map_err(SyncError::setup(
            "binding the context for the sync error slot",
        ))?;
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, self.host as *mut _, 0) }
            .result()
            .map_err(SyncError::setup(
                "cuMemHostGetDevicePointer on the sync error slot",
            ))?;
        Ok(dptr)
    }

    /// The SM clock (kHz) of the device the slot was made for, used to express cycles as time.
    pub fn clock_khz(&self) -> u32 {
        self.clock_khz
    }

    /// A snapshot of the slot.
    pub fn read(&self) -> weft_error_slot {
        // SAFETY: valid, aligned, pinned; the device may write it concurrently, hence volatile.
        unsafe { std::ptr::read_volatile(self.host) }
    }

    /// Clears the slot. Only while no kernel that may report into it is running.
    pub fn clear(&self) {
        // SAFETY: as in read().
        unsafe { std::ptr::write_volatile(self.host, weft_error_slot::default()) }
    }

    /// The recorded failure as a message, if any.
    pub fn report(&self) -> Option<String> {
        describe(&self.read(), self.clock_khz)
    }

    /// The recorded failure, typed; None when nothing was recorded.
    pub fn failure(&self) -> Option<DeviceFailure> {
        DeviceFailure::from_slot(self.read(), self.clock_khz)
    }

    /// Err with the recorded failure (kind, rank, primitive, coordinate, expected, observed, bound).
    pub fn check(&self) -> Result<(), SyncError> {
        match self.failure() {
            Some(f) => Err(SyncError::Device {
                failures: vec![f],
                end: KernelEnd::NotWaited,
            }),
            None => Ok(()),
        }
    }
}

impl Drop for ErrorSlot {
    fn drop(&mut self) {
        let freed = self
            .ctx
            .bind_to_thread()
            .and_then(|()| unsafe { result::free_host(self.host as *mut _) });
        if let Err(e) = freed {
            log::error!("freeing the error slot: {e}");
        }
    }
}

/// The primitive's name for messages.
pub fn primitive_name(id: i32) -> &'static str {
    match id as u32 {
        abi::WEFT_SYNC_PRIM_WAIT => "wait",
        abi::WEFT_SYNC_PRIM_BARRIER => "barrier",
        abi::WEFT_SYNC_PRIM_SIGNAL => "signal",
        abi::WEFT_SYNC_PRIM_WAIT_GPU => "wait_gpu",
        abi::WEFT_SYNC_PRIM_BARRIER_GPU => "barrier_gpu",
        abi::WEFT_SYNC_PRIM_MBARRIER_WAIT => "mbarrier wait",
        abi::WEFT_SYNC_PRIM_WAIT_UNORDERED => "unordered wait",
        abi::WEFT_SYNC_PRIM_WAVE_GROUP => "wave-group wait (b = group)",
        abi::WEFT_SYNC_PRIM_GEMM_ROW_SLOTS => {
            "GEMM row-slots table check (row = tile index, col = row in the tile)"
        }
        abi::WEFT_SYNC_PRIM_GEMM_SPLIT_K => {
            "GEMM split-K partials wait (d = consumer, row = tile row, col = tile column)"
        }
        _ => "unknown primitive",
    }
}

/// The name of the kernel part a report comes from (`weft_error_slot.role`, WEFT_ROLE_*); None for
/// a kernel without roles.
pub fn role_name(role: u32) -> Option<&'static str> {
    Some(match role {
        abi::WEFT_ROLE_NONE => return None,
        abi::WEFT_ROLE_GEMM_LOADER => "GEMM loader",
        abi::WEFT_ROLE_GEMM_CONSUMER => "GEMM consumer",
        abi::WEFT_ROLE_GEMM_COMMUNICATOR => "GEMM communicator",
        abi::WEFT_ROLE_GEMM_SIGNALLER => "GEMM signaller",
        abi::WEFT_ROLE_GEMM_ALLREDUCE => "GEMM AllReduce communicator",
        abi::WEFT_ROLE_GEMM_ROW_SLOTS => "GEMM row-slots check",
        abi::WEFT_ROLE_GEMM_PEER_BARRIER => "GEMM peer barrier",
        abi::WEFT_ROLE_GEMM_SETUP => "GEMM kernel entry",
        _ => "unknown role",
    })
}

fn ms(cycles: u64, clock_khz: u32) -> f64 {
    cycles as f64 / clock_khz.max(1) as f64
}

/// A slot's content as a message; None when nothing was recorded.
pub fn describe(s: &weft_error_slot, clock_khz: u32) -> Option<String> {
    let at = format!(
        "(b {}, d {}, row {}, col {})",
        s.coord.b, s.coord.d, s.coord.r, s.coord.c
    );
    let prim = primitive_name(s.primitive);
    let whence = format!("[block {}, thread {}, SM {}]", s.block, s.thread, s.smid);
    // "rank 1" or "rank 1 (GEMM loader)": who gave up.
    let who = match role_name(s.role) {
        Some(role) => format!("rank {} ({role})", s.rank),
        None => format!("rank {}", s.rank),
    };
    match s.status as u32 {
        abi::WEFT_SYNC_STATUS_NONE => None,
        abi::WEFT_SYNC_STATUS_TIMEOUT => Some(format!(
            "{who}: sync {prim} timed out at counter {at} of rank {}: expected >= {}, observed {} after {} cycles \
             ({:.3} ms by the GPU timer); bound {} cycles = {:.3} ms at {} MHz {whence}",
            s.target_rank,
            s.expected,
            s.observed,
            s.elapsed_cycles,
            s.elapsed_ns as f64 / 1e6,
            s.budget_cycles,
            ms(s.budget_cycles, clock_khz),
            clock_khz / 1000,
        )),
        abi::WEFT_SYNC_STATUS_BAD_COORD => Some(format!(
            "{who}: sync {prim} was given counter {at} of rank {}, outside the counter layout (coordinate past the \
             shape, rank outside the job, unmapped buffer or counters that are not 8-byte) {whence}",
            s.target_rank
        )),
        abi::WEFT_SYNC_STATUS_BAD_INDEX => Some(format!(
            "{who}: {prim} read entry {at} of a table: it holds {}, but what it indexes has only {} (no store \
             was made past it) {whence}",
            s.observed, s.expected
        )),
        abi::WEFT_SYNC_STATUS_SMEM => Some(format!(
            "{who}: kernel launched with {} bytes of dynamic shared memory, needs {} (host and kernel disagree on \
             the layout: a build bug) {whence}",
            s.observed, s.expected
        )),
        abi::WEFT_SYNC_STATUS_WRITING => Some(format!(
            "{who}: a sync {prim} began recording a failure at counter {at} but the kernel stopped before it \
             finished (fields may be partial) {whence}"
        )),
        other => Some(format!("sync error slot holds unknown status {other} (memory corrupted?)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_kernels::abi::weft_tile_coord;

    fn timed_out() -> weft_error_slot {
        weft_error_slot {
            status: abi::WEFT_SYNC_STATUS_TIMEOUT as i32,
            primitive: abi::WEFT_SYNC_PRIM_WAIT as i32,
            rank: 2,
            target_rank: 2,
            coord: weft_tile_coord {
                b: 0,
                d: 1,
                r: 3,
                c: 5,
            },
            expected: 17,
            observed: 12,
            elapsed_cycles: 198_000_123,
            budget_cycles: 198_000_000,
            elapsed_ns: 100_200_000,
            block: 0,
            thread: 0,
            smid: 4,
            role: 0,
        }
    }

    #[test]
    fn empty_slot_is_no_error() {
        assert_eq!(describe(&weft_error_slot::default(), 1_980_000), None);
    }

    #[test]
    fn timeout_names_rank_primitive_coordinate_values_and_bound() {
        let msg = describe(&timed_out(), 1_980_000).unwrap();
        for part in [
            "rank 2: sync wait timed out",
            "counter (b 0, d 1, row 3, col 5) of rank 2",
            "expected >= 17, observed 12",
            "after 198000123 cycles (100.200 ms by the GPU timer)",
            "bound 198000000 cycles = 100.000 ms at 1980 MHz",
            "[block 0, thread 0, SM 4]",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
    }

    #[test]
    fn other_statuses_and_primitives() {
        let mut s = timed_out();
        s.status = abi::WEFT_SYNC_STATUS_BAD_COORD as i32;
        s.primitive = abi::WEFT_SYNC_PRIM_SIGNAL as i32;
        let msg = describe(&s, 1_980_000).unwrap();
        assert!(
            msg.starts_with(
                "rank 2: sync signal was given counter (b 0, d 1, row 3, col 5) of rank 2, outside"
            ),
            "{msg}"
        );
        s.status = abi::WEFT_SYNC_STATUS_BAD_INDEX as i32;
        s.primitive = abi::WEFT_SYNC_PRIM_GEMM_ROW_SLOTS as i32;
        let msg = describe(&s, 1_980_000).unwrap();
        assert!(
            msg.starts_with("rank 2: GEMM row-slots table check (row = tile index, col = row in the tile) read entry (b 0, d 1, row 3, col 5) of a table: it holds 12, but what it indexes has only 17"),
            "{msg}"
        );
        s.status = abi::WEFT_SYNC_STATUS_WRITING as i32;
        assert!(describe(&s, 1).unwrap().contains("fields may be partial"));
        s.status = 99;
        assert!(describe(&s, 1).unwrap().contains("unknown status 99"));
        assert_eq!(
            primitive_name(abi::WEFT_SYNC_PRIM_BARRIER as i32),
            "barrier"
        );
        assert_eq!(primitive_name(-1), "unknown primitive");
    }

    #[test]
    fn a_role_is_named_beside_the_rank() {
        let mut s = timed_out();
        s.primitive = abi::WEFT_SYNC_PRIM_MBARRIER_WAIT as i32;
        s.role = abi::WEFT_ROLE_GEMM_LOADER;
        let msg = describe(&s, 1_980_000).unwrap();
        assert!(
            msg.starts_with("rank 2 (GEMM loader): sync mbarrier wait timed out"),
            "{msg}"
        );
        s.status = abi::WEFT_SYNC_STATUS_SMEM as i32;
        s.role = abi::WEFT_ROLE_GEMM_SETUP;
        let msg = describe(&s, 1_980_000).unwrap();
        assert!(
            msg.starts_with("rank 2 (GEMM kernel entry): kernel launched with 12 bytes"),
            "{msg}"
        );
        // Every role the header defines has its own name; an unknown one says so.
        let roles = [
            abi::WEFT_ROLE_GEMM_LOADER,
            abi::WEFT_ROLE_GEMM_CONSUMER,
            abi::WEFT_ROLE_GEMM_COMMUNICATOR,
            abi::WEFT_ROLE_GEMM_SIGNALLER,
            abi::WEFT_ROLE_GEMM_ALLREDUCE,
            abi::WEFT_ROLE_GEMM_ROW_SLOTS,
            abi::WEFT_ROLE_GEMM_PEER_BARRIER,
            abi::WEFT_ROLE_GEMM_SETUP,
        ];
        let names: std::collections::BTreeSet<_> =
            roles.iter().map(|r| role_name(*r).unwrap()).collect();
        assert_eq!(names.len(), roles.len());
        assert!(!names.contains("unknown role"));
        assert_eq!(role_name(abi::WEFT_ROLE_NONE), None);
        assert_eq!(role_name(999), Some("unknown role"));
    }

    #[test]
    fn slot_layout_matches_the_header() {
        // 4 x i32 + coord (16) + 5 x u64 + 4 x u32 = 88 bytes, 8-aligned.
        assert_eq!(std::mem::size_of::<weft_error_slot>(), 88);
        assert_eq!(std::mem::align_of::<weft_error_slot>(), 8);
    }
}
