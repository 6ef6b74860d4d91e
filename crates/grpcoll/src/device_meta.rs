//! Device-resident metadata: for callers whose split sizes and peers are produced on the GPU. The
//! plan is sized by a [`Capacity`]; before each run the caller writes this rank's metadata into
//! the plan's metadata PGL (layout below, in u32 words), and the run first launches the layout
//! kernel (kernels/grpcoll/layout.cu), which reads every rank's metadata over peer memory,
//! checks and matches it exactly as the host plan does, and writes this rank's work items, then
//! the transfer kernel. No host synchronisation, no host metadata.
//!
//! Layout of one rank's metadata (u32 words, `weft_grpcoll_meta_words(cap)` of them): [0] number
//! of input splits, [1] number of output splits, then `cap` input split rows, `cap` input peer
//! masks (bit r = rank r), `cap` output split rows, `cap` output peer masks. GroupCast: input masks
//! are the destinations, output masks one source bit. GroupReduce: input masks one destination
//! bit, output masks the sources.

use crate::error::GrpcollError;
use crate::meta::Desc;
use crate::meta::Kind;
use anyhow::bail;
use weft_kernels::abi::{weft_grpcoll_layout_report, WEFT_GRPCOLL_MAX_PEERS};

/// What a device-metadata plan can hold (every rank passes the same, checked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Input splits, and output splits, at most (each side).
    pub max_splits: usize,
    /// Rows of this rank's input tensor at most (the input PGLs have this many).
    pub max_input_rows: usize,
    /// Rows of this rank's output tensor at most.
    pub max_output_rows: usize,
}

/// Largest `max_splits` accepted: the layout kernel keeps per-pair lists of this length.
pub const MAX_DEVICE_SPLITS: usize = 1 << 16;

impl Capacity {
    pub(crate) fn validate(&self, what: &str) -> anyhow::Result<()> {
        if self.max_splits == 0 || self.max_splits > MAX_DEVICE_SPLITS {
            bail!(GrpcollError::Metadata(format!("{what}: device metadata capacity of {} splits; 1 to {MAX_DEVICE_SPLITS} are supported", self.max_splits)));
        }
        for (side, rows) in [
            ("input", self.max_input_rows),
            ("output", self.max_output_rows),
        ] {
            if rows > u32::MAX as usize {
                bail!(GrpcollError::Metadata(format!("{what}: device metadata capacity of {rows} {side} rows; at most {} are supported", u32::MAX)));
            }
        }
        Ok(())
    }

    /// Work items the layout can produce: every split's rows in chunks of `chunk`, plus one
    /// partial chunk per split.
    pub(crate) fn max_items(&self, chunk: usize) -> usize {
        let rows = self.max_input_rows.max(self.max_output_rows);
        rows / chunk.max(1) + self.max_splits
    }
}

fn mask(peers: &[usize]) -> u32 {
    peers.iter().fold(0u32, |m, &p| m | 1 << p)
}

/// This rank's metadata in the device layout, checked against the capacity and the world (the
/// device checks the rest, as the host plan does).
pub(crate) fn encode(
    kind: Kind,
    d: &Desc,
    cap: &Capacity,
    world: usize,
) -> anyhow::Result<Vec<u32>> {
    let what = crate::plan::kind_name(kind);
    crate::meta::validate_local(kind, d, world)?;
    let n = cap.max_splits;
    for (side, splits, rows, max) in [
        (
            "input",
            d.input_split_rows.len(),
            d.input_rows,
            cap.max_input_rows,
        ),
        (
            "output",
            d.output_split_rows.len(),
            d.output_rows,
            cap.max_output_rows,
        ),
    ] {
        if splits > n {
            bail!(GrpcollError::Metadata(format!(
                "{what}: {splits} {side} splits exceed the plan's capacity of {n}"
            )));
        }
        if rows > max {
            bail!(GrpcollError::Metadata(format!(
                "{what}: {rows} {side} rows exceed the plan's capacity of {max}"
            )));
        }
    }
    debug_assert!(world <= WEFT_GRPCOLL_MAX_PEERS as usize);
    let mut w = vec![0u32; 2 + 4 * n];
    w[0] = d.input_split_rows.len() as u32;
    w[1] = d.output_split_rows.len() as u32;
    for (side, rows, peers) in [
        (0, &d.input_split_rows, &d.input_peers),
        (1, &d.output_split_rows, &d.output_peers),
    ] {
        let at = 2 + side * 2 * n;
        for (i, (&r, p)) in rows.iter().zip(peers).enumerate() {
            w[at + i] = r as u32;
            w[at + n + i] = mask(p);
        }
    }
    Ok(w)
}

/// The layout kernel's report as an error message; None when it found nothing.
pub(crate) fn describe(kind: Kind, r: &weft_grpcoll_layout_report) -> Option<String> {
    let what = crate::plan::kind_name(kind);
    let side = if r.side == 0 { "input" } else { "output" };
    let (a, b) = (r.a, r.b);
    let text = match r.code {
        0 => return None,
        weft_kernels::abi::WEFT_GRPCOLL_BAD_SPLIT_COUNT => format!("rank {a} lists {} {side} splits; the capacity is {}", r.a_split, r.expected),
        weft_kernels::abi::WEFT_GRPCOLL_BAD_ROWS if r.side == 2 => format!("rank {a} needs {} work items; the plan holds {}", r.observed, r.expected),
        // The kernel clamps a sum past u32 to u32::MAX.
        weft_kernels::abi::WEFT_GRPCOLL_BAD_ROWS => format!("rank {a}'s {side} splits sum to {}{} rows; the capacity is {}", if r.observed == u32::MAX { "at least " } else { "" }, r.observed, r.expected),
        weft_kernels::abi::WEFT_GRPCOLL_BAD_MASK => format!("rank {a}'s {side} split {} names ranks outside the world (mask {:#x}, world mask {:#x})", r.a_split, r.observed, r.expected),
        weft_kernels::abi::WEFT_GRPCOLL_BAD_PEER_COUNT => format!("rank {a}'s {side} split {} names {} ranks; it must name {}", r.a_split, r.observed, if r.expected == 1 && r.observed == 0 { "at least one".to_string() } else { "exactly one".to_string() }),
        weft_kernels::abi::WEFT_GRPCOLL_BAD_PAIR_COUNT => format!("rank {a} sends {} input splits to rank {b} but rank {b} expects {} from rank {a}", r.expected, r.observed),
        weft_kernels::abi::WEFT_GRPCOLL_BAD_PAIR_ROWS => format!("rank {a}'s input split {} ({} rows) is rank {b}'s output split {} by the matching rule, which has {} rows", r.a_split, r.expected, r.b_split, r.observed),
        other => format!("unknown report code {other}"),
    };
    Some(format!(
        "{what}: device metadata rejected, nothing was moved: {text}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::GroupCastMeta;

    #[test]
    fn encoding_follows_the_layout() {
        let d = Desc::from(&GroupCastMeta {
            input_rows: 5,
            input_split_rows: vec![2, 3],
            dst_indices: vec![vec![0, 2], vec![]],
            output_rows: 4,
            output_split_rows: vec![4],
            src_index: vec![1],
        });
        let cap = Capacity {
            max_splits: 3,
            max_input_rows: 8,
            max_output_rows: 8,
        };
        let w = encode(Kind::Cast, &d, &cap, 3).unwrap();
        // SAFETY: a pure function of its argument.
        assert_eq!(w.len() as u32, unsafe {
            weft_kernels::abi::weft_grpcoll_meta_words(3)
        });
        assert_eq!(w, vec![2, 1, 2, 3, 0, 0b101, 0, 0, 4, 0, 0, 0b10, 0, 0]);
        let small = Capacity {
            max_splits: 1,
            ..cap
        };
        assert!(encode(Kind::Cast, &d, &small, 3)
            .unwrap_err()
            .to_string()
            .contains("2 input splits exceed the plan's capacity of 1"));
        let few = Capacity {
            max_input_rows: 4,
            ..cap
        };
        assert!(encode(Kind::Cast, &d, &few, 3)
            .unwrap_err()
            .to_string()
            .contains("5 input rows exceed the plan's capacity of 4"));
    }

    #[test]
    fn reports_read_like_the_host_checks() {
        let r = weft_grpcoll_layout_report {
            code: weft_kernels::abi::WEFT_GRPCOLL_BAD_PAIR_ROWS,
            side: 0,
            a: 3,
            b: 0,
            a_split: 0,
            b_split: 0,
            expected: 4,
            observed: 5,
        };
        assert_eq!(
            describe(Kind::Cast, &r).unwrap(),
            "group_cast: device metadata rejected, nothing was moved: rank 3's input split 0 (4 rows) is rank 0's output split 0 by the matching rule, which has 5 rows"
        );
        assert!(describe(Kind::Reduce, &weft_grpcoll_layout_report::default()).is_none());
        assert!(Capacity {
            max_splits: 0,
            max_input_rows: 1,
            max_output_rows: 1
        }
        .validate("x")
        .is_err());
    }
}
