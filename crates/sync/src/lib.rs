//! weft-sync: device `signal` / `signal_all` / `wait` / `barrier` primitives over pgl-allocated
//! u64 counters (headers `kernels/include/weft/sync.cuh` and `weft/sync/*.cuh`), with bounded
//! waits that report into a host-visible error slot, and their host side. See README.md.
//!
//! - [`Counters`]: the counter layout (a `Pgl<u64>`), its [`ErrorSlot`], its [`WaitBudget`] and
//!   its epoch; `device()` is the `weft_sync_counters` kernel argument.
//! - [`ErrorSlot`]: pinned, device-mapped; `check()` turns a recorded timeout into an error.
//! - [`WaitBudget`]: a duration as SM cycles.
//! - [`epoch`]: the monotonic-target scheme that makes counters reusable without memsets.
//! - [`stress`], [`laps`], [`latency`], [`timeout`]: launch helpers for weft's own sync kernels
//!   (`kernels/sync/*.cu`), used by the harness's `sync` trials and benchmark.

pub mod budget;
pub mod counters;
pub mod epoch;
pub mod error_slot;
pub mod laps;
pub mod latency;
pub mod launch;
pub mod stress;
pub mod timeout;

pub use budget::WaitBudget;
pub use counters::Counters;
pub use error_slot::ErrorSlot;
pub use launch::sync_checked;
