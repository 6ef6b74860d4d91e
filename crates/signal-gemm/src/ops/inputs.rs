//! The random operands a first use times its candidates on, in the plan's input dtype, made only
//! when something must be measured.

use super::choice::random_device;
use crate::dtype::Dtype;
use crate::error::refuse;
use crate::error::GemmError;
use crate::plan::GemmOptions;
use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use std::sync::Arc;

/// Two device buffers of the GEMM's input dtype.
pub(crate) enum Operands {
    Bf16(CudaSlice<bf16>, CudaSlice<bf16>),
    F16(CudaSlice<f16>, CudaSlice<f16>),
}

impl Operands {
    /// `first` and `second` elements of random values in `options.input`.
    pub fn random(
        stream: &Arc<CudaStream>,
        options: &GemmOptions,
        seed: u64,
        first: usize,
        second: usize,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            Ok(match options.input {
                Dtype::Bf16 => Operands::Bf16(
                    random_device(stream, seed, first)?,
                    random_device(stream, seed ^ 1, second)?,
                ),
                Dtype::F16 => Operands::F16(
                    random_device(stream, seed, first)?,
                    random_device(stream, seed ^ 1, second)?,
                ),
                other => refuse!(
                    Options,
                    "GEMM inputs of {other} are not supported (bf16 or f16)"
                ),
            })
        })
    }
}

/// Runs `$body` with `$a`, `$b` bound to the operands' slices, whatever their dtype.
macro_rules! with_operands {
    ($ops:expr, |$a:ident, $b:ident| $body:expr) => {
        match $ops {
            $crate::ops::inputs::Operands::Bf16($a, $b) => $body,
            $crate::ops::inputs::Operands::F16($a, $b) => $body,
        }
    };
}
pub(crate) use with_operands;
