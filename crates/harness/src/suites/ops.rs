//! The overlapped ops (`weft_signal_gemm::ops`): every family of each op, and `Auto`, on random
//! shapes, fresh random inputs (and, for the All-to-All, a random routing), each result (poisoned before the launch, launched twice) checked
//! element by element on the GPU against the sequential path (cuBLAS, then NCCL) within the bound
//! its dtype allows; a capturable `Auto` op captured into a CUDA graph and replayed; misuse
//! refused with a message naming the problem. Needs NCCL: one rank per GPU.

use super::gemm::gemm_error_kind;
use super::gpu;
use crate::bound_compare::{Bound, BoundCompare};
use crate::data::shared_seed;
use crate::gemm_data::{poisoned, uniform, upload};
use crate::job::Job;
use crate::trials::{Case, Skip};
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DeviceSlice};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use weft_pgl::nccl::Communicator;
use weft_signal_gemm::ops::{
    candidates, AllGatherGemm, AutoPolicy, ChoiceCache, GemmAllReduce, GemmAllToAll,
    GemmReduceScatter, Method, MethodChoice, OpKind, OverlapEnv,
};
use weft_signal_gemm::{device_sms, CublasGemm, Dtype, GemmError, GemmOptions, GemmShape};

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "ops::all_reduce_every_family_and_auto_match_the_sequential_path",
            |j| every_family(j, OpKind::AllReduce),
        ),
        Case::gpu(
            "ops::reduce_scatter_every_family_and_auto_match_the_sequential_path",
            |j| every_family(j, OpKind::ReduceScatter),
        ),
        Case::gpu(
            "ops::all_gather_every_family_and_auto_match_the_sequential_path",
            |j| every_family(j, OpKind::AllGather),
        ),
        Case::gpu(
            "ops::all_to_all_every_family_and_auto_match_the_sequential_path",
            |j| every_family(j, OpKind::AllToAll),
        ),
        Case::gpu(
            "ops::capturable_auto_replays_from_a_graph",
            capturable_replays,
        ),
        Case::gpu("ops::misuse_is_refused", misuse),
    ]
}

/// A fresh environment (its own communicator, an in-memory cache: every trial measures anew,
/// briefly).
pub(super) fn test_env(job: &mut Job) -> anyhow::Result<(Arc<CudaStream>, OverlapEnv)> {
    if let Some(why) = job.shared_gpu() {
        return Err(Skip(why.to_string()).into());
    }
    let (ctx, stream) = gpu(job)?;
    let comm = Communicator::new(&mut job.rdzv, &ctx)?;
    let mut env =
        OverlapEnv::with_communicator(&mut job.rdzv, &ctx, comm, ChoiceCache::in_memory())?;
    env.set_policy(AutoPolicy {
        warmup: 1,
        iters: 3,
        budget: Duration::from_secs(60),
    });
    Ok((stream, env))
}

/// A shape every method of every op can run on `world` ranks: m a multiple of 128 per rank (the
/// fused AllGather's shards), n of 128, k of 64.
fn random_shape(rng: &mut StdRng, world: u32) -> GemmShape {
    GemmShape::new(
        world * 128 * rng.random_range(1..=4),
        128 * rng.random_range(2..=12),
        64 * rng.random_range(2..=16),
    )
}

/// Overwrites `len` bf16 elements at `ptr` with NaN.
fn poison_raw(stream: &Arc<CudaStream>, ptr: u64, len: usize) -> anyhow::Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: `ptr` holds `len` 16-bit elements on this context; stream-ordered.
    unsafe { sys::cuMemsetD16Async(ptr, 0xFFFF, len, stream.cu_stream()) }.result()?;
    Ok(())
}

/// A device copy of an op's result.
fn copy_of(
    stream: &Arc<CudaStream>,
    src: &impl DevicePtr<bf16>,
) -> anyhow::Result<CudaSlice<bf16>> {
    let mut dst = poisoned::<bf16>(stream, src.len())?;
    let (ps, _g) = src.device_ptr(stream);
    let (pd, _h) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut dst, stream);
    // SAFETY: both hold src.len() bf16; stream-ordered.
    unsafe { sys::cuMemcpyDtoDAsync_v2(pd, ps, 2 * src.len(), stream.cu_stream()) }.result()?;
    drop(_h);
    stream.synchronize()?;
    Ok(dst)
}

/// Per element of Σ over ranks of this rank's product A·B: Σ_r |partial_r| (f32), for the bound
/// world · 2⁻⁷ · Σ_r |partial_r| of two bf16 paths to the same sum (see reduce_check.rs).
fn abs_sum(
    env: &OverlapEnv,
    stream: &Arc<CudaStream>,
    cmp: &BoundCompare,
    shape: GemmShape,
    a: &CudaSlice<bf16>,
    b: &CudaSlice<bf16>,
) -> anyhow::Result<CudaSlice<f32>> {
    let mut partial = poisoned::<bf16>(stream, (shape.m * shape.n) as usize)?;
    CublasGemm::new(stream, shape, GemmOptions::default())?.launch(a, b, &mut partial)?;
    let comm = env
        .comm()
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned communicator"))?;
    cmp.abs_sum_over_ranks(&comm, stream, &partial)
}

/// The first candidate of every family `Auto` would consider at `shape` (and the first
/// copy-engine AllGather with a fixed tile width), then `Auto` itself.
fn choices(
    env: &OverlapEnv,
    kind: OpKind,
    shape: GemmShape,
    world: u32,
) -> anyhow::Result<Vec<MethodChoice>> {
    let sms = device_sms(env.context())?;
    let mut out: Vec<MethodChoice> = Vec::new();
    let all = candidates(kind, shape, GemmOptions::default(), world, sms, false);
    for m in &all {
        if !out
            .iter()
            .any(|c| matches!(c, MethodChoice::Exact(x) if x.family() == m.family()))
        {
            out.push(MethodChoice::Exact(m.clone()));
        }
    }
    if let Some(m) = all.iter().find(|m| {
        matches!(
            m,
            Method::FusedCe {
                tile_n: Some(_),
                ..
            }
        )
    }) {
        out.push(MethodChoice::Exact(m.clone()));
    }
    out.push(MethodChoice::Auto);
    Ok(out)
}

fn every_family(job: &mut Job, kind: OpKind) -> anyhow::Result<()> {
    let (stream, mut env) = test_env(job)?;
    let (rank, world) = (job.rank(), job.world() as u32);
    let seed = shared_seed(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cmp = BoundCompare::load(&stream)?;
    let base = GemmOptions::default();
    for case in 0..2 {
        let shape = random_shape(&mut rng, world);
        let GemmShape { m, n, k } = shape;
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let mine = seed ^ ((rank as u64 + 1) << 32) ^ case;
        let list = if case == 0 {
            choices(&env, kind, shape, world)?
        } else {
            vec![MethodChoice::Auto]
        };
        let what = |c: &MethodChoice, method: &Method| {
            format!(
                "seed {seed}: {} {shape} {c} (ran {method}) against cuBLAS then NCCL",
                kind.title()
            )
        };
        match kind {
            OpKind::AllReduce | OpKind::ReduceScatter => {
                let a = upload(&stream, &uniform::<bf16>(mine, mu * ku))?;
                let b = upload(&stream, &uniform::<bf16>(mine ^ 1, ku * nu))?;
                let abs = abs_sum(&env, &stream, &cmp, shape, &a, &b)?;
                let rows = if kind == OpKind::ReduceScatter {
                    mu / world as usize
                } else {
                    mu
                };
                let first = if kind == OpKind::ReduceScatter {
                    rank * rows
                } else {
                    0
                };
                let bound_rows = abs.slice(first * nu..(first + rows) * nu);
                let bound_rows = {
                    let mut b = stream.alloc_zeros::<f32>(rows * nu)?;
                    stream.memcpy_dtod(&bound_rows, &mut b)?;
                    b
                };
                // Plus each partial's fp32 accumulation order (k · 2⁻¹⁸ for |a|, |b| ≤ 1, as the
                // AllGather's bound): two GEMMs summing a product whose terms cancel can differ
                // by more than 2⁻⁷ of that small result.
                let bound = Bound {
                    per_element: Some((&bound_rows, world as f32 / 128.0)),
                    rel: 0.0,
                    abs: world as f32 * ku as f32 / 262_144.0,
                };
                // The sequential path's result, the reference.
                let reference = match kind {
                    OpKind::AllReduce => {
                        let mut op = GemmAllReduce::<bf16>::plan(
                            &mut job.rdzv,
                            &mut env,
                            &stream,
                            shape,
                            base,
                            &MethodChoice::Exact(Method::SeqCublas),
                            false,
                        )?;
                        op.launch(&stream, &a, &b)?;
                        op.synchronize()?;
                        let r = copy_of(&stream, &op.output())?;
                        op.free(&mut job.rdzv)?;
                        r
                    }
                    _ => {
                        let mut op = GemmReduceScatter::<bf16>::plan(
                            &mut job.rdzv,
                            &mut env,
                            &stream,
                            shape,
                            base,
                            &MethodChoice::Exact(Method::SeqCublas),
                            false,
                        )?;
                        op.launch(&stream, &a, &b)?;
                        op.synchronize()?;
                        let r = copy_of(&stream, &op.output())?;
                        op.free(&mut job.rdzv)?;
                        r
                    }
                };
                for c in &list {
                    let checked = if kind == OpKind::AllReduce {
                        let mut op = GemmAllReduce::<bf16>::plan(
                            &mut job.rdzv,
                            &mut env,
                            &stream,
                            shape,
                            base,
                            c,
                            false,
                        )?;
                        let r = (|| {
                            for _ in 0..2 {
                                poison_raw(
                                    &stream,
                                    op.output().device_address(),
                                    op.output().len(),
                                )?;
                                op.launch(&stream, &a, &b)?;
                            }
                            op.synchronize()?;
                            cmp.check(
                                &stream,
                                &what(c, op.method()),
                                &op.output(),
                                &reference,
                                &bound,
                                nu,
                            )
                        })();
                        let freed = op.free(&mut job.rdzv);
                        r.and(freed.map_err(anyhow::Error::from))
                    } else {
                        let mut op = GemmReduceScatter::<bf16>::plan(
                            &mut job.rdzv,
                            &mut env,
                            &stream,
                            shape,
                            base,
                            c,
                            false,
                        )?;
                        let r = (|| {
                            anyhow::ensure!(
                                op.rows() == (first as u32, rows as u32),
                                "rows {:?}, expected ({first}, {rows})",
                                op.rows()
                            );
                            for _ in 0..2 {
                                poison_raw(
                                    &stream,
                                    op.output().device_address(),
                                    op.output().len(),
                                )?;
                                op.launch(&stream, &a, &b)?;
                            }
                            op.synchronize()?;
                            cmp.check(
                                &stream,
                                &what(c, op.method()),
                                &op.output(),
                                &reference,
                                &bound,
                                nu,
                            )
                        })();
                        let freed = op.free(&mut job.rdzv);
                        r.and(freed.map_err(anyhow::Error::from))
                    };
                    weft_pgl::agree(&mut job.rdzv, &format!("{} {c}", kind.title()), checked)?;
                }
            }
            OpKind::AllToAll => {
                let a = upload(&stream, &uniform::<bf16>(mine, mu * ku))?;
                let b = upload(&stream, &uniform::<bf16>(mine ^ 1, ku * nu))?;
                // Every rank's routing, the same on every rank (drawn from the shared seed).
                let mut routing = StdRng::seed_from_u64(seed ^ 0xa2a ^ case);
                let routes: Vec<Vec<u32>> = (0..world)
                    .map(|_| (0..m).map(|_| routing.random_range(0..world)).collect())
                    .collect();
                let bound = Bound {
                    per_element: None,
                    rel: 1.0 / 128.0,
                    abs: k as f32 / 262_144.0,
                };
                let reference = {
                    let mut op = GemmAllToAll::<bf16>::plan(
                        &mut job.rdzv,
                        &mut env,
                        &stream,
                        shape,
                        base,
                        &routes,
                        &MethodChoice::Exact(Method::SeqCublas),
                        false,
                    )?;
                    op.launch(&stream, &a, &b)?;
                    op.synchronize()?;
                    let r = copy_of(&stream, &op.output())?;
                    op.free(&mut job.rdzv)?;
                    r
                };
                for c in &list {
                    let mut op = GemmAllToAll::<bf16>::plan(
                        &mut job.rdzv,
                        &mut env,
                        &stream,
                        shape,
                        base,
                        &routes,
                        c,
                        false,
                    )?;
                    let r = (|| {
                        let rows = routes
                            .iter()
                            .flatten()
                            .filter(|&&d| d as usize == rank)
                            .count();
                        anyhow::ensure!(
                            op.rows() == rows,
                            "{} rows received, {rows} routed here",
                            op.rows()
                        );
                        for _ in 0..2 {
                            poison_raw(&stream, op.output().device_address(), op.output().len())?;
                            op.launch(&stream, &a, &b)?;
                        }
                        op.synchronize()?;
                        cmp.check(
                            &stream,
                            &what(c, op.method()),
                            &op.output(),
                            &reference,
                            &bound,
                            nu,
                        )
                    })();
                    let freed = op.free(&mut job.rdzv);
                    weft_pgl::agree(
                        &mut job.rdzv,
                        &format!("{} {c}", kind.title()),
                        r.and(freed.map_err(anyhow::Error::from)),
                    )?;
                }
            }
            OpKind::AllGather => {
                let shard = upload(&stream, &uniform::<bf16>(mine, mu / world as usize * ku))?;
                let b = upload(&stream, &uniform::<bf16>(mine ^ 1, ku * nu))?;
                // Two GEMMs of the same rows round differently by at most an ulp of bf16 (2⁻⁷
                // relative), plus fp32 accumulation order (k · 2⁻¹⁸ for |a|, |b| ≤ 1, generous).
                let bound = Bound {
                    per_element: None,
                    rel: 1.0 / 128.0,
                    abs: k as f32 / 262_144.0,
                };
                let mut reference = poisoned::<bf16>(&stream, mu * nu)?;
                {
                    let mut op = AllGatherGemm::<bf16>::plan(
                        &mut job.rdzv,
                        &mut env,
                        &stream,
                        shape,
                        base,
                        &MethodChoice::Exact(Method::SeqCublas),
                        false,
                    )?;
                    op.copy_shard(&stream, &shard)?;
                    op.launch(&stream, &b, &mut reference)?;
                    op.synchronize()?;
                    op.free(&mut job.rdzv)?;
                }
                for c in &list {
                    let mut op = AllGatherGemm::<bf16>::plan(
                        &mut job.rdzv,
                        &mut env,
                        &stream,
                        shape,
                        base,
                        c,
                        false,
                    )?;
                    let r = (|| {
                        let mut d = poisoned::<bf16>(&stream, mu * nu)?;
                        for _ in 0..2 {
                            op.copy_shard(&stream, &shard)?;
                            op.launch(&stream, &b, &mut d)?;
                        }
                        op.synchronize()?;
                        cmp.check(&stream, &what(c, op.method()), &d, &reference, &bound, nu)
                    })();
                    let freed = op.free(&mut job.rdzv);
                    weft_pgl::agree(
                        &mut job.rdzv,
                        &format!("{} {c}", kind.title()),
                        r.and(freed.map_err(anyhow::Error::from)),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// `Auto` planned capturable, its launch captured once and replayed on two input sets (written
/// into the captured inputs between replays), each checked against cuBLAS then NCCL.
fn capturable_replays(job: &mut Job) -> anyhow::Result<()> {
    let (stream, mut env) = test_env(job)?;
    let (rank, world) = (job.rank(), job.world() as u32);
    let seed = shared_seed(job)?;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xca97);
    let shape = random_shape(&mut rng, world);
    let (mu, nu, ku) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let mut cmp = BoundCompare::load(&stream)?;
    let base = GemmOptions::default();
    let mut op = GemmAllReduce::<bf16>::plan(
        &mut job.rdzv,
        &mut env,
        &stream,
        shape,
        base,
        &MethodChoice::Auto,
        true,
    )?;
    anyhow::ensure!(
        op.method().family().capturable(),
        "a capturable Auto chose {}",
        op.method()
    );
    let mut a = poisoned::<bf16>(&stream, mu * ku)?;
    let mut b = poisoned::<bf16>(&stream, ku * nu)?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = op.launch(&stream, &a, &b);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or_else(|| anyhow::anyhow!("the capture produced no graph"))?;
    let mut reference = GemmAllReduce::<bf16>::plan(
        &mut job.rdzv,
        &mut env,
        &stream,
        shape,
        base,
        &MethodChoice::Exact(Method::SeqCublas),
        false,
    )?;
    for set in 0..2u64 {
        let mine = seed ^ ((rank as u64 + 1) << 32) ^ (set << 20);
        stream.memcpy_htod(&uniform::<bf16>(mine, mu * ku), &mut a)?;
        stream.memcpy_htod(&uniform::<bf16>(mine ^ 1, ku * nu), &mut b)?;
        poison_raw(&stream, op.output().device_address(), op.output().len())?;
        graph.launch()?;
        stream.synchronize()?;
        reference.launch(&stream, &a, &b)?;
        let want = copy_of(&stream, &reference.output())?;
        let abs = abs_sum(&env, &stream, &cmp, shape, &a, &b)?;
        // As every_family's: plus each partial's accumulation order.
        let bound = Bound {
            per_element: Some((&abs, world as f32 / 128.0)),
            rel: 0.0,
            abs: world as f32 * ku as f32 / 262_144.0,
        };
        let what = format!(
            "seed {seed}: replay {set} of a captured {} ({}) against cuBLAS then NCCL",
            shape,
            op.method()
        );
        let r = cmp.check(&stream, &what, &op.output(), &want, &bound, nu);
        weft_pgl::agree(&mut job.rdzv, "checking a replay", r)?;
    }
    drop(graph);
    reference.free(&mut job.rdzv)?;
    op.free(&mut job.rdzv).map_err(anyhow::Error::from)
}

/// `r` must be refused as `GemmError::{kind}`, the text naming `needle`.
fn expect_err(
    what: &str,
    r: Result<(), GemmError>,
    kind: &str,
    needle: &str,
) -> anyhow::Result<()> {
    match r {
        Ok(()) => anyhow::bail!("{what}: accepted, expected an error naming {needle:?}"),
        Err(e) => {
            anyhow::ensure!(
                gemm_error_kind(&e) == kind,
                "{what}: expected GemmError::{kind}, got {e:?}"
            );
            let text = format!("{e:#}");
            anyhow::ensure!(
                text.contains(needle),
                "{what}: the error {text:?} does not name {needle:?}"
            );
            Ok(())
        }
    }
}

fn misuse(job: &mut Job) -> anyhow::Result<()> {
    let (stream, mut env) = test_env(job)?;
    let shape = GemmShape::new(256 * job.world() as u32, 512, 256);
    let base = GemmOptions::default();
    let seq = MethodChoice::Exact(Method::SeqCublas);
    // Output dtype disagreeing with the options (every rank alike: a collective refusal).
    let r = GemmAllReduce::<bf16>::plan(
        &mut job.rdzv,
        &mut env,
        &stream,
        shape,
        GemmOptions {
            output: Dtype::F32,
            ..base
        },
        &seq,
        false,
    )
    .map(|_| ());
    expect_err(
        "an f32 GEMM output for a bf16 op",
        r,
        "Options",
        "GemmOptions::output is f32",
    )?;
    // A fused method asked to be capturable.
    let r = GemmAllReduce::<bf16>::plan(
        &mut job.rdzv,
        &mut env,
        &stream,
        shape,
        base,
        &MethodChoice::Exact(Method::DistFuse { workers: 8 }),
        true,
    )
    .map(|_| ());
    expect_err(
        "distfuse planned capturable",
        r,
        "Options",
        "cannot be replayed from a CUDA graph",
    )?;
    // A method of another op.
    let r = GemmReduceScatter::<bf16>::plan(
        &mut job.rdzv,
        &mut env,
        &stream,
        shape,
        base,
        &MethodChoice::Exact(Method::DistFuse { workers: 8 }),
        false,
    )
    .map(|_| ());
    expect_err(
        "distfuse for a ReduceScatter",
        r,
        "Options",
        "not a method of GEMM + ReduceScatter",
    )?;
    // Ranks asking for different shapes.
    let odd = GemmShape::new(shape.m, if job.rank() == 0 { 512 } else { 640 }, 256);
    if job.world() > 1 {
        let r =
            GemmAllReduce::<bf16>::plan(&mut job.rdzv, &mut env, &stream, odd, base, &seq, false)
                .map(|_| ());
        expect_err(
            "ranks asking for different shapes",
            r,
            "RanksDisagree",
            "ranks asked for different ops",
        )?;
    }
    // Launches: a short A, another stream, another input dtype.
    let mut op =
        GemmAllReduce::<bf16>::plan(&mut job.rdzv, &mut env, &stream, shape, base, &seq, false)?;
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a = poisoned::<bf16>(&stream, m * k)?;
    let b = poisoned::<bf16>(&stream, k * n)?;
    let short = poisoned::<bf16>(&stream, m * k - 1)?;
    expect_err(
        "a short A",
        op.launch(&stream, &short, &b),
        "Length",
        "A holds",
    )?;
    let other = stream.context().new_stream()?;
    expect_err(
        "another stream",
        op.launch(&other, &a, &b),
        "Options",
        "another stream",
    )?;
    let a16 = poisoned::<half::f16>(&stream, m * k)?;
    let b16 = poisoned::<half::f16>(&stream, k * n)?;
    expect_err(
        "f16 inputs for a bf16 plan",
        op.launch(&stream, &a16, &b16),
        "Options",
        "planned for bf16 inputs",
    )?;
    op.free(&mut job.rdzv)?;
    // A fused launch under capture is refused before anything is recorded.
    let mut fused = GemmAllReduce::<bf16>::plan(
        &mut job.rdzv,
        &mut env,
        &stream,
        shape,
        base,
        &MethodChoice::Exact(Method::FusedInter { ctas: 8 }),
        false,
    )?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = fused.launch(&stream, &a, &b);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    expect_err(
        "a fused launch under capture",
        captured,
        "Options",
        "cannot be captured",
    )?;
    drop(graph);
    fused.free(&mut job.rdzv).map_err(anyhow::Error::from)
}
