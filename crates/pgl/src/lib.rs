//! weft-pgl: parallel global layouts over peer GPU memory, and the rank runtime every weft crate
//! and the `weft` harness share.
//!
//! Parallel global layouts (the seed's PGL):
//! - [`Pgl`]: a buffer of one [`Shape`] on every rank, each peer's buffer mapped into this
//!   process, and the plain-old-data view (`weft_pgl_view`, `kernels/include/weft/abi/pgl.h`) that
//!   kernels take by value. Collective allocation and free in process mode; [`PglGroup`] for one
//!   process driving several GPUs. Backends: [`Backend::Vmm`] (default) and [`Backend::Ipc`].
//! - [`shape`]: shapes and tile coordinates, one C definition shared with the kernels.
//! - [`multicast`]: NVLink multicast behind an explicit opt-in, refused where forbidden.
//!
//! Rank runtime (one process per GPU is the main mode):
//! - [`rank_env`]: rank, world size, local rank and a job id from the launcher's variables.
//! - [`Bootstrap`]: what every collective constructor takes — rank, world, all-gather, broadcast
//!   and barrier of bytes; bring your own (MPI, a key-value store, …) or use [`rendezvous`].
//! - [`rendezvous`]: rank 0 listens, the others connect; broadcast, all-gather and barrier of
//!   bytes, each bounded by a timeout that names the rank that did not answer.
//! - [`gpu`]: which GPU a rank drives, and whether any GPU is usable at all.
//! - [`nccl`]: NCCL communicators created through the rendezvous.

mod agree;
mod backend;
mod bootstrap;
mod driver;
mod element;
mod error;
mod group;
mod host_copy;
mod ipc;
mod pgl;
mod vmm;

pub mod gpu;
pub mod job_secret;
pub mod multicast;
pub mod nccl;
mod nccl_budget;
pub mod rank_env;
pub mod rendezvous;
pub mod shape;
mod socket_trust;

pub use agree::{agree, agree_outcome, AgreeError};
pub use backend::Backend;
pub use bootstrap::Bootstrap;
pub use element::{DType, PglElement};
pub use error::{NcclFailure, PglError, RendezvousFailure};
pub use group::{enable_peer_access, PglGroup};
pub use pgl::Pgl;
pub use shape::{Shape, TileCoord, TileGrid};
