//! weft-barrier: KernelBarrier, a device counter that communication kernels arrive on at launch
//! and a one-thread wait kernel that holds the compute stream until they are resident, so a greedy
//! compute kernel issued first cannot starve them of SMs. Rules in `README.md`.
//!
//! The workloads the overlap-order bench and the barrier trials order (a persistent compute
//! kernel with an `sm_margin` knob, a copy kernel that arrives) live in `weft-testkit`.

mod bound;
mod early_release;
mod error;
mod kernel_barrier;
mod report;

pub use bound::{default_timeout, TIMEOUT_VAR};
pub use early_release::early_release_attribute;
pub use error::BarrierError;
pub use kernel_barrier::KernelBarrier;
pub use report::describe;
