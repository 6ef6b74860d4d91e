//! The wave-group tuner (signal-gemm II, FlashOverlap §4, Alg. 1). Offline, `weft tune` measures
//! a [`TuningProfile`]: NCCL's time per message size for each collective, world size and CTA limit
//! (a densely sampled curve), weft's GEMM per shape and SM margin, cuBLAS per shape, and the
//! restore per byte. Online, [`tune`] predicts every candidate partition's time with the latency
//! model of [`predict`] (no GEMM runs), picks the fastest, and falls back to the sequential path
//! (cuBLAS, then NCCL) when no overlap is predicted to beat it. Shapes not profiled reuse their
//! nearest profiled neighbour (see [`TuningProfile::gemm_wave_ms`]).

mod predict;
mod profile;
mod search;

pub use predict::{predict_overlap, predict_sequential, GroupBytes};
pub use profile::{CommCurve, GemmSample, Op, TuningProfile};
pub use search::{best_overlap, candidates, tune, Choice};
