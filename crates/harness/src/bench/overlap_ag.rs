//! `weft bench overlap-all-gather [--method M]…`: D (m × n) = AllGather(A) · B_rank, A sharded by
//! rows (m/world per rank), by method, in the same run:
//!
//! - `seq-cublas`: ncclAllGather of the shards, then cuBLAS — the ratios' baseline;
//! - `seq-weft`: ncclAllGather, then weft's GEMM;
//! - `fused-intra`: signal-gemm III's `FusedAllGatherGemm`, the loader reading A tiles by TMA
//!   from their owners' shards, each rank starting on its own. Its D is checked, before timing,
//!   bit for bit against `seq-weft`'s (the same kernel and tiles; only the order differs).
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
use weft_signal_gemm::fused::FusedAllGatherGemm;
use weft_signal_gemm::{CublasGemm, Gemm, GemmOptions, GemmShape};

pub const METHODS: &[&str] = &["seq-cublas", "seq-weft", "fused-intra"];

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
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
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
        let fused_t = if want("fused-intra") {
            comm.all_gather(&shard, &mut a, &compute)?;
            weft.launch(&compute, &a, &b, &mut d)?;
            let reference = download(&compute, &d)?;
            let mut fused =
                FusedAllGatherGemm::<bf16>::new(&mut job.rdzv, &ctx, &compute, shape, base)?;
            let timed = (|| -> anyhow::Result<f64> {
                let mut got = poisoned::<bf16>(&compute, mu * nu)?;
                fused.copy_shard(&compute, &shard)?;
                fused.run(&compute, &b, &mut got)?;
                fused.synchronize(&compute)?;
                anyhow::ensure!(
                    download(&compute, &got)? == reference,
                    "{shape}: fused-intra's D differs from weft's GEMM of the NCCL-gathered A"
                );
                let t = rig.time(|| fused.run(&compute, &b, &mut got))?;
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
        let v = slowest(
            job,
            &[t_gemm, t_comm, t_weft_gemm, seq_cublas, seq_weft, fused_t],
        )?;
        let (t_gemm, t_comm, t_weft_gemm, seq_cublas, seq_weft, fused_t) =
            (v[0], v[1], v[2], v[3], v[4], v[5]);
        table.rows.push(vec![
            format!("{m}x{n}x{k}"),
            format!("{t_gemm:.3}"),
            format!("{t_comm:.3}"),
            format!("{seq_cublas:.3}"),
            format!("{seq_weft:.3}"),
            format!("{fused_t:.3}"),
            format!("{:.3}", seq_cublas / fused_t),
            format!("{:.3}", fused_t / t_weft_gemm),
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
        ]));
    }
    Ok(SuiteResult { table, rows })
}
