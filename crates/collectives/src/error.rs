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

impl From<cudarc::driver::DriverError> for CollectiveError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CollectiveError::Runtime(e.into())
    }
}
