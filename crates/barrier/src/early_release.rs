//! Early release: the compute kernel queued behind [`KernelBarrier::wait`](crate::KernelBarrier::wait)
//! starts as soon as the wait is satisfied, not after the wait kernel has completed.
//!
//! By default a kernel starts only after the previous kernel on its stream has *completed*,
//! which includes the end-of-grid memory flush. The wait kernel calls
//! `griddepcontrol.launch_dependents` (`weft::kernel_barrier_release_next`) the moment the target
//! is reached (and when it gives up); a kernel launched right after it with
//! [`early_release_attribute`] (programmatic stream serialization, `cuLaunchKernelEx`) may then
//! start at once. Sound because the wait kernel writes nothing the next kernel reads; every kernel
//! before the wait kernel on the stream had completed before the wait kernel started, so the
//! next kernel stays ordered after them. Only for the launch directly after a `wait` on the same
//! stream: after any other kernel the attribute would let it overlap a producer it depends on.
//! With cudarc's event tracking on (its default), taking a buffer's device pointer enqueues event
//! waits on the stream, which would land between the wait kernel and the launch: turn it off
//! (`CudaContext::disable_event_tracking`) and order buffers yourself; the attribute is refused
//! otherwise.

use crate::error::BarrierError;
use cudarc::driver::{sys, CudaStream};
use std::sync::Arc;

/// The launch attribute (for `cuLaunchKernelEx`) that lets a kernel enqueued on `stream` right
/// after `KernelBarrier::wait` start when the wait is satisfied. Err while the stream's context
/// tracks events (the event waits would sit between the wait and the launch).
pub fn early_release_attribute(
    stream: &Arc<CudaStream>,
) -> Result<sys::CUlaunchAttribute, BarrierError> {
    if stream.context().is_event_tracking() {
        return Err(BarrierError::EventTracking);
    }
    Ok(weft_sync::launch::programmatic_serialization_attribute())
}
