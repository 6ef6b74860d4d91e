//! GEMM + All-to-All fused into the GEMM kernel (WEFT_GEMM_LAYOUT_PEER_ROWS, abi/gemm.h): the
//! epilogue stores each row of this rank's product straight into its destination's output —
//! its own, or a peer's through peer memory — at the row the routing gives it there (every
//! source's rows in turn, each source's rows ascending). No pools, no copies, no NCCL, no second
//! stream, no SM set aside: DeepEP's intranode dispatch written by the GEMM's own epilogue.
//!
//! The kernel's START / END barriers (kernels/include/weft/gemm/peer_reduce.cuh) order it across
//! ranks: a rank's first store waits until every rank's stream has reached the launch (so what
//! read each output before it has run), and this rank's output is complete when its kernel ends.
//! Every rank's kernel must run at the same time (bounded waits): all of a rank's CTAs must be
//! resident, so ranks that share a GPU must leave each other room.

use super::collective_plan::{
    agree_on_plan, check_resident, peer_barrier_counters, synchronize_checked, with_failed_free,
};
use crate::dtype::GemmElement;
use crate::error::agree;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::gemm::{Gemm, LaunchExtras, PeerRowsTarget};
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::reorder::{OutputLayout, MAX_BAND_RANKS};
use anyhow::Context;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use weft_kernels::abi::{
    WEFT_GEMM_PEER_BAR_END, WEFT_GEMM_PEER_BAR_START, WEFT_GEMM_PEER_ROW_BITS,
    WEFT_GEMM_PEER_ROW_MASK,
};
use weft_pgl::Bootstrap;
use weft_pgl::{Backend, Pgl, PglElement, Shape};
use weft_sync::{Counters, WaitBudget};

/// Where each row of `rank`'s product goes, as the kernel reads it: its destination rank in the
/// high bits, its row in the destination's output in the low ones (every source's rows in turn,
/// rows ascending); and the rows each rank receives. `routes[s][i]` is the destination of rank
/// s's row i (every rank's routing).
pub(crate) fn peer_row_table(
    routes: &[Vec<u32>],
    rank: usize,
) -> anyhow::Result<(Vec<u32>, Vec<u32>)> {
    let world = routes.len();
    // At most 8 ranks (the fused methods' limit) also keeps every entry below WEFT_GEMM_NO_SLOT.
    require!(
        (1..=MAX_BAND_RANKS as usize).contains(&world),
        Unsupported,
        "the fused All-to-All spans 1 to {MAX_BAND_RANKS} ranks: rank {rank} of {world} routings"
    );
    require!(
        rank < world,
        Options,
        "the fused All-to-All: rank {rank} of {world} routings"
    );
    // received[d]: rows routed to d; first[d]: those from sources before `rank`.
    let (mut received, mut first) = (vec![0u64; world], vec![0u64; world]);
    for (s, r) in routes.iter().enumerate() {
        for (i, &d) in r.iter().enumerate() {
            require!(
                (d as usize) < world, Options,
                "the fused All-to-All: rank {s} routes row {i} to rank {d}, but there are {world} ranks"
            );
            received[d as usize] += 1;
            if s < rank {
                first[d as usize] += 1;
            }
        }
    }
    let most = received.iter().copied().max().unwrap_or(0);
    require!(
        most <= u64::from(WEFT_GEMM_PEER_ROW_MASK) + 1,
        Shape,
        "the fused All-to-All: a rank receives {most} rows, at most {} are addressed",
        u64::from(WEFT_GEMM_PEER_ROW_MASK) + 1
    );
    let mut next = first;
    let table = routes[rank]
        .iter()
        .map(|&d| {
            let row = next[d as usize] as u32;
            next[d as usize] += 1;
            (d << WEFT_GEMM_PEER_ROW_BITS) | row
        })
        .collect();
    Ok((table, received.into_iter().map(|r| r as u32).collect()))
}

/// One rank's fused GEMM + All-to-All for a fixed shape, world and routing.
pub struct FusedAllToAll<T: GemmElement + PglElement> {
    gemm: Gemm,
    /// Every rank's output, `capacity` rows × n (the most rows any rank receives).
    out: Pgl<T>,
    /// Each rank's output address as mapped here (u64 per rank), read by the kernel.
    ptrs: CudaSlice<u64>,
    /// peer_row_table of this rank (u32 per row of A).
    table: CudaSlice<u32>,
    bar: Counters,
    ranks: u32,
    /// Rows this rank receives, and the rows of every rank's buffer.
    rows: u32,
    capacity: u32,
}

impl<T: GemmElement + PglElement> FusedAllToAll<T> {
    /// Collective over `rdzv`'s ranks: plans the GEMM (the same on every rank, refused on every
    /// rank if any rank refuses), allocates every rank's output, the row table and the barrier
    /// counters. `routes[s][i]` = the destination of rank s's row i (every rank's routing, the
    /// same on every rank). `options.output` must be T; beta must be 0.
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        routes: &[Vec<u32>],
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let world = rdzv.world();
            let ranks = u32::try_from(world).unwrap_or(u32::MAX);
            let rank = rdzv.rank();
            let what = "fused GEMM + All-to-All";
            let local = agree(
                rdzv,
                "fused GEMM + All-to-All plan",
                Self::plan_local(ctx, shape, options, routes, rank, ranks),
            )?;
            let (gemm, table, received) = local;
            // The routing enters the plan every rank must share (a rank with another routing would
            // put rows where its peers do not expect them).
            let mut digest = crc32fast::Hasher::new();
            for d in routes.iter().flatten() {
                digest.update(&d.to_le_bytes());
            }
            let describe = format!(
                "{} routing {:08x}",
                gemm.plan().describe(),
                digest.finalize()
            );
            agree_on_plan(rdzv, what, &describe)?;
            check_resident(rdzv, ctx, what, gemm.plan().ctas())?;
            let capacity = received.iter().copied().max().unwrap_or(0);
            let out = Pgl::<T>::alloc(
                rdzv,
                ctx,
                Shape::new(1, 1, capacity.max(1), shape.n),
                Backend::default(),
            )
            .context("allocating the fused All-to-All's outputs")?;
            let uploaded = agree(rdzv, "fused All-to-All row table", {
                let ptrs: Vec<u64> = (0..world).map(|r| out.peer_ptr(r)).collect();
                (|| {
                    let ptrs = stream.clone_htod(&ptrs)?;
                    let table = stream.clone_htod(&table)?;
                    stream.synchronize()?;
                    Ok((ptrs, table))
                })()
            });
            let (ptrs, table) = match uploaded {
                Ok(u) => u,
                Err(e) => {
                    return Err(with_failed_free(
                        e,
                        out.free(rdzv).map_err(anyhow::Error::from),
                    ))
                }
            };
            let bar = match peer_barrier_counters(rdzv, ctx, what) {
                Ok(b) => b,
                Err(e) => {
                    return Err(with_failed_free(
                        e,
                        out.free(rdzv).map_err(anyhow::Error::from),
                    ))
                }
            };
            Ok(Self {
                gemm,
                out,
                ptrs,
                table,
                bar,
                ranks,
                rows: received[rank],
                capacity,
            })
        })
    }

    #[allow(clippy::type_complexity)]
    fn plan_local(
        ctx: &Arc<CudaContext>,
        shape: GemmShape,
        options: GemmOptions,
        routes: &[Vec<u32>],
        rank: usize,
        ranks: u32,
    ) -> anyhow::Result<(Gemm, Vec<u32>, Vec<u32>)> {
        require!(
            (1..=MAX_BAND_RANKS).contains(&ranks),
            Unsupported,
            "the fused All-to-All spans 1 to {MAX_BAND_RANKS} ranks; this job has {ranks}"
        );
        require!(
            routes.len() == ranks as usize,
            Options,
            "the fused All-to-All: {} routings for {ranks} ranks (every rank's, on every rank)",
            routes.len()
        );
        if let Some((s, r)) = routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() != shape.m as usize)
        {
            refuse!(
                Length,
                "the fused All-to-All: rank {s}'s routing has {} rows, M is {}",
                r.len(),
                shape.m
            );
        }
        require!(
            options.output == <T as GemmElement>::DTYPE, Options,
            "fused All-to-All of {} elements planned with a {} GEMM output (GemmOptions::output must match)",
            <T as GemmElement>::DTYPE,
            options.output
        );
        require!(
            options.beta == 0.0,
            Options,
            "the fused All-to-All stores rows into other ranks' outputs: beta must be 0, have {}",
            options.beta
        );
        require!(
            options.comm_ctas == 0,
            Options,
            "the fused All-to-All has no communicator CTAs (comm_ctas must be 0)"
        );
        let (table, received) = peer_row_table(routes, rank)?;
        let capacity = received.iter().copied().max().unwrap_or(0);
        let plan = GemmPlan::new(crate::gemm::device_sms(ctx)?, shape, options)?;
        plan.require_fused_kernel()?;
        OutputLayout::PeerRows {
            ranks,
            rows: capacity,
        }
        .check(&plan)?;
        Ok((Gemm::from_plan(ctx, plan)?, table, received))
    }

    pub fn gemm(&self) -> &Gemm {
        &self.gemm
    }

    pub fn plan(&self) -> &GemmPlan {
        self.gemm.plan()
    }

    /// Rows this rank receives (its output is rows() × n, row-major, in `output`'s buffer).
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// This rank's output buffer (rows() × n valid, of capacity for the most any rank receives),
    /// valid once `run`'s kernel has finished.
    pub fn output(&self) -> &Pgl<T> {
        &self.out
    }

    /// Bounds the kernel's cross-rank barrier waits (default: weft-sync's default budget).
    pub fn set_budget(&mut self, budget: WaitBudget) {
        self.bar.set_budget(budget);
    }

    /// Enqueues this rank's GEMM, each row stored into its destination's output, on `stream`.
    /// Every rank must call it (the same number of times): the kernel waits for every rank's
    /// CTAs. The previous run's output is overwritten; read it (stream-ordered) before the next
    /// run.
    pub fn run<TI: GemmElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<TI>,
        b: &CudaSlice<TI>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                Arc::ptr_eq(stream.context(), self.out.context()),
                Options,
                "the fused All-to-All was made on another context than the stream's"
            );
            let (a_ptr, _ra) = a.device_ptr(stream);
            let target = PeerRowsTarget {
                ptrs: self.ptrs.device_ptr(stream).0,
                table: self.table.device_ptr(stream).0,
                table_rows: u32::try_from(self.table.len()).unwrap_or(u32::MAX),
                bar: self.bar.device()?,
                epoch: self.bar.epoch() + 1,
            };
            let extras = LaunchExtras::<T> {
                layout: OutputLayout::PeerRows {
                    ranks: self.ranks,
                    rows: self.capacity,
                },
                peer_rows: Some(target),
                ..Default::default()
            };
            // SAFETY: the PGL's own buffer holds capacity × n elements of T (the layout's element
            // count), every peer's as much (peer_row_table's rows stay below each one's received
            // count, at most capacity); all live as long as self; the caller orders its reads of the
            // output on the stream.
            unsafe {
                self.gemm.launch_into(
                    stream,
                    (a_ptr, a.len()),
                    b,
                    self.out.local_ptr(),
                    self.out.len(),
                    extras,
                )?
            };
            // Counted only once enqueued: a refused launch leaves the epoch where the device is.
            self.bar.begin(1);
            Ok(())
        })
    }

    /// After synchronising: an error naming a GEMM pipeline wait or a cross-rank barrier
    /// (START: a rank never reached the launch; END: a rank's stores not finished) that ran past
    /// its bound.
    pub fn check(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.gemm.check()?;
            self.check_barriers()
        })
    }

    fn check_barriers(&self) -> anyhow::Result<()> {
        self.bar.check().with_context(|| {
            format!(
                "fused All-to-All barrier (counter row {WEFT_GEMM_PEER_BAR_START}: every rank reached the launch; row {WEFT_GEMM_PEER_BAR_END}: every rank's stores done)"
            )
        })
    }

    /// Waits for `stream`; an error names any wait of the kernel that ran past its bound (the
    /// report survives the trap that stopped the kernel), else the driver's error, if any.
    pub fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            synchronize_checked(stream, "the fused GEMM + All-to-All", || {
                vec![
                    self.gemm.check().map_err(anyhow::Error::from),
                    self.check_barriers(),
                ]
            })
        })
    }

    /// Collective: frees the outputs and counters on every rank.
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let out = self.out.free(rdzv).map_err(anyhow::Error::from);
            let bar = self.bar.free(rdzv).map_err(anyhow::Error::new);
            out.and(bar)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output row j of rank d comes from (s, i): every source's rows routed to d in turn, rows
    /// ascending — written from the definition, not from the table.
    fn sources_of(routes: &[Vec<u32>], d: u32) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (s, r) in routes.iter().enumerate() {
            for (i, &to) in r.iter().enumerate() {
                if to == d {
                    out.push((s, i));
                }
            }
        }
        out
    }

    #[test]
    fn every_row_lands_where_its_destination_expects_it() {
        let routes = vec![
            vec![1, 0, 1, 1, 2],
            vec![0, 1, 1, 0, 0],
            vec![2, 2, 0, 1, 1],
        ];
        let tables: Vec<_> = (0..3)
            .map(|s| peer_row_table(&routes, s).unwrap())
            .collect();
        for d in 0..3u32 {
            let expect = sources_of(&routes, d);
            assert_eq!(tables[0].1[d as usize] as usize, expect.len());
            for (j, &(s, i)) in expect.iter().enumerate() {
                let v = tables[s].0[i];
                assert_eq!(v >> WEFT_GEMM_PEER_ROW_BITS, d, "rank {s} row {i}");
                assert_eq!(
                    (v & WEFT_GEMM_PEER_ROW_MASK) as usize,
                    j,
                    "rank {s} row {i}"
                );
            }
        }
    }

    mod hostile {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2048))]
            /// Any routing (0 to 10 ranks, routings of any length, destinations past the world):
            /// `peer_row_table` never panics; it accepts only 1 to 8 ranks with every destination
            /// inside the world, and then, over every rank's table, each destination's rows are
            /// exactly 0 .. the rows routed to it, each once: no row lands outside a destination's
            /// received rows, none is written twice.
            #[test]
            fn every_accepted_table_fills_each_destination_exactly(
                routes in (0u32..10).prop_flat_map(|world| {
                    // Mostly destinations inside the world, now and then one past it.
                    let dest = prop_oneof![12 => 0..world.max(1), 1 => 0u32..12];
                    prop::collection::vec(prop::collection::vec(dest, 0..12), world as usize)
                }),
                rank in 0usize..10
            ) {
                let world = routes.len();
                let got = peer_row_table(&routes, rank);
                let valid = (1..=8).contains(&world)
                    && rank < world
                    && routes.iter().flatten().all(|&d| (d as usize) < world);
                prop_assert_eq!(got.is_ok(), valid);
                if !valid {
                    // Too many ranks: what the method cannot do; else a bad argument.
                    let kind = GemmError::from_anyhow(got.unwrap_err());
                    if (1..=8).contains(&world) {
                        prop_assert!(matches!(kind, GemmError::Options(_)), "{:?}", kind);
                    } else {
                        prop_assert!(matches!(kind, GemmError::Unsupported(_)), "{:?}", kind);
                    }
                    return Ok(());
                }
                let mut seen: Vec<Vec<bool>> = (0..world as u32)
                    .map(|d| vec![false; routes.iter().flatten().filter(|&&x| x == d).count()])
                    .collect();
                for s in 0..world {
                    let (table, received) = peer_row_table(&routes, s).unwrap();
                    prop_assert_eq!(table.len(), routes[s].len());
                    for (d, r) in received.iter().enumerate() {
                        prop_assert_eq!(*r as usize, seen[d].len());
                    }
                    for (i, v) in table.iter().enumerate() {
                        let d = (v >> WEFT_GEMM_PEER_ROW_BITS) as usize;
                        let row = (v & WEFT_GEMM_PEER_ROW_MASK) as usize;
                        prop_assert_eq!(d as u32, routes[s][i]);
                        prop_assert!(row < seen[d].len(), "rank {} row {} past destination {}'s rows", s, i, d);
                        prop_assert!(!seen[d][row], "destination {} row {} written twice", d, row);
                        seen[d][row] = true;
                    }
                }
                prop_assert!(seen.iter().flatten().all(|&b| b));
            }
        }
    }

    #[test]
    fn a_bad_routing_is_named() {
        let e = peer_row_table(&[vec![0, 3], vec![1, 1]], 0).unwrap_err();
        assert!(format!("{e:#}").contains("routes row 1 to rank 3"), "{e:#}");
    }
}
