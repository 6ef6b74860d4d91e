//! The All-to-All reorder map (signal-gemm II). Given every rank's routing (row → destination
//! rank) of a GEMM whose plan and wave groups are the same on every rank, each output row's
//! subtokens (its tile_n-column pieces, one per tile column) are stored by the epilogue
//! ([`OutputLayout::RowSlots`]) into per-group, per-destination pools: staging slots laid out
//! group by group, destination by destination, each pool in execution order (tile order, then row
//! in the tile). So after a group's tiles are stored, one grouped send/receive moves the group's
//! pools ([`AllToAllMap::group_ranges`]), and [`AllToAllMap::scatter`] puts every received
//! subtoken at its place in the output.
//!
//! Output order: rank r receives every row whose route is r, source rank by source rank, each
//! source's rows in increasing row order: out row i ↔ [`AllToAllMap::source_row`]. (NCCL has no
//! routed all-to-all; the equivalent sequential path gathers each destination's rows, exchanges
//! them with ncclSend/ncclRecv and gets this order.)

use crate::dtype::GemmElement;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::gemm::RowSlotTable;
use crate::plan::GemmPlan;
use crate::reorder::OutputLayout;
use crate::wave_groups::WaveGroups;
use anyhow::Context;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::ops::Range;
use std::sync::Arc;
use weft_kernels::abi::{weft_gemm_slot_scatter_params, WEFT_GEMM_NO_SLOT, WEFT_GEMM_TILE_M};
use weft_kernels::cubins;

/// Rank `rank`'s side of an All-to-All of a GEMM's rows.
pub struct AllToAllMap {
    plan: GemmPlan,
    world: usize,
    /// (tile index × 128 + row in tile) → this rank's staging slot.
    row_slots: CudaSlice<u32>,
    /// Received slot → (output row, tile column).
    dst_of_slot: CudaSlice<u32>,
    /// [group][peer]: element ranges of the staging buffer sent to the peer.
    send: Vec<Vec<Range<usize>>>,
    /// [group][peer]: element ranges of the received buffer coming from the peer.
    recv: Vec<Vec<Range<usize>>>,
    /// [group][peer]: where this rank's pool (group, peer) starts in the peer's received buffer
    /// (elements), for a sender that writes it there itself.
    push: Vec<Vec<usize>>,
    /// The largest received buffer of any rank (elements).
    max_received: usize,
    send_slots: u32,
    recv_slots: u32,
    /// (source rank, source row) of each output row.
    sources: Vec<(u32, u32)>,
    scatter: CudaFunction,
    blocks: u32,
}

/// Subtokens per (group, destination) of one rank's routing, walking the schedule as the epilogue
/// fills the pools: `visit(group, destination, index in the pool, tile index, row in tile, tile column)`.
fn walk(
    plan: &GemmPlan,
    groups: &WaveGroups,
    route: &[u32],
    world: usize,
    mut visit: impl FnMut(usize, usize, u32, u32, u32, u32),
) -> Vec<Vec<u32>> {
    let mut count = vec![vec![0u32; world]; groups.count()];
    let (m, tile_m) = (plan.shape.m, plan.tile_m());
    for t in plan.schedule() {
        let g = groups.group_of(t.order);
        let tile = t.tm * plan.tiles_n() + t.tn;
        for y in 0..tile_m.min(m - t.tm * tile_m) {
            let d = route[(t.tm * tile_m + y) as usize] as usize;
            visit(g, d, count[g][d], tile, y, t.tn);
            count[g][d] += 1;
        }
    }
    count
}

/// Where each source's pools land in rank `dst`'s received buffer: slot offsets [group][source]
/// (group by group, source by source) and the total, from counts_all[source][group][dst].
fn recv_offsets(counts_all: &[Vec<Vec<u32>>], groups: usize, dst: usize) -> (Vec<Vec<u32>>, u32) {
    let counts: Vec<Vec<u32>> = (0..groups)
        .map(|g| counts_all.iter().map(|c| c[g][dst]).collect())
        .collect();
    offsets(&counts)
}

/// Exclusive prefix sums of counts[g][p], in (g, p) order; and the total.
fn offsets(counts: &[Vec<u32>]) -> (Vec<Vec<u32>>, u32) {
    let mut at = 0u32;
    let off = counts
        .iter()
        .map(|row| {
            row.iter()
                .map(|&c| {
                    let o = at;
                    at += c;
                    o
                })
                .collect()
        })
        .collect();
    (off, at)
}

impl AllToAllMap {
    /// The map for rank `rank` given `routes[s][row]` = the destination of rank s's output row
    /// (every rank's routing, identical on every rank; each of m rows, each below routes.len()).
    pub fn new(
        stream: &Arc<CudaStream>,
        plan: &GemmPlan,
        groups: &WaveGroups,
        routes: &[Vec<u32>],
        rank: usize,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let world = routes.len();
            let m = plan.shape.m as usize;
            require!(
                world >= 1 && rank < world,
                Options,
                "all-to-all map: rank {rank} of {world} routings"
            );
            require!(
                groups.fits(plan),
                Options,
                "all-to-all map: wave groups {groups} were made for another plan than {}",
                plan.describe()
            );
            for (s, r) in routes.iter().enumerate() {
                require!(
                    r.len() == m,
                    Length,
                    "all-to-all map: rank {s}'s routing has {} rows, the GEMM has m = {m}",
                    r.len()
                );
                if let Some((row, d)) = r.iter().enumerate().find(|(_, &d)| d as usize >= world) {
                    refuse!(Options, "all-to-all map: rank {s} routes row {row} to rank {d}, but there are {world} ranks");
                }
            }
            let tile_n = plan.tile_n() as usize;
            // This rank's pools: the slot of every (tile, row).
            let mut mine = Vec::new();
            let counts_mine = walk(plan, groups, &routes[rank], world, |g, d, i, tile, y, _| {
                mine.push((g, d, i, tile, y))
            });
            let (send_off, send_slots) = offsets(&counts_mine);
            let mut table = vec![WEFT_GEMM_NO_SLOT; (plan.tiles() * WEFT_GEMM_TILE_M) as usize];
            for (g, d, i, tile, y) in mine {
                table[(tile * WEFT_GEMM_TILE_M + y) as usize] = send_off[g][d] + i;
            }
            let send = (0..groups.count())
                .map(|g| {
                    (0..world)
                        .map(|d| {
                            send_off[g][d] as usize * tile_n
                                ..(send_off[g][d] + counts_mine[g][d]) as usize * tile_n
                        })
                        .collect()
                })
                .collect();
            // What arrives: from each source s, its pool (g, rank), laid out group by group, source
            // by source; output rows source by source, each source's rows to this rank in order.
            let counts_all: Vec<Vec<Vec<u32>>> = routes
                .iter()
                .map(|r| walk(plan, groups, r, world, |_, _, _, _, _, _| {}))
                .collect();
            let recv_counts: Vec<Vec<u32>> = (0..groups.count())
                .map(|g| (0..world).map(|s| counts_all[s][g][rank]).collect())
                .collect();
            let (recv_off, recv_slots) = recv_offsets(&counts_all, groups.count(), rank);
            let mut push = vec![vec![0usize; world]; groups.count()];
            let mut max_received = 0usize;
            for q in 0..world {
                let (off_q, slots_q) = recv_offsets(&counts_all, groups.count(), q);
                for (g, row) in push.iter_mut().enumerate() {
                    row[q] = off_q[g][rank] as usize * tile_n;
                }
                max_received = max_received.max(slots_q as usize * tile_n);
            }
            let recv = (0..groups.count())
                .map(|g| {
                    (0..world)
                        .map(|s| {
                            recv_off[g][s] as usize * tile_n
                                ..(recv_off[g][s] + recv_counts[g][s]) as usize * tile_n
                        })
                        .collect()
                })
                .collect();
            let mut sources = Vec::new();
            let mut out_row_of = vec![Vec::new(); world]; // [s][row] -> output row (rows routed here)
            for (s, r) in routes.iter().enumerate() {
                out_row_of[s] = vec![u32::MAX; m];
                for (row, &d) in r.iter().enumerate() {
                    if d as usize == rank {
                        out_row_of[s][row] = sources.len() as u32;
                        sources.push((s as u32, row as u32));
                    }
                }
            }
            let mut dst = vec![u32::MAX; 2 * recv_slots as usize];
            for (s, r) in routes.iter().enumerate() {
                walk(plan, groups, r, world, |g, d, i, tile, y, tn| {
                    if d == rank {
                        let slot = (recv_off[g][s] + i) as usize;
                        let row = (tile / plan.tiles_n()) * WEFT_GEMM_TILE_M + y;
                        dst[2 * slot] = out_row_of[s][row as usize];
                        dst[2 * slot + 1] = tn;
                    }
                });
            }
            anyhow::ensure!(
                !dst.contains(&u32::MAX),
                "all-to-all map: a received slot has no destination (internal error)"
            );
            anyhow::ensure!(
                table
                    .iter()
                    .all(|&s| s == WEFT_GEMM_NO_SLOT || s < send_slots),
                "all-to-all map: a row-slot entry past the {send_slots} staging slots (internal error)"
            );
            let row_slots = stream
                .clone_htod(&table)
                .context("uploading the row-slot table")?;
            if dst.is_empty() {
                dst = vec![0, 0]; // nothing arrives: a placeholder (a device buffer cannot be empty)
            }
            let dst_of_slot = stream
                .clone_htod(&dst)
                .context("uploading the received-slot table")?;
            let ctx = stream.context();
            let module = cubins::GEMM_RESTORE
                .load(ctx)
                .with_context(|| format!("loading {}", cubins::GEMM_RESTORE.source))?;
            let scatter = module
                .load_function("weft_gemm_slot_scatter")
                .context("kernels/gemm/restore.cu: weft_gemm_slot_scatter")?;
            let blocks = 4 * crate::gemm::device_sms(ctx)?;
            stream.synchronize()?;
            Ok(Self {
                plan: plan.clone(),
                world,
                row_slots,
                dst_of_slot,
                send,
                recv,
                push,
                max_received,
                send_slots,
                recv_slots,
                sources,
                scatter,
                blocks,
            })
        })
    }

    /// The GEMM's layout for this map.
    pub fn layout(&self) -> OutputLayout {
        OutputLayout::RowSlots {
            slots: self.send_slots,
        }
    }

    /// The (tile, row) → slot table the GEMM launch needs (`LaunchExtras::row_slots`), its
    /// entries checked against the map's slots on the host when it was made.
    pub fn row_slots(&self) -> RowSlotTable<'_> {
        RowSlotTable::checked(&self.row_slots, self.send_slots)
    }

    /// Elements of the staging buffer (this rank's pools).
    pub fn staging_len(&self) -> usize {
        self.send_slots as usize * self.plan.tile_n() as usize
    }

    /// Elements of the received buffer.
    pub fn received_len(&self) -> usize {
        self.recv_slots as usize * self.plan.tile_n() as usize
    }

    /// Rows this rank receives: the output is rows() × n.
    pub fn rows(&self) -> usize {
        self.sources.len()
    }

    /// (source rank, source row) of output row `i`.
    pub fn source_row(&self, i: usize) -> (u32, u32) {
        self.sources[i]
    }

    /// Where this rank's pool of group `g` for `peer` starts in the peer's received buffer
    /// (elements); its length is group_ranges(g).0[peer].
    pub fn push_offset(&self, g: usize, peer: usize) -> usize {
        self.push[g][peer]
    }

    /// Elements of the largest received buffer of any rank (a buffer every rank allocates alike).
    pub fn max_received_len(&self) -> usize {
        self.max_received
    }

    /// Group `g`'s send and receive ranges, one per peer (for `Communicator::all_to_all_v`).
    pub fn group_ranges(&self, g: usize) -> (&[Range<usize>], &[Range<usize>]) {
        (&self.send[g], &self.recv[g])
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// `out` (rows() × n) from the received subtokens.
    pub fn scatter<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        received: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let (src, _gs) = received.device_ptr(stream);
            self.scatter_from(stream, src, received.len(), out)
        })
    }

    /// As [`scatter`](Self::scatter) from `received_len` elements of T at device address `src`
    /// (a buffer this map's caller owns by other means, e.g. a PGL).
    pub(crate) fn scatter_from<T: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        src: u64,
        received_len: usize,
        out: &mut CudaSlice<T>,
    ) -> anyhow::Result<()> {
        self.check::<T>(received_len, out.len())?;
        if self.recv_slots == 0 {
            return Ok(());
        }
        let (dst, _gd) = out.device_ptr_mut(stream);
        let (table, _gt) = self.dst_of_slot.device_ptr(stream);
        let p = weft_gemm_slot_scatter_params {
            src,
            dst,
            dst_of_slot: table,
            slots: self.recv_slots,
            n: self.plan.shape.n,
            tile_n: self.plan.tile_n(),
            elem_bytes: T::DTYPE.bytes() as u32,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes exactly this struct; `check` made sure the buffers hold every
        // slot and output row the tables name.
        unsafe { stream.launch_builder(&self.scatter).arg(&p).launch(cfg) }
            .context("launching the all-to-all scatter")?;
        Ok(())
    }

    /// Refuses what [`scatter`](Self::scatter) would refuse.
    pub fn check<T: GemmElement>(
        &self,
        received_len: usize,
        out_len: usize,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                self.plan.options.output == T::DTYPE,
                Options,
                "all-to-all scatter: the plan's output is {}, given {}",
                self.plan.options.output,
                T::DTYPE
            );
            require!(
                received_len >= self.received_len(),
                Length,
                "all-to-all scatter: received buffer has {received_len} elements, needs {}",
                self.received_len()
            );
            let need = self.rows() * self.plan.shape.n as usize;
            require!(
                out_len >= need,
                Length,
                "all-to-all scatter: output has {out_len} elements, needs {} rows x {}",
                self.rows(),
                self.plan.shape.n
            );
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender's offsets into a receiver's buffer are the receiver's own receive offsets.
    #[test]
    fn push_offsets_are_the_receivers_receive_offsets() {
        // counts_all[source][group][destination], three ranks, two groups.
        let counts_all = vec![
            vec![vec![1, 2, 3], vec![4, 0, 1]],
            vec![vec![0, 5, 2], vec![1, 1, 1]],
            vec![vec![2, 0, 0], vec![3, 2, 6]],
        ];
        for dst in 0..3 {
            let (off, total) = recv_offsets(&counts_all, 2, dst);
            // Brute force: walk (group, source) in order.
            let mut at = 0;
            for g in 0..2 {
                for (s, c) in counts_all.iter().enumerate() {
                    assert_eq!(off[g][s], at, "dst {dst} group {g} source {s}");
                    at += c[g][dst];
                }
            }
            assert_eq!(total, at);
        }
    }
}
