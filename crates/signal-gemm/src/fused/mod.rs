//! Fused peer-memory overlap (signal-gemm III): communication issued by the GEMM kernel itself,
//! into other GPUs' memory, instead of NCCL calls on a second stream.
//!
//! - [`FusedReduceScatter`]: GEMM + ReduceScatter inside one kernel (ParallelKittens' intra-SM
//!   method): each finished tile is reduce-added by TMA into the rank that owns its rows.
//! - [`FusedAllReduce`]: GEMM + AllReduce by tile flags: each tile's owner sums every rank's
//!   partial with peer loads and writes the sum to every rank, in the GEMM's communicator CTAs
//!   ([`AllReduceMethod::Inter`], ParallelKittens' inter-SM method) or in a kernel of its own on
//!   a second stream ([`AllReduceMethod::DistFuse`]).
//! - [`FusedAllGatherGemm`]: AllGather + GEMM, each rank starting on its own shard, the loader
//!   reading each peer's A tile by TMA from the rank that holds it ([`AllGatherMethod::Intra`]),
//!   or from a local copy the GEMM's communicator CTAs gather chunk by chunk
//!   ([`AllGatherMethod::Inter`]), or that copy engines gather on a side stream while every SM
//!   computes ([`AllGatherMethod::CopyEngine`]).
//!
//! - [`FusedAllToAll`]: GEMM + All-to-All, the epilogue storing each row into its destination's
//!   output through peer memory (DeepEP's intranode dispatch, written by the GEMM itself).
//!
//! Their CTA counts, and whether they beat the other methods at a shape, are chosen by the ops of
//! [`crate::ops`] (`Auto`).

mod ag_copy_engine;
mod all_gather;
mod all_reduce;
mod all_to_all;
mod collective_plan;
mod reduce_scatter;

pub(crate) use ag_copy_engine::k_chunks_fit;
pub use all_gather::{AllGatherMethod, FusedAllGatherGemm};
pub use all_reduce::{AllReduceMethod, FusedAllReduce};
pub use all_to_all::FusedAllToAll;
pub use reduce_scatter::FusedReduceScatter;
