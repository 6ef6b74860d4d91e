//! Fused peer-memory overlap (signal-gemm III): communication issued by the GEMM kernel itself,
//! into other GPUs' memory, instead of NCCL calls on a second stream.
//!
//! - [`FusedReduceScatter`]: GEMM + ReduceScatter inside one kernel (ParallelKittens' intra-SM
//!   method): each finished tile is reduce-added by TMA into the rank that owns its rows.

mod reduce_scatter;

pub use reduce_scatter::FusedReduceScatter;
