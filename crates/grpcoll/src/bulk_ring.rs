//! The ring of shared-memory buffers a native pull block bulk-loads its sources' rows into
//! (kernels/grpcoll/grpcoll.cu, "pull through shared memory"): its buffer size and depth, chosen
//! per plan, and the launch's dynamic shared memory.

use crate::error::GrpcollError;
use anyhow::ensure;
use weft_kernels::abi::{weft_grpcoll_pull_smem_bytes, WEFT_GRPCOLL_BULK_MAX_STAGES};

/// Default ring: three buffers of 64 KiB. On 24 SMs of two H200s it moved the reduces 3–24 %
/// faster than two of 96 KiB (the loads of two units in flight beside the unit being reduced,
/// instead of one); on 96 SMs within −2.1 … +8 % (crates/grpcoll/README.md, "Measured").
const DEFAULT_BUFFER_BYTES: u32 = 64 << 10;
const DEFAULT_STAGES: u32 = 3;
/// Overrides, for comparisons: buffer KiB (0: the sources are read straight from peer memory) and
/// the ring's depth.
const BUFFER_KIB_VAR: &str = "WEFT_GRPCOLL_BULK_KIB";
const STAGES_VAR: &str = "WEFT_GRPCOLL_BULK_STAGES";

/// `stages` buffers of `buffer_bytes`; `buffer_bytes` 0: no ring (direct reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BulkRing {
    pub buffer_bytes: u32,
    pub stages: u32,
}

impl BulkRing {
    pub const NONE: BulkRing = BulkRing {
        buffer_bytes: 0,
        stages: 0,
    };

    /// The launch's dynamic shared memory (0 without a ring).
    pub fn smem_bytes(self) -> u32 {
        // SAFETY: a pure function of its arguments.
        unsafe { weft_grpcoll_pull_smem_bytes(self.buffer_bytes, self.stages) }
    }

    /// The ring on a device whose kernel may take `optin` bytes of dynamic shared memory: the
    /// default, or `WEFT_GRPCOLL_BULK_KIB` / `WEFT_GRPCOLL_BULK_STAGES` (a buffer that does not
    /// fit the ring is refused, naming the largest that does; with only the depth given, the
    /// default buffer or the largest that fits that depth); none where the default cannot fit.
    pub fn choose(optin: u32) -> anyhow::Result<BulkRing> {
        Self::choose_with(optin, |v| std::env::var(v).ok())
    }

    fn choose_with(optin: u32, var: impl Fn(&str) -> Option<String>) -> anyhow::Result<BulkRing> {
        let whole = |name: &str, v: &str| -> anyhow::Result<u32> {
            v.trim().parse().map_err(|_| {
                GrpcollError::Options(format!("{name}={v:?} is not a whole number")).into()
            })
        };
        let depth_given = var(STAGES_VAR).is_some();
        let stages = match var(STAGES_VAR) {
            Some(v) => {
                let s = whole(STAGES_VAR, &v)?;
                // A ring has at least two buffers (one loading while one is reduced); the
                // kernel's mbarrier arrays hold at most WEFT_GRPCOLL_BULK_MAX_STAGES.
                ensure!(
                    (2..=WEFT_GRPCOLL_BULK_MAX_STAGES).contains(&s),
                    GrpcollError::Options(format!(
                        "{STAGES_VAR}={s}: the ring takes 2 to {WEFT_GRPCOLL_BULK_MAX_STAGES} buffers"
                    ))
                );
                s
            }
            None => DEFAULT_STAGES,
        };
        let fits = |buffer_bytes: u32| {
            BulkRing {
                buffer_bytes,
                stages,
            }
            .smem_bytes()
                <= optin
        };
        // The largest buffer that fits, in whole KiB (a bulk load's transaction count stays below
        // 2^20 at 1023 KiB).
        let most_kib = (0..1024u32).rev().find(|&k| fits(k << 10)).unwrap_or(0);
        let buffer_bytes = match var(BUFFER_KIB_VAR) {
            Some(v) => {
                let kib = whole(BUFFER_KIB_VAR, &v)?;
                ensure!(
                    kib <= most_kib,
                    GrpcollError::Options(format!(
                        "{BUFFER_KIB_VAR}={kib}: at most {most_kib} KiB per buffer fit this device's shared memory in a ring of {stages}"
                    ))
                );
                kib << 10
            }
            None if depth_given => most_kib.min(DEFAULT_BUFFER_BYTES >> 10) << 10,
            None if fits(DEFAULT_BUFFER_BYTES) => DEFAULT_BUFFER_BYTES,
            None => 0,
        };
        Ok(if buffer_bytes == 0 {
            BulkRing::NONE
        } else {
            BulkRing {
                buffer_bytes,
                stages,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |v| vars.iter().find(|p| p.0 == v).map(|p| p.1.to_string())
    }

    // Three 64 KiB buffers where the device's opt-in shared memory holds them (an H100 or H200:
    // 227 KiB), none where it does not.
    #[test]
    fn the_default_ring_fits_the_device() {
        let ring = |optin| BulkRing::choose_with(optin, env(&[])).unwrap();
        let three = BulkRing {
            buffer_bytes: 64 << 10,
            stages: 3,
        };
        assert_eq!(ring(232_448), three);
        assert_eq!(ring(3 * (64 << 10) + 2048), three);
        assert_eq!(ring(3 * (64 << 10) + 2047), BulkRing::NONE);
        assert_eq!(ring(49_152), BulkRing::NONE);
        assert_eq!(three.smem_bytes(), 3 * (64 << 10) + 2048);
        assert_eq!(BulkRing::NONE.smem_bytes(), 0);
    }

    #[test]
    fn overrides_are_checked_against_the_device() {
        let choose = |vars: &[(&str, &str)]| BulkRing::choose_with(232_448, env(vars));
        let e = |vars: &[(&str, &str)]| choose(vars).unwrap_err().to_string();
        let ring = |buffer_kib: u32, stages: u32| BulkRing {
            buffer_bytes: buffer_kib << 10,
            stages,
        };
        assert_eq!(
            choose(&[(STAGES_VAR, "2"), (BUFFER_KIB_VAR, "112")]).unwrap(),
            ring(112, 2)
        );
        assert_eq!(
            choose(&[(STAGES_VAR, "4"), (BUFFER_KIB_VAR, "48")]).unwrap(),
            ring(48, 4)
        );
        assert_eq!(choose(&[(BUFFER_KIB_VAR, "72")]).unwrap(), ring(72, 3));
        assert_eq!(choose(&[(BUFFER_KIB_VAR, "0")]).unwrap(), BulkRing::NONE);
        // Only the depth: the default buffer where the deeper ring holds it, else the largest
        // that fits (never a silent fall back to direct reads).
        assert_eq!(choose(&[(STAGES_VAR, "2")]).unwrap(), ring(64, 2));
        assert_eq!(choose(&[(STAGES_VAR, "4")]).unwrap(), ring(56, 4));
        // 232 448 bytes less the 2 KiB of mbarriers: 75 KiB buffers in a ring of 3, 56 in 4.
        assert!(e(&[(BUFFER_KIB_VAR, "96")])
            .contains("at most 75 KiB per buffer fit this device's shared memory in a ring of 3"));
        assert!(e(&[(STAGES_VAR, "4"), (BUFFER_KIB_VAR, "64")])
            .contains("at most 56 KiB per buffer fit this device's shared memory in a ring of 4"));
        assert!(e(&[(STAGES_VAR, "5")]).contains("the ring takes 2 to 4 buffers"));
        assert!(e(&[(STAGES_VAR, "1")]).contains("the ring takes 2 to 4 buffers"));
        assert!(e(&[(BUFFER_KIB_VAR, "a lot")]).contains("is not a whole number"));
    }
}
