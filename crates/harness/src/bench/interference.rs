//! `weft bench interference`: what each part of signal-gemm II's signalling costs the GEMM, on
//! one GPU (no communication: the overlap issues' "interference" is the signalling GEMM alone
//! against the plain GEMM on the same SMs). Per shape (the overlap shapes) at sm_margin 32, the
//! same `Gemm` launched as:
//!
//! - `plain`: standard layout, nothing else (the reference);
//! - `plain+joins`: the same between the pipeline's stream joins (the communication stream joins
//!   the compute stream before, the compute stream joins it after) with nothing on the other side;
//! - `tile-order`, `bands-4`: the AllReduce / ReduceScatter (4 ranks) reorder maps, no signals
//!   (and `bands-2`, `-3`, `-8`: the band map at other world sizes, its TMA boxes per chunk 1 to 8);
//! - `… +signals (G groups)`: the map plus the wave-group signals and, on the communication
//!   stream, one wait kernel per group between the joins — exactly `run_gemm_only` of the
//!   overlaps; the most groups a launch may have (1 wave each, up to 32 groups) and 2 groups;
//! - `… +signals (N groups, no waits)`: the signals without the wait kernels (what the chain of
//!   waits on the other stream costs; the counters are never rearmed, so not a pipeline);
//! - `tile-order+signals (N groups, last wait only)`: one wait kernel, on the last group, that
//!   polls through the whole GEMM (what polling costs, without N − 1 kernel launches and exits);
//! - `plain+side kernels (N)`: the plain GEMM between the joins with N one-tile GEMMs on the
//!   communication stream (what N short kernels beside it cost, with no signal or poll at all);
//! - `… (graph)`: the same launch sequence captured once in a CUDA graph and replayed (the
//!   overlaps are capturable; whether replay makes the kernels beside the GEMM cheaper); the
//!   first replay runs alone and its output is checked like the eager run's;
//! - `…, normal priority`: the same with a communication stream of default priority instead of
//!   the pipeline's greatest.
//!
//! Two times each: the median of CUDA events on the compute stream (what the overlap benches
//! call the GEMM's time), and the median kernel span from `LaunchExtras::timeline` (first compute
//! CTA start to last CTA end, %globaltimer), which leaves out launch and join latencies. Each
//! iteration after a 256 MiB L2-evicting write; every variant's output is checked once against
//! the plain launch (tile order and bands through their restore, bit for bit).

use super::rig::{slowest, Rig};
use super::SuiteResult;
use crate::gemm_data::{band_receive, download, poison, poisoned, uniform, upload};
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::median;
use cudarc::driver::{sys, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use weft_kernels::abi::WEFT_GEMM_MAX_WAVE_GROUPS;
use weft_signal_gemm::{
    Gemm, GemmOptions, GemmPlan, GemmShape, GroupCounters, KSplits, LaunchExtras, OutputLayout,
    RankBandMap, Restore, TileOrderMap, WaveGroups,
};

const MARGIN: u32 = 32;
const BAND_RANKS: u32 = 4;

/// One way to launch the GEMM.
struct Variant {
    name: String,
    layout: OutputLayout,
    /// Wave-group signals (waves per group).
    groups: Option<Vec<u32>>,
    /// Which groups get a wait kernel on the communication stream.
    waits: Waits,
    /// The pipeline's stream joins around the launch.
    joins: bool,
    /// One-tile GEMMs launched on the communication stream after the GEMM (diagnostic).
    side_kernels: usize,
    /// A communication stream of default priority instead of the pipeline's (diagnostic).
    normal_priority: bool,
    /// Captured once in a CUDA graph and timed as graph replays (with the timeline).
    graph: bool,
}

impl Variant {
    /// The GEMM launched alone in `layout`: no joins, signals, waits or side kernels.
    fn alone(name: impl Into<String>, layout: OutputLayout) -> Self {
        Variant {
            name: name.into(),
            layout,
            groups: None,
            waits: Waits::None,
            joins: false,
            side_kernels: 0,
            normal_priority: false,
            graph: false,
        }
    }

    /// The same between the pipeline's stream joins.
    fn joined(name: impl Into<String>, layout: OutputLayout) -> Self {
        Variant {
            joins: true,
            ..Self::alone(name, layout)
        }
    }
}

/// The wait kernels of a variant with group signals. Anything but `All` is a diagnostic: the
/// counters of unwaited groups are never rearmed and only grow, so it is not a usable pipeline.
#[derive(Clone, Copy, PartialEq)]
enum Waits {
    None,
    All,
    LastOnly,
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
    let (ctx, compute) = (gpu.ctx.clone(), gpu.stream.clone());
    let mut rig = Rig::with_comm_stream(&compute, if quick { 15 } else { 30 }, 3)?;
    let mut table = Table {
        headers: vec![
            "M x N x K",
            "variant",
            "event ms",
            "span ms",
            "event / plain",
            "span / plain",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    // The side kernel: a one-tile GEMM into its own output, on free SMs.
    let side = Gemm::new(&ctx, GemmShape::new(128, 128, 64), GemmOptions::default())?;
    let side_a = upload(&compute, &uniform::<bf16>(0x3f, 128 * 64))?;
    let side_b = upload(&compute, &uniform::<bf16>(0x4f, 64 * 128))?;
    let mut side_d = compute.alloc_zeros::<bf16>(128 * 128)?;
    // The communication stream at default priority (the diagnostics' other stream).
    let normal = ctx.new_stream()?;
    for shape in super::grid::large_shapes(quick) {
        super::progress(job.rank(), "interference", &format!("{shape}"));
        let GemmShape { m, n, k } = shape;
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let a = upload(
            &compute,
            &uniform::<bf16>(0x1f ^ u64::from(m) ^ (u64::from(k) << 20), mu * ku),
        )?;
        let b = upload(&compute, &uniform::<bf16>(0x2f ^ u64::from(k), ku * nu))?;
        let options = GemmOptions {
            sm_margin: MARGIN,
            // Whole tiles: the variants' outputs are compared bit for bit with the plain launch's.
            k_splits: KSplits::Fixed(1),
            ..GemmOptions::default()
        };
        let gemm = Gemm::new(&ctx, shape, options)?;
        let plan = gemm.plan().clone();
        let waves = plan.waves();
        let plain = |name: String| Variant::joined(name, OutputLayout::Standard);
        let mut variants = vec![
            Variant::alone("plain", OutputLayout::Standard),
            plain("plain+joins".into()),
            Variant {
                graph: true,
                ..plain("plain (graph)".into())
            },
        ];
        // The most groups a launch may have (one wave each, or as few waves as fit).
        let most = WaveGroups::uniform(&plan, waves.div_ceil(WEFT_GEMM_MAX_WAVE_GROUPS))?
            .waves()
            .to_vec();
        // As many short kernels beside it as the most groups have waits.
        let most_groups = most.len();
        for (what, normal_priority) in [("", false), (", normal priority", true)] {
            variants.push(Variant {
                side_kernels: most_groups,
                normal_priority,
                ..plain(format!("plain+side kernels ({most_groups}{what})"))
            });
        }
        // The band map alone at other world sizes: one box per 64-row chunk at 2 ranks (as
        // tile-order stores), two at 4, four at 8, eight at 3 (8-row boxes).
        for ranks in [2, 3, 8] {
            variants.push(Variant::alone(
                format!("bands-{ranks}"),
                OutputLayout::RankBands { ranks },
            ));
        }
        let bands = OutputLayout::RankBands { ranks: BAND_RANKS };
        for (label, layout) in [("tile-order", OutputLayout::TileOrder), ("bands-4", bands)] {
            variants.push(Variant::alone(label, layout));
            let mut groupings = vec![most.clone()];
            if waves > 1 {
                groupings.push(vec![waves.div_ceil(2), waves / 2]);
            }
            let tile_order = layout == OutputLayout::TileOrder;
            for (i, g) in groupings.into_iter().enumerate() {
                let signals = |what: &str| {
                    let name = format!("{label}+signals ({} groups{what})", g.len());
                    Variant {
                        groups: Some(g.clone()),
                        waits: Waits::All,
                        ..Variant::joined(name, layout)
                    }
                };
                if i == 0 {
                    variants.push(Variant {
                        waits: Waits::None,
                        ..signals(", no waits")
                    });
                }
                if i == 0 && tile_order {
                    variants.push(Variant {
                        waits: Waits::LastOnly,
                        ..signals(", last wait only")
                    });
                    variants.push(Variant {
                        normal_priority: true,
                        ..signals(", waits at normal priority")
                    });
                }
                if tile_order {
                    variants.push(Variant {
                        graph: true,
                        ..signals(", graph")
                    });
                }
                variants.push(signals(""));
            }
        }
        // The reference output, and the maps that restore the others to it.
        let mut d = poisoned::<bf16>(&compute, mu * nu)?;
        gemm.launch(&compute, &a, &b, &mut d)?;
        let reference = download(&compute, &d)?;
        let mut timeline = compute.alloc_zeros::<u64>(2)?;
        let mut times = Vec::new();
        for v in &variants {
            let counters = match &v.groups {
                Some(w) => Some(GroupCounters::new(&compute, WaveGroups::new(&plan, w)?, 0)?),
                None => None,
            };
            let len = v.layout.elements(&plan) as usize;
            let mut out = poisoned::<bf16>(&compute, len)?;
            let x = if v.normal_priority {
                normal.clone()
            } else {
                rig.comm_stream.clone()
            };
            let mut launch = |out: &mut CudaSlice<bf16>,
                              tl: Option<&mut CudaSlice<u64>>|
             -> anyhow::Result<()> {
                if v.joins {
                    x.join(&compute)?;
                }
                let extras = LaunchExtras {
                    layout: v.layout,
                    groups: counters.as_ref(),
                    timeline: tl,
                    ..Default::default()
                };
                gemm.launch_with(&compute, &a, &b, out, extras)?;
                if let Some(c) = &counters {
                    let n = c.groups().count();
                    match v.waits {
                        Waits::None => {}
                        Waits::All => (0..n).try_for_each(|g| c.wait(&x, g))?,
                        Waits::LastOnly => c.wait(&x, n - 1)?,
                    }
                }
                for _ in 0..v.side_kernels {
                    side.launch(&x, &side_a, &side_b, &mut side_d)?;
                }
                if v.joins {
                    compute.join(&x)?;
                }
                Ok(())
            };
            launch(&mut out, None)?;
            compute.synchronize()?;
            gemm.check()?;
            if let Some(c) = &counters {
                c.check()?;
            }
            check_variant(&compute, v, &plan, &out, &reference)?;
            let (event_ms, span_ms) = if v.graph {
                // Captured with the timeline, which span() resets and reads around each replay.
                compute.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
                let captured = launch(&mut out, Some(&mut timeline));
                let graph = compute.end_capture(sys::CUgraphInstantiate_flags(0));
                captured?;
                let graph = graph?
                    .ok_or_else(|| anyhow::anyhow!("{}: the capture produced no graph", v.name))?;
                // One replay alone first, its output checked like the eager run's.
                poison(&compute, &mut out)?;
                graph.launch()?;
                compute.synchronize()?;
                gemm.check()?;
                if let Some(c) = &counters {
                    c.check()?;
                }
                check_variant(&compute, v, &plan, &out, &reference)
                    .map_err(|e| e.context("after a graph replay"))?;
                let event_ms = rig.time(|| Ok(graph.launch()?))?;
                (
                    event_ms,
                    span(&mut rig, &mut timeline, |_| Ok(graph.launch()?))?,
                )
            } else {
                let event_ms = rig.time(|| launch(&mut out, None))?;
                (
                    event_ms,
                    span(&mut rig, &mut timeline, |tl| launch(&mut out, Some(tl)))?,
                )
            };
            times.push(event_ms);
            times.push(span_ms);
        }
        let times = slowest(job, &times)?;
        let (plain_event, plain_span) = (times[0], times[1]);
        for (i, v) in variants.iter().enumerate() {
            let (event_ms, span_ms) = (times[2 * i], times[2 * i + 1]);
            table.rows.push(vec![
                format!("{m}x{n}x{k}"),
                v.name.clone(),
                format!("{event_ms:.4}"),
                format!("{span_ms:.4}"),
                format!("{:.3}", event_ms / plain_event),
                format!("{:.3}", span_ms / plain_span),
            ]);
            rows.push(json::obj([
                ("m", json::num(f64::from(m))),
                ("n", json::num(f64::from(n))),
                ("k", json::num(f64::from(k))),
                ("sm_margin", json::num(f64::from(MARGIN))),
                ("ctas", json::num(f64::from(plan.ctas()))),
                ("waves", json::num(f64::from(waves))),
                ("variant", Json::String(v.name.clone())),
                ("event_ms", json::num(event_ms)),
                ("span_ms", json::num(span_ms)),
                ("event_over_plain", json::num(event_ms / plain_event)),
                ("span_over_plain", json::num(span_ms / plain_span)),
            ]));
        }
    }
    Ok(SuiteResult { table, rows })
}

/// Median kernel span (ms) of `op`, which launches the GEMM with the timeline it is given; each
/// iteration after the L2-evicting write, read back one by one.
fn span(
    rig: &mut Rig,
    timeline: &mut CudaSlice<u64>,
    mut op: impl FnMut(&mut CudaSlice<u64>) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let s = rig.compute.clone();
    let mut ms = Vec::with_capacity(rig.iters);
    for i in 0..rig.warmup + rig.iters {
        s.memset_zeros(&mut rig.flush)?;
        s.memcpy_htod(&[u64::MAX, 0], timeline)?;
        op(timeline)?;
        let t = s.clone_dtoh(timeline)?;
        anyhow::ensure!(
            t[1] > t[0],
            "GEMM timeline not written: start {} end {}",
            t[0],
            t[1]
        );
        if i >= rig.warmup {
            ms.push((t[1] - t[0]) as f64 * 1e-6);
        }
    }
    Ok(median(&ms))
}

/// The variant's output, restored to the standard layout where it has another, equals the plain
/// launch's bit for bit (bands: each rank's receive simulated by copies of its part of every
/// group's range, then its restore; together they cover every row).
fn check_variant(
    stream: &Arc<CudaStream>,
    v: &Variant,
    plan: &GemmPlan,
    out: &CudaSlice<bf16>,
    reference: &[bf16],
) -> anyhow::Result<()> {
    let n = plan.shape.n as usize;
    match v.layout {
        OutputLayout::Standard => {
            anyhow::ensure!(
                download(stream, out)? == reference,
                "{}: output differs from the plain launch",
                v.name
            );
        }
        OutputLayout::TileOrder => {
            let mut restored = poisoned::<bf16>(stream, reference.len())?;
            TileOrderMap::new(stream, plan)?.restore(stream, out, &mut restored, Restore::Copy)?;
            anyhow::ensure!(
                download(stream, &restored)? == reference,
                "{}: restored output differs from the plain launch",
                v.name
            );
        }
        OutputLayout::RankBands { ranks } => {
            // Without counters the launch stores one group.
            let groups = WaveGroups::new(plan, v.groups.as_deref().unwrap_or(&[plan.waves()]))?;
            for rank in 0..ranks {
                let map = RankBandMap::new(stream, plan, ranks, rank)?;
                let received =
                    band_receive(stream, &map, &groups, out, rank as usize, ranks as usize)?;
                let mut rows = poisoned::<bf16>(stream, map.rows() as usize * n)?;
                map.restore(stream, &received, &mut rows, Restore::Copy)?;
                let rows = download(stream, &rows)?;
                for i in 0..map.rows() as usize {
                    let g = map.global_row(i as u32) as usize;
                    anyhow::ensure!(
                        rows[i * n..(i + 1) * n] == reference[g * n..(g + 1) * n],
                        "{}: row {g} restored by rank {rank} of {ranks} differs from the plain launch",
                        v.name
                    );
                }
            }
        }
        OutputLayout::RowSlots { .. }
        | OutputLayout::PeerReduce { .. }
        | OutputLayout::PeerRows { .. } => {
            anyhow::bail!(
                "{}: the {} layout is not measured here",
                v.name,
                v.layout.name()
            )
        }
    }
    Ok(())
}
