//! The `weft` binary's command line, as a user meets it on a machine with or without GPUs:
//! argument errors of `weft launch`, `weft info` and `weft secret`, a failing rank stopping the
//! job, unknown commands, and the main job's message when there is no GPU.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn weft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(args)
        .env_remove("WEFT_RANK")
        .output()
        .expect("running weft")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn launch_argument_errors_are_named() {
    for (args, expected) in [
        (&["launch"][..], "--nranks <N>"),
        (
            &["launch", "-n"][..],
            "a value is required for '--nranks <N>'",
        ),
        (
            &["launch", "-n", "zero", "--", "true"][..],
            "invalid value 'zero'",
        ),
        (
            &["launch", "-n", "0", "--", "true"][..],
            "at least one rank",
        ),
        (&["launch", "-n", "2"][..], "<CMD>"),
        (
            &["launch", "-n", "2", "-v", "true"][..],
            "unexpected argument '-v'",
        ),
        (&["info", "extra"][..], "unexpected argument 'extra'"),
        (&["secret", "extra"][..], "unexpected argument 'extra'"),
        (
            &["launch", "-n", "2", "--", "/nonexistent/weft-test-program"][..],
            "/nonexistent/weft-test-program",
        ),
    ] {
        let o = weft(args);
        assert!(!o.status.success(), "weft {args:?} succeeded");
        assert!(
            stderr(&o).contains(expected),
            "weft {args:?}: stderr {:?} lacks {expected:?}",
            stderr(&o)
        );
    }
}

#[test]
fn a_failing_rank_stops_the_job_and_is_named() {
    let start = Instant::now();
    let o = weft(&[
        "launch",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$WEFT_RANK\" = 1 ]; then exit 7; fi; sleep 30",
    ]);
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "the job was not stopped promptly"
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("rank 1") && e.contains('7'), "{e}");
}

#[test]
fn ranks_run_the_harness_together() {
    let exe = env!("CARGO_BIN_EXE_weft");
    let o = weft(&["launch", "-n", "3", "--", exe, "test", "rendezvous::"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stdout {out}\nstderr {}", stderr(&o));
    assert!(out.contains("3 passed"), "{out}");
}

#[test]
fn unknown_commands_and_suites_are_rejected() {
    let o = weft(&["frobnicate"]);
    assert!(!o.status.success() && stderr(&o).contains("unknown command \"frobnicate\""));
    let o = weft(&["bench", "nosuch"]);
    assert!(
        !o.status.success() && stderr(&o).contains("invalid value 'nosuch'"),
        "{}",
        stderr(&o)
    );
    let o = weft(&["tune", "--nosuch"]);
    assert!(
        !o.status.success() && stderr(&o).contains("unexpected argument '--nosuch'"),
        "{}",
        stderr(&o)
    );
}

/// Every subcommand's --help prints its usage and succeeds, with no GPU or launcher needed.
#[test]
fn subcommands_print_their_help() {
    for (cmd, usage) in [
        ("bench", "Usage: weft bench"),
        ("tune", "Usage: weft tune"),
        ("info", "Usage: weft info"),
        ("launch", "Usage: weft launch"),
        ("secret", "Usage: weft secret"),
        ("plot", "Usage: weft plot"),
    ] {
        let o = weft(&[cmd, "--help"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains(usage),
            "{cmd}: {out}\n{}",
            stderr(&o)
        );
    }
}

/// `weft plot` without files is a usage error naming what is missing, not a success.
#[test]
fn plot_without_files_is_a_usage_error() {
    let o = weft(&["plot"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("RESULTS.json"), "{}", stderr(&o));
}

/// Without a GPU the main job says so and exits with status 2; with one, this test has nothing
/// to check (the GPU suites cover it).
#[test]
fn main_job_without_gpu_explains_itself() {
    let has_driver = std::path::Path::new("/proc/driver/nvidia").exists();
    if has_driver {
        return;
    }
    let o = weft(&[]);
    assert_eq!(o.status.code(), Some(2), "stderr {}", stderr(&o));
    assert!(stderr(&o).contains("no GPU available"), "{}", stderr(&o));
}
