//! Correctness suites, one libtest-mimic trial per (test × configuration).

mod barrier;
mod gemm;
mod grpcoll;
mod nccl;
mod overlap;
mod pgl;
mod rendezvous;
mod roundtrip;
mod sync;

use crate::trials::Case;

pub use sync::timeout_child as sync_timeout_child;

/// Every trial, in the order every rank runs them.
pub fn all() -> Vec<Case> {
    let mut cases = rendezvous::cases();
    cases.extend(roundtrip::cases());
    cases.extend(nccl::cases());
    cases.extend(pgl::cases());
    cases.extend(sync::cases());
    cases.extend(barrier::cases());
    cases.extend(grpcoll::cases());
    cases.extend(gemm::cases());
    cases.extend(overlap::cases());
    cases
}
