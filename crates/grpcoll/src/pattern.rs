//! Building consistent metadata for every rank from one global description of the splits (for
//! tests and benchmarks: every rank derives its own metadata from the same list), and
//! attention-like workloads that produce such lists ([`Workload`]).

use crate::meta::{GroupCastMeta, GroupReduceMeta};

/// One GroupCast split: `rows` rows of rank `owner`'s input, sent to every rank in `dsts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CastBlock {
    pub owner: usize,
    pub rows: usize,
    pub dsts: Vec<usize>,
}

/// One GroupReduce split: `rows` rows of rank `receiver`'s output, reduced from the partials of
/// every rank in `srcs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReduceBlock {
    pub receiver: usize,
    pub rows: usize,
    pub srcs: Vec<usize>,
}

/// The position of each block among its owner's blocks.
fn local_index(owners: impl Iterator<Item = usize>, world: usize) -> Vec<usize> {
    let mut count = vec![0usize; world];
    owners
        .map(|o| {
            count[o] += 1;
            count[o] - 1
        })
        .collect()
}

/// Each owner's input splits are its blocks in list order. Rank d's output splits are the blocks
/// sent to d ordered by (position among the owner's blocks, owner): sources interleave, and each
/// source's splits keep their order (the matching rule).
pub fn cast_metas(world: usize, blocks: &[CastBlock]) -> Vec<GroupCastMeta> {
    let local = local_index(blocks.iter().map(|b| b.owner), world);
    let mut metas = vec![GroupCastMeta::default(); world];
    for b in blocks {
        let m = &mut metas[b.owner];
        m.input_split_rows.push(b.rows);
        m.dst_indices.push(b.dsts.clone());
        m.input_rows += b.rows;
    }
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&g| (local[g], blocks[g].owner));
    for g in order {
        for &d in &blocks[g].dsts {
            let m = &mut metas[d];
            m.output_split_rows.push(blocks[g].rows);
            m.src_index.push(blocks[g].owner);
            m.output_rows += blocks[g].rows;
        }
    }
    metas
}

/// Each receiver's output splits are its blocks in list order. Rank s's input splits are the
/// blocks listing s, ordered by (position among the receiver's blocks, receiver).
pub fn reduce_metas(world: usize, blocks: &[ReduceBlock]) -> Vec<GroupReduceMeta> {
    let local = local_index(blocks.iter().map(|b| b.receiver), world);
    let mut metas = vec![GroupReduceMeta::default(); world];
    for b in blocks {
        let m = &mut metas[b.receiver];
        m.output_split_rows.push(b.rows);
        m.src_indices.push(b.srcs.clone());
        m.output_rows += b.rows;
    }
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by_key(|&g| (local[g], blocks[g].receiver));
    for g in order {
        for &s in &blocks[g].srcs {
            let m = &mut metas[s];
            m.input_split_rows.push(blocks[g].rows);
            m.dst_index.push(blocks[g].receiver);
            m.input_rows += blocks[g].rows;
        }
    }
    metas
}

/// Communication patterns of attention with context parallelism, for benchmarks: rank r holds
/// tokens [r·tokens, (r+1)·tokens) of one global token range. GroupCast moves a rank's K/V rows to
/// the ranks whose queries need them; GroupReduce brings the partial dK/dV back to their owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Each rank's tokens in `splits` equal splits; each split is cast to (reduced from) a
    /// pseudo-random set of 1 to world ranks drawn from `seed`.
    Uniform { splits: usize, seed: u64 },
    /// One causal sequence over all ranks: rank s's tokens are needed by every later rank (cast:
    /// to ranks > s; reduce: rank d sums the partials of ranks d..world).
    Causal,
    /// Varlen causal: sequences of pseudo-random lengths (tokens/4 to 2·tokens, from `seed`)
    /// packed one after another; a rank's part of a sequence is needed by the later ranks that
    /// sequence reaches.
    Varlen { seed: u64 },
    /// Mixture-of-experts routing (DeepSeek-V3-like): `experts` experts spread evenly over the
    /// ranks (expert e on rank e·world/experts); each token picks `top_k` distinct experts
    /// uniformly from `seed` and goes to every rank hosting one of them (its owner included when
    /// it hosts one), once per rank. Dispatch is the cast, combine the reduce (the owner sums the
    /// partials of those ranks). A rank's tokens are grouped by destination set, the layout a
    /// sort by routing gives: one split per set.
    Moe {
        experts: usize,
        top_k: usize,
        seed: u64,
    },
}

/// SplitMix64: a small deterministic generator, the same on every rank.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in lo..=hi.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

impl Workload {
    /// (owning rank, rows, the other ranks that need them) in global token order.
    fn segments(self, world: usize, tokens: usize) -> Vec<(usize, usize, Vec<usize>)> {
        let mut v = Vec::new();
        match self {
            Workload::Uniform { splits, seed } => {
                let mut rng = SplitMix(seed);
                for owner in 0..world {
                    for i in 0..splits {
                        let rows = tokens * (i + 1) / splits - tokens * i / splits;
                        let mut ranks: Vec<usize> = (0..world).collect();
                        for a in 0..world {
                            let b = rng.range(a, world - 1);
                            ranks.swap(a, b);
                        }
                        ranks.truncate(rng.range(1, world));
                        v.push((owner, rows, ranks));
                    }
                }
            }
            Workload::Causal => {
                for owner in 0..world {
                    v.push((owner, tokens, (owner + 1..world).collect()));
                }
            }
            Workload::Moe {
                experts,
                top_k,
                seed,
            } => {
                assert!(
                    top_k >= 1 && top_k <= experts && world <= 32,
                    "Moe: top_k in 1..=experts, world <= 32"
                );
                for owner in 0..world {
                    let mut rng =
                        SplitMix(seed ^ (owner as u64).wrapping_mul(0xA24B_AED4_963E_E407));
                    let mut per_set = std::collections::BTreeMap::<u32, usize>::new();
                    let mut ids: Vec<usize> = (0..experts).collect();
                    for _ in 0..tokens {
                        let mut set = 0u32;
                        for a in 0..top_k {
                            let b = rng.range(a, experts - 1);
                            ids.swap(a, b);
                            set |= 1 << (ids[a] * world / experts);
                        }
                        *per_set.entry(set).or_default() += 1;
                    }
                    for (set, rows) in per_set {
                        v.push((
                            owner,
                            rows,
                            (0..world).filter(|r| set >> r & 1 == 1).collect(),
                        ));
                    }
                }
            }
            Workload::Varlen { seed } => {
                let mut rng = SplitMix(seed);
                let total = world * tokens;
                let mut start = 0;
                while start < total {
                    let len = rng.range((tokens / 4).max(1), 2 * tokens.max(1));
                    let end = (start + len).min(total);
                    let (first, last) = (start / tokens, (end - 1) / tokens);
                    for owner in first..=last {
                        let rows = end.min((owner + 1) * tokens) - start.max(owner * tokens);
                        v.push((owner, rows, (owner + 1..=last).collect()));
                    }
                    start = end;
                }
            }
        }
        v
    }

    /// GroupCast blocks: each segment's rows to the ranks that need them (uniform: the drawn
    /// set, which may include the owner).
    pub fn cast_blocks(self, world: usize, tokens: usize) -> Vec<CastBlock> {
        self.segments(world, tokens)
            .into_iter()
            .map(|(owner, rows, dsts)| CastBlock { owner, rows, dsts })
            .collect()
    }

    /// GroupReduce blocks: each segment's owner reduces its own partial and those of the ranks
    /// that needed the rows (uniform, MoE: the drawn set as the sources).
    pub fn reduce_blocks(self, world: usize, tokens: usize) -> Vec<ReduceBlock> {
        let uniform = matches!(self, Workload::Uniform { .. } | Workload::Moe { .. });
        self.segments(world, tokens)
            .into_iter()
            .map(|(receiver, rows, others)| ReduceBlock {
                receiver,
                rows,
                srcs: if uniform {
                    others
                } else {
                    std::iter::once(receiver).chain(others).collect()
                },
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{match_global, validate_local, Desc, Kind};

    #[test]
    fn workloads_cover_every_token_once_and_match() {
        for w in [
            Workload::Uniform { splits: 3, seed: 7 },
            Workload::Causal,
            Workload::Varlen { seed: 9 },
            Workload::Moe {
                experts: 256,
                top_k: 8,
                seed: 3,
            },
            Workload::Moe {
                experts: 6,
                top_k: 1,
                seed: 4,
            },
        ] {
            for world in 1..=5 {
                let cast = w.cast_blocks(world, 100);
                let mut per_rank = vec![0usize; world];
                cast.iter().for_each(|b| per_rank[b.owner] += b.rows);
                assert!(
                    per_rank.iter().all(|&r| r == 100),
                    "{w:?} {world}: {per_rank:?}"
                );
                let descs: Vec<Desc> = cast_metas(world, &cast).iter().map(Desc::from).collect();
                descs
                    .iter()
                    .for_each(|d| validate_local(Kind::Cast, d, world).unwrap());
                match_global(Kind::Cast, &descs).unwrap();
                let red = w.reduce_blocks(world, 100);
                let descs: Vec<Desc> = reduce_metas(world, &red).iter().map(Desc::from).collect();
                descs
                    .iter()
                    .for_each(|d| validate_local(Kind::Reduce, d, world).unwrap());
                match_global(Kind::Reduce, &descs).unwrap();
            }
        }
        // MoE, top-8 of 256 over 2 ranks: a token stays on one rank only when all 8 experts fall
        // there (probability 2·C(128,8)/C(256,8) ≈ 0.7 %); every set is non-empty and sorted.
        let moe = Workload::Moe {
            experts: 256,
            top_k: 8,
            seed: 5,
        }
        .cast_blocks(2, 4096);
        let both: usize = moe
            .iter()
            .filter(|b| b.dsts == vec![0, 1])
            .map(|b| b.rows)
            .sum();
        assert!(
            (8000..8192).contains(&both),
            "{both} of 8192 tokens to both ranks"
        );
        assert!(moe
            .iter()
            .all(|b| !b.dsts.is_empty() && b.dsts.windows(2).all(|w| w[0] < w[1])));
        // Causal over 3 ranks: rank 0's tokens go to 1 and 2, rank 2's nowhere.
        let c = Workload::Causal.cast_blocks(3, 10);
        assert_eq!((c[0].dsts.clone(), c[2].dsts.clone()), (vec![1, 2], vec![]));
        assert_eq!(Workload::Causal.reduce_blocks(3, 10)[1].srcs, vec![1, 2]);
    }

    #[test]
    fn generated_cast_metadata_matches_blocks() {
        let blocks = vec![
            CastBlock {
                owner: 0,
                rows: 3,
                dsts: vec![1, 2],
            },
            CastBlock {
                owner: 1,
                rows: 0,
                dsts: vec![0],
            },
            CastBlock {
                owner: 0,
                rows: 5,
                dsts: vec![],
            },
            CastBlock {
                owner: 2,
                rows: 4,
                dsts: vec![0, 1, 2],
            },
            CastBlock {
                owner: 0,
                rows: 2,
                dsts: vec![1],
            },
        ];
        let metas = cast_metas(3, &blocks);
        let descs: Vec<Desc> = metas.iter().map(Desc::from).collect();
        for d in &descs {
            validate_local(Kind::Cast, d, 3).unwrap();
        }
        let t = match_global(Kind::Cast, &descs).unwrap();
        // 3 + 1 + 3 + 1 transfers (fan-outs 2, 1, 0, 3, 1).
        assert_eq!(t.len(), 7);
        // Rank 1's output: (0,0) block 0 of rank 0, (0,1) block 0 of rank 2 … interleaved by position.
        assert_eq!(metas[1].src_index, vec![0, 2, 0]);
        assert_eq!(metas[1].output_split_rows, vec![3, 4, 2]);
        let last = t.iter().find(|x| x.src == 0 && x.src_split == 2).unwrap();
        assert_eq!(
            (last.src_row, last.dst, last.dst_split, last.dst_row),
            (8, 1, 2, 7)
        );
    }

    #[test]
    fn generated_reduce_metadata_matches_blocks() {
        let blocks = vec![
            ReduceBlock {
                receiver: 1,
                rows: 2,
                srcs: vec![0, 1],
            },
            ReduceBlock {
                receiver: 0,
                rows: 3,
                srcs: vec![1],
            },
            ReduceBlock {
                receiver: 1,
                rows: 1,
                srcs: vec![1, 0],
            },
        ];
        let metas = reduce_metas(2, &blocks);
        let descs: Vec<Desc> = metas.iter().map(Desc::from).collect();
        for d in &descs {
            validate_local(Kind::Reduce, d, 2).unwrap();
        }
        let t = match_global(Kind::Reduce, &descs).unwrap();
        assert_eq!(t.len(), 5);
        assert_eq!(metas[1].dst_index, vec![0, 1, 1]);
        assert_eq!(metas[1].input_split_rows, vec![3, 2, 1]);
    }
}
