//! Collective agreement on a local outcome: every rank learns whether every rank succeeded, so
//! that a failure on one rank never leaves the others waiting in a later step.

use crate::rendezvous::Rendezvous;

/// All-gathers `local`'s success or error text. Ok only if every rank succeeded; otherwise every
/// rank returns the same error, naming each failing rank and what it reported, prefixed by `step`.
pub fn agree<T>(rdzv: &mut Rendezvous, step: &str, local: anyhow::Result<T>) -> anyhow::Result<T> {
    let mine = match &local {
        Ok(_) => Vec::new(),
        // A non-empty text marks failure, so an error always carries some.
        Err(e) => format!("error: {e:#}").into_bytes(),
    };
    let all = rdzv.all_gather(&mine)?;
    let failures: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(r, m)| format!("rank {r}: {}", String::from_utf8_lossy(m)))
        .collect();
    if failures.is_empty() {
        local
    } else {
        Err(anyhow::anyhow!(
            "{step} failed on {} of {} ranks: {}",
            failures.len(),
            all.len(),
            failures.join("; ")
        ))
    }
}
