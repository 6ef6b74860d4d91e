//! The float64 CPU reference of the group-collective trials and their element checks. Every
//! rank computes its own expected output from every rank's regenerated inputs, independently of
//! the plan's matching (the block lists of `weft_grpcoll::pattern` and their ordering rule).

use half::{bf16, f16};
use weft_grpcoll::pattern::{CastBlock, ReduceBlock};
use weft_pgl::{DType, PglElement};

/// A data type of the trials: conversions to and from f64 and its precision.
pub trait GElem: PglElement + PartialEq + std::fmt::Debug + Default + Clone {
    /// Relative spacing of the type (2^-23 for f32, 2^-7 for bf16).
    const EPS: f64;
    /// Relative spacing of the kernels' accumulator for this output type (f64 for f64, else f32).
    const ACC_EPS: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn poison() -> Self;
}

macro_rules! gelem {
    ($t:ty, $eps:expr, $acc:expr, $from:expr, $to:expr, $nan:expr) => {
        impl GElem for $t {
            const EPS: f64 = $eps;
            const ACC_EPS: f64 = $acc;
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn poison() -> Self {
                $nan
            }
        }
    };
}
gelem!(
    f32,
    f32::EPSILON as f64,
    f32::EPSILON as f64,
    |v| v as f32,
    |x: f32| x as f64,
    f32::NAN
);
gelem!(f64, f64::EPSILON, f64::EPSILON, |v| v, |x: f64| x, f64::NAN);
gelem!(
    bf16,
    0.0078125,
    f32::EPSILON as f64,
    bf16::from_f64,
    |x: bf16| x.to_f64(),
    bf16::NAN
);
gelem!(
    f16,
    0.0009765625,
    f32::EPSILON as f64,
    f16::from_f64,
    |x: f16| x.to_f64(),
    f16::NAN
);

/// `v` rounded (to nearest even, once) to the communication dtype. Not through `half`'s
/// `from_f64`: it drops the low 32 mantissa bits of the f64 before rounding, which misrounds
/// values just above a tie (seen against the GPU's conversions).
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::Bf16 => round_mantissa(v, 7, -126),
        DType::F16 => round_mantissa(v, 10, -14),
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

/// Round to nearest even with `mantissa` stored bits and minimum normal exponent `emin`
/// (subnormals below it keep the spacing of 2^(emin - mantissa)); finite, in-range values.
fn round_mantissa(v: f64, mantissa: i32, emin: i32) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let biased = ((v.to_bits() >> 52) & 0x7ff) as i32;
    let exp = if biased == 0 { -1023 } else { biased - 1023 };
    let ulp = 2f64.powi(exp.max(emin) - mantissa);
    (v / ulp).round_ties_even() * ulp
}

/// Rank `d`'s cast output: the blocks sent to d, ordered by (position among the owner's blocks,
/// owner), each the owner's input rows (`ins[owner]`, rows of `row_elems`).
pub fn cast_reference(
    blocks: &[CastBlock],
    world: usize,
    ins: &[Vec<f64>],
    row_elems: usize,
    d: usize,
) -> Vec<f64> {
    let mut off = vec![0usize; world];
    let mut local = vec![0usize; world];
    let mut placed = Vec::new(); // (local index, owner, input row, rows)
    for b in blocks {
        if b.dsts.contains(&d) {
            placed.push((local[b.owner], b.owner, off[b.owner], b.rows));
        }
        local[b.owner] += 1;
        off[b.owner] += b.rows;
    }
    placed.sort();
    let mut out = Vec::new();
    for (_, owner, row, rows) in placed {
        out.extend_from_slice(&ins[owner][row * row_elems..(row + rows) * row_elems]);
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Sum,
    Avg,
    Lse,
}

/// What rank d's reduction reads: every rank's partials and lse, and (accumulating) d's prior
/// output and output lse.
pub struct ReduceInputs<'a> {
    pub ins: &'a [Vec<f64>],
    pub lses: &'a [Vec<f64>],
    pub prior: Option<(&'a [f64], &'a [f64])>,
    pub row_elems: usize,
    pub lse_per_row: usize,
}

/// The expected reduction on rank d: (values, lse, scale) where scale bounds the terms'
/// magnitude (Σ |weight · x|, the prior included) for the tolerance.
#[allow(clippy::type_complexity, clippy::needless_range_loop)]
pub fn reduce_reference(
    blocks: &[ReduceBlock],
    world: usize,
    x: &ReduceInputs,
    op: Op,
    d: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let row_elems = x.row_elems;
    // Each source's input row of each block: blocks listing s, ordered by (receiver-local index, receiver).
    let mut local = vec![0usize; world];
    let locals: Vec<usize> = blocks
        .iter()
        .map(|b| {
            local[b.receiver] += 1;
            local[b.receiver] - 1
        })
        .collect();
    let mut in_row = vec![vec![0usize; world]; blocks.len()];
    for s in 0..world {
        let mut mine: Vec<usize> = (0..blocks.len())
            .filter(|&g| blocks[g].srcs.contains(&s))
            .collect();
        mine.sort_by_key(|&g| (locals[g], blocks[g].receiver));
        let mut at = 0;
        for g in mine {
            in_row[g][s] = at;
            at += blocks[g].rows;
        }
    }
    let group = if op == Op::Lse {
        row_elems / x.lse_per_row
    } else {
        row_elems
    };
    let (mut out, mut out_lse, mut scale) = (Vec::new(), Vec::new(), Vec::new());
    let mut out_row = 0usize;
    for (g, b) in blocks.iter().enumerate().filter(|(_, b)| b.receiver == d) {
        for r in 0..b.rows {
            for c in 0..row_elems {
                let h = c / group;
                let mut xs: Vec<(f64, f64)> = b
                    .srcs
                    .iter()
                    .map(|&s| {
                        let row = in_row[g][s] + r;
                        let l = if op == Op::Lse {
                            x.lses[s][row * x.lse_per_row + h]
                        } else {
                            0.0
                        };
                        (x.ins[s][row * row_elems + c], l)
                    })
                    .collect();
                let n = xs.len() as f64;
                let prior = x.prior.map(|(o, l)| {
                    let row = out_row + r;
                    (
                        o[row * row_elems + c],
                        if op == Op::Lse {
                            l[row * x.lse_per_row + h]
                        } else {
                            0.0
                        },
                    )
                });
                let (p, pabs) = match (op, prior) {
                    (Op::Sum | Op::Avg, Some((o, _))) => (o, o.abs()),
                    _ => (0.0, 0.0),
                };
                match op {
                    Op::Sum => {
                        out.push(p + xs.iter().map(|x| x.0).sum::<f64>());
                        scale.push(pabs + xs.iter().map(|x| x.0.abs()).sum::<f64>());
                    }
                    Op::Avg => {
                        out.push(p + xs.iter().map(|x| x.0).sum::<f64>() / n);
                        scale.push(pabs + xs.iter().map(|x| x.0.abs()).sum::<f64>() / n);
                    }
                    Op::Lse => {
                        if let Some(pr) = prior {
                            xs.push(pr);
                        }
                        let m = xs.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
                        let (lse, v, sc) = if m == f64::NEG_INFINITY {
                            (f64::NEG_INFINITY, 0.0, 0.0)
                        } else {
                            let lse = m + xs.iter().map(|x| (x.1 - m).exp()).sum::<f64>().ln();
                            let w = |x: &(f64, f64)| (x.1 - lse).exp();
                            (
                                lse,
                                xs.iter().map(|x| w(x) * x.0).sum(),
                                xs.iter().map(|x| w(x) * x.0.abs()).sum(),
                            )
                        };
                        out.push(v);
                        scale.push(sc);
                        if c % group == 0 {
                            out_lse.push(lse);
                        }
                    }
                }
            }
        }
        out_row += b.rows;
    }
    (out, out_lse, scale)
}

/// Tolerance for a reduced element: accumulating n terms costs about n·eps of Σ|terms| (and the
/// lse weights a few ulps more), then the result is rounded to T: coarser outputs are compared
/// with the reference rounded to T, allowing one ulp of T for a rounding flip.
fn tolerance<T: GElem>(want: f64, scale: f64) -> f64 {
    let acc = 64.0 * T::ACC_EPS * (scale + want.abs());
    if T::EPS > T::ACC_EPS {
        acc + T::EPS * want.abs().max(f64::MIN_POSITIVE)
    } else {
        acc
    }
}

/// Every element: within `want.len()` it must match (bitwise when `scale` is None, else within
/// the tolerance), past it (rows beyond this rank's output) it must still be poison.
pub fn check<T: GElem>(
    what: &str,
    got: &[T],
    want: &[f64],
    scale: Option<&[f64]>,
) -> anyhow::Result<()> {
    let mut bad = 0;
    let mut first = Vec::new();
    for (i, g) in got.iter().enumerate() {
        let gv = g.to_f64();
        let ok = match (want.get(i), scale) {
            (Some(&w), None) => {
                *g == T::from_f64(w) && gv.to_bits() == T::from_f64(w).to_f64().to_bits()
            }
            (Some(&w), Some(s)) => (gv - T::from_f64(w).to_f64()).abs() <= tolerance::<T>(w, s[i]),
            (None, _) => gv.is_nan(),
        };
        if !ok {
            bad += 1;
            if first.len() < 4 {
                let note = if i >= want.len() {
                    " (written past the output)"
                } else if gv.is_nan() {
                    " (never written)"
                } else {
                    ""
                };
                first.push(format!("[{i}] = {gv}, expected {:?}{note}", want.get(i)));
            }
        }
    }
    anyhow::ensure!(
        bad == 0,
        "{what}: {bad} of {} elements wrong: {}",
        got.len(),
        first.join("; ")
    );
    Ok(())
}

pub fn check_lse(what: &str, got: &[f32], want: &[f64]) -> anyhow::Result<()> {
    let mut bad = Vec::new();
    let mut count = 0;
    for (i, &g) in got.iter().enumerate() {
        let ok = match want.get(i) {
            Some(&w) if w == f64::NEG_INFINITY => g == f32::NEG_INFINITY,
            Some(&w) => ((g as f64) - w).abs() <= 1e-5 * (1.0 + w.abs()),
            None => g.is_nan(),
        };
        if !ok {
            count += 1;
            if bad.len() < 4 {
                bad.push(format!("[{i}] = {g}, expected {:?}", want.get(i)));
            }
        }
    }
    anyhow::ensure!(
        count == 0,
        "{what}: {count} of {} lse values wrong: {}",
        got.len(),
        bad.join("; ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_sums_in_matching_order() {
        // Rank 1 receives one block reduced from ranks 0 and 1; each sent 1 row of 2 elements.
        let blocks = vec![ReduceBlock {
            receiver: 1,
            rows: 1,
            srcs: vec![0, 1],
        }];
        let ins = vec![vec![1.0, 2.0], vec![10.0, -20.0]];
        let x = ReduceInputs {
            ins: &ins,
            lses: &[],
            prior: None,
            row_elems: 2,
            lse_per_row: 0,
        };
        assert_eq!(
            reduce_reference(&blocks, 2, &x, Op::Sum, 1).0,
            vec![11.0, -18.0]
        );
        assert_eq!(
            reduce_reference(&blocks, 2, &x, Op::Avg, 1).0,
            vec![5.5, -9.0]
        );
        let prior = (vec![100.0, 100.0], vec![]);
        let x = ReduceInputs {
            prior: Some((&prior.0, &prior.1)),
            ..x
        };
        assert_eq!(
            reduce_reference(&blocks, 2, &x, Op::Avg, 1).0,
            vec![105.5, 91.0]
        );
    }

    #[test]
    fn lse_reference_with_a_prior_source() {
        let blocks = vec![ReduceBlock {
            receiver: 0,
            rows: 1,
            srcs: vec![0],
        }];
        let ins = vec![vec![2.0]];
        let lses = vec![vec![0.0]];
        let prior = (vec![4.0], vec![0.0]);
        let x = ReduceInputs {
            ins: &ins,
            lses: &lses,
            prior: Some((&prior.0, &prior.1)),
            row_elems: 1,
            lse_per_row: 1,
        };
        let (v, l, _) = reduce_reference(&blocks, 1, &x, Op::Lse, 0);
        assert!(
            (v[0] - 3.0).abs() < 1e-12 && (l[0] - 2f64.ln()).abs() < 1e-12,
            "{v:?} {l:?}"
        );
    }

    #[test]
    fn rounding_keeps_the_sticky_bits() {
        // Just above the tie between 1 and 1 + 2^-7 (bf16) / 2^-10 (f16): rounds up.
        assert_eq!(
            round_to(DType::Bf16, 1.0 + 1.0 / 256.0 + 1e-9),
            1.0 + 1.0 / 128.0
        );
        assert_eq!(
            round_to(DType::F16, 1.0 + 1.0 / 2048.0 + 1e-12),
            1.0 + 1.0 / 1024.0
        );
        // Exactly at the tie: to even.
        assert_eq!(round_to(DType::Bf16, 1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_to(DType::Bf16, 1.0 + 3.0 / 256.0), 1.0 + 2.0 / 128.0);
        // Agrees with half's f32 conversion (which uses every bit) on f32 values.
        let mut x = 0.123_456_79f32;
        for _ in 0..10_000 {
            x = (x * 1.618_034).fract() * if x > 0.5 { -1.0 } else { 1.0 } + 1e-3;
            assert_eq!(
                round_to(DType::Bf16, x as f64),
                bf16::from_f32(x).to_f64(),
                "{x}"
            );
            assert_eq!(
                round_to(DType::F16, x as f64),
                f16::from_f32(x).to_f64(),
                "{x}"
            );
        }
        // f16 subnormals: spacing 2^-24.
        assert_eq!(
            round_to(DType::F16, 3.4 * 2f64.powi(-24)),
            3.0 * 2f64.powi(-24)
        );
    }

    #[test]
    fn rounding_to_the_comm_dtype() {
        assert_eq!(round_to(DType::Bf16, 1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(round_to(DType::F16, 1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(round_to(DType::F32, 1.0 + 1e-12), 1.0);
        assert_eq!(round_to(DType::F64, 1.0 + 1e-12), 1.0 + 1e-12);
    }
}
