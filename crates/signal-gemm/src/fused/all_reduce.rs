//! GEMM + AllReduce by tile flags (weft_tile_allreduce_params, abi/gemm.h; the worker is
//! kernels/include/weft/gemm/tile_allreduce.cuh). Every rank's GEMM stores its partial product
//! in a PGL and raises each tile's flag at system scope; the tile's owner (tile index % world)
//! waits for every rank's flag, sums the partials in fp32 in rank order and writes the bf16 sum
//! into every rank's output. So every rank's output holds the same bits. The workers are either
//! the GEMM's own communicator CTAs ([`AllReduceMethod::Inter`]) or the CTAs of a separate kernel
//! on a second stream, running beside the GEMM on the SMs its `sm_margin` leaves
//! ([`AllReduceMethod::DistFuse`]). An END barrier inside the workers makes the output complete,
//! and every rank's reads of this rank's partials finished, when the launch that ran them ends.

use super::collective_plan::{agree_on_plan, check_resident, copy_own_buffer, synchronize_checked};
use crate::dtype::{Dtype, GemmElement};
use crate::error::agree;
use crate::error::require;
use crate::error::GemmError;
use crate::gemm::{device_sms, AllReduceTarget, Gemm, LaunchExtras};
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::SIGNALS_PER_TILE;
use anyhow::Context;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use half::bf16;
use std::sync::Arc;
use weft_kernels::abi::weft_tile_allreduce_params;
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{Backend, Pgl, Shape};
use weft_sync::{Counters, WaitBudget};

/// Threads of a DistFuse worker CTA.
const DISTFUSE_THREADS: u32 = 512;

/// Where the reduction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduceMethod {
    /// In `comm_ctas` communicator CTAs of the GEMM kernel itself (on SMs of their own).
    Inter { comm_ctas: u32 },
    /// In a kernel of `workers` CTAs on a second stream, beside the GEMM; the GEMM's
    /// `sm_margin` must leave them room.
    DistFuse { workers: u32 },
}

impl AllReduceMethod {
    pub fn name(self) -> &'static str {
        match self {
            AllReduceMethod::Inter { .. } => "fused-inter",
            AllReduceMethod::DistFuse { .. } => "distfuse",
        }
    }

    fn workers(self) -> u32 {
        match self {
            AllReduceMethod::Inter { comm_ctas } => comm_ctas,
            AllReduceMethod::DistFuse { workers } => workers,
        }
    }
}

/// One rank's fused GEMM + AllReduce (bf16) for a fixed shape, world and method.
pub struct FusedAllReduce {
    gemm: Gemm,
    method: AllReduceMethod,
    partial: Pgl<bf16>,
    out: Pgl<bf16>,
    flags: Pgl<u64>,
    bar: Counters,
    /// The orders of the tiles this rank owns (tile index % world == rank), ascending.
    owned_orders: CudaSlice<u32>,
    /// Launches enqueued (tile flags reach SIGNALS_PER_TILE × launches).
    launches: u64,
    /// Set when a run enqueued the GEMM but not its workers: the flags and the END epoch then
    /// disagree with the peers', and every later run is refused.
    broken: Option<String>,
    /// DistFuse: the worker kernel and its stream.
    distfuse: Option<(CudaFunction, Arc<CudaStream>)>,
}

impl FusedAllReduce {
    /// Collective over `rdzv`'s ranks: plans the GEMM (bf16 in and out, beta 0; for `Inter` with
    /// `comm_ctas` communicator CTAs), the same on every rank, and allocates the partials,
    /// outputs, tile flags and the END counter.
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        method: AllReduceMethod,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let world = rdzv.world();
            let mut gemm = agree(
                rdzv,
                "fused GEMM + AllReduce plan",
                Self::plan_gemm(ctx, shape, options, method, world),
            )?;
            // DistFuse launches carry no peer target that names the rank.
            gemm.set_rank(rdzv.rank());
            // The workers' count is in every rank's END target: it must be agreed as well.
            let what = "fused GEMM + AllReduce";
            let plan = gemm.plan();
            agree_on_plan(
                rdzv,
                what,
                &format!(
                    "{} {} with {} workers",
                    plan.describe(),
                    method.name(),
                    method.workers()
                ),
            )?;
            let distfuse_workers = if let AllReduceMethod::DistFuse { workers } = method {
                workers
            } else {
                0
            };
            check_resident(
                rdzv,
                ctx,
                what,
                plan.ctas() + plan.options.comm_ctas + distfuse_workers,
            )?;
            let (m, n) = (shape.m, shape.n);
            let partial = Pgl::<bf16>::alloc(rdzv, ctx, Shape::new(1, 1, m, n), Backend::default())
                .context("allocating the fused AllReduce's partials")?;
            let out = Pgl::<bf16>::alloc(rdzv, ctx, Shape::new(1, 1, m, n), Backend::default())
                .context("allocating the fused AllReduce's outputs")?;
            let flags = Pgl::<u64>::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, 1, plan.tiles()),
                Backend::default(),
            )
            .context("allocating the fused AllReduce's tile flags")?;
            let bar = Counters::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, 1, 1),
                WaitBudget::default_for(ctx)?,
            )?;
            let owned_orders = stream
                .clone_htod(&owned_orders(plan, rdzv.rank(), world))
                .context("copying the fused AllReduce's owned tile list")?;
            let distfuse = match method {
                AllReduceMethod::Inter { .. } => None,
                AllReduceMethod::DistFuse { .. } => {
                    let module = cubins::GEMM_TILE_ALLREDUCE.load(ctx).with_context(|| {
                        format!("loading {}", cubins::GEMM_TILE_ALLREDUCE.source)
                    })?;
                    let func = module.load_function("weft_gemm_tile_allreduce")?;
                    let side = ctx.new_stream().context("creating the DistFuse stream")?;
                    Some((func, side))
                }
            };
            stream.synchronize()?;
            Ok(Self {
                gemm,
                method,
                partial,
                out,
                flags,
                bar,
                owned_orders,
                launches: 0,
                broken: None,
                distfuse,
            })
        })
    }

    fn plan_gemm(
        ctx: &Arc<CudaContext>,
        shape: GemmShape,
        options: GemmOptions,
        method: AllReduceMethod,
        world: usize,
    ) -> anyhow::Result<Gemm> {
        require!(
            world <= 8,
            Unsupported,
            "the fused AllReduce spans at most 8 ranks; this job has {world}"
        );
        require!(
            options.input == Dtype::Bf16 && options.output == Dtype::Bf16, Options,
            "the fused AllReduce sums bf16 partials: GemmOptions input and output must be bf16, have {} -> {}",
            options.input,
            options.output
        );
        require!(
            options.beta == 0.0,
            Options,
            "the fused AllReduce stores fresh partials: beta must be 0, have {}",
            options.beta
        );
        require!(
            method.workers() > 0,
            Options,
            "{}: at least one worker CTA is needed",
            method.name()
        );
        let options = match method {
            AllReduceMethod::Inter { comm_ctas } => {
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
            AllReduceMethod::DistFuse { workers } => {
                require!(options.comm_ctas == 0, Options, "distfuse runs its workers in a kernel of their own: GemmOptions::comm_ctas must be 0");
                require!(
                    options.sm_margin >= workers, Options,
                    "distfuse's {workers} worker CTAs run beside the GEMM: GemmOptions::sm_margin ({}) must leave them at least {workers} SMs",
                    options.sm_margin
                );
                options
            }
        };
        let plan = GemmPlan::new(device_sms(ctx)?, shape, options)?;
        plan.require_fused_kernel()?;
        Gemm::from_plan(ctx, plan).map_err(anyhow::Error::from)
    }

    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    pub fn plan(&self) -> &GemmPlan {
        self.gemm.plan()
    }

    pub fn method(&self) -> AllReduceMethod {
        self.method
    }

    /// This rank's output (m × n, row-major): the sum over ranks, valid once `run` finished.
    pub fn output(&self) -> &Pgl<bf16> {
        &self.out
    }

    /// Bounds the workers' waits (tile flags, END barrier); default weft-sync's budget.
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.bar.set_budget(budget);
    }

    /// Enqueues out = Σ over ranks of A_rank · B_rank on `stream` (DistFuse: the workers on its
    /// second stream, joined back). Every rank must call it the same number of times; read the
    /// previous output (stream-ordered) before the next run.
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
                "the fused AllReduce was made on another context than the stream's"
            );
            if let Some(why) = &self.broken {
                anyhow::bail!("this fused AllReduce is out of step with its peers since an earlier run failed half-enqueued ({why}); make a new one on every rank");
            }
            let flag_target = (self.launches + 1) * SIGNALS_PER_TILE;
            let (owned_ptr, _owned_read) = self.owned_orders.device_ptr(stream);
            let params = weft_tile_allreduce_params {
                partial: self.partial.view(),
                out: self.out.view(),
                flags: self.flags.view(),
                bar: self.bar.device()?,
                sched: self.plan().sched,
                flag_target,
                epoch: self.bar.epoch() + 1,
                owned_orders: owned_ptr,
                owned_count: self.owned_orders.len() as u32,
                workers: self.method.workers(),
            };
            let inter = matches!(self.method, AllReduceMethod::Inter { .. });
            let target = AllReduceTarget {
                flags: self.flags.local_ptr(),
                flag_target,
                comm: inter.then_some(params),
            };
            let extras = LaunchExtras::<bf16> {
                all_reduce: Some(target),
                ..Default::default()
            };
            if let Some((_, side)) = &self.distfuse {
                // The workers start after everything before on `stream` (their reads of the previous
                // run's buffers are done, the GEMM's previous launch too), beside this GEMM.
                side.join(stream)?;
            }
            // SAFETY: the partials PGL holds m × n bf16, the GEMM's standard output.
            unsafe {
                self.gemm.launch_into(
                    stream,
                    (a_ptr, a.len()),
                    b,
                    self.partial.local_ptr(),
                    self.partial.len(),
                    extras,
                )?
            };
            // Counted once the GEMM is enqueued (its flags will rise; Inter: the workers are its own
            // CTAs): a refused launch leaves the flags and the epoch where they are.
            self.launches += 1;
            self.bar.begin(1);
            let Some((func, side)) = &self.distfuse else {
                return Ok(());
            };
            let cfg = LaunchConfig {
                grid_dim: (params.workers, 1, 1),
                block_dim: (DISTFUSE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel takes exactly this struct; its views name PGLs of this object,
            // alive as long as it (callers order their reuse on `stream`, joined below).
            let workers = unsafe { side.launch_builder(func).arg(&params).launch(cfg) }
                .map(|_| ())
                .context("launching weft_gemm_tile_allreduce")
                .and_then(|()| stream.join(side).map_err(anyhow::Error::from));
            if let Err(e) = workers {
                self.broken = Some(format!("{e:#}"));
                return Err(e);
            }
            Ok(())
        })
    }

    /// Copies this rank's output into `dst` (at least m × n elements) on `stream`.
    pub fn copy_output(
        &self,
        stream: &Arc<CudaStream>,
        dst: &mut CudaSlice<bf16>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            copy_own_buffer(stream, "fused AllReduce output", &self.out, dst)
        })
    }

    /// Waits for `stream`; an error names any wait that ran past its bound (tile flags: role
    /// GEMM AllReduce communicator, coord (0, order, tile); the END counter), else the driver's
    /// error, if any.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            synchronize_checked(stream, "the fused GEMM + AllReduce", || {
                vec![
                    self.gemm.check().map_err(anyhow::Error::from),
                    self.bar
                        .check()
                        .context("fused AllReduce worker (tile flags or END barrier)"),
                ]
            })
        })
    }

    /// Collective: frees the buffers and counters on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let results = [
                self.partial.free(rdzv).map_err(anyhow::Error::from),
                self.out.free(rdzv).map_err(anyhow::Error::from),
                self.flags.free(rdzv).map_err(anyhow::Error::from),
                self.bar.free(rdzv).map_err(anyhow::Error::new),
            ];
            results
                .into_iter()
                .collect::<anyhow::Result<Vec<()>>>()
                .map(|_| ())
        })
    }
}

/// The orders of the tiles `rank` owns (tile index % world == rank) in the schedule's order:
/// the workers' list (owned_orders in weft_tile_allreduce_params).
fn owned_orders(plan: &GemmPlan, rank: usize, world: usize) -> Vec<u32> {
    let tiles_n = plan.tiles_n();
    plan.schedule()
        .iter()
        .filter(|t| (t.tm * tiles_n + t.tn) as usize % world == rank)
        .map(|t| t.order)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::owned_orders;
    use crate::{GemmOptions, GemmPlan, GemmShape};

    /// Over shapes and worlds: the ranks' lists cover every tile once, each in ascending order,
    /// each tile on the rank its row-major index names.
    #[test]
    fn owned_orders_partition_the_tiles() {
        for (m, n, world) in [
            (8192, 8192, 1),
            (1008, 3008, 3),
            (4096, 1024, 4),
            (640, 8448, 8),
        ] {
            let opts = GemmOptions {
                sm_margin: 16,
                ..GemmOptions::default()
            };
            let plan = GemmPlan::new(132, GemmShape::new(m, n, 256), opts).unwrap();
            let schedule = plan.schedule();
            let mut owner = vec![usize::MAX; schedule.len()];
            let orders = schedule.iter().map(|t| t.order).max().unwrap() as usize + 1;
            let mut tile_of_order = vec![None; orders];
            for t in &schedule {
                tile_of_order[t.order as usize] = Some(*t);
            }
            for rank in 0..world {
                let list = owned_orders(&plan, rank, world);
                assert!(
                    list.windows(2).all(|w| w[0] < w[1]),
                    "rank {rank}: orders not ascending"
                );
                for order in list {
                    let t = tile_of_order[order as usize].expect("a phantom order listed");
                    let index = (t.tm * plan.tiles_n() + t.tn) as usize;
                    assert_eq!(index % world, rank, "tile {index} listed on rank {rank}");
                    assert_eq!(owner[index], usize::MAX, "tile {index} listed twice");
                    owner[index] = rank;
                }
            }
            let tiles = (plan.tiles_m() * plan.tiles_n()) as usize;
            assert!(
                owner[..tiles].iter().all(|&r| r < world),
                "{m}x{n} world {world}: a tile owned by none"
            );
        }
    }
}
