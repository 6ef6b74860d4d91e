//! CUDA-event timing of repeated operations, and the statistics weft reports.

use cudarc::driver::{sys, CudaStream};

/// Runs `op` `warmup` times untimed, then `iters` times each between its own pair of events;
/// returns each timed iteration in milliseconds.
pub fn time_iterations(
    stream: &std::sync::Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    time_runs(
        stream,
        warmup,
        iters,
        None,
        || Ok(()),
        op,
        plain_wait(stream),
    )
}

/// A plain stream synchronize (unbounded where the stream holds collectives a peer never joins).
fn plain_wait(stream: &CudaStream) -> impl FnMut() -> anyhow::Result<()> + '_ {
    || Ok(stream.synchronize()?)
}

/// Bytes an L2 flush writes: twice the device's L2, so nothing an earlier run left there survives.
pub fn l2_flush_bytes(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> anyhow::Result<usize> {
    let l2 = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
    Ok(2 * (l2.max(1 << 20) as usize))
}

/// As [`time_iterations`], with `flush` overwritten before each timed iteration (outside its
/// events), so no iteration finds its inputs in L2 from the one before.
pub fn time_flushed(
    stream: &std::sync::Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    flush: &mut cudarc::driver::CudaSlice<u8>,
    op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    time_runs(
        stream,
        warmup,
        iters,
        Some(flush),
        || Ok(()),
        op,
        plain_wait(stream),
    )
}

/// As [`time_flushed`], with `align` enqueued after each flush, outside the events (a collective
/// that lines the ranks up, so each timed run starts together on every rank).
pub fn time_flushed_aligned(
    stream: &std::sync::Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    flush: &mut cudarc::driver::CudaSlice<u8>,
    align: impl FnMut() -> anyhow::Result<()>,
    op: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    time_runs(
        stream,
        warmup,
        iters,
        Some(flush),
        align,
        op,
        plain_wait(stream),
    )
}

/// As [`time_flushed_aligned`], waiting for the stream (after the warm-up and at the end) with
/// `wait` instead of a plain synchronize: an NCCL communicator's bounded synchronize, which
/// aborts it past its budget, keeps a peer that never joins a timed collective from hanging the
/// timing (`Auto`'s first use times its candidates so).
pub fn time_flushed_aligned_waiting(
    stream: &std::sync::Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    flush: &mut cudarc::driver::CudaSlice<u8>,
    align: impl FnMut() -> anyhow::Result<()>,
    op: impl FnMut() -> anyhow::Result<()>,
    wait: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    time_runs(stream, warmup, iters, Some(flush), align, op, wait)
}

/// `align` is called exactly `iters` times whatever happens to `op` (it may be a collective the
/// other ranks wait in): after a failed warm-up, event, run or wait, the remaining runs are
/// skipped, their line-ups are not, and the first error is returned at the end. `wait` waits for
/// the stream after the warm-up and at the end.
fn time_runs(
    stream: &std::sync::Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut flush: Option<&mut cudarc::driver::CudaSlice<u8>>,
    mut align: impl FnMut() -> anyhow::Result<()>,
    mut op: impl FnMut() -> anyhow::Result<()>,
    mut wait: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    let mut failed: Option<anyhow::Error> = None;
    let keep = |r: anyhow::Result<()>, failed: &mut Option<anyhow::Error>| {
        if let Err(e) = r {
            failed.get_or_insert(e);
        }
    };
    for _ in 0..warmup {
        if failed.is_none() {
            keep(op(), &mut failed);
        }
    }
    let ctx = stream.context();
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(2 * iters);
    if failed.is_none() {
        let made = (0..2 * iters)
            .map(|_| ctx.new_event(flags))
            .collect::<Result<Vec<_>, _>>();
        match made {
            Ok(e) => events = e,
            Err(e) => failed = Some(e.into()),
        }
    }
    if failed.is_none() {
        keep(wait(), &mut failed);
    }
    for i in 0..iters {
        if failed.is_none() {
            if let Some(f) = flush.as_deref_mut() {
                keep(stream.memset_zeros(f).map_err(Into::into), &mut failed);
            }
        }
        // Called even after a failure (the other ranks may wait in it); its own error is kept
        // only if nothing failed before (an aborted communicator's line-up fails at once).
        keep(align(), &mut failed);
        if failed.is_none() {
            let run = (|| {
                events[2 * i].record(stream)?;
                op()?;
                events[2 * i + 1].record(stream)?;
                Ok(())
            })();
            keep(run, &mut failed);
        }
    }
    let waited = wait();
    if let Some(e) = failed {
        return Err(e);
    }
    waited?;
    let mut ms = Vec::with_capacity(iters);
    for i in 0..iters {
        ms.push(events[2 * i].elapsed_ms(&events[2 * i + 1])? as f64);
    }
    Ok(ms)
}

/// The median (mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> f64 {
    assert!(!values.is_empty(), "median of no values");
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
    }
}
