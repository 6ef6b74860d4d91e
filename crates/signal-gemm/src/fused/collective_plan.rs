//! What every fused method checks and builds the same way: ranks planning the same kernel, every
//! rank's grid resident at once, a tensor map per rank's buffer in device memory, and a
//! synchronisation that names the wait that timed out.

use crate::dtype::Dtype;
use crate::error::agree;
use crate::error::require;
use crate::gemm::device_sms;
use crate::tensor_map::encode_2d;
use anyhow::Context;
use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use std::sync::Arc;
use weft_kernels::abi::weft_tensor_map;
use weft_pgl::Bootstrap;
use weft_pgl::{Pgl, PglElement, Shape};
use weft_sync::{Counters, WaitBudget};

/// Collective: every rank's `describe` (its plan, and whatever else enters the cross-rank
/// targets) must be this rank's; the error names the ranks that differ.
pub(crate) fn agree_on_plan(
    rdzv: &mut dyn Bootstrap,
    what: &str,
    describe: &str,
) -> anyhow::Result<()> {
    let all = rdzv.all_gather(describe.as_bytes())?;
    let differing: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| d.as_slice() != describe.as_bytes())
        .map(|(r, d)| format!("rank {r} planned {}", String::from_utf8_lossy(d)))
        .collect();
    require!(
        differing.is_empty(), RanksDisagree,
        "{what}: ranks planned different kernels (each waits for the others' CTAs): this rank planned {describe}, {}",
        differing.join(", ")
    );
    Ok(())
}

/// Collective: `ctas` per rank (all its kernels that wait across ranks) fit the GPU together with
/// those of the ranks sharing it.
pub(crate) fn check_resident(
    rdzv: &mut dyn Bootstrap,
    ctx: &Arc<CudaContext>,
    what: &str,
    ctas: u32,
) -> anyhow::Result<()> {
    let sharing = weft_pgl::gpu::max_ranks_per_gpu(rdzv, ctx)? as u32;
    let sms = device_sms(ctx)?;
    require!(
        u64::from(ctas) * u64::from(sharing) <= u64::from(sms), Unsupported,
        "{what}: {sharing} ranks share one GPU of {sms} SMs, so {ctas} CTAs per rank cannot all be resident at once (the kernel's barriers wait across ranks); plan at most {} CTAs per rank (raise GemmOptions::sm_margin)",
        sms / sharing
    );
    Ok(())
}

/// A 2-D tensor map (rows × cols of `dtype`, boxes of box_rows × box_cols) per rank's buffer at
/// `ptrs[r]` (peers' as this process maps them), copied to device memory for a kernel to read.
pub(crate) fn peer_tensor_maps(
    stream: &Arc<CudaStream>,
    what: &str,
    ptrs: &[u64],
    dtype: Dtype,
    (rows, cols): (u64, u64),
    (box_rows, box_cols): (u32, u32),
) -> anyhow::Result<CudaSlice<u8>> {
    let mut bytes = Vec::with_capacity(ptrs.len() * std::mem::size_of::<weft_tensor_map>());
    for (r, &ptr) in ptrs.iter().enumerate() {
        let map = encode_2d(
            &format!("rank {r}'s {what}"),
            ptr,
            dtype,
            rows,
            cols,
            box_rows,
            box_cols,
        )?;
        for w in map.words {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
    }
    // cuMemAlloc aligns to at least 256 bytes: every map is 64-byte aligned as TMA needs.
    let maps = stream.clone_htod(&bytes)?;
    stream.synchronize()?;
    Ok(maps)
}

/// Collective: the START / END counters of the fused methods' cross-rank barriers
/// (kernels/include/weft/gemm/peer_reduce.cuh), bounded by weft-sync's default budget (agreed:
/// a rank that cannot read it fails every rank alike).
pub(crate) fn peer_barrier_counters(
    rdzv: &mut dyn Bootstrap,
    ctx: &Arc<CudaContext>,
    what: &str,
) -> anyhow::Result<Counters> {
    let budget = agree(
        rdzv,
        &format!("{what} barrier budget"),
        WaitBudget::default_for(ctx).map_err(anyhow::Error::new),
    )?;
    Ok(Counters::alloc(rdzv, ctx, Shape::new(1, 1, 2, 1), budget)?)
}

/// `e`, with the failure of the collective free that followed it (`freed`), if any.
pub(crate) fn with_failed_free(e: anyhow::Error, freed: anyhow::Result<()>) -> anyhow::Error {
    match freed {
        Ok(()) => e,
        Err(f) => e.context(format!("and freeing what was allocated failed too: {f:#}")),
    }
}

/// Waits for `stream`, then runs `checks` (reads of error slots); the error names every wait they
/// report as timed out (their reports survive the trap that stopped the kernel), else the
/// driver's error, if any.
pub(crate) fn synchronize_checked(
    stream: &Arc<CudaStream>,
    what: &str,
    checks: impl FnOnce() -> Vec<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let synced = stream.synchronize();
    let failures: Vec<anyhow::Error> = checks().into_iter().filter_map(Result::err).collect();
    let end = match &synced {
        Ok(()) => KernelsEnded::Completed,
        Err(e) => KernelsEnded::Stopped(e.to_string()),
    };
    match (synced, failures.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Err(e), true) => Err(anyhow::Error::from(e))
            .with_context(|| format!("{what} failed and recorded no wait in its error slots")),
        (_, false) => Err(first_failure(what, failures, end)),
    }
}

/// How the kernels ended when their waits recorded failures.
enum KernelsEnded {
    Completed,
    /// Stopped, with the driver's error text.
    Stopped(String),
}

/// The first recorded failure, keeping its type (a `Gemm`'s or the counters' `weft_sync::SyncError`:
/// `downcast_ref` finds it), with how the kernels ended and every other failure as its context.
fn first_failure(what: &str, failures: Vec<anyhow::Error>, end: KernelsEnded) -> anyhow::Error {
    let mut failures = failures.into_iter();
    let first = failures.next().expect("called with at least one failure");
    let others: Vec<String> = failures.map(|e| format!("{e:#}")).collect();
    let end = match end {
        KernelsEnded::Completed => "yet the kernels completed".to_string(),
        KernelsEnded::Stopped(e) => format!("the kernel was stopped: {e}"),
    };
    let also = if others.is_empty() {
        String::new()
    } else {
        format!("; also: {}", others.join("; "))
    };
    first.context(format!("{what}: a wait gave up ({end}){also}"))
}

/// Copies this rank's buffer of `pgl` into `dst` (at least as many elements) on `stream`.
pub(crate) fn copy_own_buffer<T: PglElement>(
    stream: &Arc<CudaStream>,
    what: &str,
    pgl: &Pgl<T>,
    dst: &mut CudaSlice<T>,
) -> anyhow::Result<()> {
    let len = pgl.len();
    require!(
        dst.len() >= len,
        Length,
        "{what}: destination holds {} elements, needs {len}",
        dst.len()
    );
    let (ptr, _g) = dst.device_ptr_mut(stream);
    stream.context().bind_to_thread()?;
    // SAFETY: both buffers hold `len` elements of T on this context; stream-ordered.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(
            ptr,
            pgl.local_ptr(),
            len * std::mem::size_of::<T>(),
            stream.cu_stream(),
        )
    }
    .result()
    .with_context(|| format!("copying the {what}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{first_failure, KernelsEnded};
    use weft_kernels::abi;
    use weft_sync::{DeviceFailure, FailureKind, KernelEnd, SyncError};

    fn timeout(rank: i32) -> anyhow::Error {
        let slot = abi::weft_error_slot {
            status: abi::WEFT_SYNC_STATUS_TIMEOUT as i32,
            primitive: abi::WEFT_SYNC_PRIM_WAIT as i32,
            rank,
            target_rank: rank,
            expected: 4,
            observed: 2,
            ..Default::default()
        };
        let failure = DeviceFailure::from_slot(slot, 1_980_000).expect("a timeout");
        anyhow::Error::new(SyncError::Device {
            failures: vec![failure],
            end: KernelEnd::NotWaited,
        })
        .context("GEMM pipeline")
    }

    /// The first failure keeps its type under the context; the others and the end are in the text.
    #[test]
    fn the_first_failure_stays_typed() {
        let e = first_failure(
            "the fused GEMM + ReduceScatter",
            vec![timeout(0), anyhow::anyhow!("barrier row 1 timed out")],
            KernelsEnded::Stopped("CUDA_ERROR_LAUNCH_FAILED".into()),
        );
        let typed = e
            .downcast_ref::<SyncError>()
            .expect("the SyncError under the context");
        assert_eq!(typed.failures()[0].kind, FailureKind::Timeout);
        assert_eq!(
            (
                typed.failures()[0].expected(),
                typed.failures()[0].observed()
            ),
            (4, 2)
        );
        let text = format!("{e:#}");
        for part in [
            "the fused GEMM + ReduceScatter: a wait gave up (the kernel was stopped: CUDA_ERROR_LAUNCH_FAILED); also: barrier row 1 timed out",
            "GEMM pipeline",
            "rank 0: sync wait timed out",
            "expected >= 4, observed 2",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text:?}");
        }
        let e = first_failure("x", vec![timeout(1)], KernelsEnded::Completed);
        assert_eq!(
            format!("{e}"),
            "x: a wait gave up (yet the kernels completed)"
        );
    }
}
