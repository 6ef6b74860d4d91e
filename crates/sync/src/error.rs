//! What weft-sync's host side reports, typed so that a caller can match on it: the failures that
//! device primitives recorded in their error slots (kind, primitive, ranks, counter, values,
//! bound), the driver's error when a kernel stopped without recording one, a wait bound's setting
//! that is not one, and a set-up that failed. The recorded failures' messages are
//! `error_slot::describe`'s.

use crate::error_slot::describe;
use cudarc::driver::DriverError;
use std::fmt;
use thiserror::Error;
use weft_kernels::abi::{self, weft_error_slot, weft_tile_coord};

/// Why a device primitive gave up (the slot's status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// A wait ran past its bound.
    Timeout,
    /// A counter coordinate or rank outside the counter layout.
    BadCoord,
    /// A table entry that indexes past what it indexes (nothing was stored past it).
    BadIndex,
    /// A kernel launched with less dynamic shared memory than its layout needs.
    SharedMemory,
    /// The kernel stopped while the failure was being recorded (fields may be partial).
    Partial,
    /// A status this version does not know (memory corrupted?).
    Unknown(i32),
}

impl FailureKind {
    /// The kind of a slot's status; None for an empty slot.
    pub fn of(status: i32) -> Option<Self> {
        Some(match status as u32 {
            abi::WEFT_SYNC_STATUS_NONE => return None,
            abi::WEFT_SYNC_STATUS_TIMEOUT => Self::Timeout,
            abi::WEFT_SYNC_STATUS_BAD_COORD => Self::BadCoord,
            abi::WEFT_SYNC_STATUS_BAD_INDEX => Self::BadIndex,
            abi::WEFT_SYNC_STATUS_SMEM => Self::SharedMemory,
            abi::WEFT_SYNC_STATUS_WRITING => Self::Partial,
            _ => Self::Unknown(status),
        })
    }
}

/// One failure a device primitive recorded: the slot as read, and the SM clock that converts its
/// cycles to time.
#[derive(Clone, Copy, Debug)]
pub struct DeviceFailure {
    pub kind: FailureKind,
    pub slot: weft_error_slot,
    pub clock_khz: u32,
}

impl DeviceFailure {
    /// The failure a slot holds; None for an empty slot.
    pub fn from_slot(slot: weft_error_slot, clock_khz: u32) -> Option<Self> {
        FailureKind::of(slot.status).map(|kind| Self {
            kind,
            slot,
            clock_khz,
        })
    }
    /// The primitive that gave up (WEFT_SYNC_PRIM_*; `error_slot::primitive_name` names it).
    pub fn primitive(&self) -> i32 {
        self.slot.primitive
    }
    /// The rank whose kernel recorded it (as its launch was told).
    pub fn rank(&self) -> i32 {
        self.slot.rank
    }
    /// The part of the kernel whose wait or check gave up (WEFT_ROLE_*, 0 in kernels without
    /// roles; `error_slot::role_name` names it).
    pub fn role(&self) -> u32 {
        self.slot.role
    }
    /// The rank whose counter it waited on or signalled.
    pub fn target_rank(&self) -> i32 {
        self.slot.target_rank
    }
    /// The counter's coordinate (or the table entry's).
    pub fn coord(&self) -> weft_tile_coord {
        self.slot.coord
    }
    /// Timeout: the value waited for; BadIndex: the length of what the entry indexes;
    /// SharedMemory: the bytes needed.
    pub fn expected(&self) -> u64 {
        self.slot.expected
    }
    /// Timeout: the value seen last; BadIndex: the entry; SharedMemory: the bytes given.
    pub fn observed(&self) -> u64 {
        self.slot.observed
    }
}

impl fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // describe() is Some for every status FailureKind::of accepts.
        f.write_str(&describe(&self.slot, self.clock_khz).unwrap_or_default())
    }
}

/// How the kernel that recorded failures ended, as far as the host saw.
#[derive(Debug)]
pub enum KernelEnd {
    /// Not known: the slot was read on its own (`ErrorSlot::check`).
    NotWaited,
    /// The stream synchronised without error: the wait recorded a failure but did not stop it.
    Completed,
    /// The kernel was stopped (the recording wait traps): the driver's error.
    Stopped(DriverError),
}

/// What weft-sync reports: a synchronisation that failed (what the device primitives recorded,
/// or the driver's error when nothing was), a wait bound's setting that is not one, or a set-up
/// that failed.
#[derive(Debug, Error)]
pub enum SyncError {
    /// Device primitives recorded failures (one per error slot that holds one).
    #[error("{}{}", join(.failures), match .end {
        KernelEnd::NotWaited => String::new(),
        KernelEnd::Completed => " (yet the kernel completed: a wait recorded a failure without stopping it)".into(),
        KernelEnd::Stopped(e) => format!(" (the kernel was stopped: {e})"),
    })]
    Device {
        failures: Vec<DeviceFailure>,
        end: KernelEnd,
    },
    /// The stream failed and no error slot recorded anything (the driver's error is the source:
    /// `{:#}` prints it after this text).
    #[error("a sync kernel failed and recorded nothing in its error slot")]
    Driver(#[source] DriverError),
    /// A wait bound's setting that is not one: the variable, its text and why.
    #[error("{var}={value:?}: {reason}")]
    Setting {
        var: String,
        value: String,
        reason: String,
    },
    /// Setting up counters, an error slot, a kernel or a result struct failed (the driver, an
    /// allocation, agreement between ranks): what was being done, the cause as the source
    /// (`{:#}` prints it after this text).
    #[error("{what}")]
    Setup {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl SyncError {
    /// The recorded failures (none for the other kinds).
    pub fn failures(&self) -> &[DeviceFailure] {
        match self {
            Self::Device { failures, .. } => failures,
            Self::Driver(_) | Self::Setting { .. } | Self::Setup { .. } => &[],
        }
    }

    /// A `Setup` error: `what` failed because of `source`.
    pub(crate) fn setup<E>(what: impl Into<String>) -> impl FnOnce(E) -> Self
    where
        E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    {
        let what = what.into();
        move |source| Self::Setup {
            what,
            source: source.into(),
        }
    }
}

fn join(failures: &[DeviceFailure]) -> String {
    failures
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(status: u32) -> weft_error_slot {
        weft_error_slot {
            status: status as i32,
            primitive: abi::WEFT_SYNC_PRIM_BARRIER as i32,
            rank: 1,
            target_rank: 3,
            coord: weft_tile_coord {
                b: 0,
                d: 2,
                r: 4,
                c: 6,
            },
            expected: 9,
            observed: 7,
            elapsed_cycles: 2_000,
            budget_cycles: 1_980,
            elapsed_ns: 1_000,
            ..Default::default()
        }
    }

    #[test]
    fn every_status_has_its_kind() {
        assert_eq!(FailureKind::of(abi::WEFT_SYNC_STATUS_NONE as i32), None);
        for (status, kind) in [
            (abi::WEFT_SYNC_STATUS_TIMEOUT, FailureKind::Timeout),
            (abi::WEFT_SYNC_STATUS_BAD_COORD, FailureKind::BadCoord),
            (abi::WEFT_SYNC_STATUS_BAD_INDEX, FailureKind::BadIndex),
            (abi::WEFT_SYNC_STATUS_SMEM, FailureKind::SharedMemory),
            (abi::WEFT_SYNC_STATUS_WRITING, FailureKind::Partial),
            (77, FailureKind::Unknown(77)),
        ] {
            assert_eq!(
                FailureKind::of(status as i32),
                Some(kind),
                "status {status}"
            );
        }
    }

    #[test]
    fn a_failure_carries_the_slot_and_its_message() {
        assert!(DeviceFailure::from_slot(weft_error_slot::default(), 1_980_000).is_none());
        let f = DeviceFailure::from_slot(slot(abi::WEFT_SYNC_STATUS_TIMEOUT), 1_980_000).unwrap();
        assert_eq!(f.kind, FailureKind::Timeout);
        assert_eq!(
            (f.rank(), f.target_rank(), f.expected(), f.observed()),
            (1, 3, 9, 7)
        );
        assert_eq!(f.primitive(), abi::WEFT_SYNC_PRIM_BARRIER as i32);
        assert_eq!((f.coord().d, f.coord().r, f.coord().c), (2, 4, 6));
        let text = f.to_string();
        for part in [
            "rank 1: sync barrier timed out at counter (b 0, d 2, row 4, col 6) of rank 3",
            "expected >= 9, observed 7 after 2000 cycles",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
    }

    #[test]
    fn the_error_says_how_the_kernel_ended() {
        let f = DeviceFailure::from_slot(slot(abi::WEFT_SYNC_STATUS_BAD_COORD), 1_980_000).unwrap();
        let two = SyncError::Device {
            failures: vec![f, f],
            end: KernelEnd::Completed,
        };
        let text = two.to_string();
        assert_eq!(
            text.matches("outside the counter layout").count(),
            2,
            "{text}"
        );
        assert!(text.contains("; rank 1"), "{text}");
        assert!(
            text.ends_with(
                "(yet the kernel completed: a wait recorded a failure without stopping it)"
            ),
            "{text}"
        );
        assert_eq!(two.failures().len(), 2);
        let one = SyncError::Device {
            failures: vec![f],
            end: KernelEnd::NotWaited,
        };
        let text = one.to_string();
        assert!(
            text.starts_with("rank 1: sync barrier was given counter (b 0, d 2, row 4, col 6) of rank 3, outside")
                && !text.contains("; "),
            "{text}"
        );
        // (A DriverError's text comes from the driver, absent here: only the variants.)
        let driver = SyncError::Driver(DriverError(
            cudarc::driver::sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
        ));
        assert!(driver.failures().is_empty());
    }
}
