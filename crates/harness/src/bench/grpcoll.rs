//! GroupCast / GroupReduce: the native kernels (default SM count) against the AlltoAll-v baseline
//! (range-gather → NCCL grouped send/recv → range-scatter / scatter-reduce) with the same plan,
//! same buffers, same run, on the attention-like workloads of `weft_grpcoll::pattern::Workload`
//! (uniform random, causal, varlen causal): tokens per rank × hidden, bf16; and f32 data sent as
//! bf16 against f32 sent as f32. Each iteration follows an L2-evicting scratch write; time is the
//! median over iterations (CUDA events) of the slowest rank; ratio = baseline / native. GB/s per
//! GPU: the bytes that cross NVLink into the busiest rank (rows from other ranks, in the
//! communication dtype) per second of the slowest rank; "logical" GB/s count the way DeepEP does
//! (every row a rank receives in a cast or sends in a reduce, its own included). Plus the
//! expert-parallel case: MoE dispatch (cast) and combine (reduce) of DeepSeek-V3 shapes, 4096
//! tokens per rank, hidden 7168, top-8 of 256 experts spread over the ranks.

use super::rig::{slowest, Rig, FLUSH_BYTES};
use super::SuiteResult;
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use half::bf16;
use weft_grpcoll::pattern::{cast_metas, reduce_metas, Workload};
use weft_grpcoll::{
    GroupCast, GroupCastMeta, GroupCollective, GroupReduce, GroupReduceMeta, Options, ReduceOp,
};
use weft_pgl::{DType, PglElement};

/// One measured case on this rank.
struct Case {
    name: String,
    workload: &'static str,
    collective: &'static str,
    tokens: usize,
    hidden: usize,
    dtype: DType,
    comm: DType,
    sms: u32,
    /// Bytes arriving at this rank from other ranks.
    nvlink_bytes: f64,
    /// DeepEP's count: rows this rank receives (cast) or sends (reduce), its own included.
    logical_bytes: f64,
    native_ms: f64,
    baseline_ms: f64,
}

/// DeepSeek-V3's routing: top-8 of 256 experts.
const MOE: (&str, Workload) = (
    "moe top-8/256",
    Workload::Moe {
        experts: 256,
        top_k: 8,
        seed: 0x5eed,
    },
);

fn workloads(world: usize) -> [(&'static str, Workload); 3] {
    [
        (
            "uniform",
            Workload::Uniform {
                splits: 2 * world,
                seed: 0x5eed,
            },
        ),
        ("causal", Workload::Causal),
        ("varlen", Workload::Varlen { seed: 0x5eed }),
    ]
}

/// Rows this rank receives from other ranks (cast).
fn cast_remote_rows(m: &GroupCastMeta, rank: usize) -> usize {
    m.src_index
        .iter()
        .zip(&m.output_split_rows)
        .filter(|(s, _)| **s != rank)
        .map(|(_, r)| r)
        .sum()
}

/// Rows this rank reads from other ranks (reduce).
fn reduce_remote_rows(m: &GroupReduceMeta, rank: usize) -> usize {
    m.src_indices
        .iter()
        .zip(&m.output_split_rows)
        .map(|(s, r)| s.iter().filter(|&&x| x != rank).count() * r)
        .sum()
}

struct Shape {
    workload: (&'static str, Workload),
    tokens: usize,
    hidden: usize,
    comm: Option<DType>,
}

/// Times the native path and the baseline of `plan` on this rank, then frees it (collective).
fn time_plan<T: PglElement, P: GroupCollective<T>>(
    job: &mut Job,
    rig: &mut Rig,
    mut plan: P,
) -> anyhow::Result<(f64, f64, u32, DType)> {
    let measured = (|| -> anyhow::Result<(f64, f64)> {
        let native = rig.time(|| Ok(plan.run()?))?;
        plan.synchronize()?;
        let comm = job.comm()?;
        Ok((native, rig.time(|| Ok(plan.run_baseline(comm)?))?))
    })();
    let (sms, comm) = (plan.sms(), plan.comm_dtype());
    plan.free(&mut job.rdzv)?;
    let (native, baseline) = measured?;
    Ok((native, baseline, sms, comm))
}

fn measure<T: PglElement>(
    job: &mut Job,
    rig: &mut Rig,
    s: &Shape,
    reduce: bool,
) -> anyhow::Result<Case> {
    let (rank, world) = (job.rank(), job.world());
    super::progress(
        rank,
        "grpcoll",
        &format!(
            "{} {} {}{} {}x{}",
            s.workload.0,
            if reduce { "reduce" } else { "cast" },
            T::DTYPE.name(),
            s.comm
                .map(|c| format!(" via {}", c.name()))
                .unwrap_or_default(),
            s.tokens,
            s.hidden
        ),
    );
    let opts = Options {
        comm_dtype: s.comm,
        sms: sms_override()?,
        ..Options::default()
    };
    let (remote_rows, logical_rows, (native_ms, baseline_ms, sms, comm)) = if reduce {
        let metas = reduce_metas(world, &s.workload.1.reduce_blocks(world, s.tokens));
        let plan = GroupReduce::<T>::new(
            &mut job.rdzv,
            &rig.compute.clone(),
            &metas[rank],
            s.hidden,
            ReduceOp::Sum,
            opts,
        )?;
        (
            reduce_remote_rows(&metas[rank], rank),
            metas[rank].input_rows,
            time_plan(job, rig, plan)?,
        )
    } else {
        let metas = cast_metas(world, &s.workload.1.cast_blocks(world, s.tokens));
        let plan = GroupCast::<T>::new(
            &mut job.rdzv,
            &rig.compute.clone(),
            &metas[rank],
            s.hidden,
            opts,
        )?;
        (
            cast_remote_rows(&metas[rank], rank),
            metas[rank].output_rows,
            time_plan(job, rig, plan)?,
        )
    };
    Ok(Case {
        name: String::new(),
        workload: s.workload.0,
        collective: if reduce { "reduce sum" } else { "cast" },
        tokens: s.tokens,
        hidden: s.hidden,
        dtype: T::DTYPE,
        comm,
        sms,
        nvlink_bytes: (remote_rows * s.hidden * comm.size()) as f64,
        logical_bytes: (logical_rows * s.hidden * comm.size()) as f64,
        native_ms,
        baseline_ms,
    })
}

/// `WEFT_GRPCOLL_SMS`: the native kernels' SM count for every case (default: the plan's).
fn sms_override() -> anyhow::Result<Option<u32>> {
    match std::env::var("WEFT_GRPCOLL_SMS") {
        Ok(v) => Ok(Some(v.trim().parse().map_err(|_| {
            anyhow::anyhow!("WEFT_GRPCOLL_SMS={v:?} is not a number")
        })?)),
        Err(_) => Ok(None),
    }
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let world = job.world();
    let stream = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .stream
        .clone();
    job.comm()?;
    let mut rig = Rig {
        comm_stream: stream.clone(),
        flush: stream.alloc_zeros::<u8>(FLUSH_BYTES)?,
        compute: stream,
        iters: if quick { 10 } else { 30 },
        warmup: 5,
    };
    let tokens: &[usize] = if quick {
        &[16384]
    } else {
        &[4096, 16384, 65536]
    };
    let hiddens: &[usize] = if quick { &[4096] } else { &[1024, 4096, 8192] };
    let mut cases = Vec::new();
    for workload in workloads(world) {
        for &t in tokens {
            for &h in hiddens {
                let s = Shape {
                    workload,
                    tokens: t,
                    hidden: h,
                    comm: None,
                };
                for reduce in [false, true] {
                    cases.push(measure::<bf16>(job, &mut rig, &s, reduce)?);
                }
            }
        }
    }
    // Expert parallelism: MoE dispatch and combine, DeepSeek-V3 shapes.
    for reduce in [false, true] {
        let s = Shape {
            workload: MOE,
            tokens: 4096,
            hidden: 7168,
            comm: None,
        };
        cases.push(measure::<bf16>(job, &mut rig, &s, reduce)?);
    }
    // The communication dtype: f32 data sent as f32 and as bf16.
    for comm in [None, Some(DType::Bf16)] {
        let s = Shape {
            workload: workloads(world)[0],
            tokens: 16384,
            hidden: 4096,
            comm,
        };
        for reduce in [false, true] {
            cases.push(measure::<f32>(job, &mut rig, &s, reduce)?);
        }
    }
    for c in cases.iter_mut() {
        let via = if c.comm != c.dtype {
            format!(" via {}", c.comm.name())
        } else {
            String::new()
        };
        c.name = format!(
            "{} {} {}{via} {}x{}",
            c.workload,
            c.collective,
            c.dtype.name(),
            c.tokens,
            c.hidden
        );
    }

    // Slowest rank per case and path; the busiest rank's bytes.
    let mine: Vec<f64> = cases
        .iter()
        .flat_map(|c| [c.native_ms, c.baseline_ms, c.nvlink_bytes, c.logical_bytes])
        .collect();
    let worst = slowest(job, &mine)?;
    let mut table = Table {
        headers: vec![
            "case",
            "SMs",
            "native (us)",
            "AlltoAll-v (us)",
            "ratio",
            "native GB/s per GPU",
            "AlltoAll-v GB/s per GPU",
            "native logical GB/s",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let (native, baseline, bytes, logical) = (
            worst[4 * i],
            worst[4 * i + 1],
            worst[4 * i + 2],
            worst[4 * i + 3],
        );
        let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
        table.rows.push(vec![
            c.name.clone(),
            c.sms.to_string(),
            format!("{:.1}", native * 1e3),
            format!("{:.1}", baseline * 1e3),
            format!("{:.2}", baseline / native),
            format!("{:.1}", gbs(native)),
            format!("{:.1}", gbs(baseline)),
            format!("{:.1}", logical / (native * 1e-3) / 1e9),
        ]);
        rows.push(json::obj([
            ("case", Json::from(c.name.clone())),
            ("workload", Json::from(c.workload)),
            ("collective", Json::from(c.collective)),
            ("tokens_per_rank", Json::from(c.tokens)),
            ("hidden", Json::from(c.hidden)),
            ("dtype", Json::from(c.dtype.name())),
            ("comm_dtype", Json::from(c.comm.name())),
            ("sms", Json::from(c.sms as usize)),
            ("weft_ms", Json::from(native)),
            ("baseline", Json::from("AlltoAll-v: range-gather, NCCL grouped send/recv, range-scatter / scatter-reduce (same plan)")),
            ("baseline_ms", Json::from(baseline)),
            ("ratio", Json::from(baseline / native)),
            ("nvlink_bytes_busiest_gpu", Json::from(bytes as usize)),
            ("weft_gbs", Json::from(gbs(native))),
            ("baseline_gbs", Json::from(gbs(baseline))),
            ("logical_bytes_busiest_gpu", Json::from(logical as usize)),
            ("weft_logical_gbs", Json::from(logical / (native * 1e-3) / 1e9)),
        ]));
    }
    Ok(SuiteResult { table, rows })
}
