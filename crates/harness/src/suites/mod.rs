//! Correctness suites, one libtest-mimic trial per (test × configuration).

mod nccl;
mod rendezvous;
mod roundtrip;

use crate::trials::Case;

/// Every trial, in the order every rank runs them.
pub fn all() -> Vec<Case> {
    let mut cases = rendezvous::cases();
    cases.extend(roundtrip::cases());
    cases.extend(nccl::cases());
    cases
}
