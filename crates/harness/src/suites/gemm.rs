//! weft's GEMM (crates/signal-gemm, kernels/gemm/) on each rank's own GPU:
//! - random_shapes_vs_cublas: 60 seeded random shapes (ragged edges, both B layouts, every
//!   input/output dtype, the three tile widths (192 in clusters of 1) and both automatic choices
//!   (`Auto`, `AutoPlain`), random sm_margin, some with alpha and beta, some with alpha alone
//!   (the 16-bit epilogue without beta stores by stmatrix)), fresh inputs, weft's output poisoned with NaN, every element within the output
//!   dtype's tolerance of cuBLAS (cublasGemmEx, fp32 compute, fp32 output) on the same inputs.
//! - small_shapes_vs_f64: 14 small shapes against a float64 CPU reference.
//! - schedule_matches_kernel: the order each tile was stored in (a trace the epilogue writes)
//!   equals the host's listing of the plan's schedule, for several grids, with clusters of 1 and 2
//!   (one with a phantom tile row).
//! - communicator_copies_finished_tiles: the test communicator on reserved CTAs copies every tile
//!   after its flag, 3 x 10 launches back to back on alternating inputs without resetting the
//!   flags, fp32 and bf16 outputs (both epilogues), clusters of 1 and 2; the copy equals D bit
//!   for bit and D equals cuBLAS.
//! - dynamic_schedule_claims_every_tile: with dynamic scheduling, 6 launches back to back on one
//!   stream (the claim counter never reset): every tile stored once per launch at the order the
//!   host lists for it, by a CTA of the grid; D bit-equal to the statically scheduled GEMM's; the
//!   claim counter advanced by orders + CTAs per launch; the timeline ordered; a launch on a
//!   second stream refused.
//! - split_k_across_launches: split-K GEMMs (3, 16 and one-block splits, ragged tiles, dynamic
//!   scheduling, fp32 output with beta) launched 3 times each on fresh inputs against cuBLAS; a
//!   launch on a second stream refused.
//! - bad_inputs_are_rejected: dtype and buffer-size mismatches give errors naming them; dynamic
//!   scheduling with clusters refused.
//!
//! The random and small shapes, and one communicator case, use dynamic scheduling too; a third
//! of the random and small cluster-1 shapes split K.

use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::trials::Case;
use anyhow::{ensure, Context};
use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_signal_gemm::reference::{check_all, gemm_f64, Tolerance};
use weft_signal_gemm::{
    BLayout, CublasGemm, Dtype, EpilogueChoice, Gemm, GemmElement, GemmError, GemmOptions,
    GemmShape, KSplits, LaunchExtras, Scheduling, TileChoice, TileFlags,
};

const RANDOM_SHAPES: usize = 60;
const COMM_LAUNCHES: usize = 30;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("gemm::random_shapes_vs_cublas", random_shapes_vs_cublas),
        Case::gpu("gemm::small_shapes_vs_f64", small_shapes_vs_f64),
        Case::gpu("gemm::schedule_matches_kernel", schedule_matches_kernel),
        Case::gpu(
            "gemm::communicator_copies_finished_tiles",
            communicator_copies_finished_tiles,
        ),
        Case::gpu(
            "gemm::dynamic_schedule_claims_every_tile",
            dynamic_schedule_claims_every_tile,
        ),
        Case::gpu("gemm::split_k_across_launches", split_k_across_launches),
        Case::gpu("gemm::bad_inputs_are_rejected", bad_inputs_are_rejected),
    ]
}

use super::gpu;

/// Runs `$body::<TI, TO>(args...)` for the plan's runtime dtypes.
macro_rules! with_dtypes {
    ($input:expr, $output:expr, $f:ident ( $($arg:expr),* )) => {
        match ($input, $output) {
            (Dtype::Bf16, Dtype::Bf16) => $f::<bf16, bf16>($($arg),*),
            (Dtype::Bf16, Dtype::F16) => $f::<bf16, f16>($($arg),*),
            (Dtype::Bf16, Dtype::F32) => $f::<bf16, f32>($($arg),*),
            (Dtype::F16, Dtype::Bf16) => $f::<f16, bf16>($($arg),*),
            (Dtype::F16, Dtype::F16) => $f::<f16, f16>($($arg),*),
            (Dtype::F16, Dtype::F32) => $f::<f16, f32>($($arg),*),
            (i, o) => anyhow::bail!("no GEMM for {i} -> {o}"),
        }
    };
}

/// A random shape with m, n, k multiples of 16 and mostly ragged against the tiles.
fn random_shape(rng: &mut StdRng, max: u32) -> GemmShape {
    let mut dim = |max: u32| 16 * rng.random_range(1..=max / 16);
    GemmShape::new(dim(max), dim(max), dim(max))
}

fn random_options(rng: &mut StdRng, i: usize) -> GemmOptions {
    let tile = [
        TileChoice::Auto,
        TileChoice::AutoPlain,
        TileChoice::N128,
        TileChoice::N192,
        TileChoice::N256,
    ][rng.random_range(0..5)];
    // 128 x 192 tiles have kernels for clusters of 1 only.
    let cluster_m = if tile == TileChoice::N192 {
        1
    } else {
        rng.random_range(1..=2)
    };
    let scheduling = if cluster_m == 1 && rng.random_bool(0.5) {
        Scheduling::Dynamic
    } else {
        Scheduling::Static
    };
    let output = [Dtype::Bf16, Dtype::F32, Dtype::F16][(i / 2) % 3];
    // Auto picks pipelined unless split-K needs whole-tile: whole-tile is asked for where the
    // kernel has it (16-bit outputs, 128 x 256 tiles).
    let epilogue = match rng.random_range(0..3) {
        0 => EpilogueChoice::Auto,
        1 => EpilogueChoice::Pipelined,
        _ if output != Dtype::F32 && tile == TileChoice::N256 => EpilogueChoice::WholeTile,
        _ => EpilogueChoice::Auto,
    };
    GemmOptions {
        input: [Dtype::Bf16, Dtype::F16][i % 2],
        output,
        b_layout: if rng.random_bool(0.5) {
            BLayout::NxK
        } else {
            BLayout::KxN
        },
        tile,
        sm_margin: if rng.random_bool(0.3) {
            rng.random_range(1..=16)
        } else {
            0
        },
        cluster_m,
        scheduling,
        epilogue,
        alpha: match i % 7 {
            3 => 0.5,
            5 => -1.5,
            _ => 1.0,
        },
        beta: if i % 7 == 3 { -1.25 } else { 0.0 },
        ..GemmOptions::default()
    }
}

/// A third of the cluster-1 cases split K in 2 to 4 (at most its K blocks; the rest choose,
/// which mostly means none at these sizes), with the epilogue the plan picks.
fn with_random_splits(rng: &mut StdRng, shape: GemmShape, options: GemmOptions) -> GemmOptions {
    if options.cluster_m != 1 || !rng.random_bool(1.0 / 3.0) {
        return options;
    }
    let splits = rng.random_range(2..=4u32).min(shape.k.div_ceil(64));
    GemmOptions {
        k_splits: KSplits::Fixed(splits),
        epilogue: EpilogueChoice::Auto,
        ..options
    }
}

/// One shape through weft and cuBLAS on the same inputs; every element compared. cuBLAS writes
/// fp32 (it has no mixed bf16-in / fp16-out GEMM), so the reference is unrounded and weft's
/// output is within half an ulp of its own dtype plus accumulation-order error of it.
fn versus_cublas<TI: GemmElement, TO: GemmElement>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    seed: u64,
) -> anyhow::Result<()> {
    launch_versus_cublas::<TI, TO>(&Gemm::new(ctx, shape, options)?, stream, seed)
}

/// One launch of `gemm` on fresh inputs from `seed`, every element against cuBLAS.
fn launch_versus_cublas<TI: GemmElement, TO: GemmElement>(
    gemm: &Gemm,
    stream: &Arc<CudaStream>,
    seed: u64,
) -> anyhow::Result<()> {
    let (shape, options) = (gemm.plan().shape, gemm.plan().options);
    let what = gemm.plan().describe();
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a = upload(stream, &uniform::<TI>(seed, m * k))?;
    let b = upload(stream, &uniform::<TI>(seed ^ 0xB, k * n))?;
    let (mut d, mut want) = if options.beta != 0.0 {
        let d0 = uniform::<TO>(seed ^ 0xD, m * n);
        let d0_f32: Vec<f32> = d0.iter().map(|x| x.to_f64() as f32).collect();
        (upload(stream, &d0)?, upload(stream, &d0_f32)?)
    } else {
        (
            poisoned::<TO>(stream, m * n)?,
            poisoned::<f32>(stream, m * n)?,
        )
    };
    gemm.launch(stream, &a, &b, &mut d)?;
    CublasGemm::new(
        stream,
        shape,
        GemmOptions {
            output: Dtype::F32,
            ..options
        },
    )?
    .launch(&a, &b, &mut want)?;
    stream
        .synchronize()
        .with_context(|| format!("running {what}"))?;
    gemm.check()?;
    let want: Vec<f64> = download(stream, &want)?.iter().map(|&x| x as f64).collect();
    check_all(
        &format!("weft vs cuBLAS, {what}"),
        shape,
        &download(stream, &d)?,
        &want,
        Tolerance::for_output(TO::DTYPE),
    )
    .map_err(anyhow::Error::from)
}

fn random_shapes_vs_cublas(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..RANDOM_SHAPES {
        let shape = random_shape(&mut rng, if i % 4 == 0 { 4096 } else { 1536 });
        let options = random_options(&mut rng, i);
        let options = with_random_splits(&mut rng, shape, options);
        let case_seed = rng.random();
        with_dtypes!(
            options.input,
            options.output,
            versus_cublas(&ctx, &stream, shape, options, case_seed)
        )
        .with_context(|| format!("case {i} (WEFT_SEED={seed})"))?;
    }
    Ok(())
}

fn versus_f64<TI: GemmElement, TO: GemmElement>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    seed: u64,
) -> anyhow::Result<()> {
    let gemm = Gemm::new(ctx, shape, options)?;
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a = uniform::<TI>(seed, m * k);
    let b = uniform::<TI>(seed ^ 0xB, k * n);
    let d0 = if options.beta != 0.0 {
        uniform::<TO>(seed ^ 0xD, m * n)
    } else {
        Vec::new()
    };
    let mut d = if options.beta != 0.0 {
        upload(stream, &d0)?
    } else {
        poisoned::<TO>(stream, m * n)?
    };
    gemm.launch(stream, &upload(stream, &a)?, &upload(stream, &b)?, &mut d)?;
    stream.synchronize()?;
    gemm.check()?;
    let want = gemm_f64(
        shape,
        options.b_layout,
        &a,
        &b,
        options.alpha as f64,
        options.beta as f64,
        &d0,
    );
    // Against exact products: half an ulp of rounding (within the one-ulp tolerance) plus fp32
    // accumulation error.
    check_all(
        &format!("weft vs float64, {}", gemm.plan().describe()),
        shape,
        &download(stream, &d)?,
        &want,
        Tolerance::for_output(TO::DTYPE),
    )
    .map_err(anyhow::Error::from)
}

fn small_shapes_vs_f64(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5A);
    let fixed = [
        GemmShape::new(16, 16, 16),
        GemmShape::new(128, 256, 64),
        GemmShape::new(144, 272, 80),
        GemmShape::new(400, 48, 528),
    ];
    for i in 0..14 {
        let shape = fixed
            .get(i)
            .copied()
            .unwrap_or_else(|| random_shape(&mut rng, 384));
        let options = random_options(&mut rng, i);
        let options = with_random_splits(&mut rng, shape, options);
        let case_seed = rng.random();
        with_dtypes!(
            options.input,
            options.output,
            versus_f64(&ctx, &stream, shape, options, case_seed)
        )
        .with_context(|| format!("case {i} {shape} (WEFT_SEED={seed})"))?;
    }
    Ok(())
}

fn schedule_matches_kernel(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    // (shape, sm_margin, tile, cluster_m); the last: 25 tile rows in clusters of 2, a phantom row.
    let cases = [
        (
            GemmShape::new(4096, 4096, 256),
            0u32,
            TileChoice::N256,
            1u32,
        ),
        (GemmShape::new(3088, 2576, 128), 8, TileChoice::N128, 1),
        (GemmShape::new(8192, 1024, 64), 31, TileChoice::Auto, 1),
        (GemmShape::new(4096, 4096, 256), 0, TileChoice::N256, 2),
        (GemmShape::new(3088, 2576, 128), 7, TileChoice::N256, 2),
    ];
    for (shape, sm_margin, tile, cluster_m) in cases {
        let gemm = Gemm::new(
            &ctx,
            shape,
            GemmOptions {
                sm_margin,
                tile,
                cluster_m,
                ..GemmOptions::default()
            },
        )?;
        let plan = gemm.plan().clone();
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let a = upload(&stream, &uniform::<bf16>(1, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(2, k * n))?;
        let mut d = poisoned::<bf16>(&stream, m * n)?;
        let mut trace = stream.alloc_zeros::<u32>(2 * plan.tiles() as usize)?;
        gemm.launch_with(
            &stream,
            &a,
            &b,
            &mut d,
            LaunchExtras {
                trace: Some(&mut trace),
                ..Default::default()
            },
        )?;
        stream.synchronize()?;
        gemm.check()?;
        // Per tile: (order + 1, CTA + 1) as the kernel stored it, against the host's listing.
        // The listing covers every tile exactly once (CPU test in weft-signal-gemm), so a tile
        // the kernel skipped shows as (0, 0) here.
        let got = stream.clone_dtoh(&trace)?;
        let mut want = vec![0u32; 2 * plan.tiles() as usize];
        for t in plan.schedule() {
            let i = (t.tm * plan.tiles_n() + t.tn) as usize;
            want[2 * i] = t.order + 1;
            want[2 * i + 1] = t.cta + 1;
        }
        let bad: Vec<String> = (0..plan.tiles() as usize)
            .filter(|&i| got[2 * i..2 * i + 2] != want[2 * i..2 * i + 2])
            .take(4)
            .map(|i| {
                format!(
                    "tile ({}, {}) stored at order {} by CTA {} (host lists order {}, CTA {})",
                    i as u32 / plan.tiles_n(),
                    i as u32 % plan.tiles_n(),
                    got[2 * i] as i64 - 1,
                    got[2 * i + 1] as i64 - 1,
                    want[2 * i] as i64 - 1,
                    want[2 * i + 1] as i64 - 1
                )
            })
            .collect();
        ensure!(
            bad.is_empty(),
            "{}: kernel schedule differs from the host's: {}",
            plan.describe(),
            bad.join("; ")
        );
    }
    Ok(())
}

fn communicator_copies_finished_tiles(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC0);
    let s = GemmShape::new;
    // fp32 output (pipelined epilogue), clusters of 1 and 2; bf16 output with the whole-tile
    // epilogue asked for (Auto picks pipelined), 128 x 256 tiles, clusters of 1 and 2.
    let cases = [
        (s(4096, 4096, 512), 1u32, Dtype::F32),
        (s(2064, 3056, 272), 1, Dtype::F32),
        (s(2064, 3056, 272), 2, Dtype::F32),
        (s(4096, 3072, 1024), 1, Dtype::Bf16),
        (s(2064, 3056, 272), 2, Dtype::Bf16),
        (s(4096, 4096, 512), 0, Dtype::Bf16), // cluster_m 0 here: 1, dynamically scheduled
    ];
    for (shape, cluster_m, output) in cases {
        let scheduling = if cluster_m == 0 {
            Scheduling::Dynamic
        } else {
            Scheduling::Static
        };
        let cluster_m = cluster_m.max(1);
        let whole = output == Dtype::Bf16;
        let options = GemmOptions {
            cluster_m,
            comm_ctas: 4,
            sm_margin: 0,
            output,
            scheduling,
            tile: if whole {
                TileChoice::N256
            } else {
                TileChoice::Auto
            },
            epilogue: if whole {
                EpilogueChoice::WholeTile
            } else {
                EpilogueChoice::Auto
            },
            ..GemmOptions::default()
        };
        let case_seed: u64 = rng.random();
        match output {
            Dtype::F32 => communicator_case::<f32>(&ctx, &stream, shape, options, case_seed)?,
            _ => communicator_case::<bf16>(&ctx, &stream, shape, options, case_seed)?,
        }
    }
    Ok(())
}

fn communicator_case<TO: GemmElement>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
    seed: u64,
) -> anyhow::Result<()> {
    let gemm = Gemm::new(ctx, shape, options)?;
    let what = gemm.plan().describe();
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    // Two input sets, alternated launch by launch: a tile copied before it was final (or from
    // the previous launch) differs from D.
    let inputs = [seed, seed ^ 0x77]
        .iter()
        .map(|&s| {
            Ok((
                upload(stream, &uniform::<bf16>(s, m * k))?,
                upload(stream, &uniform::<bf16>(s ^ 0xB, k * n))?,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut flags = TileFlags::new(stream, gemm.plan())?;
    let mut d = poisoned::<TO>(stream, m * n)?;
    let mut copy = poisoned::<TO>(stream, m * n)?;
    let bits = |x: &TO| x.to_f64().to_bits();
    for block in 0..COMM_LAUNCHES / 10 {
        crate::gemm_data::poison(stream, &mut d)?;
        crate::gemm_data::poison(stream, &mut copy)?;
        // Ten launches back to back: no synchronisation, flags never reset (epochs rise).
        for launch in 0..10 {
            let (a, b) = &inputs[(block + launch) % 2];
            let extras = LaunchExtras {
                flags: Some(&mut flags),
                copy_dst: Some(&mut copy),
                ..Default::default()
            };
            gemm.launch_with(stream, a, b, &mut d, extras)?;
        }
        stream.synchronize()?;
        gemm.check()?;
        let (got_d, got_copy) = (download(stream, &d)?, download(stream, &copy)?);
        let diff = got_d
            .iter()
            .zip(&got_copy)
            .position(|(x, y)| bits(x) != bits(y));
        ensure!(
            diff.is_none(),
            "{what}, block {block}: copy differs from D at element {diff:?} (flag target {})",
            flags.target()
        );
        let (a, b) = &inputs[(block + 9) % 2];
        let mut want = poisoned::<f32>(stream, m * n)?;
        CublasGemm::new(
            stream,
            shape,
            GemmOptions {
                output: Dtype::F32,
                ..options
            },
        )?
        .launch(a, b, &mut want)?;
        let want: Vec<f64> = download(stream, &want)?.iter().map(|&x| x as f64).collect();
        check_all(
            &format!("D with the communicator running, {what}"),
            shape,
            &got_d,
            &want,
            Tolerance::for_output(TO::DTYPE),
        )?;
    }
    Ok(())
}

fn dynamic_schedule_claims_every_tile(job: &mut Job) -> anyhow::Result<()> {
    const LAUNCHES: usize = 6;
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let cases = [
        (GemmShape::new(4096, 4096, 256), 0u32, TileChoice::N256),
        (GemmShape::new(3088, 2576, 128), 8, TileChoice::N128),
        (GemmShape::new(8192, 1024, 64), 31, TileChoice::Auto),
    ];
    for (shape, sm_margin, tile) in cases {
        let options = GemmOptions {
            sm_margin,
            tile,
            ..GemmOptions::default()
        };
        let dynamic = Gemm::new(
            &ctx,
            shape,
            GemmOptions {
                scheduling: Scheduling::Dynamic,
                ..options
            },
        )?;
        let fixed = Gemm::new(&ctx, shape, options)?;
        let plan = dynamic.plan().clone();
        let what = plan.describe();
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let a = upload(&stream, &uniform::<bf16>(seed, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(seed ^ 0xB, k * n))?;
        let mut want = poisoned::<bf16>(&stream, m * n)?;
        fixed.launch(&stream, &a, &b, &mut want)?;
        // Back to back, no synchronisation: each launch claims from where the previous one left
        // the counter. One D, trace and timeline per launch.
        let mut runs = Vec::new();
        for _ in 0..LAUNCHES {
            let mut d = poisoned::<bf16>(&stream, m * n)?;
            let mut trace = stream.alloc_zeros::<u32>(2 * plan.tiles() as usize)?;
            let mut timeline = stream.clone_htod(&[u64::MAX, 0])?;
            let extras = LaunchExtras {
                trace: Some(&mut trace),
                timeline: Some(&mut timeline),
                ..Default::default()
            };
            dynamic.launch_with(&stream, &a, &b, &mut d, extras)?;
            runs.push((d, trace, timeline));
        }
        stream.synchronize()?;
        dynamic.check()?;
        fixed.check()?;
        let want_bits: Vec<u16> = download(&stream, &want)?
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let mut order_of = vec![0u32; plan.tiles() as usize];
        for t in plan.schedule() {
            order_of[(t.tm * plan.tiles_n() + t.tn) as usize] = t.order;
        }
        for (launch, (d, trace, timeline)) in runs.iter().enumerate() {
            let got = stream.clone_dtoh(trace)?;
            let bad: Vec<String> = (0..plan.tiles() as usize)
                .filter(|&i| {
                    got[2 * i] != order_of[i] + 1
                        || got[2 * i + 1] == 0
                        || got[2 * i + 1] > plan.ctas()
                })
                .take(4)
                .map(|i| {
                    format!(
                        "tile {i}: order {} by CTA {} (host lists order {})",
                        got[2 * i] as i64 - 1,
                        got[2 * i + 1] as i64 - 1,
                        order_of[i]
                    )
                })
                .collect();
            ensure!(
                bad.is_empty(),
                "{what}, launch {launch}: {}",
                bad.join("; ")
            );
            let ctas_used = {
                let mut c: Vec<u32> = (0..plan.tiles() as usize).map(|i| got[2 * i + 1]).collect();
                c.sort_unstable();
                c.dedup();
                c.len()
            };
            ensure!(
                ctas_used > 1,
                "{what}, launch {launch}: one CTA stored every tile"
            );
            let got_bits: Vec<u16> = download(&stream, d)?.iter().map(|x| x.to_bits()).collect();
            let diff = got_bits.iter().zip(&want_bits).position(|(x, y)| x != y);
            ensure!(
                diff.is_none(),
                "{what}, launch {launch}: D differs from the static schedule's at element {diff:?}"
            );
            let tl = stream.clone_dtoh(timeline)?;
            ensure!(
                tl[0] != u64::MAX && tl[1] != 0 && tl[0] < tl[1],
                "{what}, launch {launch}: timeline start {} end {}",
                tl[0],
                tl[1]
            );
        }
        // The kernel really claimed: the device counter advanced by orders + CTAs per launch.
        let claims = dynamic
            .claim_counter(&stream)?
            .context("a dynamic GEMM has a claim counter")?;
        let want = (LAUNCHES as u64 * (plan.orders() + plan.ctas()) as u64) as u32;
        ensure!(claims == (want, want), "{what}: claim counter (device, host base) = {claims:?} after {LAUNCHES} launches, expected {want}");
        // A second stream is refused (its launches could overlap the first stream's).
        let other = ctx.new_stream()?;
        let mut d = poisoned::<bf16>(&other, m * n)?;
        let e = dynamic
            .launch(&other, &a, &b, &mut d)
            .err()
            .context("a launch on a second stream was accepted")?;
        ensure!(format!("{e:#}").contains("launches on one stream"), "{e:#}");
    }
    Ok(())
}

/// Split-K (the last split adds the others' partials, then resets the tile's flag): one Gemm per
/// case launched 3 times on fresh inputs, every element against cuBLAS each time — a flag not
/// reset lets the next launch read partials before they are written. Cases: an LLM-like small-M
/// shape, 16 splits of one or two K blocks over ragged tiles with dynamic scheduling, one K block
/// per split with fp32 output and beta (D read once, by the last split). Then a launch on a second
/// stream is refused (the partials are the Gemm's).
fn split_k_across_launches(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let cases = [
        (
            GemmShape::new(512, 1280, 8192),
            3,
            TileChoice::N128,
            Dtype::Bf16,
            Scheduling::Static,
            0.0,
        ),
        (
            GemmShape::new(400, 272, 1040),
            16,
            TileChoice::N256,
            Dtype::F16,
            Scheduling::Dynamic,
            0.0,
        ),
        (
            GemmShape::new(144, 4096, 192),
            3,
            TileChoice::N128,
            Dtype::F32,
            Scheduling::Static,
            0.5,
        ),
    ];
    for (i, (shape, splits, tile, output, scheduling, beta)) in cases.into_iter().enumerate() {
        let gemm = Gemm::new(
            &ctx,
            shape,
            GemmOptions {
                output,
                tile,
                scheduling,
                beta,
                k_splits: KSplits::Fixed(splits),
                ..GemmOptions::default()
            },
        )?;
        ensure!(
            gemm.plan().k_splits() == splits,
            "{}: planned {} splits, asked {splits}",
            gemm.plan().describe(),
            gemm.plan().k_splits()
        );
        for launch in 0..3u64 {
            with_dtypes!(
                Dtype::Bf16,
                output,
                launch_versus_cublas(&gemm, &stream, seed ^ (i as u64) << 8 ^ launch)
            )
            .with_context(|| format!("case {i}, launch {launch} (WEFT_SEED={seed})"))?;
        }
    }
    let gemm = Gemm::new(
        &ctx,
        GemmShape::new(256, 256, 512),
        GemmOptions {
            k_splits: KSplits::Fixed(2),
            ..GemmOptions::default()
        },
    )?;
    let a = upload(&stream, &uniform::<bf16>(1, 256 * 512))?;
    let b = upload(&stream, &uniform::<bf16>(2, 512 * 256))?;
    let mut d = poisoned::<bf16>(&stream, 256 * 256)?;
    gemm.launch(&stream, &a, &b, &mut d)?;
    let other = ctx.new_stream()?;
    let e = gemm
        .launch(&other, &a, &b, &mut d)
        .err()
        .context("a split-K launch on a second stream was accepted")?;
    ensure!(format!("{e:#}").contains("launches on one stream"), "{e:#}");
    stream.synchronize()?;
    gemm.check().map_err(anyhow::Error::from)
}

/// The name of `e`'s kind, for trials that check it.
pub(super) fn gemm_error_kind(e: &GemmError) -> &'static str {
    match e {
        GemmError::Shape(_) => "Shape",
        GemmError::Length(_) => "Length",
        GemmError::Options(_) => "Options",
        GemmError::Unsupported(_) => "Unsupported",
        GemmError::RanksDisagree(_) => "RanksDisagree",
        GemmError::Setting { .. } => "Setting",
        GemmError::Wait(_) => "Wait",
        GemmError::Pgl(_) => "Pgl",
        GemmError::Runtime(_) => "Runtime",
    }
}

fn bad_inputs_are_rejected(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(256, 256, 128);
    let gemm = Gemm::new(&ctx, shape, GemmOptions::default())?;
    let a = upload(&stream, &uniform::<bf16>(1, 256 * 128))?;
    let b = upload(&stream, &uniform::<bf16>(2, 256 * 128))?;
    let short_b = upload(&stream, &uniform::<bf16>(2, 256 * 127))?;
    let a16 = upload(&stream, &uniform::<f16>(1, 256 * 128))?;
    let b16 = upload(&stream, &uniform::<f16>(2, 256 * 128))?;
    let mut d = poisoned::<bf16>(&stream, 256 * 256)?;
    let mut d32 = poisoned::<f32>(&stream, 256 * 256)?;
    // Each refusal typed (the kind a caller matches on) and worded.
    let expect = |r: Result<(), GemmError>, kind: &str, needle: &str| -> anyhow::Result<()> {
        let e = r
            .err()
            .with_context(|| format!("expected an error containing {needle:?}"))?;
        ensure!(
            gemm_error_kind(&e) == kind,
            "expected GemmError::{kind}, got {e:?}"
        );
        let e = format!("{e:#}");
        ensure!(
            e.contains(needle),
            "error {e:?} does not mention {needle:?}"
        );
        Ok(())
    };
    expect(
        gemm.launch(&stream, &a, &short_b, &mut d),
        "Length",
        "B buffer too small",
    )?;
    expect(
        gemm.launch(&stream, &a16, &b16, &mut d),
        "Options",
        "planned for bf16 inputs, given f16",
    )?;
    expect(
        gemm.launch(&stream, &a, &b, &mut d32),
        "Options",
        "planned for bf16 output, given a f32",
    )?;
    // 128 x 192 tiles have plain kernels only: a fused launch (here: with a trace) is refused.
    let plain_only = Gemm::new(
        &ctx,
        shape,
        GemmOptions {
            tile: TileChoice::N192,
            ..GemmOptions::default()
        },
    )?;
    let mut trace = stream.alloc_zeros::<u32>(2 * plain_only.plan().tiles() as usize)?;
    expect(
        plain_only.launch_with(
            &stream,
            &a,
            &b,
            &mut d,
            LaunchExtras {
                trace: Some(&mut trace),
                ..Default::default()
            },
        ),
        "Options",
        "128x192 tiles have plain kernels only, and this GEMM is launched with fusions",
    )?;
    expect(
        Gemm::new(&ctx, GemmShape::new(256, 250, 128), GemmOptions::default()).map(drop),
        "Shape",
        "n = 250 is not a multiple of 16",
    )?;
    expect(
        Gemm::new(
            &ctx,
            shape,
            GemmOptions {
                cluster_m: 2,
                scheduling: Scheduling::Dynamic,
                ..GemmOptions::default()
            },
        )
        .map(drop),
        "Options",
        "dynamic scheduling needs cluster_m 1",
    )?;
    // Nothing was launched by the rejected calls: D is still all poison.
    ensure!(
        download(&stream, &d)?.iter().all(|x| x.to_f64().is_nan()),
        "a rejected launch wrote D"
    );
    Ok(())
}
