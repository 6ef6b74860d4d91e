//! The AlltoAll-v baseline behind the same plan (also the native path's cross-check): convert
//! (when the communication dtype is narrower) → range-gather into a packed send buffer per peer
//! (a split with fan-out k is copied k times) → one NCCL group of per-peer send/recv (nested in an
//! outer group: one all-to-all-v) → range-scatter (cast) or scatter-reduce (reduce, and a cast
//! widened back) into the same output PGLs. Same kernels as the native path, without barriers,
//! over all SMs. Staging buffers are allocated on the first run.

use crate::error::GrpcollError;
use crate::meta::Kind;
use crate::plan::{Core, Path};
use anyhow::bail;
use cudarc::driver::{CudaSlice, DevicePtr};
use weft_kernels::abi::{
    weft_pgl_shape, weft_pgl_view, WEFT_GRPCOLL_ACCUMULATE, WEFT_GRPCOLL_CONVERT,
    WEFT_GRPCOLL_TRANSFER,
};
use weft_pgl::nccl::Communicator;
use weft_pgl::PglElement;

/// Per tensor: send and receive buffers in the communication dtype; and for op Lse, the lse's.
pub(crate) struct Staging {
    send: Vec<CudaSlice<u8>>,
    recv: Vec<CudaSlice<u8>>,
    lse: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
}

/// A view whose every rank's base is `ptr` (a local staging buffer, indexed by peer in the items).
fn local_view(ptr: u64, rank: usize, world: usize, rows: usize, row_bytes: usize) -> weft_pgl_view {
    let mut base = [0u64; 16];
    base.iter_mut().take(world).for_each(|b| *b = ptr);
    weft_pgl_view {
        base,
        shape: weft_pgl_shape {
            batch: 1,
            depth: 1,
            rows: rows as u32,
            cols: row_bytes as u32,
        },
        rank: rank as i32,
        world: world as i32,
        elem_bytes: 1,
        reserved: 0,
    }
}

impl<T: PglElement> Core<T> {
    pub(crate) fn run_baseline(&mut self, comm: &Communicator) -> anyhow::Result<()> {
        if self.device.is_some() {
            bail!(GrpcollError::Unsupported("grpcoll baseline: the AlltoAll-v path needs host metadata; this plan's metadata lives on the GPU".to_string()));
        }
        if comm.world() != self.world || comm.rank() != self.rank {
            bail!(GrpcollError::Unsupported(format!(
                "grpcoll baseline: communicator is rank {} of {}, the plan rank {} of {}",
                comm.rank(),
                comm.world(),
                self.rank,
                self.world
            )));
        }
        if self.staging.is_none() {
            let s = &self.stream;
            let sends: usize = self.layout.send_rows.iter().sum();
            let recvs: usize = self.layout.recv_rows.iter().sum();
            let comm_rows: Vec<usize> = self
                .tensors
                .iter()
                .map(|t| t.row_elems * self.comm.size())
                .collect();
            let lse_bytes = self.op.lse_per_row() * 4;
            self.staging = Some(Staging {
                send: comm_rows
                    .iter()
                    .map(|b| s.alloc_zeros::<u8>((sends * b).max(1)))
                    .collect::<Result<_, _>>()?,
                recv: comm_rows
                    .iter()
                    .map(|b| s.alloc_zeros::<u8>((recvs * b).max(1)))
                    .collect::<Result<_, _>>()?,
                lse: match lse_bytes {
                    0 => None,
                    b => Some((
                        s.alloc_zeros::<u8>((sends * b).max(1))?,
                        s.alloc_zeros::<u8>((recvs * b).max(1))?,
                    )),
                },
            });
        }
        let mut st = self.staging.take().unwrap();
        let done = self.baseline_with(comm, &mut st);
        self.staging = Some(st);
        done
    }

    fn baseline_with(&self, comm: &Communicator, st: &mut Staging) -> anyhow::Result<()> {
        let (rank, world) = (self.rank, self.world);
        let ptr = |b: &CudaSlice<u8>| b.device_ptr(&self.stream).0;
        let grid = self.device_sms;
        let sends: usize = self.layout.send_rows.iter().sum();
        let recvs: usize = self.layout.recv_rows.iter().sum();
        let comm_bytes: Vec<usize> = self
            .tensors
            .iter()
            .map(|t| t.row_elems * self.comm.size())
            .collect();
        let lse_bytes = self.op.lse_per_row() * 4;

        // Convert: this rank's inputs into its staging PGLs in the communication dtype.
        if self.converts() {
            let mut p = self.params(&self.data_views(), &self.native_items);
            p.flags = WEFT_GRPCOLL_CONVERT;
            self.launch(&self.native, &p, grid)?;
        }
        // Range-gather: the rows each peer needs, packed per peer, in the communication dtype.
        let gather: Vec<_> = self
            .tensors
            .iter()
            .enumerate()
            .map(|(t, tt)| {
                let from = tt.staging.as_ref().map_or(tt.input.view(), |s| s.view());
                (
                    from,
                    local_view(ptr(&st.send[t]), rank, world, sends, comm_bytes[t]),
                    comm_bytes[t],
                )
            })
            .collect();
        let mut p = self.params(&gather, &self.gather_items);
        p.flags = WEFT_GRPCOLL_TRANSFER;
        self.launch(&self.copy_comm, &p, grid)?;
        if let (Some(f), Some(il), Some((ls, _))) = (&self.copy_lse, &self.input_lse, &st.lse) {
            let views = [(
                il.view(),
                local_view(ptr(ls), rank, world, sends, lse_bytes),
                lse_bytes,
            )];
            let mut p = self.params(&views, &self.gather_items);
            p.flags = WEFT_GRPCOLL_TRANSFER;
            self.launch(f, &p, grid)?;
        }

        // All-to-all-v: one NCCL group of a send and a receive per peer and tensor.
        let stream = &self.stream;
        let (send_rows, recv_rows) = (&self.layout.send_rows, &self.layout.recv_rows);
        comm.group(|| {
            let (mut so, mut ro) = (0usize, 0usize);
            for peer in 0..world {
                let (sn, rn) = (send_rows[peer], recv_rows[peer]);
                if sn + rn > 0 {
                    for (t, &b) in comm_bytes.iter().enumerate() {
                        let send = st.send[t].slice(so * b..(so + sn) * b);
                        let mut recv = st.recv[t].slice_mut(ro * b..(ro + rn) * b);
                        comm.send_recv(&send, peer, &mut recv, peer, stream)?;
                    }
                    if let Some((ls, lr)) = &mut st.lse {
                        let b = lse_bytes;
                        let send = ls.slice(so * b..(so + sn) * b);
                        let mut recv = lr.slice_mut(ro * b..(ro + rn) * b);
                        comm.send_recv(&send, peer, &mut recv, peer, stream)?;
                    }
                }
                so += sn;
                ro += rn;
            }
            Ok(())
        })?;

        // Range-scatter / scatter-reduce into the output PGLs' final rows.
        let scatter: Vec<_> = self
            .tensors
            .iter()
            .enumerate()
            .map(|(t, tt)| {
                (
                    local_view(ptr(&st.recv[t]), rank, world, recvs, comm_bytes[t]),
                    tt.output.view(),
                    comm_bytes[t],
                )
            })
            .collect();
        let mut p = self.params(&scatter, &self.scatter_items);
        p.flags = WEFT_GRPCOLL_TRANSFER;
        match (self.kind, self.path) {
            (Kind::Cast, Path::Push) => self.launch(&self.copy_comm, &p, grid),
            _ => {
                if self.opts.accumulate {
                    p.flags |= WEFT_GRPCOLL_ACCUMULATE;
                }
                if let (Some((_, lr)), Some(ol)) = (&st.lse, &self.output_lse) {
                    p.input_lse = local_view(ptr(lr), rank, world, recvs, lse_bytes);
                    p.output_lse = ol.view();
                }
                self.launch(&self.native, &p, grid)
            }
        }
    }
}
