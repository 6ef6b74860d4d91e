//! `weft bench overlap` (GEMM + AllReduce) and `weft bench overlap-reduce-scatter` (GEMM +
//! ReduceScatter) `[--method M]…`: each rank's local GEMM M × N × K, its output summed over ranks
//! (and, for ReduceScatter, scattered by rows), by method, in the same run:
//!
//! - `seq-cublas`: cuBLAS, then the NCCL collective (NCCL's default CTAs) — the ratios' baseline;
//! - `seq-weft`: weft's GEMM, then the NCCL collective;
//! - `decomposition`: M split into 2 or 4 row bands, cuBLAS per band on the compute stream and
//!   the band's collective on a high-priority stream as soon as it is computed (best count);
//! - `signal`: signal-gemm II (`AllReduceOverlap` / `ReduceScatterOverlap`): wave-group signals,
//!   the collective's reorder map, one NCCL call per group on a high-priority stream with NCCL
//!   limited to the SMs the GEMM leaves free, then the restore to the standard layout (included
//!   in the time). Each (sm_margin, grouping) candidate is measured and the fastest reported;
//! - `fused-intra` (ReduceScatter only): signal-gemm III's `FusedReduceScatter`, one kernel on
//!   every SM whose epilogue reduce-adds each tile by TMA into its owner's memory (no NCCL); its
//!   output is checked like `signal`'s (the rows m / world each rank owns, NCCL's row split);
//! - `fused-inter`, `distfuse` (AllReduce only): signal-gemm III's `FusedAllReduce`, the tiles'
//!   owners summing every rank's partial by peer loads and writing it to every rank, in the GEMM's
//!   communicator CTAs or in a kernel of their own on a second stream; the worker count measured
//!   at first use and cached (`fused::first_use`, file `WEFT_CHOICES` or weft-choices.txt);
//!   checked like `signal`'s;
//! - `auto` (AllReduce only): the fused method and count `fused::first_use` picks for the shape,
//!   reported with its time from this run. Every row also names the fastest method measured.
//!
//! Per shape also: the GEMM and the collective alone (T_gemm = cuBLAS, T_comm), the theoretical
//! best max(T_gemm, T_comm) and the share of it reached, and the signalling GEMM alone against
//! the plain weft GEMM with the same SMs (interference). Timing: each iteration between its own
//! events on the compute stream, after a 256 MiB scratch write that evicts L2; median per rank,
//! slowest rank reported. The signal output is checked element by element, before timing,
//! against weft's GEMM summed over ranks by ncclAllReduce (ReduceScatter: the rows the rank owns;
//! bound world · 2⁻⁷ · Σ_r |partial_r|, see reduce_check.rs).

use super::rig::{slowest, Rig};
use super::SuiteResult;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::reduce_check::{check_within, pick_rows, sum_bound};
use crate::json::Json;
use crate::results::Table;
use half::bf16;
use weft_kernels::abi::WEFT_GEMM_MAX_WAVE_GROUPS;
use weft_pgl::nccl::{Communicator, ReduceOp};
use super::overlap_ops::{collective, out_len, Signal};
use weft_signal_gemm::tuner::Op;
use weft_signal_gemm::fused::{first_use, AllReduceMethod, ChoiceCache, FusedAllReduce, FusedReduceScatter};
use weft_signal_gemm::{CublasGemm, Gemm, GemmOptions, GemmPlan, GemmShape, WaveGroups};

pub const METHODS: &[&str] = &["seq-cublas", "seq-weft", "decomposition", "signal", "fused-intra", "fused-inter", "distfuse", "auto"];

pub fn shapes(quick: bool) -> Vec<GemmShape> {
    let s = GemmShape::new;
    if quick {
        return vec![s(8192, 8192, 2048), s(16384, 8192, 1024)];
    }
    let mut v = Vec::new();
    for m in [4096, 8192, 16384] {
        for k in [1024, 2048, 7168] {
            v.push(s(m, 8192, k));
        }
    }
    v.push(s(16384, 16384, 2048));
    v
}

/// Wave groupings tried for `plan`.
pub fn groupings(plan: &GemmPlan) -> anyhow::Result<Vec<Vec<u32>>> {
    let waves = plan.waves();
    let mut out = Vec::new();
    for w in [1, 2, 4] {
        if waves.div_ceil(w) <= WEFT_GEMM_MAX_WAVE_GROUPS {
            out.push(WaveGroups::uniform(plan, w)?.waves().to_vec());
        }
    }
    if waves > 1 {
        out.push(vec![1, waves - 1]);
        out.push(vec![waves.div_ceil(2), waves / 2]);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

pub fn run(job: &mut Job, op: Op, quick: bool, methods: &[String]) -> anyhow::Result<SuiteResult> {
    let want = |m: &str| methods.is_empty() || methods.iter().any(|x| x == m);
    for m in methods {
        anyhow::ensure!(METHODS.contains(&m.as_str()), "weft bench overlap: unknown method {m:?} (methods: {})", METHODS.join(", "));
    }
    anyhow::ensure!(
        op == Op::ReduceScatter || !methods.iter().any(|m| m == "fused-intra"),
        "weft bench overlap: fused-intra exists for ReduceScatter only (weft bench overlap-reduce-scatter)"
    );
    anyhow::ensure!(
        op == Op::AllReduce || !methods.iter().any(|m| m == "fused-inter" || m == "distfuse" || m == "auto"),
        "weft bench overlap-reduce-scatter: fused-inter, distfuse and auto exist for AllReduce only (weft bench overlap)"
    );
    let fused_wanted = op == Op::ReduceScatter && want("fused-intra");
    let auto_wanted = op == Op::AllReduce && want("auto");
    let ar_methods: Vec<&str> = ["fused-inter", "distfuse"]
        .into_iter()
        .filter(|name| op == Op::AllReduce && (want(name) || auto_wanted))
        .collect();
    let mut cache = ChoiceCache::open(&ChoiceCache::default_path())?;
    let rank = job.rank();
    let world = job.world();
    let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
    let (ctx, compute) = (gpu.ctx.clone(), gpu.stream.clone());
    let sms = weft_signal_gemm::device_sms(&ctx)?;
    let mut rig = Rig::with_comm_stream(&compute, if quick { 8 } else { 15 }, 3)?;
    let margins: Vec<u32> = if quick { vec![16, 32] } else { vec![16, 32, 48] };
    // One communicator per margin, NCCL limited to that many CTAs (collective: every rank).
    let mut limited: Vec<(u32, Communicator)> = Vec::new();
    if want("signal") {
        for &m in &margins {
            limited.push((m, Communicator::with_max_ctas(&mut job.rdzv, &ctx, Some(m))?));
        }
    }
    job.comm()?;
    let mut table = Table {
        headers: vec![
            "M x N x K", "T_gemm", "T_comm", "seq-cublas", "seq-weft", "decomp", "signal", "speedup", "of theory", "interf.",
            "signal config", "fused-intra", "fused speedup", "fused / weft GEMM", "fused-inter", "distfuse", "auto", "fastest",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for shape in shapes(quick) {
        let GemmShape { m, n, k } = shape;
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let seed = 0x5eed ^ (u64::from(m) << 32) ^ (u64::from(k) << 8) ^ ((rank as u64) << 56);
        let a = upload(&compute, &uniform::<bf16>(seed, mu * ku))?;
        let b = upload(&compute, &uniform::<bf16>(seed ^ 1, ku * nu))?;
        let base = GemmOptions::default();
        let cublas = CublasGemm::new(&compute, shape, base)?;
        let weft = Gemm::new(&ctx, shape, base)?;
        anyhow::ensure!(
            op == Op::AllReduce || (mu * nu) % world == 0 && mu % world == 0,
            "{shape}: the ReduceScatter baselines split m x n and m evenly over {world} ranks"
        );
        let mut d = poisoned::<bf16>(&compute, mu * nu)?;
        let mut out = poisoned::<bf16>(&compute, out_len(op, mu * nu, world))?;
        let comm = job.comm()?;

        // Alone.
        let t_gemm = rig.time(|| cublas.launch(&a, &b, &mut d))?;
        let t_comm = rig.time(|| collective(op, comm, &d, &mut out, &compute))?;
        let t_weft_gemm = rig.time(|| weft.launch(&compute, &a, &b, &mut d))?;
        // Sequential.
        let seq_cublas = if want("seq-cublas") {
            rig.time(|| {
                cublas.launch(&a, &b, &mut d)?;
                collective(op, comm, &d, &mut out, &compute)
            })?
        } else {
            f64::NAN
        };
        let seq_weft = if want("seq-weft") {
            rig.time(|| {
                weft.launch(&compute, &a, &b, &mut d)?;
                collective(op, comm, &d, &mut out, &compute)
            })?
        } else {
            f64::NAN
        };
        // Decomposition: bands of rows on two streams; band c's result at its share of `out`.
        let mut decomp = (f64::NAN, 0usize);
        if want("decomposition") {
            for chunks in [2usize, 4] {
                let rows = mu / chunks;
                let band = CublasGemm::new(&compute, GemmShape::new(rows as u32, n, k), base)?;
                let part = out_len(op, rows * nu, world);
                let x = &rig.comm_stream.clone();
                let t = rig.time(|| {
                    x.join(&compute)?;
                    for c in 0..chunks {
                        let av = a.slice(c * rows * ku..(c + 1) * rows * ku);
                        let mut dv = d.slice_mut(c * rows * nu..(c + 1) * rows * nu);
                        band.launch(&av, &b, &mut dv)?;
                        x.join(&compute)?;
                        let dv = d.slice(c * rows * nu..(c + 1) * rows * nu);
                        collective(op, comm, &dv, &mut out.slice_mut(c * part..(c + 1) * part), x)?;
                    }
                    compute.join(x)?;
                    Ok(())
                })?;
                if !(t >= decomp.0) {
                    decomp = (t, chunks);
                }
            }
        }
        // Signal: check once against weft's GEMM summed by NCCL, then every candidate timed.
        let mut best: Option<(f64, u32, String, f64, f64, f64)> = None; // (ms, margin, groups, gemm-only, plain same margin, restore)
        let mut candidates = Vec::new();
        let mut margin_rows = Vec::new();
        if want("signal") {
            weft.launch(&compute, &a, &b, &mut d)?;
            let bound = sum_bound(job, &compute, &d)?;
            let mut summed = poisoned::<bf16>(&compute, mu * nu)?;
            job.comm()?.all_reduce(&d, &mut summed, ReduceOp::Sum, &compute)?;
            let summed = download(&compute, &summed)?;
            for (margin, lcomm) in &limited {
                let options = GemmOptions { sm_margin: *margin, ..base };
                let plan = GemmPlan::new(sms, shape, options)?;
                // What the overlap works with: the GEMM on the SMs left, NCCL on the rest.
                let plain = Gemm::new(&ctx, shape, options)?;
                let parts_alone = [
                    rig.time(|| plain.launch(&compute, &a, &b, &mut d))?,
                    rig.time(|| collective(op, lcomm, &d, &mut out, &compute))?,
                ];
                let parts_alone = slowest(job, &parts_alone)?;
                margin_rows.push(Json::obj([
                    ("sm_margin", Json::Num(f64::from(*margin))),
                    ("gemm_alone_ms", Json::Num(parts_alone[0])),
                    ("nccl_max_ctas_alone_ms", Json::Num(parts_alone[1])),
                ]));
                for parts in groupings(&plan)? {
                    let mut sig = Signal::new(op, &compute, shape, options, &parts, world, rank)?;
                    let rows = sig.rows(m);
                    let mut sig_out = poisoned::<bf16>(&compute, rows.len() * nu)?;
                    sig.run(&compute, lcomm, &a, &b, &mut sig_out)?;
                    compute.synchronize()?;
                    sig.check()?;
                    let what = format!("{shape} margin {margin} groups {} against weft GEMM + ncclAllReduce", sig.groups());
                    check_within(&what, &download(&compute, &sig_out)?, &pick_rows(&summed, &rows, nu), &pick_rows(&bound, &rows, nu), nu)?;
                    let t = rig.time(|| sig.run(&compute, lcomm, &a, &b, &mut sig_out))?;
                    let t = slowest(job, &[t])?[0];
                    candidates.push(Json::obj([
                        ("sm_margin", Json::Num(f64::from(*margin))),
                        ("groups", Json::Str(sig.groups())),
                        ("ms", Json::Num(t)),
                    ]));
                    if best.as_ref().is_none_or(|b| t < b.0) {
                        let gemm_only = rig.time(|| sig.run_gemm_only(&compute, &a, &b))?;
                        let plain_t = rig.time(|| plain.launch(&compute, &a, &b, &mut d))?;
                        let restore_t = rig.time(|| sig.restore(&compute, &mut sig_out))?;
                        best = Some((t, *margin, sig.groups(), gemm_only, plain_t, restore_t));
                    }
                }
            }
        }
        // Fused: checked once against weft's GEMM summed by NCCL (this rank's m / world rows),
        // then timed. Collective (every rank makes it).
        let fused_t = if fused_wanted {
            let mut fused = FusedReduceScatter::<bf16>::new(&mut job.rdzv, &ctx, &compute, shape, base)?;
            let timed = (|| -> anyhow::Result<f64> {
                weft.launch(&compute, &a, &b, &mut d)?;
                let bound = sum_bound(job, &compute, &d)?;
                let mut summed = poisoned::<bf16>(&compute, mu * nu)?;
                job.comm()?.all_reduce(&d, &mut summed, ReduceOp::Sum, &compute)?;
                let summed = download(&compute, &summed)?;
                let (first, rows) = fused.rows();
                let rows: Vec<u32> = (first..first + rows).collect();
                let mut got = poisoned::<bf16>(&compute, rows.len() * nu)?;
                fused.run(&compute, &a, &b)?;
                fused.copy_output(&compute, &mut got)?;
                fused.synchronize(&compute)?;
                let what = format!("{shape} fused-intra against weft GEMM + ncclAllReduce");
                check_within(&what, &download(&compute, &got)?, &pick_rows(&summed, &rows, nu), &pick_rows(&bound, &rows, nu), nu)?;
                let t = rig.time(|| fused.run(&compute, &a, &b))?;
                fused.synchronize(&compute)?;
                Ok(t)
            })();
            let freed = fused.free(&mut job.rdzv);
            let t = timed?;
            freed?;
            t
        } else {
            f64::NAN
        };
        // Fused AllReduce: per method, its worker count measured at first use (or cached), the op
        // checked once against weft's GEMM summed by NCCL (every row), then timed. Collective.
        let mut ar_times = [(f64::NAN, 0u32); 2]; // (ms, workers): fused-inter, distfuse
        let mut auto = (String::new(), f64::NAN);
        if !ar_methods.is_empty() {
            weft.launch(&compute, &a, &b, &mut d)?;
            let bound = sum_bound(job, &compute, &d)?;
            let mut summed = poisoned::<bf16>(&compute, mu * nu)?;
            job.comm()?.all_reduce(&d, &mut summed, ReduceOp::Sum, &compute)?;
            let summed = download(&compute, &summed)?;
            let mut time_ar = |job: &mut Job, options: GemmOptions, method: AllReduceMethod| -> anyhow::Result<f64> {
                let mut fused = FusedAllReduce::new(&mut job.rdzv, &ctx, &compute, shape, options, method)?;
                let timed = (|| -> anyhow::Result<f64> {
                    let mut got = poisoned::<bf16>(&compute, mu * nu)?;
                    fused.run(&compute, &a, &b)?;
                    fused.copy_output(&compute, &mut got)?;
                    fused.synchronize(&compute)?;
                    let what = format!("{shape} {method:?} against weft GEMM + ncclAllReduce");
                    check_within(&what, &download(&compute, &got)?, &summed, &bound, nu)?;
                    let t = rig.time(|| fused.run(&compute, &a, &b))?;
                    fused.synchronize(&compute)?;
                    Ok(t)
                })();
                let freed = fused.free(&mut job.rdzv);
                let t = slowest(job, &[timed?])?[0];
                freed?;
                Ok(t)
            };
            let mut chosen = Vec::new();
            for (slot, name) in ["fused-inter", "distfuse"].into_iter().enumerate() {
                if !ar_methods.contains(&name) {
                    continue;
                }
                let (options, method) = first_use::all_reduce_method(&mut job.rdzv, &ctx, &compute, &mut cache, shape, base, &[name])?;
                let t = time_ar(job, options, method)?;
                let workers = match method {
                    AllReduceMethod::Inter { comm_ctas } => comm_ctas,
                    AllReduceMethod::DistFuse { workers } => workers,
                };
                ar_times[slot] = (t, workers);
                chosen.push((method, t));
            }
            if auto_wanted {
                let (options, method) = first_use::all_reduce_method(&mut job.rdzv, &ctx, &compute, &mut cache, shape, base, &["fused-inter", "distfuse"])?;
                // The same op as measured above, or (another count) timed now.
                let t = match chosen.iter().find(|c| c.0 == method) {
                    Some(c) => c.1,
                    None => time_ar(job, options, method)?,
                };
                auto = (format!("{method:?}"), t);
            }
        }
        let mine = [t_gemm, t_comm, t_weft_gemm, seq_cublas, seq_weft, decomp.0, fused_t];
        let v = slowest(job, &mine)?;
        let (t_gemm, t_comm, t_weft_gemm, seq_cublas, seq_weft, decomp_t, fused_t) = (v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
        let (sig_t, margin, groups, gemm_only, plain_t, restore_t) = match &best {
            Some((t, mg, g, go, p, r)) => {
                let w = slowest(job, &[*go, *p, *r])?;
                (*t, *mg, g.clone(), w[0], w[1], w[2])
            }
            None => (f64::NAN, 0, String::new(), f64::NAN, f64::NAN, f64::NAN),
        };
        let measured = [
            ("seq-cublas", seq_cublas),
            ("seq-weft", seq_weft),
            ("decomposition", decomp_t),
            ("signal", sig_t),
            ("fused-intra", fused_t),
            ("fused-inter", ar_times[0].0),
            ("distfuse", ar_times[1].0),
        ];
        let fastest = measured.iter().filter(|m| m.1.is_finite()).min_by(|x, y| x.1.total_cmp(&y.1)).map_or("", |m| m.0);
        let theory = t_gemm.max(t_comm);
        let speedup = seq_cublas / sig_t;
        let of_theory = theory / sig_t; // (T_seq / T_signal) / (T_seq / max)
        let interference = gemm_only / plain_t;
        table.rows.push(vec![
            format!("{m}x{n}x{k}"),
            format!("{t_gemm:.3}"),
            format!("{t_comm:.3}"),
            format!("{seq_cublas:.3}"),
            format!("{seq_weft:.3}"),
            format!("{decomp_t:.3} ({}x)", decomp.1),
            format!("{sig_t:.3}"),
            format!("{speedup:.3}"),
            format!("{:.1}%", 100.0 * of_theory),
            format!("{interference:.3}"),
            format!("margin {margin} groups {groups}"),
            format!("{fused_t:.3}"),
            format!("{:.3}", seq_cublas / fused_t),
            format!("{:.3}", fused_t / t_weft_gemm),
            format!("{:.3} ({})", ar_times[0].0, ar_times[0].1),
            format!("{:.3} ({})", ar_times[1].0, ar_times[1].1),
            format!("{:.3} {}", auto.1, auto.0),
            fastest.to_string(),
        ]);
        rows.push(Json::obj([
            ("op", Json::Str(op.name().into())),
            ("m", Json::Num(f64::from(m))),
            ("n", Json::Num(f64::from(n))),
            ("k", Json::Num(f64::from(k))),
            ("world", Json::Num(world as f64)),
            ("t_gemm_cublas_ms", Json::Num(t_gemm)),
            ("t_gemm_weft_ms", Json::Num(t_weft_gemm)),
            ("t_comm_ms", Json::Num(t_comm)),
            ("comm_over_gemm", Json::Num(t_comm / t_gemm)),
            ("seq_cublas_ms", Json::Num(seq_cublas)),
            ("seq_weft_ms", Json::Num(seq_weft)),
            ("decomposition_ms", Json::Num(decomp_t)),
            ("decomposition_chunks", Json::Num(decomp.1 as f64)),
            ("signal_ms", Json::Num(sig_t)),
            ("signal_sm_margin", Json::Num(f64::from(margin))),
            ("signal_groups", Json::Str(groups)),
            ("signal_gemm_only_ms", Json::Num(gemm_only)),
            ("plain_gemm_same_margin_ms", Json::Num(plain_t)),
            ("interference", Json::Num(interference)),
            ("restore_ms", Json::Num(restore_t)),
            ("speedup_vs_seq_cublas", Json::Num(speedup)),
            ("theoretical_speedup", Json::Num(seq_cublas / theory)),
            ("fraction_of_theoretical", Json::Num(of_theory)),
            ("signal_margins", Json::Arr(margin_rows)),
            ("signal_candidates", Json::Arr(candidates)),
            ("fused_intra_ms", Json::Num(fused_t)),
            ("fused_intra_speedup_vs_seq_cublas", Json::Num(seq_cublas / fused_t)),
            ("fused_intra_over_weft_gemm", Json::Num(fused_t / t_weft_gemm)),
            ("fused_inter_ms", Json::Num(ar_times[0].0)),
            ("fused_inter_workers", Json::Num(f64::from(ar_times[0].1))),
            ("distfuse_ms", Json::Num(ar_times[1].0)),
            ("distfuse_workers", Json::Num(f64::from(ar_times[1].1))),
            ("fused_inter_speedup_vs_seq_cublas", Json::Num(seq_cublas / ar_times[0].0)),
            ("distfuse_speedup_vs_seq_cublas", Json::Num(seq_cublas / ar_times[1].0)),
            ("auto_method", Json::Str(auto.0)),
            ("auto_ms", Json::Num(auto.1)),
            ("fastest_method", Json::Str(fastest.into())),
        ]));
    }
    Ok(SuiteResult { table, rows })
}
