//! NCCL bandwidth in the style of nccl-tests: for each collective and size, the median time
//! (slowest rank), algorithm bandwidth = size / time and bus bandwidth = algbw × the collective's
//! factor, so numbers compare with nccl-tests and with docs/DESIGN.md §4. This table is the
//! communication baseline the overlap suites are compared against.
//!
//! Size conventions (nccl-tests'): all_reduce — the buffer; reduce_scatter — the send buffer
//! (world × output); all_gather — the receive buffer (world × input); all_to_all — each rank's
//! send buffer; send_recv — the message. Data are f32, random, never zeros. Sizes: 8 B to 1 GiB
//! (`--quick`: 1 to 256 MiB) or nccl-tests' `-b -e -f` (bench/sweep.rs), rounded down to whole
//! f32 and, per rank, at least one.

use super::sweep::Sweep;
use super::SuiteResult;
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::{median, time_iterations};
use cudarc::driver::{CudaSlice, CudaStream};
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_pgl::nccl::{Communicator, ReduceOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
    SendRecv,
}

const OPS: [Op; 5] = [
    Op::AllReduce,
    Op::ReduceScatter,
    Op::AllGather,
    Op::AllToAll,
    Op::SendRecv,
];

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::AllToAll => "all_to_all",
            Op::SendRecv => "send_recv",
        }
    }

    /// nccl-tests' bus-bandwidth factor.
    pub(super) fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::ReduceScatter | Op::AllGather | Op::AllToAll => (n - 1.0) / n,
            Op::SendRecv => 1.0,
        }
    }

    /// (send elements, receive elements) for a nominal size, rounded so blocks divide evenly.
    pub(super) fn counts(self, bytes: usize, world: usize) -> (usize, usize) {
        let elems = (bytes / 4).max(1);
        let block = (elems / world).max(1);
        match self {
            Op::AllReduce | Op::SendRecv => (elems, elems),
            Op::ReduceScatter => (block * world, block),
            Op::AllGather => (block, block * world),
            Op::AllToAll => (block * world, block * world),
        }
    }

    /// The size nccl-tests reports for these counts.
    pub(super) fn reported_bytes(self, send: usize, recv: usize) -> usize {
        4 * match self {
            Op::AllGather => recv,
            _ => send,
        }
    }

    /// Bus bandwidth at 1 GiB on 4×H200 from docs/DESIGN.md §4 (NCCL 2.28), where one was measured.
    fn anchor_busbw_gbs(self) -> Option<f64> {
        match self {
            Op::AllReduce => Some(355.0),
            Op::ReduceScatter => Some(322.0),
            Op::AllToAll => Some(335.0),
            Op::AllGather => Some(326.0),
            Op::SendRecv => None,
        }
    }
}

fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        (20..=28).step_by(2).map(|s| 1usize << s).collect() // 1 MiB … 256 MiB
    } else {
        (3..=30).map(|s| 1usize << s).collect() // 8 B … 1 GiB
    }
}

pub(super) fn enqueue(
    comm: &Communicator,
    op: Op,
    send: &CudaSlice<f32>,
    recv: &mut CudaSlice<f32>,
    s: usize,
    r: usize,
    stream: &Arc<CudaStream>,
) -> anyhow::Result<()> {
    let (send, mut recv) = (send.slice(..s), recv.slice_mut(..r));
    let world = comm.world();
    let r = match op {
        Op::AllReduce => comm.all_reduce(&send, &mut recv, ReduceOp::Sum, stream),
        Op::ReduceScatter => comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum, stream),
        Op::AllGather => comm.all_gather(&send, &mut recv, stream),
        Op::AllToAll => comm.all_to_all(&send, &mut recv, stream),
        Op::SendRecv => comm.send_recv(
            &send,
            (comm.rank() + 1) % world,
            &mut recv,
            (comm.rank() + world - 1) % world,
            stream,
        ),
    };
    Ok(r?)
}

/// A device buffer of `n` random f32 (filled from a 16 MiB random block, copied repeatedly).
fn random_buffer(stream: &Arc<CudaStream>, n: usize, seed: u64) -> anyhow::Result<CudaSlice<f32>> {
    random_buffer_of(stream, n, seed, |rng| rng.random_range(-1.0..1.0))
}

/// A device buffer of `n` f32 drawn by `draw` (a 16 MiB block of them, copied repeatedly).
pub(super) fn random_buffer_of(
    stream: &Arc<CudaStream>,
    n: usize,
    seed: u64,
    mut draw: impl FnMut(&mut rand::rngs::StdRng) -> f32,
) -> anyhow::Result<CudaSlice<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let block: Vec<f32> = (0..(1 << 22).min(n)).map(|_| draw(&mut rng)).collect();
    // SAFETY: every element is written by the copies below before any use.
    let mut buf = unsafe { stream.alloc::<f32>(n) }?;
    let mut at = 0;
    while at < n {
        let len = block.len().min(n - at);
        stream.memcpy_htod(&block[..len], &mut buf.slice_mut(at..at + len))?;
        at += len;
    }
    Ok(buf)
}

pub fn run(job: &mut Job, quick: bool, sweep: &Sweep) -> anyhow::Result<SuiteResult> {
    let world = job.world();
    let rank = job.rank();
    let sizes = sweep.sizes_or(sizes(quick));
    let max_elems = OPS
        .iter()
        .map(|op| {
            let (s, r) = op.counts(*sizes.last().unwrap(), world);
            s.max(r)
        })
        .max()
        .unwrap();
    let mut medians: Vec<(Op, usize, f64)> = Vec::new();
    {
        let (comm, gpu) = job.comm_and_gpu()?;
        let stream = &gpu.stream;
        super::sweep::check_buffers_fit(stream.context(), 2, max_elems, *sizes.last().unwrap())?;
        let send = random_buffer(stream, max_elems, 1 + rank as u64)?;
        let mut recv = random_buffer(stream, max_elems, 1000 + rank as u64)?;
        for op in OPS {
            super::progress(rank, "nccl", op.name());
            let mut last = None;
            for &bytes in &sizes {
                let (s, r) = op.counts(bytes, world);
                // A size that rounds to the previous one's counts (a few bytes a rank): once.
                if last.replace((s, r)) == Some((s, r)) {
                    continue;
                }
                let iters = sweep.iters_or(if quick {
                    10
                } else if bytes <= 1 << 24 {
                    50
                } else {
                    20
                });
                let ms = time_iterations(stream, sweep.warmup_or(5), iters, || {
                    enqueue(comm, op, &send, &mut recv, s, r, stream)
                })?;
                medians.push((op, op.reported_bytes(s, r), median(&ms)));
            }
        }
    }
    // Every rank's medians, in the same order on every rank.
    let mine: Vec<f64> = medians.iter().map(|m| m.2).collect();
    let per_rank = super::gather_f64(job, &mine)?;

    let mut table = Table {
        headers: vec![
            "op",
            "size (B)",
            "time (us)",
            "min rank (us)",
            "max rank (us)",
            "algbw (GB/s)",
            "busbw (GB/s)",
            "anchor busbw",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    for (i, &(op, bytes, _)) in medians.iter().enumerate() {
        let times: Vec<f64> = per_rank.iter().map(|r| r[i]).collect();
        let slowest = times.iter().cloned().fold(f64::MIN, f64::max);
        let fastest = times.iter().cloned().fold(f64::MAX, f64::min);
        let algbw = bytes as f64 / (slowest * 1e-3) / 1e9;
        let busbw = algbw * op.bus_factor(world);
        // Compare with the anchor only where it was measured: 1 GiB on 4 ranks.
        let anchor = op
            .anchor_busbw_gbs()
            .filter(|_| world == 4 && bytes == 1 << 30);
        let anchor_ms = anchor.map(|bw| bytes as f64 * op.bus_factor(world) / (bw * 1e9) * 1e3);
        table.rows.push(vec![
            op.name().into(),
            bytes.to_string(),
            format!("{:.1}", slowest * 1e3),
            format!("{:.1}", fastest * 1e3),
            format!("{:.1}", slowest * 1e3),
            format!("{algbw:.2}"),
            format!("{busbw:.2}"),
            anchor.map_or(String::new(), |a| format!("{a:.0}")),
        ]);
        rows.push(json::obj([
            ("case", Json::from(format!("{} {bytes} B", op.name()))),
            ("op", Json::from(op.name())),
            ("bytes", Json::from(bytes)),
            ("dtype", Json::from("f32")),
            ("weft_ms", Json::from(slowest)),
            ("min_rank_ms", Json::from(fastest)),
            ("algbw_gbs", Json::from(algbw)),
            ("busbw_gbs", Json::from(busbw)),
            (
                "baseline",
                Json::from(anchor.map(|_| "docs/DESIGN.md §4 anchor: NCCL 2.28 busbw on 4xH200")),
            ),
            ("baseline_busbw_gbs", Json::from(anchor)),
            ("baseline_ms", Json::from(anchor_ms)),
            ("ratio", Json::from(anchor_ms.map(|a| a / slowest))),
        ]));
    }
    Ok(SuiteResult { table, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_nccl_tests_size_conventions() {
        // 1 GiB on 4 ranks.
        let g = 1usize << 30;
        assert_eq!(Op::AllReduce.counts(g, 4), (g / 4, g / 4));
        assert_eq!(Op::ReduceScatter.counts(g, 4), (g / 4, g / 16));
        assert_eq!(Op::AllGather.counts(g, 4), (g / 16, g / 4));
        for op in OPS {
            let (s, r) = op.counts(g, 4);
            assert_eq!(op.reported_bytes(s, r), g, "{op:?}");
        }
        // 8 B on 3 ranks: at least one element per block.
        assert_eq!(Op::ReduceScatter.counts(8, 3), (3, 1));
    }

    #[test]
    fn bus_factors() {
        assert_eq!(Op::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Op::AllGather.bus_factor(4), 0.75);
        assert_eq!(Op::SendRecv.bus_factor(4), 1.0);
    }
}
