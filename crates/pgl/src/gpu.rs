//! Which GPU a rank drives, and whether any GPU is usable at all.
//!
//! Everything here probes the driver library before touching it: with dynamic loading, cudarc
//! panics on first use of a missing library, and weft must instead say "no GPU" and exit cleanly.

use crate::rank_env::RankEnv;
use anyhow::{bail, Context};
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

/// The device ordinal (among the visible devices) that `env`'s rank drives.
///
/// `WEFT_DEVICE` overrides; otherwise the local rank. Ranks never share a GPU silently: a local
/// rank without a GPU of its own is an error, since co-located ranks would distort every timing.
pub fn device_for_rank(env: &RankEnv, visible: usize) -> anyhow::Result<usize> {
    if let Ok(text) = std::env::var("WEFT_DEVICE") {
        let ordinal: usize = text
            .trim()
            .parse()
            .with_context(|| format!("WEFT_DEVICE={text:?} is not a device ordinal"))?;
        if ordinal >= visible {
            bail!(
                "WEFT_DEVICE={ordinal} but only {visible} GPU(s) are visible to rank {}",
                env.rank
            );
        }
        return Ok(ordinal);
    }
    if env.local_rank >= visible {
        bail!(
            "rank {} is local rank {} of {} on this host, but only {visible} GPU(s) are visible \
             (CUDA_VISIBLE_DEVICES={}): start at most one rank per GPU",
            env.rank,
            env.local_rank,
            env.local_world,
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        );
    }
    Ok(env.local_rank)
}

/// The driver's CUDA version as (major, minor), e.g. (13, 0).
pub fn driver_cuda_version() -> anyhow::Result<(i32, i32)> {
    let mut v = 0;
    // SAFETY: plain out-parameter; callers probe() first so the library is loaded.
    let r = unsafe { sys::cuDriverGetVersion(&mut v) };
    if r != sys::CUresult::CUDA_SUCCESS {
        bail!("cuDriverGetVersion failed: {r:?}");
    }
    Ok((v / 1000, (v % 1000) / 10))
}
