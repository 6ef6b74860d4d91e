//! Launch plumbing shared by the sync kernels: loading a kernel, small result structs in device
//! memory, and waiting for a stream in a way that turns a trapped kernel into its slot's report.

use crate::error::{DeviceFailure, KernelEnd, SyncError};
use crate::error_slot::ErrorSlot;

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError,
};
use std::marker::PhantomData;
use std::sync::Arc;
use weft_kernels::Cubin;

/// Loads `name` from `cubin` into `ctx`.
pub fn load(ctx: &Arc<CudaContext>, cubin: &Cubin, name: &str) -> Result<CudaFunction, SyncError> {
    let module = cubin
        .load(ctx)
        .map_err(SyncError::setup(format!("loading {}", cubin.source)))?;
    module.load_function(name).map_err(SyncError::setup(format!(
        "{} has no kernel {name}",
        cubin.source
    )))
}

/// The launch attribute (for `cuLaunchKernelEx`) of programmatic dependent launch: the kernel may
/// be scheduled before the previous kernel on its stream ended, so it must execute
/// `griddepcontrol.wait` before touching anything that kernel wrote, unless (as after
/// `KernelBarrier::wait`) the previous kernel writes nothing it reads.
pub fn programmatic_serialization_attribute() -> sys::CUlaunchAttribute {
    // SAFETY: an all-zero attribute is valid plain data; id and value are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    attr
}

/// Launches `func` by `cuLaunchKernelEx` with `cfg` (grid, block, shared memory, stream,
/// attributes) and the kernel's one by-value parameter block `params`, binding `ctx` to this
/// thread first.
///
/// # Safety
/// `P` is exactly the kernel's parameter type; `cfg.hStream` is a stream of `ctx`, and `cfg.attrs`
/// points to `cfg.numAttrs` valid attributes; everything `params` points to stays valid until the
/// kernel has run.
pub unsafe fn launch_ex<P>(
    ctx: &CudaContext,
    func: &CudaFunction,
    cfg: &sys::CUlaunchConfig,
    params: &P,
) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    let mut args = [params as *const P as *mut std::ffi::c_void];
    // SAFETY: the caller's contract; `args` outlives the call, which copies the parameters.
    unsafe {
        sys::cuLaunchKernelEx(
            cfg,
            func.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}

/// A zero-initialised plain-old-data struct in device memory that a kernel fills.
pub struct DeviceStruct<T: Copy> {
    buf: CudaSlice<u8>,
    _t: PhantomData<T>,
}

impl<T: Copy> DeviceStruct<T> {
    pub fn zeroed(stream: &Arc<CudaStream>) -> Result<Self, SyncError> {
        Ok(Self {
            buf: stream
                .alloc_zeros::<u8>(std::mem::size_of::<T>())
                .map_err(SyncError::setup("allocating a kernel's result struct"))?,
            _t: PhantomData,
        })
    }

    /// The device address to hand the kernel.
    pub fn addr(&self, stream: &Arc<CudaStream>) -> u64 {
        self.buf.device_ptr(stream).0
    }

    /// Copies the struct back (synchronous on `stream`).
    pub fn read(&self, stream: &Arc<CudaStream>) -> Result<T, SyncError> {
        let bytes = stream
            .clone_dtoh(&self.buf)
            .map_err(SyncError::setup("copying a kernel's result struct back"))?;
        if bytes.len() != std::mem::size_of::<T>() {
            return Err(SyncError::setup("copying a kernel's result struct back")(
                format!(
                    "{} bytes came back for a struct of {}",
                    bytes.len(),
                    std::mem::size_of::<T>()
                ),
            ));
        }
        // SAFETY: T is a bindgen plain-old-data struct (every bit pattern valid) of exactly these bytes.
        Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
    }
}

/// Waits for `stream`. A kernel that stopped is reported by what its error slots recorded
/// (kind, rank, primitive, coordinate, expected, observed, bound), with the driver's error
/// attached ([`SyncError`]).
pub fn sync_checked(stream: &Arc<CudaStream>, slots: &[&ErrorSlot]) -> Result<(), SyncError> {
    let synced = stream.synchronize();
    let failures: Vec<DeviceFailure> = slots.iter().filter_map(|s| s.failure()).collect();
    match (synced, failures.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => Err(SyncError::Device {
            failures,
            end: KernelEnd::Completed,
        }),
        (Err(e), true) => Err(SyncError::Driver(e)),
        (Err(e), false) => Err(SyncError::Device {
            failures,
            end: KernelEnd::Stopped(e),
        }),
    }
}
