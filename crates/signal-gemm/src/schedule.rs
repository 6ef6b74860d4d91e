//! The schedule as the host sees it: the kernel's own scheduler (`weft_gemm_tile_at` in
//! kernels/include/weft/abi/gemm.h, called here through bindgen) listed tile by tile.

use weft_kernels::abi::{
    weft_gemm_order_count, weft_gemm_schedule, weft_gemm_tile_at, weft_gemm_wave_of,
};

/// One output tile of a plan and when it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledTile {
    /// Tile row and column (rows tm·128 .., columns tn·tile_n ..).
    pub tm: u32,
    pub tn: u32,
    /// Position in the schedule; CTA `order % ctas` computes it in its wave `order / ctas`.
    pub order: u32,
    pub wave: u32,
    pub cta: u32,
}

/// Every real tile (phantoms of partial clusters left out), in order.
pub(crate) fn list_schedule(s: weft_gemm_schedule) -> Vec<ScheduledTile> {
    // SAFETY: pure functions of the struct.
    let orders = unsafe { weft_gemm_order_count(s) };
    (0..orders)
        .filter_map(|order| {
            let t = unsafe { weft_gemm_tile_at(s, order) };
            debug_assert!(
                t.tm < unsafe { weft_kernels::abi::weft_gemm_tiles_m(s) } || t.valid == 0
            );
            (t.valid != 0).then(|| ScheduledTile {
                tm: t.tm,
                tn: t.tn,
                order,
                wave: unsafe { weft_gemm_wave_of(s, order) },
                cta: order % s.ctas,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::{GemmOptions, GemmPlan, GemmShape, TileChoice};
    use rand::{Rng, SeedableRng};

    /// Over random shapes, grids and group heights: every tile exactly once, waves and CTAs as
    /// the persistent loop visits them, and L2 grouping (consecutive orders stay inside a band of
    /// group_m tile rows, moving column by column).
    #[test]
    fn every_tile_once_in_grouped_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..300 {
            let shape = GemmShape::new(
                16 * rng.random_range(1..200),
                16 * rng.random_range(1..200),
                64,
            );
            let opts = GemmOptions {
                cluster_m: rng.random_range(1..=2),
                sm_margin: rng.random_range(0..20),
                tile: if rng.random_bool(0.5) {
                    TileChoice::N128
                } else {
                    TileChoice::N256
                },
                group_m: if rng.random_bool(0.3) {
                    None
                } else {
                    Some(rng.random_range(1..20))
                },
                ..GemmOptions::default()
            };
            let plan = GemmPlan::new(132, shape, opts).unwrap();
            let sched = plan.schedule();
            let (tm, tn) = (plan.tiles_m(), plan.tiles_n());
            assert_eq!(sched.len() as u32, tm * tn, "{}", plan.describe());
            let cm = plan.cluster_m();
            let mut seen = vec![false; (tm * tn) as usize];
            for t in &sched {
                assert!(t.tm < tm && t.tn < tn);
                // The CTAs of a cluster run vertically adjacent tiles of one column together.
                assert_eq!(
                    t.tm % cm,
                    t.order % cm,
                    "cluster rank = tile row within the cluster"
                );
                let idx = (t.tm * tn + t.tn) as usize;
                assert!(!seen[idx], "tile ({}, {}) scheduled twice", t.tm, t.tn);
                seen[idx] = true;
                assert_eq!(t.wave, t.order / plan.ctas());
                assert_eq!(t.cta, t.order % plan.ctas());
                // The band of group_m cluster rows that this order's unit falls in.
                let (unit, units_m) = (t.order / cm, tm.div_ceil(cm));
                let g = plan.group_m();
                let per_group = g * tn;
                let band = unit / per_group;
                assert_eq!(
                    t.tm / cm / g,
                    band,
                    "order {} leaves its group band",
                    t.order
                );
                let rows = (units_m - band * g).min(g);
                let in_group = unit % per_group;
                assert_eq!(t.tn, in_group / rows, "column-by-column inside a group");
                assert_eq!(t.tm / cm, band * g + in_group % rows);
            }
        }
    }
}
