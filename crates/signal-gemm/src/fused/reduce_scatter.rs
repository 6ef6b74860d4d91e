//! GEMM + ReduceScatter fused into the GEMM kernel (WEFT_GEMM_LAYOUT_PEER_REDUCE, abi/gemm.h): rank q
//! owns standard rows [q·m/world, (q + 1)·m/world) — the rows ncclReduceScatter of the standard
//! layout would give it — in a PGL; every rank's epilogue reduce-adds each finished tile, by TMA,
//! into the owner's buffer (local or peer), and the kernel's START / END barriers make every
//! buffer zeroed before the first add and this rank's rows complete when the kernel ends
//! (kernels/include/weft/gemm/peer_reduce.cuh). No second stream, no NCCL.
//!
//! Accumulation happens in the output dtype: with bf16 each add rounds (world roundings per
//! element, in an order that varies run to run); an f32 output (`GemmOptions::output`) adds in
//! f32. Every rank's kernel must run at the same time (its barriers wait across ranks, bounded):
//! all of a rank's CTAs must be resident, so ranks that share a GPU must leave each other room.

use super::collective_plan::{
    agree_on_plan, check_resident, copy_own_buffer, peer_barrier_counters, peer_tensor_maps,
    synchronize_checked, with_failed_free,
};
use crate::dtype::GemmElement;
use crate::error::agree;
use crate::error::require;
use crate::error::GemmError;
use crate::gemm::{device_sms, Gemm, LaunchExtras, PeerReduceTarget};
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::reorder::{OutputLayout, MAX_BAND_RANKS};
use anyhow::Context;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;
use weft_kernels::abi::{WEFT_GEMM_PEER_BAR_END, WEFT_GEMM_PEER_BAR_START};
use weft_pgl::Bootstrap;
use weft_pgl::{Backend, Pgl, PglElement, Shape};
use weft_sync::{Counters, WaitBudget};

/// The order the ranks' adds travel best in: the owners' row blocks visited in turn (every wave
/// adds into every owner, so each link carries adds the whole kernel long instead of one owner's
/// block after another), and rotated so that rank r starts on rank r + 1's block and ends on its
/// own (no owner takes every rank's adds at once; the adds that end the kernel are local). Order
/// only: the adds commute and the barriers cover the whole kernel. Either is skipped where the
/// blocks are not whole cluster rows.
fn order_for_owners(plan: GemmPlan, ranks: u32, rank: u32) -> anyhow::Result<GemmPlan> {
    let cm = plan.cluster_m();
    if ranks < 2 || !plan.tiles_m().is_multiple_of(cm) {
        return Ok(plan);
    }
    let plan = match plan.with_tm_blocks(ranks) {
        Ok(p) if (plan.shape.m / ranks).is_multiple_of(plan.tile_m() * cm) => p,
        _ => plan,
    };
    let first_row = u64::from((rank + 1) % ranks) * u64::from(plan.shape.m / ranks);
    let tiles = (first_row / u64::from(plan.tile_m())) as u32 / cm * cm;
    plan.with_tm_offset(tiles).map_err(anyhow::Error::from)
}

/// One rank's fused GEMM + ReduceScatter for a fixed shape and world.
pub struct FusedReduceScatter<T: GemmElement + PglElement> {
    gemm: Gemm,
    out: Pgl<T>,
    /// A weft_tensor_map per rank's `out` (peers' as mapped here), read by the kernel.
    maps: CudaSlice<u8>,
    bar: Counters,
    ranks: u32,
}

impl<T: GemmElement + PglElement> FusedReduceScatter<T> {
    /// Collective over `rdzv`'s ranks: plans the GEMM (the same on every rank, refused on every
    /// rank if any rank refuses), allocates each rank's m/world × n output and the barrier
    /// counters. `options.output` must be T; beta must be 0.
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let world = rdzv.world();
            let ranks = u32::try_from(world).unwrap_or(u32::MAX);
            let rank = rdzv.rank() as u32;
            let gemm = agree(
                rdzv,
                "fused GEMM + ReduceScatter plan",
                Self::plan_gemm(ctx, shape, options, ranks, rank),
            )?;
            let what = "fused GEMM + ReduceScatter";
            agree_on_plan(rdzv, what, &gemm.plan().describe())?;
            check_resident(rdzv, ctx, what, gemm.plan().ctas())?;
            let rows = shape.m / ranks;
            let out = Pgl::<T>::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, rows, shape.n),
                Backend::default(),
            )
            .context("allocating the fused ReduceScatter's outputs")?;
            let maps = match agree(
                rdzv,
                "fused ReduceScatter tensor maps",
                Self::encode_maps(stream, &out, shape, ranks),
            ) {
                Ok(m) => m,
                Err(e) => {
                    return Err(with_failed_free(
                        e,
                        out.free(rdzv).map_err(anyhow::Error::from),
                    ))
                }
            };
            let bar = match peer_barrier_counters(rdzv, ctx, what) {
                Ok(b) => b,
                Err(e) => {
                    return Err(with_failed_free(
                        e,
                        out.free(rdzv).map_err(anyhow::Error::from),
                    ))
                }
            };
            Ok(Self {
                gemm,
                out,
                maps,
                bar,
                ranks,
            })
        })
    }

    fn plan_gemm(
        ctx: &Arc<CudaContext>,
        shape: GemmShape,
        options: GemmOptions,
        ranks: u32,
        rank: u32,
    ) -> anyhow::Result<Gemm> {
        require!(
            (1..=MAX_BAND_RANKS).contains(&ranks),
            Unsupported,
            "the fused ReduceScatter spans 1 to {MAX_BAND_RANKS} ranks; this job has {ranks}"
        );
        require!(
            options.output == <T as GemmElement>::DTYPE, Options,
            "fused ReduceScatter of {} elements planned with a {} GEMM output (GemmOptions::output must match)",
            <T as GemmElement>::DTYPE,
            options.output
        );
        require!(
            options.beta == 0.0,
            Options,
            "the fused ReduceScatter adds into zeroed outputs: beta must be 0, have {}",
            options.beta
        );
        require!(
            options.comm_ctas == 0,
            Options,
            "the fused ReduceScatter has no communicator CTAs (comm_ctas must be 0)"
        );
        let plan = GemmPlan::new(device_sms(ctx)?, shape, options)?;
        plan.require_fused_kernel()?;
        OutputLayout::PeerReduce { ranks }.check(&plan)?;
        Gemm::from_plan(ctx, order_for_owners(plan, ranks, rank)?).map_err(anyhow::Error::from)
    }

    /// A tensor map per rank's output, as this process maps it, in device memory.
    fn encode_maps(
        stream: &Arc<CudaStream>,
        out: &Pgl<T>,
        shape: GemmShape,
        ranks: u32,
    ) -> anyhow::Result<CudaSlice<u8>> {
        let ptrs: Vec<u64> = (0..ranks as usize).map(|r| out.peer_ptr(r)).collect();
        let chunk_cols = (128 / <T as GemmElement>::DTYPE.bytes()) as u32;
        let dims = (u64::from(shape.m / ranks), u64::from(shape.n));
        peer_tensor_maps(
            stream,
            "ReduceScatter output",
            &ptrs,
            <T as GemmElement>::DTYPE,
            dims,
            (64, chunk_cols),
        )
    }

    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    pub fn plan(&self) -> &GemmPlan {
        self.gemm.plan()
    }

    /// The ranks the reduction spans.
    pub fn world(&self) -> u32 {
        self.ranks
    }

    /// This rank's first standard row and its row count (m / world).
    pub fn rows(&self) -> (u32, u32) {
        let rows = self.plan().shape.m / self.ranks;
        (self.out.rank() as u32 * rows, rows)
    }

    /// This rank's output (rows() rows × n, row-major), valid once `run`'s kernel has finished.
    pub fn output(&self) -> &Pgl<T> {
        &self.out
    }

    /// Bounds the kernel's cross-rank barrier waits (default: weft-sync's default budget).
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.bar.set_budget(budget);
    }

    /// Enqueues out = this rank's rows of Σ over ranks of A_rank · B_rank on `stream`. Every rank
    /// must call it (the same number of times): the kernel waits for every rank's CTAs. The
    /// previous run's output is overwritten; read it (stream-ordered) before the next run.
    pub fn run<TI: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            use cudarc::driver::DevicePtr;
            let (a_ptr, _ra) = a.device_ptr(stream);
            require!(
                Arc::ptr_eq(stream.context(), self.out.context()),
                Options,
                "the fused ReduceScatter was made on another context than the stream's"
            );
            let target = PeerReduceTarget {
                maps: self.maps_ptr(stream),
                ranks: self.ranks,
                bar: self.bar.device()?,
                epoch: self.bar.epoch() + 1,
            };
            let extras = LaunchExtras::<T> {
                layout: OutputLayout::PeerReduce { ranks: self.ranks },
                peer: Some(target),
                ..Default::default()
            };
            // SAFETY: the PGL's own buffer holds rows × n elements of T (the layout's element count)
            // and lives as long as self; the caller orders its reads of it on the stream.
            unsafe {
                self.gemm.launch_into(
                    stream,
                    (a_ptr, a.len()),
                    b,
                    self.out.local_ptr(),
                    self.out.len(),
                    extras,
                )?
            };
            // Counted only once enqueued: a refused launch leaves the epoch where the device is.
            self.bar.begin(1);
            Ok(())
        })
    }

    fn maps_ptr(&self, stream: &Arc<CudaStream>) -> u64 {
        use cudarc::driver::DevicePtr;
        self.maps.device_ptr(stream).0
    }

    /// Copies this rank's output into `dst` (at least rows × n elements) on `stream`.
    pub fn copy_output(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<T>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            copy_own_buffer(stream, "fused ReduceScatter output", &self.out, dst)
        })
    }

    /// After synchronising: an error naming a GEMM pipeline wait or a cross-rank barrier
    /// (START: a rank's outputs not zeroed in time; END: a rank's adds not finished) that ran
    /// past its bound.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.gemm.check()?;
            self.check_barriers()
        })
    }

    fn check_barriers(&self) -> anyhow::Result<()> {
        self.bar.check().with_context(|| {
            format!(
                "fused ReduceScatter barrier (counter row {WEFT_GEMM_PEER_BAR_START}: every rank's output zeroed; row {WEFT_GEMM_PEER_BAR_END}: every rank's adds done)"
            )
        })
    }

    /// Waits for `stream`; an error names any wait of the kernel that ran past its bound (the
    /// report survives the trap that stopped the kernel), else the driver's error, if any.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            synchronize_checked(stream, "the fused GEMM + ReduceScatter", || {
                vec![
                    self.gemm.check().map_err(anyhow::Error::from),
                    self.check_barriers(),
                ]
            })
        })
    }

    /// Collective: frees the outputs and counters on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let out = self.out.free(rdzv).map_err(anyhow::Error::from);
            let bar = self.bar.free(rdzv).map_err(anyhow::Error::new);
            out.and(bar)
        })
    }
}
