//! The latency model (FlashOverlap Alg. 1, lines 10-22). With the GEMM on the SMs the margin
//! leaves and NCCL on the rest (the communication stream has the higher priority), group g's
//! tiles are done after the waves of groups 0..=g, each wave taking the profiled wave time; its
//! collective starts when both its tiles and the previous group's collective are done and takes
//! the curve's time for its bytes — times the contention factor fitted for that CTA limit while
//! the GEMM still runs, at the curve's own speed once it has ended; the restore follows.
//!
//!   comp = 0, comm = 0, end = Σ waves · t_wave
//!   for each group g: comp += waves_g · t_wave;  comm = finish(max(comm, comp), t_comm(bytes_g))
//!   finish(start, t) = start + c·t            if start + c·t ≤ end   (all of it beside the GEMM)
//!                      end + (t − (end − start)/c)  if start < end   (the rest alone)
//!                      start + t              otherwise
//!   predicted = comm + t_restore
//!
//! The wave time is the plain standard-layout GEMM's at that margin, so what the collective's
//! layout and signals cost the GEMM (its interference) is folded into the fitted contention
//! factor along with NCCL's own slowdown.

use super::profile::{Op, TuningProfile};
use crate::error::GemmError;
use crate::plan::{GemmPlan, GemmShape};
use crate::reorder::OutputLayout;
use crate::wave_groups::WaveGroups;

/// Bytes each wave group's collective sends (its range of the staging buffer).
pub struct GroupBytes(pub Vec<u64>);

impl GroupBytes {
    pub fn of(plan: &GemmPlan, groups: &WaveGroups, op: Op, world: u32) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let elem = plan.options.output.bytes() as u64;
            let layout = match op {
                Op::AllReduce => OutputLayout::TileOrder,
                Op::ReduceScatter => OutputLayout::RankBands { ranks: world },
            };
            layout.check(plan)?; // a world the band layout cannot cut for
                                 // Elements per order (slot or band slots), the same for every order of a layout.
            let per_order = layout.elements(plan) / u64::from(plan.orders());
            Ok(Self(
                (0..groups.count())
                    .map(|g| u64::from(groups.orders(g).len() as u32) * per_order * elem)
                    .collect(),
            ))
        })
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// Predicted ms of the overlapped GEMM + collective of `plan` grouped as `groups`, with NCCL
/// limited to the plan's sm_margin CTAs, restore included.
pub fn predict_overlap(
    profile: &TuningProfile,
    op: Op,
    plan: &GemmPlan,
    groups: &WaveGroups,
) -> Result<f64, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<f64> {
        let margin = plan.options.sm_margin;
        let t_wave = profile.gemm_wave_ms(plan.shape, margin, plan.tile_n())?;
        let curve = profile.curve(op, Some(margin))?;
        let contention = profile.contention(op, margin);
        let bytes = GroupBytes::of(plan, groups, op, profile.world)?;
        let end = f64::from(groups.waves().iter().sum::<u32>()) * t_wave;
        let (mut comp, mut comm) = (0.0f64, 0.0f64);
        for (g, &waves) in groups.waves().iter().enumerate() {
            comp += f64::from(waves) * t_wave;
            comm = finish(comm.max(comp), curve.ms(bytes.0[g]), contention, end);
        }
        Ok(comm
            + profile.restore_ms_per_mib(op)? * output_bytes(plan.shape, op, profile.world, plan)
                / MIB)
    })
}

/// When a collective of `alone` ms (NCCL by itself) that starts at `start` ends, slowed by
/// `contention` while the GEMM runs (until `end`).
fn finish(start: f64, alone: f64, contention: f64, end: f64) -> f64 {
    if start >= end {
        return start + alone;
    }
    let slowed = contention * alone;
    if start + slowed <= end {
        start + slowed
    } else {
        end + alone - (end - start) / contention
    }
}

/// Predicted ms of cuBLAS then the collective (NCCL's default CTAs) on the standard layout.
pub fn predict_sequential(
    profile: &TuningProfile,
    op: Op,
    shape: GemmShape,
    elem_bytes: u64,
) -> Result<f64, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<f64> {
        let bytes = u64::from(shape.m) * u64::from(shape.n) * elem_bytes;
        Ok(profile.cublas_ms(shape)? + profile.curve(op, None)?.ms(bytes))
    })
}

/// Bytes the restore writes: the whole output (AllReduce) or this rank's share (ReduceScatter).
fn output_bytes(shape: GemmShape, op: Op, world: u32, plan: &GemmPlan) -> f64 {
    let all = f64::from(shape.m) * f64::from(shape.n) * plan.options.output.bytes() as f64;
    match op {
        Op::AllReduce => all,
        Op::ReduceScatter => all / f64::from(world),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{GemmOptions, TileChoice};
    use crate::tuner::{CommCurve, GemmSample};

    /// A collective is slowed only while the GEMM runs.
    #[test]
    fn contention_applies_only_beside_the_gemm() {
        assert_eq!(finish(2.0, 1.0, 2.0, 1.0), 3.0); // after the GEMM: alone
        assert_eq!(finish(0.0, 1.0, 2.0, 5.0), 2.0); // all beside it: slowed
                                                     // Starts at 0.5, GEMM ends at 1.5: 1 ms slowed covers half the work, the rest 0.5 ms.
        assert!((finish(0.5, 1.0, 2.0, 1.5) - 2.0).abs() < 1e-12);
    }

    /// Two one-wave groups, a flat 100 MiB/s-per-µs curve: worked by hand.
    #[test]
    fn model_matches_a_hand_computed_timeline() {
        let shape = GemmShape::new(2560, 2560, 1024);
        let options = GemmOptions {
            sm_margin: 32,
            tile: TileChoice::N256,
            ..GemmOptions::default()
        };
        let plan = GemmPlan::new(132, shape, options).unwrap();
        assert_eq!(
            (plan.ctas(), plan.waves(), plan.orders()),
            (100, 2, 200),
            "{}",
            plan.describe()
        );
        let mib = 1u64 << 20;
        let profile = TuningProfile {
            world: 4,
            sms: 132,
            comm: vec![CommCurve {
                op: Op::AllReduce,
                max_ctas: Some(32),
                points: vec![(mib, 0.01), (1024 * mib, 10.24)],
            }],
            gemm: vec![GemmSample {
                shape,
                sm_margin: 32,
                tile_n: 256,
                ms: 0.2,
                waves: 2,
            }],
            restore: vec![(Op::AllReduce, 0.001)],
            ..Default::default()
        };
        let groups = WaveGroups::new(&plan, &[1, 1]).unwrap();
        // Each group: 100 tiles of 128 x 256 bf16 = 6.25 MiB -> 0.0625 ms. Waves 0.1 ms each.
        // g0: tiles at 0.1, sent by 0.1625; g1: tiles at 0.2, sent by 0.2625; restore 12.5 MiB.
        let t = predict_overlap(&profile, Op::AllReduce, &plan, &groups).unwrap();
        assert!((t - (0.2625 + 0.0125)).abs() < 1e-9, "{t}");
        let one = WaveGroups::new(&plan, &[2]).unwrap();
        let t1 = predict_overlap(&profile, Op::AllReduce, &plan, &one).unwrap();
        assert!((t1 - (0.2 + 0.125 + 0.0125)).abs() < 1e-9, "{t1}");
    }
}
