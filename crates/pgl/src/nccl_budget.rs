//! How long weft waits on NCCL, and the polling that bounds it.
//!
//! [`crate::nccl::Communicator::synchronize`] polls a stream and the communicator's
//! asynchronous state until the work is done, an error shows, or the budget is spent. Every
//! communicator's init (and the split that makes a blocking one from it) returns ncclInProgress
//! and is polled here until it settles; a non-blocking communicator (opt-in, [`NONBLOCKING_VAR`])
//! also returns it from group ends, finalize and calls that need connection setup. A wait past
//! the budget is a failure the caller turns into ncclCommAbort and an error naming the
//! operation: a rank that died or never joined then ends the others within the budget instead
//! of hanging them.

use crate::error::PglError;
use cudarc::driver::sys as cu;
use cudarc::nccl::sys;
use std::time::{Duration, Instant};

/// The variable that sets the budget, in seconds (positive, finite).
pub const TIMEOUT_VAR: &str = "WEFT_NCCL_TIMEOUT_S";

/// The budget when [`TIMEOUT_VAR`] is unset: long enough for a large job's init and a slow
/// collective, short enough that a lost rank ends a job in minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The budget from `value` (the variable's value, if set).
/// Errors: `PglError::Setting`.
pub fn timeout_from(value: Option<&str>) -> Result<Duration, PglError> {
    let Some(v) = value else {
        return Ok(DEFAULT_TIMEOUT);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(PglError::Setting {
            var: TIMEOUT_VAR,
            value: v.to_string(),
            reason: "is not a positive number of seconds (the bound on every NCCL wait)".into(),
        }),
    }
}

/// The variable that makes weft's communicators non-blocking ("1"; default "0"): every call
/// and the teardown bounded too (the init is either way), at a cost per call (measured on two
/// H200s: NCCL's 8-byte all-reduce 8.8 µs blocking, 164 µs non-blocking, each launch going
/// through NCCL's helper thread:
/// `results/nccl/nvidia-h200-x2-2026-11-26-*blocking-*.json`).
pub const NONBLOCKING_VAR: &str = "WEFT_NCCL_NONBLOCKING";

/// How a communicator waits: its budget and whether it is non-blocking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waits {
    pub budget: Duration,
    pub nonblocking: bool,
}

impl Waits {
    /// From the two variables' values (if set). Errors: `PglError::Setting`.
    pub fn from_values(timeout: Option<&str>, nonblocking: Option<&str>) -> Result<Self, PglError> {
        let nonblocking = match nonblocking.map(str::trim) {
            None | Some("0") | Some("") => false,
            Some("1") => true,
            Some(v) => {
                return Err(PglError::Setting {
                    var: NONBLOCKING_VAR,
                    value: v.to_string(),
                    reason: "is not 0 or 1".into(),
                })
            }
        };
        Ok(Self {
            budget: timeout_from(timeout)?,
            nonblocking,
        })
    }

    /// From the environment ([`TIMEOUT_VAR`], [`NONBLOCKING_VAR`]).
    pub fn from_env() -> Result<Self, PglError> {
        Self::from_values(
            std::env::var(TIMEOUT_VAR).ok().as_deref(),
            std::env::var(NONBLOCKING_VAR).ok().as_deref(),
        )
    }
}

/// How a bounded wait ended when it did not succeed.
#[derive(Debug)]
pub enum Unsettled {
    /// NCCL reported this error (asynchronously or from the query itself).
    Failed(sys::ncclResult_t),
    /// Still in progress (or the stream still busy) when the budget ran out.
    TimedOut(Duration),
    /// The stream query failed with this CUDA error.
    Cuda(cu::CUresult),
}

/// Sleeps a little longer each time, from a yield up to 100 µs, so short waits stay short and
/// long ones cost no CPU.
struct Backoff(u32);

impl Backoff {
    fn pause(&mut self) {
        if self.0 < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(u64::from(self.0.min(100))));
        }
        self.0 = self.0.saturating_add(1);
    }
}

/// The communicator's asynchronous state (ncclCommGetAsyncError).
fn async_state(comm: sys::ncclComm_t) -> sys::ncclResult_t {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: a valid communicator and an out-parameter.
    let r = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
    if r != sys::ncclResult_t::ncclSuccess {
        return r;
    }
    state
}

/// Polls until the communicator's state leaves ncclInProgress, at most `budget`.
pub fn settle(comm: sys::ncclComm_t, budget: Duration) -> Result<(), Unsettled> {
    let start = Instant::now();
    let mut backoff = Backoff(0);
    loop {
        match async_state(comm) {
            sys::ncclResult_t::ncclSuccess => return Ok(()),
            sys::ncclResult_t::ncclInProgress => {}
            e => return Err(Unsettled::Failed(e)),
        }
        if start.elapsed() > budget {
            return Err(Unsettled::TimedOut(start.elapsed()));
        }
        backoff.pause();
    }
}

/// Polls until `stream` has finished its work, checking the communicator for asynchronous
/// errors meanwhile, at most `budget`. The stream's context must be current.
pub fn drain(
    comm: sys::ncclComm_t,
    stream: cu::CUstream,
    budget: Duration,
) -> Result<(), Unsettled> {
    let start = Instant::now();
    let mut backoff = Backoff(0);
    loop {
        // SAFETY: a valid stream of the current context.
        match unsafe { cu::cuStreamQuery(stream) } {
            cu::CUresult::CUDA_SUCCESS => {
                // The work is done; an error NCCL raised meanwhile still counts.
                return match async_state(comm) {
                    sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
                    e => Err(Unsettled::Failed(e)),
                };
            }
            cu::CUresult::CUDA_ERROR_NOT_READY => {}
            e => return Err(Unsettled::Cuda(e)),
        }
        match async_state(comm) {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => {}
            e => return Err(Unsettled::Failed(e)),
        }
        if start.elapsed() > budget {
            return Err(Unsettled::TimedOut(start.elapsed()));
        }
        backoff.pause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_unless_asked_and_bad_values_are_named() {
        let w = Waits::from_values(None, None).unwrap();
        assert_eq!((w.budget, w.nonblocking), (DEFAULT_TIMEOUT, false));
        assert!(
            Waits::from_values(Some("7"), Some("1"))
                .unwrap()
                .nonblocking
        );
        assert!(!Waits::from_values(None, Some("0")).unwrap().nonblocking);
        let e = Waits::from_values(None, Some("yes")).unwrap_err();
        assert!(
            matches!(&e, PglError::Setting { var: NONBLOCKING_VAR, value, .. } if value == "yes"),
            "{e:?}"
        );
        assert!(e.to_string().contains(NONBLOCKING_VAR), "{e}");
        assert!(matches!(
            Waits::from_values(Some("-3"), None),
            Err(PglError::Setting {
                var: TIMEOUT_VAR,
                ..
            })
        ));
    }

    #[test]
    fn the_budget_defaults_and_bad_values_are_named() {
        assert_eq!(timeout_from(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from(Some(" 2.5 ")).unwrap(),
            Duration::from_millis(2500)
        );
        for bad in ["0", "-1", "soon", "inf", "NaN", ""] {
            let e = timeout_from(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(TIMEOUT_VAR) && e.contains("positive"),
                "{bad}: {e}"
            );
        }
    }
}
