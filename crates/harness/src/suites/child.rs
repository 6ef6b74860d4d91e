//! Trials whose kernel traps on purpose run it in a child process of this binary: a trap poisons
//! every CUDA context of its process on this driver, and the trial's own context must survive.
//! The rank-death trials run whole jobs (a launcher and its ranks) as children the same way.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `weft ARGS…` as a child with its output piped, bounded by `limit` (killed past it; the
/// pipes are drained on a thread, so a chatty child cannot block on them).
pub fn run_bounded(args: &[String], limit: Duration) -> anyhow::Result<Output> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args);
    run_command_bounded(cmd, &format!("weft {}", args.join(" ")), limit)
}

/// Runs `cmd` (`what` names it in errors) with its output piped, bounded by `limit` as above.
/// The child leads a process group of its own, and past the limit the whole group is killed
/// (a launcher's ranks too, which would otherwise hold the pipes open).
pub fn run_command_bounded(
    mut cmd: Command,
    what: &str,
    limit: Duration,
) -> anyhow::Result<Output> {
    use std::os::unix::process::CommandExt;
    let child = cmd
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit).or_else(|_| rx.try_recv()) {
        Ok(out) => Ok(out?),
        Err(_) => {
            // SAFETY: signals our own child's process group. It had not been reaped a moment ago
            // (the thread had sent nothing); a reap in between leaves a window of microseconds
            // for its pid to be reused, as with any kill-after-timeout.
            unsafe { libc::kill(-(pid as libc::pid_t), libc::SIGKILL) };
            anyhow::bail!(
                "the child process `{what}` ran past {} s and was killed",
                limit.as_secs()
            )
        }
    }
}
