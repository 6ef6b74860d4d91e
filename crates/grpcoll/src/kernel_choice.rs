//! Which kernel of kernels/grpcoll/grpcoll.cu a plan launches, and which dtype combinations exist.
//!
//! - Push (`weft_grpcoll_cast_v{16,8,4,2,1}`): GroupCast whose communication dtype is the data
//!   dtype; rows are bytes, so any element type; the widest vector dividing every tensor's row.
//! - Pull (`weft_grpcoll_reduce_{comm}_{data}_v{N,1}`): GroupReduce, and GroupCast through a
//!   narrower communication dtype. `vN` loads 16 bytes of the comm dtype at a time and needs every
//!   tensor's element group (the row, or the elements sharing one lse value) to be a multiple of
//!   16 / size(comm); otherwise `v1`.

use crate::error::GrpcollError;
use anyhow::bail;
use weft_pgl::DType;

/// (communication, data) pairs the pull kernels are built for: each data dtype with itself, and
/// a narrower communication dtype for f32 and f64 data (e.g. f32 data sent as bf16).
pub(crate) const PULL_PAIRS: [(DType, DType); 9] = [
    (DType::Bf16, DType::Bf16),
    (DType::F16, DType::F16),
    (DType::F32, DType::F32),
    (DType::F64, DType::F64),
    (DType::Bf16, DType::F32),
    (DType::F16, DType::F32),
    (DType::Bf16, DType::F64),
    (DType::F16, DType::F64),
    (DType::F32, DType::F64),
];

/// The largest of 16, 8, 4, 2, 1 dividing every one of `bytes`.
pub(crate) fn vector_bytes(bytes: &[usize]) -> usize {
    [16, 8, 4, 2, 1]
        .into_iter()
        .find(|v| bytes.iter().all(|b| b % v == 0))
        .unwrap()
}

pub(crate) fn push_kernel_name(row_bytes: &[usize]) -> String {
    format!("weft_grpcoll_cast_v{}", vector_bytes(row_bytes))
}

/// The pull kernel for `comm` over `data`, given each tensor's element group width; an error
/// naming the pair when no kernel exists for it.
pub(crate) fn pull_kernel_name(
    what: &str,
    comm: DType,
    data: DType,
    groups: &[usize],
) -> anyhow::Result<String> {
    if !PULL_PAIRS.contains(&(comm, data)) {
        if comm == data {
            bail!(GrpcollError::Options(format!(
                "{what}: data dtype {} is not supported (supported: bf16, f16, f32, f64)",
                data.name()
            )));
        }
        bail!(GrpcollError::Options(format!(
            "{what}: communication dtype {} with data dtype {} is not supported (the communication \
             dtype is the data dtype, or bf16 / f16 for f32 data, or bf16 / f16 / f32 for f64 data)",
            comm.name(),
            data.name()
        )));
    }
    let per16 = 16 / comm.size();
    let v = if groups.iter().all(|g| g % per16 == 0) {
        "vN"
    } else {
        "v1"
    };
    Ok(format!(
        "weft_grpcoll_reduce_{}_{}_{v}",
        comm.name(),
        data.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_kernels::cubins;

    #[test]
    fn kernel_choice_follows_row_widths() {
        assert_eq!(push_kernel_name(&[8192]), "weft_grpcoll_cast_v16");
        assert_eq!(push_kernel_name(&[8192, 12]), "weft_grpcoll_cast_v4");
        assert_eq!(push_kernel_name(&[6]), "weft_grpcoll_cast_v2");
        assert_eq!(push_kernel_name(&[3]), "weft_grpcoll_cast_v1");
        let name = |c, d, g: &[usize]| pull_kernel_name("x", c, d, g).unwrap();
        assert_eq!(
            name(DType::Bf16, DType::Bf16, &[128]),
            "weft_grpcoll_reduce_bf16_bf16_vN"
        );
        assert_eq!(
            name(DType::Bf16, DType::Bf16, &[128, 12]),
            "weft_grpcoll_reduce_bf16_bf16_v1"
        );
        assert_eq!(
            name(DType::F32, DType::F32, &[12]),
            "weft_grpcoll_reduce_f32_f32_vN"
        );
        assert_eq!(
            name(DType::Bf16, DType::F32, &[12]),
            "weft_grpcoll_reduce_bf16_f32_v1"
        );
        assert_eq!(
            name(DType::F64, DType::F64, &[6]),
            "weft_grpcoll_reduce_f64_f64_vN"
        );
    }

    #[test]
    fn unsupported_pairs_are_named() {
        let e = pull_kernel_name("group_reduce", DType::U32, DType::U32, &[4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("data dtype u32 is not supported (supported: bf16, f16, f32, f64)"),
            "{e}"
        );
        let e = pull_kernel_name("group_cast", DType::F32, DType::Bf16, &[4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("communication dtype f32 with data dtype bf16 is not supported"),
            "{e}"
        );
    }

    #[test]
    fn every_kernel_the_plans_name_exists() {
        let img = cubins::GRPCOLL_GRPCOLL.image;
        let has = |name: &str| {
            img.windows(name.len() + 1)
                .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
        };
        for b in [16, 8, 4, 2, 1] {
            assert!(has(&push_kernel_name(&[b])), "{b}");
        }
        assert!(cubins::GRPCOLL_LAYOUT
            .image
            .windows(20)
            .any(|w| w == b"weft_grpcoll_layout\0"));
        for (c, d) in PULL_PAIRS {
            for g in [1, 16] {
                let name = pull_kernel_name("x", c, d, &[g]).unwrap();
                assert!(has(&name), "{name}");
            }
        }
    }
}
