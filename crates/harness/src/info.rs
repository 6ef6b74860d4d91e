//! `weft info`: what this host offers weft. Read-only; multicast support is read, never used.

use crate::nvml::{self, Nvml};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use weft_pgl::gpu::{self, GpuAvailability};

/// One GPU as the driver describes it.
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub sms: i32,
    pub cc: (i32, i32),
    pub mem_bytes: usize,
    pub l2_bytes: i32,
    pub pci_bus_id: String,
    pub multicast_supported: bool,
}

fn attr(dev: sys::CUdevice, a: Attr) -> anyhow::Result<i32> {
    // SAFETY: valid device handle from cuDeviceGet.
    Ok(unsafe { cudarc::driver::result::device::get_attribute(dev, a) }?)
}

pub fn gpu_info(ordinal: usize) -> anyhow::Result<GpuInfo> {
    use cudarc::driver::result::device;
    let dev = device::get(ordinal as i32)?;
    let mut bus = [0 as std::ffi::c_char; 32];
    // SAFETY: buffer and its length; dev is valid.
    let rc = unsafe { sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) };
    let pci_bus_id = if rc == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: NUL-terminated by the driver on success.
        unsafe { std::ffi::CStr::from_ptr(bus.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    } else {
        "unknown".into()
    };
    Ok(GpuInfo {
        ordinal,
        name: device::get_name(dev)?,
        sms: attr(dev, Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        cc: (
            attr(dev, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(dev, Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        // SAFETY: valid device handle.
        mem_bytes: unsafe { device::total_mem(dev) }?,
        l2_bytes: attr(dev, Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        pci_bus_id,
        multicast_supported: attr(dev, Attr::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)? == 1,
    })
}

/// Whether `a` can map `b`'s memory (cuDeviceCanAccessPeer).
fn can_access_peer(a: usize, b: usize) -> anyhow::Result<bool> {
    use cudarc::driver::result::device;
    let (da, db) = (device::get(a as i32)?, device::get(b as i32)?);
    let mut ok = 0;
    // SAFETY: out-parameter and valid device handles.
    let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut ok, da, db) };
    anyhow::ensure!(
        rc == sys::CUresult::CUDA_SUCCESS,
        "cuDeviceCanAccessPeer({a}, {b}) failed: {rc:?}"
    );
    Ok(ok == 1)
}

/// Prints the report; an error when no GPU is usable (the message says why).
pub fn print() -> anyhow::Result<()> {
    println!(
        "weft {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        env!("WEFT_COMMIT")
    );
    let count = match gpu::probe() {
        GpuAvailability::Absent { reason } => anyhow::bail!("no GPU available: {reason}"),
        GpuAvailability::Present { count } => count,
    };
    let (cu_major, cu_minor) = gpu::driver_cuda_version()?;
    let nccl = match weft_pgl::nccl::version() {
        Ok((a, b, c)) => format!("{a}.{b}.{c}"),
        Err(e) => format!("unavailable ({e})"),
    };
    println!(
        "driver {}, CUDA driver API {cu_major}.{cu_minor}, NCCL {nccl}",
        nvml::driver_version()
    );
    let nvml = Nvml::open();
    let infos: Vec<GpuInfo> = (0..count).map(gpu_info).collect::<anyhow::Result<_>>()?;
    for g in &infos {
        let links = nvml
            .as_ref()
            .and_then(|n| n.active_nvlinks(&g.pci_bus_id))
            .map_or("unknown (NVML unavailable)".to_string(), |l| l.to_string());
        println!(
            "GPU {}: {}, sm_{}{}, {} SMs, {:.1} GiB, L2 {} MiB, PCI {}, NVLink links active: {links}, \
             multicast: {} (read only; weft never uses it unless opted in)",
            g.ordinal,
            g.name,
            g.cc.0,
            g.cc.1,
            g.sms,
            g.mem_bytes as f64 / (1u64 << 30) as f64,
            g.l2_bytes >> 20,
            g.pci_bus_id,
            if g.multicast_supported { "supported" } else { "not supported" },
        );
    }
    if count > 1 {
        println!("peer access (row can map column):");
        print!("     ");
        for b in 0..count {
            print!("{b:>3}");
        }
        println!();
        for a in 0..count {
            print!("  {a:>3}");
            for b in 0..count {
                let cell = if a == b {
                    "-"
                } else if can_access_peer(a, b)? {
                    "y"
                } else {
                    "n"
                };
                print!("{cell:>3}");
            }
            println!();
        }
    }
    Ok(())
}
