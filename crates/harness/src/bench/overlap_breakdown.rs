//! The overlap benches' time breakdown per method: the GEMM the method runs, timed alone on the
//! SMs the method leaves it (cuBLAS for seq-cublas and seq-collectives, and the decomposition's
//! bands back to back;
//! weft's GEMM at the method's SM margin otherwise: the signal path's margin, fused-inter's
//! communicator CTAs, DistFuse's workers, none for seq-weft, fused-intra and fused-ce), and the
//! rest of the method's time, exposed: communication not hidden behind the GEMM, interference of
//! the communication with the GEMM, launch and join gaps, the signal path's restore. So a
//! method's time = T_gemm(cuBLAS) × (GEMM alone ÷ T_gemm) + exposed, and each ratio of a row
//! splits into the GEMM it runs and what overlapping it failed to hide.

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use weft_signal_gemm::ops::{Method, OpKind};
use weft_signal_gemm::{CublasGemm, Gemm, GemmOptions, GemmShape, TileChoice};

/// The GEMM a method runs, as timed alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmAlone {
    /// cuBLAS over the whole shape, in `bands` row bands one after the other.
    Cublas { bands: u32 },
    /// weft's GEMM leaving `sm_margin` SMs idle, with the method's tile width where it fixes one.
    Weft { sm_margin: u32, tile: TileChoice },
}

impl GemmAlone {
    /// The GEMM of `method` for `op` on `world` ranks.
    pub fn of(op: OpKind, method: &Method, world: u32) -> Self {
        match method {
            Method::SeqCublas | Method::SeqCollectives => GemmAlone::Cublas { bands: 1 },
            // The AllGather's decomposition computes one band per rank's shard.
            Method::Decomposition { chunks } => GemmAlone::Cublas {
                bands: if op == OpKind::AllGather {
                    world
                } else {
                    *chunks
                },
            },
            Method::SeqWeft => GemmAlone::weft(0),
            Method::FusedIntra { .. } | Method::FusedCe { .. } => GemmAlone::Weft {
                sm_margin: 0,
                // A width the op's plan refuses: the breakdown keeps the plan's own.
                tile: method
                    .tile_choice(TileChoice::Auto)
                    .unwrap_or(TileChoice::Auto),
            },
            Method::Signal { sm_margin, .. } => GemmAlone::weft(*sm_margin),
            Method::SignalCe { .. } => {
                GemmAlone::weft(weft_signal_gemm::overlap::COPY_ENGINE_SM_MARGIN)
            }
            Method::FusedInter { ctas } => GemmAlone::weft(*ctas),
            Method::DistFuse { workers } => GemmAlone::weft(*workers),
        }
    }

    fn weft(sm_margin: u32) -> Self {
        GemmAlone::Weft {
            sm_margin,
            tile: TileChoice::Auto,
        }
    }

    /// This GEMM of `shape` planned on `stream` (timed by the row with its methods:
    /// bench/overlap_lone.rs).
    pub fn prepare(
        self,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
    ) -> anyhow::Result<GemmLauncher> {
        Ok(match self {
            GemmAlone::Cublas { bands } => {
                anyhow::ensure!(
                    bands >= 1 && shape.m.is_multiple_of(bands),
                    "GEMM {shape}: M does not split into {bands} bands"
                );
                let rows = (shape.m / bands) as usize;
                let band = CublasGemm::new(
                    stream,
                    GemmShape::new(rows as u32, shape.n, shape.k),
                    GemmOptions::default(),
                )?;
                GemmLauncher::Cublas {
                    band,
                    bands: bands as usize,
                    rows,
                    n: shape.n as usize,
                    k: shape.k as usize,
                }
            }
            GemmAlone::Weft { sm_margin, tile } => GemmLauncher::Weft(Gemm::new(
                stream.context(),
                shape,
                GemmOptions {
                    sm_margin,
                    tile,
                    ..GemmOptions::default()
                },
            )?),
        })
    }
}

/// A planned [`GemmAlone`].
pub enum GemmLauncher {
    /// cuBLAS over `bands` bands of `rows` rows, one after the other.
    Cublas {
        band: CublasGemm,
        bands: usize,
        rows: usize,
        n: usize,
        k: usize,
    },
    Weft(Gemm),
}

impl GemmLauncher {
    /// D (m × n) = A (m × k) · B on `stream` (cuBLAS: on the stream it was planned on, which
    /// the bench makes the same).
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        a: &CudaSlice<bf16>,
        b: &CudaSlice<bf16>,
        d: &mut CudaSlice<bf16>,
    ) -> anyhow::Result<()> {
        match self {
            GemmLauncher::Cublas {
                band,
                bands,
                rows,
                n,
                k,
            } => {
                for c in 0..*bands {
                    band.launch(
                        &a.slice(c * rows * k..(c + 1) * rows * k),
                        b,
                        &mut d.slice_mut(c * rows * n..(c + 1) * rows * n),
                    )?;
                }
                Ok(())
            }
            GemmLauncher::Weft(gemm) => gemm.launch(stream, a, b, d).map_err(anyhow::Error::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_names_the_gemm_it_runs() {
        let ag = OpKind::AllGather;
        let ar = OpKind::AllReduce;
        assert_eq!(
            GemmAlone::of(ar, &Method::SeqCublas, 2),
            GemmAlone::Cublas { bands: 1 }
        );
        assert_eq!(
            GemmAlone::of(ar, &Method::Decomposition { chunks: 4 }, 2),
            GemmAlone::Cublas { bands: 4 }
        );
        assert_eq!(
            GemmAlone::of(ag, &Method::Decomposition { chunks: 2 }, 4),
            GemmAlone::Cublas { bands: 4 }
        );
        assert_eq!(
            GemmAlone::of(
                ag,
                &Method::FusedCe {
                    tile_rows: 4,
                    tile_n: None,
                    k_chunks: 1
                },
                2
            ),
            GemmAlone::weft(0)
        );
        assert_eq!(
            GemmAlone::of(
                ag,
                &Method::FusedCe {
                    tile_rows: 4,
                    tile_n: Some(128),
                    k_chunks: 8
                },
                2
            ),
            GemmAlone::Weft {
                sm_margin: 0,
                tile: TileChoice::N128
            }
        );
        assert_eq!(
            GemmAlone::of(
                ar,
                &Method::Signal {
                    sm_margin: 32,
                    waves: vec![1, 3]
                },
                2
            ),
            GemmAlone::weft(32)
        );
        assert_eq!(
            GemmAlone::of(ar, &Method::FusedInter { ctas: 16 }, 2),
            GemmAlone::weft(16)
        );
        assert_eq!(
            GemmAlone::of(ar, &Method::DistFuse { workers: 8 }, 2),
            GemmAlone::weft(8)
        );
    }
}
