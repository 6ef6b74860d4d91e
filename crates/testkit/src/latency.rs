//! Host side of the latency kernel (`kernels/sync/latency.cu`): launches one kind, converts the
//! per-iteration cycle samples to nanoseconds at the clock the SM actually ran (measured by the
//! kernel with both clock64 and the GPU timer over the timed loop).

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use weft_kernels::abi::{self, weft_latency_params, weft_latency_summary};
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{agree, Shape};
use weft_sync::launch::{load, sync_checked, DeviceStruct};
use weft_sync::Counters;
use weft_sync::WaitBudget;

/// Dynamic shared memory requested by each INTER_SM block: more than half of an SM's, so the two
/// blocks cannot share one.
const INTER_SM_SMEM: u32 = 120 * 1024;
// Two such blocks exceed one SM's 228 KiB of shared memory on Hopper.
const _: () = assert!(2 * INTER_SM_SMEM > 228 * 1024);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatencyKind {
    /// Token around all ranks; a sample is one lap (world one-way hops).
    Ring,
    /// Ranks 0 and 1; a sample is one round trip.
    PingPong,
    /// Every rank; a sample is one barrier.
    Barrier,
    /// Two blocks on different SMs of one GPU, GPU scope; a sample is one round trip.
    InterSm,
    /// Two warps of one block through shared-memory mbarriers; a sample is one round trip.
    Mbarrier,
    /// Reference, not weft's API: the PingPong with the epoch stored (`st.release.sys`) instead
    /// of added; a sample is one round trip.
    PingPongStore,
    /// Reference: the same with relaxed stores and loads, no ordering; one round trip.
    PingPongRelaxed,
    /// Reference: a barrier from stores, one slot per rank on every rank; one barrier.
    BarrierStore,
}

impl LatencyKind {
    fn code(self) -> i32 {
        (match self {
            LatencyKind::Ring => abi::WEFT_LATENCY_RING,
            LatencyKind::PingPong => abi::WEFT_LATENCY_PING_PONG,
            LatencyKind::Barrier => abi::WEFT_LATENCY_BARRIER,
            LatencyKind::InterSm => abi::WEFT_LATENCY_INTER_SM,
            LatencyKind::Mbarrier => abi::WEFT_LATENCY_MBARRIER,
            LatencyKind::PingPongStore => abi::WEFT_LATENCY_PING_PONG_STORE,
            LatencyKind::PingPongRelaxed => abi::WEFT_LATENCY_PING_PONG_RELAXED,
            LatencyKind::BarrierStore => abi::WEFT_LATENCY_BARRIER_STORE,
        }) as i32
    }

    /// Whether `rank` runs this kind.
    pub fn takes_part(self, rank: usize) -> bool {
        !matches!(
            self,
            LatencyKind::PingPong | LatencyKind::PingPongStore | LatencyKind::PingPongRelaxed
        ) || rank < 2
    }

    /// Whether ranks must launch together (cross-GPU kinds).
    pub fn cross_gpu(self) -> bool {
        matches!(
            self,
            LatencyKind::Ring
                | LatencyKind::PingPong
                | LatencyKind::Barrier
                | LatencyKind::PingPongStore
                | LatencyKind::PingPongRelaxed
                | LatencyKind::BarrierStore
        )
    }

    fn launch_config(self) -> LaunchConfig {
        match self {
            LatencyKind::InterSm => LaunchConfig {
                grid_dim: (2, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: INTER_SM_SMEM,
            },
            LatencyKind::Mbarrier => LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (64, 1, 1),
                shared_mem_bytes: 0,
            },
            _ => LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            },
        }
    }
}

/// One launch's timed iterations.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencySamples {
    /// Per-iteration time in nanoseconds.
    pub ns: Vec<f64>,
    /// The SMs of the two sides (INTER_SM).
    pub smid: [u32; 2],
    /// The SM clock the loop ran at, in MHz (cycles / GPU-timer nanoseconds).
    pub clock_mhz: f64,
}

/// Per-iteration nanoseconds from cycle samples and the loop's totals by both clocks.
pub fn cycles_to_ns(samples: &[u32], total_cycles: u64, total_ns: u64) -> anyhow::Result<Vec<f64>> {
    anyhow::ensure!(
        total_cycles > 0 && total_ns > 0,
        "the timed loop measured {total_cycles} cycles in {total_ns} ns"
    );
    let ns_per_cycle = total_ns as f64 / total_cycles as f64;
    Ok(samples.iter().map(|&c| c as f64 * ns_per_cycle).collect())
}

pub struct Latency {
    counters: Counters,
    func: CudaFunction,
}

impl Latency {
    /// Collective: max(2, world) counters per rank for one kind's launches.
    pub fn alloc(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        budget: WaitBudget,
    ) -> anyhow::Result<Self> {
        let loaded = (|| -> anyhow::Result<_> {
            let f = load(ctx, &cubins::SYNC_LATENCY, "weft_sync_latency")?;
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                INTER_SM_SMEM as i32,
            )?;
            Ok(f)
        })();
        let func = agree(rdzv, "loading the sync latency kernel", loaded)?;
        let slots = u32::try_from(rdzv.world().max(2))?;
        let counters = Counters::alloc(rdzv, ctx, Shape::new(1, 1, 1, slots), budget)?;
        Ok(Self { counters, func })
    }

    /// Runs `warmup + iters` iterations of `kind` (use one kind per `Latency`: the counters'
    /// epoch counts iterations). None on a rank that does not take part.
    pub fn run(
        &mut self,
        stream: &Arc<CudaStream>,
        kind: LatencyKind,
        warmup: u32,
        iters: u32,
    ) -> anyhow::Result<Option<LatencySamples>> {
        anyhow::ensure!(iters > 0, "no timed iterations");
        let first = self.counters.begin(u64::from(warmup) + u64::from(iters));
        if !kind.takes_part(self.counters.pgl().rank()) {
            return Ok(None);
        }
        let samples = stream.alloc_zeros::<u32>(iters as usize)?;
        let summary = DeviceStruct::<weft_latency_summary>::zeroed(stream)?;
        let params = weft_latency_params {
            counters: self.counters.device()?,
            samples: cudarc::driver::DevicePtr::device_ptr(&samples, stream).0,
            summary: summary.addr(stream),
            first,
            warmup,
            iters,
            kind: kind.code(),
            reserved: 0,
        };
        // SAFETY: buffers outlive the launch (synchronised below).
        unsafe {
            stream
                .launch_builder(&self.func)
                .arg(&params)
                .launch(kind.launch_config())?
        };
        sync_checked(stream, &[self.counters.slot()])?;
        let cycles = stream.clone_dtoh(&samples)?;
        let s = summary.read(stream)?;
        if kind == LatencyKind::InterSm {
            anyhow::ensure!(
                s.smid[0] != s.smid[1],
                "both inter-SM blocks ran on SM {}",
                s.smid[0]
            );
        }
        Ok(Some(LatencySamples {
            ns: cycles_to_ns(&cycles, s.total_cycles, s.total_ns)?,
            smid: s.smid,
            clock_mhz: s.total_cycles as f64 * 1e3 / s.total_ns as f64,
        }))
    }

    /// Collective.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        Ok(self.counters.free(rdzv)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_cycles_at_the_measured_clock() {
        // 4000 cycles in 2000 ns: 2 GHz.
        assert_eq!(
            cycles_to_ns(&[2000, 3000], 4000, 2000).unwrap(),
            vec![1000.0, 1500.0]
        );
        assert!(cycles_to_ns(&[1], 0, 10).is_err());
    }

    #[test]
    fn participation() {
        for ping_pong in [
            LatencyKind::PingPong,
            LatencyKind::PingPongStore,
            LatencyKind::PingPongRelaxed,
        ] {
            assert!(ping_pong.takes_part(1) && !ping_pong.takes_part(2) && ping_pong.cross_gpu());
        }
        assert!(LatencyKind::BarrierStore.takes_part(7) && LatencyKind::BarrierStore.cross_gpu());
        assert!(LatencyKind::Barrier.takes_part(7) && LatencyKind::Barrier.cross_gpu());
        assert!(!LatencyKind::InterSm.cross_gpu());
    }
}
