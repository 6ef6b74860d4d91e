//! `weft bench overlap-all-to-all [--quick] [--method M]…`: GEMM + All-to-All on MoE-like
//! routings (every rank's local GEMM M × N × K; each output row routed to one rank), in the same
//! run:
//!
//! - `seq-cublas`: cuBLAS, then one grouped ncclSend/ncclRecv of each destination's rows. The
//!   baseline is given its best case: rows already sorted by destination, so each destination's
//!   rows are one contiguous range of the standard output (no gather kernel is timed);
//! - `signal`: signal-gemm II (`AllToAllOverlap`) with the rows routed in random order (the
//!   epilogue's row-slot map gathers them into per-group, per-destination pools), NCCL limited to
//!   the SMs the GEMM leaves free, then the scatter into the routing's order (included). Each
//!   (sm_margin, grouping) candidate is measured and the fastest reported.
//!
//! Routings: `uniform` (each row to a random rank) and `skewed` (half of the rows to rank 0, the
//! rest uniform). Before timing, each signal candidate's output is compared bit for bit with
//! weft's standard-layout GEMM all-gathered by NCCL and routed on the host. Timing as in
//! bench/rig.rs (events, L2 flush, median per rank, slowest rank).

use super::grid::large_shapes as shapes;
use weft_signal_gemm::ops::groupings;
use super::rig::{slowest, Rig};
use super::SuiteResult;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::json::Json;
use crate::results::Table;
use crate::word_compare::WordCompare;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::ops::Range;
use weft_pgl::nccl::Communicator;
use weft_signal_gemm::overlap::AllToAllOverlap;
use weft_signal_gemm::{CublasGemm, Gemm, GemmOptions, GemmPlan};

pub const METHODS: &[&str] = &["seq-cublas", "signal"];
const ROUTINGS: [&str; 2] = ["uniform", "skewed"];

fn routes(kind: &str, world: usize, m: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..world)
        .map(|_| {
            (0..m)
                .map(|_| if kind == "skewed" && rng.random_bool(0.5) { 0 } else { rng.random_range(0..world) as u32 })
                .collect()
        })
        .collect()
}

/// The sorted-rows baseline's ranges (elements of an m × n output): rank `me` sends destination
/// p's rows as one block, and receives each source's block for `me`, sources in order.
fn sorted_ranges(routes: &[Vec<u32>], me: usize, n: usize) -> (Vec<Range<usize>>, Vec<Range<usize>>) {
    let world = routes.len();
    let count = |s: usize, d: usize| routes[s].iter().filter(|&&x| x as usize == d).count();
    let mut sends = Vec::new();
    let mut at = 0;
    for d in 0..world {
        let c = count(me, d) * n;
        sends.push(at..at + c);
        at += c;
    }
    let mut recvs = Vec::new();
    let mut at = 0;
    for s in 0..world {
        let c = count(s, me) * n;
        recvs.push(at..at + c);
        at += c;
    }
    (sends, recvs)
}

pub fn run(job: &mut Job, quick: bool, methods: &[String]) -> anyhow::Result<SuiteResult> {
    let want = |m: &str| methods.is_empty() || methods.iter().any(|x| x == m);
    for m in methods {
        anyhow::ensure!(METHODS.contains(&m.as_str()), "weft bench overlap-all-to-all: unknown method {m:?} (methods: {})", METHODS.join(", "));
    }
    let (rank, world) = (job.rank(), job.world());
    let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
    let (ctx, compute) = (gpu.ctx.clone(), gpu.stream.clone());
    let sms = weft_signal_gemm::device_sms(&ctx)?;
    let mut rig = Rig::with_comm_stream(&compute, if quick { 8 } else { 15 }, 3)?;
    let margins: Vec<u32> = if quick { vec![32] } else { vec![32, 48] };
    let mut limited: Vec<(u32, Communicator)> = Vec::new();
    if want("signal") {
        for &m in &margins {
            limited.push((m, Communicator::with_max_ctas(&mut job.rdzv, &ctx, Some(m))?));
        }
    }
    job.comm()?;
    let mut table = Table {
        headers: vec!["M x N x K", "routing", "rows in", "T_gemm", "T_comm", "seq-cublas", "signal", "speedup", "of theory", "signal config"],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    let base = GemmOptions::default();
    let mut cmp = WordCompare::load(&compute)?;
    for shape in shapes(quick) {
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let seed = 0xa2a ^ (u64::from(shape.m) << 32) ^ (u64::from(shape.k) << 8);
        let a = upload(&compute, &uniform::<bf16>(seed ^ ((rank as u64) << 56), m * k))?;
        let b = upload(&compute, &uniform::<bf16>(seed ^ 1 ^ ((rank as u64) << 56), k * n))?;
        let cublas = CublasGemm::new(&compute, shape, base)?;
        let reference = Gemm::new(&ctx, shape, base)?;
        let mut d = poisoned::<bf16>(&compute, m * n)?;
        for kind in ROUTINGS {
            let routes = routes(kind, world, m, seed ^ 0x5eed);
            let (sends, recvs) = sorted_ranges(&routes, rank, n);
            let rows_in = recvs.last().map_or(0, |r| r.end) / n;
            let mut out = poisoned::<bf16>(&compute, (rows_in * n).max(1))?;
            let comm = job.comm()?;
            let t_gemm = rig.time(|| cublas.launch(&a, &b, &mut d))?;
            let t_comm = rig.time(|| comm.all_to_all_v(&d, &sends, &mut out, &recvs, &compute))?;
            let seq = if want("seq-cublas") {
                rig.time(|| {
                    cublas.launch(&a, &b, &mut d)?;
                    comm.all_to_all_v(&d, &sends, &mut out, &recvs, &compute)
                })?
            } else {
                f64::NAN
            };
            // Signal: check each candidate, then time it.
            let mut best: Option<(f64, u32, String)> = None;
            let mut candidates = Vec::new();
            if want("signal") {
                reference.launch(&compute, &a, &b, &mut d)?;
                let mut gathered = poisoned::<bf16>(&compute, world * m * n)?;
                job.comm()?.all_gather(&d, &mut gathered, &compute)?;
                let gathered = download(&compute, &gathered)?;
                let mut want_rows = Vec::with_capacity(rows_in * n);
                for (s, r) in routes.iter().enumerate() {
                    for (row, &dst) in r.iter().enumerate() {
                        if dst as usize == rank {
                            want_rows.extend_from_slice(&gathered[(s * m + row) * n..(s * m + row + 1) * n]);
                        }
                    }
                }
                // Compared on the GPU, word for word, with each candidate's output.
                let want_dev = if want_rows.is_empty() { None } else { Some(upload(&compute, &want_rows)?) };
                drop(gathered);
                for (margin, lcomm) in &limited {
                    let options = GemmOptions { sm_margin: *margin, ..base };
                    let plan = GemmPlan::new(sms, shape, options)?;
                    for parts in groupings(&plan)? {
                        let ov = AllToAllOverlap::new(&compute, shape, options, Some(&parts), &routes, rank)?;
                        let mut staging = poisoned::<bf16>(&compute, ov.staging_len().max(1))?;
                        let mut received = poisoned::<bf16>(&compute, ov.received_len().max(1))?;
                        let mut sig_out = poisoned::<bf16>(&compute, (ov.map().rows() * n).max(1))?;
                        ov.run(&compute, lcomm, &a, &b, &mut staging, &mut received, &mut sig_out)?;
                        compute.synchronize()?;
                        ov.check()?;
                        if let Some(w) = &want_dev {
                            if let Some(diff) = cmp.differ(&compute, &sig_out, w)? {
                                anyhow::bail!(
                                    "{shape} {kind} margin {margin} groups {}: output differs from the gathered GEMM in {} words (first {})",
                                    ov.groups(),
                                    diff.words,
                                    diff.first_word
                                );
                            }
                        }
                        let t = rig.time(|| ov.run(&compute, lcomm, &a, &b, &mut staging, &mut received, &mut sig_out))?;
                        let t = slowest(job, &[t])?[0];
                        candidates.push(Json::obj([
                            ("sm_margin", Json::Num(f64::from(*margin))),
                            ("groups", Json::Str(ov.groups().to_string())),
                            ("ms", Json::Num(t)),
                        ]));
                        if best.as_ref().is_none_or(|b| t < b.0) {
                            best = Some((t, *margin, ov.groups().to_string()));
                        }
                    }
                }
            }
            let v = slowest(job, &[t_gemm, t_comm, seq])?;
            let (t_gemm, t_comm, seq) = (v[0], v[1], v[2]);
            let (sig, margin, groups) = best.unwrap_or((f64::NAN, 0, String::new()));
            let theory = t_gemm.max(t_comm);
            table.rows.push(vec![
                shape.to_string(),
                kind.to_string(),
                rows_in.to_string(),
                format!("{t_gemm:.3}"),
                format!("{t_comm:.3}"),
                format!("{seq:.3}"),
                format!("{sig:.3}"),
                format!("{:.3}", seq / sig),
                format!("{:.1}%", 100.0 * theory / sig),
                format!("margin {margin} groups {groups}"),
            ]);
            rows.push(Json::obj([
                ("op", Json::Str("all_to_all".into())),
                ("m", Json::Num(f64::from(shape.m))),
                ("n", Json::Num(f64::from(shape.n))),
                ("k", Json::Num(f64::from(shape.k))),
                ("world", Json::Num(world as f64)),
                ("routing", Json::Str(kind.into())),
                ("rank0_rows_in", Json::Num(rows_in as f64)),
                ("t_gemm_cublas_ms", Json::Num(t_gemm)),
                ("t_comm_ms", Json::Num(t_comm)),
                ("seq_cublas_ms", Json::Num(seq)),
                ("signal_ms", Json::Num(sig)),
                ("signal_sm_margin", Json::Num(f64::from(margin))),
                ("signal_groups", Json::Str(groups)),
                ("speedup_vs_seq_cublas", Json::Num(seq / sig)),
                ("fraction_of_theoretical", Json::Num(theory / sig)),
                ("signal_candidates", Json::Arr(candidates)),
            ]));
        }
    }
    Ok(SuiteResult { table, rows })
}
