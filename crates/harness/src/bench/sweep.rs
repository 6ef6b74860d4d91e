//! nccl-tests' sweep flags for the suites that time message sizes (`nccl`, `collectives`):
//! `-b/--minbytes`, `-e/--maxbytes`, `-f/--stepfactor` choose the sizes (min, min·f, min·f², …
//! up to max), `-n/--iters` and `-w/--warmup_iters` the timed and untimed calls per size.

/// The suites these flags apply to.
pub const SIZED_SUITES: &[&str] = &["nccl", "collectives"];

/// Sizes min, min·factor, min·factor², … up to max, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeSweep {
    pub min: usize,
    pub max: usize,
    pub factor: usize,
}

impl SizeSweep {
    /// `min` and `max` as given (either alone: that one size), `factor` 2 when not given.
    /// Refused: a size under 4 bytes (one f32), min above max, a factor under 2.
    pub fn new(
        min: Option<usize>,
        max: Option<usize>,
        factor: Option<usize>,
    ) -> Result<Option<Self>, String> {
        let (min, max) = match (min, max) {
            (None, None) if factor.is_some() => {
                return Err("-f/--stepfactor needs -b/--minbytes or -e/--maxbytes".into())
            }
            (None, None) => return Ok(None),
            (Some(b), None) => (b, b),
            (None, Some(e)) => (e, e),
            (Some(b), Some(e)) => (b, e),
        };
        let factor = factor.unwrap_or(2);
        if min < 4 {
            return Err(format!(
                "-b/--minbytes {min}: sizes start at 4 bytes (one f32)"
            ));
        }
        if min > max {
            return Err(format!("-b/--minbytes {min} is above -e/--maxbytes {max}"));
        }
        if factor < 2 {
            return Err(format!("-f/--stepfactor {factor}: at least 2"));
        }
        Ok(Some(SizeSweep { min, max, factor }))
    }

    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes = vec![self.min];
        while let Some(next) = sizes.last().unwrap().checked_mul(self.factor) {
            if next > self.max {
                break;
            }
            sizes.push(next);
        }
        sizes
    }
}

/// A size as nccl-tests reads it: a count of bytes with an optional K, M or G (powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let (digits, scale) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let scale: usize = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("{text:?}: a size is bytes, or ends in K, M or G")),
            };
            (&t[..i], scale)
        }
        _ => (t, 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{text:?}: a size is bytes, or ends in K, M or G"))?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?}: too large"))
}

/// What the sweep flags ask of a sized suite; each part `None` where the suite keeps its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub sizes: Option<SizeSweep>,
    /// Timed calls per size (per timing block where a suite alternates weft and its baseline).
    pub iters: Option<usize>,
    /// Untimed calls before them.
    pub warmup: Option<usize>,
}

impl Sweep {
    pub fn is_empty(&self) -> bool {
        *self == Sweep::default()
    }

    pub fn sizes_or(&self, grid: Vec<usize>) -> Vec<usize> {
        self.sizes.map_or(grid, |s| s.sizes())
    }

    pub fn iters_or(&self, default: usize) -> usize {
        self.iters.unwrap_or(default)
    }

    pub fn warmup_or(&self, default: usize) -> usize {
        self.warmup.unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_nccl_tests_reads_them() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("128m"), Ok(128 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        for bad in ["", "K", "4X", "-4", "1.5M", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_sweep_goes_from_min_by_the_factor_up_to_max() {
        let s = SizeSweep::new(Some(4096), Some(1 << 20), Some(4))
            .unwrap()
            .unwrap();
        assert_eq!(s.sizes(), vec![4096, 16384, 65536, 262144, 1 << 20]);
        // Max not on the ladder: the last size below it.
        let s = SizeSweep::new(Some(3 << 10), Some(20 << 10), None)
            .unwrap()
            .unwrap();
        assert_eq!(s.sizes(), vec![3 << 10, 6 << 10, 12 << 10]);
        // One bound alone: that size.
        let s = SizeSweep::new(None, Some(1 << 30), None).unwrap().unwrap();
        assert_eq!(s.sizes(), vec![1 << 30]);
        // No overflow at the top of usize.
        let s = SizeSweep::new(Some(1 << 62), Some(usize::MAX), Some(2))
            .unwrap()
            .unwrap();
        assert_eq!(s.sizes(), vec![1 << 62, 1 << 63]);
        assert_eq!(SizeSweep::new(None, None, None), Ok(None));
    }

    #[test]
    fn impossible_sweeps_are_refused_with_the_flag_named() {
        for (b, e, f, says) in [
            (Some(2), None, None, "-b/--minbytes 2"),
            (Some(8 << 10), Some(4 << 10), None, "is above -e/--maxbytes"),
            (Some(8), Some(64), Some(1), "-f/--stepfactor 1"),
            (None, None, Some(2), "needs -b/--minbytes"),
        ] {
            let e = SizeSweep::new(b, e, f).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn a_suite_keeps_its_own_choices_where_no_flag_is_given() {
        let none = Sweep::default();
        assert!(none.is_empty());
        assert_eq!(none.sizes_or(vec![4096]), vec![4096]);
        assert_eq!((none.iters_or(50), none.warmup_or(5)), (50, 5));
        let some = Sweep {
            sizes: SizeSweep::new(Some(8), Some(32), None).unwrap(),
            iters: Some(7),
            warmup: Some(0),
        };
        assert!(!some.is_empty());
        assert_eq!(some.sizes_or(vec![4096]), vec![8, 16, 32]);
        assert_eq!((some.iters_or(50), some.warmup_or(5)), (7, 0));
    }
}
