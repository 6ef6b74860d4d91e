//! Group-collective metadata: this rank's description, local validation, the all-gathered
//! cross-rank check, and the global matching of input splits to output splits.
//!
//! Matching rule (as in all-to-all-v): the k-th input split (in index order) that rank r sends to
//! rank d is the k-th output split (in index order) of rank d that lists r as a source.

use crate::error::GrpcollError;
use anyhow::bail;

/// GroupCast metadata of one rank: input split i (`input_split_rows[i]` rows, consecutive from
/// row 0) goes to every rank in `dst_indices[i]` (possibly none); output split j
/// (`output_split_rows[j]` rows, consecutive) comes from rank `src_index[j]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupCastMeta {
    /// Rows of this rank's input tensor; the input splits must sum to it.
    pub input_rows: usize,
    pub input_split_rows: Vec<usize>,
    pub dst_indices: Vec<Vec<usize>>,
    /// Rows of this rank's output tensor; the output splits must sum to it.
    pub output_rows: usize,
    pub output_split_rows: Vec<usize>,
    pub src_index: Vec<usize>,
}

/// GroupReduce metadata of one rank: input split i (a partial result) goes to rank
/// `dst_index[i]`; output split j is the reduction over the partials of every rank in
/// `src_indices[j]` (at least one, each at most once).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupReduceMeta {
    pub input_rows: usize,
    pub input_split_rows: Vec<usize>,
    pub dst_index: Vec<usize>,
    pub output_rows: usize,
    pub output_split_rows: Vec<usize>,
    pub src_indices: Vec<Vec<usize>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Cast = 1,
    Reduce = 2,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cast => "group_cast",
            Kind::Reduce => "group_reduce",
        }
    }
    fn in_peers(self) -> &'static str {
        match self {
            Kind::Cast => "dst_indices",
            Kind::Reduce => "dst_index",
        }
    }
    fn out_peers(self) -> &'static str {
        match self {
            Kind::Cast => "src_index",
            Kind::Reduce => "src_indices",
        }
    }
}

/// Either kind as one shape: the peers of each input split (destinations) and of each output
/// split (sources).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Desc {
    pub input_rows: usize,
    pub input_split_rows: Vec<usize>,
    pub input_peers: Vec<Vec<usize>>,
    pub output_rows: usize,
    pub output_split_rows: Vec<usize>,
    pub output_peers: Vec<Vec<usize>>,
}

impl From<&GroupCastMeta> for Desc {
    fn from(m: &GroupCastMeta) -> Self {
        Desc {
            input_rows: m.input_rows,
            input_split_rows: m.input_split_rows.clone(),
            input_peers: m.dst_indices.clone(),
            output_rows: m.output_rows,
            output_split_rows: m.output_split_rows.clone(),
            output_peers: m.src_index.iter().map(|&s| vec![s]).collect(),
        }
    }
}

impl From<&GroupReduceMeta> for Desc {
    fn from(m: &GroupReduceMeta) -> Self {
        Desc {
            input_rows: m.input_rows,
            input_split_rows: m.input_split_rows.clone(),
            input_peers: m.dst_index.iter().map(|&d| vec![d]).collect(),
            output_rows: m.output_rows,
            output_split_rows: m.output_split_rows.clone(),
            output_peers: m.src_indices.clone(),
        }
    }
}

/// Checks one rank's metadata on its own: list lengths, split sums, ranks in range, no rank
/// listed twice for one split, a source for every reduce output split, sizes within u32.
pub(crate) fn validate_local(kind: Kind, d: &Desc, world: usize) -> anyhow::Result<()> {
    let name = kind.name();
    let mut errs = Vec::new();
    for (side, rows, splits, peers, field) in [
        (
            "input",
            d.input_rows,
            &d.input_split_rows,
            &d.input_peers,
            kind.in_peers(),
        ),
        (
            "output",
            d.output_rows,
            &d.output_split_rows,
            &d.output_peers,
            kind.out_peers(),
        ),
    ] {
        if splits.len() != peers.len() {
            errs.push(format!(
                "{side}_split_rows has {} splits but {field} has {} entries",
                splits.len(),
                peers.len()
            ));
        }
        // Checked: a wrapped sum could equal `rows` with splits far beyond the tensor.
        match splits.iter().try_fold(0usize, |a, &s| a.checked_add(s)) {
            None => errs.push(format!(
                "{side}_split_rows sum past {} rows (a split is far larger than the {side}'s {rows} rows)",
                usize::MAX
            )),
            Some(sum) if sum != rows => errs.push(format!(
                "{side}_split_rows sum to {sum} rows but the {side} has {rows} rows"
            )),
            Some(_) => {}
        }
        if rows > u32::MAX as usize {
            errs.push(format!(
                "the {side} has {rows} rows; at most {} are supported",
                u32::MAX
            ));
        }
        for (i, list) in peers.iter().enumerate() {
            for (k, &r) in list.iter().enumerate() {
                if r >= world {
                    errs.push(format!(
                        "{field}[{i}] lists rank {r}, but the world has {world} ranks (0..{})",
                        world - 1
                    ));
                }
                if list[..k].contains(&r) {
                    errs.push(format!("{field}[{i}] lists rank {r} twice"));
                }
            }
            if kind == Kind::Reduce && side == "output" && list.is_empty() {
                errs.push(format!("src_indices[{i}] lists no source rank (every output split reduces at least one partial)"));
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        bail!(GrpcollError::Metadata(format!(
            "{name}: invalid metadata: {}",
            errs.join("; ")
        )))
    }
}

/// Everything the ranks must agree on besides the splits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: u64,
    pub dtype: u64,
    pub comm_dtype: u64,
    /// Row widths of tensors 0..3 (0: no such tensor).
    pub row_elems: [u64; 3],
    pub op: u64,
    pub lse_per_row: u64,
    pub accumulate: u64,
    pub sms: u64,
    /// Device metadata: splits per side (0: host metadata).
    pub device_splits: u64,
}

impl Header {
    const FIELDS: [&'static str; 11] = [
        "collective",
        "dtype",
        "communication dtype",
        "row_elems",
        "row_elems[1]",
        "row_elems[2]",
        "reduce op",
        "lse_per_row",
        "accumulate",
        "SM count",
        "device metadata capacity (splits)",
    ];
    fn values(&self) -> [u64; 11] {
        let [e0, e1, e2] = self.row_elems;
        [
            self.kind,
            self.dtype,
            self.comm_dtype,
            e0,
            e1,
            e2,
            self.op,
            self.lse_per_row,
            self.accumulate,
            self.sms,
            self.device_splits,
        ]
    }
    fn from_values(v: [u64; 11]) -> Self {
        Header {
            kind: v[0],
            dtype: v[1],
            comm_dtype: v[2],
            row_elems: [v[3], v[4], v[5]],
            op: v[6],
            lse_per_row: v[7],
            accumulate: v[8],
            sms: v[9],
            device_splits: v[10],
        }
    }
}

pub(crate) fn encode(h: &Header, d: &Desc) -> Vec<u8> {
    let mut v: Vec<u64> = h.values().to_vec();
    for (rows, splits, peers) in [
        (d.input_rows, &d.input_split_rows, &d.input_peers),
        (d.output_rows, &d.output_split_rows, &d.output_peers),
    ] {
        v.push(rows as u64);
        v.push(splits.len() as u64);
        for (i, &s) in splits.iter().enumerate() {
            v.push(s as u64);
            v.push(peers[i].len() as u64);
            v.extend(peers[i].iter().map(|&p| p as u64));
        }
    }
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn decode(bytes: &[u8]) -> anyhow::Result<(Header, Desc)> {
    anyhow::ensure!(
        bytes.len().is_multiple_of(8),
        GrpcollError::RanksDisagree(format!(
            "grpcoll metadata of {} bytes is not a list of u64",
            bytes.len()
        ))
    );
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut it = words.into_iter();
    let mut next = || {
        it.next().ok_or_else(|| {
            anyhow::Error::new(GrpcollError::RanksDisagree(
                "grpcoll metadata is truncated".into(),
            ))
        })
    };
    let mut values = [0u64; 11];
    for v in values.iter_mut() {
        *v = next()?;
    }
    let h = Header::from_values(values);
    let mut sides = Vec::new();
    for _ in 0..2 {
        let rows = next()? as usize;
        let n = next()? as usize;
        let (mut splits, mut peers) = (Vec::new(), Vec::new());
        for _ in 0..n {
            splits.push(next()? as usize);
            let k = next()? as usize;
            peers.push(
                (0..k)
                    .map(|_| next().map(|p| p as usize))
                    .collect::<anyhow::Result<Vec<_>>>()?,
            );
        }
        sides.push((rows, splits, peers));
    }
    let (out_rows, out_splits, out_peers) = sides.pop().unwrap();
    let (in_rows, in_splits, in_peers) = sides.pop().unwrap();
    Ok((
        h,
        Desc {
            input_rows: in_rows,
            input_split_rows: in_splits,
            input_peers: in_peers,
            output_rows: out_rows,
            output_split_rows: out_splits,
            output_peers: out_peers,
        },
    ))
}

/// Every rank's header must equal rank 0's; the error names each differing rank and field
/// (`describe(field name, value)` renders a value).
pub(crate) fn check_headers(
    kind: Kind,
    headers: &[Header],
    describe: impl Fn(&str, u64) -> String,
) -> anyhow::Result<()> {
    let mut errs = Vec::new();
    for (r, h) in headers.iter().enumerate().skip(1) {
        for (f, (a, b)) in headers[0].values().iter().zip(h.values()).enumerate() {
            if *a != b {
                errs.push(format!(
                    "rank {r} has {} {} but rank 0 has {}",
                    Header::FIELDS[f],
                    describe(Header::FIELDS[f], b),
                    describe(Header::FIELDS[f], *a)
                ));
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        bail!(GrpcollError::RanksDisagree(format!(
            "{}: the ranks disagree: {}",
            kind.name(),
            errs.join("; ")
        )))
    }
}

/// One matched pair: `rows` rows from rank `src`'s input split `src_split` (first row
/// `src_row`) to rank `dst`'s output split `dst_split` (first row `dst_row`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    pub src: usize,
    pub src_split: usize,
    pub src_row: usize,
    pub dst: usize,
    pub dst_split: usize,
    pub dst_row: usize,
    pub rows: usize,
}

fn offsets(splits: &[usize]) -> Vec<usize> {
    let mut at = 0;
    splits
        .iter()
        .map(|&s| {
            at += s;
            at - s
        })
        .collect()
}

/// Every rank's metadata as this rank decoded it, each checked as its own rank checked it: a
/// payload is not trusted to have passed that check (its sizes feed this rank's offsets and
/// buffer sizes). Host metadata: [`validate_local`]; device metadata (`device`: no splits, the
/// rows are the capacity's): rows within u32. The error names the first rank that fails.
pub(crate) fn validate_all(kind: Kind, descs: &[Desc], device: bool) -> anyhow::Result<()> {
    for (r, d) in descs.iter().enumerate() {
        let checked = if device {
            let limit = u32::MAX as usize;
            if d.input_rows > limit || d.output_rows > limit {
                Err(anyhow::anyhow!(
                    "a capacity of {} input and {} output rows, past u32",
                    d.input_rows,
                    d.output_rows
                ))
            } else {
                Ok(())
            }
        } else {
            validate_local(kind, d, descs.len())
        };
        if let Err(e) = checked {
            bail!(GrpcollError::RanksDisagree(format!(
                "{}: rank {r}'s metadata as received is not valid: {e}",
                kind.name()
            )));
        }
    }
    Ok(())
}

/// Matches every rank's sends with every rank's receives (the rule in the module docs). Every
/// rank computes the same answer from the same all-gathered metadata, so every rank fails alike;
/// the error names the ranks and splits that disagree.
pub(crate) fn match_global(kind: Kind, descs: &[Desc]) -> anyhow::Result<Vec<Transfer>> {
    let world = descs.len();
    let (fi, fo) = (kind.in_peers(), kind.out_peers());
    let mut errs = Vec::new();
    let mut out = Vec::new();
    let in_off: Vec<Vec<usize>> = descs.iter().map(|d| offsets(&d.input_split_rows)).collect();
    let out_off: Vec<Vec<usize>> = descs
        .iter()
        .map(|d| offsets(&d.output_split_rows))
        .collect();
    for s in 0..world {
        for d in 0..world {
            let sends: Vec<usize> = (0..descs[s].input_peers.len())
                .filter(|&i| descs[s].input_peers[i].contains(&d))
                .collect();
            let recvs: Vec<usize> = (0..descs[d].output_peers.len())
                .filter(|&j| descs[d].output_peers[j].contains(&s))
                .collect();
            if sends.len() != recvs.len() {
                errs.push(format!(
                    "rank {s} sends {} input splits to rank {d} (its {fi} list {d} in splits {sends:?}) but rank {d} expects {} from rank {s} (its {fo} list {s} in output splits {recvs:?})",
                    sends.len(),
                    recvs.len()
                ));
                continue;
            }
            for (&i, &j) in sends.iter().zip(&recvs) {
                let (a, b) = (descs[s].input_split_rows[i], descs[d].output_split_rows[j]);
                if a != b {
                    errs.push(format!("rank {s}'s input split {i} ({a} rows) is rank {d}'s output split {j} by the matching rule, which has {b} rows"));
                    continue;
                }
                out.push(Transfer {
                    src: s,
                    src_split: i,
                    src_row: in_off[s][i],
                    dst: d,
                    dst_split: j,
                    dst_row: out_off[d][j],
                    rows: a,
                });
            }
        }
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        let n = errs.len();
        errs.truncate(8);
        let more = if n > 8 {
            format!(" (and {} more)", n - 8)
        } else {
            String::new()
        };
        bail!(GrpcollError::RanksDisagree(format!(
            "{}: metadata disagrees across ranks: {}{more}",
            kind.name(),
            errs.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cast(
        input_split_rows: Vec<usize>,
        dst: Vec<Vec<usize>>,
        output_split_rows: Vec<usize>,
        src: Vec<usize>,
    ) -> Desc {
        Desc::from(&GroupCastMeta {
            input_rows: input_split_rows.iter().sum(),
            input_split_rows,
            dst_indices: dst,
            output_rows: output_split_rows.iter().sum(),
            output_split_rows,
            src_index: src,
        })
    }

    #[test]
    fn local_errors_are_named() {
        let mut d = cast(vec![2, 3], vec![vec![0, 1], vec![1, 1]], vec![4], vec![2]);
        d.input_rows = 6;
        let e = validate_local(Kind::Cast, &d, 2).unwrap_err();
        assert!(matches!(
            GrpcollError::from_anyhow(e.context("planning")),
            GrpcollError::Metadata(_)
        ));
        let e = validate_local(Kind::Cast, &d, 2).unwrap_err().to_string();
        assert!(
            e.contains("input_split_rows sum to 5 rows but the input has 6 rows"),
            "{e}"
        );
        assert!(e.contains("dst_indices[1] lists rank 1 twice"), "{e}");
        assert!(
            e.contains("src_index[0] lists rank 2, but the world has 2 ranks"),
            "{e}"
        );
        let r = Desc::from(&GroupReduceMeta {
            input_rows: 1,
            input_split_rows: vec![1],
            dst_index: vec![0],
            output_rows: 1,
            output_split_rows: vec![1],
            src_indices: vec![vec![]],
        });
        let e = validate_local(Kind::Reduce, &r, 2).unwrap_err().to_string();
        assert!(e.contains("src_indices[0] lists no source rank"), "{e}");
        let short = cast(vec![1, 1], vec![vec![0]], vec![], vec![]);
        let e = validate_local(Kind::Cast, &short, 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("input_split_rows has 2 splits but dst_indices has 1 entries"),
            "{e}"
        );
    }

    #[test]
    fn encoding_round_trips() {
        let h = Header {
            kind: 1,
            dtype: 7,
            comm_dtype: 6,
            row_elems: [128, 64, 0],
            op: 0,
            lse_per_row: 0,
            accumulate: 0,
            sms: 24,
            device_splits: 0,
        };
        let d = cast(
            vec![2, 0, 3],
            vec![vec![0, 1], vec![], vec![1]],
            vec![4, 1],
            vec![1, 0],
        );
        assert_eq!(decode(&encode(&h, &d)).unwrap(), (h, d));
        assert!(decode(&[1, 2, 3]).is_err());
        assert!(decode(&0u64.to_le_bytes()).is_err());
    }

    #[test]
    fn matching_follows_the_rule_and_names_disagreements() {
        // Rank 0 sends split 0 (2 rows) to 0 and 1, split 1 (3 rows) to 1; rank 1 sends split 0 (1 row) to 0.
        let d0 = cast(
            vec![2, 3],
            vec![vec![0, 1], vec![1]],
            vec![1, 2],
            vec![1, 0],
        );
        let d1 = cast(vec![1], vec![vec![0]], vec![3, 2], vec![0, 0]);
        // Rank 1 lists its output splits in the wrong order (3 rows first): a size mismatch.
        let e = match_global(Kind::Cast, &[d0.clone(), d1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 0's input split 0 (2 rows) is rank 1's output split 0 by the matching rule, which has 3 rows"), "{e}");
        let d1 = cast(vec![1], vec![vec![0]], vec![2, 3], vec![0, 0]);
        let t = match_global(Kind::Cast, &[d0.clone(), d1]).unwrap();
        assert_eq!(t.len(), 4);
        assert!(t.contains(&Transfer {
            src: 0,
            src_split: 1,
            src_row: 2,
            dst: 1,
            dst_split: 1,
            dst_row: 2,
            rows: 3
        }));
        assert!(t.contains(&Transfer {
            src: 1,
            src_split: 0,
            src_row: 0,
            dst: 0,
            dst_split: 0,
            dst_row: 0,
            rows: 1
        }));
        // A missing receive is named with both sides.
        let d1 = cast(vec![1], vec![vec![0]], vec![2], vec![0]);
        let e = match_global(Kind::Cast, &[d0.clone(), d1.clone()]).unwrap_err();
        assert!(matches!(
            GrpcollError::from_anyhow(e),
            GrpcollError::RanksDisagree(_)
        ));
        let e = match_global(Kind::Cast, &[d0, d1]).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 sends 2 input splits to rank 1")
                && e.contains("rank 1 expects 1 from rank 0"),
            "{e}"
        );
    }

    #[test]
    fn headers_must_agree() {
        let h = Header {
            kind: 2,
            dtype: 7,
            comm_dtype: 7,
            row_elems: [128, 0, 0],
            op: 0,
            lse_per_row: 0,
            accumulate: 1,
            sms: 24,
            device_splits: 0,
        };
        let h2 = Header {
            row_elems: [64, 0, 0],
            accumulate: 0,
            ..h
        };
        let e = check_headers(Kind::Reduce, &[h, h, h2], |_, v| v.to_string()).unwrap_err();
        assert!(matches!(
            GrpcollError::from_anyhow(e),
            GrpcollError::RanksDisagree(_)
        ));
        let e = check_headers(Kind::Reduce, &[h, h, h2], |_, v| v.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 2 has row_elems 64 but rank 0 has 128"),
            "{e}"
        );
        assert!(
            e.contains("rank 2 has accumulate 0 but rank 0 has 1"),
            "{e}"
        );
    }

    mod hostile {
        use super::*;
        use proptest::prelude::*;

        /// Split row counts from anywhere in usize: small ones, and ones near usize::MAX whose
        /// sum with small ones wraps to a small number.
        fn rows() -> impl Strategy<Value = usize> {
            prop_oneof![4 => 0usize..64, 1 => any::<usize>(), 2 => (usize::MAX - 64)..=usize::MAX]
        }

        /// One side in a world of `world` ranks: splits, a peer list per split (mostly valid,
        /// sometimes naming a rank outside the world or one twice), and the side's row count set
        /// to the splits' *wrapping* sum (self-consistent to a checker that forgets overflow) or
        /// to anything.
        fn side(world: usize) -> impl Strategy<Value = (usize, Vec<usize>, Vec<Vec<usize>>)> {
            let peers = prop_oneof![
                8 => prop::sample::subsequence((0..world).collect::<Vec<_>>(), 1..=world),
                1 => prop::collection::vec(0usize..world + 2, 0..4),
            ];
            prop::collection::vec((rows(), peers), 0..5)
                .prop_flat_map(|splits| {
                    let wrapped = splits.iter().fold(0usize, |a, (r, _)| a.wrapping_add(*r));
                    (
                        prop_oneof![4 => Just(wrapped), 1 => any::<usize>()],
                        Just(splits),
                    )
                })
                .prop_map(|(total, splits)| {
                    let (rows, peers) = splits.into_iter().unzip();
                    (total, rows, peers)
                })
        }

        /// One side: (rows, split rows, a peer list per split).
        type Side = (usize, Vec<usize>, Vec<Vec<usize>>);

        fn desc_of(i: Side, o: Side) -> Desc {
            Desc {
                input_rows: i.0,
                input_split_rows: i.1,
                input_peers: i.2,
                output_rows: o.0,
                output_split_rows: o.1,
                output_peers: o.2,
            }
        }

        fn desc() -> impl Strategy<Value = (usize, Desc)> {
            (1usize..5).prop_flat_map(|world| {
                (Just(world), side(world), side(world))
                    .prop_map(|(world, i, o)| (world, desc_of(i, o)))
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]
            /// Whatever it is given, validate_local accepts only metadata whose splits truly sum
            /// (in u128) to the side's rows, within u32, with one peer list per split naming
            /// distinct ranks of the world — what the plan's offsets and the kernels' u32 rows
            /// rely on. The reference below is computed independently of the checker.
            #[test]
            fn accepts_only_consistent_metadata((world, d) in desc(), reduce in any::<bool>()) {
                let kind = if reduce { Kind::Reduce } else { Kind::Cast };
                if validate_local(kind, &d, world).is_ok() {
                    for (rows, splits, peers) in [
                        (d.input_rows, &d.input_split_rows, &d.input_peers),
                        (d.output_rows, &d.output_split_rows, &d.output_peers),
                    ] {
                        let exact: u128 = splits.iter().map(|&s| s as u128).sum();
                        prop_assert_eq!(exact, rows as u128);
                        prop_assert!(rows <= u32::MAX as usize);
                        prop_assert_eq!(splits.len(), peers.len());
                        for list in peers {
                            prop_assert!(list.iter().all(|&r| r < world));
                            let mut sorted = list.clone();
                            sorted.sort_unstable();
                            sorted.dedup();
                            prop_assert_eq!(sorted.len(), list.len());
                        }
                    }
                }
            }
        }

        /// Every rank's metadata (world 1 to 4), any of it hostile.
        fn world_descs() -> impl Strategy<Value = Vec<Desc>> {
            (1usize..5).prop_flat_map(|world| {
                prop::collection::vec((side(world), side(world)), world)
                    .prop_map(|sides| sides.into_iter().map(|(i, o)| desc_of(i, o)).collect())
            })
        }

        /// Every rank's metadata built from blocks (source, destination, rows) so that every
        /// pair matches by the rule — only the row counts can be hostile (near usize::MAX, each
        /// side's rows the splits' wrapping sum): what passes matching unless the sizes are
        /// checked.
        fn matched_world() -> impl Strategy<Value = Vec<Desc>> {
            (1usize..5).prop_flat_map(|world| {
                prop::collection::vec((0..world, 0..world, rows()), 0..8).prop_map(move |blocks| {
                    (0..world)
                        .map(|r| {
                            let mut d = Desc::default();
                            for &(src, dst, rows) in &blocks {
                                if src == r {
                                    d.input_split_rows.push(rows);
                                    d.input_peers.push(vec![dst]);
                                }
                                if dst == r {
                                    d.output_split_rows.push(rows);
                                    d.output_peers.push(vec![src]);
                                }
                            }
                            let wrapped =
                                |v: &[usize]| v.iter().fold(0usize, |a, &x| a.wrapping_add(x));
                            d.input_rows = wrapped(&d.input_split_rows);
                            d.output_rows = wrapped(&d.output_split_rows);
                            d
                        })
                        .collect()
                })
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]
            /// What a plan does with the ranks' all-gathered metadata — decode, `validate_all`,
            /// `match_global` — never panics on hostile payloads, and whatever it accepts moves
            /// rows only within each source's input and each destination's output (sums in
            /// u128, independent of the code under test), each within u32.
            #[test]
            fn received_metadata_moves_rows_only_within_the_tensors(
                descs in prop_oneof![world_descs(), matched_world()],
                reduce in any::<bool>(),
                cut in any::<prop::sample::Index>(),
            ) {
                let kind = if reduce { Kind::Reduce } else { Kind::Cast };
                let h = Header {
                    kind: kind as u64,
                    dtype: 7,
                    comm_dtype: 7,
                    row_elems: [128, 0, 0],
                    op: 0,
                    lse_per_row: 0,
                    accumulate: 0,
                    sms: 24,
                    device_splits: 0,
                };
                // A payload cut short anywhere is refused, never a panic.
                let bytes = encode(&h, &descs[0]);
                let _ = decode(&bytes[..cut.index(bytes.len() + 1)]);
                let decoded: Vec<Desc> = descs
                    .iter()
                    .map(|d| decode(&encode(&h, d)).map(|(_, d)| d))
                    .collect::<anyhow::Result<_>>()
                    .expect("a whole payload decodes");
                prop_assert_eq!(&decoded, &descs);
                let Ok(()) = validate_all(kind, &decoded, false) else { return Ok(()) };
                let Ok(transfers) = match_global(kind, &decoded) else { return Ok(()) };
                for t in transfers {
                    let (src, dst) = (&decoded[t.src], &decoded[t.dst]);
                    prop_assert!(t.src_row as u128 + t.rows as u128 <= src.input_rows as u128);
                    prop_assert!(t.dst_row as u128 + t.rows as u128 <= dst.output_rows as u128);
                    prop_assert!(src.input_rows <= u32::MAX as usize);
                    prop_assert!(dst.output_rows <= u32::MAX as usize);
                    let before: u128 = src.input_split_rows[..t.src_split].iter().map(|&r| r as u128).sum();
                    prop_assert_eq!(before, t.src_row as u128);
                    let before: u128 = dst.output_split_rows[..t.dst_split].iter().map(|&r| r as u128).sum();
                    prop_assert_eq!(before, t.dst_row as u128);
                }
            }
        }

        #[test]
        fn a_peers_unchecked_metadata_is_refused_naming_it() {
            // Rank 1 claims 4 input rows made of two splits whose sum wraps: it never passed its
            // own check, and this rank's check of what it received names it.
            let d0 = cast(vec![4], vec![vec![1]], vec![4], vec![1]);
            let mut d1 = cast(vec![4], vec![vec![0]], vec![4], vec![0]);
            d1.input_split_rows = vec![usize::MAX - 3, 8];
            d1.input_peers = vec![vec![0], vec![0]];
            let e = validate_all(Kind::Cast, &[d0, d1], false).unwrap_err();
            // What a caller gets: the typed error, naming the rank.
            match GrpcollError::from_anyhow(e) {
                GrpcollError::RanksDisagree(text) => assert!(
                    text.contains("rank 1's metadata as received") && text.contains("sum past"),
                    "{text}"
                ),
                other => panic!("expected RanksDisagree, got {other:?}"),
            }
            // Device metadata carries no splits, only the capacity's rows: accepted within u32
            // (a plan's own check of a device desc would refuse its empty splits), refused past.
            let device = |rows: usize| Desc {
                input_rows: rows,
                output_rows: 8,
                ..Desc::default()
            };
            assert!(validate_all(Kind::Cast, &[device(8), device(8)], true).is_ok());
            assert!(validate_all(Kind::Cast, &[device(8), device(8)], false).is_err());
            let e = validate_all(Kind::Cast, &[device(8), device(1 << 40)], true).unwrap_err();
            assert!(e.to_string().contains("rank 1's metadata"), "{e}");
        }

        #[test]
        fn a_sum_that_wraps_is_refused() {
            let mut d = cast(vec![1, 2], vec![vec![0], vec![0]], vec![3], vec![0]);
            d.input_split_rows = vec![usize::MAX - 7, 12]; // wraps to 4
            d.input_rows = 4;
            let e = validate_local(Kind::Cast, &d, 1).unwrap_err().to_string();
            assert!(e.contains("input_split_rows sum past"), "{e}");
        }
    }
}
