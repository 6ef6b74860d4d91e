//! What KernelBarrier's host side refuses or reports, typed so that a caller can match on it.

use crate::report::describe;
use cudarc::driver::DriverError;
use thiserror::Error;
use weft_kernels::abi::weft_kernel_barrier_report;

/// What a KernelBarrier call refused, or what a wait that gave up reported.
#[derive(Debug, Error)]
pub enum BarrierError {
    /// More expected arrivals than the int32 counter holds.
    #[error(
        "KernelBarrier: {total} + {arrivals} arrivals overflow the int32 counter: reset it first"
    )]
    Overflow { total: i32, arrivals: u32 },
    /// A wait enqueued on a stream of another context than the barrier's.
    #[error("KernelBarrier::wait: the stream belongs to another context than the barrier (GPU {barrier_gpu})")]
    WrongContext { barrier_gpu: usize },
    /// A wait for a target no `expect` announced.
    #[error(
        "KernelBarrier::wait: target {target} was never expected (expected so far: {expected})"
    )]
    UnexpectedTarget { target: i32, expected: i32 },
    /// A wait gave up: the report it filled (target, observed count, elapsed time, bound); also
    /// a report holding a status this version does not know (its text says so).
    #[error("GPU {gpu}: {}", describe(.report, *.clock_khz).unwrap_or_default())]
    TimedOut {
        gpu: usize,
        report: weft_kernel_barrier_report,
        clock_khz: u32,
    },
    /// Early release asked of a context that tracks events.
    #[error(
        "early release needs the context's event tracking off (CudaContext::disable_event_tracking): with it on, \
         cudarc enqueues event waits before the launch, after the KernelBarrier wait, and the early release would not happen"
    )]
    EventTracking,
    /// A driver call failed (the driver's error is the source: `{:#}` prints it after `what`).
    #[error("{what}")]
    Driver {
        what: &'static str,
        #[source]
        source: DriverError,
    },
    /// The SM clock query, or the bound's setting (`WEFT_BARRIER_TIMEOUT_MS`: `SyncError::Setting`
    /// names the variable, its text and why it is refused).
    #[error(transparent)]
    Sync(#[from] weft_sync::SyncError),
    /// Loading the wait kernel.
    #[error(transparent)]
    Setup(#[from] anyhow::Error),
}

impl BarrierError {
    pub(crate) fn driver(what: &'static str) -> impl FnOnce(DriverError) -> Self {
        move |source| Self::Driver { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_names_its_values() {
        let e = BarrierError::Overflow {
            total: i32::MAX - 1,
            arrivals: 3,
        };
        assert_eq!(
            e.to_string(),
            "KernelBarrier: 2147483646 + 3 arrivals overflow the int32 counter: reset it first"
        );
        let e = BarrierError::UnexpectedTarget {
            target: 9,
            expected: 4,
        };
        assert!(
            e.to_string()
                .contains("target 9 was never expected (expected so far: 4)"),
            "{e}"
        );
        let e = BarrierError::WrongContext { barrier_gpu: 1 };
        assert!(
            e.to_string()
                .contains("another context than the barrier (GPU 1)"),
            "{e}"
        );
        assert!(BarrierError::EventTracking
            .to_string()
            .contains("disable_event_tracking"));
    }

    #[test]
    fn a_timeout_carries_its_report() {
        let report = crate::report::timed_out_report();
        let e = BarrierError::TimedOut {
            gpu: 3,
            report,
            clock_khz: 1_980_000,
        };
        let text = e.to_string();
        for part in [
            "GPU 3: KernelBarrier wait timed out: target 7 arrivals, observed 5",
            "bound 198000000 cycles = 100.000 ms at 1980 MHz",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
    }
}
