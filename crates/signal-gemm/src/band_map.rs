//! The ReduceScatter reorder map's other end. A GEMM stored with [`OutputLayout::RankBands`] and
//! reduce-scattered group by group ([`RankBandMap::group_ranges`]) leaves on rank r band r of every
//! tile, band r of the tile of order o in slot o of the *received* buffer. [`RankBandMap::restore`]
//! turns that into rank r's rows in the standard row-major layout.
//!
//! Layout difference from NCCL: ncclReduceScatter of the standard m × n output gives rank r the
//! contiguous rows [r·m/W, (r+1)·m/W). Here rank r owns, in every 128-row tile row tm, the rows
//! tm·128 + band_start(r) + [0, band_len(r)) (bands of 8-row atoms, see
//! [`OutputLayout::RankBands`]): whole rows, m/W of them when W divides 16 and 128 divides m
//! (for W = 3: 48, 40 and 40 of every 128), returned contiguous and in increasing row order;
//! [`RankBandMap::global_row`] names the standard row of each.

use crate::dtype::GemmElement;
use crate::error::require;
use crate::error::GemmError;
use crate::plan::GemmPlan;
use crate::reorder::{OutputLayout, Restore, SlotGeometry, SlotRestore};
use cudarc::driver::{CudaSlice, CudaStream};
use std::ops::Range;
use std::sync::Arc;
use weft_kernels::abi::{weft_gemm_band_len, weft_gemm_band_start};

/// Which rows rank `rank` owns under the RANK_BANDS layout of a plan.
#[derive(Clone, Copy, Debug)]
struct BandGeometry {
    tile_m: u32,
    band_rows: u32,
    band_start: u32,
    band_len: u32,
    rows: u32,
}

impl BandGeometry {
    fn new(plan: &GemmPlan, ranks: u32, rank: u32) -> anyhow::Result<Self> {
        let layout = OutputLayout::RankBands { ranks };
        layout.check(plan)?;
        require!(
            rank < ranks,
            Options,
            "rank-bands map: rank {rank} of {ranks} ranks"
        );
        let (tile_m, m) = (plan.tile_m(), plan.shape.m);
        let band_rows = layout.band_rows(plan);
        // SAFETY: pure functions.
        let (band_start, band_len) = unsafe {
            (
                weft_gemm_band_start(ranks, rank),
                weft_gemm_band_len(ranks, rank),
            )
        };
        // Every tile row but a ragged last one gives band_len rows.
        let rows = (0..plan.tiles_m())
            .map(|t| m.saturating_sub(t * tile_m + band_start).min(band_len))
            .sum();
        Ok(Self {
            tile_m,
            band_rows,
            band_start,
            band_len,
            rows,
        })
    }

    fn global_row(&self, i: u32) -> u32 {
        (i / self.band_len) * self.tile_m + self.band_start + i % self.band_len
    }
}

/// Rank `rank`'s side of a plan's RANK_BANDS layout for `ranks` ranks.
pub struct RankBandMap {
    slots: SlotRestore,
    plan: GemmPlan,
    ranks: u32,
    geo: BandGeometry,
}

impl RankBandMap {
    /// The map of `plan` for rank `rank` of `ranks` (the table uploaded on `stream`).
    pub fn new(
        stream: &Arc<CudaStream>,
        plan: &GemmPlan,
        ranks: u32,
        rank: u32,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let geo = BandGeometry::new(plan, ranks, rank)?;
            Ok(Self {
                slots: SlotRestore::new(stream, plan)?,
                plan: plan.clone(),
                ranks,
                geo,
            })
        })
    }

    pub fn layout(&self) -> OutputLayout {
        OutputLayout::RankBands { ranks: self.ranks }
    }

    /// Elements of the received buffer: one band slot (the largest band's rows × tile_n) per order.
    pub fn received_len(&self) -> usize {
        self.plan.orders() as usize * (self.geo.band_rows * self.plan.tile_n()) as usize
    }

    /// Rows this rank owns: the restored output is rows() × n.
    pub fn rows(&self) -> u32 {
        self.geo.rows
    }

    /// The standard-layout row of output row `i` (< rows()).
    pub fn global_row(&self, i: u32) -> u32 {
        self.geo.global_row(i)
    }

    /// For a wave group's `orders` (`WaveGroups::orders(g)` of the groups the GEMM ran with):
    /// its element range in the RANK_BANDS buffer (the ReduceScatter's send, `ranks` equal
    /// parts) and in the received buffer (the receive).
    pub fn group_ranges(&self, orders: Range<u32>) -> (Range<usize>, Range<usize>) {
        group_ranges(
            orders,
            self.ranks,
            (self.geo.band_rows * self.plan.tile_n()) as usize,
        )
    }

    fn geometry(&self) -> SlotGeometry {
        SlotGeometry {
            rows: self.geo.rows,
            tile_rows: self.geo.band_len,
            slot_rows: self.geo.band_rows,
        }
    }

    /// Refuses what [`restore`](Self::restore) would refuse, given the buffers' lengths.
    pub fn check<T: GemmElement>(
        &self,
        received_len: usize,
        dst_len: usize,
        step: &Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.slots
                .check::<T>(
                    "rank-bands",
                    self.geometry(),
                    self.received_len() as u64,
                    received_len,
                    dst_len,
                    step,
                )
                .map_err(anyhow::Error::from)
        })
    }

    /// `dst` (rows() × n, standard row order) from `received`, with `step` fused.
    pub fn restore<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        received: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        step: Restore<'_>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            self.check::<T>(received.len(), dst.len(), &step)?;
            self.slots
                .launch(stream, self.geometry(), received, dst, step)
                .map_err(anyhow::Error::from)
        })
    }
}

/// A group's send range (its orders' slots of every band: `ranks` parts, part r = band r of each
/// order) and receive range (one slot per order), in elements of `slot` per slot.
fn group_ranges(orders: Range<u32>, ranks: u32, slot: usize) -> (Range<usize>, Range<usize>) {
    let (start, end) = (orders.start as usize, orders.end as usize);
    let w = ranks as usize;
    (start * w * slot..end * w * slot, start * slot..end * slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GemmOptions, GemmShape};

    /// Every standard row belongs to exactly one rank's bands (a partition of 0..m), in
    /// increasing order per rank, for ragged m and every world size.
    #[test]
    fn bands_partition_the_rows() {
        for m in [16u32, 112, 128, 208, 1008, 4096] {
            let plan =
                GemmPlan::new(132, GemmShape::new(m, 256, 64), GemmOptions::default()).unwrap();
            for ranks in 1..=8u32 {
                let mut owner = vec![u32::MAX; m as usize];
                for rank in 0..ranks {
                    let geo = BandGeometry::new(&plan, ranks, rank).unwrap();
                    assert!(geo.band_len >= 1, "{ranks} ranks: band {rank} is empty");
                    let mut prev = None;
                    for i in 0..geo.rows {
                        let g = geo.global_row(i);
                        assert!(g < m, "m {m}, {ranks} ranks, rank {rank}: row {i} -> {g}");
                        assert_eq!(owner[g as usize], u32::MAX, "row {g} owned twice");
                        owner[g as usize] = rank;
                        assert!(prev.is_none_or(|p| p < g));
                        prev = Some(g);
                    }
                }
                assert!(
                    !owner.contains(&u32::MAX),
                    "m {m}, {ranks} ranks: a row has no owner"
                );
            }
        }
        let plan =
            GemmPlan::new(132, GemmShape::new(1024, 256, 64), GemmOptions::default()).unwrap();
        for ranks in [1u32, 2, 4, 8] {
            for rank in 0..ranks {
                assert_eq!(
                    BandGeometry::new(&plan, ranks, rank).unwrap().rows,
                    1024 / ranks,
                    "{ranks} ranks divide the rows evenly"
                );
            }
        }
        assert!(BandGeometry::new(&plan, 9, 0).is_err());
    }

    /// The host's per-group ranges agree with the kernel's slot of every band
    /// (weft_gemm_band_slots_of): band r of order o lies in part r of its group's send range, at
    /// the position the receiver's slot o takes in the group's receive range.
    #[test]
    fn group_ranges_match_the_kernels_band_slots() {
        use crate::wave_groups::WaveGroups;
        use weft_kernels::abi::weft_gemm_band_slots_of;
        let plan = GemmPlan::new(
            132,
            GemmShape::new(4096, 2048, 64),
            GemmOptions {
                sm_margin: 60,
                ..Default::default()
            },
        )
        .unwrap();
        let waves = plan.waves();
        assert!(waves >= 4, "{}", plan.describe());
        for sizes in [
            vec![waves],
            vec![1, waves - 1],
            vec![1, 2, waves - 3],
            WaveGroups::uniform(&plan, 1).unwrap().waves().to_vec(),
        ] {
            let groups = WaveGroups::new(&plan, &sizes).unwrap();
            let abi = groups.abi();
            for ranks in 1..=crate::MAX_BAND_RANKS {
                let slot = 7usize; // any slot size: ranges are in slots x slot elements
                for g in 0..groups.count() {
                    let orders = groups.orders(g);
                    let (send, recv) = group_ranges(orders.clone(), ranks, slot);
                    let part = send.len() / ranks as usize;
                    assert_eq!(part, recv.len());
                    for o in orders.clone() {
                        // SAFETY: a pure function.
                        let s = unsafe { weft_gemm_band_slots_of(plan.sched, &abi, ranks, o) };
                        for r in 0..ranks {
                            let at = (s.first + r * s.stride) as usize * slot;
                            let in_part = at - send.start - r as usize * part;
                            assert!(
                                in_part < part,
                                "{sizes:?} {ranks} ranks: band {r} of order {o} outside part {r}"
                            );
                            assert_eq!(
                                recv.start + in_part,
                                o as usize * slot,
                                "band {r} of order {o} lands elsewhere"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The kernel's store boxes: 8-row aligned (the swizzle's 1024 bytes), dividing a consumer's
    /// 64 rows, and each inside one band.
    #[test]
    fn store_boxes_stay_inside_a_band() {
        use weft_kernels::abi::{weft_gemm_band_box_rows, weft_gemm_band_of_row};
        for ranks in 1..=crate::MAX_BAND_RANKS {
            // SAFETY: pure functions.
            let rows = unsafe { weft_gemm_band_box_rows(ranks) };
            assert!(
                rows % 8 == 0 && 64 % rows == 0,
                "{ranks} ranks: box of {rows} rows"
            );
            for y in 0..128u32 {
                // SAFETY: pure functions.
                let (r, start, len) = unsafe {
                    let r = weft_gemm_band_of_row(ranks, y);
                    (
                        r,
                        weft_gemm_band_start(ranks, r),
                        weft_gemm_band_len(ranks, r),
                    )
                };
                assert!(
                    r < ranks && start <= y && y < start + len,
                    "{ranks} ranks: row {y} put in band {r} = [{start}, +{len})"
                );
            }
            for y in (0..128).step_by(rows as usize) {
                let (first, last) = unsafe {
                    (
                        weft_gemm_band_of_row(ranks, y),
                        weft_gemm_band_of_row(ranks, y + rows - 1),
                    )
                };
                assert_eq!(
                    first, last,
                    "{ranks} ranks: the box at row {y} crosses bands"
                );
            }
        }
    }
}
