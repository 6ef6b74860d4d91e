//! Which methods can run an op at a shape: the candidates `Auto` measures, sequential ones first
//! (so a measurement cut short by its budget always has the baseline to fall back on).

use super::method::Method;
use crate::error::GemmError;
use crate::fused::k_chunks_fit;
use crate::plan::{FusionSet, GemmOptions, GemmPlan, GemmShape, TileChoice};
use crate::reorder::MAX_BAND_RANKS;
use crate::wave_groups::WaveGroups;
use std::fmt;
use weft_kernels::abi::{WEFT_GEMM_MAX_WAVE_GROUPS, WEFT_GEMM_TILE_K, WEFT_GEMM_TILE_M};

/// The collective an op overlaps with its GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// D = Σ_ranks A_r · B_r on every rank.
    AllReduce,
    /// Rank r gets rows [r·m/world, (r + 1)·m/world) of Σ_ranks A_r · B_r.
    ReduceScatter,
    /// D = AllGather_rows(A shards) · B on every rank (each with its own B).
    AllGather,
    /// Each row of A_rank · B_rank goes to the rank its routing names (MoE dispatch); rank r gets
    /// the rows routed to it, source rank by source rank, each source's rows in order.
    AllToAll,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::AllToAll => "all_to_all",
        }
    }

    /// For messages: "GEMM + AllReduce".
    pub fn title(self) -> &'static str {
        match self {
            OpKind::AllReduce => "GEMM + AllReduce",
            OpKind::ReduceScatter => "GEMM + ReduceScatter",
            OpKind::AllGather => "AllGather + GEMM",
            OpKind::AllToAll => "GEMM + All-to-All",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// SM margins (NCCL's CTA limit) the signal method tries.
pub const SIGNAL_MARGINS: [u32; 2] = [16, 32];
/// Communicator / worker CTA counts the fused methods try.
pub const FUSED_COUNTS: [u32; 3] = [8, 16, 32];
/// Tile rows per copy the copy-engine AllGather tries (2 MiB and 8 MiB copies at k = 4096, bf16).
pub const COPY_ENGINE_TILE_ROWS: [u32; 2] = [4, 16];
/// Column chunks along K of the copy-engine AllGather's K-chunked candidates (16 tile rows a
/// copy): on two H200s 4 chunks won at 512–4096 rows, 8 at some larger shapes, on four 2 or 4
/// at 4096–8192 rows; 16 lost everywhere (2D copies of 1 KiB-wide rows;
/// results/overlap-all-gather/k-chunks-nvidia-h200-x4-2026-11-27/).
pub const COPY_ENGINE_K_CHUNKS: [u32; 3] = [2, 4, 8];
/// The most waves (of the plan's wider tiles) at which the fused ReduceScatter also tries
/// 128-wide tiles.
pub const NARROW_REDUCE_SCATTER_MAX_WAVES: u32 = 4;
/// Row bands the decomposition of AllReduce and ReduceScatter tries.
pub const DECOMPOSITION_CHUNKS: [u32; 2] = [2, 4];

/// Wave groupings the signal method tries for `plan`: 1, 2 or 4 waves a group, the first wave
/// alone, and two halves (deduplicated).
pub fn groupings(plan: &GemmPlan) -> Result<Vec<Vec<u32>>, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<Vec<Vec<u32>>> {
        let waves = plan.waves();
        let mut out = Vec::new();
        for w in [1, 2, 4] {
            if waves.div_ceil(w) <= WEFT_GEMM_MAX_WAVE_GROUPS {
                out.push(WaveGroups::uniform(plan, w)?.waves().to_vec());
            }
        }
        if waves > 1 {
            out.push(vec![1, waves - 1]);
            out.push(vec![waves.div_ceil(2), waves / 2]);
        }
        out.sort();
        out.dedup();
        Ok(out)
    })
}

/// The methods `Auto` considers for `op` at `shape` on `world` ranks of `sms` SMs, sequential
/// ones first. `capturable` keeps only methods whose launches can be replayed from a CUDA graph.
/// A listed method may still be refused when it is planned (its kernel does not fit, say);
/// `Auto` then excludes it on every rank.
pub fn candidates(
    op: OpKind,
    shape: GemmShape,
    options: GemmOptions,
    world: u32,
    sms: u32,
    capturable: bool,
) -> Vec<Method> {
    let mut out = vec![Method::SeqCublas, Method::SeqWeft];
    // weft's own collectives after cuBLAS: at small M the collective is mostly latency, where
    // NCCL's is 2–3× weft's (crates/collectives/README.md); no All-to-All among them.
    if world > 1 && op != OpKind::AllToAll {
        out.push(Method::SeqCollectives);
    }
    let m = shape.m;
    match op {
        OpKind::AllReduce | OpKind::ReduceScatter => {
            // Each band (and, for ReduceScatter, each rank's part of it) a whole number of rows.
            let split = if op == OpKind::ReduceScatter {
                world
            } else {
                1
            };
            for chunks in DECOMPOSITION_CHUNKS {
                if m.is_multiple_of(chunks * split) {
                    out.push(Method::Decomposition { chunks });
                }
            }
        }
        OpKind::AllGather => {
            if world > 1 {
                out.push(Method::Decomposition { chunks: world });
            }
        }
        OpKind::AllToAll => {}
    }
    if op == OpKind::AllToAll && (2..=32).contains(&world) {
        // The copy engines move the rows; the GEMM leaves one SM for the group waits.
        if let Ok(plan) = GemmPlan::new(
            sms,
            shape,
            GemmOptions {
                sm_margin: crate::overlap::COPY_ENGINE_SM_MARGIN,
                ..options
            },
        ) {
            for waves in groupings(&plan).unwrap_or_default() {
                out.push(Method::SignalCe { waves });
            }
        }
    }
    if matches!(op, OpKind::AllReduce | OpKind::AllToAll) {
        // The signal ReduceScatter's bands give rank r the r-th band of every tile's rows, not
        // NCCL's contiguous rows: it is not this op (overlap::ReduceScatterOverlap keeps it).
        for sm_margin in SIGNAL_MARGINS {
            let Ok(plan) = GemmPlan::new(
                sms,
                shape,
                GemmOptions {
                    sm_margin,
                    ..options
                },
            ) else {
                continue;
            };
            for waves in groupings(&plan).unwrap_or_default() {
                out.push(Method::Signal { sm_margin, waves });
            }
        }
    }
    // The fused methods' own limits (refused by their plans too): at most 8 ranks, and whole
    // blocks of rows per rank — 64 for the ReduceScatter's owners, a 128-row tile for the
    // AllGather's shards.
    let rows_per_rank = m / world.max(1);
    let fused_world = world <= MAX_BAND_RANKS;
    // Narrow tiles where the plan would choose a wider one itself: more, shorter tiles, so the
    // communication of the first waves overlaps the GEMM of the later ones, and less work is
    // left after the last of it (the fused ReduceScatter only at a few waves: on its grid on two
    // H200s 128-wide tiles were never faster, up to 16 % slower; results/overlap-reduce-scatter/
    // narrow-tiles-nvidia-h200-x2-2026-11-27/).
    let plan = GemmPlan::new(sms, shape, options);
    let narrow = options.tile == TileChoice::Auto && plan.as_ref().is_ok_and(|p| p.tile_n() != 128);
    match op {
        OpKind::ReduceScatter => {
            if fused_world && m.is_multiple_of(world) && rows_per_rank.is_multiple_of(64) {
                out.push(Method::FusedIntra { tile_n: None });
                // A GEMM of a few waves of wider tiles: 128-wide ones too (on two H200s 512 ×
                // 8192 × 1024 took 34.5 µs against 39.0, 1024 × 8192 × 2048 68.5 against 75.3;
                // 1024 × 8192 × 4096 123.0 against 118.6; results/overlap-reduce-scatter/
                // own-last-nvidia-h200-x2-2026-11-27-3e89360/).
                if narrow
                    && plan
                        .as_ref()
                        .is_ok_and(|p| p.waves() <= NARROW_REDUCE_SCATTER_MAX_WAVES)
                {
                    out.push(Method::FusedIntra { tile_n: Some(128) });
                }
            }
        }
        OpKind::AllGather => {
            if fused_world
                && m.is_multiple_of(world)
                && rows_per_rank.is_multiple_of(WEFT_GEMM_TILE_M)
            {
                // Not fused-intra (the loaders' TMA reads of the owners' shards): every tile
                // column re-reads the peers' A tiles over the link, so its bytes grow with
                // n / tile width; it lost to the sequential path on every shape measured, at 2
                // and 4 GPUs (crates/signal-gemm/README.md, "fused-intra AllGather retired").
                // Still a method to name explicitly.
                out.extend(FUSED_COUNTS.map(|ctas| Method::FusedInter { ctas }));
                out.extend(COPY_ENGINE_TILE_ROWS.map(|tile_rows| Method::FusedCe {
                    tile_rows,
                    tile_n: None,
                    k_chunks: 1,
                }));
                // Groups of 16 tile rows in column chunks along K: a tile starts once its rows'
                // first chunk landed (one-wave GEMMs start every tile at once). Only on the
                // AllGather's own kernel, and only counts whole K blocks make exactly.
                let own_kernel = plan
                    .as_ref()
                    .is_ok_and(|p| p.has_method_kernel(FusionSet::AllGather));
                for k_chunks in COPY_ENGINE_K_CHUNKS {
                    if own_kernel && k_chunks_fit(shape.k.div_ceil(WEFT_GEMM_TILE_K), k_chunks) {
                        out.push(Method::FusedCe {
                            tile_rows: COPY_ENGINE_TILE_ROWS[1],
                            tile_n: None,
                            k_chunks,
                        });
                    }
                }
                // Narrow tiles: where the gather takes longer than the GEMM, the tiles left after
                // the last copy lands are the tail (4096×1024×8192 on two H200s: 0.181 ms
                // against 0.205).
                if narrow {
                    out.extend(COPY_ENGINE_TILE_ROWS.map(|tile_rows| Method::FusedCe {
                        tile_rows,
                        tile_n: Some(128),
                        k_chunks: 1,
                    }));
                }
            }
        }
        OpKind::AllToAll => {
            if fused_world {
                out.push(Method::FusedIntra { tile_n: None });
                // Skewed routings where the stores outlast the GEMM (4096 × 8192 × 1024 on two
                // H200s: 0.188 ms against 0.167).
                if narrow {
                    out.push(Method::FusedIntra { tile_n: Some(128) });
                }
            }
        }
        OpKind::AllReduce => {
            if fused_world {
                out.extend(FUSED_COUNTS.map(|ctas| Method::FusedInter { ctas }));
                out.extend(FUSED_COUNTS.map(|workers| Method::DistFuse { workers }));
            }
        }
    }
    if capturable {
        out.retain(|m| m.family().capturable());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::method::Family;

    fn families(list: &[Method]) -> Vec<Family> {
        let mut f: Vec<Family> = list.iter().map(Method::family).collect();
        f.dedup();
        f
    }

    #[test]
    fn every_op_starts_with_the_sequential_paths() {
        let o = GemmOptions::default();
        for op in [
            OpKind::AllReduce,
            OpKind::ReduceScatter,
            OpKind::AllGather,
            OpKind::AllToAll,
        ] {
            for shape in [
                GemmShape::new(16, 8192, 4096),
                GemmShape::new(8192, 8192, 2048),
            ] {
                let c = candidates(op, shape, o, 2, 132, false);
                assert_eq!(c[..2], [Method::SeqCublas, Method::SeqWeft], "{op} {shape}");
                // Every sequential path before any other.
                let seq = c.iter().take_while(|m| m.is_sequential()).count();
                assert!(
                    c[seq..].iter().all(|m| !m.is_sequential()),
                    "{op} {shape}: {c:?}"
                );
                assert_eq!(
                    c.contains(&Method::SeqCollectives),
                    op != OpKind::AllToAll,
                    "{op} {shape}"
                );
                let c = candidates(op, shape, o, 2, 132, true);
                assert!(
                    c.iter().all(|m| m.family().capturable()),
                    "{op} {shape}: {c:?}"
                );
            }
        }
    }

    #[test]
    fn families_per_op() {
        let o = GemmOptions::default();
        let s = GemmShape::new(8192, 8192, 2048);
        use Family::*;
        assert_eq!(
            families(&candidates(OpKind::AllReduce, s, o, 2, 132, false)),
            [
                SeqCublas,
                SeqWeft,
                SeqCollectives,
                Decomposition,
                Signal,
                FusedInter,
                DistFuse
            ]
        );
        assert_eq!(
            families(&candidates(OpKind::ReduceScatter, s, o, 2, 132, false)),
            [
                SeqCublas,
                SeqWeft,
                SeqCollectives,
                Decomposition,
                FusedIntra
            ]
        );
        assert_eq!(
            families(&candidates(OpKind::AllGather, s, o, 2, 132, false)),
            [
                SeqCublas,
                SeqWeft,
                SeqCollectives,
                Decomposition,
                FusedInter,
                FusedCe
            ]
        );
        // 8 rows per rank: no fused ReduceScatter or AllGather; one rank: nothing to decompose.
        assert_eq!(
            families(&candidates(
                OpKind::ReduceScatter,
                GemmShape::new(16, 8192, 4096),
                o,
                2,
                132,
                false
            )),
            [SeqCublas, SeqWeft, SeqCollectives, Decomposition]
        );
        assert_eq!(
            families(&candidates(
                OpKind::AllGather,
                GemmShape::new(16, 8192, 4096),
                o,
                2,
                132,
                false
            )),
            [SeqCublas, SeqWeft, SeqCollectives, Decomposition]
        );
        assert_eq!(
            families(&candidates(OpKind::AllGather, s, o, 1, 132, false))[..3],
            [SeqCublas, SeqWeft, FusedInter]
        );
        assert_eq!(
            families(&candidates(OpKind::AllToAll, s, o, 2, 132, false)),
            [SeqCublas, SeqWeft, SignalCe, Signal, FusedIntra]
        );
    }

    #[test]
    fn fused_variants_follow_the_plan_width_and_k() {
        let o = GemmOptions::default();
        let fused = |op, shape, o| -> Vec<Method> {
            candidates(op, shape, o, 2, 132, false)
                .into_iter()
                .filter(|m| matches!(m, Method::FusedIntra { .. } | Method::FusedCe { .. }))
                .collect()
        };
        // 4096 × 8192: the plan takes 128 × 256 tiles, so the All-to-All tries 128 too (the
        // ReduceScatter does not).
        let s = GemmShape::new(4096, 8192, 1024);
        assert_eq!(GemmPlan::new(132, s, o).unwrap().tile_n(), 256);
        let both = [
            Method::FusedIntra { tile_n: None },
            Method::FusedIntra { tile_n: Some(128) },
        ];
        assert_eq!(fused(OpKind::AllToAll, s, o), both);
        assert_eq!(fused(OpKind::ReduceScatter, s, o), both[..1]);
        // A GEMM of a few waves of wider tiles: the ReduceScatter tries 128-wide ones too.
        let small = GemmShape::new(512, 8192, 1024);
        let plan = GemmPlan::new(132, small, o).unwrap();
        assert!(plan.tile_n() != 128 && plan.waves() <= NARROW_REDUCE_SCATTER_MAX_WAVES);
        assert_eq!(fused(OpKind::ReduceScatter, small, o), both);
        // A fixed tile in the options: no second width.
        let fixed = GemmOptions {
            tile: TileChoice::N256,
            ..o
        };
        assert_eq!(fused(OpKind::ReduceScatter, small, fixed), both[..1]);
        assert_eq!(fused(OpKind::AllToAll, s, fixed), both[..1]);
        // The copy-engine AllGather: groups of 4 and 16 tile rows whole, 16 in 2, 4 and 8 chunks
        // along K where whole K blocks of 64 make exactly that many (k = 256: four blocks).
        let ce = |k: u32| -> Vec<u32> {
            fused(OpKind::AllGather, GemmShape::new(4096, 2048, k), fixed)
                .iter()
                .filter_map(|m| match m {
                    Method::FusedCe { k_chunks, .. } if *k_chunks > 1 => Some(*k_chunks),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(ce(8192), [2, 4, 8]);
        assert_eq!(ce(256), [2, 4]);
        // 10 blocks of 64 make 2 chunks of 5 and 4 of 3, not 8 (5 chunks of 2).
        assert_eq!(ce(640), [2, 4]);
        // The whole-tile epilogue's plans run the kernel with every fusion: no K chunks.
        let whole = GemmOptions {
            epilogue: crate::plan::EpilogueChoice::WholeTile,
            ..fixed
        };
        let chunked = fused(OpKind::AllGather, GemmShape::new(4096, 2048, 8192), whole)
            .iter()
            .filter(|m| matches!(m, Method::FusedCe { k_chunks, .. } if *k_chunks > 1))
            .count();
        assert_eq!(chunked, 0);
    }

    #[test]
    fn groupings_cover_the_waves() {
        let plan = GemmPlan::new(
            132,
            GemmShape::new(8192, 8192, 2048),
            GemmOptions {
                sm_margin: 32,
                ..GemmOptions::default()
            },
        )
        .unwrap();
        let g = groupings(&plan).unwrap();
        assert!(!g.is_empty());
        for w in &g {
            assert_eq!(w.iter().sum::<u32>(), plan.waves(), "{w:?}");
        }
        let small = GemmPlan::new(
            132,
            GemmShape::new(16, 8192, 4096),
            GemmOptions {
                sm_margin: 32,
                ..GemmOptions::default()
            },
        )
        .unwrap();
        assert_eq!(groupings(&small).unwrap(), vec![vec![1]]);
    }
}
