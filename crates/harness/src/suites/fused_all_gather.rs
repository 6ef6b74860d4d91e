//! signal-gemm III, fused AllGather + GEMM, all three methods (fused-intra: the loader reads A
//! tiles by TMA from their owners' shards; fused-inter: communicator CTAs copy the peers' shards
//! chunk by chunk into a local A the loader reads once each chunk is flagged; fused-ce: copy
//! engines do that copy on a side stream, groups of tile rows, whole or in column chunks along K,
//! per flag): every element of every
//! rank's D against a float64 CPU GEMM of the gathered A (each rank regenerates every rank's
//! shard) and its own B; per method 10^4 back-to-back runs rewriting the shard before each
//! (integer data, exact), D compared bit for bit on the GPU; misuse refused.

use super::fused_reduce_scatter::{
    device_addr, inputs, max_ctas, random_options, refused, TRIAL_WAIT,
};
use super::gpu;
use super::overlap::STRESS_ITERATIONS;
use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, upload};
use crate::job::Job;
use crate::trials::Case;
use crate::word_compare::WordCompare;
use cudarc::driver::{CudaContext, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_signal_gemm::fused::{AllGatherMethod, FusedAllGatherGemm};
use weft_signal_gemm::reference::{check_all, gemm_f64, Tolerance};
use weft_signal_gemm::{
    device_sms, Dtype, EpilogueChoice, GemmElement, GemmOptions, GemmShape, TileChoice,
};
use weft_sync::WaitBudget;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "fused_all_gather::matches_f64_gemm_of_gathered_a",
            matches_reference,
        ),
        Case::gpu("fused_all_gather::stress_back_to_back_exact", stress),
        Case::gpu("fused_all_gather::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// Rank r's A shard (rows × k) and B (k × n) for input set `set`; and the gathered A.
fn shard_inputs(
    seed: u64,
    r: usize,
    set: u64,
    rows: u32,
    shape: GemmShape,
    integers: bool,
) -> (Vec<bf16>, Vec<bf16>) {
    let (a, _) = inputs(
        seed,
        r,
        set,
        GemmShape::new(rows, shape.n, shape.k),
        integers,
    );
    let (_, b) = inputs(seed ^ 0xB, r, set, shape, integers);
    (a, b)
}

fn gathered_a(
    seed: u64,
    world: usize,
    set: u64,
    rows: u32,
    shape: GemmShape,
    integers: bool,
) -> Vec<bf16> {
    (0..world)
        .flat_map(|r| shard_inputs(seed, r, set, rows, shape, integers).0)
        .collect()
}

/// Options for a GEMM of `ctas` compute CTAs and `method`'s communicator CTAs, if any.
fn configure(sms: u32, ctas: u32, method: AllGatherMethod, base: GemmOptions) -> GemmOptions {
    let comm = match method {
        AllGatherMethod::Inter { comm_ctas } => comm_ctas,
        AllGatherMethod::Intra | AllGatherMethod::CopyEngine { .. } => 0,
    };
    GemmOptions {
        sm_margin: sms - ctas - comm,
        ..base
    }
}

/// Random shapes (n, k ragged), B layouts, tiles, clusters, schedules, communicator counts, copy
/// groups (a shorter last group included), bf16 and f32 outputs, each method; two input sets per
/// case.
fn matches_reference(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let world = job.world();
    let budget = max_ctas(job, &ctx)?;
    anyhow::ensure!(
        budget >= 6,
        "each rank has only {budget} SMs: the trial needs 6 (GEMM and communicators resident together)"
    );
    let sms = device_sms(&ctx)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xA6);
    for case in 0..12u64 {
        let cluster_m = rng.random_range(1..=2u32);
        let rows = 128 * cluster_m * rng.random_range(1..=2u32);
        let shape = GemmShape::new(
            rows * world as u32,
            16 * rng.random_range(1..=24),
            16 * rng.random_range(1..=24),
        );
        let method = match case % 6 / 2 {
            0 => AllGatherMethod::Intra,
            1 => AllGatherMethod::Inter {
                comm_ctas: (rng.random_range(1..=(budget / 2).min(6)) / cluster_m * cluster_m)
                    .max(cluster_m),
            },
            _ => AllGatherMethod::CopyEngine {
                tile_rows: rng.random_range(1..=3),
                // Whole rows, or up to 4 chunks of whole K blocks (a shorter last one included):
                // a chunk length, and the count it makes.
                k_chunks: {
                    let blocks = shape.k.div_ceil(64);
                    blocks.div_ceil(rng.random_range(blocks.div_ceil(4)..=blocks))
                },
            },
        };
        let comm = match method {
            AllGatherMethod::Inter { comm_ctas } => comm_ctas,
            _ => 0,
        };
        let ctas = rng
            .random_range(2..=(budget - comm).max(2))
            .min(budget - comm);
        let output = if case % 2 == 0 {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        let base = GemmOptions {
            output,
            ..random_options(&mut rng, cluster_m)
        };
        let options = configure(sms, ctas, method, base);
        let what = format!(
            "case {case}: {} {shape} {options:?}, {world} ranks, seed {seed}",
            method.name()
        );
        match output {
            Dtype::Bf16 => {
                check_case::<bf16>(job, &ctx, &stream, seed + case, shape, options, method)
            }
            _ => check_case::<f32>(job, &ctx, &stream, seed + case, shape, options, method),
        }
        .map_err(|e| e.context(what))?;
    }
    Ok(())
}

fn check_case<TO: GemmElement>(
    job: &mut Job,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    seed: u64,
    shape: GemmShape,
    options: GemmOptions,
    method: AllGatherMethod,
) -> anyhow::Result<()> {
    let (world, rank) = (job.world(), job.rank());
    let rows = shape.m / world as u32;
    let mut op =
        FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, ctx, stream, shape, options, method)?;
    op.set_budget(WaitBudget::for_device(ctx, TRIAL_WAIT)?);
    // A rank whose data is wrong still runs every set (the others' kernels wait for its CTAs).
    let mut wrong: Option<anyhow::Error> = None;
    let result = (|| -> anyhow::Result<()> {
        let mut d = poisoned::<TO>(stream, (shape.m * shape.n) as usize)?;
        for set in 0..2u64 {
            let (a, b) = shard_inputs(seed, rank, set, rows, shape, false);
            let (a_dev, b_dev) = (upload(stream, &a)?, upload(stream, &b)?);
            op.copy_shard(stream, &a_dev)?;
            op.run(stream, &b_dev, &mut d)?;
            op.synchronize(stream)?;
            let got = download(stream, &d)?;
            let none: [TO; 0] = [];
            let want = gemm_f64(
                shape,
                options.b_layout,
                &gathered_a(seed, world, set, rows, shape, false),
                &b,
                1.0,
                0.0,
                &none,
            );
            if let Err(e) = check_all(
                &format!("input set {set}, rank {rank}"),
                shape,
                &got,
                &want,
                Tolerance::for_output(options.output),
            ) {
                wrong.get_or_insert(e.into());
            }
            crate::gemm_data::poison(stream, &mut d)?;
        }
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))?;
    wrong.map_or(Ok(()), Err)
}

/// Per method, 10^4 runs back to back, alternating two sets of integer shards in {-1, 0, 1}
/// (k = 32, or 192 in K chunks: every element an integer of magnitude at most k, exact), each
/// rank rewriting its shard before each run: a peer's rows loaded (or copied) before they were written, or after
/// they were rewritten for the next run, or a chunk read before its copy landed, show as a
/// difference from the exact result.
fn stress(job: &mut Job) -> anyhow::Result<()> {
    let budget = {
        let (ctx, _) = gpu(job)?;
        max_ctas(job, &ctx)?
    };
    anyhow::ensure!(
        budget >= 4,
        "each rank has only {budget} SMs: the trial needs 4"
    );
    let comm = (budget / 4).clamp(1, 4);
    let ctas = (budget - comm).min(16);
    stress_method(job, ctas, AllGatherMethod::Intra, 128, 32)?;
    stress_method(
        job,
        ctas,
        AllGatherMethod::Inter { comm_ctas: comm },
        128,
        32,
    )?;
    // Three tile rows a rank in groups of two: a whole group and a shorter last one.
    let groups = AllGatherMethod::CopyEngine {
        tile_rows: 2,
        k_chunks: 1,
    };
    stress_method(job, ctas, groups, 384, 32)?;
    // The same groups in two column chunks, of two K blocks and of one (k = 192: the sums stay
    // integers of magnitude at most 192, exact in bf16): a K block loaded before its chunk landed
    // shows.
    let chunks = AllGatherMethod::CopyEngine {
        tile_rows: 2,
        k_chunks: 2,
    };
    stress_method(job, ctas, chunks, 384, 192)
}

fn stress_method(
    job: &mut Job,
    ctas: u32,
    method: AllGatherMethod,
    rows: u32,
    k: u32,
) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    let sms = device_sms(&ctx)?;
    let shape = GemmShape::new(rows * world as u32, 256, k);
    let options = configure(sms, ctas, method, GemmOptions::default());
    let mut op =
        FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options, method)?;
    op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
    let result = (|| -> anyhow::Result<()> {
        let mut shards = Vec::new();
        let mut wants = Vec::new();
        let b = shard_inputs(seed, rank, 0, rows, shape, true).1;
        let b_dev = upload(&stream, &b)?;
        for set in 0..2u64 {
            shards.push(upload(
                &stream,
                &shard_inputs(seed, rank, set, rows, shape, true).0,
            )?);
            let none: [bf16; 0] = [];
            let want = gemm_f64(
                shape,
                options.b_layout,
                &gathered_a(seed, world, set, rows, shape, true),
                &b,
                1.0,
                0.0,
                &none,
            );
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
        let mut d = poisoned::<bf16>(&stream, (shape.m * shape.n) as usize)?;
        let mut cmp = WordCompare::load(&stream)?;
        cmp.reset(&stream)?;
        for it in 0..STRESS_ITERATIONS {
            op.copy_shard(&stream, &shards[it % 2])?;
            op.run(&stream, &b_dev, &mut d)?;
            cmp.enqueue_raw(
                &stream,
                device_addr(&stream, &d),
                device_addr(&stream, &exact[it % 2]),
                d.len() * 2,
            )?;
            if it % 1000 == 999 {
                op.synchronize(&stream)?;
            }
        }
        op.synchronize(&stream)?;
        let diff = cmp.take(&stream)?;
        anyhow::ensure!(diff.is_none(), "{}: {STRESS_ITERATIONS} runs on {world} ranks: rank {rank}'s D differed from the exact result: {diff:?}", method.name());
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))
}

/// Misuse gets an error that names it, on every rank alike.
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let world = job.world() as u32;
    let budget = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let fits = GemmOptions {
        sm_margin: sms - budget,
        ..GemmOptions::default()
    };
    let intra = AllGatherMethod::Intra;
    let expect = |job: &mut Job,
                  shape: GemmShape,
                  options: GemmOptions,
                  method: AllGatherMethod,
                  needle: &str|
     -> anyhow::Result<()> {
        // Accepted: freed (collectively, every rank accepted the same plan), then reported.
        let made =
            FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options, method);
        refused(
            &format!("{} {shape} {options:?}", method.name()),
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            needle,
        )
    };
    expect(
        job,
        GemmShape::new(64 * world, 256, 64),
        fits,
        intra,
        "whole multiple of 128",
    )?;
    expect(
        job,
        GemmShape::new(128 * world, 256, 64),
        GemmOptions {
            cluster_m: 2,
            ..fits
        },
        intra,
        "whole multiple of 256",
    )?;
    expect(
        job,
        GemmShape::new(128 * world, 256, 64),
        GemmOptions {
            input: Dtype::F16,
            ..fits
        },
        intra,
        "GemmOptions::input must match",
    )?;
    let shape = GemmShape::new(128 * world, 256, 64);
    expect(
        job,
        shape,
        GemmOptions {
            comm_ctas: 2,
            ..fits
        },
        intra,
        "comm_ctas must be 0",
    )?;
    expect(
        job,
        shape,
        fits,
        AllGatherMethod::Inter { comm_ctas: 0 },
        "at least one communicator CTA",
    )?;
    expect(
        job,
        shape,
        GemmOptions {
            comm_ctas: 3,
            ..fits
        },
        AllGatherMethod::Inter { comm_ctas: 2 },
        "sets comm_ctas itself",
    )?;
    expect(
        job,
        shape,
        GemmOptions {
            comm_ctas: 2,
            ..fits
        },
        AllGatherMethod::CopyEngine {
            tile_rows: 2,
            k_chunks: 1,
        },
        "fused-ce AllGather has no communicator CTAs",
    )?;
    expect(
        job,
        shape,
        fits,
        AllGatherMethod::CopyEngine {
            tile_rows: 0,
            k_chunks: 1,
        },
        "at least one tile row",
    )?;
    // k = 64: one K block, so at most one chunk.
    expect(
        job,
        shape,
        fits,
        AllGatherMethod::CopyEngine {
            tile_rows: 1,
            k_chunks: 2,
        },
        "cuts K into 1 to 1 chunks",
    )?;
    // k = 640: ten K blocks make 5 chunks of 2, not 8.
    expect(
        job,
        GemmShape::new(shape.m, shape.n, 640),
        fits,
        AllGatherMethod::CopyEngine {
            tile_rows: 1,
            k_chunks: 8,
        },
        "make 5 chunks of 2, not 8",
    )?;
    // The whole-tile epilogue's plan runs the kernel with every fusion, which polls no K chunks.
    expect(
        job,
        GemmShape::new(shape.m, 256, 256),
        GemmOptions {
            epilogue: EpilogueChoice::WholeTile,
            tile: TileChoice::N256,
            ..fits
        },
        AllGatherMethod::CopyEngine {
            tile_rows: 1,
            k_chunks: 2,
        },
        "needs the AllGather's own kernel",
    )?;
    if budget < sms {
        expect(
            job,
            shape,
            GemmOptions::default(),
            intra,
            "cannot all be resident",
        )?;
    }
    let mut op = FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, fits, intra)?;
    let small_b = upload(&stream, &[bf16::ZERO; 16])?;
    let mut d = poisoned::<bf16>(&stream, (shape.m * shape.n) as usize)?;
    let outcome = refused(
        &format!("a 16-element B for {shape}"),
        op.run(&stream, &small_b, &mut d)
            .map_err(anyhow::Error::from),
        "B buffer too small",
    );
    let short = upload(&stream, &[bf16::ZERO; 16])?;
    let outcome = outcome.and(refused(
        "a 16-element shard",
        op.copy_shard(&stream, &short).map_err(anyhow::Error::from),
        "the A shard needs",
    ));
    let outcome = outcome.and(op.free(&mut job.rdzv).map_err(anyhow::Error::from));
    let inter = AllGatherMethod::Inter { comm_ctas: 2 };
    let mut op = FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, fits, inter)?;
    let b = upload(&stream, &vec![bf16::ZERO; (shape.k * shape.n) as usize])?;
    let mut small_d = poisoned::<bf16>(&stream, 16)?;
    let outcome = outcome.and(refused(
        &format!("fused-inter with a 16-element D for {shape}"),
        op.run(&stream, &b, &mut small_d)
            .map_err(anyhow::Error::from),
        "D buffer too small",
    ));
    let freed = op.free(&mut job.rdzv);
    outcome.and(freed.map_err(anyhow::Error::from))
}
