//! `weft bench gemm-llm [--quick] [--shape MxNxK,…]`: weft's GEMM against cuBLAS over LLM
//! projection shapes, every tile configuration beside the default one, in the same run.
//!
//! Shapes (bf16 → bf16, B = the weight, N × K as nn.Linear holds it): the four projections of a
//! layer — QKV (N = (q + 2·kv)/TP, K = hidden), O (N = hidden, K = q/TP), gate+up (N =
//! 2·inter/TP, K = hidden), down (N = hidden, K = inter/TP) — of Llama-3.1-8B at TP 1,
//! Llama-3.1-70B at TP 2, 4 and 8, Qwen2.5-72B at TP 8 (inter 29568: a ragged K and N) and a
//! Mixtral-8x7B expert (gate+up and down at TP 1); M (tokens) 512, 4096, 16384 and a ragged
//! 3008 (not a whole number of 128-row tiles; weft's GEMM needs multiples of 16).
//! Configurations: the default plan (`TileChoice::AutoPlain`: these GEMMs are launched plain),
//! `Auto` (the widths with fused kernels, as the fused methods plan), and 128 × 256, 128 × 192 or
//! 128 × 128 tiles, clusters of 1 or 2 (192: 1 only), the pipelined or whole-tile epilogue (those a
//! shape admits), unsplit, and split-K in 2 to 4.
//!
//! Per shape: every configuration's D checked on the GPU against cuBLAS's (2⁻⁷ relative plus
//! k · 2⁻¹⁸); then all timed interleaved (bench/rig.rs: each run after an L2 flush, between its own
//! events; the median, the slowest rank's). Inputs: one random block tiled over A and B.

use super::rig::{slowest, Rig};
use super::SuiteResult;
use crate::bound_compare::{Bound, BoundCompare};
use crate::gemm_data::{uniform, upload};
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::median;
use cudarc::driver::{sys, CudaSlice, CudaStream, CudaView, DevicePtr};
use half::bf16;
use std::sync::Arc;
use weft_signal_gemm::{
    CublasGemm, EpilogueChoice, Gemm, GemmOptions, GemmShape, KSplits, TileChoice,
};

/// A model's projection sizes.
struct Model {
    name: &'static str,
    hidden: u32,
    q: u32,
    kv: u32,
    inter: u32,
}

const LLAMA_8B: Model = Model {
    name: "Llama-3.1-8B",
    hidden: 4096,
    q: 4096,
    kv: 1024,
    inter: 14336,
};
const LLAMA_70B: Model = Model {
    name: "Llama-3.1-70B",
    hidden: 8192,
    q: 8192,
    kv: 1024,
    inter: 28672,
};
const QWEN_72B: Model = Model {
    name: "Qwen2.5-72B",
    hidden: 8192,
    q: 8192,
    kv: 1024,
    inter: 29568,
};
const MIXTRAL_EXPERT: Model = Model {
    name: "Mixtral-8x7B expert",
    hidden: 4096,
    q: 4096,
    kv: 1024,
    inter: 14336,
};

/// (label, N, K) of each projection of `model` at tensor parallelism `tp`.
fn projections(model: &Model, tp: u32, dense: bool) -> Vec<(String, u32, u32)> {
    let l = |p: &str| format!("{} TP{tp} {p}", model.name);
    let mut v = vec![
        (l("gate+up"), 2 * model.inter / tp, model.hidden),
        (l("down"), model.hidden, model.inter / tp),
    ];
    if dense {
        v.insert(0, (l("qkv"), (model.q + 2 * model.kv) / tp, model.hidden));
        v.insert(1, (l("o"), model.hidden, model.q / tp));
    }
    v
}

/// The grid: (label, shape).
fn grid(quick: bool) -> Vec<(String, GemmShape)> {
    let mut pairs = projections(&LLAMA_8B, 1, true);
    for tp in [2, 4, 8] {
        pairs.extend(projections(&LLAMA_70B, tp, true));
    }
    pairs.extend(projections(&QWEN_72B, 8, true));
    pairs.extend(projections(&MIXTRAL_EXPERT, 1, false));
    let ms: &[u32] = if quick {
        &[4096]
    } else {
        &[512, 3008, 4096, 16384]
    };
    if quick {
        pairs.truncate(4);
    }
    let mut out = Vec::new();
    for &m in ms {
        for (label, n, k) in &pairs {
            out.push((format!("{label} M{m}"), GemmShape::new(m, *n, *k)));
        }
    }
    out
}

/// The configurations tried at each shape: the default first.
fn configurations() -> Vec<(&'static str, GemmOptions)> {
    // Plain launches: Auto among all three tile widths (TileChoice::AutoPlain).
    let base = GemmOptions {
        tile: TileChoice::AutoPlain,
        ..GemmOptions::default()
    };
    let split = |tile, cluster_m, epilogue, splits| GemmOptions {
        tile,
        cluster_m,
        epilogue,
        k_splits: KSplits::Fixed(splits),
        ..base
    };
    let with = |tile, cluster_m, epilogue| split(tile, cluster_m, epilogue, 1);
    use EpilogueChoice::{Pipelined, WholeTile};
    use TileChoice::{N128, N192, N256};
    vec![
        ("default", base),
        ("auto, fused widths", GemmOptions::default()),
        ("128x256 c1 pipelined", with(N256, 1, Pipelined)),
        ("128x256 c1 whole", with(N256, 1, WholeTile)),
        ("128x192 c1 pipelined", with(N192, 1, Pipelined)),
        ("128x128 c1 pipelined", with(N128, 1, Pipelined)),
        ("128x256 c2 pipelined", with(N256, 2, Pipelined)),
        ("128x256 c2 whole", with(N256, 2, WholeTile)),
        ("128x128 c2 pipelined", with(N128, 2, Pipelined)),
        ("128x128 c1 split 2", split(N128, 1, Pipelined, 2)),
        ("128x128 c1 split 3", split(N128, 1, Pipelined, 3)),
        ("128x128 c1 split 4", split(N128, 1, Pipelined, 4)),
        ("128x192 c1 split 2", split(N192, 1, Pipelined, 2)),
        ("128x192 c1 split 3", split(N192, 1, Pipelined, 3)),
        ("128x256 c1 whole split 2", split(N256, 1, WholeTile, 2)),
        ("128x256 c1 whole split 3", split(N256, 1, WholeTile, 3)),
    ]
}

/// `count` bf16 NaNs (0x7FC0), set on the device (a host vector of NaNs would take seconds at
/// these sizes).
fn nans(stream: &Arc<CudaStream>, count: usize) -> anyhow::Result<CudaSlice<bf16>> {
    // SAFETY: every element is set by the memset below before anything reads it.
    let d = unsafe { stream.alloc::<bf16>(count) }?;
    let (ptr, _g) = d.device_ptr(stream);
    stream.context().bind_to_thread()?;
    // SAFETY: `count` 16-bit elements at `ptr`; stream-ordered.
    unsafe { sys::cuMemsetD16Async(ptr, 0x7FC0, count, stream.cu_stream()) }.result()?;
    drop(_g);
    Ok(d)
}

/// Fills `dst` by repeating `block` (device to device, stream-ordered).
fn tile_fill(
    stream: &Arc<CudaStream>,
    block: &CudaView<'_, bf16>,
    dst: &mut CudaSlice<bf16>,
) -> anyhow::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let n = block.len().min(dst.len() - done);
        stream.memcpy_dtod(&block.slice(..n), &mut dst.slice_mut(done..done + n))?;
        done += n;
    }
    Ok(())
}

pub fn run(job: &mut Job, quick: bool, shapes: &[GemmShape]) -> anyhow::Result<SuiteResult> {
    let cases: Vec<(String, GemmShape)> = if shapes.is_empty() {
        grid(quick)
    } else {
        shapes.iter().map(|s| (s.to_string(), *s)).collect()
    };
    let (ctx, stream) = {
        let g = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
        (g.ctx.clone(), g.stream.clone())
    };
    let (iters, warmup) = if quick { (7, 2) } else { (15, 3) };
    let mut rig = Rig::with_comm_stream(&stream, iters, warmup)?;
    let mut cmp = BoundCompare::load(&stream)?;
    // 4 Mi random values (odd length, so A's and B's rows do not repeat in step).
    let block = upload(
        &stream,
        &uniform::<bf16>(0x11a3 ^ job.rank() as u64, (1 << 22) + 7),
    )?;
    let configs = configurations();
    let mut table = Table {
        headers: vec![
            "case",
            "M x N x K",
            "cuBLAS",
            "default",
            "default/cuBLAS",
            "best",
            "best config",
            "best/cuBLAS",
        ],
        rows: Vec::new(),
    };
    if job.rank() == 0 {
        println!(
            "\n# weft gemm-llm: {} ranks (times in ms, slowest rank's median; ratios are cuBLAS time ÷ weft time)",
            job.world()
        );
        println!("{}", table.render_header());
    }
    let mut rows = Vec::new();
    let (mut default_ratios, mut best_ratios) = (Vec::new(), Vec::new());
    for (label, shape) in &cases {
        let GemmShape { m, n, k } = *shape;
        let mn = m as usize * n as usize;
        let mut a_o = nans(&stream, m as usize * k as usize)?;
        let mut b_o = nans(&stream, n as usize * k as usize)?;
        tile_fill(&stream, &block.slice(..), &mut a_o)?;
        tile_fill(&stream, &block.slice(1000..), &mut b_o)?;
        let blas = CublasGemm::new(&stream, *shape, GemmOptions::default())?;
        let mut reference = nans(&stream, mn)?;
        blas.launch(&a_o, &b_o, &mut reference)?;
        // Every configuration a shape admits (refusals listed), each checked against cuBLAS.
        let mut gemms: Vec<(&str, Gemm)> = Vec::new();
        let mut refused: Vec<String> = Vec::new();
        for (name, options) in &configs {
            match Gemm::new(&ctx, *shape, *options) {
                Ok(g) => gemms.push((name, g)),
                Err(e) => refused.push(format!("{name}: {e:#}")),
            }
        }
        // The default plan refused: the shape has no weft row (every rank alike: same plan).
        if gemms.first().map(|g| g.0) != Some("default") {
            anyhow::bail!(
                "gemm-llm {label} {shape}: weft's GEMM refused the default plan: {}",
                refused.join("; ")
            );
        }
        let bound = Bound {
            per_element: None,
            rel: 1.0 / 128.0,
            abs: k as f32 / 262_144.0,
        };
        let mut outs = Vec::new();
        for (name, g) in &gemms {
            let mut d = nans(&stream, mn)?;
            g.launch(&stream, &a_o, &b_o, &mut d)?;
            stream.synchronize()?;
            g.check()?;
            cmp.check(
                &stream,
                &format!("gemm-llm {label} {shape} {name} against cuBLAS"),
                &d,
                &reference,
                &bound,
                n as usize,
            )?;
            outs.push(d);
        }
        // cuBLAS and each configuration, interleaved (each iteration in its own shuffled order).
        let mut want_d = nans(&stream, mn)?;
        let count = 1 + gemms.len();
        let times = rig.time_each(
            count,
            || Ok(()),
            |i| {
                if i == 0 {
                    blas.launch(&a_o, &b_o, &mut want_d)
                        .map_err(anyhow::Error::from)
                } else {
                    let (_, g) = &gemms[i - 1];
                    g.launch(&stream, &a_o, &b_o, &mut outs[i - 1])
                        .map_err(anyhow::Error::from)
                }
            },
        )?;
        let times = slowest(job, &times)?;
        let cublas_ms = times[0];
        let default_ms = times[1];
        let (best_i, best_ms) = times[1..]
            .iter()
            .copied()
            .enumerate()
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .expect("the default configuration always plans");
        let best_name = gemms[best_i].0;
        default_ratios.push(cublas_ms / default_ms);
        best_ratios.push(cublas_ms / best_ms);
        let cells = vec![
            label.clone(),
            shape.to_string(),
            format!("{cublas_ms:.3}"),
            format!("{default_ms:.3}"),
            format!("{:.3}", cublas_ms / default_ms),
            format!("{best_ms:.3}"),
            best_name.to_string(),
            format!("{:.3}", cublas_ms / best_ms),
        ];
        if job.rank() == 0 {
            println!("{}", table.render_row(&cells));
        }
        table.rows.push(cells);
        let configs_json: Vec<Json> = gemms
            .iter()
            .zip(&times[1..])
            .map(|((name, g), ms)| {
                json::obj([
                    ("config", Json::from(name.to_string())),
                    ("plan", Json::from(g.plan().describe())),
                    ("ms", Json::from(*ms)),
                    ("ratio_vs_cublas", Json::from(cublas_ms / ms)),
                ])
            })
            .collect();
        rows.push(json::obj([
            ("case", Json::from(label.clone())),
            ("m", Json::from(f64::from(m))),
            ("n", Json::from(f64::from(n))),
            ("k", Json::from(f64::from(k))),
            (
                "baseline",
                Json::from("cuBLAS cublasGemmEx, fp32 compute, same inputs, same run"),
            ),
            ("baseline_ms", Json::from(cublas_ms)),
            ("weft_ms", Json::from(default_ms)),
            ("ratio", Json::from(cublas_ms / default_ms)),
            ("default_plan", Json::from(gemms[0].1.plan().describe())),
            ("best_config", Json::from(best_name.to_string())),
            ("best_ms", Json::from(best_ms)),
            ("best_ratio", Json::from(cublas_ms / best_ms)),
            ("configs", Json::Array(configs_json)),
            (
                "refused",
                Json::Array(refused.into_iter().map(Json::from).collect()),
            ),
        ]));
    }
    if job.rank() == 0 && !default_ratios.is_empty() {
        let lo = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "\ndefault ÷ cuBLAS speed: median {:.3}, lowest {:.3}; best configuration per shape: median {:.3}, lowest {:.3} ({} shapes)",
            median(&default_ratios),
            lo(&default_ratios),
            median(&best_ratios),
            lo(&best_ratios),
            default_ratios.len()
        );
    }
    Ok(SuiteResult { table, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_holds_each_models_projections() {
        let g = grid(false);
        // 4 + 3 × 4 + 4 + 2 projections, 4 token counts.
        assert_eq!(g.len(), 22 * 4);
        let find = |label: &str| g.iter().find(|(l, _)| l == label).map(|x| x.1);
        assert_eq!(
            find("Llama-3.1-70B TP8 qkv M4096"),
            Some(GemmShape::new(4096, 1280, 8192))
        );
        assert_eq!(
            find("Qwen2.5-72B TP8 down M3008"),
            Some(GemmShape::new(3008, 8192, 3696))
        );
        assert_eq!(
            find("Llama-3.1-8B TP1 gate+up M512"),
            Some(GemmShape::new(512, 28672, 4096))
        );
        assert_eq!(configurations()[0].0, "default");
    }
}
