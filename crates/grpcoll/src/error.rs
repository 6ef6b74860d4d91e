//! What a GroupCast / GroupReduce plan refuses or reports, typed so that a caller can match on it.

use thiserror::Error;
use weft_sync::SyncError;

#[derive(Debug, Error)]
pub enum GrpcollError {
    /// Arguments a plan cannot take: tensor count, row width, SM count, an option of the other
    /// collective, lse settings, a dtype pair without a kernel, device metadata asked of a host
    /// plan.
    #[error("{0}")]
    Options(String),
    /// This rank's metadata does not describe a transfer (split sizes, offsets, peer ranks, sums
    /// that overflow), or does not fit the plan's device-metadata capacity.
    #[error("{0}")]
    Metadata(String),
    /// The ranks' plans disagree (dtype, options, row widths), or their metadata does not match
    /// up (what one rank sends another does not expect), or a rank's metadata arrived malformed.
    #[error("{0}")]
    RanksDisagree(String),
    /// Another rank refused the plan (its reason in the text); this rank's own arguments passed.
    #[error("{0}")]
    PeerRefused(String),
    /// With device metadata: the layout kernel rejected this rank's metadata on the GPU
    /// (nothing moved).
    #[error("rank {rank}: {text}")]
    Layout { rank: usize, text: String },
    /// A path this plan cannot take (the AlltoAll-v baseline with device metadata or another
    /// communicator; a launch with more work items than the kernels count).
    #[error("{0}")]
    Unsupported(String),
    /// A bounded device wait expired (its rank, counter and values, typed inside).
    #[error("grpcoll: a device wait expired: {0}")]
    Wait(SyncError),
    /// Allocation, the rendezvous, loading, launching or the driver.
    #[error(transparent)]
    Runtime(#[from] anyhow::Error),
}

impl GrpcollError {
    /// The typed error under `e` (through any context the crate added), a recorded device wait
    /// as `Wait`, else `Runtime`.
    pub(crate) fn from_anyhow(e: anyhow::Error) -> Self {
        let e = match e.downcast::<GrpcollError>() {
            Ok(g) => return g,
            Err(e) => e,
        };
        match e.downcast::<SyncError>() {
            Ok(s @ SyncError::Device { .. }) => GrpcollError::Wait(s),
            Ok(s) => GrpcollError::Runtime(anyhow::Error::new(s)),
            Err(e) => GrpcollError::Runtime(e),
        }
    }

    /// For a refusal that is text alone, its constructor: the same kind of error with another
    /// text (the one every rank agreed on, which names the ranks that refused and why).
    pub(crate) fn with_text(&self) -> Option<fn(String) -> GrpcollError> {
        Some(match self {
            GrpcollError::Options(_) => GrpcollError::Options,
            GrpcollError::Metadata(_) => GrpcollError::Metadata,
            GrpcollError::RanksDisagree(_) => GrpcollError::RanksDisagree,
            GrpcollError::Unsupported(_) => GrpcollError::Unsupported,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::GrpcollError;
    use anyhow::Context;

    /// A typed refusal keeps its kind through the crate's anyhow plumbing and context.
    #[test]
    fn typed_errors_survive_context() {
        let e: anyhow::Error = Err::<(), _>(GrpcollError::Metadata("bad splits".into()))
            .context("building the plan")
            .unwrap_err();
        assert!(
            matches!(GrpcollError::from_anyhow(e), GrpcollError::Metadata(t) if t == "bad splits")
        );
        let plain = GrpcollError::from_anyhow(anyhow::anyhow!("cuMemAlloc failed"));
        assert!(matches!(plain, GrpcollError::Runtime(_)));
        assert_eq!(plain.to_string(), "cuMemAlloc failed");
    }
}
