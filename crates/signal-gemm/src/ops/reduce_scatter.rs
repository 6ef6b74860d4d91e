//! GEMM + ReduceScatter as one op: rank r gets rows [r·m/world, (r + 1)·m/world) of Σ over ranks
//! of A_rank · B_rank (NCCL's row split), by any method ([`Method`]): `seq-cublas`, `seq-weft`,
//! `seq-collectives`, `decomposition:<chunks>`, `fused-intra` (ParallelKittens intra-SM: TMA reduce-add into the
//! owner), or `Auto`.
//!
//! Not among them: the signal method's rank bands (overlap::ReduceScatterOverlap) give rank r the
//! r-th band of every tile's rows, not these rows, so it computes another op.
//!
//! The result lands in the op's own output buffer ([`GemmReduceScatter::output`], m/world × n),
//! peer memory for the fused method, and holds the last launch's rows until the next launch.

use super::buffer::OpBuffer;
use super::candidates::OpKind;
use super::choice::{
    choose_and_plan, exact_report, first_use_what, time_candidate, Bench, Candidate, ChoiceReport,
    PlanRequest,
};
use super::common::{
    agree_on_request, check_capture, check_dtype, check_launch, op_collectives, OpElement, SeqGemm,
};
use super::env::{lock, synchronize_with, OverlapEnv, SharedComm};
use super::inputs::{with_operands, Operands};
use super::method::{Method, MethodChoice};
use crate::cublas::CublasGemm;
use crate::dtype::GemmElement;
use crate::error::agree;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::fused::FusedReduceScatter;
use crate::overlap::high_priority_stream;
use crate::plan::{GemmOptions, GemmShape};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use weft_collectives::Collectives;
use weft_pgl::nccl::ReduceOp;
use weft_pgl::Bootstrap;

// One Imp per op, held for the op's life: the fused variant's size costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
enum Imp<TO: OpElement> {
    /// seq-cublas, seq-weft: the GEMM into `d`, then ncclReduceScatter into the output.
    Seq {
        gemm: SeqGemm,
        comm: SharedComm,
        d: CudaSlice<TO>,
        out: CudaSlice<TO>,
    },
    /// seq-collectives: cuBLAS into `d`, then weft's ReduceScatter into the output.
    SeqCollectives {
        coll: Collectives,
        gemm: CublasGemm,
        d: CudaSlice<TO>,
        out: CudaSlice<TO>,
    },
    /// Chunk c is, for every rank r, rows [r·m/world + c·q, … + q) (q = m / (world · chunks)),
    /// computed into staging rows [(c·world + r)·q, … + q) and reduce-scattered as one call, so
    /// each rank receives its c-th q rows.
    Decomposition {
        band: CublasGemm,
        chunks: u32,
        comm: SharedComm,
        side: Arc<CudaStream>,
        d: CudaSlice<TO>,
        out: CudaSlice<TO>,
    },
    Fused(FusedReduceScatter<TO>),
}

/// One rank's GEMM + ReduceScatter for a fixed shape, GEMM options and world.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cudarc::driver::CudaContext;
/// use weft_pgl::{gpu, rank_env::RankEnv, rendezvous::Rendezvous};
/// # fn main() -> anyhow::Result<()> {
/// // One process per GPU, started by `weft launch -n N --`, mpirun, srun or torchrun.
/// let env = RankEnv::from_env()?;
/// let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
/// let ctx = CudaContext::new(gpu::device_for_rank(&env, CudaContext::device_count()? as usize)?)?;
/// use half::bf16;
/// use weft_signal_gemm::ops::{GemmReduceScatter, MethodChoice, OverlapEnv};
/// use weft_signal_gemm::{GemmOptions, GemmShape};
/// // The ops order their own streams by events: cudarc's per-buffer tracking must be off.
/// // SAFETY: this program uses its buffers on `stream` only and synchronises before reading.
/// unsafe { ctx.disable_event_tracking() };
/// let stream = ctx.new_stream()?;
/// let shape = GemmShape::new(4096, 8192, 2048); // A m x k, B n x k (D = A · Bᵀ)
/// let a = stream.alloc_zeros::<bf16>(4096 * 2048)?;
/// let b = stream.alloc_zeros::<bf16>(8192 * 2048)?;
/// // Collective: NCCL and the choice cache once per process, the op once per shape; `Auto`
/// // measures the methods at first use and keeps the fastest.
/// let mut env = OverlapEnv::new(&mut rdzv, &ctx)?;
/// let mut op = GemmReduceScatter::<bf16>::plan(
///     &mut rdzv, &mut env, &stream, shape, GemmOptions::default(), &MethodChoice::Auto, false,
/// )?;
/// op.launch(&stream, &a, &b)?; // this rank's m / world rows of the sum: op.output()
/// op.synchronize()?;
/// op.free(&mut rdzv)?;
/// # Ok(()) }
/// ```
pub struct GemmReduceScatter<TO: OpElement> {
    shape: GemmShape,
    options: GemmOptions,
    world: u32,
    rank: u32,
    stream: Arc<CudaStream>,
    report: ChoiceReport,
    imp: Imp<TO>,
}

impl<TO: OpElement> GemmReduceScatter<TO> {
    /// Collective, as [`super::GemmAllReduce::plan`]; m must split evenly over the ranks.
    pub fn plan(
        rdzv: &mut dyn Bootstrap,
        env: &mut OverlapEnv,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        choice: &MethodChoice,
        capturable: bool,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let kind = OpKind::ReduceScatter;
            let (world, rank) = (rdzv.world() as u32, rdzv.rank() as u32);
            let checks = check_dtype::<TO>(kind, shape, "output", options.output).and_then(|()| {
                require!(
                    shape.m.is_multiple_of(world),
                    Shape,
                    "GEMM + ReduceScatter {shape}: M = {} does not split into {world} equal row blocks",
                    shape.m
                );
                Ok(String::new())
            });
            agree_on_request(
                rdzv, env, stream, kind, shape, &options, choice, capturable, checks,
            )?;
            let mut operands: Option<(Operands, Bench)> = None;
            let seed = 0x5ca7 ^ ((rank as u64) << 40);
            let (imp, report) = choose_and_plan(
                rdzv,
                env,
                PlanRequest {
                    kind,
                    shape,
                    options,
                    choice,
                    capturable,
                },
                |rdzv, env, m| plan_imp::<TO>(rdzv, env, stream, shape, options, m),
                |rdzv, env, m| {
                    if operands.is_none() {
                        let (mk, kn) = ((shape.m * shape.k) as usize, (shape.k * shape.n) as usize);
                        operands = Some((
                            Operands::random(stream, &options, seed, mk, kn)?,
                            Bench::new(stream)?,
                        ));
                    }
                    let (ops, bench) = operands.as_mut().expect("made above");
                    let planned = plan_imp::<TO>(rdzv, env, stream, shape, options, m);
                    let imp = agree(rdzv, &format!("planning {m}"), planned)?;
                    let op = Self {
                        shape,
                        options,
                        world,
                        rank,
                        stream: stream.clone(),
                        report: exact_report(m),
                        imp,
                    };
                    time_candidate(rdzv, op, |op| {
                        with_operands!(&*ops, |a, b| bench.time(
                            env,
                            stream,
                            &first_use_what(kind, shape, m),
                            || op.launch(stream, a, b).map_err(anyhow::Error::from)
                        ))
                    })
                },
            )?;
            Ok(Self {
                shape,
                options,
                world,
                rank,
                stream: stream.clone(),
                report,
                imp,
            })
        })
    }

    pub fn method(&self) -> &Method {
        &self.report.method
    }

    pub fn report(&self) -> &ChoiceReport {
        &self.report
    }

    pub fn shape(&self) -> GemmShape {
        self.shape
    }

    /// This rank's first row of the product and its row count (m / world).
    pub fn rows(&self) -> (u32, u32) {
        let rows = self.shape.m / self.world;
        (self.rank * rows, rows)
    }

    /// Enqueues this rank's rows of Σ over ranks of A_rank · B_rank on the planned stream; as
    /// [`super::GemmAllReduce::launch`].
    pub fn launch<TI: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let GemmShape { m, n, k } = self.shape;
            check_launch::<TI>(
                OpKind::ReduceScatter,
                &self.stream,
                stream,
                &self.options,
                &[
                    ("A", a.len(), (m * k) as usize),
                    ("B", b.len(), (k * n) as usize),
                ],
            )?;
            check_capture(stream, &self.report.method)?;
            let world = self.world as usize;
            match &mut self.imp {
                Imp::Seq { gemm, comm, d, out } => {
                    gemm.launch(stream, a, b, d)?;
                    lock(comm)?
                        .reduce_scatter(&*d, out, ReduceOp::Sum, stream)
                        .map_err(anyhow::Error::from)
                }
                Imp::SeqCollectives { coll, gemm, d, out } => {
                    gemm.launch(a, b, d)?;
                    Ok(coll.reduce_scatter(&*d, out)?)
                }
                Imp::Decomposition {
                    band,
                    chunks,
                    comm,
                    side,
                    d,
                    out,
                } => {
                    let chunks = *chunks as usize;
                    let (m, n, k) = (m as usize, n as usize, k as usize);
                    let q = m / (world * chunks);
                    side.join(stream)?;
                    for c in 0..chunks {
                        for r in 0..world {
                            let src = r * (m / world) + c * q;
                            let dst = (c * world + r) * q;
                            band.launch(
                                &a.slice(src * k..(src + q) * k),
                                b,
                                &mut d.slice_mut(dst * n..(dst + q) * n),
                            )?;
                        }
                        side.join(stream)?;
                        let send = d.slice(c * world * q * n..(c + 1) * world * q * n);
                        lock(comm)?.reduce_scatter(
                            &send,
                            &mut out.slice_mut(c * q * n..(c + 1) * q * n),
                            ReduceOp::Sum,
                            side,
                        )?;
                    }
                    stream.join(side)?;
                    Ok(())
                }
                Imp::Fused(f) => f.run(stream, a, b).map_err(anyhow::Error::from),
            }
        })
    }

    /// The op's result: this rank's m/world × n rows of the last launch, once it has run.
    pub fn output(&self) -> OpBuffer<'_, TO> {
        let (ptr, len) = match &self.imp {
            Imp::Seq { out, .. }
            | Imp::SeqCollectives { out, .. }
            | Imp::Decomposition { out, .. } => (out.device_ptr(&self.stream).0, out.len()),
            Imp::Fused(f) => (f.output().local_ptr(), f.output().len()),
        };
        // SAFETY: the buffer holds `len` elements of TO and lives as long as self.
        unsafe { OpBuffer::new(ptr, len, &self.stream) }
    }

    /// As [`super::GemmAllReduce::synchronize`].
    pub fn synchronize(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            match &self.imp {
                Imp::Fused(f) => f.synchronize(&self.stream).map_err(anyhow::Error::from),
                Imp::SeqCollectives { coll, .. } => Ok(coll.synchronize()?),
                Imp::Seq { comm, .. } | Imp::Decomposition { comm, .. } => synchronize_with(
                    comm,
                    &self.stream,
                    &format!("GEMM + ReduceScatter {} ({})", self.shape, self.method()),
                ),
            }
        })
    }

    /// Collective: frees the op's peer memory (fused method, weft's collectives) on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            match self.imp {
                Imp::Fused(f) => f.free(rdzv).map_err(anyhow::Error::from),
                Imp::SeqCollectives { coll, .. } => Ok(coll.free(rdzv)?),
                _ => Ok(()),
            }
        })
    }
}

fn plan_imp<TO: OpElement>(
    rdzv: &mut dyn Bootstrap,
    env: &mut OverlapEnv,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    method: &Method,
) -> anyhow::Result<Imp<TO>> {
    let ctx = env.context().clone();
    let world = rdzv.world() as u32;
    let alloc =
        |len: u32| -> anyhow::Result<CudaSlice<TO>> { Ok(stream.alloc_zeros::<TO>(len as usize)?) };
    let (mn, out_len) = (shape.m * shape.n, shape.m / world * shape.n);
    Ok(match method {
        Method::SeqCublas | Method::SeqWeft => Imp::Seq { gemm: SeqGemm::new(method, stream, shape, options, env.rank())?, comm: env.comm().clone(), d: alloc(mn)?, out: alloc(out_len)? },
        Method::SeqCollectives => {
            // This rank's own parts first, agreed, so that every rank enters the collectives'
            // set-up (collective) or none does.
            let local = CublasGemm::new(stream, shape, options).map_err(anyhow::Error::from).and_then(|g| Ok((g, alloc(mn)?, alloc(out_len)?)));
            let (gemm, d, out) = agree(rdzv, "planning seq-collectives (cuBLAS, buffers)", local)?;
            let bytes = u64::from(mn) * size_of::<TO>() as u64;
            Imp::SeqCollectives { coll: op_collectives(rdzv, stream, bytes)?, gemm, d, out }
        }
        Method::Decomposition { chunks } => {
            require!(
                shape.m.is_multiple_of(world * chunks), Shape,
                "decomposition: M = {} does not split into {chunks} chunks of {world} equal row blocks",
                shape.m
            );
            let band = CublasGemm::new(stream, GemmShape::new(shape.m / (world * chunks), shape.n, shape.k), options)?;
            Imp::Decomposition { band, chunks: *chunks, comm: env.comm().clone(), side: high_priority_stream(&ctx)?, d: alloc(mn)?, out: alloc(out_len)? }
        }
        Method::FusedIntra { .. } => {
            let options = GemmOptions { tile: method.tile_choice(options.tile)?, ..options };
            Imp::Fused(FusedReduceScatter::<TO>::new(rdzv, &ctx, stream, shape, options)?)
        }
        other => refuse!(Options, "{other} is not a method of GEMM + ReduceScatter (seq-cublas, seq-weft, seq-collectives, decomposition, fused-intra)"),
    })
}

impl<TO: OpElement> Candidate for GemmReduceScatter<TO> {
    fn synchronize(&self) -> anyhow::Result<()> {
        Self::synchronize(self).map_err(anyhow::Error::from)
    }
    fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        Self::free(self, rdzv).map_err(anyhow::Error::from)
    }
}
