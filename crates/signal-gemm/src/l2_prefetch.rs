//! L2 prefetch of B's first k-steps (`kernels/gemm/l2_prefetch.cu`), enqueued before a
//! collective that precedes the GEMM: the bulk prefetches are issued in a few microseconds and
//! the lines arrive while the collective runs, so a GEMM that streams B (few rows of A) starts
//! with part of it in L2. A hint: it writes nothing, and the launch only reads B's addresses.

use crate::plan::BLayout;
use anyhow::{ensure, Context};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use weft_kernels::abi::weft_l2_prefetch_params;
use weft_kernels::cubins;

/// Threads per CTA and CTAs of a prefetch launch: enough issuers that a few MiB go out in about
/// a microsecond, few enough to leave the collective its SMs.
const THREADS: u32 = 128;
const CTAS: u32 = 8;

/// The region of B a prefetch covers, as rows of bytes at a pitch (see the ABI struct).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchRegion {
    pub rows: u32,
    pub pitch: u64,
    pub row_bytes: u32,
}

impl PrefetchRegion {
    /// B's first k-steps (its first `k'` of `k`, whole multiples of 64) within `budget` bytes, for
    /// a B of `n` × `k` (NxK: n rows of k) or `k` × `n` (KxN: k rows of n) elements of
    /// `elem_bytes`; None when not even 64 k-steps fit, or the rows would break the prefetch's
    /// 16-byte alignment.
    pub fn b_prefix(layout: BLayout, n: u32, k: u32, elem_bytes: u32, budget: u64) -> Option<Self> {
        let per_k = u64::from(n) * u64::from(elem_bytes);
        let steps = (budget / per_k).min(u64::from(k)) / 64 * 64;
        if steps == 0 {
            return None;
        }
        let region = match layout {
            BLayout::NxK => Self {
                rows: n,
                pitch: u64::from(k) * u64::from(elem_bytes),
                row_bytes: u32::try_from(steps * u64::from(elem_bytes)).ok()?,
            },
            BLayout::KxN => Self {
                rows: 1,
                pitch: 0,
                row_bytes: u32::try_from(steps * per_k).ok()?,
            },
        };
        (region.pitch % 16 == 0 && region.row_bytes % 16 == 0).then_some(region)
    }

    /// Bytes the region covers.
    pub fn bytes(&self) -> u64 {
        u64::from(self.rows) * u64::from(self.row_bytes)
    }
}

/// A loaded prefetch kernel and the region it covers.
pub struct L2Prefetch {
    func: CudaFunction,
    region: PrefetchRegion,
}

impl L2Prefetch {
    pub fn new(stream: &Arc<CudaStream>, region: PrefetchRegion) -> anyhow::Result<Self> {
        let module = cubins::GEMM_L2_PREFETCH
            .load(stream.context())
            .with_context(|| format!("loading {}", cubins::GEMM_L2_PREFETCH.source))?;
        let func = module
            .load_function("weft_l2_prefetch")
            .context("kernels/gemm/l2_prefetch.cu: weft_l2_prefetch")?;
        Ok(Self { func, region })
    }

    pub fn region(&self) -> PrefetchRegion {
        self.region
    }

    /// Enqueues the prefetch of `b`'s region on `stream`.
    pub fn launch<T>(&self, stream: &Arc<CudaStream>, b: &CudaSlice<T>) -> anyhow::Result<()> {
        let r = self.region;
        let span = (u64::from(r.rows) - 1) * r.pitch + u64::from(r.row_bytes);
        ensure!(
            span <= (b.len() * size_of::<T>()) as u64,
            "L2 prefetch of {span} bytes from a B of {} bytes",
            b.len() * size_of::<T>()
        );
        let (base, _guard) = b.device_ptr(stream);
        ensure!(
            base % 16 == 0,
            "L2 prefetch: B at {base:#x} is not 16-byte aligned"
        );
        let params = weft_l2_prefetch_params {
            base,
            pitch: r.pitch,
            rows: r.rows,
            row_bytes: r.row_bytes,
        };
        let cfg = LaunchConfig {
            grid_dim: (CTAS, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel only issues prefetches of addresses inside `b` (checked above).
        unsafe { stream.launch_builder(&self.func).arg(&params).launch(cfg) }
            .context("launching the L2 prefetch")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_of_either_layout_within_the_budget() {
        // 4096 × 8192 bf16 NxK, 16 MiB: 16 MiB / (4096 · 2) = 2048 k-steps of each row.
        let r = PrefetchRegion::b_prefix(BLayout::NxK, 4096, 8192, 2, 16 << 20).unwrap();
        assert_eq!((r.rows, r.pitch, r.row_bytes), (4096, 16384, 4096));
        assert_eq!(r.bytes(), 16 << 20);
        // KxN: the first 2048 rows of n, one run.
        let r = PrefetchRegion::b_prefix(BLayout::KxN, 4096, 8192, 2, 16 << 20).unwrap();
        assert_eq!((r.rows, r.row_bytes), (1, 16 << 20));
        // A budget above B covers B; whole 64-step multiples only.
        let r = PrefetchRegion::b_prefix(BLayout::NxK, 1024, 1000, 2, 1 << 30).unwrap();
        assert_eq!(r.row_bytes, 960 * 2);
        assert_eq!(
            PrefetchRegion::b_prefix(BLayout::NxK, 4096, 8192, 2, 4096 * 2 * 63),
            None
        );
    }
}
