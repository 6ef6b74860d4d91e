//! Group collectives with device-resident metadata: one plan sized by a capacity runs four
//! different random patterns in a row, each written to the GPU in stream order before its runs
//! (no plan rebuilt, no host matching), and every output is checked against the float64 CPU
//! reference as in grpcoll.rs. A disagreement found by the layout kernel fails every rank with
//! the same message, moves nothing, and the plan then runs a correct pattern.

use super::grpcoll::{cast_blocks, gpu_stream, read, reduce_blocks, ring_cast, values, write};
use super::grpcoll_reference::{
    cast_reference, check, check_lse, reduce_reference, round_to, GElem, Op, ReduceInputs,
};
use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::{Case, Skip};
use half::bf16;
use rand::rngs::StdRng;
use rand::SeedableRng;
use weft_grpcoll::pattern::{cast_metas, reduce_metas};
use weft_grpcoll::{Capacity, GroupCast, GroupCastMeta, GroupReduce, Options, ReduceOp};
use weft_pgl::DType;

const PATTERNS: usize = 4;
const ROW_ELEMS: usize = 136;
const LSE_PER_ROW: usize = 8;
const INPUT: u64 = 21;

fn capacity(world: usize) -> Capacity {
    // The trial patterns: up to 5 splits per rank on its own side and 5 · world on the other
    // (a reduce input, a cast output), under 600 rows each.
    Capacity {
        max_splits: 5 * world,
        max_input_rows: 5 * world * 600,
        max_output_rows: 5 * world * 600,
    }
}

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("grpcoll::device_meta::cast::bf16", |j| {
            cast::<bf16>(j, None)
        }),
        Case::gpu("grpcoll::device_meta::cast::f32_via_bf16", |j| {
            cast::<f32>(j, Some(DType::Bf16))
        }),
        Case::gpu("grpcoll::device_meta::reduce::sum::f32", |j| {
            reduce::<f32>(j, Op::Sum)
        }),
        Case::gpu("grpcoll::device_meta::reduce::lse::bf16", |j| {
            reduce::<bf16>(j, Op::Lse)
        }),
        Case::gpu("grpcoll::errors::device_meta_disagreement", disagreement),
        Case::gpu("grpcoll::errors::device_meta_wrapping_rows", wrapping_rows),
        Case::gpu("grpcoll::errors::device_meta_split_count", |j| {
            rejected_words(j, Corrupt::SplitCount)
        }),
        Case::gpu("grpcoll::errors::device_meta_mask_outside_world", |j| {
            rejected_words(j, Corrupt::MaskOutsideWorld)
        }),
        Case::gpu("grpcoll::errors::device_meta_peer_count", |j| {
            rejected_words(j, Corrupt::PeerCount)
        }),
        Case::gpu("grpcoll::errors::device_meta_pair_count", |j| {
            rejected_words(j, Corrupt::PairCount)
        }),
    ]
}

fn cast<T: GElem>(job: &mut Job, comm_dtype: Option<DType>) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let comm = comm_dtype.unwrap_or(T::DTYPE);
    let opts = Options {
        comm_dtype,
        ..Options::default()
    };
    let mut plan =
        GroupCast::<T>::new_device(&mut job.rdzv, &stream, capacity(world), &[ROW_ELEMS], opts)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let checked = (|| -> anyhow::Result<()> {
        for p in 0..PATTERNS {
            let blocks = cast_blocks(&mut rng, world, p, true);
            let metas = cast_metas(world, &blocks);
            let ins: Vec<Vec<f64>> = (0..world)
                .map(|r| {
                    values::<T>(seed, INPUT, p, 0, r, metas[r].input_rows * ROW_ELEMS)
                        .into_iter()
                        .map(|x| x.to_f64())
                        .collect()
                })
                .collect();
            let want: Vec<f64> = cast_reference(&blocks, world, &ins, ROW_ELEMS, rank)
                .into_iter()
                .map(|v| round_to(comm, v))
                .collect();
            write(
                plan.input(),
                &values::<T>(seed, INPUT, p, 0, rank, metas[rank].input_rows * ROW_ELEMS),
            )?;
            write(plan.output(), &vec![T::poison(); plan.output().len()])?;
            plan.write_device_meta(&metas[rank])?;
            plan.run()?;
            plan.run()?;
            plan.synchronize()?;
            let what = format!(
                "{} device-metadata cast via {}, pattern {p}, seed {seed}, rank {rank}",
                T::DTYPE.name(),
                comm.name()
            );
            check(&what, &read(plan.output())?, &want, None)?;
        }
        Ok(())
    })();
    let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll device-metadata cast trial", checked);
    plan.free(&mut job.rdzv)?;
    checked
}

fn reduce<T: GElem>(job: &mut Job, op: Op) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let (rop, lse_per_row) = match op {
        Op::Lse => (
            ReduceOp::Lse {
                lse_per_row: LSE_PER_ROW,
            },
            LSE_PER_ROW,
        ),
        Op::Avg => (ReduceOp::Avg, 0),
        Op::Sum => (ReduceOp::Sum, 0),
    };
    let mut plan = GroupReduce::<T>::new_device(
        &mut job.rdzv,
        &stream,
        capacity(world),
        &[ROW_ELEMS],
        rop,
        Options::default(),
    )?;
    let mut rng = StdRng::seed_from_u64(seed);
    let checked = (|| -> anyhow::Result<()> {
        for p in 0..PATTERNS {
            let blocks = reduce_blocks(&mut rng, world, p, true);
            let metas = reduce_metas(world, &blocks);
            let ins: Vec<Vec<f64>> = (0..world)
                .map(|r| {
                    values::<T>(seed, INPUT, p, 0, r, metas[r].input_rows * ROW_ELEMS)
                        .into_iter()
                        .map(|x| x.to_f64())
                        .collect()
                })
                .collect();
            let lse_of = |r: usize| {
                super::grpcoll::lse_values(seed, INPUT, p, r, metas[r].input_rows * lse_per_row)
            };
            let lses: Vec<Vec<f64>> = (0..world)
                .map(|r| lse_of(r).into_iter().map(f64::from).collect())
                .collect();
            let x = ReduceInputs {
                ins: &ins,
                lses: &lses,
                prior: None,
                row_elems: ROW_ELEMS,
                lse_per_row,
            };
            let (want, want_lse, scale) = reduce_reference(&blocks, world, &x, op, rank);
            write(
                plan.input(),
                &values::<T>(seed, INPUT, p, 0, rank, metas[rank].input_rows * ROW_ELEMS),
            )?;
            write(plan.output(), &vec![T::poison(); plan.output().len()])?;
            if let (Some(il), Some(ol)) = (plan.input_lse(), plan.output_lse()) {
                write(il, &lse_of(rank))?;
                write(ol, &vec![f32::NAN; ol.len()])?;
            }
            plan.write_device_meta(&metas[rank])?;
            plan.run()?;
            plan.run()?;
            plan.synchronize()?;
            let what = format!(
                "{} device-metadata reduce {op:?}, pattern {p}, seed {seed}, rank {rank}",
                T::DTYPE.name()
            );
            check(&what, &read(plan.output())?, &want, Some(&scale))?;
            if let Some(l) = plan.output_lse() {
                check_lse(&what, &read(l)?, &want_lse)?;
            }
        }
        Ok(())
    })();
    let checked = weft_pgl::agree(
        &mut job.rdzv,
        "grpcoll device-metadata reduce trial",
        checked,
    );
    plan.free(&mut job.rdzv)?;
    checked
}

/// A device-metadata GroupCast of rows of 16 f32 with room for 2 splits and 8 rows per side,
/// `body` run on it (every rank's outcome agreed as `what`), then freed.
fn on_small_device_plan(
    job: &mut Job,
    what: &str,
    body: impl FnOnce(&mut GroupCast<f32>, usize, usize) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let cap = Capacity {
        max_splits: 2,
        max_input_rows: 8,
        max_output_rows: 8,
    };
    let mut plan =
        GroupCast::<f32>::new_device(&mut job.rdzv, &stream, cap, &[16], Options::default())?;
    let checked = body(&mut plan, rank, world);
    let checked = weft_pgl::agree(&mut job.rdzv, what, checked);
    plan.free(&mut job.rdzv)?;
    checked
}

/// Rank 0 expects 5 rows from its ring source, which sends 4: every rank's synchronize names
/// the pair, nothing is written, and the same plan then runs the consistent ring.
fn disagreement(job: &mut Job) -> anyhow::Result<()> {
    on_small_device_plan(
        job,
        "grpcoll device-metadata disagreement trial",
        |plan, rank, world| {
            let good = ring_cast(rank, world, 4);
            let mut bad = good.clone();
            if rank == 0 {
                bad.output_split_rows = vec![5];
                bad.output_rows = 5;
            }
            write(plan.input(), &vec![1.5f32; 4 * 16])?;
            write(plan.output(), &vec![f32::NAN; plan.output().len()])?;
            plan.write_device_meta(&bad)?;
            plan.run()?;
            let needle = format!("device metadata rejected, nothing was moved: rank {}'s input split 0 (4 rows) is rank 0's output split 0 by the matching rule, which has 5 rows", world - 1);
            expect_rejected(
                plan,
                &needle,
                "the inconsistent device metadata was accepted",
            )?;
            runs_the_ring_after(plan, &good)
        },
    )
}

/// Inputs of 1.5, a poisoned output, `words` written as this rank's device metadata (raw, past
/// the host's checks), then a run.
fn run_raw_words(plan: &mut GroupCast<f32>, words: &[u32]) -> anyhow::Result<()> {
    write(plan.input(), &vec![1.5f32; plan.input().len()])?;
    write(plan.output(), &vec![f32::NAN; plan.output().len()])?;
    let meta = plan
        .device_meta()
        .ok_or_else(|| anyhow::anyhow!("a device-metadata plan without its metadata buffer"))?;
    write(meta, words)?;
    Ok(plan.run()?)
}

/// After a rejected layout: the same plan runs the consistent 4-row ring `good` (inputs of 1.5):
/// the previous rank's rows arrive and the rest of the output keeps its poison.
fn runs_the_ring_after(plan: &mut GroupCast<f32>, good: &GroupCastMeta) -> anyhow::Result<()> {
    plan.write_device_meta(good)?;
    plan.run()?;
    plan.synchronize()?;
    let out = read(plan.output())?;
    anyhow::ensure!(
        out[..4 * 16].iter().all(|&v| v == 1.5) && out[4 * 16..].iter().all(|v| v.is_nan()),
        "the ring after the rejected layout moved the wrong rows"
    );
    Ok(())
}

/// After a run: synchronize fails with a `GrpcollError::Layout` with `needle` in its message, and
/// the output kept its poison.
fn expect_rejected(plan: &GroupCast<f32>, needle: &str, accepted: &str) -> anyhow::Result<()> {
    match plan.synchronize() {
        Ok(()) => anyhow::bail!("{accepted}"),
        Err(e) => {
            anyhow::ensure!(
                format!("{e:#}").contains(needle),
                "expected {needle:?}, got: {e:#}"
            );
            anyhow::ensure!(
                matches!(e, weft_grpcoll::GrpcollError::Layout { .. }),
                "expected a GrpcollError::Layout, got {e:?}"
            );
        }
    }
    anyhow::ensure!(
        read(plan.output())?.iter().all(|v| v.is_nan()),
        "a rejected layout wrote output rows"
    );
    Ok(())
}

/// Device metadata written by the user's own code (here raw words, past the host's checks) whose
/// row counts sum to a small number only modulo 2^32: every rank sends [2^32 - 4, 8] rows to the
/// next rank and expects the same from the previous one, which is 4 rows in 32-bit arithmetic and
/// consistent on both sides of every pair. The layout kernel sums in 64 bits and must refuse it
/// against the capacity (8 rows) on every rank, moving nothing.
fn wrapping_rows(job: &mut Job) -> anyhow::Result<()> {
    on_small_device_plan(
        job,
        "grpcoll device-metadata wrapping-rows trial",
        |plan, rank, world| {
            let to = 1u32 << ((rank + 1) % world);
            let from = 1u32 << ((rank + world - 1) % world);
            // huge + 8 = 4 modulo 2^32.
            let huge = u32::MAX - 3;
            // The device layout (weft/abi/grpcoll.h): split counts, then per side the rows and peer
            // masks of max_splits splits.
            let words = [2, 2, huge, 8, to, to, huge, 8, from, from];
            run_raw_words(plan, &words)?;
            expect_rejected(
                plan,
                "splits sum to at least 4294967295 rows; the capacity is 8",
                "row counts that wrap in 32 bits were accepted",
            )
        },
    )
}

/// One problem in rank 0's device metadata (raw words, past the host's checks) of a ring where
/// every rank sends 4 rows to the next: each is what one of the layout kernel's checks refuses.
#[derive(Clone, Copy)]
enum Corrupt {
    /// 3 input splits listed, the capacity being 2.
    SplitCount,
    /// The input split's destinations name rank `world`.
    MaskOutsideWorld,
    /// The output split names two sources (a cast output takes exactly one).
    PeerCount,
    /// The 4 rows go to the next rank as two splits of 2, which expects one split.
    PairCount,
}

/// Every rank's layout kernel must refuse rank 0's corrupted words with the same message, move
/// nothing, and the same plan then runs the consistent ring.
fn rejected_words(job: &mut Job, corrupt: Corrupt) -> anyhow::Result<()> {
    if matches!(corrupt, Corrupt::PeerCount) && job.world() < 2 {
        return Err(Skip("needs two ranks (a second source to name)".into()).into());
    }
    on_small_device_plan(
        job,
        "grpcoll device-metadata rejection trial",
        |plan, rank, world| {
            let to = 1u32 << ((rank + 1) % world);
            let from = 1u32 << ((rank + world - 1) % world);
            // The device layout (weft/abi/grpcoll.h), max_splits = 2: split counts, then per side
            // the rows and peer masks of 2 splits.
            let mut words = [1, 1, 4, 0, to, 0, 4, 0, from, 0];
            let needle = match corrupt {
                Corrupt::SplitCount => {
                    words[0] = 3;
                    "rank 0 lists 3 input splits; the capacity is 2".to_string()
                }
                Corrupt::MaskOutsideWorld => {
                    words[4] |= 1 << world;
                    "rank 0's input split 0 names ranks outside the world".to_string()
                }
                Corrupt::PeerCount => {
                    words[8] |= 1;
                    "rank 0's output split 0 names 2 ranks; it must name exactly one".to_string()
                }
                Corrupt::PairCount => {
                    words[..6].copy_from_slice(&[2, 1, 2, 2, to, to]);
                    // The next rank (rank 0 itself at world 1).
                    format!(
                        "rank 0 sends 2 input splits to rank {d} but rank {d} expects 1 from rank 0",
                        d = 1 % world
                    )
                }
            };
            if rank != 0 {
                words = [1, 1, 4, 0, to, 0, 4, 0, from, 0];
            }
            run_raw_words(plan, &words)?;
            expect_rejected(plan, &needle, "the corrupted device metadata was accepted")?;
            runs_the_ring_after(plan, &ring_cast(rank, world, 4))
        },
    )
}
