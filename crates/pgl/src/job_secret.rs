//! The per-job secret every rendezvous member proves it knows, and rank 0 proves to each member:
//! HMAC-SHA256 over the member's rank and world and both sides' fresh nonces, so nothing that
//! could be replayed or that reveals the secret crosses the wire (rendezvous/handshake.rs).
//!
//! `WEFT_JOB_SECRET` holds it: 64 hex digits (32 bytes), the same on every rank. `weft launch`
//! makes one for its ranks when the variable is unset; under mpirun, srun or torchrun export it
//! to every rank (`weft secret` prints a fresh one). Over TCP (MASTER_ADDR) a rendezvous without
//! it is refused unless `WEFT_RDZV_INSECURE=1` says the network is trusted; over the Unix socket
//! (one host) it is optional — the socket's private directory and the peer's uid keep other
//! users out, the secret keeps out the user's other processes.

use crate::error::PglError;
use anyhow::{Context, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Read;

/// The variable that holds the secret.
pub const SECRET_VAR: &str = "WEFT_JOB_SECRET";
/// `1`: a TCP rendezvous without a secret is allowed (a trusted network).
pub const INSECURE_VAR: &str = "WEFT_RDZV_INSECURE";

/// Bytes of a secret; nonces are half as long.
const SECRET_BYTES: usize = 32;
pub(crate) const NONCE_BYTES: usize = 16;
/// Bytes of a proof (HMAC-SHA256).
pub(crate) const PROOF_BYTES: usize = 32;

#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(…)")
    }
}

/// `n` bytes from the kernel's random source.
fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("reading /dev/urandom")?;
    Ok(b)
}

/// A fresh nonce for one handshake.
pub(crate) fn nonce() -> Result<[u8; NONCE_BYTES]> {
    random()
}

/// Whose proof: rank 0's (to a member) or a member's (to rank 0); a proof of one role is never
/// accepted as the other's.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Root,
    Member,
}

impl JobSecret {
    /// A fresh secret (`PglError::Runtime` if the system's random source fails).
    pub fn generate() -> Result<Self, PglError> {
        Ok(Self(random().map_err(PglError::Runtime)?))
    }

    /// 64 hex digits (either case). Errors: `PglError::Launcher` (the secret's variable is the
    /// launcher's to set).
    pub fn parse(text: &str) -> Result<Self, PglError> {
        let text = text.trim();
        if text.len() != 2 * SECRET_BYTES || !text.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(PglError::Launcher(format!(
                "{SECRET_VAR} must be {} hex digits ({SECRET_BYTES} bytes; `weft secret` prints one), got {} characters",
                2 * SECRET_BYTES,
                text.len()
            )));
        }
        let mut b = [0u8; SECRET_BYTES];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("checked hex digits");
        }
        Ok(Self(b))
    }

    /// The 64 hex digits `parse` reads.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn mac(&self, role: Role, rank: u64, world: u64, nonces: (&[u8], &[u8])) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(match role {
            Role::Root => b"weft rendezvous: rank 0",
            Role::Member => b"weft rendezvous: member",
        });
        mac.update(&rank.to_le_bytes());
        mac.update(&world.to_le_bytes());
        mac.update(nonces.0);
        mac.update(nonces.1);
        mac
    }

    /// `role`'s proof for the handshake of member `rank` of `world` with nonces (member's, rank 0's).
    pub(crate) fn proof(
        &self,
        role: Role,
        rank: u64,
        world: u64,
        nonces: (&[u8], &[u8]),
    ) -> [u8; PROOF_BYTES] {
        self.mac(role, rank, world, nonces)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Whether `proof` is `role`'s for that handshake (constant-time comparison).
    pub(crate) fn verify(
        &self,
        role: Role,
        rank: u64,
        world: u64,
        nonces: (&[u8], &[u8]),
        proof: &[u8],
    ) -> bool {
        self.mac(role, rank, world, nonces)
            .verify_slice(proof)
            .is_ok()
    }
}

/// The secret from `value` (the variable's), if set.
pub(crate) fn from_var(value: Option<String>) -> Result<Option<JobSecret>> {
    value
        .map(|v| JobSecret::parse(&v).with_context(|| format!("reading {SECRET_VAR}")))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_round_trip_and_bad_ones_are_named() {
        let s = JobSecret::generate().unwrap();
        assert_eq!(JobSecret::parse(&s.to_hex()).unwrap(), s);
        assert_eq!(JobSecret::parse(&s.to_hex().to_uppercase()).unwrap(), s);
        assert_ne!(JobSecret::generate().unwrap(), s);
        let err = |t: &str| match JobSecret::parse(t) {
            Err(PglError::Launcher(text)) => text,
            other => panic!("expected PglError::Launcher, got {other:?}"),
        };
        assert!(err("abc").contains("64 hex digits"));
        assert!(err(&"g".repeat(64)).contains("64 hex digits"));
        assert_eq!(format!("{s:?}"), "JobSecret(…)");
    }

    #[test]
    fn a_proof_binds_the_secret_the_role_the_rank_and_both_nonces() {
        let (s, t) = (
            JobSecret::generate().unwrap(),
            JobSecret::generate().unwrap(),
        );
        let (m, r) = ([1u8; 16], [2u8; 16]);
        let p = s.proof(Role::Member, 3, 4, (&m, &r));
        assert!(s.verify(Role::Member, 3, 4, (&m, &r), &p));
        assert!(!t.verify(Role::Member, 3, 4, (&m, &r), &p));
        assert!(!s.verify(Role::Root, 3, 4, (&m, &r), &p));
        assert!(!s.verify(Role::Member, 2, 4, (&m, &r), &p));
        assert!(!s.verify(Role::Member, 3, 5, (&m, &r), &p));
        assert!(!s.verify(Role::Member, 3, 4, (&r, &m), &p));
        assert!(!s.verify(Role::Member, 3, 4, (&m, &r), &p[..31]));
    }
}
