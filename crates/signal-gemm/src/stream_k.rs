//! Stream-K (split-K is its special case): which orders run whole and how many units the other
//! tiles' K blocks are dealt to (kernels/include/weft/abi/gemm.h, "Stream-K"), the cost model
//! that chooses them, and the work items a CTA runs, listed by the kernel's own functions.

use weft_kernels::abi::{
    weft_gemm_next_work, weft_gemm_schedule, weft_gemm_work_at, WEFT_GEMM_MAX_K_SPLITS,
    WEFT_GEMM_NO_TILE,
};

/// Orders [0, dp_orders) run whole; the K blocks of the others are dealt to `units` units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamK {
    pub dp_orders: u32,
    pub units: u32,
}

/// One work item of a CTA: a tile's K blocks [k_begin, k_end), and for stream-K items the unit
/// and (for the tile's storer, k_begin 0) how many later units' partials it adds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkItem {
    pub order: u32,
    pub k_blocks: std::ops::Range<u32>,
    /// None: a data-parallel order.
    pub unit: Option<u32>,
    pub contributors: u32,
}

/// CTA `cta`'s work items in the order it runs them (static scheduling).
pub(crate) fn work_items(s: weft_gemm_schedule, cta: u32) -> Vec<WorkItem> {
    let mut out = Vec::new();
    // SAFETY (all weft_gemm_* calls): pure functions of the struct, from the C header.
    let mut work = unsafe { weft_gemm_next_work(s, cta, WEFT_GEMM_NO_TILE) };
    while work != WEFT_GEMM_NO_TILE {
        let w = unsafe { weft_gemm_work_at(s, work) };
        out.push(WorkItem {
            order: w.order,
            k_blocks: w.k_begin..w.k_end,
            unit: (w.unit != WEFT_GEMM_NO_TILE).then_some(w.unit),
            contributors: w.contributors,
        });
        work = unsafe { weft_gemm_next_work(s, cta, work) };
    }
    out
}

/// The cost model, in K blocks of the plan's tile on one CTA's critical path, fitted to
/// `weft bench gemm-llm` on one H200 (results/gemm/nvidia-h200-x2-2026-11-26-split-k-first.json,
/// 128 × 128 tiles unsplit and split 2 and 3 at 3008 × 4096 × 4096; it then predicted split 4
/// within 3 %): each stored tile adds its fill and epilogue, each partial a storer adds costs its
/// write by one CTA and its read by the storer. With fewer units than CTAs the model is
/// optimistic (fewer CTAs each load faster).
const UNIT_OVERHEAD_K_BLOCKS: f64 = 8.5;
const PARTIAL_OVERHEAD_K_BLOCKS: f64 = 3.75;
/// Stream-K only pays when it saves this fraction of the predicted time.
const MIN_GAIN: f64 = 0.1;
/// Auto's units hold at least this many K blocks.
const MIN_UNIT_K_BLOCKS: u32 = 4;

/// Predicted time of every order whole.
fn whole_cost(tiles: u32, k_blocks: u32, ctas: u32) -> f64 {
    tiles.div_ceil(ctas) as f64 * (k_blocks as f64 + UNIT_OVERHEAD_K_BLOCKS)
}

/// Predicted time of `sk` over `tiles` tiles (orders) on `ctas` CTAs.
fn cost(sk: StreamK, tiles: u32, k_blocks: u32, ctas: u32) -> f64 {
    let dp = whole_cost(sk.dp_orders, k_blocks, ctas);
    let sk_tiles = tiles - sk.dp_orders;
    let len = (sk_tiles as f64 * k_blocks as f64) / sk.units as f64;
    let rounds = sk.units.div_ceil(ctas) as f64;
    let aligned = sk_tiles.is_multiple_of(sk.units) || sk.units.is_multiple_of(sk_tiles);
    // Partials the busiest storer adds: a unit shorter than a tile leaves ⌈tile ÷ unit⌉ − 1 of
    // them; a longer one at most one, none when units and tiles line up.
    let partials = if len < k_blocks as f64 {
        (k_blocks as f64 / len).ceil() - 1.0
    } else if aligned {
        0.0
    } else {
        1.0
    };
    let stored = (len / k_blocks as f64).ceil().max(1.0);
    dp + rounds * (len + UNIT_OVERHEAD_K_BLOCKS * stored + PARTIAL_OVERHEAD_K_BLOCKS * partials)
}

/// Every order split in `splits` units of equal K (split-K); None for 1.
pub(crate) fn split_k(tiles: u32, splits: u32) -> Option<StreamK> {
    (splits > 1).then_some(StreamK {
        dp_orders: 0,
        units: tiles.saturating_mul(splits), // GemmPlan::new refuses what saturates
    })
}

/// The candidates: whole waves data-parallel (all but the last partial one, or one fewer, or
/// none), the rest over every CTA or over a whole number of units per tile.
fn candidates(tiles: u32, k_blocks: u32, ctas: u32) -> Vec<StreamK> {
    let full = tiles / ctas;
    let mut out = Vec::new();
    for dp_waves in [full, full.saturating_sub(1), 0] {
        let dp_orders = dp_waves * ctas;
        if dp_orders >= tiles {
            continue;
        }
        let rest = tiles - dp_orders;
        let iters = rest as u64 * k_blocks as u64;
        let mut units: Vec<u32> = (1..=16).map(|s| rest * s).filter(|&u| u <= ctas).collect();
        units.push(ctas);
        for u in units {
            let sk = StreamK {
                dp_orders,
                units: u,
            };
            if iters >= u as u64 * MIN_UNIT_K_BLOCKS as u64 && !out.contains(&sk) {
                out.push(sk);
            }
        }
    }
    out
}

/// The candidate with the smallest predicted time, if any.
pub(crate) fn best(tiles: u32, k_blocks: u32, ctas: u32) -> Option<(StreamK, f64)> {
    candidates(tiles, k_blocks, ctas)
        .into_iter()
        .map(|sk| (sk, cost(sk, tiles, k_blocks, ctas)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Split-K units per tile with the smallest predicted time (each unit keeps at least
/// MIN_UNIT_K_BLOCKS); 1 unless that saves MIN_GAIN.
pub(crate) fn auto_k_splits(tiles: u32, k_blocks: u32, ctas: u32) -> u32 {
    let max = (k_blocks / MIN_UNIT_K_BLOCKS).clamp(1, WEFT_GEMM_MAX_K_SPLITS);
    let whole = whole_cost(tiles, k_blocks, ctas);
    let cost = |s: u32| match split_k(tiles, s) {
        Some(sk) => cost(sk, tiles, k_blocks, ctas),
        None => whole,
    };
    let best = (1..=max)
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
        .unwrap_or(1);
    if cost(best) <= whole * (1.0 - MIN_GAIN) {
        best
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_only_where_tiles_leave_sms_idle() {
        // 512 x 1280 x 8192 in 128 x 128 tiles: 40 tiles of 128 K blocks on 132 CTAs: 3 splits.
        assert_eq!(auto_k_splits(40, 128, 132), 3);
        // 32 waves, a whole number of waves, or a short K: none.
        assert_eq!(auto_k_splits(4096, 128, 132), 1);
        assert_eq!(auto_k_splits(264, 128, 132), 1);
        assert_eq!(auto_k_splits(40, 2, 132), 1);
    }

    #[test]
    fn stream_k_balances_the_last_wave() {
        // 160 tiles of 128 K blocks on 132 CTAs: the model deals the last wave (or everything)
        // to units, predicting a gain over two waves.
        let (sk, c) = best(160, 128, 132).unwrap();
        assert!(
            sk.units <= 132 && c < whole_cost(160, 128, 132) * 0.8,
            "{sk:?} {c}"
        );
        // Nothing to deal in units of 4 K blocks.
        assert_eq!(best(40, 2, 132), None);
    }
}
