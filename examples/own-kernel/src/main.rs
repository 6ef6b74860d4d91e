//! A kernel of your own on weft's primitives (ring_put.cu, compiled by build.rs against the
//! headers weft-kernels exports): every rank writes into the next rank's memory through a PGL,
//! signals it with weft-sync, waits for the previous rank's signal and checks its data.
//!
//! Run one rank per GPU: `weft launch -n 2 -- target/release/weft-example-own-kernel`, or under
//! mpirun / srun / torchrun (weft reads their rank variables).

use cudarc::driver::{sys, CudaContext, LaunchConfig, PushKernelArg};
use std::time::Duration;
use weft_kernels::Cubin;
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;
use weft_pgl::{gpu, Backend, Pgl, Shape};
use weft_sync::{sync_checked, Counters, WaitBudget};

/// This crate's own kernel, compiled by build.rs.
const RING_PUT: Cubin = Cubin {
    source: "examples/own-kernel/ring_put.cu",
    image: include_bytes!(concat!(env!("OUT_DIR"), "/ring_put.cubin")),
};

/// Must match value() in ring_put.cu.
fn value(writer: usize, i: u32) -> f32 {
    (writer as i32 * 100_000 + i as i32) as f32
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
    let stream = ctx.new_stream()?;

    let n: u32 = 1 << 20;
    let data: Pgl<f32> = Pgl::alloc(&mut rdzv, &ctx, Shape::new(1, 1, 1, n), Backend::default())?;
    let mut bar = Counters::alloc(
        &mut rdzv,
        &ctx,
        Shape::new(1, 1, 1, 1),
        WaitBudget::default_for(&ctx)?,
    )?;
    let mut wrong = stream.alloc_zeros::<u32>(1)?;

    let f = RING_PUT.load(&ctx)?.load_function("ring_put")?;
    let base = bar.begin(1);
    let (counters, view) = (bar.device()?, data.view());
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the argument list matches ring_put's; the views' buffers hold n floats (data) and
    // one counter (bar) on every rank and outlive the launch.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&counters)
            .arg(&base)
            .arg(&view)
            .arg(&n)
            .arg(&mut wrong)
            .launch(cfg)?
    };
    // A wait that gave up is reported from the counters' error slot, naming what it waited for.
    sync_checked(&stream, &[bar.slot()])?;
    let wrong = stream.clone_dtoh(&wrong)?[0];

    // Check a few values on the host too, from this rank's buffer.
    let prev = (rank + world - 1) % world;
    let mut host = vec![0f32; n as usize];
    ctx.bind_to_thread()?;
    // SAFETY: copies this rank's n-float buffer into a host vector of n floats (the kernel is done).
    unsafe { sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), data.local_ptr(), 4 * n as usize) }
        .result()?;
    let spot = [0, n / 2, n - 1]
        .iter()
        .all(|&i| host[i as usize] == value(prev, i));

    // Nobody frees while a peer may still read: free is collective.
    rdzv.barrier()?;
    data.free(&mut rdzv)?;
    bar.free(&mut rdzv)?;
    anyhow::ensure!(
        wrong == 0 && spot,
        "rank {rank}: {wrong} of {n} values from rank {prev} were wrong"
    );
    println!(
        "rank {rank}: received rank {prev}'s {n} values through peer memory and a weft-sync signal"
    );
    Ok(())
}
