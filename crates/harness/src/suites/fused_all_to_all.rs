//! Fused GEMM + All-to-All (the epilogue stores each row into its destination's output through
//! peer memory): every row this rank receives against a float64 CPU reference of its source
//! rank's A · B row (each rank regenerates every rank's inputs from the shared seed: no
//! communication in the reference), for random shapes, routings, tiles, clusters and schedules,
//! bf16 and f32 outputs; 10^4 back-to-back runs with exact integer data, the output poisoned
//! before each, checked bit for bit on the GPU; a rank that reads its output late (after a host
//! sleep) still reads the run it waited for; misuse refused. Any world size, ranks sharing a GPU
//! included.

use super::all_to_all::random_routes;
use super::fused_reduce_scatter::{
    device_addr, inputs, max_ctas, poison_pgl, random_options, refused, TRIAL_WAIT,
};
use super::gpu;
use super::overlap::STRESS_ITERATIONS;
use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, upload};
use crate::job::Job;
use crate::trials::Case;
use crate::word_compare::WordCompare;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use weft_pgl::PglElement;
use weft_signal_gemm::fused::FusedAllToAll;
use weft_signal_gemm::reference::gemm_f64;
use weft_signal_gemm::{device_sms, BLayout, Dtype, GemmElement, GemmOptions, GemmShape};
use weft_sync::WaitBudget;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "fused_all_to_all::matches_f64_rows_of_every_rank",
            matches_reference,
        ),
        Case::gpu("fused_all_to_all::stress_back_to_back_exact", stress),
        Case::gpu(
            "fused_all_to_all::a_late_reader_reads_its_own_run",
            late_reader,
        ),
        Case::gpu("fused_all_to_all::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// The rows routed to `rank` (every source's in turn, rows ascending — the documented order,
/// written from the routing), each A_s row · B_s in float64, for input set `set`.
fn reference(
    seed: u64,
    set: u64,
    routes: &[Vec<u32>],
    rank: usize,
    shape: GemmShape,
    b_layout: BLayout,
    integers: bool,
) -> Vec<f64> {
    let k = shape.k as usize;
    let mut out = Vec::new();
    for (s, r) in routes.iter().enumerate() {
        let (a, b) = inputs(seed, s, set, shape, integers);
        let rows: Vec<usize> = (0..r.len()).filter(|&i| r[i] as usize == rank).collect();
        let picked: Vec<bf16> = rows
            .iter()
            .flat_map(|&i| a[i * k..(i + 1) * k].iter().copied())
            .collect();
        let part = GemmShape::new(rows.len() as u32, shape.n, shape.k);
        let none: [bf16; 0] = [];
        out.extend(gemm_f64(part, b_layout, &picked, &b, 1.0, 0.0, &none));
    }
    out
}

/// Default options leaving the GEMM at most `ctas` CTAs (fewer where ranks share a GPU).
/// Collective.
fn few_ctas(job: &mut Job, ctx: &Arc<CudaContext>, ctas: u32) -> anyhow::Result<GemmOptions> {
    let sms = device_sms(ctx)?;
    Ok(GemmOptions {
        sm_margin: sms - max_ctas(job, ctx)?.min(ctas),
        ..GemmOptions::default()
    })
}

/// Copies this rank's received rows (rows() × n) into a new buffer on `stream`.
fn copy_rows<T: GemmElement + PglElement>(
    stream: &Arc<CudaStream>,
    op: &FusedAllToAll<T>,
) -> anyhow::Result<CudaSlice<T>> {
    let len = op.rows() as usize * op.plan().shape.n as usize;
    let dst = poisoned::<T>(stream, len.max(1))?;
    stream.context().bind_to_thread()?;
    // SAFETY: both hold at least `len` elements of T on this context; stream-ordered.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(
            device_addr(stream, &dst),
            op.output().local_ptr(),
            len * std::mem::size_of::<T>(),
            stream.cu_stream(),
        )
    }
    .result()?;
    Ok(dst)
}

/// Random shapes (any multiple of 16: ragged tiles), routings (uniform, all to one rank, skewed,
/// runs), B layouts, tiles, clusters, schedules, bf16 and f32 outputs: every received element
/// within one rounding of the output dtype (plus fp32 accumulation) of the float64 row, two input
/// sets in a row, the output poisoned before each.
fn matches_reference(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let world = job.world();
    let max_ctas = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for case in 0..6u64 {
        let shape = GemmShape::new(
            16 * rng.random_range(1..=40),
            16 * rng.random_range(1..=32),
            16 * rng.random_range(1..=24),
        );
        let (routes, pattern) = random_routes(&mut rng, world, shape.m as usize);
        let cluster_m = rng.random_range(1..=2u32);
        let ctas = rng.random_range(2..=max_ctas.max(2)).min(max_ctas);
        let output = if case % 2 == 0 {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        let options = GemmOptions {
            output,
            sm_margin: sms - ctas,
            ..random_options(&mut rng, cluster_m)
        };
        let what = format!(
            "case {case}: {shape} {options:?}, routing {pattern}, {world} ranks, seed {seed}"
        );
        let s = seed + case;
        match output {
            Dtype::Bf16 => check_case::<bf16>(job, &ctx, &stream, s, shape, options, &routes),
            _ => check_case::<f32>(job, &ctx, &stream, s, shape, options, &routes),
        }
        .map_err(|e| e.context(what))?;
    }
    Ok(())
}

fn check_case<T: GemmElement + PglElement>(
    job: &mut Job,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    seed: u64,
    shape: GemmShape,
    options: GemmOptions,
    routes: &[Vec<u32>],
) -> anyhow::Result<()> {
    let rank = job.rank();
    let mut op = FusedAllToAll::<T>::new(&mut job.rdzv, ctx, stream, shape, options, routes)?;
    op.set_budget(WaitBudget::for_device(ctx, TRIAL_WAIT)?);
    // A rank whose data is wrong still runs every set (the others' kernels wait for its CTAs):
    // the first wrong set is reported once all ran.
    let mut wrong: Option<anyhow::Error> = None;
    let result = (|| -> anyhow::Result<()> {
        let routed = routes
            .iter()
            .flatten()
            .filter(|&&d| d as usize == rank)
            .count();
        if op.rows() as usize != routed {
            wrong = Some(anyhow::anyhow!(
                "{} rows received, {routed} routed here",
                op.rows()
            ));
        }
        for set in 0..2u64 {
            let (a, b) = inputs(seed, rank, set, shape, false);
            let (a, b) = (upload(stream, &a)?, upload(stream, &b)?);
            poison_pgl(stream, op.output())?;
            op.run(stream, &a, &b)?;
            let got = copy_rows(stream, &op)?;
            op.synchronize(stream)?;
            let got = download(stream, &got)?;
            let want = reference(seed, set, routes, rank, shape, options.b_layout, false);
            // One rounding to the output dtype (2^-8 of bf16, 2^-20 as a margin over f32's
            // 2^-24) plus fp32 accumulation in another order than float64's.
            let unit = if <T as GemmElement>::DTYPE == Dtype::Bf16 {
                2f64.powi(-8)
            } else {
                2f64.powi(-20)
            };
            let n = shape.n as usize;
            let bad: Vec<String> = want
                .iter()
                .enumerate()
                .filter_map(|(i, &w)| {
                    let g = got[i].to_f64();
                    let bound = unit * w.abs() + 2e-6 * f64::from(shape.k);
                    // A NaN difference fails too.
                    (!matches!((g - w).abs().partial_cmp(&bound), Some(o) if o.is_le())).then(
                        || {
                            format!(
                                "row {} col {}: got {g}, want {w} (bound {bound:.3e})",
                                i / n,
                                i % n
                            )
                        },
                    )
                })
                .collect();
            if !bad.is_empty() && wrong.is_none() {
                wrong = Some(anyhow::anyhow!(
                    "input set {set}: {} of {} received elements of rank {rank} wrong; first: {}",
                    bad.len(),
                    want.len(),
                    bad[..bad.len().min(4)].join("; ")
                ));
            }
        }
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))?;
    wrong.map_or(Ok(()), Err)
}

/// The exact received rows of input set 0 and 1 (integers in {-1, 0, 1}, k ≤ 256: exact in
/// bf16), uploaded, for this rank.
fn exact_sets(
    stream: &Arc<CudaStream>,
    seed: u64,
    routes: &[Vec<u32>],
    rank: usize,
    shape: GemmShape,
    b_layout: BLayout,
) -> anyhow::Result<Vec<CudaSlice<bf16>>> {
    let mut out = Vec::new();
    let mut wants = Vec::new();
    for set in 0..2u64 {
        let want = reference(seed, set, routes, rank, shape, b_layout, true);
        anyhow::ensure!(
            want.iter().all(|v| v.fract() == 0.0 && v.abs() <= 256.0),
            "the exact data is not exact in bf16"
        );
        let want: Vec<bf16> = want.iter().map(|&v| bf16::from_f64(v)).collect();
        out.push(upload(stream, &want)?);
        wants.push(want);
    }
    anyhow::ensure!(
        wants[0] != wants[1] || wants[0].is_empty(),
        "the two input sets give the same rows"
    );
    Ok(out)
}

/// Every rank's inputs of set 0 and 1 (integers), uploaded.
fn input_sets(
    stream: &Arc<CudaStream>,
    seed: u64,
    rank: usize,
    shape: GemmShape,
) -> anyhow::Result<Vec<(CudaSlice<bf16>, CudaSlice<bf16>)>> {
    (0..2u64)
        .map(|set| {
            let (a, b) = inputs(seed, rank, set, shape, true);
            Ok((upload(stream, &a)?, upload(stream, &b)?))
        })
        .collect()
}

/// 10^4 runs back to back, alternating two input sets of integers, this rank's output poisoned
/// on its stream before each run and compared bit for bit on the GPU with the set's exact rows
/// after it: a peer's store that landed before this rank reached the run (its poison would
/// overwrite it, or the previous run's comparison would read it) or after its kernel ended
/// shows as a difference.
fn stress(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    let shape = GemmShape::new(256 * world as u32, 384, 32);
    let options = few_ctas(job, &ctx, 16)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let routes: Vec<Vec<u32>> = (0..world)
        .map(|_| {
            (0..shape.m)
                .map(|_| rng.random_range(0..world) as u32)
                .collect()
        })
        .collect();
    let mut op = FusedAllToAll::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options, &routes)?;
    op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
    let result = (|| -> anyhow::Result<()> {
        let exact = exact_sets(&stream, seed, &routes, rank, shape, options.b_layout)?;
        let sets = input_sets(&stream, seed, rank, shape)?;
        let mut cmp = WordCompare::load(&stream)?;
        cmp.reset(&stream)?;
        let bytes = op.rows() as usize * shape.n as usize * 2;
        for it in 0..STRESS_ITERATIONS {
            let (a, b) = &sets[it % 2];
            poison_pgl(&stream, op.output())?;
            op.run(&stream, a, b)?;
            if bytes > 0 {
                cmp.enqueue_raw(
                    &stream,
                    op.output().local_ptr(),
                    device_addr(&stream, &exact[it % 2]),
                    bytes,
                )?;
            }
            if it % 1000 == 999 {
                op.synchronize(&stream)?;
            }
        }
        op.synchronize(&stream)?;
        let diff = cmp.take(&stream)?;
        anyhow::ensure!(diff.is_none(), "{STRESS_ITERATIONS} runs on {world} ranks: rank {rank}'s received rows differed from the exact ones: {diff:?}");
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))
}

/// Rank 0 reads its output of run 0 only after a host sleep while the other ranks go straight on
/// to run 1: what rank 0 reads must still be run 0's rows (the peers' stores of run 1 wait until
/// rank 0's stream reaches run 1), and then run 1's.
fn late_reader(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    let shape = GemmShape::new(128 * world as u32, 256, 64);
    let options = few_ctas(job, &ctx, 8)?;
    // Every rank sends every row to rank 0 and to itself in turn: rank 0 receives rows from
    // every rank.
    let routes: Vec<Vec<u32>> = (0..world)
        .map(|s| {
            (0..shape.m)
                .map(|i| if i % 2 == 0 { 0 } else { s as u32 })
                .collect()
        })
        .collect();
    let mut op = FusedAllToAll::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options, &routes)?;
    op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
    let result = (|| -> anyhow::Result<()> {
        let exact = exact_sets(&stream, seed, &routes, rank, shape, options.b_layout)?;
        let sets = input_sets(&stream, seed, rank, shape)?;
        let mut reads = Vec::new();
        for (run, (a, b)) in sets.iter().enumerate() {
            op.run(&stream, a, b)?;
            if rank == 0 && run == 0 {
                op.synchronize(&stream)?;
                std::thread::sleep(Duration::from_millis(200));
            }
            reads.push(copy_rows(&stream, &op)?);
        }
        op.synchronize(&stream)?;
        for (run, got) in reads.iter().enumerate() {
            let (got, want) = (download(&stream, got)?, download(&stream, &exact[run])?);
            let n = shape.n as usize;
            if let Some(e) = got
                .iter()
                .zip(&want)
                .position(|(g, w)| g.to_bits() != w.to_bits())
            {
                anyhow::bail!(
                    "rank {rank} of {world}: run {run}'s row {} col {} read {}, expected {}{}",
                    e / n,
                    e % n,
                    got[e],
                    want[e],
                    if rank == 0 && run == 0 {
                        " (a peer's next run wrote into it before this rank read it)"
                    } else {
                        ""
                    }
                );
            }
        }
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))
}

/// Misuse gets an error that names it, on every rank alike (the plan is agreed collectively).
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let world = job.world();
    let shape = GemmShape::new(128, 256, 64);
    let options = few_ctas(job, &ctx, 8)?;
    let routes: Vec<Vec<u32>> = vec![vec![0; 128]; world];
    let mut plan = |opts: GemmOptions, routes: &[Vec<u32>]| -> anyhow::Result<()> {
        FusedAllToAll::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, opts, routes)?
            .free(&mut job.rdzv)
            .map_err(anyhow::Error::from)
    };
    refused(
        "beta = 1",
        plan(
            GemmOptions {
                beta: 1.0,
                ..options
            },
            &routes,
        ),
        "beta must be 0",
    )?;
    refused(
        "an f32 GEMM output for bf16 rows",
        plan(
            GemmOptions {
                output: Dtype::F32,
                ..options
            },
            &routes,
        ),
        "GemmOptions::output must match",
    )?;
    let mut short = routes.clone();
    short[0].pop();
    refused(
        "a routing one row short",
        plan(options, &short),
        "rank 0's routing has 127 rows",
    )?;
    let mut far = routes.clone();
    far[world - 1][5] = world as u32;
    refused(
        "a row routed past the last rank",
        plan(options, &far),
        &format!("routes row 5 to rank {world}"),
    )
}
