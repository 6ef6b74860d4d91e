//! Test data: element types the suites exercise, seeded random inputs every rank can regenerate
//! for any other rank (so references are computed independently on the CPU), and poison values.

use crate::job::Job;
use cudarc::driver::DeviceRepr;
use cudarc::nccl::NcclType;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// An element type used in correctness suites. Values are small integers, exactly representable
/// in every type, so sums over up to 8 ranks are exact and results compare bit for bit.
pub trait Elem:
    NcclType + DeviceRepr + Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
    const NAME: &'static str;
    fn from_small_int(v: i32) -> Self;
    /// A value no correct result contains (NaN for floats, a sentinel for integers).
    fn poison() -> Self;
    fn is_poison(self) -> bool;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    fn from_small_int(v: i32) -> Self {
        v as f32
    }
    fn poison() -> Self {
        f32::NAN
    }
    fn is_poison(self) -> bool {
        self.is_nan()
    }
}

impl Elem for f64 {
    const NAME: &'static str = "f64";
    fn from_small_int(v: i32) -> Self {
        v as f64
    }
    fn poison() -> Self {
        f64::NAN
    }
    fn is_poison(self) -> bool {
        self.is_nan()
    }
}

impl Elem for bf16 {
    const NAME: &'static str = "bf16";
    fn from_small_int(v: i32) -> Self {
        bf16::from_f32(v as f32)
    }
    fn poison() -> Self {
        bf16::NAN
    }
    fn is_poison(self) -> bool {
        self.is_nan()
    }
}

impl Elem for half::f16 {
    const NAME: &'static str = "f16";
    fn from_small_int(v: i32) -> Self {
        half::f16::from_f32(v as f32)
    }
    fn poison() -> Self {
        half::f16::NAN
    }
    fn is_poison(self) -> bool {
        self.is_nan()
    }
}

impl Elem for i32 {
    const NAME: &'static str = "i32";
    fn from_small_int(v: i32) -> Self {
        v
    }
    fn poison() -> Self {
        i32::MIN
    }
    fn is_poison(self) -> bool {
        self == i32::MIN
    }
}

/// Small integers in [-16, 16]: a sum over 8 ranks stays within bf16's exact integers (±256).
pub fn small_ints(seed: u64, rank: usize, count: usize) -> Vec<i32> {
    let mut rng = StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..count).map(|_| rng.random_range(-16..=16)).collect()
}

/// A seed agreed by all ranks: `WEFT_SEED` when set (to reproduce a failure), else rank 0's clock.
pub fn shared_seed(job: &mut Job) -> anyhow::Result<u64> {
    let mine = match std::env::var("WEFT_SEED") {
        Ok(s) => s
            .parse()
            .map_err(|_| anyhow::anyhow!("WEFT_SEED={s:?} is not an integer"))?,
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
    };
    let bytes = job.rdzv.broadcast(0, &mine.to_le_bytes())?;
    let arr: [u8; 8] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| anyhow::anyhow!("seed broadcast returned {} bytes", bytes.len()))?;
    Ok(u64::from_le_bytes(arr))
}

/// Compares every element; the error names the first mismatches, unwritten (poison) elements
/// and how many differ.
pub fn check_equal<T: Elem>(what: &str, got: &[T], want: &[T]) -> anyhow::Result<()> {
    if got.len() != want.len() {
        anyhow::bail!("{what}: {} elements, expected {}", got.len(), want.len());
    }
    let mut bad = 0usize;
    let mut first = Vec::new();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            bad += 1;
            if first.len() < 4 {
                let note = if g.is_poison() {
                    " (never written)"
                } else {
                    ""
                };
                first.push(format!("[{i}] = {g:?}, expected {w:?}{note}"));
            }
        }
    }
    if bad > 0 {
        anyhow::bail!(
            "{what}: {bad} of {} elements wrong: {}",
            got.len(),
            first.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_reproducible_per_rank_and_differ_between_ranks() {
        assert_eq!(small_ints(7, 2, 100), small_ints(7, 2, 100));
        assert_ne!(small_ints(7, 1, 100), small_ints(7, 2, 100));
        assert!(small_ints(7, 0, 1000)
            .iter()
            .all(|v| (-16..=16).contains(v)));
    }

    #[test]
    fn check_equal_reports_mismatches_and_poison() {
        assert!(check_equal("x", &[1.0f32, 2.0], &[1.0, 2.0]).is_ok());
        let e = check_equal("x", &[1.0f32, f32::NAN], &[1.0, 2.0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 of 2") && e.contains("never written"), "{e}");
        // Sums of 8 values in [-16,16] are exact in bf16.
        let s: f32 = (0..8).map(|_| bf16::from_small_int(-16).to_f32()).sum();
        assert_eq!(bf16::from_f32(s).to_f32(), -128.0);
    }
}
