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
//!
//! Here: the collectives and the failure protocol; `wire` the frames, `transport` the sockets,
//! `handshake` who may join.

mod handshake;
#[cfg(test)]
mod tests;
mod transport;
mod wire;

use crate::error::{PglError, RendezvousFailure as Why};
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

use transport::*;
use wire::*;

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
fn op_timeout(value: Option<String>) -> Result<Duration, PglError> {
    let Some(v) = value else {
        return Ok(DEFAULT_TIMEOUT);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(PglError::Setting {
            var: TIMEOUT_VAR,
            value: v,
            reason: "is not a positive number of seconds".into(),
        }),
    }
}

/// A rendezvous failure of kind `why` at `address`.
fn failure(why: Why, address: &str, text: impl std::fmt::Display) -> PglError {
    PglError::rendezvous(why, format!("rendezvous at {address}: {text}"))
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
    /// Set by the first failure (its kind and text); later calls return it at once.
    failed: Option<(Why, String)>,
    max_payload: usize,
}

// The harness keeps a Rendezvous in Arc<Mutex<_>>.
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Rendezvous>()
};

impl Rendezvous {
    /// Rank 0 listens, the others connect (retrying until `connect_timeout`). Errors:
    /// `PglError::Setting` (WEFT_RDZV_TIMEOUT), `PglError::Rendezvous` (a rank that did not
    /// arrive, a stranger refused, the secret missing over TCP, …).
    pub fn connect(env: &RankEnv, connect_timeout: Duration) -> Result<Self, PglError> {
        let timeout =
            op_timeout(std::env::var_os(TIMEOUT_VAR).map(|v| v.to_string_lossy().into_owned()))?;
        if env.world == 0 || env.rank >= env.world {
            return Err(PglError::rendezvous(
                Why::Refused,
                format!(
                    "rendezvous: rank {} is not below world size {}",
                    env.rank, env.world
                ),
            ));
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
        let endpoint = Endpoint::for_env(env).map_err(|e| match PglError::from_anyhow(e) {
            PglError::Runtime(e) => PglError::rendezvous(Why::Transport, format!("{e:#}")),
            typed => typed,
        })?;
        rdzv.address = endpoint.describe();
        if matches!(endpoint, Endpoint::Tcp { .. }) && env.secret.is_none() && !env.insecure_tcp {
            return Err(PglError::rendezvous(Why::Refused, format!(
                "rank {}: the rendezvous at {} is over TCP, where anyone who can reach the port could join: set {SECRET_VAR} to the same secret on every rank (`weft secret` prints one; `weft launch` sets it) or, on a trusted network, {INSECURE_VAR}=1",
                env.rank,
                rdzv.address
            )));
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
    pub fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, PglError> {
        self.begin(Kind::AllGather, bytes.len())?;
        if matches!(self.role, Role::Single) {
            return Ok(vec![bytes.to_vec()]);
        }
        if matches!(self.role, Role::Member { .. }) {
            let reply = self.member_exchange(Kind::AllGather, &[bytes])?;
            return match decode_parts(&reply, self.world) {
                Some(parts) => Ok(parts),
                None => Err(self.fail(
                    Why::Mismatch,
                    "rank 0 sent a malformed all_gather result".into(),
                    true,
                )),
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
            return Err(self.fail(Why::Refused, text, true));
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
    pub fn broadcast(&mut self, root: usize, bytes: &[u8]) -> Result<Vec<u8>, PglError> {
        let own = if self.rank == root { bytes } else { &[][..] };
        self.begin(Kind::Broadcast, own.len())?;
        if root >= self.world {
            let text = format!(
                "rank {} called broadcast with root {root}, which is not below world size {}",
                self.rank, self.world
            );
            return Err(self.fail(Why::Refused, text, true));
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
                return Err(self.fail_root(Why::Mismatch, text));
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
    pub fn barrier(&mut self) -> Result<(), PglError> {
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
        self.failed = Some((Why::Aborted, format!("this rank aborted: {message}")));
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
    fn begin(&mut self, kind: Kind, payload_len: usize) -> Result<(), PglError> {
        if let Some((why, text)) = &self.failed {
            return Err(PglError::rendezvous(
                why.clone(),
                format!("rendezvous at {} already failed: {text}", self.address),
            ));
        }
        self.seq += 1;
        if payload_len > self.max_payload {
            let text = format!(
                "rank {} passed {payload_len} bytes to {}, over the limit of {} bytes",
                self.rank,
                kind.name(),
                self.max_payload
            );
            return Err(self.fail(Why::Refused, text, true));
        }
        Ok(())
    }

    /// Records the failure and tells the other ranks: rank 0 tells every member; a member tells
    /// rank 0 when `tell_others` (not when the failure came from rank 0).
    fn fail(&mut self, why: Why, text: String, tell_others: bool) -> PglError {
        if matches!(self.role, Role::Root { .. }) {
            return self.fail_root(why, text);
        }
        if let (true, Role::Member { root }) = (tell_others, &mut self.role) {
            send_abort(root, self.seq, &text);
        }
        let e = failure(why.clone(), &self.address, &text);
        self.failed = Some((why, text));
        e
    }

    /// Rank 0's failure: every member gets an Abort carrying `text` (the culprit too: after a
    /// mismatch it is alive and waiting; when it is gone, the send fails quietly).
    fn fail_root(&mut self, why: Why, text: String) -> PglError {
        if let Role::Root { members } = &mut self.role {
            for m in members.iter_mut() {
                send_abort(m, self.seq, &text);
            }
        }
        let e = failure(why.clone(), &self.address, &text);
        self.failed = Some((why, text));
        e
    }

    /// Rank 0: receives collective `self.seq` of kind `kind` from every member. Returns payloads
    /// indexed by rank (index 0 left empty).
    fn root_gather(&mut self, kind: Kind) -> Result<Vec<Vec<u8>>, PglError> {
        let (seq, timeout, max_frame) = (self.seq, self.timeout, self.max_frame());
        let result = match &mut self.role {
            Role::Root { members } => gather_from(members, kind, seq, timeout, max_frame),
            _ => Err((
                Why::Refused,
                "internal error: gather on a rank other than 0".into(),
            )),
        };
        result.map_err(|(why, text)| self.fail_root(why, text))
    }

    /// Rank 0: sends the result of collective `self.seq` to every member.
    fn root_reply(&mut self, pieces: &[&[u8]]) -> Result<(), PglError> {
        let (seq, timeout) = (self.seq, self.timeout);
        let deadline = Instant::now() + timeout;
        let Role::Root { members } = &mut self.role else {
            return Err(self.fail_root(
                Why::Refused,
                "internal error: reply from a rank other than 0".into(),
            ));
        };
        for (i, m) in members.iter_mut().enumerate() {
            if let Err(e) = send_frame(m, Kind::Result, seq, pieces, deadline) {
                let why = wire_failure(&e, i + 1);
                let text = wire_error_text(e, i + 1, "sending to", timeout, seq);
                return Err(self.fail_root(why, text));
            }
        }
        Ok(())
    }

    /// A member: sends its part of collective `self.seq` and waits for rank 0's result.
    fn member_exchange(&mut self, kind: Kind, pieces: &[&[u8]]) -> Result<Vec<u8>, PglError> {
        let seq = self.seq;
        let waited = self.timeout + MEMBER_SLACK;
        let deadline = Instant::now() + waited;
        let max_frame = self.max_frame();
        let Role::Member { root } = &mut self.role else {
            return Err(self.fail(
                Why::Refused,
                "internal error: member exchange on rank 0".into(),
                false,
            ));
        };
        let sent = send_frame(root, kind, seq, pieces, deadline);
        // After a failed send, rank 0 may still have left an Abort explaining why.
        let reply_deadline = if sent.is_ok() {
            deadline
        } else {
            Instant::now() + ABORT_SEND_TIMEOUT
        };
        let reply = recv_frame(root, max_frame, reply_deadline);
        let (why, text, tell_root) = match (sent, reply) {
            (_, Ok(f)) if f.kind == Kind::Abort => (
                Why::Aborted,
                String::from_utf8_lossy(&f.payload).into_owned(),
                false,
            ),
            (Ok(()), Ok(f)) if f.kind == Kind::Result && f.seq == seq => return Ok(f.payload),
            (Ok(()), Ok(f)) => (
                Why::Mismatch,
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
                let why = wire_failure(&e, 0);
                (why, wire_error_text(e, 0, "waiting for", waited, seq), tell)
            }
        };
        Err(self.fail(why, text, tell_root))
    }
}

/// weft's own bootstrap: the inherent collectives, unchanged.
impl crate::Bootstrap for Rendezvous {
    fn rank(&self) -> usize {
        Rendezvous::rank(self)
    }

    fn world(&self) -> usize {
        Rendezvous::world(self)
    }

    fn exchange(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(Rendezvous::all_gather(self, bytes)?)
    }

    fn broadcast(&mut self, root: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(Rendezvous::broadcast(self, root, bytes)?)
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(Rendezvous::barrier(self)?)
    }
}

/// Rank 0's side of a collective: reads one frame of `kind` and `seq` from every member,
/// whichever is ready first, all within `timeout`. On failure: the text, naming the rank.
fn gather_from(
    members: &mut [Stream],
    kind: Kind,
    seq: u64,
    timeout: Duration,
    max_frame: usize,
) -> Result<Vec<Vec<u8>>, (Why, String)> {
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
            return Err((Why::Timeout { ranks: pending }, text));
        }
        let fds: Vec<RawFd> = pending.iter().map(|&r| members[r - 1].fd()).collect();
        let ready = poll_readable(&fds, left).map_err(|e| {
            (
                Why::Transport,
                format!("poll failed in collective #{seq}: {e}"),
            )
        })?;
        for (&r, _) in pending.iter().zip(ready).filter(|(_, ready)| *ready) {
            let failed = match recv_frame(&mut members[r - 1], max_frame, deadline) {
                Ok(f) if f.kind == Kind::Abort => (
                    Why::Aborted,
                    format!("rank {r} failed: {}", String::from_utf8_lossy(&f.payload)),
                ),
                Ok(f) if f.seq != seq => (
                    Why::Mismatch,
                    format!(
                        "rank {r} is at collective #{} but rank 0 at #{seq}: the ranks called different numbers of \
                         collectives",
                        f.seq
                    ),
                ),
                Ok(f) if f.kind != kind => (
                    Why::Mismatch,
                    format!("rank {r} called {} but rank 0 called {} in collective #{seq}", f.kind.name(), kind.name()),
                ),
                Ok(f) => {
                    parts[r] = Some(f.payload);
                    continue;
                }
                Err(e) => (wire_failure(&e, r), wire_error_text(e, r, "waiting for", timeout, seq)),
            };
            return Err(failed);
        }
    }
}
