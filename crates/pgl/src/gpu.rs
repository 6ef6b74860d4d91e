//! Which GPU a rank drives, and whether any GPU is usable at all.
//!
//! Everything here probes the driver library before touching it: with dynamic loading, cudarc
//! panics on first use of a missing library, and weft must instead say "no GPU" and exit cleanly.

use crate::error::PglError;
use crate::rank_env::RankEnv;

use cudarc::driver::{result as cu, sys};

/// The GPUs this process can see, or why it can see none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuAvailability {
    Present { count: usize },
    Absent { reason: String },
}

/// Loads libcuda (if present), initialises the driver and counts devices. Never panics.
pub fn probe() -> GpuAvailability {
    // SAFETY: only tries to dlopen the library; no CUDA call is made when it is absent.
    if !unsafe { sys::is_culib_present() } {
        return GpuAvailability::Absent {
            reason: "no NVIDIA driver: libcuda.so could not be loaded".into(),
        };
    }
    if let Err(e) = cu::init() {
        return GpuAvailability::Absent {
            reason: format!("cuInit failed: {e:?}"),
        };
    }
    match cu::device::get_count() {
        Ok(0) => GpuAvailability::Absent {
            reason: "the NVIDIA driver reports no CUDA devices".into(),
        },
        Ok(n) => GpuAvailability::Present { count: n as usize },
        Err(e) => GpuAvailability::Absent {
            reason: format!("cuDeviceGetCount failed: {e:?}"),
        },
    }
}

/// `WEFT_SHARED_GPU=1` lets ranks share a GPU: local rank r then drives GPU r mod (visible GPUs).
/// It exists to run multi-rank correctness trials on a machine with fewer GPUs than ranks. The
/// ranks' kernels then time-share one GPU (each process has its own context), so timings mean
/// nothing, and NCCL, which refuses two ranks on one GPU, cannot be used.
pub const SHARED_GPU_VAR: &str = "WEFT_SHARED_GPU";

/// Whether `WEFT_SHARED_GPU` allows ranks to share a GPU ("1"; unset, empty or "0": no).
/// Errors: `PglError::Setting`.
pub fn shared_gpu_allowed() -> Result<bool, PglError> {
    match std::env::var(SHARED_GPU_VAR) {
        Err(_) => Ok(false),
        Ok(v) => match v.trim() {
            "" | "0" => Ok(false),
            "1" => Ok(true),
            other => Err(PglError::Setting {
                var: SHARED_GPU_VAR,
                value: other.to_string(),
                reason: "is not 1 (ranks may share a GPU) or 0".into(),
            }),
        },
    }
}

/// The device ordinal (among the visible devices) that `env`'s rank drives.
///
/// `WEFT_DEVICE` overrides; otherwise the local rank. Ranks never share a GPU silently: a local
/// rank without a GPU of its own is an error, since co-located ranks would distort every timing,
/// unless `WEFT_SHARED_GPU=1` asks for sharing (see [`SHARED_GPU_VAR`]).
///
/// Errors: `PglError::Setting` (WEFT_DEVICE, WEFT_SHARED_GPU), `PglError::Launcher` (more local
/// ranks than GPUs).
pub fn device_for_rank(env: &RankEnv, visible: usize) -> Result<usize, PglError> {
    if let Ok(text) = std::env::var(DEVICE_VAR) {
        let setting = |reason: String| PglError::Setting {
            var: DEVICE_VAR,
            value: text.clone(),
            reason,
        };
        let ordinal: usize = text
            .trim()
            .parse()
            .map_err(|_| setting("is not a device ordinal".into()))?;
        if ordinal >= visible {
            return Err(setting(format!(
                "but only {visible} GPU(s) are visible to rank {}",
                env.rank
            )));
        }
        return Ok(ordinal);
    }
    if env.local_rank >= visible {
        if shared_gpu_allowed()? {
            return Ok(env.local_rank % visible);
        }
        return Err(PglError::Launcher(format!(
            "rank {} is local rank {} of {} on this host, but only {visible} GPU(s) are visible \
             (CUDA_VISIBLE_DEVICES={}): start at most one rank per GPU (or set {SHARED_GPU_VAR}=1 \
             for correctness runs on shared GPUs)",
            env.rank,
            env.local_rank,
            env.local_world,
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        )));
    }
    Ok(env.local_rank)
}

/// `WEFT_DEVICE`: the device ordinal a rank drives, overriding its local rank.
pub const DEVICE_VAR: &str = "WEFT_DEVICE";

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_cuda_version() -> Result<(i32, i32), PglError> {
    let mut v = 0;
    // SAFETY: plain out-parameter; callers probe() first so the library is loaded.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(PglError::Driver(cudarc::driver::DriverError(r)));
    }
    Ok((v / 1000, (v % 1000) / 10))
}

/// Collective: the largest number of `rdzv`'s ranks that drive one GPU (ranks compared by their
/// context's PCI bus id); 1 unless ranks share GPUs (`WEFT_SHARED_GPU=1`). A kernel whose CTAs
/// wait on other ranks' CTAs needs every rank's grid resident at once, which a shared GPU holds
/// only if the grids of all the ranks on it fit together.
pub fn max_ranks_per_gpu(
    rdzv: &mut dyn crate::Bootstrap,
    ctx: &cudarc::driver::CudaContext,
) -> Result<usize, PglError> {
    let mine = crate::pgl::pci_bus_id(ctx.cu_device());
    let all = rdzv
        .all_gather(mine.as_bytes())
        .map_err(PglError::from_anyhow)?;
    Ok(all
        .iter()
        .map(|id| all.iter().filter(|other| *other == id).count())
        .max()
        .unwrap_or(1))
}
