//! What weft-signal-gemm's calls refuse or report, typed so that a caller can match on the kind:
//! a shape the kernels cannot take, a buffer of the wrong length, options that conflict or that
//! this plan or device lacks, ranks that disagree, a device wait that expired, peer memory or
//! NCCL (weft-pgl's error), the rest. The messages are the ones weft printed before the type.

use thiserror::Error;
use weft_pgl::PglError;
use weft_sync::SyncError;

#[derive(Debug, Error)]
pub enum GemmError {
    /// A shape the kernels or the method cannot take (M, N, K, tiles, rows per rank, K chunks).
    #[error("{0}")]
    Shape(String),
    /// A buffer of the wrong length or too small, or a table of the wrong size.
    #[error("{0}")]
    Length(String),
    /// Options that conflict, do not fit the plan they are launched with, or that this method
    /// does not take (a layout, beta, a fusion's parts, a stream, a method's parameters).
    #[error("{0}")]
    Options(String),
    /// What this GPU cannot do (not Hopper, too few SMs for the communicator CTAs, another SM
    /// count than the plan's).
    #[error("{0}")]
    Unsupported(String),
    /// A weft variable that is not one (`WEFT_AUTO_BUDGET_S`, …).
    #[error("{var}={value:?} {reason}")]
    Setting {
        var: &'static str,
        value: String,
        reason: String,
    },
    /// The ranks' arguments differ, or a rank refused a collective step.
    #[error("{0}")]
    RanksDisagree(String),
    /// A bounded device wait expired (its rank, counter and values, typed inside).
    #[error("{0}")]
    Wait(SyncError),
    /// Peer memory, the rendezvous or NCCL (weft-pgl's error, typed inside).
    #[error(transparent)]
    Pgl(PglError),
    /// Anything else: cuBLAS, the driver, allocation, the choice cache's file.
    #[error(transparent)]
    Runtime(anyhow::Error),
}

impl GemmError {
    /// The typed error under `e` (through any context added on the way): this crate's own, a
    /// recorded device wait, weft-pgl's; else `Runtime`. A kind that is text keeps the whole
    /// message, context included (`with_text`).
    pub(crate) fn from_anyhow(e: anyhow::Error) -> Self {
        let whole = format!("{e:#}");
        let layered = e.chain().count() > 1;
        let typed = match e.downcast::<GemmError>() {
            Ok(g) => g,
            Err(e) => match e.downcast::<SyncError>() {
                Ok(s @ SyncError::Device { .. }) => GemmError::Wait(s),
                Ok(s) => return GemmError::Runtime(anyhow::Error::new(s).context(whole)),
                Err(e) => match e.downcast::<PglError>() {
                    Ok(p) => GemmError::Pgl(p),
                    Err(e) => return GemmError::Runtime(e),
                },
            },
        };
        if layered {
            typed.with_text(whole)
        } else {
            typed
        }
    }

    /// The same kind with `text` as its message, where the kind carries one (also weft-pgl's
    /// inside `Pgl`); other kinds unchanged.
    pub(crate) fn with_text(self, text: String) -> Self {
        match self {
            GemmError::Shape(_) => GemmError::Shape(text),
            GemmError::Length(_) => GemmError::Length(text),
            GemmError::Options(_) => GemmError::Options(text),
            GemmError::Unsupported(_) => GemmError::Unsupported(text),
            GemmError::RanksDisagree(_) => GemmError::RanksDisagree(text),
            GemmError::Pgl(p) => GemmError::Pgl(p.with_text(text)),
            other => other,
        }
    }
}

/// `weft_pgl::agree` keeping the kinds: when ranks refused a collective step, this rank's own
/// typed refusal comes back with the agreed text (naming every failing rank), and a refusal of
/// other ranks only is `RanksDisagree`. A failed exchange is the bootstrap's error.
pub(crate) fn agree<T>(
    rdzv: &mut dyn weft_pgl::Bootstrap,
    step: &str,
    local: anyhow::Result<T>,
) -> anyhow::Result<T> {
    weft_pgl::agree_outcome(rdzv, step, local).map_err(|e| match e {
        weft_pgl::AgreeError::Exchange(e) => e,
        weft_pgl::AgreeError::Refused { text, local } => match local.map(GemmError::from_anyhow) {
            None => GemmError::RanksDisagree(text).into(),
            Some(GemmError::Runtime(_)) => anyhow::anyhow!(text),
            Some(own) => own.with_text(text).into(),
        },
    })
}

/// `r`'s error as a `GemmError` (typed where one is inside).
pub(crate) fn typed<T>(r: anyhow::Result<T>) -> Result<T, GemmError> {
    r.map_err(GemmError::from_anyhow)
}

/// `body`'s outcome as a `GemmError`: the public calls' boundary, whose bodies use `anyhow` inside.
pub(crate) fn typed_with<T>(body: impl FnOnce() -> anyhow::Result<T>) -> Result<T, GemmError> {
    typed(body())
}

/// Returns early from an `anyhow::Result` function with a typed refusal:
/// `refuse!(Shape, "m = {m} …")`; the public call types it back (`typed`).
macro_rules! refuse {
    ($kind:ident, $($fmt:tt)+) => {
        return Err($crate::error::GemmError::$kind(format!($($fmt)+)).into())
    };
}

/// `require!(cond, Kind, "…")`: `refuse!` unless `cond`.
macro_rules! require {
    ($cond:expr, $kind:ident, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::error::GemmError::$kind(format!($($fmt)+)).into());
        }
    };
}

pub(crate) use {refuse, require};

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    fn refused(m: u32) -> anyhow::Result<()> {
        require!(
            m.is_multiple_of(128),
            Shape,
            "m = {m} is not a multiple of 128"
        );
        Ok(())
    }

    /// A refusal keeps its kind through anyhow and context, and its text the context too;
    /// weft-pgl's error is `Pgl`.
    #[test]
    fn typed_errors_survive_context() {
        let e = refused(100).context("planning").unwrap_err();
        match GemmError::from_anyhow(e) {
            GemmError::Shape(t) => assert_eq!(t, "planning: m = 100 is not a multiple of 128"),
            other => panic!("not Shape: {other:?}"),
        }
        match GemmError::from_anyhow(refused(100).unwrap_err()) {
            GemmError::Shape(t) => assert_eq!(t, "m = 100 is not a multiple of 128"),
            other => panic!("not Shape: {other:?}"),
        }
        assert!(refused(256).is_ok());
        let p = anyhow::Error::new(PglError::Shape("zero rows".into())).context("peer output");
        assert!(matches!(
            GemmError::from_anyhow(p),
            GemmError::Pgl(PglError::Shape(t)) if t == "peer output: zero rows"
        ));
        assert!(matches!(
            GemmError::from_anyhow(anyhow::anyhow!("cuBLAS failed")),
            GemmError::Runtime(_)
        ));
    }
}
