//! Create/destroy cycles of everything that holds device memory, modules, streams or file
//! descriptors, with the error paths a caller can trigger in between: after a warm-up, the GPU's
//! free memory (read between barriers, every rank's work finished) and this process's open file
//! descriptors must end where they started. A leak of one buffer, module or event per cycle shows
//! as megabytes or descriptors; the driver's own bookkeeping is allowed 4 MiB per rank on the GPU.
//! - gemm_plans: GEMMs of random small shapes (split-K ones allocate partials, dynamic ones a
//!   claim counter), a launch every 100 cycles, and each cycle a launch refused for a short
//!   buffer and a plan refused for its shape.
//! - grpcoll_plans: GroupCast and GroupReduce ring plans (peer buffers, counters, error slot), a
//!   run every 100 cycles, and each cycle a plan refused for bad split sizes.
//! - fused_reduce_scatter_plans: the fused GEMM + ReduceScatter (its GEMM module, peer outputs
//!   and barriers), a run every 25 cycles, and each cycle a plan refused for its shape.
//! - fused_all_reduce_plans: the fused GEMM + AllReduce, DistFuse and communicator-CTA methods in
//!   turn (partials, outputs, flags, the workers' stream), a run of each every 25 cycles, and each cycle a
//!   DistFuse refused for an sm_margin that leaves its workers no SMs.
//! - fused_all_gather_plans: the fused AllGather + GEMM, copy-engine and communicator-CTA methods
//!   in turn (shards, gathered A, chunk flags, side stream), a run of each every 25 cycles, and each cycle
//!   a plan refused for a shard that is not whole tile rows.
//! - fused_all_to_all_plans: the fused GEMM + All-to-All (its GEMM, the peer outputs sized by
//!   the routing, row table and barriers), a run every 25 cycles, and each cycle a plan refused
//!   for a routing of the wrong length.
//! - nccl_communicators: a communicator made, used for an all-reduce, dropped.
//! - collectives: weft-collectives' staging PGL, round flags and state, an all-reduce every 25
//!   cycles, and each cycle a call refused for a short output and a set-up refused for its
//!   options (on every rank alike).
//! - overlap_ops: GEMM + AllReduce planned and freed as `seq-collectives` (cuBLAS handle, output,
//!   weft's collectives), a launch every 25 cycles, and each cycle a plan refused for beta != 0.
//! - modules_load_once: a cubin loaded twice on one (primary) context is one module, and GEMM
//!   plans of every kernel family load no other (`Cubin::load` keeps each module for the process:
//!   per-plan loads and unloads lost device memory on H100 hosts' driver).
//!
//! `weft test` runs 200 GEMM, 300 grpcoll, 100 of each of the four fused ops, 50 NCCL, 200 collectives and 100
//! overlap-op cycles; `WEFT_LEAK_CYCLES=1000`
//! sets every count (issue #26's figure). Not cycled: KernelBarrier, whose allocations (a
//! 4-byte device counter and a pinned host page) are far below the 4 MiB this check resolves,
//! so a trial of it could not fail. On two H200s 1000 cycles took 2.5 s (GEMM), 28 s
//! (grpcoll) and 13 s (fused ReduceScatter) with modules loaded once (d5de479; 26, 31 and 41 s
//! before), 20 s (fused AllReduce) and 17 s (fused AllGather) at c132b8b, a NCCL cycle 1.2 s
//! (its connections are set up each time, and the communicator made twice: a bounded init,
//! then the blocking split).

use super::fused_reduce_scatter::max_ctas;
use super::gpu;
use super::grpcoll::{ring_cast, ring_reduce};
use super::pgl::{free_memory_between_barriers, open_fds};
use crate::data::shared_seed;
use crate::gemm_data::{poisoned, uniform, upload};
use crate::job::Job;
use crate::trials::{Case, Skip};
use anyhow::{ensure, Context};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weft_grpcoll::{GroupCast, GroupCastMeta, GroupReduce, Options, ReduceOp};
use weft_pgl::nccl::{Communicator, ReduceOp as NcclOp};
use weft_signal_gemm::fused::{
    AllGatherMethod, AllReduceMethod, FusedAllGatherGemm, FusedAllReduce, FusedAllToAll,
    FusedReduceScatter,
};
use weft_signal_gemm::{device_sms, Gemm, GemmOptions, GemmShape, KSplits, Scheduling};

const WARMUP: usize = 5;
/// Driver bookkeeping allowed per rank on the GPU over a whole trial.
const SLACK_BYTES: u64 = 4 << 20;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("leaks::gemm_plans", gemm_plans),
        Case::gpu("leaks::grpcoll_plans", grpcoll_plans),
        Case::gpu(
            "leaks::fused_reduce_scatter_plans",
            fused_reduce_scatter_plans,
        ),
        Case::gpu("leaks::fused_all_reduce_plans", fused_all_reduce_plans),
        Case::gpu("leaks::fused_all_gather_plans", fused_all_gather_plans),
        Case::gpu("leaks::fused_all_to_all_plans", fused_all_to_all_plans),
        Case::gpu("leaks::nccl_communicators", nccl_communicators),
        Case::gpu("leaks::collectives", collectives),
        Case::gpu("leaks::overlap_ops", overlap_ops),
        Case::gpu("leaks::modules_load_once", modules_load_once),
    ]
}

/// `WEFT_LEAK_CYCLES`, else `default`.
fn cycles(default: usize) -> anyhow::Result<usize> {
    match std::env::var("WEFT_LEAK_CYCLES") {
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => anyhow::bail!("WEFT_LEAK_CYCLES={v:?} is not a count of at least 1"),
        },
        Err(_) => Ok(default),
    }
}

/// Runs `cycle(job, i)` WARMUP + `count` times; free device memory and open descriptors after
/// the last must equal those after the warm-up (memory within SLACK_BYTES per rank on the GPU).
fn flat_over(
    job: &mut Job,
    what: &str,
    count: usize,
    mut cycle: impl FnMut(&mut Job, usize) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let ctx = gpu(job)?.0;
    let start = std::time::Instant::now();
    let mut before = None;
    for i in 0..WARMUP + count {
        if i == WARMUP {
            before = Some((free_memory_between_barriers(job, &ctx)?, open_fds()?));
        }
        cycle(job, i).with_context(|| format!("{what}, cycle {i}"))?;
    }
    let (free0, fds0) = before.context("no cycle after the warm-up")?;
    let (free1, fds1) = (free_memory_between_barriers(job, &ctx)?, open_fds()?);
    let sharing = weft_pgl::gpu::max_ranks_per_gpu(&mut job.rdzv, &ctx)? as u64;
    if job.rank() == 0 {
        eprintln!(
            "leaks: {} {what} cycles in {:.1} s; free device memory {free0} -> {free1} B, open descriptors {fds0} -> {fds1}",
            WARMUP + count,
            start.elapsed().as_secs_f64()
        );
    }
    ensure!(
        fds1 == fds0,
        "open file descriptors grew from {fds0} to {fds1} over {count} {what} cycles"
    );
    let shrank = free0.saturating_sub(free1) as u64;
    ensure!(
        shrank <= sharing * SLACK_BYTES,
        "free device memory shrank by {shrank} B over {count} {what} cycles"
    );
    Ok(())
}

/// The error of `r`, which must contain `needle`.
fn refused<T>(what: &str, r: anyhow::Result<T>, needle: &str) -> anyhow::Result<()> {
    match r {
        Ok(_) => anyhow::bail!("{what} was accepted"),
        Err(e) => {
            let text = format!("{e:#}");
            ensure!(
                text.contains(needle),
                "{what}: expected {needle:?} in {text}"
            );
            Ok(())
        }
    }
}

fn gemm_plans(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1EA4);
    let a = upload(&stream, &uniform::<bf16>(1, 512 * 1024))?;
    let b = upload(&stream, &uniform::<bf16>(2, 1024 * 512))?;
    // Shorter than any shape's B (16 x 16 at least).
    let short_b = upload(&stream, &uniform::<bf16>(2, 16))?;
    let mut d = poisoned::<bf16>(&stream, 512 * 512)?;
    flat_over(job, "GEMM plan", cycles(200)?, |_, i| {
        let mut dim = |max: u32| 16 * rng.random_range(1..=max / 16);
        let shape = GemmShape::new(dim(512), dim(512), dim(1024));
        let split = rng.random_bool(0.5);
        let options = GemmOptions {
            k_splits: if split {
                KSplits::Fixed(2.min(shape.k.div_ceil(64)))
            } else {
                KSplits::Auto
            },
            scheduling: if rng.random_bool(0.5) {
                Scheduling::Dynamic
            } else {
                Scheduling::Static
            },
            ..GemmOptions::default()
        };
        let gemm = Gemm::new(&ctx, shape, options)?;
        if i % 100 == 0 {
            gemm.launch(&stream, &a, &b, &mut d)?;
            stream.synchronize()?;
            gemm.check()?;
        }
        refused(
            "a launch with a short B",
            gemm.launch(&stream, &a, &short_b, &mut d)
                .map_err(anyhow::Error::from),
            "B buffer too small",
        )?;
        refused(
            "a plan with n = 250",
            Gemm::new(&ctx, GemmShape::new(256, 250, 128), GemmOptions::default())
                .map_err(anyhow::Error::from),
            "n = 250 is not a multiple of 16",
        )
    })
}

fn grpcoll_plans(job: &mut Job) -> anyhow::Result<()> {
    let stream = gpu(job)?.1;
    let (rank, world) = (job.rank(), job.world());
    flat_over(job, "grpcoll plan", cycles(300)?, |job, i| {
        let rows = 16 + (i % 7) * 8;
        let mut cast = GroupCast::<bf16>::new(
            &mut job.rdzv,
            &stream,
            &ring_cast(rank, world, rows),
            64,
            Options::default(),
        )?;
        let mut reduce = GroupReduce::<f32>::new(
            &mut job.rdzv,
            &stream,
            &ring_reduce(rank, world, rows),
            32,
            ReduceOp::Sum,
            Options::default(),
        )?;
        if i % 100 == 0 {
            cast.run()?;
            reduce.run()?;
            cast.synchronize()?;
            reduce.synchronize()?;
        }
        cast.free(&mut job.rdzv)?;
        reduce.free(&mut job.rdzv)?;
        // Splits that do not add up to the input: refused on every rank alike.
        let bad = GroupCastMeta {
            input_rows: rows + 1,
            ..ring_cast(rank, world, rows)
        };
        let made = GroupCast::<bf16>::new(&mut job.rdzv, &stream, &bad, 64, Options::default());
        refused(
            "a cast whose splits exceed its input",
            made.and_then(|p| p.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            "input_split_rows sum to",
        )
    })
}

fn fused_reduce_scatter_plans(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let world = job.world() as u32;
    let max_ctas = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let options = GemmOptions {
        sm_margin: sms - max_ctas.min(16),
        ..GemmOptions::default()
    };
    let shape = GemmShape::new(128 * world, 256, 64);
    let a = upload(&stream, &uniform::<bf16>(3, (shape.m * shape.k) as usize))?;
    let b = upload(&stream, &uniform::<bf16>(4, (shape.k * shape.n) as usize))?;
    flat_over(job, "fused ReduceScatter plan", cycles(100)?, |job, i| {
        let mut op = FusedReduceScatter::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options)?;
        let ran = if i % 25 == 0 {
            op.run(&stream, &a, &b)
                .and_then(|()| op.synchronize(&stream))
        } else {
            Ok(())
        };
        let freed = op.free(&mut job.rdzv);
        ran.and(freed)?;
        // m / world not a multiple of 64: refused on every rank alike.
        let made = FusedReduceScatter::<bf16>::new(
            &mut job.rdzv,
            &ctx,
            &stream,
            GemmShape::new(96 * world, 256, 64),
            options,
        );
        refused(
            "a fused ReduceScatter of 96 rows per rank",
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            "whole multiple of 64",
        )
    })
}

fn fused_all_to_all_plans(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let world = job.world() as u32;
    let sms = device_sms(&ctx)?;
    let options = GemmOptions {
        sm_margin: sms - max_ctas(job, &ctx)?.min(16),
        ..GemmOptions::default()
    };
    let shape = GemmShape::new(128, 256, 64);
    // Row i of every rank to rank i % world (every rank receives from every rank).
    let routes: Vec<Vec<u32>> = (0..world)
        .map(|_| (0..shape.m).map(|i| i % world).collect())
        .collect();
    let short: Vec<Vec<u32>> = routes.iter().map(|r| r[1..].to_vec()).collect();
    let a = upload(&stream, &uniform::<bf16>(7, (shape.m * shape.k) as usize))?;
    let b = upload(&stream, &uniform::<bf16>(8, (shape.k * shape.n) as usize))?;
    flat_over(job, "fused All-to-All plan", cycles(100)?, |job, i| {
        let mut op =
            FusedAllToAll::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options, &routes)?;
        let ran = if i % 25 == 0 {
            op.run(&stream, &a, &b)
                .and_then(|()| op.synchronize(&stream))
        } else {
            Ok(())
        };
        let freed = op.free(&mut job.rdzv);
        ran.and(freed)?;
        // Every rank's routing one row short of M: refused on every rank alike.
        let made = FusedAllToAll::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options, &short);
        refused(
            "a fused All-to-All routing M - 1 rows",
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            "routing has 127 rows, M is 128",
        )
    })
}

fn fused_all_reduce_plans(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let sms = device_sms(&ctx)?;
    let budget = max_ctas(job, &ctx)?.min(16);
    ensure!(
        budget >= 4,
        "each rank has only {budget} SMs: the trial needs 4"
    );
    let (gemm_ctas, workers) = (budget - 2, 2);
    // DistFuse: the GEMM leaves its workers' SMs; communicator CTAs: the GEMM kernel has them.
    let distfuse = GemmOptions {
        sm_margin: sms - gemm_ctas,
        ..GemmOptions::default()
    };
    let inter = GemmOptions {
        sm_margin: sms - gemm_ctas - workers,
        ..GemmOptions::default()
    };
    let shape = GemmShape::new(256, 256, 64);
    let a = upload(&stream, &uniform::<bf16>(5, (shape.m * shape.k) as usize))?;
    let b = upload(&stream, &uniform::<bf16>(6, (shape.k * shape.n) as usize))?;
    flat_over(job, "fused AllReduce plan", cycles(100)?, |job, i| {
        let (options, method) = if i % 2 == 0 {
            (distfuse, AllReduceMethod::DistFuse { workers })
        } else {
            (inter, AllReduceMethod::Inter { comm_ctas: workers })
        };
        let mut op = FusedAllReduce::new(&mut job.rdzv, &ctx, &stream, shape, options, method)?;
        let ran = if i % 25 < 2 {
            op.run(&stream, &a, &b)
                .and_then(|()| op.synchronize(&stream))
        } else {
            Ok(())
        };
        let freed = op.free(&mut job.rdzv);
        ran.and(freed)?;
        // No SM left for DistFuse's workers: refused on every rank alike.
        let made = FusedAllReduce::new(
            &mut job.rdzv,
            &ctx,
            &stream,
            shape,
            GemmOptions::default(),
            AllReduceMethod::DistFuse { workers },
        );
        refused(
            "DistFuse with sm_margin 0",
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            "must leave them at least",
        )
    })
}

fn fused_all_gather_plans(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let world = job.world() as u32;
    let sms = device_sms(&ctx)?;
    let fits = GemmOptions {
        sm_margin: sms - max_ctas(job, &ctx)?.min(16),
        ..GemmOptions::default()
    };
    let shape = GemmShape::new(128 * world, 256, 64);
    let shard = upload(&stream, &uniform::<bf16>(7, (128 * shape.k) as usize))?;
    let b = upload(&stream, &uniform::<bf16>(8, (shape.k * shape.n) as usize))?;
    let mut d = poisoned::<bf16>(&stream, (shape.m * shape.n) as usize)?;
    flat_over(job, "fused AllGather plan", cycles(100)?, |job, i| {
        let method = if i % 2 == 0 {
            AllGatherMethod::CopyEngine {
                tile_rows: 1,
                k_chunks: 1,
            }
        } else {
            AllGatherMethod::Inter { comm_ctas: 2 }
        };
        let mut op =
            FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, fits, method)?;
        let ran = if i % 25 < 2 {
            op.copy_shard(&stream, &shard)
                .and_then(|()| op.run(&stream, &b, &mut d))
                .and_then(|()| op.synchronize(&stream))
        } else {
            Ok(())
        };
        let freed = op.free(&mut job.rdzv);
        ran.and(freed)?;
        // 96 rows per rank: not whole tile rows, refused on every rank alike.
        let made = FusedAllGatherGemm::<bf16>::new(
            &mut job.rdzv,
            &ctx,
            &stream,
            GemmShape::new(96 * world, 256, 64),
            fits,
            method,
        );
        refused(
            "a fused AllGather of 96 rows per rank",
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            "whole multiple of 128",
        )
    })
}

fn nccl_communicators(job: &mut Job) -> anyhow::Result<()> {
    if let Some(why) = job.shared_gpu() {
        return Err(Skip(why.to_string()).into());
    }
    let (ctx, stream) = gpu(job)?;
    let mut buf = stream.alloc_zeros::<f32>(1024)?;
    flat_over(job, "NCCL communicator", cycles(50)?, |job, i| {
        let comm = Communicator::new(&mut job.rdzv, &ctx)?;
        comm.all_reduce_in_place(&mut buf, NcclOp::Sum, &stream)?;
        comm.synchronize(&stream, &format!("cycle {i}'s all-reduce"))?;
        drop(comm);
        Ok(())
    })
}

fn modules_load_once(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, _) = gpu(job)?;
    let cubin = &weft_kernels::cubins::GEMM_GEMM_BF16;
    let (a, b) = (cubin.load(&ctx)?, cubin.load(&ctx)?);
    ensure!(
        std::sync::Arc::ptr_eq(&a, &b),
        "{} loaded twice on one context gave two modules",
        cubin.source
    );
    let options = |tile, cluster_m, k_splits| GemmOptions {
        tile,
        cluster_m,
        k_splits,
        ..GemmOptions::default()
    };
    use weft_signal_gemm::TileChoice::{N128, N256};
    // The GEMM plans below load the same cubin through weft-signal-gemm's copy of the constant.
    let loaded = weft_kernels::loaded_modules();
    let first = Gemm::new(&ctx, GemmShape::new(256, 256, 256), GemmOptions::default())?;
    for (i, o) in [
        options(N256, 1, KSplits::Fixed(1)),
        options(N128, 1, KSplits::Fixed(2)),
        options(N256, 2, KSplits::Fixed(1)),
        options(N128, 2, KSplits::Fixed(1)),
    ]
    .into_iter()
    .enumerate()
    {
        let g = Gemm::new(&ctx, GemmShape::new(512, 512, 256 * (i as u32 + 1)), o)?;
        drop(g);
    }
    drop(first);
    ensure!(
        weft_kernels::loaded_modules() == loaded,
        "GEMM plans loaded modules of a cubin already loaded: {loaded} before, {} after",
        weft_kernels::loaded_modules()
    );
    Ok(())
}

fn collectives(job: &mut Job) -> anyhow::Result<()> {
    use weft_collectives::{Collectives, Options as CollOptions};
    let stream = gpu(job)?.1;
    let world = job.world();
    let input = upload(&stream, &uniform::<bf16>(5, 4096))?;
    let mut out = poisoned::<bf16>(&stream, 4096)?;
    let mut short = poisoned::<bf16>(&stream, 4095)?;
    // Small slots: the cycle is the set-up and teardown, not the default 288 MiB of staging.
    let options = CollOptions {
        slot_bytes: Some(1 << 20),
        ..CollOptions::default()
    };
    flat_over(job, "collectives", cycles(200)?, |job, i| {
        let mut coll = Collectives::new(&mut job.rdzv, &stream, options)?;
        if i % 25 == 0 {
            coll.all_reduce(&input, &mut out)?;
            coll.synchronize()?;
        }
        refused(
            "an all-reduce into a shorter output",
            coll.all_reduce(&input, &mut short)
                .map_err(anyhow::Error::from),
            "output holds 4095 elements, expected 4096",
        )?;
        coll.free(&mut job.rdzv)?;
        let odd = CollOptions {
            slot_bytes: Some(1000),
            ..CollOptions::default()
        };
        refused(
            "slots of 1000 bytes",
            Collectives::new(&mut job.rdzv, &stream, odd)
                .map(|_| world)
                .map_err(anyhow::Error::from),
            "slot_bytes 1000 must be a positive multiple of 16",
        )
    })
}

fn overlap_ops(job: &mut Job) -> anyhow::Result<()> {
    use weft_signal_gemm::ops::{GemmAllReduce, Method, MethodChoice};
    if job.world() < 2 {
        return Err(Skip("seq-collectives needs two ranks or more".into()).into());
    }
    let (stream, mut env) = super::ops::test_env(job)?;
    let shape = GemmShape::new(128, 256, 64);
    let a = upload(&stream, &uniform::<bf16>(6, 128 * 64))?;
    let b = upload(&stream, &uniform::<bf16>(7, 64 * 256))?;
    let seq = MethodChoice::Exact(Method::SeqCollectives);
    flat_over(job, "overlap op", cycles(100)?, |job, i| {
        let mut op = GemmAllReduce::<bf16>::plan(
            &mut job.rdzv,
            &mut env,
            &stream,
            shape,
            GemmOptions::default(),
            &seq,
            false,
        )?;
        if i % 25 == 0 {
            op.launch(&stream, &a, &b)?;
            op.synchronize()?;
        }
        op.free(&mut job.rdzv)?;
        let beta = GemmOptions {
            beta: 1.0,
            ..GemmOptions::default()
        };
        refused(
            "an op with beta = 1",
            GemmAllReduce::<bf16>::plan(&mut job.rdzv, &mut env, &stream, shape, beta, &seq, false)
                .map(|_| ())
                .map_err(anyhow::Error::from),
            "beta must be 0",
        )
    })
}
