//! AllGather + GEMM as one op: D (m × n) = AllGather_rows(A shards) · B_rank on every rank, rank
//! r's shard being rows [r·m/world, (r + 1)·m/world) of A, by any method ([`Method`]):
//! `seq-cublas` (ncclAllGather, then cuBLAS), `seq-weft`, `seq-collectives` (weft's AllGather,
//! then cuBLAS), `decomposition:<world>` (the own
//! shard's GEMM beside the gather, then the peers'), `fused-intra` (ParallelKittens intra-SM: the
//! loader reads peer tiles by TMA), `fused-inter:<ctas>` (communicator CTAs copy the shards chunk
//! by chunk), `fused-ce:<tile rows>[:<width>][:k<chunks>]` (copy engines pull the shards, in column chunks
//! along K with `k`, while every SM computes), or
//! `Auto`.
//!
//! The shard is the op's own input buffer ([`AllGatherGemm::shard`], peer memory for the fused
//! methods, which read it from every rank): write this rank's rows there before a launch
//! ([`AllGatherGemm::copy_shard`] copies them from a buffer of yours). D is the caller's.

use super::buffer::OpBuffer;
use super::candidates::OpKind;
use super::choice::{
    choose_and_plan, exact_report, random_device, time_candidate, Bench, Candidate, ChoiceReport,
    PlanRequest,
};
use super::common::{
    agree_on_request, check_capture, check_dtype, check_launch, op_collectives, OpElement, SeqGemm,
};
use super::env::{lock, synchronize_with, OverlapEnv, SharedComm};
use super::method::{Method, MethodChoice};
use crate::cublas::CublasGemm;
use crate::dtype::{Dtype, GemmElement};
use crate::error::agree;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::fused::{AllGatherMethod, FusedAllGatherGemm};
use crate::overlap::high_priority_stream;
use crate::plan::{GemmOptions, GemmShape};
use anyhow::Context;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use std::sync::Arc;
use weft_collectives::Collectives;
use weft_pgl::Bootstrap;

// One Imp per op, held for the op's life: the fused variant's size costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
enum Imp<TI: OpElement> {
    /// seq-cublas, seq-weft: ncclAllGather of the shards into `a`, then the GEMM.
    Seq {
        gemm: SeqGemm,
        comm: SharedComm,
        shard: CudaSlice<TI>,
        a: CudaSlice<TI>,
    },
    /// seq-collectives: weft's AllGather of the shards into `a`, then cuBLAS.
    SeqCollectives {
        coll: Collectives,
        gemm: CublasGemm,
        shard: CudaSlice<TI>,
        a: CudaSlice<TI>,
    },
    Decomposition {
        band: CublasGemm,
        comm: SharedComm,
        side: Arc<CudaStream>,
        shard: CudaSlice<TI>,
        a: CudaSlice<TI>,
    },
    Fused(FusedAllGatherGemm<TI>),
}

/// One rank's AllGather + GEMM for a fixed shape (m: every rank's rows), options and world.
pub struct AllGatherGemm<TI: OpElement> {
    shape: GemmShape,
    options: GemmOptions,
    world: u32,
    rank: u32,
    stream: Arc<CudaStream>,
    report: ChoiceReport,
    imp: Imp<TI>,
}

impl<TI: OpElement> AllGatherGemm<TI> {
    /// Collective, as [`super::GemmAllReduce::plan`], for inputs TI (= options.input); m must
    /// split evenly over the ranks. D's dtype is options.output.
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
            let kind = OpKind::AllGather;
            let (world, rank) = (rdzv.world() as u32, rdzv.rank() as u32);
            let checks = check_dtype::<TI>(kind, shape, "input", options.input).and_then(|()| {
                require!(
                    shape.m.is_multiple_of(world),
                    Shape,
                    "AllGather + GEMM {shape}: M = {} does not split into {world} equal shards",
                    shape.m
                );
                Ok(String::new())
            });
            agree_on_request(
                rdzv, env, stream, kind, shape, &options, choice, capturable, checks,
            )?;
            let mut bench: Option<(CudaSlice<TI>, Bench)> = None;
            let seed = 0xa6a6 ^ ((rank as u64) << 40);
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
                |rdzv, env, m| plan_imp::<TI>(rdzv, env, stream, shape, options, m),
                |rdzv, env, m| {
                    if bench.is_none() {
                        bench = Some((
                            random_device(stream, seed, (shape.k * shape.n) as usize)?,
                            Bench::new(stream)?,
                        ));
                    }
                    let (b, timer) = bench.as_mut().expect("made above");
                    let planned = plan_imp::<TI>(rdzv, env, stream, shape, options, m);
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
                        op.fill_shard_randomly(seed)?;
                        match options.output {
                            Dtype::Bf16 => op.time_into::<bf16>(env, timer, b),
                            Dtype::F16 => op.time_into::<f16>(env, timer, b),
                            Dtype::F32 => op.time_into::<f32>(env, timer, b),
                        }
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

    fn fill_shard_randomly(&self, seed: u64) -> anyhow::Result<()> {
        let src = random_device::<TI>(&self.stream, seed ^ 2, self.shard_len())?;
        self.copy_shard(&self.stream, &src)?;
        self.stream.synchronize()?;
        Ok(())
    }

    fn time_into<TO: GemmElement + cudarc::driver::ValidAsZeroBits>(
        &mut self,
        env: &OverlapEnv,
        timer: &mut Bench,
        b: &CudaSlice<TI>,
    ) -> anyhow::Result<f64> {
        let stream = self.stream.clone();
        let mut d = stream.alloc_zeros::<TO>((self.shape.m * self.shape.n) as usize)?;
        let what =
            super::choice::first_use_what(OpKind::AllGather, self.shape, &self.report.method);
        timer.time(env, &stream, &what, || {
            self.launch(&stream, b, &mut d).map_err(anyhow::Error::from)
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

    /// Elements of this rank's shard (m/world × k).
    pub fn shard_len(&self) -> usize {
        (self.shape.m / self.world * self.shape.k) as usize
    }

    /// This rank's shard buffer: write rows [rank·m/world, …) of A here (stream-ordered) before
    /// a launch, and not again until that launch has finished.
    pub fn shard(&self) -> OpBuffer<'_, TI> {
        let (ptr, len) = match &self.imp {
            Imp::Seq { shard, .. }
            | Imp::SeqCollectives { shard, .. }
            | Imp::Decomposition { shard, .. } => (shard.device_ptr(&self.stream).0, shard.len()),
            Imp::Fused(f) => (f.shard().local_ptr(), f.shard().len()),
        };
        // SAFETY: the buffer holds `len` elements of TI and lives as long as self.
        unsafe { OpBuffer::new(ptr, len, &self.stream) }
    }

    /// Copies `src` (at least m/world × k elements) into this rank's shard on `stream`.
    pub fn copy_shard(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let len = self.shard_len();
            require!(
                src.len() >= len,
                Length,
                "AllGather + GEMM: the shard needs {len} elements, given {}",
                src.len()
            );
            let dst = self.shard().device_address();
            let (ptr, _g) = src.device_ptr(stream);
            stream.context().bind_to_thread()?;
            // SAFETY: both hold `len` elements of TI on this context; stream-ordered.
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(
                    dst,
                    ptr,
                    len * std::mem::size_of::<TI>(),
                    stream.cu_stream(),
                )
            }
            .result()
            .context("copying the AllGather shard")?;
            Ok(())
        })
    }

    /// Enqueues D = AllGather(every rank's shard) · B on the planned stream. Every rank must
    /// launch the same number of times.
    pub fn launch<TO: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        b: &CudaSlice<TI>,
        d: &mut CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let GemmShape { m, n, k } = self.shape;
            check_launch::<TI>(
                OpKind::AllGather,
                &self.stream,
                stream,
                &self.options,
                &[
                    ("B", b.len(), (k * n) as usize),
                    ("D", d.len(), (m * n) as usize),
                ],
            )?;
            require!(
                TO::DTYPE == self.options.output,
                Options,
                "AllGather + GEMM: planned for a {} D, given {}",
                self.options.output,
                TO::DTYPE
            );
            check_capture(stream, &self.report.method)?;
            let (rows, rank) = ((m / self.world) as usize, self.rank as usize);
            let (n, k) = (n as usize, k as usize);
            match &mut self.imp {
                Imp::Seq {
                    gemm,
                    comm,
                    shard,
                    a,
                } => {
                    lock(comm)?.all_gather(&*shard, a, stream)?;
                    gemm.launch(stream, a, b, d).map_err(anyhow::Error::from)
                }
                Imp::SeqCollectives {
                    coll,
                    gemm,
                    shard,
                    a,
                } => {
                    coll.all_gather(&*shard, a)?;
                    gemm.launch(a, b, d).map_err(anyhow::Error::from)
                }
                Imp::Decomposition {
                    band,
                    comm,
                    side,
                    shard,
                    a,
                } => {
                    // The gather starts after everything before (the shard written); this rank's rows
                    // are computed from its shard meanwhile, the peers' once the gather is done.
                    side.join(stream)?;
                    band.launch(
                        &*shard,
                        b,
                        &mut d.slice_mut(rank * rows * n..(rank + 1) * rows * n),
                    )?;
                    lock(comm)?.all_gather(&*shard, a, side)?;
                    stream.join(side)?;
                    for p in (0..self.world as usize).filter(|&p| p != rank) {
                        band.launch(
                            &a.slice(p * rows * k..(p + 1) * rows * k),
                            b,
                            &mut d.slice_mut(p * rows * n..(p + 1) * rows * n),
                        )?;
                    }
                    Ok(())
                }
                Imp::Fused(f) => f.run(stream, b, d).map_err(anyhow::Error::from),
            }
        })
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
                    &format!("AllGather + GEMM {} ({})", self.shape, self.method()),
                ),
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

fn plan_imp<TI: OpElement>(
    rdzv: &mut dyn Bootstrap,
    env: &mut OverlapEnv,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    method: &Method,
) -> anyhow::Result<Imp<TI>> {
    let ctx = env.context().clone();
    let world = rdzv.world() as u32;
    let alloc =
        |len: u32| -> anyhow::Result<CudaSlice<TI>> { Ok(stream.alloc_zeros::<TI>(len as usize)?) };
    let (mk, shard_len) = (shape.m * shape.k, shape.m / world * shape.k);
    Ok(match method {
        Method::SeqCublas | Method::SeqWeft => Imp::Seq { gemm: SeqGemm::new(method, stream, shape, options, env.rank())?, comm: env.comm().clone(), shard: alloc(shard_len)?, a: alloc(mk)? },
        Method::SeqCollectives => {
            // This rank's own parts first, agreed, so that every rank enters the collectives'
            // set-up (collective) or none does.
            let local = CublasGemm::new(stream, shape, options).map_err(anyhow::Error::from).and_then(|g| Ok((g, alloc(shard_len)?, alloc(mk)?)));
            let (gemm, shard, a) = agree(rdzv, "planning seq-collectives (cuBLAS, buffers)", local)?;
            let bytes = u64::from(mk) * size_of::<TI>() as u64;
            Imp::SeqCollectives { coll: op_collectives(rdzv, stream, bytes)?, gemm, shard, a }
        }
        Method::Decomposition { chunks } => {
            require!(*chunks == world, Options, "the AllGather decomposition has one chunk per rank ({world}), asked for {chunks}");
            let band = CublasGemm::new(stream, GemmShape::new(shape.m / world, shape.n, shape.k), options)?;
            Imp::Decomposition { band, comm: env.comm().clone(), side: high_priority_stream(&ctx)?, shard: alloc(shard_len)?, a: alloc(mk)? }
        }
        Method::FusedIntra { .. } => {
            let options = GemmOptions { tile: method.tile_choice(options.tile)?, ..options };
            Imp::Fused(FusedAllGatherGemm::<TI>::new(rdzv, &ctx, stream, shape, options, AllGatherMethod::Intra)?)
        }
        Method::FusedInter { ctas } => Imp::Fused(FusedAllGatherGemm::<TI>::new(rdzv, &ctx, stream, shape, options, AllGatherMethod::Inter { comm_ctas: *ctas })?),
        Method::FusedCe { tile_rows, k_chunks, .. } => {
            let options = GemmOptions { tile: method.tile_choice(options.tile)?, ..options };
            Imp::Fused(FusedAllGatherGemm::<TI>::new(rdzv, &ctx, stream, shape, options, AllGatherMethod::CopyEngine { tile_rows: *tile_rows, k_chunks: *k_chunks })?)
        }
        other => refuse!(Options, "{other} is not a method of AllGather + GEMM (seq-cublas, seq-weft, seq-collectives, decomposition, fused-intra, fused-inter, fused-ce)"),
    })
}

impl<TI: OpElement> Candidate for AllGatherGemm<TI> {
    fn synchronize(&self) -> anyhow::Result<()> {
        Self::synchronize(self).map_err(anyhow::Error::from)
    }
    fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        Self::free(self, rdzv).map_err(anyhow::Error::from)
    }
}
