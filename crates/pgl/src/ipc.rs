//! The CUDA IPC backend: `cuMemAlloc` memory exported with `cuIpcGetMemHandle` and opened in
//! peer processes with `cuIpcOpenMemHandle`. The caller's context must be current.

use crate::driver::check;
use cudarc::driver::sys::{self, CUdeviceptr};

/// What a peer needs to open a rank's buffer: the IPC handle of the allocation containing it and
/// the buffer's offset inside that allocation (a caller-owned buffer need not start it).
pub const EXPORT_BYTES: usize = 64 + 8;

pub fn alloc(bytes: usize) -> anyhow::Result<CUdeviceptr> {
    let mut ptr = 0;
    // SAFETY: out-parameter.
    check(|| format!("cuMemAlloc({bytes} B)"), unsafe {
        sys::cuMemAlloc_v2(&mut ptr, bytes)
    })?;
    Ok(ptr)
}

pub fn free(ptr: CUdeviceptr) -> anyhow::Result<()> {
    // SAFETY: ptr came from alloc() and is no longer used by anyone (the caller's ordering).
    check(|| "cuMemFree".into(), unsafe { sys::cuMemFree_v2(ptr) })
}

pub fn export(ptr: CUdeviceptr) -> anyhow::Result<[u8; EXPORT_BYTES]> {
    let (mut base, mut size) = (0, 0);
    // SAFETY: out-parameters; ptr is a device pointer of the current context.
    check(|| "cuMemGetAddressRange".into(), unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr)
    })?;
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: out-parameter; base is the start of a cuMemAlloc allocation.
    check(|| "cuIpcGetMemHandle".into(), unsafe {
        sys::cuIpcGetMemHandle(&mut handle, base)
    })?;
    let mut out = [0u8; EXPORT_BYTES];
    for (o, h) in out.iter_mut().zip(handle.reserved) {
        *o = h as u8;
    }
    out[64..].copy_from_slice(&(ptr - base).to_le_bytes());
    Ok(out)
}

/// Opens a peer's exported buffer: (base of the opened allocation, pointer to the buffer).
pub fn open(export: &[u8]) -> anyhow::Result<(CUdeviceptr, CUdeviceptr)> {
    anyhow::ensure!(
        export.len() == EXPORT_BYTES,
        "IPC export has {} bytes, expected {EXPORT_BYTES}",
        export.len()
    );
    let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
    for (h, e) in handle.reserved.iter_mut().zip(&export[..64]) {
        *h = *e as std::ffi::c_char;
    }
    let offset = u64::from_le_bytes(export[64..].try_into().unwrap());
    let mut base = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
    // SAFETY: out-parameter; the handle came from a live peer allocation.
    check(|| "cuIpcOpenMemHandle".into(), unsafe {
        sys::cuIpcOpenMemHandle_v2(&mut base, handle, flags)
    })?;
    Ok((base, base + offset))
}

pub fn close(base: CUdeviceptr) -> anyhow::Result<()> {
    // SAFETY: base came from open() and no kernel of this process uses it any more.
    check(|| "cuIpcCloseMemHandle".into(), unsafe {
        sys::cuIpcCloseMemHandle(base)
    })
}
