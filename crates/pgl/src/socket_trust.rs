//! Who may reach the rendezvous's Unix socket: it lives in a directory only this user can enter
//! (`<runtime dir>/weft-<uid>`, mode 0700, owned by the user, not a symlink), and both ends of
//! every connection check that the other process runs as the same user (SO_PEERCRED). A process
//! of another user can neither bind the socket first nor connect to it; one that connects anyway
//! (root) is dropped by rank 0 like any stranger, and the job carries on.

use anyhow::{bail, Context, Result};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// This process's user id.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `<base>/weft-<uid>`, created 0700 if missing; an existing one must be a directory (not a
/// symlink) owned by this user that nobody else can enter, or it is refused by name.
pub fn private_dir_in(base: &Path) -> Result<PathBuf> {
    let me = uid();
    let dir = base.join(format!("weft-{me}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {} // another rank, or an earlier job
        Err(e) => {
            return Err(e)
                .with_context(|| format!("creating the rendezvous directory {}", dir.display()))
        }
    }
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("reading the rendezvous directory {}", dir.display()))?;
    if !meta.file_type().is_dir() {
        bail!(
            "the rendezvous directory {} is not a directory (a symlink or file put there by someone else?)",
            dir.display()
        );
    }
    if meta.uid() != me {
        bail!(
            "the rendezvous directory {} belongs to uid {}, not to this user (uid {me}): refusing to use it",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        bail!(
            "the rendezvous directory {} has mode {:o}: others could reach the socket; make it 0700 or remove it",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    Ok(dir)
}

/// The user id of the process at the other end of `stream`.
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid out-parameters of the sizes given; the fd is open.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Ok when the peer runs as this user; else PermissionDenied naming its uid.
pub fn require_same_user(stream: &UnixStream) -> io::Result<()> {
    let theirs = peer_uid(stream)?;
    if theirs == uid() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the rendezvous peer runs as uid {theirs}, this job as uid {}",
                uid()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp_base(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-trust-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_directory_is_made_private_and_reused() {
        let base = temp_base("made");
        let dir = private_dir_in(&base).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(private_dir_in(&base).unwrap(), dir); // a second rank finds it
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn an_open_directory_or_a_symlink_is_refused() {
        let base = temp_base("open");
        let dir = base.join(format!("weft-{}", uid()));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir_in(&base).unwrap_err().to_string();
        assert!(e.contains("has mode 777"), "{e}");
        std::fs::remove_dir(&dir).unwrap();
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let e = private_dir_in(&base).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_peer_of_this_user_passes() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(peer_uid(&a).unwrap(), uid());
        require_same_user(&b).unwrap();
    }

    /// Runs `f` on a new thread whose real and effective user are `user` (the raw setresuid
    /// system call changes only the calling thread on Linux; the saved uid stays 0, so the thread
    /// can change back, which it does before it ends).
    fn on_thread_as<T: Send + 'static>(user: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            // setresuid's "leave unchanged" is (uid_t) -1; the variadic call takes longs.
            let keep = libc::c_long::from(u32::MAX);
            let id = libc::c_long::from(user);
            // SAFETY: the raw system call on this thread's own credentials.
            let r = unsafe { libc::syscall(libc::SYS_setresuid, id, id, keep) };
            assert_eq!(
                r,
                0,
                "setresuid to uid {user}: {}",
                io::Error::last_os_error()
            );
            let out = f();
            let root: libc::c_long = 0;
            // SAFETY: as above; the saved uid 0 allows the way back.
            let r = unsafe { libc::syscall(libc::SYS_setresuid, root, root, keep) };
            assert_eq!(r, 0, "setresuid back to 0: {}", io::Error::last_os_error());
            out
        })
        .join()
        .unwrap()
    }

    /// A process of another user is refused at both ends: the peer a listener accepts, and the
    /// listener a connector reaches (here in an open directory, so that only the check stands
    /// between them). The other user is a thread of this test running as `nobody`: that needs
    /// root (CAP_SETUID), which the CI container and the GPU machines have; elsewhere the test
    /// says so and checks nothing.
    #[test]
    fn a_peer_of_another_user_is_refused() {
        use std::os::unix::net::UnixListener;
        if uid() != 0 {
            eprintln!("a_peer_of_another_user_is_refused: needs root to run a thread as another user; not checked");
            return;
        }
        const NOBODY: u32 = 65534;
        let base = temp_base("other");
        let open = std::fs::Permissions::from_mode(0o777);
        std::fs::set_permissions(&base, open.clone()).unwrap();
        let refused = |s: &UnixStream| {
            let e = require_same_user(s).expect_err("a peer of another user passed");
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert!(
                e.to_string().contains(&format!("runs as uid {NOBODY}")),
                "{e}"
            );
        };
        // The other user connects to this user's listener.
        let ours = base.join("ours.sock");
        let listener = UnixListener::bind(&ours).unwrap();
        std::fs::set_permissions(&ours, open.clone()).unwrap();
        let theirs = on_thread_as(NOBODY, move || UnixStream::connect(&ours).unwrap());
        let (accepted, _) = listener.accept().unwrap();
        refused(&accepted);
        // This user connects to the other user's listener.
        let path = base.join("theirs.sock");
        let at = path.clone();
        let their_listener = on_thread_as(NOBODY, move || UnixListener::bind(&at).unwrap());
        let ours = UnixStream::connect(&path).unwrap();
        refused(&ours);
        drop((theirs, their_listener));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
