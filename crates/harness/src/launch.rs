//! `weft launch -n N -- CMD…`: starts N local ranks of CMD and stops them together.
//!
//! Each rank gets WEFT_RANK, WEFT_WORLD_SIZE, WEFT_LOCAL_RANK, WEFT_LOCAL_WORLD_SIZE and a
//! WEFT_JOB_ID unique to this launch (which names the rendezvous socket). Each rank runs in its
//! own process group, so that stopping a rank also stops what it started (e.g. `sh -c` children);
//! for the same reason ranks get /dev/null as stdin (a background process group reading the
//! terminal would be stopped).

use anyhow::{anyhow, bail, Result};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weft_pgl::job_secret::{JobSecret, SECRET_VAR};

/// Most ranks one `weft launch` starts.
pub const MAX_LOCAL_RANKS: usize = 1024;
/// Time between SIGTERM and SIGKILL when stopping ranks.
const GRACE: Duration = Duration::from_secs(5);
/// How long to wait for a rank to disappear after SIGKILL (a process stuck in the kernel, e.g. in
/// a GPU driver call, may take a while) before reporting it.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// Longest wait between checks for signals (and for rank exits where pidfds are unavailable).
const POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    pub ranks: usize,
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// weft's subcommands, which as a launched command would name a program of the same name.
const WEFT_SUBCOMMANDS: [&str; 6] = ["test", "bench", "tune", "info", "secret", "launch"];

/// `weft launch`'s flags (clap: `weft launch --help`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "weft launch",
    override_usage = "weft launch -n N [--] CMD [ARGS...]",
    about = "Start N local ranks of CMD (rank r on GPU r), with a fresh WEFT_JOB_SECRET unless one is set; \
when a rank fails, or on Ctrl-C, stop the others and name the rank and how it ended."
)]
struct LaunchArgs {
    /// Local ranks to start (1 to 1024)
    #[arg(short = 'n', long = "nranks", value_name = "N", value_parser = parse_ranks)]
    ranks: usize,
    /// The command and its arguments, the same on every rank (everything after the command's
    /// name is passed on; `--` before a command that starts with `-`)
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true, value_parser = clap::value_parser!(OsString))]
    command: Vec<OsString>,
}

/// What `weft launch ARGS` asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum LaunchCommand {
    Run(LaunchSpec),
    /// Text to print and exit successfully (`--help`).
    Print(String),
}

/// Parses the words after `launch`: `-n N [--] CMD [ARGS…]` (also `-nN`, `-n=N`, `--nranks N`,
/// `--nranks=N`; `-h` / `--help` before the command prints the usage). The first word that is not
/// an option (or the word after `--`) is the command; every word after it is the command's.
pub fn parse_launch_args(args: &[OsString]) -> Result<LaunchCommand> {
    use clap::Parser;
    let words = std::iter::once(OsString::from("weft launch")).chain(args.iter().cloned());
    let a = match LaunchArgs::try_parse_from(words) {
        Ok(a) => a,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => {
            return Ok(LaunchCommand::Print(e.render().to_string()))
        }
        Err(e) => bail!("{}", crate::bench::clap_error_text(&e)),
    };
    let (program, args) = a
        .command
        .split_first()
        .map(|(p, rest)| (p.clone(), rest.to_vec()))
        .ok_or_else(|| anyhow!("no command given after the options"))?;
    // `weft launch -n 4 test` would run the shell's `test` on every rank (which exits 1 and
    // prints nothing): a bare weft subcommand name is refused, naming the command meant.
    if let Some(sub) = program.to_str().filter(|p| WEFT_SUBCOMMANDS.contains(p)) {
        let weft = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "weft".into());
        bail!(
            "the command {sub:?} is a weft subcommand, not a program: to run it on every rank, \
             weft launch -n {} -- {weft} {sub} …",
            a.ranks
        );
    }
    Ok(LaunchCommand::Run(LaunchSpec {
        ranks: a.ranks,
        program,
        args,
    }))
}

fn parse_ranks(text: &str) -> Result<usize> {
    let n: usize = text
        .parse()
        .map_err(|_| anyhow!("the number of ranks must be a positive integer"))?;
    if n == 0 {
        bail!("at least one rank is needed");
    }
    if n > MAX_LOCAL_RANKS {
        bail!("at most {MAX_LOCAL_RANKS} local ranks can be launched");
    }
    Ok(n)
}

/// Signals received by this process while handlers are installed, and the last one's number.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only lock-free atomics here: async-signal-safe.
    LAST_SIGNAL.store(sig, Ordering::Relaxed);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// SIGINT/SIGTERM handlers that count signals; the previous handlers come back on drop.
struct SignalHandlers {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalHandlers {
    fn install() -> Result<SignalHandlers> {
        let mut handlers = SignalHandlers {
            previous: Vec::new(),
        };
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: sigaction is plain data; zeroed is a valid starting value. The handler only
            // touches atomics.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &action, &mut old) != 0 {
                    bail!(
                        "could not install a handler for {}: {}",
                        signal_name(sig),
                        io::Error::last_os_error()
                    );
                }
                handlers.previous.push((sig, old));
            }
        }
        Ok(handlers)
    }
}

impl Drop for SignalHandlers {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores the action saved by install.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
    }
}

fn signal_name(sig: libc::c_int) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    format!("signal {sig} ({name})")
}

fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by {}", signal_name(sig)),
        (None, None) => format!("ended with {status}"),
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

struct RankProcess {
    rank: usize,
    child: Child,
    /// Readable once the process exits (Linux 5.3+): the launcher wakes at the first exit, so
    /// the rank reported first is the one that failed first, not a rank that failed because of it.
    pidfd: Option<OwnedFd>,
    status: Option<ExitStatus>,
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a non-negative result is a fresh fd that nothing else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Sleeps until a running rank with a pidfd exits, a signal interrupts, or POLL_INTERVAL passes.
fn wait_for_exit(ranks: &[RankProcess]) {
    let mut fds: Vec<libc::pollfd> = ranks
        .iter()
        .filter(|p| p.status.is_none())
        .filter_map(|p| p.pidfd.as_ref())
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = POLL_INTERVAL.as_millis() as libc::c_int;
    // SAFETY: fds is a valid array of fds.len() pollfds; with none, poll just sleeps. Errors
    // (EINTR on a signal) only end the wait early.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

impl RankProcess {
    /// Reaps the process if it has exited; an error from waitpid counts as the rank's failure.
    fn poll(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Signals the rank's process group (its pid: it called setpgid(0, 0)) while it is unreaped.
    fn signal(&mut self, sig: libc::c_int) {
        if self.status.is_none() {
            // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
            unsafe { libc::kill(-(self.child.id() as libc::pid_t), sig) };
        }
    }
}

fn spawn_rank(
    spec: &LaunchSpec,
    rank: usize,
    job_id: &str,
    secret: &JobSecret,
) -> io::Result<Child> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env("WEFT_RANK", rank.to_string())
        .env("WEFT_WORLD_SIZE", spec.ranks.to_string())
        .env("WEFT_LOCAL_RANK", rank.to_string())
        .env("WEFT_LOCAL_WORLD_SIZE", spec.ranks.to_string())
        .env("WEFT_JOB_ID", job_id)
        .env(SECRET_VAR, secret.to_hex())
        .stdin(Stdio::null());
    // SAFETY: getpid has no preconditions.
    let launcher = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe calls
    // (setpgid, prctl, getppid) and builds io::Errors without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Assumes the launcher's waiting thread lives as long as the ranks (PDEATHSIG fires
            // when the forking thread exits): run_local spawns and waits on the calling thread.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGTERM as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The launcher died before prctl took effect: do not start an orphan rank.
            if libc::getppid() != launcher {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// SIGTERM to every running rank, SIGKILL after GRACE (at once if another signal arrives), then
/// waits a bounded time. Returns the ranks that are still there.
fn stop(ranks: &mut [RankProcess]) -> Vec<usize> {
    let signals_before = SIGNALS.load(Ordering::SeqCst);
    for p in ranks.iter_mut() {
        p.signal(libc::SIGTERM);
    }
    let running = |ranks: &mut [RankProcess]| -> Vec<usize> {
        // A waitpid error means the rank cannot be waited for: treat it as gone.
        ranks
            .iter_mut()
            .filter_map(|p| matches!(p.poll(), Ok(None)).then_some(p.rank))
            .collect()
    };
    let grace_end = Instant::now() + GRACE;
    while !running(ranks).is_empty()
        && Instant::now() < grace_end
        && SIGNALS.load(Ordering::SeqCst) == signals_before
    {
        wait_for_exit(ranks);
    }
    for p in ranks.iter_mut() {
        p.signal(libc::SIGKILL);
    }
    let kill_end = Instant::now() + KILL_WAIT;
    loop {
        let left = running(ranks);
        if left.is_empty() || Instant::now() >= kill_end {
            return left;
        }
        wait_for_exit(ranks);
    }
}

/// Starts `ranks` local processes with WEFT_RANK, WEFT_WORLD_SIZE, WEFT_LOCAL_RANK,
/// WEFT_LOCAL_WORLD_SIZE and WEFT_JOB_ID set, and waits for all of them.
///
/// Ok only if every rank exits 0. When a rank fails (non-zero exit or signal), or the launcher
/// gets SIGINT/SIGTERM, the other ranks get SIGTERM, then SIGKILL after 5 s, and the error names
/// the first failing rank (or the signal): "rank 1 exited with status 3; stopped the other 2
/// ranks". Ranks seen failing in the same wake-up are all listed, since their order is unknown.
pub fn run_local(spec: &LaunchSpec) -> Result<()> {
    if spec.ranks == 0 || spec.ranks > MAX_LOCAL_RANKS {
        bail!(
            "cannot launch {} ranks: the number must be in 1..={MAX_LOCAL_RANKS}",
            spec.ranks
        );
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let job_id = format!("weft-{}-{nanos}", std::process::id());
    // The caller's secret when it set one (a job spanning several launchers), else a fresh one.
    let secret = match std::env::var_os(SECRET_VAR) {
        // Non-UTF-8 is kept (lossily) so that it is refused, not taken as unset.
        Some(v) => JobSecret::parse(&v.to_string_lossy())?,
        None => JobSecret::generate()?,
    };
    let _handlers = SignalHandlers::install()?;
    let signals_at_start = SIGNALS.load(Ordering::SeqCst);
    let program = spec.program.to_string_lossy().into_owned();

    let mut ranks: Vec<RankProcess> = Vec::with_capacity(spec.ranks);
    for rank in 0..spec.ranks {
        match spawn_rank(spec, rank, &job_id, &secret) {
            Ok(child) => ranks.push(RankProcess {
                rank,
                pidfd: pidfd_open(child.id()),
                child,
                status: None,
            }),
            Err(e) => {
                let stuck = stop(&mut ranks);
                bail!(
                    "could not start {program:?} for rank {rank}: {e}{}",
                    stuck_note(&stuck)
                );
            }
        }
    }

    // Why the job ends early: a failing rank or a signal to the launcher.
    let failure = loop {
        // Failures seen in one scan happened between two wake-ups: their order is unknown.
        let mut failures = Vec::new();
        let mut all_done = true;
        for p in ranks.iter_mut() {
            match p.poll() {
                Ok(None) => all_done = false,
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => {
                    failures.push(format!("rank {} {}", p.rank, describe_status(status)))
                }
                Err(e) => failures.push(format!("could not wait for rank {}: {e}", p.rank)),
            }
        }
        if SIGNALS.load(Ordering::SeqCst) != signals_at_start {
            let sig = LAST_SIGNAL.load(Ordering::Relaxed);
            break format!("interrupted by {}", signal_name(sig));
        }
        match failures.len() {
            0 => {}
            1 => break failures.remove(0),
            _ => {
                break format!(
                    "ranks failed at about the same time: {}",
                    failures.join(", ")
                )
            }
        }
        if all_done {
            return Ok(());
        }
        wait_for_exit(&ranks);
    };
    let running = ranks
        .iter_mut()
        .filter_map(|p| matches!(p.poll(), Ok(None)).then_some(()))
        .count();
    let stuck = stop(&mut ranks);
    let stopped = match (running, failure.starts_with("interrupted")) {
        (0, _) => String::new(),
        (n, true) => format!("; stopped {} still running", plural(n, "rank")),
        (1, false) => "; stopped the other rank".to_string(),
        (n, false) => format!("; stopped the other {n} ranks"),
    };
    bail!("{failure}{stopped}{}", stuck_note(&stuck))
}

fn stuck_note(stuck: &[usize]) -> String {
    if stuck.is_empty() {
        return String::new();
    }
    let list: Vec<String> = stuck.iter().map(|r| r.to_string()).collect();
    format!(
        "; rank(s) {} had not exited {} s after SIGKILL",
        list.join(", "),
        KILL_WAIT.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn words(s: &[&str]) -> Vec<OsString> {
        s.iter().map(OsString::from).collect()
    }

    fn parse_err(s: &[&str]) -> String {
        match parse_launch_args(&words(s)) {
            Ok(c) => panic!("expected an error for {s:?}, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn parsed(s: &[&str]) -> LaunchSpec {
        match parse_launch_args(&words(s)) {
            Ok(LaunchCommand::Run(spec)) => spec,
            other => panic!("expected a launch for {s:?}, got {other:?}"),
        }
    }

    fn spec(ranks: usize, program: &str, args: &[&str]) -> LaunchSpec {
        LaunchSpec {
            ranks,
            program: program.into(),
            args: words(args),
        }
    }

    /// A fresh empty directory under the system temp dir.
    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("weft-launch-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn parses_valid_forms() {
        assert_eq!(
            parsed(&["-n", "4", "--", "prog", "-x", "y"]),
            spec(4, "prog", &["-x", "y"])
        );
        assert_eq!(
            parsed(&["-n", "2", "prog", "--", "a"]),
            spec(2, "prog", &["--", "a"])
        );
        assert_eq!(parsed(&["-n", "2", "ls", "-la"]), spec(2, "ls", &["-la"]));
        assert_eq!(parsed(&["--nranks", "8", "prog"]), spec(8, "prog", &[]));
        assert_eq!(parsed(&["-n2", "prog"]), spec(2, "prog", &[]));
        assert_eq!(
            parsed(&["-n=2", "prog", "-n", "3"]),
            spec(2, "prog", &["-n", "3"])
        );
        assert_eq!(parsed(&["-n", "2", "--", "--", "x"]), spec(2, "--", &["x"]));
        assert_eq!(parsed(&["-n", "2", "-"]), spec(2, "-", &[]));
        assert_eq!(parsed(&["--nranks=3", "--", "prog"]), spec(3, "prog", &[]));
        assert_eq!(
            parsed(&["-n", "1024", "--", "-prog"]),
            spec(1024, "-prog", &[])
        );
        // Words that are not UTF-8 pass through to the command.
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![b'a', 0xff]);
        let mut w = words(&["-n", "2", "prog"]);
        w.push(odd.clone());
        match parse_launch_args(&w).unwrap() {
            LaunchCommand::Run(s) => assert_eq!(s.args, vec![odd]),
            other => panic!("{other:?}"),
        }
        match parse_launch_args(&words(&["-n", "2", "-h"])).unwrap() {
            LaunchCommand::Print(text) => assert!(
                text.contains("Usage: weft launch -n N [--] CMD [ARGS...]")
                    && text.contains("--nranks <N>"),
                "{text}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn argument_errors() {
        for (args, part) in [
            (&["--", "prog"][..], "--nranks <N>"),
            (&["prog", "-n", "2"], "--nranks <N>"),
            (&["-n"], "a value is required for '--nranks <N>'"),
            (&["-n", "--", "prog"], "a value is required for '--nranks <N>'"),
            (&["--nranks"], "a value is required for '--nranks <N>'"),
            (&["-n", "four", "prog"], "invalid value 'four' for '--nranks <N>': the number of ranks must be a positive integer"),
            (&["-n", "-2", "prog"], "unexpected argument '-2'"),
            (&["-n", "0", "prog"], "at least one rank is needed"),
            (&["-n", "1025", "prog"], "at most 1024 local ranks"),
            (&["-n", "2"], "<CMD>"),
            (&["-n", "2", "--"], "<CMD>"),
            (&["-n", "2", "-v", "prog"], "unexpected argument '-v'"),
            (&["-n", "2", "-n", "3", "prog"], "cannot be used multiple times"),
        ] {
            let e = parse_err(args);
            assert!(e.contains(part), "{args:?}: {part:?} missing from {e:?}");
        }
        // A weft subcommand as the command (the shell's `test` would run): refused, naming the
        // command meant; with a path it is a program.
        let e = parse_err(&["-n", "4", "test"]);
        assert!(
            e.contains("\"test\" is a weft subcommand")
                && e.contains("-n 4 -- ")
                && e.ends_with("test …"),
            "{e}"
        );
        assert!(parse_err(&["-n", "2", "--", "bench", "nccl"])
            .contains("\"bench\" is a weft subcommand"));
        assert!(parse_launch_args(&words(&["-n", "2", "--", "/usr/bin/test", "-e", "/"])).is_ok());
    }

    #[test]
    fn all_ranks_succeed_with_distinct_variables() {
        let dir = temp_dir("ok");
        let script = format!(
            "echo \"$WEFT_RANK $WEFT_WORLD_SIZE $WEFT_LOCAL_RANK $WEFT_LOCAL_WORLD_SIZE $WEFT_JOB_ID\" > {}/rank-$WEFT_RANK",
            dir.display()
        );
        run_local(&spec(4, "sh", &["-c", &script])).unwrap();
        let mut job_ids = Vec::new();
        for rank in 0..4 {
            let line = std::fs::read_to_string(dir.join(format!("rank-{rank}"))).unwrap();
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(
                fields[..4],
                [rank.to_string(), "4".into(), rank.to_string(), "4".into()],
                "{line}"
            );
            assert!(fields[4].starts_with("weft-"), "{line}");
            job_ids.push(fields[4].to_string());
        }
        assert!(job_ids.iter().all(|j| *j == job_ids[0]), "{job_ids:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn failing_rank_stops_the_others() {
        let start = Instant::now();
        // Without exec, sh forks sleep: stopping the process group must stop it too.
        let script = "if [ \"$WEFT_RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep 30; true";
        let e = run_local(&spec(3, "sh", &["-c", script]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 1 exited with status 3; stopped the other 2 ranks"),
            "{e}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "took {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn rank_killed_by_a_signal() {
        let e = run_local(&spec(
            2,
            "sh",
            &[
                "-c",
                "if [ \"$WEFT_RANK\" = 0 ]; then kill -9 $$; fi; sleep 30",
            ],
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 0 was killed by signal 9 (SIGKILL); stopped the other rank"),
            "{e}"
        );
    }

    #[test]
    fn missing_program() {
        let e = run_local(&spec(2, "/nonexistent/weft-no-such-program", &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("could not start \"/nonexistent/weft-no-such-program\" for rank 0"),
            "{e}"
        );
    }

    const CHILD_ROLE: &str = "WEFT_LAUNCH_TEST_ROLE";

    /// Runs only when re-executed by `interrupt_stops_all_ranks`: a launcher whose ranks record
    /// their pids and sleep.
    #[test]
    fn interrupted_launcher_child() {
        let Some(dir) = std::env::var_os(CHILD_ROLE) else {
            return;
        };
        let script = format!(
            "echo $$ > {}/pid-$WEFT_RANK; exec sleep 30",
            PathBuf::from(dir).display()
        );
        match run_local(&spec(3, "sh", &["-c", &script])) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("launcher error: {e}");
                std::process::exit(7);
            }
        }
    }

    #[test]
    fn interrupt_stops_all_ranks() {
        let dir = temp_dir("interrupt");
        let mut launcher = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "launch::tests::interrupted_launcher_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ROLE, &dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .spawn()
            .unwrap();
        let pid_file = |r: usize| dir.join(format!("pid-{r}"));
        let start = Instant::now();
        // `echo > file` creates the file before writing: wait until each holds a pid.
        let read_pid = |r: usize| {
            std::fs::read_to_string(pid_file(r))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
        };
        while (0..3).any(|r| read_pid(r).is_none()) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "ranks did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let pids: Vec<i32> = (0..3).filter_map(read_pid).collect();
        // SAFETY: signals our own child.
        unsafe { libc::kill(launcher.id() as i32, libc::SIGINT) };
        let status = loop {
            if let Some(status) = launcher.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > Duration::from_secs(30) {
                launcher.kill().unwrap();
                panic!("the launcher did not stop after SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
        assert_eq!(status.code(), Some(7), "{stderr}");
        assert!(
            stderr.contains("interrupted by signal 2 (SIGINT); stopped 3 ranks still running"),
            "{stderr}"
        );
        for pid in pids {
            // SAFETY: signal 0 only checks for existence.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            assert!(!alive, "rank process {pid} outlived the launcher");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
