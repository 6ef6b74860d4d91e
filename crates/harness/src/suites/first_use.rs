//! signal-gemm III's first-use choices (`fused::first_use::choose`), with made-up measurements so
//! the expected answer is known: the slowest rank's time decides, a candidate that fails on any
//! rank is skipped on every rank, rank 0's cache answers later calls without measuring (and its
//! file holds the answer), and no measurable candidate is an error naming each one's reason.

use super::gpu;
use crate::job::Job;
use crate::trials::Case;
use weft_signal_gemm::fused::{first_use, Candidate, ChoiceCache};
use weft_signal_gemm::GemmShape;

pub fn cases() -> Vec<Case> {
    vec![Case::gpu(
        "fused_first_use::slowest_rank_decides_and_the_answer_is_cached",
        slowest_rank_decides,
    )]
}

fn slowest_rank_decides(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, _stream) = gpu(job)?;
    let (rank, world) = (job.rank(), job.world());
    let shape = GemmShape::new(4096, 1024, 512);
    let candidates = [
        Candidate::new("fast-on-rank-0", 8),
        Candidate::new("steady", 16),
        Candidate::new("fails-on-last-rank", 32),
    ];
    // "fast-on-rank-0" is the fastest on rank 0 but (with 2+ ranks) the slowest elsewhere;
    // "fails-on-last-rank" would win if its failure were ignored.
    let measure = |c: &Candidate| -> anyhow::Result<f64> {
        match c.method.as_str() {
            "fast-on-rank-0" => Ok(if rank == 0 { 1.0 } else { 5.0 }),
            "steady" => Ok(2.0),
            _ if rank + 1 == world => anyhow::bail!("this rank cannot make it"),
            _ => Ok(0.5),
        }
    };
    let dir = std::env::temp_dir().join(format!("weft-first-use-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("choices.txt");
    let _ = std::fs::remove_file(&path);
    let result = (|| -> anyhow::Result<()> {
        // Only rank 0's cache is read and written: the others keep theirs in memory.
        let mut cache = if rank == 0 {
            ChoiceCache::open(&path)?
        } else {
            ChoiceCache::in_memory()
        };
        let question = "test.first-use";
        let mut measured = 0;
        let first = first_use::choose(
            &mut job.rdzv,
            &ctx,
            &mut cache,
            question,
            shape,
            &candidates,
            |_, c| {
                measured += 1;
                measure(c)
            },
        )?;
        let want = if world == 1 {
            "fast-on-rank-0"
        } else {
            "steady"
        };
        anyhow::ensure!(
            measured == 3,
            "rank {rank} measured {measured} candidates, expected 3"
        );
        anyhow::ensure!(
            first.answer.method == want,
            "rank {rank}: chose {} ({} ms), expected {want} (the fastest by the slowest rank's time, the failed candidate skipped)",
            first.answer,
            first.ms
        );
        let again = first_use::choose(
            &mut job.rdzv,
            &ctx,
            &mut cache,
            question,
            shape,
            &candidates,
            |_, _| anyhow::bail!("measured again although rank 0's cache has the answer"),
        )?;
        anyhow::ensure!(
            again.answer == first.answer && again.ms == first.ms,
            "rank {rank}: the cached answer {} differs from the measured {}",
            again.answer,
            first.answer
        );
        if rank == 0 {
            let reread = ChoiceCache::open(&path)?;
            anyhow::ensure!(
                reread.lookup(&first.key).map(|c| &c.answer) == Some(&first.answer),
                "the choice file does not hold the answer"
            );
        }
        let none = first_use::choose(
            &mut job.rdzv,
            &ctx,
            &mut cache,
            "test.nothing-fits",
            shape,
            &candidates[2..],
            |_, c| measure(c),
        );
        match none {
            Ok(c) => anyhow::bail!(
                "chose {} although it failed on rank {}",
                c.answer,
                world - 1
            ),
            Err(e) => {
                let text = format!("{e:#}");
                anyhow::ensure!(
                    text.contains("no candidate could be measured")
                        && text.contains("cannot make it"),
                    "unexpected error: {text}"
                );
                Ok(())
            }
        }
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
