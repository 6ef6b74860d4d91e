//! The rendezvous itself, on every rank (CPU only: runs in CI under `weft launch -n 3`).

use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::Case;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub fn cases() -> Vec<Case> {
    vec![
        Case::cpu(
            "rendezvous::all_gather::random_payloads",
            all_gather_random_payloads,
        ),
        Case::cpu("rendezvous::broadcast::every_root", broadcast_every_root),
        Case::cpu("rendezvous::barrier::laps", barrier_laps),
    ]
}

/// Rank r's payload in round k: a length in 0..4096 and bytes, both from (seed, r, k).
fn payload(seed: u64, rank: usize, round: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed ^ ((rank as u64) << 32) ^ round as u64);
    let len = rng.random_range(0..4096);
    (0..len).map(|_| rng.random()).collect()
}

fn all_gather_random_payloads(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    for round in 0..200 {
        let got = job.rdzv.all_gather(&payload(seed, job.rank(), round))?;
        anyhow::ensure!(
            got.len() == job.world(),
            "round {round}: {} parts for world {}",
            got.len(),
            job.world()
        );
        for (r, part) in got.iter().enumerate() {
            anyhow::ensure!(
                *part == payload(seed, r, round),
                "round {round} (seed {seed}): rank {r}'s part differs"
            );
        }
    }
    Ok(())
}

fn broadcast_every_root(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    for root in 0..job.world() {
        let mine = if job.rank() == root {
            payload(seed, root, 1000)
        } else {
            b"ignored on non-roots".to_vec()
        };
        let got = job.rdzv.broadcast(root, &mine)?;
        anyhow::ensure!(
            got == payload(seed, root, 1000),
            "broadcast from rank {root} (seed {seed}) differs"
        );
    }
    Ok(())
}

/// Ranks arrive at each barrier after different random delays; a fast rank must still wait.
fn barrier_laps(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let mut rng = StdRng::seed_from_u64(seed ^ job.rank() as u64);
    for lap in 0..20u64 {
        std::thread::sleep(std::time::Duration::from_micros(rng.random_range(0..3000)));
        job.rdzv.barrier()?;
        // Every rank must be in the same lap: exchange it.
        let laps = job.rdzv.all_gather(&lap.to_le_bytes())?;
        anyhow::ensure!(
            laps.iter().all(|l| *l == lap.to_le_bytes()),
            "lap {lap}: ranks out of step"
        );
    }
    Ok(())
}
