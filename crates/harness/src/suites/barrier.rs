//! KernelBarrier correctness (crates/barrier, kernels/barrier/*.cu), on each rank's own GPU: the
//! synthetic persistent compute kernel (all SMs) waits on the compute stream while the copy kernel
//! (local → local, so one GPU suffices) arrives from the comm stream; the compute is issued first.
//! - orders_compute_after_comm_start: the compute kernel's first block starts after the comm
//!   kernel arrived, launched plainly and for early release; every compute output and every
//!   copied byte correct.
//! - reuse_without_host_sync: 50 rounds enqueued back to back with cumulative targets and one
//!   synchronisation; every round ordered and checked; then a reset and 5 more rounds from 0.
//! - orders_weft_gemm: the same with weft's GEMM (dynamic schedule, all SMs) as the compute
//!   kernel, launched plainly and for early release: its first CTA starts after the arrival
//!   (its timeline), D within tolerance of cuBLAS, every copied word right.
//! - wait_times_out: a target nobody reaches, with a 100 ms bound: check() names target, observed
//!   count and bound, the wait gave up within a few bounds, and the context and the barrier work
//!   afterwards (reset, one ordered round).

use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_barrier::{BarrierError, KernelBarrier};
use weft_testkit::synthetic::{memset_u32, ComputeWork, CopyArgs, Kernels, Stamps, DEFAULT_ROUNDS};

const COMM_BLOCKS: u32 = 16;
const POISON: u32 = 0xA5A5_A5A5;
const REUSE_ROUNDS: usize = 50;
const TIMEOUT_BOUND: Duration = Duration::from_millis(100);

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "barrier::orders_compute_after_comm_start",
            orders_compute_after_comm_start,
        ),
        Case::gpu("barrier::reuse_without_host_sync", reuse_without_host_sync),
        Case::gpu("barrier::orders_weft_gemm", orders_weft_gemm),
        Case::gpu("barrier::wait_times_out", wait_times_out),
    ]
}

/// One round's buffers: the compute work, the copy's source and destination, the stamps.
struct Round {
    work: ComputeWork,
    src: Vec<u32>,
    src_dev: CudaSlice<u32>,
    dst: CudaSlice<u32>,
    stamps: Stamps,
}

impl Round {
    fn new(
        stream: &Arc<CudaStream>,
        tiles: u32,
        words: usize,
        rng: &mut StdRng,
    ) -> anyhow::Result<Self> {
        let src: Vec<u32> = (0..words).map(|_| rng.random::<u32>()).collect();
        Ok(Self {
            work: ComputeWork::new(stream, tiles, DEFAULT_ROUNDS, rng.random())?,
            src_dev: stream.clone_htod(&src)?,
            src,
            dst: stream.alloc_zeros::<u32>(words)?,
            stamps: Stamps::new(stream)?,
        })
    }

    /// Poisons the outputs and resets the counters and stamps, in `stream` order.
    fn prepare(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        self.work.prepare(stream)?;
        self.stamps.reset(stream)?;
        memset_u32(
            stream,
            self.dst.device_ptr(stream).0,
            POISON,
            self.dst.len(),
        )
    }

    fn copy(&self, stream: &Arc<CudaStream>) -> CopyArgs {
        CopyArgs {
            src: self.src_dev.device_ptr(stream).0,
            dst: self.dst.device_ptr(stream).0,
            bytes: 4 * self.src.len() as u64,
        }
    }

    /// wait(target) then compute on `compute` (launched for early release or not); the arriving
    /// copy on `comm` (issued second).
    fn enqueue(
        &self,
        k: &Kernels,
        bar: &KernelBarrier,
        target: i32,
        compute: &Arc<CudaStream>,
        comm: &Arc<CudaStream>,
        early_release: bool,
    ) -> anyhow::Result<()> {
        bar.wait(compute, target)?;
        k.launch_compute(compute, &self.work, &self.stamps, 0, early_release)?;
        k.launch_comm(
            comm,
            &self.copy(comm),
            &self.stamps,
            Some(bar.view()),
            COMM_BLOCKS,
        )
    }

    /// After a synchronisation: ordered, every output right.
    fn verify(&self, stream: &Arc<CudaStream>, what: &str) -> anyhow::Result<()> {
        self.work
            .check(stream, 1)
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        self.verify_order_and_copy(stream, what)
    }

    /// After a synchronisation: the compute kernel (whichever it was) started after the comm
    /// kernel arrived, and every copied word is right.
    fn verify_order_and_copy(&self, stream: &Arc<CudaStream>, what: &str) -> anyhow::Result<()> {
        let s = self.stamps.read(stream)?;
        anyhow::ensure!(s.complete(), "{what}: a kernel left no stamps: {s:?}");
        anyhow::ensure!(
            s.compute_start >= s.comm_arrive,
            "{what}: the compute kernel started {} ns before the comm kernel arrived ({s:?})",
            s.comm_arrive - s.compute_start
        );
        let got = stream.clone_dtoh(&self.dst)?;
        if let Some(i) = (0..got.len()).find(|&i| got[i] != self.src[i]) {
            let bad = (0..got.len()).filter(|&i| got[i] != self.src[i]).count();
            anyhow::bail!("{what}: copy destination: {bad} of {} words differ; word {i} is {:#x}, expected {:#x}", got.len(), got[i], self.src[i]);
        }
        Ok(())
    }
}

struct Rig {
    kernels: Kernels,
    compute: Arc<CudaStream>,
    comm: Arc<CudaStream>,
}

fn rig(job: &Job) -> anyhow::Result<Rig> {
    let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
    Ok(Rig {
        kernels: Kernels::load(&gpu.ctx)?,
        compute: gpu.ctx.new_stream()?,
        comm: gpu.ctx.new_stream()?,
    })
}

fn synchronize(r: &Rig) -> anyhow::Result<()> {
    r.compute.synchronize()?;
    r.comm.synchronize()?;
    Ok(())
}

fn orders_compute_after_comm_start(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)? ^ job.rank() as u64;
    let r = rig(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bar = KernelBarrier::new(r.compute.context())?;
    // About four waves of tiles; a 16 MiB copy.
    let mut round = Round::new(&r.compute, 4 * r.kernels.sms(), 4 << 20, &mut rng)?;
    for rep in 0..6 {
        // Repetitions 3..6 launch the compute kernel for early release.
        let early = rep >= 3;
        round.prepare(&r.compute)?;
        r.compute.synchronize()?;
        let target = bar.expect(1)?;
        round.enqueue(&r.kernels, &bar, target, &r.compute, &r.comm, early)?;
        synchronize(&r)?;
        bar.check()?;
        round.verify(
            &r.compute,
            &format!("repetition {rep} (early release {early}), seed {seed}"),
        )?;
    }
    Ok(())
}

fn reuse_without_host_sync(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)? ^ job.rank() as u64;
    let r = rig(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bar = KernelBarrier::new(r.compute.context())?;
    // One wave of tiles and a 1 MiB copy per round.
    let mut rounds: Vec<Round> = (0..REUSE_ROUNDS)
        .map(|_| Round::new(&r.compute, r.kernels.sms(), 1 << 18, &mut rng))
        .collect::<anyhow::Result<_>>()?;
    for round in &mut rounds {
        round.prepare(&r.compute)?;
    }
    r.compute.synchronize()?;
    for pass in ["first pass", "after reset"] {
        let n = if pass == "first pass" {
            REUSE_ROUNDS
        } else {
            5
        };
        // Everything enqueued back to back: round i waits for arrival i + 1 (cumulative), comm
        // kernels run in order on one stream, so a count >= i + 1 means round i's comm arrived.
        for (i, round) in rounds[..n].iter().enumerate() {
            let target = bar.expect(1)?;
            anyhow::ensure!(
                target == i as i32 + 1,
                "{pass}: round {i} got target {target}"
            );
            // Every other round launches the compute kernel for early release.
            round.enqueue(&r.kernels, &bar, target, &r.compute, &r.comm, i % 2 == 1)?;
        }
        synchronize(&r)?;
        bar.check()?;
        for (i, round) in rounds[..n].iter().enumerate() {
            round.verify(
                &r.compute,
                &format!("{pass}, round {i} of {n}, seed {seed}"),
            )?;
        }
        // Both streams are idle: the reset is ordered after every wait and arrival above.
        bar.reset(&r.compute)?;
        for round in &mut rounds[..5] {
            round.prepare(&r.compute)?;
        }
        r.compute.synchronize()?;
    }
    Ok(())
}

fn orders_weft_gemm(job: &mut Job) -> anyhow::Result<()> {
    use crate::gemm_data::{download, poison, poisoned, uniform, upload};
    use half::bf16;
    use weft_signal_gemm::reference::{check_all, Tolerance};
    use weft_signal_gemm::{
        CublasGemm, Dtype, Gemm, GemmOptions, GemmShape, LaunchExtras, Scheduling,
    };
    let seed = shared_seed(job)? ^ job.rank() as u64;
    let r = rig(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bar = KernelBarrier::new(r.compute.context())?;
    let shape = GemmShape::new(4096, 4096, 2048);
    let options = GemmOptions {
        scheduling: Scheduling::Dynamic,
        ..GemmOptions::default()
    };
    let gemm = Gemm::new(r.compute.context(), shape, options)?;
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a = upload(&r.compute, &uniform::<bf16>(rng.random(), m * k))?;
    let b = upload(&r.compute, &uniform::<bf16>(rng.random(), n * k))?;
    let mut want = poisoned::<f32>(&r.compute, m * n)?;
    CublasGemm::new(
        &r.compute,
        shape,
        GemmOptions {
            output: Dtype::F32,
            ..options
        },
    )?
    .launch(&a, &b, &mut want)?;
    let want: Vec<f64> = download(&r.compute, &want)?
        .iter()
        .map(|&x| x as f64)
        .collect();
    let mut d = poisoned::<bf16>(&r.compute, m * n)?;
    // The copy and the stamps of a round; its synthetic compute work is not launched here.
    let mut round = Round::new(&r.compute, 1, 4 << 20, &mut rng)?;
    for rep in 0..4 {
        let early = rep % 2 == 1;
        let what = format!("GEMM repetition {rep} (early release {early}), seed {seed}");
        round.prepare(&r.compute)?;
        poison(&r.compute, &mut d)?;
        r.compute.synchronize()?;
        let target = bar.expect(1)?;
        bar.wait(&r.compute, target)?;
        let extras = LaunchExtras {
            timeline: Some(round.stamps.compute_timeline()),
            early_release: early,
            ..Default::default()
        };
        gemm.launch_with(&r.compute, &a, &b, &mut d, extras)?;
        r.kernels.launch_comm(
            &r.comm,
            &round.copy(&r.comm),
            &round.stamps,
            Some(bar.view()),
            COMM_BLOCKS,
        )?;
        synchronize(&r)?;
        bar.check()?;
        gemm.check()?;
        round.verify_order_and_copy(&r.compute, &what)?;
        check_all(
            &what,
            shape,
            &download(&r.compute, &d)?,
            &want,
            Tolerance::for_output(Dtype::Bf16),
        )?;
    }
    Ok(())
}

fn wait_times_out(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)? ^ job.rank() as u64;
    let r = rig(job)?;
    let mut bar = KernelBarrier::new(r.compute.context())?;
    bar.set_timeout(TIMEOUT_BOUND);
    let target = bar.expect(1)?; // nobody arrives
    let t0 = Instant::now();
    bar.wait(&r.compute, target)?;
    r.compute.synchronize()?;
    let wall = t0.elapsed();
    let msg = match bar.check() {
        Ok(()) => anyhow::bail!("a wait for an arrival nobody makes returned without error"),
        // Typed: a caller can match the timeout and read the report's values.
        Err(e @ BarrierError::TimedOut { report, .. }) => {
            anyhow::ensure!(
                (report.target, report.observed) == (1, 0),
                "the timed-out wait's report holds target {} / observed {}, not 1 / 0: {e:#}",
                report.target,
                report.observed
            );
            format!("{e:#}")
        }
        Err(e) => {
            anyhow::bail!("a wait nobody satisfies failed otherwise than by timing out: {e:#}")
        }
    };
    for part in ["timed out", "target 1 arrivals, observed 0", "bound"] {
        anyhow::ensure!(msg.contains(part), "the error does not say {part:?}: {msg}");
    }
    // The bound is cycles at the maximum SM clock: at least 100 ms, longer at lower clocks.
    anyhow::ensure!(
        wall >= TIMEOUT_BOUND.mul_f64(0.99) && wall <= TIMEOUT_BOUND * 10,
        "the wait gave up after {:.1} ms of host time for a {} ms bound: {msg}",
        wall.as_secs_f64() * 1e3,
        TIMEOUT_BOUND.as_millis()
    );
    bar.check()
        .map_err(|e| anyhow::anyhow!("check() did not clear the report: {e}"))?;
    // The context and the barrier still work: reset, then an ordered round, launched plainly and
    // for early release.
    bar.reset(&r.compute)?;
    let mut round = Round::new(
        &r.compute,
        r.kernels.sms(),
        1 << 18,
        &mut StdRng::seed_from_u64(seed),
    )?;
    for early in [false, true] {
        round.prepare(&r.compute)?;
        r.compute.synchronize()?;
        let target = bar.expect(1)?;
        round.enqueue(&r.kernels, &bar, target, &r.compute, &r.comm, early)?;
        synchronize(&r)?;
        bar.check()?;
        round.verify(
            &r.compute,
            &format!("the round after the timeout (early release {early}), seed {seed}"),
        )?;
    }
    Ok(())
}
