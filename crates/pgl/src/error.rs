//! What weft-pgl's calls refuse or report, typed so that a caller can match on the kind: the
//! launcher's variables, a setting, the rendezvous (who did not answer, who left, who could not
//! prove the job secret), ranks that disagree, shapes, NCCL, the driver. The messages are the
//! ones weft printed before these types existed; each variant keeps its text.

use cudarc::driver::DriverError;
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PglError {
    /// The launcher's variables are missing, malformed or contradict each other (rank, world,
    /// local rank, master address and port, Slurm's task lists, the job secret's variable).
    #[error("{0}")]
    Launcher(String),
    /// A weft setting (an environment variable weft reads) that is not one.
    #[error("{var}={value:?} {reason}")]
    Setting {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// weft's rendezvous failed: what went wrong, typed, and the message (which names the
    /// address and the ranks involved).
    #[error("{text}")]
    Rendezvous {
        failure: RendezvousFailure,
        text: String,
    },
    /// The ranks' arguments differ, or some rank refused a collective step (the text names each
    /// failing rank and what it reported, the same on every rank).
    #[error("{0}")]
    RanksDisagree(String),
    /// A shape, tile grid or rank count that does not fit.
    #[error("{0}")]
    Shape(String),
    /// A length that runs past a buffer (a host copy longer than the PGL, …).
    #[error("{0}")]
    Length(String),
    /// What this machine, driver or GPU cannot do as asked (peer access, the allocation backend,
    /// NCCL missing, NVLink multicast where it is not allowed).
    #[error("{0}")]
    Unsupported(String),
    /// An NCCL call failed or ran past its budget (the text names the rank and the call); the
    /// communicator was aborted unless the failure was a refused argument.
    #[error("{text}")]
    Nccl { failure: NcclFailure, text: String },
    /// The CUDA driver's error.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// Anything else: allocation, mapping, I/O, a [`crate::Bootstrap`] of the caller's own
    /// that failed (weft's rendezvous fails as `Rendezvous`).
    #[error(transparent)]
    Runtime(anyhow::Error),
}

/// Why weft's rendezvous failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RendezvousFailure {
    /// These ranks did not answer within the bound (rank 0, when a member waited for it).
    Timeout { ranks: Vec<usize> },
    /// A rank closed its connection (exited or crashed) or its connection broke.
    PeerGone { rank: usize },
    /// Another rank failed and told this one (its text says which and why); or this rank
    /// aborted the rendezvous itself.
    Aborted,
    /// The ranks called different collectives (count, kind, broadcast root, world size, a rank
    /// started twice) or a peer sent a malformed message.
    Mismatch,
    /// A process could not prove the job secret, or the process listening is not this job's
    /// rank 0 (a stranger is refused and the job carries on; this is the refused side's error).
    Unauthenticated,
    /// This rank's own call cannot be made (payload over the limit, a root outside the world, a
    /// rank outside the world, TCP without a job secret or the waiver).
    Refused,
    /// Sockets: resolving, listening, connecting, polling.
    Transport,
}

/// Why an NCCL call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclFailure {
    /// NCCL returned this result code.
    Failed(i32),
    /// The call (or the stream's work) did not finish within the budget (how long was waited).
    TimedOut { budget: Duration, waited: Duration },
    /// The stream reported this CUDA error while NCCL's work was on it.
    Stream(i32),
    /// The communicator was aborted by an earlier failure.
    Aborted,
    /// An argument NCCL or weft refused before anything was enqueued (sizes, ranks).
    Argument,
}

impl PglError {
    /// The typed error under `e` (through any context added on the way), else `Runtime`. A
    /// kind that carries a message keeps the whole one, context included (`with_text`).
    pub(crate) fn from_anyhow(e: anyhow::Error) -> Self {
        let whole = format!("{e:#}");
        let layered = e.chain().count() > 1;
        match e.downcast::<PglError>() {
            Ok(p) if layered => p.with_text(whole),
            Ok(p) => p,
            Err(e) => match e.downcast::<DriverError>() {
                Ok(d) if layered => PglError::Runtime(anyhow::Error::new(d).context(whole)),
                Ok(d) => PglError::Driver(d),
                Err(e) => PglError::Runtime(e),
            },
        }
    }

    /// A rendezvous failure of `failure` with `text`.
    pub(crate) fn rendezvous(failure: RendezvousFailure, text: String) -> Self {
        PglError::Rendezvous { failure, text }
    }

    /// The same kind with `text` as its message, where the kind carries one; other kinds
    /// (`Setting`, `Driver`, `Runtime`) unchanged.
    pub fn with_text(self, text: String) -> Self {
        match self {
            PglError::Launcher(_) => PglError::Launcher(text),
            PglError::RanksDisagree(_) => PglError::RanksDisagree(text),
            PglError::Shape(_) => PglError::Shape(text),
            PglError::Length(_) => PglError::Length(text),
            PglError::Unsupported(_) => PglError::Unsupported(text),
            PglError::Rendezvous { failure, .. } => PglError::Rendezvous { failure, text },
            PglError::Nccl { failure, .. } => PglError::Nccl { failure, text },
            other => other,
        }
    }
}

/// `r`'s error as a `PglError` (typed where one is inside).
pub(crate) fn typed<T>(r: anyhow::Result<T>) -> Result<T, PglError> {
    r.map_err(PglError::from_anyhow)
}

/// `body`'s outcome as a `PglError`: the public calls' boundary, whose bodies use `anyhow` inside.
pub(crate) fn typed_with<T>(body: impl FnOnce() -> anyhow::Result<T>) -> Result<T, PglError> {
    typed(body())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    /// A typed error keeps its kind through anyhow and context, and its text the context too.
    #[test]
    fn typed_errors_survive_context() {
        let e: anyhow::Error = Err::<(), _>(PglError::rendezvous(
            RendezvousFailure::Timeout { ranks: vec![2] },
            "rendezvous at x: timed out waiting for rank 2".into(),
        ))
        .context("allocating a PGL")
        .unwrap_err();
        match PglError::from_anyhow(e) {
            PglError::Rendezvous {
                failure: RendezvousFailure::Timeout { ranks },
                text,
            } => {
                assert_eq!(ranks, vec![2]);
                assert_eq!(
                    text,
                    "allocating a PGL: rendezvous at x: timed out waiting for rank 2"
                );
            }
            other => panic!("not a rendezvous timeout: {other:?}"),
        }
        let plain = PglError::from_anyhow(anyhow::anyhow!("mapping failed"));
        assert!(matches!(plain, PglError::Runtime(_)), "{plain:?}");
    }
}
