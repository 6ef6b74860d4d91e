//! Rank, world size, local rank and a job id, read from the variables the launcher sets.
//!
//! Supported launchers, first match wins: `weft launch` (WEFT_RANK), Open MPI
//! (OMPI_COMM_WORLD_RANK), MPICH/Hydra (PMI_RANK), Slurm `srun` (SLURM_PROCID with
//! SLURM_STEP_NUM_TASKS), torchrun (RANK with WORLD_SIZE). With none of them the process is a
//! standalone rank 0 of 1.

use crate::error::PglError;
use crate::job_secret::{JobSecret, INSECURE_VAR, SECRET_VAR};
use anyhow::{anyhow, bail, Context, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Weft,
    OpenMpi,
    Hydra,
    Slurm,
    Torchrun,
    Standalone,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub local_world: usize,
    pub launcher: Launcher,
    /// Shared by every rank of one job; None when the launcher's variables give none.
    pub job_id: Option<String>,
    /// TCP rendezvous address (host, port) when one is configured: WEFT_MASTER_ADDR/PORT, else
    /// MASTER_ADDR/PORT (under torchrun: None on one host, MASTER_PORT + 1 across hosts, because
    /// torchrun's own store already listens on MASTER_PORT).
    pub master: Option<(String, u16)>,
    /// The job secret (`WEFT_JOB_SECRET`, see [`crate::job_secret`]), if set.
    pub secret: Option<JobSecret>,
    /// `WEFT_RDZV_INSECURE=1`: a TCP rendezvous without a secret is allowed.
    pub insecure_tcp: bool,
}

impl RankEnv {
    /// Reads the process environment. When the launcher gives no job id, falls back to
    /// `ppid-<parent pid>`: ranks started by one launcher process on one host share a parent.
    /// Errors: `PglError::Launcher`, naming the variable.
    pub fn from_env() -> Result<Self, PglError> {
        // Non-UTF-8 values are kept (lossily) so that they are reported as invalid, not as unset.
        let mut env = Self::from_vars(|name| {
            std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
        })?;
        if env.job_id.is_none() && env.launcher != Launcher::Standalone {
            // SAFETY: getppid has no preconditions and cannot fail.
            let ppid = unsafe { libc::getppid() };
            env.job_id = Some(format!("ppid-{ppid}"));
        }
        Ok(env)
    }

    /// Detects the launcher from `var` (a variable lookup) and validates what it gives.
    /// Errors: `PglError::Launcher`, naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, PglError> {
        Self::parse_vars(&var).map_err(|e| PglError::Launcher(format!("{e:#}")))
    }

    fn parse_vars(var: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let has = |name: &str| var(name).is_some();
        // (launcher, rank, world size, local rank, local world size); the first also triggers.
        // Slurm has no local world size variable: it comes from SLURM_STEP_TASKS_PER_NODE.
        let (launcher, [rank_var, world_var, local_rank_var], local_world_var) = if has("WEFT_RANK")
        {
            (
                Launcher::Weft,
                ["WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK"],
                Some("WEFT_LOCAL_WORLD_SIZE"),
            )
        } else if has("OMPI_COMM_WORLD_RANK") {
            (
                Launcher::OpenMpi,
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                ],
                Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
            )
        } else if has("PMI_RANK") {
            (
                Launcher::Hydra,
                ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"],
                Some("MPI_LOCALNRANKS"),
            )
        } else if has("SLURM_PROCID") && has("SLURM_STEP_NUM_TASKS") {
            // SLURM_PROCID alone is also set inside an sbatch script, which is a single process.
            (
                Launcher::Slurm,
                ["SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"],
                None,
            )
        } else if has("RANK") && has("WORLD_SIZE") {
            (
                Launcher::Torchrun,
                ["RANK", "WORLD_SIZE", "LOCAL_RANK"],
                Some("LOCAL_WORLD_SIZE"),
            )
        } else {
            // MASTER_* alone do not make a job: a single process needs no rendezvous.
            return Ok(Self::standalone());
        };

        let number = |name: &str| required_number(var, name, rank_var);
        let rank = number(rank_var)?;
        let world = number(world_var)?;
        let local_rank = number(local_rank_var)?;
        let local_world = match local_world_var {
            Some(name) => number(name)?,
            None => {
                let node = number("SLURM_NODEID")?;
                let per_node = var("SLURM_STEP_TASKS_PER_NODE").ok_or_else(|| {
                    anyhow!("SLURM_STEP_TASKS_PER_NODE is not set but {rank_var} is")
                })?;
                slurm_tasks_on_node(&per_node, node).context("reading SLURM_STEP_TASKS_PER_NODE")?
            }
        };

        validate(launcher, rank, world, local_rank, local_world)?;
        let job_id = job_id(launcher, var);
        let master = master(launcher, var, world == local_world)?;
        let secret = crate::job_secret::from_var(var(SECRET_VAR))?;
        let insecure_tcp = var(INSECURE_VAR).is_some_and(|v| v.trim() == "1");
        Ok(RankEnv {
            rank,
            world,
            local_rank,
            local_world,
            launcher,
            job_id,
            master,
            secret,
            insecure_tcp,
        })
    }

    /// Rank 0 of 1 on one host, no job id, no rendezvous address.
    pub fn standalone() -> Self {
        RankEnv {
            rank: 0,
            world: 1,
            local_rank: 0,
            local_world: 1,
            launcher: Launcher::Standalone,
            job_id: None,
            master: None,
            secret: None,
            insecure_tcp: false,
        }
    }

    /// True when every rank runs on this host.
    pub fn is_single_host(&self) -> bool {
        self.world == self.local_world
    }
}

/// A variable the detected launcher must set, as a non-negative integer.
fn required_number(
    var: &dyn Fn(&str) -> Option<String>,
    name: &str,
    trigger: &str,
) -> Result<usize> {
    let value = var(name).ok_or_else(|| anyhow!("{name} is not set but {trigger} is"))?;
    value
        .trim()
        .parse::<usize>()
        .map_err(|_| anyhow!("{name}={value:?} is not a non-negative integer"))
}

fn validate(
    launcher: Launcher,
    rank: usize,
    world: usize,
    local_rank: usize,
    local_world: usize,
) -> Result<()> {
    let problem = if world == 0 {
        Some(format!("world size {world} must be at least 1"))
    } else if rank >= world {
        Some(format!("rank {rank} is not below world size {world}"))
    } else if local_world == 0 {
        Some(format!("local world size {local_world} must be at least 1"))
    } else if local_rank >= local_world {
        Some(format!(
            "local rank {local_rank} is not below local world size {local_world}"
        ))
    } else if local_world > world {
        Some(format!(
            "local world size {local_world} exceeds world size {world}"
        ))
    } else {
        None
    };
    match problem {
        Some(p) => bail!("invalid rank variables from {launcher:?}: {p}"),
        None => Ok(()),
    }
}

fn job_id(launcher: Launcher, var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let nonempty = |name: &str| var(name).filter(|v| !v.is_empty());
    match launcher {
        Launcher::Weft => nonempty("WEFT_JOB_ID"),
        Launcher::OpenMpi => nonempty("PMIX_NAMESPACE")
            .or_else(|| nonempty("OMPI_MCA_ess_base_jobid").map(|j| format!("ompi-{j}"))),
        Launcher::Hydra => {
            nonempty("PMI_KVSNAME").or_else(|| nonempty("PMI_PORT").map(|p| format!("pmi-{p}")))
        }
        Launcher::Slurm => nonempty("SLURM_JOB_ID").map(|job| match nonempty("SLURM_STEP_ID") {
            Some(step) => format!("slurm-{job}.{step}"),
            None => format!("slurm-{job}"),
        }),
        Launcher::Torchrun => {
            // The run id defaults to "none"; MASTER_PORT tells apart two torchruns on one host.
            let parts: Vec<String> = ["TORCHELASTIC_RUN_ID", "MASTER_PORT"]
                .iter()
                .filter_map(|n| nonempty(n))
                .collect();
            (!parts.is_empty()).then(|| format!("torchrun-{}", parts.join("-")))
        }
        Launcher::Standalone => None,
    }
}

/// Reads an (address, port) pair: both set, neither set, or an error naming the missing one.
fn address_pair(
    var: &dyn Fn(&str) -> Option<String>,
    addr: &str,
    port: &str,
) -> Result<Option<(String, u16)>> {
    match (var(addr), var(port)) {
        (None, None) => Ok(None),
        (Some(_), None) => bail!("{addr} is set but {port} is not"),
        (None, Some(_)) => bail!("{port} is set but {addr} is not"),
        (Some(a), Some(p)) => {
            let n = p
                .trim()
                .parse::<u16>()
                .map_err(|_| anyhow!("{port}={p:?} is not a port number (0-65535)"))?;
            if a.is_empty() {
                bail!("{addr} is set but empty");
            }
            Ok(Some((a, n)))
        }
    }
}

fn master(
    launcher: Launcher,
    var: &dyn Fn(&str) -> Option<String>,
    single_host: bool,
) -> Result<Option<(String, u16)>> {
    if let Some(explicit) = address_pair(var, "WEFT_MASTER_ADDR", "WEFT_MASTER_PORT")? {
        return Ok(Some(explicit));
    }
    let Some((addr, port)) = address_pair(var, "MASTER_ADDR", "MASTER_PORT")? else {
        return Ok(None);
    };
    if launcher != Launcher::Torchrun {
        return Ok(Some((addr, port)));
    }
    // torchrun's TCPStore listens on MASTER_PORT: one host uses a Unix socket, several the next port.
    if single_host {
        return Ok(None);
    }
    let next = port.checked_add(1).ok_or_else(|| {
        anyhow!("MASTER_PORT={port} leaves no port for weft's rendezvous (it uses MASTER_PORT + 1 under torchrun)")
    })?;
    Ok(Some((addr, next)))
}

/// Task count on node `node` (0-based) from Slurm's compressed per-node list, e.g. "4(x2),3"
/// means nodes 0 and 1 run 4 tasks and node 2 runs 3.
pub(crate) fn slurm_tasks_on_node(spec: &str, node: usize) -> Result<usize> {
    let groups = parse_slurm_tasks_per_node(spec)?;
    let mut first = 0usize;
    for (count, repeat) in &groups {
        if node < first.saturating_add(*repeat) {
            return Ok(*count);
        }
        first = first.saturating_add(*repeat);
    }
    bail!("node {node} is beyond the {first} node(s) listed in {spec:?}")
}

/// Parses "count" or "count(xrepeat)" entries separated by commas into (count, repeat) pairs.
pub(crate) fn parse_slurm_tasks_per_node(spec: &str) -> Result<Vec<(usize, usize)>> {
    let malformed =
        || anyhow!("malformed Slurm tasks-per-node list {spec:?} (expected e.g. \"4(x2),3\")");
    let mut groups = Vec::new();
    for entry in spec.trim().split(',') {
        let entry = entry.trim();
        let (count, repeat) = match entry.split_once('(') {
            None => (entry, "1"),
            Some((count, rest)) => {
                let repeat = rest
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(malformed)?;
                (count, repeat)
            }
        };
        let count: usize = count.parse().map_err(|_| malformed())?;
        let repeat: usize = repeat.parse().map_err(|_| malformed())?;
        if repeat == 0 {
            return Err(malformed());
        }
        groups.push((count, repeat));
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<RankEnv, PglError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RankEnv::from_vars(|name| map.get(name).cloned())
    }

    /// The error's text; every refusal of the launcher's variables is `PglError::Launcher`.
    fn err_of(pairs: &[(&str, &str)]) -> String {
        match env_of(pairs) {
            Ok(env) => panic!("expected an error, got {env:?}"),
            Err(PglError::Launcher(text)) => text,
            Err(other) => panic!("expected PglError::Launcher, got {other:?}"),
        }
    }

    const WEFT: &[(&str, &str)] = &[
        ("WEFT_RANK", "2"),
        ("WEFT_WORLD_SIZE", "4"),
        ("WEFT_LOCAL_RANK", "2"),
        ("WEFT_LOCAL_WORLD_SIZE", "4"),
        ("WEFT_JOB_ID", "weft-123-456"),
    ];
    const OMPI: &[(&str, &str)] = &[
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ("PMIX_NAMESPACE", "prterun-host-99@1"),
    ];
    const TORCH: &[(&str, &str)] = &[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "none"),
    ];

    fn with(
        base: &[(&'static str, &'static str)],
        extra: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = base
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .copied()
            .collect();
        v.extend_from_slice(extra);
        v
    }

    fn without(
        base: &[(&'static str, &'static str)],
        name: &str,
    ) -> Vec<(&'static str, &'static str)> {
        base.iter().filter(|(k, _)| *k != name).copied().collect()
    }

    #[test]
    fn weft_launcher() {
        let env = env_of(WEFT).unwrap();
        assert_eq!(
            env,
            RankEnv {
                rank: 2,
                world: 4,
                local_rank: 2,
                local_world: 4,
                launcher: Launcher::Weft,
                job_id: Some("weft-123-456".into()),
                master: None,
                secret: None,
                insecure_tcp: false,
            }
        );
        assert!(env.is_single_host());
        assert_eq!(env_of(&without(WEFT, "WEFT_JOB_ID")).unwrap().job_id, None);
    }

    #[test]
    fn open_mpi() {
        let env = env_of(OMPI).unwrap();
        assert_eq!(
            (env.rank, env.world, env.local_rank, env.local_world),
            (5, 8, 1, 4)
        );
        assert_eq!(env.launcher, Launcher::OpenMpi);
        assert_eq!(env.job_id.as_deref(), Some("prterun-host-99@1"));
        assert!(!env.is_single_host());
        let older = with(
            &without(OMPI, "PMIX_NAMESPACE"),
            &[("OMPI_MCA_ess_base_jobid", "31337")],
        );
        assert_eq!(
            env_of(&older).unwrap().job_id.as_deref(),
            Some("ompi-31337")
        );
        assert_eq!(
            env_of(&without(OMPI, "PMIX_NAMESPACE")).unwrap().job_id,
            None
        );
    }

    #[test]
    fn hydra() {
        let base = [
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "3"),
        ];
        let env = env_of(&with(
            &base,
            &[("PMI_KVSNAME", "kvs_77_0"), ("PMI_PORT", "host:1234")],
        ))
        .unwrap();
        assert_eq!(
            (env.rank, env.world, env.local_rank, env.local_world),
            (1, 3, 1, 3)
        );
        assert_eq!(env.launcher, Launcher::Hydra);
        assert_eq!(env.job_id.as_deref(), Some("kvs_77_0"));
        let env = env_of(&with(&base, &[("PMI_PORT", "host:1234")])).unwrap();
        assert_eq!(env.job_id.as_deref(), Some("pmi-host:1234"));
        assert_eq!(env_of(&base).unwrap().job_id, None);
    }

    #[test]
    fn slurm() {
        let base = [
            ("SLURM_PROCID", "9"),
            ("SLURM_STEP_NUM_TASKS", "11"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2),3"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
        ];
        let env = env_of(&base).unwrap();
        assert_eq!(
            (env.rank, env.world, env.local_rank, env.local_world),
            (9, 11, 1, 3)
        );
        assert_eq!(env.launcher, Launcher::Slurm);
        assert_eq!(env.job_id.as_deref(), Some("slurm-4242.0"));
        let env = env_of(&with(
            &base,
            &[("SLURM_NODEID", "1"), ("SLURM_PROCID", "5")],
        ))
        .unwrap();
        assert_eq!(env.local_world, 4);

        // An sbatch script (no step task count) is a standalone process.
        let sbatch = [
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_NODEID", "0"),
        ];
        assert_eq!(env_of(&sbatch).unwrap(), RankEnv::standalone());

        assert!(err_of(&without(&base, "SLURM_NODEID"))
            .contains("SLURM_NODEID is not set but SLURM_PROCID is"));
        assert!(err_of(&without(&base, "SLURM_STEP_TASKS_PER_NODE"))
            .contains("SLURM_STEP_TASKS_PER_NODE is not set"));
        let e = err_of(&with(&base, &[("SLURM_NODEID", "3")]));
        assert!(e.contains("node 3 is beyond the 3 node(s)"), "{e}");
    }

    #[test]
    fn torchrun() {
        let env = env_of(TORCH).unwrap();
        assert_eq!(
            (env.rank, env.world, env.local_rank, env.local_world),
            (1, 2, 1, 2)
        );
        assert_eq!(env.launcher, Launcher::Torchrun);
        assert_eq!(env.job_id.as_deref(), Some("torchrun-none-29500"));
        let no_run_id = without(TORCH, "TORCHELASTIC_RUN_ID");
        assert_eq!(
            env_of(&no_run_id).unwrap().job_id.as_deref(),
            Some("torchrun-29500")
        );
        let bare = without(&without(&no_run_id, "MASTER_ADDR"), "MASTER_PORT");
        assert_eq!(env_of(&bare).unwrap().job_id, None);
    }

    #[test]
    fn standalone_when_nothing_is_set() {
        assert_eq!(env_of(&[]).unwrap(), RankEnv::standalone());
        // RANK without WORLD_SIZE is not torchrun.
        assert_eq!(env_of(&[("RANK", "3")]).unwrap(), RankEnv::standalone());
        let s = RankEnv::standalone();
        assert_eq!((s.rank, s.world, s.local_rank, s.local_world), (0, 1, 0, 1));
        assert!(s.is_single_host());
    }

    #[test]
    fn precedence() {
        let both = with(WEFT, OMPI);
        assert_eq!(env_of(&both).unwrap().launcher, Launcher::Weft);
        let both = with(OMPI, TORCH);
        assert_eq!(env_of(&both).unwrap().launcher, Launcher::OpenMpi);
        let both = with(
            &[
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "1"),
                ("MPI_LOCALRANKID", "0"),
                ("MPI_LOCALNRANKS", "1"),
            ],
            TORCH,
        );
        assert_eq!(env_of(&both).unwrap().launcher, Launcher::Hydra);
    }

    #[test]
    fn missing_or_bad_numbers() {
        let e = err_of(&without(OMPI, "OMPI_COMM_WORLD_SIZE"));
        assert!(
            e.contains("OMPI_COMM_WORLD_SIZE is not set but OMPI_COMM_WORLD_RANK is"),
            "{e}"
        );
        let e = err_of(&without(WEFT, "WEFT_LOCAL_WORLD_SIZE"));
        assert!(
            e.contains("WEFT_LOCAL_WORLD_SIZE is not set but WEFT_RANK is"),
            "{e}"
        );
        let e = err_of(&without(TORCH, "LOCAL_RANK"));
        assert!(e.contains("LOCAL_RANK is not set but RANK is"), "{e}");
        let e = err_of(&with(WEFT, &[("WEFT_WORLD_SIZE", "four")]));
        assert!(
            e.contains("WEFT_WORLD_SIZE=\"four\" is not a non-negative integer"),
            "{e}"
        );
        let e = err_of(&with(WEFT, &[("WEFT_RANK", "-1")]));
        assert!(e.contains("WEFT_RANK=\"-1\""), "{e}");
    }

    #[test]
    fn inconsistent_numbers() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("WEFT_WORLD_SIZE", "0")],
                "world size 0 must be at least 1",
            ),
            (&[("WEFT_RANK", "4")], "rank 4 is not below world size 4"),
            (
                &[("WEFT_LOCAL_WORLD_SIZE", "0")],
                "local world size 0 must be at least 1",
            ),
            (
                &[("WEFT_LOCAL_RANK", "4")],
                "local rank 4 is not below local world size 4",
            ),
            (
                &[("WEFT_LOCAL_WORLD_SIZE", "8"), ("WEFT_LOCAL_RANK", "2")],
                "local world size 8 exceeds world size 4",
            ),
        ];
        for (extra, expected) in cases {
            let e = err_of(&with(WEFT, extra));
            assert!(e.contains(expected) && e.contains("Weft"), "{e}");
        }
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(parse_slurm_tasks_per_node("4").unwrap(), vec![(4, 1)]);
        assert_eq!(
            parse_slurm_tasks_per_node("4(x2),3").unwrap(),
            vec![(4, 2), (3, 1)]
        );
        assert_eq!(
            parse_slurm_tasks_per_node("2,2,1").unwrap(),
            vec![(2, 1), (2, 1), (1, 1)]
        );
        let nodes: Vec<usize> = (0..3)
            .map(|n| slurm_tasks_on_node("4(x2),3", n).unwrap())
            .collect();
        assert_eq!(nodes, [4, 4, 3]);
        assert_eq!(slurm_tasks_on_node("2,2,1", 2).unwrap(), 1);
        assert!(slurm_tasks_on_node("4", 1).is_err());
        for bad in [
            "", "x", "4(2)", "4(x2", "4(x0)", "4,,3", "-1", "4(x2),a", "4(y2)",
        ] {
            let e = parse_slurm_tasks_per_node(bad).expect_err(bad);
            assert!(format!("{e}").contains("malformed"), "{bad}: {e}");
        }
    }

    #[test]
    fn master_address() {
        let e = env_of(&with(
            WEFT,
            &[("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")],
        ))
        .unwrap();
        assert_eq!(e.master, Some(("10.0.0.1".into(), 29500)));
        // The WEFT_ pair overrides MASTER_*.
        let e = env_of(&with(
            WEFT,
            &[
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "29500"),
                ("WEFT_MASTER_ADDR", "h"),
                ("WEFT_MASTER_PORT", "7"),
            ],
        ))
        .unwrap();
        assert_eq!(e.master, Some(("h".into(), 7)));

        let e = err_of(&with(WEFT, &[("MASTER_ADDR", "10.0.0.1")]));
        assert!(
            e.contains("MASTER_ADDR is set but MASTER_PORT is not"),
            "{e}"
        );
        let e = err_of(&with(WEFT, &[("MASTER_PORT", "1")]));
        assert!(
            e.contains("MASTER_PORT is set but MASTER_ADDR is not"),
            "{e}"
        );
        let e = err_of(&with(WEFT, &[("WEFT_MASTER_PORT", "1")]));
        assert!(
            e.contains("WEFT_MASTER_PORT is set but WEFT_MASTER_ADDR is not"),
            "{e}"
        );
        let e = err_of(&with(
            WEFT,
            &[("WEFT_MASTER_ADDR", "h"), ("WEFT_MASTER_PORT", "70000")],
        ));
        assert!(
            e.contains("WEFT_MASTER_PORT=\"70000\" is not a port number"),
            "{e}"
        );
        let e = err_of(&with(
            WEFT,
            &[("MASTER_ADDR", "h"), ("MASTER_PORT", "http")],
        ));
        assert!(e.contains("MASTER_PORT=\"http\""), "{e}");
    }

    #[test]
    fn torchrun_master_rule() {
        // One host: torchrun's store owns MASTER_PORT, so weft uses a Unix socket.
        assert_eq!(env_of(TORCH).unwrap().master, None);
        // Several hosts: the next port.
        let multi = with(TORCH, &[("WORLD_SIZE", "4"), ("RANK", "3")]);
        assert_eq!(
            env_of(&multi).unwrap().master,
            Some(("127.0.0.1".into(), 29501))
        );
        let e = err_of(&with(&multi, &[("MASTER_PORT", "65535")]));
        assert!(e.contains("MASTER_PORT=65535"), "{e}");
        // An explicit WEFT_ pair is used as given, even under torchrun.
        let explicit = with(
            TORCH,
            &[
                ("WEFT_MASTER_ADDR", "10.1.1.1"),
                ("WEFT_MASTER_PORT", "29500"),
            ],
        );
        assert_eq!(
            env_of(&explicit).unwrap().master,
            Some(("10.1.1.1".into(), 29500))
        );
    }

    /// Hostile launcher variables: any of the five launchers' variables set or not, to numbers,
    /// signs, spaces or garbage. `from_vars` never panics; it accepts only a world it can run
    /// (rank below world, local rank below local world, local world within world), with the
    /// values of the launcher the precedence below (written out here) picks, and refuses
    /// everything else as `PglError::Launcher`.
    mod hostile {
        use super::*;
        use proptest::prelude::*;

        /// (the variable that selects a launcher, its rank, world, local rank and local world
        /// variables), in weft's order of precedence; Slurm also needs SLURM_STEP_NUM_TASKS.
        const LAUNCHERS: [(&str, [&str; 4]); 5] = [
            (
                "WEFT_RANK",
                [
                    "WEFT_RANK",
                    "WEFT_WORLD_SIZE",
                    "WEFT_LOCAL_RANK",
                    "WEFT_LOCAL_WORLD_SIZE",
                ],
            ),
            (
                "OMPI_COMM_WORLD_RANK",
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                ],
            ),
            (
                "PMI_RANK",
                ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
            ),
            (
                "SLURM_PROCID",
                ["SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", ""],
            ),
            (
                "RANK",
                ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
            ),
        ];

        fn value() -> impl Strategy<Value = Option<String>> {
            prop_oneof![
                2 => Just(None),
                4 => (0u64..6).prop_map(|v| Some(v.to_string())),
                1 => any::<u64>().prop_map(|v| Some(v.to_string())),
                1 => prop::sample::select(vec!["-1", "", " 2 ", "x", "1e3", "18446744073709551616", "4(x2),3", "0x1"])
                    .prop_map(|v| Some(v.to_string())),
            ]
        }

        /// The variables every launcher reads, then Slurm's node list and node id.
        fn names() -> Vec<&'static str> {
            let mut n: Vec<&str> = LAUNCHERS
                .iter()
                .flat_map(|(_, v)| v.iter().copied())
                .filter(|v| !v.is_empty())
                .collect();
            n.extend(["SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"]);
            n
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]
            #[test]
            fn accepts_only_a_runnable_world(values in prop::collection::vec(value(), 22)) {
                let names = names();
                let map: HashMap<String, String> = names.iter().zip(&values)
                    .filter_map(|(n, v)| v.clone().map(|v| (n.to_string(), v)))
                    .collect();
                let got = RankEnv::from_vars(|n| map.get(n).cloned());
                let has = |n: &str| map.contains_key(n);
                // The launcher the precedence picks, if any.
                let picked = LAUNCHERS.iter().find(|(trigger, _)| {
                    has(trigger)
                        && (*trigger != "SLURM_PROCID" || has("SLURM_STEP_NUM_TASKS"))
                        && (*trigger != "RANK" || has("WORLD_SIZE"))
                });
                // Outside Slurm (whose local world comes from its node list), which worlds are
                // runnable, decided here: the four numbers parse, rank < world, local rank <
                // local world, local world <= world; then it must be accepted.
                if let Some((trigger, vars)) = picked.filter(|(t, _)| *t != "SLURM_PROCID") {
                    let num = |n: &str| map.get(n).and_then(|v| v.trim().parse::<usize>().ok());
                    let runnable = match vars.map(num) {
                        [Some(r), Some(w), Some(lr), Some(lw)] => r < w && lr < lw && lw <= w,
                        _ => false,
                    };
                    prop_assert_eq!(got.is_ok(), runnable, "{}: {:?} for {:?}", trigger, got, map);
                }
                match (&got, picked) {
                    (Ok(env), None) => prop_assert_eq!((env.rank, env.world), (0, 1)),
                    (Ok(env), Some((_, vars))) => {
                        let num = |n: &str| map[n].trim().parse::<usize>().unwrap();
                        prop_assert_eq!(env.rank, num(vars[0]));
                        prop_assert_eq!(env.world, num(vars[1]));
                        prop_assert_eq!(env.local_rank, num(vars[2]));
                        if !vars[3].is_empty() {
                            prop_assert_eq!(env.local_world, num(vars[3]));
                        }
                        prop_assert!(env.rank < env.world);
                        prop_assert!(env.local_rank < env.local_world);
                        prop_assert!(env.local_world <= env.world);
                    }
                    (Err(PglError::Launcher(_)), Some(_)) => {}
                    (Err(e), _) => prop_assert!(false, "{e:?} for {map:?}"),
                }
            }
        }
    }
}
