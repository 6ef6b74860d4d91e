//! A buffer an op owns (its result, or the input shard its peers read), seen through cudarc's
//! slice traits: pass it to NCCL, cuBLAS, copies or your own kernels. It is valid while the op
//! lives and, like a symmetric-memory buffer, holds the last launch's result until the next
//! launch (order your reads before that launch on the stream).

use cudarc::driver::{sys, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use std::marker::PhantomData;
use std::sync::Arc;

pub struct OpBuffer<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: &'a Arc<CudaStream>,
    _op: PhantomData<&'a T>,
}

impl<'a, T> OpBuffer<'a, T> {
    /// # Safety
    /// `ptr` must hold `len` elements of T on `stream`'s context for as long as `'a`.
    pub(crate) unsafe fn new(
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: &'a Arc<CudaStream>,
    ) -> Self {
        Self {
            ptr,
            len,
            stream,
            _op: PhantomData,
        }
    }

    /// The device address (for kernels that take raw pointers).
    pub fn device_address(&self) -> sys::CUdeviceptr {
        self.ptr
    }
}

impl<T> DeviceSlice<T> for OpBuffer<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

// weft's contexts run with cudarc's event tracking off: callers order their work by streams, so
// handing out the address needs no event.
impl<T> DevicePtr<T> for OpBuffer<'_, T> {
    fn device_ptr<'b>(&'b self, _stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for OpBuffer<'_, T> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        _stream: &'b CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}
