//! `weft`: runs weft's correctness and timing suites on every rank of a job.
//!
//! ```text
//! weft                         info, the correctness suite, then seq-cublas against Auto per overlapped op, on all local GPUs
//! weft info                    GPUs, SMs, memory, peer access, NVLink, driver/CUDA/NCCL versions
//! weft test [FILTER] [FLAGS]   correctness trials (libtest flags: --list, --exact, --ignored, …)
//! weft bench [SUITE] [--quick] [--json PATH] [--csv PATH] [--method M] [-b SIZE -e SIZE -f N -n N -w N]
//! weft tune [--quick] [--out PATH] [--json PATH]   the overlap tuner's profile and its check
//! weft launch -n N -- CMD …    N local ranks (one per GPU), stopped together on any failure
//! weft plot RESULTS.json … [--out PATH.png|.svg]   speedup or bandwidth chart of results files
//! ```
//! Under a launcher (mpirun, srun, torchrun, `weft launch`) every rank runs the same command;
//! rank 0 prints.

mod bench;
mod bound_compare;
mod data;
mod file_store;
mod gemm_data;
mod info;
mod job;
mod json;
mod launch;
mod nvml;
mod plot;
mod reduce_check;
mod results;
mod results_file;
mod suites;
mod timing;
mod trials;
mod watchdog;
mod word_compare;

use crate::launch::LaunchSpec;
use anyhow::Context;
use job::Job;
use std::ffi::OsString;
use std::process::ExitCode;
use weft_pgl::gpu::{self, GpuAvailability};
use weft_pgl::rank_env::{Launcher, RankEnv};

const USAGE: &str = "\
usage:
  weft                          info, correctness suite, then cuBLAS+NCCL against Auto per overlapped op, on all local GPUs
  weft info                     describe the GPUs, links and library versions
  weft test [FILTER] [FLAGS]    correctness trials (libtest flags: --list, --exact, --skip, …)
  weft bench [SUITE] [--quick] [--json PATH] [--csv PATH] [--method M] [--shape MxNxK,…] [-b SIZE -e SIZE -f N -n N -w N]   timing suites (`weft bench --help`, `--list`)
  weft tune [--quick] [--out PATH] [--json PATH]   profile NCCL and the GEMM, write the overlap tuning file, check its predictions
  weft launch -n N -- CMD [ARGS…]   start N local ranks of CMD (with a fresh WEFT_JOB_SECRET unless set)
  weft secret                   print a fresh job secret: export WEFT_JOB_SECRET=$(weft secret) to every rank
  weft plot RESULTS.json… [--out PATH.png|.svg] [--kind speedup|bandwidth]   chart of results files (no GPU)
Under mpirun / srun / torchrun / weft launch every rank runs the same command; rank 0 prints.";

fn main() -> ExitCode {
    // The libraries' warnings (a PGL dropped without free, a teardown that failed) through the
    // log facade, on stderr: RUST_LOG filters them (default: warnings and errors).
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // Words that are not UTF-8 reach `weft launch`'s command as they are (args_os); the other
    // subcommands see them lossily converted (and refuse them as unknown words).
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let result = match args.first().map(String::as_str) {
        None => default_run(true),
        Some("--no-info") if args.len() == 1 => default_run(false),
        Some("info") => flagless::<InfoArgs>("weft info", &args[1..], || {
            info::print().map(|()| ExitCode::SUCCESS)
        }),
        Some("test") => test(&args[1..]),
        Some("bench") => bench_command(&args[1..]),
        Some("tune") => tune_command(&args[1..]),
        Some("plot") => plot_command(&args[1..]),
        Some("secret") => flagless::<SecretArgs>("weft secret", &args[1..], || {
            let s = weft_pgl::job_secret::JobSecret::generate()?;
            println!("{}", s.to_hex());
            Ok(ExitCode::SUCCESS)
        }),
        Some("launch") => {
            let rest: Vec<OsString> = std::env::args_os().skip(2).collect();
            launch::parse_launch_args(&rest).and_then(|command| match command {
                launch::LaunchCommand::Run(spec) => {
                    launch::run_local(&spec).map(|()| ExitCode::SUCCESS)
                }
                launch::LaunchCommand::Print(text) => {
                    print!("{text}");
                    Ok(ExitCode::SUCCESS)
                }
            })
        }
        // Internal: the watchdog trial's child, a step that never ends.
        Some(suites::WATCHDOG_CHILD) => suites::watchdog_child(&args[1..]),
        // Internal: the sync timeout trials run their trapping kernel in this child process.
        Some("__sync-timeout-child") => {
            suites::sync_timeout_child(&args[1..]).map(|()| ExitCode::SUCCESS)
        }
        // Internal: the GEMM row-slots trial runs its trapping kernel in this child process.
        Some(suites::GEMM_ROW_SLOTS_CHILD) => {
            suites::gemm_row_slots_child(&args[1..]).map(|()| ExitCode::SUCCESS)
        }
        // Internal: a rank of the rank-death trials' inner job.
        Some(suites::RANK_DEATH_CHILD) => {
            suites::rank_death_child(&args[1..]).map(|()| ExitCode::SUCCESS)
        }
        // Internal: each overlap-order mode is measured in this child process (fresh context).
        Some(bench::overlap_order::CHILD_COMMAND) => {
            bench::overlap_order::child(&args[1..]).map(|()| ExitCode::SUCCESS)
        }
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n{USAGE}")),
    };
    result.unwrap_or_else(|e| {
        let who = std::env::var("WEFT_RANK")
            .or_else(|_| std::env::var("OMPI_COMM_WORLD_RANK"))
            .map(|r| format!(" (rank {r})"))
            .unwrap_or_default();
        eprintln!("weft{who}: error: {e:#}");
        ExitCode::FAILURE
    })
}

/// `weft info`: no flags (clap gives it `--help` and refuses anything else).
#[derive(clap::Parser)]
#[command(
    name = "weft info",
    about = "Describe the local GPUs, their links and the driver, CUDA and NCCL versions."
)]
struct InfoArgs {}

/// `weft secret`: no flags.
#[derive(clap::Parser)]
#[command(
    name = "weft secret",
    about = "Print a fresh job secret (64 hex digits): export WEFT_JOB_SECRET=$(weft secret) and pass it \
to every rank (mpirun -x WEFT_JOB_SECRET)."
)]
struct SecretArgs {}

/// A subcommand without flags: `--help` printed, any other word refused, else `run`.
fn flagless<P: clap::Parser>(
    name: &str,
    args: &[String],
    run: impl FnOnce() -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    match P::try_parse_from(std::iter::once(name).chain(args.iter().map(String::as_str))) {
        Ok(_) => run(),
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => {
            print!("{}", e.render());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(anyhow::anyhow!("{}", bench::clap_error_text(&e))),
    }
}

/// `weft plot`: no job, no GPU; clap prints `--help` and usage errors itself.
fn plot_command(args: &[String]) -> anyhow::Result<ExitCode> {
    match plot::command(args) {
        Ok(out) => {
            println!("wrote {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => match e.downcast_ref::<clap::Error>() {
            Some(c) => {
                c.print()?;
                Ok(if c.use_stderr() {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                })
            }
            None => Err(e),
        },
    }
}

fn test(args: &[String]) -> anyhow::Result<ExitCode> {
    let job = Job::start()?;
    let flags = libtest_mimic::Arguments::from_iter(
        std::iter::once("weft test".to_string()).chain(args.iter().cloned()),
    );
    let (conclusion, _job) = trials::run(job, suites::all(), flags);
    Ok(conclusion.exit_code())
}

fn bench_command(args: &[String]) -> anyhow::Result<ExitCode> {
    let opts = match bench::parse(args)? {
        bench::BenchCommand::Run(o) => o,
        bench::BenchCommand::Print(text) => {
            println!("{}", text.trim_end());
            return Ok(ExitCode::SUCCESS);
        }
    };
    let mut job = Job::start()?;
    if let Some(why) = job.shared_gpu() {
        anyhow::bail!("weft bench: {why}; run benchmarks with one rank per GPU");
    }
    watchdog::watch_steps(job.rank(), watchdog::timeout(watchdog::BENCH_VAR, 1800));
    if let Err(e) = bench::run(&mut job, &opts) {
        job.rdzv.abort(&format!("{e:#}"));
        return Err(e);
    }
    Ok(ExitCode::SUCCESS)
}

fn tune_command(args: &[String]) -> anyhow::Result<ExitCode> {
    let opts = match bench::tune::parse(args)? {
        Ok(o) => o,
        Err(help) => {
            println!("{}", help.trim_end());
            return Ok(ExitCode::SUCCESS);
        }
    };
    let mut job = Job::start()?;
    if let Some(why) = job.shared_gpu() {
        anyhow::bail!("weft tune: {why}; run it with one rank per GPU");
    }
    watchdog::watch_steps(job.rank(), watchdog::timeout(watchdog::BENCH_VAR, 1800));
    watchdog::step("weft tune");
    let result = bench::tune::run(&mut job, &opts).and_then(|r| {
        let device = crate::info::gpu_info(
            job.gpu()
                .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
                .ordinal,
        )?
        .name;
        bench::report(&job, "tune", &device, r, opts.json.as_ref(), None)
    });
    if let Err(e) = result {
        job.rdzv.abort(&format!("{e:#}"));
        return Err(e);
    }
    Ok(ExitCode::SUCCESS)
}

/// The main job's point: per op, a few shapes of cuBLAS then NCCL against `Auto` (its choice
/// measured at first use, or taken from the choice cache), with the method chosen and the speedup.
fn overlap_tables(job: &mut Job) -> anyhow::Result<()> {
    use weft_signal_gemm::ops::OpKind;
    use weft_signal_gemm::GemmShape as S;
    let methods = vec!["auto".to_string()];
    for (op, shapes) in [
        (
            OpKind::AllReduce,
            vec![S::new(16, 8192, 4096), S::new(8192, 8192, 2048)],
        ),
        (
            OpKind::ReduceScatter,
            vec![S::new(128, 8192, 4096), S::new(8192, 8192, 2048)],
        ),
        (
            OpKind::AllGather,
            vec![S::new(128, 4096, 8192), S::new(8192, 2048, 8192)],
        ),
        (OpKind::AllToAll, vec![S::new(8192, 8192, 2048)]),
    ] {
        bench::overlap::run(
            job,
            &bench::overlap::OverlapRun {
                op,
                quick: true,
                shapes,
                methods: &methods,
            },
        )?;
    }
    Ok(())
}

/// Plain `weft`: the main job on every local GPU. Not under a launcher, it starts one rank per
/// GPU itself (after printing the host description once).
fn default_run(print_info: bool) -> anyhow::Result<ExitCode> {
    let env = RankEnv::from_env().context("reading the launcher's rank variables")?;
    if env.launcher == Launcher::Standalone {
        let count = match gpu::probe() {
            GpuAvailability::Absent { reason } => {
                eprintln!(
                    "weft: no GPU available ({reason}).\nweft's main job runs on NVIDIA GPUs; on this machine `weft test` runs the CPU checks."
                );
                return Ok(ExitCode::from(2));
            }
            GpuAvailability::Present { count } => count,
        };
        info::print()?;
        if count > 1 {
            println!("\nstarting one rank per GPU ({count} ranks)");
            let exe = std::env::current_exe().context("locating the weft executable")?;
            launch::run_local(&LaunchSpec {
                ranks: count,
                program: exe.into(),
                args: vec!["--no-info".into()],
            })?;
            return Ok(ExitCode::SUCCESS);
        }
    } else if print_info && env.rank == 0 {
        info::print()?;
    }
    let job = Job::start()?;
    if let Err(why) = job.gpu() {
        anyhow::bail!("rank {}: no GPU available: {why}", job.rank());
    }
    if job.rank() == 0 {
        println!("\n# correctness ({} ranks)", job.world());
    }
    let flags = libtest_mimic::Arguments::from_iter(["weft"]);
    let (conclusion, mut job) = trials::run(job, suites::all(), flags);
    if conclusion.has_failed() {
        return Ok(conclusion.exit_code());
    }
    if let Some(why) = job.shared_gpu() {
        if job.rank() == 0 {
            println!("\n# benchmark skipped: {why}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Err(e) = overlap_tables(&mut job) {
        job.rdzv.abort(&format!("{e:#}"));
        return Err(e);
    }
    Ok(ExitCode::SUCCESS)
}
