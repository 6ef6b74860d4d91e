//! The copy-engine AllGather's host side (`AllGatherMethod::CopyEngine`, as async-TP moves the
//! shards, but into weft's persistent GEMM): the peers' A shards are pulled into the gathered A
//! by copy engines (`cuMemcpyDtoDAsync` from the peers' mappings) on a side stream, a group of
//! `tile_rows` tile rows per copy, each copy followed by a stream write of its group's chunk flag
//! (weft_gemm_ag_copy.flag_rows) to the launch's epoch. The GEMM kernel keeps every SM computing
//! and waits for a group's flag before it loads the group's rows. No SM moves data between GPUs
//! (ranks sharing one GPU copy within it, which the driver may do with a kernel).
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
//!          group: the copy, then the flag write (default flags: a memory barrier makes the
//!          copy's writes visible before the flag);
//!   main:  joins the side stream, so a failed copy surfaces on the caller's stream and nothing
//!          of the op runs past it (the data needs no join: kernel e ends only after it saw
//!          every flag, so after every copy).
//! The side stream's wait on START has no bound of its own. What waits on it: the kernel's loader
//! (its polls of the chunk flags are bounded and report the tile row they waited for, failing the
//! context, which ends the side stream too) and the main stream's join, which therefore ends
//! with the kernel's bound as well. The kernel's END (every rank's loads
//! done) follows every group's flag, so every copy out of the peers' shards: a peer writes its
//! next shard only after them.

use anyhow::{ensure, Context};
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::Arc;

/// Where the copies of one launch go; built by the fused AllGather from its buffers.
pub(super) struct CopyEngineLaunch<'a> {
    /// Every rank's shard as mapped here (this rank's is not copied).
    pub shards: &'a [u64],
    /// The gathered A (m × k) and its chunk flags (one u64 per tile row).
    pub gathered: u64,
    pub chunk_flags: u64,
    /// Bytes of one tile row of A (tile_m rows × k elements).
    pub tile_row_bytes: u64,
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
}

impl CopyEngineGather {
    /// `tile_rows`: tile rows of a shard per copy (and per flag), at least 1.
    pub fn new(ctx: &Arc<CudaContext>, tile_rows: u32) -> anyhow::Result<Self> {
        ensure!(
            tile_rows >= 1,
            "the copy-engine AllGather copies at least one tile row at a time"
        );
        let side = ctx
            .new_stream()
            .context("creating the copy-engine AllGather's stream")?;
        Ok(Self { side, tile_rows })
    }

    pub fn tile_rows(&self) -> u32 {
        self.tile_rows
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
    ) -> anyhow::Result<()> {
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
        .context("the copy-engine AllGather's wait for every rank's START (cuStreamWaitValue64)")?;
        for q in (1..world).map(|i| (rank + i) % world) {
            let mut first = 0;
            while first < own {
                let rows = self.tile_rows.min(own - first);
                let tm = u64::from(q as u32 * own + first);
                let src = l.shards[q] + u64::from(first) * l.tile_row_bytes;
                let dst = l.gathered + tm * l.tile_row_bytes;
                let bytes = u64::from(rows) * l.tile_row_bytes;
                // SAFETY: src is rank q's shard (own tile rows), dst the gathered A (world × own
                // tile rows), both alive as long as the op; stream-ordered after the START wait.
                unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes as usize, side) }
                    .result()
                    .with_context(|| format!("copying tile rows {tm}.. of rank {q}'s A shard"))?;
                // SAFETY: the group's flag, one u64 of the op's chunk flags.
                unsafe {
                    sys::cuStreamWriteValue64_v2(
                        side,
                        l.chunk_flags + tm * 8,
                        l.flag_target,
                        sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                    )
                }
                .result()
                .context("raising a copied chunk's flag (cuStreamWriteValue64)")?;
                first += rows;
            }
        }
        main.join(&self.side)
            .context("ordering the caller's stream after the copy-engine AllGather's copies")
    }
}
