//! Joining: rank 0 accepts one connection at a time until every rank has said Hello (and,
//! with a job secret, proved it); a stranger is told why and dropped. Members connect,
//! retrying, check rank 0's proof and wait for Welcome.

use super::*;

impl Rendezvous {
    /// Rank 0's handshake: accepts until every rank 1..world has said Hello (and, with a job
    /// secret, proved it), then welcomes all. A connection that does not prove the secret is a
    /// stranger: told why and dropped, and rank 0 keeps accepting — it cannot take a rank's
    /// place, nor end the job with a bad Hello. (Connections are handled one at a time, each
    /// within CONTROL_TIMEOUT: one that stalls delays rank 0 by that much, and enough of them can
    /// run out its connect deadline.)
    pub(super) fn accept_members(
        &self,
        endpoint: &Endpoint,
        secret: Option<&JobSecret>,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Vec<Stream>, PglError> {
        let address = &self.address;
        let world = self.world;
        let listener = endpoint
            .listen()
            .map_err(|e| PglError::rendezvous(Why::Transport, format!("{e:#}")))?;
        listener
            .set_nonblocking()
            .map_err(|e| failure(Why::Transport, address, e))?;
        let mut members: Vec<Option<Stream>> = (1..world).map(|_| None).collect();
        // The last connection refused for the secret, for the timeout's message.
        let mut refused: Option<String> = None;
        // Aborts every connected member (and `extra`) with `text`, and returns the error.
        let reject = |members: &mut Vec<Option<Stream>>,
                      extra: Option<&mut Stream>,
                      why: Why,
                      text: String| {
            for m in members.iter_mut().flatten().chain(extra) {
                send_abort(m, 0, &text);
            }
            failure(why, address, text)
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
                return Err(reject(
                    &mut members,
                    None,
                    Why::Timeout { ranks: missing },
                    text,
                ));
            }
            match poll_readable(&[listener.fd()], left) {
                Ok(ready) if ready[0] => {}
                Ok(_) => continue,
                Err(e) => {
                    let text = format!("poll failed: {e}");
                    return Err(reject(&mut members, None, Why::Transport, text));
                }
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
            return Err(reject(&mut members, Some(&mut stream), Why::Mismatch, text));
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
                return Err(failure(Why::PeerGone { rank: r }, address, text));
            }
        }
        Ok(members)
    }

    /// A member's handshake: connects (retrying), says Hello, with a job secret checks rank 0's
    /// proof and sends its own, waits for Welcome.
    pub(super) fn join_root(
        &self,
        endpoint: &Endpoint,
        secret: Option<&JobSecret>,
        connect_timeout: Duration,
        deadline: Instant,
    ) -> Result<Stream, PglError> {
        let address = &self.address;
        let mut stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt =
                endpoint.connect(left.clamp(Duration::from_millis(1), Duration::from_secs(1)));
            match attempt {
                Ok(s) => break s,
                Err(e) if left.is_zero() => {
                    return Err(PglError::rendezvous(
                        Why::Timeout { ranks: vec![0] },
                        format!(
                        "rank {} could not reach rank 0 at {address} within {} (last error: {e})",
                        self.rank,
                        fmt_duration(connect_timeout)
                    ),
                    ))
                }
                Err(_) => std::thread::sleep(RETRY_INTERVAL.min(left)),
            }
        };
        let my_nonce = crate::job_secret::nonce().map_err(PglError::Runtime)?;
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
                return Err(failure(Why::Unauthenticated, address, format!(
                    "the process listening there answered with {} instead of proving the job secret ({SECRET_VAR}): it is not this job's rank 0",
                    f.kind.name()
                )));
            }
            if f.kind == Kind::Challenge {
                let (rank, world) = (self.rank as u64, self.world as u64);
                let good = f.payload.len() == NONCE_BYTES + PROOF_BYTES && {
                    let (their_nonce, proof) = f.payload.split_at(NONCE_BYTES);
                    s.verify(AuthRole::Root, rank, world, (&my_nonce, their_nonce), proof)
                };
                if !good {
                    return Err(failure(Why::Unauthenticated, address, format!(
                        "the process listening there did not prove the job secret ({SECRET_VAR}): this rank's secret differs from rank 0's (two `weft launch` runs each make their own), or it is not this job's rank 0; only this rank's Hello (rank, world, a nonce) was sent to it"
                    )));
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
        let (why, text) = match reply {
            Ok(f) if f.kind == Kind::Welcome => return Ok(stream),
            Ok(f) if f.kind == Kind::Abort => {
                let text = String::from_utf8_lossy(&f.payload).into_owned();
                let why = if is_secret_refusal(&text) {
                    Why::Unauthenticated
                } else {
                    Why::Aborted
                };
                (why, text)
            }
            Ok(f) => (
                Why::Mismatch,
                format!(
                    "unexpected {} from rank 0 during the handshake",
                    f.kind.name()
                ),
            ),
            Err(WireError::Closed) => (
                Why::PeerGone { rank: 0 },
                "rank 0 closed the connection during the handshake".into(),
            ),
            Err(WireError::TimedOut) => (
                Why::Timeout { ranks: vec![0] },
                format!(
                    "rank 0 accepted the connection but did not finish the handshake within {}",
                    fmt_duration(wait)
                ),
            ),
            Err(WireError::Io(e)) => (
                Why::PeerGone { rank: 0 },
                format!("connection to rank 0 failed during the handshake: {e}"),
            ),
            Err(WireError::Invalid(what)) => (
                Why::Mismatch,
                format!("rank 0 sent an invalid message during the handshake: {what}"),
            ),
        };
        Err(failure(why, address, text))
    }
}

/// Hello: rank and world (u64 each), whether the member has a job secret (one byte), its nonce.
pub(super) const HELLO_BYTES: usize = 8 + 8 + 1 + NONCE_BYTES;

/// How every refusal of `prove_to_member` begins (and only those: a member whose Abort begins
/// so was refused for the secret; rank 0's other Aborts may quote one later in their text, as
/// the timeout's "the last connection refused: …" does).
const SECRET_REFUSAL: &str = "refused for the job secret";

/// Whether rank 0's Abort `text` is a refusal of this process for the job secret.
pub(super) fn is_secret_refusal(text: &str) -> bool {
    text.starts_with(SECRET_REFUSAL)
}

/// Rank 0's side of the secret: `Err(why)` when the member that said Hello (`rank`, `world`,
/// whether it has a secret, its nonce) cannot join — no secret where rank 0 has one or the
/// reverse, or no valid proof of rank 0's. With a secret: sends rank 0's nonce and proof, reads
/// and checks the member's proof by `deadline`.
pub(super) fn prove_to_member(
    stream: &mut Stream,
    secret: Option<&JobSecret>,
    (rank, world, has_secret, their_nonce): (u64, u64, bool, &[u8]),
    deadline: Instant,
) -> std::result::Result<(), String> {
    let s = match (secret, has_secret) {
        (None, false) => return Ok(()),
        (None, true) => return Err(format!("{SECRET_REFUSAL}: this process has a job secret ({SECRET_VAR}) and rank 0 has none; start every rank with the same one")),
        (Some(_), false) => return Err(format!("{SECRET_REFUSAL}: rank 0 requires the job secret ({SECRET_VAR}) and this process has none; start every rank with the same one")),
        (Some(s), true) => s,
    };
    let my_nonce = crate::job_secret::nonce().map_err(|e| format!("rank 0: {e:#}"))?;
    let proof = s.proof(AuthRole::Root, rank, world, (their_nonce, &my_nonce));
    send_frame(stream, Kind::Challenge, 0, &[&my_nonce, &proof], deadline).map_err(|_| {
        format!("{SECRET_REFUSAL}: the connection closed during the secret's exchange")
    })?;
    let answer = recv_frame(stream, PROOF_BYTES, deadline)
        .map_err(|_| format!("{SECRET_REFUSAL}: no proof of the job secret came back in time"))?;
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
            "{SECRET_REFUSAL}: rank 0 refused this process: its proof of the job secret ({SECRET_VAR}) did not match"
        ))
    }
}
