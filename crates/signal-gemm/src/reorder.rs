//! Reorder maps (signal-gemm II). The GEMM's epilogue writes each tile where the communication
//! wants it ([`OutputLayout::TileOrder`]: whole tiles in execution order, so each wave group is one
//! contiguous range for NCCL), and [`TileOrderMap`] restores the standard m × n layout afterwards,
//! bit for bit, alone or fused into a residual add or an RMSNorm.

use crate::dtype::{Dtype, GemmElement};
use crate::plan::GemmPlan;
use anyhow::{ensure, Context};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use half::bf16;
use std::sync::Arc;
use weft_kernels::abi::{
    weft_gemm_restore_params, WEFT_GEMM_RESTORE_ADD, WEFT_GEMM_RESTORE_COPY, WEFT_GEMM_RESTORE_RMSNORM,
};
use weft_kernels::cubins;

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
}

impl OutputLayout {
    /// Elements of D this layout needs for `plan`.
    pub fn elements(self, plan: &GemmPlan) -> u64 {
        match self {
            OutputLayout::Standard => u64::from(plan.shape.m) * u64::from(plan.shape.n),
            OutputLayout::TileOrder => u64::from(plan.orders()) * u64::from(plan.tile_m()) * u64::from(plan.tile_n()),
        }
    }
}

/// The tile → slot table of a plan's TILE_ORDER layout on the device, and the restore kernels.
pub struct TileOrderMap {
    plan: GemmPlan,
    slot_of_tile: CudaSlice<u32>,
    restore: CudaFunction,
    rmsnorm: CudaFunction,
    blocks: u32,
}

/// The post-communication step fused into the restore.
pub enum Restore<'a> {
    /// dst = src, bit for bit.
    Copy,
    /// dst = bf16(src + residual) (bf16 output only).
    ResidualAdd { residual: &'a CudaSlice<bf16> },
    /// x = src (+ residual); dst = bf16(x · rsqrt(mean(x²) + eps) · gamma), per row (bf16 only).
    RmsNorm { residual: Option<&'a CudaSlice<bf16>>, gamma: &'a CudaSlice<bf16>, eps: f32 },
}

impl TileOrderMap {
    /// The table for `plan` (listed from the kernel's scheduler), uploaded on `stream`.
    pub fn new(stream: &Arc<CudaStream>, plan: &GemmPlan) -> anyhow::Result<Self> {
        let mut table = vec![u32::MAX; plan.tiles() as usize];
        for t in plan.schedule() {
            table[(t.tm * plan.tiles_n() + t.tn) as usize] = t.order;
        }
        ensure!(!table.contains(&u32::MAX), "the schedule of {} misses a tile", plan.describe());
        let slot_of_tile = stream.clone_htod(&table).context("uploading the tile-order map")?;
        let ctx = stream.context();
        let module = cubins::GEMM_RESTORE.load(ctx).with_context(|| format!("loading {}", cubins::GEMM_RESTORE.source))?;
        let restore = module.load_function("weft_gemm_restore").context("kernels/gemm/restore.cu: weft_gemm_restore")?;
        let rmsnorm = module.load_function("weft_gemm_restore_rmsnorm").context("kernels/gemm/restore.cu: weft_gemm_restore_rmsnorm")?;
        let sms = crate::gemm::device_sms(ctx)?;
        stream.synchronize()?;
        Ok(Self { plan: plan.clone(), slot_of_tile, restore, rmsnorm, blocks: 4 * sms })
    }

    /// Refuses what [`restore`](Self::restore) would refuse, given the buffers' lengths.
    pub fn check<T: GemmElement>(&self, src_len: usize, dst_len: usize, step: &Restore<'_>) -> anyhow::Result<()> {
        let plan = &self.plan;
        let (m, n) = (plan.shape.m, plan.shape.n);
        let need_src = OutputLayout::TileOrder.elements(plan);
        ensure!(src_len as u64 >= need_src, "restore: TILE_ORDER buffer has {src_len} elements, {} needs {need_src}", plan.describe());
        ensure!(dst_len as u64 >= u64::from(m) * u64::from(n), "restore: output has {dst_len} elements, needs {m} x {n}");
        ensure!(plan.options.output == T::DTYPE, "restore: the plan's output is {}, given {}", plan.options.output, T::DTYPE);
        let mn = u64::from(m) * u64::from(n);
        let residual_ok = |r: &CudaSlice<bf16>| {
            ensure!(r.len() as u64 >= mn, "restore: residual has {} elements, needs {m} x {n}", r.len());
            Ok(())
        };
        match step {
            Restore::Copy => {}
            Restore::ResidualAdd { residual } => {
                ensure!(T::DTYPE == Dtype::Bf16, "restore with a residual add needs bf16 output, the plan's is {}", T::DTYPE);
                residual_ok(residual)?;
            }
            Restore::RmsNorm { residual, gamma, eps } => {
                ensure!(T::DTYPE == Dtype::Bf16, "restore with RMSNorm needs bf16 output, the plan's is {}", T::DTYPE);
                ensure!(gamma.len() >= n as usize, "restore: RMSNorm gamma has {} elements, needs n = {n}", gamma.len());
                ensure!(eps.is_finite() && *eps >= 0.0, "restore: RMSNorm eps must be finite and >= 0, got {eps}");
                if let Some(r) = residual {
                    residual_ok(r)?;
                }
            }
        }
        Ok(())
    }

    /// `dst` (m × n, standard) from `src` (the TILE_ORDER buffer), with `step` fused.
    pub fn restore<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        step: Restore<'_>,
    ) -> anyhow::Result<()> {
        self.check::<T>(src.len(), dst.len(), &step)?;
        let plan = &self.plan;
        let (m, n) = (plan.shape.m, plan.shape.n);
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
            m,
            n,
            tile_m: plan.tile_m(),
            tile_n: plan.tile_n(),
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
            Restore::RmsNorm { residual, gamma, eps } => {
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
        let grid = if p.op == WEFT_GEMM_RESTORE_RMSNORM { m.min(self.blocks * 2) } else { self.blocks };
        let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernels take exactly this struct; every buffer was checked to hold what the
        // plan's shape makes them read or write and lives until the stream has run the launch.
        unsafe { stream.launch_builder(func).arg(&p).launch(cfg) }.context("launching the restore kernel")?;
        drop(keep);
        Ok(())
    }
}
