//! The deliberately missing signal (`kernels/sync/timeout.cu`), run in a throwaway context: its
//! wait must give up after the budget, fill the error slot and trap. A trap leaves every context
//! of its process unusable on driver 580, so callers run this in a process of its own (the
//! harness uses a child process).

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use std::time::{Duration, Instant};
use weft_kernels::abi::{
    weft_error_slot, weft_pgl_view, weft_sync_bound, weft_sync_counters, weft_tile_coord,
    weft_timeout_params,
};
use weft_kernels::cubins;
use weft_pgl::Shape;
use weft_sync::launch::{load, sync_checked};
use weft_sync::{ErrorSlot, SyncError, WaitBudget};

/// What waiting for a signal nobody sends did.
pub struct MissingSignal {
    /// The error the host got (sync_checked: the slot's failure, typed, and the driver's
    /// error), or None if the kernel completed, which would be a bug.
    pub error: Option<SyncError>,
    /// The slot as the trapping thread left it.
    pub slot: weft_error_slot,
    /// Host time from the launch to the error.
    pub wall: Duration,
}

/// In a new non-primary context on device `ordinal`: counters of `shape` holding `values` (this
/// rank's buffer only, as a view of `world` ranks where only `rank`'s is mapped), one thread waiting
/// for the counter at `coord` to reach `expected`, bounded by `budget`. `slot` must be allocated in
/// another (long-lived) context; it is cleared first.
#[allow(clippy::too_many_arguments)]
pub fn run_missing_signal(
    ordinal: usize,
    rank: usize,
    world: usize,
    slot: &ErrorSlot,
    shape: Shape,
    values: &[u64],
    coord: weft_tile_coord,
    expected: u64,
    budget: WaitBudget,
) -> anyhow::Result<MissingSignal> {
    anyhow::ensure!(
        values.len() as u64 == shape.elems(),
        "{} values for a shape of {} elements",
        values.len(),
        shape.elems()
    );
    slot.clear();
    let ctx = CudaContext::new_non_primary(ordinal, 0)?;
    // SAFETY: one stream, synchronised explicitly below.
    unsafe { ctx.disable_event_tracking() };
    let outcome = (|| -> anyhow::Result<MissingSignal> {
        let stream = ctx.new_stream()?;
        let func = load(&ctx, &cubins::SYNC_TIMEOUT, "weft_sync_missing_signal")?;
        let counters = stream.clone_htod(values)?;
        let mut base = [0u64; weft_kernels::abi::WEFT_PGL_MAX_RANKS as usize];
        base[rank] = cudarc::driver::DevicePtr::device_ptr(&counters, &stream).0;
        let view = weft_pgl_view {
            base,
            shape: shape.raw(),
            rank: rank as i32,
            world: world as i32,
            elem_bytes: 8,
            reserved: 0,
        };
        let params = weft_timeout_params {
            counters: weft_sync_counters {
                view,
                bound: weft_sync_bound {
                    error_slot: slot.device_ptr(&ctx)?,
                    budget_cycles: budget.cycles,
                },
            },
            coord,
            expected,
        };
        stream.synchronize()?;
        let start = Instant::now();
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the counters outlive the launch (synchronised below); the slot outlives the context.
        unsafe { stream.launch_builder(&func).arg(&params).launch(cfg)? };
        let error = sync_checked(&stream, &[slot]).err();
        Ok(MissingSignal {
            error,
            slot: slot.read(),
            wall: start.elapsed(),
        })
    })();
    // The context (and everything in it) is destroyed here; the slot lives on in its own.
    drop(ctx);
    outcome
}
