//! The wait kernel's report as an error message.

use weft_kernels::abi::{self, weft_kernel_barrier_report};

/// The report as a message; None when no wait gave up.
pub fn describe(r: &weft_kernel_barrier_report, clock_khz: u32) -> Option<String> {
    match r.status as u32 {
        abi::WEFT_KERNEL_BARRIER_STATUS_NONE => None,
        abi::WEFT_KERNEL_BARRIER_STATUS_TIMEOUT => Some(format!(
            "KernelBarrier wait timed out: target {} arrivals, observed {} after {} cycles ({:.3} ms by the GPU timer); \
             bound {} cycles = {:.3} ms at {} MHz (a communication kernel did not start or does not arrive)",
            r.target,
            r.observed,
            r.elapsed_cycles,
            r.elapsed_ns as f64 / 1e6,
            r.budget_cycles,
            r.budget_cycles as f64 / clock_khz.max(1) as f64,
            clock_khz / 1000,
        )),
        other => Some(format!("KernelBarrier report holds unknown status {other} (memory corrupted?)")),
    }
}

/// A timed-out wait's report for tests: target 7, observed 5, a 100 ms bound at 1980 MHz.
#[cfg(test)]
pub(crate) fn timed_out_report() -> weft_kernel_barrier_report {
    weft_kernel_barrier_report {
        status: abi::WEFT_KERNEL_BARRIER_STATUS_TIMEOUT as i32,
        target: 7,
        observed: 5,
        reserved: 0,
        elapsed_ns: 100_500_000,
        elapsed_cycles: 198_000_040,
        budget_cycles: 198_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_target_observed_and_bound() {
        assert_eq!(
            describe(&weft_kernel_barrier_report::default(), 1_980_000),
            None
        );
        let r = timed_out_report();
        let msg = describe(&r, 1_980_000).unwrap();
        for part in [
            "target 7 arrivals, observed 5",
            "(100.500 ms by the GPU timer)",
            "bound 198000000 cycles = 100.000 ms at 1980 MHz",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
        assert!(describe(&weft_kernel_barrier_report { status: 9, ..r }, 1)
            .unwrap()
            .contains("unknown status 9"));
    }

    #[test]
    fn report_layout_matches_the_header() {
        assert_eq!(std::mem::size_of::<weft_kernel_barrier_report>(), 40);
    }
}
