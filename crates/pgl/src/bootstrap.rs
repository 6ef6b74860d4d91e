//! What weft's collective constructors need from a job: this rank, the world, and three
//! collectives of bytes. [`crate::rendezvous::Rendezvous`] (weft's own: authenticated, bounded)
//! implements it; a program that already has MPI, a key-value store or an NCCL communicator of
//! its own implements [`Bootstrap::exchange`] over that and passes it wherever weft asks for
//! `&mut dyn Bootstrap`.
//!
//! What an implementation must guarantee:
//! - it carries CUDA IPC and VMM handles, NCCL unique ids, shapes, plans and choices: deliver
//!   them only to the job's own processes (weft's rendezvous checks a job secret and the peer's
//!   uid; yours must give the same guarantee);
//! - every wait is bounded: an error naming the rank waited for, never a hang;
//! - every rank calls the same collectives in the same order; a rank that is out of step should
//!   make the collective fail (weft's rendezvous numbers and types its collectives), else its
//!   bytes are paired with another step's;
//! - after a collective has failed, every later one fails too (weft's constructors may still
//!   call one to release what a failed step allocated; it must not block).

use anyhow::{ensure, Result};

pub trait Bootstrap {
    /// This rank, below [`Bootstrap::world`].
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// Every rank's `bytes`, indexed by rank (`world` entries, this rank's own included). What
    /// an implementation provides; weft calls it through [`Bootstrap::all_gather`].
    fn exchange(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// [`Bootstrap::exchange`], checked: `world` parts, this rank's own as it sent it. (Not
    /// meant to be overridden: weft indexes the result by rank.)
    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let (rank, world) = (self.rank(), self.world());
        let all = self.exchange(bytes)?;
        ensure!(
            all.len() == world,
            "the bootstrap's exchange returned {} parts for {world} ranks",
            all.len()
        );
        ensure!(
            all[rank] == bytes,
            "the bootstrap's exchange returned another part than rank {rank} sent as its own"
        );
        Ok(all)
    }

    /// Rank `root`'s `bytes` on every rank (`bytes` is ignored on the other ranks). The default
    /// all-gathers (the root's bytes, empty from the others).
    fn broadcast(&mut self, root: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        let world = self.world();
        ensure!(
            root < world,
            "broadcast from root {root}, which is not below world size {world}"
        );
        let own = if self.rank() == root { bytes } else { &[][..] };
        Ok(self.all_gather(own)?.swap_remove(root))
    }

    /// Returns once every rank has called it. The default all-gathers nothing.
    fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::Bootstrap;
    use anyhow::Result;

    /// Rank 1 of 3 whose exchange returns what `reply` makes of its bytes.
    struct Faulty {
        reply: fn(&[u8]) -> Vec<Vec<u8>>,
    }

    impl Bootstrap for Faulty {
        fn rank(&self) -> usize {
            1
        }
        fn world(&self) -> usize {
            3
        }
        fn exchange(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
            Ok((self.reply)(bytes))
        }
    }

    fn err(b: &mut Faulty) -> String {
        match b.all_gather(b"mine") {
            Ok(parts) => panic!("a faulty exchange passed: {parts:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_faulty_exchange_is_refused_not_indexed() {
        let short = |b: &[u8]| vec![b.to_vec(), b.to_vec()];
        assert!(err(&mut Faulty { reply: short }).contains("2 parts for 3 ranks"));
        let long = |b: &[u8]| vec![b.to_vec(); 4];
        assert!(err(&mut Faulty { reply: long }).contains("4 parts for 3 ranks"));
        let swapped = |b: &[u8]| vec![b.to_vec(), Vec::new(), Vec::new()];
        assert!(err(&mut Faulty { reply: swapped }).contains("another part than rank 1 sent"));
        // agree over a short exchange fails instead of missing a refusal.
        let mut b = Faulty { reply: short };
        assert!(crate::agree(&mut b, "a step", Ok(())).is_err());
        // The defaults: broadcast and barrier go through the checked all_gather.
        assert!(b.broadcast(0, b"x").is_err());
        assert!(b.barrier().is_err());
        let good = |b: &[u8]| vec![b"zero".to_vec(), b.to_vec(), b"two".to_vec()];
        let mut b = Faulty { reply: good };
        assert_eq!(b.broadcast(2, b"ignored").unwrap(), b"two");
        assert!(b
            .broadcast(3, b"")
            .unwrap_err()
            .to_string()
            .contains("root 3"));
        assert!(b.barrier().is_ok());
    }

    /// agree_outcome tells a failed exchange from refusals, and hands this rank's error back.
    #[test]
    fn agreement_outcomes_are_told_apart() {
        use crate::{agree_outcome, AgreeError};
        let short = |b: &[u8]| vec![b.to_vec(), b.to_vec()];
        let mut b = Faulty { reply: short };
        assert!(matches!(
            agree_outcome(&mut b, "a step", Ok(())),
            Err(AgreeError::Exchange(_))
        ));
        let peer_refused = |b: &[u8]| vec![b"error: no".to_vec(), b.to_vec(), Vec::new()];
        let mut b = Faulty {
            reply: peer_refused,
        };
        match agree_outcome(&mut b, "a step", Ok(())) {
            Err(AgreeError::Refused { text, local: None }) => {
                assert_eq!(text, "a step failed on 1 of 3 ranks: rank 0: error: no")
            }
            other => panic!("{other:?}"),
        }
        match agree_outcome::<()>(&mut b, "a step", Err(anyhow::anyhow!("mine"))) {
            Err(AgreeError::Refused {
                text,
                local: Some(e),
            }) => {
                assert!(text.contains("rank 0: error: no") && text.contains("rank 1: error: mine"));
                assert_eq!(e.to_string(), "mine");
            }
            other => panic!("{other:?}"),
        }
    }
}
