//! weft-testkit: launchers for weft's own test and bench kernels, kept out of the libraries
//! users take. The harness's `sync` trials and benchmark use [`stress`], [`laps`], [`latency`]
//! and [`timeout`] (`kernels/sync/*.cu`); the `overlap-order` bench and the barrier trials use
//! [`synthetic`] (`kernels/barrier/{persistent_compute,comm_copy}.cu`): a persistent compute
//! kernel with an `sm_margin` knob and a copy kernel that arrives on a KernelBarrier.

pub mod laps;
pub mod latency;
pub mod stress;
pub mod synthetic;
pub mod timeout;
