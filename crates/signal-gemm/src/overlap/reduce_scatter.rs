//! GEMM + ReduceScatter: each tile's rows stored as `world` row bands (the RANK_BANDS reorder map),
//! one ncclReduceScatter per wave group on the communication stream (rank r receives band r of
//! each of the group's tiles), then the restore of this rank's rows to the standard row order
//! (optionally fused with a residual add or RMSNorm) on the compute stream. The ordering of a run
//! is the pipeline's (overlap/pipeline.rs); which rows a rank owns is [`RankBandMap`]'s (they
//! differ from ncclReduceScatter's contiguous m / world rows of the standard layout).

use crate::band_map::RankBandMap;
use crate::error::GemmError;
use crate::gemm::Gemm;
use crate::overlap::pipeline::GroupPipeline;
use crate::plan::{GemmOptions, GemmShape};
use crate::reorder::{OutputLayout, Restore};
use crate::wave_groups::WaveGroups;
use crate::GemmElement;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::NcclType;
use std::sync::Arc;
use weft_pgl::nccl::{Communicator, ReduceOp};

/// One rank's GEMM + ReduceScatter overlap for a fixed shape, world size and wave grouping.
pub struct ReduceScatterOverlap {
    pipe: GroupPipeline,
    map: RankBandMap,
    world: u32,
    rank: u32,
}

impl ReduceScatterOverlap {
    /// As `AllReduceOverlap::new`, for rank `rank` of `world` ranks (1 to 8).
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        waves_per_group: Option<&[u32]>,
        world: u32,
        rank: u32,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let layout = OutputLayout::RankBands { ranks: world };
            let pipe = GroupPipeline::new(
                "GEMM + ReduceScatter",
                stream,
                shape,
                options,
                waves_per_group,
                layout,
                rank,
            )?;
            let map = RankBandMap::new(stream, pipe.gemm().plan(), world, rank)?;
            Ok(Self {
                pipe,
                map,
                world,
                rank,
            })
        })
    }

    pub fn gemm(&self) -> &Gemm {
        self.pipe.gemm()
    }

    pub fn groups(&self) -> &WaveGroups {
        self.pipe.groups()
    }

    /// Which standard rows this rank's output holds.
    pub fn map(&self) -> &RankBandMap {
        &self.map
    }

    /// Elements of the staging buffer (the GEMM's output in rank bands, every rank's).
    pub fn staging_len(&self) -> usize {
        self.pipe.staging_len()
    }

    /// Elements of the received buffer (this rank's bands, reduced).
    pub fn received_len(&self) -> usize {
        self.map.received_len()
    }

    /// out = this rank's rows of ReduceScatter_sum(A · B) over `comm`'s ranks: map().rows() × n
    /// in standard row order (through `restore`'s fused step). Enqueues only: synchronise
    /// `compute` before reading `out`.
    #[allow(clippy::too_many_arguments)]
    pub fn run<TI: GemmElement, TO: GemmElement + NcclType>(
        &self,
        compute: &Arc<CudaStream>,
        comm: &Communicator,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
        received: &mut CudaSlice<TO>,
        out: &mut CudaSlice<TO>,
        restore: Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            // Everything that can be refused is checked before anything is enqueued.
            self.pipe.check_comm(comm, compute)?;
            self.pipe
                .check_rank(comm, self.rank as usize, self.world as usize)?;
            self.pipe.check_staging(staging.len())?;
            self.map.check::<TO>(received.len(), out.len(), &restore)?;
            self.pipe
                .enqueue(compute, a, b, staging, None, |g, x, staging| {
                    let (send, recv) = self.map.group_ranges(self.groups().orders(g));
                    let send = staging.slice(send);
                    let mut recv = received.slice_mut(recv);
                    comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum, x)
                        .map_err(anyhow::Error::from)
                })?;
            let restored = self.map.restore(compute, received, out, restore);
            self.pipe
                .mark_if_failed(restored.map_err(anyhow::Error::from))
                .map_err(anyhow::Error::from)
        })
    }

    /// Only the GEMM with its signals and the group waits (no collective, no restore). Enqueues only.
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

    /// Only the restore (for timing it alone): `out` from `received`.
    pub fn restore<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        received: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        step: Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.map
                .restore(stream, received, out, step)
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
