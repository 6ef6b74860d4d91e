//! Stops this rank when one step runs past its bound — a trial (`WEFT_TRIAL_TIMEOUT`, 600 s), or
//! a step of `weft bench` / `weft tune` (`WEFT_BENCH_TIMEOUT`, 1800 s: a suite, a row, a tuning
//! measurement). The other ranks then see it disappear at their next collective and fail naming
//! it, and the launcher stops the job. This is what bounds a step stuck where nothing else is:
//! an NCCL call whose peer died (NCCL has no timeout of its own).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const TRIAL_VAR: &str = "WEFT_TRIAL_TIMEOUT";
pub const BENCH_VAR: &str = "WEFT_BENCH_TIMEOUT";

/// Exit status of a rank the watchdog stopped (as `timeout` uses).
pub const EXIT_TIMED_OUT: i32 = 124;

pub struct Watchdog {
    current: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Watchdog {
    /// Starts the watching thread; `var` names the bound in the message.
    pub fn start(rank: usize, var: &'static str, limit: Duration) -> Self {
        let current: Arc<Mutex<Option<(String, Instant)>>> = Arc::new(Mutex::new(None));
        let watched = current.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200).min(limit));
            let late = watched
                .lock()
                .map(|c| {
                    c.as_ref()
                        .filter(|(_, since)| since.elapsed() > limit)
                        .cloned()
                })
                .unwrap_or(None);
            if let Some((name, _)) = late {
                eprintln!(
                    "weft: rank {rank}: {name} still running after {} s ({var}); stopping this rank",
                    limit.as_secs()
                );
                std::process::exit(EXIT_TIMED_OUT);
            }
        });
        Self { current }
    }

    /// `name` starts now (replacing the step before).
    pub fn watch(&self, name: &str) {
        if let Ok(mut c) = self.current.lock() {
            *c = Some((name.to_string(), Instant::now()));
        }
    }

    pub fn clear(&self) {
        if let Ok(mut c) = self.current.lock() {
            *c = None;
        }
    }
}

/// `var` in seconds when set to a number, else `default_secs`.
pub fn timeout(var: &str, default_secs: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(default_secs),
    )
}

static STEPS: OnceLock<Watchdog> = OnceLock::new();

/// Starts the watchdog of `weft bench` / `weft tune` steps (once per process).
pub fn watch_steps(rank: usize, limit: Duration) {
    STEPS.get_or_init(|| Watchdog::start(rank, BENCH_VAR, limit));
}

/// A bench or tune step begins (nothing when the step watchdog was not started).
pub fn step(name: &str) {
    if let Some(w) = STEPS.get() {
        w.watch(name);
    }
}
