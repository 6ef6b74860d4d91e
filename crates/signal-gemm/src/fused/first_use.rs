//! Choices made at first use and kept in a [`ChoiceCache`]: the communicator or worker CTA count
//! of a fused method, and the fastest of several methods (`--method auto`) per op and shape.
//!
//! [`choose`] is collective: rank 0's cache answers for every rank (so all build the same op); a
//! question it has no answer to is measured on every rank, candidate by candidate (each op made,
//! run on random inputs, timed by CUDA events: median of back-to-back runs, freed), the slowest
//! rank's time counts, the fastest candidate wins and rank 0 records it. A candidate that cannot
//! be made (its CTAs do not fit, say) is skipped on every rank alike; if none can, the error
//! names each one's reason.

use super::all_gather::{AllGatherMethod, FusedAllGatherGemm};
use super::all_reduce::{AllReduceMethod, FusedAllReduce};
use super::choice_cache::{Candidate, Choice, ChoiceCache, ChoiceKey};
use crate::dtype::{Dtype, GemmElement};
use crate::gemm::device_sms;
use crate::plan::{GemmOptions, GemmShape};
use crate::timing::{median, time_iterations};
use anyhow::{bail, Context};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_pgl::rendezvous::Rendezvous;
use weft_pgl::{agree, PglElement};

/// The CTA counts tried for a method's communicators or workers.
pub const COUNT_CANDIDATES: [u32; 3] = [8, 16, 32];

/// Untimed and timed runs per candidate.
const WARMUP: usize = 2;
const ITERS: usize = 7;

/// Collective: the answer to `question` for `shape` (see the module). `measure` makes, runs and
/// frees one candidate (collectively) and returns this rank's median ms.
pub fn choose(
    rdzv: &mut Rendezvous,
    ctx: &Arc<CudaContext>,
    cache: &mut ChoiceCache,
    question: &str,
    shape: GemmShape,
    candidates: &[Candidate],
    mut measure: impl FnMut(&mut Rendezvous, &Candidate) -> anyhow::Result<f64>,
) -> anyhow::Result<Choice> {
    let key = ChoiceKey {
        question: question.to_string(),
        shape,
        world: rdzv.world() as u32,
        sms: device_sms(ctx)?,
        device: ctx.name().context("reading the device name")?,
    };
    // Rank 0's cached answer, as "method count ms", or nothing.
    let cached = match cache.lookup(&key) {
        Some(c) if rdzv.rank() == 0 => format!("{} {} {}", c.answer.method, c.answer.count, c.ms),
        _ => String::new(),
    };
    let cached = String::from_utf8(rdzv.broadcast(0, cached.as_bytes())?)?;
    if let [method, count, ms] = cached.split(' ').collect::<Vec<_>>()[..] {
        return Ok(Choice {
            key,
            answer: Candidate::new(method, count.parse()?),
            ms: ms.parse()?,
        });
    }
    let mut best: Option<(f64, &Candidate)> = None;
    let mut skipped = Vec::new();
    for candidate in candidates {
        let step = format!("measuring {candidate} for {question} at {shape}");
        let mine = measure(rdzv, candidate);
        let ms = match agree(rdzv, &step, mine) {
            Ok(ms) => ms,
            Err(e) => {
                skipped.push(format!("{candidate}: {e:#}"));
                continue;
            }
        };
        let all = rdzv.all_gather(&ms.to_le_bytes())?;
        let slowest = all
            .iter()
            .map(|b| f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])))
            .fold(0.0f64, f64::max);
        if best.is_none_or(|(t, _)| slowest < t) {
            best = Some((slowest, candidate));
        }
    }
    let Some((ms, answer)) = best else {
        bail!(
            "{question} at {shape}: no candidate could be measured ({})",
            skipped.join("; ")
        );
    };
    let choice = Choice {
        key,
        answer: answer.clone(),
        ms,
    };
    if rdzv.rank() == 0 {
        cache.record(choice.clone())?;
    }
    Ok(choice)
}

/// Random values in [-1, 1] on the device.
fn random_device<T: GemmElement>(
    stream: &Arc<CudaStream>,
    seed: u64,
    count: usize,
) -> anyhow::Result<CudaSlice<T>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let host: Vec<T> = (0..count)
        .map(|_| T::from_f64(rng.random_range(-1.0..=1.0)))
        .collect();
    Ok(stream.clone_htod(&host)?)
}

fn median_ms(
    stream: &Arc<CudaStream>,
    op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    Ok(median(&time_iterations(stream, WARMUP, ITERS, op)?))
}

/// The fused AllReduce's method and worker count among `methods` ("fused-inter", "distfuse"),
/// each with every count of [`COUNT_CANDIDATES`], for `shape` and `options` (DistFuse: the
/// workers' SMs added to options.sm_margin). Collective; question `all_reduce.<methods joined
/// by +>`.
pub fn all_reduce_method(
    rdzv: &mut Rendezvous,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    cache: &mut ChoiceCache,
    shape: GemmShape,
    options: GemmOptions,
    methods: &[&str],
) -> anyhow::Result<(GemmOptions, AllReduceMethod)> {
    let make = |c: &Candidate| -> anyhow::Result<(GemmOptions, AllReduceMethod)> {
        match c.method.as_str() {
            "fused-inter" => Ok((options, AllReduceMethod::Inter { comm_ctas: c.count })),
            "distfuse" => Ok((
                GemmOptions {
                    sm_margin: options.sm_margin + c.count,
                    ..options
                },
                AllReduceMethod::DistFuse { workers: c.count },
            )),
            other => bail!("the fused AllReduce has no method {other:?} (fused-inter, distfuse)"),
        }
    };
    let candidates = counted(methods);
    candidates.iter().try_for_each(|c| make(c).map(|_| ()))?;
    let question = format!("all_reduce.{}", methods.join("+"));
    let seed = 0xA11 ^ rdzv.rank() as u64;
    let choice = choose(
        rdzv,
        ctx,
        cache,
        &question,
        shape,
        &candidates,
        |rdzv, c| {
            let (options, method) = make(c)?;
            let a = random_device::<bf16>(stream, seed, (shape.m * shape.k) as usize)?;
            let b = random_device::<bf16>(stream, seed ^ 1, (shape.k * shape.n) as usize)?;
            let mut op = FusedAllReduce::new(rdzv, ctx, stream, shape, options, method)?;
            let timed = median_ms(stream, || op.run(stream, &a, &b))
                .and_then(|t| op.synchronize(stream).map(|()| t));
            let freed = op.free(rdzv);
            let t = timed?;
            freed?;
            Ok(t)
        },
    )?;
    make(&choice.answer)
}

/// The fused AllGather's method among `methods` ("fused-intra"; "fused-inter" with every count
/// of [`COUNT_CANDIDATES`]) for `shape` and `options`. Collective; question
/// `all_gather.<methods joined by +>`.
pub fn all_gather_method<TI: GemmElement + PglElement>(
    rdzv: &mut Rendezvous,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    cache: &mut ChoiceCache,
    shape: GemmShape,
    options: GemmOptions,
    methods: &[&str],
) -> anyhow::Result<AllGatherMethod> {
    let make = |c: &Candidate| -> anyhow::Result<AllGatherMethod> {
        match c.method.as_str() {
            "fused-intra" => Ok(AllGatherMethod::Intra),
            "fused-inter" => Ok(AllGatherMethod::Inter { comm_ctas: c.count }),
            other => {
                bail!("the fused AllGather has no method {other:?} (fused-intra, fused-inter)")
            }
        }
    };
    let candidates = counted(methods);
    candidates.iter().try_for_each(|c| make(c).map(|_| ()))?;
    let question = format!("all_gather.{}", methods.join("+"));
    let seed = 0xA6 ^ rdzv.rank() as u64;
    let choice = choose(
        rdzv,
        ctx,
        cache,
        &question,
        shape,
        &candidates,
        |rdzv, c| {
            let method = make(c)?;
            match options.output {
                Dtype::F32 => {
                    time_all_gather::<TI, f32>(rdzv, ctx, stream, shape, options, method, seed)
                }
                _ => time_all_gather::<TI, bf16>(rdzv, ctx, stream, shape, options, method, seed),
            }
        },
    )?;
    make(&choice.answer)
}

/// One fused AllGather candidate's median ms on random shards.
fn time_all_gather<TI: GemmElement + PglElement, TO: GemmElement>(
    rdzv: &mut Rendezvous,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    method: AllGatherMethod,
    seed: u64,
) -> anyhow::Result<f64> {
    let world = rdzv.world() as u32;
    let shard = random_device::<TI>(stream, seed, (shape.m / world * shape.k) as usize)?;
    let b = random_device::<TI>(stream, seed ^ 1, (shape.k * shape.n) as usize)?;
    let mut d = random_device::<TO>(stream, seed ^ 2, (shape.m * shape.n) as usize)?;
    let mut op = FusedAllGatherGemm::<TI>::new(rdzv, ctx, stream, shape, options, method)?;
    let timed = op
        .copy_shard(stream, &shard)
        .and_then(|()| median_ms(stream, || op.run(stream, &b, &mut d)))
        .and_then(|t| op.synchronize(stream).map(|()| t));
    let freed = op.free(rdzv);
    let t = timed?;
    freed?;
    Ok(t)
}

/// Each method with each count (methods without communicators once, count 0).
fn counted(methods: &[&str]) -> Vec<Candidate> {
    methods
        .iter()
        .flat_map(|&m| match m {
            "fused-intra" => vec![Candidate::new(m, 0)],
            _ => COUNT_CANDIDATES
                .iter()
                .map(|&c| Candidate::new(m, c))
                .collect(),
        })
        .collect()
}
