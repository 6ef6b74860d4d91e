//! The overlap benches' default shapes (local GEMM M × N × K per rank; for AllGather, M is the
//! gathered rows), and `--shape MxNxK[,…]`.

use anyhow::{ensure, Context};
use weft_signal_gemm::ops::OpKind;
use weft_signal_gemm::GemmShape;

/// M × N × K grid of the NCCL-overlap benches before the ops (tuner, All-to-All): M from 4096.
pub fn large_shapes(quick: bool) -> Vec<GemmShape> {
    let s = GemmShape::new;
    if quick {
        return vec![s(8192, 8192, 2048), s(16384, 8192, 1024)];
    }
    let mut v = Vec::new();
    for m in [4096, 8192, 16384] {
        for k in [1024, 2048, 7168] {
            v.push(s(m, 8192, k));
        }
    }
    v.push(s(16384, 16384, 2048));
    v
}

/// Decoding-sized M (16 to 512 tokens), where overlap cannot win and `Auto` must fall back.
pub fn small_m_shapes(op: OpKind) -> Vec<GemmShape> {
    let s = GemmShape::new;
    match op {
        // Row-parallel projections: N = hidden 8192, K = the rank's part of the inner size.
        OpKind::AllReduce | OpKind::ReduceScatter => {
            vec![s(16, 8192, 4096), s(128, 8192, 4096), s(512, 8192, 4096)]
        }
        // Column-parallel: gathered tokens, N = the rank's columns, K = hidden.
        OpKind::AllGather => vec![s(32, 4096, 8192), s(128, 4096, 8192), s(512, 4096, 8192)],
        // MoE dispatch of a projection's rows: a decoding step's tokens.
        OpKind::AllToAll => vec![s(128, 8192, 4096)],
    }
}

/// The default grid of an op's bench.
pub fn shapes(op: OpKind, quick: bool) -> Vec<GemmShape> {
    let s = GemmShape::new;
    let mut v = small_m_shapes(op);
    if quick {
        v.truncate(1);
    }
    match op {
        OpKind::AllReduce | OpKind::ReduceScatter => v.extend(large_shapes(quick)),
        // The dual of the ReduceScatter grid: with sequence parallelism a layer's AllGather +
        // GEMM (column-parallel, K = hidden) and its GEMM + ReduceScatter (row-parallel, N =
        // hidden) share the rank's inner size, so each row M × N × K there is M × K × N here
        // (async-TP's shapes, N = 2048 at M = 8192 and 16384, among them).
        OpKind::AllGather => v.extend(
            large_shapes(quick)
                .into_iter()
                .map(|g| s(g.m, g.k, g.n))
                .collect::<Vec<_>>(),
        ),
        OpKind::AllToAll => v.extend(if quick {
            vec![s(8192, 8192, 2048)]
        } else {
            vec![
                s(4096, 8192, 1024),
                s(8192, 8192, 2048),
                s(16384, 8192, 1024),
                s(8192, 8192, 7168),
            ]
        }),
    }
    v
}

/// `MxNxK[,MxNxK…]`.
pub fn parse_shapes(text: &str) -> anyhow::Result<Vec<GemmShape>> {
    text.split(',')
        .map(|one| {
            let dims: Vec<&str> = one.trim().split(['x', 'X']).collect();
            ensure!(
                dims.len() == 3,
                "--shape {one:?}: expected MxNxK, e.g. 6144x8192x4096"
            );
            let d = |i: usize, name: &str| -> anyhow::Result<u32> {
                let v: u32 = dims[i].parse().with_context(|| {
                    format!(
                        "--shape {one:?}: {name} {:?} is not a whole number",
                        dims[i]
                    )
                })?;
                ensure!(v > 0, "--shape {one:?}: {name} is 0");
                Ok(v)
            };
            Ok(GemmShape::new(d(0, "M")?, d(1, "N")?, d(2, "K")?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_shapes("6144x8192x4096").unwrap(),
            vec![GemmShape::new(6144, 8192, 4096)]
        );
        assert_eq!(parse_shapes("16x8x32, 32X16x8").unwrap().len(), 2);
        assert!(format!("{:#}", parse_shapes("6144x8192").unwrap_err()).contains("expected MxNxK"));
        assert!(format!("{:#}", parse_shapes("6144x8192xk").unwrap_err()).contains("K \"k\""));
        assert!(format!("{:#}", parse_shapes("0x8x8").unwrap_err()).contains("M is 0"));
    }

    #[test]
    fn the_all_gather_grid_is_the_reduce_scatter_grids_dual() {
        let ag = shapes(OpKind::AllGather, false);
        for g in shapes(OpKind::ReduceScatter, false)
            .iter()
            .filter(|g| g.m >= 4096)
        {
            assert!(ag.contains(&GemmShape::new(g.m, g.k, g.n)), "{g:?}");
        }
        assert!(ag.contains(&GemmShape::new(8192, 2048, 8192)));
    }

    #[test]
    fn default_grids_start_with_small_m() {
        for op in [
            OpKind::AllReduce,
            OpKind::ReduceScatter,
            OpKind::AllGather,
            OpKind::AllToAll,
        ] {
            let g = shapes(op, false);
            assert!(
                g[0].m <= 512 && g.iter().any(|s| s.m >= 8192),
                "{op}: {g:?}"
            );
        }
    }
}
