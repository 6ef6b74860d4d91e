//! Checking a bf16 sum over ranks against another path to the same sum: the bound
//! world · (2⁻⁷ · Σ_r |partial_r| + k · 2⁻¹⁸) per element. Each rank's partial may round
//! differently in the two GEMMs (≤ 2⁻⁷ |partial_r|) and sum its k products in another order (fp32;
//! an allowance of k · 2⁻¹⁸ for |a|, |b| ≤ 1, empirical — the worst case is about k² · 2⁻²⁴ — that
//! covers products which cancel, where the difference is more than 2⁻⁷ of the small partial), and
//! each of the world − 1 bf16 additions of either reduction rounds by ≤ 2⁻⁸ Σ_r |partial_r|.

use crate::gemm_data::download;
use crate::job::Job;
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use weft_pgl::nccl::ReduceOp;

/// The per-element bound for sums of `partial` (this rank's GEMM output, `k` products of operands
/// within [-1, 1] per element) over every rank. Collective: every rank calls it.
pub fn sum_bound(
    job: &mut Job,
    stream: &Arc<CudaStream>,
    partial: &CudaSlice<bf16>,
    k: u32,
) -> anyhow::Result<Vec<f32>> {
    let world = job.world() as f32;
    let abs: Vec<f32> = download(stream, partial)?
        .iter()
        .map(|v| v.to_f32().abs())
        .collect();
    let mut s = stream.clone_htod(&abs)?;
    job.comm()?
        .all_reduce_in_place(&mut s, ReduceOp::Sum, stream)?;
    Ok(download(stream, &s)?
        .iter()
        .map(|x| world * (x / 128.0 + k as f32 / 262_144.0))
        .collect())
}

/// Every element of `got` within `bound` of `want` (rows of `n` for the message).
pub fn check_within(
    what: &str,
    got: &[bf16],
    want: &[bf16],
    bound: &[f32],
    n: usize,
) -> anyhow::Result<()> {
    let mut bad = 0usize;
    let mut first = None;
    for (i, ((g, w), b)) in got.iter().zip(want).zip(bound).enumerate() {
        let (g, w) = (g.to_f32(), w.to_f32());
        #[allow(clippy::neg_cmp_op_on_partial_ord)] // a NaN difference must fail the check too
        if !((g - w).abs() <= b + 1e-6) {
            bad += 1;
            first.get_or_insert((i, g, w, *b));
        }
    }
    match first {
        None => Ok(()),
        Some((i, g, w, b)) => anyhow::bail!(
            "{what}: {bad} of {} elements outside the bound; first at ({}, {}): got {g}, expected {w}, bound {b}",
            got.len(),
            i / n,
            i % n
        ),
    }
}

/// Rows `rows` (each of `n` elements) of a row-major matrix, in that order.
pub fn pick_rows<T: Copy>(values: &[T], rows: &[u32], n: usize) -> Vec<T> {
    rows.iter()
        .flat_map(|&r| values[r as usize * n..(r as usize + 1) * n].iter().copied())
        .collect()
}
