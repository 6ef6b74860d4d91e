//! Rank 0 listens, the other ranks connect; all-gather, broadcast and barrier of bytes through
//! rank 0 (a star), each bounded by a timeout, each failure naming the rank responsible.
//!
//! Transport: TCP to `RankEnv::master` when one is configured, otherwise (one host only) a Unix
//! socket named after the user and the job id, so that two jobs on one host never meet.
//!
//! Wire format: every message is a frame `magic "WFRV" | kind u8 | seq u64 LE | len u64 LE |
//! payload`. `seq` numbers collectives from 1 (0 during the handshake) and catches ranks that
//! disagree on how many collectives they called.
//!
//! Failure model: any error poisons the rendezvous (later calls fail at once). Rank 0 sends an
//! Abort frame carrying its error text to every other rank, and a member that fails on its own
//! tells rank 0, so that every rank fails promptly with a message naming the culprit.

use crate::job_secret::{
    JobSecret, Role as AuthRole, INSECURE_VAR, NONCE_BYTES, PROOF_BYTES, SECRET_VAR,
};
use crate::rank_env::RankEnv;
use anyhow::{anyhow, bail, Result};
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"WFRV";
const HEADER_LEN: usize = 4 + 1 + 8 + 8;
/// Largest payload one rank may pass to a collective.
const MAX_PAYLOAD: usize = 1 << 30;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
const TIMEOUT_VAR: &str = "WEFT_RDZV_TIMEOUT";
const RETRY_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on small control sends (Welcome, Abort) and on reading a Hello; peers answer at once.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on best-effort Abort sends, which must not delay reporting the error.
const ABORT_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// Extra time a member waits for rank 0 beyond the collective timeout, so that rank 0 (which
/// knows the culprit) reports a late rank before the members give up on rank 0 itself.
const MEMBER_SLACK: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Hello = 1,
    Welcome = 2,
    Abort = 3,
    AllGather = 4,
    Broadcast = 5,
    Barrier = 6,
    Result = 7,
    /// Rank 0 to a member that said Hello with a secret: rank 0's nonce and proof.
    Challenge = 8,
    /// The member's proof, answering the Challenge.
    Proof = 9,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Abort,
            4 => Kind::AllGather,
            5 => Kind::Broadcast,
            6 => Kind::Barrier,
            7 => Kind::Result,
            8 => Kind::Challenge,
            9 => Kind::Proof,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Welcome => "welcome",
            Kind::Abort => "abort",
            Kind::AllGather => "all_gather",
            Kind::Broadcast => "broadcast",
            Kind::Barrier => "barrier",
            Kind::Result => "result",
            Kind::Challenge => "challenge",
            Kind::Proof => "proof",
        }
    }
}

struct Frame {
    kind: Kind,
    seq: u64,
    payload: Vec<u8>,
}

/// A connected TCP or Unix stream.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    fn fd(&self) -> RawFd {
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

/// Why a frame could not be sent or received.
#[derive(Debug)]
enum WireError {
    Closed,
    TimedOut,
    Io(io::Error),
    Invalid(String),
}

impl WireError {
    fn from_io(e: io::Error) -> WireError {
        use io::ErrorKind::*;
        match e.kind() {
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
                WireError::Closed
            }
            WouldBlock | TimedOut => WireError::TimedOut,
            _ => WireError::Io(e),
        }
    }
}

fn remaining(deadline: Instant) -> Result<Duration, WireError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(WireError::TimedOut)
    } else {
        Ok(left)
    }
}

/// read_exact, bounded by `deadline` overall (not per read call).
fn read_exact_by(s: &mut Stream, mut buf: &mut [u8], deadline: Instant) -> Result<(), WireError> {
    while !buf.is_empty() {
        s.set_read_timeout(Some(remaining(deadline)?))
            .map_err(WireError::Io)?;
        match s.read(buf) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => match WireError::from_io(e) {
                WireError::TimedOut => {} // the loop re-checks the deadline
                other => return Err(other),
            },
        }
    }
    Ok(())
}

/// write_all, bounded by `deadline` overall.
fn write_all_by(s: &mut Stream, mut buf: &[u8], deadline: Instant) -> Result<(), WireError> {
    while !buf.is_empty() {
        s.set_write_timeout(Some(remaining(deadline)?))
            .map_err(WireError::Io)?;
        match s.write(buf) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => match WireError::from_io(e) {
                WireError::TimedOut => {}
                other => return Err(other),
            },
        }
    }
    Ok(())
}

/// Sends one frame whose payload is the concatenation of `parts` (no copy).
fn send_frame(
    s: &mut Stream,
    kind: Kind,
    seq: u64,
    parts: &[&[u8]],
    deadline: Instant,
) -> Result<(), WireError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&MAGIC);
    header[4] = kind as u8;
    header[5..13].copy_from_slice(&seq.to_le_bytes());
    header[13..].copy_from_slice(&(len as u64).to_le_bytes());
    write_all_by(s, &header, deadline)?;
    for part in parts {
        write_all_by(s, part, deadline)?;
    }
    Ok(())
}

fn recv_frame(s: &mut Stream, max_len: usize, deadline: Instant) -> Result<Frame, WireError> {
    let mut header = [0u8; HEADER_LEN];
    read_exact_by(s, &mut header, deadline)?;
    if header[..4] != MAGIC {
        return Err(WireError::Invalid(
            "not a weft rendezvous message (bad magic)".into(),
        ));
    }
    let kind = Kind::from_byte(header[4])
        .ok_or_else(|| WireError::Invalid(format!("unknown message kind {}", header[4])))?;
    let (seq, len) = (
        u64_at(&header, 5).unwrap_or_default(),
        u64_at(&header, 13).unwrap_or_default(),
    );
    if len > max_len as u64 {
        return Err(WireError::Invalid(format!(
            "message of {len} bytes exceeds the limit of {max_len} bytes"
        )));
    }
    let mut payload = vec![0u8; len as usize];
    read_exact_by(s, &mut payload, deadline)?;
    Ok(Frame { kind, seq, payload })
}

/// The little-endian u64 at `at`, if `bytes` is long enough.
fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(word.try_into().ok()?))
}

/// Best effort: tells a peer why this job is failing.
fn send_abort(s: &mut Stream, seq: u64, text: &str) {
    let _ = send_frame(
        s,
        Kind::Abort,
        seq,
        &[text.as_bytes()],
        Instant::now() + ABORT_SEND_TIMEOUT,
    );
}

/// Which of `fds` are readable (or closed) within `timeout`; all false on timeout or EINTR.
fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
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

/// "5 s", "500 ms", "2.5 s".
fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn rank_list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Per-collective timeout: WEFT_RDZV_TIMEOUT seconds when set, else 300 s.
fn op_timeout(value: Option<String>) -> Result<Duration> {
    let Some(v) = value else {
        return Ok(DEFAULT_TIMEOUT);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => bail!("{TIMEOUT_VAR}={v:?} is not a positive number of seconds"),
    }
}

/// Where rank 0 listens.
enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl Endpoint {
    fn for_env(env: &RankEnv) -> Result<Endpoint> {
        if let Some((host, port)) = &env.master {
            return Ok(Endpoint::Tcp {
                host: host.clone(),
                port: *port,
            });
        }
        if env.world != env.local_world {
            bail!(
                "rank {} of {}: a multi-node job needs MASTER_ADDR and MASTER_PORT (or WEFT_MASTER_ADDR/PORT) \
                 for the rendezvous ({} rank(s) per node)",
                env.rank,
                env.world,
                env.local_world
            );
        }
        let Some(job) = &env.job_id else {
            bail!(
                "rank {} of {}: no job id to name the rendezvous socket: set WEFT_JOB_ID (the same on every \
                 rank) or MASTER_ADDR/MASTER_PORT",
                env.rank,
                env.world
            );
        };
        Ok(Endpoint::Unix(unix_socket_path(job)?))
    }

    fn describe(&self) -> String {
        match self {
            Endpoint::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Endpoint::Tcp { host, port } => format!("{host}:{port}"),
            Endpoint::Unix(path) => format!("unix:{}", path.display()),
        }
    }

    /// One connection attempt, bounded by `timeout` for TCP (a Unix connect does not block).
    fn connect(&self, timeout: Duration) -> io::Result<Stream> {
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

    fn listen(&self) -> Result<Listener> {
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
fn unix_socket_path(job_id: &str) -> Result<PathBuf> {
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
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Removes the Unix socket file when rank 0 stops listening.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

enum Listener {
    Tcp(TcpListener),
    /// The socket file goes away with the listener.
    Unix {
        listener: UnixListener,
        _file: SocketFile,
    },
}

impl Listener {
    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(true),
            Listener::Unix { listener: l, .. } => l.set_nonblocking(true),
        }
    }

    fn fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix { listener: l, .. } => l.as_raw_fd(),
        }
    }

    /// Accepts one connection as a blocking stream.
    fn accept(&self) -> io::Result<Stream> {
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

enum Role {
    /// World size 1: no socket.
    Single,
    /// Rank 0: `members[r - 1]` is the stream to rank r.
    Root {
        members: Vec<Stream>,
    },
    Member {
        root: Stream,
    },
}

pub struct Rendezvous {
    rank: usize,
    world: usize,
    address: String,
    timeout: Duration,
    /// Number of the current (or last) collective; 0 before the first.
    seq: u64,
    role: Role,
    /// Set by the first failure; later calls return it at once.
    failed: Option<String>,
    max_payload: usize,
}

// The harness keeps a Rendezvous in Arc<Mutex<_>>.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Rendezvous>()
};

impl Rendezvous {
    /// Rank 0 listens, the others connect (retrying until `connect_timeout`).
    pub fn connect(env: &RankEnv, connect_timeout: Duration) -> Result<Self> {
        let timeout =
            op_timeout(std::env::var_os(TIMEOUT_VAR).map(|v| v.to_string_lossy().into_owned()))?;
        if env.world == 0 || env.rank >= env.world {
            bail!(
                "rendezvous: rank {} is not below world size {}",
                env.rank,
                env.world
            );
        }
        let mut rdzv = Rendezvous {
            rank: env.rank,
            world: env.world,
            address: String::from("(none: world size 1)"),
            timeout,
            seq: 0,
            role: Role::Single,
            failed: None,
            max_payload: MAX_PAYLOAD,
        };
        if env.world == 1 {
            return Ok(rdzv);
        }
        let endpoint = Endpoint::for_env(env)?;
        rdzv.address = endpoint.describe();
        if matches!(endpoint, Endpoint::Tcp { .. }) && env.secret.is_none() && !env.insecure_tcp {
            bail!(
                "rank {}: the rendezvous at {} is over TCP, where anyone who can reach the port could join: set {SECRET_VAR} to the same secret on every rank (`weft secret` prints one; `weft launch` sets it) or, on a trusted network, {INSECURE_VAR}=1",
                env.rank,
                rdzv.address
            );
        }
        let secret = env.secret.as_ref();
        let deadline = Instant::now() + connect_timeout;
        rdzv.role = if env.rank == 0 {
            Role::Root {
                members: rdzv.accept_members(&endpoint, secret, connect_timeout, deadline)?,
            }
        } else {
            Role::Member {
                root: rdzv.join_root(&endpoint, secret, connect_timeout, deadline)?,
            }
        };
        Ok(rdzv)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Human-readable address ("host:port" or "unix:/path"), for messages.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Bound on each later collective (default 300 s, or WEFT_RDZV_TIMEOUT seconds).
    pub fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// Every rank's `bytes`, indexed by rank.
    pub fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.begin(Kind::AllGather, bytes.len())?;
        if matches!(self.role, Role::Single) {
            return Ok(vec![bytes.to_vec()]);
        }
        if matches!(self.role, Role::Member { .. }) {
            let reply = self.member_exchange(Kind::AllGather, &[bytes])?;
            return match decode_parts(&reply, self.world) {
                Some(parts) => Ok(parts),
                None => Err(self.fail("rank 0 sent a malformed all_gather result".into(), true)),
            };
        }
        let mut parts = self.root_gather(Kind::AllGather)?;
        parts[0] = bytes.to_vec();
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.max_payload {
            let text = format!(
                "all_gather result of {total} bytes (world {}) exceeds the limit of {} bytes",
                self.world, self.max_payload
            );
            return Err(self.fail(text, true));
        }
        let mut framing = Vec::with_capacity(8 * self.world);
        for p in &parts {
            framing.push((p.len() as u64).to_le_bytes());
        }
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(2 * self.world);
        for (len, p) in framing.iter().zip(&parts) {
            pieces.push(len);
            pieces.push(p);
        }
        self.root_reply(&pieces)?;
        Ok(parts)
    }

    /// Rank `root`'s `bytes` on every rank (`bytes` is ignored on the other ranks).
    pub fn broadcast(&mut self, root: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        let own = if self.rank == root { bytes } else { &[][..] };
        self.begin(Kind::Broadcast, own.len())?;
        if root >= self.world {
            let text = format!(
                "rank {} called broadcast with root {root}, which is not below world size {}",
                self.rank, self.world
            );
            return Err(self.fail(text, true));
        }
        if matches!(self.role, Role::Single) {
            return Ok(bytes.to_vec());
        }
        let root_word = (root as u64).to_le_bytes();
        if matches!(self.role, Role::Member { .. }) {
            return self.member_exchange(Kind::Broadcast, &[&root_word, own]);
        }
        let mut parts = self.root_gather(Kind::Broadcast)?;
        // Every member's payload starts with the root it was called with.
        for (r, part) in parts.iter().enumerate().skip(1) {
            let theirs = u64_at(part, 0);
            if theirs != Some(root as u64) {
                let text = match theirs {
                    Some(t) => format!(
                        "rank {r} called broadcast with root {t} but rank 0 with root {root} in collective #{}",
                        self.seq
                    ),
                    None => format!("rank {r} sent a malformed broadcast in collective #{}", self.seq),
                };
                return Err(self.fail_root(text));
            }
        }
        let value = if root == 0 {
            bytes.to_vec()
        } else {
            parts.swap_remove(root).split_off(8)
        };
        self.root_reply(&[&value])?;
        Ok(value)
    }

    /// Returns once every rank has called barrier.
    pub fn barrier(&mut self) -> Result<()> {
        self.begin(Kind::Barrier, 0)?;
        if matches!(self.role, Role::Single) {
            return Ok(());
        }
        if matches!(self.role, Role::Member { .. }) {
            self.member_exchange(Kind::Barrier, &[])?;
            return Ok(());
        }
        self.root_gather(Kind::Barrier)?;
        self.root_reply(&[])
    }

    /// Best effort: makes every other rank's current or next collective fail with `message`
    /// (this rank's failure). Later calls on this rendezvous fail at once.
    pub fn abort(&mut self, message: &str) {
        if self.failed.is_some() {
            return; // the other ranks were told when it failed
        }
        match &mut self.role {
            Role::Single => {}
            Role::Root { members } => {
                let text = format!("rank 0 failed: {message}");
                for m in members.iter_mut() {
                    send_abort(m, self.seq, &text);
                }
            }
            // Rank 0 prefixes "rank N failed: " when it passes the message on.
            Role::Member { root } => send_abort(root, self.seq, message),
        }
        self.failed = Some(format!("this rank aborted: {message}"));
    }

    #[cfg(test)]
    fn set_max_payload(&mut self, n: usize) {
        self.max_payload = n;
    }

    /// Frames may carry the payload plus 8 bytes per rank of framing.
    fn max_frame(&self) -> usize {
        self.max_payload + 8 * (self.world + 1)
    }

    /// Starts collective number seq + 1, unless this rendezvous has failed or the payload is too big.
    fn begin(&mut self, kind: Kind, payload_len: usize) -> Result<()> {
        if let Some(text) = &self.failed {
            bail!("rendezvous at {} already failed: {text}", self.address);
        }
        self.seq += 1;
        if payload_len > self.max_payload {
            let text = format!(
                "rank {} passed {payload_len} bytes to {}, over the limit of {} bytes",
                self.rank,
                kind.name(),
                self.max_payload
            );
            return Err(self.fail(text, true));
        }
        Ok(())
    }

    /// Records the failure and tells the other ranks: rank 0 tells every member; a member tells
    /// rank 0 when `tell_others` (not when the failure came from rank 0).
    fn fail(&mut self, text: String, tell_others: bool) -> anyhow::Error {
        if matches!(self.role, Role::Root { .. }) {
            return self.fail_root(text);
        }
        if let (true, Role::Member { root }) = (tell_others, &mut self.role) {
            send_abort(root, self.seq, &text);
        }
        let e = anyhow!("rendezvous at {}: {text}", self.address);
        self.failed = Some(text);
        e
    }

    /// Rank 0's failure: every member gets an Abort carrying `text` (the culprit too: after a
    /// mismatch it is alive and waiting; when it is gone, the send fails quietly).
    fn fail_root(&mut self, text: String) -> anyhow::Error {
        if let Role::Root { members } = &mut self.role {
            for m in members.iter_mut() {
                send_abort(m, self.seq, &text);
            }
        }
        let e = anyhow!("rendezvous at {}: {text}", self.address);
        self.failed = Some(text);
        e
    }

    /// Rank 0: receives collective `self.seq` of kind `kind` from every member. Returns payloads
    /// indexed by rank (index 0 left empty).
    fn root_gather(&mut self, kind: Kind) -> Result<Vec<Vec<u8>>> {
        let (seq, timeout, max_frame) = (self.seq, self.timeout, self.max_frame());
        let result = match &mut self.role {
            Role::Root { members } => gather_from(members, kind, seq, timeout, max_frame),
            _ => Err("internal error: gather on a rank other than 0".into()),
        };
        result.map_err(|text| self.fail_root(text))
    }

    /// Rank 0: sends the result of collective `self.seq` to every member.
    fn root_reply(&mut self, pieces: &[&[u8]]) -> Result<()> {
        let (seq, timeout) = (self.seq, self.timeout);
        let deadline = Instant::now() + timeout;
        let Role::Root { members } = &mut self.role else {
            return Err(self.fail_root("internal error: reply from a rank other than 0".into()));
        };
        for (i, m) in members.iter_mut().enumerate() {
            if let Err(e) = send_frame(m, Kind::Result, seq, pieces, deadline) {
                let text = wire_error_text(e, i + 1, "sending to", timeout, seq);
                return Err(self.fail_root(text));
            }
        }
        Ok(())
    }

    /// A member: sends its part of collective `self.seq` and waits for rank 0's result.
    fn member_exchange(&mut self, kind: Kind, pieces: &[&[u8]]) -> Result<Vec<u8>> {
        let seq = self.seq;
        let waited = self.timeout + MEMBER_SLACK;
        let deadline = Instant::now() + waited;
        let max_frame = self.max_frame();
        let Role::Member { root } = &mut self.role else {
            return Err(self.fail("internal error: member exchange on rank 0".into(), false));
        };
        let sent = send_frame(root, kind, seq, pieces, deadline);
        // After a failed send, rank 0 may still have left an Abort explaining why.
        let reply_deadline = if sent.is_ok() {
            deadline
        } else {
            Instant::now() + ABORT_SEND_TIMEOUT
        };
        let reply = recv_frame(root, max_frame, reply_deadline);
        let (text, tell_root) = match (sent, reply) {
            (_, Ok(f)) if f.kind == Kind::Abort => {
                (String::from_utf8_lossy(&f.payload).into_owned(), false)
            }
            (Ok(()), Ok(f)) if f.kind == Kind::Result && f.seq == seq => return Ok(f.payload),
            (Ok(()), Ok(f)) => (
                format!(
                    "unexpected {} #{} from rank 0 in collective #{seq}",
                    f.kind.name(),
                    f.seq
                ),
                true,
            ),
            (Err(e), _) | (Ok(()), Err(e)) => {
                // Rank 0 is alive but silent: tell it, in case it is stuck elsewhere.
                let tell = matches!(e, WireError::TimedOut);
                (wire_error_text(e, 0, "waiting for", waited, seq), tell)
            }
        };
        Err(self.fail(text, tell_root))
    }

    /// Rank 0's handshake: accepts until every rank 1..world has said Hello (and, with a job
    /// secret, proved it), then welcomes all. A connection that does not prove the secret is a
    /// stranger: told why and dropped, and rank 0 keeps accepting — it cannot take a rank's
    /// place, nor end the job with a bad Hello. (Connections are handled one at a time, each
    /// within CONTROL_TIMEOUT: one that stalls delays rank 0 by that much, and enough of them can
    /// run out its connect deadline.)
    fn accept_members(
        &self,
        endpoint: &Endpoint,
        secret: Option<&JobSecret>,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Stream>> {
        let address = &self.address;
        let world = self.world;
        let listener = endpoint.listen()?;
        listener
            .set_nonblocking()
            .map_err(|e| anyhow!("rendezvous at {address}: {e}"))?;
        let mut members: Vec<Option<Stream>> = (1..world).map(|_| None).collect();
        // The last connection refused for the secret, for the timeout's message.
        let mut refused: Option<String> = None;
        // Aborts every connected member (and `extra`) with `text`, and returns the error.
        let reject =
            |members: &mut Vec<Option<Stream>>, extra: Option<&mut Stream>, text: String| {
                for m in members.iter_mut().flatten().chain(extra) {
                    send_abort(m, 0, &text);
                }
                anyhow!("rendezvous at {address}: {text}")
            };
        while members.iter().any(|m| m.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<usize> =
                    (1..world).filter(|&r| members[r - 1].is_none()).collect();
                let text = format!(
                    "rank(s) {} did not arrive within {} (world {world}){}",
                    rank_list(&missing),
                    fmt_duration(connect_timeout),
                    refused.as_deref().map_or(String::new(), |r| format!(
                        "; the last connection refused: {r}"
                    ))
                );
                return Err(reject(&mut members, None, text));
            }
            match poll_readable(&[listener.fd()], left) {
                Ok(ready) if ready[0] => {}
                Ok(_) => continue,
                Err(e) => return Err(reject(&mut members, None, format!("poll failed: {e}"))),
            }
            let mut stream = match listener.accept() {
                Ok(s) => s,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                // Resource trouble (e.g. out of fds) is transient from the listener's view: retry.
                Err(_) => {
                    std::thread::sleep(RETRY_INTERVAL.min(left));
                    continue;
                }
            };
            // Peers send Hello right after connecting. Anything else (a port scanner, a liveness
            // probe of the socket file) is dropped.
            let hello_deadline = deadline.min(Instant::now() + CONTROL_TIMEOUT);
            let Ok(frame) = recv_frame(&mut stream, HELLO_BYTES, hello_deadline) else {
                continue;
            };
            if frame.kind != Kind::Hello || frame.payload.len() != HELLO_BYTES {
                continue;
            }
            let (Some(rank), Some(their_world)) =
                (u64_at(&frame.payload, 0), u64_at(&frame.payload, 8))
            else {
                continue;
            };
            let (has_secret, nonce) = (frame.payload[16] != 0, &frame.payload[17..]);
            if let Err(why) = prove_to_member(
                &mut stream,
                secret,
                (rank, their_world, has_secret, nonce),
                hello_deadline,
            ) {
                send_abort(&mut stream, 0, &why);
                refused = Some(format!("one claiming rank {rank}: {why}"));
                continue;
            }
            let text = if their_world != world as u64 {
                format!(
                    "rank {rank} was started with world size {their_world}, rank 0 with {world}"
                )
            } else if rank == 0 || rank >= world as u64 {
                format!(
                    "a peer connected as rank {rank}, which is not in 1..{} (world {world})",
                    world - 1
                )
            } else if members[rank as usize - 1].is_some() {
                format!("rank {rank} connected twice (two processes started as rank {rank}, or two jobs sharing {address})")
            } else {
                members[rank as usize - 1] = Some(stream);
                continue;
            };
            return Err(reject(&mut members, Some(&mut stream), text));
        }
        drop(listener); // no more connections: removes the Unix socket file
        let mut members: Vec<Stream> = members.into_iter().flatten().collect();
        for r in 1..world {
            if send_frame(
                &mut members[r - 1],
                Kind::Welcome,
                0,
                &[],
                Instant::now() + CONTROL_TIMEOUT,
            )
            .is_err()
            {
                let text = format!("rank {r} closed its connection during the handshake");
                for (i, m) in members.iter_mut().enumerate() {
                    if i + 1 != r {
                        send_abort(m, 0, &text);
                    }
                }
                bail!("rendezvous at {address}: {text}");
            }
        }
        Ok(members)
    }

    /// A member's handshake: connects (retrying), says Hello, with a job secret checks rank 0's
    /// proof and sends its own, waits for Welcome.
    fn join_root(
        &self,
        endpoint: &Endpoint,
        secret: Option<&JobSecret>,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Stream> {
        let address = &self.address;
        let mut stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt =
                endpoint.connect(left.clamp(Duration::from_millis(1), Duration::from_secs(1)));
            match attempt {
                Ok(s) => break s,
                Err(e) if left.is_zero() => bail!(
                    "rank {} could not reach rank 0 at {address} within {} (last error: {e})",
                    self.rank,
                    fmt_duration(connect_timeout)
                ),
                Err(_) => std::thread::sleep(RETRY_INTERVAL.min(left)),
            }
        };
        let my_nonce = crate::job_secret::nonce()?;
        let mut hello = [0u8; HELLO_BYTES];
        hello[..8].copy_from_slice(&(self.rank as u64).to_le_bytes());
        hello[8..16].copy_from_slice(&(self.world as u64).to_le_bytes());
        hello[16] = u8::from(secret.is_some());
        hello[17..].copy_from_slice(&my_nonce);
        let sent = send_frame(
            &mut stream,
            Kind::Hello,
            0,
            &[&hello],
            Instant::now() + CONTROL_TIMEOUT,
        );
        // Rank 0 answers once every rank has arrived, which takes at most its own connect timeout
        // from now (it started listening before we connected).
        let wait = if sent.is_ok() {
            connect_timeout + CONTROL_TIMEOUT
        } else {
            ABORT_SEND_TIMEOUT
        };
        let until = Instant::now() + wait;
        let mut reply = recv_frame(&mut stream, 1 << 20, until);
        if let (Some(s), Ok(f)) = (secret, &reply) {
            // With a secret, rank 0 must challenge (or refuse) before anything else: a Welcome
            // without its proof is not from this job's rank 0.
            if f.kind != Kind::Challenge && f.kind != Kind::Abort {
                bail!(
                    "rendezvous at {address}: the process listening there answered with {} instead of proving the job secret ({SECRET_VAR}): it is not this job's rank 0",
                    f.kind.name()
                );
            }
            if f.kind == Kind::Challenge {
                let (rank, world) = (self.rank as u64, self.world as u64);
                let good = f.payload.len() == NONCE_BYTES + PROOF_BYTES && {
                    let (their_nonce, proof) = f.payload.split_at(NONCE_BYTES);
                    s.verify(AuthRole::Root, rank, world, (&my_nonce, their_nonce), proof)
                };
                if !good {
                    bail!(
                        "rendezvous at {address}: the process listening there did not prove the job secret ({SECRET_VAR}): this rank's secret differs from rank 0's (two `weft launch` runs each make their own), or it is not this job's rank 0; only this rank's Hello (rank, world, a nonce) was sent to it"
                    );
                }
                let proof = s.proof(
                    AuthRole::Member,
                    rank,
                    world,
                    (&my_nonce, &f.payload[..NONCE_BYTES]),
                );
                reply = send_frame(
                    &mut stream,
                    Kind::Proof,
                    0,
                    &[&proof],
                    Instant::now() + CONTROL_TIMEOUT,
                )
                .and_then(|()| recv_frame(&mut stream, 1 << 20, until));
            }
        }
        let text = match reply {
            Ok(f) if f.kind == Kind::Welcome => return Ok(stream),
            Ok(f) if f.kind == Kind::Abort => String::from_utf8_lossy(&f.payload).into_owned(),
            Ok(f) => format!(
                "unexpected {} from rank 0 during the handshake",
                f.kind.name()
            ),
            Err(WireError::Closed) => "rank 0 closed the connection during the handshake".into(),
            Err(WireError::TimedOut) => {
                format!(
                    "rank 0 accepted the connection but did not finish the handshake within {}",
                    fmt_duration(wait)
                )
            }
            Err(WireError::Io(e)) => {
                format!("connection to rank 0 failed during the handshake: {e}")
            }
            Err(WireError::Invalid(what)) => {
                format!("rank 0 sent an invalid message during the handshake: {what}")
            }
        };
        bail!("rendezvous at {address}: {text}")
    }
}

/// Rank 0's side of a collective: reads one frame of `kind` and `seq` from every member,
/// whichever is ready first, all within `timeout`. On failure: the text, naming the rank.
/// weft's own bootstrap: the inherent collectives, unchanged.
impl crate::Bootstrap for Rendezvous {
    fn rank(&self) -> usize {
        Rendezvous::rank(self)
    }

    fn world(&self) -> usize {
        Rendezvous::world(self)
    }

    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Rendezvous::all_gather(self, bytes)
    }

    fn broadcast(&mut self, root: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        Rendezvous::broadcast(self, root, bytes)
    }

    fn barrier(&mut self) -> Result<()> {
        Rendezvous::barrier(self)
    }
}

fn gather_from(
    members: &mut [Stream],
    kind: Kind,
    seq: u64,
    timeout: Duration,
    max_frame: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let deadline = Instant::now() + timeout;
    // parts[r] for rank r; rank 0's own part is filled in by the caller.
    let mut parts: Vec<Option<Vec<u8>>> = vec![None; members.len() + 1];
    parts[0] = Some(Vec::new());
    loop {
        let pending: Vec<usize> = (1..parts.len()).filter(|&r| parts[r].is_none()).collect();
        if pending.is_empty() {
            return Ok(parts.into_iter().map(Option::unwrap_or_default).collect());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let who = if pending.len() == 1 { "rank" } else { "ranks" };
            let text = format!(
                "timed out after {} waiting for {who} {} in collective #{seq}",
                fmt_duration(timeout),
                rank_list(&pending)
            );
            return Err(text);
        }
        let fds: Vec<RawFd> = pending.iter().map(|&r| members[r - 1].fd()).collect();
        let ready = poll_readable(&fds, left)
            .map_err(|e| format!("poll failed in collective #{seq}: {e}"))?;
        for (&r, _) in pending.iter().zip(ready).filter(|(_, ready)| *ready) {
            let text = match recv_frame(&mut members[r - 1], max_frame, deadline) {
                Ok(f) if f.kind == Kind::Abort => format!("rank {r} failed: {}", String::from_utf8_lossy(&f.payload)),
                Ok(f) if f.seq != seq => format!(
                    "rank {r} is at collective #{} but rank 0 at #{seq}: the ranks called different numbers of \
                     collectives",
                    f.seq
                ),
                Ok(f) if f.kind != kind => {
                    format!("rank {r} called {} but rank 0 called {} in collective #{seq}", f.kind.name(), kind.name())
                }
                Ok(f) => {
                    parts[r] = Some(f.payload);
                    continue;
                }
                Err(e) => wire_error_text(e, r, "waiting for", timeout, seq),
            };
            return Err(text);
        }
    }
}

/// Names `peer` and collective `seq` in a send or receive failure; `waited` is the bound used.
fn wire_error_text(e: WireError, peer: usize, doing: &str, waited: Duration, seq: u64) -> String {
    match e {
        WireError::Closed => format!(
            "rank {peer} closed its connection (exited or crashed) during collective #{seq}"
        ),
        WireError::TimedOut => {
            format!(
                "timed out after {} {doing} rank {peer} in collective #{seq}",
                fmt_duration(waited)
            )
        }
        WireError::Io(e) => {
            format!("connection to rank {peer} failed during collective #{seq}: {e}")
        }
        WireError::Invalid(what) => {
            format!("rank {peer} sent an invalid message in collective #{seq}: {what}")
        }
    }
}

/// Decodes `world` length-prefixed parts; None unless the bytes are exactly that.
fn decode_parts(mut bytes: &[u8], world: usize) -> Option<Vec<Vec<u8>>> {
    let mut parts = Vec::with_capacity(world);
    for _ in 0..world {
        let len = usize::try_from(u64_at(bytes, 0)?).ok()?;
        let part = bytes.get(8..8usize.checked_add(len)?)?;
        parts.push(part.to_vec());
        bytes = &bytes[8 + len..];
    }
    bytes.is_empty().then_some(parts)
}

/// Hello: rank and world (u64 each), whether the member has a job secret (one byte), its nonce.
const HELLO_BYTES: usize = 8 + 8 + 1 + NONCE_BYTES;

/// Rank 0's side of the secret: `Err(why)` when the member that said Hello (`rank`, `world`,
/// whether it has a secret, its nonce) cannot join — no secret where rank 0 has one or the
/// reverse, or no valid proof of rank 0's. With a secret: sends rank 0's nonce and proof, reads
/// and checks the member's proof by `deadline`.
fn prove_to_member(
    stream: &mut Stream,
    secret: Option<&JobSecret>,
    (rank, world, has_secret, their_nonce): (u64, u64, bool, &[u8]),
    deadline: Instant,
) -> std::result::Result<(), String> {
    let s = match (secret, has_secret) {
        (None, false) => return Ok(()),
        (None, true) => return Err(format!("this process has a job secret ({SECRET_VAR}) and rank 0 has none: start every rank with the same one")),
        (Some(_), false) => return Err(format!("rank 0 requires the job secret ({SECRET_VAR}) and this process has none: start every rank with the same one")),
        (Some(s), true) => s,
    };
    let my_nonce = crate::job_secret::nonce().map_err(|e| format!("rank 0: {e:#}"))?;
    let proof = s.proof(AuthRole::Root, rank, world, (their_nonce, &my_nonce));
    send_frame(stream, Kind::Challenge, 0, &[&my_nonce, &proof], deadline)
        .map_err(|_| "the connection closed during the secret's exchange".to_string())?;
    let answer = recv_frame(stream, PROOF_BYTES, deadline)
        .map_err(|_| "no proof of the job secret came back in time".to_string())?;
    let good = answer.kind == Kind::Proof
        && s.verify(
            AuthRole::Member,
            rank,
            world,
            (their_nonce, &my_nonce),
            &answer.payload,
        );
    if good {
        Ok(())
    } else {
        Err(format!(
            "rank 0 refused this process: its proof of the job secret ({SECRET_VAR}) did not match"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank_env::Launcher;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static NEXT_JOB: AtomicUsize = AtomicUsize::new(0);
    const CONNECT: Duration = Duration::from_secs(10);

    /// A job id no other test (or test process) uses.
    fn unique_job(name: &str) -> String {
        format!(
            "unit-{}-{}-{name}",
            std::process::id(),
            NEXT_JOB.fetch_add(1, Ordering::SeqCst)
        )
    }

    fn rank_env(rank: usize, world: usize, job: &str, master: Option<(String, u16)>) -> RankEnv {
        RankEnv {
            rank,
            world,
            local_rank: rank,
            local_world: world,
            launcher: Launcher::Weft,
            job_id: Some(job.to_string()),
            master,
            secret: None,
            insecure_tcp: false,
        }
    }

    /// `envs` with `secret` on every rank.
    fn with_secret(mut envs: Vec<RankEnv>, secret: &JobSecret) -> Vec<RankEnv> {
        for e in &mut envs {
            e.secret = Some(secret.clone());
        }
        envs
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// One env per entry of `ranks`, all of one job of size `world`.
    fn envs(
        name: &str,
        ranks: &[usize],
        world: usize,
        master: Option<(String, u16)>,
    ) -> Vec<RankEnv> {
        let job = unique_job(name);
        ranks
            .iter()
            .map(|&r| rank_env(r, world, &job, master.clone()))
            .collect()
    }

    /// Runs `body` for each env on its own thread; results in the order of `envs`.
    fn on_threads<T: Send>(envs: Vec<RankEnv>, body: impl Fn(RankEnv) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let handles: Vec<_> = envs.into_iter().map(|env| s.spawn(|| body(env))).collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread panicked"))
                .collect()
        })
    }

    /// Every rank's error text (panics if a rank succeeded).
    fn errors(results: Vec<Result<()>>) -> Vec<String> {
        results
            .into_iter()
            .map(|r| format!("{:#}", r.expect_err("expected this rank to fail")))
            .collect()
    }

    /// Rank- and round-dependent bytes of varying length, empty for some (rank 0, round 0 included).
    fn payload(rank: usize, round: usize) -> Vec<u8> {
        let len = (rank * 31 + round * 7) % 50;
        (0..len).map(|i| (rank * 13 + round + i) as u8).collect()
    }

    fn exercise(env: RankEnv, rounds: usize) -> Result<()> {
        let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
        assert_eq!((rdzv.rank(), rdzv.world()), (env.rank, env.world));
        for round in 0..rounds {
            let all = rdzv.all_gather(&payload(env.rank, round))?;
            let expected: Vec<Vec<u8>> = (0..env.world).map(|r| payload(r, round)).collect();
            assert_eq!(
                all, expected,
                "all_gather round {round} on rank {}",
                env.rank
            );
            if round % 3 == 0 {
                let root = round % env.world;
                let got = rdzv.broadcast(root, &payload(env.rank, round + 1000))?;
                assert_eq!(
                    got,
                    payload(root, round + 1000),
                    "broadcast round {round} on rank {}",
                    env.rank
                );
            }
            if round % 5 == 0 {
                rdzv.barrier()?;
            }
        }
        Ok(())
    }

    #[test]
    fn world_of_one_needs_no_socket() {
        let mut rdzv = Rendezvous::connect(&RankEnv::standalone(), CONNECT).unwrap();
        assert_eq!(rdzv.all_gather(b"abc").unwrap(), vec![b"abc".to_vec()]);
        assert_eq!(rdzv.broadcast(0, b"xyz").unwrap(), b"xyz");
        rdzv.barrier().unwrap();
        let e = rdzv.broadcast(1, b"").unwrap_err().to_string();
        assert!(e.contains("root 1, which is not below world size 1"), "{e}");
    }

    #[test]
    fn collectives_are_correct_for_several_world_sizes() {
        for world in [2, 3, 5] {
            let ranks: Vec<usize> = (0..world).collect();
            for result in on_threads(envs("sizes", &ranks, world, None), |env| exercise(env, 30)) {
                result.unwrap();
            }
        }
    }

    #[test]
    fn a_thousand_rounds() {
        for result in on_threads(envs("many", &[0, 1, 2], 3, None), |env| exercise(env, 1000)) {
            result.unwrap();
        }
    }

    #[test]
    fn tcp_transport() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let master = Some(("127.0.0.1".to_string(), port));
        let secret = JobSecret::generate().unwrap();
        let tcp = with_secret(envs("tcp", &[0, 1, 2, 3], 4, master), &secret);
        let results = on_threads(tcp, |env| {
            let rdzv = Rendezvous::connect(&env, CONNECT)?;
            assert_eq!(rdzv.address(), format!("127.0.0.1:{port}"));
            drop(rdzv);
            Ok(())
        });
        results.into_iter().collect::<Result<()>>().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let master = Some(("127.0.0.1".to_string(), port));
        let tcp = with_secret(envs("tcp", &[0, 1, 2], 3, master), &secret);
        for result in on_threads(tcp, |env| exercise(env, 100)) {
            result.unwrap();
        }
    }

    #[test]
    fn tcp_without_a_secret_is_refused_unless_waived() {
        let master = Some(("127.0.0.1".to_string(), free_port()));
        for e in errors(on_threads(
            envs("nosecret", &[0, 1], 2, master.clone()),
            |env| Rendezvous::connect(&env, CONNECT).map(drop),
        )) {
            assert!(
                e.contains("over TCP") && e.contains("WEFT_JOB_SECRET"),
                "{e}"
            );
        }
        let mut waived = envs("waived", &[0, 1], 2, master);
        for e in &mut waived {
            e.insecure_tcp = true;
        }
        for r in on_threads(waived, |env| exercise(env, 3)) {
            r.unwrap();
        }
    }

    #[test]
    fn a_shared_secret_joins_over_the_unix_socket() {
        let secret = JobSecret::generate().unwrap();
        for r in on_threads(
            with_secret(envs("secret", &[0, 1, 2], 3, None), &secret),
            |env| exercise(env, 20),
        ) {
            r.unwrap();
        }
    }

    /// A process that knows the job's address but not its secret says Hello as rank 1, answers
    /// rank 0's challenge with a forged proof and is refused; then the real rank 1 joins and the
    /// job carries on. (Fails if rank 0 seats a member without checking its proof: the stranger
    /// would get the Welcome.)
    #[test]
    fn a_stranger_without_the_secret_is_refused_and_the_job_carries_on() {
        let secret = JobSecret::generate().unwrap();
        let master = Some(("127.0.0.1".to_string(), free_port()));
        let job = with_secret(envs("stranger", &[0, 1], 2, master), &secret);
        let (root_env, member_env) = (job[0].clone(), job[1].clone());
        std::thread::scope(|s| {
            let root = s.spawn(|| exercise(root_env, 5));
            let endpoint = Endpoint::for_env(&member_env).unwrap();
            let mut stream = loop {
                match endpoint.connect(Duration::from_secs(1)) {
                    Ok(st) => break st,
                    Err(_) => std::thread::sleep(RETRY_INTERVAL),
                }
            };
            let mut hello = [0u8; HELLO_BYTES];
            hello[..8].copy_from_slice(&1u64.to_le_bytes());
            hello[8..16].copy_from_slice(&2u64.to_le_bytes());
            hello[16] = 1;
            let soon = || Instant::now() + Duration::from_secs(5);
            send_frame(&mut stream, Kind::Hello, 0, &[&hello], soon()).unwrap();
            let challenge = recv_frame(&mut stream, 1 << 10, soon()).unwrap();
            assert_eq!(challenge.kind, Kind::Challenge);
            send_frame(&mut stream, Kind::Proof, 0, &[&[7u8; PROOF_BYTES]], soon()).unwrap();
            let answer = recv_frame(&mut stream, 1 << 10, soon()).unwrap();
            let text = String::from_utf8_lossy(&answer.payload).into_owned();
            assert_eq!(
                answer.kind,
                Kind::Abort,
                "the stranger got {:?}",
                answer.kind
            );
            assert!(text.contains("did not match"), "{text}");
            let member = s.spawn(|| exercise(member_env, 5));
            root.join().unwrap().unwrap();
            member.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_member_refuses_a_rank_0_without_its_secret() {
        let master = Some(("127.0.0.1".to_string(), free_port()));
        let mut job = envs("impostor", &[0, 1], 2, master);
        job[0].secret = Some(JobSecret::generate().unwrap());
        job[1].secret = Some(JobSecret::generate().unwrap());
        let results = on_threads(job, |env| {
            Rendezvous::connect(&env, Duration::from_secs(2)).map(drop)
        });
        let e = errors(results);
        assert!(e[1].contains("did not prove the job secret"), "{}", e[1]);
        assert!(e[0].contains("rank(s) 1 did not arrive"), "{}", e[0]);
        assert!(
            e[0].contains("the last connection refused: one claiming rank 1"),
            "{}",
            e[0]
        );
    }

    /// A process listening at the job's address that answers Hello with Welcome (never proving
    /// the secret) is refused by a member that has one. (Fails if the member takes any Welcome.)
    #[test]
    fn a_member_refuses_a_welcome_without_a_challenge() {
        let port = free_port();
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let mut job = envs("welcome", &[1], 2, Some(("127.0.0.1".to_string(), port)));
        job[0].secret = Some(JobSecret::generate().unwrap());
        let env = job.remove(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let (tcp, _) = listener.accept().unwrap();
                let mut stream = Stream::Tcp(tcp);
                let soon = Instant::now() + Duration::from_secs(5);
                let hello = recv_frame(&mut stream, 1 << 10, soon).unwrap();
                assert_eq!(hello.kind, Kind::Hello);
                send_frame(&mut stream, Kind::Welcome, 0, &[], soon).unwrap();
                // Keep the connection open until the member has decided.
                let _ = recv_frame(&mut stream, 1 << 10, soon);
            });
            let e = format!(
                "{:#}",
                Rendezvous::connect(&env, Duration::from_secs(5))
                    .map(drop)
                    .unwrap_err()
            );
            assert!(
                e.contains("answered with welcome instead of proving"),
                "{e}"
            );
        });
    }

    #[test]
    fn a_member_without_the_secret_is_told_why() {
        let master = Some(("127.0.0.1".to_string(), free_port()));
        let mut job = envs("absent", &[0, 1], 2, master);
        job[0].secret = Some(JobSecret::generate().unwrap());
        job[1].insecure_tcp = true;
        let results = on_threads(job, |env| {
            Rendezvous::connect(&env, Duration::from_secs(2)).map(drop)
        });
        let e = errors(results);
        assert!(e[1].contains("rank 0 requires the job secret"), "{}", e[1]);
    }

    #[test]
    fn missing_rank_is_named() {
        let start = Instant::now();
        let results = on_threads(envs("missing", &[0, 1], 3, None), |env| {
            Rendezvous::connect(&env, Duration::from_secs(1)).map(drop)
        });
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "took {:?}",
            start.elapsed()
        );
        for e in errors(results) {
            assert!(
                e.contains("rank(s) 2 did not arrive within 1 s (world 3)"),
                "{e}"
            );
        }
    }

    #[test]
    fn member_without_root_gives_up() {
        let start = Instant::now();
        let env = &envs("noroot", &[1], 2, None)[0];
        let e = Rendezvous::connect(env, Duration::from_millis(300))
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 1 could not reach rank 0 at unix:") && e.contains("within 300 ms"),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(3));
    }

    #[test]
    fn different_world_sizes_are_reported_to_both() {
        let mut envs = envs("world", &[0, 1], 2, None);
        envs[1].world = 3;
        envs[1].local_world = 3;
        let results = on_threads(envs, |env| Rendezvous::connect(&env, CONNECT).map(drop));
        for e in errors(results) {
            assert!(
                e.contains("rank 1 was started with world size 3, rank 0 with 2"),
                "{e}"
            );
        }
    }

    #[test]
    fn duplicate_rank_is_reported() {
        let results = on_threads(envs("dup", &[0, 1, 1], 3, None), |env| {
            Rendezvous::connect(&env, Duration::from_secs(3)).map(drop)
        });
        for e in errors(results) {
            assert!(e.contains("rank 1 connected twice"), "{e}");
        }
    }

    #[test]
    fn mismatched_collectives_are_reported() {
        let results = on_threads(envs("kind", &[0, 1], 2, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.barrier()?;
            if env.rank == 0 {
                rdzv.all_gather(b"x").map(drop)
            } else {
                rdzv.barrier()
            }
        });
        for e in errors(results) {
            assert!(
                e.contains("rank 1 called barrier but rank 0 called all_gather in collective #2"),
                "{e}"
            );
        }
        let results = on_threads(envs("root", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.broadcast(if env.rank == 2 { 2 } else { 1 }, b"x")
                .map(drop)
        });
        for e in errors(results) {
            assert!(
                e.contains(
                    "rank 2 called broadcast with root 2 but rank 0 with root 1 in collective #1"
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn abort_reaches_every_rank_and_poisons_later_calls() {
        let results = on_threads(envs("abort", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.barrier()?;
            if env.rank == 2 {
                rdzv.abort("out of memory on GPU 2");
            }
            let first = format!("{:#}", rdzv.barrier().unwrap_err());
            let start = Instant::now();
            let again = format!("{:#}", rdzv.all_gather(b"x").unwrap_err());
            assert!(start.elapsed() < Duration::from_secs(1));
            assert!(again.contains("already failed"), "{again}");
            Err(anyhow!(first))
        });
        let errors = errors(results);
        for e in &errors[..2] {
            assert!(e.contains("rank 2 failed: out of memory on GPU 2"), "{e}");
        }
        assert!(
            errors[2].contains("this rank aborted: out of memory on GPU 2"),
            "{}",
            errors[2]
        );
    }

    #[test]
    fn root_abort_reaches_members() {
        let results = on_threads(envs("rootabort", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            if env.rank == 0 {
                rdzv.abort("bad input");
                return Err(anyhow!("rank 0 aborted"));
            }
            rdzv.barrier()
        });
        for e in &errors(results)[1..] {
            assert!(e.contains("rank 0 failed: bad input"), "{e}");
        }
    }

    #[test]
    fn late_rank_is_named_by_everyone() {
        let results = on_threads(envs("late", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.set_timeout(Duration::from_secs(1));
            if env.rank == 2 {
                std::thread::sleep(Duration::from_secs(3));
            }
            let start = Instant::now();
            let result = rdzv.barrier();
            // Ranks 0 and 1 give up after the timeout, before rank 2 even arrives.
            if env.rank < 2 {
                assert!(
                    start.elapsed() < Duration::from_millis(2500),
                    "{:?}",
                    start.elapsed()
                );
            }
            result
        });
        for e in errors(results) {
            assert!(
                e.contains("timed out after 1 s waiting for rank 2 in collective #1"),
                "{e}"
            );
        }
    }

    #[test]
    fn closed_member_is_named() {
        let results = on_threads(envs("closed", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.barrier()?;
            if env.rank == 2 {
                drop(rdzv);
                return Err(anyhow!("rank 2 left"));
            }
            rdzv.barrier()
        });
        for e in &errors(results)[..2] {
            assert!(
                e.contains("rank 2 closed its connection (exited or crashed) during collective #2"),
                "{e}"
            );
        }
    }

    #[test]
    fn closed_root_is_named() {
        let results = on_threads(envs("closedroot", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.barrier()?;
            if env.rank == 0 {
                drop(rdzv);
                return Err(anyhow!("rank 0 left"));
            }
            // Give rank 0 time to close first.
            std::thread::sleep(Duration::from_millis(100));
            rdzv.barrier()
        });
        for e in &errors(results)[1..] {
            assert!(
                e.contains("rank 0 closed its connection (exited or crashed) during collective #2"),
                "{e}"
            );
        }
    }

    #[test]
    fn payload_limits() {
        let results = on_threads(envs("limit", &[0, 1], 2, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.set_max_payload(100);
            rdzv.all_gather(&vec![0u8; if env.rank == 1 { 101 } else { 100 }])
                .map(drop)
        });
        for e in errors(results) {
            assert!(
                e.contains("rank 1 passed 101 bytes to all_gather, over the limit of 100 bytes"),
                "{e}"
            );
        }
        let results = on_threads(envs("limit", &[0, 1, 2], 3, None), |env| {
            let mut rdzv = Rendezvous::connect(&env, CONNECT)?;
            rdzv.set_max_payload(100);
            rdzv.all_gather(&[7u8; 60]).map(drop)
        });
        for e in errors(results) {
            assert!(
                e.contains(
                    "all_gather result of 180 bytes (world 3) exceeds the limit of 100 bytes"
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn address_errors() {
        let mut multi = rank_env(1, 4, "multi", None);
        multi.local_world = 2;
        let e = Rendezvous::connect(&multi, CONNECT)
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "a multi-node job needs MASTER_ADDR and MASTER_PORT (or WEFT_MASTER_ADDR/PORT)"
            ),
            "{e}"
        );
        let mut no_job = rank_env(0, 2, "x", None);
        no_job.job_id = None;
        let e = Rendezvous::connect(&no_job, CONNECT)
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("set WEFT_JOB_ID") && e.contains("MASTER_ADDR/MASTER_PORT"),
            "{e}"
        );
    }

    #[test]
    fn stale_socket_is_replaced_and_live_one_refused() {
        let envs1 = envs("stale", &[0, 1], 2, None);
        let path = unix_socket_path(envs1[0].job_id.as_deref().unwrap()).unwrap();
        drop(UnixListener::bind(&path).unwrap()); // leaves a dead socket file behind
        assert!(path.exists());
        for result in on_threads(envs1, |env| exercise(env, 3)) {
            result.unwrap();
        }
        assert!(!path.exists(), "the socket file outlived the handshake");

        let envs2 = envs("live", &[0], 2, None);
        let path = unix_socket_path(envs2[0].job_id.as_deref().unwrap()).unwrap();
        let live = UnixListener::bind(&path).unwrap();
        let e = Rendezvous::connect(&envs2[0], CONNECT)
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another rendezvous is already listening"), "{e}");
        drop(live);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn socket_names() {
        let p = unix_socket_path("job/with spaces:1").unwrap();
        let name = p.file_name().unwrap().to_str().unwrap();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        assert_eq!(name, format!("weft-rdzv-{uid}-job_with_spaces_1.sock"));
        let long_a = unix_socket_path(&format!("{}a", "x".repeat(200))).unwrap();
        let long_b = unix_socket_path(&format!("{}b", "x".repeat(200))).unwrap();
        assert_ne!(long_a, long_b);
        assert!(long_a.as_os_str().len() < 108, "{}", long_a.display());
    }

    #[test]
    fn timeout_variable() {
        assert_eq!(op_timeout(None).unwrap(), Duration::from_secs(300));
        assert_eq!(
            op_timeout(Some("2.5".into())).unwrap(),
            Duration::from_millis(2500)
        );
        for bad in ["0", "-1", "abc", "", "inf"] {
            let e = op_timeout(Some(bad.into())).unwrap_err().to_string();
            assert!(
                e.contains("WEFT_RDZV_TIMEOUT") && e.contains("positive number of seconds"),
                "{e}"
            );
        }
    }

    #[test]
    fn part_encoding() {
        let parts = vec![b"a".to_vec(), vec![], b"xyz".to_vec()];
        let mut bytes = Vec::new();
        for p in &parts {
            bytes.extend_from_slice(&(p.len() as u64).to_le_bytes());
            bytes.extend_from_slice(p);
        }
        assert_eq!(decode_parts(&bytes, 3), Some(parts));
        assert_eq!(decode_parts(&bytes, 2), None);
        assert_eq!(decode_parts(&bytes[..bytes.len() - 1], 3), None);
        assert_eq!(fmt_duration(Duration::from_secs(5)), "5 s");
        assert_eq!(fmt_duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(fmt_duration(Duration::from_millis(2500)), "2.5 s");
    }
}
