//! Checked calls into the CUDA driver's `sys` layer: every failure becomes an error naming the
//! call and the driver's own error name and text.

use cudarc::driver::sys::{self, CUresult};
use std::ffi::CStr;

/// The driver's name and description of `r`, e.g. "CUDA_ERROR_OUT_OF_MEMORY: out of memory".
pub fn describe(r: CUresult) -> String {
    let mut name = std::ptr::null();
    let mut text = std::ptr::null();
    // SAFETY: out-parameters; the driver returns static strings (or leaves them null).
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        // SAFETY: non-null pointers from the driver are NUL-terminated static strings.
        if p.is_null() {
            format!("{r:?}")
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    format!("{}: {}", s(name), s(text))
}

/// Ok for CUDA_SUCCESS, else an error "`call` failed: NAME: text".
pub fn check(call: impl FnOnce() -> String, r: CUresult) -> anyhow::Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(anyhow::anyhow!("{} failed: {}", call(), describe(r)))
    }
}
