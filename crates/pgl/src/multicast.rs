//! NVLink multicast (NVSwitch in-network broadcast and reduction) for a VMM-backed PGL, behind
//! an explicit opt-in. NEVER use it on shared machines: a program that uses multicast can put a
//! host's GPUs out of service. The unicast path is weft's default and its tested one.
//!
//! Creating a multicast mapping needs all of: a [`MulticastOptIn`] value in code, the variable
//! `WEFT_ALLOW_MULTICAST=1`, `NCCL_NVLS_ENABLE` not set to 0 (machines that forbid multicast set
//! it), and device support (`CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`). The refusal is checked
//! before any multicast call, and agreed across ranks.
//!
//! Not exercised on hardware by weft's own tests (the lent machines forbid multicast); only the
//! refusal logic is tested.

use crate::agree::agree_typed;
use crate::driver::check;
use crate::element::PglElement;
use crate::error::{typed, PglError};
use crate::pgl::{Own, Pgl};
use crate::vmm;
use crate::Bootstrap;
use anyhow::bail;
use cudarc::driver::sys::{self, CUdeviceptr};
use std::os::fd::{AsRawFd, RawFd};

/// The code-side opt-in. Constructing one states that the caller runs on a machine where NVLink
/// multicast is allowed.
pub struct MulticastOptIn(());

impl MulticastOptIn {
    pub fn nvlink_multicast_is_allowed_on_this_machine() -> Self {
        Self(())
    }
}

/// Ok when multicast may be set up: the environment opts in, the machine does not forbid it,
/// and the device supports it. `var` reads environment variables.
pub fn multicast_permitted(
    var: impl Fn(&str) -> Option<String>,
    device_supports: bool,
) -> Result<(), PglError> {
    let refused = |why: &str| {
        Err(PglError::Unsupported(format!(
            "NVLink multicast refused: {why}"
        )))
    };
    if var("NCCL_NVLS_ENABLE").as_deref().map(str::trim) == Some("0") {
        return refused("NCCL_NVLS_ENABLE=0 is set (this machine forbids multicast)");
    }
    if var("WEFT_ALLOW_MULTICAST").as_deref() != Some("1") {
        return refused("not opted in (set WEFT_ALLOW_MULTICAST=1 on machines that allow it)");
    }
    if !device_supports {
        return refused("the device does not support multicast");
    }
    Ok(())
}

/// A multicast address range bound to every rank's buffer of one PGL: stores through it reach
/// every rank (`multimem.st`), `multimem.ld_reduce` reduces across ranks.
pub struct MulticastMapping {
    map: vmm::Mapping,
    _mc: vmm::Physical,
}

impl MulticastMapping {
    pub fn ptr(&self) -> CUdeviceptr {
        self.map.va
    }
}

/// Collective: creates a multicast object spanning every rank of `pgl` (VMM backend) and maps it
/// (the seed's Appendix F). Refused, on every rank alike, unless [`multicast_permitted`] allows.
pub fn bind_multicast<T: PglElement>(
    rdzv: &mut dyn Bootstrap,
    pgl: &Pgl<T>,
    _opt_in: &MulticastOptIn,
) -> Result<MulticastMapping, PglError> {
    typed(bind(rdzv, pgl))
}

fn bind<T: PglElement>(rdzv: &mut dyn Bootstrap, pgl: &Pgl<T>) -> anyhow::Result<MulticastMapping> {
    let device = pgl.context().cu_device();
    let mut supported = 0;
    // SAFETY: out-parameter, valid device.
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED;
    check(|| "cuDeviceGetAttribute".into(), unsafe {
        sys::cuDeviceGetAttribute(&mut supported, attr, device)
    })?;
    agree_typed(
        rdzv,
        "multicast permission",
        multicast_permitted(|k| std::env::var(k).ok(), supported == 1).map_err(Into::into),
    )?;
    let Some(Own::Vmm { _phys: phys, .. }) = pgl.own.as_ref() else {
        bail!("multicast needs a PGL allocated with the vmm backend");
    };
    pgl.context().bind_to_thread()?;
    // SAFETY: an all-zero prop is valid before the fields below are set.
    let mut prop: sys::CUmulticastObjectProp = unsafe { std::mem::zeroed() };
    prop.numDevices = pgl.world() as u32;
    prop.handleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
    let mut gran = 0;
    let opt = sys::CUmulticastGranularity_flags::CU_MULTICAST_GRANULARITY_RECOMMENDED;
    // SAFETY: out-parameter, valid prop.
    check(|| "cuMulticastGetGranularity".into(), unsafe {
        sys::cuMulticastGetGranularity(&mut gran, &prop, opt)
    })?;
    prop.size = vmm::round_up(phys.size, gran);

    // Rank 0 creates the object and exports it; the others import it.
    let created = if pgl.rank() == 0 {
        let mut handle = 0;
        // SAFETY: out-parameter, valid prop. Reached only through the permission check above.
        check(|| "cuMulticastCreate".into(), unsafe {
            sys::cuMulticastCreate(&mut handle, &prop)
        })
        .and_then(|()| {
            let mc = vmm::Physical {
                handle,
                size: prop.size,
            };
            let fd = mc.export_fd()?;
            Ok((Some(mc), Some(fd)))
        })
    } else {
        Ok((None, None))
    };
    let (mc0, fd0) = agree_typed(rdzv, "multicast create", created)?;
    let mut announce = std::process::id().to_le_bytes().to_vec();
    announce.extend_from_slice(&fd0.as_ref().map_or(-1, |f| f.as_raw_fd()).to_le_bytes());
    let root = rdzv.broadcast(0, &announce)?;
    let mc = match mc0 {
        Some(mc) => Ok(mc),
        None if root.len() != 8 => Err(anyhow::anyhow!(
            "malformed multicast announcement from rank 0: {} bytes, expected 8 (pid, fd)",
            root.len()
        )),
        None => {
            let pid = u32::from_le_bytes(root[0..4].try_into().unwrap());
            let fd = RawFd::from_le_bytes(root[4..8].try_into().unwrap());
            vmm::fd_from_process(pid, fd).and_then(|f| vmm::Physical::import_fd(&f, prop.size))
        }
    };
    let mc = agree_typed(rdzv, "multicast import", mc)?;
    // Every device joins before any memory is bound.
    // SAFETY: valid handle and device.
    let added = check(|| "cuMulticastAddDevice".into(), unsafe {
        sys::cuMulticastAddDevice(mc.handle, device)
    });
    agree_typed(rdzv, "multicast add device", added)?;
    // SAFETY: binds this rank's physical memory at offset 0 of the object.
    let bound = check(|| "cuMulticastBindMem".into(), unsafe {
        sys::cuMulticastBindMem(mc.handle, 0, phys.handle, 0, phys.size, 0)
    });
    agree_typed(rdzv, "multicast bind", bound)?;
    let map = agree_typed(
        rdzv,
        "multicast map",
        vmm::Mapping::new(&mc, gran, &[device]),
    )?;
    // Every rank imported the object above; rank 0's exported descriptor (fd0) closes here.
    drop(fd0);
    Ok(MulticastMapping { map, _mc: mc })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn refused_where_nccl_nvls_is_disabled_even_when_opted_in() {
        let e = multicast_permitted(
            vars(&[("NCCL_NVLS_ENABLE", "0"), ("WEFT_ALLOW_MULTICAST", "1")]),
            true,
        )
        .unwrap_err();
        assert!(e.to_string().contains("NCCL_NVLS_ENABLE=0"), "{e}");
    }

    #[test]
    fn refused_without_the_environment_opt_in() {
        for v in [
            &[][..],
            &[("WEFT_ALLOW_MULTICAST", "0")][..],
            &[("WEFT_ALLOW_MULTICAST", "yes")][..],
        ] {
            let e = multicast_permitted(vars(v), true).unwrap_err();
            assert!(e.to_string().contains("not opted in"), "{e}");
        }
    }

    #[test]
    fn refused_without_device_support_and_permitted_only_with_everything() {
        let ok = [("WEFT_ALLOW_MULTICAST", "1"), ("NCCL_NVLS_ENABLE", "1")];
        assert!(multicast_permitted(vars(&ok), false)
            .unwrap_err()
            .to_string()
            .contains("does not support"));
        assert!(multicast_permitted(vars(&ok), true).is_ok());
        assert!(multicast_permitted(vars(&ok[..1]), true).is_ok());
    }
}
