//! The measuring side of `overlap-order`, run in a child process (`weft __overlap-order-child`)
//! with a fresh CUDA context (CUDA_DEVICE_MAX_CONNECTIONS only applies to contexts created after it
//! is set); one child measures a list of modes of one compute kernel on one [`Rig`]. One process
//! drives two GPUs: the compute GPU runs both kernels, the copy writes into the peer GPU's memory
//! (a single-process PGL, VMM backend).

use super::gemm_load::GemmLoad;
use super::{Compute, Mode};
use crate::timing::median;
use crate::word_compare::WordCompare;
use anyhow::Context;
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_barrier::KernelBarrier;
use weft_pgl::{Backend, PglGroup, Shape};
use weft_testkit::synthetic::{
    memset_u32, ComputeWork, CopyArgs, Kernels, StampValues, Stamps, DEFAULT_ROUNDS,
};

const POISON: u32 = 0xA5A5_A5A5;
/// Targets of the calibration: compute alone on all SMs, and the copy alone.
const TARGET_COMP_MS: f64 = 4.0;
const TARGET_COMM_MS: f64 = 1.0;
/// Every `SAMPLE_STRIDE`-th compute output is checked on repetitions after the first (which
/// checks all of them).
const SAMPLE_STRIDE: usize = 61;

/// The workload sizes, fixed by the calibration and passed to every mode's child.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub compute_gpu: usize,
    pub peer_gpu: usize,
    pub tiles: u32,
    pub bytes: u64,
    pub comm_blocks: u32,
    pub reps: usize,
    pub seed: u64,
    pub compute: Compute,
}

/// Both GPUs, the kernels, the buffers and the streams of the compute GPU, for every mode a child
/// measures.
pub struct Rig {
    kernels: Kernels,
    compute: Arc<CudaStream>,
    /// The comm stream of the current mode: `normal_comm` or, for the high-priority mode,
    /// `high_comm`.
    comm: Arc<CudaStream>,
    normal_comm: Arc<CudaStream>,
    high_comm: Arc<CudaStream>,
    peer: Arc<CudaStream>,
    load: ComputeLoad,
    stamps: Stamps,
    /// The copy's source; the destination is compared with it on the compute GPU, which reads
    /// the peer's buffer through its mapping.
    src_dev: CudaSlice<u32>,
    words: usize,
    compare: WordCompare,
    group: PglGroup<u32>,
    cfg: Config,
}

/// The compute kernel's work: the synthetic kernel's tiles or the GEMM.
#[allow(clippy::large_enum_variant)] // one per measurement; a Box would buy nothing
enum ComputeLoad {
    Synthetic(ComputeWork),
    Gemm(GemmLoad),
}

fn open(ordinal: usize) -> anyhow::Result<Arc<CudaContext>> {
    let ctx = CudaContext::new(ordinal).with_context(|| format!("opening GPU {ordinal}"))?;
    // SAFETY: the streams are ordered explicitly (events, synchronize); nothing is freed in use.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

impl Rig {
    pub fn new(cfg: Config) -> anyhow::Result<Self> {
        let (a, b) = (open(cfg.compute_gpu)?, open(cfg.peer_gpu)?);
        let words = (cfg.bytes / 4) as u32;
        let group =
            PglGroup::<u32>::alloc(&[a.clone(), b.clone()], Shape::vector(words), Backend::Vmm)
                .with_context(|| {
                    format!(
                        "mapping {} B of GPU {} into GPU {}",
                        cfg.bytes, cfg.peer_gpu, cfg.compute_gpu
                    )
                })?;
        let compute = a.new_stream()?;
        let normal_comm = a.new_stream()?;
        let high_comm = weft_signal_gemm::overlap::high_priority_stream(&a)?;
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let src: Vec<u32> = (0..words).map(|_| rng.random()).collect();
        let load = match cfg.compute {
            Compute::Synthetic => ComputeLoad::Synthetic(ComputeWork::new(
                &compute,
                cfg.tiles,
                DEFAULT_ROUNDS,
                rng.random(),
            )?),
            Compute::Gemm(scheduling) => {
                ComputeLoad::Gemm(GemmLoad::new(&compute, scheduling, rng.random())?)
            }
        };
        Ok(Self {
            load,
            kernels: Kernels::load(&a)?,
            stamps: Stamps::new(&compute)?,
            src_dev: compute.clone_htod(&src)?,
            words: src.len(),
            compare: WordCompare::load(&compute)?,
            peer: b.new_stream()?,
            comm: normal_comm.clone(),
            normal_comm,
            high_comm,
            compute,
            group,
            cfg,
        })
    }

    /// Sets up `mode`: its comm stream, and the GEMM planned with its margin (made once).
    fn enter(&mut self, mode: Mode) -> anyhow::Result<()> {
        self.comm = if mode == Mode::HighPriority {
            self.high_comm.clone()
        } else {
            self.normal_comm.clone()
        };
        if let ComputeLoad::Gemm(g) = &mut self.load {
            g.select(&self.compute, mode.sm_margin())?;
        }
        Ok(())
    }

    fn copy(&self) -> CopyArgs {
        CopyArgs {
            src: self.src_dev.device_ptr(&self.compute).0,
            dst: self.group.member(0).peer_ptr(1),
            bytes: self.cfg.bytes,
        }
    }

    /// The compute kernel on the compute stream: the synthetic one on SMs − `sm_margin` blocks,
    /// or the GEMM (planned with the mode's margin). `early_release` only right after a wait.
    fn launch_compute(&mut self, sm_margin: u32, early_release: bool) -> anyhow::Result<()> {
        match &mut self.load {
            ComputeLoad::Gemm(g) => g.launch(&self.compute, &mut self.stamps, early_release),
            ComputeLoad::Synthetic(w) => self.kernels.launch_compute(
                &self.compute,
                w,
                &self.stamps,
                sm_margin,
                early_release,
            ),
        }
    }

    /// Poisons both outputs, resets the tile counter and stamps; returns when done.
    fn prepare(&mut self) -> anyhow::Result<()> {
        match &mut self.load {
            ComputeLoad::Synthetic(w) => w.prepare(&self.compute)?,
            ComputeLoad::Gemm(g) => g.poison(&self.compute)?,
        }
        self.stamps.reset(&self.compute)?;
        memset_u32(
            &self.peer,
            self.group.member(1).local_ptr(),
            POISON,
            self.words,
        )?;
        self.peer.synchronize()?;
        self.compute.synchronize()?;
        Ok(())
    }

    /// The outputs of the kernels that ran against the host's: all compute outputs when `full`,
    /// else a sample; every copied word. Returns the elements checked.
    fn verify(&mut self, ran: Ran, full: bool, what: &str) -> anyhow::Result<u64> {
        let checked = match (&mut self.load, ran.compute) {
            (_, false) => 0,
            (ComputeLoad::Gemm(g), true) => g.verify(&self.compute, what)?,
            (ComputeLoad::Synthetic(w), true) => w
                .check(&self.compute, if full { 1 } else { SAMPLE_STRIDE })
                .with_context(|| what.to_string())?,
        };
        if !ran.comm {
            return Ok(checked);
        }
        // Every word of the destination against the source, on the compute GPU (it reads the
        // peer's buffer through its mapping; the copy's kernels are done: timed() synchronised).
        let (src, _g) = self.src_dev.device_ptr(&self.compute);
        let dst = self.group.member(0).peer_ptr(1);
        self.compare.reset(&self.compute)?;
        self.compare
            .enqueue_raw(&self.compute, src, dst, 4 * self.words)?;
        if let Some(d) = self.compare.take(&self.compute)? {
            anyhow::bail!(
                "{what}: copy destination: {} of {} words differ from the source, first at word {}",
                d.words,
                self.words,
                d.first_word
            );
        }
        Ok(checked + self.words as u64)
    }
}

/// Which kernels a timed launch ran (their outputs are checked).
#[derive(Clone, Copy)]
struct Ran {
    compute: bool,
    comm: bool,
}

const COMPUTE: Ran = Ran {
    compute: true,
    comm: false,
};
const COMM: Ran = Ran {
    compute: false,
    comm: true,
};
const BOTH: Ran = Ran {
    compute: true,
    comm: true,
};

fn event(ctx: &Arc<CudaContext>) -> anyhow::Result<CudaEvent> {
    Ok(ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// One mode's numbers (medians over the repetitions), printed as `key value` lines.
#[derive(Debug, Default)]
pub struct Measured {
    pub t_comp_ms: f64,
    pub t_comm_ms: f64,
    pub t_total_ms: f64,
    /// Compute kernel first start to last end, alone and in the pair (stamps).
    pub comp_span_alone_ms: f64,
    pub comp_span_pair_ms: f64,
    /// Comm start − compute start, and comm start − the pair's first start (stamps).
    pub start_delay_us: f64,
    pub start_delay_first_us: f64,
    /// Barrier mode: comm arrival → wait kernel exit, and wait kernel exit → compute start (stamps).
    pub arrive_to_wait_exit_us: f64,
    pub wait_exit_to_compute_us: f64,
    pub checked: u64,
    /// Barrier mode: an already-satisfied wait between events on an idle stream, and the same
    /// events with nothing between them.
    pub wait_us: f64,
    pub empty_events_us: f64,
    pub sms: u32,
    pub compute_regs: u32,
    pub comm_regs: u32,
}

impl Measured {
    /// Overlap efficiency: (T_comp + T_comm − T_total) / min(T_comp, T_comm).
    pub fn efficiency(&self) -> f64 {
        (self.t_comp_ms + self.t_comm_ms - self.t_total_ms) / self.t_comp_ms.min(self.t_comm_ms)
    }

    pub fn fields(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("t_comp_ms", self.t_comp_ms),
            ("t_comm_ms", self.t_comm_ms),
            ("t_total_ms", self.t_total_ms),
            ("comp_span_alone_ms", self.comp_span_alone_ms),
            ("comp_span_pair_ms", self.comp_span_pair_ms),
            ("start_delay_us", self.start_delay_us),
            ("start_delay_first_us", self.start_delay_first_us),
            ("arrive_to_wait_exit_us", self.arrive_to_wait_exit_us),
            ("wait_exit_to_compute_us", self.wait_exit_to_compute_us),
            ("checked", self.checked as f64),
            ("wait_us", self.wait_us),
            ("empty_events_us", self.empty_events_us),
            ("sms", self.sms as f64),
            ("compute_regs", self.compute_regs as f64),
            ("comm_regs", self.comm_regs as f64),
        ]
    }

    pub fn parse(stdout: &str) -> anyhow::Result<Self> {
        let get = |k: &str| -> anyhow::Result<f64> {
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix(' ')));
            line.with_context(|| format!("the child reported no {k}"))?
                .trim()
                .parse::<f64>()
                .with_context(|| format!("{k} is not a number"))
        };
        Ok(Self {
            t_comp_ms: get("t_comp_ms")?,
            t_comm_ms: get("t_comm_ms")?,
            t_total_ms: get("t_total_ms")?,
            comp_span_alone_ms: get("comp_span_alone_ms")?,
            comp_span_pair_ms: get("comp_span_pair_ms")?,
            start_delay_us: get("start_delay_us")?,
            start_delay_first_us: get("start_delay_first_us")?,
            arrive_to_wait_exit_us: get("arrive_to_wait_exit_us")?,
            wait_exit_to_compute_us: get("wait_exit_to_compute_us")?,
            checked: get("checked")? as u64,
            wait_us: get("wait_us")?,
            empty_events_us: get("empty_events_us")?,
            sms: get("sms")? as u32,
            compute_regs: get("compute_regs")? as u32,
            comm_regs: get("comm_regs")? as u32,
        })
    }
}

fn ns_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Times `launch` (enqueueing on the rig's streams) between events on the compute stream; the
/// comm stream joins both ends. Returns (ms, stamps) after checking the outputs.
fn timed(
    rig: &mut Rig,
    ran: Ran,
    full: bool,
    what: &str,
    launch: &mut dyn FnMut(&mut Rig) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, StampValues, u64)> {
    rig.prepare()?;
    let ctx = rig.compute.context().clone();
    let (e0, e_comm, e1) = (event(&ctx)?, event(&ctx)?, event(&ctx)?);
    e0.record(&rig.compute)?;
    rig.comm.wait(&e0)?;
    launch(rig)?;
    e_comm.record(&rig.comm)?;
    rig.compute.wait(&e_comm)?;
    e1.record(&rig.compute)?;
    rig.compute.synchronize()?;
    let ms = e0.elapsed_ms(&e1)? as f64;
    let stamps = rig.stamps.read(&rig.compute)?;
    let checked = rig.verify(ran, full, what)?;
    Ok((ms, stamps, checked))
}

/// Measures one mode on `rig`: compute alone and comm alone in the mode's configuration, then the
/// pair in the unfavourable order (compute issued first), `cfg.reps` times each.
pub fn measure(mode: Mode, rig: &mut Rig) -> anyhow::Result<Measured> {
    let margin = mode.sm_margin();
    rig.enter(mode)?;
    let cfg = rig.cfg;
    let (blocks, compute_regs, comm_regs) = (
        cfg.comm_blocks,
        rig.kernels.registers()?.0,
        rig.kernels.registers()?.1,
    );
    let mut bar = KernelBarrier::new(rig.compute.context())?;
    let (mut comp, mut comm, mut total) = (Vec::new(), Vec::new(), Vec::new());
    let (mut span_alone, mut span_pair, mut delay, mut delay_first) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut checked = 0;
    let (mut to_exit, mut handoff) = (Vec::new(), Vec::new());
    let name = mode.name();
    let barrier = matches!(mode, Mode::Barrier | Mode::BarrierEarly);
    for rep in 0..cfg.reps + 1 {
        // Repetition 0 is a warm-up whose outputs are checked in full.
        let full = rep == 0;
        let (ms, s, n) = timed(
            rig,
            COMPUTE,
            full,
            &format!("{name}: compute alone"),
            &mut |r| r.launch_compute(margin, false),
        )?;
        checked += n;
        if rep > 0 {
            comp.push(ms);
            span_alone.push(ns_ms(s.compute_end - s.compute_start));
        }
        let (ms, _, n) = timed(rig, COMM, full, &format!("{name}: comm alone"), &mut |r| {
            r.kernels
                .launch_comm(&r.comm, &r.copy(), &r.stamps, None, blocks)
        })?;
        checked += n;
        if rep > 0 {
            comm.push(ms);
        }
        let target = if barrier { bar.expect(1)? } else { 0 };
        let view = bar.view();
        let (ms, s, n) = timed(
            rig,
            BOTH,
            full,
            &format!("{name}: overlapped pair, repetition {rep}"),
            &mut |r| {
                let copy = r.copy();
                match mode {
                    Mode::Favourable => {
                        r.kernels
                            .launch_comm(&r.comm, &copy, &r.stamps, None, blocks)?;
                        r.launch_compute(0, false)
                    }
                    Mode::Barrier | Mode::BarrierEarly => {
                        bar.wait_stamped(&r.compute, target, r.stamps.wait_exit_ptr(&r.compute))?;
                        r.launch_compute(0, mode == Mode::BarrierEarly)?;
                        r.kernels
                            .launch_comm(&r.comm, &copy, &r.stamps, Some(view), blocks)
                    }
                    _ => {
                        r.launch_compute(margin, false)?;
                        r.kernels
                            .launch_comm(&r.comm, &copy, &r.stamps, None, blocks)
                    }
                }
            },
        )?;
        bar.check()?;
        checked += n;
        anyhow::ensure!(
            s.complete(),
            "{name}: a kernel of the pair left no stamps: {s:?}"
        );
        if barrier {
            anyhow::ensure!(
                s.compute_start >= s.comm_arrive,
                "{name}: compute started {} ns before the comm kernel arrived",
                s.comm_arrive - s.compute_start
            );
        }
        if rep > 0 {
            total.push(ms);
            span_pair.push(ns_ms(s.compute_end - s.compute_start));
            delay.push((s.comm_start as f64 - s.compute_start as f64) / 1e3);
            delay_first.push((s.comm_start - s.comm_start.min(s.compute_start)) as f64 / 1e3);
            if barrier {
                to_exit.push((s.wait_exit as f64 - s.comm_arrive as f64) / 1e3);
                handoff.push((s.compute_start as f64 - s.wait_exit as f64) / 1e3);
            }
        }
    }
    let (wait_us, empty_events_us) = if barrier {
        wait_overhead(&rig.compute, &mut bar)?
    } else {
        (f64::NAN, f64::NAN)
    };
    Ok(Measured {
        t_comp_ms: median(&comp),
        t_comm_ms: median(&comm),
        t_total_ms: median(&total),
        comp_span_alone_ms: median(&span_alone),
        comp_span_pair_ms: median(&span_pair),
        start_delay_us: median(&delay),
        start_delay_first_us: median(&delay_first),
        arrive_to_wait_exit_us: if to_exit.is_empty() {
            f64::NAN
        } else {
            median(&to_exit)
        },
        wait_exit_to_compute_us: if handoff.is_empty() {
            f64::NAN
        } else {
            median(&handoff)
        },
        checked,
        wait_us,
        empty_events_us,
        sms: rig.kernels.sms(),
        compute_regs,
        comm_regs,
    })
}

/// An already-satisfied wait on an idle stream between events (median of 100), and the same
/// events with nothing between them.
fn wait_overhead(stream: &Arc<CudaStream>, bar: &mut KernelBarrier) -> anyhow::Result<(f64, f64)> {
    let target = bar.expected();
    let ctx = stream.context().clone();
    let (mut wait, mut empty) = (Vec::new(), Vec::new());
    for i in 0..110 {
        let (e0, e1) = (event(&ctx)?, event(&ctx)?);
        stream.synchronize()?;
        e0.record(stream)?;
        let waited = i % 2 == 0;
        if waited {
            bar.wait(stream, target)?;
        }
        e1.record(stream)?;
        stream.synchronize()?;
        let us = e0.elapsed_ms(&e1)? as f64 * 1e3;
        if i >= 10 {
            if waited {
                wait.push(us)
            } else {
                empty.push(us)
            }
        }
    }
    bar.check()?;
    Ok((median(&wait), median(&empty)))
}

/// Picks tiles and bytes so that compute alone (all SMs) takes about TARGET_COMP_MS and the copy
/// alone about TARGET_COMM_MS on this pair of GPUs.
pub fn calibrate(mut cfg: Config) -> anyhow::Result<Config> {
    let sms = {
        let ctx = open(cfg.compute_gpu)?;
        ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32
    };
    cfg.tiles = 8 * sms;
    cfg.bytes = 64 << 20;
    let mut rig = Rig::new(Config {
        compute: Compute::Synthetic,
        ..cfg
    })?;
    let (mut comp, mut comm) = (Vec::new(), Vec::new());
    for rep in 0..6 {
        let (c, _, _) = timed(&mut rig, COMPUTE, false, "calibration: compute", &mut |r| {
            r.launch_compute(0, false)
        })?;
        let (m, _, _) = timed(&mut rig, COMM, false, "calibration: comm", &mut |r| {
            r.kernels
                .launch_comm(&r.comm, &r.copy(), &r.stamps, None, cfg.comm_blocks)
        })?;
        if rep > 0 {
            comp.push(c);
            comm.push(m);
        }
    }
    let scale_tiles = TARGET_COMP_MS / median(&comp);
    let scale_bytes = TARGET_COMM_MS / median(&comm);
    cfg.tiles = ((cfg.tiles as f64 * scale_tiles).round() as u32).clamp(sms, 4096 * sms.max(1));
    let mib = ((cfg.bytes as f64 * scale_bytes) / (1 << 20) as f64).round() as u64;
    cfg.bytes = mib.clamp(1, 2048) << 20;
    Ok(cfg)
}
