//! The VMM backend: physical memory from `cuMemCreate` (POSIX-fd shareable), exported as a file
//! descriptor, fetched by peers with pidfd_getfd, imported, and mapped into a reserved address
//! range with access granted to the devices that use it. The caller's context must be current.

use crate::driver::check;
use cudarc::driver::sys::{self, CUdevice, CUdeviceptr, CUmemGenericAllocationHandle};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn prop(device: CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is valid (null metadata, no flags).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    };
    p
}

/// The recommended allocation granularity on `device` (2 MiB on Hopper).
pub fn granularity(device: CUdevice) -> anyhow::Result<usize> {
    let mut g = 0;
    let p = prop(device);
    let opt = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
    // SAFETY: out-parameter and a valid prop.
    check(|| "cuMemGetAllocationGranularity".into(), unsafe {
        sys::cuMemGetAllocationGranularity(&mut g, &p, opt)
    })?;
    Ok(g)
}

/// Physical memory; released on drop (mappings keep their own reference).
pub struct Physical {
    pub handle: CUmemGenericAllocationHandle,
    pub size: usize,
}

impl Physical {
    /// `size` must be a multiple of `granularity(device)`.
    pub fn create(device: CUdevice, size: usize) -> anyhow::Result<Self> {
        let mut handle = 0;
        let p = prop(device);
        // SAFETY: out-parameter and a valid prop.
        check(|| format!("cuMemCreate({size} B)"), unsafe {
            sys::cuMemCreate(&mut handle, size, &p, 0)
        })?;
        Ok(Self { handle, size })
    }

    pub fn export_fd(&self) -> anyhow::Result<OwnedFd> {
        let mut fd: RawFd = -1;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for POSIX fds the shareable handle is an int written through the pointer.
        check(|| "cuMemExportToShareableHandle".into(), unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut RawFd as *mut std::ffi::c_void,
                self.handle,
                kind,
                0,
            )
        })?;
        // SAFETY: the driver returned a new descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn import_fd(fd: &OwnedFd, size: usize) -> anyhow::Result<Self> {
        let mut handle = 0;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for POSIX fds the OS handle is the descriptor's value cast to a pointer.
        check(|| "cuMemImportFromShareableHandle".into(), unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                kind,
            )
        })?;
        Ok(Self { handle, size })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        // SAFETY: releases our reference; mappings hold their own.
        if let Err(e) = check(|| "cuMemRelease".into(), unsafe {
            sys::cuMemRelease(self.handle)
        }) {
            log::error!("{e:#}");
        }
    }
}

/// A reserved address range with `physical` mapped at its start; unmapped and freed on drop.
pub struct Mapping {
    pub va: CUdeviceptr,
    pub size: usize,
}

impl Mapping {
    /// Maps `physical` and grants read/write access to each of `devices`.
    pub fn new(
        physical: &Physical,
        alignment: usize,
        devices: &[CUdevice],
    ) -> anyhow::Result<Self> {
        let size = physical.size;
        let mut va = 0;
        // SAFETY: out-parameter; the range is ours until freed in drop.
        check(|| format!("cuMemAddressReserve({size} B)"), unsafe {
            sys::cuMemAddressReserve(&mut va, size, alignment, 0, 0)
        })?;
        // SAFETY: maps the whole physical allocation at the start of the reserved range.
        if let Err(e) = check(|| "cuMemMap".into(), unsafe {
            sys::cuMemMap(va, size, 0, physical.handle, 0)
        }) {
            // SAFETY: the range is reserved and unmapped.
            unsafe { sys::cuMemAddressFree(va, size) };
            return Err(e);
        }
        // From here on, drop unmaps and frees the range.
        let mapping = Self { va, size };
        let access: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&d| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: d,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the range is mapped; one descriptor per device.
        check(|| format!("cuMemSetAccess(devices {devices:?})"), unsafe {
            sys::cuMemSetAccess(va, size, access.as_ptr(), access.len())
        })?;
        Ok(mapping)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.va == 0 {
            return;
        }
        // SAFETY: the range was mapped and reserved by new(); nobody uses it any more (the
        // owner's ordering: a barrier precedes collective unmapping).
        let r = unsafe { sys::cuMemUnmap(self.va, self.size) };
        if let Err(e) = check(|| "cuMemUnmap".into(), r) {
            log::error!("{e:#}");
        }
        // SAFETY: as above.
        let r = unsafe { sys::cuMemAddressFree(self.va, self.size) };
        if let Err(e) = check(|| "cuMemAddressFree".into(), r) {
            log::error!("{e:#}");
        }
    }
}

/// A duplicate of descriptor `fd` of process `pid` (pidfd_open + pidfd_getfd, Linux ≥ 5.6; needs
/// ptrace access to that process, which a job's own ranks under one user have).
pub fn fd_from_process(pid: u32, fd: RawFd) -> anyhow::Result<OwnedFd> {
    // SAFETY: plain syscalls; returned descriptors are owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        anyhow::bail!(
            "pidfd_open({pid}) failed: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a new descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: plain syscall.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        let err = std::io::Error::last_os_error();
        let hint = if err.raw_os_error() == Some(libc::EPERM) {
            " (ptrace permission denied: ranks must run as one user; check /proc/sys/kernel/yama/ptrace_scope, or use WEFT_PGL_BACKEND=ipc)"
        } else {
            ""
        };
        anyhow::bail!("pidfd_getfd(pid {pid}, fd {fd}) failed: {err}{hint}");
    }
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(got as RawFd) })
}

pub fn round_up(n: usize, to: usize) -> usize {
    n.div_ceil(to) * to
}
