//! `weft bench overlap` (GEMM + AllReduce), `overlap-reduce-scatter` (GEMM + ReduceScatter),
//! `overlap-all-gather` (AllGather + GEMM) and `overlap-all-to-all` (GEMM + All-to-All, each shape
//! with a uniform and a skewed routing) `[--shape MxNxK,…] [--method M]…`: the ops of
//! `weft_signal_gemm::ops`, every family of the op and `Auto`, in the same run, per shape:
//!
//! - `seq-cublas` (cuBLAS then NCCL; for AllGather NCCL then cuBLAS): always, the baseline;
//! - each family asked for (default: all the op has), with the parameters its first use found
//!   fastest — `--method` takes family names, exact methods (`signal:32:1+3`) or `auto`;
//! - `auto`: planned first, so its first use (every candidate measured, or none if the choice
//!   cache — `WEFT_CHOICES`, else the per-user cache directory — already holds them) is its own;
//!   the time it took and the method chosen are columns.
//!
//! Also the GEMM alone (cuBLAS, T_gemm) and the collective alone (NCCL, T_comm), the ideal
//! max(T_gemm, T_comm) and the share of it `auto` reaches, auto ÷ seq-cublas and auto against the
//! fastest method of the row (auto's own op included). The time breakdown
//! (bench/overlap_breakdown.rs): each method's GEMM timed alone on the SMs the method leaves it,
//! and the rest of its time, exposed — `gemm_alone_ms` / `exposed_ms` per method in the JSON
//! rows, `auto gemm+exposed` in the table. T_gemm, T_comm and the breakdown's GEMMs are timed
//! interleaved with the methods (bench/overlap_lone.rs); T_gemm and T_comm timed once more
//! before, alone, set the row's iteration count (`t_gemm_cublas_first_ms`,
//! `t_comm_nccl_first_ms` in the JSON).
//! Every op's result is poisoned, then checked element by element on the GPU against
//! seq-cublas's before it is timed (sums: world · 2⁻⁷ · Σ_r |partial_r|; AllGather and
//! All-to-All: 2⁻⁷ relative plus k · 2⁻¹⁸). Timing: bench/rig.rs (events; before each run
//! L2 evicted and the ranks lined up by a one-element ncclAllReduce; the row's ops interleaved;
//! median per rank, the slowest rank's). Rank 0 prints each row as soon as it is measured and its progress on
//! stderr.

use super::overlap_breakdown::GemmAlone;
use super::overlap_lone::{CommAlone, Lones};
use super::rig::{row_iterations, slowest, Rig};
use super::SuiteResult;
use crate::bound_compare::{Bound, BoundCompare};
use crate::gemm_data::{poisoned, uniform, upload};
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DeviceSlice};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Instant;
use weft_pgl::nccl::ReduceOp;
use weft_pgl::rendezvous::Rendezvous;
use weft_signal_gemm::ops::{
    AllGatherGemm, Family, GemmAllReduce, GemmAllToAll, GemmReduceScatter, Method, MethodChoice,
    OpKind, OverlapEnv,
};
use weft_signal_gemm::{CublasGemm, GemmOptions, GemmShape, RowGather};

/// The families each op's bench shows (seq-cublas, the baseline, is always run).
pub fn families(op: OpKind) -> &'static [Family] {
    use Family::*;
    match op {
        OpKind::AllReduce => &[
            SeqWeft,
            SeqCollectives,
            Decomposition,
            Signal,
            FusedInter,
            DistFuse,
        ],
        OpKind::ReduceScatter => &[SeqWeft, SeqCollectives, Decomposition, FusedIntra],
        OpKind::AllGather => &[
            SeqWeft,
            SeqCollectives,
            Decomposition,
            FusedIntra,
            FusedInter,
            FusedCe,
        ],
        OpKind::AllToAll => &[SeqWeft, Signal, SignalCe, FusedIntra],
    }
}

pub fn suite_name(op: OpKind) -> &'static str {
    match op {
        OpKind::AllReduce => "overlap",
        OpKind::ReduceScatter => "overlap-reduce-scatter",
        OpKind::AllGather => "overlap-all-gather",
        OpKind::AllToAll => "overlap-all-to-all",
    }
}

/// What to run: the op, its shapes, and the choices of `--method` (empty: every family and auto).
pub struct OverlapRun<'a> {
    pub op: OpKind,
    pub quick: bool,
    pub shapes: Vec<GemmShape>,
    pub methods: &'a [String],
}

/// The columns a run measures besides seq-cublas: the choices asked for, auto last.
fn choices(op: OpKind, methods: &[String]) -> anyhow::Result<(Vec<MethodChoice>, bool)> {
    if methods.is_empty() {
        return Ok((
            families(op).iter().map(|&f| family_choice(f)).collect(),
            true,
        ));
    }
    let mut out = Vec::new();
    let mut auto = false;
    for m in methods {
        let c: MethodChoice = m
            .parse()
            .map_err(|e| anyhow::anyhow!("weft bench {}: --method {m:?}: {e:#}", suite_name(op)))?;
        let family = match &c {
            MethodChoice::Auto => {
                auto = true;
                continue;
            }
            MethodChoice::Family(f) => *f,
            MethodChoice::Exact(x) => x.family(),
        };
        anyhow::ensure!(
            family == Family::SeqCublas || families(op).contains(&family),
            "weft bench {}: {family} is not a method of {} (methods: seq-cublas, {}, auto)",
            suite_name(op),
            op.title(),
            families(op)
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        if family != Family::SeqCublas {
            out.push(c);
        }
    }
    Ok((out, auto))
}

/// A family as a choice: parameterless families are their one exact method (fused-intra: with
/// the plan's own tile width; `--method fused-intra:128` names the narrow one).
fn family_choice(f: Family) -> MethodChoice {
    match f {
        Family::SeqCublas => MethodChoice::Exact(Method::SeqCublas),
        Family::SeqWeft => MethodChoice::Exact(Method::SeqWeft),
        Family::SeqCollectives => MethodChoice::Exact(Method::SeqCollectives),
        Family::FusedIntra => MethodChoice::Exact(Method::FusedIntra { tile_n: None }),
        f => MethodChoice::Family(f),
    }
}

/// One shape's operands (this rank's) and the sequential path's result to check against.
struct Operands {
    /// AllReduce / ReduceScatter: A (m × k); AllGather: this rank's shard (m/world × k).
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    /// AllGather's D (the caller's buffer).
    d: Option<CudaSlice<bf16>>,
    /// All-to-All: every rank's routing (the same on every rank).
    routes: Vec<Vec<u32>>,
}

/// Any of the three ops.
enum AnyOp {
    Ar(GemmAllReduce<bf16>),
    Rs(GemmReduceScatter<bf16>),
    Ag(AllGatherGemm<bf16>),
    A2a(GemmAllToAll<bf16>),
}

impl AnyOp {
    fn plan(
        op: OpKind,
        rdzv: &mut Rendezvous,
        env: &mut OverlapEnv,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        x: &Operands,
        choice: &MethodChoice,
    ) -> anyhow::Result<Self> {
        let o = GemmOptions::default();
        Ok(match op {
            OpKind::AllReduce => AnyOp::Ar(GemmAllReduce::plan(
                rdzv, env, stream, shape, o, choice, false,
            )?),
            OpKind::ReduceScatter => AnyOp::Rs(GemmReduceScatter::plan(
                rdzv, env, stream, shape, o, choice, false,
            )?),
            OpKind::AllGather => AnyOp::Ag(AllGatherGemm::plan(
                rdzv, env, stream, shape, o, choice, false,
            )?),
            OpKind::AllToAll => AnyOp::A2a(GemmAllToAll::plan(
                rdzv, env, stream, shape, o, &x.routes, choice, false,
            )?),
        })
    }

    fn report(&self) -> &weft_signal_gemm::ops::ChoiceReport {
        match self {
            AnyOp::Ar(x) => x.report(),
            AnyOp::Rs(x) => x.report(),
            AnyOp::Ag(x) => x.report(),
            AnyOp::A2a(x) => x.report(),
        }
    }

    /// Readies the inputs the op owns (the AllGather shard).
    fn prepare(&self, stream: &Arc<CudaStream>, x: &Operands) -> anyhow::Result<()> {
        if let AnyOp::Ag(op) = self {
            op.copy_shard(stream, &x.a)?;
        }
        Ok(())
    }

    fn launch(&mut self, stream: &Arc<CudaStream>, x: &mut Operands) -> anyhow::Result<()> {
        match self {
            AnyOp::Ar(op) => op.launch(stream, &x.a, &x.b).map_err(anyhow::Error::from),
            AnyOp::Rs(op) => op.launch(stream, &x.a, &x.b).map_err(anyhow::Error::from),
            AnyOp::Ag(op) => (op.launch(
                stream,
                &x.b,
                x.d.as_mut().expect("AllGather operands have a D"),
            ))
            .map_err(anyhow::Error::from),
            AnyOp::A2a(op) => op.launch(stream, &x.a, &x.b).map_err(anyhow::Error::from),
        }
    }

    /// Where the result lies: the op's output, or the caller's D (AllGather).
    fn result_region(&self, stream: &Arc<CudaStream>, x: &Operands) -> (u64, usize) {
        match self {
            AnyOp::Ar(op) => (op.output().device_address(), op.output().len()),
            AnyOp::Rs(op) => (op.output().device_address(), op.output().len()),
            AnyOp::A2a(op) => (op.output().device_address(), op.output().len()),
            AnyOp::Ag(_) => {
                let d = x.d.as_ref().expect("AllGather operands have a D");
                (d.device_ptr(stream).0, d.len())
            }
        }
    }

    /// Overwrites the result with NaN.
    fn poison(&self, stream: &Arc<CudaStream>, x: &Operands) -> anyhow::Result<()> {
        let (ptr, len) = self.result_region(stream, x);
        stream.context().bind_to_thread()?;
        // SAFETY: `len` bf16 elements at `ptr` on this context; stream-ordered.
        unsafe { sys::cuMemsetD16Async(ptr, 0xFFFF, len, stream.cu_stream()) }.result()?;
        Ok(())
    }

    fn check(
        &self,
        cmp: &mut BoundCompare,
        stream: &Arc<CudaStream>,
        what: &str,
        x: &Operands,
        want: &CudaSlice<bf16>,
        bound: &Bound<'_>,
        n: usize,
    ) -> anyhow::Result<()> {
        match self {
            AnyOp::Ar(op) => cmp.check(stream, what, &op.output(), want, bound, n),
            AnyOp::Rs(op) => cmp.check(stream, what, &op.output(), want, bound, n),
            AnyOp::A2a(op) => cmp.check(stream, what, &op.output(), want, bound, n),
            AnyOp::Ag(_) => cmp.check(
                stream,
                what,
                x.d.as_ref().expect("AllGather operands have a D"),
                want,
                bound,
                n,
            ),
        }
    }

    /// A device copy of the result.
    fn result_copy(
        &self,
        stream: &Arc<CudaStream>,
        x: &Operands,
    ) -> anyhow::Result<CudaSlice<bf16>> {
        let (ptr, len) = self.result_region(stream, x);
        let mut dst = stream.alloc_zeros::<bf16>(len)?;
        let (pd, _g) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut dst, stream);
        // SAFETY: both hold `len` bf16; stream-ordered.
        unsafe { sys::cuMemcpyDtoDAsync_v2(pd, ptr, 2 * len, stream.cu_stream()) }.result()?;
        drop(_g);
        stream.synchronize()?;
        Ok(dst)
    }

    fn synchronize(&self) -> anyhow::Result<()> {
        match self {
            AnyOp::Ar(x) => x.synchronize().map_err(anyhow::Error::from),
            AnyOp::Rs(x) => x.synchronize().map_err(anyhow::Error::from),
            AnyOp::Ag(x) => x.synchronize().map_err(anyhow::Error::from),
            AnyOp::A2a(x) => x.synchronize().map_err(anyhow::Error::from),
        }
    }

    fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()> {
        match self {
            AnyOp::Ar(x) => x.free(rdzv).map_err(anyhow::Error::from),
            AnyOp::Rs(x) => x.free(rdzv).map_err(anyhow::Error::from),
            AnyOp::Ag(x) => x.free(rdzv).map_err(anyhow::Error::from),
            AnyOp::A2a(x) => x.free(rdzv).map_err(anyhow::Error::from),
        }
    }
}

/// One measured column of a row.
struct Measured {
    choice: MethodChoice,
    method: String,
    ms: f64,
}

/// Rank 0's progress line on stderr; on every rank, a new step for the watchdog.
fn progress(job: &Job, text: &str) {
    super::progress(job.rank(), "overlap", text);
}

pub fn run(job: &mut Job, run: &OverlapRun<'_>) -> anyhow::Result<SuiteResult> {
    let op = run.op;
    let (columns, auto_wanted) = choices(op, run.methods)?;
    let (rank, world) = (job.rank(), job.world());
    let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
    let compute = gpu.stream.clone();
    let base_iters = if run.quick { 8 } else { 15 };
    let mut rig = Rig::with_comm_stream(&compute, base_iters, 3)?;
    let mut cmp = BoundCompare::load(&compute)?;
    {
        let (_, env) = job.overlap()?;
        if rank == 0 {
            if let Some(p) = env.cache().path() {
                eprintln!(
                    "weft bench: choices cached in {} ({} entries)",
                    p.display(),
                    env.cache().entries().len()
                );
            }
            for problem in env.cache().problems() {
                eprintln!("weft bench: choice cache: {problem}");
            }
        }
    }
    let mut headers = vec!["M x N x K", "T_gemm", "T_comm", "ideal", "seq-cublas"];
    let labels: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
    let leaked: Vec<&'static str> = labels
        .iter()
        .map(|l| &*Box::leak(l.clone().into_boxed_str()))
        .collect();
    headers.extend(leaked);
    if auto_wanted {
        headers.extend([
            "auto",
            "auto method",
            "auto/seq",
            "auto/fastest",
            "of ideal",
            "auto gemm+exposed",
            "first use s",
        ]);
    }
    headers.push("fastest");
    let mut table = Table {
        headers,
        rows: Vec::new(),
    };
    if rank == 0 {
        println!(
            "\n# weft {}: {} ranks (rows as measured; times in ms, slowest rank's median)",
            suite_name(op),
            world
        );
        println!("{}", table.render_header());
    }
    let mut rows = Vec::new();
    // All-to-All: every shape with each routing.
    let cases: Vec<(GemmShape, Option<&str>)> = run
        .shapes
        .iter()
        .flat_map(|&s| {
            let routings: &[Option<&str>] = if op == OpKind::AllToAll {
                &[Some("uniform"), Some("skewed")]
            } else {
                &[None]
            };
            routings.iter().map(move |r| (s, *r))
        })
        .collect();
    let total = cases.len();
    for (i, &(shape, routing)) in cases.iter().enumerate() {
        let started = Instant::now();
        let GemmShape { m, n, k } = shape;
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        anyhow::ensure!(
            mu % world == 0,
            "{shape}: M does not split over {world} ranks"
        );
        progress(
            job,
            &format!(
                "[{}/{total}] {} {shape}: operands and the sequential path",
                i + 1,
                op.title()
            ),
        );
        let seed = 0x0e7a
            ^ (u64::from(m) << 40)
            ^ (u64::from(n) << 20)
            ^ u64::from(k)
            ^ ((rank as u64) << 60);
        let a_len = if op == OpKind::AllGather {
            mu / world * ku
        } else {
            mu * ku
        };
        let mut x = Operands {
            a: upload(&compute, &uniform::<bf16>(seed, a_len))?,
            b: upload(&compute, &uniform::<bf16>(seed ^ 1, ku * nu))?,
            d: if op == OpKind::AllGather {
                Some(poisoned::<bf16>(&compute, mu * nu)?)
            } else {
                None
            },
            // The same on every rank: drawn from the shape alone.
            routes: routing.map_or_else(Vec::new, |r| {
                routes(r, world, mu, 0xa2a ^ (u64::from(m) << 32) ^ u64::from(k))
            }),
        };
        let label = match routing {
            Some(r) => format!("{shape} {r}"),
            None => shape.to_string(),
        };
        // The GEMM and the collective alone first (for the iteration count), and the bound of
        // the checks.
        let cublas = CublasGemm::new(&compute, shape, GemmOptions::default())?;
        rig.iters = base_iters;
        let (t_gemm_first, t_comm_first, bound_buf, comm_alone) =
            alone(job, &mut rig, &mut cmp, op, &cublas, shape, &x)?;
        // Slowest rank's values, so every rank derives the same iteration count from them.
        let v = slowest(job, &[t_gemm_first, t_comm_first])?;
        let (t_gemm_first, t_comm_first) = (v[0], v[1]);
        rig.iters = row_iterations(base_iters, t_gemm_first + t_comm_first);
        let bound = match &bound_buf {
            Some(b) => Bound {
                per_element: Some((b, world as f32 / 128.0)),
                rel: 0.0,
                abs: 1e-6,
            },
            None => Bound {
                per_element: None,
                rel: 1.0 / 128.0,
                abs: k as f32 / 262_144.0,
            },
        };
        // The sequential path's result: every other's reference.
        progress(job, &format!("[{}/{total}] {shape}: seq-cublas", i + 1));
        let mut planned: Vec<(MethodChoice, AnyOp)> = Vec::new();
        let reference = {
            let (rdzv, env) = job.overlap()?;
            let mut seq_op = AnyOp::plan(
                op,
                rdzv,
                env,
                &compute,
                shape,
                &x,
                &MethodChoice::Exact(Method::SeqCublas),
            )?;
            seq_op.prepare(&compute, &x)?;
            seq_op.poison(&compute, &x)?;
            seq_op.launch(&compute, &mut x)?;
            seq_op.synchronize()?;
            let reference = seq_op.result_copy(&compute, &x)?;
            planned.push((MethodChoice::Exact(Method::SeqCublas), seq_op));
            reference
        };
        // Auto before the families: its first use (if the cache lacks the shape) is its own.
        let mut auto_first_use = (0.0, 0usize);
        // The candidates whose times were the tuner's predictions (WEFT_TUNING), with them.
        let mut auto_predicted: Vec<(String, f64)> = Vec::new();
        if auto_wanted {
            progress(
                job,
                &format!("[{}/{total}] {shape}: auto (first use)", i + 1),
            );
            let (rdzv, env) = job.overlap()?;
            let anyop = AnyOp::plan(op, rdzv, env, &compute, shape, &x, &MethodChoice::Auto)?;
            let report = anyop.report();
            auto_first_use = (
                report.first_use_s(),
                report.ranking.as_ref().map_or(0, |r| r.measured),
            );
            if let Some(r) = &report.ranking {
                auto_predicted = r
                    .times
                    .iter()
                    .filter(|(m, _)| r.predicted.contains(m))
                    .map(|(m, t)| (m.to_string(), *t))
                    .collect();
            }
            planned.push((MethodChoice::Auto, anyop));
        }
        let mut refused = Vec::new();
        for c in &columns {
            progress(job, &format!("[{}/{total}] {shape}: {c}", i + 1));
            let (rdzv, env) = job.overlap()?;
            match AnyOp::plan(op, rdzv, env, &compute, shape, &x, c) {
                Ok(anyop) => planned.push((c.clone(), anyop)),
                // Refused on every rank alike (planning is collective): a column with a reason.
                Err(e) => {
                    progress(
                        job,
                        &format!(
                            "[{}/{total}] {shape}: {c} cannot run: {}",
                            i + 1,
                            first_line(&e)
                        ),
                    );
                    refused.push(c.clone());
                }
            }
        }
        // The references timed with the ops: the GEMM and the collective alone, and each op's
        // GEMM for the breakdown (the same list on every rank: the methods were agreed when
        // planned).
        let gemms: Vec<GemmAlone> = planned
            .iter()
            .filter_map(|(_, o)| o.report().method.to_string().parse::<Method>().ok())
            .map(|m| GemmAlone::of(op, &m, world as u32))
            .collect();
        // Every op checked against the reference, then all timed interleaved with the
        // references, then freed (also when the references could not be planned).
        progress(
            job,
            &format!(
                "[{}/{total}] {shape}: checking {} ops, timing them with the references",
                i + 1,
                planned.len(),
            ),
        );
        // Planned on every rank alike or refused on all (the timing below is collective).
        let lones = Lones::new(&compute, shape, &gemms, comm_alone);
        let lones = weft_pgl::agree(
            &mut job.rdzv,
            &format!("planning the references at {shape}"),
            lones,
        );
        let timed = lones.and_then(|mut lones| {
            let t = check_and_time_all(
                job,
                &mut rig,
                &mut cmp,
                op,
                &mut planned,
                &mut lones,
                &mut x,
                &reference,
                &bound,
                shape,
            )?;
            Ok((t, lones))
        });
        let mut freed = Ok(());
        for (_, anyop) in planned.drain(..).rev().collect::<Vec<_>>() {
            freed = freed.and(anyop.free(&mut job.rdzv));
        }
        let ((labels, times, lone_times), lones) = timed?;
        freed?;
        let (t_gemm, t_comm, gemm_ms) = lones.split(&lone_times);
        drop(lones);
        let seq_ms = times[0];
        let mut auto = None;
        let mut measured = Vec::new();
        for ((c, method), ms) in labels.into_iter().zip(times).skip(1) {
            if c == MethodChoice::Auto {
                auto = Some((
                    Measured {
                        choice: c,
                        method,
                        ms,
                    },
                    auto_first_use.0,
                    auto_first_use.1,
                ));
            } else {
                measured.push(Measured {
                    choice: c,
                    method,
                    ms,
                });
            }
        }
        for c in refused {
            measured.push(Measured {
                choice: c,
                method: "-".into(),
                ms: f64::NAN,
            });
        }
        measured.sort_by_key(|m| columns.iter().position(|c| *c == m.choice));
        let ideal = t_gemm.max(t_comm);
        let gemm_alone = |method: &str| -> Option<f64> {
            let g = GemmAlone::of(op, &method.parse().ok()?, world as u32);
            gemm_ms.iter().find(|(x, _)| *x == g).map(|(_, ms)| *ms)
        };
        let breakdown = |method: &str, ms: f64| -> Vec<(&'static str, Json)> {
            match gemm_alone(method) {
                Some(g) if ms.is_finite() => vec![
                    ("gemm_alone_ms", json::num(g)),
                    ("exposed_ms", json::num(ms - g)),
                ],
                _ => Vec::new(),
            }
        };
        // Every op of the row, auto's too (named by its method): auto/fastest is 1 when auto's
        // own op was the fastest, and above 1 by how much a column beat it.
        let mut all: Vec<(&str, f64)> = vec![("seq-cublas", seq_ms)];
        for c in measured.iter().chain(auto.as_ref().map(|a| &a.0)) {
            all.push((c.method.as_str(), c.ms));
        }
        let fastest = all
            .iter()
            .filter(|x| x.1.is_finite())
            .min_by(|p, q| p.1.total_cmp(&q.1))
            .copied()
            .unwrap_or(("", f64::NAN));
        let mut cells = vec![label.clone(), f3(t_gemm), f3(t_comm), f3(ideal), f3(seq_ms)];
        for c in &measured {
            cells.push(if c.ms.is_finite() {
                format!("{} {}", f3(c.ms), params(&c.method))
            } else {
                "-".into()
            });
        }
        let mut json = vec![
            ("case", Json::String(format!("{} {label}", op.name()))),
            ("routing", Json::String(routing.unwrap_or("").into())),
            ("op", Json::String(op.name().into())),
            ("m", json::num(f64::from(m))),
            ("n", json::num(f64::from(n))),
            ("k", json::num(f64::from(k))),
            ("world", json::num(world as f64)),
            ("baseline", Json::String("seq-cublas".into())),
            ("baseline_ms", json::num(seq_ms)),
            ("t_gemm_cublas_ms", json::num(t_gemm)),
            ("t_comm_nccl_ms", json::num(t_comm)),
            ("t_gemm_cublas_first_ms", json::num(t_gemm_first)),
            ("t_comm_nccl_first_ms", json::num(t_comm_first)),
            ("ideal_ms", json::num(ideal)),
            ("iterations", json::num(rig.iters as f64)),
        ];
        if let Some(g) = gemm_alone("seq-cublas") {
            json.extend([
                ("baseline_gemm_alone_ms", json::num(g)),
                ("baseline_exposed_ms", json::num(seq_ms - g)),
            ]);
        }
        let methods_json: Vec<Json> = measured
            .iter()
            .map(|c| {
                let mut fields = vec![
                    ("asked", Json::String(c.choice.to_string())),
                    ("method", Json::String(c.method.clone())),
                    ("ms", json::num(c.ms)),
                    ("speedup_vs_seq_cublas", json::num(seq_ms / c.ms)),
                ];
                fields.extend(breakdown(&c.method, c.ms));
                json::obj(fields)
            })
            .collect();
        if let Some((a, first_use, count)) = &auto {
            cells.extend([
                f3(a.ms),
                a.method.clone(),
                format!("{:.3}", seq_ms / a.ms),
                format!("{:.3}", a.ms / fastest.1),
                format!("{:.1}%", 100.0 * ideal / a.ms),
                gemm_alone(&a.method).map_or("-".into(), |g| format!("{}+{}", f3(g), f3(a.ms - g))),
                format!("{first_use:.1}"),
            ]);
            json.extend([
                ("weft_ms", json::num(a.ms)),
                ("ratio", json::num(seq_ms / a.ms)),
                ("auto_method", Json::String(a.method.clone())),
                ("auto_over_fastest", json::num(a.ms / fastest.1)),
                ("fraction_of_ideal", json::num(ideal / a.ms)),
                ("auto_first_use_s", json::num(*first_use)),
                ("auto_breakdown", json::obj(breakdown(&a.method, a.ms))),
                ("auto_candidates_measured", json::num(*count as f64)),
                (
                    "auto_predicted",
                    Json::Array(
                        auto_predicted
                            .iter()
                            .map(|(m, t)| {
                                json::obj(vec![
                                    ("method", Json::String(m.clone())),
                                    ("ms", json::num(*t)),
                                ])
                            })
                            .collect(),
                    ),
                ),
            ]);
        }
        cells.push(fastest.0.to_string());
        json.extend([
            ("fastest_method", Json::String(fastest.0.to_string())),
            ("fastest_ms", json::num(fastest.1)),
            ("methods", Json::Array(methods_json)),
            ("row_seconds", json::num(started.elapsed().as_secs_f64())),
        ]);
        if rank == 0 {
            println!("{}", table.render_row(&cells));
        }
        table.rows.push(cells);
        rows.push(json::obj(json));
    }
    Ok(SuiteResult { table, rows })
}

fn f3(v: f64) -> String {
    format!("{v:.3}")
}

/// A method's parameters for a table cell ("(16)", "(32:1+3)"), empty without any.
fn params(method: &str) -> String {
    match method.split_once(':') {
        Some((_, p)) => format!("({p})"),
        None => String::new(),
    }
}

/// The GEMM alone (cuBLAS) and the collective alone (NCCL, the env's communicator), timed each in
/// a block of its own before the row (they set its iteration count; the row's T_gemm and T_comm
/// are timed again with its methods), the collective with its buffers for that, and, for the
/// sums, Σ_r |partial_r| (f32, this rank's rows) for the checks' bound.
fn alone(
    job: &mut Job,
    rig: &mut Rig,
    cmp: &mut BoundCompare,
    op: OpKind,
    cublas: &CublasGemm,
    shape: GemmShape,
    x: &Operands,
) -> anyhow::Result<(f64, f64, Option<CudaSlice<f32>>, CommAlone)> {
    let world = job.world();
    let rank = job.rank();
    let (mu, nu, ku) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let compute = rig.compute.clone();
    let (_, env) = job.overlap()?;
    let comm = env.comm().clone();
    let comm = comm
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned communicator"))?;
    Ok(match op {
        OpKind::AllReduce | OpKind::ReduceScatter => {
            let mut d = poisoned::<bf16>(&compute, mu * nu)?;
            let t_gemm = rig.time(|| {
                cublas
                    .launch(&x.a, &x.b, &mut d)
                    .map_err(anyhow::Error::from)
            })?;
            let all = op == OpKind::AllReduce;
            let out = poisoned::<bf16>(&compute, if all { mu * nu } else { mu * nu / world })?;
            let abs = cmp.abs_sum_over_ranks(&comm, &compute, &d)?;
            let rows = if all {
                0..mu
            } else {
                rank * mu / world..(rank + 1) * mu / world
            };
            let mut mine = compute.alloc_zeros::<f32>(rows.len() * nu)?;
            compute.memcpy_dtod(&abs.slice(rows.start * nu..rows.end * nu), &mut mine)?;
            let mut lone = CommAlone::Reduce { d, out, all };
            let t_comm = rig.time(|| lone.launch(&comm, &x.a, &compute))?;
            compute.synchronize()?;
            (t_gemm, t_comm, Some(mine), lone)
        }
        OpKind::AllToAll => {
            let mut d = poisoned::<bf16>(&compute, mu * nu)?;
            let t_gemm = rig.time(|| {
                cublas
                    .launch(&x.a, &x.b, &mut d)
                    .map_err(anyhow::Error::from)
            })?;
            let gather = RowGather::new(&compute, &x.routes, rank, shape.m, shape.n)?;
            let mut send = poisoned::<bf16>(&compute, gather.send_len().max(1))?;
            gather.gather(&compute, &d, &mut send)?;
            let (sends, recvs) = gather.ranges();
            let mut lone = CommAlone::AllToAll {
                send,
                sends: sends.to_vec(),
                recv: poisoned::<bf16>(&compute, gather.recv_len().max(1))?,
                recvs: recvs.to_vec(),
            };
            let t_comm = rig.time(|| lone.launch(&comm, &x.a, &compute))?;
            (t_gemm, t_comm, None, lone)
        }
        OpKind::AllGather => {
            let mut a = poisoned::<bf16>(&compute, mu * ku)?;
            let t_comm = rig.time(|| {
                comm.all_gather(&x.a, &mut a, &compute)
                    .map_err(anyhow::Error::from)
            })?;
            let mut d = poisoned::<bf16>(&compute, mu * nu)?;
            let t_gemm =
                rig.time(|| cublas.launch(&a, &x.b, &mut d).map_err(anyhow::Error::from))?;
            (t_gemm, t_comm, None, CommAlone::AllGather { a })
        }
    })
}

/// Checks every op against `reference` (result poisoned, one launch), then times them all
/// interleaved with `lones`' references; (choice, method), the slowest rank's median per op in
/// `ops`' order, and per reference in `lones`' order.
#[allow(clippy::too_many_arguments)]
fn check_and_time_all(
    job: &mut Job,
    rig: &mut Rig,
    cmp: &mut BoundCompare,
    op: OpKind,
    ops: &mut [(MethodChoice, AnyOp)],
    lones: &mut Lones,
    x: &mut Operands,
    reference: &CudaSlice<bf16>,
    bound: &Bound<'_>,
    shape: GemmShape,
) -> anyhow::Result<(Vec<(MethodChoice, String)>, Vec<f64>, Vec<f64>)> {
    let compute = rig.compute.clone();
    let labels: Vec<(MethodChoice, String)> = ops
        .iter()
        .map(|(c, o)| (c.clone(), o.report().method.to_string()))
        .collect();
    for (c, anyop) in ops.iter_mut() {
        let method = anyop.report().method.to_string();
        let checked = (|| -> anyhow::Result<()> {
            anyop.prepare(&compute, x)?;
            anyop.poison(&compute, x)?;
            anyop.launch(&compute, x)?;
            anyop.synchronize()?;
            let what = format!("{} {shape} {c} ({method}) against seq-cublas", op.title());
            anyop.check(cmp, &compute, &what, x, reference, bound, shape.n as usize)
        })();
        weft_pgl::agree(
            &mut job.rdzv,
            &format!("checking {method} at {shape}"),
            checked,
        )?;
    }
    let comm = job.overlap()?.1.comm().clone();
    let mut tiny = compute.alloc_zeros::<f32>(1)?;
    let timed = (|| -> anyhow::Result<Vec<f64>> {
        for (_, anyop) in ops.iter() {
            anyop.prepare(&compute, x)?;
        }
        let n = ops.len();
        let t = rig.time_each(
            n + lones.len(),
            || align(&comm, &mut tiny, &compute),
            |i| {
                if i < n {
                    ops[i].1.launch(&compute, x)
                } else {
                    lones.launch(i - n, &comm, &x.a, &x.b, &compute)
                }
            },
        )?;
        for (_, anyop) in ops.iter() {
            anyop.synchronize()?;
        }
        Ok(t)
    })();
    let times = weft_pgl::agree(
        &mut job.rdzv,
        &format!("timing {} ops at {shape}", ops.len()),
        timed,
    )?;
    let mut times = slowest(job, &times)?;
    let lone_times = times.split_off(ops.len());
    Ok((labels, times, lone_times))
}

/// Lines the ranks up on `stream`: a one-element ncclAllReduce, which ends on every rank once all
/// have reached it (a few µs apart), so the next op starts together everywhere.
fn align(
    comm: &weft_signal_gemm::ops::SharedComm,
    tiny: &mut CudaSlice<f32>,
    stream: &Arc<CudaStream>,
) -> anyhow::Result<()> {
    let comm = comm.lock().map_err(|_| {
        anyhow::anyhow!(
            "the ops' communicator is unusable: a thread panicked while enqueueing on it"
        )
    })?;
    comm.all_reduce_in_place(tiny, ReduceOp::Sum, stream)
        .map_err(anyhow::Error::from)
}

/// An error's first line (progress lines stay short; the full text is in the refusal).
fn first_line(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let short: String = text.chars().take(240).collect();
    if short.len() < text.len() {
        format!("{short}…")
    } else {
        short
    }
}

/// Every rank's routing of `m` rows over `world` ranks: `uniform` (each row to a random rank) or
/// `skewed` (half of the rows to rank 0, the rest uniform), the same on every rank for a seed.
fn routes(kind: &str, world: usize, m: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..world)
        .map(|_| {
            (0..m)
                .map(|_| {
                    if kind == "skewed" && rng.random_bool(0.5) {
                        0
                    } else {
                        rng.random_range(0..world) as u32
                    }
                })
                .collect()
        })
        .collect()
}
