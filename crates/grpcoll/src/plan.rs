//! The plan behind GroupCast and GroupReduce: validation (local, then across ranks), buffers,
//! kernels, work lists (host metadata) or the layout kernel's buffers (device metadata), and the
//! native launch. The AlltoAll-v path is in baseline.rs.

use crate::baseline::Staging;
use crate::bulk_ring::BulkRing;
use crate::device_meta::{self, Capacity};
use crate::error::GrpcollError;
use crate::kernel_choice::{pull_kernel_name, push_kernel_name};
use crate::meta::{self, Desc, Header, Kind, Transfer};
use crate::work::{chunk_rows, pull_items, push_items, BaselineLayout, Items};
use crate::{Options, ReduceOp};
use anyhow::{bail, ensure, Context};
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;
use weft_kernels::abi::{
    weft_grpcoll_layout_params, weft_grpcoll_layout_report, weft_grpcoll_params,
    weft_grpcoll_tensor, weft_kernel_barrier_view, weft_pgl_view, WEFT_GRPCOLL_ACCUMULATE,
    WEFT_GRPCOLL_CONVERT, WEFT_GRPCOLL_SYNCED, WEFT_GRPCOLL_TRANSFER,
};
use weft_kernels::cubins;
use weft_pgl::Bootstrap;
use weft_pgl::{agree, agree_outcome, AgreeError, Backend, DType, Pgl, PglElement, Shape};
use weft_sync::{Counters, WaitBudget};

const PUSH_THREADS: u32 = 1024;
/// The kernel's own constant: with bulk buffers one warp loads and the others reduce.
const PULL_THREADS: u32 = weft_kernels::abi::WEFT_GRPCOLL_PULL_THREADS;
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
pub(crate) enum Path {
    /// GroupCast in the data dtype: the sender writes into every destination.
    Push,
    /// GroupReduce, or GroupCast through a narrower comm dtype: the receiver reads its sources.
    Pull,
}

/// One tensor of a plan.
pub(crate) struct Tensor<T: PglElement> {
    pub(crate) row_elems: usize,
    pub(crate) input: Pgl<T>,
    pub(crate) output: Pgl<T>,
    /// This rank's input in the communication dtype (when it differs from the data's).
    pub(crate) staging: Option<Pgl<u8>>,
}

/// What both collectives share: metadata, buffers, counters, kernels and work lists.
pub(crate) struct Core<T: PglElement> {
    pub(crate) kind: Kind,
    pub(crate) path: Path,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) op: ReduceOp,
    pub(crate) opts: Options,
    /// The communication dtype (the data dtype unless a narrower one was asked for).
    pub(crate) comm: DType,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) sms: u32,
    pub(crate) device_sms: u32,
    pub(crate) input_rows: usize,
    pub(crate) tensors: Vec<Tensor<T>>,
    pub(crate) input_lse: Option<Pgl<f32>>,
    pub(crate) output_lse: Option<Pgl<f32>>,
    pub(crate) counters: Counters,
    pub(crate) native: CudaFunction,
    /// The native pull kernel's ring of bulk buffers (none: it reads peer memory directly).
    pub(crate) bulk: BulkRing,
    pub(crate) native_items: Items,
    /// Push kernel at the comm row widths (the baseline's gathers, and a push cast's scatter);
    /// and at the lse row width.
    pub(crate) copy_comm: CudaFunction,
    pub(crate) copy_lse: Option<CudaFunction>,
    pub(crate) gather_items: Items,
    pub(crate) scatter_items: Items,
    pub(crate) layout: BaselineLayout,
    pub(crate) transfers: Vec<Transfer>,
    pub(crate) staging: Option<Staging>,
    /// KernelBarrier counter (device address) each native launch arrives on; 0: none.
    pub(crate) arrive: u64,
    /// Device-resident metadata (the layout kernel's buffers), or None for host metadata.
    pub(crate) device: Option<DeviceMeta>,
}

/// Where a plan's metadata comes from.
pub(crate) enum MetaSource {
    Host(Desc),
    Device(Capacity),
}

/// A device-metadata plan's buffers: the metadata PGL the caller fills, the layout kernel's
/// scratch, its report, and the item count it writes for the transfer kernel.
pub(crate) struct DeviceMeta {
    pub(crate) cap: Capacity,
    pub(crate) meta: Pgl<u32>,
    pub(crate) scratch: CudaSlice<u32>,
    pub(crate) report: CudaSlice<u32>,
    pub(crate) nitems: CudaSlice<u32>,
    pub(crate) layout: CudaFunction,
    pub(crate) max_items: usize,
    pub(crate) chunk: usize,
}

/// u32 words of one rank's device metadata.
fn unsafe_meta_words(cap: usize) -> usize {
    // SAFETY: a pure function of its argument.
    unsafe { weft_kernels::abi::weft_grpcoll_meta_words(cap as u32) as usize }
}

pub(crate) fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Cast => "group_cast",
        Kind::Reduce => "group_reduce",
    }
}

/// Local checks of the plan's arguments (before anything is allocated or exchanged).
pub(crate) fn validate_args(
    kind: Kind,
    data: DType,
    row_elems: &[usize],
    op: ReduceOp,
    opts: &Options,
    sms: u32,
    device_sms: u32,
    ranks_on_gpu: u32,
) -> anyhow::Result<(Path, DType, Option<String>)> {
    let what = kind_name(kind);
    if row_elems.is_empty() || row_elems.len() > crate::MAX_TENSORS {
        bail!(GrpcollError::Options(format!(
            "{what}: packed transfer takes 1 to {} tensors, got {}",
            crate::MAX_TENSORS,
            row_elems.len()
        )));
    }
    for (t, &e) in row_elems.iter().enumerate() {
        if e == 0
            || e.checked_mul(data.size())
                .is_none_or(|b| b > u32::MAX as usize)
        {
            bail!(GrpcollError::Options(format!(
                "{what}: tensor {t}: row_elems {e} must be at least 1 and a row at most 4 GiB"
            )));
        }
    }
    if sms == 0 || sms > device_sms {
        bail!(GrpcollError::Options(format!(
            "{what}: {sms} SMs requested; the device has {device_sms}"
        )));
    }
    // The native kernels' CTAs wait on the other ranks' CTAs: on a GPU that several ranks share
    // (WEFT_SHARED_GPU=1), every rank's grid must be resident at once, or the waits deadlock
    // (one CTA per SM is all the kernels are sure of).
    if sms * ranks_on_gpu > device_sms {
        bail!(GrpcollError::Options(format!(
            "{what}: {ranks_on_gpu} ranks share one GPU of {device_sms} SMs, so {sms} SMs per rank \
             cannot all be resident at once; pass Options::sms at most {} (the default fits)",
            device_sms / ranks_on_gpu
        )));
    }
    if kind == Kind::Cast && opts.accumulate {
        bail!(GrpcollError::Options(
            "group_cast: accumulate is a GroupReduce option (a cast overwrites its output rows)"
                .to_string()
        ));
    }
    let comm = opts.comm_dtype.unwrap_or(data);
    let lse_per_row = op.lse_per_row();
    if let ReduceOp::Lse { lse_per_row } = op {
        if row_elems.len() > 1 {
            bail!(GrpcollError::Options(format!(
                "group_reduce: op lse takes one tensor (its lse), got {}",
                row_elems.len()
            )));
        }
        if lse_per_row == 0 || !row_elems[0].is_multiple_of(lse_per_row) {
            bail!(GrpcollError::Options(format!(
                "group_reduce: lse_per_row {lse_per_row} must divide row_elems {}",
                row_elems[0]
            )));
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

/// `weft_pgl::agree` keeping this rank's typed refusal: a rank that refused gets its own kind
/// of error with the agreed text (every refusing rank named, with its reason), a rank whose own
/// step passed `PeerRefused`, and a failed exchange of the verdicts `Runtime`.
pub(crate) fn agree_typed<T>(
    rdzv: &mut dyn Bootstrap,
    step: &str,
    local: anyhow::Result<T>,
) -> anyhow::Result<T> {
    agree_outcome(rdzv, step, local).map_err(|e| {
        anyhow::Error::new(match e {
            AgreeError::Exchange(e) => {
                GrpcollError::Runtime(e.context(format!("{step}: exchanging the ranks' verdicts")))
            }
            AgreeError::Refused { text, local: None } => GrpcollError::PeerRefused(text),
            AgreeError::Refused {
                text,
                local: Some(mine),
            } => match mine
                .downcast_ref::<GrpcollError>()
                .and_then(GrpcollError::with_text)
            {
                Some(refusal) => refusal(text),
                None => GrpcollError::Runtime(anyhow::anyhow!(text)),
            },
        })
    })
}

impl<T: PglElement> Core<T> {
    pub(crate) fn build(
        kind: Kind,
        rdzv: &mut dyn Bootstrap,
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
        let ranks_on_gpu = weft_pgl::gpu::max_ranks_per_gpu(rdzv, &ctx)? as u32;
        let sms = opts
            .sms
            .unwrap_or(crate::DEFAULT_SMS.min(device_sms / ranks_on_gpu).max(1));
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
        .and_then(|()| {
            validate_args(
                kind,
                data,
                row_elems,
                op,
                &opts,
                sms,
                device_sms,
                ranks_on_gpu,
            )
        });
        let (path, comm, pull_name) = agree_typed(
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
        meta::validate_all(kind, &descs, capacity.is_some())?;
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
            // Bulk buffers where the pull kernel has them (16-byte vectors, one tensor, no lse)
            // and they pay: a GroupReduce (a cast through a narrower dtype measured 3-6 % slower).
            let bulk = match &pull_name {
                Some(name)
                    if kind == Kind::Reduce
                        && name.ends_with("_vN")
                        && lse_per_row == 0
                        && row_elems.len() == 1 =>
                {
                    // The module (and so this kernel's handle) is shared by every plan in the
                    // process: its limit is raised to the device's whole opt-in once, never
                    // lowered to one plan's size (a later plan must not break an earlier one).
                    let optin = ctx.attribute(
                        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                    )? as u32;
                    let static_smem = native.get_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                    )? as u32;
                    let dynamic = optin.saturating_sub(static_smem);
                    native.set_attribute(
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        dynamic as i32,
                    )?;
                    BulkRing::choose(dynamic)?
                }
                _ => BulkRing::NONE,
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
            Ok((native, bulk, copy_comm, copy_lse, layout))
        })();
        let (native, bulk, copy_comm, copy_lse, layout) =
            agree_typed(rdzv, "grpcoll plan (kernels)", loaded)?;

        // Work lists: rows per item from the bytes of one row of every tensor.
        let chunk = chunk_rows(row_elems.iter().sum::<usize>() * data.size());
        let device = match (capacity, layout) {
            (Some(cap), Some(layout)) => {
                // Before anything is allocated (the same verdict on every rank: the capacity and
                // the chunk agree): the kernels' walk counts item positions in 32 bits.
                let max_items = cap.max_items(chunk);
                ensure!(
                    max_items < weft_kernels::abi::WEFT_GRPCOLL_MAX_ITEMS as usize, GrpcollError::Unsupported(format!(
                    "grpcoll device metadata: {} rows in chunks of {chunk} make up to {max_items} work items, more than {} (lower the capacity)",
                    cap.max_input_rows.max(cap.max_output_rows),
                    weft_kernels::abi::WEFT_GRPCOLL_MAX_ITEMS - 1
                )));
                let words = unsafe_meta_words(cap.max_splits);
                let meta = Pgl::<u32>::alloc(rdzv, &ctx, shape(1, words), Backend::default())
                    .context("allocating the grpcoll device metadata")?;
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
                    agree_typed(rdzv, "grpcoll plan (layout buffers)", buffers)?;
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
            agree_typed(rdzv, "grpcoll plan (work lists)", uploaded)?;
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
            bulk,
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

    pub(crate) fn write_device_meta(&self, desc: &Desc) -> anyhow::Result<()> {
        let Some(dm) = &self.device else {
            bail!(GrpcollError::Options(format!(
                "{}: this plan was built with host metadata (use new_device for device metadata)",
                kind_name(self.kind)
            )));
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

    pub(crate) fn converts(&self) -> bool {
        self.comm != T::DTYPE
    }

    fn op_code(&self) -> i32 {
        match (self.kind, self.path) {
            (Kind::Cast, Path::Pull) => weft_kernels::abi::WEFT_GRPCOLL_OP_COPY as i32,
            _ => self.op.code(),
        }
    }

    /// Parameters with every tensor's views as given, no flags, no barrier; launches adjust them.
    pub(crate) fn params(
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
    pub(crate) fn data_views(&self) -> Vec<(weft_pgl_view, weft_pgl_view, usize)> {
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

    pub(crate) fn launch(
        &self,
        f: &CudaFunction,
        p: &weft_grpcoll_params,
        grid: u32,
    ) -> anyhow::Result<()> {
        let pull = std::ptr::eq(f, &self.native) && self.path == Path::Pull;
        let smem = BulkRing {
            buffer_bytes: p.bulk_buffer_bytes,
            stages: p.bulk_stages,
        }
        .smem_bytes();
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (if pull { PULL_THREADS } else { PUSH_THREADS }, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the params' views and work lists point at buffers this plan owns (or peers'
        // mapped buffers of the same shapes), alive until the plan is freed; the items stay in
        // bounds of them by construction (validated metadata).
        unsafe { self.stream.launch_builder(f).arg(p).launch(cfg)? };
        Ok(())
    }

    /// The native kernel: (convert,) barrier, push / pull, barrier.
    pub(crate) fn run_native(&mut self) -> anyhow::Result<()> {
        let base = self.counters.begin(1);
        let mut p = self.params(&self.data_views(), &self.native_items);
        if let (Some(il), Some(ol)) = (&self.input_lse, &self.output_lse) {
            p.input_lse = il.view();
            p.output_lse = ol.view();
        }
        p.bar = self.counters.device()?;
        p.epoch = base + 1;
        p.flags = WEFT_GRPCOLL_SYNCED | WEFT_GRPCOLL_TRANSFER;
        p.bulk_buffer_bytes = self.bulk.buffer_bytes;
        p.bulk_stages = self.bulk.stages;
        if self.converts() {
            p.flags |= WEFT_GRPCOLL_CONVERT;
        }
        if self.opts.accumulate {
            p.flags |= WEFT_GRPCOLL_ACCUMULATE;
        }
        p.arrive = weft_kernel_barrier_view {
            counter: self.arrive,
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
    pub(crate) fn check_layout(&self) -> anyhow::Result<()> {
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
                bail!(GrpcollError::Layout {
                    rank: self.rank,
                    text
                })
            }
        }
    }

    pub(crate) fn free(self, rdzv: &mut dyn Bootstrap) -> anyhow::Result<()> {
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
        Ok(self.counters.free(rdzv)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 1 of 2 whose exchange returns rank 0's verdict `peer` beside its own, or fails.
    struct Pair {
        peer: Option<Vec<u8>>,
    }

    impl Bootstrap for Pair {
        fn rank(&self) -> usize {
            1
        }
        fn world(&self) -> usize {
            2
        }
        fn exchange(&mut self, bytes: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
            match &self.peer {
                Some(p) => Ok(vec![p.clone(), bytes.to_vec()]),
                None => anyhow::bail!("rank 0 never answered"),
            }
        }
    }

    fn typed(peer: Option<&str>, local: anyhow::Result<()>) -> GrpcollError {
        let mut b = Pair {
            peer: peer.map(|p| p.as_bytes().to_vec()),
        };
        GrpcollError::from_anyhow(agree_typed(&mut b, "step", local).unwrap_err())
    }

    /// The refusing rank keeps its kind with the text both ranks agree on; a rank whose own step
    /// passed hears `PeerRefused`; a failed exchange is `Runtime`, and so is an untyped refusal.
    #[test]
    fn agreed_refusals_keep_their_kind() {
        let bad = || Err(GrpcollError::Metadata("bad splits".into()).into());
        let e = typed(Some(""), bad());
        assert!(
            matches!(&e, GrpcollError::Metadata(t) if t.contains("step failed on 1 of 2 ranks: rank 1: error: bad splits")),
            "{e:?}"
        );
        let e = typed(Some("error: their splits"), Ok(()));
        assert!(
            matches!(&e, GrpcollError::PeerRefused(t) if t.contains("rank 0: error: their splits")),
            "{e:?}"
        );
        let e = typed(None, Ok(()));
        assert!(
            matches!(&e, GrpcollError::Runtime(_))
                && format!("{e:#}").contains("rank 0 never answered"),
            "{e:?}"
        );
        let e = typed(Some(""), Err(anyhow::anyhow!("cuMemAlloc failed")));
        assert!(matches!(&e, GrpcollError::Runtime(_)), "{e:?}");
        let mut ok = Pair {
            peer: Some(Vec::new()),
        };
        assert!(agree_typed(&mut ok, "step", Ok(7)).is_ok_and(|v| v == 7));
    }

    fn args(
        kind: Kind,
        data: DType,
        rows: &[usize],
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<(Path, DType, Option<String>)> {
        validate_args(kind, data, rows, op, &opts, 24, 132, 1)
    }

    #[test]
    fn argument_errors_are_named() {
        let o = Options::default();
        // Every refusal here is a typed Options error, its text the one checked below.
        let e = |r: anyhow::Result<_>| {
            let e = GrpcollError::from_anyhow(r.unwrap_err());
            assert!(matches!(e, GrpcollError::Options(_)), "{e:?}");
            e.to_string()
        };
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
            132,
            1
        ))
        .contains("200 SMs requested; the device has 132"));
        assert!(e(validate_args(Kind::Cast, DType::F32, &[8], ReduceOp::Sum, &o, 24, 132, 8))
            .contains("8 ranks share one GPU of 132 SMs, so 24 SMs per rank cannot all be resident at once; pass Options::sms at most 16"));
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
}
