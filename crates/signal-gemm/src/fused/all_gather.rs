//! AllGather + GEMM fused into the GEMM's loader (ParallelKittens' intra-SM method): A (m × k) is
//! sharded by rows, rank q holding rows [q·m/world, (q + 1)·m/world) in a PGL; every rank computes
//! all of D = A · B_rank (its own B, e.g. a column shard of a weight), its loader reading each A
//! tile by TMA straight from the owner's shard, local or peer (`ag_maps`, abi/gemm.h). The order is
//! rotated so that each rank starts on its own shard's rows: the wait for the peers' shards
//! (START, every rank's CTAs launched, so their shards are written) comes after a rank's own
//! tiles have started. END (every rank's loads done) lets the next run's shard be overwritten.
//!
//! Two methods ([`AllGatherMethod`]): `Intra`, as above; `Inter`, where communicator CTAs of the
//! GEMM kernel copy the peers' shards into a local gathered A, a tile row (chunk) at a time, in
//! the order the rotated schedule reads them, and release a flag per chunk; the loader reads its
//! own rows from its shard and a peer's rows from the copy once their chunk's flag is up
//! (kernels/include/weft/gemm/ag_copy.cuh). `CopyEngine`: the same gathered A and flags, but
//! copy engines pull the peers' shards on a side stream and every SM computes
//! (ag_copy_engine.rs), groups of tile rows whole or in column chunks along K (a flag per chunk).

use super::ag_copy_engine::{CopyEngineGather, CopyEngineLaunch};
use super::collective_plan::{
    agree_on_plan, check_resident, peer_barrier_counters, peer_tensor_maps, synchronize_checked,
    with_failed_free,
};
use crate::dtype::GemmElement;
use crate::error::agree;
use crate::error::require;
use crate::error::GemmError;
use crate::gemm::{device_sms, AllGatherSource, Gemm, LaunchExtras};
use crate::plan::{FusionSet, GemmOptions, GemmPlan, GemmShape};
use crate::reorder::MAX_BAND_RANKS;
use anyhow::Context;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use weft_kernels::abi::{weft_gemm_ag_copy, WEFT_GEMM_TILE_K, WEFT_GEMM_TILE_M};
use weft_pgl::Bootstrap;
use weft_pgl::{Backend, Pgl, PglElement, Shape};
use weft_sync::{Counters, WaitBudget};

/// Where the peers' A rows are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllGatherMethod {
    /// By the loader's TMA, straight from the owners' shards.
    Intra,
    /// Copied by `comm_ctas` communicator CTAs of the GEMM kernel into a local gathered A, chunk
    /// by chunk, the loader waiting for each chunk's flag.
    Inter { comm_ctas: u32 },
    /// Copied by copy engines on a side stream, `tile_rows` tile rows of a shard per copy, the
    /// loader waiting for each group's flag; no communicator CTAs. With `k_chunks` > 1 each group
    /// is copied in that many column chunks along K, each flagged, and a tile of the group starts
    /// once its first chunk has landed: chunks of whole K blocks (64 columns), so at most
    /// ceil(K / 64) of them, and only counts those blocks make exactly (10 blocks: 5 chunks of
    /// 2, not 8); the AllGather's own kernel only (a 128- or 256-wide tile, pipelined epilogue).
    CopyEngine { tile_rows: u32, k_chunks: u32 },
}

impl AllGatherMethod {
    pub fn name(self) -> &'static str {
        match self {
            AllGatherMethod::Intra => "fused-intra",
            AllGatherMethod::Inter { .. } => "fused-inter",
            AllGatherMethod::CopyEngine { .. } => "fused-ce",
        }
    }
}

/// The inter-SM and copy-engine methods' buffers on this GPU: the gathered A (m × k) and a flag
/// per tile row and K chunk. The flags are a PGL for its memory (cuMem), not for the peers: stream memory
/// operations (the copy engine's flag writes) refuse stream-ordered pool allocations.
struct GatheredA<TI> {
    a: CudaSlice<TI>,
    chunk_flags: Pgl<u64>,
}

/// One rank's fused AllGather + GEMM for a fixed shape (m: all ranks' rows), world and method.
pub struct FusedAllGatherGemm<TI: GemmElement + PglElement> {
    gemm: Gemm,
    method: AllGatherMethod,
    shard: Pgl<TI>,
    /// A weft_tensor_map per rank's shard (peers' as mapped here), read by the loader.
    maps: CudaSlice<u8>,
    bar: Counters,
    rows: u32,
    gathered: Option<GatheredA<TI>>,
    copy_engine: Option<CopyEngineGather>,
    /// Set when a copy-engine launch failed after its kernel was enqueued: that kernel waits (up
    /// to its bound) for flags that will not come and then fails the context. Refused from then on.
    broken: bool,
}

impl<TI: GemmElement + PglElement> FusedAllGatherGemm<TI> {
    /// Collective over `rdzv`'s ranks: plans the GEMM (the same on every rank but for the order's
    /// rotation; `Inter` with its communicator CTAs), allocates each rank's A shard (m/world × k)
    /// and the barrier counters, and for `Inter` and `CopyEngine` the gathered A and its chunk
    /// flags. A failed allocation frees what was allocated before it, collectively.
    /// m/world must be a multiple of 128 (of 256 with clusters of 2).
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        method: AllGatherMethod,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let (world, rank) = (rdzv.world() as u32, rdzv.rank() as u32);
            let gemm = agree(
                rdzv,
                "fused AllGather + GEMM plan",
                Self::plan_gemm(ctx, shape, options, method, world, rank),
            )?;
            let what = "fused AllGather + GEMM";
            let plan = gemm.plan();
            agree_on_plan(
                rdzv,
                what,
                &format!("{} {}", plan.describe(), method.name()),
            )?;
            check_resident(rdzv, ctx, what, plan.ctas() + plan.options.comm_ctas)?;
            // Before any peer memory: a refusal here leaves nothing to free collectively.
            let copy_engine = match method {
                AllGatherMethod::CopyEngine {
                    tile_rows,
                    k_chunks,
                } => Some(agree(
                    rdzv,
                    "the copy-engine AllGather's stream",
                    CopyEngineGather::new(
                        ctx,
                        tile_rows,
                        k_chunks,
                        shape.k.div_ceil(WEFT_GEMM_TILE_K),
                    )
                    .map_err(anyhow::Error::from),
                )?),
                _ => None,
            };
            let rows = shape.m / world;
            let shard = Pgl::<TI>::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, rows, shape.k),
                Backend::default(),
            )
            .context("allocating the fused AllGather's A shards")?;
            // Each step collective (agreed): on an error every rank frees what it holds, alike.
            let maps = agree(
                rdzv,
                "fused AllGather tensor maps",
                Self::encode_maps(stream, &shard, shape, world),
            );
            let maps = match maps {
                Ok(m) => m,
                Err(e) => {
                    return Err(with_failed_free(
                        e,
                        shard.free(rdzv).map_err(anyhow::Error::from),
                    ))
                }
            };
            let bar = match peer_barrier_counters(rdzv, ctx, what) {
                Ok(b) => b,
                Err(e) => {
                    return Err(with_failed_free(
                        e,
                        shard.free(rdzv).map_err(anyhow::Error::from),
                    ))
                }
            };
            let gathered = match method {
                AllGatherMethod::Intra => None,
                AllGatherMethod::Inter { .. } | AllGatherMethod::CopyEngine { .. } => {
                    let k_chunks = copy_engine.as_ref().map_or(1, CopyEngineGather::k_chunks);
                    let flags = shape.m.div_ceil(WEFT_GEMM_TILE_M) * k_chunks;
                    let made = agree(
                        rdzv,
                        "fused AllGather's gathered A",
                        Self::alloc_gathered(stream, shape),
                    )
                    .and_then(|a| {
                        let flags = Pgl::<u64>::alloc(
                            rdzv,
                            ctx,
                            Shape::new(1, 1, 1, flags),
                            Backend::default(),
                        )
                        .context("allocating the fused AllGather's chunk flags")?;
                        Ok(GatheredA {
                            a,
                            chunk_flags: flags,
                        })
                    });
                    match made {
                        Ok(g) => Some(g),
                        Err(e) => {
                            let held = shard
                                .free(rdzv)
                                .map_err(anyhow::Error::from)
                                .and(bar.free(rdzv).map_err(anyhow::Error::new));
                            return Err(with_failed_free(e, held));
                        }
                    }
                }
            };
            Ok(Self {
                gemm,
                method,
                shard,
                maps,
                bar,
                rows,
                gathered,
                copy_engine,
                broken: false,
            })
        })
    }

    fn alloc_gathered(stream: &Arc<CudaStream>, shape: GemmShape) -> anyhow::Result<CudaSlice<TI>> {
        let elements = shape.m as usize * shape.k as usize;
        // SAFETY: uninitialised; a peer's rows are read only after the communicators copied
        // them (their chunk's flag), this rank's rows never (they come from its shard).
        let a = unsafe { stream.alloc::<TI>(elements) }.with_context(|| {
            format!(
                "allocating the gathered A ({} x {}) of the inter-SM AllGather",
                shape.m, shape.k
            )
        })?;
        stream.synchronize()?;
        Ok(a)
    }

    fn plan_gemm(
        ctx: &Arc<CudaContext>,
        shape: GemmShape,
        options: GemmOptions,
        method: AllGatherMethod,
        world: u32,
        rank: u32,
    ) -> anyhow::Result<Gemm> {
        require!(
            (1..=MAX_BAND_RANKS).contains(&world),
            Unsupported,
            "the fused AllGather spans 1 to {MAX_BAND_RANKS} ranks; this job has {world}"
        );
        require!(
            options.input == <TI as GemmElement>::DTYPE, Options,
            "fused AllGather of {} shards planned with {} GEMM inputs (GemmOptions::input must match)",
            <TI as GemmElement>::DTYPE,
            options.input
        );
        let options = match method {
            AllGatherMethod::Intra | AllGatherMethod::CopyEngine { .. } => {
                require!(
                    options.comm_ctas == 0,
                    Options,
                    "the {} AllGather has no communicator CTAs (comm_ctas must be 0)",
                    method.name()
                );
                options
            }
            AllGatherMethod::Inter { comm_ctas } => {
                require!(
                    comm_ctas > 0,
                    Options,
                    "fused-inter AllGather: at least one communicator CTA is needed"
                );
                require!(
                    options.comm_ctas == 0 || options.comm_ctas == comm_ctas,
                    Options,
                    "fused-inter sets comm_ctas itself ({comm_ctas}); GemmOptions::comm_ctas is {}",
                    options.comm_ctas
                );
                GemmOptions {
                    comm_ctas,
                    ..options
                }
            }
        };
        let tile_rows = WEFT_GEMM_TILE_M * options.cluster_m;
        require!(
            shape.m.is_multiple_of(world) && (shape.m / world).is_multiple_of(tile_rows), Shape,
            "GEMM {shape}: the fused AllGather gives each of {world} ranks m / {world} rows of A, which must be a whole multiple of {tile_rows} (tiles of 128 rows, clusters of {}); m = {} gives {}",
            options.cluster_m,
            shape.m,
            f64::from(shape.m) / f64::from(world)
        );
        let plan = GemmPlan::new(device_sms(ctx)?, shape, options)?;
        plan.require_fused_kernel()?;
        // Only the AllGather's own kernel polls a flag per K chunk (the kernel with every fusion
        // would read the later chunks before they landed; the launch refuses it too).
        if let AllGatherMethod::CopyEngine { k_chunks, .. } = method {
            require!(
                k_chunks <= 1 || plan.has_method_kernel(FusionSet::AllGather), Options,
                "GEMM {shape}: fused-ce in {k_chunks} K chunks needs the AllGather's own kernel (a 128- or 256-wide tile and the pipelined epilogue), which this plan has not ({})",
                plan.describe()
            );
        }
        let plan = plan.with_tm_offset(rank * (shape.m / world) / WEFT_GEMM_TILE_M)?;
        Gemm::from_plan(ctx, plan).map_err(anyhow::Error::from)
    }

    fn encode_maps(
        stream: &Arc<CudaStream>,
        shard: &Pgl<TI>,
        shape: GemmShape,
        world: u32,
    ) -> anyhow::Result<CudaSlice<u8>> {
        let ptrs: Vec<u64> = (0..world as usize).map(|r| shard.peer_ptr(r)).collect();
        let dims = (u64::from(shape.m / world), u64::from(shape.k));
        peer_tensor_maps(
            stream,
            "A shard",
            &ptrs,
            <TI as GemmElement>::DTYPE,
            dims,
            (WEFT_GEMM_TILE_M, 64),
        )
    }

    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    pub fn method(&self) -> AllGatherMethod {
        self.method
    }

    pub fn plan(&self) -> &GemmPlan {
        self.gemm.plan()
    }

    /// This rank's A shard (m/world × k, rows [rank·m/world, …) of A): write it (stream-ordered)
    /// before `run`, e.g. with `copy_shard`.
    pub fn shard(&self) -> &Pgl<TI> {
        &self.shard
    }

    /// Copies `src` (m/world × k) into this rank's shard on `stream`.
    pub fn copy_shard(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let len = self.shard.len();
            require!(
                src.len() >= len,
                Length,
                "fused AllGather: the A shard needs {len} elements ({} x {}), given {}",
                self.rows,
                self.plan().shape.k,
                src.len()
            );
            let (ptr, _g) = src.device_ptr(stream);
            stream.context().bind_to_thread()?;
            // SAFETY: both hold `len` elements of TI on this context; stream-ordered.
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(
                    self.shard.local_ptr(),
                    ptr,
                    len * std::mem::size_of::<TI>(),
                    stream.cu_stream(),
                )
            }
            .result()
            .context("copying the fused AllGather's A shard")?;
            Ok(())
        })
    }

    /// Bounds the kernel's cross-rank barrier waits (default: weft-sync's default budget).
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.bar.set_budget(budget);
    }

    /// Enqueues d = AllGather(A shards) · b on `stream`. Every rank must call it the same number
    /// of times; write the shard for the next run only after this one (stream order: the kernel
    /// ends after every rank's loads of it).
    pub fn run<TO: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        b: &CudaSlice<TI>,
        d: &mut CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                Arc::ptr_eq(stream.context(), self.shard.context()),
                Options,
                "the fused AllGather was made on another context than the stream's"
            );
            anyhow::ensure!(
                !self.broken, "the fused AllGather (fused-ce): an earlier launch failed after its kernel was enqueued; make a new one"
            );
            let epoch = self.bar.epoch() + 1;
            // Inter-SM and copy engines: the launch's A is the gathered copy; a chunk's flag reaches
            // the epoch.
            let (a, copy) = match &self.gathered {
                None => ((self.shard.local_ptr(), self.shard.len()), None),
                Some(g) => {
                    let copy = weft_gemm_ag_copy {
                        shards: self.shard.view(),
                        chunk_flags: g.chunk_flags.local_ptr(),
                        flag_target: epoch,
                        row_bytes: self.plan().shape.k * <TI as GemmElement>::DTYPE.bytes() as u32,
                        flag_rows: self
                            .copy_engine
                            .as_ref()
                            .map_or(1, CopyEngineGather::tile_rows),
                        k_chunks: self
                            .copy_engine
                            .as_ref()
                            .map_or(1, CopyEngineGather::k_chunks),
                        k_chunk_blocks: self
                            .copy_engine
                            .as_ref()
                            .map_or(0, CopyEngineGather::k_chunk_blocks),
                        ..Default::default()
                    };
                    ((g.a.device_ptr(stream).0, g.a.len()), Some(copy))
                }
            };
            let source = AllGatherSource {
                maps: self.maps.device_ptr(stream).0,
                rows: self.rows,
                bar: self.bar.device()?,
                epoch,
                copy,
                host_copy: self.copy_engine.is_some(),
            };
            let extras = LaunchExtras::<TO> {
                all_gather: Some(source),
                ..Default::default()
            };
            let d_len = d.len();
            {
                let (d_ptr, _rd) = cudarc::driver::DevicePtrMut::device_ptr_mut(d, stream);
                // SAFETY: A (the shard PGL, rows × k, or the gathered copy, m × k) and `d` (d_len of
                // TO) are alive past the launch (the caller orders its later use of them on the stream).
                unsafe { self.gemm.launch_into(stream, a, b, d_ptr, d_len, extras)? };
            }
            // Counted only once enqueued: a refused launch leaves the epoch where the device is.
            self.bar.begin(1);
            if let (Some(ce), Some(g)) = (&self.copy_engine, &self.gathered) {
                let world = self.shard.world();
                let shards: Vec<u64> = (0..world).map(|r| self.shard.peer_ptr(r)).collect();
                let element_bytes = <TI as GemmElement>::DTYPE.bytes() as u64;
                let row_bytes = u64::from(self.plan().shape.k) * element_bytes;
                let launch = CopyEngineLaunch {
                    shards: &shards,
                    gathered: g.a.device_ptr(stream).0,
                    chunk_flags: g.chunk_flags.local_ptr(),
                    tile_row_bytes: u64::from(WEFT_GEMM_TILE_M) * row_bytes,
                    row_bytes,
                    k_chunk_bytes: ce.k_chunk_bytes(element_bytes),
                    // Row WEFT_GEMM_PEER_BAR_START (0) of this rank's counters; every CTA of every
                    // rank adds 1 per launch (peer_reduce.cuh's peer_bar_target).
                    start_counter: self.bar.pgl().local_ptr(),
                    start_target: world as u64 * u64::from(self.plan().ctas()) * epoch,
                    flag_target: epoch,
                };
                let copied = ce.copy(
                    stream,
                    &launch,
                    self.shard.rank(),
                    self.rows / WEFT_GEMM_TILE_M,
                );
                if copied.is_err() {
                    self.broken = true;
                }
                copied?;
            }
            Ok(())
        })
    }

    /// Waits for `stream`; an error names any wait that ran past its bound (START: a rank's
    /// shard not ready; END: a rank's loads not done), else the driver's error, if any.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            synchronize_checked(stream, "the fused AllGather + GEMM", || {
                vec![
                    self.gemm.check().map_err(anyhow::Error::from),
                    self.bar.check().context("fused AllGather barrier (row 0: every rank's shard written; row 1: every rank's loads done)"),
                ]
            })
        })
    }

    /// Collective: frees the shards, counters and chunk flags on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let shard = self.shard.free(rdzv).map_err(anyhow::Error::from);
            let bar = self.bar.free(rdzv).map_err(anyhow::Error::new);
            let flags = self.gathered.map_or(Ok(()), |g| {
                g.chunk_flags.free(rdzv).map_err(anyhow::Error::from)
            });
            shard.and(bar).and(flags)
        })
    }
}
