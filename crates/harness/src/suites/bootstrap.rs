//! Bring your own bootstrap: weft's constructors take any [`weft_pgl::Bootstrap`]. These trials
//! run a user-style one ([`crate::file_store::FileStore`]: files in a private directory) beside
//! the job's own rendezvous, the independent reference: its collectives must give the rendezvous's
//! results, `agree` over it must name a failing rank, a silent rank must end a collective by its
//! bound, and a PGL exchanged through it must carry every rank's writes.

use super::pgl::pattern_exchange;
use crate::data::shared_seed;
use crate::file_store::{create_private_dir, FileStore};
use crate::job::Job;
use crate::trials::Case;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Duration;
use weft_pgl::{Backend, Bootstrap};

pub fn cases() -> Vec<Case> {
    vec![
        Case::cpu("bootstrap::file_store::collectives", file_store_collectives),
        Case::cpu("bootstrap::file_store::silent_rank", file_store_silent_rank),
        Case::gpu("bootstrap::file_store::pgl", file_store_pgl),
    ]
}

/// A fresh private directory made by rank 0 (a random name, its path sent through the
/// rendezvous), and this rank's file store on it; every step agreed, so a rank that cannot open
/// it fails the trial on every rank.
fn open_store(job: &mut Job, timeout: Duration) -> anyhow::Result<(PathBuf, FileStore)> {
    let made = if job.rank() == 0 {
        let name = format!("weft-file-store-{:016x}", rand::random::<u64>());
        create_private_dir(&std::env::temp_dir(), &name).map(|d| d.to_string_lossy().into_owned())
    } else {
        Ok(String::new())
    };
    let dir = weft_pgl::agree(&mut job.rdzv, "creating the file store", made)?;
    let dir = PathBuf::from(String::from_utf8(job.rdzv.broadcast(0, dir.as_bytes())?)?);
    let opened = FileStore::new(&dir, job.rank(), job.world(), timeout);
    match weft_pgl::agree(&mut job.rdzv, "opening the file store", opened) {
        Ok(store) => Ok((dir, store)),
        Err(e) => {
            if job.rank() == 0 {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Err(e)
        }
    }
}

/// Ends a trial on every rank alike (its outcome agreed through the rendezvous, so no rank
/// leaves early), then removes the store's directory.
fn close_store(job: &mut Job, dir: PathBuf, result: anyhow::Result<()>) -> anyhow::Result<()> {
    let agreed = weft_pgl::agree(&mut job.rdzv, "the file store trial", result);
    if job.rank() == 0 {
        std::fs::remove_dir_all(&dir)?;
    }
    agreed
}

fn file_store_collectives(job: &mut Job) -> anyhow::Result<()> {
    let (dir, mut store) = open_store(job, Duration::from_secs(30))?;
    let (rank, world) = (job.rank(), job.world());
    let seed = shared_seed(job)?;
    // The rendezvous's calls run in step on every rank; the file store's failures are noted and
    // the trial goes on, so a rank that sees one does not leave the others behind.
    let mut errors: Vec<String> = Vec::new();
    // `wrong`: what it means when the check comes out false.
    let mut check = |wrong: String, got: anyhow::Result<bool>| match got {
        Ok(true) => {}
        Ok(false) => errors.push(wrong),
        Err(e) => errors.push(format!("the file store failed: {e:#}")),
    };
    let mut rng = StdRng::seed_from_u64(seed ^ ((rank as u64 + 1) << 32));
    for round in 0..20 {
        // Lengths differ by rank and round, empty ones included.
        let len = if round % 5 == 0 {
            0
        } else {
            rng.random_range(0..4096)
        };
        let mine: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let got = store.all_gather(&mine);
        let want = job.rdzv.all_gather(&mine)?;
        check(
            format!("all_gather #{round} through the file store differs from the rendezvous's"),
            got.map(|g| g == want),
        );
        let root = round % world;
        let got = Bootstrap::broadcast(&mut store, root, &mine);
        let want = job.rdzv.broadcast(root, &mine)?;
        check(
            format!("broadcast #{round} from rank {root} differs from the rendezvous's"),
            got.map(|g| g == want),
        );
        check(String::new(), Bootstrap::barrier(&mut store).map(|()| true));
    }
    // The barrier holds every rank until the last arrives: the last rank comes 300 ms late.
    job.rdzv.barrier()?;
    let start = std::time::Instant::now();
    if rank == world - 1 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let held = Bootstrap::barrier(&mut store)
        .map(|()| world == 1 || rank == world - 1 || start.elapsed() >= Duration::from_millis(250));
    check(
        format!(
            "the barrier returned before rank {} (300 ms late) arrived",
            world - 1
        ),
        held,
    );
    // A refusal on the last rank reaches every rank, naming it.
    let last = world - 1;
    let local = if rank == last {
        Err(anyhow::anyhow!("planted refusal"))
    } else {
        Ok(())
    };
    let named = match weft_pgl::agree(&mut store, "the planted step", local) {
        Ok(()) => Ok(false),
        Err(e) => {
            let text = format!("{e:#}");
            Ok(text.contains(&format!("rank {last}")) && text.contains("planted refusal"))
        }
    };
    check(
        format!("agree over the file store passed or did not name rank {last}'s planted refusal"),
        named,
    );
    let result = match errors.len() {
        0 => Ok(()),
        n => Err(anyhow::anyhow!("{n} failures, the first: {}", errors[0])),
    };
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
                // Rank 0 among the ranks named (another may be late too on a busy machine).
                let text = format!("{e:#}");
                let named = text
                    .split("rank(s) ")
                    .nth(1)
                    .and_then(|t| t.split(" did not write").next())
                    .is_some_and(|list| list.split(", ").any(|r| r == "0"));
                anyhow::ensure!(
                    named,
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
    let (ctx, stream) = super::gpu(job)?;
    let seed = shared_seed(job)?;
    let (dir, mut store) = open_store(job, Duration::from_secs(60))?;
    let result = [Backend::Vmm, Backend::Ipc]
        .into_iter()
        .try_for_each(|backend| {
            pattern_exchange(
                &mut store,
                &ctx,
                &stream,
                backend,
                seed,
                4,
                "over the file store",
            )
        });
    close_store(job, dir, result)
}
