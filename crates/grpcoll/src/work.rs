//! Work lists: the matched transfers cut into chunks of rows (`weft_grpcoll_item`), for the native
//! kernel and for the baseline's gather and scatter, and their upload to the device.

use crate::error::GrpcollError;
use crate::meta::Transfer;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;
use weft_kernels::abi::{weft_grpcoll_item, WEFT_GRPCOLL_MAX_ITEMS, WEFT_GRPCOLL_MAX_PEERS};

/// Rows per item are chosen so one item moves about this many bytes (all tensors together).
const CHUNK_BYTES: usize = 64 << 10;

/// A work list in device memory.
pub(crate) struct Items {
    pub buf: CudaSlice<u8>,
    pub count: u32,
}

impl Items {
    pub fn upload(stream: &Arc<CudaStream>, items: &[weft_grpcoll_item]) -> anyhow::Result<Self> {
        // The kernels' walk counts positions in 32 bits (weft_grpcoll_walk_item).
        anyhow::ensure!(
            items.len() < WEFT_GRPCOLL_MAX_ITEMS as usize,
            GrpcollError::Unsupported(format!(
                "a grpcoll launch of {} work items: at most {} (split the transfer)",
                items.len(),
                WEFT_GRPCOLL_MAX_ITEMS - 1
            ))
        );
        let bytes = std::mem::size_of_val(items);
        // SAFETY: weft_grpcoll_item is a bindgen plain-old-data struct of u32/i32 fields with no
        // padding; viewing the slice as bytes reads only initialised memory.
        let raw = unsafe { std::slice::from_raw_parts(items.as_ptr() as *const u8, bytes) };
        let buf = if raw.is_empty() {
            stream.alloc_zeros::<u8>(1)?
        } else {
            stream.clone_htod(raw)?
        };
        Ok(Self {
            buf,
            count: items.len() as u32,
        })
    }
}

/// Rows per item for rows of `row_bytes` bytes (summed over a packed launch's tensors).
pub(crate) fn chunk_rows(row_bytes: usize) -> usize {
    (CHUNK_BYTES / row_bytes.max(1)).max(1)
}

/// Splits `rows` rows into chunks of at most `chunk` rows, one item each, with `peers` (rank,
/// first row) advanced alongside.
pub(crate) fn push_chunks(
    out: &mut Vec<weft_grpcoll_item>,
    row: usize,
    rows: usize,
    peers: &[(usize, usize)],
    chunk: usize,
) {
    assert!(peers.len() <= WEFT_GRPCOLL_MAX_PEERS as usize);
    let mut at = 0;
    while at < rows {
        let n = chunk.min(rows - at);
        let mut item = weft_grpcoll_item {
            row: (row + at) as u32,
            rows: n as u32,
            npeers: peers.len() as u32,
            reserved: 0,
            peer: [0; 16],
            peer_row: [0; 16],
        };
        for (k, &(p, r)) in peers.iter().enumerate() {
            item.peer[k] = p as i32;
            item.peer_row[k] = (r + at) as u32;
        }
        out.push(item);
        at += n;
    }
}

/// Push items (GroupCast): per input split of `rank`, its rows and every destination's rows.
pub(crate) fn push_items(
    transfers: &[Transfer],
    rank: usize,
    input_splits: usize,
    chunk: usize,
) -> Vec<weft_grpcoll_item> {
    let mut items = Vec::new();
    for i in 0..input_splits {
        let ts: Vec<&Transfer> = transfers
            .iter()
            .filter(|t| t.src == rank && t.src_split == i)
            .collect();
        if let Some(t0) = ts.first() {
            let peers: Vec<(usize, usize)> = ts.iter().map(|t| (t.dst, t.dst_row)).collect();
            push_chunks(&mut items, t0.src_row, t0.rows, &peers, chunk);
        }
    }
    items
}

/// Pull items (GroupReduce, or GroupCast through a comm dtype): per output split of `rank`, its
/// rows and every source's rows — at `source_row(transfer)` (the source's input row natively, its
/// row in the receive staging for the baseline's scatter).
pub(crate) fn pull_items(
    transfers: &[Transfer],
    rank: usize,
    output_splits: usize,
    chunk: usize,
    source_row: impl Fn(&Transfer) -> usize,
) -> Vec<weft_grpcoll_item> {
    let mut items = Vec::new();
    for j in 0..output_splits {
        let ts: Vec<&Transfer> = transfers
            .iter()
            .filter(|t| t.dst == rank && t.dst_split == j)
            .collect();
        if let Some(t0) = ts.first() {
            let peers: Vec<(usize, usize)> = ts.iter().map(|t| (t.src, source_row(t))).collect();
            push_chunks(&mut items, t0.dst_row, t0.rows, &peers, chunk);
        }
    }
    items
}

/// The AlltoAll-v baseline's layout: per peer, the sends in input-split order and the receives in
/// output-split order (the matching rule pairs them in these orders), packed contiguously.
pub(crate) struct BaselineLayout {
    pub send_rows: Vec<usize>,
    pub recv_rows: Vec<usize>,
    /// Range-gather: input rows → send staging rows (push items onto this rank's send staging).
    pub gather: Vec<weft_grpcoll_item>,
    /// Each (source, output split)'s first row in the receive staging.
    pub recv_at: std::collections::HashMap<(usize, usize), usize>,
}

impl BaselineLayout {
    pub fn new(transfers: &[Transfer], rank: usize, world: usize, chunk: usize) -> Self {
        let mut send_rows = vec![0usize; world];
        let mut recv_rows = vec![0usize; world];
        let mut gather = Vec::new();
        let mut send_at = 0;
        for (p, rows) in send_rows.iter_mut().enumerate() {
            let mut ts: Vec<&Transfer> = transfers
                .iter()
                .filter(|t| t.src == rank && t.dst == p)
                .collect();
            ts.sort_by_key(|t| t.src_split);
            for t in ts {
                push_chunks(&mut gather, t.src_row, t.rows, &[(rank, send_at)], chunk);
                send_at += t.rows;
                *rows += t.rows;
            }
        }
        let mut recv_at = std::collections::HashMap::new();
        let mut at = 0;
        for (p, rows) in recv_rows.iter_mut().enumerate() {
            let mut ts: Vec<&Transfer> = transfers
                .iter()
                .filter(|t| t.dst == rank && t.src == p)
                .collect();
            ts.sort_by_key(|t| t.dst_split);
            for t in ts {
                recv_at.insert((t.src, t.dst_split), at);
                at += t.rows;
                *rows += t.rows;
            }
        }
        Self {
            send_rows,
            recv_rows,
            gather,
            recv_at,
        }
    }

    /// Range-scatter for a push (cast): receive staging rows → output rows (peer = this rank).
    pub fn push_scatter(
        &self,
        transfers: &[Transfer],
        rank: usize,
        chunk: usize,
    ) -> Vec<weft_grpcoll_item> {
        let mut items = Vec::new();
        let mut firsts: Vec<&Transfer> = transfers.iter().filter(|t| t.dst == rank).collect();
        firsts.sort_by_key(|t| t.dst_split);
        for t in firsts {
            let from = self.recv_at[&(t.src, t.dst_split)];
            push_chunks(&mut items, from, t.rows, &[(rank, t.dst_row)], chunk);
        }
        items
    }

    /// Scatter for a pull (reduce, or cast converted back): output rows ← receive staging rows.
    pub fn pull_scatter(
        &self,
        transfers: &[Transfer],
        rank: usize,
        output_splits: usize,
        chunk: usize,
    ) -> Vec<weft_grpcoll_item> {
        pull_items(transfers, rank, output_splits, chunk, |t| {
            self.recv_at[&(t.src, t.dst_split)]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_rows_and_advance_peers() {
        let mut v = Vec::new();
        push_chunks(&mut v, 10, 7, &[(1, 100), (3, 0)], 3);
        assert_eq!(v.len(), 3);
        assert_eq!(
            (
                v[2].row,
                v[2].rows,
                v[2].peer_row[0],
                v[2].peer_row[1],
                v[2].peer[1]
            ),
            (16, 1, 106, 6, 3)
        );
        push_chunks(&mut v, 0, 0, &[(0, 0)], 3);
        assert_eq!(v.len(), 3);
    }

    // The kernels' walk (weft_grpcoll_walk_item, the same C definition): a permutation of the
    // items; with items in per-peer runs no two ranks are on the same peer at the same position,
    // and interleaved, every rank's consecutive blocks are on different peers.
    fn walk(n: u32, world: u32, rank: u32, interleave: bool) -> Vec<u32> {
        use weft_kernels::abi::{weft_grpcoll_walk_item, weft_grpcoll_walk_length};
        // SAFETY: pure functions of their integer arguments.
        let len = unsafe { weft_grpcoll_walk_length(n, world) };
        (0..len)
            .map(|j| unsafe { weft_grpcoll_walk_item(j, n, world, rank, interleave as u32) })
            .collect()
    }

    #[test]
    fn the_walk_takes_every_item_once() {
        for interleave in [false, true] {
            for world in 1..=weft_kernels::abi::WEFT_PGL_MAX_RANKS {
                for rank in 0..world {
                    for n in (0..=70u32).chain([1000, 4097]) {
                        let mut seen = vec![0u32; n as usize];
                        let mut empty = 0;
                        for it in walk(n, world, rank, interleave) {
                            if it == n {
                                empty += 1;
                            } else {
                                seen[it as usize] += 1;
                            }
                        }
                        let at = format!("n {n} world {world} rank {rank} interleave {interleave}");
                        assert!(seen.iter().all(|&c| c == 1), "{at}: {seen:?}");
                        assert!(empty < world, "{at}: {empty} empty positions");
                    }
                }
            }
        }
    }

    // Near the largest list (2^31 - 1 items) the 32-bit walk agrees with the same walk in exact
    // 64-bit arithmetic: nothing wraps.
    #[test]
    fn the_walk_does_not_wrap_near_the_limit() {
        use weft_kernels::abi::{
            weft_grpcoll_walk_item, weft_grpcoll_walk_length, WEFT_GRPCOLL_MAX_ITEMS,
        };
        let n = WEFT_GRPCOLL_MAX_ITEMS - 1;
        for world in [1u32, 3, 4, 16] {
            let run = n.div_ceil(world);
            // SAFETY: pure functions of their integer arguments.
            let len = unsafe { weft_grpcoll_walk_length(n, world) };
            assert_eq!(len, run * world);
            for rank in [0, world - 1] {
                for interleave in [0u32, 1] {
                    for j in len - world..len {
                        let it = unsafe { weft_grpcoll_walk_item(j, n, world, rank, interleave) };
                        let (j, run64) = (j as u64, run as u64);
                        let (lane, step) = if interleave == 1 {
                            (j % world as u64, j / world as u64)
                        } else {
                            (j / run64, j % run64)
                        };
                        let r = (lane + rank as u64 + 1) % world as u64;
                        let want = (r * run64 + step).min(n as u64) as u32;
                        assert_eq!(
                            it, want,
                            "world {world} rank {rank} interleave {interleave} position {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_walk_spreads_ranks_over_peers() {
        let (world, per_peer) = (4u32, 6u32);
        let n = world * per_peer; // items [p·6, p·6 + 6) go to peer p
        let all: Vec<u32> = (0..world).collect();
        for interleave in [false, true] {
            let walks: Vec<Vec<u32>> = (0..world).map(|r| walk(n, world, r, interleave)).collect();
            for (r, w) in walks.iter().enumerate() {
                assert_eq!(
                    w[0] / per_peer,
                    (r as u32 + 1) % world,
                    "rank {r} starts on the next peer"
                );
                if interleave {
                    for step in w.chunks(world as usize) {
                        let mut peers: Vec<u32> = step.iter().map(|&i| i / per_peer).collect();
                        peers.sort();
                        assert_eq!(peers, all, "rank {r}: {step:?}");
                    }
                } else {
                    // Whole runs, each in order.
                    for run in w.chunks(per_peer as usize) {
                        assert!(
                            run.windows(2).all(|p| p[1] == p[0] + 1),
                            "rank {r}: {run:?}"
                        );
                    }
                }
            }
            for j in 0..n as usize {
                let mut peers: Vec<u32> = walks.iter().map(|w| w[j] / per_peer).collect();
                peers.sort();
                assert_eq!(peers, all, "position {j}, interleave {interleave}");
            }
        }
    }

    #[test]
    fn chunk_rows_move_about_64_kib() {
        assert_eq!(chunk_rows(8192), 8);
        assert_eq!(chunk_rows(1 << 20), 1);
        assert_eq!(chunk_rows(0), 65536);
    }
}
