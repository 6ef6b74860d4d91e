//! The rendezvous across real processes: this test binary re-executes itself as the ranks.
//!
//! Each parent test spawns `current_exe() --exact child_rank` once per rank with the WEFT_*
//! launcher variables and a role in WEFT_RDZV_TEST_ROLE; `child_rank` does nothing without it.
//! A child prints its error to stderr and exits 2; the parent checks exit codes and stderr.

use anyhow::{bail, Result};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;

const ROLE: &str = "WEFT_RDZV_TEST_ROLE";
const CONNECT_SECS: &str = "WEFT_RDZV_TEST_CONNECT_SECS";
/// The rank that exits in the "exit" roles.
const EXIT_RANK: &str = "WEFT_RDZV_TEST_EXIT_RANK";
/// Bound on a whole multi-process case; a hang fails the test instead of stalling the suite.
const CASE_LIMIT: Duration = Duration::from_secs(60);

fn payload(rank: usize, round: usize) -> Vec<u8> {
    let len = (rank * 17 + round * 5) % 40;
    (0..len).map(|i| (rank * 7 + round * 3 + i) as u8).collect()
}

#[test]
fn child_rank() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    if let Err(e) = run_child(&role) {
        eprintln!("CHILD ERROR: {e:#}");
        std::process::exit(2);
    }
}

fn run_child(role: &str) -> Result<()> {
    let env = RankEnv::from_env()?;
    let connect: f64 = std::env::var(CONNECT_SECS)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let mut rdzv = Rendezvous::connect(&env, Duration::from_secs_f64(connect))?;
    match role {
        "collectives" => {
            for round in 0..200 {
                let all = rdzv.all_gather(&payload(env.rank, round))?;
                for (r, got) in all.iter().enumerate() {
                    if *got != payload(r, round) {
                        bail!("all_gather round {round}: wrong bytes from rank {r}");
                    }
                }
                let root = round % env.world;
                if rdzv.broadcast(root, &payload(env.rank, round + 7))? != payload(root, round + 7)
                {
                    bail!("broadcast round {round} from rank {root}: wrong bytes");
                }
            }
            Ok(rdzv.barrier()?)
        }
        "exit" => {
            let exit_rank: usize = std::env::var(EXIT_RANK)?.parse()?;
            rdzv.barrier()?;
            if env.rank == exit_rank {
                std::process::exit(3);
            }
            // Collective #2 finds the rank gone.
            rdzv.all_gather(b"second")?;
            bail!("collective #2 succeeded although rank {exit_rank} exited")
        }
        other => bail!("unknown role {other:?}"),
    }
}

static NEXT_CASE: AtomicUsize = AtomicUsize::new(0);

struct Case {
    dir: PathBuf,
    job_id: String,
    role: &'static str,
    extra_env: Vec<(String, String)>,
}

impl Case {
    fn new(role: &'static str) -> Case {
        let n = NEXT_CASE.fetch_add(1, Ordering::SeqCst);
        let job_id = format!("proc-test-{}-{n}-{role}", std::process::id());
        let dir = std::env::temp_dir().join(format!("weft-{job_id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Case {
            dir,
            job_id,
            role,
            extra_env: Vec::new(),
        }
    }

    fn env(mut self, name: &str, value: impl ToString) -> Case {
        self.extra_env.push((name.to_string(), value.to_string()));
        self
    }

    /// Starts one child per (rank, world size).
    fn spawn(&self, ranks: &[(usize, usize)]) -> Vec<Child> {
        let exe = std::env::current_exe().unwrap();
        ranks
            .iter()
            .map(|&(rank, world)| {
                let mut cmd = Command::new(&exe);
                cmd.args(["--exact", "child_rank", "--nocapture", "--test-threads=1"]);
                for name in [
                    "WEFT_MASTER_ADDR",
                    "WEFT_MASTER_PORT",
                    "MASTER_ADDR",
                    "MASTER_PORT",
                    "WEFT_RDZV_TIMEOUT",
                ] {
                    cmd.env_remove(name);
                }
                cmd.env(ROLE, self.role)
                    .env("WEFT_RANK", rank.to_string())
                    .env("WEFT_WORLD_SIZE", world.to_string())
                    .env("WEFT_LOCAL_RANK", rank.to_string())
                    .env("WEFT_LOCAL_WORLD_SIZE", world.to_string())
                    .env("WEFT_JOB_ID", &self.job_id)
                    .env("WEFT_RDZV_TIMEOUT", "10")
                    .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(
                        std::fs::File::create(self.dir.join(format!("stderr-{rank}-{world}")))
                            .unwrap(),
                    );
                cmd.spawn().unwrap()
            })
            .collect()
    }

    /// Waits for every child (killing all of them past CASE_LIMIT); exit status and stderr each.
    fn wait(
        &self,
        ranks: &[(usize, usize)],
        mut children: Vec<Child>,
    ) -> Vec<(ExitStatus, String)> {
        let start = Instant::now();
        let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
        while statuses.iter().any(Option::is_none) {
            for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
                if status.is_none() {
                    *status = child.try_wait().unwrap();
                }
            }
            if start.elapsed() > CASE_LIMIT {
                for c in children.iter_mut() {
                    let _ = c.kill();
                }
                panic!(
                    "ranks of {} still running after {CASE_LIMIT:?}",
                    self.job_id
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let results = ranks
            .iter()
            .zip(statuses)
            .map(|(&(rank, world), status)| {
                let stderr =
                    std::fs::read_to_string(self.dir.join(format!("stderr-{rank}-{world}")))
                        .unwrap();
                (status.unwrap(), stderr)
            })
            .collect();
        let _ = std::fs::remove_dir_all(&self.dir);
        results
    }

    fn run(&self, ranks: &[(usize, usize)]) -> Vec<(ExitStatus, String)> {
        let children = self.spawn(ranks);
        self.wait(ranks, children)
    }
}

fn all_ranks(world: usize) -> Vec<(usize, usize)> {
    (0..world).map(|r| (r, world)).collect()
}

#[test]
fn four_processes_agree_over_unix_socket() {
    for (rank, (status, stderr)) in Case::new("collectives")
        .run(&all_ranks(4))
        .into_iter()
        .enumerate()
    {
        assert!(status.success(), "rank {rank}: {status}\n{stderr}");
    }
}

#[test]
fn three_processes_agree_over_tcp() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Over TCP the job needs its secret (any 64 hex digits, the same on every rank).
    let case = Case::new("collectives")
        .env("WEFT_MASTER_ADDR", "127.0.0.1")
        .env("WEFT_MASTER_PORT", port)
        .env("WEFT_JOB_SECRET", "5ec7e7".repeat(10) + "0000");
    for (rank, (status, stderr)) in case.run(&all_ranks(3)).into_iter().enumerate() {
        assert!(status.success(), "rank {rank}: {status}\n{stderr}");
    }
}

#[test]
fn missing_rank_fails_everyone_in_bounded_time() {
    let start = Instant::now();
    let results = Case::new("collectives")
        .env(CONNECT_SECS, 2)
        .run(&[(0, 3), (1, 3)]);
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    for (rank, (status, stderr)) in results.into_iter().enumerate() {
        assert_eq!(status.code(), Some(2), "rank {rank}\n{stderr}");
        assert!(
            stderr.contains("rank(s) 2 did not arrive within 2 s (world 3)"),
            "rank {rank}: {stderr}"
        );
    }
}

#[test]
fn wrong_world_size_names_both_sizes() {
    let results = Case::new("collectives")
        .env(CONNECT_SECS, 5)
        .run(&[(0, 2), (1, 3)]);
    for (rank, (status, stderr)) in results.into_iter().enumerate() {
        assert_eq!(status.code(), Some(2), "rank {rank}\n{stderr}");
        assert!(
            stderr.contains("rank 1 was started with world size 3, rank 0 with 2"),
            "rank {rank}: {stderr}"
        );
    }
}

#[test]
fn member_exiting_mid_job_is_named() {
    let start = Instant::now();
    let results = Case::new("exit").env(EXIT_RANK, 2).run(&all_ranks(4));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    for (rank, (status, stderr)) in results.into_iter().enumerate() {
        if rank == 2 {
            assert_eq!(status.code(), Some(3), "{stderr}");
            continue;
        }
        assert_eq!(status.code(), Some(2), "rank {rank}\n{stderr}");
        assert!(
            stderr
                .contains("rank 2 closed its connection (exited or crashed) during collective #2"),
            "rank {rank}: {stderr}"
        );
    }
}

#[test]
fn root_exiting_mid_job_is_named() {
    let start = Instant::now();
    let results = Case::new("exit").env(EXIT_RANK, 0).run(&all_ranks(3));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "took {:?}",
        start.elapsed()
    );
    for (rank, (status, stderr)) in results.into_iter().enumerate().skip(1) {
        assert_eq!(status.code(), Some(2), "rank {rank}\n{stderr}");
        assert!(
            stderr.contains("rank 0 closed its connection"),
            "rank {rank}: {stderr}"
        );
    }
}
