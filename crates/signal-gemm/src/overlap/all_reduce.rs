//! GEMM + AllReduce: tiles stored in execution order (the TILE_ORDER reorder map), one in-place
//! ncclAllReduce per wave group on the communication stream, then the restore to the standard
//! layout (optionally fused with a residual add or RMSNorm) on the compute stream.
//!
//! Ordering of one `run` (compute stream C, communication stream X):
//!   X waits for C          — the staging buffer's previous readers and the inputs are done
//!   C: GEMM (TILE_ORDER, group signals)
//!   X: for each group g: wait kernel (acquire, rearms the counter), ncclAllReduce(range g)
//!   C waits for X; C: restore
//! So the next run's GEMM is ordered after every wait of this one (the counters' rule).

use crate::gemm::Gemm;
use crate::overlap::comm_stream::high_priority_stream;
use crate::plan::{GemmOptions, GemmShape};
use crate::reorder::{OutputLayout, Restore, TileOrderMap};
use crate::wave_groups::{GroupCounters, WaveGroups};
use crate::{GemmElement, LaunchExtras};
use anyhow::ensure;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::NcclType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use weft_pgl::nccl::{Communicator, ReduceOp};

/// One rank's GEMM + AllReduce overlap for a fixed shape and wave grouping.
pub struct AllReduceOverlap {
    gemm: Gemm,
    counters: GroupCounters,
    map: TileOrderMap,
    comm_stream: Arc<CudaStream>,
    /// Set when a run failed after its GEMM was enqueued: some group counters may not have been
    /// waited on (and rearmed), so a later run could read unfinished tiles. Refused from then on.
    broken: AtomicBool,
}

impl AllReduceOverlap {
    /// Plans the GEMM (`options.sm_margin`: the SMs left to NCCL's kernels; see
    /// `Communicator::with_max_ctas`) and groups its waves as `waves_per_group` (None: one group
    /// per wave). `stream` gives the device; `rank` names this process in wait reports.
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        waves_per_group: Option<&[u32]>,
        rank: u32,
    ) -> anyhow::Result<Self> {
        ensure!(options.beta == 0.0, "GEMM + AllReduce: beta must be 0 (the epilogue writes the tile-order layout)");
        ensure!(options.comm_ctas == 0, "GEMM + AllReduce: no communicator CTAs (NCCL communicates)");
        let ctx = stream.context();
        ensure!(
            !ctx.is_event_tracking(),
            "GEMM + AllReduce needs the context's event tracking off (CudaContext::disable_event_tracking): with it on, \
             taking a group's range of the staging buffer makes the communication stream wait for the whole GEMM, \
             and nothing overlaps"
        );
        let gemm = Gemm::new(ctx, shape, options)?;
        let plan = gemm.plan();
        let groups = match waves_per_group {
            Some(w) => WaveGroups::new(plan, w)?,
            None => WaveGroups::uniform(plan, 1)?,
        };
        let counters = GroupCounters::new(stream, groups, rank)?;
        let map = TileOrderMap::new(stream, plan)?;
        let comm_stream = high_priority_stream(ctx)?;
        Ok(Self { gemm, counters, map, comm_stream, broken: AtomicBool::new(false) })
    }

    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    pub fn groups(&self) -> &WaveGroups {
        self.counters.groups()
    }

    /// Elements of the staging buffer (the GEMM's output in tile order, reduced in place).
    pub fn staging_len(&self) -> usize {
        OutputLayout::TileOrder.elements(self.gemm.plan()) as usize
    }

    /// out = AllReduce_sum(A · B) over `comm`'s ranks, in the standard m × n layout (through
    /// `restore`'s fused step). Enqueues only: synchronise `compute` before reading `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn run<TI: GemmElement, TO: GemmElement + NcclType>(
        &self,
        compute: &Arc<CudaStream>,
        comm: &Communicator,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
        out: &mut CudaSlice<TO>,
        restore: Restore<'_>,
    ) -> anyhow::Result<()> {
        ensure!(
            comm.context().cu_ctx() == compute.context().cu_ctx(),
            "GEMM + AllReduce: the communicator is on GPU {}, the compute stream on GPU {}",
            comm.context().ordinal(),
            compute.context().ordinal()
        );
        // Everything that can be refused is checked before anything is enqueued.
        self.check_staging(staging.len())?;
        self.map.check::<TO>(staging.len(), out.len(), &restore)?;
        let tile = (self.gemm.plan().tile_m() * self.gemm.plan().tile_n()) as usize;
        self.enqueue(compute, a, b, staging, |g, x, staging| {
            let r = self.groups().orders(g);
            let mut range = staging.slice_mut(r.start as usize * tile..r.end as usize * tile);
            comm.all_reduce_in_place(&mut range, ReduceOp::Sum, x)
        })?;
        let restored = self.map.restore(compute, staging, out, restore);
        self.mark_if_failed(restored)
    }

    /// Only the GEMM with its signals and the group waits (no collective, no restore): for
    /// measuring what signalling costs the GEMM. Enqueues only.
    pub fn run_gemm_only<TI: GemmElement, TO: GemmElement>(
        &self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
    ) -> anyhow::Result<()> {
        self.enqueue(compute, a, b, staging, |_, _, _| Ok(()))
    }

    /// The ordering of the module doc: the communication stream joins the compute stream, the
    /// GEMM, then per group its wait and `after_wait(group, communication stream, staging)`, and
    /// the compute stream joins back.
    fn enqueue<TI: GemmElement, TO: GemmElement>(
        &self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
        mut after_wait: impl FnMut(usize, &Arc<CudaStream>, &mut CudaSlice<TO>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.check_staging(staging.len())?;
        ensure!(
            !self.broken.load(Ordering::Relaxed),
            "GEMM + AllReduce: an earlier run failed after its GEMM was enqueued, so its group counters may be stale; make a new AllReduceOverlap"
        );
        let x = &self.comm_stream;
        x.join(compute)?;
        let extras = LaunchExtras { groups: Some(&self.counters), layout: OutputLayout::TileOrder, ..Default::default() };
        self.gemm.launch_with(compute, a, b, staging, extras)?;
        let enqueued = (|| {
            for g in 0..self.groups().count() {
                self.counters.wait(x, g)?;
                after_wait(g, x, staging)?;
            }
            compute.join(x)?;
            Ok(())
        })();
        self.mark_if_failed(enqueued)
    }

    fn check_staging(&self, len: usize) -> anyhow::Result<()> {
        ensure!(len >= self.staging_len(), "GEMM + AllReduce: staging buffer has {len} elements, needs {}", self.staging_len());
        Ok(())
    }

    /// A failure after the GEMM was enqueued leaves this object unusable (see `broken`).
    fn mark_if_failed(&self, r: anyhow::Result<()>) -> anyhow::Result<()> {
        if r.is_err() {
            self.broken.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Only the restore (for timing it alone): `out` from `staging`.
    pub fn restore<T: GemmElement>(&self, stream: &Arc<CudaStream>, staging: &CudaSlice<T>, out: &mut CudaSlice<T>, step: Restore<'_>) -> anyhow::Result<()> {
        self.map.restore(stream, staging, out, step)
    }

    /// After synchronising: an error naming a GEMM or group wait that ran past its bound.
    pub fn check(&self) -> anyhow::Result<()> {
        self.gemm.check()?;
        self.counters.check()
    }
}
