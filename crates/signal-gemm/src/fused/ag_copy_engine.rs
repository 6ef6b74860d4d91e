//! The copy-engine AllGather's host side (`AllGatherMethod::CopyEngine`, as async-TP moves the
//! shards, but into weft's persistent GEMM): the peers' A shards are pulled into the gathered A
//! by copy engines (`cuMemcpyDtoDAsync` from the peers' mappings) on a side stream, a group of
//! `tile_rows` tile rows per copy, each copy followed by a stream write of its group's chunk flag
//! (weft_gemm_ag_copy.flag_rows) to the launch's epoch. With `k_chunks` > 1 each group is copied
//! as that many column chunks along K (`cuMemcpy2DAsync`, the rows' pitch), in K order, each with
//! its own flag (weft_gemm_ag_copy.k_chunks): a tile of the group starts once the first chunk has
//! landed. The GEMM kernel keeps every SM computing and waits for a chunk's flag before it loads
//! from it. No SM moves data between GPUs (ranks sharing one GPU copy within it, which the driver
//! may do with a kernel).
//!
//! One side stream takes every peer, in the order the schedule reads their rows: with a stream
//! per peer (0da4af6, pulls from every peer at once) the method ran up to 1.87× slower on four
//! H200s (faster only at 512 rows, one wave) — the shards shared the gather's bandwidth, so the
//! rows the schedule needs first came later
//! (results/overlap-all-gather/k-chunks-nvidia-h200-x4-2026-11-27/).
//!
//! Orderings, launch e:
//!   main:  kernel e, whose CTAs arrive at START on every rank as they begin;
//!   side:  waits for this rank's START counter to hold world × ctas × e: every rank's kernel e
//!          began, so every shard of e is written (each rank writes its shard before its kernel,
//!          and its START adds are releases), and this rank's kernel e - 1, which read the
//!          gathered A and the flags, has ended (kernel e follows it on the main stream). The
//!          target cannot be reached without this rank's CTAs of e: a peer's CTAs of e + 1 arrive
//!          only after its kernel e ended, which needs every END arrival of e, and each CTA
//!          arrives at START before END (the same thread, kernel.cuh). Then per
//!          group (per K chunk of it with K chunks): the copy, then the flag write (default
//!          flags: a memory barrier makes the copy's writes visible before the flag);
//!   main:  joins the side stream, so a failed copy surfaces on the caller's stream and nothing
//!          of the op runs past it (the data needs no join: kernel e ends only after it saw
//!          every flag, so after every copy).
//! The side stream's wait on START has no bound of its own. What waits on it: the kernel's loader
//! (its polls of the chunk flags are bounded and report the tile row and K chunk they waited
//! for, failing the context, which ends the side stream too) and the main stream's join, which therefore ends
//! with the kernel's bound as well. The kernel's END (every rank's loads
//! done) follows every group's flag, so every copy out of the peers' shards: a peer writes its
//! next shard only after them.

use crate::error::require;
use crate::error::GemmError;
use anyhow::Context;
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::Arc;
use weft_kernels::abi::{WEFT_GEMM_TILE_K, WEFT_GEMM_TILE_M};

/// Where the copies of one launch go; built by the fused AllGather from its buffers.
pub(super) struct CopyEngineLaunch<'a> {
    /// Every rank's shard as mapped here (this rank's is not copied).
    pub shards: &'a [u64],
    /// The gathered A (m × k) and its chunk flags (one u64 per tile row and K chunk).
    pub gathered: u64,
    pub chunk_flags: u64,
    /// Bytes of one tile row of A (tile_m rows × k elements).
    pub tile_row_bytes: u64,
    /// Bytes of one row of A (k elements) and of one K chunk of it (the last chunk may be
    /// shorter): [`CopyEngineGather::k_chunk_bytes`].
    pub row_bytes: u64,
    pub k_chunk_bytes: u64,
    /// This rank's START counter and the value it holds once every rank's kernel began.
    pub start_counter: u64,
    pub start_target: u64,
    /// The value a copied group's flag takes in this launch.
    pub flag_target: u64,
}

/// The side stream and the grouping of the copy-engine AllGather.
pub(super) struct CopyEngineGather {
    side: Arc<CudaStream>,
    tile_rows: u32,
    /// K blocks (of WEFT_GEMM_TILE_K) per chunk, and the chunks that makes (1: all of K at once).
    k_chunk_blocks: u32,
    k_chunks: u32,
}

impl CopyEngineGather {
    /// `tile_rows`: tile rows of a shard per copy (and per flag), at least 1; `k_chunks`: column
    /// chunks per group along K, at least 1 and at most `k_blocks` (K blocks of the GEMM's main
    /// loop: chunks are whole K blocks, the last may be shorter; counts whole blocks do not make
    /// exactly are refused, [`k_chunks_fit`]).
    pub fn new(
        ctx: &Arc<CudaContext>,
        tile_rows: u32,
        k_chunks: u32,
        k_blocks: u32,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            require!(
                tile_rows >= 1,
                Options,
                "the copy-engine AllGather copies at least one tile row at a time"
            );
            require!(
                (1..=k_blocks).contains(&k_chunks), Shape,
                "the copy-engine AllGather cuts K into 1 to {k_blocks} chunks (its K blocks of {WEFT_GEMM_TILE_K}); asked for {k_chunks}"
            );
            let k_chunk_blocks = k_blocks.div_ceil(k_chunks);
            require!(
                k_chunks_fit(k_blocks, k_chunks), Shape,
                "the copy-engine AllGather cuts K into chunks of whole K blocks ({WEFT_GEMM_TILE_K} columns): {k_blocks} blocks make {} chunks of {k_chunk_blocks}, not {k_chunks}",
                k_blocks.div_ceil(k_chunk_blocks)
            );
            let side = ctx
                .new_stream()
                .context("creating the copy-engine AllGather's stream")?;
            Ok(Self {
                side,
                tile_rows,
                k_chunk_blocks,
                k_chunks,
            })
        })
    }

    pub fn tile_rows(&self) -> u32 {
        self.tile_rows
    }

    /// Chunks per group along K (flags per tile row of A), and K blocks per chunk.
    pub fn k_chunks(&self) -> u32 {
        self.k_chunks
    }
    pub fn k_chunk_blocks(&self) -> u32 {
        self.k_chunk_blocks
    }

    /// Bytes of a row's K chunk, for `element_bytes`-byte elements.
    pub fn k_chunk_bytes(&self, element_bytes: u64) -> u64 {
        u64::from(self.k_chunk_blocks) * u64::from(WEFT_GEMM_TILE_K) * element_bytes
    }

    /// After the kernel: enqueues the START wait, the copies and the flag writes on the side
    /// stream, then makes `main` wait for them. `own` tile rows per shard, the peers' taken in
    /// the order the rotated schedule reads them (from the shard after `rank`'s on).
    pub fn copy(
        &self,
        main: &Arc<CudaStream>,
        l: &CopyEngineLaunch<'_>,
        rank: usize,
        own: u32,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let side = self.side.cu_stream();
            let world = l.shards.len();
            main.context().bind_to_thread()?;
            // SAFETY: the counter is this rank's, alive as long as the op; a stream operation.
            unsafe {
                sys::cuStreamWaitValue64_v2(
                    side,
                    l.start_counter,
                    l.start_target,
                    sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
            }
            .result()
            .context(
                "the copy-engine AllGather's wait for every rank's START (cuStreamWaitValue64)",
            )?;
            for q in (1..world).map(|i| (rank + i) % world) {
                let mut first = 0;
                while first < own {
                    let rows = self.tile_rows.min(own - first);
                    let tm = u64::from(q as u32 * own + first);
                    let src = l.shards[q] + u64::from(first) * l.tile_row_bytes;
                    let dst = l.gathered + tm * l.tile_row_bytes;
                    for chunk in 0..self.k_chunks {
                        if self.k_chunks == 1 {
                            let bytes = u64::from(rows) * l.tile_row_bytes;
                            // SAFETY: src is rank q's shard (own tile rows), dst the gathered A (world
                            // × own tile rows), both alive as long as the op; stream-ordered after the
                            // START wait.
                            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes as usize, side) }
                                .result()
                                .with_context(|| {
                                    format!("copying tile rows {tm}.. of rank {q}'s A shard")
                                })?;
                        } else {
                            let at = u64::from(chunk) * l.k_chunk_bytes;
                            let width = l.k_chunk_bytes.min(l.row_bytes - at);
                            let copy = columns_copy(
                                src + at,
                                dst + at,
                                l.row_bytes,
                                width,
                                u64::from(rows) * u64::from(WEFT_GEMM_TILE_M),
                            );
                            // SAFETY: columns [at, at + width) of the group's rows, inside rank q's
                            // shard and the gathered A (as above; at + width <= row_bytes).
                            unsafe { sys::cuMemcpy2DAsync_v2(&copy, side) }
                                .result()
                                .with_context(|| {
                                    format!("copying K chunk {chunk} of tile rows {tm}.. of rank {q}'s A shard")
                                })?;
                        }
                        // SAFETY: the chunk's flag, one u64 of the op's chunk flags (tile rows ×
                        // k_chunks of them).
                        unsafe {
                            sys::cuStreamWriteValue64_v2(
                                side,
                                l.chunk_flags + (tm * u64::from(self.k_chunks) + u64::from(chunk)) * 8,
                                l.flag_target,
                                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                            )
                        }
                        .result()
                        .with_context(|| {
                            format!("raising the flag of K chunk {chunk} of tile rows {tm}.. of rank {q}'s A shard (cuStreamWriteValue64)")
                        })?;
                    }
                    first += rows;
                }
            }
            main.join(&self.side)
                .context("ordering the caller's stream after the copy-engine AllGather's copies")
        })
    }
}

/// Whether `k_blocks` K blocks cut into exactly `k_chunks` chunks of whole blocks, all but the
/// last ceil(k_blocks / k_chunks) long (10 blocks make 5 chunks of 2, not 8: refused).
pub(crate) fn k_chunks_fit(k_blocks: u32, k_chunks: u32) -> bool {
    (1..=k_blocks).contains(&k_chunks) && k_blocks.div_ceil(k_blocks.div_ceil(k_chunks)) == k_chunks
}

/// A device-to-device copy of `width` bytes of each of `rows` rows, both sides `pitch` bytes apart.
fn columns_copy(src: u64, dst: u64, pitch: u64, width: u64, rows: u64) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: pitch as usize,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: pitch as usize,
        WidthInBytes: width as usize,
        Height: rows as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::k_chunks_fit;

    #[test]
    fn k_chunks_fit_only_where_whole_blocks_make_that_many() {
        assert!(
            k_chunks_fit(128, 8) && k_chunks_fit(3, 2) && k_chunks_fit(5, 3) && k_chunks_fit(4, 1)
        );
        // 10 blocks in chunks of 2 are 5 chunks; 4 blocks in chunks of 2 are 2.
        assert!(!k_chunks_fit(10, 8) && !k_chunks_fit(4, 3));
        assert!(!k_chunks_fit(4, 0) && !k_chunks_fit(4, 5));
    }
}
