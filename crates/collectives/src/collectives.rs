//! `Collectives`: one rank's staging PGL, round flags and kernels, and the three calls.

use crate::element::CollectiveElement;
use crate::error::CollectiveError;
use crate::geometry::{
    all_reduce_algorithm, geometry, Algorithm, AllReduceChoice, Geometry, Limits, Protocol,
};
use crate::options::Options;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
};
use std::sync::Arc;
use weft_kernels::abi::{self, weft_collective_params};
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{agree, Backend, Pgl, Shape};
use weft_sync::launch::{launch_ex, load, programmatic_serialization_attribute, sync_checked};
use weft_sync::{Counters, WaitBudget};

/// AllReduce, ReduceScatter and AllGather of this rank's device buffers, on one stream, with every
/// rank of the rendezvous. Every rank must make the same calls in the same order with the same
/// lengths and element types (as with NCCL); a rank that does not is reported by the others'
/// bounded waits ([`CollectiveError::Wait`] from [`Collectives::synchronize`] or `check`).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use cudarc::driver::CudaContext;
/// use weft_pgl::{gpu, rank_env::RankEnv, rendezvous::Rendezvous};
/// # fn main() -> anyhow::Result<()> {
/// // One process per GPU, started by `weft launch -n N --`, mpirun, srun or torchrun.
/// let env = RankEnv::from_env()?;
/// let mut rdzv = Rendezvous::connect(&env, Duration::from_secs(60))?;
/// let ctx = CudaContext::new(gpu::device_for_rank(&env, CudaContext::device_count()? as usize)?)?;
/// use weft_collectives::{Collectives, Options};
/// let stream = ctx.new_stream()?;
/// let mut coll = Collectives::new(&mut rdzv, &stream, Options::default())?;
/// let input = stream.clone_htod(&vec![1.0f32; 4096])?;
/// let mut sum = stream.alloc_zeros::<f32>(4096)?;
/// coll.all_reduce(&input, &mut sum)?; // every element: the world size
/// coll.synchronize()?;
/// coll.free(&mut rdzv)?;
/// # Ok(()) }
/// ```
pub struct Collectives {
    stream: Arc<CudaStream>,
    staging: Pgl<u8>,
    flags: Counters,
    /// Per element type (`CollectiveElement::INDEX`): every path but the sentinel two-shot
    /// AllReduce, and that one (a kernel of its own, so that its code cannot change the others').
    kernels: [CudaFunction; 3],
    two_shot_kernels: [CudaFunction; 3],
    options: Options,
    max_blocks: u32,
    /// Bytes of one staging slot (the options' or the default at this world).
    slot_bytes: u64,
    /// weft_collective_state: the round numbers, kept on the device so graph replays advance them.
    state: CudaSlice<u64>,
    /// Every launch's params but the call's own (input, output, count, cut, algorithm).
    base: weft_collective_params,
    /// Launches carry the programmatic-serialization attribute (options.pdl, ranks not sharing
    /// a GPU).
    pdl: bool,
}

impl Collectives {
    /// Collective: staging and flags on every rank of `rdzv` for launches on `stream`.
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        options: Options,
    ) -> Result<Self, CollectiveError> {
        let ctx = stream.context().clone();
        let world = rdzv.world();
        let sms = sm_count(&ctx)?;
        let sharing = weft_pgl::gpu::max_ranks_per_gpu(rdzv, &ctx)?;
        // Every rank checks its options, then all compare what shapes a launch: a rank cutting
        // calls differently would read slot parts its peers never wrote.
        let checked = options.validate(world, sms, sharing);
        let local = checked
            .as_ref()
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("{e}"));
        if let Err(e) = agree(rdzv, "collectives options", local) {
            return Err(match checked {
                Err(mine) => mine,
                Ok(_) => CollectiveError::Options(format!("{e:#}")),
            });
        }
        let max_blocks = checked?;
        let cut = format!(
            "slot_bytes {} blocks {:?} max_blocks {max_blocks} ll_max_bytes {} sentinel_bytes {} all_reduce {:?}",
            options.slot_bytes_at(world),
            options.blocks,
            options.ll_max_bytes,
            options.sentinel_bytes_at(world),
            options.all_reduce
        );
        let all = rdzv.all_gather(cut.as_bytes())?;
        if let Some((r, theirs)) = all
            .iter()
            .enumerate()
            .find(|(_, b)| b.as_slice() != cut.as_bytes())
        {
            return Err(CollectiveError::Options(format!(
                "ranks disagree: rank {} has {cut}, rank {r} has {}",
                rdzv.rank(),
                String::from_utf8_lossy(theirs)
            )));
        }
        let (kernels, two_shot_kernels) = agree(
            rdzv,
            "loading kernels/collectives/collectives.cu",
            load_kernels(&ctx),
        )?;
        // [slot][phase][sender] rows of slot_bytes, then [slot][sender] LL rows
        // (weft_collective_slot_offset, weft_collective_ll_slot_offset), then the sentinel
        // area, [slot][sender] rows of sentinel_bytes (weft_collective_sentinel_slot_offset),
        // rounded up to whole rows of slot_bytes.
        // SAFETY: pure functions of their arguments (weft/abi/collectives.h).
        let rows = unsafe { abi::weft_collective_staging_rows(world as u32) };
        let slot_bytes = options.slot_bytes_at(world);
        let sentinel_bytes = options.sentinel_bytes_at(world);
        let sentinel_area =
            unsafe { abi::weft_collective_sentinel_area_bytes(world as u32, sentinel_bytes) };
        let sentinel_rows = u32::try_from(sentinel_area.div_ceil(slot_bytes)).map_err(|_| {
            CollectiveError::Options(format!("sentinel area of {sentinel_area} bytes"))
        })?;
        let staging = Pgl::alloc(
            rdzv,
            &ctx,
            Shape::new(1, 1, rows + sentinel_rows, slot_bytes as u32),
            Backend::default(),
        )
        .map_err(|e| {
            anyhow::Error::new(e).context(format!(
                "allocating {} bytes of collective staging",
                (rows + sentinel_rows) as u64 * slot_bytes
            ))
        })?;
        let budget = agree(
            rdzv,
            "collectives wait budget",
            WaitBudget::default_for(&ctx).map_err(anyhow::Error::new),
        )?;
        let flags = Counters::alloc(
            rdzv,
            &ctx,
            Shape::new(
                abi::WEFT_COLL_PHASES,
                1,
                world as u32,
                abi::WEFT_COLL_MAX_BLOCKS,
            ),
            budget,
        )?;
        // This rank's local set-up, agreed on by all (a rank that fails here must not leave the
        // others waiting): the sentinel area filled with the sentinel, the zeroed round state, the
        // launch params; all in place before any rank's first launch.
        let local = (|| -> anyhow::Result<(CudaSlice<u64>, weft_collective_params)> {
            ctx.bind_to_thread()?;
            if sentinel_area > 0 {
                let at = staging.local_ptr() + rows as u64 * slot_bytes;
                // SAFETY: [at, at + sentinel_area) lies inside this rank's staging allocation of
                // (rows + sentinel_rows) · slot_bytes bytes, alive while `staging` is.
                unsafe {
                    cudarc::driver::result::memset_d8_async(
                        at,
                        0xff,
                        sentinel_area as usize,
                        stream.cu_stream(),
                    )
                }?;
            }
            let state =
                stream.alloc_zeros::<u64>(std::mem::size_of::<abi::weft_collective_state>() / 8)?;
            let state_ptr = state.device_ptr(stream).0;
            let base = weft_collective_params {
                staging: staging.view(),
                flags: flags.device()?,
                slot_bytes,
                sentinel_bytes,
                state: state_ptr,
                ..Default::default()
            };
            stream.synchronize()?;
            Ok((state, base))
        })();
        let (state, base) = agree(rdzv, "collectives state and sentinel area", local)?;
        Ok(Self {
            stream: stream.clone(),
            staging,
            flags,
            kernels,
            two_shot_kernels,
            options,
            max_blocks,
            slot_bytes,
            state,
            base,
            pdl: options.pdl && sharing <= 1,
        })
    }

    /// The options as given (what launches do may be less: [`Collectives::pdl`],
    /// [`Collectives::sentinel_bytes`]).
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Whether launches carry the programmatic-dependent-launch attribute (`options.pdl`, and
    /// the ranks do not share a GPU).
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Bytes of one sentinel slot: the largest payload per sender the sentinel protocol takes
    /// (`options.sentinel_max_bytes`, at most a slot; 0: off).
    pub fn sentinel_bytes(&self) -> u64 {
        self.base.sentinel_bytes
    }

    /// Bytes of one staging slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `output[i]` = sum over ranks of `input[i]`; equal lengths. Every rank gets the same bits.
    /// The sentinel protocol changes one NaN bit pattern: [`crate::Options::sentinel_max_bytes`].
    pub fn all_reduce<T: CollectiveElement>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
    ) -> Result<(), CollectiveError> {
        const OP: &str = "all_reduce";
        expect_len(
            OP,
            "output",
            output.len(),
            input.len(),
            "the input's length",
        )?;
        let stream = self.stream.clone();
        let (i, _gi) = input.device_ptr(&stream);
        let (o, _go) = output.device_ptr_mut(&stream);
        self.all_reduce_ptrs::<T>(i, o, input.len())
    }

    /// In place: `buf[i]` = sum over ranks of `buf[i]`.
    pub fn all_reduce_in_place<T: CollectiveElement>(
        &mut self,
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<(), CollectiveError> {
        let n = buf.len();
        let stream = self.stream.clone();
        let (p, _g) = buf.device_ptr_mut(&stream);
        self.all_reduce_ptrs::<T>(p, p, n)
    }

    fn all_reduce_ptrs<T: CollectiveElement>(
        &mut self,
        input: u64,
        output: u64,
        n: usize,
    ) -> Result<(), CollectiveError> {
        let algo = self.all_reduce_path::<T>(n);
        self.launch::<T>(algo, input, output, n)
    }

    /// `output` (n elements) = sum over ranks of `input[rank·n .. (rank+1)·n]`; `input` holds world·n.
    /// The sentinel protocol changes one NaN bit pattern: [`crate::Options::sentinel_max_bytes`].
    pub fn reduce_scatter<T: CollectiveElement>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
    ) -> Result<(), CollectiveError> {
        let n = output.len();
        expect_len(
            "reduce_scatter",
            "input",
            input.len(),
            n * self.staging.world(),
            "world × the output's length",
        )?;
        let stream = self.stream.clone();
        let (i, _gi) = input.device_ptr(&stream);
        let (o, _go) = output.device_ptr_mut(&stream);
        self.launch::<T>(Algorithm::ReduceScatter, i, o, n)
    }

    /// `output[r·n .. (r+1)·n]` = rank r's `input` (n elements); `output` holds world·n.
    /// The sentinel protocol changes one NaN bit pattern: [`crate::Options::sentinel_max_bytes`].
    pub fn all_gather<T: CollectiveElement>(
        &mut self,
        input: &impl DevicePtr<T>,
        output: &mut impl DevicePtrMut<T>,
    ) -> Result<(), CollectiveError> {
        let n = input.len();
        expect_len(
            "all_gather",
            "output",
            output.len(),
            n * self.staging.world(),
            "world × the input's length",
        )?;
        let stream = self.stream.clone();
        let (i, _gi) = input.device_ptr(&stream);
        let (o, _go) = output.device_ptr_mut(&stream);
        self.launch::<T>(Algorithm::AllGather, i, o, n)
    }

    /// The launch geometry a call of `count` elements of `T` gets (for reports and tests); an
    /// error when it would take more than u32::MAX rounds.
    pub fn geometry<T: CollectiveElement>(
        &self,
        algo: Algorithm,
        count: usize,
    ) -> Result<Geometry, CollectiveError> {
        let limits = Limits {
            slot_bytes: self.slot_bytes,
            sentinel_bytes: self.base.sentinel_bytes,
            ll_max_bytes: self.options.ll_max_bytes,
            blocks: self.options.blocks,
            max_blocks: self.max_blocks,
        };
        geometry(
            algo,
            count as u64,
            self.staging.world(),
            std::mem::size_of::<T>(),
            limits,
        )
        .ok_or(CollectiveError::TooLarge {
            op: algo.name(),
            count,
            slot_bytes: self.slot_bytes,
        })
    }

    /// The AllReduce path a call of `count` elements of `T` takes.
    pub fn all_reduce_path<T: CollectiveElement>(&self, count: usize) -> Algorithm {
        // Only Auto beyond two ranks looks at the two-shot's protocol.
        let sentinel_two_shot = self.options.all_reduce == AllReduceChoice::Auto
            && self.staging.world() > 2
            && self
                .geometry::<T>(Algorithm::AllReduceTwoShot, count)
                .is_ok_and(|g| g.protocol == Protocol::Sentinel);
        all_reduce_algorithm(
            self.options.all_reduce,
            self.staging.world(),
            (count * std::mem::size_of::<T>()) as u64,
            sentinel_two_shot,
        )
    }

    /// Every buffer must be memory of the stream's device.
    fn check_device(
        &self,
        op: &'static str,
        buffer: &'static str,
        addr: u64,
    ) -> Result<(), CollectiveError> {
        let mut ordinal: i32 = -1;
        // SAFETY: a query of the driver about an address; `ordinal` is the i32 it writes.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                &mut ordinal as *mut i32 as *mut std::ffi::c_void,
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        let expected = self.stream.context().ordinal() as i32;
        if r != sys::CUresult::CUDA_SUCCESS || ordinal != expected {
            return Err(CollectiveError::WrongDevice {
                op,
                buffer,
                addr,
                device: ordinal,
                expected,
            });
        }
        Ok(())
    }

    fn launch<T: CollectiveElement>(
        &mut self,
        algo: Algorithm,
        input: u64,
        output: u64,
        count: usize,
    ) -> Result<(), CollectiveError> {
        let op = algo.name();
        for (buffer, addr) in [("input", input), ("output", output)] {
            if addr % 16 != 0 {
                return Err(CollectiveError::Misaligned { op, buffer, addr });
            }
        }
        if count == 0 {
            return Ok(()); // nothing to move (as NCCL: a zero count is a no-op)
        }
        self.check_device(op, "input", input)?;
        self.check_device(op, "output", output)?;
        let g = self.geometry::<T>(algo, count)?;
        let params = weft_collective_params {
            input,
            output,
            count: g.count,
            shard: g.shard,
            window: g.window,
            rounds: g.rounds,
            algo: algo.code(),
            protocol: g.protocol.code(),
            ..self.base
        };
        let func = if g.protocol == Protocol::Sentinel && algo == Algorithm::AllReduceTwoShot {
            &self.two_shot_kernels[T::INDEX]
        } else {
            &self.kernels[T::INDEX]
        };
        // SAFETY: input and output are this device's buffers of the lengths
        // checked by the callers (count elements; world·count where the op says so), 16-byte
        // aligned; the staging and flag views are this value's PGLs, alive while it is; the kernel
        // writes the staging only inside slots of slot_bytes (window ≤ slot_bytes / size of T;
        // LL: 8 bytes per 4-byte word; sentinel: payload ≤ sentinel_bytes; checked by
        // geometry()); the state is this value's WEFT_COLL_MAX_BLOCKS words; the kernel takes
        // exactly weft_collective_params by value. Capturable: nothing here depends on earlier
        // launches.
        let mut attrs = [programmatic_serialization_attribute()];
        let cfg = sys::CUlaunchConfig {
            gridDimX: g.blocks,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: g.threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: self.stream.cu_stream(),
            // The kernel waits for the previous grid (griddepcontrol.wait) before any memory access.
            attrs: attrs.as_mut_ptr(),
            numAttrs: u32::from(self.pdl),
        };
        unsafe { launch_ex(self.stream.context(), func, &cfg, &params) }?;
        Ok(())
    }

    /// Waits for the stream; a kernel stopped by an expired wait is reported with what it saw.
    pub fn synchronize(&self) -> Result<(), CollectiveError> {
        sync_checked(&self.stream, &[self.flags.slot()]).map_err(CollectiveError::from)
    }

    /// Collective: frees staging and flags on every rank (after the stream drained).
    pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), CollectiveError> {
        agree(
            rdzv,
            "collectives free (drain)",
            self.synchronize().map_err(anyhow::Error::from),
        )?;
        drop(self.state);
        self.staging.free(rdzv)?;
        self.flags.free(rdzv)?;
        Ok(())
    }
}

fn expect_len(
    op: &'static str,
    buffer: &'static str,
    len: usize,
    expected: usize,
    rule: &'static str,
) -> Result<(), CollectiveError> {
    if len == expected {
        Ok(())
    } else {
        Err(CollectiveError::Length {
            op,
            buffer,
            len,
            expected,
            rule,
        })
    }
}

/// The kernels of every path but the sentinel two-shot AllReduce, and that one's.
type Kernels = ([CudaFunction; 3], [CudaFunction; 3]);

fn load_kernels(ctx: &Arc<CudaContext>) -> anyhow::Result<Kernels> {
    let f = |name: &str| load(ctx, &cubins::COLLECTIVES_COLLECTIVES, name);
    let names = [
        <f32 as CollectiveElement>::KERNEL,
        <half::bf16 as CollectiveElement>::KERNEL,
        <half::f16 as CollectiveElement>::KERNEL,
    ];
    Ok((
        [f(names[0])?, f(names[1])?, f(names[2])?],
        [
            f(&format!("{}_two_shot", names[0]))?,
            f(&format!("{}_two_shot", names[1]))?,
            f(&format!("{}_two_shot", names[2]))?,
        ],
    ))
}

fn sm_count(ctx: &Arc<CudaContext>) -> anyhow::Result<u32> {
    Ok(ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32)
}
