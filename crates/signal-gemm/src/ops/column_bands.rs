//! The column-band method of GEMM + AllReduce and GEMM + ReduceScatter
//! ([`super::Method::ColumnBands`]): cuBLAS computes D in `chunks` bands of whole columns, each
//! into a contiguous buffer of its own (B's band is read in place: an offset and B's leading
//! dimension), planned for the SMs weft's collective leaves (cuBLAS's SM count target); as soon
//! as a band is computed, a second, high-priority stream reduces it with weft's collective (at
//! most `comm_blocks` blocks) and a copy engine copies the result into the band's columns of the
//! op's output.
//!
//! Why columns: at small M the GEMM reads B at memory speed, and row bands (`decomposition`)
//! read all of B once per band; column bands read each part of B once, and A (m × k, small
//! there) once per band.
//!
//! Orderings: the side stream starts after everything before the launch on the op's stream (the
//! output's earlier readers); band c's collective after band c's GEMM (an event); the op's stream
//! ends after the side stream's last copy, so the next launch's first GEMM cannot overwrite a
//! band the previous launch still reduces.

use super::candidates::OpKind;
use super::common::{op_collectives, OpElement};
use crate::cublas::CublasGemm;
use crate::dtype::GemmElement;
use crate::plan::{GemmOptions, GemmShape};
use anyhow::{ensure, Context};
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use weft_collectives::Collectives;
use weft_pgl::Bootstrap;

pub(crate) struct ColumnBands<TO: OpElement> {
    kind: OpKind,
    shape: GemmShape,
    world: u32,
    chunks: u32,
    /// One band: m × n / chunks, planned for the SMs the collective leaves.
    gemm: CublasGemm,
    /// On `side`, at most `comm_blocks` blocks a launch.
    coll: Collectives,
    side: Arc<CudaStream>,
    /// Band c at c · m · w (w = n / chunks).
    bands: CudaSlice<TO>,
    /// ReduceScatter: band c's rows of this rank at c · (m / world) · w.
    scattered: Option<CudaSlice<TO>>,
    /// AllReduce: m × n; ReduceScatter: m / world × n.
    out: CudaSlice<TO>,
}

impl<TO: OpElement> ColumnBands<TO> {
    /// Collective (weft's collectives): `kind` is AllReduce or ReduceScatter; n must split into
    /// `chunks` bands of whole 16-byte vectors, and (ReduceScatter) m into the ranks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        kind: OpKind,
        shape: GemmShape,
        options: GemmOptions,
        chunks: u32,
        comm_blocks: u32,
    ) -> anyhow::Result<Self> {
        let world = rdzv.world() as u32;
        let GemmShape { m, n, k } = shape;
        let vector = 16 / size_of::<TO>() as u32;
        ensure!(
            matches!(kind, OpKind::AllReduce | OpKind::ReduceScatter),
            "column-bands is a method of GEMM + AllReduce and GEMM + ReduceScatter, not {}",
            kind.title()
        );
        ensure!(
            chunks > 0 && n.is_multiple_of(chunks * vector),
            "column-bands:{chunks}: N = {n} does not split into {chunks} bands of whole 16-byte vectors ({vector} elements)"
        );
        ensure!(
            kind == OpKind::AllReduce || m.is_multiple_of(world),
            "column-bands: M = {m} does not split into {world} equal row blocks"
        );
        let ctx = stream.context().clone();
        let sms = crate::gemm::device_sms(&ctx)?;
        ensure!(
            comm_blocks > 0 && comm_blocks < sms,
            "column-bands: {comm_blocks} communication blocks on a GPU of {sms} SMs"
        );
        let side = crate::overlap::high_priority_stream(&ctx)?;
        let mn = u64::from(m) * u64::from(n);
        // The collective part first: a rank that fails later leaves no peer waiting in it.
        let band_bytes = mn / u64::from(chunks) * size_of::<TO>() as u64;
        let coll = op_collectives(rdzv, &side, band_bytes, Some(comm_blocks))?;
        let w = n / chunks;
        let mut gemm = CublasGemm::new(stream, GemmShape::new(m, w, k), options)?;
        gemm.set_sm_count_target(sms - comm_blocks)?;
        let alloc = |len: u64| -> anyhow::Result<CudaSlice<TO>> {
            Ok(stream.alloc_zeros::<TO>(usize::try_from(len)?)?)
        };
        let (scattered, out) = match kind {
            OpKind::ReduceScatter => (
                Some(alloc(mn / u64::from(world))?),
                alloc(mn / u64::from(world))?,
            ),
            _ => (None, alloc(mn)?),
        };
        Ok(Self {
            kind,
            shape,
            world,
            chunks,
            gemm,
            coll,
            side,
            bands: alloc(mn)?,
            scattered,
            out,
        })
    }

    /// Enqueues the op on `stream` (the one it was planned with, checked by the caller).
    pub fn launch<TI: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
    ) -> anyhow::Result<()> {
        let GemmShape { m, n, .. } = self.shape;
        let (m, n, w) = (m as usize, n as usize, (n / self.chunks) as usize);
        let rows = if self.kind == OpKind::ReduceScatter {
            m / self.world as usize
        } else {
            m
        };
        let elem = size_of::<TO>();
        let out = self.out.device_ptr(&self.side).0;
        self.side.context().bind_to_thread()?;
        self.side.join(stream)?;
        for c in 0..self.chunks as usize {
            let mut band = self.bands.slice_mut(c * m * w..(c + 1) * m * w);
            self.gemm
                .launch_columns(a, b, n as u32, (c * w) as u32, &mut band)?;
            self.side.join(stream)?;
            let src = match &mut self.scattered {
                None => {
                    self.coll.all_reduce_in_place(&mut band)?;
                    let (ptr, _read) = band.device_ptr(&self.side);
                    ptr
                }
                Some(scattered) => {
                    let mut mine = scattered.slice_mut(c * rows * w..(c + 1) * rows * w);
                    self.coll.reduce_scatter(&band, &mut mine)?;
                    let (ptr, _read) = mine.device_ptr(&self.side);
                    ptr
                }
            };
            // This band's rows (w wide) into columns [c·w, (c+1)·w) of the output (n wide).
            let copy = band_copy(src, out + (c * w * elem) as u64, w * elem, n * elem, rows);
            // SAFETY: src holds rows × w elements and out rows × n, device memory of the side
            // stream's context that lives as long as self (freed after the streams drained).
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.side.cu_stream()) }
                .result()
                .context("copying a column band into the output")?;
        }
        stream.join(&self.side)?;
        Ok(())
    }

    pub fn output(&self) -> &CudaSlice<TO> {
        &self.out
    }

    /// Waits for both streams; an expired wait of the collective is reported with what it saw.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        self.coll.synchronize()?;
        stream.synchronize()?;
        Ok(())
    }

    /// Collective: frees weft's collectives on every rank (after their stream drained).
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
        Ok(self.coll.free(rdzv)?)
    }
}

/// A device-to-device copy of `rows` rows of `width` bytes, from rows `width` bytes apart to rows
/// `dst_pitch` bytes apart.
fn band_copy(
    src: u64,
    dst: u64,
    width: usize,
    dst_pitch: usize,
    rows: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: width,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: rows,
    }
}
