//! signal-gemm III, fused GEMM + ReduceScatter (TMA reduce-add into the owners' memory): every
//! rank's rows against a float64 CPU reference of Σ over ranks of A_r · B_r (each rank regenerates
//! every rank's inputs from the shared seed: no communication in the reference), bf16 and f32
//! accumulation; 10^4 back-to-back runs with exact integer data checked bit for bit on the GPU;
//! misuse refused with a message. Runs on any world size, ranks sharing a GPU included.

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
use weft_pgl::{Pgl, PglElement};
use weft_signal_gemm::fused::FusedReduceScatter;
use weft_signal_gemm::reference::gemm_f64;
use weft_signal_gemm::{
    device_sms, BLayout, Dtype, GemmElement, GemmOptions, GemmShape, Scheduling, TileChoice,
};
use weft_sync::WaitBudget;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "fused_reduce_scatter::matches_f64_sum_over_ranks",
            matches_reference,
        ),
        Case::gpu("fused_reduce_scatter::stress_back_to_back_exact", stress),
        Case::gpu(
            "fused_reduce_scatter::a_late_rank_reads_its_own_run",
            late_rank,
        ),
        Case::gpu("fused_reduce_scatter::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// Cross-rank waits in trials: long enough for ranks sharing a GPU, short enough to fail fast.
pub(super) const TRIAL_WAIT: Duration = Duration::from_secs(10);

/// The most compute CTAs a rank's plan may take so that every rank's grid is resident at once.
/// Collective.
pub(super) fn max_ctas(job: &mut Job, ctx: &Arc<CudaContext>) -> anyhow::Result<u32> {
    let sharing = weft_pgl::gpu::max_ranks_per_gpu(&mut job.rdzv, ctx)? as u32;
    Ok(device_sms(ctx)? / sharing)
}

/// Rank `r`'s A and B for input set `set` (every rank can regenerate any rank's).
pub(super) fn inputs(
    seed: u64,
    r: usize,
    set: u64,
    shape: GemmShape,
    integers: bool,
) -> (Vec<bf16>, Vec<bf16>) {
    let mut rng = StdRng::seed_from_u64(
        seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(r as u64 + 1)) ^ (set << 48),
    );
    let mut draw = |count: usize| -> Vec<bf16> {
        (0..count)
            .map(|_| {
                if integers {
                    bf16::from_f32(rng.random_range(-1i32..=1) as f32)
                } else {
                    bf16::from_f64(rng.random_range(-1.0f64..=1.0))
                }
            })
            .collect()
    };
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a = draw(m * k);
    let b = draw(k * n);
    (a, b)
}

/// Σ over ranks of rank r's rows [first, first + rows) of A_r · B_r, and Σ of their magnitudes.
pub(super) fn reference(
    seed: u64,
    set: u64,
    world: usize,
    shape: GemmShape,
    b_layout: BLayout,
    first: u32,
    rows: u32,
    integers: bool,
) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (shape.n as usize, shape.k as usize);
    let part = GemmShape::new(rows, shape.n, shape.k);
    let mut sum = vec![0.0f64; rows as usize * n];
    let mut mag = vec![0.0f64; rows as usize * n];
    for r in 0..world {
        let (a, b) = inputs(seed, r, set, shape, integers);
        let a_rows = &a[first as usize * k..(first + rows) as usize * k];
        let none: [bf16; 0] = [];
        let c = gemm_f64(part, b_layout, a_rows, &b, 1.0, 0.0, &none);
        for (i, v) in c.into_iter().enumerate() {
            sum[i] += v;
            mag[i] += v.abs();
        }
    }
    (sum, mag)
}

/// Fills this rank's buffer of `out` with NaN on `stream`, so an element a run never writes
/// fails the check.
pub(super) fn poison_pgl<T: PglElement>(
    stream: &Arc<CudaStream>,
    out: &Pgl<T>,
) -> anyhow::Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: the PGL's own buffer holds len() elements of T; stream-ordered before the run.
    match std::mem::size_of::<T>() {
        2 => {
            unsafe { sys::cuMemsetD16Async(out.local_ptr(), 0x7FC0, out.len(), stream.cu_stream()) }
                .result()?
        }
        4 => unsafe {
            sys::cuMemsetD32Async(out.local_ptr(), 0x7FC0_0000, out.len(), stream.cu_stream())
        }
        .result()?,
        s => anyhow::bail!("no poison for {s}-byte elements"),
    }
    Ok(())
}

/// Random shapes (ragged tiles: n and k any multiple of 16; m/world a multiple of 64), both B
/// layouts, both tiles, clusters, static and dynamic schedules, bf16 and f32 outputs: every
/// element of this rank's rows within the bound of the reduction's roundings, two input sets in
/// a row (the second run reuses the zeroed-then-added buffers and the barriers' next epoch).
fn matches_reference(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let world = job.world();
    let max_ctas = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for case in 0..6 {
        let rows = 64 * rng.random_range(1..=4u32);
        let shape = GemmShape::new(
            rows * world as u32,
            16 * rng.random_range(1..=32),
            16 * rng.random_range(1..=24),
        );
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
        let what = format!("case {case}: {shape} {options:?}, {world} ranks, seed {seed}");
        match output {
            Dtype::Bf16 => check_case::<bf16>(job, &ctx, &stream, seed + case, shape, options),
            _ => check_case::<f32>(job, &ctx, &stream, seed + case, shape, options),
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
) -> anyhow::Result<()> {
    let world = job.world();
    let rank = job.rank();
    let mut op = FusedReduceScatter::<T>::new(&mut job.rdzv, ctx, stream, shape, options)?;
    op.set_budget(WaitBudget::for_device(ctx, TRIAL_WAIT)?);
    let (first, rows) = op.rows();
    anyhow::ensure!(
        first == rank as u32 * shape.m / world as u32 && rows == shape.m / world as u32,
        "rank {rank} owns rows {first}+{rows}"
    );
    // A rank whose data is wrong still runs every set (the others' kernels wait for its CTAs):
    // the first wrong set is reported once all ran.
    let mut wrong: Option<anyhow::Error> = None;
    let result = (|| -> anyhow::Result<()> {
        let mut got = poisoned::<T>(stream, op.output().len())?;
        for set in 0..2u64 {
            let (a, b) = inputs(seed, rank, set, shape, false);
            let (a, b) = (upload(stream, &a)?, upload(stream, &b)?);
            poison_pgl(stream, op.output())?;
            op.run(stream, &a, &b)?;
            op.copy_output(stream, &mut got)?;
            op.synchronize(stream)?;
            let got = download(stream, &got)?;
            let (want, mag) = reference(
                seed,
                set,
                world,
                shape,
                options.b_layout,
                first,
                rows,
                false,
            );
            // Each rank's partial rounds once to the output dtype, and each of the world adds
            // rounds the running sum once: (world + 1) units of 2^-8 (bf16) or 2^-20 (f32, a
            // margin over 2^-24) of Σ|partial|, plus fp32 accumulation in another order.
            let unit = if <T as GemmElement>::DTYPE == Dtype::Bf16 {
                2f64.powi(-8)
            } else {
                2f64.powi(-20)
            };
            let n = shape.n as usize;
            let mut bad = Vec::new();
            for (i, g) in got.iter().enumerate() {
                let g = g.to_f64();
                let bound =
                    (world as f64 + 1.0) * unit * mag[i] + 2e-6 * f64::from(shape.k) * world as f64;
                #[allow(clippy::neg_cmp_op_on_partial_ord)]
                // a NaN difference must fail the check too
                if !((g - want[i]).abs() <= bound) {
                    bad.push(format!(
                        "row {} col {}: got {g}, want {} (bound {bound:.3e})",
                        first as usize + i / n,
                        i % n,
                        want[i]
                    ));
                }
            }
            if !bad.is_empty() && wrong.is_none() {
                wrong = Some(anyhow::anyhow!(
                    "input set {set}: {} of {} elements of rank {rank}'s rows wrong; first: {}",
                    bad.len(),
                    got.len(),
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

/// 10^4 runs back to back, alternating two input sets of integers in {-1, 0, 1} (every partial
/// and every sum an integer of magnitude at most k · world <= 256: exact in bf16 in any add
/// order), each output compared bit for bit on the GPU with the set's exact result: a reduce
/// that read or zeroed a buffer too early, or an output read before every rank's adds landed,
/// shows as a difference.
/// Rank `rank`'s integer inputs of set `set` and its rows of the exact result (`rows` = (first,
/// count) of its output), in bf16; refused unless every partial sum is exact in bf16 (integers up
/// to 256), which the bit-exact trials need.
fn exact_set(
    seed: u64,
    rank: usize,
    set: u64,
    world: usize,
    shape: GemmShape,
    options: GemmOptions,
    (first, rows): (u32, u32),
) -> anyhow::Result<(Vec<bf16>, Vec<bf16>, Vec<bf16>)> {
    let (a, b) = inputs(seed, rank, set, shape, true);
    let (want, _) = reference(seed, set, world, shape, options.b_layout, first, rows, true);
    anyhow::ensure!(
        want.iter().all(|v| v.fract() == 0.0 && v.abs() <= 256.0),
        "{shape} over {world} ranks: the integer data is not exact in bf16"
    );
    Ok((a, b, want.iter().map(|&v| bf16::from_f64(v)).collect()))
}

fn stress(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    let max_ctas = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let shape = GemmShape::new(128 * world as u32, 384, 32);
    let options = GemmOptions {
        sm_margin: sms - max_ctas.min(16),
        ..GemmOptions::default()
    };
    let mut op = FusedReduceScatter::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options)?;
    op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
    let result = (|| -> anyhow::Result<()> {
        let (first, rows) = op.rows();
        let mut sets = Vec::new();
        let mut wants = Vec::new();
        for set in 0..2u64 {
            let (a, b, want) = exact_set(seed, rank, set, world, shape, options, (first, rows))?;
            sets.push((upload(&stream, &a)?, upload(&stream, &b)?));
            wants.push(want);
        }
        anyhow::ensure!(
            wants[0] != wants[1],
            "the two input sets give the same result"
        );
        let exact = [upload(&stream, &wants[0])?, upload(&stream, &wants[1])?];
        let mut cmp = WordCompare::load(&stream)?;
        cmp.reset(&stream)?;
        let bytes = op.output().len() * 2;
        for it in 0..STRESS_ITERATIONS {
            let (a, b) = &sets[it % 2];
            op.run(&stream, a, b)?;
            cmp.enqueue_raw(
                &stream,
                op.output().local_ptr(),
                device_addr(&stream, &exact[it % 2]),
                bytes,
            )?;
            if it % 1000 == 999 {
                op.synchronize(&stream)?;
            }
        }
        op.synchronize(&stream)?;
        let diff = cmp.take(&stream)?;
        anyhow::ensure!(diff.is_none(), "{STRESS_ITERATIONS} runs on {world} ranks: rank {rank}'s output differed from the exact result: {diff:?}");
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))
}

/// Rank 0 checks its output of run 0 only after a host sleep while the other ranks go straight
/// on to run 1, then checks run 1's: the peers' adds of run 1 must wait (the kernel's START
/// barrier, kernels/include/weft/gemm/peer_reduce.cuh) until rank 0 has zeroed its output in run
/// 1, which its stream reaches after the check, or rank 0 reads run 0 with run 1's adds in it, or
/// zeroes adds that came early. Every rank runs both runs whatever it found (a rank that left
/// after a wrong run 0 would leave its peers' run 1 waiting out its barrier) and reports after.
fn late_rank(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    // Partial sums of 32 products in {-1, 0, 1} over `world` ranks stay exact in bf16 up to 256.
    anyhow::ensure!(
        world <= 8,
        "the late-rank trial's data is exact in bf16 for at most 8 ranks, not {world}"
    );
    let max_ctas = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let shape = GemmShape::new(512 * world as u32, 1024, 32);
    let options = GemmOptions {
        sm_margin: sms - max_ctas.min(8),
        tile: TileChoice::N256,
        ..GemmOptions::default()
    };
    let mut op = FusedReduceScatter::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options)?;
    op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
    let result = (|| -> anyhow::Result<()> {
        let (first, rows) = op.rows();
        let bytes = op.output().len() * 2;
        let mut cmp = WordCompare::load(&stream)?;
        let mut wrong = Vec::new();
        for run in 0..2u64 {
            let (a, b, want) = exact_set(seed, rank, run, world, shape, options, (first, rows))?;
            let (a, b, want) = (
                upload(&stream, &a)?,
                upload(&stream, &b)?,
                upload(&stream, &want)?,
            );
            op.run(&stream, &a, &b)?;
            if rank == 0 && run == 0 {
                op.synchronize(&stream)?;
                std::thread::sleep(Duration::from_millis(200));
            }
            cmp.reset(&stream)?;
            cmp.enqueue_raw(
                &stream,
                op.output().local_ptr(),
                device_addr(&stream, &want),
                bytes,
            )?;
            op.synchronize(&stream)?;
            if let Some(d) = cmp.take(&stream)? {
                wrong.push(format!(
                    "run {run}'s output differed from the exact result: {d:?}{}",
                    if rank == 0 && run == 0 {
                        " (a peer's next run added into it before this rank read it)"
                    } else {
                        ""
                    }
                ));
            }
        }
        anyhow::ensure!(
            wrong.is_empty(),
            "rank {rank} of {world}: {}",
            wrong.join("; ")
        );
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))
}

pub(super) fn device_addr<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    s: &CudaSlice<T>,
) -> u64 {
    use cudarc::driver::DevicePtr;
    s.device_ptr(stream).0
}

/// Misuse gets an error that names it, on every rank alike (the plan is agreed collectively).
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let world = job.world() as u32;
    let max_ctas = max_ctas(job, &ctx)?;
    let sms = device_sms(&ctx)?;
    let fits = GemmOptions {
        sm_margin: sms - max_ctas,
        ..GemmOptions::default()
    };
    let expect = |job: &mut Job,
                  shape: GemmShape,
                  options: GemmOptions,
                  needle: &str|
     -> anyhow::Result<()> {
        // Accepted: freed (collectively, every rank accepted the same plan), then reported.
        let made = FusedReduceScatter::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, options);
        refused(
            &format!("{shape} {options:?}"),
            made.and_then(|op| op.free(&mut job.rdzv))
                .map_err(anyhow::Error::from),
            needle,
        )
    };
    // m / world not a multiple of 64.
    expect(
        job,
        GemmShape::new(96 * world, 256, 64),
        fits,
        "whole multiple of 64",
    )?;
    expect(
        job,
        GemmShape::new(128 * world, 256, 64),
        GemmOptions { beta: 1.0, ..fits },
        "beta must be 0",
    )?;
    expect(
        job,
        GemmShape::new(128 * world, 256, 64),
        GemmOptions {
            output: Dtype::F32,
            ..fits
        },
        "GemmOptions::output must match",
    )?;
    if max_ctas < sms {
        expect(
            job,
            GemmShape::new(128 * world, 256, 64),
            GemmOptions::default(),
            "cannot all be resident",
        )?;
    }
    // Too small an operand, on a plan that is otherwise valid.
    let shape = GemmShape::new(128 * world, 256, 64);
    let mut op = FusedReduceScatter::<bf16>::new(&mut job.rdzv, &ctx, &stream, shape, fits)?;
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

/// Random GEMM options the fused trials share: B layout, tile, `cluster_m`, and (without
/// clusters) static or dynamic scheduling; the rest default.
pub(super) fn random_options(rng: &mut StdRng, cluster_m: u32) -> GemmOptions {
    GemmOptions {
        b_layout: if rng.random_bool(0.5) {
            BLayout::NxK
        } else {
            BLayout::KxN
        },
        tile: [TileChoice::Auto, TileChoice::N128, TileChoice::N256][rng.random_range(0..3)],
        cluster_m,
        scheduling: if cluster_m == 1 && rng.random_bool(0.5) {
            Scheduling::Dynamic
        } else {
            Scheduling::Static
        },
        ..GemmOptions::default()
    }
}

/// `r` must be an error mentioning `needle` (`what` was given to the call that returned it).
pub(super) fn refused(what: &str, r: anyhow::Result<()>, needle: &str) -> anyhow::Result<()> {
    match r {
        Ok(()) => anyhow::bail!("{what} was accepted; expected an error containing {needle:?}"),
        Err(e) if format!("{e:#}").contains(needle) => Ok(()),
        Err(e) => anyhow::bail!("{what}: expected an error containing {needle:?}, got: {e:#}"),
    }
}
