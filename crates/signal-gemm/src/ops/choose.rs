//! `Auto`'s choice, collective over the ranks: the candidates' times come from rank 0's cache, or
//! are measured at first use on every rank, candidate by candidate, and cached by rank 0.
//!
//! - The slowest rank's time counts for each candidate.
//! - A candidate that fails or is refused on any rank is excluded on every rank (with the reasons).
//! - Sequential candidates are measured first and always; the others only while the first-use
//!   budget lasts (every rank stops at the same candidate: they decide on the slowest rank's
//!   elapsed time, which all of them see).
//! - Only candidates the cache does not hold are measured, so a family asked for after `Auto`
//!   (or the reverse) reuses what was measured.
//! - A non-sequential candidate every rank can predict (the wave-group tuner's model, where a
//!   tuning file for the machine is loaded: `OverlapEnv::set_tuning`) is not measured: the
//!   slowest rank's prediction counts. Predictions are not cached (they cost nothing, and the
//!   cache must not keep a number no run measured once the tuning file is gone).

use super::cache::{ChoiceCache, Entry, Outcome};
use super::key::ChoiceKey;
use super::method::Method;
use crate::error::agree;
use crate::error::GemmError;
use anyhow::Context;
use std::time::{Duration, Instant};
use weft_pgl::Bootstrap;

/// How a first use measures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoPolicy {
    /// Untimed runs, then timed runs (median) per candidate.
    pub warmup: usize,
    pub iters: usize,
    /// Once this much time has gone into measuring (the slowest rank's), the remaining
    /// non-sequential candidates are skipped.
    pub budget: Duration,
}

/// Seconds of first-use measurement per choice, unless `WEFT_AUTO_BUDGET_S` says otherwise.
pub const DEFAULT_BUDGET_S: f64 = 30.0;

/// The variable [`AutoPolicy::from_env`] reads: seconds of first-use measurement per choice.
pub const BUDGET_VAR: &str = "WEFT_AUTO_BUDGET_S";

/// The measurement budget from `value` (the variable's, if set): seconds, finite and >= 0.
pub fn budget_from(value: Option<&str>) -> Result<Duration, GemmError> {
    let Some(v) = value else {
        return Ok(Duration::from_secs_f64(DEFAULT_BUDGET_S));
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && (0.0..=1e9).contains(&s) => Ok(Duration::from_secs_f64(s)),
        _ => Err(GemmError::Setting {
            var: BUDGET_VAR,
            value: v.to_string(),
            reason: "is not a number of seconds >= 0".into(),
        }),
    }
}

/// The defaults, without reading the environment ([`AutoPolicy::from_env`] does).
impl Default for AutoPolicy {
    fn default() -> Self {
        // 11 timed runs: the fused methods' best counts often lie within 2-3 % of each other
        // (measured on two H100s), closer than 7 runs' medians told apart.
        Self {
            warmup: 2,
            iters: 11,
            budget: Duration::from_secs_f64(DEFAULT_BUDGET_S),
        }
    }
}

impl AutoPolicy {
    /// The defaults with the budget from `WEFT_AUTO_BUDGET_S` when set (`GemmError::Setting`
    /// when it is not a number of seconds >= 0; before, a bad value fell back to 30 s silently).
    pub fn from_env() -> Result<Self, GemmError> {
        let budget = budget_from(std::env::var(BUDGET_VAR).ok().as_deref())?;
        Ok(Self {
            budget,
            ..Self::default()
        })
    }
}

/// How much faster than the fastest sequential candidate another must have measured for `Auto`
/// to take it (a fraction). Two instances of one op timed back to back differ by up to about 2 %
/// at latency-bound sizes (1 µs of 50 on two H200s: GEMM + All-to-All at M = 128), so a smaller
/// lead is noise, and the sequential paths (seq-cublas, seq-weft, seq-collectives: no second
/// stream, no peer-memory epochs, capturable) are the ones `Auto` keeps when nothing beats them
/// clearly.
pub const SEQUENTIAL_PREFERENCE: f64 = 0.02;

/// The candidates' times for one key, fastest first, as every rank sees them.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranking {
    pub key: ChoiceKey,
    pub measured_m: u32,
    /// (method, the slowest rank's median ms), fastest first.
    pub times: Vec<(Method, f64)>,
    /// Candidates that cannot be used, with why (failed or refused on a rank, or left unmeasured
    /// when the budget ran out).
    pub excluded: Vec<(Method, String)>,
    /// Candidates measured by this call (0: every time came from the cache or a prediction).
    pub measured: usize,
    /// Candidates whose time is the tuner's prediction, not a measurement.
    pub predicted: Vec<Method>,
    /// Wall time this call spent measuring (the slowest rank's), seconds.
    pub first_use_s: f64,
}

impl Ranking {
    /// The methods `allow` accepts in the order `Auto` tries them: fastest first, except that
    /// the fastest sequential one goes first when the fastest of all leads it by no more than
    /// [`SEQUENTIAL_PREFERENCE`].
    pub fn preferred(&self, allow: impl Fn(&Method) -> bool) -> Vec<&(Method, f64)> {
        let mut order: Vec<&(Method, f64)> = self.times.iter().filter(|(m, _)| allow(m)).collect();
        if let Some(at) = order.iter().position(|(m, _)| m.is_sequential()) {
            if at > 0 && order[at].1 <= order[0].1 * (1.0 + SEQUENTIAL_PREFERENCE) {
                let seq = order.remove(at);
                order.insert(0, seq);
            }
        }
        order
    }

    /// Why no allowed candidate is usable, for an error.
    pub fn why_none(&self, allow: impl Fn(&Method) -> bool) -> String {
        let reasons: Vec<String> = self
            .excluded
            .iter()
            .filter(|(m, _)| allow(m))
            .map(|(m, why)| format!("{m}: {why}"))
            .collect();
        if reasons.is_empty() {
            "no candidate of that kind can run this shape".into()
        } else {
            reasons.join("; ")
        }
    }
}

/// Collective: the ranking of `candidates` for `key` at `m`. `measure` makes, runs and frees one
/// candidate (collectively) and returns this rank's median ms.
pub fn rank_candidates(
    rdzv: &mut dyn Bootstrap,
    cache: &mut ChoiceCache,
    key: &ChoiceKey,
    m: u32,
    candidates: &[Method],
    policy: &AutoPolicy,
    measure: impl FnMut(&mut dyn Bootstrap, &Method) -> anyhow::Result<f64>,
) -> Result<Ranking, GemmError> {
    rank_candidates_predicted(rdzv, cache, key, m, candidates, policy, |_| None, measure)
}

/// Collective: as [`rank_candidates`], with `predict` giving this rank's predicted ms of a
/// candidate where it has one: a non-sequential candidate the cache lacks is then not measured
/// if every rank predicts it (the slowest rank's prediction counts), else measured as usual. A
/// prediction never wins by itself: while the fastest candidate is a predicted one, it is
/// measured (and cached), and the ranking redone.
#[allow(clippy::too_many_arguments)]
pub fn rank_candidates_predicted(
    rdzv: &mut dyn Bootstrap,
    cache: &mut ChoiceCache,
    key: &ChoiceKey,
    m: u32,
    candidates: &[Method],
    policy: &AutoPolicy,
    mut predict: impl FnMut(&Method) -> Option<f64>,
    mut measure: impl FnMut(&mut dyn Bootstrap, &Method) -> anyhow::Result<f64>,
) -> Result<Ranking, GemmError> {
    // The measurements are the caller's: their errors pass through (typed where they are).
    crate::error::typed_with(|| -> anyhow::Result<Ranking> {
        // Rank 0's entry, as JSON, or nothing.
        let cached = match cache.lookup(key) {
            Some(e) if rdzv.rank() == 0 => {
                serde_json::to_string(e).context("encoding a cached choice")?
            }
            _ => String::new(),
        };
        let cached = rdzv
            .broadcast(0, cached.as_bytes())
            .context("broadcasting rank 0's cached choice")?;
        let mut entry: Entry = if cached.is_empty() {
            Entry {
                key: key.clone(),
                measured_m: m,
                results: Vec::new(),
            }
        } else {
            serde_json::from_slice(&cached).context("decoding rank 0's cached choice")?
        };
        let known =
            |entry: &Entry, c: &Method| entry.results.iter().any(|r| r.method == c.to_string());
        let missing: Vec<&Method> = candidates.iter().filter(|c| !known(&entry, c)).collect();
        let mut predicted = agreed_predictions(rdzv, &missing, &mut predict)?;
        let mut timer = Timer {
            start: Instant::now(),
            elapsed_s: 0.0,
        };
        let mut measured = 0;
        let mut unmeasured = Vec::new();
        for c in missing {
            if predicted.iter().any(|(p, _)| p == c) {
                continue;
            }
            if !c.is_sequential() && timer.elapsed_s > policy.budget.as_secs_f64() {
                unmeasured.push((
                    c.clone(),
                    format!(
                        "not measured: the first-use budget of {:.0} s was spent",
                        policy.budget.as_secs_f64()
                    ),
                ));
                continue;
            }
            entry
                .results
                .push(timer.measure(rdzv, key, c, &mut measure)?);
            measured += 1;
        }
        // The fastest predicted candidate is measured while it would rank first.
        let best_measured = |entry: &Entry| {
            candidates
                .iter()
                .filter_map(|c| entry.results.iter().find(|r| r.method == c.to_string()))
                .filter_map(|r| r.ms)
                .fold(f64::INFINITY, f64::min)
        };
        while let Some(at) = predicted
            .iter()
            .enumerate()
            .min_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
            .filter(|(_, (_, ms))| *ms < best_measured(&entry))
            .map(|(at, _)| at)
        {
            let (c, _) = predicted.remove(at);
            entry
                .results
                .push(timer.measure(rdzv, key, &c, &mut measure)?);
            measured += 1;
        }
        if measured > 0 {
            entry.measured_m = m;
            if rdzv.rank() == 0 {
                cache
                    .record(entry.clone())
                    .context("recording the first-use choice")?;
            }
        }
        let mut times = Vec::new();
        let mut excluded = unmeasured;
        for c in candidates {
            let Some(r) = entry.results.iter().find(|r| r.method == c.to_string()) else {
                continue;
            };
            match (r.ms, &r.error) {
                (Some(ms), _) => times.push((c.clone(), ms)),
                (None, why) => excluded.push((c.clone(), why.clone().unwrap_or_default())),
            }
        }
        times.extend(predicted.iter().cloned());
        times.sort_by(|a, b| a.1.total_cmp(&b.1));
        Ok(Ranking {
            key: key.clone(),
            measured_m: entry.measured_m,
            times,
            excluded,
            measured,
            predicted: predicted.into_iter().map(|(m, _)| m).collect(),
            first_use_s: timer.elapsed_s,
        })
    })
}

/// Collective, one exchange: the non-sequential candidates of `missing` every rank predicts,
/// each with the slowest rank's prediction.
fn agreed_predictions(
    rdzv: &mut dyn Bootstrap,
    missing: &[&Method],
    predict: &mut impl FnMut(&Method) -> Option<f64>,
) -> anyhow::Result<Vec<(Method, f64)>> {
    // NaN: no prediction on this rank (sequential candidates are always measured).
    let mine: Vec<u8> = missing
        .iter()
        .map(|c| {
            Some(c)
                .filter(|c| !c.is_sequential())
                .and_then(|c| predict(c))
                .filter(|p| p.is_finite() && *p > 0.0)
                .unwrap_or(f64::NAN)
        })
        .flat_map(f64::to_le_bytes)
        .collect();
    let all = rdzv
        .all_gather(&mine)
        .context("exchanging the tuner's predictions")?;
    let at = |b: &Vec<u8>, i: usize| {
        b.get(8 * i..8 * i + 8)
            .and_then(|s| s.try_into().ok())
            .map_or(f64::NAN, f64::from_le_bytes)
    };
    Ok(missing
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let each: Vec<f64> = all.iter().map(|b| at(b, i)).collect();
            each.iter()
                .all(|p| p.is_finite() && *p > 0.0)
                .then(|| ((*c).clone(), each.iter().copied().fold(0.0, f64::max)))
        })
        .collect())
}

/// First-use time spent so far (the slowest rank's, as every rank sees it).
struct Timer {
    start: Instant,
    elapsed_s: f64,
}

impl Timer {
    /// Collective: measures `c` on every rank; the slowest rank's time, or why it failed.
    fn measure(
        &mut self,
        rdzv: &mut dyn Bootstrap,
        key: &ChoiceKey,
        c: &Method,
        measure: &mut impl FnMut(&mut dyn Bootstrap, &Method) -> anyhow::Result<f64>,
    ) -> anyhow::Result<Outcome> {
        let step = format!("measuring {c} for {key}");
        let mine = measure(rdzv, c);
        let field = |b: &Vec<u8>, i: usize| {
            f64::from_le_bytes(
                b.get(8 * i..8 * i + 8)
                    .and_then(|s| s.try_into().ok())
                    .unwrap_or([0; 8]),
            )
        };
        Ok(match agree(rdzv, &step, mine) {
            Ok(ms) => {
                // Every rank's (ms, elapsed): the slowest rank's of each.
                let mut bytes = ms.to_le_bytes().to_vec();
                bytes.extend_from_slice(&self.start.elapsed().as_secs_f64().to_le_bytes());
                let all = rdzv.all_gather(&bytes)?;
                let slowest = all.iter().map(|b| field(b, 0)).fold(0.0f64, f64::max);
                self.elapsed_s = all
                    .iter()
                    .map(|b| field(b, 1))
                    .fold(self.elapsed_s, f64::max);
                if slowest.is_finite() && slowest > 0.0 {
                    Outcome {
                        method: c.to_string(),
                        ms: Some(slowest),
                        error: None,
                    }
                } else {
                    Outcome {
                        method: c.to_string(),
                        ms: None,
                        error: Some(format!("measured {slowest} ms")),
                    }
                }
            }
            Err(e) => {
                let all = rdzv.all_gather(&self.start.elapsed().as_secs_f64().to_le_bytes())?;
                self.elapsed_s = all
                    .iter()
                    .map(|b| field(b, 0))
                    .fold(self.elapsed_s, f64::max);
                Outcome {
                    method: c.to_string(),
                    ms: None,
                    error: Some(format!("{e:#}")),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `WEFT_AUTO_BUDGET_S`: seconds >= 0, else a typed refusal naming it (no silent default).
    #[test]
    fn the_budget_setting_is_read_or_refused() {
        assert_eq!(
            budget_from(None).unwrap(),
            Duration::from_secs_f64(DEFAULT_BUDGET_S)
        );
        assert_eq!(
            budget_from(Some(" 2.5 ")).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(budget_from(Some("0")).unwrap(), Duration::ZERO);
        for bad in ["-1", "x", "", "inf", "NaN", "1e10"] {
            match budget_from(Some(bad)) {
                Err(GemmError::Setting { var, value, .. }) => {
                    assert_eq!((var, value.as_str()), (BUDGET_VAR, bad))
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
