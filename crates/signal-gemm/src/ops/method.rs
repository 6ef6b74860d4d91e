//! The methods behind every overlapped op, as values: a [`Method`] is one way to run an op with
//! all its parameters fixed (what the choice cache stores and `--method` can name exactly); a
//! [`Family`] is a method without its parameters; a [`MethodChoice`] is what a caller asks for.
//!
//! Text forms (round-trip through `Display` / `FromStr`):
//!
//! ```text
//! seq-cublas  seq-weft  seq-collectives  decomposition:<chunks>  signal:<sm_margin>:<waves per group, '+'-joined>
//! signal-ce:<waves per group, '+'-joined>  fused-intra[:<tile width>]  fused-inter:<ctas>
//! fused-ce:<tile rows per copy>[:<tile width>][:k<chunks along K>]  distfuse:<workers>
//! ```

use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::plan::TileChoice;
use anyhow::Context;
use std::fmt;
use std::str::FromStr;

/// One way to run an op, every parameter fixed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// cuBLAS, then the NCCL collective (or, for AllGather, the NCCL gather then cuBLAS): the
    /// baseline every other method must beat.
    SeqCublas,
    /// weft's GEMM and NCCL, one after the other.
    SeqWeft,
    /// cuBLAS, then weft's own peer-memory collective (`weft-collectives`: one-shot and
    /// sentinel protocols, one NVLink hop of latency) instead of NCCL's (AllGather: weft's
    /// gather, then cuBLAS). Not for All-to-All.
    SeqCollectives,
    /// The GEMM cut into `chunks` row bands; each band's collective on a second stream as soon
    /// as the band is computed (AllGather: each shard's GEMM as soon as it has arrived).
    Decomposition { chunks: u32 },
    /// FlashOverlap's design: the GEMM stores tiles in the collective's layout and signals each
    /// wave group; one NCCL call per group on the SMs `sm_margin` leaves.
    Signal { sm_margin: u32, waves: Vec<u32> },
    /// The signal path's GEMM and wave groups with the rows moved by copy engines (All-to-All):
    /// each group's pools copied into the destinations' buffers once the group is stored, no
    /// NCCL, one SM left for the group waits.
    SignalCe { waves: Vec<u32> },
    /// ParallelKittens' intra-SM design: the GEMM's own epilogue (ReduceScatter: TMA reduce-add
    /// into the owner; All-to-All: stores into the destinations) or loader (AllGather: TMA loads
    /// from the owner) talks to the peers. `tile_n`: the GEMM's tile width (128 or 256), or
    /// `None` for the plan's own choice: narrower tiles make more, shorter ones, and less work
    /// after the last stores (the All-to-All's skewed routings).
    FusedIntra { tile_n: Option<u32> },
    /// ParallelKittens' inter-SM design: `ctas` communicator CTAs of the GEMM kernel move the
    /// data (AllReduce: tile owners sum and broadcast; AllGather: chunked copies).
    FusedInter { ctas: u32 },
    /// AllGather: copy engines pull the peers' shards (PyTorch async-TP's data movement) on a
    /// side stream, `tile_rows` tile rows per copy, while weft's persistent GEMM keeps every SM
    /// and waits for each copy's flag before loading its rows. `tile_n`: the GEMM's tile width
    /// (128 or 256), or `None` for the plan's own choice: narrower tiles shorten the work left
    /// after the last copy lands where the gather takes longer than the GEMM. `k_chunks`: copies
    /// per group along K (1: whole rows), so that a tile starts once the first chunk landed.
    FusedCe {
        tile_rows: u32,
        tile_n: Option<u32>,
        k_chunks: u32,
    },
    /// DistFuse: per-tile flags, `workers` CTAs of a second kernel all-reduce each tile as soon
    /// as it is ready.
    DistFuse { workers: u32 },
}

/// A method without its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    SeqCublas,
    SeqWeft,
    SeqCollectives,
    Decomposition,
    Signal,
    SignalCe,
    FusedIntra,
    FusedInter,
    FusedCe,
    DistFuse,
}

impl Family {
    pub const ALL: [Family; 10] = [
        Family::SeqCublas,
        Family::SeqWeft,
        Family::SeqCollectives,
        Family::Decomposition,
        Family::Signal,
        Family::SignalCe,
        Family::FusedIntra,
        Family::FusedInter,
        Family::FusedCe,
        Family::DistFuse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::SeqCublas => "seq-cublas",
            Family::SeqWeft => "seq-weft",
            Family::SeqCollectives => "seq-collectives",
            Family::Decomposition => "decomposition",
            Family::Signal => "signal",
            Family::SignalCe => "signal-ce",
            Family::FusedIntra => "fused-intra",
            Family::FusedInter => "fused-inter",
            Family::FusedCe => "fused-ce",
            Family::DistFuse => "distfuse",
        }
    }

    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether the family's launches can be captured into a CUDA graph and replayed: the fused
    /// methods keep host-side epochs in their kernels' parameters, so a replay would wait for
    /// targets that were already reached.
    pub fn capturable(self) -> bool {
        !matches!(
            self,
            Family::SignalCe
                | Family::FusedIntra
                | Family::FusedInter
                | Family::FusedCe
                | Family::DistFuse
        )
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Method {
    pub fn family(&self) -> Family {
        match self {
            Method::SeqCublas => Family::SeqCublas,
            Method::SeqWeft => Family::SeqWeft,
            Method::SeqCollectives => Family::SeqCollectives,
            Method::Decomposition { .. } => Family::Decomposition,
            Method::Signal { .. } => Family::Signal,
            Method::SignalCe { .. } => Family::SignalCe,
            Method::FusedIntra { .. } => Family::FusedIntra,
            Method::FusedInter { .. } => Family::FusedInter,
            Method::FusedCe { .. } => Family::FusedCe,
            Method::DistFuse { .. } => Family::DistFuse,
        }
    }

    /// Whether it is one of the sequential paths (always candidates, measured first).
    pub fn is_sequential(&self) -> bool {
        matches!(
            self,
            Method::SeqCublas | Method::SeqWeft | Method::SeqCollectives
        )
    }
}

impl Method {
    /// The GEMM's tile choice: the width the method fixes (`fused-intra:<w>`, `fused-ce:…:<w>`:
    /// 128 or 256), else `planned`, the options' own.
    pub fn tile_choice(&self, planned: TileChoice) -> Result<TileChoice, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<TileChoice> {
            let tile_n = match self {
                Method::FusedIntra { tile_n } | Method::FusedCe { tile_n, .. } => *tile_n,
                _ => None,
            };
            Ok(match tile_n {
                None => planned,
                Some(128) => TileChoice::N128,
                Some(256) => TileChoice::N256,
                Some(w) => refuse!(Options, "{self}: the tile width is 128 or 256, not {w}"),
            })
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.family().name();
        match self {
            Method::SeqCublas
            | Method::SeqWeft
            | Method::SeqCollectives
            | Method::FusedIntra { tile_n: None } => f.write_str(name),
            Method::FusedIntra { tile_n: Some(w) } => write!(f, "{name}:{w}"),
            Method::Decomposition { chunks } => write!(f, "{name}:{chunks}"),
            Method::FusedInter { ctas } => write!(f, "{name}:{ctas}"),
            Method::FusedCe {
                tile_rows,
                tile_n,
                k_chunks,
            } => {
                write!(f, "{name}:{tile_rows}")?;
                if let Some(w) = tile_n {
                    write!(f, ":{w}")?;
                }
                if *k_chunks > 1 {
                    write!(f, ":k{k_chunks}")?;
                }
                Ok(())
            }
            Method::DistFuse { workers } => write!(f, "{name}:{workers}"),
            Method::Signal { sm_margin, waves } => {
                let w: Vec<String> = waves.iter().map(u32::to_string).collect();
                write!(f, "{name}:{sm_margin}:{}", w.join("+"))
            }
            Method::SignalCe { waves } => {
                let w: Vec<String> = waves.iter().map(u32::to_string).collect();
                write!(f, "{name}:{}", w.join("+"))
            }
        }
    }
}

/// A fixed tile width in a method's text: 128 or 256.
fn tile_width(text: &str, method: &str) -> anyhow::Result<u32> {
    let w = count(text, "tile width", method)?;
    require!(
        w == 128 || w == 256,
        Options,
        "method {method:?}: the tile width is 128 or 256, not {w}"
    );
    Ok(w)
}

fn count(text: &str, what: &str, method: &str) -> anyhow::Result<u32> {
    let v: u32 = text
        .parse()
        .with_context(|| format!("method {method:?}: {what} {text:?} is not a whole number"))?;
    require!(
        v > 0,
        Options,
        "method {method:?}: {what} must be at least 1"
    );
    Ok(v)
}

impl FromStr for Method {
    type Err = GemmError;

    fn from_str(s: &str) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let parts: Vec<&str> = s.split(':').collect();
            let Some(family) = Family::from_name(parts[0]) else {
                refuse!(
                    Options,
                    "unknown method {s:?} (methods: {})",
                    Family::ALL.map(Family::name).join(", ")
                );
            };
            let args = &parts[1..];
            let want = |n: usize, form: &str| -> anyhow::Result<()> {
                require!(
                    args.len() == n,
                    Options,
                    "method {s:?}: expected the form {form}"
                );
                Ok(())
            };
            Ok(match family {
                Family::SeqCublas => want(0, "seq-cublas").map(|()| Method::SeqCublas)?,
                Family::SeqWeft => want(0, "seq-weft").map(|()| Method::SeqWeft)?,
                Family::SeqCollectives => {
                    want(0, "seq-collectives").map(|()| Method::SeqCollectives)?
                }
                Family::FusedIntra => {
                    require!(
                        args.len() <= 1,
                        Options,
                        "method {s:?}: expected the form fused-intra[:<tile width, 128 or 256>]"
                    );
                    Method::FusedIntra {
                        tile_n: args.first().map(|w| tile_width(w, s)).transpose()?,
                    }
                }
                Family::Decomposition => {
                    want(1, "decomposition:<chunks>")?;
                    Method::Decomposition {
                        chunks: count(args[0], "chunks", s)?,
                    }
                }
                Family::FusedInter => {
                    want(1, "fused-inter:<ctas>")?;
                    Method::FusedInter {
                        ctas: count(args[0], "CTA count", s)?,
                    }
                }
                Family::FusedCe => {
                    let form =
                        "fused-ce:<tile rows per copy>[:<tile width, 128 or 256>][:k<chunks along K>]";
                    require!(
                        (1..=3).contains(&args.len()),
                        Options,
                        "method {s:?}: expected the form {form}"
                    );
                    // The optional parts in their order: a width, then k and a chunk count.
                    let (widths, chunks): (Vec<&str>, Vec<&str>) =
                        args[1..].iter().partition(|a| !a.starts_with('k'));
                    require!(
                        widths.len() <= 1
                            && chunks.len() <= 1
                            && (chunks.is_empty() || args.last() == chunks.first()),
                        Options,
                        "method {s:?}: expected the form {form}"
                    );
                    let tile_n = widths.first().map(|w| tile_width(w, s)).transpose()?;
                    let k_chunks = match chunks.first() {
                        None => 1,
                        Some(c) => count(&c[1..], "chunks along K", s)?,
                    };
                    Method::FusedCe {
                        tile_rows: count(args[0], "tile rows per copy", s)?,
                        tile_n,
                        k_chunks,
                    }
                }
                Family::DistFuse => {
                    want(1, "distfuse:<workers>")?;
                    Method::DistFuse {
                        workers: count(args[0], "worker count", s)?,
                    }
                }
                Family::SignalCe => {
                    want(1, "signal-ce:<waves>+<waves>…")?;
                    let waves = args[0]
                        .split('+')
                        .map(|w| count(w, "waves per group", s))
                        .collect::<anyhow::Result<Vec<u32>>>()?;
                    Method::SignalCe { waves }
                }
                Family::Signal => {
                    want(2, "signal:<sm_margin>:<waves>+<waves>…")?;
                    let sm_margin: u32 = args[0].parse().with_context(|| {
                        format!(
                            "method {s:?}: sm_margin {:?} is not a whole number",
                            args[0]
                        )
                    })?;
                    let waves = args[1]
                        .split('+')
                        .map(|w| count(w, "waves per group", s))
                        .collect::<anyhow::Result<Vec<u32>>>()?;
                    Method::Signal { sm_margin, waves }
                }
            })
        })
    }
}

/// What a caller asks an op for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MethodChoice {
    /// The fastest method that can run the shape (measured at first use, or cached).
    Auto,
    /// The fastest parameters of one family.
    Family(Family),
    /// Exactly this method.
    Exact(Method),
}

impl MethodChoice {
    /// Whether `method` is one this choice allows.
    pub fn allows(&self, method: &Method) -> bool {
        match self {
            MethodChoice::Auto => true,
            MethodChoice::Family(f) => method.family() == *f,
            MethodChoice::Exact(m) => m == method,
        }
    }
}

impl fmt::Display for MethodChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MethodChoice::Auto => f.write_str("auto"),
            MethodChoice::Family(x) => write!(f, "{x}"),
            MethodChoice::Exact(m) => write!(f, "{m}"),
        }
    }
}

impl FromStr for MethodChoice {
    type Err = GemmError;

    /// `auto`, a family name (`signal`), or an exact method (`signal:32:1+3`).
    fn from_str(s: &str) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            if s == "auto" {
                return Ok(MethodChoice::Auto);
            }
            if let Some(f) = Family::from_name(s) {
                if !s.contains(':')
                    && !matches!(
                        f,
                        Family::SeqCublas
                            | Family::SeqWeft
                            | Family::SeqCollectives
                            | Family::FusedIntra
                    )
                {
                    return Ok(MethodChoice::Family(f));
                }
            }
            Ok(MethodChoice::Exact(s.parse()?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip() {
        let methods = [
            Method::SeqCublas,
            Method::SeqWeft,
            Method::SeqCollectives,
            Method::Decomposition { chunks: 4 },
            Method::Signal {
                sm_margin: 32,
                waves: vec![1, 3],
            },
            Method::SignalCe { waves: vec![2, 1] },
            Method::FusedIntra { tile_n: None },
            Method::FusedIntra { tile_n: Some(128) },
            Method::FusedInter { ctas: 16 },
            Method::FusedCe {
                tile_rows: 4,
                tile_n: None,
                k_chunks: 1,
            },
            Method::FusedCe {
                tile_rows: 16,
                tile_n: Some(128),
                k_chunks: 1,
            },
            Method::FusedCe {
                tile_rows: 16,
                tile_n: None,
                k_chunks: 8,
            },
            Method::FusedCe {
                tile_rows: 2,
                tile_n: Some(256),
                k_chunks: 4,
            },
            Method::DistFuse { workers: 8 },
        ];
        for m in methods {
            let text = m.to_string();
            assert_eq!(text.parse::<Method>().unwrap(), m, "{text}");
            assert_eq!(
                text.parse::<MethodChoice>().unwrap(),
                MethodChoice::Exact(m.clone())
            );
        }
        assert_eq!(
            "signal:16:2".parse::<Method>().unwrap(),
            Method::Signal {
                sm_margin: 16,
                waves: vec![2]
            }
        );
    }

    #[test]
    fn choices_parse_auto_families_and_exact_methods() {
        assert_eq!("auto".parse::<MethodChoice>().unwrap(), MethodChoice::Auto);
        assert_eq!(
            "distfuse".parse::<MethodChoice>().unwrap(),
            MethodChoice::Family(Family::DistFuse)
        );
        assert_eq!(
            "signal".parse::<MethodChoice>().unwrap(),
            MethodChoice::Family(Family::Signal)
        );
        // Methods without parameters are exact methods and their own family.
        assert_eq!(
            "seq-cublas".parse::<MethodChoice>().unwrap(),
            MethodChoice::Exact(Method::SeqCublas)
        );
        assert_eq!(
            "seq-collectives".parse::<MethodChoice>().unwrap(),
            MethodChoice::Exact(Method::SeqCollectives)
        );
        assert!(MethodChoice::Family(Family::FusedInter).allows(&Method::FusedInter { ctas: 8 }));
        assert!(!MethodChoice::Family(Family::FusedInter).allows(&Method::DistFuse { workers: 8 }));
    }

    #[test]
    fn bad_text_names_the_problem() {
        let err = |s: &str| format!("{:#}", s.parse::<Method>().unwrap_err());
        assert!(err("magic").contains("unknown method \"magic\""));
        assert!(err("distfuse").contains("distfuse:<workers>"));
        assert!(err("fused-inter:x").contains("CTA count \"x\""));
        assert!(err("fused-inter:0").contains("at least 1"));
        assert!(err("fused-ce").contains("fused-ce:<tile rows per copy>"));
        assert!(err("fused-ce:0").contains("at least 1"));
        assert!(err("fused-ce:4:k0").contains("chunks along K must be at least 1"));
        assert!(err("fused-ce:4:kx").contains("chunks along K \"x\""));
        assert!(err("fused-ce:4:k2:128").contains("the form fused-ce:"));
        assert!(err("fused-ce:4:k2:k3").contains("the form fused-ce:"));
        assert!(err("fused-ce:4:128:256").contains("the form fused-ce:"));
        assert!(err("fused-ce:4:192").contains("128 or 256, not 192"));
        assert!(err("fused-intra:192").contains("128 or 256, not 192"));
        assert!(err("fused-intra:128:4").contains("fused-intra[:<tile width"));
        assert!(err("signal-ce").contains("signal-ce:<waves>"));
        assert!(err("signal-ce:2+0").contains("at least 1"));
        assert!(err("signal:32").contains("signal:<sm_margin>"));
        assert!(err("signal:32:1+0").contains("at least 1"));
        assert!(err("seq-weft:3").contains("the form seq-weft"));
        assert!(err("seq-collectives:8").contains("the form seq-collectives"));
    }

    #[test]
    fn fused_families_are_not_capturable() {
        assert!(
            Family::SeqCublas.capturable()
                && Family::SeqCollectives.capturable()
                && Family::Signal.capturable()
                && Family::Decomposition.capturable()
        );
        assert!(
            !Family::FusedIntra.capturable()
                && !Family::SignalCe.capturable()
                && !Family::FusedInter.capturable()
                && !Family::FusedCe.capturable()
                && !Family::DistFuse.capturable()
        );
    }
}
