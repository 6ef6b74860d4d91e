//! KernelBarrier: the host side. One device int32 counter that communication kernels arrive on
//! (through [`KernelBarrier::view`]) and the wait kernel polls, plus the pinned report a wait that
//! gave up fills. Targets are cumulative (the host keeps the running total of expected arrivals),
//! so rounds of wait / compute / comm can be enqueued back to back with no host synchronisation
//! and no memset between them.

use crate::bound;
use crate::error::BarrierError;
use crate::report::describe;
use anyhow::Context;
use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;
use std::time::Duration;
use weft_kernels::abi::{
    weft_kernel_barrier_report, weft_kernel_barrier_view, weft_kernel_barrier_wait_params,
};
use weft_kernels::cubins;
use weft_sync::WaitBudget;

/// A launch-ordering barrier on one GPU (RAII: the counter and the report are freed on drop, after
/// the context has finished every kernel that may use them).
///
/// # Examples
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// use weft_barrier::KernelBarrier;
/// # fn main() -> anyhow::Result<()> {
/// let ctx = CudaContext::new(0)?;
/// let (compute, comm) = (ctx.new_stream()?, ctx.new_stream()?);
/// let mut bar = KernelBarrier::new(&ctx)?;
/// let target = bar.expect(1)?; // one arrival this round
/// bar.wait(&compute, target)?; // the compute stream's next kernels start once it has come
/// // ... launch the compute kernels on `compute`, then on `comm` a communication kernel that
/// // arrives on `bar.view()` once its blocks are resident (a grpcoll plan takes it through
/// // `set_kernel_barrier`; your own kernel includes <weft/barrier/kernel_barrier.cuh>) ...
/// compute.synchronize()?;
/// comm.synchronize()?;
/// bar.check()?; // a wait that gave up: an error naming the target and what had arrived
/// # Ok(()) }
/// ```
pub struct KernelBarrier {
    ctx: Arc<CudaContext>,
    wait: CudaFunction,
    counter: sys::CUdeviceptr,
    report: *mut weft_kernel_barrier_report,
    report_dev: u64,
    /// Arrivals expected since the last reset: the next target.
    total: i32,
    timeout: Duration,
    clock_khz: u32,
}

// SAFETY: `report` points to pinned host memory owned by this value, read and written as a whole
// plain-old-data struct with volatile accesses; the device pointers are plain addresses.
unsafe impl Send for KernelBarrier {}

impl KernelBarrier {
    /// A zeroed counter on `ctx`'s device, bound [`bound::default_timeout`].
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, BarrierError> {
        ctx.bind_to_thread()
            .map_err(BarrierError::driver("binding the barrier's context"))?;
        let clock_khz = weft_sync::budget::sm_clock_khz(ctx)?;
        let module = cubins::BARRIER_WAIT
            .load(ctx)
            .with_context(|| format!("loading {}", cubins::BARRIER_WAIT.source))?;
        let wait = module
            .load_function("weft_kernel_barrier_wait")
            .context("kernels/barrier/wait.cu has no weft_kernel_barrier_wait")?;
        // Everything that can fail without side effects comes before the allocation below.
        let timeout = bound::default_timeout()?;
        // SAFETY: a fresh 4-byte allocation, zeroed before any use.
        let counter = unsafe { result::malloc_sync(4) }
            .map_err(BarrierError::driver("allocating the KernelBarrier counter"))?;
        let mut this = Self {
            ctx: ctx.clone(),
            wait,
            counter,
            report: std::ptr::null_mut(),
            report_dev: 0,
            total: 0,
            timeout,
            clock_khz,
        };
        // SAFETY: the counter allocated above; synchronous.
        unsafe { sys::cuMemsetD32_v2(counter, 0, 1) }
            .result()
            .map_err(BarrierError::driver("zeroing the KernelBarrier counter"))?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a fresh allocation of the report's size; cleared below before any use.
        this.report = unsafe {
            result::malloc_host(std::mem::size_of::<weft_kernel_barrier_report>(), flags)
        }
        .map_err(BarrierError::driver(
            "allocating the KernelBarrier report (cuMemHostAlloc, portable + device-mapped)",
        ))? as *mut _;
        this.clear_report();
        // SAFETY: `report` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut this.report_dev, this.report.cast(), 0) }
            .result()
            .map_err(BarrierError::driver(
                "cuMemHostGetDevicePointer on the KernelBarrier report",
            ))?;
        Ok(this)
    }

    /// What communication kernels take: their first thread of the first block arrives on it.
    pub fn view(&self) -> weft_kernel_barrier_view {
        weft_kernel_barrier_view {
            counter: self.counter,
        }
    }

    /// Records that `arrivals` more arrivals will come (one per communication kernel launched on
    /// this barrier, or one per cluster, see README) and returns the target a wait for them uses.
    pub fn expect(&mut self, arrivals: u32) -> Result<i32, BarrierError> {
        let next = i64::from(self.total) + i64::from(arrivals);
        let Ok(next) = i32::try_from(next) else {
            return Err(BarrierError::Overflow {
                total: self.total,
                arrivals,
            });
        };
        self.total = next;
        Ok(next)
    }

    /// The target of the arrivals expected so far.
    pub fn expected(&self) -> i32 {
        self.total
    }

    /// Enqueues the wait kernel (1 block, 1 thread) on `stream`: work enqueued after it on that
    /// stream starts once the counter has reached `target`, or once the bound has expired (then
    /// [`check`](Self::check) reports it). Returns without waiting on the host.
    pub fn wait(&self, stream: &Arc<CudaStream>, target: i32) -> Result<(), BarrierError> {
        self.wait_stamped(stream, target, 0)
    }

    /// As [`wait`](Self::wait), and the wait kernel writes its exit `%globaltimer` (u64 ns) to
    /// device address `exit_stamp` (0: none) — for measuring the hand-off to the next kernel.
    pub fn wait_stamped(
        &self,
        stream: &Arc<CudaStream>,
        target: i32,
        exit_stamp: u64,
    ) -> Result<(), BarrierError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(BarrierError::WrongContext {
                barrier_gpu: self.ctx.ordinal(),
            });
        }
        if target < 0 || target > self.total {
            return Err(BarrierError::UnexpectedTarget {
                target,
                expected: self.total,
            });
        }
        let p = weft_kernel_barrier_wait_params {
            view: self.view(),
            target,
            reserved: 0,
            budget_cycles: WaitBudget::from_duration(self.timeout, self.clock_khz).cycles,
            report: self.report_dev,
            exit_stamp,
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes exactly this struct; the counter and the report outlive it (drop
        // synchronises the context first).
        unsafe { stream.launch_builder(&self.wait).arg(&p).launch(cfg) }.map_err(
            BarrierError::driver("launching the KernelBarrier wait kernel"),
        )?;
        Ok(())
    }

    /// Zeroes the counter in `stream` order and the host's running total. `stream` must be ordered
    /// after every wait and arrival of the earlier targets (an arrival after the memset would count
    /// toward the next ones).
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> Result<(), BarrierError> {
        self.ctx
            .bind_to_thread()
            .map_err(BarrierError::driver("binding the barrier's context"))?;
        // SAFETY: the counter is a live 4-byte allocation of this context.
        unsafe { sys::cuMemsetD32Async(self.counter, 0, 1, stream.cu_stream()) }
            .result()
            .map_err(BarrierError::driver("resetting the KernelBarrier counter"))?;
        self.total = 0;
        Ok(())
    }

    /// After the waits' streams have been synchronised: Err naming target, observed count and
    /// bound when a wait gave up (the report is cleared; the counter is left as it was: reset it
    /// before reuse).
    pub fn check(&self) -> Result<(), BarrierError> {
        // SAFETY: valid, aligned, pinned; volatile because the device writes it.
        let r = unsafe { std::ptr::read_volatile(self.report) };
        if describe(&r, self.clock_khz).is_none() {
            return Ok(());
        }
        self.clear_report();
        Err(BarrierError::TimedOut {
            gpu: self.ctx.ordinal(),
            report: r,
            clock_khz: self.clock_khz,
        })
    }

    /// The bound on each later wait (cycles at the maximum SM clock).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn clear_report(&self) {
        // SAFETY: as in check(); only while no wait may be writing (after a synchronisation).
        unsafe { std::ptr::write_volatile(self.report, weft_kernel_barrier_report::default()) }
    }
}

impl Drop for KernelBarrier {
    fn drop(&mut self) {
        let freed = self.ctx.synchronize().and_then(|()| {
            // SAFETY: allocated in new(); no kernel of the context is running any more.
            unsafe { result::free_sync(self.counter)? };
            if self.report.is_null() {
                return Ok(()); // new() failed before allocating it
            }
            // SAFETY: allocated in new(); no kernel of the context is running any more.
            unsafe { result::free_host(self.report.cast()) }
        });
        if let Err(e) = freed {
            log::error!("freeing a KernelBarrier: {e}");
        }
    }
}
