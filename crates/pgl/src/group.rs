//! Single-process mode: one process drives several GPUs, with the same `Pgl` API and views.
//! Member i is "rank" i on `contexts[i]`'s device; every member maps every other directly (one
//! address space), so there is nothing to exchange. Backend `Ipc` here means plain `cuMemAlloc`
//! memory with peer access enabled between every pair; `Vmm` maps each device's physical memory
//! once with access granted to every member device.

use crate::backend::Backend;
use crate::driver::check;
use crate::element::PglElement;
use crate::error::{typed, PglError};
use crate::pgl::{byte_size, pci_bus_id, Mode, Own, Peer, Pgl};
use crate::shape::Shape;
use crate::{ipc, vmm};
use anyhow::bail;
use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::CudaContext;
use std::marker::PhantomData;
use std::sync::Arc;
use weft_kernels::abi::WEFT_PGL_MAX_RANKS;

/// The members of a single-process PGL; freed together.
pub struct PglGroup<T: PglElement> {
    members: Vec<Pgl<T>>,
}

/// Enables peer access from every context to every other, naming the first pair without it.
/// Errors: `PglError::Unsupported` for a pair without peer access.
pub fn enable_peer_access(contexts: &[Arc<CudaContext>]) -> Result<(), PglError> {
    for (a, ca) in contexts.iter().enumerate() {
        for (b, cb) in contexts.iter().enumerate() {
            if a == b {
                continue;
            }
            let mut ok = 0;
            // SAFETY: out-parameter, valid devices.
            typed(check(|| "cuDeviceCanAccessPeer".into(), unsafe {
                sys::cuDeviceCanAccessPeer(&mut ok, ca.cu_device(), cb.cu_device())
            }))?;
            if ok != 1 {
                return Err(PglError::Unsupported(format!(
                    "no peer access from member {a} (GPU {}, {}) to member {b} (GPU {}, {})",
                    ca.ordinal(),
                    pci_bus_id(ca.cu_device()),
                    cb.ordinal(),
                    pci_bus_id(cb.cu_device())
                )));
            }
            ca.bind_to_thread()?;
            // SAFETY: both contexts are live.
            let r = unsafe { sys::cuCtxEnablePeerAccess(cb.cu_ctx(), 0) };
            if r != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                check(
                    || {
                        format!(
                            "cuCtxEnablePeerAccess(GPU {} -> GPU {})",
                            ca.ordinal(),
                            cb.ordinal()
                        )
                    },
                    r,
                )
                .map_err(PglError::from_anyhow)?;
            }
        }
    }
    Ok(())
}

impl<T: PglElement> PglGroup<T> {
    /// Allocates `shape` (zero-filled) on each context's device and maps all of them everywhere.
    /// Errors: `Shape` (member count, shape), `Unsupported` (two members on one GPU, no peer
    /// access), `Runtime` (an allocation that does not fit, the driver).
    pub fn alloc(
        contexts: &[Arc<CudaContext>],
        shape: Shape,
        backend: Backend,
    ) -> Result<Self, PglError> {
        let world = contexts.len();
        if world == 0 || world > WEFT_PGL_MAX_RANKS as usize {
            return Err(PglError::Shape(format!(
                "a single-process PGL needs 1 to {WEFT_PGL_MAX_RANKS} GPUs, got {world}"
            )));
        }
        for (a, ca) in contexts.iter().enumerate() {
            if let Some(b) = contexts[..a]
                .iter()
                .position(|cb| cb.cu_device() == ca.cu_device())
            {
                return Err(PglError::Unsupported(format!(
                    "members {b} and {a} both use GPU {}: one GPU per member",
                    ca.ordinal()
                )));
            }
        }
        let bytes = typed(byte_size::<T>(shape))?.max(1);
        enable_peer_access(contexts)?;
        typed(Self::allocate(contexts, shape, backend, bytes))
    }

    fn allocate(
        contexts: &[Arc<CudaContext>],
        shape: Shape,
        backend: Backend,
        bytes: usize,
    ) -> anyhow::Result<Self> {
        let world = contexts.len();
        let devices: Vec<_> = contexts.iter().map(|c| c.cu_device()).collect();
        let mut owns = Vec::with_capacity(world);
        for (i, ctx) in contexts.iter().enumerate() {
            ctx.bind_to_thread()?;
            let (free, _) = ctx.mem_get_info()?;
            if bytes > free {
                bail!(
                    "member {i}: allocation of {bytes} B does not fit: GPU {} has {free} B free",
                    ctx.ordinal()
                );
            }
            let own = match backend {
                Backend::Ipc => Own::Ipc {
                    ptr: ipc::alloc(bytes)?,
                },
                Backend::Vmm => {
                    let g = vmm::granularity(ctx.cu_device())?;
                    let phys = vmm::Physical::create(ctx.cu_device(), vmm::round_up(bytes, g))?;
                    let map = vmm::Mapping::new(&phys, g, &devices)?;
                    Own::Vmm { map, _phys: phys }
                }
            };
            let (ptr, size) = match &own {
                Own::Ipc { ptr } => (*ptr, bytes),
                Own::Vmm { map, .. } => (map.va, map.size),
                Own::Borrowed { .. } => {
                    unreachable!("single-process mode allocates its own memory")
                }
            };
            // SAFETY: fills the memory allocated just above.
            check(|| "cuMemsetD8".into(), unsafe {
                sys::cuMemsetD8_v2(ptr, 0, size)
            })?;
            // The fill is asynchronous on the legacy stream: complete it before any member uses it.
            ctx.synchronize()?;
            owns.push((own, ptr));
        }
        let ptrs: Vec<_> = owns.iter().map(|(_, p)| *p).collect();
        let members = owns
            .into_iter()
            .enumerate()
            .map(|(i, (own, _))| Pgl {
                ctx: contexts[i].clone(),
                shape,
                rank: i,
                world,
                backend,
                mode: Mode::SingleProcess,
                own: Some(own),
                peers: (0..world)
                    .map(|r| {
                        if r == i {
                            Peer::Own
                        } else {
                            Peer::Direct { ptr: ptrs[r] }
                        }
                    })
                    .collect(),
                _t: PhantomData,
            })
            .collect();
        Ok(Self { members })
    }

    pub fn members(&self) -> &[Pgl<T>] {
        &self.members
    }

    pub fn member(&self, i: usize) -> &Pgl<T> {
        &self.members[i]
    }

    /// Synchronises every member's device, then frees every member.
    pub fn free(mut self) -> Result<(), PglError> {
        self.synchronize_all()?;
        self.members.clear();
        Ok(())
    }

    fn synchronize_all(&self) -> Result<(), PglError> {
        for m in &self.members {
            m.ctx.synchronize()?;
        }
        Ok(())
    }
}

impl<T: PglElement> Drop for PglGroup<T> {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize_all() {
            log::error!("synchronising before freeing a single-process PGL: {e:#}");
        }
        self.members.clear();
    }
}
