//! The All-to-All's sequential path: a standard-layout GEMM output's rows gathered destination by
//! destination (kernels/gemm/restore.cu, weft_gemm_row_gather), each destination's rows in
//! increasing order, so one ncclSend / ncclRecv per peer moves them and every rank receives them
//! source by source in the order the All-to-All map ([`crate::AllToAllMap`]) defines.

use crate::dtype::GemmElement;
use crate::error::GemmError;
use crate::error::{refuse, require};
use anyhow::Context;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::ops::Range;
use std::sync::Arc;
use weft_kernels::abi::weft_gemm_row_gather_params;
use weft_kernels::cubins;

/// Rank `rank`'s gather and its send and receive ranges (elements of rows of `n`).
pub struct RowGather {
    /// Source row of each gathered row (destination by destination, rows ascending).
    src_rows: CudaSlice<u32>,
    rows: u32,
    m: u32,
    n: u32,
    sends: Vec<Range<usize>>,
    recvs: Vec<Range<usize>>,
    func: CudaFunction,
    blocks: u32,
}

impl RowGather {
    /// `routes[s][row]` = the destination of rank s's output row (every rank's routing, the same
    /// on every rank, each of `m` rows below routes.len()).
    pub fn new(
        stream: &Arc<CudaStream>,
        routes: &[Vec<u32>],
        rank: usize,
        m: u32,
        n: u32,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let world = routes.len();
            require!(
                rank < world,
                Options,
                "row gather: rank {rank} of {world} routings"
            );
            for (s, r) in routes.iter().enumerate() {
                require!(
                    r.len() == m as usize,
                    Length,
                    "row gather: rank {s}'s routing has {} rows, the GEMM has m = {m}",
                    r.len()
                );
                if let Some((row, d)) = r.iter().enumerate().find(|(_, &d)| d as usize >= world) {
                    refuse!(Options, "row gather: rank {s} routes row {row} to rank {d}, but there are {world} ranks");
                }
            }
            let n_us = n as usize;
            let mut src_rows = Vec::with_capacity(m as usize);
            let mut sends = Vec::with_capacity(world);
            for d in 0..world {
                let start = src_rows.len();
                src_rows.extend((0..m).filter(|&row| routes[rank][row as usize] as usize == d));
                sends.push(start * n_us..src_rows.len() * n_us);
            }
            let mut recvs = Vec::with_capacity(world);
            let mut at = 0;
            for r in routes {
                let count = r.iter().filter(|&&d| d as usize == rank).count() * n_us;
                recvs.push(at..at + count);
                at += count;
            }
            let rows = src_rows.len() as u32;
            let src_rows = stream
                .clone_htod(if src_rows.is_empty() {
                    &[0u32][..]
                } else {
                    &src_rows[..]
                })
                .context("uploading the row gather's list")?;
            let ctx = stream.context();
            let module = cubins::GEMM_RESTORE
                .load(ctx)
                .with_context(|| format!("loading {}", cubins::GEMM_RESTORE.source))?;
            let func = module
                .load_function("weft_gemm_row_gather")
                .context("kernels/gemm/restore.cu: weft_gemm_row_gather")?;
            let blocks = 4 * crate::gemm::device_sms(ctx)?;
            stream.synchronize()?;
            Ok(Self {
                src_rows,
                rows,
                m,
                n,
                sends,
                recvs,
                func,
                blocks,
            })
        })
    }

    /// Elements of the gathered (send) buffer: every row of this rank's GEMM, m × n.
    pub fn send_len(&self) -> usize {
        self.rows as usize * self.n as usize
    }

    /// Elements this rank receives (its output).
    pub fn recv_len(&self) -> usize {
        self.recvs.last().map_or(0, |r| r.end)
    }

    /// Per peer: the send range of the gathered buffer and the receive range of the output.
    pub fn ranges(&self) -> (&[Range<usize>], &[Range<usize>]) {
        (&self.sends, &self.recvs)
    }

    /// `dst` (m × n) = `src`'s rows, destination by destination, on `stream`.
    pub fn gather<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let need = self.m as usize * self.n as usize;
            require!(
                src.len() >= need && dst.len() >= self.send_len(),
                Length,
                "row gather: buffers of {} and {} elements, need {need} and {}",
                src.len(),
                dst.len(),
                self.send_len()
            );
            if self.rows == 0 {
                return Ok(());
            }
            let (ps, _gs) = src.device_ptr(stream);
            let (pd, _gd) = dst.device_ptr_mut(stream);
            let (pr, _gr) = self.src_rows.device_ptr(stream);
            let p = weft_gemm_row_gather_params {
                src: ps,
                dst: pd,
                src_rows: pr,
                rows: self.rows,
                n: self.n,
                elem_bytes: T::DTYPE.bytes() as u32,
                reserved: 0,
            };
            let cfg = LaunchConfig {
                grid_dim: (self.blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel takes exactly this struct; `src` holds m rows (each listed row < m,
            // checked when the list was made) and `dst` the listed rows.
            unsafe { stream.launch_builder(&self.func).arg(&p).launch(cfg) }
                .context("launching the row gather")?;
            Ok(())
        })
    }
}
