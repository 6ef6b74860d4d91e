//! `Counters`: a pgl-allocated layout of u64 counters on every rank, its error slot, its wait
//! bound and its epoch — everything a kernel's `weft_sync_counters` argument is built from.

use crate::budget::WaitBudget;
use crate::epoch::Epoch;
use crate::error::SyncError;
use crate::error_slot::ErrorSlot;
use cudarc::driver::{result, CudaContext, CudaStream};
use std::sync::Arc;
use weft_kernels::abi::{weft_sync_bound, weft_sync_counters};
use weft_pgl::Bootstrap;
use weft_pgl::{agree, Backend, Pgl, Shape};

/// Signal counters on every rank, this rank's error slot and the waits' budget.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cudarc::driver::CudaContext;
/// use weft_pgl::{gpu, rank_env::RankEnv, rendezvous::Rendezvous};
/// # fn main() -> anyhow::Result<()> {
/// // One process per GPU, started by `weft launch -n N --`, mpirun, srun or torchrun.
/// let env = RankEnv::from_env()?;
/// let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
/// let ctx = CudaContext::new(gpu::device_for_rank(&env, CudaContext::device_count()? as usize)?)?;
/// use weft_pgl::Shape;
/// use weft_sync::{sync_checked, Counters, WaitBudget};
/// // Collective: one counter per rank, waits bounded by the default budget.
/// let mut bar = Counters::alloc(&mut rdzv, &ctx, Shape::new(1, 1, 1, 1), WaitBudget::default_for(&ctx)?)?;
/// let _target = bar.begin(1); // this launch's epoch base: targets grow, no memsets
/// let _counters = bar.device()?; // the weft_sync_counters argument of your kernel
/// let stream = ctx.new_stream()?;
/// // ... launch a kernel that includes <weft/sync.cuh> and signals / waits on `_counters` ...
/// sync_checked(&stream, &[bar.slot()])?; // a wait that gave up: an error naming what it waited for
/// bar.free(&mut rdzv)?;
/// # Ok(()) }
/// ```
pub struct Counters {
    pgl: Pgl<u64>,
    slot: ErrorSlot,
    budget: WaitBudget,
    epoch: Epoch,
}

impl Counters {
    /// Collective: zeroed counters of `shape` on every rank (pgl's default backend), this rank's
    /// error slot, and waits bounded by `budget`.
    pub fn alloc(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        shape: Shape,
        budget: WaitBudget,
    ) -> Result<Self, SyncError> {
        let slot = agree(
            rdzv,
            "sync error slot",
            ErrorSlot::new(ctx).map_err(anyhow::Error::new),
        )
        .map_err(SyncError::setup("making every rank's sync error slot"))?;
        let pgl = Pgl::alloc(rdzv, ctx, shape, Backend::default())
            .map_err(SyncError::setup("allocating sync counters"))?;
        Ok(Self {
            pgl,
            slot,
            budget,
            epoch: Epoch::default(),
        })
    }

    /// The kernel argument: the counters' view and the bound of their waits.
    pub fn device(&self) -> Result<weft_sync_counters, SyncError> {
        Ok(weft_sync_counters {
            view: self.pgl.view(),
            bound: weft_sync_bound {
                error_slot: self.slot.device_ptr(self.pgl.context())?,
                budget_cycles: self.budget.cycles,
            },
        })
    }

    /// Reserves `steps` steps for the next launch; returns its epoch base (see [`crate::epoch`]).
    pub fn begin(&mut self, steps: u64) -> u64 {
        self.epoch.begin(steps)
    }

    /// Steps taken so far.
    pub fn epoch(&self) -> u64 {
        self.epoch.steps()
    }

    pub fn budget(&self) -> WaitBudget {
        self.budget
    }

    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.budget = budget;
    }

    pub fn slot(&self) -> &ErrorSlot {
        &self.slot
    }

    pub fn pgl(&self) -> &Pgl<u64> {
        &self.pgl
    }

    /// Err naming what a timed-out wait recorded, if one did.
    pub fn check(&self) -> Result<(), crate::SyncError> {
        self.slot.check()
    }

    /// Collective: back to zero without reallocating. Waits for `stream` and for every rank
    /// (nobody may still signal into these counters), zeroes this rank's buffer, waits for every
    /// rank again (nobody signals into a buffer not yet zeroed), and restarts the epoch.
    pub fn reset(
        &mut self,
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
    ) -> Result<(), SyncError> {
        let drained = agree(
            rdzv,
            "sync counters reset (drain)",
            stream.synchronize().map_err(anyhow::Error::from),
        );
        drained.map_err(SyncError::setup(
            "draining every rank before a counters reset",
        ))?;
        let zeroed = (|| -> anyhow::Result<()> {
            stream.context().bind_to_thread()?;
            let bytes = self.pgl.len() * std::mem::size_of::<u64>();
            // SAFETY: this rank's buffer holds len() u64; no kernel uses it (drained above).
            unsafe { result::memset_d8_async(self.pgl.local_ptr(), 0, bytes, stream.cu_stream()) }?;
            stream.synchronize()?;
            Ok(())
        })();
        agree(rdzv, "sync counters reset (zero)", zeroed)
            .map_err(SyncError::setup("zeroing the counters on every rank"))?;
        self.epoch.reset();
        self.slot.clear();
        Ok(())
    }

    /// Collective: frees the counters on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), SyncError> {
        self.pgl
            .free(rdzv)
            .map_err(SyncError::setup("freeing the sync counters"))
    }
}
