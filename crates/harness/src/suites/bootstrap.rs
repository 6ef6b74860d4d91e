//! Bring your own bootstrap: weft's constructors take any [`weft_pgl::Bootstrap`]. These trials
//! run a user-style one ([`crate::file_store::FileStore`]: files in a private directory) beside
//! the job's own rendezvous, the independent reference: its collectives must give the rendezvous's
//! results, `agree` over it must name a failing rank, a silent rank must end a collective by its
//! bound, and a PGL exchanged through it must carry every rank's writes.

use super::pgl::{check_pattern, launch_pattern, pattern_cases};
use crate::data::shared_seed;
use crate::file_store::{create_private_dir, FileStore};
use crate::job::Job;
use crate::trials::Case;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Duration;
use weft_pgl::{Backend, Bootstrap, Pgl, Shape};

pub fn cases() -> Vec<Case> {
    vec![
        Case::cpu("bootstrap::file_store::collectives", file_store_collectives),
        Case::cpu("bootstrap::file_store::silent_rank", file_store_silent_rank),
        Case::gpu("bootstrap::file_store::pgl", file_store_pgl),
    ]
}

/// A fresh private directory made by rank 0 (its path sent through the rendezvous), and this
/// rank's file store on it.
fn open_store(job: &mut Job, timeout: Duration) -> anyhow::Result<(PathBuf, FileStore)> {
    let seed = shared_seed(job)?;
    let made = if job.rank() == 0 {
        create_private_dir(
            &std::env::temp_dir(),
            &format!("weft-file-store-{}-{seed:016x}", std::process::id()),
        )
        .map(|d| d.to_string_lossy().into_owned())
    } else {
        Ok(String::new())
    };
    let dir = weft_pgl::agree(&mut job.rdzv, "creating the file store", made)?;
    let dir = PathBuf::from(String::from_utf8(job.rdzv.broadcast(0, dir.as_bytes())?)?);
    let store = FileStore::new(&dir, job.rank(), job.world(), timeout)?;
    Ok((dir, store))
}

/// Removes the store's directory once every rank is done with it.
fn close_store(job: &mut Job, dir: PathBuf, result: anyhow::Result<()>) -> anyhow::Result<()> {
    job.rdzv.barrier()?;
    if job.rank() == 0 {
        std::fs::remove_dir_all(&dir)?;
    }
    result
}

fn file_store_collectives(job: &mut Job) -> anyhow::Result<()> {
    let (dir, mut store) = open_store(job, Duration::from_secs(30))?;
    let (rank, world) = (job.rank(), job.world());
    let seed = shared_seed(job)?;
    let result = (|| -> anyhow::Result<()> {
        let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64 + 1) << 32);
        for round in 0..20 {
            // Lengths differ by rank and round, empty ones included.
            let len = if round % 5 == 0 {
                0
            } else {
                rng.random_range(0..4096)
            };
            let mine: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let got = store.all_gather(&mine)?;
            let want = job.rdzv.all_gather(&mine)?;
            anyhow::ensure!(
                got == want,
                "all_gather #{round} through the file store differs from the rendezvous's"
            );
            let root = round % world;
            let got = Bootstrap::broadcast(&mut store, root, &mine)?;
            let want = job.rdzv.broadcast(root, &mine)?;
            anyhow::ensure!(
                got == want,
                "broadcast #{round} from rank {root} through the file store differs from the rendezvous's"
            );
            Bootstrap::barrier(&mut store)?;
        }
        // A refusal on the last rank reaches every rank, naming it.
        let last = world - 1;
        let local = if rank == last {
            Err(anyhow::anyhow!("planted refusal"))
        } else {
            Ok(())
        };
        match weft_pgl::agree(&mut store, "the planted step", local) {
            Ok(()) => anyhow::bail!("agree over the file store passed a planted refusal"),
            Err(e) => {
                let text = format!("{e:#}");
                anyhow::ensure!(
                    text.contains(&format!("rank {last}")) && text.contains("planted refusal"),
                    "agree over the file store: the error does not name rank {last}'s refusal: {text}"
                );
            }
        }
        Ok(())
    })();
    close_store(job, dir, result)
}

/// Rank 0 skips a collective the others enter: they must end within the bound, naming it.
fn file_store_silent_rank(job: &mut Job) -> anyhow::Result<()> {
    let (dir, mut store) = open_store(job, Duration::from_millis(500))?;
    let result = (|| -> anyhow::Result<()> {
        if job.rank() == 0 || job.world() == 1 {
            return Ok(());
        }
        match store.all_gather(b"hello") {
            Ok(_) => anyhow::bail!("an all_gather without rank 0 returned"),
            Err(e) => {
                let text = format!("{e:#}");
                anyhow::ensure!(
                    text.contains("rank(s) 0 did not write"),
                    "the file store's timeout does not name rank 0: {text}"
                );
                Ok(())
            }
        }
    })();
    close_store(job, dir, result)
}

/// PGLs allocated, exchanged and freed through the file store (process mode, both backends):
/// every rank writes its pattern into every peer's buffer, every rank checks its own.
fn file_store_pgl(job: &mut Job) -> anyhow::Result<()> {
    let (dir, mut store) = open_store(job, Duration::from_secs(60))?;
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world() as u32);
    let (ctx, stream) = super::gpu(job)?;
    let result = (|| -> anyhow::Result<()> {
        for backend in [Backend::Vmm, Backend::Ipc] {
            let cases = pattern_cases(world, &mut StdRng::seed_from_u64(seed));
            for (slice, tr, tc) in cases.into_iter().take(4) {
                let shape = Shape {
                    batch: world,
                    ..slice
                };
                let what = format!(
                    "{} over the file store, shape {shape}, tiles {tr}×{tc}, seed {seed}",
                    backend.name()
                );
                let pgl: Pgl<u32> = Pgl::alloc(&mut store, &ctx, shape, backend)?;
                launch_pattern(&stream, &pgl, tr, tc)?;
                stream.synchronize()?;
                store.barrier()?;
                let checked = check_pattern(&pgl, rank, &what);
                pgl.free(&mut store)?;
                checked?;
            }
        }
        Ok(())
    })();
    close_store(job, dir, result)
}
