//! overlap-order: a greedy persistent compute kernel and a communication kernel (a peer copy)
//! issued on two streams in the unfavourable order (compute first), measured five ways —
//! nothing, CUDA_DEVICE_MAX_CONNECTIONS=1, an sm_margin sweep, a high-priority comm stream,
//! KernelBarrier (plain, and with early release) — plus the favourable order (comm issued first)
//! as a reference. Two compute kernels: the synthetic persistent kernel and weft's GEMM
//! (dynamically scheduled; plus the statically scheduled GEMM under KernelBarrier).
//!
//! One process drives two GPUs: this rank's GPU runs both kernels and the copy writes into the
//! next visible GPU. Under a launcher only rank 0 measures; the other ranks wait for it at a
//! rendezvous barrier (their GPUs stay idle, apart from the peer GPU receiving the copy). Modes run
//! in child processes (`weft __overlap-order-child`), one per compute kernel and one more for
//! CUDA_DEVICE_MAX_CONNECTIONS=1, which needs a fresh context; a child measures its modes one after
//! the other on one set of buffers and prints a progress line per mode (forwarded to stderr). The
//! first child calibrates the sizes (compute alone on all SMs ≈ 4 ms, the copy alone ≈ 1 ms) and
//! every mode uses them.
//!
//! Per mode (medians over the repetitions, CUDA events for times, %globaltimer stamps for starts):
//! T_comp and T_comm alone in the mode's configuration, T_total of the pair, the comm kernel's
//! start delay, overlap efficiency = (T_comp + T_comm − T_total) / min(T_comp, T_comm), compute
//! slowdown (compute span in the pair / all-SM compute span alone) and the comm kernel's SM share.
//! Every repetition checks both outputs (compute sampled, in full on the first; every copied word).

mod gemm_load;
mod measure;

use super::SuiteResult;
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use anyhow::Context;
use cudarc::driver::CudaContext;
use measure::{Config, Measured};
use std::time::{Duration, Instant};
use weft_signal_gemm::Scheduling;

pub const CHILD_COMMAND: &str = "__overlap-order-child";
/// 8 blocks: peer writes from 8 SMs already reach ~90% of the copy engine (bench pgl), and every
/// SM the copy holds is one the compute kernel loses while they overlap.
const DEFAULT_COMM_BLOCKS: u32 = 8;
/// Overrides the comm kernel's block count.
const COMM_BLOCKS_VAR: &str = "WEFT_OVERLAP_COMM_BLOCKS";
/// A child's bound: setup (contexts, inputs, the cuBLAS reference) plus each of its modes.
const CHILD_SETUP_TIMEOUT: Duration = Duration::from_secs(90);
const CHILD_MODE_TIMEOUT: Duration = Duration::from_secs(60);
/// Separates the modes' reports in a child's stdout: `mode <arg>`.
const MODE_LINE: &str = "mode ";
const BASELINE: &str = "nothing (unfavourable order)";
/// The goals.
const GOAL_EFFICIENCY: f64 = 0.9;
const GOAL_WAIT_US: f64 = 5.0;

/// The compute kernel of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// The synthetic persistent kernel (weft_testkit::synthetic), tiles from a counter.
    Synthetic,
    /// weft's GEMM (gemm_load::SHAPE), statically or dynamically scheduled.
    Gemm(Scheduling),
}

impl Compute {
    fn arg(self) -> &'static str {
        match self {
            Compute::Synthetic => "synthetic",
            Compute::Gemm(Scheduling::Dynamic) => "gemm-dynamic",
            Compute::Gemm(Scheduling::Static) => "gemm-static",
        }
    }

    fn from_arg(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "synthetic" => Compute::Synthetic,
            "gemm-dynamic" => Compute::Gemm(Scheduling::Dynamic),
            "gemm-static" => Compute::Gemm(Scheduling::Static),
            _ => anyhow::bail!("unknown overlap-order compute kernel {s:?}"),
        })
    }

    pub fn name(self) -> String {
        match self {
            Compute::Synthetic => "synthetic persistent kernel".into(),
            Compute::Gemm(Scheduling::Dynamic) => {
                format!("weft GEMM {} bf16, dynamic schedule", gemm_load::SHAPE)
            }
            Compute::Gemm(Scheduling::Static) => {
                format!("weft GEMM {} bf16, static schedule", gemm_load::SHAPE)
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Calibrate,
    Favourable,
    Nothing,
    MaxConnections1,
    Margin(u32),
    HighPriority,
    Barrier,
    /// KernelBarrier with the compute kernel launched for early release.
    BarrierEarly,
}

impl Mode {
    fn arg(self) -> String {
        match self {
            Mode::Calibrate => "calibrate".into(),
            Mode::Favourable => "favourable".into(),
            Mode::Nothing => "nothing".into(),
            Mode::MaxConnections1 => "max-connections-1".into(),
            Mode::Margin(m) => format!("sm-margin-{m}"),
            Mode::HighPriority => "high-priority".into(),
            Mode::Barrier => "barrier".into(),
            Mode::BarrierEarly => "barrier-early-release".into(),
        }
    }

    fn from_arg(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "calibrate" => Mode::Calibrate,
            "favourable" => Mode::Favourable,
            "nothing" => Mode::Nothing,
            "max-connections-1" => Mode::MaxConnections1,
            "high-priority" => Mode::HighPriority,
            "barrier" => Mode::Barrier,
            "barrier-early-release" => Mode::BarrierEarly,
            _ => Mode::Margin(
                s.strip_prefix("sm-margin-")
                    .and_then(|m| m.parse().ok())
                    .with_context(|| format!("unknown overlap-order mode {s:?}"))?,
            ),
        })
    }

    pub fn name(self) -> String {
        match self {
            Mode::Calibrate => "calibration".into(),
            Mode::Favourable => "reference: favourable order (comm issued first)".into(),
            Mode::Nothing => "nothing (unfavourable order)".into(),
            Mode::MaxConnections1 => "CUDA_DEVICE_MAX_CONNECTIONS=1".into(),
            Mode::Margin(m) => format!("sm_margin {m}"),
            Mode::HighPriority => "high-priority comm stream".into(),
            Mode::Barrier => "KernelBarrier".into(),
            Mode::BarrierEarly => "KernelBarrier, early release".into(),
        }
    }

    pub fn sm_margin(self) -> u32 {
        if let Mode::Margin(m) = self {
            m
        } else {
            0
        }
    }
}

/// `weft __overlap-order-child MODE[,MODE…] COMPUTE COMPUTE_GPU PEER_GPU TILES BYTES COMM_BLOCKS
/// REPS SEED`: measures the modes in order on one rig and prints, per mode, a `mode <arg>` line and
/// its `key value` lines (and a progress line on stderr). Not a rank of any job.
pub fn child(args: &[String]) -> anyhow::Result<()> {
    let [modes, compute, a, b, tiles, bytes, blocks, reps, seed] = args else {
        anyhow::bail!("usage: weft {CHILD_COMMAND} MODE[,MODE...] COMPUTE COMPUTE_GPU PEER_GPU TILES BYTES COMM_BLOCKS REPS SEED");
    };
    let cfg = Config {
        compute_gpu: a.parse()?,
        peer_gpu: b.parse()?,
        tiles: tiles.parse()?,
        bytes: bytes.parse()?,
        comm_blocks: blocks.parse()?,
        reps: reps.parse()?,
        seed: seed.parse()?,
        compute: Compute::from_arg(compute)?,
    };
    let modes = modes
        .split(',')
        .map(Mode::from_arg)
        .collect::<anyhow::Result<Vec<_>>>()?;
    if modes == [Mode::Calibrate] {
        let c = measure::calibrate(cfg)?;
        println!("tiles {}\nbytes {}", c.tiles, c.bytes);
        return Ok(());
    }
    anyhow::ensure!(
        !modes.contains(&Mode::Calibrate),
        "calibration runs alone in its child"
    );
    let start = Instant::now();
    let mut rig = measure::Rig::new(cfg)?;
    for m in modes {
        let r = measure::measure(m, &mut rig)
            .with_context(|| format!("{} ({})", m.name(), cfg.compute.name()))?;
        eprintln!(
            "weft bench: overlap-order {}, {}: T_total {:.3} ms, efficiency {:.0}% ({:.1} s)",
            cfg.compute.arg(),
            m.name(),
            r.t_total_ms,
            100.0 * r.efficiency(),
            start.elapsed().as_secs_f64()
        );
        println!("{MODE_LINE}{}", m.arg());
        for (k, v) in r.fields() {
            println!("{k} {v}");
        }
    }
    Ok(())
}

/// Runs a child for `modes` (bounded), its stderr forwarded line by line; returns its stdout.
fn run_child(modes: &[Mode], cfg: &Config) -> anyhow::Result<String> {
    use std::io::BufRead;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    let names: Vec<String> = modes.iter().map(|m| m.arg()).collect();
    let what = || {
        format!(
            "overlap-order {} ({})",
            names.join(", "),
            cfg.compute.name()
        )
    };
    cmd.arg(CHILD_COMMAND)
        .arg(names.join(","))
        .arg(cfg.compute.arg());
    for v in [
        cfg.compute_gpu as u64,
        cfg.peer_gpu as u64,
        cfg.tiles as u64,
        cfg.bytes,
        cfg.comm_blocks as u64,
        cfg.reps as u64,
        cfg.seed,
    ] {
        cmd.arg(v.to_string());
    }
    // Only the CUDA_DEVICE_MAX_CONNECTIONS mode sets it (alone in its child); the others measure
    // the default.
    if modes == [Mode::MaxConnections1] {
        cmd.env("CUDA_DEVICE_MAX_CONNECTIONS", "1");
    } else {
        anyhow::ensure!(
            !modes.contains(&Mode::MaxConnections1),
            "CUDA_DEVICE_MAX_CONNECTIONS=1 needs a child of its own"
        );
        cmd.env_remove("CUDA_DEVICE_MAX_CONNECTIONS");
    }
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    // Forward the child's progress as it comes and keep it for an error message; read its stdout
    // on another thread so that neither pipe can fill up and stall it.
    let stderr = child.stderr.take().context("the child's stderr")?;
    let forward = std::thread::spawn(move || {
        let mut kept = String::new();
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{line}");
            kept.push_str(&line);
            kept.push('\n');
        }
        kept
    });
    let mut stdout_pipe = child.stdout.take().context("the child's stdout")?;
    let collect = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout_pipe, &mut out).map(|_| out)
    });
    let bound = CHILD_SETUP_TIMEOUT + CHILD_MODE_TIMEOUT * modes.len() as u32;
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(
                    anyhow::Error::from(e).context(format!("{}: waiting for the child", what()))
                );
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "{}: the child process ran past {} s and was killed",
                what(),
                bound.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = forward.join().unwrap_or_default();
    let stdout = collect
        .join()
        .map_err(|_| anyhow::anyhow!("{}: reading the child's stdout panicked", what()))??;
    anyhow::ensure!(
        status.success(),
        "{}: the child process failed ({status}): {}",
        what(),
        stderr.trim()
    );
    Ok(stdout)
}

/// Splits a child's stdout into its modes' reports, in the order `modes` asked for them.
fn parse_modes(stdout: &str, modes: &[Mode]) -> anyhow::Result<Vec<Measured>> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in stdout.lines() {
        if let Some(m) = line.strip_prefix(MODE_LINE) {
            sections.push((m.trim().to_string(), String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    anyhow::ensure!(
        sections.len() == modes.len(),
        "the child reported {} modes, {} were asked for",
        sections.len(),
        modes.len()
    );
    modes
        .iter()
        .zip(&sections)
        .map(|(m, (arg, text))| {
            anyhow::ensure!(
                *arg == m.arg(),
                "the child reported mode {arg:?} where {:?} was expected",
                m.arg()
            );
            Measured::parse(text).with_context(|| m.name())
        })
        .collect()
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let result = if job.rank() == 0 {
        measure_all(job, quick)
    } else {
        Ok(SuiteResult {
            table: Table {
                headers: vec![],
                rows: vec![],
            },
            rows: vec![],
        })
    };
    if result.is_ok() {
        // Other ranks idle here while rank 0 measures: at most 8 children and 32 modes, each
        // bounded, so the wait may exceed the rendezvous' default bound.
        job.rdzv.set_timeout(
            CHILD_SETUP_TIMEOUT * 8 + CHILD_MODE_TIMEOUT * 32 + Duration::from_secs(60),
        );
        job.rdzv.barrier()?;
    }
    result
}

fn measure_all(job: &Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
    let count = CudaContext::device_count()? as usize;
    anyhow::ensure!(count >= 2, "overlap-order needs 2 visible GPUs (this rank's GPU computes and copies into the next one); {count} visible");
    let comm_blocks = match std::env::var(COMM_BLOCKS_VAR) {
        Ok(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&b| b > 0)
            .with_context(|| format!("{COMM_BLOCKS_VAR}={v:?} is not a positive block count"))?,
        Err(_) => DEFAULT_COMM_BLOCKS,
    };
    let seed = std::env::var("WEFT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0E7A_u64);
    let cfg = Config {
        compute_gpu: gpu.ordinal,
        peer_gpu: (gpu.ordinal + 1) % count,
        tiles: 0,
        bytes: 0,
        comm_blocks,
        reps: if quick { 5 } else { 20 },
        seed,
        compute: Compute::Synthetic,
    };
    eprintln!("weft bench: overlap-order: calibrating the sizes");
    let out = run_child(&[Mode::Calibrate], &cfg)?;
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.trim().parse::<u64>().ok()))
    };
    let (Some(tiles), Some(bytes)) = (field("tiles "), field("bytes ")) else {
        anyhow::bail!("the calibration child reported no sizes: {out:?}")
    };
    let cfg = Config {
        tiles: tiles as u32,
        bytes,
        ..cfg
    };

    let mut modes = vec![Mode::Favourable, Mode::Nothing, Mode::MaxConnections1];
    let mut margins = vec![4, 8, 16, 32, comm_blocks];
    margins.sort_unstable();
    margins.dedup();
    modes.extend(margins.into_iter().map(Mode::Margin));
    modes.extend([Mode::HighPriority, Mode::Barrier, Mode::BarrierEarly]);
    // Every mode with the synthetic kernel and with the dynamically scheduled GEMM; the static
    // GEMM under KernelBarrier shows what dynamic scheduling buys (its CTAs on the SMs the comm
    // kernel holds start late and still own their share of the tiles).
    let runs = [
        (Compute::Synthetic, modes.clone()),
        (Compute::Gemm(Scheduling::Dynamic), modes),
        (
            Compute::Gemm(Scheduling::Static),
            vec![Mode::Nothing, Mode::BarrierEarly],
        ),
    ];
    let mut measured = Vec::new();
    for (compute, modes) in runs {
        let cfg = Config { compute, ..cfg };
        // CUDA_DEVICE_MAX_CONNECTIONS=1 in a child of its own; every other mode in one child.
        let (alone, shared): (Vec<Mode>, Vec<Mode>) =
            modes.into_iter().partition(|m| *m == Mode::MaxConnections1);
        let mut got = Vec::new();
        for group in [shared, alone] {
            if group.is_empty() {
                continue;
            }
            let reports =
                parse_modes(&run_child(&group, &cfg)?, &group).with_context(|| compute.name())?;
            got.extend(group.into_iter().zip(reports));
        }
        // Report in the order of the mode list (MaxConnections1 after the unfavourable order).
        got.sort_by_key(|(m, _)| mode_order(*m));
        measured.extend(got.into_iter().map(|(m, r)| (compute, m, r)));
    }
    Ok(report(&cfg, &measured))
}

/// The table's order of the modes.
fn mode_order(m: Mode) -> (u32, u32) {
    match m {
        Mode::Calibrate => (0, 0),
        Mode::Favourable => (1, 0),
        Mode::Nothing => (2, 0),
        Mode::MaxConnections1 => (3, 0),
        Mode::Margin(x) => (4, x),
        Mode::HighPriority => (5, 0),
        Mode::Barrier => (6, 0),
        Mode::BarrierEarly => (7, 0),
    }
}

fn report(cfg: &Config, measured: &[(Compute, Mode, Measured)]) -> SuiteResult {
    let base_of = |c: Compute| {
        measured
            .iter()
            .find(|(k, m, _)| *k == c && *m == Mode::Nothing)
            .map(|(_, _, r)| r)
            .expect("the nothing mode is measured for every compute kernel")
    };
    let sms = base_of(Compute::Synthetic).sms;
    let share = cfg.comm_blocks.min(sms) as f64 / sms as f64;
    let mut table = Table {
        headers: vec![
            "compute",
            "mode",
            "T_total (ms)",
            "T_comp (ms)",
            "T_comm (ms)",
            "efficiency",
            "comm start delay (us)",
            "vs first start (us)",
            "compute slowdown",
            "vs nothing",
            "checked",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (compute, mode, r) in measured {
        let base = base_of(*compute);
        let efficiency = r.efficiency();
        let slowdown = r.comp_span_pair_ms / base.comp_span_alone_ms;
        let ratio = base.t_total_ms / r.t_total_ms;
        table.rows.push(vec![
            compute.arg().into(),
            mode.name(),
            format!("{:.3}", r.t_total_ms),
            format!("{:.3}", r.t_comp_ms),
            format!("{:.3}", r.t_comm_ms),
            format!("{:.0}%", 100.0 * efficiency),
            format!("{:.1}", r.start_delay_us),
            format!("{:.1}", r.start_delay_first_us),
            format!("{slowdown:.3}x"),
            format!("{ratio:.2}x"),
            r.checked.to_string(),
        ]);
        let mut row = vec![
            (
                "case",
                Json::from(format!("{}: {}", compute.name(), mode.name())),
            ),
            ("compute", Json::from(compute.name())),
            ("mode", Json::from(mode.name())),
            ("weft_ms", Json::from(r.t_total_ms)),
            ("baseline", Json::from(BASELINE)),
            ("baseline_ms", Json::from(base.t_total_ms)),
            ("ratio", Json::from(ratio)),
            ("efficiency", Json::from(efficiency)),
            ("start_delay_us", Json::from(r.start_delay_us)),
            (
                "start_delay_vs_first_us",
                Json::from(r.start_delay_first_us),
            ),
            (
                "arrive_to_wait_exit_us",
                Json::from(r.arrive_to_wait_exit_us),
            ),
            (
                "wait_exit_to_compute_us",
                Json::from(r.wait_exit_to_compute_us),
            ),
            ("t_comp_ms", Json::from(r.t_comp_ms)),
            ("t_comm_ms", Json::from(r.t_comm_ms)),
            ("comp_span_alone_ms", Json::from(r.comp_span_alone_ms)),
            ("comp_span_pair_ms", Json::from(r.comp_span_pair_ms)),
            ("slowdown", Json::from(slowdown)),
            ("comm_sm_share", Json::from(share)),
            ("sm_margin", Json::from(mode.sm_margin() as usize)),
            ("comm_blocks", Json::from(cfg.comm_blocks as usize)),
            ("sms", Json::from(sms as usize)),
            ("compute_tiles", Json::from(cfg.tiles as usize)),
            ("comm_bytes", Json::from(cfg.bytes as usize)),
            ("repetitions", Json::from(cfg.reps)),
            ("elements_checked", Json::from(r.checked as usize)),
        ];
        if matches!(mode, Mode::Barrier | Mode::BarrierEarly) {
            row.push((
                "meets_goal",
                Json::from(
                    if efficiency >= GOAL_EFFICIENCY && slowdown - 1.0 <= share {
                        "yes"
                    } else {
                        "no"
                    },
                ),
            ));
        }
        rows.push(json::obj(row));
    }
    if let Some((_, _, b)) = measured
        .iter()
        .find(|(c, m, _)| *c == Compute::Synthetic && *m == Mode::Barrier)
    {
        // The wait's own cost: the events around it minus the same events around nothing.
        let overhead_us = b.wait_us - b.empty_events_us;
        let mut cells = padded_row(
            &table,
            "KernelBarrier wait, target already reached (events around it)".into(),
        );
        cells[2] = format!("{:.4}", b.wait_us / 1e3);
        cells[9] = format!(
            "empty events: {:.1} us, overhead {overhead_us:.1} us",
            b.empty_events_us
        );
        table.rows.push(cells);
        rows.push(json::obj([
            (
                "case",
                Json::from("KernelBarrier wait, target already reached, idle stream"),
            ),
            ("weft_ms", Json::from(b.wait_us / 1e3)),
            ("weft_us", Json::from(b.wait_us)),
            ("baseline", Json::from("events with nothing between them")),
            ("baseline_ms", Json::from(b.empty_events_us / 1e3)),
            ("ratio", Json::from(b.empty_events_us / b.wait_us)),
            ("overhead_us", Json::from(overhead_us)),
            ("goal_us", Json::from(GOAL_WAIT_US)),
            (
                "meets_goal",
                Json::from(if overhead_us <= GOAL_WAIT_US {
                    "yes"
                } else {
                    "no"
                }),
            ),
        ]));
    }
    // Whether a comm block can share an SM with a compute block at all (registers).
    let base = base_of(Compute::Synthetic);
    let note = format!(
        "GPU {} computes and copies into GPU {}; {} SMs; compute {} tiles, 1 block/SM x {} threads x {} registers; comm {} blocks x {} threads x {} registers, {} MiB",
        cfg.compute_gpu,
        cfg.peer_gpu,
        sms,
        cfg.tiles,
        weft_testkit::synthetic::THREADS,
        base.compute_regs,
        cfg.comm_blocks,
        weft_testkit::synthetic::THREADS,
        base.comm_regs,
        cfg.bytes >> 20
    );
    table.rows.push(padded_row(&table, note));
    let gemm = weft_signal_gemm::GemmPlan::new(sms, gemm_load::SHAPE, Default::default())
        .map(|p| p.describe())
        .unwrap_or_else(|e| format!("{e:#}"));
    table.rows.push(padded_row(
        &table,
        format!("GEMM: {gemm}; sm_margin modes plan it on SMs - margin CTAs"),
    ));
    SuiteResult { table, rows }
}

/// A row of `table`'s width with `first` in the first column and the rest empty.
fn padded_row(table: &Table, first: String) -> Vec<String> {
    let mut cells = vec![String::new(); table.headers.len()];
    cells[0] = first;
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(t_total: f64) -> String {
        let r = Measured {
            t_comp_ms: 4.0,
            t_comm_ms: 1.0,
            t_total_ms: t_total,
            ..Default::default()
        };
        r.fields()
            .iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect()
    }

    #[test]
    fn a_childs_modes_are_split_in_order() {
        let out = format!(
            "{MODE_LINE}nothing\n{}{MODE_LINE}sm-margin-4\n{}",
            report(5.0),
            report(4.1)
        );
        let got = parse_modes(&out, &[Mode::Nothing, Mode::Margin(4)]).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].efficiency(), 0.0); // nothing hidden: 4 + 1 - 5
        assert!((got[1].efficiency() - 0.9).abs() < 1e-12); // (4 + 1 - 4.1) / 1
    }

    #[test]
    fn a_missing_or_reordered_mode_is_an_error() {
        let out = format!("{MODE_LINE}nothing\n{}", report(5.0));
        let e = parse_modes(&out, &[Mode::Nothing, Mode::Barrier]).unwrap_err();
        assert!(format!("{e:#}").contains("reported 1 modes, 2 were asked for"));
        let e = parse_modes(&out, &[Mode::Barrier]).unwrap_err();
        assert!(format!("{e:#}").contains("\"nothing\" where \"barrier\""));
        let e = parse_modes(
            &format!("{MODE_LINE}nothing\nt_comp_ms 1\n"),
            &[Mode::Nothing],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("t_comm_ms"), "{e:#}");
    }
}
