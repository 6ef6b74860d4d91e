//! `Auto`'s collective choice (`ops::rank_candidates`) with made-up measurements, so the expected
//! answer is known: the slowest rank's time decides, a candidate that fails on any rank is
//! excluded on every rank, the sequential path wins where it is fastest, rank 0's cache answers
//! later calls without measuring (and its file holds the answer), only what the cache lacks is
//! measured, and a spent budget leaves only the sequential paths. CPU trials: they run in CI on 1
//! and 3 ranks.

use crate::job::Job;
use crate::trials::Case;
use std::time::Duration;
use weft_signal_gemm::ops::{
    rank_candidates, rank_candidates_predicted, AutoPolicy, ChoiceCache, ChoiceKey, Method, OpKind,
};
use weft_signal_gemm::{GemmOptions, GemmShape};

pub fn cases() -> Vec<Case> {
    vec![
        Case::cpu(
            "auto_choice::slowest_rank_decides_failures_are_excluded_and_the_answer_is_cached",
            slowest_rank_decides,
        ),
        Case::cpu(
            "auto_choice::sequential_wins_where_it_is_fastest_or_within_noise",
            sequential_wins,
        ),
        Case::cpu(
            "auto_choice::only_missing_candidates_are_measured",
            only_missing_measured,
        ),
        Case::cpu(
            "auto_choice::a_spent_budget_leaves_the_sequential_paths",
            budget_spent,
        ),
        Case::cpu(
            "auto_choice::predictions_every_rank_has_replace_measurements",
            predictions_replace_measurements,
        ),
    ]
}

fn m(s: &str) -> Method {
    s.parse().expect("a valid method")
}

fn key(job: &Job, n: u32) -> ChoiceKey {
    ChoiceKey::new(
        OpKind::AllReduce,
        GemmShape::new(4096, n, 1024),
        &GemmOptions::default(),
        false,
        job.world() as u32,
        "cpu trial",
    )
}

fn policy() -> AutoPolicy {
    AutoPolicy {
        warmup: 0,
        iters: 1,
        budget: Duration::from_secs(3600),
    }
}

/// Runs `body` with rank 0's cache in a fresh file (the other ranks' in memory) and removes it.
fn with_cache(
    rank: usize,
    name: &str,
    body: impl FnOnce(&mut ChoiceCache, &std::path::Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("weft-auto-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("choices.jsonl");
    let _ = std::fs::remove_file(&path);
    let result = (|| {
        let mut cache = if rank == 0 {
            ChoiceCache::open(&path)?
        } else {
            ChoiceCache::in_memory()
        };
        body(&mut cache, &path)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn slowest_rank_decides(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let candidates = [
        m("seq-cublas"),
        m("seq-weft"),
        m("fused-inter:8"),
        m("distfuse:8"),
        m("fused-inter:16"),
    ];
    // fused-inter:8 is the fastest on rank 0 but (with 2+ ranks) the slowest elsewhere;
    // fused-inter:16 would win if its failure on the last rank were ignored.
    let time = |c: &Method| -> anyhow::Result<f64> {
        match c.to_string().as_str() {
            "seq-cublas" => Ok(2.0),
            "seq-weft" => Ok(2.1),
            "fused-inter:8" => Ok(if rank == 0 { 0.5 } else { 5.0 }),
            "distfuse:8" => Ok(1.0),
            _ if rank + 1 == world => anyhow::bail!("this rank cannot make it"),
            _ => Ok(0.25),
        }
    };
    let k = key(job, 1024);
    with_cache(job.rank(), "slowest", |cache, path| {
        let mut measured = 0;
        let first = rank_candidates(
            &mut job.rdzv,
            cache,
            &k,
            4096,
            &candidates,
            &policy(),
            |_, c| {
                measured += 1;
                time(c)
            },
        )?;
        anyhow::ensure!(
            measured == 5,
            "rank {rank} measured {measured} candidates, expected 5"
        );
        // One rank: that rank is the last, fused-inter:16 fails there, and rank 0's 0.5 ms stands.
        let want = if world == 1 {
            "fused-inter:8"
        } else {
            "distfuse:8"
        };
        let best = &first.times[0];
        anyhow::ensure!(
            best.0.to_string() == want,
            "rank {rank}: ranked {} ({} ms) first, expected {want}: {:?}",
            best.0,
            best.1,
            first.times
        );
        if world > 1 {
            let (_, why) = first
                .excluded
                .iter()
                .find(|(c, _)| c.to_string() == "fused-inter:16")
                .ok_or_else(|| {
                    anyhow::anyhow!("fused-inter:16 was not excluded: {:?}", first.excluded)
                })?;
            anyhow::ensure!(
                why.contains(&format!("rank {}", world - 1)) && why.contains("cannot make it"),
                "exclusion reason {why:?} does not name the rank and its error"
            );
            let slow = first
                .times
                .iter()
                .find(|t| t.0.to_string() == "fused-inter:8")
                .map(|t| t.1);
            anyhow::ensure!(
                slow == Some(5.0),
                "fused-inter:8 counted {slow:?} ms, the slowest rank took 5"
            );
        }
        let again = rank_candidates(
            &mut job.rdzv,
            cache,
            &k,
            4096,
            &candidates,
            &policy(),
            |_, _| anyhow::bail!("measured again although rank 0's cache has the answer"),
        )?;
        anyhow::ensure!(
            again.measured == 0 && again.times == first.times && again.excluded == first.excluded,
            "rank {rank}: the cached ranking differs: {again:?} vs {first:?}"
        );
        if rank == 0 {
            let reread = ChoiceCache::open(path)?;
            anyhow::ensure!(reread.problems().is_empty(), "{:?}", reread.problems());
            anyhow::ensure!(
                reread.lookup(&k).map(|e| e.results.len()) == Some(5),
                "the choice file does not hold the five results"
            );
        }
        // A nearby M in the same range reuses the choice; one outside it is measured anew.
        let near = rank_candidates(
            &mut job.rdzv,
            cache,
            &k,
            3500,
            &candidates,
            &policy(),
            |_, _| anyhow::bail!("measured although M 3500 shares 4096's range"),
        )?;
        anyhow::ensure!(near.times == first.times, "M 3500 ranked differently");
        Ok(())
    })
}

fn sequential_wins(job: &mut Job) -> anyhow::Result<()> {
    let candidates = [
        m("seq-cublas"),
        m("seq-weft"),
        m("decomposition:2"),
        m("signal:32:1"),
        m("distfuse:16"),
    ];
    let k = key(job, 2048);
    let rank = job.rank();
    with_cache(job.rank(), "sequential", |cache, _| {
        let r = rank_candidates(
            &mut job.rdzv,
            cache,
            &k,
            4096,
            &candidates,
            &policy(),
            |_, c| {
                Ok(match c.to_string().as_str() {
                    "seq-cublas" => 0.30,
                    "seq-weft" => 0.31,
                    "decomposition:2" => 0.36,
                    "signal:32:1" => 0.33,
                    _ => 0.40 + 0.01 * rank as f64,
                })
            },
        )?;
        let order: Vec<String> = r.times.iter().map(|t| t.0.to_string()).collect();
        anyhow::ensure!(
            order
                == [
                    "seq-cublas",
                    "seq-weft",
                    "signal:32:1",
                    "decomposition:2",
                    "distfuse:16"
                ],
            "ranked {order:?}"
        );
        Ok(())
    })?;
    // A lead within SEQUENTIAL_PREFERENCE (2 %) is noise: the sequential path stays first; a
    // larger one wins. Made-up times, so the answers are known.
    let mut preferred = |times: [f64; 3], name: &str| -> anyhow::Result<String> {
        let k = key(job, 2560);
        let mut first = String::new();
        with_cache(rank, name, |cache, _| {
            let r = rank_candidates(
                &mut job.rdzv,
                cache,
                &k,
                4096,
                &[m("seq-cublas"), m("seq-weft"), m("fused-intra")],
                &policy(),
                |_, c| {
                    Ok(match c.to_string().as_str() {
                        "seq-cublas" => times[0],
                        "seq-weft" => times[1],
                        _ => times[2],
                    })
                },
            )?;
            first = r.preferred(|_| true)[0].0.to_string();
            Ok(())
        })?;
        Ok(first)
    };
    let close = preferred([0.100, 0.110, 0.0985], "close")?;
    anyhow::ensure!(
        close == "seq-cublas",
        "a 1.5 % lead chose {close}, not the sequential path"
    );
    let clear = preferred([0.100, 0.110, 0.0970], "clear")?;
    anyhow::ensure!(
        clear == "fused-intra",
        "a 3 % lead chose {clear}, not fused-intra"
    );
    let seq_weft = preferred([0.100, 0.0995, 0.0990], "seq-weft")?;
    anyhow::ensure!(
        seq_weft == "seq-weft",
        "with seq-weft the fastest sequential path within 2 %, {seq_weft} was chosen"
    );
    Ok(())
}

fn only_missing_measured(job: &mut Job) -> anyhow::Result<()> {
    let k = key(job, 3072);
    with_cache(job.rank(), "missing", |cache, _| {
        let family = [
            m("seq-cublas"),
            m("seq-weft"),
            m("distfuse:8"),
            m("distfuse:16"),
        ];
        let all = [
            m("seq-cublas"),
            m("seq-weft"),
            m("fused-inter:8"),
            m("distfuse:8"),
            m("distfuse:16"),
        ];
        let mut seen = Vec::new();
        rank_candidates(
            &mut job.rdzv,
            cache,
            &k,
            4096,
            &family,
            &policy(),
            |_, c| {
                seen.push(c.to_string());
                Ok(1.0)
            },
        )?;
        let mut later = Vec::new();
        let r = rank_candidates(&mut job.rdzv, cache, &k, 4096, &all, &policy(), |_, c| {
            later.push(c.to_string());
            Ok(0.5)
        })?;
        anyhow::ensure!(
            seen.len() == 4 && later == ["fused-inter:8"],
            "measured {seen:?}, then {later:?} (expected only fused-inter:8)"
        );
        anyhow::ensure!(
            r.times[0].0.to_string() == "fused-inter:8" && r.times.len() == 5,
            "{:?}",
            r.times
        );
        Ok(())
    })
}

fn budget_spent(job: &mut Job) -> anyhow::Result<()> {
    let k = key(job, 6144);
    with_cache(job.rank(), "budget", |cache, _| {
        let candidates = [
            m("seq-cublas"),
            m("seq-weft"),
            m("fused-inter:8"),
            m("distfuse:8"),
        ];
        let policy = AutoPolicy {
            budget: Duration::ZERO,
            ..policy()
        };
        let mut seen = Vec::new();
        let r = rank_candidates(
            &mut job.rdzv,
            cache,
            &k,
            4096,
            &candidates,
            &policy,
            |_, c| {
                seen.push(c.to_string());
                std::thread::sleep(Duration::from_millis(2));
                Ok(if c.is_sequential() { 1.0 } else { 0.1 })
            },
        )?;
        anyhow::ensure!(
            seen == ["seq-cublas", "seq-weft"],
            "measured {seen:?} with no budget"
        );
        anyhow::ensure!(r.times.iter().all(|t| t.0.is_sequential()), "{:?}", r.times);
        anyhow::ensure!(
            r.excluded.len() == 2 && r.excluded.iter().all(|(_, why)| why.contains("budget")),
            "{:?}",
            r.excluded
        );
        Ok(())
    })
}

/// Made-up predictions: where every rank predicts a non-sequential candidate it is not measured
/// and the slowest rank's prediction ranks it (named in `predicted`, kept out of the cache) —
/// unless it would rank first, when it is measured; where one rank has none it is measured on
/// all; sequential candidates are always measured.
fn predictions_replace_measurements(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let candidates = [
        m("seq-cublas"),
        m("signal:32:1"),
        m("signal:32:2"),
        m("signal:16:1"),
    ];
    let k = key(job, 2816);
    with_cache(rank, "predicted", |cache, _| {
        let r = rank_candidates_predicted(
            &mut job.rdzv,
            cache,
            &k,
            4096,
            &candidates,
            &policy(),
            |c| match c.to_string().as_str() {
                "seq-cublas" => Some(0.001),
                // Predicted first: measured after all.
                "signal:32:1" => Some(0.20),
                "signal:32:2" => Some(0.50 + 0.01 * rank as f64),
                // Predicted by every rank but the last (on one rank: by none).
                _ => (rank + 1 < world).then_some(0.10),
            },
            |_, c| match c.to_string().as_str() {
                "seq-cublas" => Ok(0.30),
                "signal:32:1" => Ok(0.35),
                "signal:16:1" => Ok(0.40),
                other => anyhow::bail!(
                    "{other} was measured although every rank predicted it slower than the best"
                ),
            },
        )?;
        let got: Vec<(String, f64)> = r.times.iter().map(|(m, t)| (m.to_string(), *t)).collect();
        let slowest = 0.50 + 0.01 * (world - 1) as f64;
        anyhow::ensure!(
            got == [
                ("seq-cublas".to_string(), 0.30),
                ("signal:32:1".to_string(), 0.35),
                ("signal:16:1".to_string(), 0.40),
                ("signal:32:2".to_string(), slowest),
            ],
            "ranked {got:?}"
        );
        anyhow::ensure!(
            r.predicted == [m("signal:32:2")] && r.measured == 3,
            "predicted {:?}, measured {}",
            r.predicted,
            r.measured
        );
        if rank == 0 {
            let cached = cache.lookup(&k).map(|e| e.results.len());
            anyhow::ensure!(
                cached == Some(3),
                "the cache holds {cached:?} results, expected the 3 measured ones"
            );
        }
        Ok(())
    })
}
