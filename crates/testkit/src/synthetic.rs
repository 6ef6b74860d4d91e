//! The synthetic workloads a KernelBarrier orders in the overlap-order bench and the barrier
//! trials (kernels/barrier/persistent_compute.cu, comm_copy.cu; layouts in weft/abi/synthetic.h):
//!
//! - a persistent compute kernel: one greedy block per SM (1024 threads × 64 registers fill the
//!   register file, plus [`COMPUTE_SMEM`] of dynamic shared memory), grid = SMs − `sm_margin`,
//!   tiles taken from a global counter; the host recomputes every output in closed form;
//! - a copy kernel (local → peer, or local → local) that arrives on a barrier view first thing.
//!
//! Both stamp `%globaltimer` into a [`Stamps`] buffer (first start, last end, arrival).

use anyhow::{ensure, Context};
use cudarc::driver::sys::{self, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;
use weft_kernels::abi::{
    self, weft_comm_copy_params, weft_kernel_barrier_view, weft_persistent_compute_params,
};
use weft_kernels::cubins;

/// Threads per block of both kernels.
pub const THREADS: u32 = abi::WEFT_OVERLAP_THREADS;
/// Dynamic shared memory of each compute block (capped at the device's opt-in limit): no second
/// compute-like block fits beside it.
pub const COMPUTE_SMEM: u32 = 200 * 1024;
/// Affine steps per chain per tile: about 0.06 ms per tile on an H200 SM (1024 threads × 56
/// chains × 128 steps). Fine-grained on purpose: with 512 steps (0.25 ms a tile) the blocks that
/// start late, once the comm kernel frees its SMs, ended up to a quarter millisecond apart, which
/// showed up as lost overlap.
pub const DEFAULT_ROUNDS: u32 = 128;
/// A value written over outputs before each run (an output left unwritten shows).
pub const POISON: u32 = 0xDEAD_BEEF;

/// The two kernels, loaded on one context.
pub struct Kernels {
    compute: CudaFunction,
    comm: CudaFunction,
    sms: u32,
    compute_smem: u32,
}

impl Kernels {
    pub fn load(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        let load = |c: &weft_kernels::Cubin, name: &str| -> anyhow::Result<CudaFunction> {
            let m = c
                .load(ctx)
                .with_context(|| format!("loading {}", c.source))?;
            m.load_function(name)
                .with_context(|| format!("{} has no kernel {name}", c.source))
        };
        let compute = load(
            &cubins::BARRIER_PERSISTENT_COMPUTE,
            "weft_persistent_compute",
        )?;
        let comm = load(&cubins::BARRIER_COMM_COPY, "weft_comm_copy")?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let optin = ctx.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )? as u32;
        let static_smem = compute
            .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?
            as u32;
        let compute_smem = COMPUTE_SMEM.min(optin.saturating_sub(static_smem));
        compute.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            compute_smem as i32,
        )?;
        Ok(Self {
            compute,
            comm,
            sms,
            compute_smem,
        })
    }

    /// The device's SM count.
    pub fn sms(&self) -> u32 {
        self.sms
    }

    /// Registers per thread of (compute, comm), as compiled.
    pub fn registers(&self) -> anyhow::Result<(u32, u32)> {
        let regs = |f: &CudaFunction| {
            f.get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)
                .map(|r| r as u32)
        };
        Ok((regs(&self.compute)?, regs(&self.comm)?))
    }

    /// The persistent kernel on SMs − `sm_margin` blocks. `early_release`: launched with
    /// [`early_release_attribute`](weft_barrier::early_release_attribute) — only directly after a
    /// `KernelBarrier::wait` on `stream`, with the context's event tracking off (refused
    /// otherwise by the attribute).
    pub fn launch_compute(
        &self,
        stream: &Arc<CudaStream>,
        work: &ComputeWork,
        stamps: &Stamps,
        sm_margin: u32,
        early_release: bool,
    ) -> anyhow::Result<()> {
        ensure!(
            sm_margin < self.sms,
            "sm_margin {sm_margin} leaves no SM of {} for the compute kernel",
            self.sms
        );
        let p = weft_persistent_compute_params {
            out: work.out.device_ptr(stream).0,
            tile_counter: work.tile_counter.device_ptr(stream).0,
            stamps: stamps.buf.device_ptr(stream).0,
            tiles: work.tiles,
            rounds: work.rounds,
            mul: work.mul,
            add: work.add,
            seed: work.seed,
            reserved: 0,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.sms - sm_margin, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: self.compute_smem,
        };
        let mut attrs = Vec::new();
        if early_release {
            attrs.push(weft_barrier::early_release_attribute(stream)?);
        }
        let ex = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: THREADS,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: the kernel takes exactly this struct (its buffers live in `work` and `stamps`);
        // `attrs` is alive for the call.
        unsafe { weft_sync::launch::launch_ex(stream.context(), &self.compute, &ex, &p) }
            .context("launching the persistent compute kernel")?;
        Ok(())
    }

    /// The copy kernel on `blocks` blocks: `bytes` from `src` to `dst` (device addresses valid in
    /// the stream's context, 16-byte aligned, disjoint; bytes a multiple of 16), arriving on
    /// `barrier` (None: no arrival).
    pub fn launch_comm(
        &self,
        stream: &Arc<CudaStream>,
        copy: &CopyArgs,
        stamps: &Stamps,
        barrier: Option<weft_kernel_barrier_view>,
        blocks: u32,
    ) -> anyhow::Result<()> {
        ensure!(
            copy.src.is_multiple_of(16)
                && copy.dst.is_multiple_of(16)
                && copy.bytes.is_multiple_of(16),
            "comm copy needs 16-byte alignment: {copy:?}"
        );
        ensure!(blocks > 0, "the comm kernel needs at least one block");
        let p = weft_comm_copy_params {
            barrier: barrier.unwrap_or(weft_kernel_barrier_view { counter: 0 }),
            src: copy.src,
            dst: copy.dst,
            bytes: copy.bytes,
            stamps: stamps.buf.device_ptr(stream).0,
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes exactly this struct; the caller keeps src and dst alive.
        unsafe { stream.launch_builder(&self.comm).arg(&p).launch(cfg) }
            .context("launching the comm copy kernel")?;
        Ok(())
    }
}

/// What the copy kernel copies.
#[derive(Clone, Copy, Debug)]
pub struct CopyArgs {
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
}

/// The compute kernel's inputs and output.
pub struct ComputeWork {
    pub out: CudaSlice<u32>,
    tile_counter: CudaSlice<u32>,
    pub tiles: u32,
    pub rounds: u32,
    pub mul: u32,
    pub add: u32,
    pub seed: u32,
}

impl ComputeWork {
    /// `tiles` tiles of `rounds` steps; the step constants derive from `seed`.
    pub fn new(
        stream: &Arc<CudaStream>,
        tiles: u32,
        rounds: u32,
        seed: u32,
    ) -> anyhow::Result<Self> {
        ensure!(
            tiles > 0 && (tiles as u64) * (THREADS as u64) <= u32::MAX as u64,
            "{tiles} tiles do not fit a u32 element index"
        );
        let out = stream.alloc_zeros::<u32>((tiles * THREADS) as usize)?;
        let tile_counter = stream.alloc_zeros::<u32>(1)?;
        let mul = abi_mix(seed ^ 0x5bd1_e995) | 1;
        let add = abi_mix(seed.wrapping_add(0x9e37_79b9));
        Ok(Self {
            out,
            tile_counter,
            tiles,
            rounds,
            mul,
            add,
            seed,
        })
    }

    /// In `stream` order: the tile counter to 0 and every output to [`POISON`].
    pub fn prepare(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        stream.memset_zeros(&mut self.tile_counter)?;
        memset_u32(
            stream,
            self.out.device_ptr(stream).0,
            POISON,
            self.out.len(),
        )
    }

    /// Output element `elem` as the host computes it: (mul, add)^rounds applied to every chain,
    /// summed (the steps are affine, so the sum is A · Σ starts + CHAINS · C).
    pub fn expected(&self, elem: u32, step: (u32, u32)) -> u32 {
        // SAFETY: a pure function over integers (weft/abi/synthetic.h).
        let starts = unsafe { abi::weft_overlap_start_sum(self.seed, elem) };
        step.0
            .wrapping_mul(starts)
            .wrapping_add(abi::WEFT_OVERLAP_CHAINS.wrapping_mul(step.1))
    }

    /// The affine map of `rounds` steps.
    pub fn step(&self) -> (u32, u32) {
        affine_power((self.mul, self.add), self.rounds)
    }

    /// Copies the output back and compares every `stride`-th element (and the last) with the
    /// host's closed form; `stride` 1 checks all. Err names the first wrong element.
    pub fn check(&self, stream: &Arc<CudaStream>, stride: usize) -> anyhow::Result<u64> {
        let host = stream.clone_dtoh(&self.out)?;
        let step = self.step();
        let mut idx: Vec<usize> = (0..host.len()).step_by(stride.max(1)).collect();
        idx.push(host.len() - 1);
        let mut wrong = 0u64;
        let mut first = None;
        for &i in &idx {
            let want = self.expected(i as u32, step);
            if host[i] != want {
                wrong += 1;
                first.get_or_insert((i, host[i], want));
            }
        }
        if let Some((i, got, want)) = first {
            let what = if got == POISON {
                "never written"
            } else {
                "wrong"
            };
            anyhow::bail!(
                "compute output: {wrong} of {} checked elements wrong; element {i} (tile {}, thread {}) is {got:#x} ({what}), expected {want:#x} (seed {}, {} tiles, {} rounds)",
                idx.len(),
                i as u32 / THREADS,
                i as u32 % THREADS,
                self.seed,
                self.tiles,
                self.rounds
            );
        }
        Ok(idx.len() as u64)
    }
}

/// The kernels' `%globaltimer` stamps (ns), see weft/abi/synthetic.h.
pub struct Stamps {
    buf: CudaSlice<u64>,
}

/// One run's stamps (ns on the GPU's global timer).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StampValues {
    pub compute_start: u64,
    pub compute_end: u64,
    pub comm_start: u64,
    pub comm_end: u64,
    pub comm_arrive: u64,
    /// The KernelBarrier wait kernel's exit (0 when no stamped wait ran).
    pub wait_exit: u64,
}

impl StampValues {
    /// Whether both kernels ran (every stamp written).
    pub fn complete(&self) -> bool {
        self.compute_start != u64::MAX
            && self.comm_start != u64::MAX
            && self.compute_end != 0
            && self.comm_end != 0
            && self.comm_arrive != 0
    }
}

impl Stamps {
    pub fn new(stream: &Arc<CudaStream>) -> anyhow::Result<Self> {
        Ok(Self {
            buf: stream.alloc_zeros::<u64>(abi::WEFT_STAMP_COUNT as usize)?,
        })
    }

    /// In `stream` order: starts to u64::MAX, ends and the arrival to 0.
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        let mut v = [0u64; abi::WEFT_STAMP_COUNT as usize];
        v[abi::WEFT_STAMP_COMPUTE_START as usize] = u64::MAX;
        v[abi::WEFT_STAMP_COMM_START as usize] = u64::MAX;
        stream.memcpy_htod(&v, &mut self.buf)?;
        Ok(())
    }

    /// The whole buffer, for a compute kernel that keeps its own timeline (weft's GEMM:
    /// `LaunchExtras::timeline` lowers element 0 to its start and raises element 1 to its end,
    /// which are WEFT_STAMP_COMPUTE_START and _END).
    pub fn compute_timeline(&mut self) -> &mut CudaSlice<u64> {
        const _: () =
            assert!(abi::WEFT_STAMP_COMPUTE_START == 0 && abi::WEFT_STAMP_COMPUTE_END == 1);
        &mut self.buf
    }

    /// Device address of the wait-exit slot, for [`KernelBarrier::wait_stamped`](weft_barrier::KernelBarrier::wait_stamped).
    pub fn wait_exit_ptr(&self, stream: &Arc<CudaStream>) -> u64 {
        self.buf.device_ptr(stream).0 + 8 * abi::WEFT_STAMP_WAIT_EXIT as u64
    }

    /// Reads the stamps (synchronous on `stream`).
    pub fn read(&self, stream: &Arc<CudaStream>) -> anyhow::Result<StampValues> {
        let v = stream.clone_dtoh(&self.buf)?;
        Ok(StampValues {
            compute_start: v[abi::WEFT_STAMP_COMPUTE_START as usize],
            compute_end: v[abi::WEFT_STAMP_COMPUTE_END as usize],
            comm_start: v[abi::WEFT_STAMP_COMM_START as usize],
            comm_end: v[abi::WEFT_STAMP_COMM_END as usize],
            comm_arrive: v[abi::WEFT_STAMP_COMM_ARRIVE as usize],
            wait_exit: v[abi::WEFT_STAMP_WAIT_EXIT as usize],
        })
    }
}

/// Fills `n` u32 at `ptr` with `value`, in `stream` order.
pub fn memset_u32(stream: &Arc<CudaStream>, ptr: u64, value: u32, n: usize) -> anyhow::Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: the caller passes a live allocation of at least n u32 in the stream's context (or
    // mapped into it).
    unsafe { sys::cuMemsetD32Async(ptr, value, n, stream.cu_stream()) }
        .result()
        .context("cuMemsetD32Async")?;
    Ok(())
}

fn abi_mix(x: u32) -> u32 {
    // SAFETY: a pure function over integers (weft/abi/synthetic.h).
    unsafe { abi::weft_overlap_mix(x) }
}

/// The affine map x -> m·x + c (mod 2^32) applied `n` times, as (m', c'), by squaring.
pub fn affine_power((m, c): (u32, u32), mut n: u32) -> (u32, u32) {
    // g ∘ f for f = (m1, c1) then g = (m2, c2): x -> m2 (m1 x + c1) + c2.
    let then = |(m1, c1): (u32, u32), (m2, c2): (u32, u32)| {
        (m2.wrapping_mul(m1), m2.wrapping_mul(c1).wrapping_add(c2))
    };
    let (mut acc, mut base) = ((1u32, 0u32), (m, c));
    while n > 0 {
        if n & 1 == 1 {
            acc = then(acc, base);
        }
        base = then(base, base);
        n >>= 1;
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_power_is_repeated_steps() {
        for (m, c) in [(0x2545_f491u32 | 1, 0x9e37_79b9u32), (3, 7), (1, 1)] {
            let mut x = 0x1234_5678u32;
            for n in 0..600u32 {
                let (a, b) = affine_power((m, c), n);
                assert_eq!(
                    a.wrapping_mul(0x1234_5678).wrapping_add(b),
                    x,
                    "m {m:#x} c {c:#x} n {n}"
                );
                x = x.wrapping_mul(m).wrapping_add(c);
            }
        }
    }

    #[test]
    fn closed_form_matches_the_chains_step_by_step() {
        // The kernel's arithmetic, element by element, against ComputeWork::expected's formula.
        let (seed, rounds) = (77u32, 37u32);
        let mul = abi_mix(seed ^ 0x5bd1_e995) | 1;
        let add = abi_mix(seed.wrapping_add(0x9e37_79b9));
        let (a, c) = affine_power((mul, add), rounds);
        for elem in [0u32, 1, 1023, 1024, 999_999] {
            let mut sum = 0u32;
            for j in 0..abi::WEFT_OVERLAP_CHAINS {
                let mut x = unsafe { abi::weft_overlap_chain_start(seed, elem, j) };
                for _ in 0..rounds {
                    x = x.wrapping_mul(mul).wrapping_add(add);
                }
                sum = sum.wrapping_add(x);
            }
            let starts = unsafe { abi::weft_overlap_start_sum(seed, elem) };
            assert_eq!(
                a.wrapping_mul(starts)
                    .wrapping_add(abi::WEFT_OVERLAP_CHAINS.wrapping_mul(c)),
                sum,
                "element {elem}"
            );
        }
    }

    #[test]
    fn stamp_layout() {
        assert_eq!(abi::WEFT_STAMP_COUNT, 6);
        assert_eq!(std::mem::size_of::<weft_comm_copy_params>(), 40);
        assert_eq!(std::mem::size_of::<weft_persistent_compute_params>(), 48);
    }
}
