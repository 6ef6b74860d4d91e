//! Element types of the GEMM: inputs (A and B) are bf16 or fp16, the output bf16, fp16 or fp32;
//! accumulation is always fp32.

use cudarc::driver::sys::CUtensorMapDataType;
use cudarc::driver::DeviceRepr;

/// A GEMM element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bf16,
    F16,
    F32,
}

impl Dtype {
    pub fn bytes(self) -> usize {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// The name used in kernel names and messages.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
        }
    }

    pub(crate) fn tensor_map_type(self) -> CUtensorMapDataType {
        match self {
            Dtype::Bf16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            Dtype::F16 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            Dtype::F32 => CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type a GEMM buffer may hold.
pub trait GemmElement: DeviceRepr + Copy + Send + Sync + 'static {
    const DTYPE: Dtype;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl GemmElement for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
}

impl GemmElement for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
}

impl GemmElement for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
