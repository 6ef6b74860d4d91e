//! GroupCast / GroupReduce correctness (crates/grpcoll): seeded random patterns (split counts and
//! sizes, empty splits, fan-out 0…world for cast and 1…world for reduce, odd row widths), f32 and
//! bf16, the native kernels and the AlltoAll-v baseline, against a float64 CPU reference that every
//! rank computes from every rank's regenerated inputs. Outputs are poisoned (NaN) first; every
//! output element is checked, and the rows past this rank's output must stay poisoned. Cast is
//! checked bit for bit; reductions within a tolerance set by the dtype (see `Tol`). The native
//! path runs three times back to back per pattern (epoch reuse with no host synchronisation).
//! Metadata errors must fail on every rank with a message naming the problem.

use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::sys;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weft_grpcoll::pattern::{cast_metas, reduce_metas, CastBlock, ReduceBlock};
use weft_grpcoll::{GroupCast, GroupCastMeta, GroupReduce, GroupReduceMeta, Options, ReduceOp};
use weft_pgl::{Pgl, PglElement};

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("grpcoll::cast::f32", cast_trial::<f32>),
        Case::gpu("grpcoll::cast::bf16", cast_trial::<bf16>),
        Case::gpu("grpcoll::reduce::sum::f32", |j| {
            reduce_trial::<f32>(j, Op::Sum)
        }),
        Case::gpu("grpcoll::reduce::sum::bf16", |j| {
            reduce_trial::<bf16>(j, Op::Sum)
        }),
        Case::gpu("grpcoll::reduce::avg::f32", |j| {
            reduce_trial::<f32>(j, Op::Avg)
        }),
        Case::gpu("grpcoll::reduce::avg::bf16", |j| {
            reduce_trial::<bf16>(j, Op::Avg)
        }),
        Case::gpu("grpcoll::reduce::lse::f32", |j| {
            reduce_trial::<f32>(j, Op::Lse)
        }),
        Case::gpu("grpcoll::reduce::lse::bf16", |j| {
            reduce_trial::<bf16>(j, Op::Lse)
        }),
        Case::gpu("grpcoll::errors::split_sum", err_split_sum),
        Case::gpu("grpcoll::errors::index_out_of_range", err_out_of_range),
        Case::gpu("grpcoll::errors::duplicate_destination", err_duplicate),
        Case::gpu("grpcoll::errors::cross_rank_disagreement", err_disagreement),
        Case::gpu("grpcoll::errors::unsupported_dtype", err_dtype),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Sum,
    Avg,
    Lse,
}

/// A data type of the trials: conversions to and from f64 and its precision.
trait GElem: PglElement + PartialEq + std::fmt::Debug {
    /// Relative spacing of the type (2^-23 for f32, 2^-7 for bf16).
    const EPS: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn poison() -> Self;
}

impl GElem for f32 {
    const EPS: f64 = f32::EPSILON as f64;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn poison() -> Self {
        f32::NAN
    }
}

impl GElem for bf16 {
    const EPS: f64 = 0.0078125;
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn poison() -> Self {
        bf16::NAN
    }
}

const PATTERNS: usize = 6;
const ROW_ELEMS: [usize; 6] = [1, 3, 8, 24, 136, 1024];

fn gpu_stream(job: &Job) -> anyhow::Result<std::sync::Arc<cudarc::driver::CudaStream>> {
    Ok(job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .stream
        .clone())
}

fn random_subset(rng: &mut StdRng, world: usize, min: usize) -> Vec<usize> {
    let k = rng.random_range(min..=world);
    let mut all: Vec<usize> = (0..world).collect();
    for i in 0..world {
        let j = rng.random_range(i..world);
        all.swap(i, j);
    }
    all.truncate(k);
    all
}

fn random_rows(rng: &mut StdRng, big: bool) -> usize {
    match rng.random_range(0..10) {
        0..=1 => 0,
        2..=7 => rng.random_range(1..40),
        _ => rng.random_range(1..if big { 600 } else { 80 }),
    }
}

/// Pattern p: up to 5 splits per rank; pattern 0 sends every split to every rank (full fan-out).
fn cast_blocks(rng: &mut StdRng, world: usize, p: usize, big: bool) -> Vec<CastBlock> {
    let mut v = Vec::new();
    for owner in 0..world {
        for _ in 0..rng.random_range(0..=5) {
            let dsts = if p == 0 {
                (0..world).collect()
            } else {
                random_subset(rng, world, 0)
            };
            v.push(CastBlock {
                owner,
                rows: random_rows(rng, big),
                dsts,
            });
        }
    }
    // Interleave owners in the list (the generator keeps each owner's order).
    let n = v.len();
    for i in 0..n {
        let j = rng.random_range(i..n);
        v.swap(i, j);
    }
    v
}

fn reduce_blocks(rng: &mut StdRng, world: usize, p: usize, big: bool) -> Vec<ReduceBlock> {
    let mut v = Vec::new();
    for receiver in 0..world {
        for _ in 0..rng.random_range(0..=5) {
            let srcs = if p == 0 {
                (0..world).collect()
            } else {
                random_subset(rng, world, 1)
            };
            v.push(ReduceBlock {
                receiver,
                rows: random_rows(rng, big),
                srcs,
            });
        }
    }
    v
}

/// Rank r's inputs of pattern p (values already rounded to T), regenerable by every rank.
fn inputs<T: GElem>(seed: u64, p: usize, r: usize, rows: usize, row_elems: usize) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(
        seed ^ ((p as u64) << 32) ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    (0..rows * row_elems)
        .map(|_| T::from_f64(rng.random_range(-1.0..1.0)))
        .collect()
}

fn lse_inputs(seed: u64, p: usize, r: usize, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(
        !seed ^ ((p as u64) << 32) ^ (r as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
    );
    (0..n)
        .map(|_| {
            if rng.random_range(0..20) == 0 {
                f32::NEG_INFINITY
            } else {
                rng.random_range(-4.0f32..4.0)
            }
        })
        .collect()
}

fn write<T: PglElement>(pgl: &Pgl<T>, host: &[T]) -> anyhow::Result<()> {
    anyhow::ensure!(
        host.len() <= pgl.len(),
        "{} elements do not fit a PGL of {}",
        host.len(),
        pgl.len()
    );
    if host.is_empty() {
        return Ok(());
    }
    pgl.context().bind_to_thread()?;
    // SAFETY: copies host.len() elements into this rank's buffer, which holds at least as many.
    let r = unsafe {
        sys::cuMemcpyHtoD_v2(
            pgl.local_ptr(),
            host.as_ptr().cast(),
            std::mem::size_of_val(host),
        )
    };
    anyhow::ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "copying to the PGL failed: {r:?}"
    );
    // From pageable memory the copy may still be in flight on the legacy stream when the call
    // returns, unordered with the plan's stream and with peers: finish it here.
    pgl.context().synchronize()?;
    Ok(())
}

fn read<T: PglElement + Default + Clone>(pgl: &Pgl<T>) -> anyhow::Result<Vec<T>> {
    let mut host = vec![T::default(); pgl.len()];
    pgl.context().bind_to_thread()?;
    // SAFETY: copies this rank's whole buffer into a host vector of the same length.
    let r = unsafe {
        sys::cuMemcpyDtoH_v2(
            host.as_mut_ptr().cast(),
            pgl.local_ptr(),
            std::mem::size_of_val(host.as_slice()),
        )
    };
    anyhow::ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "copying the PGL back failed: {r:?}"
    );
    Ok(host)
}

/// The first row of each block in its owner's (cast) / receiver-side source's (reduce) input,
/// from the generator's ordering rule, computed here independently of the plan's matching.
fn cast_reference(
    blocks: &[CastBlock],
    world: usize,
    ins: &[Vec<f64>],
    row_elems: usize,
    d: usize,
) -> Vec<f64> {
    let mut off = vec![0usize; world];
    let mut local = vec![0usize; world];
    let mut placed = Vec::new(); // (local index, owner, input row, rows)
    for b in blocks {
        if b.dsts.contains(&d) {
            placed.push((local[b.owner], b.owner, off[b.owner], b.rows));
        }
        local[b.owner] += 1;
        off[b.owner] += b.rows;
    }
    placed.sort();
    let mut out = Vec::new();
    for (_, owner, row, rows) in placed {
        out.extend_from_slice(&ins[owner][row * row_elems..(row + rows) * row_elems]);
    }
    out
}

fn check_cast<T: GElem>(what: &str, got: &[T], want: &[f64]) -> anyhow::Result<()> {
    let mut bad = 0;
    let mut first = Vec::new();
    for (i, g) in got.iter().enumerate() {
        let ok = match want.get(i) {
            Some(&w) => *g == T::from_f64(w) && g.to_f64().to_bits() == w.to_bits(),
            None => g.to_f64().is_nan(), // past this rank's output: never written
        };
        if !ok {
            bad += 1;
            if first.len() < 4 {
                let note = if i >= want.len() {
                    " (written past the output)"
                } else if g.to_f64().is_nan() {
                    " (never written)"
                } else {
                    ""
                };
                first.push(format!("[{i}] = {g:?}, expected {:?}{note}", want.get(i)));
            }
        }
    }
    anyhow::ensure!(
        bad == 0,
        "{what}: {bad} of {} elements wrong: {}",
        got.len(),
        first.join("; ")
    );
    Ok(())
}

fn cast_trial<T: GElem + Default + Clone>(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    job.comm()?;
    let mut rng = StdRng::seed_from_u64(seed);
    for p in 0..PATTERNS {
        let row_elems = ROW_ELEMS[rng.random_range(0..ROW_ELEMS.len())];
        let blocks = cast_blocks(&mut rng, world, p, row_elems <= 136);
        let metas = cast_metas(world, &blocks);
        let ins: Vec<Vec<f64>> = (0..world)
            .map(|r| {
                inputs::<T>(seed, p, r, metas[r].input_rows, row_elems)
                    .iter()
                    .map(|v| v.to_f64())
                    .collect()
            })
            .collect();
        let want = cast_reference(&blocks, world, &ins, row_elems, rank);
        let sms = Options {
            sms: Some(rng.random_range(1..=24)),
        };
        let mut plan = GroupCast::<T>::new(&mut job.rdzv, &stream, &metas[rank], row_elems, sms)?;
        let nsms = plan.sms();
        let what = |path: &str| {
            format!("{} cast {path}, pattern {p}, row_elems {row_elems}, {nsms} SMs, seed {seed}, rank {rank}", std::any::type_name::<T>())
        };
        write(
            plan.input(),
            &inputs::<T>(seed, p, rank, metas[rank].input_rows, row_elems),
        )?;
        let checked = (|| -> anyhow::Result<()> {
            write(plan.output(), &vec![T::poison(); plan.output().len()])?;
            for _ in 0..3 {
                plan.run()?;
            }
            plan.synchronize()?;
            check_cast(&what("native"), &read(plan.output())?, &want)?;
            write(plan.output(), &vec![T::poison(); plan.output().len()])?;
            // Nobody may still push into this rank's output (the previous check rewrote it).
            job.rdzv.barrier()?;
            plan.run_baseline(job.comm()?)?;
            plan.synchronize()?;
            check_cast(&what("AlltoAll-v baseline"), &read(plan.output())?, &want)
        })();
        let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll cast trial", checked);
        plan.free(&mut job.rdzv)?;
        checked?;
    }
    Ok(())
}

/// Reference for rank d's output: (values, lse, scale) where scale bounds the terms' magnitude
/// (Σ |weight · x|) for the tolerance.
#[allow(
    clippy::type_complexity,
    clippy::too_many_arguments,
    clippy::needless_range_loop
)]
fn reduce_reference(
    blocks: &[ReduceBlock],
    world: usize,
    ins: &[Vec<f64>],
    lses: &[Vec<f64>],
    row_elems: usize,
    lse_per_row: usize,
    op: Op,
    d: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    // Each source's input row of each block: blocks listing s, ordered by (receiver-local index, receiver).
    let mut local = vec![0usize; world];
    let locals: Vec<usize> = blocks
        .iter()
        .map(|b| {
            local[b.receiver] += 1;
            local[b.receiver] - 1
        })
        .collect();
    let mut in_row = vec![vec![0usize; world]; blocks.len()];
    for s in 0..world {
        let mut mine: Vec<usize> = (0..blocks.len())
            .filter(|&g| blocks[g].srcs.contains(&s))
            .collect();
        mine.sort_by_key(|&g| (locals[g], blocks[g].receiver));
        let mut at = 0;
        for g in mine {
            in_row[g][s] = at;
            at += blocks[g].rows;
        }
    }
    let group = if op == Op::Lse {
        row_elems / lse_per_row
    } else {
        row_elems
    };
    let (mut out, mut out_lse, mut scale) = (Vec::new(), Vec::new(), Vec::new());
    for (g, b) in blocks.iter().enumerate().filter(|(_, b)| b.receiver == d) {
        for r in 0..b.rows {
            for c in 0..row_elems {
                let h = c / group;
                let xs: Vec<(f64, f64)> = b
                    .srcs
                    .iter()
                    .map(|&s| {
                        let row = in_row[g][s] + r;
                        let l = if op == Op::Lse {
                            lses[s][row * lse_per_row + h]
                        } else {
                            0.0
                        };
                        (ins[s][row * row_elems + c], l)
                    })
                    .collect();
                let n = xs.len() as f64;
                match op {
                    Op::Sum => {
                        out.push(xs.iter().map(|x| x.0).sum());
                        scale.push(xs.iter().map(|x| x.0.abs()).sum());
                    }
                    Op::Avg => {
                        out.push(xs.iter().map(|x| x.0).sum::<f64>() / n);
                        scale.push(xs.iter().map(|x| x.0.abs()).sum::<f64>() / n);
                    }
                    Op::Lse => {
                        let m = xs.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                        let (lse, v, sc) = if m == f64::NEG_INFINITY {
                            (f64::NEG_INFINITY, 0.0, 0.0)
                        } else {
                            let lse = m + xs.iter().map(|x| (x.1 - m).exp()).sum::<f64>().ln();
                            let w = |x: &(f64, f64)| (x.1 - lse).exp();
                            (
                                lse,
                                xs.iter().map(|x| w(x) * x.0).sum(),
                                xs.iter().map(|x| w(x) * x.0.abs()).sum(),
                            )
                        };
                        out.push(v);
                        scale.push(sc);
                        if c % group == 0 {
                            out_lse.push(lse);
                        }
                    }
                }
            }
        }
    }
    (out, out_lse, scale)
}

/// Tolerance for a reduced element: fp32 accumulation of n terms costs about n·2^-24 of Σ|terms|
/// (and the lse weights a few ulps more), then the result is rounded to T: bf16 outputs are
/// compared with the reference rounded to bf16, allowing one bf16 ulp for a rounding flip.
fn tolerance<T: GElem>(want: f64, scale: f64) -> f64 {
    let acc = 64.0 * f32::EPSILON as f64 * (scale + want.abs());
    if T::EPS > f32::EPSILON as f64 {
        acc + T::EPS * want.abs().max(f64::MIN_POSITIVE)
    } else {
        acc
    }
}

fn check_reduce<T: GElem>(
    what: &str,
    got: &[T],
    want: &[f64],
    scale: &[f64],
) -> anyhow::Result<()> {
    let mut bad = 0;
    let mut first = Vec::new();
    for (i, g) in got.iter().enumerate() {
        let gv = g.to_f64();
        let ok = match want.get(i) {
            Some(&w) => {
                let w_t = T::from_f64(w).to_f64();
                (gv - w_t).abs() <= tolerance::<T>(w, scale[i])
            }
            None => gv.is_nan(),
        };
        if !ok {
            bad += 1;
            if first.len() < 4 {
                let note = if i >= want.len() {
                    " (written past the output)"
                } else if gv.is_nan() {
                    " (never written)"
                } else {
                    ""
                };
                first.push(format!("[{i}] = {gv}, expected {:?}{note}", want.get(i)));
            }
        }
    }
    anyhow::ensure!(
        bad == 0,
        "{what}: {bad} of {} elements wrong: {}",
        got.len(),
        first.join("; ")
    );
    Ok(())
}

fn check_lse(what: &str, got: &[f32], want: &[f64]) -> anyhow::Result<()> {
    let mut bad = Vec::new();
    let mut count = 0;
    for (i, &g) in got.iter().enumerate() {
        let ok = match want.get(i) {
            Some(&w) if w == f64::NEG_INFINITY => g == f32::NEG_INFINITY,
            Some(&w) => ((g as f64) - w).abs() <= 1e-5 * (1.0 + w.abs()),
            None => g.is_nan(),
        };
        if !ok {
            count += 1;
            if bad.len() < 4 {
                bad.push(format!("[{i}] = {g}, expected {:?}", want.get(i)));
            }
        }
    }
    anyhow::ensure!(
        count == 0,
        "{what}: {count} of {} lse values wrong: {}",
        got.len(),
        bad.join("; ")
    );
    Ok(())
}

fn reduce_trial<T: GElem + Default + Clone>(job: &mut Job, op: Op) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    job.comm()?;
    let mut rng = StdRng::seed_from_u64(seed);
    for p in 0..PATTERNS {
        let row_elems = ROW_ELEMS[rng.random_range(0..ROW_ELEMS.len())];
        let divisors: Vec<usize> = (1..=row_elems.min(16))
            .filter(|d| row_elems % d == 0)
            .collect();
        let lse_per_row = if op == Op::Lse {
            divisors[rng.random_range(0..divisors.len())]
        } else {
            0
        };
        let blocks = reduce_blocks(&mut rng, world, p, row_elems <= 136);
        let metas = reduce_metas(world, &blocks);
        let ins: Vec<Vec<f64>> = (0..world)
            .map(|r| {
                inputs::<T>(seed, p, r, metas[r].input_rows, row_elems)
                    .iter()
                    .map(|v| v.to_f64())
                    .collect()
            })
            .collect();
        let lses: Vec<Vec<f64>> = (0..world)
            .map(|r| {
                lse_inputs(seed, p, r, metas[r].input_rows * lse_per_row)
                    .iter()
                    .map(|&v| v as f64)
                    .collect()
            })
            .collect();
        let (want, want_lse, scale) = reduce_reference(
            &blocks,
            world,
            &ins,
            &lses,
            row_elems,
            lse_per_row,
            op,
            rank,
        );
        let rop = match op {
            Op::Sum => ReduceOp::Sum,
            Op::Avg => ReduceOp::Avg,
            Op::Lse => ReduceOp::Lse { lse_per_row },
        };
        let opts = Options {
            sms: Some(rng.random_range(1..=24)),
        };
        let mut plan =
            GroupReduce::<T>::new(&mut job.rdzv, &stream, &metas[rank], row_elems, rop, opts)?;
        let what = |path: &str| {
            format!("{} reduce {op:?} {path}, pattern {p}, row_elems {row_elems}, lse_per_row {lse_per_row}, seed {seed}, rank {rank}", std::any::type_name::<T>())
        };
        write(
            plan.input(),
            &inputs::<T>(seed, p, rank, metas[rank].input_rows, row_elems),
        )?;
        if let Some(l) = plan.input_lse() {
            write(
                l,
                &lse_inputs(seed, p, rank, metas[rank].input_rows * lse_per_row),
            )?;
        }
        let checked = (|| -> anyhow::Result<()> {
            for baseline in [false, true] {
                write(plan.output(), &vec![T::poison(); plan.output().len()])?;
                if let Some(l) = plan.output_lse() {
                    write(l, &vec![f32::NAN; l.len()])?;
                }
                if baseline {
                    plan.run_baseline(job.comm()?)?;
                } else {
                    for _ in 0..3 {
                        plan.run()?;
                    }
                }
                plan.synchronize()?;
                let path = if baseline {
                    "AlltoAll-v baseline"
                } else {
                    "native"
                };
                check_reduce(&what(path), &read(plan.output())?, &want, &scale)?;
                if let Some(l) = plan.output_lse() {
                    check_lse(&what(path), &read(l)?, &want_lse)?;
                }
            }
            Ok(())
        })();
        let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll reduce trial", checked);
        plan.free(&mut job.rdzv)?;
        checked?;
    }
    Ok(())
}

/// A valid ring pattern: every rank casts `rows` rows to the next rank.
fn ring_cast(rank: usize, world: usize, rows: usize) -> GroupCastMeta {
    GroupCastMeta {
        input_rows: rows,
        input_split_rows: vec![rows],
        dst_indices: vec![vec![(rank + 1) % world]],
        output_rows: rows,
        output_split_rows: vec![rows],
        src_index: vec![(rank + world - 1) % world],
    }
}

/// Builds a cast plan from `meta` and expects every rank to fail with `needle` in the error.
fn expect_cast_error(job: &mut Job, meta: GroupCastMeta, needle: &str) -> anyhow::Result<()> {
    let stream = gpu_stream(job)?;
    match GroupCast::<f32>::new(&mut job.rdzv, &stream, &meta, 16, Options::default()) {
        Ok(plan) => {
            plan.free(&mut job.rdzv)?;
            anyhow::bail!("the plan was accepted; expected an error containing {needle:?}")
        }
        Err(e) => {
            let text = format!("{e:#}");
            anyhow::ensure!(
                text.contains(needle),
                "expected an error containing {needle:?}, got: {text}"
            );
            Ok(())
        }
    }
}

fn err_split_sum(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let mut m = ring_cast(rank, world, 4);
    if rank == 0 {
        m.input_rows = 5;
    }
    expect_cast_error(job, m, "rank 0: error: group_cast: invalid metadata: input_split_rows sum to 4 rows but the input has 5 rows")
}

fn err_out_of_range(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let mut m = ring_cast(rank, world, 4);
    if rank == world - 1 {
        m.dst_indices[0] = vec![world];
    }
    let needle = format!("rank {}: error: group_cast: invalid metadata: dst_indices[0] lists rank {world}, but the world has {world} ranks", world - 1);
    expect_cast_error(job, m, &needle)
}

fn err_duplicate(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let mut m = ring_cast(rank, world, 4);
    let d = m.dst_indices[0][0];
    m.dst_indices[0] = vec![d, d];
    expect_cast_error(job, m, "dst_indices[0] lists rank")
}

fn err_disagreement(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    // Rank 0 expects 5 rows from its source, which sends 4: both named.
    let mut m = ring_cast(rank, world, 4);
    if rank == 0 {
        m.output_split_rows = vec![5];
        m.output_rows = 5;
    }
    let needle = format!("rank {}'s input split 0 (4 rows) is rank 0's output split 0 by the matching rule, which has 5 rows", world - 1);
    expect_cast_error(job, m, &needle)?;
    // Rank 0 expects nothing from its source (a missing receive).
    let mut m = ring_cast(rank, world, 4);
    if rank == 0 {
        m = GroupCastMeta {
            output_rows: 0,
            output_split_rows: vec![],
            src_index: vec![],
            ..m
        };
    }
    let needle = format!("rank {} sends 1 input splits to rank 0", world - 1);
    expect_cast_error(job, m, &needle)?;
    // A header disagreement: the row width.
    let stream = gpu_stream(job)?;
    let m = ring_cast(rank, world, 4);
    let row_elems = if rank == world - 1 { 32 } else { 16 };
    match GroupCast::<f32>::new(&mut job.rdzv, &stream, &m, row_elems, Options::default()) {
        Ok(p) => {
            p.free(&mut job.rdzv)?;
            if world > 1 {
                anyhow::bail!("row_elems 16 vs 32 was accepted");
            }
            Ok(())
        }
        Err(e) => {
            let needle = format!("rank {} has row_elems 32 but rank 0 has 16", world - 1);
            anyhow::ensure!(
                format!("{e:#}").contains(&needle),
                "expected {needle:?}, got: {e:#}"
            );
            Ok(())
        }
    }
}

fn err_dtype(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let stream = gpu_stream(job)?;
    let m = GroupReduceMeta {
        input_rows: 2,
        input_split_rows: vec![2],
        dst_index: vec![(rank + 1) % world],
        output_rows: 2,
        output_split_rows: vec![2],
        src_indices: vec![vec![(rank + world - 1) % world]],
    };
    match GroupReduce::<u32>::new(
        &mut job.rdzv,
        &stream,
        &m,
        8,
        ReduceOp::Sum,
        Options::default(),
    ) {
        Ok(p) => {
            p.free(&mut job.rdzv)?;
            anyhow::bail!("a u32 reduce was accepted")
        }
        Err(e) => {
            anyhow::ensure!(
                format!("{e:#}").contains("data dtype u32 is not supported (supported: f32, bf16)"),
                "got: {e:#}"
            );
            Ok(())
        }
    }
}
