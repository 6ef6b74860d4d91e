//! signal-gemm III, fused GEMM + AllReduce by tile flags, both methods (fused-inter: the GEMM's
//! communicator CTAs reduce; distfuse: a kernel of its own on a second stream): every element of
//! every rank's output against a float64 CPU sum over ranks (each rank regenerates every rank's
//! inputs), and every rank's output the same bits (hashes compared through the rendezvous);
//! 10^4 back-to-back runs of integer data, exact in bf16, compared bit for bit on the GPU;
//! misuse refused with a message. Any world size, ranks sharing a GPU included.

use super::fused_reduce_scatter::{
    device_addr, inputs, max_ctas, random_options, reference, refused, TRIAL_WAIT,
};
use super::gpu;
use super::overlap::STRESS_ITERATIONS;
use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, upload};
use crate::job::Job;
use crate::trials::Case;
use crate::word_compare::WordCompare;
use cudarc::driver::{sys, CudaContext, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_signal_gemm::fused::{AllReduceMethod, FusedAllReduce};
use weft_signal_gemm::{device_sms, Dtype, GemmOptions, GemmShape};
use weft_sync::WaitBudget;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "fused_all_reduce::matches_f64_sum_over_ranks",
            matches_reference,
        ),
        Case::gpu("fused_all_reduce::stress_back_to_back_exact", stress),
        Case::gpu("fused_all_reduce::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// Options and method for a GEMM of `gemm_ctas` CTAs and `workers` reduction CTAs.
fn configure(
    sms: u32,
    gemm_ctas: u32,
    workers: u32,
    inter: bool,
    base: GemmOptions,
) -> (GemmOptions, AllReduceMethod) {
    if inter {
        (
            GemmOptions {
                sm_margin: sms - gemm_ctas - workers,
                ..base
            },
            AllReduceMethod::Inter { comm_ctas: workers },
        )
    } else {
        (
            GemmOptions {
                sm_margin: sms - gemm_ctas,
                ..base
            },
            AllReduceMethod::DistFuse { workers },
        )
    }
}

/// Fills this rank's output with NaN, so an element no owner writes fails the check.
fn poison_output(stream: &Arc<CudaStream>, op: &FusedAllReduce) -> anyhow::Result<()> {
    let out = op.output();
    stream.context().bind_to_thread()?;
    // SAFETY: the PGL's own buffer holds len() bf16; stream-ordered before the run.
    unsafe { sys::cuMemsetD16Async(out.local_ptr(), 0x7FC0, out.len(), stream.cu_stream()) }
        .result()?;
    Ok(())
}

/// Random shapes (ragged tiles), B layouts, tiles, clusters, schedules, worker counts, both
/// methods; two input sets per case (the flags' and the barrier's next epoch).
fn matches_reference(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let world = job.world();
    let budget = max_ctas(job, &ctx)?;
    anyhow::ensure!(
        budget >= 4,
        "each rank has only {budget} SMs: the trial needs 4 (GEMM and workers resident together)"
    );
    let sms = device_sms(&ctx)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xA11);
    for case in 0..6u64 {
        let shape = GemmShape::new(
            16 * rng.random_range(1..=24),
            16 * rng.random_range(1..=24),
            16 * rng.random_range(1..=24),
        );
        let cluster_m = rng.random_range(1..=2u32);
        let inter = case % 2 == 0;
        let workers = (rng.random_range(1..=(budget / 2).min(8)) / cluster_m).max(1) * cluster_m;
        let gemm_ctas = rng.random_range(cluster_m..=budget - workers);
        let base = GemmOptions {
            ..random_options(&mut rng, cluster_m)
        };
        let (options, method) = configure(sms, gemm_ctas, workers, inter, base);
        let what = format!(
            "case {case}: {} {shape} {options:?}, {world} ranks, seed {seed}",
            method.name()
        );
        check_case(job, &ctx, &stream, seed + case, shape, options, method)
            .map_err(|e| e.context(what))?;
    }
    Ok(())
}

fn check_case(
    job: &mut Job,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    seed: u64,
    shape: GemmShape,
    options: GemmOptions,
    method: AllReduceMethod,
) -> anyhow::Result<()> {
    let (world, rank) = (job.world(), job.rank());
    let mut op = FusedAllReduce::new(&mut job.rdzv, ctx, stream, shape, options, method)?;
    op.set_budget(WaitBudget::for_device(ctx, TRIAL_WAIT)?);
    // A rank whose data is wrong still runs every set (the others wait for its tiles).
    let mut wrong: Option<anyhow::Error> = None;
    let result = (|| -> anyhow::Result<()> {
        let mut got = poisoned::<bf16>(stream, op.output().len())?;
        for set in 0..2u64 {
            let (a, b) = inputs(seed, rank, set, shape, false);
            let (a, b) = (upload(stream, &a)?, upload(stream, &b)?);
            poison_output(stream, &op)?;
            op.run(stream, &a, &b)?;
            op.copy_output(stream, &mut got)?;
            op.synchronize(stream)?;
            let got = download(stream, &got)?;
            let (want, mag) =
                reference(seed, set, world, shape, options.b_layout, 0, shape.m, false);
            // Each partial rounds once to bf16 and the fp32 sum once more: (world + 1) units of
            // 2^-8 of Σ|partial|, plus fp32 accumulation in another order.
            let n = shape.n as usize;
            let mut bad = Vec::new();
            for (i, g) in got.iter().enumerate() {
                let g = g.to_f64();
                let bound = (world as f64 + 1.0) * 2f64.powi(-8) * mag[i]
                    + 2e-6 * f64::from(shape.k) * world as f64;
                #[allow(clippy::neg_cmp_op_on_partial_ord)]
                // a NaN difference must fail the check too
                if !((g - want[i]).abs() <= bound) {
                    bad.push(format!(
                        "({}, {}): got {g}, want {} (bound {bound:.3e})",
                        i / n,
                        i % n,
                        want[i]
                    ));
                }
            }
            // Every rank's output must be the same bits (one owner wrote each tile everywhere).
            let hash = got.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
                (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
            });
            let all = job.rdzv.all_gather(&hash.to_le_bytes())?;
            let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
            if wrong.is_none() {
                if !bad.is_empty() {
                    wrong = Some(anyhow::anyhow!("input set {set}: {} of {} elements of rank {rank}'s output wrong; first: {}", bad.len(), got.len(), bad[..bad.len().min(4)].join("; ")));
                } else if !differ.is_empty() {
                    wrong = Some(anyhow::anyhow!(
                        "input set {set}: ranks {differ:?} hold other bits than rank 0"
                    ));
                }
            }
        }
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))?;
    wrong.map_or(Ok(()), Err)
}

/// For each method: 10^4 runs back to back alternating two input sets of integers in {-1, 0, 1}
/// (k · world <= 256: every partial and sum exact in bf16), each output compared bit for bit on
/// the GPU with the exact result: an owner that read a partial before its flag, or a rank that
/// read its output before every owner wrote it, shows as a difference.
fn stress(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    let budget = max_ctas(job, &ctx)?;
    anyhow::ensure!(
        budget >= 4,
        "each rank has only {budget} SMs: the trial needs 4"
    );
    let sms = device_sms(&ctx)?;
    let shape = GemmShape::new(256, 384, 32);
    let workers = (budget / 4).clamp(1, 4);
    for inter in [true, false] {
        let (options, method) = configure(
            sms,
            (budget - workers).min(16),
            workers,
            inter,
            GemmOptions::default(),
        );
        let mut op = FusedAllReduce::new(&mut job.rdzv, &ctx, &stream, shape, options, method)?;
        op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
        let result = (|| -> anyhow::Result<()> {
            let mut sets = Vec::new();
            let mut wants = Vec::new();
            for set in 0..2u64 {
                let (a, b) = inputs(seed, rank, set, shape, true);
                sets.push((upload(&stream, &a)?, upload(&stream, &b)?));
                let (want, _) =
                    reference(seed, set, world, shape, options.b_layout, 0, shape.m, true);
                anyhow::ensure!(
                    want.iter().all(|v| v.fract() == 0.0 && v.abs() <= 256.0),
                    "stress data is not exact in bf16"
                );
                wants.push(want.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>());
            }
            anyhow::ensure!(
                wants[0] != wants[1],
                "the two input sets give the same result"
            );
            let exact = [upload(&stream, &wants[0])?, upload(&stream, &wants[1])?];
            let mut cmp = WordCompare::load(&stream)?;
            cmp.reset(&stream)?;
            for it in 0..STRESS_ITERATIONS {
                let (a, b) = &sets[it % 2];
                op.run(&stream, a, b)?;
                cmp.enqueue_raw(
                    &stream,
                    op.output().local_ptr(),
                    device_addr(&stream, &exact[it % 2]),
                    op.output().len() * 2,
                )?;
                if it % 1000 == 999 {
                    op.synchronize(&stream)?;
                }
            }
            op.synchronize(&stream)?;
            let diff = cmp.take(&stream)?;
            anyhow::ensure!(diff.is_none(), "{}: {STRESS_ITERATIONS} runs on {world} ranks: rank {rank}'s output differed from the exact result: {diff:?}", method.name());
            Ok(())
        })();
        let freed = op.free(&mut job.rdzv);
        result.and(freed.map_err(anyhow::Error::from))?;
    }
    Ok(())
}

/// Misuse gets an error that names it, on every rank alike (the plan is agreed collectively).
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let budget = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let shape = GemmShape::new(256, 256, 64);
    let expect = |job: &mut Job,
                  options: GemmOptions,
                  method: AllReduceMethod,
                  needle: &str|
     -> anyhow::Result<()> {
        // Accepted: freed (collectively, every rank accepted the same plan), then reported.
        let made = FusedAllReduce::new(&mut job.rdzv, &ctx, &stream, shape, options, method);
        refused(
            &format!("{options:?} {method:?}"),
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            needle,
        )
    };
    let fits = GemmOptions {
        sm_margin: sms - budget + 2,
        ..GemmOptions::default()
    };
    expect(
        job,
        GemmOptions {
            output: Dtype::F32,
            ..fits
        },
        AllReduceMethod::Inter { comm_ctas: 2 },
        "must be bf16",
    )?;
    expect(
        job,
        GemmOptions { beta: 0.5, ..fits },
        AllReduceMethod::Inter { comm_ctas: 2 },
        "beta must be 0",
    )?;
    expect(
        job,
        fits,
        AllReduceMethod::Inter { comm_ctas: 0 },
        "at least one worker",
    )?;
    expect(
        job,
        GemmOptions {
            sm_margin: 1,
            ..GemmOptions::default()
        },
        AllReduceMethod::DistFuse { workers: 4 },
        "must leave them at least 4 SMs",
    )?;
    if budget < sms {
        expect(
            job,
            GemmOptions::default(),
            AllReduceMethod::Inter { comm_ctas: 2 },
            "cannot all be resident",
        )?;
    }
    // A too small operand on a valid plan.
    let mut op = FusedAllReduce::new(
        &mut job.rdzv,
        &ctx,
        &stream,
        shape,
        fits,
        AllReduceMethod::Inter { comm_ctas: 2 },
    )?;
    let small = upload(&stream, &[bf16::ZERO; 16])?;
    let b = upload(&stream, &vec![bf16::ZERO; 256 * 64])?;
    let outcome = refused(
        &format!("a 16-element A for {shape}"),
        op.run(&stream, &small, &b).map_err(anyhow::Error::from),
        "A buffer too small",
    );
    let freed = op.free(&mut job.rdzv);
    outcome.and(freed.map_err(anyhow::Error::from))
}
