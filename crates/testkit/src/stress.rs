//! Host side of the data + signal stress kernel (`kernels/sync/stress.cu`): allocation, launches
//! that continue the counters' epoch, and the report checked against host-computed expectations.

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use weft_kernels::abi::{self, weft_stress_params, weft_stress_result};
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{agree, Backend, Pgl, Shape};
use weft_sync::launch::{load, sync_checked, DeviceStruct};
use weft_sync::Counters;
use weft_sync::WaitBudget;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StressMode {
    /// rank -> rank + 1, system scope.
    Ring,
    /// every rank -> every rank (itself included), system scope.
    AllToAll,
    /// one block -> another block of the same GPU, GPU scope.
    InterSm,
    /// rank -> rank + 1 with the payload slot on rank + 2 (three ranks or more): data, flag and
    /// the receiver's reads take three different links, system scope.
    Relay,
}

impl StressMode {
    pub fn name(self) -> &'static str {
        match self {
            StressMode::Ring => "ring",
            StressMode::AllToAll => "all_to_all",
            StressMode::InterSm => "inter_sm",
            StressMode::Relay => "relay",
        }
    }

    fn code(self) -> i32 {
        (match self {
            StressMode::Ring => abi::WEFT_STRESS_RING,
            StressMode::AllToAll => abi::WEFT_STRESS_ALL_TO_ALL,
            StressMode::InterSm => abi::WEFT_STRESS_INTER_SM,
            StressMode::Relay => abi::WEFT_STRESS_RELAY,
        }) as i32
    }

    /// The ranks whose messages `rank` receives.
    pub fn senders_to(self, rank: usize, world: usize) -> Vec<usize> {
        match self {
            StressMode::Ring | StressMode::Relay => vec![(rank + world - 1) % world],
            StressMode::AllToAll => (0..world).collect(),
            StressMode::InterSm => vec![rank],
        }
    }
}

/// How the payload travels and is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ordering {
    /// Plain stores, release signal, acquire wait (the primitives).
    ReleaseAcquire,
    /// Negative control: relaxed signals and polls, no fences (should show mismatches).
    Relaxed,
    /// TMA bulk stores from shared memory, released once complete (`bulk_wait_group<0>` and the
    /// async-proxy fence), as the fused GEMM epilogues do.
    BulkStore,
}

pub struct Stress {
    data: Pgl<u32>,
    counters: Counters,
    func: CudaFunction,
    mode: StressMode,
    max_elems: u32,
    slots: u32,
}

/// One enqueued launch, with what the host expects of it.
pub struct PendingStress {
    result: DeviceStruct<weft_stress_result>,
    expected_checked: u64,
    expected_rounds: u64,
    first_round: u64,
    rounds: u32,
}

impl PendingStress {
    /// The launch's epoch base: the global index of its first round.
    pub fn first_round(&self) -> u64 {
        self.first_round
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressReport {
    pub mismatches: u64,
    pub checked: u64,
    pub rounds_received: u64,
    pub expected_checked: u64,
    pub expected_rounds: u64,
    pub first_round: u64,
    pub rounds: u32,
    /// The first mismatch the kernel recorded.
    pub first_bad: Option<String>,
}

impl StressReport {
    /// Err unless every element of every expected message was checked and matched.
    pub fn verify(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.mismatches == 0,
            "{} of {} payload elements wrong (rounds {}..{}); first: {}",
            self.mismatches,
            self.checked,
            self.first_round,
            self.first_round + self.rounds as u64,
            self.first_bad.as_deref().unwrap_or("not recorded")
        );
        anyhow::ensure!(
            self.rounds_received == self.expected_rounds && self.checked == self.expected_checked,
            "the receivers consumed {} messages and checked {} elements; expected {} and {}",
            self.rounds_received,
            self.checked,
            self.expected_rounds,
            self.expected_checked
        );
        Ok(())
    }
}

impl Stress {
    /// Collective: payload buffers (`slots` per sender, `max_elems` u32 each) and counters.
    pub fn alloc(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        mode: StressMode,
        max_elems: u32,
        slots: u32,
        budget: WaitBudget,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            max_elems >= 1 && slots >= 1,
            "stress needs max_elems >= 1 and slots >= 1"
        );
        let world = rdzv.world() as u32;
        anyhow::ensure!(
            mode != StressMode::Relay || world >= 3,
            "the relay stress needs three ranks or more, not {world}"
        );
        let func = agree(
            rdzv,
            "loading the sync stress kernel",
            load(ctx, &cubins::SYNC_STRESS, "weft_sync_stress").map_err(anyhow::Error::new),
        )?;
        let data = Pgl::alloc(
            rdzv,
            ctx,
            Shape::new(1, slots, world, max_elems),
            Backend::default(),
        )?;
        let counters = Counters::alloc(rdzv, ctx, Shape::new(1, 1, 2, world), budget)?;
        Ok(Self {
            data,
            counters,
            func,
            mode,
            max_elems,
            slots,
        })
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Collective: zeroes the counters and restarts at round 0 (the payload buffers keep their
    /// content; the next messages overwrite them).
    pub fn reset_counters(
        &mut self,
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
    ) -> anyhow::Result<()> {
        Ok(self.counters.reset(rdzv, stream)?)
    }

    /// Enqueues `rounds` rounds continuing from the previous launch (no memset, no host barrier).
    pub fn launch(
        &mut self,
        stream: &Arc<CudaStream>,
        rounds: u32,
        seed: u64,
        ordering: Ordering,
    ) -> anyhow::Result<PendingStress> {
        let (rank, world) = (self.data.rank(), self.data.world());
        if ordering == Ordering::BulkStore {
            // The bulk path is tried around the ring and the relay only (the trials' modes).
            anyhow::ensure!(
                matches!(self.mode, StressMode::Ring | StressMode::Relay),
                "bulk-store stress runs in ring or relay mode, not {}",
                self.mode.name()
            );
            // Bulk stores move whole 16-byte units into 16-byte aligned slots.
            anyhow::ensure!(
                self.max_elems.is_multiple_of(4),
                "bulk-store stress needs max_elems a multiple of 4, not {}",
                self.max_elems
            );
        }
        let first_round = self.counters.begin(rounds as u64);
        let senders = self.mode.senders_to(rank, world);
        let max_elems = self.max_elems;
        let expected_checked = (first_round..first_round + rounds as u64)
            .flat_map(|g| senders.iter().map(move |&s| (g, s)))
            // SAFETY: pure arithmetic (the C definition the kernel uses).
            .map(|(g, s)| {
                u64::from(unsafe {
                    abi::weft_stress_elems(seed, g, s as u32, rank as u32, max_elems)
                })
            })
            .sum();
        let result = DeviceStruct::<weft_stress_result>::zeroed(stream)?;
        let params = weft_stress_params {
            data: self.data.view(),
            counters: self.counters.device()?,
            result: result.addr(stream),
            seed,
            first_round,
            rounds,
            max_elems: self.max_elems,
            slots: self.slots,
            mode: self.mode.code(),
            ordering: (match ordering {
                Ordering::ReleaseAcquire => abi::WEFT_STRESS_ORDERED,
                Ordering::Relaxed => abi::WEFT_STRESS_RELAXED,
                Ordering::BulkStore => abi::WEFT_STRESS_BULK,
            }) as i32,
            reserved: 0,
        };
        let pairs = if self.mode == StressMode::AllToAll {
            world as u32
        } else {
            1
        };
        let cfg = LaunchConfig {
            grid_dim: (2 * pairs, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the views and result buffer outlive the launch (finish() synchronises before
        // they can be dropped); all 2 * pairs blocks are resident together on any Hopper GPU.
        unsafe { stream.launch_builder(&self.func).arg(&params).launch(cfg)? };
        Ok(PendingStress {
            result,
            expected_checked,
            expected_rounds: rounds as u64 * senders.len() as u64,
            first_round,
            rounds,
        })
    }

    /// Waits for the launch and reads its report (a timed-out wait becomes the error).
    pub fn finish(
        &self,
        stream: &Arc<CudaStream>,
        pending: PendingStress,
    ) -> anyhow::Result<StressReport> {
        sync_checked(stream, &[self.counters.slot()])?;
        let r = pending.result.read(stream)?;
        let first_bad = (r.bad_claimed != 0).then(|| {
            format!(
                "round {} from rank {}, element {}: got {:#010x}, expected {:#010x}{}",
                r.bad_round,
                r.bad_sender,
                r.bad_index,
                r.bad_got,
                r.bad_want,
                if r.bad_got == abi::WEFT_STRESS_POISON {
                    " (poison: the slot's previous use, already consumed)"
                } else {
                    ""
                }
            )
        });
        Ok(StressReport {
            mismatches: r.mismatches,
            checked: r.checked,
            rounds_received: r.rounds_received,
            expected_checked: pending.expected_checked,
            expected_rounds: pending.expected_rounds,
            first_round: pending.first_round,
            rounds: pending.rounds,
            first_bad,
        })
    }

    /// Collective.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        self.data.free(rdzv)?;
        Ok(self.counters.free(rdzv)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn senders() {
        assert_eq!(StressMode::Ring.senders_to(0, 4), vec![3]);
        assert_eq!(StressMode::Ring.senders_to(2, 4), vec![1]);
        assert_eq!(StressMode::Ring.senders_to(0, 1), vec![0]);
        assert_eq!(StressMode::AllToAll.senders_to(1, 3), vec![0, 1, 2]);
        assert_eq!(StressMode::InterSm.senders_to(3, 4), vec![3]);
    }

    #[test]
    fn payload_sizes_cover_the_range_and_patterns_differ() {
        let max = 8192;
        let sizes: Vec<u32> = (0..20_000u64)
            .map(|g| unsafe { abi::weft_stress_elems(7, g, 1, 2, max) })
            .collect();
        assert!(sizes.iter().all(|&n| (1..=max).contains(&n)));
        assert!(sizes.contains(&1), "single-element payloads occur");
        assert!(
            sizes.iter().filter(|&&n| n <= 32).count() > 20_000 / 10,
            "about one in eight is short"
        );
        assert!(
            sizes.iter().any(|&n| n > max - 64),
            "near-full payloads occur"
        );
        // The pattern depends on every input, so a stale or misdirected payload cannot pass.
        let v = |seed, g, s, r, i| unsafe {
            abi::weft_stress_value(abi::weft_stress_message_key(seed, g, s, r), i)
        };
        let base = v(7, 10, 1, 2, 5);
        for other in [
            v(8, 10, 1, 2, 5),
            v(7, 11, 1, 2, 5),
            v(7, 10, 0, 2, 5),
            v(7, 10, 1, 3, 5),
            v(7, 10, 1, 2, 6),
        ] {
            assert_ne!(base, other);
        }
        // Never the poison value.
        assert!((0..100_000u32).all(|i| unsafe {
            abi::weft_stress_value(i as u64 * 0x1234_5678, i)
        } != abi::WEFT_STRESS_POISON));
    }

    #[test]
    fn report_verification() {
        let ok = StressReport {
            mismatches: 0,
            checked: 10,
            rounds_received: 2,
            expected_checked: 10,
            expected_rounds: 2,
            first_round: 0,
            rounds: 2,
            first_bad: None,
        };
        assert!(ok.verify().is_ok());
        let bad = StressReport {
            mismatches: 1,
            first_bad: Some("round 1 from rank 0, element 3".into()),
            ..ok.clone()
        };
        assert!(bad
            .verify()
            .unwrap_err()
            .to_string()
            .contains("1 of 10 payload elements wrong (rounds 0..2); first: round 1"));
        let short = StressReport { checked: 9, ..ok };
        assert!(short
            .verify()
            .unwrap_err()
            .to_string()
            .contains("checked 9 elements; expected 2 and 10"));
    }
}
