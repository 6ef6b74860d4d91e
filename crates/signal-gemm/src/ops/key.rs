//! What a choice depends on, and so what the choice cache is keyed by: the op, the range of M it
//! covers, N, K, the dtypes and B's layout, whether the launch must be graph-capturable, the world
//! size, the machine (host, GPU model and SMs, driver, how the ranks' GPUs are linked) and weft's
//! version (the crate's and a checksum of its kernels).

use super::candidates::OpKind;
use crate::error::GemmError;
use crate::plan::{GemmOptions, GemmShape};
use anyhow::Context;
use cudarc::driver::{sys, CudaContext};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};
use weft_pgl::Bootstrap;

/// The key of one cached choice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChoiceKey {
    pub op: String,
    /// The choice covers m_lo < M ≤ m_hi ([`m_range`]).
    pub m_lo: u32,
    pub m_hi: u32,
    pub n: u32,
    pub k: u32,
    pub input: String,
    pub output: String,
    pub b_layout: String,
    pub capturable: bool,
    pub world: u32,
    pub machine: String,
    pub version: String,
}

impl ChoiceKey {
    pub fn new(
        op: OpKind,
        shape: GemmShape,
        options: &GemmOptions,
        capturable: bool,
        world: u32,
        machine: &str,
    ) -> Self {
        let (m_lo, m_hi) = m_range(shape.m);
        Self {
            op: op.name().to_string(),
            m_lo,
            m_hi,
            n: shape.n,
            k: shape.k,
            input: options.input.name().to_string(),
            output: options.output.name().to_string(),
            b_layout: options.b_layout.name().to_string(),
            capturable,
            world,
            machine: machine.to_string(),
            version: weft_version().to_string(),
        }
    }

    /// Whether a choice under this key holds for `m`.
    pub fn covers(&self, m: u32) -> bool {
        self.m_lo < m && m <= self.m_hi
    }
}

impl std::fmt::Display for ChoiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} M in ({}, {}] N {} K {} {}->{} B {}{} on {} ranks",
            self.op,
            self.m_lo,
            self.m_hi,
            self.n,
            self.k,
            self.input,
            self.output,
            self.b_layout,
            if self.capturable { " capturable" } else { "" },
            self.world
        )
    }
}

/// The range (lo, hi] of M that one choice covers: hi is the smallest of 16 · 2^j and 24 · 2^j
/// at or above m, lo the one before it (0 below 16). So a caller whose M changes from call to call
/// (decoding batches, variable sequence lengths) measures once per range, at most 1.5× apart.
pub fn m_range(m: u32) -> (u32, u32) {
    let (mut lo, mut hi) = (0u64, 16u64);
    let mut three_halves = true;
    while hi < u64::from(m) {
        lo = hi;
        hi = if three_halves { hi * 3 / 2 } else { hi * 4 / 3 };
        three_halves = !three_halves;
    }
    (
        lo.min(u64::from(u32::MAX)) as u32,
        hi.min(u64::from(u32::MAX)) as u32,
    )
}

/// How the ops plan their candidates' GEMMs without touching a kernel (GemmPlan's automatic
/// choices, `ops::candidates`): raised with every such change, so that choices cached before it
/// are measured again. 2: Auto's epilogue pipelined at short K, fused-intra out of the AllGather
/// candidates.
const PLAN_POLICY: u32 = 2;

/// weft's version as far as choices are concerned: this crate's version, the plan policy and a
/// checksum of the GEMM's kernels (a rebuilt kernel may change which method wins).
pub fn weft_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let mut h = crc32fast::Hasher::new();
        // The GEMM's own cubins and weft's collectives (seq-collectives; the ops' other kernels
        // are NCCL's): the same set whichever other weft crates a program builds.
        for c in weft_kernels::cubins::ALL.iter().filter(|c| {
            c.source.starts_with("kernels/gemm/") || c.source.starts_with("kernels/collectives/")
        }) {
            h.update(c.source.as_bytes());
            h.update(c.image);
        }
        format!(
            "weft-signal-gemm {} plans {PLAN_POLICY} kernels {:08x}",
            env!("CARGO_PKG_VERSION"),
            h.finalize()
        )
    })
}

/// The NVIDIA driver's version: the kernel module's (e.g. 580.159.04) where Linux shows it,
/// else the CUDA driver API version.
fn driver_version() -> String {
    if let Ok(text) = std::fs::read_to_string("/proc/driver/nvidia/version") {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..."
        if let Some(v) = text
            .lines()
            .next()
            .and_then(|l| l.split("Kernel Module").nth(1))
            .and_then(|r| r.split_whitespace().next())
        {
            return v.to_string();
        }
    }
    let mut v = 0;
    // SAFETY: an out-parameter.
    match unsafe { sys::cuDriverGetVersion(&mut v) }.result() {
        Ok(()) => format!("cuda-driver-api {v}"),
        Err(_) => "unknown".to_string(),
    }
}

fn pci_bus_id(dev: sys::CUdevice) -> anyhow::Result<String> {
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: a buffer of the given length for a NUL-terminated string.
    unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) }
        .result()
        .context("cuDeviceGetPCIBusId")?;
    // SAFETY: NUL-terminated by the driver within the buffer.
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// How this rank's GPU reaches the GPU at `bus_id` (visible to this process): "p2p<rank>" with
/// the driver's relative performance rank, "no-p2p", or "?" when it is not visible here.
fn link_to(ctx: &Arc<CudaContext>, bus_id: &str) -> String {
    let Ok(c) = std::ffi::CString::new(bus_id) else {
        return "?".into();
    };
    let mut peer = 0;
    // SAFETY: an out-parameter and a NUL-terminated id.
    if unsafe { sys::cuDeviceGetByPCIBusId(&mut peer, c.as_ptr()) }
        .result()
        .is_err()
    {
        return "?".into();
    }
    let me = ctx.cu_device();
    if peer == me {
        return "same".into();
    }
    let attr = |a| {
        let mut v = 0;
        // SAFETY: an out-parameter; both devices exist.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut v, a, me, peer) }
            .result()
            .map(|()| v)
    };
    match (
        attr(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED),
        attr(sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK),
    ) {
        (Ok(1), Ok(rank)) => format!("p2p{rank}"),
        (Ok(_), _) => "no-p2p".into(),
        _ => "?".into(),
    }
}

/// Collective: a description of the machine the ranks run on, the same text on every rank: each
/// rank's host and GPU (model, SMs, driver), and for every pair of ranks on one host how their
/// GPUs are linked (as rank 0 of the pair sees it).
pub fn machine_fingerprint(
    rdzv: &mut dyn Bootstrap,
    ctx: &Arc<CudaContext>,
) -> Result<String, GemmError> {
    crate::error::typed_with(|| -> anyhow::Result<String> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .trim()
            .to_string();
        let name = ctx.name().context("reading the device name")?;
        let sms = crate::gemm::device_sms(ctx)?;
        let bus = pci_bus_id(ctx.cu_device())?;
        let me = format!("{host}\t{name}\t{sms}\t{}\t{bus}", driver_version());
        let all = rdzv
            .all_gather(me.as_bytes())
            .context("all-gathering the machine description")?;
        let ranks: Vec<Vec<String>> = all
            .iter()
            .map(|b| {
                String::from_utf8_lossy(b)
                    .split('\t')
                    .map(str::to_string)
                    .collect()
            })
            .collect();
        // My links to every later rank on my host; all-gathered so every rank builds the same text.
        let mine = rdzv.rank();
        let links: Vec<String> = (mine + 1..ranks.len())
            .filter(|&r| ranks[r].first() == ranks[mine].first())
            .map(|r| {
                format!(
                    "{mine}-{r}:{}",
                    link_to(ctx, ranks[r].get(4).map_or("", String::as_str))
                )
            })
            .collect();
        let links = rdzv.all_gather(links.join(",").as_bytes())?;
        let mut text = String::new();
        for (r, f) in ranks.iter().enumerate() {
            // host, GPU model, SMs, driver (the bus id only enters through the links).
            let f: Vec<&str> = f.iter().map(String::as_str).take(4).collect();
            text.push_str(&format!("rank{r}={};", f.join("/")));
        }
        let links: Vec<String> = links
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .filter(|s| !s.is_empty())
            .collect();
        text.push_str(&format!("links={}", links.join(",")));
        Ok(text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m_ranges_tile_the_line_at_most_one_and_a_half_apart() {
        assert_eq!(m_range(1), (0, 16));
        assert_eq!(m_range(16), (0, 16));
        assert_eq!(m_range(17), (16, 24));
        assert_eq!(m_range(24), (16, 24));
        assert_eq!(m_range(25), (24, 32));
        assert_eq!(m_range(512), (384, 512));
        assert_eq!(m_range(6144), (4096, 6144));
        assert_eq!(m_range(8192), (6144, 8192));
        let mut prev = 0;
        for m in 1..70_000u32 {
            let (lo, hi) = m_range(m);
            assert!(lo < m && m <= hi, "{m}: ({lo}, {hi}]");
            assert!(
                lo == 0 || 2 * hi <= 3 * lo,
                "{m}: ({lo}, {hi}] is wider than 1.5x"
            );
            assert!(
                lo >= prev || lo == m_range(m - 1).0,
                "ranges go back at {m}"
            );
            prev = lo;
        }
        assert_eq!(m_range(u32::MAX).1, u32::MAX);
    }

    #[test]
    fn keys_differ_by_everything_that_changes_the_answer() {
        let o = GemmOptions::default();
        let s = GemmShape::new(8192, 8192, 2048);
        let k = ChoiceKey::new(OpKind::AllReduce, s, &o, false, 2, "m");
        assert!(k.covers(8000) && !k.covers(8193) && !k.covers(6144));
        assert_eq!(
            k,
            ChoiceKey::new(
                OpKind::AllReduce,
                GemmShape::new(7000, 8192, 2048),
                &o,
                false,
                2,
                "m"
            )
        );
        let others = [
            ChoiceKey::new(OpKind::ReduceScatter, s, &o, false, 2, "m"),
            ChoiceKey::new(
                OpKind::AllReduce,
                GemmShape::new(8192, 4096, 2048),
                &o,
                false,
                2,
                "m",
            ),
            ChoiceKey::new(
                OpKind::AllReduce,
                GemmShape::new(8192, 8192, 1024),
                &o,
                false,
                2,
                "m",
            ),
            ChoiceKey::new(
                OpKind::AllReduce,
                s,
                &GemmOptions {
                    output: crate::Dtype::F32,
                    ..o
                },
                false,
                2,
                "m",
            ),
            ChoiceKey::new(
                OpKind::AllReduce,
                s,
                &GemmOptions {
                    b_layout: crate::BLayout::KxN,
                    ..o
                },
                false,
                2,
                "m",
            ),
            ChoiceKey::new(OpKind::AllReduce, s, &o, true, 2, "m"),
            ChoiceKey::new(OpKind::AllReduce, s, &o, false, 4, "m"),
            ChoiceKey::new(OpKind::AllReduce, s, &o, false, 2, "another machine"),
        ];
        for other in others {
            assert_ne!(k, other);
        }
        assert!(k.version.starts_with("weft-signal-gemm "));
    }
}
