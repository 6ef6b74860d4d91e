//! Overlap as one call: one op per collective — [`GemmAllReduce`], [`GemmReduceScatter`],
//! [`AllGatherGemm`], [`GemmAllToAll`] — each planned once per (shape, dtypes, layouts, world) and launched many
//! times, with every method of the workspace behind it ([`Method`]) and [`MethodChoice::Auto`]
//! choosing the fastest for the shape.
//!
//! ```text
//! let mut env = OverlapEnv::new(&mut rdzv, &ctx)?;                       // per rank, collective
//! let mut op = GemmReduceScatter::<bf16>::plan(&mut rdzv, &mut env, &stream, shape,
//!                                              GemmOptions::default(), &MethodChoice::Auto, false)?;
//! op.launch(&stream, &a, &b)?;                                            // many times
//! let rows = op.output();                                                 // m/world × n
//! ```
//!
//! - Which seed's design each method is: [`Method`]'s variants say.
//! - `Auto` (and a family without parameters, e.g. `signal`) ranks the candidates
//!   ([`candidates`]): times from the [`ChoiceCache`] when it holds them for this key
//!   ([`ChoiceKey`]: op, the range of M, N, K, dtypes, B layout, capturability, world, machine,
//!   weft version), else measured collectively at first use ([`rank_candidates`]: slowest rank
//!   decides, a method refused anywhere is excluded everywhere, the sequential paths always
//!   measured, the rest within [`AutoPolicy::budget`]). The report says what was chosen, from what,
//!   and what the first use cost ([`ChoiceReport`]).
//! - Graph capture: plan with `capturable = true` to keep to methods a replay can run; the fused
//!   methods refuse a capture.

mod all_gather;
mod all_reduce;
mod all_to_all;
mod buffer;
mod cache;
mod candidates;
mod choice;
mod choose;
mod common;
mod env;
mod inputs;
mod key;
mod method;
mod reduce_scatter;

pub use all_gather::AllGatherGemm;
pub use all_reduce::GemmAllReduce;
pub use all_to_all::GemmAllToAll;
pub use buffer::OpBuffer;
pub use cache::{ChoiceCache, Entry, Outcome, CACHE_VAR};
pub use candidates::{
    candidates, groupings, OpKind, DECOMPOSITION_CHUNKS, FUSED_COUNTS, SIGNAL_MARGINS,
};
pub use choice::ChoiceReport;
pub use choose::{
    rank_candidates, rank_candidates_predicted, AutoPolicy, Ranking, DEFAULT_BUDGET_S,
    SEQUENTIAL_PREFERENCE,
};
pub use common::OpElement;
pub use env::{OverlapEnv, SharedComm, TUNING_VAR};
pub use key::{m_range, machine_fingerprint, weft_version, ChoiceKey};
pub use method::{Family, Method, MethodChoice};
pub use reduce_scatter::GemmReduceScatter;
