//! weft-grpcoll: native intranode GroupCast / GroupReduce over pgl peer buffers, with an NCCL
//! AlltoAll-v baseline behind the same plan. See README.md.
//!
//! - [`GroupCast`]: input split i goes to every rank of `dst_indices[i]` (push: the sender reads
//!   each split once and writes it to every destination's output at its final rows).
//! - [`GroupReduce`]: output split j is the sum / average / lse-combination of the partials of
//!   every rank in `src_indices[j]` (pull: the receiver reads its sources' partials and writes the
//!   reduced rows once), fp32 accumulation.
//!
//! A plan is built once, collectively, from this rank's metadata ([`GroupCastMeta`],
//! [`GroupReduceMeta`]): it validates locally and across ranks, allocates the input and output
//! PGLs (callers write inputs there and read outputs there), and uploads this rank's work lists.
//! Each `run` is then one kernel launch with no host synchronisation.

mod meta;
pub mod pattern;

pub use meta::{GroupCastMeta, GroupReduceMeta, Transfer};

use anyhow::{bail, Context};
use cudarc::driver::{
    sys, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use meta::{Desc, Header, Kind};
use std::sync::Arc;
use weft_kernels::abi::{
    weft_grpcoll_item, weft_grpcoll_params, weft_pgl_shape, weft_pgl_view, WEFT_GRPCOLL_MAX_PEERS,
};
use weft_kernels::cubins;
use weft_pgl::nccl::Communicator;
use weft_pgl::rendezvous::Rendezvous;
use weft_pgl::{agree, Backend, DType, Pgl, PglElement, Shape};
use weft_sync::{Counters, ErrorSlot, WaitBudget};

/// Default number of SMs (one block each) the native kernels use, capped by the device's count.
pub const DEFAULT_SMS: u32 = 24;

/// Rows per work item are chosen so one item moves about this many bytes.
const CHUNK_BYTES: usize = 64 << 10;
const CAST_THREADS: u32 = 1024;
const REDUCE_THREADS: u32 = 512;

/// Plan options. Every rank must pass the same values (checked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// SMs (blocks) for the native kernels; `None`: min(DEFAULT_SMS, the device's SMs).
    pub sms: Option<u32>,
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
        match self {
            ReduceOp::Sum => weft_kernels::abi::WEFT_GRPCOLL_OP_SUM as i32,
            ReduceOp::Avg => weft_kernels::abi::WEFT_GRPCOLL_OP_AVG as i32,
            ReduceOp::Lse { .. } => weft_kernels::abi::WEFT_GRPCOLL_OP_LSE as i32,
        }
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
        _ => "?",
    }
}

/// Staging buffers of the AlltoAll-v baseline, allocated on its first run.
struct Staging {
    send: CudaSlice<u8>,
    recv: CudaSlice<u8>,
    lse_send: Option<CudaSlice<u8>>,
    lse_recv: Option<CudaSlice<u8>>,
}

/// A work list in device memory.
struct Items {
    buf: CudaSlice<u8>,
    count: u32,
}

impl Items {
    fn upload(stream: &Arc<CudaStream>, items: &[weft_grpcoll_item]) -> anyhow::Result<Self> {
        let bytes = std::mem::size_of_val(items);
        // SAFETY: weft_grpcoll_item is a bindgen plain-old-data struct of u32/i32 fields with no
        // padding; viewing the slice as bytes reads only initialised memory.
        let raw = unsafe { std::slice::from_raw_parts(items.as_ptr() as *const u8, bytes) };
        let buf = if raw.is_empty() {
            stream.alloc_zeros::<u8>(1)?
        } else {
            stream.clone_htod(raw)?
        };
        Ok(Self {
            buf,
            count: items.len() as u32,
        })
    }
}

/// What both collectives share: metadata, buffers, counters, kernels and work lists.
struct Core<T: PglElement> {
    kind: Kind,
    rank: usize,
    world: usize,
    row_elems: usize,
    op: ReduceOp,
    stream: Arc<CudaStream>,
    sms: u32,
    device_sms: u32,
    input: Pgl<T>,
    output: Pgl<T>,
    input_lse: Option<Pgl<f32>>,
    output_lse: Option<Pgl<f32>>,
    counters: Counters,
    native: CudaFunction,
    /// Cast kernel for the baseline's gathers (and the cast scatter) at the data and lse row widths.
    copy_data: CudaFunction,
    copy_lse: Option<CudaFunction>,
    native_items: Items,
    gather_items: Items,
    scatter_items: Items,
    /// Rows sent to / received from each peer by the baseline, and their first row in staging.
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
    transfers: Vec<Transfer>,
    staging: Option<Staging>,
}

fn elem_code(d: DType) -> u64 {
    d as u8 as u64
}

fn dtype_name(code: u64) -> String {
    DType::from_code(code as u8).map_or(format!("code {code}"), |d| d.name().to_string())
}

/// The largest of 16, 8, 4, 2, 1 dividing `bytes`.
fn vector_bytes(bytes: usize) -> usize {
    [16, 8, 4, 2, 1]
        .into_iter()
        .find(|v| bytes % v == 0)
        .unwrap()
}

fn cast_kernel_name(row_bytes: usize) -> String {
    format!("weft_grpcoll_cast_v{}", vector_bytes(row_bytes))
}

/// The reduce kernel for a dtype and a group width (elements that share one lse value, or the
/// whole row): 16-byte vectors when they divide the group.
fn reduce_kernel_name(dtype: DType, group: usize) -> anyhow::Result<String> {
    let (name, per16) = match dtype {
        DType::F32 => ("f32", 4),
        DType::Bf16 => ("bf16", 8),
        other => bail!(
            "group_reduce: data dtype {} is not supported (supported: f32, bf16)",
            other.name()
        ),
    };
    Ok(format!(
        "weft_grpcoll_reduce_{name}_v{}",
        if group % per16 == 0 { per16 } else { 1 }
    ))
}

fn empty_view() -> weft_pgl_view {
    weft_pgl_view {
        base: [0; 16],
        shape: weft_pgl_shape {
            batch: 0,
            depth: 0,
            rows: 0,
            cols: 0,
        },
        rank: 0,
        world: 0,
        elem_bytes: 0,
        reserved: 0,
    }
}

/// A view whose every rank's base is `ptr` (a local staging buffer, indexed by peer in the items).
fn local_view(
    ptr: u64,
    rank: usize,
    world: usize,
    rows: usize,
    cols: usize,
    elem_bytes: usize,
) -> weft_pgl_view {
    let mut base = [0u64; 16];
    base.iter_mut().take(world).for_each(|b| *b = ptr);
    weft_pgl_view {
        base,
        shape: weft_pgl_shape {
            batch: 1,
            depth: 1,
            rows: rows as u32,
            cols: cols as u32,
        },
        rank: rank as i32,
        world: world as i32,
        elem_bytes: elem_bytes as u32,
        reserved: 0,
    }
}

/// Splits `rows` rows into chunks of at most `chunk` rows, one item each, with `peers` (rank,
/// first row) advanced alongside.
fn push_chunks(
    out: &mut Vec<weft_grpcoll_item>,
    row: usize,
    rows: usize,
    peers: &[(usize, usize)],
    chunk: usize,
) {
    assert!(peers.len() <= WEFT_GRPCOLL_MAX_PEERS as usize);
    let mut at = 0;
    while at < rows {
        let n = chunk.min(rows - at);
        let mut item = weft_grpcoll_item {
            row: (row + at) as u32,
            rows: n as u32,
            npeers: peers.len() as u32,
            reserved: 0,
            peer: [0; 16],
            peer_row: [0; 16],
        };
        for (k, &(p, r)) in peers.iter().enumerate() {
            item.peer[k] = p as i32;
            item.peer_row[k] = (r + at) as u32;
        }
        out.push(item);
        at += n;
    }
}

impl<T: PglElement> Core<T> {
    #[allow(clippy::too_many_arguments)]
    fn build(
        kind: Kind,
        rdzv: &mut Rendezvous,
        stream: &Arc<CudaStream>,
        desc: Desc,
        row_elems: usize,
        op: ReduceOp,
        opts: Options,
    ) -> anyhow::Result<Self> {
        let (rank, world) = (rdzv.rank(), rdzv.world());
        let ctx = stream.context().clone();
        let device_sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let sms = opts.sms.unwrap_or(DEFAULT_SMS.min(device_sms));
        let lse_per_row = op.lse_per_row();
        let elem_bytes = T::DTYPE.size();
        // Local checks, agreed so that every rank fails together.
        let local = (|| -> anyhow::Result<()> {
            meta::validate_local(kind, &desc, world)?;
            if row_elems == 0 || row_elems * elem_bytes > u32::MAX as usize {
                bail!(
                    "{}: row_elems {row_elems} must be at least 1 and a row at most 4 GiB",
                    kind_name(kind)
                );
            }
            if sms == 0 || sms > device_sms {
                bail!(
                    "{}: {sms} SMs requested; the device has {device_sms}",
                    kind_name(kind)
                );
            }
            if kind == Kind::Reduce {
                reduce_kernel_name(T::DTYPE, row_elems)?;
                if let ReduceOp::Lse { lse_per_row } = op {
                    if lse_per_row == 0 || row_elems % lse_per_row != 0 {
                        bail!("group_reduce: lse_per_row {lse_per_row} must divide row_elems {row_elems}");
                    }
                }
            }
            Ok(())
        })();
        agree(
            rdzv,
            &format!("{} plan (local metadata)", kind_name(kind)),
            local,
        )?;

        // Cross-rank: every rank's metadata, the same checks everywhere.
        let header = Header {
            kind: kind as u64,
            dtype: elem_code(T::DTYPE),
            row_elems: row_elems as u64,
            op: if kind == Kind::Reduce {
                op.code() as u64
            } else {
                0
            },
            lse_per_row: lse_per_row as u64,
            sms: sms as u64,
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
            0 => (if v == 1 { "group_cast" } else { "group_reduce" }).to_string(),
            1 => dtype_name(v),
            3 => op_name(v).to_string(),
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
        let input = Pgl::<T>::alloc(
            rdzv,
            &ctx,
            Shape::new(1, 1, max_in as u32, row_elems as u32),
            Backend::default(),
        )
        .context("allocating the grpcoll input")?;
        let output = Pgl::<T>::alloc(
            rdzv,
            &ctx,
            Shape::new(1, 1, max_out as u32, row_elems as u32),
            Backend::default(),
        )
        .context("allocating the grpcoll output")?;
        let (input_lse, output_lse) = if lse_per_row > 0 {
            (
                Some(Pgl::<f32>::alloc(
                    rdzv,
                    &ctx,
                    Shape::new(1, 1, max_in as u32, lse_per_row as u32),
                    Backend::default(),
                )?),
                Some(Pgl::<f32>::alloc(
                    rdzv,
                    &ctx,
                    Shape::new(1, 1, max_out as u32, lse_per_row as u32),
                    Backend::default(),
                )?),
            )
        } else {
            (None, None)
        };
        let counters = Counters::alloc(rdzv, &ctx, Shape::new(1, 1, 2, sms), budget)?;

        let module = cubins::GRPCOLL_GRPCOLL
            .load(&ctx)
            .context("loading kernels/grpcoll/grpcoll.cu")?;
        let row_bytes = row_elems * elem_bytes;
        let copy_data = module.load_function(&cast_kernel_name(row_bytes))?;
        let copy_lse = if lse_per_row > 0 {
            Some(module.load_function(&cast_kernel_name(lse_per_row * 4))?)
        } else {
            None
        };
        let native = match kind {
            Kind::Cast => copy_data.clone(),
            Kind::Reduce => {
                let group = row_elems.checked_div(lse_per_row).unwrap_or(row_elems);
                module.load_function(&reduce_kernel_name(T::DTYPE, group)?)?
            }
        };

        // Work lists.
        let chunk = (CHUNK_BYTES / row_bytes).max(1);
        let mut native_items = Vec::new();
        match kind {
            Kind::Cast => {
                for i in 0..descs[rank].input_split_rows.len() {
                    let ts: Vec<&Transfer> = transfers
                        .iter()
                        .filter(|t| t.src == rank && t.src_split == i)
                        .collect();
                    if let Some(t0) = ts.first() {
                        let peers: Vec<(usize, usize)> =
                            ts.iter().map(|t| (t.dst, t.dst_row)).collect();
                        push_chunks(&mut native_items, t0.src_row, t0.rows, &peers, chunk);
                    }
                }
            }
            Kind::Reduce => {
                for j in 0..descs[rank].output_split_rows.len() {
                    let ts: Vec<&Transfer> = transfers
                        .iter()
                        .filter(|t| t.dst == rank && t.dst_split == j)
                        .collect();
                    if let Some(t0) = ts.first() {
                        let peers: Vec<(usize, usize)> =
                            ts.iter().map(|t| (t.src, t.src_row)).collect();
                        push_chunks(&mut native_items, t0.dst_row, t0.rows, &peers, chunk);
                    }
                }
            }
        }
        // Baseline: per peer, the sends in input-split order and the receives in output-split
        // order (the matching rule pairs them in these orders), packed contiguously.
        let mut send_rows = vec![0usize; world];
        let mut recv_rows = vec![0usize; world];
        let mut gather = Vec::new();
        let mut send_at = 0;
        for (p, rows) in send_rows.iter_mut().enumerate() {
            let mut ts: Vec<&Transfer> = transfers
                .iter()
                .filter(|t| t.src == rank && t.dst == p)
                .collect();
            ts.sort_by_key(|t| t.src_split);
            for t in ts {
                push_chunks(&mut gather, t.src_row, t.rows, &[(rank, send_at)], chunk);
                send_at += t.rows;
                *rows += t.rows;
            }
        }
        let mut recv_at_of = std::collections::HashMap::new();
        let mut recv_at = 0;
        for (p, rows) in recv_rows.iter_mut().enumerate() {
            let mut ts: Vec<&Transfer> = transfers
                .iter()
                .filter(|t| t.dst == rank && t.src == p)
                .collect();
            ts.sort_by_key(|t| t.dst_split);
            for t in ts {
                recv_at_of.insert((t.src, t.dst_split), recv_at);
                recv_at += t.rows;
                *rows += t.rows;
            }
        }
        let mut scatter = Vec::new();
        for j in 0..descs[rank].output_split_rows.len() {
            let ts: Vec<&Transfer> = transfers
                .iter()
                .filter(|t| t.dst == rank && t.dst_split == j)
                .collect();
            let Some(t0) = ts.first() else { continue };
            match kind {
                // Cast: recv staging rows → output rows (input view = staging, output = the PGL).
                Kind::Cast => push_chunks(
                    &mut scatter,
                    recv_at_of[&(t0.src, j)],
                    t0.rows,
                    &[(rank, t0.dst_row)],
                    chunk,
                ),
                // Reduce: output rows ← every source's rows in recv staging.
                Kind::Reduce => {
                    let peers: Vec<(usize, usize)> = ts
                        .iter()
                        .map(|t| (t.src, recv_at_of[&(t.src, j)]))
                        .collect();
                    push_chunks(&mut scatter, t0.dst_row, t0.rows, &peers, chunk);
                }
            }
        }
        let uploaded = (|| -> anyhow::Result<_> {
            let r = (
                Items::upload(stream, &native_items)?,
                Items::upload(stream, &gather)?,
                Items::upload(stream, &scatter)?,
            );
            stream.synchronize()?;
            Ok(r)
        })();
        let (native_items, gather_items, scatter_items) =
            agree(rdzv, "grpcoll plan (work lists)", uploaded)?;
        Ok(Self {
            kind,
            rank,
            world,
            row_elems,
            op,
            stream: stream.clone(),
            sms,
            device_sms,
            input,
            output,
            input_lse,
            output_lse,
            counters,
            native,
            copy_data,
            copy_lse,
            native_items,
            gather_items,
            scatter_items,
            send_rows,
            recv_rows,
            transfers,
            staging: None,
        })
    }

    fn params(
        &self,
        input: weft_pgl_view,
        output: weft_pgl_view,
        items: &Items,
        row_bytes: usize,
    ) -> anyhow::Result<weft_grpcoll_params> {
        Ok(weft_grpcoll_params {
            input,
            output,
            input_lse: empty_view(),
            output_lse: empty_view(),
            bar: self.counters.device()?,
            items: items.buf.device_ptr(&self.stream).0,
            epoch: 0,
            nitems: items.count,
            row_bytes: row_bytes as u32,
            row_elems: self.row_elems as u32,
            lse_per_row: self.op.lse_per_row() as u32,
            op: self.op.code(),
            synced: 0,
        })
    }

    fn launch(&self, f: &CudaFunction, p: &weft_grpcoll_params, grid: u32) -> anyhow::Result<()> {
        let threads = if std::ptr::eq(f, &self.native) && self.kind == Kind::Reduce {
            REDUCE_THREADS
        } else {
            CAST_THREADS
        };
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the params' views and work lists point at buffers this plan owns (or peers'
        // mapped buffers of the same shapes), alive until the plan is freed; the items stay in
        // bounds of them by construction (validated metadata).
        unsafe { self.stream.launch_builder(f).arg(p).launch(cfg)? };
        Ok(())
    }

    /// The native kernel: start barrier, push / pull, end barrier.
    fn run_native(&mut self) -> anyhow::Result<()> {
        let base = self.counters.begin(1);
        let mut p = self.params(
            self.input.view(),
            self.output.view(),
            &self.native_items,
            self.row_elems * T::DTYPE.size(),
        )?;
        if let (Some(il), Some(ol)) = (&self.input_lse, &self.output_lse) {
            p.input_lse = il.view();
            p.output_lse = ol.view();
        }
        p.epoch = base + 1;
        p.synced = 1;
        self.launch(&self.native, &p, self.sms)
    }

    /// Range-gather → NCCL grouped send/recv → range-scatter (cast) or scatter-reduce (reduce).
    fn run_baseline(&mut self, comm: &Communicator) -> anyhow::Result<()> {
        if comm.world() != self.world || comm.rank() != self.rank {
            bail!(
                "grpcoll baseline: communicator is rank {} of {}, the plan rank {} of {}",
                comm.rank(),
                comm.world(),
                self.rank,
                self.world
            );
        }
        let row_bytes = self.row_elems * T::DTYPE.size();
        let lse_bytes = self.op.lse_per_row() * 4;
        let (sends, recvs): (usize, usize) =
            (self.send_rows.iter().sum(), self.recv_rows.iter().sum());
        if self.staging.is_none() {
            let s = &self.stream;
            let lse = self.input_lse.is_some();
            self.staging = Some(Staging {
                send: s.alloc_zeros::<u8>((sends * row_bytes).max(1))?,
                recv: s.alloc_zeros::<u8>((recvs * row_bytes).max(1))?,
                lse_send: if lse {
                    Some(s.alloc_zeros::<u8>((sends * lse_bytes).max(1))?)
                } else {
                    None
                },
                lse_recv: if lse {
                    Some(s.alloc_zeros::<u8>((recvs * lse_bytes).max(1))?)
                } else {
                    None
                },
            });
        }
        let mut st = self.staging.take().unwrap();
        let done = self.baseline_with(comm, &mut st, sends, recvs);
        self.staging = Some(st);
        done
    }

    fn baseline_with(
        &self,
        comm: &Communicator,
        st: &mut Staging,
        sends: usize,
        recvs: usize,
    ) -> anyhow::Result<()> {
        let row_bytes = self.row_elems * T::DTYPE.size();
        let lse_bytes = self.op.lse_per_row() * 4;
        let (rank, world) = (self.rank, self.world);
        let ptr = |b: &CudaSlice<u8>| b.device_ptr(&self.stream).0;
        let grid = self.device_sms;

        // Range-gather: the input rows each peer needs, packed per peer.
        let send_view = local_view(
            ptr(&st.send),
            rank,
            world,
            sends,
            self.row_elems,
            T::DTYPE.size(),
        );
        let p = self.params(self.input.view(), send_view, &self.gather_items, row_bytes)?;
        self.launch(&self.copy_data, &p, grid)?;
        if let (Some(f), Some(il), Some(ls)) = (&self.copy_lse, &self.input_lse, &st.lse_send) {
            let p = self.params(
                il.view(),
                local_view(ptr(ls), rank, world, sends, self.op.lse_per_row(), 4),
                &self.gather_items,
                lse_bytes,
            )?;
            self.launch(f, &p, grid)?;
        }

        // All-to-all-v: one NCCL group of a send and a receive per peer (nested groups aggregate).
        {
            let _group = NcclGroup::start()?;
            let (mut so, mut ro) = (0usize, 0usize);
            for p in 0..world {
                let (sn, rn) = (self.send_rows[p], self.recv_rows[p]);
                if sn + rn > 0 {
                    let send = st.send.slice(so * row_bytes..(so + sn) * row_bytes);
                    let mut recv = st.recv.slice_mut(ro * row_bytes..(ro + rn) * row_bytes);
                    comm.send_recv(&send, p, &mut recv, p, &self.stream)?;
                    if let (Some(ls), Some(lr)) = (&st.lse_send, &mut st.lse_recv) {
                        let send = ls.slice(so * lse_bytes..(so + sn) * lse_bytes);
                        let mut recv = lr.slice_mut(ro * lse_bytes..(ro + rn) * lse_bytes);
                        comm.send_recv(&send, p, &mut recv, p, &self.stream)?;
                    }
                }
                so += sn;
                ro += rn;
            }
            _group.end()?;
        }

        // Range-scatter / scatter-reduce into the output PGL's final rows.
        let recv_view = local_view(
            ptr(&st.recv),
            rank,
            world,
            recvs,
            self.row_elems,
            T::DTYPE.size(),
        );
        match self.kind {
            Kind::Cast => {
                let p = self.params(
                    recv_view,
                    self.output.view(),
                    &self.scatter_items,
                    row_bytes,
                )?;
                self.launch(&self.copy_data, &p, grid)
            }
            Kind::Reduce => {
                let mut p = self.params(
                    recv_view,
                    self.output.view(),
                    &self.scatter_items,
                    row_bytes,
                )?;
                if let (Some(lr), Some(ol)) = (&st.lse_recv, &self.output_lse) {
                    p.input_lse = local_view(ptr(lr), rank, world, recvs, self.op.lse_per_row(), 4);
                    p.output_lse = ol.view();
                }
                self.launch(&self.native, &p, grid)
            }
        }
    }

    fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()> {
        let synced = self.stream.synchronize().map_err(anyhow::Error::from);
        agree(rdzv, "grpcoll plan free (drain)", synced)?;
        drop(self.staging);
        self.input.free(rdzv)?;
        self.output.free(rdzv)?;
        if let Some(p) = self.input_lse {
            p.free(rdzv)?;
        }
        if let Some(p) = self.output_lse {
            p.free(rdzv)?;
        }
        self.counters.free(rdzv)
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Cast => "group_cast",
        Kind::Reduce => "group_reduce",
    }
}

/// An NCCL group around the baseline's sends and receives; ended on drop if `end` was not reached.
struct NcclGroup {
    open: bool,
}

impl NcclGroup {
    fn start() -> anyhow::Result<Self> {
        cudarc::nccl::result::group_start()
            .map_err(|e| anyhow::anyhow!("ncclGroupStart failed: {e:?}"))?;
        Ok(Self { open: true })
    }
    fn end(mut self) -> anyhow::Result<()> {
        self.open = false;
        cudarc::nccl::result::group_end()
            .map_err(|e| anyhow::anyhow!("ncclGroupEnd failed: {e:?}"))?;
        Ok(())
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if self.open {
            let _ = cudarc::nccl::result::group_end();
        }
    }
}

macro_rules! common_methods {
    () => {
        /// This rank's input rows (`meta.input_rows` of them, `row_elems` each) live at the start
        /// of this PGL; write them before `run` (stream order, or any order completed before it).
        pub fn input(&self) -> &Pgl<T> {
            &self.core.input
        }
        /// This rank's output rows (`meta.output_rows`) at the start of this PGL after `run`.
        pub fn output(&self) -> &Pgl<T> {
            &self.core.output
        }
        pub fn row_elems(&self) -> usize {
            self.core.row_elems
        }
        /// SMs (blocks) the native kernel uses.
        pub fn sms(&self) -> u32 {
            self.core.sms
        }
        /// Every rank's matched transfers (the same list on every rank).
        pub fn transfers(&self) -> &[Transfer] {
            &self.core.transfers
        }
        /// Native path: one launch on the plan's stream (start barrier, transfer, end barrier);
        /// no host synchronisation. Every rank must call it the same number of times.
        pub fn run(&mut self) -> anyhow::Result<()> {
            self.core.run_native()
        }
        /// AlltoAll-v baseline (range-gather, NCCL grouped send/recv, range-scatter or
        /// scatter-reduce) on the plan's stream, with the same inputs and outputs.
        pub fn run_baseline(&mut self, comm: &Communicator) -> anyhow::Result<()> {
            self.core.run_baseline(comm)
        }
        /// The error slot of the native kernel's bounded waits (e.g. for `weft_sync::sync_checked`).
        pub fn error_slot(&self) -> &ErrorSlot {
            self.core.counters.slot()
        }
        /// Waits for the plan's stream; a timed-out barrier becomes an error naming rank and coordinate.
        pub fn synchronize(&self) -> anyhow::Result<()> {
            weft_sync::sync_checked(&self.core.stream, &[self.core.counters.slot()])
        }
        /// Collective: frees the buffers and counters on every rank.
        pub fn free(self, rdzv: &mut Rendezvous) -> anyhow::Result<()> {
            self.core.free(rdzv)
        }
    };
}

/// A GroupCast plan (collective). Any element type (the data are copied as bytes).
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
        Ok(Self {
            core: Core::build(
                Kind::Cast,
                rdzv,
                stream,
                Desc::from(meta),
                row_elems,
                ReduceOp::Sum,
                opts,
            )?,
        })
    }
    common_methods!();
}

/// A GroupReduce plan (collective). Data dtypes f32 and bf16; fp32 accumulation.
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
        Ok(Self {
            core: Core::build(
                Kind::Reduce,
                rdzv,
                stream,
                Desc::from(meta),
                row_elems,
                op,
                opts,
            )?,
        })
    }
    common_methods!();
    pub fn op(&self) -> ReduceOp {
        self.core.op
    }
    /// With [`ReduceOp::Lse`]: this rank's input lse (`input_rows × lse_per_row` f32).
    pub fn input_lse(&self) -> Option<&Pgl<f32>> {
        self.core.input_lse.as_ref()
    }
    /// With [`ReduceOp::Lse`]: the combined lse after `run`.
    pub fn output_lse(&self) -> Option<&Pgl<f32>> {
        self.core.output_lse.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_choice_follows_row_widths() {
        assert_eq!(cast_kernel_name(8192), "weft_grpcoll_cast_v16");
        assert_eq!(cast_kernel_name(12), "weft_grpcoll_cast_v4");
        assert_eq!(cast_kernel_name(6), "weft_grpcoll_cast_v2");
        assert_eq!(cast_kernel_name(3), "weft_grpcoll_cast_v1");
        assert_eq!(
            reduce_kernel_name(DType::Bf16, 128).unwrap(),
            "weft_grpcoll_reduce_bf16_v8"
        );
        assert_eq!(
            reduce_kernel_name(DType::Bf16, 12).unwrap(),
            "weft_grpcoll_reduce_bf16_v1"
        );
        assert_eq!(
            reduce_kernel_name(DType::F32, 12).unwrap(),
            "weft_grpcoll_reduce_f32_v4"
        );
        let e = reduce_kernel_name(DType::U32, 4).unwrap_err().to_string();
        assert!(
            e.contains("data dtype u32 is not supported (supported: f32, bf16)"),
            "{e}"
        );
    }

    #[test]
    fn chunks_cover_the_rows_and_advance_peers() {
        let mut v = Vec::new();
        push_chunks(&mut v, 10, 7, &[(1, 100), (3, 0)], 3);
        assert_eq!(v.len(), 3);
        assert_eq!(
            (
                v[2].row,
                v[2].rows,
                v[2].peer_row[0],
                v[2].peer_row[1],
                v[2].peer[1]
            ),
            (16, 1, 106, 6, 3)
        );
        push_chunks(&mut v, 0, 0, &[(0, 0)], 3);
        assert_eq!(v.len(), 3);
    }

    #[test]
    fn every_kernel_the_plans_name_exists() {
        let img = cubins::GRPCOLL_GRPCOLL.image;
        let has = |name: &str| {
            img.windows(name.len() + 1)
                .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0)
        };
        for b in [16, 8, 4, 2, 1] {
            assert!(has(&cast_kernel_name(b)), "{b}");
        }
        for (d, g) in [
            (DType::F32, 4),
            (DType::F32, 1),
            (DType::Bf16, 8),
            (DType::Bf16, 1),
        ] {
            assert!(has(&reduce_kernel_name(d, g).unwrap()));
        }
    }
}
