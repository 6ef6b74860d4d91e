//! KernelBarrier (`weft_barrier`): a persistent GEMM launched on the compute stream takes every
//! SM, so a communication kernel launched after it on another stream waits until the GEMM ends.
//! With the barrier, a one-thread wait kernel holds the GEMM back until the communication kernel
//! has arrived (it is running), and the two overlap. Here the communication is a GroupCast ring
//! (`weft_grpcoll`, each rank's rows to the next rank, on 8 SMs, arriving on the barrier), the
//! compute weft's GEMM with dynamic scheduling (its CTAs that start late run fewer tiles).
//!
//! Both orders are timed (host clock around both streams, after a warm-up), and both results
//! checked: the cast's rows exactly, 8 rows of the GEMM against a host reference (small integers:
//! exact in its f32 output).
//!
//! Run one rank per GPU: `weft launch -n 2 -- target/release/weft-example-kernel-barrier`, or
//! under mpirun / srun / torchrun.

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_barrier::KernelBarrier;
use weft_grpcoll::{GroupCast, GroupCastMeta, Options};
use weft_pgl::gpu;
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;
use weft_signal_gemm::{BLayout, Dtype, Gemm, GemmOptions, GemmShape, Scheduling};

/// The GEMM (about 0.7 ms on an H200) and the cast (16384 rows of 4096 bf16: 128 MiB).
const SHAPE: (u32, u32, u32) = (8192, 8192, 4096);
const ROWS: usize = 16384;
const ROW_ELEMS: usize = 4096;
const CAST_SMS: u32 = 8;

/// A small integer (−2 ..= 2) for element `i` of operand `which` of rank `rank` (ranks below
/// five differ at every element).
fn small(rank: usize, which: usize, i: usize) -> f32 {
    ((i * 7 + which * 3 + rank * 2) % 5) as f32 - 2.0
}

/// Milliseconds per round of `round`, rounds back to back (both streams synchronised before the
/// first and after the last; a round's cast may still run when the next round's GEMM starts).
fn time(
    streams: &[&Arc<CudaStream>],
    rounds: u32,
    mut round: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    round()?;
    for s in streams {
        s.synchronize()?;
    }
    let t0 = Instant::now();
    for _ in 0..rounds {
        round()?;
    }
    for s in streams {
        s.synchronize()?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3 / f64::from(rounds))
}

fn main() -> anyhow::Result<()> {
    // weft's warnings (e.g. a PGL dropped without free on an early return) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let env = RankEnv::from_env()?;
    let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
    let (rank, world) = (rdzv.rank(), rdzv.world());
    let ctx = CudaContext::new(gpu::device_for_rank(
        &env,
        CudaContext::device_count()? as usize,
    )?)?;
    // Two streams share nothing here; cudarc's per-buffer events would only add waits.
    // SAFETY: every buffer is used on one stream, and both are synchronised before any read.
    unsafe { ctx.disable_event_tracking() };
    let compute = ctx.new_stream()?;
    let comm = ctx.new_stream()?;

    // The GEMM: D (f32) = A · Bᵀ (B n × k, the weight layout), dynamic scheduling.
    let (m, n, k) = SHAPE;
    let shape = GemmShape::new(m, n, k);
    let options = GemmOptions {
        output: Dtype::F32,
        b_layout: BLayout::NxK,
        scheduling: Scheduling::Dynamic,
        cluster_m: 1,
        ..GemmOptions::default()
    };
    let gemm = Gemm::new(&ctx, shape, options)?;
    let (mu, nu, ku) = (m as usize, n as usize, k as usize);
    let host_a: Vec<f32> = (0..mu * ku).map(|i| small(rank, 0, i)).collect();
    let host_b: Vec<f32> = (0..nu * ku).map(|i| small(rank, 1, i)).collect();
    let to_bf16 = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let a: CudaSlice<bf16> = compute.clone_htod(&to_bf16(&host_a))?;
    let b: CudaSlice<bf16> = compute.clone_htod(&to_bf16(&host_b))?;
    let mut d = compute.alloc_zeros::<f32>(mu * nu)?;

    // The cast: every rank sends its ROWS rows to the next rank (collective plan, comm stream).
    let meta = GroupCastMeta {
        input_rows: ROWS,
        input_split_rows: vec![ROWS],
        dst_indices: vec![vec![(rank + 1) % world]],
        output_rows: ROWS,
        output_split_rows: vec![ROWS],
        src_index: vec![(rank + world - 1) % world],
    };
    let opts = Options {
        sms: Some(CAST_SMS),
        ..Options::default()
    };
    let mut cast = GroupCast::<bf16>::new(&mut rdzv, &comm, &meta, ROW_ELEMS, opts)?;
    let sent = |r: usize, i: usize| bf16::from_f32(small(r, 2, i));
    cast.input().copy_from_host(
        &(0..ROWS * ROW_ELEMS)
            .map(|i| sent(rank, i))
            .collect::<Vec<_>>(),
    )?;

    // Compute first, comm second, no barrier: the cast waits for SMs.
    let plain = time(&[&compute, &comm], 10, || {
        gemm.launch(&compute, &a, &b, &mut d)?;
        Ok(cast.run()?)
    })?;
    // The same order with the barrier: the GEMM waits until the cast has arrived.
    let mut bar = KernelBarrier::new(&ctx)?;
    cast.set_kernel_barrier(Some(bar.view()));
    let ordered = time(&[&compute, &comm], 10, || {
        let target = bar.expect(1)?;
        bar.wait(&compute, target)?;
        gemm.launch(&compute, &a, &b, &mut d)?;
        Ok(cast.run()?)
    })?;
    cast.synchronize()?;
    compute.synchronize()?;
    bar.check()?;
    // Each alone, for the ideal max(T_gemm, T_cast).
    let gemm_ms = time(&[&compute], 10, || {
        Ok(gemm.launch(&compute, &a, &b, &mut d)?)
    })?;
    // Alone, the cast arrives on no barrier (arrivals nobody expects would run the counter ahead
    // of the host's total).
    cast.set_kernel_barrier(None);
    let cast_ms = time(&[&comm], 10, || Ok(cast.run()?))?;
    cast.synchronize()?;

    // Checks: the previous rank's rows, exactly; 8 rows of D against the host.
    let prev = (rank + world - 1) % world;
    let mut got = vec![bf16::ZERO; ROWS * ROW_ELEMS];
    cast.output().copy_to_host(&mut got)?;
    let mut bad = got
        .iter()
        .enumerate()
        .filter(|&(i, &g)| g != sent(prev, i))
        .count();
    let dh: Vec<f32> = compute.clone_dtoh(&d)?;
    // Eight rows at different offsets within their 128-row tiles.
    for row in (0..8).map(|r| r * mu / 8 + (r * 37) % 128) {
        for col in 0..nu {
            let want: f32 = (0..ku)
                .map(|j| host_a[row * ku + j] * host_b[col * ku + j])
                .sum();
            bad += usize::from(dh[row * nu + col] != want);
        }
    }
    let checked = weft_pgl::agree(
        &mut rdzv,
        "checking the cast and the GEMM",
        if bad == 0 {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "{bad} elements differ from the host reference"
            ))
        },
    );
    println!(
        "rank {rank}/{world}: GEMM {shape} {gemm_ms:.3} ms, cast of {} MiB {cast_ms:.3} ms alone; \
         rounds of GEMM then cast {plain:.3} ms each without the barrier, {ordered:.3} ms with it \
         (ideal {:.3}); results {}",
        (ROWS * ROW_ELEMS * 2) >> 20,
        gemm_ms.max(cast_ms),
        if checked.is_ok() { "exact" } else { "WRONG" }
    );
    cast.free(&mut rdzv)?;
    checked
}
