//! Collective agreement on a local outcome: every rank learns whether every rank succeeded, so
//! that a failure on one rank never leaves the others waiting in a later step.

use crate::error::PglError;
use crate::Bootstrap;

/// Why an agreement did not end in every rank's success.
#[derive(Debug)]
pub enum AgreeError {
    /// The exchange of the ranks' verdicts failed (a rank gone, a bound reached): no verdicts.
    Exchange(anyhow::Error),
    /// One or more ranks failed: `text` (the same on every rank) names each and what it
    /// reported, prefixed by the step; `local` is this rank's own error if it was among them.
    Refused {
        text: String,
        local: Option<anyhow::Error>,
    },
}

impl std::fmt::Display for AgreeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgreeError::Exchange(e) => write!(f, "{e:#}"),
            AgreeError::Refused { text, .. } => f.write_str(text),
        }
    }
}

/// All-gathers `local`'s success or error text. Ok only if every rank succeeded; otherwise every
/// rank returns the same error, naming each failing rank and what it reported, prefixed by `step`.
pub fn agree<T>(
    rdzv: &mut dyn Bootstrap,
    step: &str,
    local: anyhow::Result<T>,
) -> anyhow::Result<T> {
    agree_outcome(rdzv, step, local).map_err(|e| match e {
        AgreeError::Exchange(e) => e,
        AgreeError::Refused { text, .. } => anyhow::anyhow!(text),
    })
}

/// [`agree`] for weft-pgl's own steps: a failed exchange is the bootstrap's error (typed when
/// it is weft's rendezvous); when this rank refused too, its own kind (`Shape`, `Unsupported`,
/// `Setting`, …) with the agreed text where the kind carries one; a refusal of other ranks only
/// is `RanksDisagree`.
pub(crate) fn agree_typed<T>(
    rdzv: &mut dyn Bootstrap,
    step: &str,
    local: anyhow::Result<T>,
) -> Result<T, PglError> {
    agree_outcome(rdzv, step, local).map_err(|e| match e {
        AgreeError::Exchange(e) => PglError::from_anyhow(e),
        AgreeError::Refused { text, local } => match local.map(PglError::from_anyhow) {
            None => PglError::RanksDisagree(text),
            Some(PglError::Runtime(_)) => PglError::Runtime(anyhow::anyhow!(text)),
            Some(own) => own.with_text(text),
        },
    })
}

/// [`agree`], telling a failed exchange from the ranks' refusals and handing this rank's own
/// error back (so that a caller can keep its type).
pub fn agree_outcome<T>(
    rdzv: &mut dyn Bootstrap,
    step: &str,
    local: anyhow::Result<T>,
) -> Result<T, AgreeError> {
    let mine = match &local {
        Ok(_) => Vec::new(),
        // A non-empty text marks failure, so an error always carries some.
        Err(e) => format!("error: {e:#}").into_bytes(),
    };
    let all = rdzv.all_gather(&mine).map_err(AgreeError::Exchange)?;
    // Ranks that failed with the same text are named together, so an error every rank shares
    // (as a collective refusal is) reads once.
    let mut failures: Vec<(Vec<usize>, String)> = Vec::new();
    for (r, m) in all.iter().enumerate().filter(|(_, m)| !m.is_empty()) {
        let text = String::from_utf8_lossy(m).into_owned();
        match failures.iter_mut().find(|(_, t)| *t == text) {
            Some((ranks, _)) => ranks.push(r),
            None => failures.push((vec![r], text)),
        }
    }
    let failed: usize = failures.iter().map(|(r, _)| r.len()).sum();
    let failures: Vec<String> = failures
        .iter()
        .map(|(ranks, text)| {
            let names: Vec<String> = ranks.iter().map(usize::to_string).collect();
            format!(
                "{} {}: {text}",
                if ranks.len() == 1 { "rank" } else { "ranks" },
                names.join(", ")
            )
        })
        .collect();
    if failures.is_empty() {
        return local.map_err(|e| AgreeError::Refused {
            text: format!("{e:#}"),
            local: Some(e),
        });
    }
    Err(AgreeError::Refused {
        text: format!(
            "{step} failed on {} of {} ranks: {}",
            failed,
            all.len(),
            failures.join("; ")
        ),
        local: local.err(),
    })
}
