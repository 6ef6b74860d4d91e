//! weft-grpcoll: native intranode GroupCast / GroupReduce over pgl peer buffers, with an NCCL
//! AlltoAll-v baseline behind the same plan. See README.md.
//!
//! - [`GroupCast`]: input split i goes to every rank of `dst_indices[i]` (push: the sender reads
//!   each split once and writes it to every destination's output at its final rows).
//! - [`GroupReduce`]: output split j is the sum / average / lse-combination of the partials of
//!   every rank in `src_indices[j]` (pull: the receiver reads its sources' partials — bulk-loaded
//!   into shared memory where it can — and writes the reduced rows once), fp32 accumulation (fp64
//!   for f64 data), optionally into the existing output.
//!
//! A plan is built once, collectively, from this rank's metadata ([`GroupCastMeta`],
//! [`GroupReduceMeta`]) and the row widths of up to three tensors that share it (packed
//! transfer): it validates locally and across ranks, allocates the input and output PGLs (callers
//! write inputs there and read outputs there), and uploads this rank's work lists. Each `run` is
//! then one kernel launch with no host synchronisation.
//!
//! A communication dtype narrower than the data ([`Options::comm_dtype`], e.g. f32 data sent as
//! bf16) makes the launch convert this rank's inputs into a staging PGL first (local memory), and
//! the receivers pull the narrow rows and widen them into their outputs, in the same kernel.

mod baseline;
mod bulk_ring;
mod device_meta;
mod error;
mod kernel_choice;
mod meta;
pub mod pattern;
mod plan;
mod work;

pub use device_meta::{Capacity, MAX_DEVICE_SPLITS};
pub use error::GrpcollError;
pub use meta::{GroupCastMeta, GroupReduceMeta, Transfer};

use cudarc::driver::CudaStream;
use meta::{Desc, Kind};
use plan::{Core, MetaSource};
use std::sync::Arc;
use weft_kernels::abi::{weft_kernel_barrier_view, WEFT_GRPCOLL_MAX_TENSORS};
use weft_pgl::Bootstrap;
use weft_pgl::{DType, Pgl, PglElement};
use weft_sync::ErrorSlot;

pub use weft_pgl::nccl::Communicator;

/// Default number of SMs (one block each) the native kernels use, capped by the device's count.
/// 96: chosen when the pulling GroupReduce was latency-bound (two H100s: 91–183 GB/s from 24 SMs,
/// 287–324 from 96). Since the ring of bulk buffers, 24 SMs take about as long as 96 for most
/// reduces on two H200s (median 1.00×) but up to 1.9× as long for the many-item varlen reduces, and
/// the casts 1.01–1.16× as long (2.1× through a narrower dtype) (README.md, "Measured"). Pass
/// `Options::sms` to leave SMs to compute.
pub const DEFAULT_SMS: u32 = 96;
/// Tensors one plan moves together (packed transfer).
pub const MAX_TENSORS: usize = WEFT_GRPCOLL_MAX_TENSORS as usize;

/// Plan options. Every rank must pass the same values (checked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// SMs (blocks) for the native kernels; `None`: min(DEFAULT_SMS, the device's SMs / the ranks
    /// sharing one GPU, 1 unless WEFT_SHARED_GPU=1).
    pub sms: Option<u32>,
    /// The dtype rows cross NVLink in; `None`: the data dtype. Narrower than the data (bf16 or f16
    /// for f32 data; bf16, f16 or f32 for f64 data) halves or quarters the bytes moved, at the
    /// cost of rounding every value to it once.
    pub comm_dtype: Option<DType>,
    /// GroupReduce only: reduce into the existing output instead of overwriting it (`Sum`: out +
    /// Σ; `Avg`: out + Σ / n; `Lse`: the existing output and output lse take part in the
    /// combination as one more source).
    pub accumulate: bool,
}

/// GroupReduce's reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the number of sources of the split.
    Avg,
    /// Log-sum-exp combination, as in attention: with f32 lse tensors of `rows × lse_per_row`
    /// (each lse value covers `row_elems / lse_per_row` contiguous elements of its row),
    /// `lse = log Σ_k exp(lse_k)` and `out = Σ_k exp(lse_k − lse) · out_k`, computed
    /// max-subtracted. Sources whose lse is −∞ contribute nothing; if all are, lse = −∞ and out = 0.
    Lse {
        lse_per_row: usize,
    },
}

impl ReduceOp {
    pub(crate) fn code(self) -> i32 {
        use weft_kernels::abi::{WEFT_GRPCOLL_OP_AVG, WEFT_GRPCOLL_OP_LSE, WEFT_GRPCOLL_OP_SUM};
        (match self {
            ReduceOp::Sum => WEFT_GRPCOLL_OP_SUM,
            ReduceOp::Avg => WEFT_GRPCOLL_OP_AVG,
            ReduceOp::Lse { .. } => WEFT_GRPCOLL_OP_LSE,
        }) as i32
    }
    pub(crate) fn lse_per_row(self) -> usize {
        match self {
            ReduceOp::Lse { lse_per_row } => lse_per_row,
            _ => 0,
        }
    }
}

macro_rules! common_methods {
    () => {
        /// Tensor 0's input: this rank's input rows (`meta.input_rows` of them, `row_elems` each)
        /// live at the start of this PGL; write them before `run` (stream order, or any order
        /// completed before it).
        pub fn input(&self) -> &Pgl<T> {
            &self.core.tensors[0].input
        }
        /// Tensor 0's output: this rank's output rows (`meta.output_rows`) at its start after `run`.
        pub fn output(&self) -> &Pgl<T> {
            &self.core.tensors[0].output
        }
        /// Tensor `t`'s input (packed plans have up to [`MAX_TENSORS`]).
        pub fn input_of(&self, t: usize) -> &Pgl<T> {
            &self.core.tensors[t].input
        }
        /// Tensor `t`'s output.
        pub fn output_of(&self, t: usize) -> &Pgl<T> {
            &self.core.tensors[t].output
        }
        /// Tensors moved together by this plan.
        pub fn tensors(&self) -> usize {
            self.core.tensors.len()
        }
        /// Tensor 0's row width in elements.
        pub fn row_elems(&self) -> usize {
            self.core.tensors[0].row_elems
        }
        /// The dtype rows cross NVLink in.
        pub fn comm_dtype(&self) -> DType {
            self.core.comm
        }
        /// SMs (blocks) the native kernel uses.
        pub fn sms(&self) -> u32 {
            self.core.sms
        }
        /// Every rank's matched transfers (the same list on every rank).
        pub fn transfers(&self) -> &[Transfer] {
            &self.core.transfers
        }
        /// Native path: one launch on the plan's stream (convert, barrier, transfer, barrier); no
        /// host synchronisation. Every rank must call it the same number of times.
        pub fn run(&mut self) -> Result<(), GrpcollError> {
            self.core.run_native().map_err(GrpcollError::from_anyhow)
        }
        /// Makes every later native launch arrive once, at its start, on a KernelBarrier
        /// (`weft_barrier::KernelBarrier::view()`: expect one arrival per `run`); `None` stops it.
        /// The counter must outlive those launches.
        pub fn set_kernel_barrier(&mut self, view: Option<weft_kernel_barrier_view>) {
            self.core.arrive = view.map_or(0, |v| v.counter);
        }
        /// AlltoAll-v baseline (convert, range-gather, NCCL grouped send/recv, range-scatter or
        /// scatter-reduce) on the plan's stream, with the same inputs, outputs and options.
        pub fn run_baseline(&mut self, comm: &Communicator) -> Result<(), GrpcollError> {
            self.core
                .run_baseline(comm)
                .map_err(GrpcollError::from_anyhow)
        }
        /// The error slot of the native kernel's bounded waits (e.g. for `weft_sync::sync_checked`).
        pub fn error_slot(&self) -> &ErrorSlot {
            self.core.counters.slot()
        }
        /// Waits for the plan's stream; a timed-out barrier becomes an error naming rank and coordinate.
        /// With device metadata, a layout the kernel rejected (nothing moved) is an error here too.
        pub fn synchronize(&self) -> Result<(), GrpcollError> {
            weft_sync::sync_checked(&self.core.stream, &[self.core.counters.slot()])
                .map_err(|e| GrpcollError::from_anyhow(e.into()))?;
            self.core.check_layout().map_err(GrpcollError::from_anyhow)
        }
        /// Device metadata: the PGL (u32 words, layout in [`Capacity`]'s module docs) this rank
        /// fills before each `run`, in stream order; None for host metadata.
        pub fn device_meta(&self) -> Option<&Pgl<u32>> {
            self.core.device.as_ref().map(|d| &d.meta)
        }
        /// Collective: frees the buffers and counters on every rank.
        pub fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GrpcollError> {
            self.core.free(rdzv).map_err(GrpcollError::from_anyhow)
        }
    };
}

/// What [`GroupCast`] and [`GroupReduce`] plans share, for code that drives either (the methods
/// of the same names on each).
pub trait GroupCollective<T: PglElement> {
    fn input(&self) -> &Pgl<T>;
    fn output(&self) -> &Pgl<T>;
    fn sms(&self) -> u32;
    fn comm_dtype(&self) -> DType;
    fn run(&mut self) -> Result<(), GrpcollError>;
    fn run_baseline(&mut self, comm: &Communicator) -> Result<(), GrpcollError>;
    fn synchronize(&self) -> Result<(), GrpcollError>;
    fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GrpcollError>;
}

macro_rules! group_collective {
    ($plan:ident) => {
        impl<T: PglElement> GroupCollective<T> for $plan<T> {
            fn input(&self) -> &Pgl<T> {
                $plan::input(self)
            }
            fn output(&self) -> &Pgl<T> {
                $plan::output(self)
            }
            fn sms(&self) -> u32 {
                $plan::sms(self)
            }
            fn comm_dtype(&self) -> DType {
                $plan::comm_dtype(self)
            }
            fn run(&mut self) -> Result<(), GrpcollError> {
                $plan::run(self)
            }
            fn run_baseline(&mut self, comm: &Communicator) -> Result<(), GrpcollError> {
                $plan::run_baseline(self, comm)
            }
            fn synchronize(&self) -> Result<(), GrpcollError> {
                $plan::synchronize(self)
            }
            fn free(self, rdzv: &mut dyn Bootstrap) -> Result<(), GrpcollError> {
                $plan::free(self, rdzv)
            }
        }
    };
}
group_collective!(GroupCast);
group_collective!(GroupReduce);

/// A GroupCast plan (collective). Any element type when the communication dtype is the data's
/// (rows are copied as bytes); f32 / f64 data through a narrower communication dtype.
///
/// # Examples
///
/// A ring: every rank sends its 4 rows of 1024 f32 to the next rank.
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
/// use weft_grpcoll::{GroupCast, GroupCastMeta, Options};
/// let (rank, world) = (rdzv.rank(), rdzv.world());
/// let meta = GroupCastMeta {
///     input_rows: 4,
///     input_split_rows: vec![4],
///     dst_indices: vec![vec![(rank + 1) % world]], // input split 0 goes to the next rank
///     output_rows: 4,
///     output_split_rows: vec![4],
///     src_index: vec![(rank + world - 1) % world], // output split 0 comes from the previous one
/// };
/// let stream = ctx.new_stream()?;
/// // Collective: checks every rank's metadata against the others', allocates input and output.
/// let mut cast = GroupCast::<f32>::new(&mut rdzv, &stream, &meta, 1024, Options::default())?;
/// cast.input().copy_from_host(&vec![rank as f32; 4 * 1024])?;
/// cast.run()?;
/// cast.synchronize()?;
/// let mut got = vec![0f32; 4 * 1024];
/// cast.output().copy_to_host(&mut got)?; // the previous rank's rows
/// cast.free(&mut rdzv)?;
/// # Ok(()) }
/// ```
pub struct GroupCast<T: PglElement> {
    core: Core<T>,
}

impl<T: PglElement> GroupCast<T> {
    /// Collective: validates `meta` (locally, then against every rank's), allocates the input and
    /// output PGLs (rows = the largest input / output across ranks), and uploads this rank's work.
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        meta: &GroupCastMeta,
        row_elems: usize,
        opts: Options,
    ) -> Result<Self, GrpcollError> {
        Self::new_packed(rdzv, stream, meta, &[row_elems], opts)
    }

    /// Collective, as [`GroupCast::new`], for 1 to [`MAX_TENSORS`] tensors of these row widths
    /// that share the metadata (e.g. K and V): one launch moves them all.
    pub fn new_packed(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        meta: &GroupCastMeta,
        row_elems: &[usize],
        opts: Options,
    ) -> Result<Self, GrpcollError> {
        Ok(Self {
            core: Core::build(
                Kind::Cast,
                rdzv,
                stream,
                MetaSource::Host(Desc::from(meta)),
                row_elems,
                ReduceOp::Sum,
                opts,
            )
            .map_err(GrpcollError::from_anyhow)?,
        })
    }

    /// Collective: a plan whose metadata lives on the GPU, sized by `cap` (every rank the same).
    /// Before each `run`, write this rank's metadata into [`device_meta`](Self::device_meta)
    /// (or with [`write_device_meta`](Self::write_device_meta)); the run matches it on the
    /// GPU. The AlltoAll-v baseline needs host metadata and is refused.
    pub fn new_device(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        cap: Capacity,
        row_elems: &[usize],
        opts: Options,
    ) -> Result<Self, GrpcollError> {
        Ok(Self {
            core: Core::build(
                Kind::Cast,
                rdzv,
                stream,
                MetaSource::Device(cap),
                row_elems,
                ReduceOp::Sum,
                opts,
            )
            .map_err(GrpcollError::from_anyhow)?,
        })
    }

    /// Device metadata from host metadata (checked against the capacity), copied in stream order.
    pub fn write_device_meta(&self, meta: &GroupCastMeta) -> Result<(), GrpcollError> {
        self.core
            .write_device_meta(&Desc::from(meta))
            .map_err(GrpcollError::from_anyhow)
    }
    common_methods!();
}

/// A GroupReduce plan (collective). Data dtypes bf16, f16, f32, f64; fp32 accumulation (fp64 for
/// f64).
pub struct GroupReduce<T: PglElement> {
    core: Core<T>,
}

impl<T: PglElement> GroupReduce<T> {
    /// Collective, as [`GroupCast::new`]; with [`ReduceOp::Lse`] it also allocates the f32 lse
    /// PGLs (`input_lse()`, `output_lse()`, `lse_per_row` columns).
    pub fn new(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        meta: &GroupReduceMeta,
        row_elems: usize,
        op: ReduceOp,
        opts: Options,
    ) -> Result<Self, GrpcollError> {
        Self::new_packed(rdzv, stream, meta, &[row_elems], op, opts)
    }

    /// Collective, as [`GroupReduce::new`], for 1 to [`MAX_TENSORS`] tensors sharing the
    /// metadata (op `Lse` takes one).
    pub fn new_packed(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        meta: &GroupReduceMeta,
        row_elems: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> Result<Self, GrpcollError> {
        Ok(Self {
            core: Core::build(
                Kind::Reduce,
                rdzv,
                stream,
                MetaSource::Host(Desc::from(meta)),
                row_elems,
                op,
                opts,
            )
            .map_err(GrpcollError::from_anyhow)?,
        })
    }

    /// Collective: a plan whose metadata lives on the GPU, as [`GroupCast::new_device`].
    pub fn new_device(
        rdzv: &mut dyn Bootstrap,
        stream: &Arc<CudaStream>,
        cap: Capacity,
        row_elems: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> Result<Self, GrpcollError> {
        Ok(Self {
            core: Core::build(
                Kind::Reduce,
                rdzv,
                stream,
                MetaSource::Device(cap),
                row_elems,
                op,
                opts,
            )
            .map_err(GrpcollError::from_anyhow)?,
        })
    }

    /// Device metadata from host metadata (checked against the capacity), copied in stream order.
    pub fn write_device_meta(&self, meta: &GroupReduceMeta) -> Result<(), GrpcollError> {
        self.core
            .write_device_meta(&Desc::from(meta))
            .map_err(GrpcollError::from_anyhow)
    }
    common_methods!();
    pub fn op(&self) -> ReduceOp {
        self.core.op
    }
    /// With [`ReduceOp::Lse`]: this rank's input lse (`input_rows × lse_per_row` f32).
    pub fn input_lse(&self) -> Option<&Pgl<f32>> {
        self.core.input_lse.as_ref()
    }
    /// With [`ReduceOp::Lse`]: the combined lse after `run` (read, too, when accumulating).
    pub fn output_lse(&self) -> Option<&Pgl<f32>> {
        self.core.output_lse.as_ref()
    }
}
