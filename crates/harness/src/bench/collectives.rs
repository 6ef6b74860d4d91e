//! `weft bench collectives`: weft-collectives' AllReduce, ReduceScatter and AllGather against NCCL
//! in the same run, 4 KiB to 1 GiB (`--quick`: seven sizes; or nccl-tests' `-b -e -f`,
//! bench/sweep.rs), in nccl-tests' columns (size
//! conventions, algbw, busbw: see bench/nccl.rs) plus weft ÷ NCCL.
//!
//! Per size: both outputs are poisoned, each implementation runs once, and weft's output must equal
//! NCCL's bit for bit (inputs are small integers stored as f32, so every sum is exact in any order);
//! then weft and NCCL are timed in alternating blocks (CUDA events around each call, after
//! warm-up), and the table reports each one's median over its iterations, the slowest rank's.
//! Sizes up to 4 MiB are also timed under CUDA graph replay (20 calls per graph, per-call time),
//! as inference engines run small collectives: launch costs on the host then drop out; and their
//! host cost is reported: the wall time per call of enqueueing 100 calls back to back, without
//! events or synchronisation (the GPU does not hold the host back: 100 launches fit its queue),
//! the median of three such batches after an untimed one.

use super::nccl::Op;
use super::sweep::Sweep;
use super::SuiteResult;
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::{median, time_iterations};
use crate::word_compare::WordCompare;
use anyhow::Context;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtrMut};
use rand::Rng;
use std::sync::Arc;
use weft_collectives::{Algorithm, Collectives, Options, Protocol};

const OPS: [Op; 3] = [Op::AllReduce, Op::ReduceScatter, Op::AllGather];

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        [12, 16, 18, 20, 22, 26, 28]
            .iter()
            .map(|s| 1usize << s)
            .collect()
    } else {
        (12..=30).map(|s| 1usize << s).collect() // 4 KiB … 1 GiB
    }
}

/// `n` small integers as f32 (exact sums in any order).
fn int_buffer(stream: &Arc<CudaStream>, n: usize, seed: u64) -> anyhow::Result<CudaSlice<f32>> {
    super::nccl::random_buffer_of(stream, n, seed, |rng| rng.random_range(-64..=64) as f32)
}

fn weft_call(
    coll: &mut Collectives,
    op: Op,
    send: &CudaSlice<f32>,
    recv: &mut CudaSlice<f32>,
    s: usize,
    r: usize,
) -> anyhow::Result<()> {
    let (send, mut recv) = (send.slice(..s), recv.slice_mut(..r));
    match op {
        Op::AllReduce => coll.all_reduce(&send, &mut recv)?,
        Op::ReduceScatter => coll.reduce_scatter(&send, &mut recv)?,
        _ => coll.all_gather(&send, &mut recv)?,
    }
    Ok(())
}

struct Measured {
    op: Op,
    bytes: usize,
    path: String,
    blocks: u32,
    threads: u32,
    rounds: u32,
    weft_ms: f64,
    nccl_ms: f64,
    /// Per call under graph replay (sizes up to GRAPH_MAX_BYTES), else 0.
    weft_graph_ms: f64,
    nccl_graph_ms: f64,
    /// Host wall time per call to enqueue it (sizes up to GRAPH_MAX_BYTES), else 0.
    weft_enqueue_us: f64,
    nccl_enqueue_us: f64,
}

/// Sizes up to this are also timed under CUDA graph replay (where launch costs dominate).
const GRAPH_MAX_BYTES: usize = 4 << 20;
const GRAPH_CALLS: usize = 20;

/// Calls enqueued back to back for the host cost of one.
const ENQUEUE_CALLS: usize = 100;

/// Host wall time per call (µs) of `ENQUEUE_CALLS` calls enqueued back to back on an idle
/// stream (the stream drained after each batch): the median of three batches after an untimed
/// one (a first call's set-up costs are not a call's).
fn time_enqueue(
    stream: &Arc<CudaStream>,
    mut op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let mut batches = Vec::new();
    for batch in 0..4 {
        stream.synchronize()?;
        let start = std::time::Instant::now();
        for _ in 0..ENQUEUE_CALLS {
            op()?;
        }
        if batch > 0 {
            batches.push(start.elapsed().as_secs_f64() * 1e6 / ENQUEUE_CALLS as f64);
        }
    }
    stream.synchronize()?;
    Ok(median(&batches))
}

/// Per-call time under graph replay: `GRAPH_CALLS` calls captured in one graph, each replay timed
/// with events (after warm-up); the median replay divided by the calls.
fn time_graph(
    stream: &Arc<CudaStream>,
    replays: usize,
    mut op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    stream.synchronize()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = (0..GRAPH_CALLS).try_for_each(|_| op());
    // End the capture whatever happened, so the stream stays usable.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or_else(|| anyhow::anyhow!("the capture produced no graph"))?;
    let ms = time_iterations(stream, 2, replays, || Ok(graph.launch()?))?;
    Ok(median(&ms) / GRAPH_CALLS as f64)
}

pub fn run(job: &mut Job, quick: bool, sweep: &Sweep) -> anyhow::Result<SuiteResult> {
    let (world, rank) = (job.world(), job.rank());
    let sizes = sweep.sizes_or(sizes(quick));
    let max_elems = OPS
        .iter()
        .map(|op| {
            let (s, r) = op.counts(*sizes.last().unwrap(), world);
            s.max(r)
        })
        .max()
        .unwrap();
    let options = Options::from_env()?;
    let stream = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .stream
        .clone();
    let mut coll = Collectives::new(&mut job.rdzv, &stream, options)?;
    super::sweep::check_buffers_fit(stream.context(), 3, max_elems, *sizes.last().unwrap())?;
    let mut measured = Vec::new();
    {
        let (comm, _) = job.comm_and_gpu()?;
        let send = int_buffer(&stream, max_elems, 1 + rank as u64)?;
        let mut weft_out = int_buffer(&stream, max_elems, 1000 + rank as u64)?;
        let mut nccl_out = int_buffer(&stream, max_elems, 2000 + rank as u64)?;
        let mut compare = WordCompare::load(&stream)?;
        for op in OPS {
            let mut last = None;
            for &bytes in &sizes {
                let (s, r) = op.counts(bytes, world);
                // A size that rounds to the previous one's counts (a few bytes a rank): once.
                if last.replace((s, r)) == Some((s, r)) {
                    continue;
                }
                if rank == 0 {
                    eprintln!(
                        "weft bench: collectives {} {} B",
                        op.name(),
                        op.reported_bytes(s, r)
                    );
                }
                // Poison (NaN: 0xff bytes), run each once, compare bit for bit.
                poison(&stream, &mut weft_out, r)?;
                poison(&stream, &mut nccl_out, r)?;
                weft_call(&mut coll, op, &send, &mut weft_out, s, r)?;
                super::nccl::enqueue(comm, op, &send, &mut nccl_out, s, r, &stream)?;
                coll.synchronize()?;
                if let Some(d) =
                    compare.differ(&stream, &weft_out.slice(..r), &nccl_out.slice(..r))?
                {
                    anyhow::bail!(
                        "collectives {} {} elements: weft differs from NCCL in {} of {r} words (first at {})",
                        op.name(),
                        s,
                        d.words,
                        d.first_word
                    );
                }
                let iters = sweep.iters_or(if bytes <= 1 << 24 {
                    50
                } else if bytes < 1 << 30 {
                    20
                } else {
                    10
                });
                let warmup = sweep.warmup_or(5);
                let (mut w, mut n) = (Vec::new(), Vec::new());
                for _ in 0..2 {
                    w.extend(time_iterations(&stream, warmup, iters, || {
                        weft_call(&mut coll, op, &send, &mut weft_out, s, r)
                    })?);
                    n.extend(time_iterations(&stream, warmup, iters, || {
                        super::nccl::enqueue(comm, op, &send, &mut nccl_out, s, r, &stream)
                    })?);
                }
                let (mut wg, mut ng, mut we, mut ne) = (0.0, 0.0, 0.0, 0.0);
                if op.reported_bytes(s, r) <= GRAPH_MAX_BYTES {
                    we = time_enqueue(&stream, || {
                        weft_call(&mut coll, op, &send, &mut weft_out, s, r)
                    })?;
                    ne = time_enqueue(&stream, || {
                        super::nccl::enqueue(comm, op, &send, &mut nccl_out, s, r, &stream)
                    })?;
                    wg = time_graph(&stream, 10, || {
                        weft_call(&mut coll, op, &send, &mut weft_out, s, r)
                    })?;
                    ng = time_graph(&stream, 10, || {
                        super::nccl::enqueue(comm, op, &send, &mut nccl_out, s, r, &stream)
                    })?;
                }
                coll.synchronize().context("after the timed calls")?;
                let (path, count) = match op {
                    Op::AllReduce => (coll.all_reduce_path::<f32>(s), s),
                    Op::ReduceScatter => (Algorithm::ReduceScatter, r),
                    _ => (Algorithm::AllGather, s),
                };
                let g = coll.geometry::<f32>(path, count)?;
                measured.push(Measured {
                    op,
                    bytes: op.reported_bytes(s, r),
                    path: format!(
                        "{}{}",
                        path.name(),
                        match g.protocol {
                            Protocol::LowLatency => " LL",
                            Protocol::Sentinel => " sentinel",
                            Protocol::Simple => "",
                        }
                    ),
                    blocks: g.blocks,
                    threads: g.threads,
                    rounds: g.rounds,
                    weft_ms: median(&w),
                    nccl_ms: median(&n),
                    weft_graph_ms: wg,
                    nccl_graph_ms: ng,
                    weft_enqueue_us: we,
                    nccl_enqueue_us: ne,
                });
            }
        }
    }
    let slot_bytes = coll.slot_bytes();
    let pdl = coll.pdl();
    let sentinel_bytes = coll.sentinel_bytes();
    coll.free(&mut job.rdzv)?;
    let mine: Vec<f64> = measured
        .iter()
        .flat_map(|m| {
            [
                m.weft_ms,
                m.nccl_ms,
                m.weft_graph_ms,
                m.nccl_graph_ms,
                m.weft_enqueue_us,
                m.nccl_enqueue_us,
            ]
        })
        .collect();
    let per_rank = super::gather_f64(job, &mine)?;
    let slowest = |i: usize| per_rank.iter().map(|r| r[i]).fold(f64::MIN, f64::max);

    let mut table = Table {
        headers: vec![
            "op",
            "size (B)",
            "weft (us)",
            "weft busbw",
            "NCCL (us)",
            "NCCL busbw",
            "NCCL / weft",
            "graph: weft (us)",
            "NCCL (us)",
            "NCCL / weft",
            "enqueue: weft / NCCL (us)",
            "path",
            "blocks×threads",
            "rounds",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (k, m) in measured.iter().enumerate() {
        let (w, n, wg, ng, we, ne) = (
            slowest(6 * k),
            slowest(6 * k + 1),
            slowest(6 * k + 2),
            slowest(6 * k + 3),
            slowest(6 * k + 4),
            slowest(6 * k + 5),
        );
        let graphed = wg > 0.0 && ng > 0.0;
        let opt = |v: f64| {
            if graphed {
                format!("{v:.1}")
            } else {
                String::new()
            }
        };
        let busbw = |ms: f64| m.bytes as f64 / (ms * 1e-3) / 1e9 * m.op.bus_factor(world);
        table.rows.push(vec![
            m.op.name().into(),
            m.bytes.to_string(),
            format!("{:.1}", w * 1e3),
            format!("{:.1}", busbw(w)),
            format!("{:.1}", n * 1e3),
            format!("{:.1}", busbw(n)),
            format!("{:.2}", n / w),
            opt(wg * 1e3),
            opt(ng * 1e3),
            if graphed {
                format!("{:.2}", ng / wg)
            } else {
                String::new()
            },
            if graphed {
                format!("{we:.1} / {ne:.1}")
            } else {
                String::new()
            },
            m.path.clone(),
            format!("{}×{}", m.blocks, m.threads),
            m.rounds.to_string(),
        ]);
        rows.push(json::obj([
            ("case", Json::from(format!("{} {} B", m.op.name(), m.bytes))),
            ("op", Json::from(m.op.name())),
            ("bytes", Json::from(m.bytes)),
            ("dtype", Json::from("f32")),
            ("weft_ms", Json::from(w)),
            ("weft_busbw_gbs", Json::from(busbw(w))),
            ("baseline", Json::from("NCCL (same run)")),
            ("baseline_ms", Json::from(n)),
            ("baseline_busbw_gbs", Json::from(busbw(n))),
            ("ratio", Json::from(n / w)),
            ("graph_weft_ms", Json::from(graphed.then_some(wg))),
            ("graph_baseline_ms", Json::from(graphed.then_some(ng))),
            ("graph_ratio", Json::from(graphed.then_some(ng / wg))),
            ("enqueue_weft_us", Json::from(graphed.then_some(we))),
            ("enqueue_baseline_us", Json::from(graphed.then_some(ne))),
            ("path", Json::from(m.path.as_str())),
            ("blocks", Json::from(m.blocks as usize)),
            ("threads", Json::from(m.threads as usize)),
            ("rounds", Json::from(m.rounds as usize)),
            ("slot_bytes", Json::from(slot_bytes as usize)),
            ("ll_max_bytes", Json::from(options.ll_max_bytes as usize)),
            (
                "sentinel_max_bytes",
                Json::from(options.sentinel_max_bytes as usize),
            ),
            // What launches used: the option, at most a slot.
            ("sentinel_bytes", Json::from(sentinel_bytes as usize)),
            // 1: launches carried the programmatic-dependent-launch attribute.
            ("pdl", Json::from(usize::from(pdl))),
        ]));
    }
    Ok(SuiteResult { table, rows })
}

fn poison(stream: &Arc<CudaStream>, buf: &mut CudaSlice<f32>, n: usize) -> anyhow::Result<()> {
    let (p, _g) = buf.device_ptr_mut(stream);
    // SAFETY: the buffer holds at least n f32 (n ≤ its length: the counts of the largest size).
    unsafe { cudarc::driver::result::memset_d8_async(p, 0xff, n * 4, stream.cu_stream()) }?;
    Ok(())
}
