//! Reorder maps (signal-gemm II). The GEMM's epilogue writes each tile where the communication
//! wants it ([`OutputLayout::TileOrder`] for AllReduce: whole tiles in execution order, so each
//! wave group is one contiguous range; [`OutputLayout::RankBands`] for ReduceScatter: each tile's
//! row bands in their rank's part of the group's range), and [`TileOrderMap`] /
//! [`RankBandMap`](crate::RankBandMap) restore the standard row-major layout afterwards, bit for
//! bit, alone or fused into a residual add or an RMSNorm.

use crate::dtype::{Dtype, GemmElement};
use crate::error::require;
use crate::error::GemmError;
use crate::plan::GemmPlan;
use anyhow::Context;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use half::bf16;
use std::sync::Arc;
use weft_kernels::abi::{
    weft_gemm_band_rows, weft_gemm_restore_params, WEFT_GEMM_LAYOUT_PEER_REDUCE,
    WEFT_GEMM_LAYOUT_PEER_ROWS, WEFT_GEMM_LAYOUT_RANK_BANDS, WEFT_GEMM_LAYOUT_ROW_SLOTS,
    WEFT_GEMM_LAYOUT_STANDARD, WEFT_GEMM_LAYOUT_TILE_ORDER, WEFT_GEMM_PEER_ROW_MASK,
    WEFT_GEMM_RESTORE_ADD, WEFT_GEMM_RESTORE_COPY, WEFT_GEMM_RESTORE_RMSNORM,
};
use weft_kernels::cubins;

/// The most ranks [`OutputLayout::RankBands`] cuts a tile for (every band then holds rows).
pub const MAX_BAND_RANKS: u32 = 8;

/// Where the GEMM's epilogue stores D.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputLayout {
    /// m × n row-major.
    #[default]
    Standard,
    /// The AllReduce reorder map: the tile of order o at rows [o·128, o·128 + 128) of an
    /// (orders·128) × tile_n row-major matrix (WEFT_GEMM_LAYOUT_TILE_ORDER). A ragged tile's
    /// missing rows and columns hold zeros. Needs beta = 0.
    TileOrder,
    /// The ReduceScatter reorder map for `ranks` ranks (WEFT_GEMM_LAYOUT_RANK_BANDS): each tile's
    /// 128 rows, as 16 atoms of 8 rows, dealt in order to `ranks` bands (band r gets 16 / ranks
    /// atoms, one more if r < 16 % ranks); inside each wave group's range, part r holds band r
    /// of every tile of the group in execution order, so a ReduceScatter of the range gives rank
    /// r whole rows. Bands are slots of the largest band's rows × tile_n (orders · ranks slots);
    /// a shorter band's last slot rows are not written (ranks not dividing 16 send up to 8 rows
    /// of padding per slot). Needs beta = 0; the groups are those of the launch's counters (none:
    /// one group).
    RankBands { ranks: u32 },
    /// The All-to-All reorder map (WEFT_GEMM_LAYOUT_ROW_SLOTS): each row of a tile (tile_n
    /// columns, a subtoken) in its own slot of a `slots` × tile_n buffer, the slot given by a
    /// table (`LaunchExtras::row_slots`, see [`AllToAllMap`](crate::AllToAllMap)). Needs beta = 0.
    RowSlots { slots: u32 },
    /// The fused GEMM + ReduceScatter's output (WEFT_GEMM_LAYOUT_PEER_REDUCE, signal-gemm III):
    /// rank q of `ranks` owns standard rows [q·m/ranks, (q + 1)·m/ranks) and D is those rows
    /// (m/ranks × n); every rank's tiles are reduce-added into their owner's D through peer
    /// memory. m/ranks must be a multiple of 64. Only through
    /// [`FusedReduceScatter`](crate::fused::FusedReduceScatter), which owns the peers' buffers
    /// and barriers. Needs beta = 0.
    PeerReduce { ranks: u32 },
    /// The fused GEMM + All-to-All's output (WEFT_GEMM_LAYOUT_PEER_ROWS): every rank's D is
    /// `rows` × n (the most rows any rank receives) and each row of the product is stored, by
    /// the epilogue's threads, into the row of its destination's D a table names (local or
    /// through peer memory). Only through [`FusedAllToAll`](crate::fused::FusedAllToAll), which
    /// owns the peers' buffers, the table and the barriers. Needs beta = 0.
    PeerRows { ranks: u32, rows: u32 },
}

impl OutputLayout {
    /// Refuses a layout the plan cannot store.
    pub fn check(self, plan: &GemmPlan) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            if let OutputLayout::RankBands { ranks } = self {
                require!(
                    (1..=MAX_BAND_RANKS).contains(&ranks), Unsupported,
                    "the rank-bands layout cuts a tile for 1 to {MAX_BAND_RANKS} ranks, asked for {ranks} ({})",
                    plan.describe()
                );
            }
            if let OutputLayout::PeerReduce { ranks } = self {
                let m = plan.shape.m;
                require!(
                    (1..=MAX_BAND_RANKS).contains(&ranks),
                    Unsupported,
                    "the fused ReduceScatter spans 1 to {MAX_BAND_RANKS} ranks, asked for {ranks} ({})",
                    plan.describe()
                );
                require!(
                    m.is_multiple_of(ranks) && (m / ranks).is_multiple_of(64), Shape,
                    "GEMM {}: the fused ReduceScatter gives each of {ranks} ranks m / {ranks} rows, which must be a whole multiple of 64 (m = {m} gives {})",
                    plan.shape,
                    f64::from(m) / f64::from(ranks)
                );
            }
            if let OutputLayout::PeerRows { ranks, rows } = self {
                require!(
                    (1..=MAX_BAND_RANKS).contains(&ranks),
                    Unsupported,
                    "the fused All-to-All spans 1 to {MAX_BAND_RANKS} ranks, asked for {ranks} ({})",
                    plan.describe()
                );
                require!(
                    rows <= WEFT_GEMM_PEER_ROW_MASK + 1, Shape,
                    "GEMM {}: the fused All-to-All addresses at most {} rows per rank, asked for {rows}",
                    plan.shape,
                    WEFT_GEMM_PEER_ROW_MASK + 1
                );
            }
            Ok(())
        })
    }

    /// Elements of D this layout needs for `plan`.
    pub fn elements(self, plan: &GemmPlan) -> u64 {
        match self {
            OutputLayout::Standard => u64::from(plan.shape.m) * u64::from(plan.shape.n),
            OutputLayout::TileOrder => {
                u64::from(plan.orders()) * u64::from(plan.tile_m()) * u64::from(plan.tile_n())
            }
            OutputLayout::RankBands { ranks } => {
                u64::from(plan.orders())
                    * u64::from(ranks)
                    * u64::from(self.band_rows(plan))
                    * u64::from(plan.tile_n())
            }
            OutputLayout::RowSlots { slots } => u64::from(slots) * u64::from(plan.tile_n()),
            OutputLayout::PeerReduce { ranks } => {
                u64::from(plan.shape.m / ranks.max(1)) * u64::from(plan.shape.n)
            }
            OutputLayout::PeerRows { rows, .. } => u64::from(rows) * u64::from(plan.shape.n),
        }
    }

    /// Rows of one band slot (RankBands; the tile's rows otherwise).
    pub fn band_rows(self, plan: &GemmPlan) -> u32 {
        match self {
            // SAFETY: a pure function.
            OutputLayout::RankBands { ranks } => unsafe {
                weft_gemm_band_rows(ranks.clamp(1, MAX_BAND_RANKS))
            },
            _ => plan.tile_m(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OutputLayout::Standard => "standard",
            OutputLayout::TileOrder => "tile-order",
            OutputLayout::RankBands { .. } => "rank-bands",
            OutputLayout::RowSlots { .. } => "row-slots",
            OutputLayout::PeerReduce { .. } => "peer-reduce",
            OutputLayout::PeerRows { .. } => "peer-rows",
        }
    }

    /// What D holds in this layout, for messages.
    pub fn describe(self, plan: &GemmPlan) -> String {
        match self {
            OutputLayout::Standard => format!("{} x {}", plan.shape.m, plan.shape.n),
            OutputLayout::TileOrder => format!(
                "{} tiles of {} x {} in execution order",
                plan.orders(),
                plan.tile_m(),
                plan.tile_n()
            ),
            OutputLayout::RankBands { ranks } => format!(
                "{} tiles x {ranks} band slots of {} x {}",
                plan.orders(),
                self.band_rows(plan),
                plan.tile_n()
            ),
            OutputLayout::RowSlots { slots } => format!("{slots} row slots of {}", plan.tile_n()),
            OutputLayout::PeerReduce { ranks } => format!(
                "this rank's {} x {} of {ranks} ranks",
                plan.shape.m / ranks.max(1),
                plan.shape.n
            ),
            OutputLayout::PeerRows { ranks, rows } => format!(
                "this rank's {rows} x {} received rows of {ranks} ranks",
                plan.shape.n
            ),
        }
    }

    pub(crate) fn abi(self) -> u32 {
        match self {
            OutputLayout::Standard => WEFT_GEMM_LAYOUT_STANDARD,
            OutputLayout::TileOrder => WEFT_GEMM_LAYOUT_TILE_ORDER,
            OutputLayout::RankBands { .. } => WEFT_GEMM_LAYOUT_RANK_BANDS,
            OutputLayout::RowSlots { .. } => WEFT_GEMM_LAYOUT_ROW_SLOTS,
            OutputLayout::PeerReduce { .. } => WEFT_GEMM_LAYOUT_PEER_REDUCE,
            OutputLayout::PeerRows { .. } => WEFT_GEMM_LAYOUT_PEER_ROWS,
        }
    }
}

/// The post-communication step fused into the restore.
pub enum Restore<'a> {
    /// dst = src, bit for bit.
    Copy,
    /// dst = bf16(src + residual) (bf16 output only).
    ResidualAdd { residual: &'a CudaSlice<bf16> },
    /// x = src (+ residual); dst = bf16(x · rsqrt(mean(x²) + eps) · gamma), per row (bf16 only).
    RmsNorm {
        residual: Option<&'a CudaSlice<bf16>>,
        gamma: &'a CudaSlice<bf16>,
        eps: f32,
    },
}

/// The geometry of one restore: a buffer of slots in execution order → `rows` × n row-major,
/// output row i from tile row i / tile_rows, row i % tile_rows of the tile's slot (see
/// weft_gemm_restore_params).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotGeometry {
    pub rows: u32,
    pub tile_rows: u32,
    pub slot_rows: u32,
}

/// The tile → slot table of a plan on the device, and the restore kernels (kernels/gemm/restore.cu).
pub(crate) struct SlotRestore {
    plan: GemmPlan,
    slot_of_tile: CudaSlice<u32>,
    restore: CudaFunction,
    rmsnorm: CudaFunction,
    blocks: u32,
}

impl SlotRestore {
    /// The table for `plan` (listed from the kernel's scheduler), uploaded on `stream`.
    pub fn new(stream: &Arc<CudaStream>, plan: &GemmPlan) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let mut table = vec![u32::MAX; plan.tiles() as usize];
            for t in plan.schedule() {
                table[(t.tm * plan.tiles_n() + t.tn) as usize] = t.order;
            }
            anyhow::ensure!(
                !table.contains(&u32::MAX),
                "the schedule of {} misses a tile",
                plan.describe()
            );
            let slot_of_tile = stream
                .clone_htod(&table)
                .context("uploading the tile -> slot table")?;
            let ctx = stream.context();
            let module = cubins::GEMM_RESTORE
                .load(ctx)
                .with_context(|| format!("loading {}", cubins::GEMM_RESTORE.source))?;
            let restore = module
                .load_function("weft_gemm_restore")
                .context("kernels/gemm/restore.cu: weft_gemm_restore")?;
            let rmsnorm = module
                .load_function("weft_gemm_restore_rmsnorm")
                .context("kernels/gemm/restore.cu: weft_gemm_restore_rmsnorm")?;
            let sms = crate::gemm::device_sms(ctx)?;
            stream.synchronize()?;
            Ok(Self {
                plan: plan.clone(),
                slot_of_tile,
                restore,
                rmsnorm,
                blocks: 4 * sms,
            })
        })
    }

    /// Refuses what [`launch`](Self::launch) would refuse, given the buffers' lengths
    /// (`src_need`: the slot buffer's elements; `what`: the map, for messages).
    pub fn check<T: GemmElement>(
        &self,
        what: &str,
        geo: SlotGeometry,
        src_need: u64,
        src_len: usize,
        dst_len: usize,
        step: &Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let plan = &self.plan;
            let (rows, n) = (geo.rows, plan.shape.n);
            require!(
                src_len as u64 >= src_need,
                Length,
                "{what} restore: the slot buffer has {src_len} elements, {} needs {src_need}",
                plan.describe()
            );
            let out = u64::from(rows) * u64::from(n);
            require!(
                dst_len as u64 >= out,
                Length,
                "{what} restore: output has {dst_len} elements, needs {rows} x {n}"
            );
            require!(
                plan.options.output == T::DTYPE,
                Options,
                "{what} restore: the plan's output is {}, given {}",
                plan.options.output,
                T::DTYPE
            );
            let residual_ok = |r: &CudaSlice<bf16>| -> anyhow::Result<()> {
                require!(
                    r.len() as u64 >= out,
                    Length,
                    "{what} restore: residual has {} elements, needs {rows} x {n}",
                    r.len()
                );
                Ok(())
            };
            match step {
                Restore::Copy => {}
                Restore::ResidualAdd { residual } => {
                    require!(
                        T::DTYPE == Dtype::Bf16,
                        Options,
                        "{what} restore with a residual add needs bf16 output, the plan's is {}",
                        T::DTYPE
                    );
                    residual_ok(residual)?;
                }
                Restore::RmsNorm {
                    residual,
                    gamma,
                    eps,
                } => {
                    require!(
                        T::DTYPE == Dtype::Bf16,
                        Options,
                        "{what} restore with RMSNorm needs bf16 output, the plan's is {}",
                        T::DTYPE
                    );
                    require!(
                        gamma.len() >= n as usize,
                        Length,
                        "{what} restore: RMSNorm gamma has {} elements, needs n = {n}",
                        gamma.len()
                    );
                    require!(
                        eps.is_finite() && *eps >= 0.0,
                        Options,
                        "{what} restore: RMSNorm eps must be finite and >= 0, got {eps}"
                    );
                    if let Some(r) = residual {
                        residual_ok(r)?;
                    }
                }
            }
            Ok(())
        })
    }

    /// `dst` from `src` with `step` fused; the caller has run [`check`](Self::check).
    pub fn launch<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        geo: SlotGeometry,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        step: Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let plan = &self.plan;
            if geo.rows == 0 {
                return Ok(());
            }
            // The guards live to the end of the launch (they order other streams when cudarc's event
            // tracking is on).
            let (src_ptr, _gs) = src.device_ptr(stream);
            let (dst_ptr, _gd) = dst.device_ptr_mut(stream);
            let (table_ptr, _gt) = self.slot_of_tile.device_ptr(stream);
            let mut keep = Vec::new();
            let mut p = weft_gemm_restore_params {
                src: src_ptr,
                dst: dst_ptr,
                slot_of_tile: table_ptr,
                m: geo.rows,
                n: plan.shape.n,
                tile_n: plan.tile_n(),
                tiles_n: plan.tiles_n(),
                tile_rows: geo.tile_rows,
                slot_rows: geo.slot_rows,
                elem_bytes: T::DTYPE.bytes() as u32,
                op: WEFT_GEMM_RESTORE_COPY,
                ..Default::default()
            };
            let func = match step {
                Restore::Copy => &self.restore,
                Restore::ResidualAdd { residual } => {
                    p.op = WEFT_GEMM_RESTORE_ADD;
                    let (ptr, g) = residual.device_ptr(stream);
                    p.residual = ptr;
                    keep.push(g);
                    &self.restore
                }
                Restore::RmsNorm {
                    residual,
                    gamma,
                    eps,
                } => {
                    p.op = WEFT_GEMM_RESTORE_RMSNORM;
                    let (ptr, g) = gamma.device_ptr(stream);
                    p.gamma = ptr;
                    keep.push(g);
                    p.eps = eps;
                    if let Some(r) = residual {
                        let (ptr, g) = r.device_ptr(stream);
                        p.residual = ptr;
                        keep.push(g);
                    }
                    &self.rmsnorm
                }
            };
            let grid = if p.op == WEFT_GEMM_RESTORE_RMSNORM {
                geo.rows.min(self.blocks * 2)
            } else {
                self.blocks
            };
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernels take exactly this struct; every buffer was checked (by `check`) to
            // hold what the geometry makes them read or write and lives until the stream has run it.
            unsafe { stream.launch_builder(func).arg(&p).launch(cfg) }
                .context("launching the restore kernel")?;
            drop(keep);
            Ok(())
        })
    }
}

/// The AllReduce map: a TILE_ORDER buffer → the standard m × n layout.
pub struct TileOrderMap {
    slots: SlotRestore,
    plan: GemmPlan,
}

impl TileOrderMap {
    /// The table for `plan`, uploaded on `stream`.
    pub fn new(stream: &Arc<CudaStream>, plan: &GemmPlan) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            Ok(Self {
                slots: SlotRestore::new(stream, plan)?,
                plan: plan.clone(),
            })
        })
    }

    fn geometry(&self) -> SlotGeometry {
        let tm = self.plan.tile_m();
        SlotGeometry {
            rows: self.plan.shape.m,
            tile_rows: tm,
            slot_rows: tm,
        }
    }

    /// Refuses what [`restore`](Self::restore) would refuse, given the buffers' lengths.
    pub fn check<T: GemmElement>(
        &self,
        src_len: usize,
        dst_len: usize,
        step: &Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let need = OutputLayout::TileOrder.elements(&self.plan);
            self.slots
                .check::<T>("tile-order", self.geometry(), need, src_len, dst_len, step)
                .map_err(anyhow::Error::from)
        })
    }

    /// `dst` (m × n, standard) from `src` (the TILE_ORDER buffer), with `step` fused.
    pub fn restore<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        step: Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.check::<T>(src.len(), dst.len(), &step)?;
            self.slots
                .launch(stream, self.geometry(), src, dst, step)
                .map_err(anyhow::Error::from)
        })
    }
}
