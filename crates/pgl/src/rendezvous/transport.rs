//! Where rank 0 listens and how the others reach it: TCP, or a Unix socket in a private
//! per-user directory named after the job; bounded connects, accepts and polls.

use super::*;

/// A connected TCP or Unix stream.
pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(super) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub(super) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub(super) fn fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            // std's UnixStream::write may raise SIGPIPE on a closed peer (TcpStream's does not):
            // send with MSG_NOSIGNAL so a host process that does not ignore SIGPIPE survives.
            Stream::Unix(s) => {
                // SAFETY: buf is valid for buf.len() bytes; the fd is owned by `s`.
                let n = unsafe {
                    libc::send(
                        s.as_raw_fd(),
                        buf.as_ptr().cast(),
                        buf.len(),
                        libc::MSG_NOSIGNAL,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Which of `fds` are readable (or closed) within `timeout`; all false on timeout or EINTR.
pub(super) fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // Round up so that a sub-millisecond remainder does not busy-loop.
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: pfds is a valid array of pfds.len() pollfd structs for the duration of the call.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// Where rank 0 listens.
pub(super) enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl Endpoint {
    pub(super) fn for_env(env: &RankEnv) -> Result<Endpoint> {
        if let Some((host, port)) = &env.master {
            return Ok(Endpoint::Tcp {
                host: host.clone(),
                port: *port,
            });
        }
        // What the launcher's variables leave out: `PglError::Launcher`.
        if env.world != env.local_world {
            return Err(PglError::Launcher(format!(
                "rank {} of {}: a multi-node job needs MASTER_ADDR and MASTER_PORT (or WEFT_MASTER_ADDR/PORT) \
                 for the rendezvous ({} rank(s) per node)",
                env.rank,
                env.world,
                env.local_world
            ))
            .into());
        }
        let Some(job) = &env.job_id else {
            return Err(PglError::Launcher(format!(
                "rank {} of {}: no job id to name the rendezvous socket: set WEFT_JOB_ID (the same on every \
                 rank) or MASTER_ADDR/MASTER_PORT",
                env.rank,
                env.world
            ))
            .into());
        };
        Ok(Endpoint::Unix(unix_socket_path(job)?))
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Endpoint::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Endpoint::Tcp { host, port } => format!("{host}:{port}"),
            Endpoint::Unix(path) => format!("unix:{}", path.display()),
        }
    }

    /// One connection attempt, bounded by `timeout` for TCP (a Unix connect does not block).
    pub(super) fn connect(&self, timeout: Duration) -> io::Result<Stream> {
        match self {
            Endpoint::Unix(path) => {
                let s = UnixStream::connect(path)?;
                crate::socket_trust::require_same_user(&s)?; // rank 0 runs as this user
                Ok(Stream::Unix(s))
            }
            Endpoint::Tcp { host, port } => {
                let mut last = io::Error::new(
                    io::ErrorKind::NotFound,
                    "the host name resolved to no address",
                );
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(s) => {
                            s.set_nodelay(true)?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }

    pub(super) fn listen(&self) -> Result<Listener> {
        let address = self.describe();
        match self {
            Endpoint::Tcp { host, port } => {
                let addrs = (host.as_str(), *port).to_socket_addrs().map_err(|e| {
                    anyhow!("rank 0 could not resolve the rendezvous address {address}: {e}")
                })?;
                let mut last = None;
                for addr in addrs {
                    match TcpListener::bind(addr) {
                        Ok(l) => return Ok(Listener::Tcp(l)),
                        Err(e) => last = Some(e),
                    }
                }
                match last {
                    Some(e) if e.kind() == io::ErrorKind::AddrInUse => {
                        bail!("rank 0 could not listen on {address}: the port is in use (another job on this port?)")
                    }
                    Some(e) => bail!("rank 0 could not listen on {address}: {e}"),
                    None => bail!("rank 0 could not listen on {address}: the host name resolved to no address"),
                }
            }
            Endpoint::Unix(path) => {
                if path.exists() {
                    // A live listener means another job has the same id; a dead one is stale.
                    if UnixStream::connect(path).is_ok() {
                        bail!(
                            "another rendezvous is already listening at {address} (two jobs with the same job id? \
                             set a distinct WEFT_JOB_ID)"
                        );
                    }
                    std::fs::remove_file(path).map_err(|e| {
                        anyhow!("rank 0 could not remove the stale socket {address}: {e}")
                    })?;
                }
                let listener = UnixListener::bind(path)
                    .map_err(|e| anyhow!("rank 0 could not listen on {address}: {e}"))?;
                Ok(Listener::Unix {
                    listener,
                    _file: SocketFile(path.clone()),
                })
            }
        }
    }
}

/// `<dir>/weft-<uid>/weft-rdzv-<uid>-<job>.sock`, dir = $XDG_RUNTIME_DIR if it exists, else /tmp;
/// `weft-<uid>` is private to the user (socket_trust::private_dir_in).
pub(super) fn unix_socket_path(job_id: &str) -> Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    let dir = crate::socket_trust::private_dir_in(&base)?;
    let mut job: String = job_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    // sun_path holds 108 bytes: keep long ids unique by a hash of the whole id.
    if job.len() > 48 {
        job = format!("{}-{:016x}", &job[..32], fnv1a(job_id.as_bytes()));
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    Ok(dir.join(format!("weft-rdzv-{uid}-{job}.sock")))
}

/// FNV-1a: stable across processes and Rust versions, unlike std's DefaultHasher.
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Removes the Unix socket file when rank 0 stops listening.
pub(super) struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(super) enum Listener {
    Tcp(TcpListener),
    /// The socket file goes away with the listener.
    Unix {
        listener: UnixListener,
        _file: SocketFile,
    },
}

impl Listener {
    pub(super) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix { listener: l, .. } => l.set_nonblocking(true),
        }
    }

    pub(super) fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix { listener: l, .. } => l.as_raw_fd(),
        }
    }

    /// Accepts one connection as a blocking stream.
    pub(super) fn accept(&self) -> io::Result<Stream> {
        let stream = match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Listener::Unix { listener: l, .. } => {
                let s = l.accept()?.0;
                // A process of another user is dropped (the caller retries the accept).
                crate::socket_trust::require_same_user(&s)?;
                Stream::Unix(s)
            }
        };
        match &stream {
            Stream::Tcp(s) => s.set_nonblocking(false)?,
            Stream::Unix(s) => s.set_nonblocking(false)?,
        }
        Ok(stream)
    }
}
