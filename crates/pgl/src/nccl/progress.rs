//! Where a communicator's ranks on one host post how far they are, so that a rank whose wait
//! ran out of budget can name the peer it waits for: one whose process has exited, or one that
//! has not made the call yet. NCCL itself cannot say which peer is missing.
//!
//! The board is a small file in the user's private runtime directory (`<runtime dir>/weft-<uid>`,
//! as the rendezvous socket), named after the communicator's unique id and mapped shared by every
//! rank of that communicator on the host: per rank its process id and the number of collective
//! collective calls it has made on the communicator (every rank makes the same collectives in the
//! same order, so the counts compare; point-to-point calls, whose count differs from rank to rank,
//! are not counted). Each rank writes only its own slot. Ranks on other hosts map their own host's
//! board and are reported as not seen; a rank in another pid namespace (another container) is not
//! checked for having exited. Every rank removes the file once the communicator is made (every
//! rank mapped it before joining), and on its way out; the mappings outlive it. The file is
//! allocated (not sparse), so a full filesystem fails the open, not a later store.

use sha2::{Digest, Sha256};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Words per rank: process id, calls made, pid namespace (the inode of /proc/self/ns/pid; 0 where
/// it cannot be read).
const SLOT_WORDS: usize = 3;

pub(super) struct ProgressBoard {
    words: *mut AtomicU64,
    len: usize,
    rank: usize,
    world: usize,
    path: PathBuf,
}

// SAFETY: the mapping is shared memory accessed only through atomics; the board moves with its
// communicator (which is Send, not Sync).
unsafe impl Send for ProgressBoard {}

/// What the board says about one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Peer {
    /// Its slot was never written: another host, or it never reached the communicator.
    NotSeen,
    /// Its process no longer exists.
    Exited { pid: u32 },
    /// Alive (or in another pid namespace, where that cannot be checked), with this many calls
    /// made on the communicator.
    Made { pid: u32, calls: u64 },
}

impl ProgressBoard {
    /// The board of the communicator with unique id `id` in `dir` (created if this rank is the
    /// first on the host to open it), with this rank's slot written.
    pub(super) fn open(dir: &Path, id: &[u8], rank: usize, world: usize) -> io::Result<Self> {
        let digest = Sha256::digest(id);
        let name: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join(format!("weft-nccl-{name}.board"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)?;
        let len = world * SLOT_WORDS * 8;
        // Every rank allocates the same length (blocks, not a hole: a store into a hole of a full
        // filesystem would kill the process with SIGBUS).
        // SAFETY: a valid descriptor; offset 0 and a positive length.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        // SAFETY: a shared read-write mapping of `len` bytes of a file at least that long; the
        // file may be closed afterwards (the mapping keeps it).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let board = Self {
            words: p.cast::<AtomicU64>(),
            len,
            rank,
            world,
            path,
        };
        board.word(rank, 1).store(0, Ordering::Relaxed);
        board
            .word(rank, 2)
            .store(pid_namespace(), Ordering::Relaxed);
        board
            .word(rank, 0)
            .store(u64::from(std::process::id()), Ordering::Release);
        Ok(board)
    }

    fn word(&self, rank: usize, i: usize) -> &AtomicU64 {
        assert!(rank < self.world && i < SLOT_WORDS);
        // SAFETY: inside the mapping (rank < world, i < SLOT_WORDS), 8-byte aligned (mmap is
        // page-aligned), and only ever accessed atomically.
        unsafe { &*self.words.add(rank * SLOT_WORDS + i) }
    }

    /// Removes the file (the mappings stay): once every rank has mapped it, or on the way out.
    pub(super) fn unlink(&self) {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                log::debug!(
                    "removing the NCCL progress board {}: {e}",
                    self.path.display()
                )
            }
            _ => {}
        }
    }

    /// One more collective call made by this rank.
    pub(super) fn count_call(&self) {
        self.word(self.rank, 1).fetch_add(1, Ordering::Release);
    }

    /// This rank's calls made.
    pub(super) fn calls(&self) -> u64 {
        self.word(self.rank, 1).load(Ordering::Relaxed)
    }

    /// What the board says about `rank`.
    pub(super) fn peer(&self, rank: usize) -> Peer {
        let pid = self.word(rank, 0).load(Ordering::Acquire);
        if pid == 0 {
            return Peer::NotSeen;
        }
        let pid = pid as u32;
        let ns = self.word(rank, 2).load(Ordering::Relaxed);
        if ns == pid_namespace() && ns != 0 && !process_exists(pid) {
            return Peer::Exited { pid };
        }
        Peer::Made {
            pid,
            calls: self.word(rank, 1).load(Ordering::Acquire),
        }
    }

    /// The peers a wait of this rank is probably held up by, in words: those that exited or have
    /// made fewer calls than this rank; empty when every peer on this host is level or ahead.
    pub(super) fn diagnose(&self) -> String {
        let mine = self.calls();
        let mut gone = Vec::new();
        let mut behind = Vec::new();
        let mut unseen = Vec::new();
        for r in (0..self.world).filter(|&r| r != self.rank) {
            match self.peer(r) {
                Peer::NotSeen => unseen.push(format!("{r}")),
                Peer::Exited { pid } => gone.push(format!("rank {r} (pid {pid}) has exited")),
                Peer::Made { pid, calls } if calls < mine => behind.push(format!(
                    "rank {r} (pid {pid}) has made {calls} calls on this communicator, this rank {mine}"
                )),
                Peer::Made { .. } => {}
            }
        }
        let mut parts = gone;
        parts.extend(behind);
        if parts.is_empty() {
            parts.push(format!(
                "every peer on this host has made this rank's {mine} calls or more"
            ));
        }
        if !unseen.is_empty() {
            parts.push(format!(
                "rank(s) {} not seen on this host's board",
                unseen.join(", ")
            ));
        }
        parts.join("; ")
    }
}

impl Drop for ProgressBoard {
    fn drop(&mut self) {
        self.unlink(); // a communicator that failed to join leaves no file behind either
                       // SAFETY: the mapping made in open, unmapped once.
        unsafe { libc::munmap(self.words.cast(), self.len) };
    }
}

/// This process's pid namespace (the inode of /proc/self/ns/pid), 0 where it cannot be read:
/// pids compare only within one namespace.
fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Whether a process with this id exists (kill with signal 0: no signal is sent).
fn process_exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-board-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn ranks_see_each_others_calls_and_who_is_behind() {
        let d = dir();
        let id = [7u8; 128];
        let r0 = ProgressBoard::open(&d, &id, 0, 3).unwrap();
        let r1 = ProgressBoard::open(&d, &id, 1, 3).unwrap();
        for _ in 0..3 {
            r0.count_call();
        }
        r1.count_call();
        assert_eq!(r0.calls(), 3);
        let me = std::process::id();
        assert_eq!(r0.peer(1), Peer::Made { pid: me, calls: 1 });
        assert_eq!(r0.peer(2), Peer::NotSeen);
        let text = r0.diagnose();
        assert!(
            text.contains(&format!(
                "rank 1 (pid {me}) has made 1 calls on this communicator, this rank 3"
            )) && text.contains("rank(s) 2 not seen"),
            "{text}"
        );
        // Rank 1 is ahead of nobody: nothing holds it up on this host but the unseen rank 2.
        let text = r1.diagnose();
        assert!(text.starts_with("every peer on this host"), "{text}");
        // Another communicator's board is another file: rank 0 of it never wrote its slot.
        let other = ProgressBoard::open(&d, &[8u8; 128], 1, 3).unwrap();
        assert_eq!(other.peer(0), Peer::NotSeen);
        r0.unlink();
        assert!(!r0.path.exists());
        r1.count_call(); // the mappings outlive the file
        assert_eq!(r0.peer(1), Peer::Made { pid: me, calls: 2 });
        other.unlink();
        let _ = std::fs::remove_dir(&d);
    }

    #[test]
    fn a_peer_whose_process_exited_is_named() {
        let d = dir();
        let id = [9u8; 128];
        let r0 = ProgressBoard::open(&d, &id, 0, 2).unwrap();
        let r1 = ProgressBoard::open(&d, &id, 1, 2).unwrap();
        // A process that has surely exited: a child reaped before its id is posted.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        r1.word(1, 0).store(u64::from(pid), Ordering::Release);
        assert_eq!(r0.peer(1), Peer::Exited { pid });
        let text = r0.diagnose();
        assert!(
            text.starts_with(&format!("rank 1 (pid {pid}) has exited")),
            "{text}"
        );
        r0.unlink();
        let _ = std::fs::remove_dir(&d);
    }
}
