//! Peer-memory bandwidth (seed PK §3.1.2, issue 3): how fast kernels move data over NVLink through
//! PGL peer pointers — 16-byte plain stores and loads, and TMA bulk copies — at several SM counts
//! and message sizes, against the copy engine. Goal: at least 90% of the copy engine with at most
//! 32 SMs from 64 MiB up.
//!
//! # Method
//!
//! Two `Pgl<u32>` of the largest size (1 GiB) are allocated once: `src`, filled with random words
//! (a hash of seed, rank and index; never the poison word), and `dst`. Every rank moves data to
//! rank `(r + 1) % world`, all ranks at once, so data always flows r → r+1 around a ring and every
//! GPU sends one stream and receives one:
//!
//! - writes (`copy engine write`, `plain write`, `bulk write`) are issued by the sender: rank r's
//!   local `src` → rank r+1's `dst` through its peer pointer;
//! - reads (`copy engine read`, `plain read`, `bulk read`) are issued by the receiver: rank r−1's
//!   `src` through its peer pointer → rank r's local `dst`.
//!
//! Either way rank r's `dst` ends up holding rank r−1's `src`. A message of S bytes is the first S
//! bytes of the buffers. Ranks meet at a barrier before each (method, SMs, size); times are CUDA
//! events around each launch (warm-up first), the median per rank, and the slowest rank's median is
//! reported. GB/s = bytes / time / 1e9. "% of CE" = copy-engine-write time / method time at the
//! same size in the same run (also the JSON `ratio`; baseline "copy engine (cuMemcpyDtoDAsync)").
//!
//! Correctness: after timing each (method, SMs) at the largest size, every rank poisons its `dst`,
//! all ranks meet, the method runs once more, all ranks meet, and every rank reads back its whole
//! `dst` and compares every word with rank r−1's source words regenerated on the CPU. Any
//! mismatch (or an unwritten, still-poisoned word) fails the run on every rank, naming the rank.
//!
//! # Kernels (`kernels/pgl/peer_copy.cu`, helpers in `kernels/include/weft/tma/bulk_copy.cuh`)
//!
//! - `plain write` / `plain read`: blocks of 1024 threads, one per SM (the suite checks occupancy
//!   and pads shared memory if two could share an SM), grid-stride over 16-byte vectors with 4
//!   (write) or 8 (read) independent loads in flight per thread before the stores.
//! - `bulk write` / `bulk read`: one block of 32 threads per SM, one thread driving the TMA: a ring
//!   of `stages` shared-memory buffers of `chunk` bytes; `cp.async.bulk` global → shared completes
//!   on the stage's mbarrier, `cp.async.bulk` shared → global goes out in its own bulk group, a
//!   stage is refilled once `wait_group.read` says its store has read it (with `inflight` stores
//!   still reading), and the kernel ends with `wait_group 0`. Chunk c goes to block c mod blocks;
//!   the chunk shrinks (multiple of 16) so small messages still spread over the blocks, and the
//!   last chunk may be short. Default 32 KiB × 6 stages, 3 stores in flight (192 KiB of shared
//!   memory, so one block per SM); `WEFT_PGL_BULK=chunk,stages,inflight` overrides it to tune
//!   (e.g. `WEFT_PGL_BULK=65536,3,1`).
//! - SM counts: 4, 8, 16, 32, half and all of the device's SMs (read from the device); quick mode
//!   16, 32 and all, at 64 MiB and 1 GiB only.
//!
//! # Expected numbers (4× H200 NV18, docs/DESIGN.md §4)
//!
//! Copy engine ≈ 395 GB/s at 1 GiB and well below that for small messages (PK: ≥ 256 MB for 80%).
//! Plain 16-byte stores measured 293 / 336 / 353 / 370 GB/s at 8 / 16 / 32 / 132 blocks (2-GPU
//! machine): about 74 / 85 / 89 / 94% of the copy engine, so plain writes should just miss the goal
//! at 32 SMs. TMA needs 3.2–5.1× fewer SMs than register-level copies to saturate NVLink (PK
//! Fig. 3): bulk writes should pass 90% by 8–16 SMs. Reads are latency-bound on the load side
//! (~1–2 µs per NVLink round trip): plain reads need more SMs than plain writes; bulk reads keep
//! (stages − inflight) chunks per SM in flight and should track bulk writes from 16 SMs up. Below
//! ~1 MiB every kernel method is launch-latency bound (a few µs) and beats the copy engine.
//!
//! Run: `mpirun --allow-run-as-root --bind-to none -np 4 target/release/weft bench pgl --json
//! results/pgl/<device-kind>-<date>.json` (about 30 s; `--quick` about 10 s).

use super::SuiteResult;
use crate::job::Job;
use crate::json::{self, Json};
use crate::results::Table;
use crate::timing::{median, time_iterations};
use anyhow::{bail, Context};
use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;
use weft_kernels::cubins;
use weft_pgl::{Backend, Pgl, Shape};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// What an unwritten destination word holds; source words never equal it.
const POISON: u32 = 0xDEAD_BEEF;

/// Threads per block of the plain kernels (their `__launch_bounds__`).
const PLAIN_THREADS: u32 = 1024;
/// Threads per block of the bulk kernels (one of them works).
const BULK_THREADS: u32 = 32;

/// Sizes from which the goal applies, and the SM budget and fraction of the copy engine it asks
/// (issue #25: >= 95 % with <= 16 SMs at >= 64 MiB).
const GOAL_FROM_BYTES: usize = 64 * MIB;
const GOAL_MAX_SMS: u32 = 16;
const GOAL_PCT: f64 = 95.0;

const BASELINE: &str = "copy engine (cuMemcpyDtoDAsync)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    CopyEngineWrite,
    CopyEngineRead,
    PlainWrite,
    PlainRead,
    BulkWrite,
    BulkRead,
}

const METHODS: [Method; 6] = [
    Method::CopyEngineWrite,
    Method::CopyEngineRead,
    Method::PlainWrite,
    Method::PlainRead,
    Method::BulkWrite,
    Method::BulkRead,
];

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::CopyEngineWrite => "copy engine write",
            Method::CopyEngineRead => "copy engine read",
            Method::PlainWrite => "plain write",
            Method::PlainRead => "plain read",
            Method::BulkWrite => "bulk write",
            Method::BulkRead => "bulk read",
        }
    }

    fn is_kernel(self) -> bool {
        !matches!(self, Method::CopyEngineWrite | Method::CopyEngineRead)
    }

    /// Issued by the receiver (peer source, local destination) rather than the sender.
    fn is_read(self) -> bool {
        matches!(
            self,
            Method::CopyEngineRead | Method::PlainRead | Method::BulkRead
        )
    }
}

/// Message sizes: 4 KiB to 1 GiB in ×4 steps; quick: 64 MiB and 1 GiB.
fn sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![64 * MIB, GIB]
    } else {
        (0..10).map(|k| (4 * KIB) << (2 * k)).collect()
    }
}

/// SM (= block) counts for the kernels: 4, 8, 16, 32, half and all of the device's SMs; quick: 16,
/// 32 and all. Never more than the device has, ascending, without repeats.
fn sm_counts(sms: u32, quick: bool) -> Vec<u32> {
    let wanted: Vec<u32> = if quick {
        vec![16, 32, sms]
    } else {
        vec![4, 8, 16, 32, sms / 2, sms]
    };
    let mut v: Vec<u32> = wanted.into_iter().filter(|&s| s >= 1 && s <= sms).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// (warm-up, timed iterations) for a message size: few for the big ones so the full sweep stays short.
fn repetitions(bytes: usize, quick: bool) -> (usize, usize) {
    match bytes {
        _ if quick && bytes >= 256 * MIB => (2, 5),
        _ if quick => (3, 10),
        b if b >= GIB => (2, 8),
        b if b >= 256 * MIB => (2, 10),
        b if b >= 16 * MIB => (3, 20),
        _ => (5, 40),
    }
}

/// The TMA pipeline of one bulk block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BulkConfig {
    /// Bytes per stage (a multiple of 16).
    chunk: u32,
    /// Shared-memory buffers in the ring (2..=8, the kernel's kMaxStages).
    stages: u32,
    /// Stores allowed to be still reading shared memory when a stage is refilled (1..stages).
    inflight: u32,
}

impl Default for BulkConfig {
    fn default() -> Self {
        BulkConfig {
            chunk: 32 * KIB as u32,
            stages: 6,
            inflight: 3,
        }
    }
}

impl BulkConfig {
    /// `WEFT_PGL_BULK=chunk,stages,inflight` when set (through `var`), else the default.
    fn from_env(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let Some(text) = var("WEFT_PGL_BULK") else {
            return Ok(Self::default());
        };
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        let parsed: Vec<u32> = parts.iter().filter_map(|p| p.parse().ok()).collect();
        let [chunk, stages, inflight] = parsed[..] else {
            bail!("WEFT_PGL_BULK={text:?}: expected chunk,stages,inflight (e.g. 32768,6,3)");
        };
        let c = BulkConfig {
            chunk,
            stages,
            inflight,
        };
        c.validate()
            .with_context(|| format!("WEFT_PGL_BULK={text:?}"))?;
        Ok(c)
    }

    fn validate(&self) -> anyhow::Result<()> {
        // One bulk transaction moves at most 2^20 - 1 bytes; the stages must fit shared memory
        // (checked against the device's opt-in limit at launch).
        if self.chunk < 16 || !self.chunk.is_multiple_of(16) || self.chunk >= 1 << 20 {
            bail!(
                "chunk {} must be a multiple of 16 bytes below 1 MiB",
                self.chunk
            );
        }
        if !(2..=8).contains(&self.stages) {
            bail!("stages {} must be 2 to 8", self.stages);
        }
        if self.inflight < 1 || self.inflight >= self.stages {
            bail!(
                "inflight {} must be at least 1 and below stages ({})",
                self.inflight,
                self.stages
            );
        }
        Ok(())
    }

    fn smem_bytes(&self) -> u32 {
        // chunk < 2^20 and stages <= 8 (validate), so this cannot overflow.
        self.chunk * self.stages
    }

    /// The chunk for a message: the configured one, or smaller (a multiple of 16) so that a small
    /// message still spreads over all `blocks`.
    fn chunk_for(&self, bytes: usize, blocks: u32) -> u32 {
        let share = bytes.div_ceil(blocks as usize).div_ceil(16) * 16;
        (share.max(16) as u64).min(self.chunk as u64) as u32
    }

    fn describe(&self) -> String {
        format!("{}K x{} /{}", self.chunk / 1024, self.stages, self.inflight)
    }
}

/// A source word: a hash of (seed, rank, index), never [`POISON`]. Any rank can regenerate any
/// rank's source to check what it received.
fn source_word(seed: u64, rank: usize, i: usize) -> u32 {
    let mut z = seed
        ^ (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let w = z as u32;
    if w == POISON {
        w ^ 1
    } else {
        w
    }
}

/// Host threads for filling and checking 1 GiB (the process's CPU affinity decides).
fn host_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16)
}

/// Fills `buf` with rank `rank`'s source words, in parallel.
fn fill_source(buf: &mut [u32], seed: u64, rank: usize) {
    let per = buf.len().div_ceil(host_threads()).max(1);
    std::thread::scope(|s| {
        for (k, part) in buf.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (j, w) in part.iter_mut().enumerate() {
                    *w = source_word(seed, rank, k * per + j);
                }
            });
        }
    });
}

/// Compares every word of `got` with rank `from`'s source words; None when all match, else the
/// count and the first mismatches.
fn check_source(got: &[u32], seed: u64, from: usize) -> Option<String> {
    let per = got.len().div_ceil(host_threads()).max(1);
    let parts: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = got
            .chunks(per)
            .enumerate()
            .map(|(k, part)| {
                s.spawn(move || {
                    let (mut bad, mut first) = (0usize, Vec::new());
                    for (j, &g) in part.iter().enumerate() {
                        let i = k * per + j;
                        let w = source_word(seed, from, i);
                        if g != w {
                            bad += 1;
                            if first.len() < 4 {
                                let note = if g == POISON { " (never written)" } else { "" };
                                first.push(format!("[{i}] = {g:#010x}, expected {w:#010x}{note}"));
                            }
                        }
                    }
                    (bad, first)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("check thread panicked"))
            .collect()
    });
    let bad: usize = parts.iter().map(|p| p.0).sum();
    if bad == 0 {
        return None;
    }
    let first: Vec<String> = parts.into_iter().flat_map(|p| p.1).take(4).collect();
    Some(format!(
        "{bad} of {} words differ from rank {from}'s source: {}",
        got.len(),
        first.join("; ")
    ))
}

/// The copy kernels, loaded, with the dynamic shared memory each launch takes.
struct Kernels {
    _module: Arc<CudaModule>,
    write_plain: CudaFunction,
    read_plain: CudaFunction,
    write_bulk: CudaFunction,
    read_bulk: CudaFunction,
    /// Padding that keeps plain blocks one per SM (0 when registers already do).
    plain_smem: u32,
    bulk_smem: u32,
    bulk: BulkConfig,
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>, bulk: BulkConfig) -> anyhow::Result<Self> {
        let module = cubins::PGL_PEER_COPY
            .load(ctx)
            .context("loading kernels/pgl/peer_copy.cu")?;
        let f = |name: &str| {
            module
                .load_function(name)
                .with_context(|| format!("kernels/pgl/peer_copy.cu: {name}"))
        };
        let (write_plain, read_plain, write_bulk, read_bulk) = (
            f("weft_peer_write_plain")?,
            f("weft_peer_read_plain")?,
            f("weft_peer_write_bulk")?,
            f("weft_peer_read_bulk")?,
        );
        let per_sm = ctx.attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )? as u32;
        let optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as u32;
        let plain_smem = one_block_per_sm(
            &[&write_plain, &read_plain],
            PLAIN_THREADS,
            0,
            per_sm,
            optin,
        )?;
        let bulk_smem = one_block_per_sm(
            &[&write_bulk, &read_bulk],
            BULK_THREADS,
            bulk.smem_bytes(),
            per_sm,
            optin,
        )
        .with_context(|| format!("bulk pipeline {}", bulk.describe()))?;
        Ok(Kernels {
            _module: module,
            write_plain,
            read_plain,
            write_bulk,
            read_bulk,
            plain_smem,
            bulk_smem,
            bulk,
        })
    }
}

/// The dynamic shared memory (at least `wanted`) with which every one of `funcs` runs one block
/// per SM: `wanted` if occupancy already says one, else more than half an SM's shared memory.
/// Raises each function's dynamic-shared-memory limit to the device's opt-in maximum.
fn one_block_per_sm(
    funcs: &[&CudaFunction],
    threads: u32,
    wanted: u32,
    per_sm: u32,
    optin: u32,
) -> anyhow::Result<u32> {
    let mut smem = wanted;
    for f in funcs {
        let static_smem =
            f.get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as u32;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            (optin - static_smem) as i32,
        )?;
        if smem + static_smem > optin {
            bail!(
                "{smem} bytes of shared memory per block do not fit (at most {} on this device)",
                optin - static_smem
            );
        }
        if f.occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)? > 1 {
            smem = smem.max(per_sm / 2 + 1);
        }
    }
    for f in funcs {
        let n = f.occupancy_max_active_blocks_per_multiprocessor(threads, smem as usize, None)?;
        if n != 1 {
            bail!("{n} blocks of {threads} threads with {smem} B of shared memory fit per SM, expected exactly 1");
        }
    }
    Ok(smem)
}

/// Everything one copy needs.
struct Transfer<'a> {
    stream: &'a Arc<CudaStream>,
    kernels: &'a Kernels,
    /// Local source and destination, and the peers' as mapped here.
    src_local: u64,
    dst_local: u64,
    src_prev: u64,
    dst_next: u64,
}

impl Transfer<'_> {
    /// Enqueues one copy of `bytes` by `method` on `blocks` SMs (ignored by the copy engine).
    fn enqueue(&self, method: Method, blocks: u32, bytes: usize) -> anyhow::Result<()> {
        let (src, dst) = if method.is_read() {
            (self.src_prev, self.dst_local)
        } else {
            (self.src_local, self.dst_next)
        };
        if !bytes.is_multiple_of(16) || src % 16 != 0 || dst % 16 != 0 {
            bail!("peer copy of {bytes} B from {src:#x} to {dst:#x}: sizes and addresses must be multiples of 16");
        }
        let stream = self.stream;
        let k = self.kernels;
        let n = bytes as u64;
        match method {
            Method::CopyEngineWrite | Method::CopyEngineRead => {
                // SAFETY: both ranges lie inside live PGL buffers of at least `bytes` bytes.
                unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream())? };
            }
            Method::PlainWrite | Method::PlainRead => {
                let func = if method == Method::PlainWrite {
                    &k.write_plain
                } else {
                    &k.read_plain
                };
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (PLAIN_THREADS, 1, 1),
                    shared_mem_bytes: k.plain_smem,
                };
                // SAFETY: (src, dst, bytes) as the kernel expects: 16-byte aligned, disjoint, live.
                unsafe {
                    stream
                        .launch_builder(func)
                        .arg(&src)
                        .arg(&dst)
                        .arg(&n)
                        .launch(cfg)?
                };
            }
            Method::BulkWrite | Method::BulkRead => {
                let func = if method == Method::BulkWrite {
                    &k.write_bulk
                } else {
                    &k.read_bulk
                };
                let chunk = k.bulk.chunk_for(bytes, blocks);
                let (stages, inflight) = (k.bulk.stages, k.bulk.inflight);
                let cfg = LaunchConfig {
                    grid_dim: (blocks, 1, 1),
                    block_dim: (BULK_THREADS, 1, 1),
                    shared_mem_bytes: k.bulk_smem,
                };
                // SAFETY: as above; chunk * stages <= the dynamic shared memory of the launch.
                unsafe {
                    stream
                        .launch_builder(func)
                        .arg(&src)
                        .arg(&dst)
                        .arg(&n)
                        .arg(&chunk)
                        .arg(&stages)
                        .arg(&inflight)
                        .launch(cfg)?
                };
            }
        }
        Ok(())
    }
}

/// One timed case, in the same order on every rank.
struct Case {
    method: Method,
    /// Blocks (= SMs) for kernels, 0 for the copy engine.
    sms: u32,
    bytes: usize,
    median_ms: f64,
}

pub fn run(job: &mut Job, quick: bool) -> anyhow::Result<SuiteResult> {
    let (rank, world) = (job.rank(), job.world());
    let (ctx, stream) = {
        let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
        (gpu.ctx.clone(), gpu.stream.clone())
    };
    ctx.bind_to_thread()?;
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    if world == 1 && rank == 0 {
        eprintln!("weft bench pgl: 1 rank, so every copy is local to the GPU, not over NVLink");
    }
    let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
    let sizes = sizes(quick);
    let largest = *sizes.last().unwrap();
    let counts = sm_counts(sms, quick);
    let bulk = BulkConfig::from_env(|v| std::env::var(v).ok())?;
    let kernels = Kernels::load(&ctx, bulk)?;
    let seed = crate::data::shared_seed(job)?;

    let words = largest / 4;
    let shape = Shape::vector(u32::try_from(words).context("largest message in u32 words")?);
    let src: Pgl<u32> = Pgl::alloc(&mut job.rdzv, &ctx, shape, Backend::default())?;
    let dst: Pgl<u32> = Pgl::alloc(&mut job.rdzv, &ctx, shape, Backend::default())?;
    let backend = src.backend().name();

    // Random source: this rank's words, uploaded once; the host buffer is reused for read-backs.
    let mut host = vec![0u32; words];
    fill_source(&mut host, seed, rank);
    // SAFETY: `host` and the local source both hold `words` words; synchronised before reuse.
    unsafe { result::memcpy_htod_async(src.local_ptr(), &host, stream.cu_stream())? };
    stream.synchronize()?;

    let copy = Transfer {
        stream: &stream,
        kernels: &kernels,
        src_local: src.local_ptr(),
        dst_local: dst.local_ptr(),
        src_prev: src.peer_ptr(prev),
        dst_next: dst.peer_ptr(next),
    };
    let mut cases: Vec<Case> = Vec::new();
    for method in METHODS {
        let configs: Vec<u32> = if method.is_kernel() {
            counts.clone()
        } else {
            vec![0]
        };
        for &blocks in &configs {
            super::progress(
                job.rank(),
                "pgl",
                &if method.is_kernel() {
                    format!("{} on {blocks} SMs", method.name())
                } else {
                    method.name().to_string()
                },
            );
            for &bytes in &sizes {
                let (warmup, iters) = repetitions(bytes, quick);
                job.rdzv.barrier()?;
                let ms = time_iterations(&stream, warmup, iters, || {
                    copy.enqueue(method, blocks, bytes)
                })
                .with_context(|| format!("{} on {blocks} SMs, {bytes} B", method.name()))?;
                cases.push(Case {
                    method,
                    sms: blocks,
                    bytes,
                    median_ms: median(&ms),
                });
            }
            // The largest size (full chunks everywhere) and two odd ones: a short last chunk, shrunken
            // chunks, blocks with no chunk and fewer chunks than stages.
            for check_bytes in [largest, 4096 + 48, (largest / 7) / 16 * 16 + 48] {
                verify(
                    job,
                    &copy,
                    &dst,
                    &mut host,
                    seed,
                    prev,
                    method,
                    blocks,
                    check_bytes,
                )?;
            }
        }
    }
    dst.free(&mut job.rdzv)?;
    src.free(&mut job.rdzv)?;

    // Every rank's medians, in the same order on every rank.
    let mine: Vec<f64> = cases.iter().map(|c| c.median_ms).collect();
    let per_rank = super::gather_f64(job, &mine)?;
    let slowest: Vec<f64> = (0..cases.len())
        .map(|i| per_rank.iter().map(|r| r[i]).fold(f64::MIN, f64::max))
        .collect();
    let fastest: Vec<f64> = (0..cases.len())
        .map(|i| per_rank.iter().map(|r| r[i]).fold(f64::MAX, f64::min))
        .collect();
    let ce_ms = |bytes: usize| {
        cases
            .iter()
            .zip(&slowest)
            .find(|(c, _)| c.method == Method::CopyEngineWrite && c.bytes == bytes)
            .map(|(_, &t)| t)
    };

    let mut table = Table {
        headers: vec![
            "method",
            "SMs",
            "per block",
            "size",
            "time (us)",
            "min rank (us)",
            "GB/s",
            "% of CE",
        ],
        rows: Vec::new(),
    };
    let mut rows = Vec::new();
    let mut pcts: Vec<(Method, u32, usize, f64)> = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let (t, tmin) = (slowest[i], fastest[i]);
        let gbs = c.bytes as f64 / (t * 1e-3) / 1e9;
        let base = ce_ms(c.bytes);
        let ratio = base.map(|b| b / t);
        let block = match c.method {
            Method::PlainWrite | Method::PlainRead => format!("{PLAIN_THREADS} thr"),
            Method::BulkWrite | Method::BulkRead => kernels.bulk.describe(),
            _ => String::new(),
        };
        if let Some(r) = ratio {
            pcts.push((c.method, c.sms, c.bytes, 100.0 * r));
        }
        table.rows.push(vec![
            c.method.name().into(),
            if c.method.is_kernel() {
                c.sms.to_string()
            } else {
                "-".into()
            },
            block.clone(),
            human_size(c.bytes),
            format!("{:.1}", t * 1e3),
            format!("{:.1}", tmin * 1e3),
            format!("{gbs:.1}"),
            ratio.map_or(String::new(), |r| format!("{:.1}", 100.0 * r)),
        ]);
        let case = if c.method.is_kernel() {
            format!("{} {} SMs {} B", c.method.name(), c.sms, c.bytes)
        } else {
            format!("{} {} B", c.method.name(), c.bytes)
        };
        rows.push(json::obj([
            ("case", Json::from(case)),
            ("method", Json::from(c.method.name())),
            (
                "direction",
                Json::from(if c.method.is_read() { "read" } else { "write" }),
            ),
            (
                "sms",
                Json::from(c.method.is_kernel().then_some(c.sms as usize)),
            ),
            ("block", Json::from((!block.is_empty()).then_some(block))),
            ("bytes", Json::from(c.bytes)),
            ("backend", Json::from(backend)),
            ("weft_ms", Json::from(t)),
            ("min_rank_ms", Json::from(tmin)),
            ("gbs", Json::from(gbs)),
            ("baseline", Json::from(BASELINE)),
            ("baseline_ms", Json::from(base)),
            ("ratio", Json::from(ratio)),
            ("pct_of_copy_engine", Json::from(ratio.map(|r| 100.0 * r))),
        ]));
    }
    if rank == 0 {
        println!(
            "\n# weft bench pgl: data flows rank r -> r+1 on all {world} ranks at once (writes issued by the sender, reads by the receiver); {backend} backend; {sms} SMs per GPU"
        );
        for line in goal_summary(&pcts) {
            println!("{line}");
        }
    }
    Ok(SuiteResult { table, rows })
}

/// Poisons this rank's `dst`, runs `method` once at `bytes` on every rank, and checks that `dst`
/// holds rank `prev`'s source; every rank learns every rank's verdict.
#[allow(clippy::too_many_arguments)]
fn verify(
    job: &mut Job,
    copy: &Transfer,
    dst: &Pgl<u32>,
    host: &mut [u32],
    seed: u64,
    prev: usize,
    method: Method,
    blocks: u32,
    bytes: usize,
) -> anyhow::Result<()> {
    let stream = copy.stream;
    let words = bytes / 4;
    // Words past the message that must keep their poison (an overrun would overwrite them).
    let guard = (host.len() - words).min(64);
    // The previous rank may still be running its last timed write into our destination.
    stream.synchronize()?;
    job.rdzv.barrier()?;
    // SAFETY: the local destination holds at least `words + guard` words.
    unsafe {
        sys::cuMemsetD32Async(dst.local_ptr(), POISON, words + guard, stream.cu_stream())
            .result()?
    };
    stream.synchronize()?;
    job.rdzv.barrier()?; // every destination poisoned before any rank writes
    copy.enqueue(method, blocks, bytes)?;
    stream
        .synchronize()
        .with_context(|| format!("{} on {blocks} SMs, {bytes} B (check run)", method.name()))?;
    job.rdzv.barrier()?; // every copy into every destination done
                         // SAFETY: `host` holds `words + guard` words; synchronised below before it is read.
    unsafe {
        result::memcpy_dtoh_async(
            &mut host[..words + guard],
            dst.local_ptr(),
            stream.cu_stream(),
        )?
    };
    stream.synchronize()?;
    let overrun = host[words..words + guard].iter().position(|&w| w != POISON);
    let local = match (check_source(&host[..words], seed, prev), overrun) {
        (Some(wrong), _) => Err(anyhow::anyhow!(wrong)),
        (None, Some(i)) => Err(anyhow::anyhow!(
            "wrote past the message: word {} (message ends at {words})",
            words + i
        )),
        (None, None) => Ok(()),
    };
    let sms = if method.is_kernel() {
        format!(" on {blocks} SMs")
    } else {
        String::new()
    };
    let step = format!(
        "weft bench pgl: checking {}{sms}, {bytes} B (seed {seed}, WEFT_SEED={seed} replays it)",
        method.name()
    );
    weft_pgl::agree(&mut job.rdzv, &step, local)
}

/// Per kernel method: the fewest SMs (at most GOAL_MAX_SMS) reaching GOAL_PCT of the copy engine
/// at every measured size from GOAL_FROM_BYTES up, or the best it reached.
fn goal_summary(pcts: &[(Method, u32, usize, f64)]) -> Vec<String> {
    let mut out = vec![format!(
        "goal: >= {GOAL_PCT:.0}% of the copy engine with <= {GOAL_MAX_SMS} SMs at every size from {} up",
        human_size(GOAL_FROM_BYTES)
    )];
    for method in METHODS.into_iter().filter(|m| m.is_kernel()) {
        let mut sms: Vec<u32> = pcts
            .iter()
            .filter(|p| p.0 == method && p.1 <= GOAL_MAX_SMS)
            .map(|p| p.1)
            .collect();
        sms.sort_unstable();
        sms.dedup();
        // The worst size from GOAL_FROM_BYTES up at each SM count.
        let worst = |s: u32| {
            pcts.iter()
                .filter(|p| p.0 == method && p.1 == s && p.2 >= GOAL_FROM_BYTES)
                .map(|p| p.3)
                .fold(f64::INFINITY, f64::min)
        };
        let line = match sms
            .iter()
            .find(|&&s| worst(s).is_finite() && worst(s) >= GOAL_PCT)
        {
            Some(&s) => format!(
                "  {}: met from {s} SMs (worst size {:.1}%)",
                method.name(),
                worst(s)
            ),
            None => match sms
                .iter()
                .filter(|&&s| worst(s).is_finite())
                .map(|&s| (s, worst(s)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
            {
                Some((s, w)) => format!("  {}: not met (best: {w:.1}% at {s} SMs)", method.name()),
                None => format!("  {}: not measured", method.name()),
            },
        };
        out.push(line);
    }
    out
}

fn human_size(bytes: usize) -> String {
    match bytes {
        b if b >= GIB && b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= KIB && b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_run_from_4k_to_1g_in_steps_of_4() {
        let s = sizes(false);
        assert_eq!(s.first(), Some(&(4 * KIB)));
        assert_eq!(s.last(), Some(&GIB));
        assert!(s.windows(2).all(|w| w[1] == 4 * w[0]));
        assert_eq!(sizes(true), vec![64 * MIB, GIB]);
        assert!(s.iter().all(|b| b % 16 == 0));
    }

    #[test]
    fn sm_counts_follow_the_device() {
        assert_eq!(sm_counts(132, false), vec![4, 8, 16, 32, 66, 132]);
        assert_eq!(sm_counts(78, false), vec![4, 8, 16, 32, 39, 78]);
        assert_eq!(sm_counts(20, false), vec![4, 8, 10, 16, 20]);
        assert_eq!(sm_counts(132, true), vec![16, 32, 132]);
        assert_eq!(sm_counts(1, false), vec![1]);
    }

    #[test]
    fn bulk_config_from_env_and_validation() {
        assert_eq!(
            BulkConfig::from_env(|_| None).unwrap(),
            BulkConfig::default()
        );
        assert!(BulkConfig::default().validate().is_ok());
        let c = BulkConfig::from_env(|_| Some("65536, 3, 1".into())).unwrap();
        assert_eq!(
            c,
            BulkConfig {
                chunk: 65536,
                stages: 3,
                inflight: 1
            }
        );
        for bad in [
            "1000,4,1",
            "32768,1,1",
            "32768,9,1",
            "32768,4,4",
            "32768,4,0",
            "32768,4",
            "a,b,c",
        ] {
            assert!(BulkConfig::from_env(|_| Some(bad.into())).is_err(), "{bad}");
        }
    }

    #[test]
    fn bulk_chunks_shrink_for_small_messages() {
        let c = BulkConfig::default();
        assert_eq!(c.chunk_for(GIB, 32), 32 * KIB as u32);
        assert_eq!(c.chunk_for(4 * KIB, 32), 128);
        assert_eq!(c.chunk_for(4 * KIB, 132), 32); // 31.03 → 32
        assert_eq!(c.chunk_for(16, 132), 16);
        for (bytes, blocks) in [(4 * KIB, 4), (1 << 20, 132), (48, 7)] {
            let ch = c.chunk_for(bytes, blocks);
            assert!(
                ch % 16 == 0 && ch >= 16 && ch <= c.chunk,
                "{bytes} {blocks} -> {ch}"
            );
        }
    }

    #[test]
    fn source_words_differ_by_rank_and_are_never_poison() {
        assert_ne!(
            (0..64).map(|i| source_word(7, 0, i)).collect::<Vec<_>>(),
            (0..64).map(|i| source_word(7, 1, i)).collect::<Vec<_>>()
        );
        assert!((0..100_000).all(|i| source_word(7, 3, i) != POISON));
        let mut buf = vec![0u32; 10_001];
        fill_source(&mut buf, 9, 2);
        assert!(check_source(&buf, 9, 2).is_none());
        buf[10_000] = POISON;
        buf[5] ^= 1;
        let e = check_source(&buf, 9, 2).unwrap();
        assert!(
            e.starts_with("2 of 10001 words differ from rank 2")
                && e.contains("[5]")
                && e.contains("never written"),
            "{e}"
        );
        assert!(check_source(&buf, 9, 1)
            .unwrap()
            .starts_with("10001 of 10001"));
    }

    #[test]
    fn goal_summary_finds_the_fewest_sms() {
        let m = Method::BulkWrite;
        let p = vec![
            (m, 8, 64 * MIB, 85.0),
            (m, 8, GIB, 97.0),
            (m, 16, 64 * MIB, 95.5),
            (m, 16, GIB, 96.0),
            (m, 16, 4 * KIB, 10.0), // below 64 MiB: not part of the goal
            (Method::PlainWrite, 16, GIB, 94.0),
            (Method::PlainWrite, 132, GIB, 99.0), // more than 16 SMs: not part of the goal
        ];
        let s = goal_summary(&p).join("\n");
        assert!(
            s.contains("bulk write: met from 16 SMs (worst size 95.5%)"),
            "{s}"
        );
        assert!(
            s.contains("plain write: not met (best: 94.0% at 16 SMs)"),
            "{s}"
        );
        assert!(s.contains("plain read: not measured"), "{s}");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(4 * KIB), "4 KiB");
        assert_eq!(human_size(256 * MIB), "256 MiB");
        assert_eq!(human_size(GIB), "1 GiB");
        assert_eq!(human_size(48), "48 B");
    }
}
