//! weft-signal-gemm: a persistent, warp-specialized Hopper GEMM (TMA loads into a multi-stage
//! mbarrier pipeline, wgmma consumers with register reallocation, TMA-store epilogue) written as
//! a template of roles — loader, consumer, storer, communicator (kernels/include/weft/gemm/) — so
//! signalling epilogues and communicators plug in without copying the main loop.
//!
//! - [`GemmPlan`]: shape, dtypes, B layout, `sm_margin`, validated once, with the tile shape and
//!   the schedule ([`GemmPlan::schedule`]: every tile's order and wave, from the kernel's own
//!   scheduler function in kernels/include/weft/abi/gemm.h).
//! - [`Gemm`]: the plan's kernel loaded on a context; `launch` on a stream, `launch_with` for
//!   per-tile flags ([`TileFlags`]), the test communicator's copy, a trace, a start/end
//!   timeline, or early release after a `weft_barrier::KernelBarrier` wait. With
//!   [`Scheduling::Dynamic`] CTAs claim tiles from a counter the `Gemm` owns. With split-K
//!   ([`KSplits`], chosen from the shape by default) a plain launch cuts each tile's K over
//!   several CTAs, whose fp32 partials the `Gemm` holds.
//! - [`fused::FusedReduceScatter`]: GEMM + ReduceScatter in one kernel, tiles reduce-added by
//!   TMA into their owners' memory (signal-gemm III).
//! - [`ops`]: overlap as one call — GEMM + AllReduce, GEMM + ReduceScatter and AllGather + GEMM,
//!   each with every method behind it and `Auto` choosing per shape (measured at first use, cached).
//! - [`CublasGemm`]: the cuBLAS baseline of the same operation; [`reference`]: float64 CPU
//!   reference and tolerances.

mod a2a_map;
mod band_map;
mod cublas;
mod dtype;
mod error;
pub mod fused;
mod gemm;
mod kernel_choice;
pub mod ops;
pub mod overlap;
mod plan;
pub mod reference;
mod reorder;
mod row_gather;
mod schedule;
mod tensor_map;
pub mod timing;
pub mod tuner;
mod wave_groups;

pub use a2a_map::AllToAllMap;
pub use band_map::RankBandMap;
pub use cublas::CublasGemm;
pub use dtype::{Dtype, GemmElement};
pub use error::GemmError;
pub use gemm::{
    device_sms, AllGatherSource, AllReduceTarget, Gemm, LaunchExtras, PeerReduceTarget,
    RowSlotTable, TileFlags, SIGNALS_PER_TILE,
};
pub use plan::{
    BLayout, EpilogueChoice, FusionSet, GemmOptions, GemmPlan, GemmShape, KSplits, Scheduling,
    TileChoice,
};
pub use reorder::{OutputLayout, Restore, TileOrderMap, MAX_BAND_RANKS};
pub use row_gather::RowGather;
pub use schedule::ScheduledTile;
pub use wave_groups::{GroupCounters, WaveGroups};
