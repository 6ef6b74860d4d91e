//! Host side of the barrier-laps kernel (`kernels/sync/laps.cu`): `blocks` independent barriers,
//! random per-rank delays, and a check after every barrier that no rank passed early.

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use weft_kernels::abi::{self, weft_laps_params, weft_laps_result};
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{agree, Backend, Pgl, Shape};
use weft_sync::launch::{load, sync_checked, DeviceStruct};
use weft_sync::Counters;
use weft_sync::WaitBudget;

pub struct Laps {
    barrier: Counters,
    seen: Pgl<u64>,
    func: CudaFunction,
    blocks: u32,
}

pub struct PendingLaps {
    result: DeviceStruct<weft_laps_result>,
    expected_checks: u64,
    requested_delay_ns: u64,
    first_lap: u64,
    laps: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LapsReport {
    pub violations: u64,
    pub checks: u64,
    pub expected_checks: u64,
    /// Delay the kernel spent (GPU timer) and the sum of the delays it was given.
    pub delay_ns: u64,
    pub requested_delay_ns: u64,
    pub first_lap: u64,
    pub laps: u32,
    pub first_bad: Option<String>,
}

impl LapsReport {
    pub fn verify(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.violations == 0,
            "{} of {} checks after a barrier failed (laps {}..{}); first: {}",
            self.violations,
            self.checks,
            self.first_lap + 1,
            self.first_lap + self.laps as u64,
            self.first_bad.as_deref().unwrap_or("not recorded")
        );
        anyhow::ensure!(
            self.checks == self.expected_checks,
            "{} checks made, expected {}",
            self.checks,
            self.expected_checks
        );
        anyhow::ensure!(
            self.delay_ns >= self.requested_delay_ns,
            "the kernel spent {} ns in random delays, less than the {} ns it was given",
            self.delay_ns,
            self.requested_delay_ns
        );
        Ok(())
    }
}

impl Laps {
    /// Collective: one barrier counter and one row of `seen` slots per block.
    pub fn alloc(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        blocks: u32,
        budget: WaitBudget,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(blocks >= 1, "laps needs at least one block");
        let world = rdzv.world() as u32;
        let func = agree(
            rdzv,
            "loading the sync laps kernel",
            load(ctx, &cubins::SYNC_LAPS, "weft_sync_laps").map_err(anyhow::Error::new),
        )?;
        let barrier = Counters::alloc(rdzv, ctx, Shape::new(1, 1, 1, blocks), budget)?;
        let seen = Pgl::alloc(
            rdzv,
            ctx,
            Shape::new(1, 1, blocks, world),
            Backend::default(),
        )?;
        Ok(Self {
            barrier,
            seen,
            func,
            blocks,
        })
    }

    /// Enqueues `laps` barriers per block continuing the epoch; delays up to `max_delay_ns`
    /// (one lap in 64 up to ten times that).
    pub fn launch(
        &mut self,
        stream: &Arc<CudaStream>,
        laps: u32,
        seed: u64,
        max_delay_ns: u32,
    ) -> anyhow::Result<PendingLaps> {
        let (rank, world) = (self.seen.rank() as u32, self.seen.world() as u64);
        let first_lap = self.barrier.begin(laps as u64);
        let blocks = self.blocks;
        let requested_delay_ns = (first_lap + 1..=first_lap + laps as u64)
            .flat_map(|e| (0..blocks).map(move |b| (e, b)))
            // SAFETY: pure arithmetic (the C definition the kernel uses).
            .map(|(e, b)| {
                u64::from(unsafe { abi::weft_laps_delay_ns(seed, e, rank, b, max_delay_ns) })
            })
            .sum();
        let result = DeviceStruct::<weft_laps_result>::zeroed(stream)?;
        let params = weft_laps_params {
            barrier: self.barrier.device()?,
            seen: self.seen.view(),
            result: result.addr(stream),
            seed,
            first_lap,
            laps,
            max_delay_ns,
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: buffers outlive the launch (finish() synchronises); blocks are few and resident.
        unsafe { stream.launch_builder(&self.func).arg(&params).launch(cfg)? };
        Ok(PendingLaps {
            result,
            expected_checks: laps as u64 * blocks as u64 * world,
            requested_delay_ns,
            first_lap,
            laps,
        })
    }

    pub fn finish(
        &self,
        stream: &Arc<CudaStream>,
        pending: PendingLaps,
    ) -> anyhow::Result<LapsReport> {
        sync_checked(stream, &[self.barrier.slot()])?;
        let r = pending.result.read(stream)?;
        let first_bad = (r.bad_claimed != 0).then(|| {
            format!(
                "after barrier {} (block {}) rank {}'s announced lap read {}, expected {} or {}",
                r.bad_lap,
                r.bad_block,
                r.bad_peer,
                r.bad_seen,
                r.bad_lap,
                r.bad_lap + 1
            )
        });
        Ok(LapsReport {
            violations: r.violations,
            checks: r.checks,
            expected_checks: pending.expected_checks,
            delay_ns: r.delay_ns,
            requested_delay_ns: pending.requested_delay_ns,
            first_lap: pending.first_lap,
            laps: pending.laps,
            first_bad,
        })
    }

    /// Collective.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        self.seen.free(rdzv)?;
        Ok(self.barrier.free(rdzv)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_bounded_varied_and_sometimes_long() {
        let max = 2000;
        let d: Vec<u32> = (1..=10_000u64)
            .map(|e| unsafe { abi::weft_laps_delay_ns(3, e, 1, 0, max) })
            .collect();
        assert!(d.iter().all(|&x| x <= 10 * max));
        assert!(
            d.iter().filter(|&&x| x > max).count() > 50,
            "about one lap in 64 is long"
        );
        let other_rank: Vec<u32> = (1..=10_000u64)
            .map(|e| unsafe { abi::weft_laps_delay_ns(3, e, 2, 0, max) })
            .collect();
        assert_ne!(d, other_rank, "ranks are delayed differently");
    }
}
