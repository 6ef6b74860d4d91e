//! Timing suites: `weft bench [SUITE] [--quick] [--json PATH] [--csv PATH]`. Every rank times,
//! results are combined across ranks (the slowest rank's median is the reported time), rank 0
//! prints the table and writes the files.

mod collectives;
mod gemm;
mod gemm_llm;
pub mod grid;
mod grpcoll;
mod interference;
mod nccl;
pub mod overlap;
mod overlap_breakdown;
mod overlap_lone;
pub mod overlap_ops;
pub mod overlap_order;
mod pgl;
pub mod rig;
pub mod sweep;
mod sync;
pub mod tune;

use crate::job::Job;
use crate::json::Json;
use crate::results::{today, RunMeta, Table};
use anyhow::{bail, Context};
use std::path::PathBuf;
use weft_signal_gemm::ops::OpKind;

pub const SUITES: &[&str] = &[
    "nccl",
    "collectives",
    "pgl",
    "sync",
    "overlap-order",
    "grpcoll",
    "gemm",
    "gemm-llm",
    "overlap",
    "overlap-reduce-scatter",
    "overlap-all-to-all",
    "overlap-all-gather",
    "interference",
];

#[derive(Debug, Default, PartialEq)]
pub struct BenchOptions {
    pub suites: Vec<String>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub quick: bool,
    /// `--method M` (repeatable): the overlap suite's methods to run (all when none is named).
    pub methods: Vec<String>,
    /// `--shape MxNxK[,…]` (repeatable): the overlap suites' shapes instead of their grid.
    pub shapes: Vec<weft_signal_gemm::GemmShape>,
    /// nccl-tests' `-b -e -f -n -w`: the sized suites' sizes and iterations.
    pub sweep: sweep::Sweep,
}

/// What one suite measured: the table rank 0 prints and the rows of its results file.
pub struct SuiteResult {
    pub table: Table,
    pub rows: Vec<Json>,
}

/// `weft bench`'s flags (clap: `weft bench --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "weft bench",
    about = "Timing suites: weft against its baselines (cuBLAS, NCCL, the sequential paths) in the same run, the slowest rank's medians",
    after_help = "Run under a launcher with one rank per GPU (mpirun, srun, torchrun, weft launch -n N --). \
Times are CUDA-event medians after warm-up; each suite's method is in the crate README it cites."
)]
struct BenchArgs {
    /// Suites to run, in order (all when none is named)
    #[arg(value_name = "SUITE", value_parser = clap::builder::PossibleValuesParser::new(SUITES))]
    suites: Vec<String>,
    /// Print the suites and exit
    #[arg(long)]
    list: bool,
    /// Fewer sizes and shapes
    #[arg(long)]
    quick: bool,
    /// Write the suite's results file (one suite only)
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Write the suite's table as CSV (one suite only)
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
    /// An overlap suite's method to run (repeatable; all when none is named)
    #[arg(long = "method", value_name = "M")]
    methods: Vec<String>,
    /// The overlap suites' and gemm-llm's shapes instead of their grid (repeatable)
    #[arg(long = "shape", value_name = "MxNxK[,MxNxK…]", value_parser = parse_shape_list)]
    shapes: Vec<Vec<weft_signal_gemm::GemmShape>>,
    /// nccl and collectives: the smallest size (whole bytes, or with K, M or G; alone: that one size), as nccl-tests' -b
    #[arg(short = 'b', long = "minbytes", value_name = "SIZE", value_parser = sweep::parse_size)]
    minbytes: Option<usize>,
    /// nccl and collectives: the largest size (alone: that one size), as nccl-tests' -e
    #[arg(short = 'e', long = "maxbytes", value_name = "SIZE", value_parser = sweep::parse_size)]
    maxbytes: Option<usize>,
    /// nccl and collectives: the factor between sizes (default 2; needs -b and -e), as nccl-tests' -f
    #[arg(short = 'f', long = "stepfactor", value_name = "N")]
    stepfactor: Option<usize>,
    /// nccl and collectives: timed eager calls per size and timing block (1 to 100000; graph replay keeps its own), as nccl-tests' -n
    #[arg(short = 'n', long = "iters", value_name = "N")]
    iters: Option<usize>,
    /// nccl and collectives: untimed calls before each timing block, per size (nccl-tests' -w warms up once)
    #[arg(short = 'w', long = "warmup_iters", value_name = "N")]
    warmup_iters: Option<usize>,
}

fn parse_shape_list(text: &str) -> Result<Vec<weft_signal_gemm::GemmShape>, String> {
    grid::parse_shapes(text).map_err(|e| format!("{e:#}"))
}

/// A clap error's text without its own "error: " (weft's error line adds one).
pub fn clap_error_text(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.trim_end();
    text.strip_prefix("error: ").unwrap_or(text).to_string()
}

/// What `weft bench ARGS` asks for.
#[derive(Debug, PartialEq)]
pub enum BenchCommand {
    Run(BenchOptions),
    /// Text to print and exit successfully (`--help`, `--list`).
    Print(String),
}

/// `args` without the leading `bench`.
pub fn parse(args: &[String]) -> anyhow::Result<BenchCommand> {
    use clap::Parser;
    let a = match BenchArgs::try_parse_from(
        std::iter::once("weft bench").chain(args.iter().map(String::as_str)),
    ) {
        Ok(a) => a,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => {
            return Ok(BenchCommand::Print(e.render().to_string()))
        }
        Err(e) => bail!("{}", clap_error_text(&e)),
    };
    if a.list {
        return Ok(BenchCommand::Print(SUITES.join("\n")));
    }
    let sweep = sweep::Sweep::from_flags(
        a.minbytes,
        a.maxbytes,
        a.stepfactor,
        a.iters,
        a.warmup_iters,
    )
    .map_err(|e| anyhow::anyhow!("weft bench: {e}"))?;
    let mut o = BenchOptions {
        suites: a.suites,
        json: a.json,
        csv: a.csv,
        quick: a.quick,
        methods: a.methods,
        shapes: a.shapes.into_iter().flatten().collect(),
        sweep,
    };
    if o.suites.is_empty() {
        o.suites = SUITES.iter().map(|s| s.to_string()).collect();
    }
    let shaped = [
        "gemm-llm",
        "overlap",
        "overlap-reduce-scatter",
        "overlap-all-gather",
        "overlap-all-to-all",
    ];
    if !o.shapes.is_empty() && !o.suites.iter().all(|s| shaped.contains(&s.as_str())) {
        bail!(
            "weft bench: --shape applies to {} only: name the suite",
            shaped.join(", ")
        );
    }
    if !o.sweep.is_empty()
        && !o
            .suites
            .iter()
            .all(|s| sweep::SIZED_SUITES.contains(&s.as_str()))
    {
        bail!(
            "weft bench: -b/-e/-f/-n/-w apply to {} only: name the suite",
            sweep::SIZED_SUITES.join(", ")
        );
    }
    if (o.json.is_some() || o.csv.is_some()) && o.suites.len() > 1 {
        bail!(
            "weft bench: --json/--csv write one suite's results: name the suite ({})",
            SUITES.join(", ")
        );
    }
    Ok(BenchCommand::Run(o))
}

pub fn run(job: &mut Job, opts: &BenchOptions) -> anyhow::Result<()> {
    let gpu = job
        .gpu()
        .map_err(|why| anyhow::anyhow!("weft bench needs a GPU: {why}"))?;
    let device = crate::info::gpu_info(gpu.ordinal)?.name;
    for suite in &opts.suites {
        crate::watchdog::step(&format!("bench {suite}"));
        let result = match suite.as_str() {
            "nccl" => nccl::run(job, opts.quick, &opts.sweep)?,
            "collectives" => collectives::run(job, opts.quick, &opts.sweep)?,
            "grpcoll" => grpcoll::run(job, opts.quick)?,
            "gemm" => gemm::run(job, opts.quick)?,
            "gemm-llm" => gemm_llm::run(job, opts.quick, &opts.shapes)?,
            "pgl" => pgl::run(job, opts.quick)?,
            "sync" => sync::run(job, opts.quick)?,
            "overlap-order" => overlap_order::run(job, opts.quick)?,
            "overlap" | "overlap-reduce-scatter" | "overlap-all-gather" | "overlap-all-to-all" => {
                let op = match suite.as_str() {
                    "overlap" => OpKind::AllReduce,
                    "overlap-reduce-scatter" => OpKind::ReduceScatter,
                    "overlap-all-gather" => OpKind::AllGather,
                    _ => OpKind::AllToAll,
                };
                let shapes = if opts.shapes.is_empty() {
                    grid::shapes(op, opts.quick)
                } else {
                    opts.shapes.clone()
                };
                overlap::run(
                    job,
                    &overlap::OverlapRun {
                        op,
                        quick: opts.quick,
                        shapes,
                        methods: &opts.methods,
                    },
                )?
            }
            "interference" => interference::run(job, opts.quick)?,
            other => bail!("unknown suite {other}"),
        };
        report(
            job,
            suite,
            &device,
            result,
            opts.json.as_ref(),
            opts.csv.as_ref(),
        )?;
    }
    Ok(())
}

/// Rank 0 prints a suite's table and writes its results file (and CSV) with the run's metadata.
pub fn report(
    job: &Job,
    suite: &str,
    device: &str,
    result: SuiteResult,
    json: Option<&PathBuf>,
    csv: Option<&PathBuf>,
) -> anyhow::Result<()> {
    if job.rank() != 0 {
        return Ok(());
    }
    println!(
        "\n# weft {suite}: {} ranks, {device}\n{}",
        job.world(),
        result.table.render()
    );
    let meta = RunMeta {
        suite: suite.to_string(),
        device: device.to_string(),
        gpus: job.world(),
        driver: crate::nvml::driver_version(),
        commit: env!("WEFT_COMMIT").to_string(),
        date: today(),
        command: format!(
            "{} ({} ranks, launcher {:?})",
            std::env::args().collect::<Vec<_>>().join(" "),
            job.world(),
            job.env.launcher
        ),
    };
    // The CSV first: a run whose rows the schema refuses keeps its table.
    if let Some(path) = csv {
        write_file(path, &result.table.csv()?)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = json {
        // Rows were printed as they were measured; the whole table again for the record.
        let shown = path.display().to_string();
        match meta.results_file(result.rows.clone(), &shown) {
            Ok(file) => {
                write_file(path, &file.render()?)?;
                println!("wrote {}", path.display());
            }
            Err(e) => {
                // Kept beside, for the record, but not under the results file's name.
                let rejected = path.with_extension("rejected.json");
                let raw = serde_json::to_string_pretty(&result.rows)?;
                write_file(&rejected, &raw)?;
                anyhow::bail!("{e} (the rows are in {})", rejected.display());
            }
        }
    }
    Ok(())
}

/// Every rank's `values` (the same count on every rank), indexed by rank: how suites combine
/// their per-rank medians (usually into the slowest rank's).
pub fn gather_f64(job: &mut Job, values: &[f64]) -> anyhow::Result<Vec<Vec<f64>>> {
    let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(job
        .rdzv
        .all_gather(&mine)?
        .iter()
        .map(|b| {
            b.chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
        .collect())
}

pub fn write_file(path: &PathBuf, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A suite's progress: a new step for this rank's watchdog (the bench bound counts per step) and,
/// on rank 0, a line on stderr (`weft bench <suite>: <text>`) as the suite reaches each part.
pub(crate) fn progress(rank: usize, suite: &str, text: &str) {
    crate::watchdog::step(&format!("bench {suite}: {text}"));
    if rank == 0 {
        eprintln!("weft bench {suite}: {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_suites_and_options() {
        let run = |a: &str| match parse(&words(a)).unwrap() {
            BenchCommand::Run(o) => o,
            p => panic!("{a}: {p:?}"),
        };
        let o = run("nccl --quick --json r.json");
        assert_eq!(o.suites, vec!["nccl"]);
        assert!(o.quick);
        assert_eq!(o.json, Some(PathBuf::from("r.json")));
        assert_eq!(
            run("").suites,
            SUITES.iter().map(|s| s.to_string()).collect::<Vec<_>>()
        );
        let o =
            run("overlap --shape 16x8192x4096,128x8192x4096 --shape 4096x8192x1024 --method auto");
        assert_eq!(o.shapes.len(), 3);
        assert_eq!(o.methods, vec!["auto"]);
    }

    #[test]
    fn help_and_list_print() {
        for a in ["--help", "-h", "overlap --help"] {
            match parse(&words(a)).unwrap() {
                BenchCommand::Print(t) => {
                    assert!(
                        t.contains("Usage: weft bench") && t.contains("--shape"),
                        "{a}: {t}"
                    )
                }
                r => panic!("{a}: {r:?}"),
            }
        }
        assert_eq!(
            parse(&words("--list")).unwrap(),
            BenchCommand::Print(SUITES.join("\n"))
        );
    }

    #[test]
    fn rejects_unknown_suites_and_options() {
        let err = |a: &str| parse(&words(a)).unwrap_err().to_string();
        assert!(
            err("gemmm").contains("invalid value 'gemmm'"),
            "{}",
            err("gemmm")
        );
        assert!(err("--fast").contains("unexpected argument '--fast'"));
        assert!(err("nccl --json").contains("a value is required for '--json <PATH>'"));
        assert!(
            err("overlap --shape 12x3").contains("MxNxK")
                || err("overlap --shape 12x3").contains("12x3")
        );
        assert!(err("nccl --shape 16x16x16").contains("--shape applies to"));
        assert!(err("nccl gemm --json r.json").contains("one suite's results"));
    }

    #[test]
    fn takes_nccl_tests_sweep_flags_for_the_sized_suites() {
        let o = match parse(&words("collectives -b 4K -e 1M -f 4 -n 7 -w 0")).unwrap() {
            BenchCommand::Run(o) => o,
            p => panic!("{p:?}"),
        };
        assert_eq!(
            o.sweep.sizes_or(Vec::new()),
            vec![4096, 16384, 65536, 262144, 1 << 20]
        );
        assert_eq!((o.sweep.iters, o.sweep.warmup), (Some(7), Some(0)));
        let o = match parse(&words("nccl --minbytes 8 --maxbytes 64")).unwrap() {
            BenchCommand::Run(o) => o,
            p => panic!("{p:?}"),
        };
        assert_eq!(o.sweep.sizes_or(Vec::new()), vec![8, 16, 32, 64]);
        assert!(
            matches!(parse(&words("nccl")).unwrap(), BenchCommand::Run(o) if o.sweep.is_empty())
        );
        let err = |a: &str| parse(&words(a)).unwrap_err().to_string();
        for (a, says) in [
            ("gemm -b 4K", "apply to nccl, collectives only"),
            ("-n 5", "apply to nccl, collectives only"),
            (
                "nccl collectives pgl -w 1",
                "apply to nccl, collectives only",
            ),
            ("nccl -n 0", "-n/--iters 0"),
            ("nccl -n 100001", "-n/--iters 100001"),
            ("nccl -e 2", "-e/--maxbytes 2"),
            (
                "collectives -b 8K -e 4K",
                "-b/--minbytes 8192 is above -e/--maxbytes 4096",
            ),
            ("collectives -b 4X", "ends in K, M or G"),
            ("collectives -f 4", "needs both"),
            ("collectives -b 4K -f 4", "needs both"),
        ] {
            let e = err(a);
            assert!(e.contains(says), "{a}: {e}");
        }
        match parse(&words("--help")).unwrap() {
            BenchCommand::Print(t) => {
                assert!(t.contains("--minbytes") && t.contains("-w, --warmup_iters"))
            }
            r => panic!("{r:?}"),
        }
    }
}
