//! GroupCast / GroupReduce: the native kernels (default SM count) against the AlltoAll-v
//! baseline (range-gather → NCCL grouped send/recv → range-scatter / scatter-reduce) with the same
//! plan, same buffers, same run. bf16, 8192 rows × 4096 per rank, uniform patterns: each rank's
//! tensor is cut into `world` equal splits; cast split i of rank r goes to ranks r+i … r+i+f−1
//! (mod world), reduce output split j of rank d reduces ranks d+j … d+j+f−1 (fan-out / fan-in f).
//! Time: median over iterations (CUDA events) of the slowest rank; ratio = baseline / native.
//! GB/s per GPU: the bytes that cross NVLink into this rank (rows from other ranks) per second.

use super::SuiteResult;
use crate::job::Job;
use crate::json::Json;
use crate::results::Table;
use crate::timing::{median, time_iterations};
use half::bf16;
use weft_grpcoll::pattern::{cast_metas, reduce_metas, CastBlock, ReduceBlock};
use weft_grpcoll::{GroupCast, GroupReduce, Options, ReduceOp};

const ROWS: usize = 8192;
const HIDDEN: usize = 4096;

struct Measured {
    name: String,
    fan: usize,
    sms: u32,
    remote_bytes: usize,
    native_ms: f64,
    baseline_ms: f64,
}

fn fans(world: usize) -> Vec<usize> {
    let mut v = vec![1, 2.min(world), world];
    v.dedup();
    v
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let (rank, world) = (job.rank(), job.world());
    let stream = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .stream
        .clone();
    job.comm()?;
    let iters = if quick { 10 } else { 30 };
    let split = ROWS / world;
    let row_bytes = HIDDEN * 2;
    let mut out: Vec<Measured> = Vec::new();
    for &f in &fans(world) {
        // GroupCast, fan-out f.
        let blocks: Vec<CastBlock> = (0..world)
            .flat_map(|r| {
                (0..world).map(move |i| CastBlock {
                    owner: r,
                    rows: split,
                    dsts: (0..f).map(|t| (r + i + t) % world).collect(),
                })
            })
            .collect();
        let metas = cast_metas(world, &blocks);
        let mut plan = GroupCast::<bf16>::new(
            &mut job.rdzv,
            &stream,
            &metas[rank],
            HIDDEN,
            Options::default(),
        )?;
        let remote: usize = metas[rank]
            .src_index
            .iter()
            .zip(&metas[rank].output_split_rows)
            .filter(|(s, _)| **s != rank)
            .map(|(_, r)| r * row_bytes)
            .sum();
        let native = median(&time_iterations(&stream, 5, iters, || plan.run())?);
        plan.synchronize()?;
        let comm = job.comm()?;
        let baseline = median(&time_iterations(&stream, 5, iters, || {
            plan.run_baseline(comm)
        })?);
        out.push(Measured {
            name: format!("cast bf16 {ROWS}x{HIDDEN} fan-out {f}"),
            fan: f,
            sms: plan.sms(),
            remote_bytes: remote,
            native_ms: native,
            baseline_ms: baseline,
        });
        plan.free(&mut job.rdzv)?;

        // GroupReduce (sum), fan-in f.
        let blocks: Vec<ReduceBlock> = (0..world)
            .flat_map(|d| {
                (0..world).map(move |j| ReduceBlock {
                    receiver: d,
                    rows: split,
                    srcs: (0..f).map(|t| (d + j + t) % world).collect(),
                })
            })
            .collect();
        let metas = reduce_metas(world, &blocks);
        let mut plan = GroupReduce::<bf16>::new(
            &mut job.rdzv,
            &stream,
            &metas[rank],
            HIDDEN,
            ReduceOp::Sum,
            Options::default(),
        )?;
        let remote: usize = metas[rank]
            .src_indices
            .iter()
            .zip(&metas[rank].output_split_rows)
            .map(|(s, r)| s.iter().filter(|&&x| x != rank).count() * r * row_bytes)
            .sum();
        let native = median(&time_iterations(&stream, 5, iters, || plan.run())?);
        plan.synchronize()?;
        let comm = job.comm()?;
        let baseline = median(&time_iterations(&stream, 5, iters, || {
            plan.run_baseline(comm)
        })?);
        out.push(Measured {
            name: format!("reduce sum bf16 {ROWS}x{HIDDEN} fan-in {f}"),
            fan: f,
            sms: plan.sms(),
            remote_bytes: remote,
            native_ms: native,
            baseline_ms: baseline,
        });
        plan.free(&mut job.rdzv)?;
    }

    // Slowest rank per case and path.
    let mine: Vec<f64> = out
        .iter()
        .flat_map(|m| [m.native_ms, m.baseline_ms, m.remote_bytes as f64])
        .collect();
    let per_rank = super::gather_f64(job, &mine)?;
    let mut table = Table {
        headers: vec![
            "case",
            "SMs",
            "native (us)",
            "AlltoAll-v (us)",
            "ratio",
            "native GB/s per GPU",
            "AlltoAll-v GB/s per GPU",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (i, m) in out.iter().enumerate() {
        let max = |k: usize| {
            per_rank
                .iter()
                .map(|r| r[3 * i + k])
                .fold(f64::MIN, f64::max)
        };
        let (native, baseline) = (max(0), max(1));
        let min_native = per_rank.iter().map(|r| r[3 * i]).fold(f64::MAX, f64::min);
        let bytes = max(2);
        let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
        table.rows.push(vec![
            m.name.clone(),
            m.sms.to_string(),
            format!("{:.1}", native * 1e3),
            format!("{:.1}", baseline * 1e3),
            format!("{:.2}", baseline / native),
            format!("{:.1}", gbs(native)),
            format!("{:.1}", gbs(baseline)),
        ]);
        rows.push(Json::obj([
            ("case", Json::from(m.name.clone())),
            ("rows", Json::from(ROWS)),
            ("hidden", Json::from(HIDDEN)),
            ("dtype", Json::from("bf16")),
            ("fan", Json::from(m.fan)),
            ("sms", Json::from(m.sms as usize)),
            ("weft_ms", Json::from(native)),
            ("min_rank_ms", Json::from(min_native)),
            ("baseline", Json::from("AlltoAll-v: range-gather, NCCL grouped send/recv, range-scatter / scatter-reduce (same plan)")),
            ("baseline_ms", Json::from(baseline)),
            ("ratio", Json::from(baseline / native)),
            ("nvlink_bytes_per_gpu", Json::from(bytes as usize)),
            ("weft_gbs", Json::from(gbs(native))),
            ("baseline_gbs", Json::from(gbs(baseline))),
        ]));
    }
    Ok(SuiteResult { table, rows })
}
