//! nccl-tests' sweep flags for the suites that time message sizes (`nccl`, `collectives`):
//! `-b/--minbytes`, `-e/--maxbytes`, `-f/--stepfactor` choose the sizes (min, min·f, min·f², …
//! up to max), `-n/--iters` and `-w/--warmup_iters` the timed and untimed eager calls per size
//! (per timing block; graph replay keeps its own counts). Unlike nccl-tests: one bound alone is
//! that one size, and sizes are whole numbers.

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
    /// `min` and `max` as given (either alone: that one size), `factor` (2 when not given) only
    /// with both. Refused, naming the flag: a size under 4 bytes (one f32), min above max, a
    /// factor under 2 or without both bounds.
    pub fn new(
        min: Option<usize>,
        max: Option<usize>,
        factor: Option<usize>,
    ) -> Result<Option<Self>, String> {
        for (flag, bound) in [("-b/--minbytes", min), ("-e/--maxbytes", max)] {
            if let Some(b) = bound.filter(|&b| b < 4) {
                return Err(format!("{flag} {b}: sizes start at 4 bytes (one f32)"));
            }
        }
        if factor.is_some() && (min.is_none() || max.is_none()) {
            return Err("-f/--stepfactor needs both -b/--minbytes and -e/--maxbytes".into());
        }
        let (min, max) = match (min, max) {
            (None, None) => return Ok(None),
            (Some(b), None) => (b, b),
            (None, Some(e)) => (e, e),
            (Some(b), Some(e)) => (b, e),
        };
        let factor = factor.unwrap_or(2);
        if min > max {
            return Err(format!("-b/--minbytes {min} is above -e/--maxbytes {max}"));
        }
        if factor < 2 {
            return Err(format!("-f/--stepfactor {factor}: at least 2"));
        }
        Ok(Some(SizeSweep { min, max, factor }))
    }

    /// Ascending: min, then each times the factor while it stays ≤ max (and below usize::MAX).
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

/// A size: a whole number of bytes with an optional K, M or G (powers of 1024, as nccl-tests
/// reads them; nccl-tests also takes fractions and ignores what follows the letter).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let not_a_size = || format!("{text:?}: a size is whole bytes, or ends in K, M or G");
    let (digits, scale) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let scale: usize = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(not_a_size()),
            };
            (&t[..i], scale)
        }
        _ => (t, 1),
    };
    let n: usize = digits.parse().map_err(|e: std::num::ParseIntError| {
        if *e.kind() == std::num::IntErrorKind::PosOverflow {
            format!("{text:?}: too large")
        } else {
            not_a_size()
        }
    })?;
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?}: too large"))
}

/// Whether a sized suite's `buffers` buffers of `elems` f32 each (what its largest size,
/// `largest` bytes, needs) fit in `free` bytes; else why not, naming the flag that sets it.
pub fn buffers_fit(
    buffers: usize,
    elems: usize,
    largest: usize,
    free: usize,
) -> Result<(), String> {
    let need = buffers.saturating_mul(elems).saturating_mul(4);
    if need <= free {
        return Ok(());
    }
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    Err(format!(
        "the largest size, {largest} B (-e/--maxbytes, or the suite's grid), needs {:.2} GiB of \
         buffers a rank; this GPU has {:.2} GiB free",
        gib(need),
        gib(free)
    ))
}

/// [`buffers_fit`] with the free memory of `ctx`'s GPU, before a suite allocates.
pub fn check_buffers_fit(
    ctx: &cudarc::driver::CudaContext,
    buffers: usize,
    elems: usize,
    largest: usize,
) -> anyhow::Result<()> {
    let (free, _) = ctx.mem_get_info()?;
    buffers_fit(buffers, elems, largest, free).map_err(|e| anyhow::anyhow!("weft bench: {e}"))
}

/// At most this many timed calls per size (each takes two CUDA events).
pub const MAX_ITERS: usize = 100_000;

/// What the sweep flags ask of a sized suite; each part `None` where the suite keeps its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub sizes: Option<SizeSweep>,
    /// Timed eager calls per size (per timing block where a suite alternates weft and its
    /// baseline; graph replay keeps its own counts).
    pub iters: Option<usize>,
    /// Untimed calls before each timing block.
    pub warmup: Option<usize>,
}

impl Sweep {
    /// From the flags as given; refused, naming the flag, where a sweep is impossible or `iters`
    /// is 0 or above [`MAX_ITERS`].
    pub fn from_flags(
        min: Option<usize>,
        max: Option<usize>,
        factor: Option<usize>,
        iters: Option<usize>,
        warmup: Option<usize>,
    ) -> Result<Sweep, String> {
        if let Some(n) = iters.filter(|n| !(1..=MAX_ITERS).contains(n)) {
            return Err(format!("-n/--iters {n}: from 1 to {MAX_ITERS} timed calls"));
        }
        Ok(Sweep {
            sizes: SizeSweep::new(min, max, factor)?,
            iters,
            warmup,
        })
    }

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
        for bad in ["", "K", "4X", "-4", "1.5M", "4KB"] {
            assert!(
                parse_size(bad).unwrap_err().contains("whole bytes"),
                "{bad:?}"
            );
        }
        assert!(parse_size("99999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_size("99999999999G")
            .unwrap_err()
            .contains("too large"));
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
            (None, Some(2), None, "-e/--maxbytes 2"),
            (Some(8), None, Some(2), "needs both"),
            (Some(8 << 10), Some(4 << 10), None, "is above -e/--maxbytes"),
            (Some(8), Some(64), Some(1), "-f/--stepfactor 1"),
            (None, None, Some(2), "needs both"),
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
        assert_eq!(
            Sweep::from_flags(Some(8), Some(32), None, Some(7), Some(0)),
            Ok(some)
        );
    }

    #[test]
    fn buffers_that_do_not_fit_are_named_before_allocation() {
        assert!(buffers_fit(3, 1 << 28, 1 << 30, 3 << 30).is_ok());
        let e = buffers_fit(3, 1 << 28, 1 << 30, (3 << 30) - 1).unwrap_err();
        assert!(
            e.contains("1073741824 B (-e/--maxbytes") && e.contains("3.00 GiB"),
            "{e}"
        );
        // No overflow for absurd sizes.
        assert!(buffers_fit(3, usize::MAX, usize::MAX, usize::MAX - 1).is_err());
    }

    #[test]
    fn iterations_are_bounded() {
        for n in [0, MAX_ITERS + 1, usize::MAX] {
            let e = Sweep::from_flags(None, None, None, Some(n), None).unwrap_err();
            assert!(e.contains(&format!("-n/--iters {n}")), "{e}");
        }
        assert!(Sweep::from_flags(None, None, None, Some(MAX_ITERS), None).is_ok());
    }
}
