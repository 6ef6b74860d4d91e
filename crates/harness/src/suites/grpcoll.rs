//! GroupCast / GroupReduce correctness (crates/grpcoll): seeded random patterns (split counts and
//! sizes, empty splits, fan-out 0…world for cast and 1…world for reduce, odd row widths), every
//! data dtype, communication dtypes narrower than the data, accumulation into the existing output,
//! packed transfer of up to three tensors, on the native kernels (`::native`) and on the
//! AlltoAll-v baseline (`::alltoallv`, needs NCCL: one GPU per rank), against a float64 CPU
//! reference that every rank computes from every rank's regenerated inputs
//! (grpcoll_reference.rs). Outputs are poisoned (NaN) first, or set to random prior values when
//! accumulating; every output element is checked, and the rows past this rank's output must stay
//! poisoned. Cast is checked bit for bit; reductions within a tolerance set by the dtypes. The
//! native path runs three times back to back per pattern (epoch reuse with no host
//! synchronisation) unless it accumulates. Metadata errors must fail on every rank with a message
//! naming the problem. Long back-to-back loops: grpcoll_stress.rs.

use super::grpcoll_reference::{
    cast_reference, check, check_lse, reduce_reference, round_to, GElem, Op, ReduceInputs,
};
use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::{sys, CudaStream};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_grpcoll::pattern::{cast_metas, reduce_metas, CastBlock, ReduceBlock};
use weft_grpcoll::{
    GroupCast, GroupCastMeta, GroupReduce, GroupReduceMeta, GrpcollError, Options, ReduceOp,
};
use weft_pgl::{DType, Pgl, PglElement};

/// Which path a trial runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    Native,
    AllToAllV,
}

/// A trial's plan options besides the SM count (random per pattern).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cfg {
    pub comm: Option<DType>,
    pub accumulate: bool,
    pub tensors: usize,
}

const PLAIN: Cfg = Cfg {
    comm: None,
    accumulate: false,
    tensors: 1,
};

const fn via(comm: DType) -> Cfg {
    Cfg {
        comm: Some(comm),
        ..PLAIN
    }
}

const ACCUMULATE: Cfg = Cfg {
    accumulate: true,
    ..PLAIN
};

/// A `::native` and an `::alltoallv` trial of one configuration.
macro_rules! both {
    ($name:expr, $trial:ident :: < $t:ty > ( $($arg:expr),* )) => {
        [
            Case::gpu(format!("{}::native", $name), |j| $trial::<$t>(j, Via::Native, $($arg),*)),
            Case::gpu(format!("{}::alltoallv", $name), |j| $trial::<$t>(j, Via::AllToAllV, $($arg),*)),
        ]
    };
}

pub fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = [
        both!("grpcoll::cast::f32", cast_trial::<f32>(PLAIN)),
        both!("grpcoll::cast::bf16", cast_trial::<bf16>(PLAIN)),
        both!("grpcoll::cast::f16", cast_trial::<f16>(PLAIN)),
        both!("grpcoll::cast::f64", cast_trial::<f64>(PLAIN)),
        both!(
            "grpcoll::cast::f32_via_bf16",
            cast_trial::<f32>(via(DType::Bf16))
        ),
        both!(
            "grpcoll::cast::f64_via_f16",
            cast_trial::<f64>(via(DType::F16))
        ),
        both!(
            "grpcoll::cast::f64_via_f32",
            cast_trial::<f64>(via(DType::F32))
        ),
        both!(
            "grpcoll::cast::packed3::bf16",
            cast_trial::<bf16>(Cfg {
                tensors: 3,
                ..PLAIN
            })
        ),
        both!(
            "grpcoll::cast::packed2::f32_via_bf16",
            cast_trial::<f32>(Cfg {
                tensors: 2,
                ..via(DType::Bf16)
            })
        ),
        both!(
            "grpcoll::reduce::sum::f32",
            reduce_trial::<f32>(Op::Sum, PLAIN)
        ),
        both!(
            "grpcoll::reduce::sum::bf16",
            reduce_trial::<bf16>(Op::Sum, PLAIN)
        ),
        both!(
            "grpcoll::reduce::sum::f16",
            reduce_trial::<f16>(Op::Sum, PLAIN)
        ),
        both!(
            "grpcoll::reduce::sum::f64",
            reduce_trial::<f64>(Op::Sum, PLAIN)
        ),
        both!(
            "grpcoll::reduce::avg::f32",
            reduce_trial::<f32>(Op::Avg, PLAIN)
        ),
        both!(
            "grpcoll::reduce::avg::bf16",
            reduce_trial::<bf16>(Op::Avg, PLAIN)
        ),
        both!(
            "grpcoll::reduce::avg::f16",
            reduce_trial::<f16>(Op::Avg, PLAIN)
        ),
        both!(
            "grpcoll::reduce::avg::f64",
            reduce_trial::<f64>(Op::Avg, PLAIN)
        ),
        both!(
            "grpcoll::reduce::lse::f32",
            reduce_trial::<f32>(Op::Lse, PLAIN)
        ),
        both!(
            "grpcoll::reduce::lse::bf16",
            reduce_trial::<bf16>(Op::Lse, PLAIN)
        ),
        both!(
            "grpcoll::reduce::lse::f16",
            reduce_trial::<f16>(Op::Lse, PLAIN)
        ),
        both!(
            "grpcoll::reduce::lse::f64",
            reduce_trial::<f64>(Op::Lse, PLAIN)
        ),
        both!(
            "grpcoll::reduce::sum::f32_via_bf16",
            reduce_trial::<f32>(Op::Sum, via(DType::Bf16))
        ),
        both!(
            "grpcoll::reduce::avg::f32_via_f16",
            reduce_trial::<f32>(Op::Avg, via(DType::F16))
        ),
        both!(
            "grpcoll::reduce::lse::f64_via_f32",
            reduce_trial::<f64>(Op::Lse, via(DType::F32))
        ),
        // One tensor through a narrower dtype into f64: the bulk pull's fp64 accumulators.
        both!(
            "grpcoll::reduce::sum::f64_via_bf16",
            reduce_trial::<f64>(Op::Sum, via(DType::Bf16))
        ),
        both!(
            "grpcoll::reduce::avg::accumulate::f64_via_f32",
            reduce_trial::<f64>(
                Op::Avg,
                Cfg {
                    accumulate: true,
                    ..via(DType::F32)
                }
            )
        ),
        both!(
            "grpcoll::reduce::sum::accumulate::bf16",
            reduce_trial::<bf16>(Op::Sum, ACCUMULATE)
        ),
        both!(
            "grpcoll::reduce::avg::accumulate::f32",
            reduce_trial::<f32>(Op::Avg, ACCUMULATE)
        ),
        both!(
            "grpcoll::reduce::lse::accumulate::f32",
            reduce_trial::<f32>(Op::Lse, ACCUMULATE)
        ),
        both!(
            "grpcoll::reduce::lse::accumulate::bf16",
            reduce_trial::<bf16>(Op::Lse, ACCUMULATE)
        ),
        both!(
            "grpcoll::reduce::sum::accumulate::f32_via_bf16",
            reduce_trial::<f32>(
                Op::Sum,
                Cfg {
                    accumulate: true,
                    ..via(DType::Bf16)
                }
            )
        ),
        both!(
            "grpcoll::reduce::packed3::sum::bf16",
            reduce_trial::<bf16>(
                Op::Sum,
                Cfg {
                    tensors: 3,
                    ..PLAIN
                }
            )
        ),
        both!(
            "grpcoll::reduce::packed2::avg::accumulate::f64_via_f32",
            reduce_trial::<f64>(
                Op::Avg,
                Cfg {
                    tensors: 2,
                    accumulate: true,
                    comm: Some(DType::F32)
                }
            )
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    v.extend(super::grpcoll_stress::cases());
    v.extend(super::grpcoll_device_meta::cases());
    v.extend([
        Case::gpu("grpcoll::kernel_barrier_arrivals", kernel_barrier_arrivals),
        Case::gpu("grpcoll::errors::split_sum", err_split_sum),
        Case::gpu("grpcoll::errors::index_out_of_range", err_out_of_range),
        Case::gpu("grpcoll::errors::duplicate_destination", err_duplicate),
        Case::gpu("grpcoll::errors::cross_rank_disagreement", err_disagreement),
        Case::gpu("grpcoll::errors::unsupported_dtype", err_dtype),
        Case::gpu("grpcoll::errors::options", err_options),
    ]);
    v
}

const PATTERNS: usize = 4;
const ROW_ELEMS: [usize; 6] = [1, 3, 8, 24, 136, 1024];

pub(super) fn gpu_stream(job: &Job) -> anyhow::Result<std::sync::Arc<cudarc::driver::CudaStream>> {
    Ok(job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .stream
        .clone())
}

fn random_subset(rng: &mut StdRng, world: usize, min: usize) -> Vec<usize> {
    let k = rng.random_range(min..=world);
    let mut all: Vec<usize> = (0..world).collect();
    for i in 0..world {
        let j = rng.random_range(i..world);
        all.swap(i, j);
    }
    all.truncate(k);
    all
}

fn random_rows(rng: &mut StdRng, big: bool) -> usize {
    match rng.random_range(0..10) {
        0..=1 => 0,
        2..=7 => rng.random_range(1..40),
        _ => rng.random_range(1..if big { 600 } else { 80 }),
    }
}

/// Pattern p: up to 5 splits per rank; pattern 0 sends every split to every rank (full fan-out).
pub(super) fn cast_blocks(rng: &mut StdRng, world: usize, p: usize, big: bool) -> Vec<CastBlock> {
    let mut v = Vec::new();
    for owner in 0..world {
        for _ in 0..rng.random_range(0..=5) {
            let dsts = if p == 0 {
                (0..world).collect()
            } else {
                random_subset(rng, world, 0)
            };
            v.push(CastBlock {
                owner,
                rows: random_rows(rng, big),
                dsts,
            });
        }
    }
    // Interleave owners in the list (the generator keeps each owner's order).
    let n = v.len();
    for i in 0..n {
        let j = rng.random_range(i..n);
        v.swap(i, j);
    }
    v
}

pub(super) fn reduce_blocks(
    rng: &mut StdRng,
    world: usize,
    p: usize,
    big: bool,
) -> Vec<ReduceBlock> {
    let mut v = Vec::new();
    for receiver in 0..world {
        for _ in 0..rng.random_range(0..=5) {
            let srcs = if p == 0 {
                (0..world).collect()
            } else {
                random_subset(rng, world, 1)
            };
            v.push(ReduceBlock {
                receiver,
                rows: random_rows(rng, big),
                srcs,
            });
        }
    }
    v
}

/// Values of stream `what` (input, prior output…) of tensor t, pattern p, rank r, rounded to T;
/// regenerable by every rank.
pub(super) fn values<T: GElem>(
    seed: u64,
    what: u64,
    p: usize,
    t: usize,
    r: usize,
    n: usize,
) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(
        seed ^ (what << 56)
            ^ ((p as u64) << 32)
            ^ ((t as u64) << 24)
            ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    (0..n)
        .map(|_| T::from_f64(rng.random_range(-1.0..1.0)))
        .collect()
}

/// lse values in [-4, 4), one in 20 of them -inf.
pub(super) fn lse_values(seed: u64, what: u64, p: usize, r: usize, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(
        !seed ^ (what << 56) ^ ((p as u64) << 32) ^ (r as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    (0..n)
        .map(|_| {
            if rng.random_range(0..20) == 0 {
                f32::NEG_INFINITY
            } else {
                rng.random_range(-4.0f32..4.0)
            }
        })
        .collect()
}

const INPUT: u64 = 1;
const PRIOR: u64 = 2;

/// The most SMs a trial's plan may take: 24, or fewer when ranks share the GPU (every rank's
/// grid must be resident at once; the plan refuses more). Collective.
fn trial_max_sms(job: &mut Job, stream: &Arc<CudaStream>) -> anyhow::Result<u32> {
    let (device_sms, sharing) = gpu_sharing(job, stream)?;
    Ok(24.min(device_sms / sharing))
}

/// (the device's SMs, the most ranks on one GPU). Collective.
fn gpu_sharing(job: &mut Job, stream: &Arc<CudaStream>) -> anyhow::Result<(u32, u32)> {
    let ctx = stream.context();
    let sms =
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
    Ok((
        sms,
        weft_pgl::gpu::max_ranks_per_gpu(&mut job.rdzv, ctx)? as u32,
    ))
}

fn as_f64<T: GElem>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

pub(super) fn write<T: PglElement>(pgl: &Pgl<T>, host: &[T]) -> anyhow::Result<()> {
    Ok(pgl.copy_from_host(host)?)
}

pub(super) fn read<T: PglElement + Default + Clone>(pgl: &Pgl<T>) -> anyhow::Result<Vec<T>> {
    let mut host = vec![T::default(); pgl.len()];
    pgl.copy_to_host(&mut host)?;
    Ok(host)
}

/// `prefix` followed by poison up to `len` elements.
fn padded<T: GElem>(prefix: &[T], len: usize) -> Vec<T> {
    let mut v = prefix.to_vec();
    v.resize(len, T::poison());
    v
}

fn cast_trial<T: GElem>(job: &mut Job, via: Via, cfg: Cfg) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    if via == Via::AllToAllV {
        job.comm()?;
    }
    let comm = cfg.comm.unwrap_or(T::DTYPE);
    let max_sms = trial_max_sms(job, &stream)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for p in 0..PATTERNS {
        let widths: Vec<usize> = (0..cfg.tensors)
            .map(|_| ROW_ELEMS[rng.random_range(0..ROW_ELEMS.len())])
            .collect();
        let blocks = cast_blocks(&mut rng, world, p, widths.iter().all(|&w| w <= 136));
        let metas = cast_metas(world, &blocks);
        let want: Vec<Vec<f64>> = widths
            .iter()
            .enumerate()
            .map(|(t, &w)| {
                let ins: Vec<Vec<f64>> = (0..world)
                    .map(|r| as_f64(&values::<T>(seed, INPUT, p, t, r, metas[r].input_rows * w)))
                    .collect();
                cast_reference(&blocks, world, &ins, w, rank)
                    .into_iter()
                    .map(|v| round_to(comm, v))
                    .collect()
            })
            .collect();
        let opts = Options {
            sms: Some(rng.random_range(1..=max_sms)),
            comm_dtype: cfg.comm,
            accumulate: false,
        };
        let mut plan =
            GroupCast::<T>::new_packed(&mut job.rdzv, &stream, &metas[rank], &widths, opts)?;
        let what = format!(
            "{} cast via {} {via:?}, pattern {p}, row_elems {widths:?}, {} SMs, seed {seed}, rank {rank}",
            T::DTYPE.name(),
            comm.name(),
            plan.sms()
        );
        let checked = (|| -> anyhow::Result<()> {
            for (t, &w) in widths.iter().enumerate() {
                write(
                    plan.input_of(t),
                    &values::<T>(seed, INPUT, p, t, rank, metas[rank].input_rows * w),
                )?;
                write(
                    plan.output_of(t),
                    &vec![T::poison(); plan.output_of(t).len()],
                )?;
            }
            match via {
                Via::Native => (0..3).try_for_each(|_| plan.run())?,
                Via::AllToAllV => plan.run_baseline(job.comm()?)?,
            }
            plan.synchronize()?;
            for (t, want) in want.iter().enumerate() {
                check(
                    &format!("{what}, tensor {t}"),
                    &read(plan.output_of(t))?,
                    want,
                    None,
                )?;
            }
            Ok(())
        })();
        let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll cast trial", checked);
        plan.free(&mut job.rdzv)?;
        checked?;
    }
    Ok(())
}

fn reduce_trial<T: GElem>(job: &mut Job, via: Via, op: Op, cfg: Cfg) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    if via == Via::AllToAllV {
        job.comm()?;
    }
    let comm = cfg.comm.unwrap_or(T::DTYPE);
    let max_sms = trial_max_sms(job, &stream)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for p in 0..PATTERNS {
        let widths: Vec<usize> = (0..cfg.tensors)
            .map(|_| ROW_ELEMS[rng.random_range(0..ROW_ELEMS.len())])
            .collect();
        let divisors: Vec<usize> = (1..=widths[0].min(16))
            .filter(|d| widths[0].is_multiple_of(*d))
            .collect();
        let lse_per_row = if op == Op::Lse {
            divisors[rng.random_range(0..divisors.len())]
        } else {
            0
        };
        let blocks = reduce_blocks(&mut rng, world, p, widths.iter().all(|&w| w <= 136));
        let metas = reduce_metas(world, &blocks);
        let out_rows = metas[rank].output_rows;
        let lses: Vec<Vec<f64>> = (0..world)
            .map(|r| {
                lse_values(seed, INPUT, p, r, metas[r].input_rows * lse_per_row)
                    .iter()
                    .map(|&v| v as f64)
                    .collect()
            })
            .collect();
        let prior_lse: Vec<f32> = lse_values(seed, PRIOR, p, rank, out_rows * lse_per_row);
        let rop = match op {
            Op::Sum => ReduceOp::Sum,
            Op::Avg => ReduceOp::Avg,
            Op::Lse => ReduceOp::Lse { lse_per_row },
        };
        let opts = Options {
            sms: Some(rng.random_range(1..=max_sms)),
            comm_dtype: cfg.comm,
            accumulate: cfg.accumulate,
        };
        let mut plan =
            GroupReduce::<T>::new_packed(&mut job.rdzv, &stream, &metas[rank], &widths, rop, opts)?;
        let what = format!(
            "{} reduce {op:?} via {} {via:?}{}, pattern {p}, row_elems {widths:?}, lse_per_row {lse_per_row}, {} SMs, seed {seed}, rank {rank}",
            T::DTYPE.name(),
            comm.name(),
            if cfg.accumulate { " accumulating" } else { "" },
            plan.sms()
        );
        let checked = (|| -> anyhow::Result<()> {
            let mut wants = Vec::new();
            for (t, &w) in widths.iter().enumerate() {
                let ins: Vec<Vec<f64>> = (0..world)
                    .map(|r| {
                        values::<T>(seed, INPUT, p, t, r, metas[r].input_rows * w)
                            .into_iter()
                            .map(|x| round_to(comm, x.to_f64()))
                            .collect()
                    })
                    .collect();
                let prior: Vec<T> = values::<T>(seed, PRIOR, p, t, rank, out_rows * w);
                let prior_f: Vec<f64> = as_f64(&prior);
                let prior_l: Vec<f64> = prior_lse.iter().map(|&v| v as f64).collect();
                let x = ReduceInputs {
                    ins: &ins,
                    lses: &lses,
                    prior: cfg
                        .accumulate
                        .then_some((prior_f.as_slice(), prior_l.as_slice())),
                    row_elems: w,
                    lse_per_row,
                };
                wants.push(reduce_reference(&blocks, world, &x, op, rank));
                write(
                    plan.input_of(t),
                    &values::<T>(seed, INPUT, p, t, rank, metas[rank].input_rows * w),
                )?;
                let out = plan.output_of(t);
                write(
                    out,
                    &padded(if cfg.accumulate { &prior } else { &[] }, out.len()),
                )?;
            }
            if let (Some(il), Some(ol)) = (plan.input_lse(), plan.output_lse()) {
                write(
                    il,
                    &lse_values(seed, INPUT, p, rank, metas[rank].input_rows * lse_per_row),
                )?;
                write(
                    ol,
                    &padded(if cfg.accumulate { &prior_lse } else { &[] }, ol.len()),
                )?;
            }
            let runs = if cfg.accumulate { 1 } else { 3 };
            match via {
                Via::Native => (0..runs).try_for_each(|_| plan.run())?,
                Via::AllToAllV => plan.run_baseline(job.comm()?)?,
            }
            plan.synchronize()?;
            for (t, (want, want_lse, scale)) in wants.iter().enumerate() {
                check(
                    &format!("{what}, tensor {t}"),
                    &read(plan.output_of(t))?,
                    want,
                    Some(scale),
                )?;
                if let Some(l) = plan.output_lse() {
                    check_lse(&what, &read(l)?, want_lse)?;
                }
            }
            Ok(())
        })();
        let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll reduce trial", checked);
        plan.free(&mut job.rdzv)?;
        checked?;
    }
    Ok(())
}

/// Every native launch arrives once on a KernelBarrier: a wait for exactly that many arrivals on
/// another stream passes (and the count is read back).
fn kernel_barrier_arrivals(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let ctx = stream.context().clone();
    let mut kb = weft_barrier::KernelBarrier::new(&ctx)?;
    let meta = ring_cast(rank, world, 64);
    let mut plan = GroupCast::<f32>::new(&mut job.rdzv, &stream, &meta, 256, Options::default())?;
    let checked = (|| -> anyhow::Result<()> {
        plan.set_kernel_barrier(Some(kb.view()));
        const RUNS: u32 = 5;
        for _ in 0..RUNS {
            plan.run()?;
        }
        plan.set_kernel_barrier(None);
        plan.run()?; // no arrival
        let target = kb.expect(RUNS)?;
        let waiter = ctx.new_stream()?;
        kb.wait(&waiter, target)?;
        waiter.synchronize()?;
        plan.synchronize()?;
        kb.check()?;
        let mut count = 0i32;
        // SAFETY: reads the barrier's 4-byte counter after both streams finished.
        let r =
            unsafe { sys::cuMemcpyDtoH_v2((&mut count as *mut i32).cast(), kb.view().counter, 4) };
        anyhow::ensure!(
            r == sys::CUresult::CUDA_SUCCESS,
            "reading the KernelBarrier counter: {r:?}"
        );
        anyhow::ensure!(count == RUNS as i32, "the KernelBarrier counted {count} arrivals after {RUNS} launches with it and 1 without");
        Ok(())
    })();
    let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll kernel barrier trial", checked);
    plan.free(&mut job.rdzv)?;
    checked
}

/// A valid ring pattern: every rank casts `rows` rows to the next rank.
pub(super) fn ring_cast(rank: usize, world: usize, rows: usize) -> GroupCastMeta {
    GroupCastMeta {
        input_rows: rows,
        input_split_rows: vec![rows],
        dst_indices: vec![vec![(rank + 1) % world]],
        output_rows: rows,
        output_split_rows: vec![rows],
        src_index: vec![(rank + world - 1) % world],
    }
}

/// A valid ring pattern: every rank reduces `rows` rows into the next rank.
pub(super) fn ring_reduce(rank: usize, world: usize, rows: usize) -> GroupReduceMeta {
    GroupReduceMeta {
        input_rows: rows,
        input_split_rows: vec![rows],
        dst_index: vec![(rank + 1) % world],
        output_rows: rows,
        output_split_rows: vec![rows],
        src_indices: vec![vec![(rank + world - 1) % world]],
    }
}

/// Which kind of `GrpcollError` an error is (the trials name the kind each refusal must carry).
fn error_kind(e: &GrpcollError) -> &'static str {
    match e {
        GrpcollError::Options(_) => "Options",
        GrpcollError::Metadata(_) => "Metadata",
        GrpcollError::RanksDisagree(_) => "RanksDisagree",
        GrpcollError::PeerRefused(_) => "PeerRefused",
        GrpcollError::Layout { .. } => "Layout",
        GrpcollError::Unsupported(_) => "Unsupported",
        GrpcollError::Wait(_) => "Wait",
        GrpcollError::Runtime(_) => "Runtime",
    }
}

/// `result` must be an error on every rank containing `needle`, of kind `kind` on this rank (a
/// plan that was built is freed).
fn expect_error<P>(
    job: &mut Job,
    result: Result<P, GrpcollError>,
    free: fn(P, &mut Job) -> anyhow::Result<()>,
    kind: &str,
    needle: &str,
) -> anyhow::Result<()> {
    match result {
        Ok(plan) => {
            free(plan, job)?;
            anyhow::bail!("the plan was accepted; expected an error containing {needle:?}")
        }
        Err(e) => {
            let text = format!("{e:#}");
            anyhow::ensure!(
                text.contains(needle),
                "expected an error containing {needle:?}, got: {text}"
            );
            anyhow::ensure!(
                error_kind(&e) == kind,
                "expected a GrpcollError::{kind}, got {}: {text}",
                error_kind(&e)
            );
            Ok(())
        }
    }
}

fn free_cast(p: GroupCast<f32>, job: &mut Job) -> anyhow::Result<()> {
    Ok(p.free(&mut job.rdzv)?)
}

/// Builds a cast plan from `meta` and expects every rank to fail with `needle` in the error,
/// of kind `kind` on this rank.
fn expect_cast_error(
    job: &mut Job,
    meta: GroupCastMeta,
    kind: &str,
    needle: &str,
) -> anyhow::Result<()> {
    let stream = gpu_stream(job)?;
    let r = GroupCast::<f32>::new(&mut job.rdzv, &stream, &meta, 16, Options::default());
    expect_error(job, r, free_cast, kind, needle)
}

/// The kind of a refusal that `refusing` ranks make of their own metadata: theirs, and
/// `PeerRefused` on the others.
fn own_or_peer(refusing: bool) -> &'static str {
    if refusing {
        "Metadata"
    } else {
        "PeerRefused"
    }
}

fn err_split_sum(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let mut m = ring_cast(rank, world, 4);
    if rank == 0 {
        m.input_rows = 5;
    }
    let kind = own_or_peer(rank == 0);
    expect_cast_error(job, m, kind, "rank 0: error: group_cast: invalid metadata: input_split_rows sum to 4 rows but the input has 5 rows")
}

fn err_out_of_range(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let mut m = ring_cast(rank, world, 4);
    if rank == world - 1 {
        m.dst_indices[0] = vec![world];
    }
    let needle = format!("rank {}: error: group_cast: invalid metadata: dst_indices[0] lists rank {world}, but the world has {world} ranks", world - 1);
    expect_cast_error(job, m, own_or_peer(rank == world - 1), &needle)
}

fn err_duplicate(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let mut m = ring_cast(rank, world, 4);
    let d = m.dst_indices[0][0];
    m.dst_indices[0] = vec![d, d];
    expect_cast_error(job, m, "Metadata", "dst_indices[0] lists rank")
}

fn err_disagreement(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    // Rank 0 expects 5 rows from its source, which sends 4: both named.
    let mut m = ring_cast(rank, world, 4);
    if rank == 0 {
        m.output_split_rows = vec![5];
        m.output_rows = 5;
    }
    let needle = format!("rank {}'s input split 0 (4 rows) is rank 0's output split 0 by the matching rule, which has 5 rows", world - 1);
    expect_cast_error(job, m, "RanksDisagree", &needle)?;
    // Rank 0 expects nothing from its source (a missing receive).
    let mut m = ring_cast(rank, world, 4);
    if rank == 0 {
        m = GroupCastMeta {
            output_rows: 0,
            output_split_rows: vec![],
            src_index: vec![],
            ..m
        };
    }
    let needle = format!("rank {} sends 1 input splits to rank 0", world - 1);
    expect_cast_error(job, m, "RanksDisagree", &needle)?;
    if world == 1 {
        return Ok(());
    }
    // Header disagreements: the row width, the communication dtype.
    let stream = gpu_stream(job)?;
    let m = ring_cast(rank, world, 4);
    let last = rank == world - 1;
    let r = GroupCast::<f32>::new(
        &mut job.rdzv,
        &stream,
        &m,
        if last { 32 } else { 16 },
        Options::default(),
    );
    expect_error(
        job,
        r,
        free_cast,
        "RanksDisagree",
        &format!("rank {} has row_elems 32 but rank 0 has 16", world - 1),
    )?;
    let opts = Options {
        comm_dtype: Some(if last { DType::F16 } else { DType::Bf16 }),
        ..Options::default()
    };
    let r = GroupCast::<f32>::new(&mut job.rdzv, &stream, &m, 16, opts);
    expect_error(
        job,
        r,
        free_cast,
        "RanksDisagree",
        &format!(
            "rank {} has communication dtype f16 but rank 0 has bf16",
            world - 1
        ),
    )
}

fn err_dtype(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let r = GroupReduce::<u32>::new(
        &mut job.rdzv,
        &stream,
        &ring_reduce(rank, world, 2),
        8,
        ReduceOp::Sum,
        Options::default(),
    );
    expect_error(
        job,
        r,
        |p, j| Ok(p.free(&mut j.rdzv)?),
        "Options",
        "data dtype u32 is not supported (supported: bf16, f16, f32, f64)",
    )
}

fn err_options(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let free_red = |p: GroupReduce<bf16>, j: &mut Job| Ok(p.free(&mut j.rdzv)?);
    let wide = Options {
        comm_dtype: Some(DType::F32),
        ..Options::default()
    };
    let r = GroupReduce::<bf16>::new(
        &mut job.rdzv,
        &stream,
        &ring_reduce(rank, world, 2),
        8,
        ReduceOp::Sum,
        wide,
    );
    expect_error(
        job,
        r,
        free_red,
        "Options",
        "communication dtype f32 with data dtype bf16 is not supported",
    )?;
    let acc = Options {
        accumulate: true,
        ..Options::default()
    };
    let r = GroupCast::<f32>::new(&mut job.rdzv, &stream, &ring_cast(rank, world, 2), 8, acc);
    expect_error(
        job,
        r,
        free_cast,
        "Options",
        "group_cast: accumulate is a GroupReduce option",
    )?;
    let r = GroupReduce::<bf16>::new_packed(
        &mut job.rdzv,
        &stream,
        &ring_reduce(rank, world, 2),
        &[8, 8],
        ReduceOp::Lse { lse_per_row: 2 },
        Options::default(),
    );
    expect_error(
        job,
        r,
        free_red,
        "Options",
        "group_reduce: op lse takes one tensor (its lse), got 2",
    )?;
    let r = GroupCast::<f32>::new_packed(
        &mut job.rdzv,
        &stream,
        &ring_cast(rank, world, 2),
        &[8, 8, 8, 8],
        Options::default(),
    );
    expect_error(
        job,
        r,
        free_cast,
        "Options",
        "packed transfer takes 1 to 3 tensors, got 4",
    )?;
    // Ranks sharing a GPU: more SMs than all their grids can hold at once is refused (it would
    // deadlock the cross-rank waits). Without sharing, the device's SMs are the bound (above).
    let (device_sms, sharing) = gpu_sharing(job, &stream)?;
    if sharing > 1 {
        let too_many = Options {
            sms: Some(device_sms / sharing + 1),
            ..Options::default()
        };
        let r = GroupCast::<f32>::new(
            &mut job.rdzv,
            &stream,
            &ring_cast(rank, world, 2),
            8,
            too_many,
        );
        expect_error(
            job,
            r,
            free_cast,
            "Options",
            "cannot all be resident at once",
        )?;
    }
    Ok(())
}
