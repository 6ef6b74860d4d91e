//! GEMM + ReduceScatter as one call (`weft_signal_gemm::ops`): every rank r computes A_r · B_rᵀ
//! (A m × k, B n × k, bf16) and receives rows [r·m/world, (r+1)·m/world) of the sum over ranks.
//! `Auto` measures the methods at first use (cuBLAS then NCCL among them) and keeps the fastest
//! in the per-user choice cache; the op is planned once and launched many times.
//!
//! Run one rank per GPU: `weft launch -n 2 -- target/release/weft-example-gemm-reduce-scatter`,
//! or under mpirun / srun / torchrun. Optional argument: the shape, `MxNxK` (default 4096x8192x2048).

use cudarc::driver::CudaContext;
use half::bf16;
use std::time::{Duration, Instant};
use weft_pgl::gpu;
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;
use weft_signal_gemm::ops::{GemmReduceScatter, MethodChoice, OverlapEnv};
use weft_signal_gemm::{GemmOptions, GemmShape};

/// Rank `rank`'s operand `which` (0: A, 1: B): small integers, the same on every rank that
/// regenerates it, so each rank can compute the reference of its rows on the host.
fn operand(rank: usize, which: u64, len: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ ((rank as u64) << 32) ^ which;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % 5) as f32 - 2.0 // -2 ..= 2: exact in bf16, products and sums exact in f32
        })
        .collect()
}

fn parse_shape(arg: Option<String>) -> anyhow::Result<GemmShape> {
    let text = arg.unwrap_or_else(|| "4096x8192x2048".into());
    let dims: Vec<u32> = text
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("shape {text:?}: {e} (expected MxNxK)"))?;
    anyhow::ensure!(dims.len() == 3, "shape {text:?}: expected MxNxK");
    Ok(GemmShape::new(dims[0], dims[1], dims[2]))
}

fn main() -> anyhow::Result<()> {
    // weft's warnings (e.g. a PGL dropped without free on an early return) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let shape = parse_shape(std::env::args().nth(1))?;
    let env = RankEnv::from_env()?;
    let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
    let (rank, world) = (rdzv.rank(), rdzv.world());
    let ctx = CudaContext::new(gpu::device_for_rank(
        &env,
        CudaContext::device_count()? as usize,
    )?)?;
    // The ops run work on their own streams beside the caller's and order it with their own
    // events; cudarc's per-buffer event tracking would serialise them (the ops refuse to plan
    // with it on).
    // SAFETY: this program uses its buffers on `stream` only, and synchronises it before
    // reading results or freeing anything.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream()?;
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    anyhow::ensure!(m % world == 0, "{shape}: M must split over {world} ranks");

    // This rank's A (m × k) and B (n × k, the weight layout: D = A · Bᵀ), the caller's buffers.
    let to_bf16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let a = stream.clone_htod(&to_bf16(operand(rank, 0, m * k)))?;
    let b = stream.clone_htod(&to_bf16(operand(rank, 1, n * k)))?;

    // Collective: NCCL communicator and choice cache once per process; the op once per shape.
    let mut overlap = OverlapEnv::new(&mut rdzv, &ctx)?;
    let started = Instant::now();
    let mut op = GemmReduceScatter::<bf16>::plan(
        &mut rdzv,
        &mut overlap,
        &stream,
        shape,
        GemmOptions::default(),
        &MethodChoice::Auto,
        false,
    )?;
    let planned_s = started.elapsed().as_secs_f64();

    // Launch many times (enqueue only); time a few.
    op.launch(&stream, &a, &b)?;
    stream.synchronize()?;
    let runs = 20;
    let t0 = Instant::now();
    for _ in 0..runs {
        op.launch(&stream, &a, &b)?;
    }
    stream.synchronize()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
    let got: Vec<bf16> = stream.clone_dtoh(&op.output())?;

    // Host reference for 16 of this rank's rows spread over its band: Σ_r A_r[row] · B_rᵀ
    // (exact in f32: small integers). Each rank's partial may be rounded to bf16 before the sum
    // (the fused method adds bf16 tiles at the owner), so the bound is the benches':
    // world · 2⁻⁷ · Σ_r |partial_r| per element.
    let band = m / world;
    let checked: Vec<usize> = (0..16.min(band)).map(|i| i * band / 16.min(band)).collect();
    let mut wrong = 0usize;
    let operands: Vec<(Vec<f32>, Vec<f32>)> = (0..world)
        .map(|r| (operand(r, 0, m * k), operand(r, 1, n * k)))
        .collect();
    for &i in &checked {
        let row = rank * band + i;
        for j in 0..n {
            let (mut sum, mut bound) = (0f32, 0f32);
            for (ar, br) in &operands {
                let dot: f32 = ar[row * k..(row + 1) * k]
                    .iter()
                    .zip(&br[j * k..(j + 1) * k])
                    .map(|(x, y)| x * y)
                    .sum();
                sum += dot;
                bound += dot.abs();
            }
            let g = got[i * n + j].to_f32();
            if (g - sum).abs() > world as f32 * bound / 128.0 || !g.is_finite() {
                wrong += 1;
            }
        }
    }
    let failed = weft_pgl::agree(
        &mut rdzv,
        "checking the rows",
        if wrong == 0 {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "{wrong} of {} checked elements beyond the bound of the host reference",
                checked.len() * n
            ))
        },
    );
    println!(
        "rank {rank}/{world}: {shape} by {} (planned in {planned_s:.1} s), {ms:.3} ms per call \
         (host clock over {runs} launches); {} of rows {}..{}: {}",
        op.method(),
        checked.len(),
        rank * band,
        (rank + 1) * band,
        if failed.is_ok() {
            "within the bound of the host reference"
        } else {
            "WRONG"
        }
    );
    op.free(&mut rdzv)?;
    failed
}
