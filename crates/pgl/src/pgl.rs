//! `Pgl<T>`: a buffer of the same shape on every rank, with every peer's buffer mapped into this
//! process, and the plain-old-data view kernels take by value.
//!
//! Process mode (one process per GPU): [`Pgl::alloc`] and [`Pgl::share`] are collective over the
//! rendezvous, and so is [`Pgl::free`]: it synchronises, waits until every rank has stopped using
//! every buffer, unmaps the peers, waits again, and only then frees this rank's memory, so no
//! peer ever reads freed memory. Dropping a process-mode `Pgl` without `free` unmaps the peers
//! but keeps this rank's memory alive (a peer might still be reading it) and says so through the
//! `log` facade (a warning).
//!
//! Single-process mode (one process driving several GPUs): see [`crate::PglGroup`].

use crate::agree::agree_typed;
use crate::backend::Backend;
use crate::driver::check;
use crate::element::{DType, PglElement};
use crate::error::PglError;
use crate::shape::Shape;
use crate::Bootstrap;
use crate::{ipc, vmm};
use anyhow::{bail, Context};
use cudarc::driver::sys::{self, CUdevice, CUdeviceptr};
use cudarc::driver::CudaContext;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use weft_kernels::abi::{weft_pgl_view, WEFT_PGL_MAX_RANKS};

/// Whether the PGL spans processes (collective over a rendezvous) or the GPUs of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Process,
    SingleProcess,
}

/// This rank's memory.
pub(crate) enum Own {
    /// Allocated here with cuMemAlloc.
    Ipc { ptr: CUdeviceptr },
    /// The caller's buffer (never freed by weft).
    Borrowed { ptr: CUdeviceptr },
    Vmm {
        map: vmm::Mapping,
        _phys: vmm::Physical,
    },
}

impl Drop for Own {
    fn drop(&mut self) {
        if let Own::Ipc { ptr } = self {
            if let Err(e) = ipc::free(*ptr) {
                log::error!("{e:#}");
            }
        }
        // Borrowed memory is the caller's; VMM fields unmap and release themselves.
    }
}

/// How this process reaches one rank's buffer.
pub(crate) enum Peer {
    /// This rank's own buffer.
    Own,
    /// Not mapped (only while an allocation is being built or torn down).
    Unmapped,
    IpcOpened {
        base: CUdeviceptr,
        ptr: CUdeviceptr,
    },
    Vmm {
        map: vmm::Mapping,
    },
    /// Same address space (single-process mode): nothing to unmap.
    Direct {
        ptr: CUdeviceptr,
    },
}

/// One buffer of a [`Shape`] on every rank, each peer's mapped into this process.
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
/// use weft_pgl::{Backend, Pgl, Shape};
/// // Collective: every rank allocates 1024 x 1024 f32 (zeroed) and maps every peer's buffer.
/// let buf = Pgl::<f32>::alloc(&mut rdzv, &ctx, Shape::new(1, 1, 1024, 1024), Backend::default())?;
/// let next = (rdzv.rank() + 1) % rdzv.world();
/// let _peer_address = buf.peer_ptr(next); // a device address this rank's kernels may write
/// let _view = buf.view(); // every rank's address, by value: a kernel argument (weft/abi/pgl.h)
/// buf.free(&mut rdzv)?; // collective: no rank frees while a peer may still read
/// # Ok(()) }
/// ```
pub struct Pgl<T: PglElement> {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) shape: Shape,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) backend: Backend,
    pub(crate) mode: Mode,
    pub(crate) own: Option<Own>,
    pub(crate) peers: Vec<Peer>,
    pub(crate) _t: PhantomData<T>,
}

/// Bytes of a shape of T, refusing sizes that overflow.
pub(crate) fn byte_size<T: PglElement>(shape: Shape) -> anyhow::Result<usize> {
    shape.validate()?;
    usize::try_from(shape.elems())
        .ok()
        .and_then(|n| n.checked_mul(T::DTYPE.size()))
        .with_context(|| {
            format!(
                "shape {shape} of {} overflows the address space",
                T::DTYPE.name()
            )
        })
}

/// What every rank must agree on before allocating: shape, dtype, backend; plus where it runs.
struct Descriptor {
    shape: Shape,
    dtype: u8,
    backend: u8,
    pci_bus_id: String,
}

impl Descriptor {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [
            self.shape.batch,
            self.shape.depth,
            self.shape.rows,
            self.shape.cols,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.push(self.dtype);
        v.push(self.backend);
        v.extend_from_slice(self.pci_bus_id.as_bytes());
        v
    }

    fn decode(b: &[u8]) -> anyhow::Result<Self> {
        anyhow::ensure!(
            b.len() >= 18,
            "malformed PGL descriptor ({} bytes)",
            b.len()
        );
        let u = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
        Ok(Self {
            shape: Shape::new(u(0), u(1), u(2), u(3)),
            dtype: b[16],
            backend: b[17],
            pci_bus_id: String::from_utf8_lossy(&b[18..]).into_owned(),
        })
    }

    fn describe(&self) -> String {
        let dtype = DType::from_code(self.dtype).map_or("?", |d| d.name());
        let backend = Backend::from_code(self.backend).map_or("?", |b| b.name());
        format!("shape {} of {dtype} with the {backend} backend", self.shape)
    }
}

pub(crate) fn pci_bus_id(device: CUdevice) -> String {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: buffer and its length.
    let r = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, device) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return "unknown".into();
    }
    // SAFETY: NUL-terminated on success.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Ranks whose descriptor differs from rank 0's, as an error naming them.
fn check_agreement(all: &[Descriptor]) -> Result<(), PglError> {
    let first = &all[0];
    let differing: Vec<String> = all
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, d)| (d.shape, d.dtype, d.backend) != (first.shape, first.dtype, first.backend))
        .map(|(r, d)| format!("rank {r} asked for {}", d.describe()))
        .collect();
    if !differing.is_empty() {
        return Err(PglError::RanksDisagree(format!(
            "PGL allocation: ranks disagree: rank 0 asked for {}, {}",
            first.describe(),
            differing.join(", ")
        )));
    }
    Ok(())
}

impl<T: PglElement> Pgl<T> {
    /// Collective: allocates `shape` (zero-filled) on every rank of `rdzv` on `ctx`'s device and
    /// maps every peer's buffer. Every rank must pass the same shape, element type and backend;
    /// a disagreement, an allocation that does not fit, or a pair of ranks without peer access
    /// fails on every rank with an error naming the ranks involved.
    pub fn alloc(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        shape: Shape,
        backend: Backend,
    ) -> Result<Self, PglError> {
        Self::build(rdzv, ctx, shape, backend, None)
    }

    /// Collective: shares a buffer the caller owns (`ptr`, at least `shape`'s bytes, from
    /// cuMemAlloc or an allocator built on it) through CUDA IPC. weft never frees it.
    ///
    /// # Safety
    /// `ptr` must point to device memory of `ctx`'s device holding at least `shape.elems()`
    /// elements of T, live until this `Pgl` is freed.
    pub unsafe fn share(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        shape: Shape,
        ptr: CUdeviceptr,
    ) -> Result<Self, PglError> {
        Self::build(rdzv, ctx, shape, Backend::Ipc, Some(ptr))
    }

    fn build(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        shape: Shape,
        backend: Backend,
        existing: Option<CUdeviceptr>,
    ) -> Result<Self, PglError> {
        let (rank, world) = (rdzv.rank(), rdzv.world());
        if world > WEFT_PGL_MAX_RANKS as usize {
            return Err(PglError::Shape(format!(
                "a PGL spans at most {WEFT_PGL_MAX_RANKS} ranks; this job has {world}"
            )));
        }
        ctx.bind_to_thread()?;
        let device = ctx.cu_device();
        let valid = byte_size::<T>(shape);
        let mine = Descriptor {
            shape,
            dtype: T::DTYPE as u8,
            backend: backend as u8,
            pci_bus_id: pci_bus_id(device),
        };
        let all = rdzv
            .all_gather(&mine.encode())
            .map_err(PglError::from_anyhow)?
            .iter()
            .map(|b| Descriptor::decode(b))
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(|e| PglError::RanksDisagree(format!("{e:#}")))?;
        check_agreement(&all)?;
        let bytes = agree_typed(rdzv, "PGL shape check", valid)?;

        let mut pgl = Self {
            ctx: ctx.clone(),
            shape,
            rank,
            world,
            backend,
            mode: Mode::Process,
            own: None,
            peers: Vec::new(),
            _t: PhantomData,
        };
        pgl.peers = (0..world)
            .map(|r| if r == rank { Peer::Own } else { Peer::Unmapped })
            .collect();
        // A rank whose allocation failed makes every rank fail here (memory allocated on the
        // others is freed by Own's drop); after it, failures tear down collectively.
        let (own, export, _exported_fd) = agree_typed(
            rdzv,
            "PGL allocation",
            allocate_own(ctx, bytes, backend, existing),
        )?;
        pgl.own = Some(own);
        // A failed exchange means a broken rendezvous: no collective teardown is possible then.
        let exports = rdzv.all_gather(&export).map_err(PglError::from_anyhow)?;
        let mapped = map_peers(&mut pgl, &all, &exports);
        if let Err(e) = agree_typed(rdzv, "PGL peer mapping", mapped) {
            let _ = pgl.release(rdzv);
            return Err(e);
        }
        // Every peer holds its own reference now; the exported descriptor (_exported_fd) may close.
        rdzv.barrier().map_err(PglError::from_anyhow)?;
        Ok(pgl)
    }
}

/// Allocates (or adopts) this rank's memory, zero-fills it and exports it for the peers.
fn allocate_own(
    ctx: &Arc<CudaContext>,
    bytes: usize,
    backend: Backend,
    existing: Option<CUdeviceptr>,
) -> anyhow::Result<(Own, Vec<u8>, Option<OwnedFd>)> {
    let device = ctx.cu_device();
    if existing.is_none() {
        let (free, total) = ctx.mem_get_info()?;
        if bytes > free {
            bail!(
                "allocation of {bytes} B ({:.2} GiB) does not fit: GPU {} has {free} B free of {total} B",
                bytes as f64 / (1u64 << 30) as f64,
                ctx.ordinal()
            );
        }
    }
    let nonzero = bytes.max(1);
    match (backend, existing) {
        (Backend::Ipc, Some(ptr)) => Ok((Own::Borrowed { ptr }, ipc::export(ptr)?.to_vec(), None)),
        (Backend::Ipc, None) => {
            let ptr = ipc::alloc(nonzero)?;
            let own = Own::Ipc { ptr }; // frees on an early return below
                                        // SAFETY: fills the allocation made just above.
            check(|| "cuMemsetD8".into(), unsafe {
                sys::cuMemsetD8_v2(ptr, 0, nonzero)
            })?;
            // The fill runs asynchronously on the legacy stream, unordered with weft's streams and
            // with peers: it must be done before the buffer is exported or used.
            ctx.synchronize()?;
            let export = ipc::export(ptr)?.to_vec();
            Ok((own, export, None))
        }
        (Backend::Vmm, None) => {
            let size = vmm::round_up(nonzero, vmm::granularity(device)?);
            let phys = vmm::Physical::create(device, size)?;
            let map = vmm::Mapping::new(&phys, vmm::granularity(device)?, &[device])?;
            // SAFETY: fills the mapping made just above.
            check(|| "cuMemsetD8".into(), unsafe {
                sys::cuMemsetD8_v2(map.va, 0, size)
            })?;
            ctx.synchronize()?; // as above: the fill completes before the export
            let fd = phys.export_fd()?;
            let mut export = Vec::with_capacity(16);
            export.extend_from_slice(&std::process::id().to_le_bytes());
            export.extend_from_slice(&fd.as_raw_fd().to_le_bytes());
            export.extend_from_slice(&(size as u64).to_le_bytes());
            Ok((Own::Vmm { map, _phys: phys }, export, Some(fd)))
        }
        (Backend::Vmm, Some(_)) => bail!("sharing an existing buffer needs the ipc backend"),
    }
}

/// Maps every peer's exported buffer into this process.
fn map_peers<T: PglElement>(
    pgl: &mut Pgl<T>,
    all: &[Descriptor],
    exports: &[Vec<u8>],
) -> anyhow::Result<()> {
    let device = pgl.ctx.cu_device();
    for (r, export) in exports.iter().enumerate() {
        if r == pgl.rank {
            continue;
        }
        check_peer_access(pgl.rank, device, r, &all[r].pci_bus_id)?;
        let what = || {
            format!(
                "rank {} mapping rank {r}'s buffer (GPU {})",
                pgl.rank, all[r].pci_bus_id
            )
        };
        pgl.peers[r] = match pgl.backend {
            Backend::Ipc => {
                let (base, ptr) = ipc::open(export).with_context(what)?;
                Peer::IpcOpened { base, ptr }
            }
            Backend::Vmm => {
                anyhow::ensure!(export.len() == 16, "malformed VMM export from rank {r}");
                let pid = u32::from_le_bytes(export[0..4].try_into().unwrap());
                let fd = i32::from_le_bytes(export[4..8].try_into().unwrap());
                let size = u64::from_le_bytes(export[8..16].try_into().unwrap()) as usize;
                let local_fd = vmm::fd_from_process(pid, fd).with_context(what)?;
                let phys = vmm::Physical::import_fd(&local_fd, size).with_context(what)?;
                let map = vmm::Mapping::new(&phys, vmm::granularity(device)?, &[device])
                    .with_context(what)?;
                // The mapping holds the memory; our handle and descriptor may go.
                Peer::Vmm { map }
            }
        };
    }
    Ok(())
}

/// Errors naming the pair when `peer`'s GPU is visible here and this GPU cannot access it.
fn check_peer_access(
    rank: usize,
    device: CUdevice,
    peer: usize,
    peer_pci: &str,
) -> anyhow::Result<()> {
    let Ok(id) = std::ffi::CString::new(peer_pci) else {
        return Ok(());
    };
    let mut peer_dev = 0;
    // SAFETY: out-parameter and a NUL-terminated id.
    if unsafe { sys::cuDeviceGetByPCIBusId(&mut peer_dev, id.as_ptr()) }
        != sys::CUresult::CUDA_SUCCESS
    {
        return Ok(()); // not visible in this process: the mapping itself will tell
    }
    if peer_dev == device {
        if crate::gpu::shared_gpu_allowed()? {
            return Ok(()); // mapping a peer process's memory on the same GPU works
        }
        return Err(PglError::Unsupported(format!(
            "ranks {rank} and {peer} both use GPU {peer_pci}: a PGL needs one GPU per rank \
             (set {}=1 to allow shared GPUs for correctness runs)",
            crate::gpu::SHARED_GPU_VAR
        ))
        .into());
    }
    let mut ok = 0;
    // SAFETY: out-parameter and valid devices.
    check(|| "cuDeviceCanAccessPeer".into(), unsafe {
        sys::cuDeviceCanAccessPeer(&mut ok, device, peer_dev)
    })?;
    if ok != 1 {
        return Err(PglError::Unsupported(format!(
            "no peer access between rank {rank} (GPU {}) and rank {peer} (GPU {peer_pci})",
            pci_bus_id(device)
        ))
        .into());
    }
    Ok(())
}

impl<T: PglElement> Pgl<T> {
    pub fn shape(&self) -> Shape {
        self.shape
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world(&self) -> usize {
        self.world
    }
    pub fn backend(&self) -> Backend {
        self.backend
    }
    /// Elements per rank.
    pub fn len(&self) -> usize {
        self.shape.elems() as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// This rank's buffer.
    pub fn local_ptr(&self) -> CUdeviceptr {
        match self.own.as_ref().expect("a live Pgl owns its memory") {
            Own::Ipc { ptr } | Own::Borrowed { ptr } => *ptr,
            Own::Vmm { map, .. } => map.va,
        }
    }

    /// Rank `r`'s buffer as mapped into this process.
    pub fn peer_ptr(&self, r: usize) -> CUdeviceptr {
        assert!(
            r < self.world,
            "rank {r} out of range for a PGL of {} ranks",
            self.world
        );
        match &self.peers[r] {
            Peer::Own => self.local_ptr(),
            Peer::IpcOpened { ptr, .. } | Peer::Direct { ptr } => *ptr,
            Peer::Vmm { map } => map.va,
            Peer::Unmapped => panic!("rank {r}'s buffer is not mapped"),
        }
    }

    /// The plain-old-data view kernels take by value.
    pub fn view(&self) -> weft_pgl_view {
        let mut base = [0u64; WEFT_PGL_MAX_RANKS as usize];
        for (r, b) in base.iter_mut().enumerate().take(self.world) {
            *b = self.peer_ptr(r);
        }
        weft_pgl_view {
            base,
            shape: self.shape.raw(),
            rank: self.rank as i32,
            world: self.world as i32,
            elem_bytes: T::DTYPE.size() as u32,
            reserved: 0,
        }
    }

    /// Collective: frees this PGL on every rank (see the module docs for the ordering).
    pub fn free(mut self, rdzv: &mut dyn Bootstrap) -> Result<(), PglError> {
        if self.mode != Mode::Process {
            return Err(PglError::Unsupported(
                "a single-process PGL is freed through its PglGroup".into(),
            ));
        }
        self.release(rdzv)
    }

    /// Synchronise; barrier (nobody uses any buffer); unmap peers; barrier (nobody maps ours);
    /// free our memory.
    fn release(&mut self, rdzv: &mut dyn Bootstrap) -> Result<(), PglError> {
        self.ctx.bind_to_thread()?;
        let synced = self.ctx.synchronize().map_err(anyhow::Error::from);
        agree_typed(rdzv, "PGL free (synchronise)", synced)?;
        let unmapped = self.unmap_peers();
        agree_typed(rdzv, "PGL free (unmap peers)", unmapped)?;
        self.free_own();
        Ok(())
    }

    pub(crate) fn unmap_peers(&mut self) -> anyhow::Result<()> {
        let mut first_error = Ok(());
        for p in self.peers.iter_mut() {
            if let Peer::IpcOpened { base, .. } = p {
                if let Err(e) = ipc::close(*base) {
                    first_error = first_error.and(Err(e));
                }
            }
            if !matches!(p, Peer::Own) {
                *p = Peer::Unmapped; // drops VMM mappings (unmap + address free)
            }
        }
        first_error
    }

    /// Frees this rank's memory (errors are reported by Own's drop).
    pub(crate) fn free_own(&mut self) {
        self.own.take();
    }
}

impl<T: PglElement> Drop for Pgl<T> {
    fn drop(&mut self) {
        if self.own.is_none() {
            return; // freed
        }
        let _ = self.ctx.bind_to_thread();
        let _ = self.ctx.synchronize();
        if let Err(e) = self.unmap_peers() {
            log::error!("rank {}: {e:#}", self.rank);
        }
        match self.mode {
            // Only PglGroup drops single-process members, after synchronising every device.
            Mode::SingleProcess => self.free_own(),
            Mode::Process if self.world == 1 => self.free_own(),
            Mode::Process => {
                log::warn!(
                    "rank {}: a {}-rank PGL of shape {} was dropped without free(); its memory stays \
                     allocated until the process exits, since a peer may still read it",
                    self.rank, self.world, self.shape
                );
                if let Some(own) = self.own.take() {
                    std::mem::forget(own);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(shape: Shape, dtype: DType, backend: Backend) -> Descriptor {
        Descriptor {
            shape,
            dtype: dtype as u8,
            backend: backend as u8,
            pci_bus_id: "0000:01:00.0".into(),
        }
    }

    #[test]
    fn descriptors_round_trip() {
        let x = d(Shape::new(2, 3, 4, 5), DType::Bf16, Backend::Ipc);
        let y = Descriptor::decode(&x.encode()).unwrap();
        assert_eq!(
            (y.shape, y.dtype, y.backend, y.pci_bus_id.as_str()),
            (x.shape, x.dtype, x.backend, "0000:01:00.0")
        );
    }

    #[test]
    fn disagreements_name_every_differing_rank() {
        let s = Shape::vector(16);
        let all = [
            d(s, DType::F32, Backend::Vmm),
            d(s, DType::F32, Backend::Vmm),
            d(Shape::vector(17), DType::F32, Backend::Vmm),
            d(s, DType::Bf16, Backend::Vmm),
            d(s, DType::F32, Backend::Ipc),
        ];
        let e = check_agreement(&all).unwrap_err().to_string();
        assert!(
            e.contains("rank 0 asked for shape (1, 1, 1, 16) of f32 with the vmm backend"),
            "{e}"
        );
        assert!(e.contains("rank 2 asked for shape (1, 1, 1, 17)"), "{e}");
        assert!(
            e.contains("rank 3 asked for shape (1, 1, 1, 16) of bf16"),
            "{e}"
        );
        assert!(
            e.contains("rank 4 asked for shape (1, 1, 1, 16) of f32 with the ipc backend"),
            "{e}"
        );
        assert!(!e.contains("rank 1 "), "{e}");
        assert!(check_agreement(&all[..2]).is_ok());
    }

    #[test]
    fn byte_sizes_check_dimensions_and_overflow() {
        assert_eq!(byte_size::<f32>(Shape::new(2, 3, 4, 5)).unwrap(), 480);
        assert!(byte_size::<f32>(Shape::new(1, 1, 0, 5)).is_err());
        assert!(
            byte_size::<u64>(Shape::new(u32::MAX, u32::MAX, u32::MAX, u32::MAX))
                .unwrap_err()
                .to_string()
                .contains("overflows")
        );
    }
}
