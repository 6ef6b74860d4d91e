//! weft's GEMM as the overlap-order compute kernel: a bf16 GEMM on all SMs (or SMs − sm_margin),
//! persistent, with a start/end timeline in the bench's stamps. One GEMM is planned per margin a
//! child's modes use (on the same inputs and output). Each one's output is checked in full every
//! time: against cuBLAS (fp32 output, the bf16 tolerance) on the host the first time, then bit for
//! bit on the GPU against a device copy of that verified output (the GEMM is deterministic: a
//! tile's arithmetic does not depend on the CTA that runs it).

use crate::gemm_data::{download, uniform, upload};
use crate::word_compare::WordCompare;
use anyhow::Context;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::bf16;
use std::sync::Arc;
use weft_signal_gemm::reference::{check_all, Tolerance};
use weft_signal_gemm::{CublasGemm, Dtype, Gemm, GemmOptions, GemmShape, LaunchExtras, Scheduling};
use weft_testkit::synthetic::{memset_u32, Stamps};

/// About 3 ms on an H200 alone; 128 x 256 tiles of K = 4096 (about 50 us each), 64 x 64 of them,
/// so a CTA that starts late loses little to the tile granularity.
pub const SHAPE: GemmShape = GemmShape::new(16384, 16384, 4096);

pub struct GemmLoad {
    scheduling: Scheduling,
    /// One per sm_margin used so far: the GEMM and a device copy of its verified output.
    gemms: Vec<(u32, Gemm, Option<CudaSlice<bf16>>)>,
    /// Index in `gemms` of the one the current mode launches.
    current: usize,
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    d: CudaSlice<bf16>,
    /// cuBLAS's D (fp32): each GEMM's first output is checked against it.
    want: Vec<f64>,
    compare: WordCompare,
}

impl GemmLoad {
    pub fn new(
        stream: &Arc<CudaStream>,
        scheduling: Scheduling,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let options = GemmOptions {
            scheduling,
            ..GemmOptions::default()
        };
        let (m, n, k) = (SHAPE.m as usize, SHAPE.n as usize, SHAPE.k as usize);
        let a = upload(stream, &uniform::<bf16>(seed, m * k))?;
        let b = upload(stream, &uniform::<bf16>(seed ^ 0xB, n * k))?;
        let mut want = stream.alloc_zeros::<f32>(m * n)?;
        CublasGemm::new(
            stream,
            SHAPE,
            GemmOptions {
                output: Dtype::F32,
                ..options
            },
        )?
        .launch(&a, &b, &mut want)?;
        let want: Vec<f64> = download(stream, &want)?.iter().map(|&x| x as f64).collect();
        let mut load = Self {
            scheduling,
            gemms: Vec::new(),
            current: 0,
            d: stream.alloc_zeros::<bf16>(m * n)?,
            a,
            b,
            want,
            compare: WordCompare::load(stream)?,
        };
        load.select(stream, 0)?;
        Ok(load)
    }

    /// The GEMM planned with `sm_margin` becomes the one launched (planned on first use).
    pub fn select(&mut self, stream: &Arc<CudaStream>, sm_margin: u32) -> anyhow::Result<()> {
        if let Some(i) = self.gemms.iter().position(|(m, _, _)| *m == sm_margin) {
            self.current = i;
            return Ok(());
        }
        let options = GemmOptions {
            sm_margin,
            scheduling: self.scheduling,
            ..GemmOptions::default()
        };
        let gemm = Gemm::new(stream.context(), SHAPE, options)?;
        self.gemms.push((sm_margin, gemm, None));
        self.current = self.gemms.len() - 1;
        Ok(())
    }

    fn gemm(&self) -> &Gemm {
        &self.gemms[self.current].1
    }

    pub fn describe(&self) -> String {
        self.gemm().plan().describe()
    }

    /// In `stream` order: D to NaN (0xFFFF is a bf16 NaN).
    pub fn poison(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        memset_u32(
            stream,
            self.d.device_ptr(stream).0,
            0xFFFF_FFFF,
            self.d.len() / 2,
        )
    }

    /// The GEMM on `stream`, stamping compute start and end; `early_release` only directly after
    /// a KernelBarrier wait.
    pub fn launch(
        &mut self,
        stream: &Arc<CudaStream>,
        stamps: &mut Stamps,
        early_release: bool,
    ) -> anyhow::Result<()> {
        let extras = LaunchExtras {
            timeline: Some(stamps.compute_timeline()),
            early_release,
            ..Default::default()
        };
        self.gemms[self.current]
            .1
            .launch_with(stream, &self.a, &self.b, &mut self.d, extras)
            .map_err(anyhow::Error::from)
    }

    /// After a synchronisation: every element of D checked. Returns the elements checked.
    pub fn verify(&mut self, stream: &Arc<CudaStream>, what: &str) -> anyhow::Result<u64> {
        self.gemm().check().with_context(|| what.to_string())?;
        if self.gemms[self.current].2.is_none() {
            let got = download(stream, &self.d)?;
            check_all(
                &format!("{what}: weft GEMM vs cuBLAS, {}", self.describe()),
                SHAPE,
                &got,
                &self.want,
                Tolerance::for_output(Dtype::Bf16),
            )?;
            self.gemms[self.current].2 = Some(stream.clone_dtod(&self.d)?);
        } else {
            let verified = self.gemms[self.current]
                .2
                .as_ref()
                .context("GEMM output verified before")?;
            if let Some(diff) = self.compare.differ(stream, &self.d, verified)? {
                // Two bf16 per word.
                let e = 2 * diff.first_word as usize;
                anyhow::bail!(
                    "{what}: GEMM output differs from the verified run in {} of {} words (2 elements each), first at elements ({}, {}..{})",
                    diff.words,
                    self.d.len() / 2,
                    e / SHAPE.n as usize,
                    e % SHAPE.n as usize,
                    e % SHAPE.n as usize + 1
                );
            }
        }
        Ok(self.d.len() as u64)
    }
}
