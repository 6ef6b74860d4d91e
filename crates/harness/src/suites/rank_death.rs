//! A rank killed (SIGKILL) in the middle of a job, across real processes: this binary starts a
//! whole 2-rank job as a child — under `weft launch` and, where `mpirun` is on the PATH, under
//! Open MPI — whose rank 1 kills itself, and checks that the job ends within 30 s of the kill
//! with the launcher naming rank 1 and the signal. Where rank 1 is when it dies:
//! - between steps (host code, after a rendezvous barrier; rank 0 waits at the next one): a CPU
//!   trial;
//! - inside a weft kernel wait (both ranks spin on a counter nobody raises, bounded far beyond
//!   the 30 s); needs two GPUs;
//! - inside an NCCL all-reduce that rank 0 never joins (rank 0 waits at a rendezvous barrier);
//!   needs two GPUs.
//!
//! The trial runs on rank 0 of the outer job only (one inner job at a time); the inner job's
//! environment is cleared of the outer launcher's variables, so its ranks see only their own.

use super::child::run_command_bounded;
use crate::job::Job;
use crate::trials::{Case, Skip};
use anyhow::{bail, ensure, Context};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weft_kernels::abi::weft_tile_coord;
use weft_pgl::gpu::{self, GpuAvailability};
use weft_pgl::nccl::ReduceOp;
use weft_pgl::Shape;
use weft_sync::{ErrorSlot, WaitBudget};

pub const CHILD_COMMAND: &str = "__rank-death-child";
/// The rank that kills itself.
const VICTIM: usize = 1;
/// How long after the kill the job must have ended.
const END_WITHIN: Duration = Duration::from_secs(30);
/// The whole inner job's bound (start-up, NCCL init, the kill, the end).
const JOB_LIMIT: Duration = Duration::from_secs(120);
/// What the victim prints just before it dies (then the epoch milliseconds).
const KILL_LINE: &str = "weft rank-death: rank 1 kills itself at ";

pub fn cases() -> Vec<Case> {
    vec![
        Case::cpu("rank_death::killed_between_steps", killed_between_steps),
        Case::gpu("rank_death::killed_in_kernel_wait", killed_in_kernel_wait),
        Case::gpu(
            "rank_death::killed_in_nccl_collective",
            killed_in_nccl_collective,
        ),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Between,
    Kernel,
    Nccl,
}

impl Place {
    fn name(self) -> &'static str {
        match self {
            Place::Between => "between",
            Place::Kernel => "kernel",
            Place::Nccl => "nccl",
        }
    }
    fn parse(s: &str) -> anyhow::Result<Self> {
        [Place::Between, Place::Kernel, Place::Nccl]
            .into_iter()
            .find(|p| p.name() == s)
            .with_context(|| {
                format!("{CHILD_COMMAND}: unknown place {s:?} (between, kernel, nccl)")
            })
    }
}

fn killed_between_steps(job: &mut Job) -> anyhow::Result<()> {
    trial(job, Place::Between)
}
fn killed_in_kernel_wait(job: &mut Job) -> anyhow::Result<()> {
    trial(job, Place::Kernel)
}
fn killed_in_nccl_collective(job: &mut Job) -> anyhow::Result<()> {
    trial(job, Place::Nccl)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

/// Kills this process with SIGKILL after `delay`, from a thread (the main thread may be blocked
/// in the driver), saying when first.
fn die_after(delay: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        eprintln!("{KILL_LINE}{}", now_ms());
        // SAFETY: ends this process; nothing is left to clean up by design.
        unsafe { libc::raise(libc::SIGKILL) };
    });
}

/// `weft __rank-death-child PLACE`: one rank of the inner job.
pub fn child(args: &[String]) -> anyhow::Result<()> {
    let [place] = args else {
        bail!("usage: weft {CHILD_COMMAND} between|kernel|nccl");
    };
    let place = Place::parse(place)?;
    let mut job = Job::start()?;
    ensure!(
        job.world() == 2,
        "the rank-death job runs 2 ranks, not {}",
        job.world()
    );
    let victim = job.rank() == VICTIM;
    match place {
        Place::Between => {
            job.rdzv.barrier()?;
            if victim {
                die_after(Duration::ZERO);
                std::thread::sleep(Duration::from_secs(60));
            }
        }
        Place::Kernel => {
            let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
            let (ordinal, ctx) = (gpu.ordinal, gpu.ctx.clone());
            let slot = ErrorSlot::new(&ctx)?;
            let budget = WaitBudget::for_device(&ctx, 4 * JOB_LIMIT)?;
            job.rdzv.barrier()?;
            if victim {
                die_after(Duration::from_secs(2));
            }
            // A counter at 0 awaited at 1 that nobody raises: both ranks spin in the kernel.
            let zero = weft_tile_coord {
                b: 0,
                d: 0,
                r: 0,
                c: 0,
            };
            let (rank, world) = (job.rank(), job.world());
            let out = weft_testkit::timeout::run_missing_signal(
                ordinal,
                rank,
                world,
                &slot,
                Shape::new(1, 1, 1, 1),
                &[0],
                zero,
                1,
                budget,
            )?;
            bail!("the unsignalled wait ended after {:?}", out.wall);
        }
        Place::Nccl => {
            {
                let (comm, gpu) = job.comm_and_gpu()?;
                let stream = gpu.stream.clone();
                let mut buf = stream.alloc_zeros::<f32>(1 << 20)?;
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
                comm.synchronize(&stream, "the first all-reduce")?;
                if victim {
                    // A second all-reduce that rank 0 never joins: the victim dies inside it.
                    die_after(Duration::from_secs(2));
                    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
                    stream.synchronize()?;
                    bail!("an all-reduce with no peer completed");
                }
            }
        }
    }
    // Rank 0: waits here for a rank that is gone, until the launcher stops it.
    job.rdzv.barrier()?;
    bail!(
        "rank {} passed a barrier its dead peer never reached",
        job.rank()
    )
}

/// The launchers the inner job runs under.
#[derive(Clone, Copy, Debug)]
enum Launcher {
    Weft,
    Mpirun,
}

/// An Open MPI `mpirun` on the PATH (the flags and the report matched are Open MPI's).
fn mpirun_available() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("Open MPI")
        })
}

/// Whether `var` is one a launcher sets for its ranks (their rank, job and server), not the
/// user's configuration: Open MPI's and PMIx's MCA parameters stay (a machine may need them,
/// e.g. `OMPI_MCA_plm_rsh_agent` where there is no ssh) except the per-job ones.
fn set_by_a_launcher(var: &str) -> bool {
    const JOB_MCA: [&str; 4] = ["ess", "orte", "pmix", "initial_wdir"];
    const PREFIXES: [&str; 6] = [
        "OMPI_",
        "PMIX_",
        "PMI_",
        "HYDRA_",
        "SLURM_",
        "TORCHELASTIC_",
    ];
    const NAMES: [&str; 14] = [
        "WEFT_MASTER_ADDR",
        "WEFT_MASTER_PORT",
        "WEFT_DEVICE",
        "WEFT_RANK",
        "WEFT_WORLD_SIZE",
        "WEFT_LOCAL_RANK",
        "WEFT_LOCAL_WORLD_SIZE",
        "WEFT_JOB_ID",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];
    if let Some(param) = var.strip_prefix("OMPI_MCA_") {
        return JOB_MCA.iter().any(|p| param.starts_with(p));
    }
    if var.starts_with("PMIX_MCA_") {
        return false;
    }
    PREFIXES.iter().any(|p| var.starts_with(p)) || NAMES.contains(&var)
}

/// The inner job's command: its environment cleared of every launcher's rank variables.
fn inner_job(launcher: Launcher, place: Place) -> anyhow::Result<Command> {
    let exe = std::env::current_exe()?;
    let mut cmd = match launcher {
        Launcher::Weft => {
            let mut c = Command::new(&exe);
            c.args(["launch", "-n", "2", "--"]).arg(&exe);
            c
        }
        Launcher::Mpirun => {
            let mut c = Command::new("mpirun");
            c.args(["--allow-run-as-root", "-np", "2"]);
            for var in ["LD_LIBRARY_PATH", "NCCL_NVLS_ENABLE", gpu::SHARED_GPU_VAR] {
                if std::env::var_os(var).is_some() {
                    c.args(["-x", var]);
                }
            }
            if place == Place::Between {
                c.args(["-x", "CUDA_VISIBLE_DEVICES"]);
            }
            c.arg(&exe);
            c
        }
    };
    cmd.args([CHILD_COMMAND, place.name()]);
    for (key, _) in std::env::vars_os() {
        if set_by_a_launcher(&key.to_string_lossy()) {
            cmd.env_remove(&key);
        }
    }
    if place == Place::Between {
        // Its ranks do no GPU work: no GPUs, so two ranks start on a machine with fewer than two.
        cmd.env("CUDA_VISIBLE_DEVICES", "");
    }
    Ok(cmd)
}

fn trial(job: &mut Job, place: Place) -> anyhow::Result<()> {
    // Every rank probes, so that all of them skip alike (rank 0 alone runs the inner job).
    if place != Place::Between {
        match gpu::probe() {
            GpuAvailability::Present { count } if count >= 2 => {}
            GpuAvailability::Present { count } => {
                return Err(Skip(format!(
                    "the inner job puts its 2 ranks on 2 GPUs; rank 0 sees {count}"
                ))
                .into())
            }
            GpuAvailability::Absent { reason } => return Err(Skip(reason).into()),
        }
    }
    if job.rank() != 0 {
        return Ok(());
    }
    let mut launchers = vec![Launcher::Weft];
    if mpirun_available() {
        launchers.push(Launcher::Mpirun);
    }
    for launcher in launchers {
        let what = format!("a {launcher:?} job whose rank 1 dies {}", place.name());
        let out = run_command_bounded(inner_job(launcher, place)?, &what, JOB_LIMIT)?;
        let ended = now_ms();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(!out.status.success(), "{what}: ended successfully: {text}");
        let killed_at: u128 = text
            .lines()
            .find_map(|l| l.split_once(KILL_LINE).map(|(_, t)| t.trim().parse().ok()))
            .flatten()
            .with_context(|| format!("{what}: rank 1 never reached its kill: {text}"))?;
        let took = Duration::from_millis(ended.saturating_sub(killed_at) as u64);
        ensure!(
            took <= END_WITHIN,
            "{what}: the job ended {took:?} after the kill (bound {END_WITHIN:?}): {text}"
        );
        let named = match launcher {
            Launcher::Weft => text.contains("rank 1 was killed by signal 9 (SIGKILL)"),
            // Open MPI: "process rank 1 with PID … exited on signal 9". (The kill line also
            // says "rank 1", so the launcher's own wording is matched.)
            Launcher::Mpirun => text.contains("process rank 1") && text.contains("signal 9"),
        };
        ensure!(
            named,
            "{what}: the launcher's report does not name rank 1 and SIGKILL: {text}"
        );
        eprintln!("rank_death: {what}: ended {took:?} after the kill, the launcher naming it");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::set_by_a_launcher;

    #[test]
    fn launcher_variables_go_configuration_stays() {
        for v in [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_MCA_ess_base_jobid",
            "WEFT_MASTER_PORT",
            "WEFT_DEVICE",
            "OMPI_MCA_orte_hnp_uri",
            "PMIX_NAMESPACE",
            "PMIX_SERVER_URI41",
            "WEFT_RANK",
            "WEFT_JOB_ID",
            "SLURM_PROCID",
            "MASTER_PORT",
        ] {
            assert!(set_by_a_launcher(v), "{v}");
        }
        for v in [
            "OMPI_MCA_plm_rsh_agent",
            "OMPI_MCA_btl",
            "PMIX_MCA_gds",
            "OPAL_PREFIX",
            "WEFT_JOB_SECRET",
            "LD_LIBRARY_PATH",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert!(!set_by_a_launcher(v), "{v}");
        }
    }
}
