//! weft-kernels: weft's CUDA C++ kernels (`kernels/` at the workspace root), the folders its
//! dependents enable (a cargo feature per folder) compiled for sm_90a by this crate's build script, embedded as cubins, plus the plain-old-data structs that
//! kernels and Rust share (declared once in `kernels/include/weft/abi/*.h`, bound with bindgen).
//!
//! Host crates load a module with [`Cubin::load`] (once per primary context and cubin) and
//! launch its functions through cudarc.

use cudarc::driver::{CudaContext, CudaModule, DeviceRepr, DriverError};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// One compiled `.cu` file.
#[derive(Clone, Copy, Debug)]
pub struct Cubin {
    /// Workspace-relative source path, for messages.
    pub source: &'static str,
    /// The sm_90a ELF image.
    pub image: &'static [u8],
}

impl Cubin {
    /// The image's module in `ctx`: in a primary context, loaded at the first call (the driver
    /// checks that it matches the device's architecture) and the same module at every later one;
    /// in a context of its own (`CudaContext::new_non_primary`), loaded afresh each time.
    ///
    /// Cached modules stay loaded, with the primary context they hold, until the process exits:
    /// a plan made and dropped in a loop then loads nothing (a GEMM cubin is megabytes; on H100
    /// hosts the driver kept about 129 KiB of device memory per load and unload,
    /// results/trials/nvidia-h100-x1-2026-11-26-module-cache/). Holding the context keeps its
    /// handle from being reused while cached. Device globals are then per (context, cubin) for
    /// the process: weft's only one, the error-report claim, is set just before a trap, which
    /// poisons the process's contexts. Function attributes are shared the same way: weft sets
    /// only each function's dynamic shared memory limit, always to the same value for a given
    /// function. The key is the cubin's source path, not its address (a `const` may have a copy
    /// per crate).
    pub fn load(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaModule>, DriverError> {
        if !ctx.is_primary() {
            // A context of its own is destroyed when its last user drops it: not held here.
            return ctx.load_module(Ptx::from_binary(self.image.to_vec()));
        }
        let key = (ctx.cu_ctx() as usize, self.source);
        // A panic while holding the lock leaves the map consistent (insert is the last step).
        // Loads on other contexts wait for this one: loads are rare once cached.
        let mut cache = modules().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cache.get(&key) {
            return Ok(m.clone());
        }
        let m = ctx.load_module(Ptx::from_binary(self.image.to_vec()))?;
        cache.insert(key, m.clone());
        Ok(m)
    }
}

type ModuleKey = (usize, &'static str);

/// Every module [`Cubin::load`] has cached, by (primary context handle, cubin source path).
fn modules() -> &'static Mutex<HashMap<ModuleKey, Arc<CudaModule>>> {
    static MODULES: OnceLock<Mutex<HashMap<ModuleKey, Arc<CudaModule>>>> = OnceLock::new();
    MODULES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How many modules [`Cubin::load`] holds (all primary contexts): for tests and reports.
pub fn loaded_modules() -> usize {
    modules().lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// weft's device headers (`kernels/include`) where this crate was built: `-I` this for NVRTC or
/// nvcc to include `weft/sync.cuh` and the rest in a kernel of your own (build scripts: read
/// `DEP_WEFT_KERNELS_INCLUDE` instead, see `examples/own-kernel`).
pub const INCLUDE_DIR: &str = env!("WEFT_KERNELS_INCLUDE_DIR");

/// The embedded cubins, one constant per `kernels/<enabled folder>/*.cu` (path with `/` → `_`,
/// upper case).
pub mod cubins {
    use super::Cubin;
    include!(concat!(env!("OUT_DIR"), "/cubins.rs"));
}

/// Structs shared with the kernels, generated from `kernels/include/weft/abi.h`.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code
)]
pub mod abi {
    include!(concat!(env!("OUT_DIR"), "/abi.rs"));
}

// SAFETY: these are `#[repr(C)]` plain-old-data structs whose layout bindgen checked against
// the same header the kernels include; they are passed to kernels by value.
unsafe impl DeviceRepr for abi::weft_roundtrip_params {}
unsafe impl DeviceRepr for abi::weft_word_compare_params {}
unsafe impl DeviceRepr for abi::weft_bound_compare_params {}
unsafe impl DeviceRepr for abi::weft_abs_to_f32_params {}
unsafe impl DeviceRepr for abi::weft_pgl_view {}
unsafe impl DeviceRepr for abi::weft_pgl_shape {}
unsafe impl DeviceRepr for abi::weft_tile_coord {}
unsafe impl DeviceRepr for abi::weft_sync_counters {}
unsafe impl DeviceRepr for abi::weft_stress_params {}
unsafe impl DeviceRepr for abi::weft_laps_params {}
unsafe impl DeviceRepr for abi::weft_latency_params {}
unsafe impl DeviceRepr for abi::weft_timeout_params {}
unsafe impl DeviceRepr for abi::weft_grpcoll_params {}
unsafe impl DeviceRepr for abi::weft_grpcoll_layout_params {}
unsafe impl DeviceRepr for abi::weft_kernel_barrier_view {}
unsafe impl DeviceRepr for abi::weft_kernel_barrier_wait_params {}
unsafe impl DeviceRepr for abi::weft_persistent_compute_params {}
unsafe impl DeviceRepr for abi::weft_comm_copy_params {}
unsafe impl DeviceRepr for abi::weft_gemm_params {}
unsafe impl DeviceRepr for abi::weft_tile_allreduce_params {}
unsafe impl DeviceRepr for abi::weft_gemm_group_wait_params {}
unsafe impl DeviceRepr for abi::weft_gemm_peer_flags_params {}
unsafe impl DeviceRepr for abi::weft_gemm_row_slots_check_params {}
unsafe impl DeviceRepr for abi::weft_gemm_restore_params {}
unsafe impl DeviceRepr for abi::weft_gemm_slot_scatter_params {}
unsafe impl DeviceRepr for abi::weft_gemm_row_gather_params {}
unsafe impl DeviceRepr for abi::weft_collective_params {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder's cubins are embedded exactly when its feature is on.
    #[test]
    fn every_enabled_folder_and_no_other_is_embedded() {
        let folders = [
            ("barrier", cfg!(feature = "barrier")),
            ("collectives", cfg!(feature = "collectives")),
            ("gemm", cfg!(feature = "gemm")),
            ("grpcoll", cfg!(feature = "grpcoll")),
            ("harness", cfg!(feature = "harness")),
            ("pgl", cfg!(feature = "pgl")),
            ("sync", cfg!(feature = "sync")),
        ];
        for (folder, enabled) in folders {
            let prefix = format!("kernels/{folder}/");
            let n = cubins::ALL
                .iter()
                .filter(|c| c.source.starts_with(&prefix))
                .count();
            assert_eq!(
                n > 0,
                enabled,
                "kernels/{folder}: feature on = {enabled}, {n} cubins embedded"
            );
        }
        let known = cubins::ALL.iter().all(|c| {
            folders
                .iter()
                .any(|(f, _)| c.source.starts_with(&format!("kernels/{f}/")))
        });
        assert!(known, "a cubin outside the known folders");
    }

    /// Every cubin is a 64-bit ELF for NVIDIA's CUDA machine type (EM_CUDA = 190) built for
    /// sm_90a: the build really compiled for Hopper, not a placeholder.
    #[test]
    fn every_kernel_is_an_sm90a_cubin() {
        for c in cubins::ALL {
            let img = c.image;
            assert_eq!(&img[..4], b"\x7fELF", "{} is not an ELF image", c.source);
            assert_eq!(img[4], 2, "{} is not ELF64", c.source);
            let machine = u16::from_le_bytes([img[18], img[19]]);
            assert_eq!(
                machine, 190,
                "{} has e_machine {machine}, not EM_CUDA",
                c.source
            );
            // e_flags holds the SM version: bits 8..16 from CUDA's ELF ABI version 8 on (what
            // CUDA 13 writes, e.g. 0x0900_5a04), the low byte before that.
            let flags = u32::from_le_bytes([img[48], img[49], img[50], img[51]]);
            let sm = if img[8] >= 8 {
                (flags >> 8) & 0xff
            } else {
                flags & 0xff
            };
            assert_eq!(sm, 90, "{}: e_flags {flags:#x} is not sm_90", c.source);
        }
    }

    /// ptxas's report for every kernel: no register spills, and no setmaxnreg it ignored (the
    /// GEMM's register reallocation must take effect).
    #[test]
    fn no_kernel_spills_or_loses_setmaxnreg() {
        let log = include_str!(concat!(env!("OUT_DIR"), "/ptxas.log"));
        let spill_lines: Vec<&str> = log.lines().filter(|l| l.contains("spill")).collect();
        // A report per kernel: at least one per embedded cubin, and the GEMM's many.
        let want = cubins::ALL
            .len()
            .max(if cfg!(feature = "gemm") { 24 } else { 0 });
        assert!(
            spill_lines.len() >= want,
            "ptxas log has only {} spill reports (want {want})",
            spill_lines.len()
        );
        for l in spill_lines {
            assert!(
                l.contains(" 0 bytes spill stores, 0 bytes spill loads"),
                "spill: {l}"
            );
        }
        assert!(
            !log.contains("setmaxnreg' ignored"),
            "ptxas ignored a setmaxnreg"
        );
        assert_eq!(
            log.contains("weft_gemm_bf16_bf16_nk_256"),
            cfg!(feature = "gemm"),
            "GEMM kernels in the ptxas log exactly when the gemm feature is on"
        );
    }

    #[test]
    fn abi_layout_is_the_headers() {
        // 2 pointers + u64 + f32 + i32 = 32 bytes, as the kernel sees it.
        assert_eq!(std::mem::size_of::<abi::weft_roundtrip_params>(), 32);
    }
}
