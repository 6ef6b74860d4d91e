//! weft-collectives: standalone AllReduce, ReduceScatter and AllGather over peer memory, built from
//! weft's primitives (a staging [`weft_pgl::Pgl`] and `weft_sync` flags), in the manner of
//! ParallelKittens' Appendix B and the one-shot all-reduces of inference engines.
//!
//! - [`Collectives`]: one rank's staging, flags and kernels; `all_reduce`, `all_reduce_in_place`,
//!   `reduce_scatter`, `all_gather` on the caller's device buffers, on one stream.
//! - [`Options`]: staging slot size, blocks, the AllReduce path ([`AllReduceChoice`]).
//! - [`geometry`]: how a call is cut into rounds and blocks (pure, the same on every rank).
//!
//! The kernels (`kernels/collectives/collectives.cu`) push data into the receivers' staging slots
//! and publish a round number per block; the receiver's block of the same index waits for it
//! (bounded), then sums or copies locally. See README.md.

mod collectives;
mod element;
mod error;
pub mod geometry;
mod options;

pub use collectives::Collectives;
pub use element::CollectiveElement;
pub use error::CollectiveError;
pub use geometry::{Algorithm, AllReduceChoice, Geometry, Protocol};
pub use options::{Options, ENV_VARS};
