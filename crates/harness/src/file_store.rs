//! A bootstrap of a user's kind ([`weft_pgl::Bootstrap`]) for the trials: the ranks of one host
//! exchange their bytes through files in a private directory, as a program with a shared
//! filesystem store (PyTorch's FileStore) might. Collective #n: each rank writes `n.<rank>`
//! (a temporary file renamed into place, so readers never see a partial one), then reads every
//! rank's file, polling until the bound and then naming the ranks that did not write.
//!
//! Trust: the directory must be this user's and closed to everyone else (mode 0700), the
//! guarantee weft's own rendezvous gives with its job secret and uid check. After a failure every
//! later collective fails at once. Unlike weft's rendezvous it cannot tell a rank that is out of
//! step (one that skipped a collective meets the others' next one).

use anyhow::{bail, ensure, Context, Result};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weft_pgl::Bootstrap;

pub struct FileStore {
    dir: PathBuf,
    rank: usize,
    world: usize,
    /// The next collective's number.
    seq: u64,
    timeout: Duration,
    /// The first failure; later collectives return it.
    failed: Option<String>,
}

/// Creates a new directory for a file store under `parent`, closed to other users.
pub fn create_private_dir(parent: &Path, name: &str) -> Result<PathBuf> {
    let dir = parent.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating the file store {}", dir.display()))?;
    Ok(dir)
}

impl FileStore {
    /// Rank `rank` of `world` on `dir`, which must exist, belong to this user and be closed to
    /// others; each collective waits at most `timeout` for the other ranks.
    pub fn new(dir: &Path, rank: usize, world: usize, timeout: Duration) -> Result<Self> {
        ensure!(
            rank < world,
            "file store: rank {rank} is not below world {world}"
        );
        let meta = std::fs::metadata(dir)
            .with_context(|| format!("file store directory {}", dir.display()))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        ensure!(
            meta.is_dir() && meta.uid() == me && meta.permissions().mode() & 0o077 == 0,
            "file store: {} must be a directory of uid {me} closed to other users (it is uid {}, mode {:o})",
            dir.display(),
            meta.uid(),
            meta.permissions().mode() & 0o7777
        );
        Ok(Self {
            dir: dir.to_path_buf(),
            rank,
            world,
            seq: 0,
            timeout,
            failed: None,
        })
    }

    fn file(&self, seq: u64, rank: usize) -> PathBuf {
        self.dir.join(format!("{seq}.{rank}"))
    }
}

impl Bootstrap for FileStore {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn exchange(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        if let Some(why) = &self.failed {
            bail!("file store: an earlier collective failed: {why}");
        }
        let result = self.exchange_once(bytes);
        if let Err(e) = &result {
            self.failed = Some(format!("{e:#}"));
        }
        result
    }
}

impl FileStore {
    fn exchange_once(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.seq;
        self.seq += 1;
        // Every rank has read collective #seq − 2 before writing #seq − 1, which this rank has
        // read: its own file of #seq − 2 is no longer needed.
        if seq >= 2 {
            let old = self.file(seq - 2, self.rank);
            std::fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
        }
        let tmp = self.dir.join(format!("{seq}.{}.tmp", self.rank));
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.file(seq, self.rank))
            .with_context(|| format!("publishing {}", tmp.display()))?;
        let deadline = Instant::now() + self.timeout;
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; self.world];
        let mut pause = Duration::from_micros(200);
        loop {
            for (r, part) in parts.iter_mut().enumerate().filter(|(_, p)| p.is_none()) {
                match std::fs::read(self.file(seq, r)) {
                    Ok(b) => *part = Some(b),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        bail!("file store: reading rank {r}'s part of collective #{seq}: {e}")
                    }
                }
            }
            if parts.iter().all(Option::is_some) {
                return Ok(parts.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline {
                let missing: Vec<String> = parts
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                bail!(
                    "file store {}: rank(s) {} did not write collective #{seq} within {:?}",
                    self.dir.display(),
                    missing.join(", "),
                    self.timeout
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}
