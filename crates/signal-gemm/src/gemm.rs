//! A loaded GEMM: the plan's kernel on one context, its error slot, and launches on a stream.

use crate::dtype::{Dtype, GemmElement};
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::kernel_choice::{GemmKernels, KernelVariant, LaunchNeeds, MethodKernels};
use crate::plan::{BLayout, FusionSet, GemmOptions, GemmPlan, GemmShape, Scheduling};
use crate::reorder::OutputLayout;
use crate::tensor_map::{encode_2d, encode_3d, encode_wide};
use crate::wave_groups::GroupCounters;
use anyhow::Context;
use cudarc::driver::sys::{self, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use std::sync::{Arc, Mutex};
use weft_kernels::abi::{
    weft_gemm_ag_copy, weft_gemm_band_box_rows, weft_gemm_band_of_row, weft_gemm_band_start,
    weft_gemm_k_blocks, weft_gemm_params, weft_gemm_row_slots_check_params, weft_gemm_work_count,
    weft_sync_bound, weft_sync_counters, weft_tile_allreduce_params, WEFT_GEMM_COMM_ALLGATHER,
    WEFT_GEMM_COMM_ALLREDUCE, WEFT_GEMM_CONSUMERS, WEFT_GEMM_TILE_M,
};
use weft_kernels::cubins;
use weft_sync::{ErrorSlot, WaitBudget};

/// What a finished tile's flag rises by in one launch (each consumer warpgroup adds 1).
pub const SIGNALS_PER_TILE: u64 = WEFT_GEMM_CONSUMERS as u64;

/// Per-tile completion flags (u64, one per output tile, row-major tile order) that the epilogue
/// raises after the tile's stores are complete. Reused across launches without memsets: launch
/// e (from 1) brings every flag to e · SIGNALS_PER_TILE. One TileFlags per plan: it counts the
/// launches of the GEMM it is given to.
pub struct TileFlags {
    pub flags: CudaSlice<u64>,
    launches: u64,
    tiles: u32,
}

impl TileFlags {
    /// Zeroed flags for `plan`'s tiles.
    pub fn new(stream: &Arc<CudaStream>, plan: &GemmPlan) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let flags = stream
                .alloc_zeros::<u64>(plan.tiles() as usize)
                .context("allocating GEMM tile flags")?;
            Ok(Self {
                flags,
                launches: 0,
                tiles: plan.tiles(),
            })
        })
    }
    /// The value every flag reaches at the end of the next launch (and counts that launch).
    /// The target of the last launch (0 before the first).
    pub fn target(&self) -> u64 {
        self.launches * SIGNALS_PER_TILE
    }
}

/// Optional outputs of a launch beyond D.
pub struct LaunchExtras<'a, TO: GemmElement> {
    /// Raise per-tile flags after each tile's stores.
    pub flags: Option<&'a mut TileFlags>,
    /// The test communicator (plan with comm_ctas > 0, needs `flags`): copies every finished
    /// tile of D here.
    pub copy_dst: Option<&'a mut CudaSlice<TO>>,
    /// Records, per tile (row-major tile order), order + 1 and CTA index + 1 of the CTA that
    /// stored it (2 × u32 per tile).
    pub trace: Option<&'a mut CudaSlice<u32>>,
    /// Elements 0 and 1 (u64 %globaltimer ns): lowered to the first compute CTA's start
    /// (atomicMin) and raised to the last compute CTA's end (atomicMax, after its stores
    /// completed). The caller initialises them (u64::MAX, 0).
    pub timeline: Option<&'a mut CudaSlice<u64>>,
    /// Launch for early release (`weft_barrier::early_release_attribute`): the GEMM may start as
    /// soon as the `KernelBarrier::wait` enqueued *directly before it on the same stream* is
    /// satisfied. Only after such a wait: after any other kernel it could overlap its producer.
    /// Needs the context's event tracking off (refused otherwise): cudarc's event waits would
    /// land between the wait kernel and this launch.
    pub early_release: bool,
    /// Add to the wave-group counters after each tile's stores (see [`GroupCounters`]).
    pub groups: Option<&'a GroupCounters>,
    /// Where the epilogue stores D (the reorder map of the communication that follows).
    pub layout: OutputLayout,
    /// `OutputLayout::RowSlots`: each (tile, row)'s slot (u32 per tile × 128 rows).
    pub row_slots: Option<RowSlotTable<'a>>,
    /// `OutputLayout::PeerReduce`: the peers' outputs and barriers (made by
    /// [`FusedReduceScatter`](crate::fused::FusedReduceScatter)).
    pub peer: Option<PeerReduceTarget>,
    /// `OutputLayout::PeerRows`: every rank's output, the row table and barriers (made by
    /// [`FusedAllToAll`](crate::fused::FusedAllToAll)).
    pub peer_rows: Option<PeerRowsTarget>,
    /// The fused AllReduce's tile flags (system scope) and, for fused-inter, its communicator
    /// CTAs' work (made by [`FusedAllReduce`](crate::fused::FusedAllReduce)).
    pub all_reduce: Option<AllReduceTarget>,
    /// A read from every rank's shard (made by
    /// [`FusedAllGatherGemm`](crate::fused::FusedAllGatherGemm)); the launch's A is this rank's.
    pub all_gather: Option<AllGatherSource>,
}

/// Where a fused AllGather + GEMM reads A: a tensor map per rank's shard (device memory), the
/// rows of a shard, the START / END counters and this launch's epoch; inter-SM, also the
/// communicators' copy (the launch's A is then the gathered m × k buffer, not the shard), or with
/// `host_copy` the host's (copy engines, no communicator CTAs: the kernel only waits for the
/// chunk flags).
#[derive(Clone, Copy)]
pub struct AllGatherSource {
    pub(crate) maps: u64,
    pub(crate) rows: u32,
    pub(crate) bar: weft_sync_counters,
    pub(crate) epoch: u64,
    pub(crate) copy: Option<weft_gemm_ag_copy>,
    pub(crate) host_copy: bool,
}

/// Where a fused-AllReduce launch raises its tile flags (a PGL, released at system scope) and
/// what its communicator CTAs run, if they run the reduction. Made by the fused AllReduce.
#[derive(Clone, Copy)]
pub struct AllReduceTarget {
    pub(crate) flags: u64,
    pub(crate) flag_target: u64,
    pub(crate) comm: Option<weft_tile_allreduce_params>,
}

/// Where a PEER_REDUCE launch adds its tiles: a tensor map per rank's output (device memory),
/// the START / END barrier counters and this launch's epoch. Made by the fused ReduceScatter.
#[derive(Clone, Copy)]
pub struct PeerReduceTarget {
    pub(crate) maps: u64,
    pub(crate) ranks: u32,
    pub(crate) bar: weft_sync_counters,
    pub(crate) epoch: u64,
}

/// Where a PEER_ROWS launch stores its rows: each rank's output address as mapped here (u64 per
/// rank, device memory), the row table (u32 per row of A, device memory, `table_rows` of them;
/// checked when made), the START / END counters and this launch's epoch. Made by the fused
/// All-to-All.
#[derive(Clone, Copy)]
pub struct PeerRowsTarget {
    pub(crate) ptrs: u64,
    pub(crate) table: u64,
    pub(crate) table_rows: u32,
    pub(crate) bar: weft_sync_counters,
    pub(crate) epoch: u64,
}

impl<TO: GemmElement> LaunchExtras<'_, TO> {
    /// Whether the launch asks for none of the fusions (another output layout, tile flags, the
    /// test communicator's copy, wave-group counters, a trace, a peer target or a fused
    /// collective): it then runs the plain kernel, which has them compiled out. The timeline and
    /// early release are not fusions (the plain kernel has them).
    pub fn fusion_free(&self) -> bool {
        self.fusion_set() == FusionSet::None
    }
}

impl<TO: GemmElement> Default for LaunchExtras<'_, TO> {
    fn default() -> Self {
        Self {
            flags: None,
            copy_dst: None,
            trace: None,
            timeline: None,
            early_release: false,
            groups: None,
            layout: OutputLayout::Standard,
            row_slots: None,
            peer: None,
            peer_rows: None,
            all_reduce: None,
            all_gather: None,
        }
    }
}

/// The GEMM kernel of one plan, loaded on one context.
pub struct Gemm {
    plan: GemmPlan,
    /// Boxed, as the row-slots check: a Gemm is held by value in enums.
    kernels: Box<GemmKernels>,
    slot: ErrorSlot,
    bound: weft_sync_bound,
    /// The rank the kernels' give-up reports name outside peer launches (which name their own).
    rank: i32,
    /// Dynamic scheduling only: the claim counter and where the next launch starts on it.
    claims: Option<Mutex<TileClaims>>,
    /// Split-K plans only: the earlier splits' partials and the tiles' flags (boxed, as the
    /// row-slots check: a Gemm is held by value in enums).
    split: Option<Box<Mutex<SplitPartials>>>,
    /// The row-slots table check, loaded at the first row-slots launch (boxed: most GEMMs never
    /// load it, and a Gemm is held by value in enums).
    row_slots_check: Box<std::sync::OnceLock<CudaFunction>>,
}

/// The claim counter of a dynamically scheduled GEMM. Each launch advances it by exactly orders +
/// CTAs (every CTA's last claim fails once), so the next launch's base is known on the host and
/// the counter is never reset. Launches must be ordered: the stream is remembered and another one
/// refused (two launches in flight at once would claim from each other's range). The check
/// compares stream handles: a stream destroyed and another created with the same handle while a
/// launch is still running would pass it.
struct TileClaims {
    counter: CudaSlice<u32>,
    base: u32,
    stream: Option<sys::CUstream>,
}

// SAFETY: the CUstream handle is only compared, never used to enqueue work.
unsafe impl Send for TileClaims {}

/// Split-K's device state (kernels/include/weft/gemm/split_k.cuh): per tile, consumer and earlier
/// split a partial of 64 × tile_n fp32, and per tile and consumer a flag the kernel leaves at 0.
/// Launches must be ordered (two at once would share the partials): the stream is remembered and
/// another refused, as for the claim counter.
struct SplitPartials {
    partials: CudaSlice<f32>,
    flags: CudaSlice<u64>,
    stream: Option<sys::CUstream>,
}

// SAFETY: the CUstream handle is only compared, never used to enqueue work.
unsafe impl Send for SplitPartials {}

impl SplitPartials {
    fn new(ctx: &Arc<CudaContext>, plan: &GemmPlan) -> anyhow::Result<Option<Box<Mutex<Self>>>> {
        let splits = plan.k_splits();
        if splits <= 1 {
            return Ok(None);
        }
        let per_tile = WEFT_GEMM_CONSUMERS as usize;
        let floats = plan.tiles() as usize
            * per_tile
            * (splits as usize - 1)
            * (WEFT_GEMM_TILE_M as usize / 2)
            * plan.tile_n() as usize;
        let stream = ctx.default_stream();
        let partials = stream.alloc_zeros::<f32>(floats).with_context(|| {
            format!(
                "allocating split-K partials for {} ({} MiB)",
                plan.describe(),
                (floats * 4) >> 20
            )
        })?;
        let flags = stream
            .alloc_zeros::<u64>(plan.tiles() as usize * per_tile)
            .context("allocating the split-K tile flags")?;
        stream.synchronize()?;
        Ok(Some(Box::new(Mutex::new(Self {
            partials,
            flags,
            stream: None,
        }))))
    }
}

fn cluster_attribute(cluster_m: u32) -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute is valid plain data; id and clusterDim are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster_m;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}

fn launch_config(
    plan: &GemmPlan,
    grid: u32,
    stream: sys::CUstream,
    attrs: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: plan.block_threads(),
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: plan.smem_bytes(),
        hStream: stream,
        attrs: if attrs.is_empty() {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        numAttrs: attrs.len() as u32,
    }
}

/// The plan on as many compute CTAs as can be resident at once in whole clusters (next to its
/// communicator clusters): SMs of a GPC pair up, so fewer clusters than SMs ÷ cluster_m may fit,
/// and a persistent grid larger than that would run a second, serial wave.
fn fit_resident_clusters(func: &CudaFunction, plan: GemmPlan) -> anyhow::Result<GemmPlan> {
    let cm = plan.cluster_m();
    let mut attr = [cluster_attribute(cm)];
    let cfg = launch_config(
        &plan,
        plan.ctas() + plan.options.comm_ctas,
        std::ptr::null_mut(),
        &mut attr,
    );
    let mut clusters: i32 = 0;
    // SAFETY: a valid function and launch configuration; writes one int.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, func.cu_function(), &cfg) }
        .result()
        .context("cuOccupancyMaxActiveClusters")?;
    let resident = clusters.max(0) as u32 * cm;
    let comm = plan.options.comm_ctas;
    require!(resident > comm, Options, "only {clusters} clusters of {cm} CTAs can be resident: no room for the GEMM next to {comm} communicator CTAs");
    if plan.ctas() + comm <= resident {
        Ok(plan)
    } else {
        plan.with_ctas(resident - comm).map_err(anyhow::Error::from)
    }
}

/// The RANK_BANDS parameters: the band count and, per store box, its band and first row in it.
fn fill_band_boxes(p: &mut weft_gemm_params, ranks: u32) {
    // SAFETY: pure functions.
    let box_rows = unsafe { weft_gemm_band_box_rows(ranks) };
    p.bands = ranks;
    p.band_box_shift = box_rows.trailing_zeros();
    for (i, y) in (0..WEFT_GEMM_TILE_M).step_by(box_rows as usize).enumerate() {
        // SAFETY: pure functions.
        let (band, start) = unsafe {
            let band = weft_gemm_band_of_row(ranks, y);
            (band, weft_gemm_band_start(ranks, band))
        };
        p.band_of_box[i] = band as u8;
        p.row_of_box[i] = (y - start) as u8;
    }
}

/// A row-slots layout's table: (tile index × 128 + row in tile) → D's slot, or WEFT_GEMM_NO_SLOT.
#[derive(Clone, Copy)]
pub struct RowSlotTable<'a> {
    table: &'a CudaSlice<u32>,
    /// The slot count every entry was checked against on the host when the table was made
    /// (weft's own tables); None for a caller's table.
    checked_below: Option<u32>,
}

impl<'a> RowSlotTable<'a> {
    /// A caller's table: a kernel checks every entry against D's slots on the stream before each
    /// launch (kernels/gemm/row_slots_check.cu), so a bad entry is reported, never stored through.
    pub fn new(table: &'a CudaSlice<u32>) -> Self {
        Self {
            table,
            checked_below: None,
        }
    }

    /// A table weft built on the host with every entry below `slots` (AllToAllMap): launches
    /// with `slots` slots skip the device check.
    pub(crate) fn checked(table: &'a CudaSlice<u32>, slots: u32) -> Self {
        Self {
            table,
            checked_below: Some(slots),
        }
    }
}

/// The SM count of `ctx`'s device.
pub fn device_sms(ctx: &Arc<CudaContext>) -> Result<u32, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<u32> {
        Ok(
            ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                as u32,
        )
    })
}

impl Gemm {
    /// Plans `shape` with `options` for `ctx`'s device and loads the kernel.
    pub fn new(
        ctx: &Arc<CudaContext>,
        shape: GemmShape,
        options: GemmOptions,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let plan = GemmPlan::new(device_sms(ctx)?, shape, options)?;
            Self::from_plan(ctx, plan).map_err(anyhow::Error::from)
        })
    }

    /// Loads the kernel of a plan made for this device.
    pub fn from_plan(ctx: &Arc<CudaContext>, plan: GemmPlan) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let sms = device_sms(ctx)?;
            require!(
                plan.sms == sms,
                Unsupported,
                "GEMM plan made for {} SMs, but the device has {sms}",
                plan.sms
            );
            let major = ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            require!(
                (major, minor) == (9, 0),
                Unsupported,
                "weft's GEMM needs a Hopper GPU (sm_90), this device is sm_{major}{minor}"
            );
            let cubin = match plan.options.input {
                Dtype::Bf16 => &cubins::GEMM_GEMM_BF16,
                Dtype::F16 => &cubins::GEMM_GEMM_F16,
                Dtype::F32 => unreachable!("rejected by GemmPlan::new"),
            };
            let module = cubin
                .load(ctx)
                .with_context(|| format!("loading {}", cubin.source))?;
            let load = |name: String| -> anyhow::Result<CudaFunction> {
                let func = module
                    .load_function(&name)
                    .with_context(|| format!("{} has no kernel {name}", cubin.source))?;
                func.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    plan.smem_bytes() as i32,
                )
                .with_context(|| {
                    format!(
                        "allowing {} bytes of dynamic shared memory for {name}",
                        plan.smem_bytes()
                    )
                })?;
                Ok(func)
            };
            let func = if plan.has_fused_kernel() {
                Some(load(plan.kernel_name())?)
            } else {
                None
            };
            let methods = MethodKernels::load(&plan, load)?;
            let plain_func = load(plan.plain_kernel_name())?;
            let plain_split = if plan.k_splits() > 1 {
                Some(load(plan.plain_split_kernel_name())?)
            } else {
                None
            };
            let plan = if plan.cluster_m() > 1 {
                // The kernels use the same registers and shared memory; checked on each regardless.
                let mut plan = plan;
                let method_funcs = MethodKernels::SETS.iter().filter_map(|s| methods.get(*s));
                for f in func.iter().chain(method_funcs) {
                    plan = fit_resident_clusters(f, plan)?;
                }
                fit_resident_clusters(&plain_func, plan)?
            } else {
                plan
            };
            let slot = ErrorSlot::new(ctx)?;
            let budget = WaitBudget::default_for(ctx)?;
            let bound = weft_sync_bound {
                error_slot: slot.device_ptr(ctx)?,
                budget_cycles: budget.cycles,
            };
            let claims = match plan.options.scheduling {
                Scheduling::Static => None,
                Scheduling::Dynamic => {
                    let stream = ctx.default_stream();
                    let counter = stream
                        .alloc_zeros::<u32>(1)
                        .context("allocating the GEMM's tile-claim counter")?;
                    stream.synchronize()?;
                    Some(Mutex::new(TileClaims {
                        counter,
                        base: 0,
                        stream: None,
                    }))
                }
            };
            let split = SplitPartials::new(ctx, &plan)?;
            Ok(Self {
                row_slots_check: Box::default(),
                plan,
                kernels: Box::new(GemmKernels {
                    fused: func,
                    methods,
                    plain: plain_func,
                    plain_split,
                }),
                slot,
                bound,
                rank: 0,
                claims,
                split,
            })
        })
    }

    pub fn plan(&self) -> &GemmPlan {
        &self.plan
    }

    /// Bounds every device wait of later launches by `budget` (default: weft-sync's default).
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.bound.budget_cycles = budget.cycles;
    }

    /// The rank this GEMM's give-up reports name (its rank in a job; 0 until set). Launches with
    /// peer targets (the fused methods) name the rank of their targets instead.
    pub fn set_rank(&mut self, rank: usize) {
        self.rank = i32::try_from(rank).unwrap_or(i32::MAX);
    }

    /// D = alpha · A · B + beta · D on `stream`.
    pub fn launch<TI: GemmElement, TO: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        d: &mut CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.launch_with(stream, a, b, d, LaunchExtras::default())
                .map_err(anyhow::Error::from)
        })
    }

    /// As [`Gemm::launch`], with tile flags, the test communicator's copy, or a trace.
    pub fn launch_with<TI: GemmElement, TO: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        d: &mut CudaSlice<TO>,
        extras: LaunchExtras<'_, TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let d_len = d.len();
            let (a_ptr, _ra) = a.device_ptr(stream);
            let (d_ptr, _rd) = d.device_ptr_mut(stream);
            // SAFETY: `a` holds a.len() elements of TI and `d` d_len of TO; both stay borrowed (and
            // their use recorded) until the launch is enqueued.
            unsafe { self.launch_into(stream, (a_ptr, a.len()), b, d_ptr, d_len, extras) }
        })
    }

    /// As [`Gemm::launch_with`], with A as (device address, elements of TI) and D as `d_len`
    /// elements of TO at `d_ptr` (e.g. PGLs' own buffers).
    ///
    /// # Safety
    /// Both must be device memory of the stream's context holding that many elements, alive
    /// (and D not used by other work) until the launch completes.
    pub(crate) unsafe fn launch_into<TI: GemmElement, TO: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        a: (u64, usize),
        b: &CudaSlice<TI>,
        d_ptr: u64,
        d_len: usize,
        extras: LaunchExtras<'_, TO>,
    ) -> anyhow::Result<()> {
        let plan = &self.plan;
        let GemmShape { m, n, k } = plan.shape;
        let (m, n, k) = (m as u64, n as u64, k as u64);
        let o = &plan.options;
        require!(
            TI::DTYPE == o.input,
            Options,
            "GEMM planned for {} inputs, given {} buffers",
            o.input,
            TI::DTYPE
        );
        require!(
            TO::DTYPE == o.output,
            Options,
            "GEMM planned for {} output, given a {} buffer",
            o.output,
            TO::DTYPE
        );
        let need = |what: &str, len: usize, want: u64, dims: String| -> anyhow::Result<()> {
            require!(
                len as u64 >= want,
                Length,
                "GEMM {}: {what} buffer too small: {len} elements, needs {want} ({dims})",
                plan.shape
            );
            Ok(())
        };
        // With the intra-SM AllGather, A is this rank's shard of ag_rows rows.
        let a_rows = match extras.all_gather {
            Some(g) if g.copy.is_none() => u64::from(g.rows),
            _ => m,
        };
        need("A", a.1, a_rows * k, format!("{a_rows} x {k}"))?;
        let b_dims = match o.b_layout {
            BLayout::KxN => format!("{k} x {n}"),
            BLayout::NxK => format!("{n} x {k}"),
        };
        need("B", b.len(), k * n, b_dims)?;
        let layout = extras.layout;
        layout.check(plan)?;
        match layout {
            OutputLayout::Standard => need("D", d_len, m * n, format!("{m} x {n}"))?,
            OutputLayout::TileOrder
            | OutputLayout::RankBands { .. }
            | OutputLayout::RowSlots { .. }
            | OutputLayout::PeerReduce { .. }
            | OutputLayout::PeerRows { .. } => {
                need("D", d_len, layout.elements(plan), layout.describe(plan))?;
                require!(o.beta == 0.0, Options, "GEMM {}: the {} layout needs beta = 0 (D is not in the standard layout to read)", plan.shape, layout.name());
                require!(
                    extras.copy_dst.is_none(),
                    Options,
                    "GEMM {}: the tile-copy communicator reads the standard layout, not {}",
                    plan.shape,
                    layout.name()
                );
            }
        }

        let a_ptr = a.0;
        let (b_ptr, _rb) = b.device_ptr(stream);
        let tile_n = plan.tile_n();
        let map_a = encode_2d("A", a_ptr, o.input, a_rows, k, plan.tile_m(), 64)?;
        let map_b = match o.b_layout {
            // With clusters, each CTA loads 1/cluster_m of the B tile's rows and multicasts them.
            BLayout::NxK => encode_2d(
                "B (n x k)",
                b_ptr,
                o.input,
                n,
                k,
                tile_n / plan.cluster_m(),
                64,
            )?,
            BLayout::KxN => encode_2d("B (k x n)", b_ptr, o.input, k, n, 64, 64)?,
        };
        let chunk_cols = (128 / o.output.bytes()) as u32;
        // Wide stores (kernels/include/weft/abi/gemm.h): with the whole-tile epilogue, one TMA box per run
        // of a warpgroup's rows across the tile's width instead of one per 128-byte chunk.
        let wide = plan.whole_tile_epilogue()
            && match layout {
                OutputLayout::Standard => n % u64::from(chunk_cols) == 0,
                OutputLayout::TileOrder | OutputLayout::RankBands { .. } => true,
                OutputLayout::RowSlots { .. }
                | OutputLayout::PeerReduce { .. }
                | OutputLayout::PeerRows { .. } => false,
            };
        // D as `slots` row-major matrices of `rows` x `cols`, stored in boxes of `box_rows` rows.
        let (what, slots, rows, cols, box_rows) = match layout {
            OutputLayout::Standard => ("D", 1, m, n, 64),
            OutputLayout::TileOrder => (
                "D (tile order)",
                1,
                u64::from(plan.orders()) * u64::from(plan.tile_m()),
                u64::from(tile_n),
                64,
            ),
            // Not read by the kernel (the threads store the rows), encoded for a uniform launch.
            OutputLayout::RowSlots { slots } => (
                "D (row slots)",
                1,
                u64::from(slots.max(1)),
                u64::from(tile_n),
                64,
            ),
            OutputLayout::PeerReduce { ranks } => {
                ("D (this rank's rows)", 1, m / u64::from(ranks), n, 64)
            }
            // Not read by the kernel either (the threads store the rows).
            OutputLayout::PeerRows { rows, .. } => (
                "D (this rank's received rows)",
                1,
                u64::from(rows.max(1)),
                n,
                64,
            ),
            OutputLayout::RankBands { ranks } => {
                // SAFETY: a pure function.
                let box_rows = unsafe { weft_gemm_band_box_rows(ranks) };
                (
                    "D (rank bands)",
                    u64::from(plan.orders()) * u64::from(ranks),
                    u64::from(layout.band_rows(plan)),
                    u64::from(tile_n),
                    box_rows,
                )
            }
        };
        let map_d = if wide {
            encode_wide(
                what,
                d_ptr,
                o.output,
                slots,
                rows,
                cols,
                box_rows,
                tile_n / chunk_cols,
            )?
        } else if matches!(layout, OutputLayout::RankBands { .. }) {
            encode_3d(
                what, d_ptr, o.output, slots, rows, cols, box_rows, chunk_cols,
            )?
        } else {
            encode_2d(what, d_ptr, o.output, rows, cols, box_rows, chunk_cols)?
        };

        let mut p = weft_gemm_params {
            a: map_a,
            b: map_b,
            d: map_d,
            sched: plan.sched,
            alpha: o.alpha,
            beta: o.beta,
            d_ptr,
            comm_ctas: o.comm_ctas,
            bound: self.bound,
            layout: layout.abi(),
            d_wide: u32::from(wide),
            ..Default::default()
        };
        if let OutputLayout::RankBands { ranks } = layout {
            fill_band_boxes(&mut p, ranks);
        }
        // A launch without fusions runs the plain kernel (the fusions compiled out). Split-K on
        // those only, and not with early release, which starts the GEMM beside another kernel
        // (the trace, a fusion, names the CTA the plan's schedule lists): the others run every
        // tile whole. A CUDA graph of a split launch shares the partials too: replay it in order
        // with the Gemm's other launches (one stream), never two at once.
        let set = extras.fusion_set();
        let plain = set == FusionSet::None;
        // Held to the end of the launch, as the claim counter.
        let mut split = match &self.split {
            Some(sp) if plain && !extras.early_release => Some(
                sp.lock()
                    .map_err(|_| anyhow::anyhow!("the GEMM's split-K lock is poisoned"))?,
            ),
            _ => None,
        };
        let _split_keep = match split.as_mut() {
            Some(sp) => {
                let s = stream.cu_stream();
                require!(
                    sp.stream.is_none_or(|prev| prev == s), Options,
                    "a split-K GEMM launches on one stream (its launches share the partials): this Gemm already launched on another stream; make one Gemm per stream or plan it with KSplits::Fixed(1)"
                );
                sp.stream = Some(s);
                let SplitPartials {
                    partials, flags, ..
                } = &mut **sp;
                let (partials, r1) = partials.device_ptr_mut(stream);
                p.split_partials = partials;
                let (flags, r2) = flags.device_ptr_mut(stream);
                p.split_flags = flags;
                Some((r1, r2))
            }
            None => {
                p.sched.k_splits = 1;
                None
            }
        };
        let variant = KernelVariant::of(LaunchNeeds {
            set,
            method_kernel: self.kernels.methods.get(set).is_some(),
            k_splits: p.sched.k_splits,
        });
        let func = match variant {
            KernelVariant::Fused => {
                plan.require_fused_kernel()?;
                self.kernels
                    .fused
                    .as_ref()
                    .context("a plan with a fused kernel loaded without it")?
            }
            KernelVariant::Method(set) => self
                .kernels
                .methods
                .get(set)
                .context("a plan without a fused method's kernel chose it")?,
            KernelVariant::Plain => &self.kernels.plain,
            // Loaded with the plan whenever it may split (k_splits > 1), which a split launch needs.
            KernelVariant::PlainSplit => self
                .kernels
                .plain_split
                .as_ref()
                .context("a split launch of a plan loaded without its split kernel")?,
        };
        let LaunchExtras {
            flags,
            copy_dst,
            trace,
            timeline,
            early_release,
            groups,
            layout: _,
            row_slots,
            peer,
            peer_rows,
            all_reduce,
            all_gather,
        } = extras;
        if let Some(g) = all_gather {
            require!(
                peer.is_none() && peer_rows.is_none() && all_reduce.is_none(),
                Options,
                "GEMM {}: the fused AllGather combines with no other fused collective",
                plan.shape
            );
            require!(flags.is_none() && groups.is_none(), Options, "GEMM {}: the fused AllGather signals through its barriers, not tile flags or wave groups", plan.shape);
            let ranks = g.bar.view.world as u32;
            require!(
                u64::from(g.rows) * u64::from(ranks) == m && g.rows % (plan.tile_m() * plan.cluster_m()) == 0, Shape,
                "GEMM {}: A shards of {} rows on {ranks} ranks do not make m in whole tiles (of whole clusters)",
                plan.shape,
                g.rows
            );
            p.ag_maps = g.maps;
            p.ag_rows = g.rows;
            p.peer_bar = g.bar;
            p.peer_epoch = g.epoch;
            if let Some(c) = g.copy {
                if g.host_copy {
                    require!(o.comm_ctas == 0, Options, "GEMM {}: the copy-engine AllGather copies on the host's streams: plan with comm_ctas = 0 (not {})", plan.shape, o.comm_ctas);
                } else {
                    require!(o.comm_ctas > 0 && c.flag_rows <= 1, Options, "GEMM {}: the inter-SM AllGather copies the shards in communicator CTAs, a flag per tile row: plan with comm_ctas > 0", plan.shape);
                }
                // K chunks: only the AllGather's own kernel polls a flag per chunk (the kernel with
                // every fusion polls each group's first flag alone, and would read the later
                // chunks before they landed); each chunk whole K blocks, the flags covering K.
                if c.k_chunks > 1 {
                    require!(
                        g.host_copy && variant == KernelVariant::Method(FusionSet::AllGather), Options,
                        "GEMM {}: the AllGather's copy in K chunks needs the copy engines and the AllGather's own kernel (a 128- or 256-wide tile, the pipelined epilogue, no other fusion); this launch runs {variant:?}",
                        plan.shape
                    );
                    // SAFETY: a pure function of the schedule (abi/gemm.h).
                    let k_blocks = unsafe { weft_gemm_k_blocks(p.sched) };
                    require!(
                        c.k_chunk_blocks > 0 && k_blocks.div_ceil(c.k_chunk_blocks) == c.k_chunks,
                        Shape,
                        "GEMM {}: {} K chunks of {} K blocks do not cover its {k_blocks} K blocks",
                        plan.shape,
                        c.k_chunks,
                        c.k_chunk_blocks
                    );
                }
                require!(
                    c.shards.world as u32 == ranks && u64::from(c.row_bytes) == k * o.input.bytes() as u64, Options,
                    "GEMM {}: the AllGather copy was made for {} ranks and rows of {} bytes, the launch has {ranks} ranks and rows of {} bytes",
                    plan.shape,
                    c.shards.world,
                    c.row_bytes,
                    k * o.input.bytes() as u64
                );
                p.comm_op = WEFT_GEMM_COMM_ALLGATHER;
                p.ag_copy = weft_gemm_ag_copy {
                    gathered: a_ptr,
                    ..c
                };
            }
        }
        if let Some(t) = all_reduce {
            require!(
                layout == OutputLayout::Standard,
                Options,
                "GEMM {}: the fused AllReduce reads the standard layout, not {}",
                plan.shape,
                layout.name()
            );
            require!(flags.is_none() && groups.is_none() && copy_dst.is_none(), Options, "GEMM {}: the fused AllReduce owns the tile flags (no TileFlags, wave groups or tile copy)", plan.shape);
            p.tile_flags = t.flags;
            p.flag_target = t.flag_target;
            p.flags_sys = 1;
            if let Some(ar) = t.comm {
                require!(o.comm_ctas > 0 && ar.workers == o.comm_ctas, Options, "GEMM {}: the fused AllReduce's {} workers must be the plan's communicator CTAs ({})", plan.shape, ar.workers, o.comm_ctas);
                p.comm_op = WEFT_GEMM_COMM_ALLREDUCE;
                p.allreduce = ar;
            }
        }
        match (layout, peer) {
            (OutputLayout::PeerReduce { ranks }, Some(t)) => {
                require!(
                    t.ranks == ranks && t.bar.view.world as u32 == ranks, Options,
                    "GEMM {}: peer targets for {} ranks given to a launch reducing over {ranks}",
                    plan.shape,
                    t.ranks
                );
                require!(flags.is_none() && groups.is_none(), Options, "GEMM {}: the peer-reduce layout signals through its barriers, not tile flags or wave groups", plan.shape);
                p.peer_maps = t.maps;
                p.peer_rows = plan.shape.m / ranks;
                p.peer_bar = t.bar;
                p.peer_epoch = t.epoch;
            }
            (OutputLayout::PeerReduce { .. }, None) => refuse!(Options, "GEMM {}: the peer-reduce layout needs its peers' outputs and barriers (use weft_signal_gemm::fused::FusedReduceScatter)", plan.shape),
            (_, Some(_)) => refuse!(Options, "GEMM {}: peer targets were given for the {} layout", plan.shape, layout.name()),
            (_, None) => {}
        }
        match (layout, peer_rows) {
            (OutputLayout::PeerRows { ranks, rows }, Some(t)) => {
                require!(
                    t.bar.view.world as u32 == ranks && u64::from(t.table_rows) == m, Options,
                    "GEMM {}: peer rows made for {} ranks and {} rows of A given to a launch over {ranks} ranks and {m} rows",
                    plan.shape,
                    t.bar.view.world,
                    t.table_rows
                );
                require!(flags.is_none() && groups.is_none(), Options, "GEMM {}: the peer-rows layout signals through its barriers, not tile flags or wave groups", plan.shape);
                p.peer_ptrs = t.ptrs;
                p.row_slots = t.table;
                p.peer_rows = rows;
                p.peer_bar = t.bar;
                p.peer_epoch = t.epoch;
            }
            (OutputLayout::PeerRows { .. }, None) => refuse!(Options, "GEMM {}: the peer-rows layout needs its peers' outputs, row table and barriers (use weft_signal_gemm::fused::FusedAllToAll)", plan.shape),
            (_, Some(_)) => refuse!(Options, "GEMM {}: peer rows were given for the {} layout", plan.shape, layout.name()),
            (_, None) => {}
        }
        // (table, entries, slots): a table not checked for these slots, checked on the device
        // before the GEMM.
        let mut slots_check = None;
        match (layout, row_slots) {
            (
                OutputLayout::RowSlots { slots },
                Some(RowSlotTable {
                    table,
                    checked_below,
                }),
            ) => {
                let need = u64::from(plan.tiles()) * u64::from(WEFT_GEMM_TILE_M);
                require!(
                    table.len() as u64 >= need,
                    Length,
                    "GEMM {}: row-slot table has {} entries, needs {need} (128 per tile)",
                    plan.shape,
                    table.len()
                );
                p.row_slots = table.device_ptr(stream).0;
                if checked_below != Some(slots) {
                    slots_check = Some((p.row_slots, need, slots));
                }
            }
            (OutputLayout::RowSlots { .. }, None) => refuse!(
                Options,
                "GEMM {}: the row-slots layout needs its table (LaunchExtras::row_slots)",
                plan.shape
            ),
            (_, Some(_)) => refuse!(
                Options,
                "GEMM {}: a row-slot table was given for the {} layout",
                plan.shape,
                layout.name()
            ),
            (_, None) => {}
        }
        if let Some(g) = groups {
            require!(
                g.groups().fits(plan), Options,
                "wave groups {} were made for another plan ({} orders on {} CTAs) than {} ({} orders on {} CTAs)",
                g.groups(),
                g.groups().planned().0,
                g.groups().planned().1,
                plan.describe(),
                plan.orders(),
                plan.ctas()
            );
            p.groups = g.groups().abi();
            p.group_counters = g.device_ptr(stream);
        }
        let mut _keep = Vec::new();
        let mut launches = None;
        if let Some(f) = flags {
            require!(
                f.tiles == plan.tiles(),
                Options,
                "tile flags made for {} tiles, this plan has {} (one TileFlags per plan)",
                f.tiles,
                plan.tiles()
            );
            // Counted only once the launch is enqueued (below): a rejected launch leaves the
            // flags' epoch where the device will find it.
            p.flag_target = (f.launches + 1) * SIGNALS_PER_TILE;
            let (ptr, r) = f.flags.device_ptr_mut(stream);
            p.tile_flags = ptr;
            _keep.push(r);
            launches = Some(&mut f.launches);
        }
        if let Some(c) = copy_dst {
            require!(
                p.tile_flags != 0,
                Options,
                "the tile-copy communicator needs tile flags"
            );
            require!(
                o.comm_ctas > 0,
                Options,
                "the tile-copy communicator needs a plan with comm_ctas > 0"
            );
            need("copy", c.len(), m * n, format!("{m} x {n}"))?;
            let (ptr, r) = c.device_ptr_mut(stream);
            p.copy_dst = ptr;
            _keep.push(r);
        }
        if let Some(t) = trace {
            need(
                "trace",
                t.len(),
                2 * plan.tiles() as u64,
                "two per tile".into(),
            )?;
            let (ptr, r) = t.device_ptr_mut(stream);
            p.trace = ptr;
            _keep.push(r);
        }
        if let Some(t) = timeline {
            need("timeline", t.len(), 2, "start and end".into())?;
            let (ptr, r) = t.device_ptr_mut(stream);
            p.timeline = ptr;
            _keep.push(r);
        }
        // Held to the end of the launch: the base is advanced only once the launch is enqueued.
        let mut claims = match &self.claims {
            None => None,
            Some(c) => Some(
                c.lock()
                    .map_err(|_| anyhow::anyhow!("the GEMM's claim counter lock is poisoned"))?,
            ),
        };
        if let Some(c) = claims.as_mut() {
            // A graph would replay this launch's claim base, not the counter's next one.
            let capture = stream.capture_status().context("cuStreamIsCapturing")?;
            require!(
                capture == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, Options,
                "a dynamically scheduled GEMM cannot be captured in a CUDA graph (each launch starts at a new claim base); plan it with Scheduling::Static"
            );
            let s = stream.cu_stream();
            require!(
                c.stream.is_none_or(|prev| prev == s), Options,
                "a dynamically scheduled GEMM launches on one stream (its launches must not overlap): this Gemm already launched on another stream; make one Gemm per stream"
            );
            c.stream = Some(s);
            p.claim_base = c.base;
        }
        let claim_keep = claims.as_mut().map(|c| {
            let (ptr, r) = c.counter.device_ptr_mut(stream);
            p.claim_counter = ptr;
            r
        });
        // The rank the kernel's give-up reports name: a peer launch's own, else this Gemm's.
        p.rank = if p.peer_bar.view.world > 0 {
            p.peer_bar.view.rank
        } else if p.comm_op == WEFT_GEMM_COMM_ALLREDUCE {
            p.allreduce.partial.rank
        } else {
            self.rank
        };
        if let Some((table, entries, slots)) = slots_check {
            require!(
                !early_release, Options,
                "GEMM {}: the row-slots layout's table check runs on the stream before the GEMM, so the GEMM cannot be released early by a wait",
                plan.shape
            );
            self.check_row_slots(stream, table, entries, slots, p.rank)?;
        }
        let grid = plan.ctas() + o.comm_ctas;
        let mut attrs = Vec::with_capacity(2);
        if plan.cluster_m() > 1 {
            attrs.push(cluster_attribute(plan.cluster_m()));
        }
        if early_release {
            attrs.push(weft_barrier::early_release_attribute(stream)?);
        }
        // SAFETY: the kernel takes exactly weft_gemm_params by value; the tensor maps and pointers
        // name buffers checked above to hold the shapes the schedule touches, alive until the
        // launch's work is done (stream order; callers keep them alive).
        if attrs.is_empty() {
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (plan.block_threads(), 1, 1),
                shared_mem_bytes: plan.smem_bytes(),
            };
            unsafe { stream.launch_builder(func).arg(&p).launch(cfg) }.map(|_| ())
        } else {
            let cfg = launch_config(plan, grid, stream.cu_stream(), &mut attrs);
            unsafe { weft_sync::launch::launch_ex(stream.context(), func, &cfg, &p) }
        }
        .with_context(|| {
            // Named only on failure: no string is built on the launch path.
            let name = match variant {
                KernelVariant::PlainSplit => plan.plain_split_kernel_name(),
                KernelVariant::Plain => plan.plain_kernel_name(),
                KernelVariant::Fused => plan.kernel_name(),
                KernelVariant::Method(set) => plan.method_kernel_name(set),
            };
            format!("launching {name} ({})", plan.describe())
        })?;
        drop(claim_keep);
        if let Some(l) = launches {
            *l += 1;
        }
        if let Some(c) = claims.as_mut() {
            // SAFETY: a pure function of the launch's schedule.
            let works = unsafe { weft_gemm_work_count(p.sched) };
            c.base = c.base.wrapping_add(works + plan.ctas());
        }
        Ok(())
    }

    /// Enqueues the row-slots table check (kernels/gemm/row_slots_check.cu) on `stream`: an entry
    /// at or past `slots` is reported in this GEMM's error slot and traps, before the GEMM runs.
    fn check_row_slots(
        &self,
        stream: &Arc<CudaStream>,
        table: u64,
        entries: u64,
        slots: u32,
        rank: i32,
    ) -> anyhow::Result<()> {
        let func = match self.row_slots_check.get() {
            Some(f) => f,
            None => {
                let c = &cubins::GEMM_ROW_SLOTS_CHECK;
                let f = c
                    .load(stream.context())
                    .with_context(|| format!("loading {}", c.source))?
                    .load_function("weft_gemm_row_slots_check")?;
                self.row_slots_check.get_or_init(|| f)
            }
        };
        let params = weft_gemm_row_slots_check_params {
            table,
            entries,
            slots,
            rank,
            bound: self.bound,
        };
        let blocks = entries.div_ceil(256).clamp(1, 264) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes exactly this struct; the table holds `entries` u32 (checked by
        // the caller) and stays alive until the GEMM after it has run (stream order).
        unsafe { stream.launch_builder(func).arg(&params).launch(cfg) }
            .context("launching the row-slots table check")?;
        Ok(())
    }

    /// Dynamic scheduling only: (the claim counter's value on the device, the base the host will
    /// give the next launch). Equal once every launch has finished. Synchronises `stream`.
    pub fn claim_counter(&self, stream: &Arc<CudaStream>) -> Result<Option<(u32, u32)>, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Option<(u32, u32)>> {
            let Some(c) = &self.claims else {
                return Ok(None);
            };
            let c = c
                .lock()
                .map_err(|_| anyhow::anyhow!("the GEMM's claim counter lock is poisoned"))?;
            let v = stream.clone_dtoh(&c.counter)?;
            stream.synchronize()?;
            Ok(Some((v[0], c.base)))
        })
    }

    /// After a synchronisation: an error naming the wait that ran past its budget, if any.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> { Ok(self.slot.check()?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    // The plain kernel has every fusion compiled out: a launch that asks for one must not get it
    // (the GPU suites' fused trials then fail or time out). Here: the fusions a CPU can build.
    #[test]
    fn fusions_are_not_fusion_free() {
        let plain = LaunchExtras::<bf16>::default();
        assert!(plain.fusion_free());
        let not_fusions = LaunchExtras::<bf16> {
            early_release: true,
            ..Default::default()
        };
        assert!(
            not_fusions.fusion_free(),
            "early release is a launch attribute, not a fusion"
        );
        for layout in [
            OutputLayout::TileOrder,
            OutputLayout::RankBands { ranks: 2 },
            OutputLayout::RowSlots { slots: 4 },
            OutputLayout::PeerReduce { ranks: 2 },
            OutputLayout::PeerRows { ranks: 2, rows: 8 },
        ] {
            let e = LaunchExtras::<bf16> {
                layout,
                ..Default::default()
            };
            assert!(!e.fusion_free(), "{}", layout.name());
        }
        let bar = weft_sync_counters::default();
        let peer = LaunchExtras::<bf16> {
            peer: Some(PeerReduceTarget {
                maps: 0,
                ranks: 2,
                bar,
                epoch: 0,
            }),
            ..Default::default()
        };
        assert!(!peer.fusion_free());
        let peer_rows = LaunchExtras::<bf16> {
            peer_rows: Some(PeerRowsTarget {
                ptrs: 0,
                table: 0,
                table_rows: 0,
                bar,
                epoch: 0,
            }),
            ..Default::default()
        };
        assert!(!peer_rows.fusion_free());
        let all_reduce = LaunchExtras::<bf16> {
            all_reduce: Some(AllReduceTarget {
                flags: 0,
                flag_target: 0,
                comm: None,
            }),
            ..Default::default()
        };
        assert!(!all_reduce.fusion_free());
        let all_gather = LaunchExtras::<bf16> {
            all_gather: Some(AllGatherSource {
                maps: 0,
                rows: 0,
                bar,
                epoch: 0,
                copy: None,
                host_copy: false,
            }),
            ..Default::default()
        };
        assert!(!all_gather.fusion_free());
    }
}
