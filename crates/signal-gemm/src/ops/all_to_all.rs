//! GEMM + All-to-All as one op (MoE dispatch of a GEMM's rows): row i of A_rank · B_rank goes to
//! rank routes[rank][i]; rank r gets every row routed to it, source rank by source rank, each
//! source's rows in increasing order ([`GemmAllToAll::sources`]). Methods ([`Method`]):
//! `seq-cublas` (cuBLAS, the rows gathered destination by destination, one ncclSend / ncclRecv
//! per peer), `seq-weft`, `signal:<margin>:<waves>` (FlashOverlap: the epilogue stores each row
//! into its destination's pool of its wave group, one grouped send / receive per group, then a
//! scatter into the order above), `signal-ce:<waves>` (the same pools moved by copy engines into
//! the destinations' buffers as each group is stored; `overlap::AllToAllCopyEngine`),
//! `fused-intra` (the epilogue stores each row straight into its destination's output through
//! peer memory; `fused::FusedAllToAll`), or `Auto`.
//!
//! The routing is fixed when the op is planned (every rank's, the same on every rank); a choice of
//! `Auto` is cached per shape whatever the routing (it was measured with the first routing seen).
//! The result is the op's own buffer ([`GemmAllToAll::output`], rows() × n).

use super::buffer::OpBuffer;
use super::candidates::OpKind;
use super::choice::{
    choose_and_plan, exact_report, first_use_what, time_candidate, Bench, Candidate, ChoiceReport,
    PlanRequest,
};
use super::common::{
    agree_on_request, check_capture, check_dtype, check_launch, OpElement, SeqGemm,
};
use super::env::{lock, synchronize_with, OverlapEnv, SharedComm};
use super::inputs::{with_operands, Operands};
use super::method::{Method, MethodChoice};
use crate::dtype::GemmElement;
use crate::error::agree;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::fused::FusedAllToAll;
use crate::overlap::{AllToAllCopyEngine, AllToAllOverlap};
use crate::plan::{GemmOptions, GemmShape};
use crate::row_gather::RowGather;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use weft_pgl::Bootstrap;

// One Imp per op, held for the op's life: the fused variant's size costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
enum Imp<TO: OpElement> {
    /// seq-cublas, seq-weft: the GEMM into `d`, its rows gathered into `send` destination by
    /// destination, one ncclSend / ncclRecv per peer into the output.
    Seq {
        gemm: SeqGemm,
        comm: SharedComm,
        gather: RowGather,
        d: CudaSlice<TO>,
        send: CudaSlice<TO>,
    },
    Signal {
        ov: AllToAllOverlap,
        comm: SharedComm,
        staging: CudaSlice<TO>,
        received: CudaSlice<TO>,
    },
    /// Boxed: it holds the GEMM, its maps and peer buffers, several times the others' size.
    CopyEngine(Box<AllToAllCopyEngine<TO>>),
    /// fused-intra: the epilogue stores each row into its destination's output (peer memory),
    /// which is the op's output.
    Fused(Box<FusedAllToAll<TO>>),
}

/// One rank's GEMM + All-to-All for a fixed shape, options, world and routing.
pub struct GemmAllToAll<TO: OpElement> {
    shape: GemmShape,
    options: GemmOptions,
    stream: Arc<CudaStream>,
    report: ChoiceReport,
    /// (source rank, source row) of each output row.
    sources: Vec<(u32, u32)>,
    out: CudaSlice<TO>,
    imp: Imp<TO>,
}

/// The output rows of `rank`: every row routed to it, source by source, rows ascending.
fn sources_of(routes: &[Vec<u32>], rank: usize) -> Vec<(u32, u32)> {
    routes
        .iter()
        .enumerate()
        .flat_map(|(s, r)| {
            r.iter()
                .enumerate()
                .filter(|(_, &d)| d as usize == rank)
                .map(move |(row, _)| (s as u32, row as u32))
        })
        .collect()
}

/// The routing's own checks, and a digest every rank must share.
fn check_routes(routes: &[Vec<u32>], world: usize, m: u32) -> anyhow::Result<String> {
    require!(
        routes.len() == world,
        Options,
        "GEMM + All-to-All: {} routings for {world} ranks (every rank's, on every rank)",
        routes.len()
    );
    let mut h = crc32fast::Hasher::new();
    for (s, r) in routes.iter().enumerate() {
        require!(
            r.len() == m as usize,
            Length,
            "GEMM + All-to-All: rank {s}'s routing has {} rows, M is {m}",
            r.len()
        );
        if let Some((row, d)) = r.iter().enumerate().find(|(_, &d)| d as usize >= world) {
            refuse!(Options, "GEMM + All-to-All: rank {s} routes row {row} to rank {d}, but there are {world} ranks");
        }
        for d in r {
            h.update(&d.to_le_bytes());
        }
    }
    Ok(format!(" routing {:08x}", h.finalize()))
}

impl<TO: OpElement> GemmAllToAll<TO> {
    /// Collective, as [`super::GemmAllReduce::plan`], with `routes[s][row]` = the destination
    /// rank of rank s's output row (every rank's routing, the same on every rank).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        rdzv: &mut dyn Bootstrap,
        env: &mut OverlapEnv,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        routes: &[Vec<u32>],
        choice: &MethodChoice,
        capturable: bool,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let kind = OpKind::AllToAll;
            let rank = rdzv.rank();
            let checks = check_dtype::<TO>(kind, shape, "output", options.output)
                .and_then(|()| check_routes(routes, rdzv.world(), shape.m));
            agree_on_request(
                rdzv, env, stream, kind, shape, &options, choice, capturable, checks,
            )?;
            let sources = sources_of(routes, rank);
            let mut operands: Option<(Operands, Bench)> = None;
            let seed = 0xa2a ^ ((rank as u64) << 40);
            let new = |imp: Imp<TO>, report: ChoiceReport| -> anyhow::Result<Self> {
                // The fused method's output is its own peer buffer.
                let len = match imp {
                    Imp::Fused(_) => 1,
                    _ => (sources.len() * shape.n as usize).max(1),
                };
                let out = stream.alloc_zeros::<TO>(len)?;
                Ok(Self {
                    shape,
                    options,
                    stream: stream.clone(),
                    report,
                    sources: sources.clone(),
                    out,
                    imp,
                })
            };
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
                |rdzv, env, m| plan_imp::<TO>(rdzv, env, stream, shape, options, routes, m),
                |rdzv, env, m| {
                    if operands.is_none() {
                        let (mk, kn) = ((shape.m * shape.k) as usize, (shape.k * shape.n) as usize);
                        operands = Some((
                            Operands::random(stream, &options, seed, mk, kn)?,
                            Bench::new(stream)?,
                        ));
                    }
                    let (ops, bench) = operands.as_mut().expect("made above");
                    let planned = plan_imp::<TO>(rdzv, env, stream, shape, options, routes, m)
                        .and_then(|imp| new(imp, exact_report(m)));
                    let op = agree(rdzv, &format!("planning {m}"), planned)?;
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
            new(imp, report)
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

    /// Rows this rank receives (the output is rows() × n).
    pub fn rows(&self) -> usize {
        self.sources.len()
    }

    /// (source rank, source row) of each output row.
    pub fn sources(&self) -> &[(u32, u32)] {
        &self.sources
    }

    /// Enqueues the GEMM and the All-to-All of its rows on the planned stream. Every rank must
    /// launch the same number of times.
    pub fn launch<TI: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let GemmShape { m, n, k } = self.shape;
            check_launch::<TI>(
                OpKind::AllToAll,
                &self.stream,
                stream,
                &self.options,
                &[
                    ("A", a.len(), (m * k) as usize),
                    ("B", b.len(), (k * n) as usize),
                ],
            )?;
            check_capture(stream, &self.report.method)?;
            let out = &mut self.out;
            match &mut self.imp {
                Imp::Seq {
                    gemm,
                    comm,
                    gather,
                    d,
                    send,
                } => {
                    gemm.launch(stream, a, b, d)?;
                    gather.gather(stream, d, send)?;
                    let (sends, recvs) = gather.ranges();
                    lock(comm)?
                        .all_to_all_v(&*send, sends, out, recvs, stream)
                        .map_err(anyhow::Error::from)
                }
                Imp::Signal {
                    ov,
                    comm,
                    staging,
                    received,
                } => ov
                    .run(stream, &*lock(comm)?, a, b, staging, received, out)
                    .map_err(anyhow::Error::from),
                Imp::CopyEngine(ce) => ce.run(stream, a, b, out).map_err(anyhow::Error::from),
                Imp::Fused(f) => f.run(stream, a, b).map_err(anyhow::Error::from),
            }
        })
    }

    /// The op's result: rows() × n of TO, the last launch's once it has run.
    pub fn output(&self) -> OpBuffer<'_, TO> {
        let ptr = match &self.imp {
            Imp::Fused(f) => f.output().local_ptr(),
            _ => self.out.device_ptr(&self.stream).0,
        };
        // SAFETY: `out`, or the fused method's output, holds at least rows() × n elements of TO
        // and lives as long as self.
        unsafe {
            OpBuffer::new(
                ptr,
                self.sources.len() * self.shape.n as usize,
                &self.stream,
            )
        }
    }

    /// As [`super::GemmAllReduce::synchronize`].
    pub fn synchronize(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let what = || format!("GEMM + All-to-All {} ({})", self.shape, self.method());
            match &self.imp {
                Imp::Fused(f) => f.synchronize(&self.stream).map_err(anyhow::Error::from),
                Imp::Seq { comm, .. } => synchronize_with(comm, &self.stream, &what()),
                Imp::Signal { ov, comm, .. } => {
                    synchronize_with(comm, &self.stream, &what())?;
                    ov.check().map_err(anyhow::Error::from)
                }
                Imp::CopyEngine(ce) => {
                    self.stream.synchronize()?;
                    ce.check().map_err(anyhow::Error::from)
                }
            }
        })
    }

    /// Collective: frees the op's peer memory (signal-ce, fused-intra) on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            match self.imp {
                Imp::CopyEngine(ce) => ce.free(rdzv).map_err(anyhow::Error::from),
                Imp::Fused(f) => f.free(rdzv).map_err(anyhow::Error::from),
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
    routes: &[Vec<u32>],
    method: &Method,
) -> anyhow::Result<Imp<TO>> {
    let rank = rdzv.rank();
    let mn = (shape.m * shape.n) as usize;
    let alloc =
        |len: usize| -> anyhow::Result<CudaSlice<TO>> { Ok(stream.alloc_zeros::<TO>(len.max(1))?) };
    Ok(match method {
        Method::SeqCublas | Method::SeqWeft => {
            let gather = RowGather::new(stream, routes, rank, shape.m, shape.n)?;
            let (comm, d, send) = (env.comm().clone(), alloc(mn)?, alloc(gather.send_len())?);
            Imp::Seq {
                gemm: SeqGemm::new(method, stream, shape, options, env.rank())?,
                comm,
                gather,
                d,
                send,
            }
        }
        Method::Signal { sm_margin, waves } => {
            let local = AllToAllOverlap::new(
                stream,
                shape,
                GemmOptions {
                    sm_margin: *sm_margin,
                    ..options
                },
                Some(waves),
                routes,
                rank,
            );
            let ov = agree(
                rdzv,
                "planning the signal GEMM",
                local.map_err(anyhow::Error::from),
            )?;
            let comm = env.limited_comm(rdzv, *sm_margin)?;
            let (staging, received) = (alloc(ov.staging_len())?, alloc(ov.received_len())?);
            Imp::Signal {
                ov,
                comm,
                staging,
                received,
            }
        }
        Method::SignalCe { waves } => Imp::CopyEngine(Box::new(AllToAllCopyEngine::new(
            rdzv, stream, shape, options, waves, routes,
        )?)),
        Method::FusedIntra { .. } => Imp::Fused(Box::new(FusedAllToAll::new(
            rdzv,
            stream.context(),
            stream,
            shape,
            GemmOptions {
                tile: method.tile_choice(options.tile)?,
                ..options
            },
            routes,
        )?)),
        other => {
            refuse!(Options, "{other} is not a method of GEMM + All-to-All (seq-cublas, seq-weft, signal, signal-ce, fused-intra)")
        }
    })
}

impl<TO: OpElement> Candidate for GemmAllToAll<TO> {
    fn synchronize(&self) -> anyhow::Result<()> {
        Self::synchronize(self).map_err(anyhow::Error::from)
    }
    fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        Self::free(self, rdzv).map_err(anyhow::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_source_by_source_rows_ascending() {
        let routes = vec![vec![1, 0, 1, 1], vec![0, 1, 1, 0]];
        assert_eq!(
            sources_of(&routes, 1),
            vec![(0, 0), (0, 2), (0, 3), (1, 1), (1, 2)]
        );
        assert_eq!(sources_of(&routes, 0), vec![(0, 1), (1, 0), (1, 3)]);
    }

    #[test]
    fn bad_routings_are_named() {
        let err = |r: &[Vec<u32>], w, m| format!("{:#}", check_routes(r, w, m).unwrap_err());
        assert!(err(&[vec![0, 1]], 2, 2).contains("1 routings for 2 ranks"));
        assert!(err(&[vec![0, 1], vec![0]], 2, 2).contains("rank 1's routing has 1 rows"));
        assert!(err(&[vec![0, 2], vec![0, 1]], 2, 2).contains("routes row 1 to rank 2"));
        assert_ne!(
            check_routes(&[vec![0, 1], vec![1, 0]], 2, 2).unwrap(),
            check_routes(&[vec![1, 0], vec![1, 0]], 2, 2).unwrap()
        );
    }
}
