//! weft's standalone collectives (`weft_collectives::Collectives`) on the caller's own device
//! buffers: AllReduce, ReduceScatter and AllGather of `n` f32 values per rank, every element
//! checked exactly against a host reference (small integers: their sums are exact in f32), then
//! each call timed back to back.
//!
//! Run one rank per GPU: `weft launch -n 2 -- target/release/weft-example-collectives`, or under
//! mpirun / srun / torchrun. Optional argument: elements per rank (default 1048576, 4 MiB).

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_collectives::{Collectives, Options};
use weft_pgl::gpu;
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;

/// Rank `rank`'s value at `i`: a small integer (−8 ..= 7) from a hash of `i` (no period, so
/// that blocks of a longer buffer differ), different per rank.
fn value(rank: usize, i: usize) -> f32 {
    let h = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60;
    ((h as usize + rank * 13) % 16) as f32 - 8.0
}

/// Elements of `got` that differ from `want` (exact comparison: the sums are exact).
fn wrong(got: &[f32], want: impl Fn(usize) -> f32) -> usize {
    got.iter()
        .enumerate()
        .filter(|&(i, &g)| g != want(i))
        .count()
}

/// Seconds per call of `call` on `stream`, by the host clock over `runs` calls after a warm-up.
fn time(
    stream: &Arc<CudaStream>,
    runs: u32,
    mut call: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    call()?;
    stream.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..runs {
        call()?;
    }
    stream.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() / f64::from(runs))
}

fn main() -> anyhow::Result<()> {
    // weft's warnings (e.g. a PGL dropped without free on an early return) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let n: usize = match std::env::args().nth(1) {
        None => 1 << 20,
        Some(t) => t
            .parse()
            .map_err(|e| anyhow::anyhow!("elements per rank {t:?}: {e}"))?,
    };
    anyhow::ensure!(n > 0, "elements per rank must be at least 1");
    let env = RankEnv::from_env()?;
    let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
    let (rank, world) = (rdzv.rank(), rdzv.world());
    let ctx = CudaContext::new(gpu::device_for_rank(
        &env,
        CudaContext::device_count()? as usize,
    )?)?;
    let stream = ctx.new_stream()?;

    // Collective: staging and round flags on every rank, launches on `stream`.
    let mut coll = Collectives::new(&mut rdzv, &stream, Options::default())?;
    let mine: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
    let input: CudaSlice<f32> = stream.clone_htod(&mine)?;
    // AllReduce: every rank gets Σ_r value(r, i).
    let mut summed = stream.alloc_zeros::<f32>(n)?;
    coll.all_reduce(&input, &mut summed)?;
    // ReduceScatter of world · n elements: rank q gets Σ_r of block q of every rank's input.
    let long: Vec<f32> = (0..world * n).map(|i| value(rank, i)).collect();
    let long_in = stream.clone_htod(&long)?;
    let mut scattered = stream.alloc_zeros::<f32>(n)?;
    coll.reduce_scatter(&long_in, &mut scattered)?;
    // AllGather: every rank gets every rank's input, in rank order.
    let mut gathered = stream.alloc_zeros::<f32>(world * n)?;
    coll.all_gather(&input, &mut gathered)?;
    coll.synchronize()?;

    let sum_at = |i: usize| (0..world).map(|r| value(r, i)).sum::<f32>();
    let bad = wrong(&stream.clone_dtoh(&summed)?, sum_at)
        + wrong(&stream.clone_dtoh(&scattered)?, |i| sum_at(rank * n + i))
        + wrong(&stream.clone_dtoh(&gathered)?, |i| value(i / n, i % n));
    let checked = weft_pgl::agree(
        &mut rdzv,
        "checking the collectives",
        if bad == 0 {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "{bad} of {} elements differ from the host reference",
                (world + 2) * n
            ))
        },
    );

    // Back to back, as a model runs them (each call enqueues only).
    let runs = 50;
    let ar = time(&stream, runs, || Ok(coll.all_reduce(&input, &mut summed)?))?;
    let rs = time(&stream, runs, || {
        Ok(coll.reduce_scatter(&long_in, &mut scattered)?)
    })?;
    let ag = time(
        &stream,
        runs,
        || Ok(coll.all_gather(&input, &mut gathered)?),
    )?;
    coll.synchronize()?;
    let bytes = (n * size_of::<f32>()) as f64;
    // nccl-tests' bus bandwidth: AllReduce 2(w−1)/w, ReduceScatter and AllGather (w−1)/w of the
    // per-rank message (AllReduce: n elements; the others: world · n).
    let frac = (world - 1) as f64 / world as f64;
    println!(
        "rank {rank}/{world}: {n} f32 per rank: all-reduce {:.1} µs ({:.0} GB/s bus), \
         reduce-scatter {:.1} µs ({:.0} GB/s), all-gather {:.1} µs ({:.0} GB/s) per call \
         (host clock over {runs} calls); results {}",
        ar * 1e6,
        2.0 * frac * bytes / ar / 1e9,
        rs * 1e6,
        frac * bytes * world as f64 / rs / 1e9,
        ag * 1e6,
        frac * bytes * world as f64 / ag / 1e9,
        if checked.is_ok() { "exact" } else { "WRONG" }
    );
    coll.free(&mut rdzv)?;
    checked
}
