//! `weft tune [--quick] [--out PATH] [--json PATH]`: the wave-group tuner's offline stage
//! (crates/signal-gemm/src/tuner) on this job's GPUs, then a check of its predictions.
//!
//! 1. Profile: NCCL AllReduce and ReduceScatter times on a dense log-spaced range of send sizes,
//!    with NCCL's default CTAs and limited to each SM margin's CTAs; weft's GEMM alone per shape
//!    and margin; cuBLAS per shape; the restore per MiB.
//! 2. Contention: NCCL runs slower beside the GEMM than alone, the more so the fewer CTAs it has.
//!    One factor per collective and margin scales its curve; it is fitted (bisection) so the
//!    model's prediction of each calibration shape's best partition at that margin equals its
//!    measured time, and the largest over the calibration shapes kept, at least 1 (conservative:
//!    an over-predicted overlap only makes the tuner fall back to the sequential path).
//! 3. The tuning file is written (`--out`, default weft-tuning.txt).
//! 4. Check: for every shape and collective, the tuner's choice (overlap partition, or the
//!    sequential fallback) and two other partitions are measured next to cuBLAS + NCCL; the table
//!    reports each prediction's error and the chosen path's speedup; the summary gives the mean
//!    error over all predictions and over overlap predictions only (the sequential ones are of
//!    profiled cuBLAS times, nearly exact). Calibration shapes are marked: their errors are not
//!    out-of-sample.
//!
//! Times are the slowest rank's medians (bench/rig.rs). Rank 0 draws a progress bar on stderr.

use super::grid::large_shapes as shapes;
use super::overlap_ops::{collective, out_len, Signal};
use super::rig::{slowest, Rig};
use super::SuiteResult;
use crate::gemm_data::{poisoned, uniform, upload};
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use anyhow::Context;
use half::bf16;
use std::io::Write;
use std::path::PathBuf;
use weft_pgl::nccl::Communicator;
use weft_signal_gemm::tuner::{
    best_overlap, predict_overlap, tune, Choice, CommCurve, GemmSample, Op, TuningProfile,
};
use weft_signal_gemm::{CublasGemm, Gemm, GemmOptions, GemmPlan, GemmShape, WaveGroups};

const OPS: [Op; 2] = [Op::AllReduce, Op::ReduceScatter];

#[derive(Debug, Default)]
pub struct TuneOptions {
    pub quick: bool,
    pub out: Option<PathBuf>,
    pub json: Option<PathBuf>,
}

/// `weft tune`'s flags (clap: `weft tune --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "weft tune",
    about = "Profile NCCL and the GEMM, write the overlap tuning file (WEFT_TUNING), and check its predictions against measurements",
    after_help = "Run under a launcher with one rank per GPU; every rank must pass the same flags."
)]
struct TuneArgs {
    /// Fewer shapes and sizes
    #[arg(long)]
    quick: bool,
    /// The tuning file to write (default weft-tuning.txt)
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Write the check's results file
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// `args` without the leading `tune`: the options, or the text `--help` prints.
pub fn parse(args: &[String]) -> anyhow::Result<Result<TuneOptions, String>> {
    use clap::Parser;
    match TuneArgs::try_parse_from(
        std::iter::once("weft tune").chain(args.iter().map(String::as_str)),
    ) {
        Ok(a) => Ok(Ok(TuneOptions {
            quick: a.quick,
            out: a.out,
            json: a.json,
        })),
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => {
            Ok(Err(e.render().to_string()))
        }
        Err(e) => anyhow::bail!("{}", crate::bench::clap_error_text(&e)),
    }
}

/// Rank 0's progress bar on stderr.
struct Progress {
    show: bool,
    done: usize,
    total: usize,
}

impl Progress {
    fn step(&mut self, what: &str) {
        crate::watchdog::step(&format!("tune step {what}"));
        self.done += 1;
        if self.show {
            let width = 30;
            let filled = width * self.done / self.total.max(1);
            eprint!(
                "\rweft tune [{}{}] {:>3}/{} {what:<60}",
                "#".repeat(filled),
                ".".repeat(width - filled),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
            if self.done == self.total {
                eprintln!();
            }
        }
    }
}

/// Send sizes sampled for the curves: log-spaced from 256 KiB to 512 MiB (4 per octave, 2 with
/// --quick), each a multiple of world × 256 bytes (ReduceScatter splits it evenly).
fn sizes(quick: bool, world: usize) -> Vec<u64> {
    let per_octave = if quick { 2 } else { 4 };
    let unit = (world * 256) as u64;
    let mut v: Vec<u64> = (0..=11 * per_octave)
        .map(|i| {
            let bytes = (256u64 << 10) as f64 * 2f64.powf(i as f64 / per_octave as f64);
            (bytes as u64).div_ceil(unit) * unit
        })
        .collect();
    v.dedup();
    v
}

pub fn run(job: &mut Job, opts: &TuneOptions) -> anyhow::Result<SuiteResult> {
    let (rank, world) = (job.rank(), job.world());
    let gpu = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("weft tune needs a GPU: {w}"))?;
    let (ctx, compute) = (gpu.ctx.clone(), gpu.stream.clone());
    let sms = weft_signal_gemm::device_sms(&ctx)?;
    let device = crate::info::gpu_info(gpu.ordinal)?.name;
    let mut rig = Rig::with_comm_stream(&compute, if opts.quick { 8 } else { 15 }, 3)?;
    let margins: Vec<u32> = if opts.quick {
        vec![32]
    } else {
        vec![16, 32, 48]
    };
    // Calibration: the quick set (K = 2048 and 1024) and a long-K shape; NCCL's slowdown beside
    // the GEMM grows with the GEMM's K (measured: a factor fitted at short K under-predicted
    // K = 7168 by 18-30 %).
    let mut calibration = shapes(true);
    calibration.push(GemmShape::new(8192, 8192, 7168));
    let shapes = shapes(opts.quick);
    let sizes = sizes(opts.quick, world);
    let base = GemmOptions::default();
    let mut progress = Progress {
        show: rank == 0,
        done: 0,
        total: OPS.len() * (margins.len() + 1)
            + shapes.len() * (margins.len() + 1)
            + 2
            + OPS.len() * margins.len() * calibration.len()
            + OPS.len() * shapes.len(),
    };
    let mut limited: Vec<(u32, Communicator)> = Vec::new();
    for &m in &margins {
        limited.push((
            m,
            Communicator::with_max_ctas(&mut job.rdzv, &ctx, Some(m))?,
        ));
    }
    job.comm()?;
    let mut profile = TuningProfile {
        device: device.clone(),
        world: world as u32,
        sms,
        ..Default::default()
    };

    // 1. Curves.
    let largest = *sizes.last().unwrap() as usize / 2;
    let send = upload(&compute, &uniform::<bf16>(7 + rank as u64, largest))?;
    let mut recv = poisoned::<bf16>(&compute, largest)?;
    for op in OPS {
        let mut measured: Vec<(Option<u32>, Vec<f64>)> = Vec::new();
        {
            let mut comms: Vec<(Option<u32>, &Communicator)> = vec![(None, job.comm()?)];
            comms.extend(limited.iter().map(|(m, c)| (Some(*m), c)));
            for (max_ctas, comm) in comms {
                let mut times = Vec::new();
                for &bytes in &sizes {
                    let n = bytes as usize / 2;
                    let s = send.slice(..n);
                    let mut r = recv.slice_mut(..out_len(op, n, world));
                    times.push(rig.time(|| collective(op, comm, &s, &mut r, &compute))?);
                }
                measured.push((max_ctas, times));
                progress.step(&format!("{} curve, max_ctas {max_ctas:?}", op.name()));
            }
        }
        for (max_ctas, times) in measured {
            let worst = slowest(job, &times)?;
            profile.comm.push(CommCurve {
                op,
                max_ctas,
                points: sizes.iter().copied().zip(worst).collect(),
            });
        }
    }
    drop((send, recv));

    // 2. GEMMs alone.
    for &shape in &shapes {
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let a = upload(&compute, &uniform::<bf16>(11 + rank as u64, m * k))?;
        let b = upload(&compute, &uniform::<bf16>(13 + rank as u64, k * n))?;
        let mut d = poisoned::<bf16>(&compute, m * n)?;
        let cublas = CublasGemm::new(&compute, shape, base)?;
        let t = rig.time(|| cublas.launch(&a, &b, &mut d).map_err(anyhow::Error::from))?;
        profile.cublas.push((shape, slowest(job, &[t])?[0]));
        progress.step(&format!("cuBLAS {shape}"));
        for &margin in &margins {
            let gemm = Gemm::new(
                &ctx,
                shape,
                GemmOptions {
                    sm_margin: margin,
                    ..base
                },
            )?;
            let t = slowest(
                job,
                &[rig.time(|| {
                    gemm.launch(&compute, &a, &b, &mut d)
                        .map_err(anyhow::Error::from)
                })?],
            )?[0];
            let plan = gemm.plan();
            profile.gemm.push(GemmSample {
                shape,
                sm_margin: margin,
                tile_n: plan.tile_n(),
                ms: t,
                waves: plan.waves(),
            });
            progress.step(&format!("weft GEMM {shape} margin {margin}"));
        }
    }

    // The restore per MiB of output, from a large shape.
    let big = GemmShape::new(8192, 8192, 1024);
    for op in OPS {
        let plan = GemmPlan::new(
            sms,
            big,
            GemmOptions {
                sm_margin: margins[0],
                ..base
            },
        )?;
        let waves = vec![plan.waves()];
        let sig = Signal::new(op, &compute, big, plan.options, &waves, world, rank)?;
        let mut out = poisoned::<bf16>(&compute, sig.rows(big.m).len() * big.n as usize)?;
        let t = slowest(job, &[rig.time(|| sig.restore(&compute, &mut out))?])?[0];
        let mib = (out.len() * 2) as f64 / f64::from(1u32 << 20);
        profile.restore.push((op, t / mib));
        progress.step(&format!("{} restore", op.name()));
    }

    // Measures one overlap of `shape` (margin, partition), slowest rank.
    let measure = |job: &mut Job,
                   rig: &mut Rig,
                   op: Op,
                   shape: GemmShape,
                   margin: u32,
                   waves: &[u32]|
     -> anyhow::Result<f64> {
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let a = upload(&compute, &uniform::<bf16>(17 + rank as u64, m * k))?;
        let b = upload(&compute, &uniform::<bf16>(19 + rank as u64, k * n))?;
        let options = GemmOptions {
            sm_margin: margin,
            ..base
        };
        let mut sig = Signal::new(op, &compute, shape, options, waves, world, rank)?;
        let mut out = poisoned::<bf16>(&compute, sig.rows(shape.m).len() * n)?;
        let lcomm = &limited
            .iter()
            .find(|l| l.0 == margin)
            .context("no communicator for this margin")?
            .1;
        let t = rig.time(|| sig.run(&compute, lcomm, &a, &b, &mut out))?;
        compute.synchronize()?;
        sig.check()?;
        Ok(slowest(job, &[t])?[0])
    };

    // 3. Contention: fit each collective's factor per margin on the calibration shapes.
    for op in OPS {
        for &margin in &margins {
            let mut factors = Vec::new();
            for &shape in &calibration {
                let (plan, waves, _) = best_overlap(&profile, op, shape, base, Some(margin))?;
                let measured = measure(job, &mut rig, op, shape, margin, &waves)?;
                factors.push(fit_contention(&profile, op, &plan, &waves, measured)?);
                progress.step(&format!(
                    "{} contention, margin {margin}, on {shape}",
                    op.name()
                ));
            }
            // The largest, and at least 1: an over-predicted overlap falls back to the
            // sequential path, an under-predicted one runs slower than it.
            let worst = factors.iter().copied().fold(1.0f64, f64::max);
            if rank == 0
                && factors
                    .iter()
                    .any(|&f| f <= CONTENTION_RANGE.0 || f >= CONTENTION_RANGE.1)
            {
                eprintln!("\nweft tune: a {} contention fit at margin {margin} hit the bound of {CONTENTION_RANGE:?}: {factors:?}", op.name());
            }
            profile.contention.push((op, margin, worst));
        }
    }

    // 4. The tuning file.
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("weft-tuning.txt"));
    if rank == 0 {
        super::write_file(&out, &profile.to_text())?;
    }

    // 5. Check the predictions.
    let mut table = Table {
        headers: vec![
            "op",
            "M x N x K",
            "choice",
            "predicted",
            "measured",
            "error",
            "seq-cublas",
            "speedup",
            "other partitions (pred/meas)",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    for op in OPS {
        for &shape in &shapes {
            let choice = tune(&profile, op, shape, base, sms, world as u32)?;
            let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
            let a = upload(&compute, &uniform::<bf16>(23 + rank as u64, m * k))?;
            let b = upload(&compute, &uniform::<bf16>(29 + rank as u64, k * n))?;
            let mut d = poisoned::<bf16>(&compute, m * n)?;
            let mut o = poisoned::<bf16>(&compute, out_len(op, m * n, world))?;
            let cublas = CublasGemm::new(&compute, shape, base)?;
            let comm = job.comm()?;
            let seq = rig.time(|| {
                cublas.launch(&a, &b, &mut d)?;
                collective(op, comm, &d, &mut o, &compute)
            })?;
            let seq = slowest(job, &[seq])?[0];
            drop((a, b, d, o));
            let seq_pred = match &choice {
                Choice::Sequential { predicted_ms, .. } => *predicted_ms,
                Choice::Overlap { sequential_ms, .. } => *sequential_ms,
            };
            // The chosen path's measured time, and the predicted/measured pairs of overlaps.
            let (label, chosen_pred, chosen_meas, plan, best_waves) = match &choice {
                Choice::Sequential { predicted_ms, .. } => {
                    let (plan, waves, _) = best_overlap(&profile, op, shape, base, None)?;
                    ("sequential".to_string(), *predicted_ms, seq, plan, waves)
                }
                Choice::Overlap {
                    sm_margin,
                    waves,
                    predicted_ms,
                    ..
                } => {
                    let plan = GemmPlan::new(
                        sms,
                        shape,
                        GemmOptions {
                            sm_margin: *sm_margin,
                            ..base
                        },
                    )?;
                    let t = measure(job, &mut rig, op, shape, *sm_margin, waves)?;
                    (
                        format!("margin {sm_margin} groups {}", fmt_waves(waves)),
                        *predicted_ms,
                        t,
                        plan,
                        waves.clone(),
                    )
                }
            };
            // (predicted, measured, is an overlap prediction)
            let mut pairs = vec![(seq_pred, seq, false)];
            if matches!(choice, Choice::Overlap { .. }) {
                pairs.push((chosen_pred, chosen_meas, true));
            }
            // Two other partitions at the same margin: the best overlap (when the choice was
            // sequential) or one wave per group, and [1, rest].
            let w = plan.waves();
            let mut others: Vec<Vec<u32>> = Vec::new();
            if matches!(choice, Choice::Sequential { .. }) {
                others.push(best_waves.clone());
            } else {
                others.push(
                    WaveGroups::uniform(&plan, w.div_ceil(32).max(1))?
                        .waves()
                        .to_vec(),
                );
            }
            if w > 1 {
                others.push(vec![1, w - 1]);
            }
            others.retain(|o| *o != best_waves || matches!(choice, Choice::Sequential { .. }));
            let mut other_txt = Vec::new();
            let mut other_json = Vec::new();
            for waves in others.iter().take(2) {
                let groups = WaveGroups::new(&plan, waves)?;
                let pred = predict_overlap(&profile, op, &plan, &groups)?;
                let meas = measure(job, &mut rig, op, shape, plan.options.sm_margin, waves)?;
                pairs.push((pred, meas, true));
                other_txt.push(format!("{}: {pred:.3}/{meas:.3}", fmt_waves(waves)));
                other_json.push(json::obj([
                    ("groups", Json::String(fmt_waves(waves))),
                    ("predicted_ms", json::num(pred)),
                    ("measured_ms", json::num(meas)),
                ]));
            }
            let calibrated = calibration.contains(&shape);
            for &(p, m, overlap) in &pairs {
                errors.push(((p - m).abs() / m, calibrated, overlap));
            }
            let err = (chosen_pred - chosen_meas).abs() / chosen_meas;
            table.rows.push(vec![
                op.name().to_string(),
                format!("{shape}{}", if calibrated { " (cal.)" } else { "" }),
                label.clone(),
                format!("{chosen_pred:.3}"),
                format!("{chosen_meas:.3}"),
                format!("{:.1}%", 100.0 * err),
                format!("{seq:.3}"),
                format!("{:.3}", seq / chosen_meas),
                other_txt.join(", "),
            ]);
            rows.push(json::obj([
                ("op", Json::String(op.name().into())),
                ("m", json::num(f64::from(shape.m))),
                ("n", json::num(f64::from(shape.n))),
                ("k", json::num(f64::from(shape.k))),
                (
                    "calibration_shape",
                    json::num(if calibrated { 1.0 } else { 0.0 }),
                ),
                ("choice", Json::String(label)),
                ("predicted_ms", json::num(chosen_pred)),
                ("measured_ms", json::num(chosen_meas)),
                ("prediction_error", json::num(err)),
                ("seq_cublas_ms", json::num(seq)),
                ("seq_cublas_predicted_ms", json::num(seq_pred)),
                ("speedup_vs_seq_cublas", json::num(seq / chosen_meas)),
                ("sm_margin", json::num(f64::from(plan.options.sm_margin))),
                ("other_partitions", Json::Array(other_json)),
            ]));
            progress.step(&format!("check {} {shape}", op.name()));
        }
    }
    // (mean, max, count) of the errors whose (calibrated, overlap) flags pass `f`.
    let stats = |f: &dyn Fn(bool, bool) -> bool| {
        let v: Vec<f64> = errors.iter().filter(|e| f(e.1, e.2)).map(|e| e.0).collect();
        (
            v.iter().sum::<f64>() / v.len().max(1) as f64,
            v.iter().copied().fold(0.0, f64::max),
            v.len(),
        )
    };
    let (all, _, n_all) = stats(&|_, _| true);
    let (held_out, _, n_held) = stats(&|c, _| !c);
    let (ov, ov_max, n_ov) = stats(&|_, o| o);
    let (ov_held, ov_held_max, n_ov_held) = stats(&|c, o| o && !c);
    if rank == 0 {
        println!("wrote the tuning file {}", out.display());
        println!(
            "mean prediction error: {:.1}% over {n_all} predictions ({:.1}% over the {n_held} of shapes not used for calibration); \
             overlap predictions only: {:.1}% over {n_ov} (max {:.1}%), {:.1}% over the {n_ov_held} held out (max {:.1}%)",
            100.0 * all,
            100.0 * held_out,
            100.0 * ov,
            100.0 * ov_max,
            100.0 * ov_held,
            100.0 * ov_held_max
        );
    }
    for (op, margin, f) in &profile.contention {
        rows.push(json::obj([
            ("contention_op", Json::String(op.name().into())),
            ("sm_margin", json::num(f64::from(*margin))),
            ("factor", json::num(*f)),
        ]));
    }
    rows.push(json::obj([
        ("mean_prediction_error", json::num(all)),
        ("predictions", json::num(n_all as f64)),
        ("mean_prediction_error_held_out", json::num(held_out)),
        ("predictions_held_out", json::num(n_held as f64)),
        ("mean_prediction_error_overlap", json::num(ov)),
        ("max_prediction_error_overlap", json::num(ov_max)),
        ("predictions_overlap", json::num(n_ov as f64)),
        ("mean_prediction_error_overlap_held_out", json::num(ov_held)),
        ("predictions_overlap_held_out", json::num(n_ov_held as f64)),
        ("tuning_file", Json::String(profile.to_text())),
    ]));
    Ok(SuiteResult { table, rows })
}

fn fmt_waves(w: &[u32]) -> String {
    format!(
        "[{}]",
        w.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    )
}

/// The range the contention fit searches.
const CONTENTION_RANGE: (f64, f64) = (0.25, 8.0);

/// The contention factor that makes the model predict `measured` for this partition (bisection
/// on CONTENTION_RANGE, clamped to it; the prediction grows with the factor).
fn fit_contention(
    profile: &TuningProfile,
    op: Op,
    plan: &GemmPlan,
    waves: &[u32],
    measured: f64,
) -> anyhow::Result<f64> {
    let groups = WaveGroups::new(plan, waves)?;
    let mut p = profile.clone();
    let mut predict = |f: f64| -> anyhow::Result<f64> {
        p.contention = vec![(op, plan.options.sm_margin, f)];
        predict_overlap(&p, op, plan, &groups).map_err(anyhow::Error::from)
    };
    let (mut lo, mut hi) = CONTENTION_RANGE;
    if predict(lo)? >= measured {
        return Ok(lo);
    }
    if predict(hi)? <= measured {
        return Ok(hi);
    }
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if predict(mid)? < measured {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(0.5 * (lo + hi))
}
