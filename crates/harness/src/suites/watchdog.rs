//! The step watchdog of `weft bench` / `weft tune` (crate::watchdog): a child of this binary
//! starts it with a 1 s bound and begins a step that never ends; it must stop itself within a
//! few seconds with the watchdog's exit status and a message naming the step and the variable.

use super::child::run_bounded;
use crate::job::Job;
use crate::trials::Case;
use crate::watchdog::{self, BENCH_VAR, EXIT_TIMED_OUT};
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub const CHILD_COMMAND: &str = "__watchdog-child";

pub fn cases() -> Vec<Case> {
    vec![Case::cpu(
        "watchdog::a_bench_step_past_its_bound_stops_the_rank",
        step_past_its_bound,
    )]
}

/// The child: `__watchdog-child SECONDS`, a step called "stuck step" that sleeps for a minute.
pub fn child(args: &[String]) -> anyhow::Result<ExitCode> {
    let secs: u64 = args
        .first()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{CHILD_COMMAND} SECONDS"))?;
    watchdog::watch_steps(0, Duration::from_secs(secs));
    watchdog::step("stuck step");
    std::thread::sleep(Duration::from_secs(60));
    Ok(ExitCode::SUCCESS)
}

fn step_past_its_bound(_job: &mut Job) -> anyhow::Result<()> {
    let start = Instant::now();
    let out = run_bounded(
        &[CHILD_COMMAND.to_string(), "1".to_string()],
        Duration::from_secs(20),
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.code() == Some(EXIT_TIMED_OUT),
        "the child ended with {} (expected exit status {EXIT_TIMED_OUT}); stderr: {stderr}",
        out.status
    );
    anyhow::ensure!(
        stderr.contains(&format!("stuck step still running after 1 s ({BENCH_VAR})")),
        "the watchdog's message does not name the step and its bound: {stderr}"
    );
    anyhow::ensure!(
        start.elapsed() < Duration::from_secs(10),
        "the watchdog took {:?} to stop a step bounded by 1 s",
        start.elapsed()
    );
    Ok(())
}
