//! The few NVML queries `weft info` makes (driver version, NVLink link states), loaded at run
//! time so weft runs where NVML is absent. Read-only: nothing here changes any GPU setting.

use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

const NVML_SUCCESS: c_int = 0;
/// NVML_NVLINK_MAX_LINKS in nvml.h (Hopper has 18).
const MAX_LINKS: c_uint = 18;

pub struct Nvml {
    lib: Library,
}

type Device = *mut c_void;

impl Nvml {
    /// Loads and initialises NVML; None when it is not installed or does not start.
    pub fn open() -> Option<Self> {
        // SAFETY: loading the system NVML library runs its (trusted) initialisers only.
        let lib = unsafe {
            Library::new("libnvidia-ml.so.1").or_else(|_| Library::new("libnvidia-ml.so"))
        }
        .ok()?;
        let nvml = Self { lib };
        // SAFETY: nvmlInit_v2 takes no arguments.
        let rc = unsafe { nvml.sym::<unsafe extern "C" fn() -> c_int>(b"nvmlInit_v2\0")?() };
        (rc == NVML_SUCCESS).then_some(nvml)
    }

    fn sym<T>(&self, name: &[u8]) -> Option<Symbol<'_, T>> {
        // SAFETY: callers give each symbol its nvml.h signature.
        unsafe { self.lib.get(name).ok() }
    }

    pub fn driver_version(&self) -> Option<String> {
        let f = self.sym::<unsafe extern "C" fn(*mut c_char, c_uint) -> c_int>(
            b"nvmlSystemGetDriverVersion\0",
        )?;
        let mut buf = [0 as c_char; 96];
        // SAFETY: buffer and its length.
        let rc = unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) };
        // SAFETY: NVML NUL-terminates on success.
        (rc == NVML_SUCCESS).then(|| {
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
    }

    /// Active NVLink links of the GPU at `pci_bus_id` (as CUDA reports it), or None if unknown.
    pub fn active_nvlinks(&self, pci_bus_id: &str) -> Option<u32> {
        let by_pci = self.sym::<unsafe extern "C" fn(*const c_char, *mut Device) -> c_int>(
            b"nvmlDeviceGetHandleByPciBusId_v2\0",
        )?;
        let state = self.sym::<unsafe extern "C" fn(Device, c_uint, *mut c_int) -> c_int>(
            b"nvmlDeviceGetNvLinkState\0",
        )?;
        let id = CString::new(pci_bus_id).ok()?;
        let mut dev: Device = std::ptr::null_mut();
        // SAFETY: valid C string and out-parameter.
        if unsafe { by_pci(id.as_ptr(), &mut dev) } != NVML_SUCCESS {
            return None;
        }
        let mut active = 0;
        for link in 0..MAX_LINKS {
            let mut on: c_int = 0;
            // SAFETY: out-parameter; links that do not exist return an error and are skipped.
            if unsafe { state(dev, link, &mut on) } == NVML_SUCCESS && on == 1 {
                active += 1;
            }
        }
        Some(active)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Some(f) = self.sym::<unsafe extern "C" fn() -> c_int>(b"nvmlShutdown\0") {
            // SAFETY: balances the successful nvmlInit_v2 in open().
            unsafe { f() };
        }
    }
}

/// The kernel driver's version ("580.159.04"), from NVML or /proc; "unknown" if neither answers.
pub fn driver_version() -> String {
    if let Some(v) = Nvml::open().and_then(|n| n.driver_version()) {
        return v;
    }
    std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| parse_proc_version(&t))
        .unwrap_or_else(|| "unknown".into())
}

/// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue …" → "580.159.04".
fn parse_proc_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    line.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_the_proc_driver_version() {
        let t = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Oct 28 2026\nGCC version: gcc 12";
        assert_eq!(super::parse_proc_version(t).as_deref(), Some("580.159.04"));
        assert_eq!(super::parse_proc_version("nothing"), None);
    }
}
