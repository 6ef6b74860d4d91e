//! GEMM + All-to-All (MoE-style dispatch of the GEMM's output rows): each row's subtokens stored
//! into per-group, per-destination pools (the ROW_SLOTS reorder map, [`AllToAllMap`]), one grouped
//! ncclSend/ncclRecv per wave group on the communication stream with that group's per-peer
//! counts, then the scatter of the received subtokens into the routing's order on the compute
//! stream. The ordering of a run is the pipeline's (overlap/pipeline.rs).

use crate::a2a_map::AllToAllMap;
use crate::error::GemmError;
use crate::gemm::Gemm;
use crate::overlap::pipeline::GroupPipeline;
use crate::plan::{GemmOptions, GemmShape};
use crate::reorder::OutputLayout;
use crate::wave_groups::WaveGroups;
use crate::GemmElement;
use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::NcclType;
use std::sync::Arc;
use weft_pgl::nccl::Communicator;

/// One rank's GEMM + All-to-All overlap for a fixed shape, routing and wave grouping.
pub struct AllToAllOverlap {
    pipe: GroupPipeline,
    map: AllToAllMap,
    rank: usize,
}

impl AllToAllOverlap {
    /// As `AllReduceOverlap::new`, with `routes[s][row]` = the destination rank of rank s's
    /// output row (every rank's routing, the same on every rank; the shape, options and groups
    /// must be the same on every rank too).
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        waves_per_group: Option<&[u32]>,
        routes: &[Vec<u32>],
        rank: usize,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let layout = OutputLayout::RowSlots { slots: 0 }; // replaced once the pools are known
            let mut pipe = GroupPipeline::new(
                "GEMM + All-to-All",
                stream,
                shape,
                options,
                waves_per_group,
                layout,
                rank as u32,
            )?;
            let map = AllToAllMap::new(stream, pipe.gemm().plan(), pipe.groups(), routes, rank)?;
            pipe.set_layout(map.layout())?;
            Ok(Self { pipe, map, rank })
        })
    }

    pub fn gemm(&self) -> &Gemm {
        self.pipe.gemm()
    }

    pub fn groups(&self) -> &WaveGroups {
        self.pipe.groups()
    }

    /// The pools, and which source row each output row is.
    pub fn map(&self) -> &AllToAllMap {
        &self.map
    }

    pub fn staging_len(&self) -> usize {
        self.map.staging_len()
    }

    pub fn received_len(&self) -> usize {
        self.map.received_len()
    }

    /// out = the rows of every rank's A · B routed to this rank, source by source, each source's
    /// rows in order: map().rows() × n. Enqueues only: synchronise `compute` before reading it.
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
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            // Everything that can be refused is checked before anything is enqueued.
            self.pipe.check_comm(comm, compute)?;
            self.pipe.check_rank(comm, self.rank, self.map.world())?;
            self.pipe.check_staging(staging.len())?;
            self.map.check::<TO>(received.len(), out.len())?;
            self.pipe.enqueue(
                compute,
                a,
                b,
                staging,
                Some(self.map.row_slots()),
                |g, x, staging| {
                    let (sends, recvs) = self.map.group_ranges(g);
                    comm.all_to_all_v(&*staging, sends, received, recvs, x)
                        .map_err(anyhow::Error::from)
                },
            )?;
            let scattered = self.map.scatter(compute, received, out);
            self.pipe
                .mark_if_failed(scattered.map_err(anyhow::Error::from))
                .map_err(anyhow::Error::from)
        })
    }

    /// Only the GEMM with its signals and the group waits. Enqueues only.
    pub fn run_gemm_only<TI: GemmElement, TO: GemmElement>(
        &self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        staging: &mut CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.pipe.enqueue(
                compute,
                a,
                b,
                staging,
                Some(self.map.row_slots()),
                |_, _, _| Ok(()),
            )
        })
    }

    /// After synchronising: an error naming a GEMM or group wait that ran past its bound.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.pipe.check().map_err(anyhow::Error::from)
        })
    }
}
