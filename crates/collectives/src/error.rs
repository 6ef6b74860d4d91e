//! What a collective call can refuse or report.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CollectiveError {
    /// A buffer whose length does not fit the collective's rule.
    #[error("{op}: {buffer} holds {len} elements, expected {expected} ({rule})")]
    Length {
        op: &'static str,
        buffer: &'static str,
        len: usize,
        expected: usize,
        rule: &'static str,
    },
    /// A buffer not aligned to 16 bytes (the kernels move 16-byte vectors).
    #[error("{op}: {buffer} at {addr:#x} is not 16-byte aligned")]
    Misaligned {
        op: &'static str,
        buffer: &'static str,
        addr: u64,
    },
    /// A buffer that is not memory of the collective's device.
    #[error("{op}: {buffer} at {addr:#x} is memory of device {device}, not of the collective's device {expected} (-1: not device memory)")]
    WrongDevice {
        op: &'static str,
        buffer: &'static str,
        addr: u64,
        device: i32,
        expected: i32,
    },
    /// A call that would take more rounds than a launch counts (u32), or more than 2^64 bytes.
    #[error("{op}: {count} elements need more than 2^32 rounds of {slot_bytes}-byte slots (use larger slots), or more than 2^64 bytes")]
    TooLarge {
        op: &'static str,
        count: usize,
        slot_bytes: u64,
    },
    /// Options that cannot work on this job, or that differ between ranks.
    #[error("collectives options: {0}")]
    Options(String),
    /// A bounded wait inside a kernel expired (a peer never published its round): what it saw,
    /// typed (`SyncError::Device`: kind, rank, counter, expected and observed values).
    #[error("a collective's wait expired: {0} (ranks must make the same collective calls, in the same order, with the same lengths)")]
    Wait(weft_sync::SyncError),
    /// Allocation, agreement between ranks, loading or launching failed.
    #[error(transparent)]
    Runtime(#[from] anyhow::Error),
}

/// weft-sync's error: recorded waits are `Wait`; a driver error with nothing recorded, a wait
/// bound's setting or a set-up that failed is `Runtime` (still a `SyncError` inside:
/// `downcast_ref`).
impl From<weft_sync::SyncError> for CollectiveError {
    fn from(e: weft_sync::SyncError) -> Self {
        match e {
            e @ weft_sync::SyncError::Device { .. } => CollectiveError::Wait(e),
            e => CollectiveError::Runtime(anyhow::Error::new(e)),
        }
    }
}

/// weft-pgl's error (the staging PGL, the rendezvous): `Runtime`, typed inside (`downcast_ref`).
impl From<weft_pgl::PglError> for CollectiveError {
    fn from(e: weft_pgl::PglError) -> Self {
        CollectiveError::Runtime(anyhow::Error::new(e))
    }
}

impl From<cudarc::driver::DriverError> for CollectiveError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CollectiveError::Runtime(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::CollectiveError;
    use cudarc::driver::{sys::CUresult, DriverError};
    use weft_kernels::abi;
    use weft_sync::{DeviceFailure, FailureKind, KernelEnd, SyncError};

    /// Recorded waits become `Wait` (typed inside, named in the text); a driver error with
    /// nothing recorded stays a `SyncError` inside `Runtime`.
    #[test]
    fn sync_errors_map_to_wait_or_runtime() {
        let slot = abi::weft_error_slot {
            status: abi::WEFT_SYNC_STATUS_TIMEOUT as i32,
            primitive: abi::WEFT_SYNC_PRIM_WAIT as i32,
            rank: 1,
            target_rank: 1,
            expected: 3,
            observed: 2,
            ..Default::default()
        };
        let failure = DeviceFailure::from_slot(slot, 1_980_000).expect("a timeout");
        let e = CollectiveError::from(SyncError::Device {
            failures: vec![failure],
            end: KernelEnd::NotWaited,
        });
        let text = e.to_string();
        assert!(
            text.starts_with("a collective's wait expired: rank 1: sync wait timed out")
                && text.contains("expected >= 3, observed 2"),
            "{text}"
        );
        match &e {
            CollectiveError::Wait(s) => assert_eq!(s.failures()[0].kind, FailureKind::Timeout),
            other => panic!("not a Wait: {other:?}"),
        }
        let e = CollectiveError::from(SyncError::Driver(DriverError(
            CUresult::CUDA_ERROR_LAUNCH_FAILED,
        )));
        match e {
            CollectiveError::Runtime(inner) => assert!(matches!(
                inner.downcast_ref::<SyncError>(),
                Some(SyncError::Driver(_))
            )),
            other => panic!("not Runtime: {other:?}"),
        }
    }
}
