//! signal-ce, GEMM + All-to-All with the rows moved by copy engines (`overlap::AllToAllCopyEngine`,
//! no NCCL: runs with ranks sharing a GPU too): 10⁴ launches back to back alternating two sets of
//! integer inputs in {-1, 0, 1} (k = 32: exact in bf16) and a routing that sends 85 % of the rows
//! to rank 0 (so rank 0's scatter is long and the others' launches run ahead into it), several
//! wave groups;
//! every launch's output compared bit for bit on the GPU with a float64 CPU GEMM of every source's
//! rows routed here, in the op's documented order (source by source, rows ascending). A copy that
//! lands in a buffer its receiver is still scattering, a scatter before a peer's copies landed, or
//! a group copied before it was stored shows as a difference. Misuse refused.

use super::fused_reduce_scatter::{device_addr, inputs, refused, TRIAL_WAIT};
use super::gpu;
use super::overlap::STRESS_ITERATIONS;
use crate::data::shared_seed;
use crate::gemm_data::{poisoned, upload};
use crate::job::Job;
use crate::trials::{Case, Skip};
use crate::word_compare::WordCompare;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weft_signal_gemm::overlap::{AllToAllCopyEngine, COPY_ENGINE_SM_MARGIN};
use weft_signal_gemm::reference::gemm_f64;
use weft_signal_gemm::{device_sms, GemmOptions, GemmPlan, GemmShape};
use weft_sync::WaitBudget;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("all_to_all_ce::stress_back_to_back_exact", stress),
        Case::gpu("all_to_all_ce::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// The output rows of `rank`: every row routed to it, source by source, rows ascending.
fn sources(routes: &[Vec<u32>], rank: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (s, r) in routes.iter().enumerate() {
        for (row, &d) in r.iter().enumerate() {
            if d as usize == rank {
                out.push((s, row));
            }
        }
    }
    out
}

/// The copy-engine All-to-All spans 2 to 32 ranks (a job of one is refused: `bad_inputs`).
fn needs_two_ranks(job: &Job) -> anyhow::Result<()> {
    if job.world() < 2 {
        return Err(Skip("the copy-engine All-to-All needs two ranks or more".into()).into());
    }
    Ok(())
}

fn stress(job: &mut Job) -> anyhow::Result<()> {
    needs_two_ranks(job)?;
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let (world, rank) = (job.world(), job.rank());
    // 40 tile rows × 8 or 16 tile columns: more tiles than one wave, so several groups.
    let shape = GemmShape::new(128 * 40, 2048, 32);
    let options = GemmOptions::default();
    let plan = GemmPlan::new(
        device_sms(&ctx)?,
        shape,
        GemmOptions {
            sm_margin: COPY_ENGINE_SM_MARGIN,
            ..options
        },
    )?;
    let waves = vec![1; plan.waves().min(8) as usize - 1]
        .into_iter()
        .chain([plan.waves() - (plan.waves().min(8) - 1)])
        .collect::<Vec<u32>>();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xce2a);
    let routes: Vec<Vec<u32>> = (0..world)
        .map(|_| {
            (0..shape.m)
                .map(|_| {
                    if rng.random_bool(0.85) {
                        0
                    } else {
                        rng.random_range(0..world as u32)
                    }
                })
                .collect()
        })
        .collect();
    let mine = sources(&routes, rank);
    let n = shape.n as usize;
    let mut a_dev = Vec::new();
    let mut b_dev = Vec::new();
    let mut exact = Vec::new();
    for set in 0..2u64 {
        let per_rank: Vec<(Vec<bf16>, Vec<bf16>)> = (0..world)
            .map(|r| inputs(seed, r, set, shape, true))
            .collect();
        a_dev.push(upload(&stream, &per_rank[rank].0)?);
        b_dev.push(upload(&stream, &per_rank[rank].1)?);
        let none: [bf16; 0] = [];
        let d: Vec<Vec<f64>> = per_rank
            .iter()
            .map(|(a, b)| gemm_f64(shape, options.b_layout, a, b, 1.0, 0.0, &none))
            .collect();
        let mut want = Vec::with_capacity(mine.len() * n);
        for &(s, row) in &mine {
            for &v in &d[s][row * n..(row + 1) * n] {
                anyhow::ensure!(
                    v.fract() == 0.0 && v.abs() <= 256.0,
                    "stress data is not exact in bf16"
                );
                want.push(bf16::from_f64(v));
            }
        }
        exact.push(upload(&stream, &want)?);
    }
    let mut op =
        AllToAllCopyEngine::<bf16>::new(&mut job.rdzv, &stream, shape, options, &waves, &routes)?;
    op.set_budget(WaitBudget::for_device(&ctx, TRIAL_WAIT)?);
    let result = (|| -> anyhow::Result<()> {
        anyhow::ensure!(
            op.map().rows() == mine.len(),
            "{} rows received, {} routed here",
            op.map().rows(),
            mine.len()
        );
        let mut out = poisoned::<bf16>(&stream, (mine.len() * n).max(1))?;
        let mut cmp = WordCompare::load(&stream)?;
        cmp.reset(&stream)?;
        for it in 0..STRESS_ITERATIONS {
            let set = it % 2;
            op.run(&stream, &a_dev[set], &b_dev[set], &mut out)?;
            if !mine.is_empty() {
                cmp.enqueue_raw(
                    &stream,
                    device_addr(&stream, &out),
                    device_addr(&stream, &exact[set]),
                    mine.len() * n * 2,
                )?;
            }
            if it % 1000 == 999 {
                stream.synchronize()?;
                op.check()?;
            }
        }
        stream.synchronize()?;
        op.check()?;
        let diff = cmp.take(&stream)?;
        anyhow::ensure!(
            diff.is_none(),
            "signal-ce:{waves:?}: {STRESS_ITERATIONS} launches on {world} ranks: rank {rank}'s output differed from the exact result: {diff:?}"
        );
        Ok(())
    })();
    let freed = op.free(&mut job.rdzv);
    result.and(freed.map_err(anyhow::Error::from))
}

/// Misuse gets an error that names it, on every rank alike (the plan is agreed collectively).
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (_ctx, stream) = gpu(job)?;
    if job.world() < 2 {
        // The world check comes first: a job of one is refused whatever else it asks.
        let routes = vec![vec![0u32; 512]];
        let one = AllToAllCopyEngine::<bf16>::new(
            &mut job.rdzv,
            &stream,
            GemmShape::new(512, 256, 64),
            GemmOptions::default(),
            &[1],
            &routes,
        )
        .and_then(|op| op.free(&mut job.rdzv));
        // The other refusals need a job the op can span.
        return refused(
            "signal-ce in a job of one rank",
            one.map_err(anyhow::Error::from),
            "spans 2 to 32 ranks",
        );
    }
    let world = job.world();
    let shape = GemmShape::new(512, 256, 64);
    let routes: Vec<Vec<u32>> = (0..world).map(|_| vec![0; 512]).collect();
    let try_plan = |job: &mut Job, options: GemmOptions, waves: &[u32], routes: &[Vec<u32>]| {
        AllToAllCopyEngine::<bf16>::new(&mut job.rdzv, &stream, shape, options, waves, routes)
            .and_then(|op| op.free(&mut job.rdzv))
    };
    let margin = GemmOptions {
        sm_margin: 8,
        ..GemmOptions::default()
    };
    refused(
        "signal-ce with sm_margin 8",
        try_plan(job, margin, &[1], &routes).map_err(anyhow::Error::from),
        "sets its own SM margin",
    )?;
    refused(
        "signal-ce with 3 waves per group of a 1-wave GEMM",
        try_plan(job, GemmOptions::default(), &[3], &routes).map_err(anyhow::Error::from),
        "cover",
    )?;
    let short: Vec<Vec<u32>> = (0..world).map(|_| vec![0; 16]).collect();
    refused(
        "signal-ce with 16-row routings for M = 512",
        try_plan(job, GemmOptions::default(), &[1], &short).map_err(anyhow::Error::from),
        "routing has 16 rows",
    )
}
