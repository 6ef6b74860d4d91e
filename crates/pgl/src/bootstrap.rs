//! What weft's collective constructors need from a job: this rank, the world, and three
//! collectives of bytes. [`crate::rendezvous::Rendezvous`] (weft's own: authenticated, bounded)
//! implements it; a program that already has MPI, a key-value store or an NCCL communicator of
//! its own implements it over that and passes it wherever weft asks for `&mut dyn Bootstrap`.
//!
//! What an implementation carries: CUDA IPC and VMM handles, NCCL unique ids, shapes, plans and
//! choices. It must deliver them only to the job's own processes (weft's rendezvous checks a job
//! secret and the peer's uid; yours must give the same guarantee) and bound its waits (an error
//! naming the rank waited for, never a hang). Every rank calls the collectives in the same order.

use anyhow::{ensure, Result};

pub trait Bootstrap {
    /// This rank, below [`Bootstrap::world`].
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// Every rank's `bytes`, indexed by rank (`world` entries, this rank's own included).
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Rank `root`'s `bytes` on every rank (`bytes` is ignored on the other ranks). The default
    /// all-gathers (the root's bytes, empty from the others).
    fn broadcast(&mut self, root: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        let world = self.world();
        ensure!(
            root < world,
            "broadcast from root {root}, which is not below world size {world}"
        );
        let own = if self.rank() == root { bytes } else { &[][..] };
        let mut all = self.all_gather(own)?;
        ensure!(
            all.len() == world,
            "the bootstrap's all_gather returned {} parts for {world} ranks",
            all.len()
        );
        Ok(all.swap_remove(root))
    }

    /// Returns once every rank has called it. The default all-gathers nothing.
    fn barrier(&mut self) -> Result<()> {
        let world = self.world();
        let all = self.all_gather(&[])?;
        ensure!(
            all.len() == world,
            "the bootstrap's all_gather returned {} parts for {world} ranks",
            all.len()
        );
        Ok(())
    }
}
