//! Wait budgets: how long a device wait may poll before it reports and traps, in SM clock cycles
//! (what clock64() counts), derived from a duration and the device's maximum SM clock.
//!
//! The SM clock never exceeds its maximum, so a budget of `d` at the maximum clock lasts at least
//! `d` of wall time; it lasts longer when the SM runs slower (idle or throttled clocks).

use crate::error::SyncError;
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;
use std::time::Duration;

/// The variable that overrides the default wait bound, in milliseconds.
pub const TIMEOUT_VAR: &str = "WEFT_SYNC_TIMEOUT_MS";

/// The default bound: long enough for launch skew between ranks and for long stress launches to
/// line up, short enough that a lost signal fails a suite in seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitBudget {
    /// clock64() cycles one wait may poll.
    pub cycles: u64,
    /// The maximum SM clock the cycles were derived from (kHz).
    pub clock_khz: u32,
}

impl WaitBudget {
    /// `d` at `clock_khz` (rounded up to a whole cycle; at least one cycle).
    pub fn from_duration(d: Duration, clock_khz: u32) -> Self {
        let cycles = (d.as_nanos() * clock_khz as u128)
            .div_ceil(1_000_000)
            .max(1);
        Self {
            cycles: u64::try_from(cycles).unwrap_or(u64::MAX),
            clock_khz,
        }
    }

    /// `d` on `ctx`'s device.
    pub fn for_device(ctx: &Arc<CudaContext>, d: Duration) -> Result<Self, SyncError> {
        Ok(Self::from_duration(d, sm_clock_khz(ctx)?))
    }

    /// The default bound ([`TIMEOUT_VAR`] or [`DEFAULT_TIMEOUT`]) on `ctx`'s device.
    pub fn default_for(ctx: &Arc<CudaContext>) -> Result<Self, SyncError> {
        Self::for_device(ctx, default_timeout()?)
    }

    /// The shortest wall time the budget lasts (at the maximum clock).
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(
            u64::try_from(self.cycles as u128 * 1_000_000 / self.clock_khz.max(1) as u128)
                .unwrap_or(u64::MAX),
        )
    }
}

/// [`TIMEOUT_VAR`] when set, else [`DEFAULT_TIMEOUT`].
pub fn default_timeout() -> Result<Duration, SyncError> {
    timeout_from_env(TIMEOUT_VAR, DEFAULT_TIMEOUT)
}

/// A wait bound from environment variable `var` (whole milliseconds, 1 to one hour), else
/// `default`. Shared by every crate whose device waits have their own variable.
pub fn timeout_from_env(var: &str, default: Duration) -> Result<Duration, SyncError> {
    timeout_from_text(var, std::env::var(var).ok().as_deref(), default)
}

/// `text` (the value of `var`, if set) as a bound.
pub fn timeout_from_text(
    var: &str,
    text: Option<&str>,
    default: Duration,
) -> Result<Duration, SyncError> {
    let Some(text) = text else {
        return Ok(default);
    };
    let refused = |reason: &str| SyncError::Setting {
        var: var.to_string(),
        value: text.to_string(),
        reason: reason.to_string(),
    };
    let ms: u64 = text
        .trim()
        .parse()
        .map_err(|_| refused("not a whole number of milliseconds"))?;
    if ms == 0 {
        return Err(refused("a wait needs a positive bound"));
    }
    // A bound of hours is no bound: a lost signal must surface while someone is watching.
    if ms > 3_600_000 {
        return Err(refused("at most 3600000 (one hour)"));
    }
    Ok(Duration::from_millis(ms))
}

/// The device's maximum SM clock in kHz (CU_DEVICE_ATTRIBUTE_CLOCK_RATE).
pub fn sm_clock_khz(ctx: &Arc<CudaContext>) -> Result<u32, SyncError> {
    let khz = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
        .map_err(SyncError::setup("reading the SM clock rate"))?;
    if khz <= 0 {
        return Err(SyncError::setup("reading the SM clock rate")(format!(
            "the device reports an SM clock of {khz} kHz"
        )));
    }
    Ok(khz as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout_from(text: Option<&str>) -> Result<Duration, SyncError> {
        timeout_from_text(TIMEOUT_VAR, text, DEFAULT_TIMEOUT)
    }

    #[test]
    fn cycles_from_duration_and_back() {
        // H200: 1980 MHz.
        let b = WaitBudget::from_duration(Duration::from_millis(100), 1_980_000);
        assert_eq!(b.cycles, 198_000_000);
        assert_eq!(b.duration(), Duration::from_millis(100));
        // Rounds up, never zero.
        assert_eq!(
            WaitBudget::from_duration(Duration::from_nanos(1), 1_000).cycles,
            1
        );
        assert_eq!(
            WaitBudget::from_duration(Duration::ZERO, 1_980_000).cycles,
            1
        );
        assert_eq!(
            WaitBudget::from_duration(Duration::from_nanos(1001), 1_000_000).cycles,
            1001
        );
        // Ten seconds at 2 GHz fits easily; absurd durations saturate rather than wrap.
        assert_eq!(
            WaitBudget::from_duration(DEFAULT_TIMEOUT, 2_000_000).cycles,
            20_000_000_000
        );
        assert_eq!(
            WaitBudget::from_duration(Duration::MAX, u32::MAX).cycles,
            u64::MAX
        );
    }

    #[test]
    fn timeout_variable() {
        assert_eq!(timeout_from(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_from(Some(" 250 ")).unwrap(),
            Duration::from_millis(250)
        );
        assert!(timeout_from(Some("0"))
            .unwrap_err()
            .to_string()
            .contains("positive"));
        assert!(timeout_from(Some("1s"))
            .unwrap_err()
            .to_string()
            .contains("WEFT_SYNC_TIMEOUT_MS=\"1s\""));
    }

    #[test]
    fn a_refused_setting_is_typed() {
        for (text, reason) in [
            ("0", "positive"),
            ("1s", "whole number"),
            ("3600001", "one hour"),
        ] {
            match timeout_from(Some(text)) {
                Err(SyncError::Setting {
                    var,
                    value,
                    reason: why,
                }) => {
                    assert_eq!((var.as_str(), value.as_str()), (TIMEOUT_VAR, text));
                    assert!(why.contains(reason), "{text}: {why}");
                }
                other => panic!("{text}: expected SyncError::Setting, got {other:?}"),
            }
        }
    }
}
