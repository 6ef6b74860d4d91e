//! What every GEMM + collective overlap shares: the GEMM with its wave-group counters, the
//! high-priority communication stream, and the ordering of one run.
//!
//! Ordering of one run (compute stream C, communication stream X):
//!   X waits for C          — the staging buffer's previous readers and the inputs are done
//!   C: GEMM (the collective's layout, group signals)
//!   X: for each group g: wait kernel (acquire, rearms the counter), the collective on group g
//!   C waits for X; C: the restore (by the caller)
//! So the next run's GEMM is ordered after every wait of this one (the counters' rule).

use crate::error::require;
use crate::error::GemmError;
use crate::gemm::{Gemm, RowSlotTable};
use crate::overlap::comm_stream::high_priority_stream;
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::reorder::OutputLayout;
use crate::wave_groups::{GroupCounters, WaveGroups};
use crate::{GemmElement, LaunchExtras};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use weft_pgl::nccl::Communicator;

pub(crate) struct GroupPipeline {
    /// The operation, for messages ("GEMM + AllReduce").
    what: &'static str,
    gemm: Gemm,
    counters: GroupCounters,
    layout: OutputLayout,
    comm_stream: Arc<CudaStream>,
    /// Set when a run failed after its GEMM was enqueued: some group counters may not have been
    /// waited on (and rearmed), so a later run could read unfinished tiles. Refused from then on.
    broken: AtomicBool,
}

impl GroupPipeline {
    pub fn new(
        what: &'static str,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        waves_per_group: Option<&[u32]>,
        layout: OutputLayout,
        rank: u32,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            require!(
                options.beta == 0.0,
                Options,
                "{what}: beta must be 0 (the epilogue writes the {} layout)",
                layout.name()
            );
            require!(
                options.comm_ctas == 0,
                Options,
                "{what}: no communicator CTAs (NCCL communicates)"
            );
            let ctx = stream.context();
            require!(
                !ctx.is_event_tracking(), Options,
                "{what} needs the context's event tracking off (CudaContext::disable_event_tracking): with it on, \
                 taking a group's range of the staging buffer makes the communication stream wait for the whole GEMM, \
                 and nothing overlaps"
            );
            let plan = GemmPlan::new(crate::gemm::device_sms(ctx)?, shape, options)?;
            plan.require_fused_kernel()?;
            let mut gemm = Gemm::from_plan(ctx, plan)?;
            gemm.set_rank(rank as usize);
            let plan = gemm.plan();
            layout.check(plan)?;
            let groups = match waves_per_group {
                Some(w) => WaveGroups::new(plan, w)?,
                None => WaveGroups::uniform(plan, 1)?,
            };
            let counters = GroupCounters::new(stream, groups, rank)?;
            let comm_stream = high_priority_stream(ctx)?;
            Ok(Self {
                what,
                gemm,
                counters,
                layout,
                comm_stream,
                broken: AtomicBool::new(false),
            })
        })
    }

    /// Replaces the layout (for a layout that depends on the groups: the All-to-All's slots).
    pub fn set_layout(&mut self, layout: OutputLayout) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            layout.check(self.gemm.plan())?;
            self.layout = layout;
            Ok(())
        })
    }

    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    pub fn groups(&self) -> &WaveGroups {
        self.counters.groups()
    }

    pub fn staging_len(&self) -> usize {
        self.layout.elements(self.gemm.plan()) as usize
    }

    pub fn check_staging(&self, len: usize) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                len >= self.staging_len(),
                Length,
                "{}: staging buffer has {len} elements, needs {}",
                self.what,
                self.staging_len()
            );
            Ok(())
        })
    }

    /// The communicator is on the compute stream's GPU.
    pub fn check_comm(
        &self,
        comm: &Communicator,
        compute: &Arc<CudaStream>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                comm.context().cu_ctx() == compute.context().cu_ctx(),
                Options,
                "{}: the communicator is on GPU {}, the compute stream on GPU {}",
                self.what,
                comm.context().ordinal(),
                compute.context().ordinal()
            );
            Ok(())
        })
    }

    /// The communicator is rank `rank` of `world` (collectives whose layout depends on them).
    pub fn check_rank(
        &self,
        comm: &Communicator,
        rank: usize,
        world: usize,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                comm.world() == world && comm.rank() == rank,
                Options,
                "{}: made for rank {rank} of {world}, the communicator is rank {} of {}",
                self.what,
                comm.rank(),
                comm.world()
            );
            Ok(())
        })
    }

    /// The ordering of the module doc: the communication stream joins the compute stream, the
    /// GEMM (with `row_slots` for the row-slots layout), then per group its wait and
    /// `after_wait(group, communication stream, staging)`, and the compute stream joins back.
    pub fn enqueue<TI: GemmElement, TO: GemmElement>(
        &self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
        row_slots: Option<RowSlotTable<'_>>,
        mut after_wait: impl FnMut(usize, &Arc<CudaStream>, &mut CudaSlice<TO>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.check_staging(staging.len())?;
        anyhow::ensure!(
            !self.broken.load(Ordering::Relaxed), "{}: an earlier run failed after its GEMM was enqueued, so its group counters may be stale; make a new one",
            self.what
        );
        let x = &self.comm_stream;
        x.join(compute)?;
        let extras = LaunchExtras {
            groups: Some(&self.counters),
            layout: self.layout,
            row_slots,
            ..Default::default()
        };
        self.gemm.launch_with(compute, a, b, staging, extras)?;
        let enqueued = (|| {
            for g in 0..self.groups().count() {
                self.counters.wait(x, g)?;
                after_wait(g, x, staging)?;
            }
            compute.join(x)?;
            Ok(())
        })();
        self.mark_if_failed(enqueued).map_err(anyhow::Error::from)
    }

    /// A failure after the GEMM was enqueued leaves the pipeline unusable (see `broken`).
    pub fn mark_if_failed(&self, r: anyhow::Result<()>) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            if r.is_err() {
                self.broken.store(true, Ordering::Relaxed);
            }
            r
        })
    }

    /// After synchronising: an error naming a GEMM or group wait that ran past its bound.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.gemm.check()?;
            self.counters.check().map_err(anyhow::Error::from)
        })
    }
}
