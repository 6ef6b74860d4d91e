//! `weft bench gemm`: weft's GEMM against cuBLAS (cublasGemmEx, fp32 compute) in the same run, on
//! each rank's GPU (the slowest rank's median is reported). Per shape: fresh random inputs, both
//! outputs poisoned and weft's checked element by element against cuBLAS's; then interleaved
//! rounds of weft and cuBLAS launches, each launch timed with its own events after a 256 MiB
//! scratch write that evicts L2, so neither starts warm from the previous iteration.
//!
//! Rows: the shapes (B n x k, bf16 -> bf16), one k x n B row, fp32-output and fp16 rows,
//! the other epilogue variant and clusters of 2 on some named shapes, and sm_margin = 8 rows
//! whose slowdown is compared with the share of SMs given up.

use super::SuiteResult;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::median;
use cudarc::driver::{sys, CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use weft_signal_gemm::reference::{check_all, Tolerance};
use weft_signal_gemm::{
    BLayout, CublasGemm, Dtype, EpilogueChoice, Gemm, GemmElement, GemmOptions, GemmShape,
};

const GOAL: f64 = 0.95;
const FLOOR: f64 = 0.85;
const FLUSH_BYTES: usize = 256 << 20;

struct Case {
    shape: GemmShape,
    options: GemmOptions,
    /// One of the named shapes (judged against the 95 % goal).
    named: bool,
    /// Compare with the sm_margin = 0 row of the same shape and options.
    margin_of: Option<usize>,
}

fn cases(quick: bool) -> Vec<Case> {
    let s = GemmShape::new;
    let base = GemmOptions::default();
    let named = [
        s(8192, 8192, 8192),
        s(4096, 4096, 4096),
        s(8192, 8192, 2048),
        s(16384, 8192, 1024),
        s(8192, 7168, 8192),
        s(4096, 8192, 2048),
    ];
    let mut v: Vec<Case> = named
        .iter()
        .map(|&shape| Case {
            shape,
            options: base,
            named: true,
            margin_of: None,
        })
        .collect();
    if quick {
        v.truncate(2);
    }
    // The whole-tile epilogue beside Auto's pipelined one, at short and long K.
    let whole = GemmOptions {
        epilogue: EpilogueChoice::WholeTile,
        ..base
    };
    for shape in [
        s(8192, 8192, 2048),
        s(16384, 8192, 1024),
        s(4096, 8192, 2048),
    ] {
        v.push(Case {
            shape,
            options: whole,
            named: false,
            margin_of: None,
        });
    }
    for shape in [s(8192, 8192, 8192), s(4096, 4096, 4096)] {
        v.push(Case {
            shape,
            options: whole,
            named: false,
            margin_of: None,
        });
    }
    let c2 = GemmOptions {
        cluster_m: 2,
        ..base
    };
    for shape in [s(8192, 8192, 8192), s(16384, 8192, 1024)] {
        v.push(Case {
            shape,
            options: c2,
            named: false,
            margin_of: None,
        });
    }
    v.push(Case {
        shape: s(8192, 8192, 8192),
        options: GemmOptions {
            b_layout: BLayout::KxN,
            ..base
        },
        named: false,
        margin_of: None,
    });
    v.push(Case {
        shape: s(8192, 8192, 4096),
        options: GemmOptions {
            output: Dtype::F32,
            ..base
        },
        named: false,
        margin_of: None,
    });
    v.push(Case {
        shape: s(8192, 8192, 4096),
        options: GemmOptions {
            input: Dtype::F16,
            output: Dtype::F16,
            ..base
        },
        named: false,
        margin_of: None,
    });
    v.push(Case {
        shape: s(8192, 8192, 8192),
        options: GemmOptions {
            sm_margin: 8,
            ..base
        },
        named: false,
        margin_of: Some(0),
    });
    if !quick {
        v.push(Case {
            shape: s(4096, 8192, 2048),
            options: GemmOptions {
                sm_margin: 8,
                ..base
            },
            named: false,
            margin_of: Some(5),
        });
    }
    v
}

struct Measured {
    weft_ms: f64,
    cublas_ms: f64,
    describe: String,
    flops: f64,
    ctas: u32,
    sms: u32,
}

/// Events around one launch, after an L2-evicting scratch write outside the timed region.
fn timed(
    stream: &Arc<CudaStream>,
    flush: &mut CudaSlice<u8>,
    op: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let ctx = stream.context();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
    stream.memset_zeros(flush)?;
    start.record(stream)?;
    op()?;
    end.record(stream)?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64)
}

fn measure<TI: GemmElement, TO: GemmElement>(
    job: &Job,
    case: &Case,
    quick: bool,
    flush: &mut CudaSlice<u8>,
) -> anyhow::Result<Measured> {
    let g = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
    let (ctx, stream) = (&g.ctx, &g.stream);
    let shape = case.shape;
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let seed = 0x6e6d_u64 ^ (m * 31 + n * 17 + k) as u64 ^ job.rank() as u64;
    let a = upload(stream, &uniform::<TI>(seed, m * k))?;
    let b = upload(stream, &uniform::<TI>(seed ^ 0xB, k * n))?;
    let mut d = poisoned::<TO>(stream, m * n)?;
    let mut want = poisoned::<TO>(stream, m * n)?;
    let gemm = Gemm::new(ctx, shape, case.options)?;
    let blas = CublasGemm::new(stream, shape, case.options)?;
    gemm.launch(stream, &a, &b, &mut d)?;
    blas.launch(&a, &b, &mut want)?;
    stream.synchronize()?;
    gemm.check()?;
    let want_f64: Vec<f64> = download(stream, &want)?
        .iter()
        .map(|x| x.to_f64())
        .collect();
    check_all(
        &format!("bench {}", gemm.plan().describe()),
        shape,
        &download(stream, &d)?,
        &want_f64,
        Tolerance::for_output(TO::DTYPE),
    )?;
    drop(want_f64);

    let (rounds, per_round) = if quick { (3, 5) } else { (6, 10) };
    for _ in 0..3 {
        gemm.launch(stream, &a, &b, &mut d)?;
        blas.launch(&a, &b, &mut want)?;
    }
    let (mut weft, mut cublas) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first in a round, so clock drift favours neither.
        for first_weft in [round % 2 == 0, round % 2 == 1] {
            for _ in 0..per_round {
                if first_weft {
                    weft.push(timed(stream, flush, &mut || {
                        gemm.launch(stream, &a, &b, &mut d)
                            .map_err(anyhow::Error::from)
                    })?);
                } else {
                    cublas.push(timed(stream, flush, &mut || {
                        blas.launch(&a, &b, &mut want).map_err(anyhow::Error::from)
                    })?);
                }
            }
        }
    }
    gemm.check()?;
    let sms = gemm.plan().sms;
    Ok(Measured {
        weft_ms: median(&weft),
        cublas_ms: median(&cublas),
        describe: gemm.plan().describe(),
        flops: gemm.plan().flops(),
        ctas: gemm.plan().ctas(),
        sms,
    })
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let cases = cases(quick);
    let mut flush = {
        let g = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
        g.stream.alloc_zeros::<u8>(FLUSH_BYTES)?
    };
    let mut measured = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        use half::f16;
        super::progress(
            job.rank(),
            "gemm",
            &format!(
                "{}/{} {} {}→{}, sm_margin {}",
                i + 1,
                cases.len(),
                case.shape,
                case.options.input,
                case.options.output,
                case.options.sm_margin
            ),
        );
        let m = match (case.options.input, case.options.output) {
            (Dtype::Bf16, Dtype::Bf16) => measure::<bf16, bf16>(job, case, quick, &mut flush)?,
            (Dtype::Bf16, Dtype::F32) => measure::<bf16, f32>(job, case, quick, &mut flush)?,
            (Dtype::F16, Dtype::F16) => measure::<f16, f16>(job, case, quick, &mut flush)?,
            (Dtype::F16, Dtype::F32) => measure::<f16, f32>(job, case, quick, &mut flush)?,
            (i, o) => anyhow::bail!("the gemm bench has no {i} -> {o} case"),
        };
        measured.push(m);
    }
    let mine: Vec<f64> = measured
        .iter()
        .flat_map(|m| [m.weft_ms, m.cublas_ms])
        .collect();
    let all = super::gather_f64(job, &mine)?;
    let slowest = |i: usize| all.iter().map(|r| r[i]).fold(f64::NAN, f64::max);

    let mut table = Table {
        headers: vec![
            "case",
            "plan",
            "weft (ms)",
            "cuBLAS (ms)",
            "weft TFLOP/s",
            "cuBLAS TFLOP/s",
            "weft / cuBLAS",
            "goal",
            "notes",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (i, (case, m)) in cases.iter().zip(&measured).enumerate() {
        let (weft_ms, cublas_ms) = (slowest(2 * i), slowest(2 * i + 1));
        let tflops = |ms: f64| m.flops / (ms * 1e-3) / 1e12;
        let ratio = cublas_ms / weft_ms; // weft speed as a fraction of cuBLAS speed
        let label = format!(
            "{} {}->{} B {}{}",
            case.shape,
            case.options.input,
            case.options.output,
            case.options.b_layout.name(),
            if case.options.sm_margin > 0 {
                format!(" sm_margin {}", case.options.sm_margin)
            } else {
                String::new()
            }
        ) + if case.options.cluster_m > 1 {
            " cluster 2"
        } else {
            ""
        } + match case.options.epilogue {
            EpilogueChoice::Auto => "",
            EpilogueChoice::Pipelined => " pipelined epilogue",
            EpilogueChoice::WholeTile => " whole-tile epilogue",
        };
        let (goal, notes, margin_json) = if let Some(j) = case.margin_of {
            let base_ms = slowest(2 * j);
            let share = m.sms as f64 / m.ctas as f64; // slowdown if time scaled with SMs given up
            let slowdown = weft_ms / base_ms;
            (
                format!("slowdown <= {share:.3}"),
                format!(
                    "slowdown vs sm_margin 0: {slowdown:.3} (meets: {})",
                    if slowdown <= share { "yes" } else { "no" }
                ),
                Some((slowdown, share)),
            )
        } else if case.named {
            let verdict = if ratio >= GOAL { "yes" } else { "no" };
            (
                format!(">= {GOAL:.2}"),
                format!(
                    "meets goal: {verdict}; floor {FLOOR:.2}: {}",
                    if ratio >= FLOOR { "yes" } else { "no" }
                ),
                None,
            )
        } else {
            (
                format!(">= {FLOOR:.2}"),
                format!("floor: {}", if ratio >= FLOOR { "yes" } else { "no" }),
                None,
            )
        };
        table.rows.push(vec![
            label.clone(),
            m.describe.clone(),
            format!("{weft_ms:.3}"),
            format!("{cublas_ms:.3}"),
            format!("{:.0}", tflops(weft_ms)),
            format!("{:.0}", tflops(cublas_ms)),
            format!("{ratio:.3}"),
            goal,
            notes,
        ]);
        rows.push(json::obj([
            ("case", Json::from(label)),
            ("plan", Json::from(m.describe.clone())),
            ("weft_ms", Json::from(weft_ms)),
            (
                "baseline",
                Json::from("cuBLAS cublasGemmEx, fp32 compute, same inputs, same run"),
            ),
            ("baseline_ms", Json::from(cublas_ms)),
            ("ratio", Json::from(ratio)),
            ("weft_tflops", Json::from(tflops(weft_ms))),
            ("cublas_tflops", Json::from(tflops(cublas_ms))),
            (
                "named_shape",
                Json::from(if case.named { "yes" } else { "no" }),
            ),
            ("ctas", Json::from(m.ctas as f64)),
            ("sms", Json::from(m.sms as f64)),
            ("slowdown_vs_margin0", Json::from(margin_json.map(|x| x.0))),
            ("sm_share_slowdown", Json::from(margin_json.map(|x| x.1))),
        ]));
    }
    Ok(SuiteResult { table, rows })
}
