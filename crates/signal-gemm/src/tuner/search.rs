//! The online search (FlashOverlap §4.1, Alg. 1 lines 7 and 24-26): candidate partitions with
//! small first and last groups (a long first group delays the first collective, a long last one
//! leaves it alone at the end), uniform groups between; every candidate's time predicted, the
//! fastest kept, and the sequential path chosen when it is predicted faster.

use super::predict::{predict_overlap, predict_sequential};
use super::profile::{Op, TuningProfile};
use crate::error::GemmError;
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::wave_groups::WaveGroups;
use anyhow::Context;
use weft_kernels::abi::WEFT_GEMM_MAX_WAVE_GROUPS;

/// The largest first and last groups tried, in waves.
const MAX_END_GROUP: u32 = 3;
/// The uniform sizes tried for the groups between the first and the last.
const MIDDLE_SIZES: [u32; 6] = [1, 2, 3, 4, 6, 8];

/// What the tuner chose for one shape.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// cuBLAS then NCCL: no overlap is predicted to beat it.
    Sequential {
        predicted_ms: f64,
        best_overlap_ms: Option<f64>,
    },
    /// Signal-gemm overlap with this margin (NCCL's CTAs) and grouping.
    Overlap {
        sm_margin: u32,
        waves: Vec<u32>,
        predicted_ms: f64,
        sequential_ms: f64,
    },
}

/// Partitions of `waves` waves: first group f ≤ 3, last group l ≤ 3, the waves between in
/// groups of one uniform size (the remainder in a shorter last middle group), at most 32 groups;
/// plus the single group. Sizes sum to `waves`, each ≥ 1.
pub fn candidates(waves: u32) -> Vec<Vec<u32>> {
    let mut out = vec![vec![waves]];
    for f in 1..=MAX_END_GROUP.min(waves) {
        if f == waves {
            continue;
        }
        for l in 1..=MAX_END_GROUP.min(waves - f) {
            let middle = waves - f - l;
            let mut sizes_tried = MIDDLE_SIZES.to_vec();
            if middle > 0 {
                sizes_tried.push(middle);
            }
            for u in sizes_tried {
                let mut c = vec![f];
                let mut left = middle;
                while left > 0 {
                    let s = u.min(left);
                    c.push(s);
                    left -= s;
                }
                c.push(l);
                if c.len() <= WEFT_GEMM_MAX_WAVE_GROUPS as usize {
                    out.push(c);
                }
                if middle == 0 {
                    break;
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The partition (with its plan) of the lowest predicted overlap time over the profiled margins,
/// or at `only` that margin, and its prediction. Margins the profile cannot predict for this shape
/// (no GEMM sample with its tile width) are skipped; an error when none is left.
pub fn best_overlap(
    profile: &TuningProfile,
    op: Op,
    shape: GemmShape,
    base: GemmOptions,
    only: Option<u32>,
) -> Result<(GemmPlan, Vec<u32>, f64), GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<(GemmPlan, Vec<u32>, f64)> {
        let mut best: Option<(f64, GemmPlan, Vec<u32>)> = None;
        let mut skipped = Vec::new();
        for margin in profile
            .margins()
            .into_iter()
            .filter(|m| only.is_none_or(|o| o == *m))
        {
            let plan = GemmPlan::new(
                profile.sms,
                shape,
                GemmOptions {
                    sm_margin: margin,
                    ..base
                },
            )?;
            if let Err(e) = profile.gemm_wave_ms(shape, margin, plan.tile_n()) {
                skipped.push(format!("{e:#}"));
                continue;
            }
            for waves in candidates(plan.waves()) {
                let groups = WaveGroups::new(&plan, &waves)?;
                let t = predict_overlap(profile, op, &plan, &groups)?;
                if best.as_ref().is_none_or(|b| t < b.0) {
                    best = Some((t, plan.clone(), waves));
                }
            }
        }
        let (t, plan, waves) = best.with_context(|| {
            format!(
                "no profiled margin can predict {shape} ({})",
                skipped.join("; ")
            )
        })?;
        Ok((plan, waves, t))
    })
}

/// The best predicted way to run `shape` + `op` on the profiled machine (GEMM `base` options,
/// its sm_margin replaced by each profiled margin). `sms` and `world`: this job's, which must be
/// the profile's.
pub fn tune(
    profile: &TuningProfile,
    op: Op,
    shape: GemmShape,
    base: GemmOptions,
    sms: u32,
    world: u32,
) -> Result<Choice, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<Choice> {
        profile.check_machine(sms, world)?;
        let sequential = predict_sequential(profile, op, shape, base.output.bytes() as u64)?;
        let best = best_overlap(profile, op, shape, base, None)?;
        Ok(match best {
            (plan, waves, t) if t < sequential => Choice::Overlap {
                sm_margin: plan.options.sm_margin,
                waves,
                predicted_ms: t,
                sequential_ms: sequential,
            },
            (_, _, t) => Choice::Sequential {
                predicted_ms: sequential,
                best_overlap_ms: Some(t),
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_partition_the_waves() {
        for waves in 1..=70 {
            let c = candidates(waves);
            assert!(c.contains(&vec![waves]));
            for p in &c {
                assert_eq!(p.iter().sum::<u32>(), waves, "{p:?}");
                assert!(p.iter().all(|&w| w >= 1) && p.len() <= 32, "{p:?}");
                if p.len() > 1 {
                    assert!(
                        p[0] <= MAX_END_GROUP && p[p.len() - 1] <= MAX_END_GROUP,
                        "{p:?}"
                    );
                }
            }
        }
        assert!(candidates(10).contains(&vec![1, 2, 2, 2, 2, 1]));
    }
}
