//! sync latency: the device primitives timed inside the kernel (clock64 per iteration, converted
//! at the clock the SM ran, crates/testkit/src/latency.rs), against an NCCL 4-byte all-reduce timed
//! in the same run (CUDA events per iteration, as in the nccl suite) and the seed's figures.
//! Every number is the median over all timed iterations of a rank; the reported time is the
//! slowest rank's median.
//!
//! Rows: one-way signal->wait across GPUs (a token passed around all ranks: lap / world), the
//! rank 0 <-> 1 ping-pong (round trip, and half of it), the all-rank barrier, the inter-SM
//! signal on one GPU (half a round trip between two blocks on different SMs), the intra-SM
//! mbarrier (half a round trip between two warps), and the ring stress kernel per round with
//! release/acquire against the same protocol without them (negative control, with the mismatches
//! it let through). Reference rows, timed in the same run: the ping-pong with the epoch stored
//! instead of added (ordered, and relaxed with no ordering: the link's floor) and a barrier built
//! from stored epochs, a slot per rank, so the primitives' cost is read against what the
//! hardware allows on this machine.

use super::SuiteResult;
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::{median, time_iterations};
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;
use weft_pgl::nccl::ReduceOp;
use weft_sync::WaitBudget;
use weft_testkit::latency::{Latency, LatencyKind};
use weft_testkit::stress::{Ordering, PendingStress, Stress, StressMode};

/// The seed's (parallelkittens.md §3.1.3) and docs/DESIGN.md §4's reference figures, in µs.
const SEED_MBARRIER_US: f64 = 0.064;
const SEED_INTER_SM_US: f64 = 0.832;
const ANCHOR_PING_PONG_US: f64 = 2.36;
const ANCHOR_ONE_WAY_US: f64 = 1.18;
/// Issue #25's goals, in µs.
const GOAL_ONE_WAY_US: f64 = 1.5;
const GOAL_BARRIER_US: f64 = 2.0;

/// One measured row before the cross-rank combination: this rank's value in µs (NaN when it
/// does not take part).
struct Measured {
    case: String,
    us: f64,
    reference: Option<(f64, &'static str)>,
    goal_us: Option<f64>,
    /// Stress rows: (mismatches, elements checked) on this rank.
    mismatches: Option<(u64, u64)>,
    /// Latency rows: the SM clock the timed loops ran at on this rank (median of the launches),
    /// in MHz; NaN elsewhere. Latencies in ns scale with it.
    clock_mhz: f64,
}

fn latency_rows(
    job: &mut Job,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    quick: bool,
) -> anyhow::Result<Vec<Measured>> {
    let world = job.world();
    let budget = WaitBudget::default_for(ctx)?;
    let (iters, launches) = if quick { (2_000, 3) } else { (20_000, 5) };
    let warmup = iters / 10;
    let mut kinds = Vec::new();
    if world >= 2 {
        kinds.extend([
            LatencyKind::Ring,
            LatencyKind::PingPong,
            LatencyKind::Barrier,
            LatencyKind::PingPongStore,
            LatencyKind::PingPongRelaxed,
            LatencyKind::BarrierStore,
        ]);
    }
    kinds.extend([LatencyKind::InterSm, LatencyKind::Mbarrier]);
    let mut rows = Vec::new();
    for kind in kinds {
        let mut lat = Latency::alloc(&mut job.rdzv, ctx, budget)?;
        let (mut ns, mut clocks) = (Vec::new(), Vec::new());
        let measured = (|| -> anyhow::Result<()> {
            for _ in 0..launches {
                if kind.cross_gpu() {
                    job.rdzv.barrier()?; // launch together; the in-kernel warm-up absorbs the skew
                }
                if let Some(s) = lat.run(stream, kind, warmup, iters)? {
                    ns.extend(s.ns);
                    clocks.push(s.clock_mhz);
                }
            }
            Ok(())
        })();
        lat.free(&mut job.rdzv)?;
        measured?;
        let us = if ns.is_empty() {
            f64::NAN
        } else {
            median(&ns) / 1e3
        };
        let w = world as f64;
        let clock_mhz = if clocks.is_empty() {
            f64::NAN
        } else {
            median(&clocks)
        };
        let part = |case: String, us: f64, reference, goal_us| Measured {
            case,
            us,
            reference,
            goal_us,
            mismatches: None,
            clock_mhz,
        };
        match kind {
            LatencyKind::Ring => rows.push(part(
                format!("one-way signal->wait (token ring over {world} GPUs, per hop)"),
                us / w,
                Some((ANCHOR_ONE_WAY_US, "docs/DESIGN.md §4 flag ping-pong / 2")),
                Some(GOAL_ONE_WAY_US),
            )),
            LatencyKind::PingPong => {
                rows.push(part(
                    "ping-pong round trip (ranks 0 <-> 1)".into(),
                    us,
                    Some((ANCHOR_PING_PONG_US, "docs/DESIGN.md §4 flag ping-pong")),
                    None,
                ));
                rows.push(part(
                    "one-way signal->wait (ping-pong / 2)".into(),
                    us / 2.0,
                    Some((ANCHOR_ONE_WAY_US, "docs/DESIGN.md §4 flag ping-pong / 2")),
                    Some(GOAL_ONE_WAY_US),
                ));
            }
            LatencyKind::Barrier => rows.push(part(
                format!("barrier ({world} ranks)"),
                us,
                None,
                Some(GOAL_BARRIER_US),
            )),
            LatencyKind::InterSm => rows.push(part(
                "inter-SM signal->wait, one GPU (round trip / 2)".into(),
                us / 2.0,
                Some((SEED_INTER_SM_US, "seed: inter-SM sync through HBM")),
                None,
            )),
            LatencyKind::Mbarrier => rows.push(part(
                "intra-SM mbarrier, two warps (round trip / 2)".into(),
                us / 2.0,
                Some((SEED_MBARRIER_US, "seed: intra-SM mbarrier")),
                None,
            )),
            LatencyKind::PingPongStore => rows.push(part(
                "reference: ping-pong / 2 by stored epochs, st.release.sys / ld.acquire.sys".into(),
                us / 2.0,
                Some((ANCHOR_ONE_WAY_US, "docs/DESIGN.md §4 flag ping-pong / 2")),
                None,
            )),
            LatencyKind::PingPongRelaxed => rows.push(part(
                "reference: ping-pong / 2 by stored epochs, relaxed, no ordering".into(),
                us / 2.0,
                None,
                None,
            )),
            LatencyKind::BarrierStore => rows.push(part(
                format!("reference: barrier from stored epochs, a slot per rank ({world} ranks)"),
                us,
                None,
                None,
            )),
        }
    }
    Ok(rows)
}

/// The ring stress kernel per round, with and without release/acquire.
fn stress_rows(
    job: &mut Job,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    quick: bool,
) -> anyhow::Result<Vec<Measured>> {
    let rounds: u32 = if quick { 5_000 } else { 50_000 };
    let budget = WaitBudget::default_for(ctx)?;
    let mut s = Stress::alloc(&mut job.rdzv, ctx, StressMode::Ring, 8192, 4, budget)?;
    let mut rows = Vec::new();
    let measured = (|| -> anyhow::Result<()> {
        for (ordering, name) in [
            (Ordering::ReleaseAcquire, "release/acquire"),
            (Ordering::Relaxed, "relaxed, no fences (negative control)"),
        ] {
            job.rdzv.barrier()?;
            let mut pending: Vec<PendingStress> = Vec::new();
            let ms = time_iterations(stream, 1, 3, || {
                pending.push(s.launch(stream, rounds, 0x5EED, ordering)?);
                Ok(())
            })?;
            let (mut bad, mut checked) = (0, 0);
            for p in pending {
                let report = s.finish(stream, p)?;
                if ordering == Ordering::ReleaseAcquire {
                    report.verify()?;
                }
                bad += report.mismatches;
                checked += report.checked;
            }
            rows.push(Measured {
                case: format!("stress ring, random payloads up to 32 KiB, {name} (per round)"),
                us: median(&ms) * 1e3 / rounds as f64,
                reference: None,
                goal_us: None,
                mismatches: Some((bad, checked)),
                clock_mhz: f64::NAN,
            });
        }
        Ok(())
    })();
    s.free(&mut job.rdzv)?;
    measured.map(|()| rows)
}

fn nccl_all_reduce_4b_us(job: &mut Job, quick: bool) -> anyhow::Result<f64> {
    let (comm, gpu) = job.comm_and_gpu()?;
    let send = gpu.stream.clone_htod(&[1.0f32])?;
    let mut recv = gpu.stream.clone_htod(&[0.0f32])?;
    let ms = time_iterations(&gpu.stream, 20, if quick { 100 } else { 500 }, || {
        comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &gpu.stream)
            .map_err(anyhow::Error::from)
    })?;
    Ok(median(&ms) * 1e3)
}

fn fmt_us(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "-".into()
    }
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let (ctx, stream) = {
        let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
        (gpu.ctx.clone(), gpu.stream.clone())
    };
    let mut measured = latency_rows(job, &ctx, &stream, quick)?;
    measured.extend(stress_rows(job, &ctx, &stream, quick)?);
    let nccl_us = nccl_all_reduce_4b_us(job, quick)?;

    // Per rank: every row's value, then the NCCL time, then (mismatches, checked) of stress rows,
    // then every row's SM clock.
    let mut mine: Vec<f64> = measured.iter().map(|m| m.us).collect();
    mine.push(nccl_us);
    mine.extend(measured.iter().flat_map(|m| {
        m.mismatches
            .map_or([0.0, 0.0], |(b, c)| [b as f64, c as f64])
    }));
    mine.extend(measured.iter().map(|m| m.clock_mhz));
    let all = super::gather_f64(job, &mine)?;
    let n = measured.len();
    let across = |i: usize| -> (f64, f64) {
        let v: Vec<f64> = all.iter().map(|r| r[i]).filter(|x| x.is_finite()).collect();
        (
            v.iter().cloned().fold(f64::NAN, f64::max),
            v.iter().cloned().fold(f64::NAN, f64::min),
        )
    };
    let (nccl_slowest, nccl_fastest) = across(n);

    let mut table = Table {
        headers: vec![
            "case",
            "median (us)",
            "min rank (us)",
            "NCCL 4 B all-reduce (us)",
            "vs NCCL",
            "reference (us)",
            "goal (us)",
            "notes",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (i, m) in measured.iter().enumerate() {
        let (slowest, fastest) = across(i);
        let (bad, checked) = all.iter().fold((0.0, 0.0), |(b, c), r| {
            (b + r[n + 1 + 2 * i], c + r[n + 2 + 2 * i])
        });
        let (_, clock_min) = across(n + 1 + 2 * n + i);
        let meets = m.goal_us.map(|g| if slowest <= g { "yes" } else { "no" });
        let notes = match (m.mismatches, meets) {
            (Some(_), _) => format!("{bad:.0} of {checked:.0} elements wrong"),
            (None, Some(ok)) => format!("meets goal: {ok}"),
            (None, None) => String::new(),
        };
        table.rows.push(vec![
            m.case.clone(),
            fmt_us(slowest),
            fmt_us(fastest),
            fmt_us(nccl_slowest),
            format!("{:.1}x", nccl_slowest / slowest),
            m.reference.map_or(String::new(), |(r, _)| fmt_us(r)),
            m.goal_us.map_or(String::new(), fmt_us),
            notes,
        ]);
        rows.push(json::obj([
            ("case", Json::from(m.case.as_str())),
            ("weft_ms", Json::from(slowest / 1e3)),
            ("weft_us", Json::from(slowest)),
            ("min_rank_us", Json::from(fastest)),
            ("baseline", Json::from("NCCL all_reduce 4 B f32, same run")),
            ("baseline_ms", Json::from(nccl_slowest / 1e3)),
            ("ratio", Json::from(nccl_slowest / slowest)),
            ("reference_us", Json::from(m.reference.map(|r| r.0))),
            ("reference", Json::from(m.reference.map(|r| r.1))),
            ("goal_us", Json::from(m.goal_us)),
            ("meets_goal", Json::from(meets)),
            (
                "sm_clock_mhz_min_rank",
                Json::from(clock_min.is_finite().then_some(clock_min)),
            ),
            ("mismatches", Json::from(m.mismatches.map(|_| bad))),
            (
                "elements_checked",
                Json::from(m.mismatches.map(|_| checked)),
            ),
        ]));
    }
    table.rows.push(vec![
        "NCCL all_reduce 4 B (baseline)".into(),
        fmt_us(nccl_slowest),
        fmt_us(nccl_fastest),
        fmt_us(nccl_slowest),
        "1.0x".into(),
        "19.000".into(),
        String::new(),
        "reference: docs/DESIGN.md §4".into(),
    ]);
    rows.push(json::obj([
        ("case", Json::from("NCCL all_reduce 4 B f32")),
        ("weft_ms", Json::from(nccl_slowest / 1e3)),
        ("min_rank_us", Json::from(nccl_fastest)),
        ("baseline", Json::from("NCCL all_reduce 4 B f32, same run")),
        ("baseline_ms", Json::from(nccl_slowest / 1e3)),
        ("ratio", Json::from(1.0)),
        ("reference_us", Json::from(19.0)),
        (
            "reference",
            Json::from("docs/DESIGN.md §4: NCCL all-reduce of 4 B"),
        ),
    ]));
    Ok(SuiteResult { table, rows })
}
