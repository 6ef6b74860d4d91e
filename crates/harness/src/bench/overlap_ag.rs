//! `weft bench overlap-all-gather [--method M]…`: D (m × n) = AllGather(A) · B_rank, A sharded by
//! rows (m/world per rank), by method, in the same run:
//!
//! - `seq-cublas`: ncclAllGather of the shards, then cuBLAS — the ratios' baseline;
//! - `seq-weft`: ncclAllGather, then weft's GEMM;
//! - `fused-intra`: signal-gemm III's `FusedAllGatherGemm`, the loader reading A tiles by TMA
//!   from their owners' shards, each rank starting on its own;
//! - `fused-inter`: the same op, communicator CTAs copying the peers' shards chunk by chunk into
//!   a local A (their count measured at first use and cached, `fused::first_use`);
//! - `auto`: the fused method `fused::first_use` picks for the shape (measured at first use and
//!   cached), reported with its time from this run; the row also names the fastest method measured.
//!
//! Each fused D is checked, before timing, bit for bit against `seq-weft`'s (the same kernel and
//! tiles; only the order differs).
//!
//! Per shape also the GEMM and the AllGather alone (T_gemm = cuBLAS, T_comm). Timing as the other
//! overlap benches: events on the compute stream, L2 evicted before each iteration, median per
//! rank, slowest rank reported.

use super::rig::{slowest, Rig};
use super::SuiteResult;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::json::Json;
use crate::results::Table;
use half::bf16;
use weft_signal_gemm::fused::{first_use, AllGatherMethod, ChoiceCache, FusedAllGatherGemm};
use weft_signal_gemm::{CublasGemm, Gemm, GemmOptions, GemmShape};

pub const METHODS: &[&str] = &["seq-cublas", "seq-weft", "fused-intra", "fused-inter", "auto"];

/// M × N × K of the GEMM after the gather (async-TP's AG + GEMM shapes first).
pub fn shapes(quick: bool) -> Vec<GemmShape> {
    let s = GemmShape::new;
    if quick {
        return vec![s(8192, 2048, 8192)];
    }
    vec![
        s(8192, 2048, 8192),
        s(16384, 2048, 8192),
        s(8192, 8192, 2048),
        s(16384, 8192, 2048),
    ]
}

pub fn run(job: &mut Job, quick: bool, methods: &[String]) -> anyhow::Result<SuiteResult> {
    let want = |m: &str| methods.is_empty() || methods.iter().any(|x| x == m);
    for m in methods {
        anyhow::ensure!(
            METHODS.contains(&m.as_str()),
            "weft bench overlap-all-gather: unknown method {m:?} (methods: {})",
            METHODS.join(", ")
        );
    }
    let (rank, world) = (job.rank(), job.world());
    let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
    let (ctx, compute) = (gpu.ctx.clone(), gpu.stream.clone());
    let mut rig = Rig::with_comm_stream(&compute, if quick { 8 } else { 15 }, 3)?;
    job.comm()?;
    let mut table = Table {
        headers: vec![
            "M x N x K",
            "T_gemm",
            "T_comm",
            "seq-cublas",
            "seq-weft",
            "fused-intra",
            "speedup",
            "fused / weft GEMM",
            "fused-inter",
            "auto",
            "fastest",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    let mut cache = ChoiceCache::open(&ChoiceCache::default_path())?;
    for shape in shapes(quick) {
        let GemmShape { m, n, k } = shape;
        anyhow::ensure!(
            m as usize % world == 0,
            "{shape}: m does not split over {world} ranks"
        );
        let (mu, nu, ku) = (m as usize, n as usize, k as usize);
        let shard_rows = mu / world;
        let seed = 0xa6 ^ (u64::from(m) << 32) ^ (u64::from(k) << 8) ^ ((rank as u64) << 56);
        let shard = upload(&compute, &uniform::<bf16>(seed, shard_rows * ku))?;
        let b = upload(&compute, &uniform::<bf16>(seed ^ 1, ku * nu))?;
        let base = GemmOptions::default();
        let cublas = CublasGemm::new(&compute, shape, base)?;
        let weft = Gemm::new(&ctx, shape, base)?;
        let mut a = poisoned::<bf16>(&compute, mu * ku)?;
        let mut d = poisoned::<bf16>(&compute, mu * nu)?;
        let comm = job.comm()?;
        let t_gemm = rig.time(|| cublas.launch(&a, &b, &mut d))?;
        let t_comm = rig.time(|| comm.all_gather(&shard, &mut a, &compute))?;
        let t_weft_gemm = rig.time(|| weft.launch(&compute, &a, &b, &mut d))?;
        let seq = |rig: &mut Rig,
                   a: &mut cudarc::driver::CudaSlice<bf16>,
                   d: &mut cudarc::driver::CudaSlice<bf16>,
                   use_weft: bool| {
            rig.time(|| {
                comm.all_gather(&shard, a, &compute)?;
                if use_weft {
                    weft.launch(&compute, a, &b, d)
                } else {
                    cublas.launch(a, &b, d)
                }
            })
        };
        let seq_cublas = if want("seq-cublas") {
            seq(&mut rig, &mut a, &mut d, false)?
        } else {
            f64::NAN
        };
        let seq_weft = if want("seq-weft") {
            seq(&mut rig, &mut a, &mut d, true)?
        } else {
            f64::NAN
        };
        // The fused methods' reference: weft's GEMM of the NCCL-gathered A.
        comm.all_gather(&shard, &mut a, &compute)?;
        weft.launch(&compute, &a, &b, &mut d)?;
        let reference = download(&compute, &d)?;
        let mut time_fused = |job: &mut Job, method: AllGatherMethod| -> anyhow::Result<f64> {
            let mut fused = FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &compute, shape, base, method)?;
            let timed = (|| -> anyhow::Result<f64> {
                let mut got = poisoned::<bf16>(&compute, mu * nu)?;
                fused.copy_shard(&compute, &shard)?;
                fused.run(&compute, &b, &mut got)?;
                fused.synchronize(&compute)?;
                anyhow::ensure!(
                    download(&compute, &got)? == reference,
                    "{shape}: {method:?}'s D differs from weft's GEMM of the NCCL-gathered A"
                );
                let t = rig.time(|| fused.run(&compute, &b, &mut got))?;
                fused.synchronize(&compute)?;
                Ok(t)
            })();
            let freed = fused.free(&mut job.rdzv);
            let t = timed?;
            freed?;
            Ok(t)
        };
        let fused_t = if want("fused-intra") || want("auto") {
            time_fused(job, AllGatherMethod::Intra)?
        } else {
            f64::NAN
        };
        let (inter_t, inter_ctas) = if want("fused-inter") || want("auto") {
            let method = first_use::all_gather_method::<bf16>(&mut job.rdzv, &ctx, &compute, &mut cache, shape, base, &["fused-inter"])?;
            let AllGatherMethod::Inter { comm_ctas } = method else {
                anyhow::bail!("{shape}: fused-inter's choice is {method:?}")
            };
            (time_fused(job, method)?, comm_ctas)
        } else {
            (f64::NAN, 0)
        };
        // auto: the chosen method's time in this run (the same op as measured above, or timed
        // now if its count differs from fused-inter's own choice).
        let (auto_name, auto_t) = if want("auto") {
            match first_use::all_gather_method::<bf16>(&mut job.rdzv, &ctx, &compute, &mut cache, shape, base, &["fused-intra", "fused-inter"])? {
                AllGatherMethod::Intra => ("fused-intra".to_string(), fused_t),
                m @ AllGatherMethod::Inter { comm_ctas } => (
                    format!("fused-inter ({comm_ctas})"),
                    if comm_ctas == inter_ctas { inter_t } else { time_fused(job, m)? },
                ),
            }
        } else {
            (String::new(), f64::NAN)
        };
        let v = slowest(
            job,
            &[t_gemm, t_comm, t_weft_gemm, seq_cublas, seq_weft, fused_t, inter_t, auto_t],
        )?;
        let (t_gemm, t_comm, t_weft_gemm, seq_cublas, seq_weft, fused_t, inter_t, auto_t) =
            (v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        let measured = [("seq-cublas", seq_cublas), ("seq-weft", seq_weft), ("fused-intra", fused_t), ("fused-inter", inter_t)];
        let fastest = measured.iter().filter(|m| m.1.is_finite()).min_by(|x, y| x.1.total_cmp(&y.1)).map_or("", |m| m.0);
        table.rows.push(vec![
            format!("{m}x{n}x{k}"),
            format!("{t_gemm:.3}"),
            format!("{t_comm:.3}"),
            format!("{seq_cublas:.3}"),
            format!("{seq_weft:.3}"),
            format!("{fused_t:.3}"),
            format!("{:.3}", seq_cublas / fused_t),
            format!("{:.3}", fused_t / t_weft_gemm),
            format!("{inter_t:.3} ({inter_ctas})"),
            format!("{auto_t:.3} {auto_name}"),
            fastest.to_string(),
        ]);
        rows.push(Json::obj([
            ("op", Json::Str("all-gather".into())),
            ("m", Json::Num(f64::from(m))),
            ("n", Json::Num(f64::from(n))),
            ("k", Json::Num(f64::from(k))),
            ("world", Json::Num(world as f64)),
            ("t_gemm_cublas_ms", Json::Num(t_gemm)),
            ("t_gemm_weft_ms", Json::Num(t_weft_gemm)),
            ("t_comm_ms", Json::Num(t_comm)),
            ("seq_cublas_ms", Json::Num(seq_cublas)),
            ("seq_weft_ms", Json::Num(seq_weft)),
            ("fused_intra_ms", Json::Num(fused_t)),
            (
                "fused_intra_speedup_vs_seq_cublas",
                Json::Num(seq_cublas / fused_t),
            ),
            (
                "fused_intra_over_weft_gemm",
                Json::Num(fused_t / t_weft_gemm),
            ),
            ("fused_inter_ms", Json::Num(inter_t)),
            ("fused_inter_comm_ctas", Json::Num(f64::from(inter_ctas))),
            ("fused_inter_speedup_vs_seq_cublas", Json::Num(seq_cublas / inter_t)),
            ("fused_inter_over_weft_gemm", Json::Num(inter_t / t_weft_gemm)),
            ("auto_method", Json::Str(auto_name)),
            ("auto_ms", Json::Num(auto_t)),
            ("fastest_method", Json::Str(fastest.into())),
        ]));
    }
    Ok(SuiteResult { table, rows })
}
