//! GEMM + NCCL overlap by signalling (signal-gemm II, FlashOverlap §3): the GEMM's epilogue
//! stores each tile in the layout the collective wants and signals its wave group; a
//! high-priority communication stream waits for each group (a 1-thread wait kernel) and runs the
//! collective on that group's contiguous range while the GEMM computes the next waves.

mod all_reduce;
mod all_to_all;
mod all_to_all_ce;
mod comm_stream;
mod pipeline;
mod reduce_scatter;

pub use all_reduce::AllReduceOverlap;
pub use all_to_all::AllToAllOverlap;
pub use all_to_all_ce::{AllToAllCopyEngine, COPY_ENGINE_SM_MARGIN};
pub use comm_stream::high_priority_stream;
pub use reduce_scatter::ReduceScatterOverlap;
