//! Tolerance checks of large bf16 results on their GPU (kernels/harness/bound_compare.cu): every
//! element of a result against a reference within a bound, without downloading either; only the
//! first bad element is read back for the message.

use anyhow::{ensure, Context};
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
use half::bf16;
use std::sync::Arc;
use weft_kernels::abi::{weft_abs_to_f32_params, weft_bound_compare_params};
use weft_kernels::cubins;

pub struct BoundCompare {
    compare: CudaFunction,
    abs: CudaFunction,
    /// [elements outside the bound, first such index]
    result: CudaSlice<u64>,
}

/// The bound of element i: `per_element[i] · scale + rel · |want[i]| + abs`.
pub struct Bound<'a> {
    pub per_element: Option<(&'a CudaSlice<f32>, f32)>,
    pub rel: f32,
    pub abs: f32,
}

const GRID: LaunchConfig = LaunchConfig {
    grid_dim: (1056, 1, 1),
    block_dim: (256, 1, 1),
    shared_mem_bytes: 0,
};

impl BoundCompare {
    pub fn load(stream: &Arc<CudaStream>) -> anyhow::Result<Self> {
        let c = &cubins::HARNESS_BOUND_COMPARE;
        let module = c
            .load(stream.context())
            .with_context(|| format!("loading {}", c.source))?;
        Ok(Self {
            compare: module.load_function("weft_bound_compare")?,
            abs: module.load_function("weft_abs_to_f32")?,
            result: stream.alloc_zeros::<u64>(2)?,
        })
    }

    /// |src| as f32, on `stream`.
    fn abs_f32(
        &self,
        stream: &Arc<CudaStream>,
        src: &impl DevicePtr<bf16>,
    ) -> anyhow::Result<CudaSlice<f32>> {
        let count = src.len();
        // SAFETY: every element is written by the kernel below before anything reads it.
        let mut dst = unsafe { stream.alloc::<f32>(count.max(1)) }?;
        let (ps, _gs) = src.device_ptr(stream);
        let (pd, _gd) = dst.device_ptr_mut(stream);
        let p = weft_abs_to_f32_params {
            src: ps,
            dst: pd,
            count: count as u64,
        };
        // SAFETY: the kernel takes exactly this struct; both buffers hold `count` elements.
        unsafe { stream.launch_builder(&self.abs).arg(&p).launch(GRID) }
            .context("launching weft_abs_to_f32")?;
        drop((_gs, _gd));
        Ok(dst)
    }

    /// Σ over ranks of |partial_r| (f32) per element, every rank's `partial` summed by `comm`: the
    /// base of the bound world · 2⁻⁷ · Σ_r |partial_r| of two bf16 paths to one sum (see
    /// reduce_check.rs). Collective; synchronises `stream`.
    pub fn abs_sum_over_ranks(
        &self,
        comm: &weft_pgl::nccl::Communicator,
        stream: &Arc<CudaStream>,
        partial: &impl DevicePtr<bf16>,
    ) -> anyhow::Result<CudaSlice<f32>> {
        let mut abs = self.abs_f32(stream, partial)?;
        comm.all_reduce_in_place(&mut abs, weft_pgl::nccl::ReduceOp::Sum, stream)?;
        stream.synchronize()?;
        Ok(abs)
    }

    /// Every element of `got` within `bound` of `want` (same length); the error names how many
    /// are not and the first one (row and column for rows of `n`), with its values. Synchronises.
    pub fn check(
        &mut self,
        stream: &Arc<CudaStream>,
        what: &str,
        got: &impl DevicePtr<bf16>,
        want: &CudaSlice<bf16>,
        bound: &Bound<'_>,
        n: usize,
    ) -> anyhow::Result<()> {
        let count = want.len();
        ensure!(
            got.len() >= count,
            "{what}: the result holds {} elements, the reference {count}",
            got.len()
        );
        if let Some((b, _)) = bound.per_element {
            ensure!(
                b.len() >= count,
                "{what}: the bound holds {} elements, the reference {count}",
                b.len()
            );
        }
        stream.memcpy_htod(&[0u64, u64::MAX], &mut self.result)?;
        let (pg, _gg) = got.device_ptr(stream);
        let (pw, _gw) = want.device_ptr(stream);
        let (pb, scale, _gb) = match bound.per_element {
            Some((b, s)) => {
                let (p, g) = b.device_ptr(stream);
                (p, s, Some(g))
            }
            None => (0, 0.0, None),
        };
        let (pr, _gr) = self.result.device_ptr_mut(stream);
        let p = weft_bound_compare_params {
            got: pg,
            want: pw,
            bound: pb,
            bound_scale: scale,
            rel: bound.rel,
            abs: bound.abs,
            count: count as u64,
            result: pr,
        };
        // SAFETY: the kernel takes exactly this struct; the buffers hold `count` elements (checked).
        unsafe { stream.launch_builder(&self.compare).arg(&p).launch(GRID) }
            .context("launching weft_bound_compare")?;
        drop(_gr);
        let r = stream.clone_dtoh(&self.result)?;
        stream.synchronize()?;
        if r[0] == 0 {
            return Ok(());
        }
        let i = r[1] as usize;
        let mut got_bits = [0u16; 1];
        stream.context().bind_to_thread()?;
        // SAFETY: element i < count of `got`, two bytes, into a host array of one u16.
        unsafe { sys::cuMemcpyDtoH_v2(got_bits.as_mut_ptr().cast(), pg + 2 * i as u64, 2) }
            .result()?;
        let want_v = stream.clone_dtoh(&want.slice(i..i + 1))?[0].to_f32();
        let b = match bound.per_element {
            Some((b, s)) => stream.clone_dtoh(&b.slice(i..i + 1))?[0] * s,
            None => 0.0,
        } + bound.rel * want_v.abs()
            + bound.abs;
        anyhow::bail!(
            "{what}: {} of {count} elements outside the bound; first at ({}, {}): got {}, expected {want_v}, bound {b}",
            r[0],
            i / n.max(1),
            i % n.max(1),
            bf16::from_bits(got_bits[0]).to_f32()
        )
    }
}
