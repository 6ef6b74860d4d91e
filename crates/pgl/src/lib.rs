//! weft-pgl: parallel global layouts over peer GPU memory, and the rank runtime every weft crate
//! and the `weft` harness share.
//!
//! Rank runtime (one process per GPU is the main mode):
//! - [`rank_env`]: rank, world size, local rank and a job id from the launcher's variables
//!   (Open MPI, MPICH/Hydra, Slurm, torchrun, `weft launch`).
//! - [`rendezvous`]: rank 0 listens, the others connect; broadcast, all-gather of bytes and a
//!   barrier, each bounded by a timeout that names the rank that did not answer.
//! - [`launch`]: `weft launch -n N -- CMD…` — N local ranks, stopped together on failure.
//! - [`gpu`]: which GPU a rank drives, and whether any GPU is usable at all.
//! - [`nccl`]: NCCL communicators created through the rendezvous.

pub mod gpu;
pub mod launch;
pub mod nccl;
pub mod rank_env;
pub mod rendezvous;
