//! Building consistent metadata for every rank from one global description of the splits (for
//! tests and benchmarks: every rank derives its own metadata from the same list).

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::{match_global, validate_local, Desc, Kind};

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
