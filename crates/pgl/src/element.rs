//! Element types a PGL may hold, with a dtype code that ranks compare at allocation.

use cudarc::driver::DeviceRepr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum DType {
    U8 = 1,
    I32,
    U32,
    U64,
    F16,
    Bf16,
    F32,
    F64,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::U64 | DType::F64 => 8,
        }
    }

    pub fn from_code(code: u8) -> Option<DType> {
        [
            DType::U8,
            DType::I32,
            DType::U32,
            DType::U64,
            DType::F16,
            DType::Bf16,
            DType::F32,
            DType::F64,
        ]
        .into_iter()
        .find(|d| *d as u8 == code)
    }
}

/// A type a PGL can hold.
pub trait PglElement: DeviceRepr + Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl PglElement for $t {
            const DTYPE: DType = $d;
        }
    };
}
element!(u8, DType::U8);
element!(i32, DType::I32);
element!(u32, DType::U32);
element!(u64, DType::U64);
element!(half::f16, DType::F16);
element!(half::bf16, DType::Bf16);
element!(f32, DType::F32);
element!(f64, DType::F64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_sizes_match_rust() {
        for d in [
            DType::U8,
            DType::I32,
            DType::U32,
            DType::U64,
            DType::F16,
            DType::Bf16,
            DType::F32,
            DType::F64,
        ] {
            assert_eq!(DType::from_code(d as u8), Some(d));
        }
        assert_eq!(DType::from_code(0), None);
        assert_eq!(
            <f64 as PglElement>::DTYPE.size(),
            std::mem::size_of::<f64>()
        );
        assert_eq!(
            <half::bf16 as PglElement>::DTYPE.size(),
            std::mem::size_of::<half::bf16>()
        );
    }
}
