//! Expert-parallel MoE dispatch and combine with weft-grpcoll: every token goes to the ranks that
//! hold its top-8 of 256 experts (GroupCast), each of those ranks transforms it, and the results
//! come back to the token's rank summed (GroupReduce) — DeepSeek-V3's routing shapes, 4096 tokens
//! per rank of hidden 7168 by default.
//!
//! How a user builds the metadata: each rank routes its own tokens, orders them by destination
//! set (a split = a run of tokens with the same set), and all-gathers its list of (rows, set); from
//! every rank's list `weft_grpcoll::pattern` derives this rank's GroupCast and GroupReduce
//! metadata, in the order the matching rule pairs sends with receives, so the combine's input is
//! the dispatch's output as it lies. The "experts" here scale each received row by (rank + 1) on
//! the host, a stand-in for the expert FFNs an engine runs on the GPU between the two; so the
//! combined row of a token is its input times Σ (d + 1) over its destination ranks d, which is
//! checked exactly (small integers, exact in bf16 for up to 8 ranks).
//!
//! Run one rank per GPU: `weft launch -n 2 -- target/release/weft-example-moe-dispatch-combine`,
//! or under mpirun / srun / torchrun. Optional argument: `TOKENSxHIDDEN` (default 4096x7168).

use cudarc::driver::CudaContext;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use weft_grpcoll::pattern::{cast_metas, reduce_metas, CastBlock, ReduceBlock};
use weft_grpcoll::{GroupCast, GroupCollective, GroupReduce, Options, ReduceOp};
use weft_pgl::gpu;
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;

const EXPERTS: usize = 256;
const TOP_K: usize = 8;

/// This rank's routing: per token, the set of ranks holding its top-k experts (a bit per rank;
/// experts spread evenly over the ranks), drawn from a gate stand-in.
fn route(rank: usize, world: usize, tokens: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(0x5eed ^ ((rank as u64) << 40));
    (0..tokens)
        .map(|_| {
            sample(&mut rng, EXPERTS, TOP_K)
                .iter()
                .fold(0u32, |set, e| set | 1 << (e * world / EXPERTS))
        })
        .collect()
}

/// Row `token` of rank `rank`'s input: integers in -8..=7.
fn token_row(rank: usize, token: usize, hidden: usize) -> impl Iterator<Item = f32> {
    let mut rng = StdRng::seed_from_u64(((rank as u64) << 32) ^ token as u64);
    (0..hidden).map(move |_| rng.random_range(-8i8..8) as f32)
}

fn ranks_of(set: u32, world: usize) -> Vec<usize> {
    (0..world).filter(|r| set >> r & 1 == 1).collect()
}

/// Mean microseconds of `runs` back-to-back runs to their completion, after an untimed one.
fn time_runs<T: weft_pgl::PglElement>(
    plan: &mut impl GroupCollective<T>,
    runs: u32,
) -> anyhow::Result<f64> {
    plan.run()?;
    plan.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..runs {
        plan.run()?;
    }
    plan.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / f64::from(runs))
}

fn parse_args(arg: Option<String>) -> anyhow::Result<(usize, usize)> {
    let text = arg.unwrap_or_else(|| "4096x7168".into());
    let dims: Vec<usize> = text
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{text:?}: {e} (expected TOKENSxHIDDEN)"))?;
    anyhow::ensure!(dims.len() == 2, "{text:?}: expected TOKENSxHIDDEN");
    anyhow::ensure!(
        dims[0] > 0 && dims[1] > 0,
        "{text:?}: tokens and hidden must be positive"
    );
    Ok((dims[0], dims[1]))
}

fn main() -> anyhow::Result<()> {
    // weft's warnings (e.g. a PGL dropped without free on an early return) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let (tokens, hidden) = parse_args(std::env::args().nth(1))?;
    let env = RankEnv::from_env()?;
    let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
    let (rank, world) = (rdzv.rank(), rdzv.world());
    anyhow::ensure!(
        world <= 8,
        "this example's exact check holds for at most 8 ranks, not {world}"
    );
    let ctx = CudaContext::new(gpu::device_for_rank(
        &env,
        CudaContext::device_count()? as usize,
    )?)?;
    let stream = ctx.new_stream()?;

    // Route, and order this rank's tokens by destination set: input row i is token order[i].
    let sets = route(rank, world, tokens);
    let mut order: Vec<usize> = (0..tokens).collect();
    order.sort_by_key(|&t| (sets[t], t));
    let mut own: Vec<(u32, u32)> = Vec::new(); // (rows, set) per split, in input order
    for &t in &order {
        match own.last_mut() {
            Some((rows, set)) if *set == sets[t] => *rows += 1,
            _ => own.push((1, sets[t])),
        }
    }
    // Every rank's splits, in rank order (each rank's in its input order).
    let bytes: Vec<u8> = own
        .iter()
        .flat_map(|&(rows, set)| [rows.to_le_bytes(), set.to_le_bytes()].concat())
        .collect();
    let mut cast_blocks = Vec::new();
    for (owner, part) in rdzv.all_gather(&bytes)?.iter().enumerate() {
        anyhow::ensure!(
            part.len() % 8 == 0,
            "rank {owner} sent a malformed split list"
        );
        for w in part.chunks_exact(8) {
            let rows = u32::from_le_bytes(w[..4].try_into()?) as usize;
            let set = u32::from_le_bytes(w[4..].try_into()?);
            cast_blocks.push(CastBlock {
                owner,
                rows,
                dsts: ranks_of(set, world),
            });
        }
    }
    // The combine mirrors the dispatch: each split's owner sums what its destinations send back.
    let reduce_blocks: Vec<ReduceBlock> = cast_blocks
        .iter()
        .map(|b| ReduceBlock {
            receiver: b.owner,
            rows: b.rows,
            srcs: b.dsts.clone(),
        })
        .collect();
    let cast_meta = cast_metas(world, &cast_blocks).swap_remove(rank);
    let reduce_meta = reduce_metas(world, &reduce_blocks).swap_remove(rank);

    // Collective: the plans validate and match every rank's metadata, and allocate the peer buffers.
    let mut dispatch =
        GroupCast::<bf16>::new(&mut rdzv, &stream, &cast_meta, hidden, Options::default())?;
    let mut combine = GroupReduce::<bf16>::new(
        &mut rdzv,
        &stream,
        &reduce_meta,
        hidden,
        ReduceOp::Sum,
        Options::default(),
    )?;

    let x: Vec<bf16> = order
        .iter()
        .flat_map(|&t| token_row(rank, t, hidden).map(bf16::from_f32))
        .collect();
    dispatch.input().copy_from_host(&x)?;
    dispatch.run()?;
    dispatch.synchronize()?;
    // The experts: this rank scales every row it received by rank + 1.
    let mut received = vec![bf16::ZERO; cast_meta.output_rows * hidden];
    dispatch.output().copy_to_host(&mut received)?;
    let scale = (rank + 1) as f32;
    received
        .iter_mut()
        .for_each(|v| *v = bf16::from_f32(v.to_f32() * scale));
    combine.input().copy_from_host(&received)?;
    combine.run()?;
    combine.synchronize()?;
    let mut combined = vec![bf16::ZERO; tokens * hidden];
    combine.output().copy_to_host(&mut combined)?;

    // Exact: the input row times Σ (d + 1) over the token's destination ranks.
    let mut wrong = 0usize;
    for (i, &t) in order.iter().enumerate() {
        let factor: usize = ranks_of(sets[t], world).iter().map(|d| d + 1).sum();
        for h in 0..hidden {
            let want = x[i * hidden + h].to_f32() * factor as f32;
            if combined[i * hidden + h].to_f32() != want {
                wrong += 1;
            }
        }
    }
    let checked = weft_pgl::agree(
        &mut rdzv,
        "checking the combined tokens",
        if wrong == 0 {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "{wrong} of {} combined elements differ from the host reference",
                tokens * hidden
            ))
        },
    );

    // Timing (host clock over back-to-back runs; `weft bench grpcoll` times with CUDA events):
    // bytes that cross NVLink into this rank — dispatch: the rows other ranks send here; combine:
    // the partials this rank pulls from the others.
    let runs = 20;
    let dispatch_us = time_runs(&mut dispatch, runs)?;
    let combine_us = time_runs(&mut combine, runs)?;
    let row_bytes = (hidden * 2) as f64;
    let cast_in: usize = (cast_meta.output_split_rows.iter().zip(&cast_meta.src_index))
        .filter(|(_, &s)| s != rank)
        .map(|(r, _)| r)
        .sum();
    let reduce_in: usize = (reduce_meta
        .output_split_rows
        .iter()
        .zip(&reduce_meta.src_indices))
    .map(|(r, s)| r * s.iter().filter(|&&d| d != rank).count())
    .sum();
    println!(
        "rank {rank}/{world}: {tokens} tokens x {hidden}, top-{TOP_K} of {EXPERTS} experts: \
         dispatch {} -> {} rows, {dispatch_us:.1} us ({:.0} GB/s over NVLink in); combine {} rows, \
         {combine_us:.1} us ({:.0} GB/s); every combined element {}",
        tokens,
        cast_meta.output_rows,
        cast_in as f64 * row_bytes / dispatch_us / 1e3,
        reduce_meta.output_rows,
        reduce_in as f64 * row_bytes / combine_us / 1e3,
        if checked.is_ok() { "exact" } else { "WRONG" }
    );
    let freed = dispatch.free(&mut rdzv).and(combine.free(&mut rdzv));
    checked.and(freed.map_err(anyhow::Error::from))
}
