//! How a [`crate::Collectives`] is set up: staging slot size, block counts, the AllReduce path.

use crate::error::CollectiveError;
use crate::geometry::AllReduceChoice;
use weft_kernels::abi;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Bytes of one staging slot: a round moves at most this much per (sender, receiver) pair.
    /// Staging per rank is 9 × world × slot_bytes (three rounds in flight, two phases and the LL
    /// area) plus the sentinel area (3 × world × the sentinel slot). A positive multiple of 16,
    /// at most 1 GiB; `None`: [`DEFAULT_STAGING_PER_SLOT_SET`] / world (16 MiB at two ranks,
    /// 288 MiB of staging at any world, plus 24 MiB of sentinel area at two ranks).
    pub slot_bytes: Option<u64>,
    /// Blocks per launch; `None`: one per 8 KiB of a round, at most 64, for rounds up to 4 MiB;
    /// `max_blocks` for larger rounds; LL launches: see [`crate::geometry::LL_MIN_BLOCKS`];
    /// sentinel launches: one per 2 KiB sent to each peer, 64 to 128, the vectors spread evenly
    /// over them ([`crate::geometry::SENTINEL_BYTES_PER_BLOCK`]) (measured on two, three and four
    /// H200s: README.md).
    pub blocks: Option<u32>,
    /// Upper bound on blocks per launch (and on `blocks`); at most 128 and, with ranks sharing a
    /// GPU, at most its SMs divided among them (every block of every rank must be resident).
    pub max_blocks: u32,
    pub all_reduce: AllReduceChoice,
    /// Payloads per sender up to this many bytes go by the LL protocol (one round, latency of
    /// one NVLink hop, half the bandwidth) when the sentinel protocol does not take them; 0 turns
    /// it off.
    pub ll_max_bytes: u64,
    /// Payloads per sender up to this many bytes (and at most a slot) that are whole 16-byte
    /// vectors go by the sentinel protocol (one round, latency of one NVLink hop, full
    /// bandwidth); 0 turns it off. Its one change of bits: an element whose bits are all ones
    /// (one NaN pattern) arrives as 0x7f…f (another NaN), on every rank alike; every other value
    /// moves bit for bit. Integers carried as floats would be changed: turn it off for them. Its
    /// staging area, 3 × world × min(this, slot_bytes) bytes (24 MiB at two ranks, 96 at eight),
    /// is allocated at creation.
    pub sentinel_max_bytes: u64,
    /// Launch with programmatic dependent launch: a call's blocks may be scheduled while the
    /// kernel before it on the stream ends (they wait for its end before touching memory), and a
    /// kernel after it that is launched the same way may be scheduled while the call ends. Off
    /// whenever ranks share a GPU (early blocks would hold SMs a peer's blocks need).
    pub pdl: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            slot_bytes: None,
            blocks: None,
            max_blocks: 128,
            all_reduce: AllReduceChoice::Auto,
            ll_max_bytes: 256 << 10,
            sentinel_max_bytes: DEFAULT_SENTINEL_MAX_BYTES,
            pdl: true,
        }
    }
}

/// The default slots of all senders together: `slot_bytes` = this / world.
pub const DEFAULT_STAGING_PER_SLOT_SET: u64 = 32 << 20;

/// The default [`Options::sentinel_max_bytes`]: on two H200s the sentinel protocol beat the LL
/// one at every size up to its 256 KiB (AllReduce 4 KiB 2.99 against 3.20 µs, 256 KiB 4.1
/// against 5.1) and the simple one up to 4 MiB (16.3 against 19.5 µs; 1 MiB 6.5 against 9.1),
/// under CUDA graph replay (`results/collectives/kernel-ab-nvidia-h200-x2-2026-11-27/sentinel.log`).
pub const DEFAULT_SENTINEL_MAX_BYTES: u64 = 4 << 20;

/// The variables [`Options::from_env`] reads.
pub const ENV_VARS: [&str; 7] = [
    "WEFT_COLL_SLOT_BYTES",
    "WEFT_COLL_BLOCKS",
    "WEFT_COLL_MAX_BLOCKS",
    "WEFT_COLL_ALL_REDUCE",
    "WEFT_COLL_LL_MAX_BYTES",
    "WEFT_COLL_SENTINEL_MAX_BYTES",
    "WEFT_COLL_PDL",
];

impl Options {
    /// The defaults, overridden by `WEFT_COLL_SLOT_BYTES`, `WEFT_COLL_BLOCKS`,
    /// `WEFT_COLL_MAX_BLOCKS`, `WEFT_COLL_ALL_REDUCE` (`auto`, `one-shot`, `two-shot`),
    /// `WEFT_COLL_LL_MAX_BYTES`, `WEFT_COLL_SENTINEL_MAX_BYTES` and `WEFT_COLL_PDL` (0 or 1).
    pub fn from_env() -> Result<Self, CollectiveError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, CollectiveError> {
        let mut o = Options::default();
        let num = |k: &str, v: String| -> Result<u64, CollectiveError> {
            v.trim()
                .parse()
                .map_err(|_| CollectiveError::Options(format!("{k}={v:?} is not a number")))
        };
        if let Some(v) = get(ENV_VARS[0]) {
            o.slot_bytes = Some(num(ENV_VARS[0], v)?);
        }
        if let Some(v) = get(ENV_VARS[1]) {
            o.blocks = Some(u32::try_from(num(ENV_VARS[1], v)?).unwrap_or(u32::MAX));
        }
        if let Some(v) = get(ENV_VARS[2]) {
            o.max_blocks = u32::try_from(num(ENV_VARS[2], v)?).unwrap_or(u32::MAX);
        }
        if let Some(v) = get(ENV_VARS[3]) {
            o.all_reduce = match v.trim() {
                "auto" => AllReduceChoice::Auto,
                "one-shot" => AllReduceChoice::OneShot,
                "two-shot" => AllReduceChoice::TwoShot,
                _ => {
                    return Err(CollectiveError::Options(format!(
                        "{}={v:?}: expected auto, one-shot or two-shot",
                        ENV_VARS[3]
                    )))
                }
            };
        }
        if let Some(v) = get(ENV_VARS[4]) {
            o.ll_max_bytes = num(ENV_VARS[4], v)?;
        }
        if let Some(v) = get(ENV_VARS[5]) {
            o.sentinel_max_bytes = num(ENV_VARS[5], v)?;
        }
        if let Some(v) = get(ENV_VARS[6]) {
            o.pdl = match v.trim() {
                "0" => false,
                "1" => true,
                _ => {
                    return Err(CollectiveError::Options(format!(
                        "{}={v:?}: expected 0 or 1",
                        ENV_VARS[6]
                    )))
                }
            };
        }
        Ok(o)
    }

    /// The slot size at `world` ranks.
    pub fn slot_bytes_at(&self, world: usize) -> u64 {
        self.slot_bytes
            .unwrap_or((DEFAULT_STAGING_PER_SLOT_SET / world.max(1) as u64) / 16 * 16)
    }

    /// Bytes of one sentinel slot at `world` ranks: `sentinel_max_bytes`, at most a slot, down
    /// to a multiple of 16 (0: the protocol is off).
    pub fn sentinel_bytes_at(&self, world: usize) -> u64 {
        self.sentinel_max_bytes.min(self.slot_bytes_at(world)) / 16 * 16
    }

    /// Checks the options against `world` ranks on GPUs of `sms` SMs, `ranks_per_gpu` of them
    /// on one GPU; returns the block cap launches use.
    pub fn validate(
        &self,
        world: usize,
        sms: u32,
        ranks_per_gpu: usize,
    ) -> Result<u32, CollectiveError> {
        let slot = self.slot_bytes_at(world);
        if slot == 0 || !slot.is_multiple_of(16) || slot > 1 << 30 {
            return Err(CollectiveError::Options(format!(
                "slot_bytes {slot} must be a positive multiple of 16, at most 1 GiB"
            )));
        }
        let hard = abi::WEFT_COLL_MAX_BLOCKS;
        let resident = (sms / ranks_per_gpu.max(1) as u32).max(1);
        if self.max_blocks == 0 || self.max_blocks > hard {
            return Err(CollectiveError::Options(format!(
                "max_blocks {} must be in 1..={hard}",
                self.max_blocks
            )));
        }
        if let Some(b) = self.blocks {
            if b == 0 || b > self.max_blocks {
                return Err(CollectiveError::Options(format!(
                    "blocks {b} must be in 1..={} (max_blocks)",
                    self.max_blocks
                )));
            }
            if b > resident {
                return Err(CollectiveError::Options(format!(
                    "blocks {b}: {ranks_per_gpu} ranks share a GPU of {sms} SMs, so at most {resident} blocks per rank can be resident at once"
                )));
            }
        }
        Ok(self.max_blocks.min(resident))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_override_defaults_and_bad_values_are_named() {
        let o = Options::from_vars(|k| match k {
            "WEFT_COLL_BLOCKS" => Some("8".into()),
            "WEFT_COLL_ALL_REDUCE" => Some("two-shot".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            (o.blocks, o.all_reduce, o.slot_bytes),
            (Some(8), AllReduceChoice::TwoShot, None)
        );
        assert_eq!(o.slot_bytes_at(2), 16 << 20);
        assert_eq!(o.slot_bytes_at(3), 11184800); // 32 MiB / 3, down to a multiple of 16
        let e = Options::from_vars(|k| (k == "WEFT_COLL_SLOT_BYTES").then(|| "lots".into()))
            .unwrap_err();
        assert!(
            e.to_string().contains("WEFT_COLL_SLOT_BYTES=\"lots\""),
            "{e}"
        );
        let e = Options::from_vars(|k| (k == "WEFT_COLL_ALL_REDUCE").then(|| "ring".into()))
            .unwrap_err();
        assert!(e.to_string().contains("one-shot"), "{e}");
        let o = Options::from_vars(|k| match k {
            "WEFT_COLL_PDL" => Some("0".into()),
            "WEFT_COLL_SENTINEL_MAX_BYTES" => Some("65536".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((o.pdl, o.sentinel_max_bytes), (false, 65536));
        assert_eq!(o.sentinel_bytes_at(2), 65536);
        let e = Options::from_vars(|k| (k == "WEFT_COLL_PDL").then(|| "yes".into())).unwrap_err();
        assert!(e.to_string().contains("WEFT_COLL_PDL=\"yes\""), "{e}");
    }

    #[test]
    fn validation_names_the_bad_option() {
        let mut o = Options::default();
        assert_eq!(o.validate(2, 132, 1).unwrap(), 128);
        assert_eq!(o.validate(8, 132, 8).unwrap(), 16);
        o.slot_bytes = Some(100);
        assert!(o
            .validate(2, 132, 1)
            .unwrap_err()
            .to_string()
            .contains("multiple of 16"));
        o = Options {
            blocks: Some(20),
            ..Options::default()
        };
        assert!(o
            .validate(8, 132, 8)
            .unwrap_err()
            .to_string()
            .contains("at most 16 blocks"));
        o = Options {
            max_blocks: 500,
            ..Options::default()
        };
        assert!(o
            .validate(2, 132, 1)
            .unwrap_err()
            .to_string()
            .contains("1..=128"));
    }
}
