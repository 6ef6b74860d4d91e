//! Trials whose kernel traps on purpose run it in a child process of this binary: a trap poisons
//! every CUDA context of its process on this driver, and the trial's own context must survive.

use std::time::Duration;

/// Runs `weft ARGS…` as a child with its output piped, bounded by `limit` (killed past it; the
/// pipes are drained on a thread, so a chatty child cannot block on them).
pub fn run_bounded(args: &[String], limit: Duration) -> anyhow::Result<std::process::Output> {
    let exe = std::env::current_exe()?;
    let child = std::process::Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit).or_else(|_| rx.try_recv()) {
        Ok(out) => Ok(out?),
        Err(_) => {
            // SAFETY: signals our own child. It had not been reaped a moment ago (the thread had
            // sent nothing); a reap in between leaves a window of microseconds for its pid to be
            // reused, as with any kill-after-timeout.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            anyhow::bail!(
                "the child process `weft {}` ran past {} s and was killed",
                args.join(" "),
                limit.as_secs()
            )
        }
    }
}
