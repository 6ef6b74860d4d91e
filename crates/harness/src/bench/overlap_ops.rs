//! What the overlap benchmarks and the tuner run: the NCCL collective after a GEMM, and a
//! signal-gemm overlap (AllReduce or ReduceScatter) with its staging buffers.

use crate::gemm_data::poisoned;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;
use std::sync::Arc;
use weft_pgl::nccl::{Communicator, ReduceOp};
use weft_signal_gemm::overlap::{AllReduceOverlap, ReduceScatterOverlap};
use weft_signal_gemm::tuner::Op;
use weft_signal_gemm::{GemmOptions, GemmShape, Restore};

/// Elements of the result of `send_len` elements on `world` ranks.
pub fn out_len(op: Op, send_len: usize, world: usize) -> usize {
    match op {
        Op::AllReduce => send_len,
        Op::ReduceScatter => send_len / world,
    }
}

/// `out` = the collective of `send` (NCCL, out of place), on `stream`.
pub fn collective<S: DevicePtr<bf16>, R: DevicePtrMut<bf16>>(
    op: Op,
    comm: &Communicator,
    send: &S,
    out: &mut R,
    stream: &CudaStream,
) -> anyhow::Result<()> {
    let r = match op {
        Op::AllReduce => comm.all_reduce(send, out, ReduceOp::Sum, stream),
        Op::ReduceScatter => comm.reduce_scatter(send, out, ReduceOp::Sum, stream),
    };
    Ok(r?)
}

/// One signal-gemm overlap and its staging buffers.
pub enum Signal {
    AllReduce {
        ov: AllReduceOverlap,
        staging: CudaSlice<bf16>,
    },
    ReduceScatter {
        ov: ReduceScatterOverlap,
        staging: CudaSlice<bf16>,
        received: CudaSlice<bf16>,
    },
}

impl Signal {
    pub fn new(
        op: Op,
        compute: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        parts: &[u32],
        world: usize,
        rank: usize,
    ) -> anyhow::Result<Self> {
        Ok(match op {
            Op::AllReduce => {
                let ov = AllReduceOverlap::new(compute, shape, options, Some(parts), rank as u32)?;
                let staging = poisoned::<bf16>(compute, ov.staging_len())?;
                Signal::AllReduce { ov, staging }
            }
            Op::ReduceScatter => {
                let ov = ReduceScatterOverlap::new(
                    compute,
                    shape,
                    options,
                    Some(parts),
                    world as u32,
                    rank as u32,
                )?;
                let staging = poisoned::<bf16>(compute, ov.staging_len())?;
                let received = poisoned::<bf16>(compute, ov.received_len())?;
                Signal::ReduceScatter {
                    ov,
                    staging,
                    received,
                }
            }
        })
    }

    /// The standard rows of the output, in its order.
    pub fn rows(&self, m: u32) -> Vec<u32> {
        match self {
            Signal::AllReduce { .. } => (0..m).collect(),
            Signal::ReduceScatter { ov, .. } => (0..ov.map().rows())
                .map(|i| ov.map().global_row(i))
                .collect(),
        }
    }

    pub fn run(
        &mut self,
        compute: &Arc<CudaStream>,
        comm: &Communicator,
        a: &CudaSlice<bf16>,
        b: &CudaSlice<bf16>,
        out: &mut CudaSlice<bf16>,
    ) -> anyhow::Result<()> {
        match self {
            Signal::AllReduce { ov, staging } => ov
                .run(compute, comm, a, b, staging, out, Restore::Copy)
                .map_err(anyhow::Error::from),
            Signal::ReduceScatter {
                ov,
                staging,
                received,
            } => ov
                .run(compute, comm, a, b, staging, received, out, Restore::Copy)
                .map_err(anyhow::Error::from),
        }
    }

    pub fn restore(
        &self,
        compute: &Arc<CudaStream>,
        out: &mut CudaSlice<bf16>,
    ) -> anyhow::Result<()> {
        match self {
            Signal::AllReduce { ov, staging } => ov
                .restore(compute, staging, out, Restore::Copy)
                .map_err(anyhow::Error::from),
            Signal::ReduceScatter { ov, received, .. } => ov
                .restore(compute, received, out, Restore::Copy)
                .map_err(anyhow::Error::from),
        }
    }

    pub fn check(&self) -> anyhow::Result<()> {
        match self {
            Signal::AllReduce { ov, .. } => ov.check().map_err(anyhow::Error::from),
            Signal::ReduceScatter { ov, .. } => ov.check().map_err(anyhow::Error::from),
        }
    }
}
