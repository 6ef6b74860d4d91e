//! GEMM + All-to-All with the rows moved by copy engines (`signal-ce:<waves>`): the signal
//! path's GEMM (each row's subtokens stored into per-group, per-destination pools, [`AllToAllMap`];
//! a counter per wave group) leaving one SM for the group waits, and per group, once its counter
//! is complete, one `cuMemcpyDtoDAsync` per destination from this rank's pool straight into the
//! destination's received buffer (peer memory) — no NCCL, no SM margin for communication. Then the
//! scatter of the received subtokens into the routing's order, as the NCCL signal path does.
//!
//! Per-peer flags (a PGL row of `world` u64 per kind on every rank; flag i written by rank i):
//! `ready` — rank i's copies into this rank's buffer have landed; `free` — rank i has scattered
//! what this rank copied into it, so its buffer may be written again. Both are written to 1 by a
//! stream write (default flags: a memory barrier orders the stream's earlier copies before it)
//! and rearmed to 0 by the one kernel that waits for them (kernels/gemm/peer_flags.cu). The free
//! flags start at 1, so every launch runs the same sequence.
//!
//! Ordering of launch e (compute stream C, side stream S):
//!   C: wait for every peer's `free` (they consumed launch e - 1's copies), rearm;
//!   S joins C (the peer copies follow the `free` wait; and the staging buffer's previous
//!   readers, the copies of e - 1, are done since C joined S);
//!   C: the GEMM (RowSlots layout, group signals, sm_margin 1);
//!   S: per group: the group wait kernel (on the SM the margin leaves; rearms the counter), then
//!      the group's pool for each peer copied into the peer's received buffer;
//!   S: `ready` = 1 on every peer;
//!   C: this rank's own pools copied into its received buffer (after the whole GEMM: a copy
//!      within one GPU may run as a kernel, which would wait for the GEMM's SMs and hold up the
//!      side stream's peer copies behind it);
//!   C joins S; C: wait for every peer's `ready`, rearm; the scatter into the output;
//!   C: `free` = 1 on every peer (this rank's buffer was read).
//! A writer writes a flag again only after the reader's rearm: `ready` for e + 1 after the
//! writer's `free` wait of e + 1, which follows the reader's `free` write of e, which follows its
//! `ready` rearm of e in stream order; the same argument with the roles swapped for `free`.
//! Every wait is a bounded kernel: a peer that never writes its flag is reported by row and rank.
//! Once the `free` wait is enqueued (it rearms the flags), a launch that fails to enqueue the rest
//! marks the op broken: a later launch would wait for flags this one consumed.

use crate::a2a_map::AllToAllMap;
use crate::error::agree;
use crate::error::require;
use crate::error::GemmError;
use crate::gemm::Gemm;
use crate::overlap::comm_stream::high_priority_stream;
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::wave_groups::{GroupCounters, WaveGroups};
use crate::{GemmElement, LaunchExtras};
use anyhow::Context;
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use weft_kernels::abi::{weft_gemm_peer_flags_params, weft_sync_bound};
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{Backend, Pgl, PglElement, Shape};
use weft_sync::{ErrorSlot, WaitBudget};

/// The SMs the GEMM leaves for the group waits.
pub const COPY_ENGINE_SM_MARGIN: u32 = 1;

/// Flag rows of the PGL of flags.
const READY: u32 = 0;
const FREE: u32 = 1;

/// What one rank plans on its own (before the collective allocations).
struct Local {
    gemm: Gemm,
    counters: GroupCounters,
    map: AllToAllMap,
    side: Arc<CudaStream>,
    wait: CudaFunction,
    slot: ErrorSlot,
    bound: weft_sync_bound,
}

/// One rank's GEMM + All-to-All by copy engines for a fixed shape, routing and wave grouping.
pub struct AllToAllCopyEngine<TO: GemmElement + PglElement + ValidAsZeroBits> {
    local: Local,
    staging: CudaSlice<TO>,
    received: Pgl<TO>,
    /// (1, 1, 2, world): row READY and row FREE, flag i written by rank i.
    flags: Pgl<u64>,
    /// Set when a launch failed after its `free` wait was enqueued (counters or flags may be
    /// left un-rearmed): refused from then on.
    broken: AtomicBool,
}

impl<TO: GemmElement + PglElement + ValidAsZeroBits> AllToAllCopyEngine<TO> {
    /// Collective. `routes[s][row]` = the destination of rank s's output row (every rank's, the
    /// same on every rank); `options.sm_margin` and `comm_ctas` must be 0 (the margin is this
    /// method's own); `waves` per group as for the signal path.
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        waves: &[u32],
        routes: &[Vec<u32>],
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let (rank, world) = (rdzv.rank(), rdzv.world());
            let local = agree(
                rdzv,
                "planning the copy-engine All-to-All",
                Self::plan_local(stream, shape, options, waves, routes, rank, world),
            )?;
            let ctx = stream.context();
            let received = Pgl::<TO>::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, 1, local.map.max_received_len().max(1) as u32),
                Backend::default(),
            )
            .context("allocating the copy-engine All-to-All's received buffers")?;
            let flags = Pgl::<u64>::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, 2, world as u32),
                Backend::default(),
            );
            let flags = match flags {
                Ok(f) => f,
                Err(e) => {
                    let e = anyhow::Error::from(e)
                        .context("allocating the copy-engine All-to-All's flags");
                    return Err(match received.free(rdzv) {
                        Ok(()) => e,
                        Err(f) => e.context(format!(
                            "and freeing the received buffers failed too: {f:#}"
                        )),
                    });
                }
            };
            let started = agree(
                rdzv,
                "arming the copy-engine All-to-All's free flags",
                (|| {
                    // Every peer's buffer starts free: the first launch's wait passes as the later ones do.
                    let ones = vec![1u64; world];
                    stream.context().bind_to_thread()?;
                    // SAFETY: row FREE of this rank's flags holds `world` u64; synchronous copy.
                    unsafe {
                        sys::cuMemcpyHtoD_v2(
                            flags.local_ptr() + 8 * world as u64 * u64::from(FREE),
                            ones.as_ptr().cast(),
                            8 * world,
                        )
                    }
                    .result()?;
                    let staging = stream.alloc_zeros::<TO>(local.map.staging_len().max(1))?;
                    stream.synchronize()?;
                    Ok(staging)
                })(),
            );
            let staging = match started {
                Ok(s) => s,
                Err(e) => {
                    let freed = received.free(rdzv).and(flags.free(rdzv));
                    return Err(match freed {
                        Ok(()) => e,
                        Err(f) => e.context(format!("and freeing the buffers failed too: {f:#}")),
                    });
                }
            };
            Ok(Self {
                local,
                staging,
                received,
                flags,
                broken: AtomicBool::new(false),
            })
        })
    }

    fn plan_local(
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        waves: &[u32],
        routes: &[Vec<u32>],
        rank: usize,
        world: usize,
    ) -> anyhow::Result<Local> {
        require!(
            (2..=32).contains(&world),
            Unsupported,
            "the copy-engine All-to-All spans 2 to 32 ranks; this job has {world}"
        );
        require!(
            options.sm_margin == 0 && options.comm_ctas == 0, Options,
            "the copy-engine All-to-All sets its own SM margin ({COPY_ENGINE_SM_MARGIN}); GemmOptions has sm_margin {} and comm_ctas {}",
            options.sm_margin,
            options.comm_ctas
        );
        require!(
            options.beta == 0.0,
            Options,
            "GEMM + All-to-All: beta must be 0"
        );
        let ctx = stream.context();
        require!(
            !ctx.is_event_tracking(), Options,
            "the copy-engine All-to-All needs the context's event tracking off (CudaContext::disable_event_tracking)"
        );
        let options = GemmOptions {
            sm_margin: COPY_ENGINE_SM_MARGIN,
            ..options
        };
        let plan = GemmPlan::new(crate::gemm::device_sms(ctx)?, shape, options)?;
        plan.require_fused_kernel()?;
        let mut gemm = Gemm::from_plan(ctx, plan)?;
        gemm.set_rank(rank);
        let plan = gemm.plan();
        let groups = WaveGroups::new(plan, waves)?;
        let map = AllToAllMap::new(stream, plan, &groups, routes, rank)?;
        map.layout().check(plan)?;
        let counters = GroupCounters::new(stream, groups, rank as u32)?;
        let module = cubins::GEMM_PEER_FLAGS
            .load(ctx)
            .with_context(|| format!("loading {}", cubins::GEMM_PEER_FLAGS.source))?;
        let wait = module
            .load_function("weft_gemm_peer_flags_wait")
            .context("kernels/gemm/peer_flags.cu has no weft_gemm_peer_flags_wait")?;
        let slot = ErrorSlot::new(ctx)?;
        let bound = weft_sync_bound {
            error_slot: slot.device_ptr(ctx)?,
            budget_cycles: WaitBudget::default_for(ctx)?.cycles,
        };
        Ok(Local {
            gemm,
            counters,
            map,
            side: high_priority_stream(ctx)?,
            wait,
            slot,
            bound,
        })
    }

    pub fn gemm(&self) -> &Gemm {
        &self.local.gemm
    }

    pub fn groups(&self) -> &WaveGroups {
        self.local.counters.groups()
    }

    pub fn map(&self) -> &AllToAllMap {
        &self.local.map
    }

    /// Bounds the flag and group waits by `budget`.
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.local.bound.budget_cycles = budget.cycles;
        self.local.counters.set_budget(budget);
    }

    /// out = the rows of every rank's A · B routed to this rank (map().rows() × n), on
    /// `compute`. Enqueues only. Every rank must launch the same number of times.
    pub fn run<TI: GemmElement>(
        &mut self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        out: &mut CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            anyhow::ensure!(
                !self.broken.load(Ordering::Relaxed), "the copy-engine All-to-All: an earlier launch failed after its free wait was enqueued, so its counters or flags may be stale; make a new one"
            );
            // What can be refused is checked before the `free` wait consumes the flags.
            self.local.map.check::<TO>(self.received.len(), out.len())?;
            let GemmShape { m, n, k } = self.local.gemm.plan().shape;
            require!(
                a.len() >= (m * k) as usize && b.len() >= (k * n) as usize, Length,
                "the copy-engine All-to-All {m}x{n}x{k}: A holds {} elements (needs {}), B {} (needs {})",
                a.len(),
                m * k,
                b.len(),
                k * n
            );
            self.wait_flags(compute, FREE)?;
            let enqueued = self.enqueue_after_free(compute, a, b, out);
            if enqueued.is_err() {
                self.broken.store(true, Ordering::Relaxed);
            }
            enqueued
        })
    }

    /// Everything of a launch after its `free` wait (see the module doc).
    fn enqueue_after_free<TI: GemmElement>(
        &mut self,
        compute: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
        out: &mut CudaSlice<TO>,
    ) -> anyhow::Result<()> {
        let side = self.local.side.clone();
        side.join(compute)?;
        let local = &self.local;
        let extras = LaunchExtras {
            groups: Some(&local.counters),
            layout: local.map.layout(),
            row_slots: Some(local.map.row_slots()),
            ..Default::default()
        };
        local
            .gemm
            .launch_with(compute, a, b, &mut self.staging, extras)?;
        self.copy_groups(&side)?;
        self.copy_own(compute)?;
        compute.join(&side)?;
        self.wait_flags(compute, READY)?;
        let (received, len) = (self.received.local_ptr(), self.received.len());
        self.local.map.scatter_from(compute, received, len, out)?;
        self.write_flags(compute, FREE)
    }

    /// On the side stream: per group, its wait, then one copy per peer with rows in it; then
    /// `ready` on every peer.
    fn copy_groups(&self, side: &Arc<CudaStream>) -> anyhow::Result<()> {
        for g in 0..self.groups().count() {
            self.local.counters.wait(side, g)?;
            for q in (0..self.flags.world()).filter(|&q| q != self.flags.rank()) {
                self.copy_pool(side, g, q)?;
            }
        }
        self.write_flags(side, READY)
    }

    /// On `compute`, after the GEMM: this rank's own pools into its received buffer.
    fn copy_own(&self, compute: &Arc<CudaStream>) -> anyhow::Result<()> {
        for g in 0..self.groups().count() {
            self.copy_pool(compute, g, self.flags.rank())?;
        }
        Ok(())
    }

    /// Pool (g, q) of the staging buffer into rank q's received buffer, on `stream`.
    fn copy_pool(&self, stream: &Arc<CudaStream>, g: usize, q: usize) -> anyhow::Result<()> {
        let map = &self.local.map;
        let range = &map.group_ranges(g).0[q];
        if range.is_empty() {
            return Ok(());
        }
        let elem = std::mem::size_of::<TO>() as u64;
        let dst = self.received.peer_ptr(q) + map.push_offset(g, q) as u64 * elem;
        let src = self.staging.device_ptr(stream).0 + range.start as u64 * elem;
        let bytes = range.len() * elem as usize;
        stream.context().bind_to_thread()?;
        // SAFETY: src is this rank's pool (g, q) inside staging; dst the range of rank q's
        // received buffer the map reserves for it (within max_received_len); both alive as long
        // as self; stream-ordered after the group was stored.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.cu_stream()) }
            .result()
            .with_context(|| format!("copying group {g}'s rows for rank {q}"))?;
        Ok(())
    }

    /// Flag `row` = 1 at this rank's index on every peer, on `stream`.
    fn write_flags(&self, stream: &Arc<CudaStream>, row: u32) -> anyhow::Result<()> {
        stream.context().bind_to_thread()?;
        for q in (0..self.flags.world()).filter(|&q| q != self.flags.rank()) {
            let at = self.flags.peer_ptr(q)
                + 8 * (u64::from(row) * self.flags.world() as u64 + self.flags.rank() as u64);
            // SAFETY: one u64 of rank q's flags, mapped here; default flags: a memory barrier
            // orders the stream's earlier work (the copies, the scatter) before the write.
            unsafe {
                sys::cuStreamWriteValue64_v2(
                    stream.cu_stream(),
                    at,
                    1,
                    sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                )
            }
            .result()
            .with_context(|| {
                format!("raising flag row {row} on rank {q} (cuStreamWriteValue64)")
            })?;
        }
        Ok(())
    }

    /// The bounded wait for every peer's flag in `row` (then rearmed), on `stream`.
    fn wait_flags(&self, stream: &Arc<CudaStream>, row: u32) -> anyhow::Result<()> {
        let p = weft_gemm_peer_flags_params {
            flags: self.flags.local_ptr() + 8 * u64::from(row) * self.flags.world() as u64,
            world: self.flags.world() as u32,
            rank: self.flags.rank() as u32,
            row,
            reserved: 0,
            bound: self.local.bound,
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes exactly this struct; the flags outlive the launch.
        unsafe { stream.launch_builder(&self.local.wait).arg(&p).launch(cfg) }
            .with_context(|| format!("launching the wait for the peers' flags (row {row})"))?;
        Ok(())
    }

    /// After synchronising: an error naming a GEMM, group or flag wait that ran past its bound.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.local.gemm.check()?;
            self.local.counters.check()?;
            self.local
                .slot
                .check()
                .context("copy-engine All-to-All flags (row 0: a peer's copies landed; row 1: a peer consumed this rank's copies)")
        })
    }

    /// Collective: frees the received buffers and flags on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let received = self.received.free(rdzv);
            let flags = self.flags.free(rdzv);
            Ok(received.and(flags)?)
        })
    }
}
