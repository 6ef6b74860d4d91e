//! Collective trials: every rank runs the same libtest-mimic trials in the same order, each
//! trial's outcome is all-gathered, and every rank reports the combined verdict (rank 0 prints).
//!
//! Assumptions: every rank is given the same arguments (true under mpirun, Slurm, torchrun and
//! `weft launch`), so filtering selects the same trials everywhere; trials run one at a time.

use crate::job::Job;
use crate::watchdog::{self, Watchdog};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// What a trial needs to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Cpu,
    Gpu,
}

pub type Body = fn(&mut Job) -> anyhow::Result<()>;

/// Returned (as an error) by a trial that does not apply to this job, e.g. one that needs two
/// ranks in a one-rank job; the trial is reported as ignored with this reason.
#[derive(Debug)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

/// A named trial body (suites list these).
pub struct Case {
    pub name: String,
    pub needs: Needs,
    pub body: Body,
}

impl Case {
    pub fn cpu(name: impl Into<String>, body: Body) -> Self {
        Self {
            name: name.into(),
            needs: Needs::Cpu,
            body,
        }
    }
    pub fn gpu(name: impl Into<String>, body: Body) -> Self {
        Self {
            name: name.into(),
            needs: Needs::Gpu,
            body,
        }
    }
}

/// One rank's local result, as exchanged between ranks.
enum Local {
    Pass,
    Ignored(String),
    Fail(String),
}

impl Local {
    fn encode(&self) -> Vec<u8> {
        let (tag, text) = match self {
            Local::Pass => (0u8, ""),
            Local::Ignored(r) => (1, r.as_str()),
            Local::Fail(m) => (2, m.as_str()),
        };
        let mut v = vec![tag];
        v.extend_from_slice(text.as_bytes());
        v
    }

    fn decode(bytes: &[u8]) -> Local {
        let text = String::from_utf8_lossy(bytes.get(1..).unwrap_or_default()).into_owned();
        match bytes.first() {
            Some(0) => Local::Pass,
            Some(1) => Local::Ignored(text),
            Some(2) => Local::Fail(text),
            _ => Local::Fail(format!("malformed trial outcome {bytes:?}")),
        }
    }
}

/// Combines every rank's result: any failure fails the trial (naming each failing rank); all
/// ignored with rank 0's reason; a mix of passed and ignored is a failure (ranks disagree).
fn combine(results: &[Local]) -> Result<Completion, Failed> {
    let failures: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(r, l)| match l {
            Local::Fail(m) => Some(format!("rank {r}: {m}")),
            _ => None,
        })
        .collect();
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }
    let ignored: Vec<(usize, &String)> = results
        .iter()
        .enumerate()
        .filter_map(|(r, l)| {
            if let Local::Ignored(why) = l {
                Some((r, why))
            } else {
                None
            }
        })
        .collect();
    match ignored.len() {
        0 => Ok(Completion::Completed),
        n if n == results.len() => Ok(Completion::ignored_with(ignored[0].1)),
        _ => Err(format!(
            "ranks disagree: {} ran it but {}",
            results.len() - ignored.len(),
            ignored
                .iter()
                .map(|(r, why)| format!("rank {r} ignored it ({why})"))
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into()),
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".into())
}

/// Runs `cases` as libtest-mimic trials on every rank; `args` are libtest-mimic's flags.
/// Returns the verdict (identical on every rank) and the job for further use.
pub fn run(job: Job, cases: Vec<Case>, mut args: Arguments) -> (libtest_mimic::Conclusion, Job) {
    // Collectives inside trials require one trial at a time, in the same order on every rank.
    args.test_threads = Some(1);
    if job.rank() != 0 {
        args.logfile = Some("/dev/null".into());
    }
    let rank = job.rank();
    let job = Arc::new(Mutex::new(job));
    let watchdog = Arc::new(Watchdog::start(
        rank,
        watchdog::TRIAL_VAR,
        watchdog::timeout(watchdog::TRIAL_VAR, 600),
    ));
    let trials = cases
        .into_iter()
        .map(|case| {
            let job = job.clone();
            let watchdog = watchdog.clone();
            let name = case.name.clone();
            Trial::ignorable_test(case.name, move || {
                let mut job = job.lock().unwrap();
                watchdog.watch(&format!("trial {name}"));
                let local = match (case.needs, job.gpu()) {
                    (Needs::Gpu, Err(why)) => Local::Ignored(format!("no GPU: {why}")),
                    _ => match catch_unwind(AssertUnwindSafe(|| (case.body)(&mut job))) {
                        Ok(Ok(())) => Local::Pass,
                        Ok(Err(e)) => match e.downcast_ref::<Skip>() {
                            Some(skip) => Local::Ignored(skip.0.clone()),
                            None => Local::Fail(format!("{e:#}")),
                        },
                        Err(p) => Local::Fail(format!("panicked: {}", panic_text(p))),
                    },
                };
                watchdog.clear();
                let gathered = job.rdzv.all_gather(&local.encode()).map_err(|e| {
                    Failed::from(format!("rank {}: exchanging results: {e:#}", job.rank()))
                })?;
                combine(
                    &gathered
                        .iter()
                        .map(|b| Local::decode(b))
                        .collect::<Vec<_>>(),
                )
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // The trials (and their clones of the job) were consumed by the run.
    let job = Arc::try_unwrap(job)
        .ok()
        .expect("trials still hold the job")
        .into_inner()
        .unwrap_or_else(|p| p.into_inner());
    (conclusion, job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_failure_fails_and_names_the_rank() {
        let r = combine(&[Local::Pass, Local::Fail("bad".into()), Local::Pass]);
        let msg = r.err().unwrap().message().unwrap().to_string();
        assert_eq!(msg, "rank 1: bad");
    }

    #[test]
    fn all_ignored_is_ignored_and_mixed_is_a_failure() {
        assert!(matches!(
            combine(&[Local::Ignored("no GPU".into()), Local::Ignored("no GPU".into())]),
            Ok(Completion::Ignored { reason: Some(r) }) if r == "no GPU"
        ));
        let mixed = combine(&[Local::Pass, Local::Ignored("no GPU".into())]);
        assert!(mixed
            .err()
            .unwrap()
            .message()
            .unwrap()
            .contains("rank 1 ignored it"));
        assert!(matches!(
            combine(&[Local::Pass, Local::Pass]),
            Ok(Completion::Completed)
        ));
    }

    #[test]
    fn outcomes_round_trip_through_bytes() {
        for l in [
            Local::Pass,
            Local::Ignored("why".into()),
            Local::Fail("msg".into()),
        ] {
            let back = Local::decode(&l.encode());
            assert_eq!(back.encode(), l.encode());
        }
        assert!(matches!(Local::decode(&[9]), Local::Fail(_)));
    }
}
