//! weft-grpcoll: native intranode GroupCast / GroupReduce over pgl peer buffers, with an NCCL
//! AlltoAll-v baseline behind the same plan. See README.md.
//!
//! - [`GroupCast`]: input split i goes to every rank of `dst_indices[i]` (push: the sender reads
//!   each split once and writes it to every destination's output at its final rows).
//! - [`GroupReduce`]: output split j is the sum / average / lse-combination of the partials of
//!   every rank in `src_indices[j]` (pull: the receiver reads its sources' partials and writes the
//!   reduced rows once), fp32 accumulation (fp64 for f64 data), optionally into the existing output.
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
mod device_meta;
mod kernel_choice;
mod meta;
pub mod pattern;
mod work;

pub use device_meta::{Capacity, MAX_DEVICE_SPLITS};
pub use meta::{GroupCastMeta, GroupReduceMeta, Transfer};

use anyhow::{bail, Context};
use baseline::Staging;
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use kernel_choice::{pull_kernel_name, push_kernel_name};
use meta::{Desc, Header, Kind};
use std::sync::Arc;
use weft_kernels::abi::{
    weft_grpcoll_layout_params, weft_grpcoll_layout_report, weft_grpcoll_params,
    weft_grpcoll_tensor, weft_kernel_barrier_view, weft_pgl_view, WEFT_GRPCOLL_ACCUMULATE,
    WEFT_GRPCOLL_CONVERT, WEFT_GRPCOLL_MAX_TENSORS, WEFT_GRPCOLL_SYNCED, WEFT_GRPCOLL_TRANSFER,
};
use weft_kernels::cubins;
use weft_pgl::rendezvous::Rendezvous;
use weft_pgl::{agree, Backend, DType, Pgl, PglElement, Shape};
use weft_sync::{Counters, ErrorSlot, WaitBudget};
use work::{chunk_rows, pull_items, push_items, BaselineLayout, Items};

pub use weft_pgl::nccl::Communicator;

/// Default number of SMs (one block each) the native kernels use, capped by the device's count.
pub const DEFAULT_SMS: u32 = 24;
/// Tensors one plan moves together (packed transfer).
pub const MAX_TENSORS: usize = WEFT_GRPCOLL_MAX_TENSORS as usize;

const PUSH_THREADS: u32 = 1024;
const PULL_THREADS: u32 = 512;

/// Plan options. Every rank must pass the same values (checked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// SMs (blocks) for the native kernels; `None`: min(DEFAULT_SMS, the device's SMs).
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
    fn code(self) -> i32 {
        use weft_kernels::abi::{WEFT_GRPCOLL_OP_AVG, WEFT_GRPCOLL_OP_LSE, WEFT_GRPCOLL_OP_SUM};
        (match self {
            ReduceOp::Sum => WEFT_GRPCOLL_OP_SUM,
            ReduceOp::Avg => WEFT_GRPCOLL_OP_AVG,
            ReduceOp::Lse { .. } => WEFT_GRPCOLL_OP_LSE,
        }) as i32
    }
    fn lse_per_row(self) -> usize {
        match self {
            ReduceOp::Lse { lse_per_row } => lse_per_row,
            _ => 0,
        }
    }
}

fn op_name(code: u64) -> &'static str {
    match code {
        0 => "sum",
        1 => "avg",
        2 => "lse",
        3 => "copy",
        _ => "?",
    }
}

fn dtype_name(code: u64) -> String {
    DType::from_code(code as u8).map_or(format!("code {code}"), |d| d.name().to_string())
}

/// How the native kernel moves rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// GroupCast in the data dtype: the sender writes into every destination.
    Push,
    /// GroupReduce, or GroupCast through a narrower comm dtype: the receiver reads its sources.
    Pull,
}

/// One tensor of a plan.
struct Tensor<T: PglElement> {
    row_elems: usize,
    input: Pgl<T>,
    output: Pgl<T>,
    /// This rank's input in the communication dtype (when it differs from the data's).
    staging: Option<Pgl<u8>>,
}

/// What both collectives share: metadata, buffers, counters, kernels and work lists.
struct Core<T: PglElement> {
    kind: Kind,
    path: Path,
    rank: usize,
    world: usize,
    op: ReduceOp,
    opts: Options,
    /// The communication dtype (the data dtype unless a narrower one was asked for).
    comm: DType,
    stream: Arc<CudaStream>,
    sms: u32,
    device_sms: u32,
    input_rows: usize,
    tensors: Vec<Tensor<T>>,
    input_lse: Option<Pgl<f32>>,
    output_lse: Option<Pgl<f32>>,
    counters: Counters,
    native: CudaFunction,
    native_items: Items,
    /// Push kernel at the comm row widths (the baseline's gathers, and a push cast's scatter);
    /// and at the lse row width.
    copy_comm: CudaFunction,
    copy_lse: Option<CudaFunction>,
    gather_items: Items,
    scatter_items: Items,
    layout: BaselineLayout,
    transfers: Vec<Transfer>,
    staging: Option<Staging>,
    /// KernelBarrier counter (device address) each native launch arrives on; 0: none.
    arrive: u64,
    /// Device-resident metadata (the layout kernel's buffers), or None for host metadata.
    device: Option<DeviceMeta>,
}

/// Where a plan's metadata comes from.
enum MetaSource {
    Host(Desc),
    Device(Capacity),
}

/// A device-metadata plan's buffers: the metadata PGL the caller fills, the layout kernel's
/// scratch, its report, and the item count it writes for the transfer kernel.
struct DeviceMeta {
    cap: Capacity,
    meta: Pgl<u32>,
    scratch: CudaSlice<u32>,
    report: CudaSlice<u32>,
    nitems: CudaSlice<u32>,
    layout: CudaFunction,
    max_items: usize,
    chunk: usize,
}

/// u32 words of one rank's device metadata.
fn unsafe_meta_words(cap: usize) -> usize {
    // SAFETY: a pure function of its argument.
    unsafe { weft_kernels::abi::weft_grpcoll_meta_words(cap as u32) as usize }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Cast => "group_cast",
        Kind::Reduce => "group_reduce",
    }
}

/// Local checks of the plan's arguments (before anything is allocated or exchanged).
fn validate_args(
    kind: Kind,
    data: DType,
    row_elems: &[usize],
    op: ReduceOp,
    opts: &Options,
    sms: u32,
    device_sms: u32,
) -> anyhow::Result<(Path, DType, Option<String>)> {
    let what = kind_name(kind);
    if row_elems.is_empty() || row_elems.len() > MAX_TENSORS {
        bail!(
            "{what}: packed transfer takes 1 to {MAX_TENSORS} tensors, got {}",
            row_elems.len()
        );
    }
    for (t, &e) in row_elems.iter().enumerate() {
        if e == 0 || e * data.size() > u32::MAX as usize {
            bail!("{what}: tensor {t}: row_elems {e} must be at least 1 and a row at most 4 GiB");
        }
    }
    if sms == 0 || sms > device_sms {
        bail!("{what}: {sms} SMs requested; the device has {device_sms}");
    }
    if kind == Kind::Cast && opts.accumulate {
        bail!("group_cast: accumulate is a GroupReduce option (a cast overwrites its output rows)");
    }
    let comm = opts.comm_dtype.unwrap_or(data);
    let lse_per_row = op.lse_per_row();
    if let ReduceOp::Lse { lse_per_row } = op {
        if row_elems.len() > 1 {
            bail!(
                "group_reduce: op lse takes one tensor (its lse), got {}",
                row_elems.len()
            );
        }
        if lse_per_row == 0 || row_elems[0] % lse_per_row != 0 {
            bail!(
                "group_reduce: lse_per_row {lse_per_row} must divide row_elems {}",
                row_elems[0]
            );
        }
    }
    let path = if kind == Kind::Reduce || comm != data {
        Path::Pull
    } else {
        Path::Push
    };
    let native = match path {
        Path::Push => None,
        Path::Pull => {
            let groups: Vec<usize> = row_elems
                .iter()
                .map(|&e| e.checked_div(lse_per_row).unwrap_or(e))
                .collect();
            Some(pull_kernel_name(what, comm, data, &groups)?)
        }
    };
    Ok((path, comm, native))
}

impl<T: PglElement> Core<T> {
    fn build(
        kind: Kind,
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        source: MetaSource,
        row_elems: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<Self> {
        let (rank, world) = (rdzv.rank(), rdzv.world());
        let ctx = stream.context().clone();
        let device_sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let sms = opts.sms.unwrap_or(DEFAULT_SMS.min(device_sms));
        let data = T::DTYPE;
        let lse_per_row = op.lse_per_row();
        // Device metadata: the plan is sized by the capacity; the splits come with each run.
        let (desc, capacity) = match source {
            MetaSource::Host(d) => (d, None),
            MetaSource::Device(c) => (
                Desc {
                    input_rows: c.max_input_rows,
                    input_split_rows: vec![],
                    input_peers: vec![],
                    output_rows: c.max_output_rows,
                    output_split_rows: vec![],
                    output_peers: vec![],
                },
                Some(c),
            ),
        };
        // Local checks, agreed so that every rank fails together.
        let local = match &capacity {
            None => meta::validate_local(kind, &desc, world),
            Some(c) => c.validate(kind_name(kind)),
        }
        .and_then(|()| validate_args(kind, data, row_elems, op, &opts, sms, device_sms));
        let (path, comm, pull_name) = agree(
            rdzv,
            &format!("{} plan (local metadata)", kind_name(kind)),
            local,
        )?;

        // Cross-rank: every rank's metadata, the same checks everywhere.
        let header = Header {
            kind: kind as u64,
            dtype: data as u8 as u64,
            comm_dtype: comm as u8 as u64,
            row_elems: [0, 1, 2].map(|t| row_elems.get(t).copied().unwrap_or(0) as u64),
            op: if kind == Kind::Reduce {
                op.code() as u64
            } else {
                0
            },
            lse_per_row: lse_per_row as u64,
            accumulate: opts.accumulate as u64,
            sms: sms as u64,
            device_splits: capacity.map_or(0, |c| c.max_splits as u64),
        };
        let all = rdzv
            .all_gather(&meta::encode(&header, &desc))
            .context("all-gathering grpcoll metadata")?;
        let decoded = all
            .iter()
            .map(|b| meta::decode(b))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let headers: Vec<Header> = decoded.iter().map(|(h, _)| *h).collect();
        meta::check_headers(kind, &headers, |f, v| match f {
            "collective" => (if v == 1 { "group_cast" } else { "group_reduce" }).to_string(),
            "dtype" | "communication dtype" => dtype_name(v),
            "reduce op" => op_name(v).to_string(),
            _ => v.to_string(),
        })?;
        let descs: Vec<Desc> = decoded.into_iter().map(|(_, d)| d).collect();
        let transfers = meta::match_global(kind, &descs)?;

        let max_in = descs.iter().map(|d| d.input_rows).max().unwrap_or(0).max(1);
        let max_out = descs
            .iter()
            .map(|d| d.output_rows)
            .max()
            .unwrap_or(0)
            .max(1);
        let budget = WaitBudget::default_for(&ctx)?;
        let shape = |rows: usize, cols: usize| Shape::new(1, 1, rows as u32, cols as u32);
        let mut tensors = Vec::new();
        for (t, &e) in row_elems.iter().enumerate() {
            let input = Pgl::<T>::alloc(rdzv, &ctx, shape(max_in, e), Backend::default())
                .with_context(|| format!("allocating the grpcoll input of tensor {t}"))?;
            let output = Pgl::<T>::alloc(rdzv, &ctx, shape(max_out, e), Backend::default())
                .with_context(|| format!("allocating the grpcoll output of tensor {t}"))?;
            let staging = if comm != data {
                Some(
                    Pgl::<u8>::alloc(
                        rdzv,
                        &ctx,
                        shape(max_in, e * comm.size()),
                        Backend::default(),
                    )
                    .with_context(|| format!("allocating the grpcoll staging of tensor {t}"))?,
                )
            } else {
                None
            };
            tensors.push(Tensor {
                row_elems: e,
                input,
                output,
                staging,
            });
        }
        let (input_lse, output_lse) = if lse_per_row > 0 {
            (
                Some(Pgl::<f32>::alloc(
                    rdzv,
                    &ctx,
                    shape(max_in, lse_per_row),
                    Backend::default(),
                )?),
                Some(Pgl::<f32>::alloc(
                    rdzv,
                    &ctx,
                    shape(max_out, lse_per_row),
                    Backend::default(),
                )?),
            )
        } else {
            (None, None)
        };
        let counters = Counters::alloc(rdzv, &ctx, Shape::new(1, 1, 4, sms), budget)?;

        let loaded = (|| -> anyhow::Result<_> {
            let module = cubins::GRPCOLL_GRPCOLL
                .load(&ctx)
                .context("loading kernels/grpcoll/grpcoll.cu")?;
            let comm_bytes: Vec<usize> = row_elems.iter().map(|e| e * comm.size()).collect();
            let copy_comm = module.load_function(&push_kernel_name(&comm_bytes))?;
            let copy_lse = match lse_per_row {
                0 => None,
                n => Some(module.load_function(&push_kernel_name(&[n * 4]))?),
            };
            let native = match &pull_name {
                Some(name) => module.load_function(name)?,
                None => copy_comm.clone(),
            };
            let layout = match capacity {
                None => None,
                Some(_) => Some(
                    cubins::GRPCOLL_LAYOUT
                        .load(&ctx)
                        .context("loading kernels/grpcoll/layout.cu")?
                        .load_function("weft_grpcoll_layout")?,
                ),
            };
            Ok((native, copy_comm, copy_lse, layout))
        })();
        let (native, copy_comm, copy_lse, layout) = agree(rdzv, "grpcoll plan (kernels)", loaded)?;

        // Work lists: rows per item from the bytes of one row of every tensor.
        let chunk = chunk_rows(row_elems.iter().sum::<usize>() * data.size());
        let device = match (capacity, layout) {
            (Some(cap), Some(layout)) => {
                let words = unsafe_meta_words(cap.max_splits);
                let meta = Pgl::<u32>::alloc(rdzv, &ctx, shape(1, words), Backend::default())
                    .context("allocating the grpcoll device metadata")?;
                let max_items = cap.max_items(chunk);
                let buffers = (|| -> anyhow::Result<_> {
                    // SAFETY: a pure function of its arguments.
                    let scratch = unsafe {
                        weft_kernels::abi::weft_grpcoll_layout_scratch_words(
                            cap.max_splits as u32,
                            world as u32,
                        )
                    };
                    Ok((
                        stream.alloc_zeros::<u32>(scratch as usize)?,
                        stream.alloc_zeros::<u32>(
                            std::mem::size_of::<weft_grpcoll_layout_report>() / 4,
                        )?,
                        stream.alloc_zeros::<u32>(1)?,
                    ))
                })();
                let (scratch, report, nitems) =
                    agree(rdzv, "grpcoll plan (layout buffers)", buffers)?;
                Some(DeviceMeta {
                    cap,
                    meta,
                    scratch,
                    report,
                    nitems,
                    layout,
                    max_items,
                    chunk,
                })
            }
            _ => None,
        };
        let d = &descs[rank];
        let native_items = match path {
            Path::Push => push_items(&transfers, rank, d.input_split_rows.len(), chunk),
            Path::Pull => pull_items(&transfers, rank, d.output_split_rows.len(), chunk, |t| {
                t.src_row
            }),
        };
        let layout = BaselineLayout::new(&transfers, rank, world, chunk);
        let scatter = match path {
            Path::Push => layout.push_scatter(&transfers, rank, chunk),
            Path::Pull => layout.pull_scatter(&transfers, rank, d.output_split_rows.len(), chunk),
        };
        let native_items = match &device {
            // The layout kernel writes up to max_items items here on every run.
            Some(dm) => vec![weft_kernels::abi::weft_grpcoll_item::default(); dm.max_items],
            None => native_items,
        };
        let uploaded = (|| -> anyhow::Result<_> {
            let r = (
                Items::upload(stream, &native_items)?,
                Items::upload(stream, &layout.gather)?,
                Items::upload(stream, &scatter)?,
            );
            stream.synchronize()?;
            Ok(r)
        })();
        let (native_items, gather_items, scatter_items) =
            agree(rdzv, "grpcoll plan (work lists)", uploaded)?;
        Ok(Self {
            kind,
            path,
            rank,
            world,
            op,
            opts,
            comm,
            stream: stream.clone(),
            sms,
            device_sms,
            input_rows: d.input_rows,
            tensors,
            input_lse,
            output_lse,
            counters,
            native,
            native_items,
            copy_comm,
            copy_lse,
            gather_items,
            scatter_items,
            layout,
            transfers,
            staging: None,
            arrive: 0,
            device,
        })
    }

    fn write_device_meta(&self, desc: &Desc) -> anyhow::Result<()> {
        let Some(dm) = &self.device else {
            bail!(
                "{}: this plan was built with host metadata (use new_device for device metadata)",
                kind_name(self.kind)
            );
        };
        let words = device_meta::encode(self.kind, desc, &dm.cap, self.world)?;
        self.stream.context().bind_to_thread()?;
        // SAFETY: copies words.len() u32 into this rank's metadata buffer, which holds exactly as
        // many; from pageable memory the driver stages the data before returning.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dm.meta.local_ptr(),
                words.as_ptr().cast(),
                words.len() * 4,
                self.stream.cu_stream(),
            )
        }
        .result()?;
        Ok(())
    }

    fn converts(&self) -> bool {
        self.comm != T::DTYPE
    }

    fn op_code(&self) -> i32 {
        match (self.kind, self.path) {
            (Kind::Cast, Path::Pull) => weft_kernels::abi::WEFT_GRPCOLL_OP_COPY as i32,
            _ => self.op.code(),
        }
    }

    /// Parameters with every tensor's views as given, no flags, no barrier; launches adjust them.
    fn params(
        &self,
        views: &[(weft_pgl_view, weft_pgl_view, usize)],
        items: &Items,
    ) -> weft_grpcoll_params {
        let mut p = weft_grpcoll_params {
            items: items.buf.device_ptr(&self.stream).0,
            nitems: items.count,
            ntensors: views.len() as u32,
            lse_per_row: self.op.lse_per_row() as u32,
            op: self.op_code(),
            ..Default::default()
        };
        for (t, &(input, output, row_bytes)) in views.iter().enumerate() {
            p.tensor[t] = weft_grpcoll_tensor {
                input,
                output,
                row_elems: self.tensors[t].row_elems as u32,
                row_bytes: row_bytes as u32,
                convert_rows: self.input_rows as u32,
                ..Default::default()
            };
            if let Some(s) = &self.tensors[t].staging {
                p.tensor[t].staging = s.view();
            }
        }
        p
    }

    /// The data views of every tensor: (input, output, data row bytes).
    fn data_views(&self) -> Vec<(weft_pgl_view, weft_pgl_view, usize)> {
        self.tensors
            .iter()
            .map(|t| {
                (
                    t.input.view(),
                    t.output.view(),
                    t.row_elems * T::DTYPE.size(),
                )
            })
            .collect()
    }

    fn launch(&self, f: &CudaFunction, p: &weft_grpcoll_params, grid: u32) -> anyhow::Result<()> {
        let pull = std::ptr::eq(f, &self.native) && self.path == Path::Pull;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (if pull { PULL_THREADS } else { PUSH_THREADS }, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the params' views and work lists point at buffers this plan owns (or peers'
        // mapped buffers of the same shapes), alive until the plan is freed; the items stay in
        // bounds of them by construction (validated metadata).
        unsafe { self.stream.launch_builder(f).arg(p).launch(cfg)? };
        Ok(())
    }

    /// The native kernel: (convert,) barrier, push / pull, barrier.
    fn run_native(&mut self) -> anyhow::Result<()> {
        let base = self.counters.begin(1);
        let mut p = self.params(&self.data_views(), &self.native_items);
        if let (Some(il), Some(ol)) = (&self.input_lse, &self.output_lse) {
            p.input_lse = il.view();
            p.output_lse = ol.view();
        }
        p.bar = self.counters.device()?;
        p.epoch = base + 1;
        p.flags = WEFT_GRPCOLL_SYNCED | WEFT_GRPCOLL_TRANSFER;
        if self.converts() {
            p.flags |= WEFT_GRPCOLL_CONVERT;
        }
        if self.opts.accumulate {
            p.flags |= WEFT_GRPCOLL_ACCUMULATE;
        }
        p.arrive = weft_kernel_barrier_view {
            counter: self.arrive as *mut i32,
        };
        if let Some(dm) = &self.device {
            let lp = weft_grpcoll_layout_params {
                meta: dm.meta.view(),
                bar: p.bar,
                scratch: dm.scratch.device_ptr(&self.stream).0,
                items: p.items,
                nitems: dm.nitems.device_ptr(&self.stream).0,
                report: dm.report.device_ptr(&self.stream).0,
                epoch: p.epoch,
                cap: dm.cap.max_splits as u32,
                max_items: dm.max_items as u32,
                max_input_rows: dm.cap.max_input_rows as u32,
                max_output_rows: dm.cap.max_output_rows as u32,
                chunk: dm.chunk as u32,
                pull: (self.path == Path::Pull) as u32,
                reduce: (self.kind == Kind::Reduce) as u32,
                reserved: 0,
            };
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: every address is a buffer of this plan sized for its capacity (the scratch by
            // weft_grpcoll_layout_scratch_words, the items by max_items), alive until it is freed.
            unsafe {
                self.stream
                    .launch_builder(&dm.layout)
                    .arg(&lp)
                    .launch(cfg)?
            };
            p.nitems_at = lp.nitems;
        }
        self.launch(&self.native, &p, self.sms)
    }

    /// Device metadata: the layout kernel's verdict since the last check (cleared when read).
    fn check_layout(&self) -> anyhow::Result<()> {
        let Some(dm) = &self.device else {
            return Ok(());
        };
        let words = self.stream.clone_dtoh(&dm.report)?;
        self.stream.synchronize()?;
        let r = weft_grpcoll_layout_report {
            code: words[0],
            side: words[1],
            a: words[2] as i32,
            b: words[3] as i32,
            a_split: words[4],
            b_split: words[5],
            expected: words[6],
            observed: words[7],
        };
        match device_meta::describe(self.kind, &r) {
            None => Ok(()),
            Some(text) => {
                // Cleared in place for the next run (CudaSlice::clone would copy the buffer).
                let ptr = dm.report.device_ptr(&self.stream).0;
                // SAFETY: zeroes the report's own words; the stream is idle (synchronised above).
                unsafe { sys::cuMemsetD32Async(ptr, 0, words.len(), self.stream.cu_stream()) }
                    .result()?;
                self.stream.synchronize()?;
                bail!("rank {}: {text}", self.rank)
            }
        }
    }

    fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()> {
        let synced = self.stream.synchronize().map_err(anyhow::Error::from);
        agree(rdzv, "grpcoll plan free (drain)", synced)?;
        drop(self.staging);
        for t in self.tensors {
            t.input.free(rdzv)?;
            t.output.free(rdzv)?;
            if let Some(s) = t.staging {
                s.free(rdzv)?;
            }
        }
        if let Some(p) = self.input_lse {
            p.free(rdzv)?;
        }
        if let Some(p) = self.output_lse {
            p.free(rdzv)?;
        }
        if let Some(dm) = self.device {
            dm.meta.free(rdzv)?;
        }
        self.counters.free(rdzv)
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
        pub fn run(&mut self) -> anyhow::Result<()> {
            self.core.run_native()
        }
        /// Makes every later native launch arrive once, at its start, on a KernelBarrier
        /// (`weft_barrier::KernelBarrier::view()`: expect one arrival per `run`); `None` stops it.
        /// The counter must outlive those launches.
        pub fn set_kernel_barrier(&mut self, view: Option<weft_kernel_barrier_view>) {
            self.core.arrive = view.map_or(0, |v| v.counter as u64);
        }
        /// AlltoAll-v baseline (convert, range-gather, NCCL grouped send/recv, range-scatter or
        /// scatter-reduce) on the plan's stream, with the same inputs, outputs and options.
        pub fn run_baseline(&mut self, comm: &Communicator) -> anyhow::Result<()> {
            self.core.run_baseline(comm)
        }
        /// The error slot of the native kernel's bounded waits (e.g. for `weft_sync::sync_checked`).
        pub fn error_slot(&self) -> &ErrorSlot {
            self.core.counters.slot()
        }
        /// Waits for the plan's stream; a timed-out barrier becomes an error naming rank and coordinate.
        /// With device metadata, a layout the kernel rejected (nothing moved) is an error here too.
        pub fn synchronize(&self) -> anyhow::Result<()> {
            weft_sync::sync_checked(&self.core.stream, &[self.core.counters.slot()])?;
            self.core.check_layout()
        }
        /// Device metadata: the PGL (u32 words, layout in [`Capacity`]'s module docs) this rank
        /// fills before each `run`, in stream order; None for host metadata.
        pub fn device_meta(&self) -> Option<&Pgl<u32>> {
            self.core.device.as_ref().map(|d| &d.meta)
        }
        /// Collective: frees the buffers and counters on every rank.
        pub fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()> {
            self.core.free(rdzv)
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
    fn run(&mut self) -> anyhow::Result<()>;
    fn run_baseline(&mut self, comm: &Communicator) -> anyhow::Result<()>;
    fn synchronize(&self) -> anyhow::Result<()>;
    fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()>;
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
            fn run(&mut self) -> anyhow::Result<()> {
                $plan::run(self)
            }
            fn run_baseline(&mut self, comm: &Communicator) -> anyhow::Result<()> {
                $plan::run_baseline(self, comm)
            }
            fn synchronize(&self) -> anyhow::Result<()> {
                $plan::synchronize(self)
            }
            fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()> {
                $plan::free(self, rdzv)
            }
        }
    };
}
group_collective!(GroupCast);
group_collective!(GroupReduce);

/// A GroupCast plan (collective). Any element type when the communication dtype is the data's
/// (rows are copied as bytes); f32 / f64 data through a narrower communication dtype.
pub struct GroupCast<T: PglElement> {
    core: Core<T>,
}

impl<T: PglElement> GroupCast<T> {
    /// Collective: validates `meta` (locally, then against every rank's), allocates the input and
    /// output PGLs (rows = the largest input / output across ranks), and uploads this rank's work.
    pub fn new(
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        meta: &GroupCastMeta,
        row_elems: usize,
        opts: Options,
    ) -> anyhow::Result<Self> {
        Self::new_packed(rdzv, stream, meta, &[row_elems], opts)
    }

    /// Collective, as [`GroupCast::new`], for 1 to [`MAX_TENSORS`] tensors of these row widths
    /// that share the metadata (e.g. K and V): one launch moves them all.
    pub fn new_packed(
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        meta: &GroupCastMeta,
        row_elems: &[usize],
        opts: Options,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            core: Core::build(
                Kind::Cast,
                rdzv,
                stream,
                MetaSource::Host(Desc::from(meta)),
                row_elems,
                ReduceOp::Sum,
                opts,
            )?,
        })
    }

    /// Collective: a plan whose metadata lives on the GPU, sized by `cap` (every rank the same).
    /// Before each `run`, write this rank's metadata into [`device_meta`](Self::device_meta)
    /// (or with [`write_device_meta`](Self::write_device_meta)); the run matches it on the
    /// GPU. The AlltoAll-v baseline needs host metadata and is refused.
    pub fn new_device(
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        cap: Capacity,
        row_elems: &[usize],
        opts: Options,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            core: Core::build(
                Kind::Cast,
                rdzv,
                stream,
                MetaSource::Device(cap),
                row_elems,
                ReduceOp::Sum,
                opts,
            )?,
        })
    }

    /// Device metadata from host metadata (checked against the capacity), copied in stream order.
    pub fn write_device_meta(&self, meta: &GroupCastMeta) -> anyhow::Result<()> {
        self.core.write_device_meta(&Desc::from(meta))
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
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        meta: &GroupReduceMeta,
        row_elems: usize,
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<Self> {
        Self::new_packed(rdzv, stream, meta, &[row_elems], op, opts)
    }

    /// Collective, as [`GroupReduce::new`], for 1 to [`MAX_TENSORS`] tensors sharing the
    /// metadata (op `Lse` takes one).
    pub fn new_packed(
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        meta: &GroupReduceMeta,
        row_elems: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            core: Core::build(
                Kind::Reduce,
                rdzv,
                stream,
                MetaSource::Host(Desc::from(meta)),
                row_elems,
                op,
                opts,
            )?,
        })
    }

    /// Collective: a plan whose metadata lives on the GPU, as [`GroupCast::new_device`].
    pub fn new_device(
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        cap: Capacity,
        row_elems: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            core: Core::build(
                Kind::Reduce,
                rdzv,
                stream,
                MetaSource::Device(cap),
                row_elems,
                op,
                opts,
            )?,
        })
    }

    /// Device metadata from host metadata (checked against the capacity), copied in stream order.
    pub fn write_device_meta(&self, meta: &GroupReduceMeta) -> anyhow::Result<()> {
        self.core.write_device_meta(&Desc::from(meta))
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

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_choice::PULL_PAIRS;

    fn args(
        kind: Kind,
        data: DType,
        rows: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<(Path, DType, Option<String>)> {
        validate_args(kind, data, rows, op, &opts, 24, 132)
    }

    #[test]
    fn argument_errors_are_named() {
        let o = Options::default();
        let e = |r: anyhow::Result<_>| r.unwrap_err().to_string();
        assert!(e(args(Kind::Cast, DType::F32, &[], ReduceOp::Sum, o))
            .contains("packed transfer takes 1 to 3 tensors, got 0"));
        assert!(e(args(
            Kind::Cast,
            DType::F32,
            &[1, 2, 3, 4],
            ReduceOp::Sum,
            o
        ))
        .contains("got 4"));
        assert!(e(args(Kind::Cast, DType::F32, &[8, 0], ReduceOp::Sum, o))
            .contains("tensor 1: row_elems 0"));
        let acc = Options {
            accumulate: true,
            ..o
        };
        assert!(e(args(Kind::Cast, DType::F32, &[8], ReduceOp::Sum, acc))
            .contains("accumulate is a GroupReduce option"));
        let lse = ReduceOp::Lse { lse_per_row: 4 };
        assert!(
            e(args(Kind::Reduce, DType::F32, &[8, 8], lse, o)).contains("op lse takes one tensor")
        );
        assert!(e(args(Kind::Reduce, DType::F32, &[6], lse, o))
            .contains("lse_per_row 4 must divide row_elems 6"));
        let wide = Options {
            comm_dtype: Some(DType::F32),
            ..o
        };
        assert!(
            e(args(Kind::Reduce, DType::Bf16, &[8], ReduceOp::Sum, wide))
                .contains("communication dtype f32 with data dtype bf16 is not supported")
        );
        assert!(e(args(Kind::Cast, DType::Bf16, &[8], ReduceOp::Sum, wide))
            .contains("communication dtype f32 with data dtype bf16"));
        assert!(e(validate_args(
            Kind::Cast,
            DType::F32,
            &[8],
            ReduceOp::Sum,
            &Options {
                sms: Some(200),
                ..o
            },
            200,
            132
        ))
        .contains("200 SMs requested; the device has 132"));
    }

    #[test]
    fn paths_follow_the_collective_and_the_comm_dtype() {
        let o = Options::default();
        assert_eq!(
            args(Kind::Cast, DType::U32, &[8], ReduceOp::Sum, o).unwrap(),
            (Path::Push, DType::U32, None)
        );
        let narrow = Options {
            comm_dtype: Some(DType::Bf16),
            ..o
        };
        assert_eq!(
            args(Kind::Cast, DType::F32, &[8, 16], ReduceOp::Sum, narrow).unwrap(),
            (
                Path::Pull,
                DType::Bf16,
                Some("weft_grpcoll_reduce_bf16_f32_vN".into())
            )
        );
        assert_eq!(
            args(
                Kind::Reduce,
                DType::F64,
                &[8],
                ReduceOp::Lse { lse_per_row: 8 },
                o
            )
            .unwrap()
            .2,
            Some("weft_grpcoll_reduce_f64_f64_v1".into())
        );
    }

    #[test]
    fn every_kernel_the_plans_name_exists() {
        let img = cubins::GRPCOLL_GRPCOLL.image;
        let has = |name: &str| {
            img.windows(name.len() + 1)
                .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
        };
        for b in [16, 8, 4, 2, 1] {
            assert!(has(&push_kernel_name(&[b])), "{b}");
        }
        assert!(cubins::GRPCOLL_LAYOUT
            .image
            .windows(20)
            .any(|w| w == b"weft_grpcoll_layout\0"));
        for (c, d) in PULL_PAIRS {
            for g in [1, 16] {
                let name = pull_kernel_name("x", c, d, &[g]).unwrap();
                assert!(has(&name), "{name}");
            }
        }
    }
}
