//! Wave groups: the signalling timing of signal-gemm II (FlashOverlap §3.2). The schedule's orders
//! are cut at wave boundaries into consecutive groups; the epilogue adds to its group's counter
//! once a tile's stores are complete, and the communication of a group starts when its counter is
//! full. The group of an order comes from `weft_gemm_group_of` (kernels/include/weft/abi/gemm.h), the
//! same function the kernel calls.

use crate::error::require;
use crate::error::GemmError;
use crate::plan::GemmPlan;
use anyhow::Context;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use std::ops::Range;
use std::sync::Arc;
use weft_kernels::abi::{
    weft_gemm_group_of, weft_gemm_group_wait_params, weft_gemm_wave_groups, weft_sync_bound,
    WEFT_GEMM_CONSUMERS, WEFT_GEMM_MAX_WAVE_GROUPS,
};
use weft_kernels::cubins;
use weft_sync::{ErrorSlot, WaitBudget};

/// A partition of a plan's waves into consecutive groups.
#[derive(Clone, Debug)]
pub struct WaveGroups {
    /// Group sizes in waves (each ≥ 1, summing to the plan's waves).
    waves: Vec<u32>,
    abi: weft_gemm_wave_groups,
    orders: u32,
    ctas: u32,
}

impl WaveGroups {
    /// Groups of `waves[g]` waves each, in order. They must cover the plan's waves exactly.
    pub fn new(plan: &GemmPlan, waves: &[u32]) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let total = plan.waves();
            require!(
                !waves.is_empty(),
                Options,
                "wave groups: no group given ({} has {total} waves)",
                plan.describe()
            );
            require!(
                waves.len() <= WEFT_GEMM_MAX_WAVE_GROUPS as usize,
                Options,
                "wave groups: {} groups, at most {WEFT_GEMM_MAX_WAVE_GROUPS}",
                waves.len()
            );
            require!(
                waves.iter().all(|&w| w >= 1),
                Options,
                "wave groups: a group of 0 waves in {waves:?}"
            );
            let sum: u64 = waves.iter().map(|&w| u64::from(w)).sum();
            require!(
                sum == u64::from(total),
                Options,
                "wave groups {waves:?} cover {sum} waves, the plan has {total} ({})",
                plan.describe()
            );
            let (orders, ctas) = (plan.orders(), plan.ctas());
            let mut abi = weft_gemm_wave_groups {
                count: waves.len() as u32,
                ..Default::default()
            };
            let mut end_wave = 0u32;
            for (g, &w) in waves.iter().enumerate() {
                end_wave += w;
                abi.end_order[g] = (end_wave * ctas).min(orders);
            }
            Ok(Self {
                waves: waves.to_vec(),
                abi,
                orders,
                ctas,
            })
        })
    }

    /// Groups of `per_group` waves (the last one takes what is left).
    pub fn uniform(plan: &GemmPlan, per_group: u32) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            require!(per_group >= 1, Options, "wave groups: 0 waves per group");
            let total = plan.waves();
            let mut sizes = vec![per_group; (total / per_group) as usize];
            if !total.is_multiple_of(per_group) {
                sizes.push(total % per_group);
            }
            Self::new(plan, &sizes).map_err(anyhow::Error::from)
        })
    }

    pub fn count(&self) -> usize {
        self.waves.len()
    }

    /// Group sizes in waves.
    pub fn waves(&self) -> &[u32] {
        &self.waves
    }

    /// The orders of group `g` (phantoms included).
    pub fn orders(&self, g: usize) -> Range<u32> {
        let start = if g == 0 { 0 } else { self.abi.end_order[g - 1] };
        start..self.abi.end_order[g]
    }

    /// The group of `order`, as the kernel computes it.
    pub fn group_of(&self, order: u32) -> usize {
        // SAFETY: a pure function reading the struct.
        unsafe { weft_gemm_group_of(&self.abi, order) as usize }
    }

    /// For the kernel's parameters.
    pub(crate) fn abi(&self) -> weft_gemm_wave_groups {
        self.abi
    }

    /// (orders, CTAs) of the plan the groups were made for.
    pub(crate) fn planned(&self) -> (u32, u32) {
        (self.orders, self.ctas)
    }

    /// True when made for a plan with this schedule length and grid.
    pub(crate) fn fits(&self, plan: &GemmPlan) -> bool {
        self.orders == plan.orders() && self.ctas == plan.ctas()
    }
}

impl std::fmt::Display for WaveGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: Vec<String> = self.waves.iter().map(u32::to_string).collect();
        write!(f, "[{}]", sizes.join(","))
    }
}

/// The per-group counters of one GEMM plus the wait kernel that hands a finished group to the
/// communication stream. Counters never need a memset: each wait rearms its counter (see
/// weft_gemm_group_wait_params), so the launch / wait sequence is the same every time and can be
/// captured in a CUDA graph. Rule: for every GEMM launch with these counters, enqueue exactly one
/// wait per group, and order the next launch after those waits.
pub struct GroupCounters {
    groups: WaveGroups,
    counters: CudaSlice<u64>,
    wait: CudaFunction,
    slot: ErrorSlot,
    bound: weft_sync_bound,
    rank: u32,
}

impl GroupCounters {
    /// Zeroed counters for `groups` on `stream`'s device; `rank` names this process in reports.
    pub fn new(stream: &Arc<CudaStream>, groups: WaveGroups, rank: u32) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let ctx: &Arc<CudaContext> = stream.context();
            let module = cubins::GEMM_GROUP_WAIT
                .load(ctx)
                .with_context(|| format!("loading {}", cubins::GEMM_GROUP_WAIT.source))?;
            let wait = module
                .load_function("weft_gemm_group_wait")
                .context("kernels/gemm/group_wait.cu has no weft_gemm_group_wait")?;
            let counters = stream
                .alloc_zeros::<u64>(groups.count())
                .context("allocating wave-group counters")?;
            stream.synchronize()?;
            let slot = ErrorSlot::new(ctx)?;
            let bound = weft_sync_bound {
                error_slot: slot.device_ptr(ctx)?,
                budget_cycles: WaitBudget::default_for(ctx)?.cycles,
            };
            Ok(Self {
                groups,
                counters,
                wait,
                slot,
                bound,
                rank,
            })
        })
    }

    pub fn groups(&self) -> &WaveGroups {
        &self.groups
    }

    /// The counters' device address (for the GEMM's parameters).
    pub(crate) fn device_ptr(&self, stream: &CudaStream) -> u64 {
        self.counters.device_ptr(stream).0
    }

    /// The count group `g`'s counter reaches when its tiles are stored.
    pub fn target(&self, g: usize) -> u64 {
        u64::from(WEFT_GEMM_CONSUMERS) * u64::from(self.groups.orders(g).len() as u32)
    }

    /// Enqueues on `stream` the wait for group `g` of the launch in flight: work enqueued after it
    /// reads the group's finished output.
    pub fn wait(&self, stream: &Arc<CudaStream>, g: usize) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                g < self.groups.count(),
                Options,
                "wave group {g} of {}",
                self.groups.count()
            );
            let p = weft_gemm_group_wait_params {
                counter: self.device_ptr(stream) + 8 * g as u64,
                target: self.target(g),
                group: g as u32,
                rank: self.rank,
                bound: self.bound,
            };
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel takes exactly this struct; the counters outlive the launch (the
            // owner synchronises before dropping them).
            unsafe { stream.launch_builder(&self.wait).arg(&p).launch(cfg) }
                .context("launching the wave-group wait")?;
            Ok(())
        })
    }

    /// Bounds later waits by `budget`.
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.bound.budget_cycles = budget.cycles;
    }

    /// After a synchronisation: an error naming the group wait that ran past its bound, if any.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> { Ok(self.slot.check()?) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GemmOptions, GemmShape};

    #[test]
    fn groups_cut_at_wave_boundaries_and_cover_every_order() {
        let plan = GemmPlan::new(
            132,
            GemmShape::new(4096, 8192, 1024),
            GemmOptions {
                sm_margin: 20,
                ..Default::default()
            },
        )
        .unwrap();
        let waves = plan.waves();
        assert!(waves >= 3, "{}", plan.describe());
        let g = WaveGroups::new(&plan, &[1, waves - 2, 1]).unwrap();
        assert_eq!(g.orders(0), 0..plan.ctas());
        assert_eq!(g.orders(2).end, plan.orders());
        for order in 0..plan.orders() {
            let wave = order / plan.ctas();
            let want = if wave == 0 {
                0
            } else if wave == waves - 1 {
                2
            } else {
                1
            };
            assert_eq!(g.group_of(order), want, "order {order}");
            assert!(g.orders(want).contains(&order));
        }
        let u = WaveGroups::uniform(&plan, 2).unwrap();
        assert_eq!(u.waves().iter().sum::<u32>(), waves);
        assert!(WaveGroups::new(&plan, &[waves + 1])
            .unwrap_err()
            .to_string()
            .contains("cover"));
        assert!(WaveGroups::new(&plan, &[0, waves]).is_err());
        assert!(WaveGroups::new(&plan, &[]).is_err());
        assert!(WaveGroups::new(&plan, &[1; 40]).is_err());
    }
}
