//! Stream-K (split-K is its special case): which orders run whole and how many units the other
//! tiles' K blocks are dealt to (kernels/include/weft/abi/gemm.h, "Stream-K"), the cost model
//! that chooses them, and the work items a CTA runs, listed by the kernel's own functions.

use weft_kernels::abi::{
    weft_gemm_next_work, weft_gemm_schedule, weft_gemm_work_at, WEFT_GEMM_NO_TILE,
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
pub(crate) fn whole_cost(tiles: u32, k_blocks: u32, ctas: u32) -> f64 {
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

/// Auto: the best candidate where it saves MIN_GAIN of running every order whole.
pub(crate) fn auto(tiles: u32, k_blocks: u32, ctas: u32) -> Option<StreamK> {
    let whole = whole_cost(tiles, k_blocks, ctas);
    best(tiles, k_blocks, ctas)
        .filter(|&(_, c)| c <= whole * (1.0 - MIN_GAIN))
        .map(|(sk, _)| sk)
}

/// Predicted time (K blocks) of the plan Auto would pick: for choosing the tile width.
pub(crate) fn auto_cost(tiles: u32, k_blocks: u32, ctas: u32) -> f64 {
    let whole = whole_cost(tiles, k_blocks, ctas);
    match best(tiles, k_blocks, ctas) {
        Some((_, c)) if c <= whole * (1.0 - MIN_GAIN) => c,
        _ => whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_tiles_go_to_every_cta_and_full_waves_stay_whole() {
        // 512 x 2560 x 8192 in 128 x 256 tiles: 40 tiles of 128 K blocks on 132 CTAs.
        let sk = auto(40, 128, 132).unwrap();
        assert_eq!(sk.dp_orders, 0);
        assert!(sk.units >= 120, "{sk:?}");
        // 16384 x 8192: 4096 tiles, 32 waves; the last (4 tiles short of full) is not worth it.
        assert_eq!(auto(4096, 128, 132), None);
        // A whole number of waves: nothing to balance.
        assert_eq!(auto(264, 128, 132), None);
        // Short K: the overheads eat the gain.
        assert_eq!(auto(40, 2, 132), None);
    }
}
