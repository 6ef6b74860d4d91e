//! A float64 CPU reference of the GEMM (small shapes), and the tolerance weft checks against.

use crate::dtype::{Dtype, GemmElement};
use crate::error::GemmError;
use crate::plan::{BLayout, GemmShape};

/// alpha · A · B + beta · D0 in float64 from the (already rounded) inputs. `d0` may be empty when
/// beta is 0.
pub fn gemm_f64<TI: GemmElement, TO: GemmElement>(
    shape: GemmShape,
    b_layout: BLayout,
    a: &[TI],
    b: &[TI],
    alpha: f64,
    beta: f64,
    d0: &[TO],
) -> Vec<f64> {
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a: Vec<f64> = a[..m * k].iter().map(|x| x.to_f64()).collect();
    // B as k x n row-major.
    let bt: Vec<f64> = match b_layout {
        BLayout::KxN => b[..k * n].iter().map(|x| x.to_f64()).collect(),
        BLayout::NxK => {
            let mut t = vec![0.0; k * n];
            for j in 0..n {
                for kk in 0..k {
                    t[kk * n + j] = b[j * k + kk].to_f64();
                }
            }
            t
        }
    };
    let mut d = vec![0.0f64; m * n];
    for i in 0..m {
        let row = &mut d[i * n..(i + 1) * n];
        for kk in 0..k {
            let av = a[i * k + kk];
            let brow = &bt[kk * n..(kk + 1) * n];
            for j in 0..n {
                row[j] += av * brow[j];
            }
        }
        for j in 0..n {
            row[j] *= alpha;
            if beta != 0.0 {
                row[j] += beta * d0[i * n + j].to_f64();
            }
        }
    }
    d
}

/// Per-element tolerance |got − want| ≤ rel · |want| + abs_per_k · k for inputs of magnitude ≤ 1.
/// rel: one unit in the last place of the output dtype (two independent roundings of nearly equal
/// fp32 sums can land one ulp apart); abs_per_k: fp32 accumulation in a different order (about
/// k · 2⁻²⁴ / 3 for random signs), with a 100× margin. A dropped or doubled K block of 64 moves an
/// element by about 3, far outside.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub rel: f64,
    pub abs_per_k: f64,
}

impl Tolerance {
    pub fn for_output(d: Dtype) -> Self {
        let rel = match d {
            Dtype::Bf16 => 2f64.powi(-7),
            Dtype::F16 => 2f64.powi(-10),
            Dtype::F32 => 2f64.powi(-20),
        };
        Self {
            rel,
            abs_per_k: 2e-6,
        }
    }
    pub fn allows(&self, got: f64, want: f64, k: u32) -> bool {
        // NaN (the poison) never passes.
        (got - want).abs() <= self.rel * want.abs() + self.abs_per_k * k as f64
    }
}

/// Compares every element; the error names the first mismatches and their coordinates.
pub fn check_all<TO: GemmElement>(
    what: &str,
    shape: GemmShape,
    got: &[TO],
    want: &[f64],
    tol: Tolerance,
) -> Result<(), GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<()> {
        let n = shape.n as usize;
        let mut bad = 0usize;
        let mut first = Vec::new();
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let g = g.to_f64();
            if !tol.allows(g, *w, shape.k) {
                bad += 1;
                if first.len() < 5 {
                    first.push(format!("({}, {}): got {g}, want {w}", i / n, i % n));
                }
            }
        }
        anyhow::ensure!(
            got.len() == want.len(),
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        );
        anyhow::ensure!(
            bad == 0,
            "{what} {shape}: {bad} of {} elements outside tolerance ({tol:?}); first: {}",
            got.len(),
            first.join("; ")
        );
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference against products computed by hand, both B layouts, alpha and beta.
    #[test]
    fn reference_matches_hand_computed_products() {
        let shape = GemmShape::new(2, 3, 2);
        let f = |v: &[f32]| {
            v.iter()
                .map(|&x| half::bf16::from_f32(x))
                .collect::<Vec<_>>()
        };
        let a = f(&[1.0, 2.0, 3.0, 4.0]); // [[1,2],[3,4]]
        let b_kn = f(&[1.0, 0.0, -1.0, 2.0, 1.0, 0.5]); // [[1,0,-1],[2,1,0.5]]
        let b_nk = f(&[1.0, 2.0, 0.0, 1.0, -1.0, 0.5]);
        let want = [5.0, 2.0, 0.0, 11.0, 4.0, -1.0];
        let none: [f32; 0] = [];
        assert_eq!(
            gemm_f64(shape, BLayout::KxN, &a, &b_kn, 1.0, 0.0, &none),
            want
        );
        assert_eq!(
            gemm_f64(shape, BLayout::NxK, &a, &b_nk, 1.0, 0.0, &none),
            want
        );
        let d0 = [1.0f32; 6];
        let got = gemm_f64(shape, BLayout::KxN, &a, &b_kn, 2.0, -1.0, &d0);
        assert_eq!(got, want.map(|x| 2.0 * x - 1.0));
    }

    #[test]
    fn tolerance_rejects_nan_and_a_missing_k_block() {
        let t = Tolerance::for_output(Dtype::Bf16);
        assert!(!t.allows(f64::NAN, 1.0, 1024));
        assert!(t.allows(10.0 + 10.0 * 2f64.powi(-8), 10.0, 1024));
        assert!(!t.allows(10.0 + 3.0, 10.0, 1024));
    }
}
