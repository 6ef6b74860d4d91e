//! The communication stream: the context's greatest priority, so its kernels (the group waits and
//! NCCL's) are scheduled ahead of queued GEMM CTAs whenever an SM frees up.

use crate::error::GemmError;
use anyhow::Context;
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::Arc;

/// A new non-blocking stream on `ctx` at the greatest priority the context allows.
pub fn high_priority_stream(ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<Arc<CudaStream>> {
        ctx.bind_to_thread()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: two out-parameters.
        unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) }
            .result()
            .context("cuCtxGetStreamPriorityRange")?;
        ctx.new_stream_with_priority(greatest)
            .context("creating the high-priority communication stream")
    })
}
