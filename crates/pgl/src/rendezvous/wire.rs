//! The wire format: frames `magic "WFRV" | kind u8 | seq u64 LE | len u64 LE | payload`, each
//! read or written within a deadline, and the texts that name a peer when one fails.

use super::*;

pub(super) const MAGIC: [u8; 4] = *b"WFRV";
pub(super) const HEADER_LEN: usize = 4 + 1 + 8 + 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
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
    pub(super) fn from_byte(b: u8) -> Option<Kind> {
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

    pub(super) fn name(self) -> &'static str {
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

pub(super) struct Frame {
    pub(super) kind: Kind,
    pub(super) seq: u64,
    pub(super) payload: Vec<u8>,
}

/// Why a frame could not be sent or received.
#[derive(Debug)]
pub(super) enum WireError {
    Closed,
    TimedOut,
    Io(io::Error),
    Invalid(String),
}

impl WireError {
    pub(super) fn from_io(e: io::Error) -> WireError {
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

pub(super) fn remaining(deadline: Instant) -> Result<Duration, WireError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(WireError::TimedOut)
    } else {
        Ok(left)
    }
}

/// read_exact, bounded by `deadline` overall (not per read call).
pub(super) fn read_exact_by(
    s: &mut Stream,
    mut buf: &mut [u8],
    deadline: Instant,
) -> Result<(), WireError> {
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
pub(super) fn write_all_by(
    s: &mut Stream,
    mut buf: &[u8],
    deadline: Instant,
) -> Result<(), WireError> {
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
pub(super) fn send_frame(
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

pub(super) fn recv_frame(
    s: &mut Stream,
    max_len: usize,
    deadline: Instant,
) -> Result<Frame, WireError> {
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
pub(super) fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(word.try_into().ok()?))
}

/// Best effort: tells a peer why this job is failing.
pub(super) fn send_abort(s: &mut Stream, seq: u64, text: &str) {
    let _ = send_frame(
        s,
        Kind::Abort,
        seq,
        &[text.as_bytes()],
        Instant::now() + ABORT_SEND_TIMEOUT,
    );
}

/// Names `peer` and collective `seq` in a send or receive failure; `waited` is the bound used.
pub(super) fn wire_error_text(
    e: WireError,
    peer: usize,
    doing: &str,
    waited: Duration,
    seq: u64,
) -> String {
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

/// The kind of failure a wire error with rank `peer` is.
pub(super) fn wire_failure(e: &WireError, peer: usize) -> crate::error::RendezvousFailure {
    use crate::error::RendezvousFailure as Why;
    match e {
        WireError::Closed | WireError::Io(_) => Why::PeerGone { rank: peer },
        WireError::TimedOut => Why::Timeout { ranks: vec![peer] },
        WireError::Invalid(_) => Why::Mismatch,
    }
}

/// Decodes `world` length-prefixed parts; None unless the bytes are exactly that.
pub(super) fn decode_parts(mut bytes: &[u8], world: usize) -> Option<Vec<Vec<u8>>> {
    let mut parts = Vec::with_capacity(world);
    for _ in 0..world {
        let len = usize::try_from(u64_at(bytes, 0)?).ok()?;
        let part = bytes.get(8..8usize.checked_add(len)?)?;
        parts.push(part.to_vec());
        bytes = &bytes[8 + len..];
    }
    bytes.is_empty().then_some(parts)
}
