//! The bound on a wait: a duration from the environment or the default, converted to SM cycles at
//! the device's maximum clock (so it lasts at least that long; longer at lower clocks).

use anyhow::Context;
use std::time::Duration;

/// The variable that overrides the default bound, in milliseconds.
pub const TIMEOUT_VAR: &str = "WEFT_BARRIER_TIMEOUT_MS";

/// Long enough for any launch skew between the streams, short enough to fail a suite in seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// [`TIMEOUT_VAR`] when set, else [`DEFAULT_TIMEOUT`].
pub fn default_timeout() -> anyhow::Result<Duration> {
    timeout_from(std::env::var(TIMEOUT_VAR).ok().as_deref())
}

fn timeout_from(var: Option<&str>) -> anyhow::Result<Duration> {
    let Some(text) = var else {
        return Ok(DEFAULT_TIMEOUT);
    };
    let ms: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("{TIMEOUT_VAR}={text:?} is not a whole number of milliseconds"))?;
    anyhow::ensure!(ms > 0, "{TIMEOUT_VAR}=0: a wait needs a positive bound");
    Ok(Duration::from_millis(ms))
}

/// `d` in cycles of a `clock_khz` clock, rounded up, at least 1.
pub fn cycles(d: Duration, clock_khz: u32) -> u64 {
    let c = (d.as_nanos() * clock_khz as u128)
        .div_ceil(1_000_000)
        .max(1);
    u64::try_from(c).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_from_the_variable() {
        assert_eq!(timeout_from(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from(Some(" 250 ")).unwrap(),
            Duration::from_millis(250)
        );
        assert!(timeout_from(Some("0"))
            .unwrap_err()
            .to_string()
            .contains("positive bound"));
        assert!(timeout_from(Some("1s"))
            .unwrap_err()
            .to_string()
            .contains("whole number"));
    }

    #[test]
    fn cycles_at_a_clock() {
        assert_eq!(cycles(Duration::from_millis(100), 1_980_000), 198_000_000);
        assert_eq!(cycles(Duration::from_nanos(1), 1_000), 1);
        assert_eq!(cycles(Duration::ZERO, 1_980_000), 1);
    }
}
