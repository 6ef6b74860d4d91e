//! Correctness suites, one libtest-mimic trial per (test × configuration).

mod all_to_all;
mod all_to_all_ce;
mod auto_choice;
mod barrier;
mod bootstrap;
mod child;
mod collectives;
mod fused_all_gather;
mod fused_all_reduce;
mod fused_all_to_all;
mod fused_reduce_scatter;
mod gemm;
mod gemm_row_slots;
mod graph_capture;
mod grpcoll;
mod grpcoll_device_meta;
mod grpcoll_reference;
mod grpcoll_stress;
mod leaks;
mod nccl;
mod ops;
mod ops_bounded;
mod overlap;
mod pgl;
mod rank_death;
mod reduce_scatter;
mod rendezvous;
mod roundtrip;
mod sync;
mod watchdog;

use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;

/// This rank's context and suite stream, or an error naming why it has no GPU.
fn gpu(job: &Job) -> anyhow::Result<(Arc<CudaContext>, Arc<CudaStream>)> {
    let g = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
    Ok((g.ctx.clone(), g.stream.clone()))
}

pub use gemm_row_slots::{child as gemm_row_slots_child, CHILD_COMMAND as GEMM_ROW_SLOTS_CHILD};
pub use rank_death::{child as rank_death_child, CHILD_COMMAND as RANK_DEATH_CHILD};
pub use sync::timeout_child as sync_timeout_child;
pub use watchdog::{child as watchdog_child, CHILD_COMMAND as WATCHDOG_CHILD};

/// Every trial, in the order every rank runs them.
pub fn all() -> Vec<Case> {
    let mut cases = rendezvous::cases();
    cases.extend(watchdog::cases());
    cases.extend(rank_death::cases());
    cases.extend(bootstrap::cases());
    cases.extend(roundtrip::cases());
    cases.extend(nccl::cases());
    cases.extend(pgl::cases());
    cases.extend(sync::cases());
    cases.extend(barrier::cases());
    cases.extend(grpcoll::cases());
    cases.extend(collectives::cases());
    cases.extend(gemm::cases());
    cases.extend(gemm_row_slots::cases());
    cases.extend(overlap::cases());
    cases.extend(reduce_scatter::cases());
    cases.extend(graph_capture::cases());
    cases.extend(all_to_all::cases());
    cases.extend(all_to_all_ce::cases());
    cases.extend(fused_reduce_scatter::cases());
    cases.extend(fused_all_reduce::cases());
    cases.extend(fused_all_to_all::cases());
    cases.extend(fused_all_gather::cases());
    cases.extend(auto_choice::cases());
    cases.extend(ops::cases());
    cases.extend(ops_bounded::cases());
    cases.extend(leaks::cases());
    cases
}
