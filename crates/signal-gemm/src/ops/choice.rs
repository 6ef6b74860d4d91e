//! How every op turns a [`MethodChoice`] into a planned method: an exact method is planned as
//! asked; `Auto` or a family ranks its candidates ([`rank_candidates`]: cached, or measured at
//! first use) and plans the fastest that every rank can plan at this exact shape.

use super::candidates::{candidates, OpKind};
use super::choose::{rank_candidates_predicted, Ranking};
use super::env::{lock, OverlapEnv};
use super::key::ChoiceKey;
use super::method::{Method, MethodChoice};
use crate::dtype::GemmElement;
use crate::error::agree;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::gemm::device_sms;
use crate::plan::{GemmOptions, GemmShape};
use crate::timing::{l2_flush_bytes, median, time_flushed_aligned_waiting};
use cudarc::driver::{CudaSlice, CudaStream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_pgl::nccl::ReduceOp;
use weft_pgl::Bootstrap;

/// What an op was asked for and what it runs.
#[derive(Clone, Debug)]
pub struct ChoiceReport {
    pub asked: MethodChoice,
    pub method: Method,
    /// The ranking behind an `Auto` or family choice (None for an exact method).
    pub ranking: Option<Ranking>,
    /// Faster candidates that could not be planned at this exact shape, with why.
    pub refused: Vec<(Method, String)>,
}

impl ChoiceReport {
    /// Seconds this plan spent measuring candidates (0 when the cache knew them).
    pub fn first_use_s(&self) -> f64 {
        self.ranking.as_ref().map_or(0.0, |r| r.first_use_s)
    }
}

/// What an op's planning needs besides its own buffers.
pub(crate) struct PlanRequest<'a> {
    pub kind: OpKind,
    pub shape: GemmShape,
    pub options: GemmOptions,
    pub choice: &'a MethodChoice,
    pub capturable: bool,
}

/// Collective: plans `req.choice` (see the module). `plan_exact` plans one method on this rank
/// (it may itself be collective); `measure` makes, times and frees one (collective).
pub(crate) fn choose_and_plan<T>(
    rdzv: &mut dyn Bootstrap,
    env: &mut OverlapEnv,
    req: PlanRequest<'_>,
    mut plan_exact: impl FnMut(&mut dyn Bootstrap, &mut OverlapEnv, &Method) -> anyhow::Result<T>,
    mut measure: impl FnMut(&mut dyn Bootstrap, &mut OverlapEnv, &Method) -> anyhow::Result<f64>,
) -> anyhow::Result<(T, ChoiceReport)> {
    let PlanRequest {
        kind,
        shape,
        options,
        choice,
        capturable,
    } = req;
    let title = kind.title();
    if let MethodChoice::Exact(m) = choice {
        require!(
            !capturable || m.family().capturable(), Options,
            "{title} {shape}: {m} cannot be replayed from a CUDA graph (its kernels carry host-side epochs), and the op was asked to be capturable"
        );
        let planned = plan_exact(rdzv, env, m);
        let op = agree(rdzv, &format!("planning {title} {shape} with {m}"), planned)?;
        return Ok((op, exact_report(m)));
    }
    let world = rdzv.world() as u32;
    let sms = device_sms(env.context())?;
    let allowed: Vec<Method> = candidates(kind, shape, options, world, sms, capturable)
        .into_iter()
        .filter(|m| choice.allows(m))
        .collect();
    require!(
        !allowed.is_empty(),
        Options,
        "{title} {shape}: no {choice} method can run this shape on {world} ranks{}",
        if capturable { " capturably" } else { "" }
    );
    let key = ChoiceKey::new(kind, shape, &options, capturable, world, env.machine());
    let mut cache = std::mem::take(env.cache_mut());
    let policy = *env.policy();
    let predictions: Vec<Option<f64>> = allowed
        .iter()
        .map(|m| env.predict(kind, shape, options, m))
        .collect();
    let ranked = rank_candidates_predicted(
        rdzv,
        &mut cache,
        &key,
        shape.m,
        &allowed,
        &policy,
        |m| {
            let at = allowed.iter().position(|a| a == m)?;
            predictions[at]
        },
        |rdzv, m| measure(rdzv, env, m),
    );
    *env.cache_mut() = cache;
    let ranking = ranked?;
    let mut refused = Vec::new();
    for (m, _) in ranking.preferred(|m| choice.allows(m)) {
        let planned = plan_exact(rdzv, env, m);
        match agree(rdzv, &format!("planning {title} {shape} with {m}"), planned) {
            Ok(op) => {
                let report = ChoiceReport {
                    asked: choice.clone(),
                    method: m.clone(),
                    ranking: Some(ranking.clone()),
                    refused,
                };
                return Ok((op, report));
            }
            Err(e) => refused.push((m.clone(), format!("{e:#}"))),
        }
    }
    let refused: Vec<String> = refused.iter().map(|(m, e)| format!("{m}: {e}")).collect();
    refuse!(
        Options,
        "{title} {shape}: no {choice} method could be planned ({}{}{})",
        ranking.why_none(|m| choice.allows(m)),
        if refused.is_empty() {
            ""
        } else {
            "; refused at this shape: "
        },
        refused.join("; ")
    )
}

/// What a first use needs of a planned op besides launching it.
pub(crate) trait Candidate: Sized {
    /// Waits for the op's stream, naming any wait of the op that ran past its bound.
    fn synchronize(&self) -> anyhow::Result<()>;
    /// Collective: frees the op's peer memory.
    fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()>;
}

/// The report of a candidate planned exactly, to be measured.
pub(crate) fn exact_report(method: &Method) -> ChoiceReport {
    ChoiceReport {
        asked: MethodChoice::Exact(method.clone()),
        method: method.clone(),
        ranking: None,
        refused: Vec::new(),
    }
}

/// What a first-use timing of `method` is called in a bounded wait's error.
pub(crate) fn first_use_what(kind: OpKind, shape: GemmShape, method: &Method) -> String {
    format!(
        "{} {shape}: Auto's first-use timing of {method}",
        kind.title()
    )
}

/// Collective: `time`s a candidate planned on every rank, waits for it and frees it (freed even
/// when the timing failed, so every rank takes part); this rank's median ms.
pub(crate) fn time_candidate<O: Candidate>(
    rdzv: &mut dyn Bootstrap,
    mut op: O,
    time: impl FnOnce(&mut O) -> anyhow::Result<f64>,
) -> anyhow::Result<f64> {
    // The op's own wait runs even after a failed timing: where a kernel of the op gave up, its
    // report (what it waited for) is the error to show.
    let timed = time(&mut op);
    let synced = op.synchronize();
    let timed = match (timed, synced) {
        (Ok(t), Ok(())) => Ok(t),
        (Ok(_), Err(e)) => Err(e),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(report)) => Err(report.context(format!("{e:#}"))),
    };
    let freed = op.free(rdzv);
    let t = timed?;
    freed?;
    Ok(t)
}

/// The L2 flush and the line-up buffer a first use times its candidates with.
pub(crate) struct Bench {
    pub flush: CudaSlice<u8>,
    tiny: CudaSlice<f32>,
}

impl Bench {
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let flush = stream.alloc_zeros::<u8>(l2_flush_bytes(stream.context())?)?;
            let tiny = stream.alloc_zeros::<f32>(1)?;
            Ok(Self { flush, tiny })
        })
    }

    /// This rank's median ms of `op` (warm-up and iterations as `env`'s policy says; before each
    /// timed run, outside its events, L2 flushed and the ranks lined up by a one-element
    /// ncclAllReduce on `env`'s communicator, as the overlap benches time their rows: unaligned,
    /// a rank's run could start while its peer is still in the previous one, and the methods
    /// that wait for their peers inside the kernel measured up to 20 % faster than they run
    /// aligned — GEMM + All-to-All fused-intra at M = 128 on two H200s). The stream is waited
    /// for through `env`'s communicator (its budget, NCCL's errors polled, aborted past the
    /// budget), so a peer that never joins a timed collective ends the timing with an error
    /// naming `what`, not a hang.
    pub fn time(
        &mut self,
        env: &OverlapEnv,
        stream: &Arc<CudaStream>,
        what: &str,
        op: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<f64> {
        let p = env.policy();
        let tiny = &mut self.tiny;
        let align = || {
            let comm = lock(env.comm())?;
            comm.all_reduce_in_place(tiny, ReduceOp::Sum, stream)
                .map_err(anyhow::Error::from)
        };
        let wait = || super::env::synchronize_with(env.comm(), stream, what);
        Ok(median(&time_flushed_aligned_waiting(
            stream,
            p.warmup,
            p.iters.max(1),
            &mut self.flush,
            align,
            op,
            wait,
        )?))
    }
}

/// `count` values in [-1, 1] on the device: a random block of up to 2^20 values repeated (enough
/// for timing: not zeros, and no cheaper to multiply than fully random data).
pub(crate) fn random_device<T: GemmElement>(
    stream: &Arc<CudaStream>,
    seed: u64,
    count: usize,
) -> anyhow::Result<CudaSlice<T>> {
    let block_len = count.clamp(1, 1 << 20);
    let mut rng = StdRng::seed_from_u64(seed);
    let block: Vec<T> = (0..block_len)
        .map(|_| T::from_f64(rng.random_range(-1.0..=1.0)))
        .collect();
    // SAFETY: every element is written below before the buffer is read.
    let mut d = unsafe { stream.alloc::<T>(count.max(1)) }?;
    let mut at = 0;
    while at < count {
        let len = block_len.min(count - at);
        stream.memcpy_htod(&block[..len], &mut d.slice_mut(at..at + len))?;
        at += len;
    }
    stream.synchronize()?;
    Ok(d)
}
