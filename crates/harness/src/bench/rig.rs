//! Timing for the overlap benchmarks and the tuner: each iteration between its own CUDA events
//! on the compute stream, after a 256 MiB scratch write that evicts L2; the median per rank, and
//! the slowest rank's value.

use super::gather_f64;
use crate::job::Job;
use crate::timing::median;
use cudarc::driver::{sys, CudaSlice, CudaStream};
use std::sync::Arc;

/// Bytes written before each timed iteration (more than the L2).
pub const FLUSH_BYTES: usize = 256 << 20;

pub struct Rig {
    pub compute: Arc<CudaStream>,
    pub comm_stream: Arc<CudaStream>,
    pub flush: CudaSlice<u8>,
    pub iters: usize,
    pub warmup: usize,
}

impl Rig {
    /// A rig on `compute` whose communication stream is a new high-priority one (the overlap
    /// benches' and the tuner's).
    pub fn with_comm_stream(
        compute: &Arc<CudaStream>,
        iters: usize,
        warmup: usize,
    ) -> anyhow::Result<Self> {
        Ok(Rig {
            comm_stream: weft_signal_gemm::overlap::high_priority_stream(compute.context())?,
            flush: compute.alloc_zeros::<u8>(FLUSH_BYTES)?,
            compute: compute.clone(),
            iters,
            warmup,
        })
    }

    /// Median ms of `op` (each iteration after an L2 flush, between its own events).
    pub fn time(&mut self, mut op: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
        for _ in 0..self.warmup {
            op()?;
        }
        let ctx = self.compute.context();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut ms = Vec::with_capacity(self.iters);
        let events: Vec<_> = (0..2 * self.iters)
            .map(|_| ctx.new_event(flags))
            .collect::<Result<_, _>>()?;
        self.compute.synchronize()?;
        for i in 0..self.iters {
            self.compute.memset_zeros(&mut self.flush)?;
            events[2 * i].record(&self.compute)?;
            op()?;
            events[2 * i + 1].record(&self.compute)?;
        }
        self.compute.synchronize()?;
        for i in 0..self.iters {
            ms.push(events[2 * i].elapsed_ms(&events[2 * i + 1])? as f64);
        }
        Ok(median(&ms))
    }
}

impl Rig {
    /// Median ms of each of `count` ops, timed interleaved: every iteration runs every op, in an
    /// order of its own ([`iteration_orders`]: shuffled, the same on every rank), each after an L2
    /// flush and `align` (outside its events), between its own events, so a drift of
    /// the GPU's clocks or temperature during the measurement weighs on every op alike. `align`
    /// lines the ranks up on the stream (a tiny collective), so an op does not count, as its own,
    /// the time its peers still spent on the op before.
    pub fn time_each(
        &mut self,
        count: usize,
        mut align: impl FnMut() -> anyhow::Result<()>,
        mut launch: impl FnMut(usize) -> anyhow::Result<()>,
    ) -> anyhow::Result<Vec<f64>> {
        for _ in 0..self.warmup {
            for i in 0..count {
                launch(i)?;
            }
        }
        let ctx = self.compute.context();
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let events: Vec<_> = (0..2 * self.iters * count)
            .map(|_| ctx.new_event(flags))
            .collect::<Result<_, _>>()?;
        self.compute.synchronize()?;
        for (it, order) in iteration_orders(count, self.iters).iter().enumerate() {
            for &i in order {
                let e = 2 * (it * count + i);
                self.compute.memset_zeros(&mut self.flush)?;
                align()?;
                events[e].record(&self.compute)?;
                launch(i)?;
                events[e + 1].record(&self.compute)?;
            }
        }
        self.compute.synchronize()?;
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let ms: Vec<f64> = (0..self.iters)
                .map(|it| {
                    let e = 2 * (it * count + i);
                    events[e].elapsed_ms(&events[e + 1]).map(f64::from)
                })
                .collect::<Result<_, _>>()?;
            out.push(median(&ms));
        }
        Ok(out)
    }
}

/// Timed work a row's sequential path should add up to (ms): short rows get more iterations.
pub const ROW_TIMED_MS: f64 = 10.0;

/// Iterations for a row whose sequential path takes about `seq_ms` (the slowest rank's T_gemm +
/// T_comm, so every rank computes the same count): enough for [`ROW_TIMED_MS`] of it, at least
/// `base` and at most 10 × `base` (with `base` 15, rows of 0.67 ms and more keep it). A median of
/// 15 left ±2.5 % of noise on 40 µs rows (four 4-GPU runs of the AllGather and ReduceScatter
/// grids, 2026-11-26). The first timing of T_gemm and T_comm, which gives `seq_ms` before the
/// count is known, keeps `base`.
pub fn row_iterations(base: usize, seq_ms: f64) -> usize {
    let wanted = if seq_ms.is_finite() && seq_ms > 0.0 {
        (ROW_TIMED_MS / seq_ms).ceil().min(1e6) as usize
    } else {
        base
    };
    wanted.clamp(base, 10 * base)
}

/// The order of the ops in each of `iters` iterations: a permutation of 0..count per iteration,
/// shuffled (Fisher–Yates) by a fixed-seed SplitMix64 written out here, so every rank launches
/// the collective ops in the same order whatever the build (a library's generator may change
/// between versions), and each op follows each other op about as often. (Rotating a fixed order,
/// as before, has op i follow op i − 1 in all but one slot of every iteration: an op that slows
/// or speeds up its successor — through NCCL's state, clocks or memory — then weighs on one
/// column only.)
pub fn iteration_orders(count: usize, iters: usize) -> Vec<Vec<usize>> {
    let mut state: u64 = 0x0de5_0f0f;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (0..iters)
        .map(|_| {
            let mut order: Vec<usize> = (0..count).collect();
            for i in (1..count).rev() {
                let j = (next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            order
        })
        .collect()
}

/// The slowest rank's value of each entry.
pub fn slowest(job: &mut Job, mine: &[f64]) -> anyhow::Result<Vec<f64>> {
    let all = gather_f64(job, mine)?;
    // Folding from NaN keeps a method that was not run NaN (f64::max ignores a NaN operand).
    Ok((0..mine.len())
        .map(|i| all.iter().map(|r| r[i]).fold(f64::NAN, f64::max))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::iteration_orders;

    #[test]
    fn every_iteration_runs_each_op_once() {
        for count in 1..6 {
            for order in iteration_orders(count, 50) {
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..count).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn no_op_mostly_follows_one_other() {
        // 4 ops, 300 iterations: each op has a predecessor in about 225 slots; shuffled, each of
        // the other three takes about a third of them (a rotation gives one of them all 225).
        let (count, iters) = (4, 300);
        let mut follows = vec![vec![0usize; count]; count];
        for order in iteration_orders(count, iters) {
            for w in order.windows(2) {
                follows[w[1]][w[0]] += 1;
            }
        }
        for (op, before) in follows.iter().enumerate() {
            let total: usize = before.iter().sum();
            let most = *before.iter().max().unwrap();
            assert!(
                (most as f64) < 0.45 * total as f64,
                "op {op} follows one op in {most} of {total} slots: {before:?}"
            );
        }
    }

    #[test]
    fn short_rows_get_more_iterations() {
        use super::row_iterations;
        // 10 ms of timed work, between base and 10 × base.
        assert_eq!(row_iterations(15, 0.043), 150); // 233 wanted, capped
        assert_eq!(row_iterations(15, 0.089), 113); // ceil(112.36)
        assert_eq!(row_iterations(15, 0.274), 37); // ceil(36.50)
        assert_eq!(row_iterations(15, 0.787), 15); // 13 wanted, base
        assert_eq!(row_iterations(8, 0.05), 80);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(row_iterations(15, bad), 15);
        }
    }

    #[test]
    fn the_same_on_every_call() {
        assert_eq!(iteration_orders(5, 40), iteration_orders(5, 40));
    }
}
