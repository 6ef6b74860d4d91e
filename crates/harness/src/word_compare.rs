//! Bitwise comparison of two device buffers on their GPU (kernels/harness/word_compare.cu): a
//! full check of a large output against a verified copy without downloading either.

use anyhow::{ensure, Context};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;
use weft_kernels::abi::weft_word_compare_params;
use weft_kernels::cubins;

pub struct WordCompare {
    func: CudaFunction,
    /// [differing words, first differing word]
    result: CudaSlice<u64>,
}

/// Where two buffers differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Difference {
    pub words: u64,
    pub first_word: u64,
}

impl WordCompare {
    pub fn load(stream: &Arc<CudaStream>) -> anyhow::Result<Self> {
        let module = cubins::HARNESS_WORD_COMPARE
            .load(stream.context())
            .with_context(|| format!("loading {}", cubins::HARNESS_WORD_COMPARE.source))?;
        Ok(Self {
            func: module.load_function("weft_word_compare")?,
            result: stream.alloc_zeros::<u64>(2)?,
        })
    }

    /// Compares `a` and `b` (the same length, a whole number of 32-bit words) on `stream`;
    /// synchronises it. None when they are equal bit for bit.
    pub fn differ<T: cudarc::driver::DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
    ) -> anyhow::Result<Option<Difference>> {
        self.reset(stream)?;
        self.enqueue(stream, a, b)?;
        self.take(stream)
    }

    /// Clears the accumulated result (in `stream` order).
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        stream.memcpy_htod(&[0u64, u64::MAX], &mut self.result)?;
        Ok(())
    }

    /// Enqueues a comparison of `a` and `b` whose differing words add to the result (no
    /// synchronisation): many comparisons, one [`take`](Self::take).
    pub fn enqueue<T: cudarc::driver::DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
    ) -> anyhow::Result<()> {
        ensure!(
            a.len() == b.len(),
            "comparing buffers of {} and {} elements",
            a.len(),
            b.len()
        );
        let (pa, _ga) = a.device_ptr(stream);
        let (pb, _gb) = b.device_ptr(stream);
        self.enqueue_raw(stream, pa, pb, a.len() * std::mem::size_of::<T>())
    }

    /// [`enqueue`](Self::enqueue) for raw device addresses of `bytes` bytes each (e.g. a PGL's
    /// local buffer); the caller keeps both alive until the stream has run the comparison.
    pub fn enqueue_raw(
        &mut self,
        stream: &Arc<CudaStream>,
        pa: u64,
        pb: u64,
        bytes: usize,
    ) -> anyhow::Result<()> {
        ensure!(
            bytes.is_multiple_of(4),
            "comparing {bytes} bytes: not a whole number of 32-bit words"
        );
        let (pr, _gr) = self.result.device_ptr_mut(stream);
        let p = weft_word_compare_params {
            a: pa,
            b: pb,
            words: (bytes / 4) as u64,
            result: pr,
        };
        let cfg = LaunchConfig {
            grid_dim: (528, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes exactly this struct; both buffers hold `words` words and the
        // result two u64, alive until the stream has run it (callers synchronise before freeing).
        unsafe { stream.launch_builder(&self.func).arg(&p).launch(cfg) }
            .context("launching weft_word_compare")?;
        Ok(())
    }

    /// Synchronises `stream` and returns what the comparisons since the last reset found.
    pub fn take(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<Option<Difference>> {
        let r = stream.clone_dtoh(&self.result)?;
        stream.synchronize()?;
        Ok((r[0] != 0).then_some(Difference {
            words: r[0],
            first_word: r[1],
        }))
    }
}
