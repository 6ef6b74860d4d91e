//! The references an overlap row times interleaved with its methods (`Rig::time_each`): the
//! collective alone (NCCL: T_comm), the GEMM alone (cuBLAS: T_gemm) and each method's GEMM as
//! the breakdown times it (bench/overlap_breakdown.rs). In the same loop as the methods, with the
//! same L2 flush and rank alignment, their medians see the clocks and temperature the methods
//! saw. (Timed in blocks of their own, before and after the methods, they did not: on two H200s
//! at 99a0abf the cuBLAS GEMM timed after the K = 7168 ReduceScatter rows took 1.08–1.15× the
//! T_gemm timed before them, so the ideal max(T_gemm, T_comm) was not the one the methods ran
//! against.)

use super::overlap_breakdown::{GemmAlone, GemmLauncher};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use std::ops::Range;
use std::sync::Arc;
use weft_pgl::nccl::{Communicator, ReduceOp};
use weft_signal_gemm::ops::SharedComm;
use weft_signal_gemm::GemmShape;

/// The op's collective alone on NCCL, with its buffers.
pub enum CommAlone {
    /// AllReduce (`all`) or ReduceScatter of a GEMM output `d` into `out`.
    Reduce {
        d: CudaSlice<bf16>,
        out: CudaSlice<bf16>,
        all: bool,
    },
    /// The ranks' A shards gathered into `a` (m × k; after the first run, the whole A).
    AllGather { a: CudaSlice<bf16> },
    /// The routed rows of `send` exchanged into `recv`.
    AllToAll {
        send: CudaSlice<bf16>,
        sends: Vec<Range<usize>>,
        recv: CudaSlice<bf16>,
        recvs: Vec<Range<usize>>,
    },
}

impl CommAlone {
    /// One run on `stream`; `shard` is this rank's A shard (AllGather's input).
    pub fn launch(
        &mut self,
        comm: &Communicator,
        shard: &CudaSlice<bf16>,
        stream: &Arc<CudaStream>,
    ) -> anyhow::Result<()> {
        let r = match self {
            CommAlone::Reduce { d, out, all: true } => {
                comm.all_reduce(d, out, ReduceOp::Sum, stream)
            }
            CommAlone::Reduce { d, out, all: false } => {
                comm.reduce_scatter(d, out, ReduceOp::Sum, stream)
            }
            CommAlone::AllGather { a } => comm.all_gather(shard, a, stream),
            CommAlone::AllToAll {
                send,
                sends,
                recv,
                recvs,
            } => comm.all_to_all_v(send, sends, recv, recvs, stream),
        };
        Ok(r?)
    }
}

/// A row's references: index 0 .. gemms.len() the GEMMs (the first is cuBLAS over the whole
/// shape, T_gemm), then the collective (T_comm).
pub struct Lones {
    gemms: Vec<(GemmAlone, GemmLauncher)>,
    comm: CommAlone,
    /// The GEMMs' output, shared: they run one at a time on one stream.
    d: CudaSlice<bf16>,
}

impl Lones {
    /// `gemms` (deduplicated here; cuBLAS over the whole shape put first) planned on `stream`.
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        gemms: &[GemmAlone],
        comm: CommAlone,
    ) -> anyhow::Result<Self> {
        let gemms = reference_gemms(gemms)
            .into_iter()
            .map(|g| Ok((g, g.prepare(stream, shape)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let d = stream.alloc_zeros::<bf16>(shape.m as usize * shape.n as usize)?;
        Ok(Lones { gemms, comm, d })
    }

    pub fn len(&self) -> usize {
        self.gemms.len() + 1
    }

    /// Reference `i` on `stream`. `a` is the GEMMs' A except for AllGather (x's shard), whose
    /// GEMMs read the gathered A.
    pub fn launch(
        &mut self,
        i: usize,
        comm: &SharedComm,
        a: &CudaSlice<bf16>,
        b: &CudaSlice<bf16>,
        stream: &Arc<CudaStream>,
    ) -> anyhow::Result<()> {
        if let Some((_, gemm)) = self.gemms.get(i) {
            let a = match &self.comm {
                CommAlone::AllGather { a: gathered } => gathered,
                _ => a,
            };
            return gemm.launch(stream, a, b, &mut self.d);
        }
        let comm = comm.lock().map_err(|_| {
            anyhow::anyhow!("the ops' communicator is unusable: a thread panicked on it")
        })?;
        self.comm.launch(&comm, a, stream)
    }

    /// From the references' times (in `launch`'s order): T_gemm, T_comm, and the ms of each
    /// breakdown GEMM.
    pub fn split(&self, times: &[f64]) -> (f64, f64, Vec<(GemmAlone, f64)>) {
        let g = self.gemms.len();
        let gemm_ms = self
            .gemms
            .iter()
            .zip(times)
            .map(|((alone, _), ms)| (*alone, *ms))
            .collect();
        (times[0], times[g], gemm_ms)
    }
}

/// cuBLAS over the whole shape (T_gemm), then each other GEMM of `gemms` once, in order.
fn reference_gemms(gemms: &[GemmAlone]) -> Vec<GemmAlone> {
    let mut list = vec![GemmAlone::Cublas { bands: 1 }];
    for g in gemms {
        if !list.contains(g) {
            list.push(*g);
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_signal_gemm::TileChoice;

    #[test]
    fn t_gemm_first_then_each_gemm_once() {
        let weft = |sm_margin| GemmAlone::Weft {
            sm_margin,
            tile: TileChoice::Auto,
        };
        let bands = GemmAlone::Cublas { bands: 2 };
        let whole = GemmAlone::Cublas { bands: 1 };
        assert_eq!(reference_gemms(&[]), vec![whole]);
        assert_eq!(
            reference_gemms(&[weft(0), bands, whole, weft(0), weft(16), bands]),
            vec![whole, weft(0), bands, weft(16)]
        );
    }
}
