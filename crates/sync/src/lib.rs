//! weft-sync: device `signal` / `signal_all` / `wait` / `barrier` primitives over pgl-allocated
//! u64 counters (headers `kernels/include/weft/sync.cuh` and `weft/sync/*.cuh`), with bounded
//! waits that report into a host-visible error slot, and their host side. See README.md.
//!
//! - [`Counters`]: the counter layout (a `Pgl<u64>`), its [`ErrorSlot`], its [`WaitBudget`] and
//!   its epoch; `device()` is the `weft_sync_counters` kernel argument.
//! - [`ErrorSlot`]: pinned, device-mapped; `check()` turns a recorded timeout into a
//!   [`SyncError`] a caller can match on ([`DeviceFailure`]: kind, rank, counter, values).
//! - [`WaitBudget`]: a duration as SM cycles.
//! - [`epoch`]: the monotonic-target scheme that makes counters reusable without memsets.
//! - [`launch`]: loading a kernel and a synchronisation that reports a recorded timeout.
//!
//! The launchers of weft's own sync test kernels (`kernels/sync/*.cu`) live in `weft-testkit`.

pub mod budget;
pub mod counters;
pub mod epoch;
pub mod error;
pub mod error_slot;
pub mod launch;

pub use budget::WaitBudget;
pub use counters::Counters;
pub use error::{DeviceFailure, FailureKind, KernelEnd, SyncError};
pub use error_slot::ErrorSlot;
pub use launch::sync_checked;
