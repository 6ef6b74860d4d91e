//! The collective calls of a [`Communicator`]: one NCCL call each on a caller-given stream
//! (lengths checked first), and the NCCL group that several calls of one operation run in.

use super::{check, nccl_argument, Communicator, ReduceOp};
use crate::error::{typed_with, PglError};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{result as nc, NcclType};
use std::sync::atomic::Ordering;

impl Communicator {
    /// `recv[i] = op over ranks of send[i]`; `send` and `recv` have equal length (may alias via in-place slices).
    pub fn all_reduce<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("ncclAllReduce")?;
            if send.len() != recv.len() {
                return Err(nccl_argument(format!(
                    "all_reduce: send has {} elements, recv {}",
                    send.len(),
                    recv.len()
                )));
            }
            let n = recv.len();
            let (s, _gs) = send.device_ptr(stream);
            let (r, _gr) = recv.device_ptr_mut(stream);
            // SAFETY: both buffers hold n elements of T on this communicator's device.
            self.count_collective(); // checked: about to be enqueued
            let res = unsafe {
                nc::all_reduce(
                    s as _,
                    r as _,
                    n,
                    T::as_nccl_type(),
                    op.raw(),
                    self.comm,
                    stream.cu_stream() as _,
                )
            };
            self.finish("ncclAllReduce", res)
        })
    }

    /// In place: `buf[i] = op over ranks of buf[i]` (one NCCL call with send = recv).
    pub fn all_reduce_in_place<T: NcclType, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("ncclAllReduce (in place)")?;
            let n = buf.len();
            let (p, _g) = buf.device_ptr_mut(stream);
            // SAFETY: the buffer holds n elements of T on this communicator's device; NCCL allows
            // sendbuff == recvbuff.
            self.count_collective(); // checked: about to be enqueued
            let res = unsafe {
                nc::all_reduce(
                    p as _,
                    p as _,
                    n,
                    T::as_nccl_type(),
                    op.raw(),
                    self.comm,
                    stream.cu_stream() as _,
                )
            };
            self.finish("ncclAllReduce (in place)", res)
        })
    }

    /// `recv` (n elements) = op over ranks of `send[rank*n .. (rank+1)*n]`; `send` holds world·n.
    pub fn reduce_scatter<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("ncclReduceScatter")?;
            let n = recv.len();
            if send.len() != n * self.world {
                return Err(nccl_argument(format!(
                    "reduce_scatter: send has {} elements, expected world ({}) × recv ({n})",
                    send.len(),
                    self.world
                )));
            }
            let (s, _gs) = send.device_ptr(stream);
            let (r, _gr) = recv.device_ptr_mut(stream);
            // SAFETY: sizes checked above.
            self.count_collective(); // checked: about to be enqueued
            let res = unsafe {
                nc::reduce_scatter(
                    s as _,
                    r as _,
                    n,
                    T::as_nccl_type(),
                    op.raw(),
                    self.comm,
                    stream.cu_stream() as _,
                )
            };
            self.finish("ncclReduceScatter", res)
        })
    }

    /// `recv[r*n .. (r+1)*n]` = rank r's `send` (n elements); `recv` holds world·n.
    pub fn all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("ncclAllGather")?;
            let n = send.len();
            if recv.len() != n * self.world {
                return Err(nccl_argument(format!(
                    "all_gather: recv has {} elements, expected world ({}) × send ({n})",
                    recv.len(),
                    self.world
                )));
            }
            let (s, _gs) = send.device_ptr(stream);
            let (r, _gr) = recv.device_ptr_mut(stream);
            // SAFETY: sizes checked above.
            self.count_collective(); // checked: about to be enqueued
            let res = unsafe {
                nc::all_gather(
                    s as _,
                    r as _,
                    n,
                    T::as_nccl_type(),
                    self.comm,
                    stream.cu_stream() as _,
                )
            };
            self.finish("ncclAllGather", res)
        })
    }

    /// All-to-all with equal blocks: block p of `send` (n = len / world elements) goes to rank p,
    /// and block p of `recv` comes from rank p. One NCCL group of world sends and world receives.
    pub fn all_to_all<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("all_to_all")?;
            if send.len() != recv.len() || send.len() % self.world != 0 {
                return Err(nccl_argument(format!(
                    "all_to_all: send {} and recv {} elements must be equal and divisible by world {}",
                    send.len(),
                    recv.len(),
                    self.world
                )));
            }
            let n = send.len() / self.world;
            let bytes = n * std::mem::size_of::<T>();
            let (s, _gs) = send.device_ptr(stream);
            let (r, _gr) = recv.device_ptr_mut(stream);
            self.count_collective(); // checked: about to be enqueued
            let group = Group::start(self)?;
            for peer in 0..self.world {
                let off = (peer * bytes) as u64;
                // SAFETY: block `peer` of each buffer is in bounds (sizes checked above).
                let rs = unsafe {
                    nc::send(
                        (s + off) as _,
                        n,
                        T::as_nccl_type(),
                        peer as i32,
                        self.comm,
                        stream.cu_stream() as _,
                    )
                };
                self.finish("ncclSend", rs)?;
                let rr = unsafe {
                    nc::recv(
                        (r + off) as _,
                        n,
                        T::as_nccl_type(),
                        peer as i32,
                        self.comm,
                        stream.cu_stream() as _,
                    )
                };
                self.finish("ncclRecv", rr)?;
            }
            group.end()
        })
    }

    /// All-to-all with per-peer ranges, one NCCL group: `send[sends[p]]` goes to rank p and
    /// `recv[recvs[p]]` comes from rank p (element ranges; empty ones are skipped). Every rank's
    /// send range to q must have the length of q's receive range from it (NCCL cannot check it).
    pub fn all_to_all_v<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        sends: &[std::ops::Range<usize>],
        recv: &mut R,
        recvs: &[std::ops::Range<usize>],
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("all_to_all_v")?;
            if sends.len() != self.world || recvs.len() != self.world {
                return Err(nccl_argument(format!(
                    "all_to_all_v: {} send and {} receive ranges, expected one per rank ({})",
                    sends.len(),
                    recvs.len(),
                    self.world
                )));
            }
            for (what, ranges, len) in [("send", sends, send.len()), ("receive", recvs, recv.len())]
            {
                if let Some((p, r)) = ranges
                    .iter()
                    .enumerate()
                    .find(|(_, r)| r.start > r.end || r.end > len)
                {
                    return Err(nccl_argument(format!("all_to_all_v: {what} range {r:?} for rank {p} is outside the {len}-element buffer")));
                }
            }
            let elem = std::mem::size_of::<T>() as u64;
            let (s, _gs) = send.device_ptr(stream);
            let (r, _gr) = recv.device_ptr_mut(stream);
            self.count_collective(); // checked: about to be enqueued
            let group = Group::start(self)?;
            for peer in 0..self.world {
                let (out, inn) = (&sends[peer], &recvs[peer]);
                if !out.is_empty() {
                    // SAFETY: the range is inside `send` (checked above).
                    let rs = unsafe {
                        nc::send(
                            (s + out.start as u64 * elem) as _,
                            out.len(),
                            T::as_nccl_type(),
                            peer as i32,
                            self.comm,
                            stream.cu_stream() as _,
                        )
                    };
                    self.finish("ncclSend", rs)?;
                }
                if !inn.is_empty() {
                    // SAFETY: the range is inside `recv` (checked above).
                    let rr = unsafe {
                        nc::recv(
                            (r + inn.start as u64 * elem) as _,
                            inn.len(),
                            T::as_nccl_type(),
                            peer as i32,
                            self.comm,
                            stream.cu_stream() as _,
                        )
                    };
                    self.finish("ncclRecv", rr)?;
                }
            }
            group.end()
        })
    }

    /// Sends `send` to `to` and receives `recv` from `from` in one group (a ring step when
    /// to = rank+1 and from = rank−1).
    pub fn send_recv<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        to: usize,
        recv: &mut R,
        from: usize,
        stream: &CudaStream,
    ) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable("send_recv")?;
            if to >= self.world || from >= self.world {
                return Err(nccl_argument(format!(
                    "send_recv: peers {to} and {from} must be below world {}",
                    self.world
                )));
            }
            let (send_len, recv_len) = (send.len(), recv.len());
            let (s, _gs) = send.device_ptr(stream);
            let (r, _gr) = recv.device_ptr_mut(stream);
            let group = Group::start(self)?;
            // SAFETY: each buffer's own length is passed.
            let rs = unsafe {
                nc::send(
                    s as _,
                    send_len,
                    T::as_nccl_type(),
                    to as i32,
                    self.comm,
                    stream.cu_stream() as _,
                )
            };
            self.finish("ncclSend", rs)?;
            let rr = unsafe {
                nc::recv(
                    r as _,
                    recv_len,
                    T::as_nccl_type(),
                    from as i32,
                    self.comm,
                    stream.cu_stream() as _,
                )
            };
            self.finish("ncclRecv", rr)?;
            group.end()
        })
    }
}

/// An NCCL group on `comm`; `end` must be called (dropping without it ends the group too,
/// ignoring errors, so an early `?` never leaves NCCL inside a group). While it is open an abort
/// of `comm` is deferred; the outermost group's end runs it.
pub(super) struct Group<'a> {
    comm: &'a Communicator,
    open: bool,
}

impl<'a> Group<'a> {
    pub(super) fn start(comm: &'a Communicator) -> anyhow::Result<Self> {
        check("ncclGroupStart", std::ptr::null_mut(), nc::group_start())?;
        comm.groups.fetch_add(1, Ordering::AcqRel);
        Ok(Self { comm, open: true })
    }

    /// Ends the group; a non-blocking launch is waited out within the budget.
    pub(super) fn end(mut self) -> anyhow::Result<()> {
        self.open = false;
        let r = nc::group_end();
        self.closed();
        self.comm.finish("ncclGroupEnd", r)
    }

    /// After ncclGroupEnd: the outermost group runs a deferred abort.
    fn closed(&self) {
        let comm = self.comm;
        if comm.groups.fetch_sub(1, Ordering::AcqRel) == 1
            && comm.abort_pending.swap(false, Ordering::AcqRel)
        {
            comm.abort_now();
        }
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = nc::group_end();
            self.closed();
        }
    }
}
