//! GEMM + AllReduce: tiles stored in execution order (the TILE_ORDER reorder map), one in-place
//! ncclAllReduce per wave group on the communication stream, then the restore to the standard
//! layout (optionally fused with a residual add or RMSNorm) on the compute stream. The ordering
//! of a run is the pipeline's (overlap/pipeline.rs).

use crate::error::GemmError;
use crate::gemm::Gemm;
use crate::overlap::pipeline::GroupPipeline;
use crate::plan::{GemmOptions, GemmShape};
use crate::reorder::{OutputLayout, Restore, TileOrderMap};
use crate::wave_groups::WaveGroups;
use crate::GemmElement;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::NcclType;
use std::sync::Arc;
use weft_pgl::nccl::{Communicator, ReduceOp};

/// One rank's GEMM + AllReduce overlap for a fixed shape and wave grouping.
pub struct AllReduceOverlap {
    pipe: GroupPipeline,
    map: TileOrderMap,
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
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let layout = OutputLayout::TileOrder;
            let pipe = GroupPipeline::new(
                "GEMM + AllReduce",
                stream,
                shape,
                options,
                waves_per_group,
                layout,
                rank,
            )?;
            let map = TileOrderMap::new(stream, pipe.gemm().plan())?;
            Ok(Self { pipe, map })
        })
    }

    pub fn gemm(&self) -> &Gemm {
        self.pipe.gemm()
    }

    pub fn groups(&self) -> &WaveGroups {
        self.pipe.groups()
    }

    /// Elements of the staging buffer (the GEMM's output in tile order, reduced in place).
    pub fn staging_len(&self) -> usize {
        self.pipe.staging_len()
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
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            // Everything that can be refused is checked before anything is enqueued.
            self.pipe.check_comm(comm, compute)?;
            self.pipe.check_staging(staging.len())?;
            self.map.check::<TO>(staging.len(), out.len(), &restore)?;
            let tile = (self.gemm().plan().tile_m() * self.gemm().plan().tile_n()) as usize;
            self.pipe
                .enqueue(compute, a, b, staging, None, |g, x, staging| {
                    let r = self.groups().orders(g);
                    let mut range =
                        staging.slice_mut(r.start as usize * tile..r.end as usize * tile);
                    comm.all_reduce_in_place(&mut range, ReduceOp::Sum, x)
                        .map_err(anyhow::Error::from)
                })?;
            let restored = self.map.restore(compute, staging, out, restore);
            self.pipe
                .mark_if_failed(restored.map_err(anyhow::Error::from))
                .map_err(anyhow::Error::from)
        })
    }

    /// Only the GEMM with its signals and the group waits (no collective, no restore): for
    /// measuring what signalling costs the GEMM. Enqueues only.
    pub fn run_gemm_only<TI: GemmElement, TO: GemmElement>(
        &self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.pipe
                .enqueue(compute, a, b, staging, None, |_, _, _| Ok(()))
        })
    }

    /// Only the restore (for timing it alone): `out` from `staging`.
    pub fn restore<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        staging: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        step: Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.map
                .restore(stream, staging, out, step)
                .map_err(anyhow::Error::from)
        })
    }

    /// After synchronising: an error naming a GEMM or group wait that ran past its bound.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.pipe.check().map_err(anyhow::Error::from)
        })
    }
}
