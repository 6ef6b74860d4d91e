//! The bound on a wait: a duration from [`TIMEOUT_VAR`] or the default, turned into SM cycles
//! at the device's maximum clock by weft-sync's [`WaitBudget`](weft_sync::WaitBudget) (so it lasts
//! at least that long; longer at lower clocks).

use crate::error::BarrierError;
use std::time::Duration;

/// The variable that overrides the default bound, in milliseconds.
pub const TIMEOUT_VAR: &str = "WEFT_BARRIER_TIMEOUT_MS";

/// Long enough for any launch skew between the streams, short enough to fail a suite in seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// [`TIMEOUT_VAR`] when set, else [`DEFAULT_TIMEOUT`].
pub fn default_timeout() -> Result<Duration, BarrierError> {
    Ok(weft_sync::budget::timeout_from_env(
        TIMEOUT_VAR,
        DEFAULT_TIMEOUT,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_sync::budget::timeout_from_text;
    use weft_sync::WaitBudget;

    fn timeout_from(text: Option<&str>) -> Result<Duration, weft_sync::SyncError> {
        timeout_from_text(TIMEOUT_VAR, text, DEFAULT_TIMEOUT)
    }

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
        let cycles = |d, khz| WaitBudget::from_duration(d, khz).cycles;
        assert_eq!(cycles(Duration::from_millis(100), 1_980_000), 198_000_000);
        assert_eq!(cycles(Duration::from_nanos(1), 1_000), 1);
        assert_eq!(cycles(Duration::ZERO, 1_980_000), 1);
    }
}
