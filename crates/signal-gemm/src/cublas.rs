//! The cuBLAS baseline (cublasGemmEx through cudarc, fp32 compute): the same row-major operation
//! as [`crate::Gemm`], for correctness checks and timing side by side.

use crate::dtype::{Dtype, GemmElement};
use crate::error::require;
use crate::error::GemmError;
use crate::plan::{BLayout, GemmOptions, GemmShape};
use anyhow::{ensure, Context};
use cudarc::cublas::{result, sys, CudaBlas};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use std::sync::Arc;

pub struct CublasGemm {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    shape: GemmShape,
    options: GemmOptions,
}

fn data_type(d: Dtype) -> sys::cudaDataType {
    match d {
        Dtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        Dtype::F16 => sys::cudaDataType::CUDA_R_16F,
        Dtype::F32 => sys::cudaDataType::CUDA_R_32F,
    }
}

impl CublasGemm {
    /// A cuBLAS handle on `stream` for `shape` / `options` (sm_margin, tile and comm_ctas are
    /// weft's and ignored here).
    pub fn new(
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            // SAFETY: only probes for the library.
            ensure!(
                unsafe { sys::is_culib_present() },
                "cuBLAS (libcublas.so.13) not found: add its directory to LD_LIBRARY_PATH (e.g. the CUDA toolkit's lib64)"
            );
            let blas = CudaBlas::new(stream.clone()).context("creating a cuBLAS handle")?;
            Ok(Self {
                blas,
                stream: stream.clone(),
                shape,
                options,
            })
        })
    }

    /// D = alpha · A · B + beta · D, row-major, as weft's GEMM defines it.
    /// Takes slices or views (e.g. a band of rows of larger A and D).
    pub fn launch<TI: GemmElement, TO: GemmElement>(
        &self,
        a: &impl DevicePtr<TI>,
        b: &impl DevicePtr<TI>,
        d: &mut impl DevicePtrMut<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let GemmShape { m, n, k } = self.shape;
            let o = &self.options;
            require!(
                TI::DTYPE == o.input && TO::DTYPE == o.output,
                Options,
                "cuBLAS GEMM planned for {}→{}, given {}→{}",
                o.input,
                o.output,
                TI::DTYPE,
                TO::DTYPE
            );
            let (mu, nu, ku) = (m as usize, n as usize, k as usize);
            require!(
                a.len() >= mu * ku && b.len() >= ku * nu && d.len() >= mu * nu,
                Length,
                "cuBLAS GEMM {}: a buffer is too small",
                self.shape
            );
            // Row-major D (m x n) is column-major Dᵀ (n x m) = Bᵀ Aᵀ: cuBLAS computes with B first.
            let (op_b, ld_b) = match o.b_layout {
                BLayout::KxN => (sys::cublasOperation_t::CUBLAS_OP_N, n),
                BLayout::NxK => (sys::cublasOperation_t::CUBLAS_OP_T, k),
            };
            let (a_ptr, _ra) = a.device_ptr(&self.stream);
            let (b_ptr, _rb) = b.device_ptr(&self.stream);
            let (d_ptr, _rd) = d.device_ptr_mut(&self.stream);
            let (alpha, beta) = (o.alpha, o.beta);
            // SAFETY: pointers to buffers of the checked sizes on the handle's stream; alpha and beta
            // are f32 as CUBLAS_COMPUTE_32F expects.
            unsafe {
                result::gemm_ex(
                    *self.blas.handle(),
                    op_b,
                    sys::cublasOperation_t::CUBLAS_OP_N,
                    n as i32,
                    m as i32,
                    k as i32,
                    &alpha as *const f32 as *const _,
                    b_ptr as *const _,
                    data_type(o.input),
                    ld_b as i32,
                    a_ptr as *const _,
                    data_type(o.input),
                    k as i32,
                    &beta as *const f32 as *const _,
                    d_ptr as *mut _,
                    data_type(o.output),
                    n as i32,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .with_context(|| format!("cublasGemmEx {} {}→{}", self.shape, o.input, o.output))?;
            Ok(())
        })
    }
}
