//! signal-gemm II: the tile-order reorder map and its restore, wave-group signals, and GEMM +
//! AllReduce overlapped with NCCL, checked against independent paths (the standard-layout GEMM
//! bit for bit; cuBLAS then ncclAllReduce within a derived bf16 bound; CPU add / RMSNorm).

use super::gemm::gemm_error_kind;
use super::gpu;
use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::reduce_check::{check_within, sum_bound};
use crate::trials::Case;
use crate::word_compare::WordCompare;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use weft_pgl::nccl::ReduceOp;
use weft_signal_gemm::overlap::AllReduceOverlap;
use weft_signal_gemm::{
    BLayout, CublasGemm, Dtype, EpilogueChoice, Gemm, GemmElement, GemmError, GemmOptions,
    GemmPlan, GemmShape, GroupCounters, KSplits, LaunchExtras, OutputLayout, Restore, Scheduling,
    TileChoice, TileOrderMap, WaveGroups,
};
use weft_sync::WaitBudget;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "overlap::tile_order_round_trip_is_bitwise",
            tile_order_round_trip,
        ),
        Case::gpu(
            "overlap::restore_fused_add_and_rmsnorm_match_cpu",
            fused_restore,
        ),
        Case::gpu(
            "overlap::all_reduce_matches_cublas_then_nccl",
            all_reduce_vs_sequential,
        ),
        Case::gpu("overlap::all_reduce_stress_back_to_back", |j| {
            all_reduce_stress(
                j,
                GemmOptions {
                    tile: TileChoice::N128,
                    sm_margin: 100,
                    ..GemmOptions::default()
                },
            )
        }),
        Case::gpu("overlap::all_reduce_stress_whole_tile_epilogue", |j| {
            all_reduce_stress(
                j,
                GemmOptions {
                    tile: TileChoice::N256,
                    epilogue: EpilogueChoice::WholeTile,
                    sm_margin: 110,
                    ..GemmOptions::default()
                },
            )
        }),
        Case::gpu("overlap::all_reduce_stress_dynamic_schedule", |j| {
            let dynamic = Scheduling::Dynamic;
            all_reduce_stress(
                j,
                GemmOptions {
                    tile: TileChoice::N128,
                    sm_margin: 100,
                    scheduling: dynamic,
                    ..GemmOptions::default()
                },
            )
        }),
        Case::gpu("overlap::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// Group waits in trials give up after 5 s (a missing signal then fails fast, with a report).
pub(super) const TRIAL_WAIT: Duration = Duration::from_secs(5);

/// A random shape (multiples of 16, mostly ragged against the tiles) and options that give
/// several waves on small shapes (a large sm_margin).
pub(super) fn random_case(rng: &mut StdRng, max: u32, output: Dtype) -> (GemmShape, GemmOptions) {
    let mut dim = |max: u32| 16 * rng.random_range(1..=max / 16);
    let shape = GemmShape::new(dim(max), dim(max), dim(max / 2));
    let cluster_m = rng.random_range(1..=2);
    let tile = [TileChoice::Auto, TileChoice::N128, TileChoice::N256][rng.random_range(0..3)];
    let options = GemmOptions {
        output,
        b_layout: if rng.random_bool(0.5) {
            BLayout::NxK
        } else {
            BLayout::KxN
        },
        tile,
        // Auto picks pipelined: whole-tile (its wide and band stores) asked for where the kernel
        // has it, half the time.
        epilogue: if tile == TileChoice::N256 && output != Dtype::F32 && rng.random_bool(0.5) {
            EpilogueChoice::WholeTile
        } else {
            EpilogueChoice::Auto
        },
        sm_margin: rng.random_range(8..=124),
        cluster_m,
        scheduling: if cluster_m == 1 && rng.random_bool(0.5) {
            Scheduling::Dynamic
        } else {
            Scheduling::Static
        },
        // Whole tiles: the reordered launches run them so, and the standard-layout GEMM they are
        // compared with bit for bit must add in the same order (split-K adds the K ranges apart).
        k_splits: KSplits::Fixed(1),
        ..GemmOptions::default()
    };
    (shape, options)
}

/// A random partition of the plan's waves (1 to 32 groups).
pub(super) fn random_groups(rng: &mut StdRng, plan: &GemmPlan) -> Vec<u32> {
    let waves = plan.waves();
    let mut sizes = Vec::new();
    let mut left = waves;
    while left > 0 {
        let max = if sizes.len() == 31 { left } else { left.min(4) };
        let w = rng.random_range(1..=max);
        sizes.push(w);
        left -= w;
    }
    sizes
}

pub(super) fn with_budget(
    mut counters: GroupCounters,
    ctx: &Arc<CudaContext>,
) -> anyhow::Result<GroupCounters> {
    counters.set_budget(WaitBudget::for_device(ctx, TRIAL_WAIT)?);
    Ok(counters)
}

/// The GEMM stored in tile order and restored equals the standard-layout GEMM bit for bit, for
/// every output dtype, tile, cluster and schedule; every slot is written (poison gone) and the
/// rows and columns a ragged tile lacks hold exactly 0; each group's counter reaches its target
/// (the waits return) twice in a row (the waits rearm them).
fn tile_order_round_trip(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?.wrapping_add(job.rank() as u64);
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cmp = WordCompare::load(&stream)?;
    for i in 0..12 {
        let output = [Dtype::Bf16, Dtype::F16, Dtype::F32][i % 3];
        let (shape, options) = random_case(&mut rng, 1024, output);
        match output {
            Dtype::Bf16 => round_trip::<bf16>(
                &ctx,
                &stream,
                &mut cmp,
                &mut rng,
                shape,
                options,
                seed + i as u64,
            ),
            Dtype::F16 => round_trip::<f16>(
                &ctx,
                &stream,
                &mut cmp,
                &mut rng,
                shape,
                options,
                seed + i as u64,
            ),
            Dtype::F32 => round_trip::<f32>(
                &ctx,
                &stream,
                &mut cmp,
                &mut rng,
                shape,
                options,
                seed + i as u64,
            ),
        }
        .map_err(|e| e.context(format!("case {i}: {shape} {options:?} seed {seed}")))?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn round_trip<TO: GemmElement>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    cmp: &mut WordCompare,
    rng: &mut StdRng,
    shape: GemmShape,
    options: GemmOptions,
    seed: u64,
) -> anyhow::Result<()> {
    let gemm = Gemm::new(ctx, shape, options)?;
    let plan = gemm.plan().clone();
    let groups = WaveGroups::new(&plan, &random_groups(rng, &plan))?;
    let counters = with_budget(GroupCounters::new(stream, groups.clone(), 0)?, ctx)?;
    let map = TileOrderMap::new(stream, &plan)?;
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    for round in 0..2u64 {
        let a = upload(stream, &uniform::<bf16>(seed ^ (round << 40), m * k))?;
        let b = upload(stream, &uniform::<bf16>(seed ^ (round << 40) ^ 1, k * n))?;
        let mut standard = poisoned::<TO>(stream, m * n)?;
        gemm.launch(stream, &a, &b, &mut standard)?;
        let mut staging = poisoned::<TO>(stream, OutputLayout::TileOrder.elements(&plan) as usize)?;
        let extras = LaunchExtras {
            groups: Some(&counters),
            layout: OutputLayout::TileOrder,
            ..Default::default()
        };
        gemm.launch_with(stream, &a, &b, &mut staging, extras)?;
        for g in 0..groups.count() {
            counters.wait(stream, g)?;
        }
        let mut back = poisoned::<TO>(stream, m * n)?;
        map.restore(stream, &staging, &mut back, Restore::Copy)?;
        stream.synchronize()?;
        gemm.check()?;
        counters.check()?;
        if let Some(d) = cmp.differ(stream, &standard, &back)? {
            anyhow::bail!(
                "round {round}, groups {groups}: restored output differs from the standard layout in {} words (first word {})",
                d.words,
                d.first_word
            );
        }
        check_slots(&download(stream, &staging)?, &plan)?;
    }
    Ok(())
}

/// Every slot of a TILE_ORDER buffer: finite where the tile has data, exactly 0 where it has none.
fn check_slots<T: GemmElement>(staging: &[T], plan: &GemmPlan) -> anyhow::Result<()> {
    let (tm_, tn_) = (plan.tile_m() as usize, plan.tile_n() as usize);
    let (m, n) = (plan.shape.m as usize, plan.shape.n as usize);
    let real: std::collections::HashMap<u32, (usize, usize)> = plan
        .schedule()
        .iter()
        .map(|t| (t.order, (t.tm as usize, t.tn as usize)))
        .collect();
    for order in 0..plan.orders() {
        let (rows, cols) = match real.get(&order) {
            Some(&(tm, tn)) => ((m - tm * tm_).min(tm_), (n - tn * tn_).min(tn_)),
            None => (0, 0), // a phantom: all zeros
        };
        for r in 0..tm_ {
            for c in 0..tn_ {
                let v = staging[(order as usize * tm_ + r) * tn_ + c].to_f64();
                let inside = r < rows && c < cols;
                anyhow::ensure!(
                    if inside { v.is_finite() } else { v == 0.0 },
                    "slot of order {order}: element ({r}, {c}) is {v} ({} the tile's {rows} x {cols} data)",
                    if inside { "inside" } else { "outside" }
                );
            }
        }
    }
    Ok(())
}

/// Restore fused with a residual add (bit-exact against the CPU: one fp32 add, one rounding) and
/// with RMSNorm (within one bf16 ulp of a float64 CPU RMSNorm of the same bf16 inputs).
fn fused_restore(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?.wrapping_add(job.rank() as u64);
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..4u64 {
        let (shape, options) = random_case(&mut rng, 1024, Dtype::Bf16);
        let gemm = Gemm::new(&ctx, shape, options)?;
        let plan = gemm.plan().clone();
        let map = TileOrderMap::new(&stream, &plan)?;
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let a = upload(&stream, &uniform::<bf16>(seed + 10 * i, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(seed + 10 * i + 1, k * n))?;
        let residual_h = uniform::<bf16>(seed + 10 * i + 2, m * n);
        let gamma_h = uniform::<bf16>(seed + 10 * i + 3, n);
        let (residual, gamma) = (upload(&stream, &residual_h)?, upload(&stream, &gamma_h)?);
        let mut standard = poisoned::<bf16>(&stream, m * n)?;
        gemm.launch(&stream, &a, &b, &mut standard)?;
        let mut staging =
            poisoned::<bf16>(&stream, OutputLayout::TileOrder.elements(&plan) as usize)?;
        let extras = LaunchExtras {
            layout: OutputLayout::TileOrder,
            ..Default::default()
        };
        gemm.launch_with(&stream, &a, &b, &mut staging, extras)?;
        let mut added = poisoned::<bf16>(&stream, m * n)?;
        map.restore(
            &stream,
            &staging,
            &mut added,
            Restore::ResidualAdd {
                residual: &residual,
            },
        )?;
        let mut normed = poisoned::<bf16>(&stream, m * n)?;
        let eps = 1e-5f32;
        let with_residual = i % 2 == 0;
        let step = Restore::RmsNorm {
            residual: with_residual.then_some(&residual),
            gamma: &gamma,
            eps,
        };
        map.restore(&stream, &staging, &mut normed, step)?;
        let x = download(&stream, &standard)?;
        let (added, normed) = (download(&stream, &added)?, download(&stream, &normed)?);
        gemm.check()?;
        for idx in 0..m * n {
            let want = bf16::from_f32(x[idx].to_f32() + residual_h[idx].to_f32());
            anyhow::ensure!(
                added[idx].to_bits() == want.to_bits(),
                "case {i} {shape}: residual add at ({}, {}) gave {}, the CPU {}",
                idx / n,
                idx % n,
                added[idx],
                want
            );
        }
        for row in 0..m {
            let v: Vec<f64> = (0..n)
                .map(|c| {
                    let s = x[row * n + c].to_f32() as f64;
                    if with_residual {
                        (x[row * n + c].to_f32() + residual_h[row * n + c].to_f32()) as f64
                    } else {
                        s
                    }
                })
                .collect();
            let scale = 1.0 / (v.iter().map(|t| t * t).sum::<f64>() / n as f64 + eps as f64).sqrt();
            for c in 0..n {
                let want = v[c] * scale * gamma_h[c].to_f64();
                let got = normed[row * n + c].to_f64();
                anyhow::ensure!(
                    (got - want).abs() <= want.abs() / 128.0 + 1e-6,
                    "case {i} {shape}: RMSNorm (residual {with_residual}) at ({row}, {c}) gave {got}, float64 CPU {want}"
                );
            }
        }
    }
    Ok(())
}

/// The sequential reference: cuBLAS, then ncclAllReduce, with its per-element bound
/// (reduce_check.rs).
pub(super) struct Reference {
    pub want: Vec<bf16>,
    pub bound: Vec<f32>,
}

pub(super) fn reference(
    job: &mut Job,
    shape: GemmShape,
    options: GemmOptions,
    a: &CudaSlice<bf16>,
    b: &CudaSlice<bf16>,
) -> anyhow::Result<Reference> {
    let stream = gpu(job)?.1;
    let n_out = (shape.m * shape.n) as usize;
    let cublas = CublasGemm::new(&stream, shape, options)?;
    let mut partial = poisoned::<bf16>(&stream, n_out)?;
    cublas.launch(a, b, &mut partial)?;
    let mut reduced = poisoned::<bf16>(&stream, n_out)?;
    job.comm()?
        .all_reduce(&partial, &mut reduced, ReduceOp::Sum, &stream)?;
    let bound = sum_bound(job, &stream, &partial, shape.k)?;
    Ok(Reference {
        want: download(&stream, &reduced)?,
        bound,
    })
}

fn check_reduced(what: &str, got: &[bf16], r: &Reference, n: usize) -> anyhow::Result<()> {
    check_within(
        &format!("{what} (against cuBLAS + NCCL)"),
        got,
        &r.want,
        &r.bound,
        n,
    )
}

/// GEMM + AllReduce through signals equals cuBLAS then ncclAllReduce on every element, for random
/// ragged shapes, tiles, clusters, schedules and wave groupings, twice per plan (fresh inputs).
fn all_reduce_vs_sequential(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let rank = job.rank();
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed); // the same shapes and groups on every rank
    for i in 0..8u64 {
        let (shape, options) = random_case(&mut rng, 2048, Dtype::Bf16);
        let plan = GemmPlan::new(weft_signal_gemm::device_sms(&ctx)?, shape, options)?;
        let parts = random_groups(&mut rng, &plan);
        let ov = AllReduceOverlap::new(&stream, shape, options, Some(&parts), rank as u32)?;
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        for round in 0..2u64 {
            let s = seed ^ (i << 20) ^ (round << 40) ^ ((rank as u64) << 50);
            let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
            let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
            let r = reference(job, shape, options, &a, &b)?;
            let (comm, _) = job.comm_and_gpu()?;
            let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
            let mut out = poisoned::<bf16>(&stream, m * n)?;
            ov.run(&stream, comm, &a, &b, &mut staging, &mut out, Restore::Copy)?;
            stream.synchronize()?;
            ov.check()?;
            let what = format!(
                "case {i} round {round}: {} groups {} seed {seed}",
                ov.gemm().plan().describe(),
                ov.groups()
            );
            check_reduced(&what, &download(&stream, &out)?, &r, n)?;
        }
    }
    Ok(())
}

pub(super) const STRESS_ITERATIONS: usize = 10_000;

/// 10⁴ back-to-back overlapped GEMM + AllReduce runs with no host synchronisation, alternating
/// two input sets whose results differ, the staging buffer poisoned (NaN) before every run: each
/// output is compared on the GPU, bit for bit, with the verified first result of its input set.
/// A stale read (the other set's data) or an early one (poison) shows as a difference.
fn all_reduce_stress(job: &mut Job, options: GemmOptions) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let rank = job.rank();
    let (_ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(2048, 1024, 128);
    let ov = AllReduceOverlap::new(&stream, shape, options, None, rank as u32)?;
    anyhow::ensure!(
        ov.groups().count() >= 3,
        "stress plan {} has {} groups",
        ov.gemm().plan().describe(),
        ov.groups().count()
    );
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let mut inputs = Vec::new();
    let mut verified = Vec::new();
    let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
    for set in 0..2u64 {
        let s = seed ^ (set << 40) ^ ((rank as u64) << 50);
        let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
        let r = reference(job, shape, options, &a, &b)?;
        let (comm, _) = job.comm_and_gpu()?;
        let mut out = poisoned::<bf16>(&stream, m * n)?;
        ov.run(&stream, comm, &a, &b, &mut staging, &mut out, Restore::Copy)?;
        stream.synchronize()?;
        ov.check()?;
        check_reduced(
            &format!("stress input set {set}"),
            &download(&stream, &out)?,
            &r,
            n,
        )?;
        inputs.push((a, b));
        verified.push(out);
    }
    let (comm, _) = job.comm_and_gpu()?;
    back_to_back(&stream, &verified, |it, out| {
        poison_bf16(&stream, &mut staging)?;
        let (a, b) = &inputs[it % 2];
        ov.run(&stream, comm, a, b, &mut staging, out, Restore::Copy)
            .map_err(anyhow::Error::from)
    })?;
    ov.check().map_err(anyhow::Error::from)
}

/// STRESS_ITERATIONS runs of `run(iteration, out)` with no host synchronisation, each writing
/// `out` (poisoned first), compared on the GPU word for word with `verified[iteration % 2]`:
/// an error if any run's output differed.
pub(super) fn back_to_back(
    stream: &Arc<CudaStream>,
    verified: &[CudaSlice<bf16>],
    mut run: impl FnMut(usize, &mut CudaSlice<bf16>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut cmp = WordCompare::load(stream)?;
    cmp.reset(stream)?;
    let mut out = poisoned::<bf16>(stream, verified[0].len())?;
    for it in 0..STRESS_ITERATIONS {
        poison_bf16(stream, &mut out)?;
        run(it, &mut out)?;
        cmp.enqueue(stream, &out, &verified[it % 2])?;
    }
    if let Some(d) = cmp.take(stream)? {
        anyhow::bail!("{STRESS_ITERATIONS} back-to-back runs: {} words differed from the verified results (first word {})", d.words, d.first_word);
    }
    Ok(())
}

/// NaN (0x7FC0) into every element, in stream order.
pub(super) fn poison_bf16(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<bf16>,
) -> anyhow::Result<()> {
    let len = buf.len();
    let (ptr, _g) = buf.device_ptr_mut(stream);
    // SAFETY: `len` 16-bit elements at `ptr`, on the buffer's stream.
    unsafe { sys::cuMemsetD16Async(ptr, 0x7FC0, len, stream.cu_stream()) }.result()?;
    Ok(())
}

/// Misuse gets an error that names it.
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let rank = job.rank() as u32;
    let (ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(1024, 1024, 256);
    let options = GemmOptions {
        sm_margin: 100,
        ..GemmOptions::default()
    };
    // Each refusal typed (the kind a caller matches on) and worded.
    let expect = |r: Result<(), GemmError>, needle: &str, kind: &str| -> anyhow::Result<()> {
        match r {
            Ok(()) => anyhow::bail!("accepted; expected an error containing {needle:?}"),
            Err(e) if gemm_error_kind(&e) != kind => {
                anyhow::bail!("expected GemmError::{kind}, got {e:?}")
            }
            Err(e) if format!("{e:#}").contains(needle) => Ok(()),
            Err(e) => anyhow::bail!("error {e:#} does not mention {needle:?}"),
        }
    };
    expect(
        AllReduceOverlap::new(
            &stream,
            shape,
            GemmOptions {
                beta: 1.0,
                ..options
            },
            None,
            rank,
        )
        .map(|_| ()),
        "beta",
        "Options",
    )?;
    let gemm = Gemm::new(&ctx, shape, options)?;
    let plan = gemm.plan().clone();
    expect(
        WaveGroups::new(&plan, &[plan.waves() + 1]).map(|_| ()),
        "cover",
        "Options",
    )?;
    let a = poisoned::<bf16>(&stream, 1024 * 256)?;
    let b = poisoned::<bf16>(&stream, 1024 * 256)?;
    let mut standard = poisoned::<bf16>(&stream, 1024 * 1024)?;
    let tile_order_len = OutputLayout::TileOrder.elements(&plan) as usize;
    let mut too_small = poisoned::<bf16>(&stream, tile_order_len - 1)?;
    expect(
        gemm.launch_with(
            &stream,
            &a,
            &b,
            &mut too_small,
            LaunchExtras {
                layout: OutputLayout::TileOrder,
                ..Default::default()
            },
        ),
        "too small",
        "Length",
    )?;
    let other = GemmPlan::new(plan.sms, GemmShape::new(2048, 1024, 256), options)?;
    let foreign = GroupCounters::new(&stream, WaveGroups::uniform(&other, 1)?, rank)?;
    expect(
        gemm.launch_with(
            &stream,
            &a,
            &b,
            &mut standard,
            LaunchExtras {
                groups: Some(&foreign),
                ..Default::default()
            },
        ),
        "another plan",
        "Options",
    )?;
    let beta_gemm = Gemm::new(
        &ctx,
        shape,
        GemmOptions {
            beta: 1.0,
            ..options
        },
    )?;
    let mut staging = poisoned::<bf16>(&stream, tile_order_len)?;
    expect(
        beta_gemm.launch_with(
            &stream,
            &a,
            &b,
            &mut staging,
            LaunchExtras {
                layout: OutputLayout::TileOrder,
                ..Default::default()
            },
        ),
        "beta = 0",
        "Options",
    )?;
    let map = TileOrderMap::new(&stream, &plan)?;
    let mut out16 = poisoned::<f16>(&stream, 1024 * 1024)?;
    let staging16 = poisoned::<f16>(&stream, tile_order_len)?;
    expect(
        map.restore(&stream, &staging16, &mut out16, Restore::Copy),
        "output is bf16",
        "Options",
    )?;
    expect(
        map.restore(
            &stream,
            &staging,
            &mut standard,
            Restore::RmsNorm {
                residual: None,
                gamma: &a,
                eps: f32::NAN,
            },
        ),
        "eps",
        "Options",
    )?;
    let ov = AllReduceOverlap::new(&stream, shape, options, None, rank)?;
    let (comm, _) = job.comm_and_gpu()?;
    expect(
        ov.run(
            &stream,
            comm,
            &a,
            &b,
            &mut too_small,
            &mut standard,
            Restore::Copy,
        ),
        "staging buffer",
        "Length",
    )?;
    // Refused before anything is enqueued: the next run still works.
    let bad_norm = Restore::RmsNorm {
        residual: None,
        gamma: &a,
        eps: -1.0,
    };
    expect(
        ov.run(&stream, comm, &a, &b, &mut staging, &mut standard, bad_norm),
        "eps",
        "Options",
    )?;
    ov.run(
        &stream,
        comm,
        &a,
        &b,
        &mut staging,
        &mut standard,
        Restore::Copy,
    )?;
    stream.synchronize()?;
    ov.check()?;
    Ok(())
}
