//! TMA descriptors (CUtensorMap) for the GEMM's operands, encoded on the host with
//! cuTensorMapEncodeTiled and passed to the kernel inside its parameters.

use crate::dtype::Dtype;
use crate::error::require;
use anyhow::Context;
use cudarc::driver::sys;
use weft_kernels::abi::weft_tensor_map;

/// A 2-D row-major tensor of `rows` × `cols` elements of `dtype` at `ptr`, loaded or stored in
/// boxes of `box_rows` × `box_cols` with the 128-byte swizzle (box_cols · elem ≤ 128 bytes).
pub(crate) fn encode_2d(
    what: &str,
    ptr: u64,
    dtype: Dtype,
    rows: u64,
    cols: u64,
    box_rows: u32,
    box_cols: u32,
) -> anyhow::Result<weft_tensor_map> {
    let elem = dtype.bytes() as u64;
    require!(
        (cols * elem).is_multiple_of(16),
        Shape,
        "{what}: row pitch {} bytes is not a multiple of 16",
        cols * elem
    );
    require!(
        box_cols as u64 * elem <= 128,
        Options,
        "{what}: box row of {} bytes exceeds the 128-byte swizzle",
        box_cols as u64 * elem
    );
    encode(what, ptr, dtype, &[cols, rows], &[box_cols, box_rows])
}

/// A dense 3-D tensor of `slots` matrices of `rows` × `cols` elements (row-major, one after the
/// other) at `ptr`, stored in boxes of `box_rows` × `box_cols` × 1 with the 128-byte swizzle.
pub(crate) fn encode_3d(
    what: &str,
    ptr: u64,
    dtype: Dtype,
    slots: u64,
    rows: u64,
    cols: u64,
    box_rows: u32,
    box_cols: u32,
) -> anyhow::Result<weft_tensor_map> {
    let elem = dtype.bytes() as u64;
    require!(
        (cols * elem).is_multiple_of(16),
        Shape,
        "{what}: row pitch {} bytes is not a multiple of 16",
        cols * elem
    );
    require!(
        box_cols as u64 * elem <= 128,
        Options,
        "{what}: box row of {} bytes exceeds the 128-byte swizzle",
        box_cols as u64 * elem
    );
    encode(
        what,
        ptr,
        dtype,
        &[cols, rows, slots],
        &[box_cols, box_rows, 1],
    )
}

/// The wide view of D for the whole-tile epilogue's stores (kernels/include/weft/abi/gemm.h,
/// "Wide stores"): `slots` row-major matrices of `rows` × `cols` elements (one after the other)
/// as (128 bytes of columns, row, 128-byte column chunk, slot), stored in boxes of 128 bytes ×
/// `box_rows` × `box_chunks` × 1. The chunk dimension's stride (128 bytes) is smaller than the
/// row's: a box takes a run of rows across `box_chunks` chunks, chunk-major in shared memory.
pub(crate) fn encode_wide(
    what: &str,
    ptr: u64,
    dtype: Dtype,
    slots: u64,
    rows: u64,
    cols: u64,
    box_rows: u32,
    box_chunks: u32,
) -> anyhow::Result<weft_tensor_map> {
    let elem = dtype.bytes() as u64;
    let chunk_cols = 128 / elem;
    require!(
        cols.is_multiple_of(chunk_cols),
        Options,
        "{what}: {cols} columns are not whole 128-byte chunks (the wide view needs them)"
    );
    let row_bytes = cols * elem;
    let dims = [chunk_cols, rows, cols / chunk_cols, slots];
    let strides = [row_bytes, 128, rows * row_bytes];
    encode_strided(
        what,
        ptr,
        dtype,
        &dims,
        &strides,
        &[chunk_cols as u32, box_rows, box_chunks, 1],
    )
}

/// cuTensorMapEncodeTiled of a dense row-major tensor, innermost dimension first.
fn encode(
    what: &str,
    ptr: u64,
    dtype: Dtype,
    dims: &[u64],
    boxes: &[u32],
) -> anyhow::Result<weft_tensor_map> {
    let elem = dtype.bytes() as u64;
    let rank = dims.len();
    // Byte strides of dimensions 1.. (dimension 0 is contiguous).
    let strides: Vec<u64> = (1..rank)
        .map(|d| dims[..d].iter().product::<u64>() * elem)
        .collect();
    encode_strided(what, ptr, dtype, dims, &strides, boxes)
}

/// cuTensorMapEncodeTiled with the byte strides of dimensions 1.. given (dimension 0 is
/// contiguous), 128-byte swizzle.
fn encode_strided(
    what: &str,
    ptr: u64,
    dtype: Dtype,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
) -> anyhow::Result<weft_tensor_map> {
    require!(
        ptr.is_multiple_of(16),
        Options,
        "{what}: device address {ptr:#x} is not 16-byte aligned (TMA needs it)"
    );
    let rank = dims.len();
    assert!(
        strides.len() + 1 == rank && boxes.len() == rank,
        "{what}: {rank} dimensions need {} strides and {rank} box sizes",
        rank - 1
    );
    let elem_strides = vec![1u32; rank];
    let mut map = weft_tensor_map::default();
    // SAFETY: `map` is 128 bytes, 64-byte aligned (weft_tensor_map); the arrays have rank and
    // rank − 1 entries as the driver reads them.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map as *mut weft_tensor_map as *mut sys::CUtensorMap,
            dtype.tensor_map_type(),
            rank as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .with_context(|| format!("cuTensorMapEncodeTiled for {what} (dims {dims:?} of {dtype}, innermost first; byte strides {strides:?}; box {boxes:?})"))?;
    Ok(map)
}
