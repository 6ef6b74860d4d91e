//! GEMM + AllReduce as one op: out = Σ over ranks of A_rank · B_rank on every rank, by any method
//! ([`Method`]): `seq-cublas`, `seq-weft`, `seq-collectives`, `decomposition:<chunks>`, `signal:<margin>:<waves>`
//! (FlashOverlap), `fused-inter:<ctas>` (ParallelKittens inter-SM), `distfuse:<workers>`
//! (DistFuse), or `Auto`.
//!
//! The result lands in the op's own output buffer ([`GemmAllReduce::output`], m × n): the fused
//! methods write it through peer memory, so it must be memory every peer has mapped; every method
//! writes the same buffer, so they are interchangeable. It holds the last launch's sum until the
//! next launch.

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
use crate::dtype::{Dtype, GemmElement};
use crate::error::agree;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::fused::{AllReduceMethod, FusedAllReduce};
use crate::overlap::{high_priority_stream, AllReduceOverlap};
use crate::plan::{GemmOptions, GemmShape};
use crate::reorder::Restore;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use weft_collectives::Collectives;
use weft_pgl::nccl::ReduceOp;
use weft_pgl::Bootstrap;

enum Imp<TO: OpElement> {
    /// seq-cublas, seq-weft: the GEMM into the output, then an in-place ncclAllReduce.
    Seq {
        gemm: SeqGemm,
        comm: SharedComm,
        out: CudaSlice<TO>,
    },
    /// seq-collectives: cuBLAS into the output, then weft's in-place AllReduce.
    SeqCollectives {
        gemm: CublasGemm,
        coll: Collectives,
        out: CudaSlice<TO>,
    },
    Decomposition {
        band: CublasGemm,
        chunks: u32,
        comm: SharedComm,
        side: Arc<CudaStream>,
        out: CudaSlice<TO>,
    },
    Signal {
        ov: AllReduceOverlap,
        comm: SharedComm,
        staging: CudaSlice<TO>,
        out: CudaSlice<TO>,
    },
    Fused(FusedAllReduce),
}

/// One rank's GEMM + AllReduce for a fixed shape, GEMM options and world.
pub struct GemmAllReduce<TO: OpElement> {
    shape: GemmShape,
    options: GemmOptions,
    stream: Arc<CudaStream>,
    report: ChoiceReport,
    imp: Imp<TO>,
}

impl<TO: OpElement> GemmAllReduce<TO> {
    /// Collective over `rdzv`'s ranks, with the same arguments on every rank: plans `choice` for
    /// A (m × k) · B (`options.b_layout`) summed over ranks, output dtype TO (= options.output),
    /// launched on `stream`. `capturable` keeps to methods a CUDA graph can replay. `Auto` and
    /// families measure their candidates at first use (or take them from the cache).
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
            let kind = OpKind::AllReduce;
            let checks =
                check_dtype::<TO>(kind, shape, "output", options.output).map(|()| String::new());
            agree_on_request(
                rdzv, env, stream, kind, shape, &options, choice, capturable, checks,
            )?;
            let mut operands: Option<(Operands, Bench)> = None;
            let seed = 0xA11 ^ ((rdzv.rank() as u64) << 40);
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
                stream: stream.clone(),
                report,
                imp,
            })
        })
    }

    /// The method this op runs, and how it was chosen.
    pub fn method(&self) -> &Method {
        &self.report.method
    }

    pub fn report(&self) -> &ChoiceReport {
        &self.report
    }

    pub fn shape(&self) -> GemmShape {
        self.shape
    }

    /// Enqueues out = Σ over ranks of A_rank · B_rank on the stream the op was planned with
    /// (passed again, and checked, so the call site says where it runs). Every rank must launch
    /// the same number of times. Read the previous result (stream-ordered) before this launch.
    pub fn launch<TI: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let GemmShape { m, n, k } = self.shape;
            check_launch::<TI>(
                OpKind::AllReduce,
                &self.stream,
                stream,
                &self.options,
                &[
                    ("A", a.len(), (m * k) as usize),
                    ("B", b.len(), (k * n) as usize),
                ],
            )?;
            check_capture(stream, &self.report.method)?;
            match &mut self.imp {
                Imp::Seq { gemm, comm, out } => {
                    gemm.launch(stream, a, b, out)?;
                    lock(comm)?
                        .all_reduce_in_place(out, ReduceOp::Sum, stream)
                        .map_err(anyhow::Error::from)
                }
                Imp::SeqCollectives { gemm, coll, out } => {
                    gemm.launch(a, b, out)?;
                    Ok(coll.all_reduce_in_place(out)?)
                }
                Imp::Decomposition {
                    band,
                    chunks,
                    comm,
                    side,
                    out,
                } => {
                    let rows = (m / *chunks) as usize;
                    let (n, k) = (n as usize, k as usize);
                    // The side stream starts after everything before (the output's earlier readers).
                    side.join(stream)?;
                    for c in 0..*chunks as usize {
                        let a_band = a.slice(c * rows * k..(c + 1) * rows * k);
                        band.launch(
                            &a_band,
                            b,
                            &mut out.slice_mut(c * rows * n..(c + 1) * rows * n),
                        )?;
                        side.join(stream)?;
                        lock(comm)?.all_reduce_in_place(
                            &mut out.slice_mut(c * rows * n..(c + 1) * rows * n),
                            ReduceOp::Sum,
                            side,
                        )?;
                    }
                    stream.join(side)?;
                    Ok(())
                }
                Imp::Signal {
                    ov,
                    comm,
                    staging,
                    out,
                } => ov
                    .run(stream, &*lock(comm)?, a, b, staging, out, Restore::Copy)
                    .map_err(anyhow::Error::from),
                Imp::Fused(f) => f.run(stream, a, b).map_err(anyhow::Error::from),
            }
        })
    }

    /// The op's result (m × n of TO): the sum of the last launch once it has run.
    pub fn output(&self) -> OpBuffer<'_, TO> {
        let (ptr, len) = match &self.imp {
            Imp::Seq { out, .. }
            | Imp::SeqCollectives { out, .. }
            | Imp::Decomposition { out, .. }
            | Imp::Signal { out, .. } => (out.device_ptr(&self.stream).0, out.len()),
            Imp::Fused(f) => (f.output().local_ptr(), f.output().len()),
        };
        // SAFETY: the buffer holds `len` elements of TO (the fused AllReduce is planned only for
        // bf16 outputs, so TO is bf16 there) and lives as long as self.
        unsafe { OpBuffer::new(ptr, len, &self.stream) }
    }

    /// Waits for the op's stream; an error names any device wait of the op that ran past its
    /// bound (fused and signal methods), an NCCL call a peer never joined within the
    /// communicator's budget (NCCL methods: the communicator is aborted), else the driver's
    /// error, if any.
    pub fn synchronize(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let what = || format!("GEMM + AllReduce {} ({})", self.shape, self.method());
            match &self.imp {
                Imp::Fused(f) => f.synchronize(&self.stream).map_err(anyhow::Error::from),
                Imp::Signal { ov, comm, .. } => {
                    synchronize_with(comm, &self.stream, &what())?;
                    ov.check().map_err(anyhow::Error::from)
                }
                Imp::Seq { comm, .. } | Imp::Decomposition { comm, .. } => {
                    synchronize_with(comm, &self.stream, &what())
                }
                Imp::SeqCollectives { coll, .. } => Ok(coll.synchronize()?),
            }
        })
    }

    /// Collective: frees the op's peer memory (fused methods, weft's collectives) on every rank.
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

/// This rank's part of planning `method` (collective for the fused methods and for a signal
/// method's first communicator of its margin).
fn plan_imp<TO: OpElement>(
    rdzv: &mut dyn Bootstrap,
    env: &mut OverlapEnv,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    method: &Method,
) -> anyhow::Result<Imp<TO>> {
    let ctx = env.context().clone();
    let out =
        |len: u32| -> anyhow::Result<CudaSlice<TO>> { Ok(stream.alloc_zeros::<TO>(len as usize)?) };
    let mn = shape.m * shape.n;
    Ok(match method {
        Method::SeqCublas | Method::SeqWeft => Imp::Seq {
            gemm: SeqGemm::new(method, stream, shape, options, env.rank())?,
            comm: env.comm().clone(),
            out: out(mn)?,
        },
        Method::SeqCollectives => {
            // This rank's own parts first, agreed, so that every rank enters the collectives'
            // set-up (collective) or none does.
            let local = CublasGemm::new(stream, shape, options)
                .map_err(anyhow::Error::from)
                .and_then(|g| Ok((g, out(mn)?)));
            let (gemm, out) = agree(rdzv, "planning seq-collectives (cuBLAS, buffers)", local)?;
            let bytes = u64::from(mn) * size_of::<TO>() as u64;
            Imp::SeqCollectives {
                coll: op_collectives(rdzv, stream, bytes)?,
                gemm,
                out,
            }
        }
        Method::Decomposition { chunks } => {
            require!(
                shape.m.is_multiple_of(*chunks),
                Shape,
                "decomposition: M = {} does not split into {chunks} bands",
                shape.m
            );
            let band = CublasGemm::new(
                stream,
                GemmShape::new(shape.m / chunks, shape.n, shape.k),
                options,
            )?;
            Imp::Decomposition {
                band,
                chunks: *chunks,
                comm: env.comm().clone(),
                side: high_priority_stream(&ctx)?,
                out: out(mn)?,
            }
        }
        Method::Signal { sm_margin, waves } => {
            let local = AllReduceOverlap::new(
                stream,
                shape,
                GemmOptions {
                    sm_margin: *sm_margin,
                    ..options
                },
                Some(waves),
                rdzv.rank() as u32,
            );
            let ov = agree(
                rdzv,
                "planning the signal GEMM",
                local.map_err(anyhow::Error::from),
            )?;
            let comm = env.limited_comm(rdzv, *sm_margin)?;
            let staging = stream.alloc_zeros::<TO>(ov.staging_len())?;
            Imp::Signal {
                ov,
                comm,
                staging,
                out: out(mn)?,
            }
        }
        Method::FusedInter { ctas } => {
            require!(
                <TO as GemmElement>::DTYPE == Dtype::Bf16,
                Options,
                "fused-inter sums bf16 partials; the output is {}",
                <TO as GemmElement>::DTYPE
            );
            Imp::Fused(FusedAllReduce::new(
                rdzv,
                &ctx,
                stream,
                shape,
                options,
                AllReduceMethod::Inter { comm_ctas: *ctas },
            )?)
        }
        Method::DistFuse { workers } => {
            require!(
                <TO as GemmElement>::DTYPE == Dtype::Bf16,
                Options,
                "distfuse sums bf16 partials; the output is {}",
                <TO as GemmElement>::DTYPE
            );
            let options = GemmOptions {
                sm_margin: options.sm_margin + workers,
                ..options
            };
            Imp::Fused(FusedAllReduce::new(
                rdzv,
                &ctx,
                stream,
                shape,
                options,
                AllReduceMethod::DistFuse { workers: *workers },
            )?)
        }
        Method::FusedIntra { .. } | Method::FusedCe { .. } | Method::SignalCe { .. } => {
            refuse!(
                Options,
                "{method} is not a method of GEMM + AllReduce (fused-inter, distfuse)"
            )
        }
    })
}

impl<TO: OpElement> Candidate for GemmAllReduce<TO> {
    fn synchronize(&self) -> anyhow::Result<()> {
        Self::synchronize(self).map_err(anyhow::Error::from)
    }
    fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        Self::free(self, rdzv).map_err(anyhow::Error::from)
    }
}
