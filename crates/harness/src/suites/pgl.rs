//! PGL correctness: every rank writes a rank- and index-dependent pattern into its slice of every
//! rank's buffer through the device view (kernels/pgl/pattern.cu), and every rank checks every
//! element of its own buffer against a host computation. Both backends, process mode and
//! single-process mode, sizes from one element per writer to over 1 GiB per rank, odd shapes and
//! ragged tiles; 1000 alloc/free cycles without growth; the errors ranks must agree on.

use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::{Case, Skip};
use cudarc::driver::{sys, CudaContext, CudaStream, LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_kernels::cubins;
use weft_pgl::multicast::{bind_multicast, MulticastOptIn};
use weft_pgl::{Backend, Bootstrap, Pgl, PglError, PglGroup, Shape};

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("pgl::pattern::vmm::process", |j| {
            pattern_process(j, Backend::Vmm)
        }),
        Case::gpu("pgl::pattern::ipc::process", |j| {
            pattern_process(j, Backend::Ipc)
        }),
        Case::gpu(
            "pgl::pattern::ipc::shared_user_buffer",
            pattern_shared_user_buffer,
        ),
        Case::gpu("pgl::pattern::vmm::single_process", |j| {
            pattern_single_process(j, Backend::Vmm)
        }),
        Case::gpu("pgl::pattern::ipc::single_process", |j| {
            pattern_single_process(j, Backend::Ipc)
        }),
        Case::gpu("pgl::alloc_free_1000::vmm", |j| {
            alloc_free_cycles(j, Backend::Vmm)
        }),
        Case::gpu("pgl::alloc_free_1000::ipc", |j| {
            alloc_free_cycles(j, Backend::Ipc)
        }),
        Case::gpu("pgl::errors::shape_mismatch", shape_mismatch),
        Case::gpu("pgl::errors::backend_mismatch", backend_mismatch),
        Case::gpu("pgl::errors::too_large", too_large),
        Case::gpu("pgl::multicast::refused_here", multicast_refused),
    ]
}

/// Must match pattern_value() in kernels/pgl/pattern.cu.
fn pattern_value(writer: u32, owner: u32, offset: u64) -> u32 {
    let mut x = offset
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((writer as u64) << 40)
        .wrapping_add((owner as u64) << 48)
        .wrapping_add(1);
    x ^= x >> 29;
    (x as u32) | 1
}

/// (slice shape (batch 1), tile rows, tile cols) cases for a world size; the buffer is the
/// slice stacked `world` times, one slice per writer.
fn pattern_cases(world: u32, rng: &mut StdRng) -> Vec<(Shape, u32, u32)> {
    // Over 1 GiB per rank: world slices of 16384-column rows.
    let big_rows = (1u32 << 28).div_ceil(world * 16384);
    vec![
        (Shape::new(1, 1, 1, 1), 16, 32),
        (Shape::new(1, 3, 5, 7), 16, 32),
        (Shape::new(1, 1, 17, 33), 16, 32),
        (Shape::new(1, 2, 1000, 999), 64, 64),
        (
            Shape::new(
                1,
                rng.random_range(1..4),
                rng.random_range(1..2000),
                rng.random_range(1..3000),
            ),
            1,
            256,
        ),
        (Shape::new(1, 1, big_rows, 16384), 64, 128),
    ]
}

fn launch_pattern(
    stream: &Arc<CudaStream>,
    pgl: &Pgl<u32>,
    tile_rows: u32,
    tile_cols: u32,
) -> anyhow::Result<()> {
    let module = cubins::PGL_PATTERN.load(stream.context())?;
    let f = module.load_function("weft_pgl_pattern")?;
    let view = pgl.view();
    let slice = Shape {
        batch: 1,
        ..pgl.shape()
    };
    let tiles = weft_pgl::TileGrid::new(slice, tile_rows, tile_cols)?.count();
    let sms = stream
        .context()
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
        as u64;
    let grid = tiles.min(sms * 8) as u32;
    let cfg = LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the view's buffers hold shape.elems() u32 on every rank and outlive the launch.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&view)
            .arg(&tile_rows)
            .arg(&tile_cols)
            .launch(cfg)?
    };
    Ok(())
}

/// Checks every element of `owner`'s buffer: slice w holds writer w's pattern.
fn check_pattern(pgl: &Pgl<u32>, owner: usize, what: &str) -> anyhow::Result<()> {
    let n = pgl.len();
    let mut host = vec![0u32; n];
    pgl.context().bind_to_thread()?;
    // SAFETY: copies the owner's n-element buffer into a host vector of n elements.
    let r = unsafe { sys::cuMemcpyDtoH_v2(host.as_mut_ptr().cast(), pgl.peer_ptr(owner), n * 4) };
    anyhow::ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "{what}: copying the buffer back failed: {r:?}"
    );
    let slice = n as u64 / pgl.world() as u64;
    let mut bad = 0u64;
    let mut first = Vec::new();
    for (i, &got) in host.iter().enumerate() {
        let writer = (i as u64 / slice) as u32;
        let want = pattern_value(writer, owner as u32, i as u64);
        if got != want {
            bad += 1;
            if first.len() < 3 {
                let note = if got == 0 { " (never written)" } else { "" };
                first.push(format!(
                    "[{i}] = {got:#x}, expected {want:#x} from rank {writer}{note}"
                ));
            }
        }
    }
    anyhow::ensure!(
        bad == 0,
        "{what}: rank {owner}'s buffer has {bad} of {n} elements wrong: {}",
        first.join("; ")
    );
    Ok(())
}

fn pattern_process(job: &mut Job, backend: Backend) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = super::gpu(job)?;
    pattern_exchange(
        &mut job.rdzv,
        &ctx,
        &stream,
        backend,
        seed,
        usize::MAX,
        "process mode",
    )
}

/// The first `cases` pattern cases of `seed`, each a PGL allocated through `bootstrap`, written by
/// every rank into every peer's buffer, checked by its owner, and freed.
pub(super) fn pattern_exchange(
    bootstrap: &mut dyn Bootstrap,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    backend: Backend,
    seed: u64,
    cases: usize,
    label: &str,
) -> anyhow::Result<()> {
    let (rank, world) = (bootstrap.rank(), bootstrap.world() as u32);
    for (slice, tr, tc) in pattern_cases(world, &mut StdRng::seed_from_u64(seed))
        .into_iter()
        .take(cases)
    {
        let shape = Shape {
            batch: world,
            ..slice
        };
        let what = format!(
            "{} {label}, shape {shape}, tiles {tr}×{tc}, seed {seed}",
            backend.name()
        );
        let pgl: Pgl<u32> = Pgl::alloc(bootstrap, ctx, shape, backend)?;
        launch_pattern(stream, &pgl, tr, tc)?;
        stream.synchronize()?;
        // Every rank's writes have landed before anyone checks.
        bootstrap.barrier()?;
        let checked = check_pattern(&pgl, rank, &what);
        pgl.free(bootstrap)?;
        checked?;
    }
    Ok(())
}

/// A buffer the caller allocated (cuMemAlloc, used 256 bytes past the allocation's start so the
/// IPC offset matters) shared with `Pgl::share`; weft must not free it.
fn pattern_shared_user_buffer(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world() as u32);
    let (ctx, stream) = {
        let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
        (gpu.ctx.clone(), gpu.stream.clone())
    };
    let shape = Shape::new(world, 1, 333, 517);
    let bytes = shape.elems() as usize * 4;
    ctx.bind_to_thread()?;
    let mut base = 0;
    // SAFETY: out-parameter.
    let r = unsafe { sys::cuMemAlloc_v2(&mut base, bytes + 256) };
    anyhow::ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuMemAlloc failed: {r:?}");
    // SAFETY: base + 256 holds `bytes` bytes and outlives the Pgl (freed below, after pgl.free).
    let shared = unsafe { Pgl::<u32>::share(&mut job.rdzv, &ctx, shape, base + 256) }
        .map_err(anyhow::Error::from);
    let result = shared.and_then(|pgl| {
        launch_pattern(&stream, &pgl, 16, 32)?;
        stream.synchronize()?;
        job.rdzv.barrier()?;
        let checked = check_pattern(&pgl, rank, &format!("shared user buffer, shape {shape}"));
        pgl.free(&mut job.rdzv)?;
        checked
    });
    // The caller's memory is still the caller's: free it ourselves (weft must not have).
    // SAFETY: allocated above; every rank's Pgl over it is freed.
    let r = unsafe { sys::cuMemFree_v2(base) };
    result?;
    anyhow::ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "freeing the user buffer failed ({r:?}): was it freed twice?"
    );
    Ok(())
}

fn pattern_single_process(job: &mut Job, backend: Backend) -> anyhow::Result<()> {
    if job.world() != 1 {
        return Err(
            Skip("single-process mode runs in a one-rank job (`weft test pgl::`)".into()).into(),
        );
    }
    let count = CudaContext::device_count()? as usize;
    if count < 2 {
        return Err(Skip(format!(
            "single-process mode needs 2 or more GPUs; {count} visible"
        ))
        .into());
    }
    let seed = shared_seed(job)?;
    let contexts: Vec<Arc<CudaContext>> =
        (0..count).map(CudaContext::new).collect::<Result<_, _>>()?;
    let streams: Vec<Arc<CudaStream>> = contexts
        .iter()
        .map(|c| c.new_stream())
        .collect::<Result<_, _>>()?;
    for (slice, tr, tc) in pattern_cases(count as u32, &mut StdRng::seed_from_u64(seed)) {
        let shape = Shape {
            batch: count as u32,
            ..slice
        };
        let group: PglGroup<u32> = PglGroup::alloc(&contexts, shape, backend)?;
        for (m, s) in group.members().iter().zip(&streams) {
            launch_pattern(s, m, tr, tc)?;
        }
        for s in &streams {
            s.synchronize()?;
        }
        for (i, m) in group.members().iter().enumerate() {
            check_pattern(m, i, &format!("{} single-process mode on {count} GPUs, shape {shape}, tiles {tr}×{tc}, seed {seed}", backend.name()))?;
        }
        group.free()?;
    }
    Ok(())
}

pub(super) fn open_fds() -> anyhow::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

fn alloc_free_cycles(job: &mut Job, backend: Backend) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let world = job.world() as u32;
    let (ctx, stream) = {
        let gpu = job.gpu().map_err(|w| anyhow::anyhow!("no GPU: {w}"))?;
        (gpu.ctx.clone(), gpu.stream.clone())
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut before = None;
    const CYCLES: usize = 1000;
    const WARMUP: usize = 10;
    for cycle in 0..CYCLES + WARMUP {
        if cycle == WARMUP {
            before = Some((free_memory_between_barriers(job, &ctx)?, open_fds()?));
        }
        let shape = Shape::new(world, 1, rng.random_range(1..64), rng.random_range(1..4096));
        let pgl: Pgl<u32> = Pgl::alloc(&mut job.rdzv, &ctx, shape, backend)?;
        if cycle % 100 == 0 {
            launch_pattern(&stream, &pgl, 16, 32)?;
            stream.synchronize()?;
            job.rdzv.barrier()?;
            check_pattern(&pgl, job.rank(), &format!("cycle {cycle}, shape {shape}"))?;
        }
        pgl.free(&mut job.rdzv)?;
    }
    let (free0, fds0) = before.unwrap();
    let (free1, fds1) = (free_memory_between_barriers(job, &ctx)?, open_fds()?);
    // Ranks sharing the GPU (WEFT_SHARED_GPU=1) all count in its free memory.
    let sharing = weft_pgl::gpu::max_ranks_per_gpu(&mut job.rdzv, &ctx)? as u64;
    anyhow::ensure!(
        fds1 == fds0,
        "open file descriptors grew from {fds0} to {fds1} over {CYCLES} {} cycles",
        backend.name()
    );
    // The driver may keep a little bookkeeping; a leak of even one buffer per cycle would be GiBs.
    let grown = free0.saturating_sub(free1);
    anyhow::ensure!(
        grown as u64 <= sharing * (4 << 20),
        "free device memory shrank by {grown} B over {CYCLES} {} alloc/free cycles",
        backend.name()
    );
    Ok(())
}

/// The GPU's free memory with every rank's work finished and none started: on a GPU that ranks
/// share, another rank's buffer in flight would count as a leak.
pub(super) fn free_memory_between_barriers(
    job: &mut Job,
    ctx: &Arc<CudaContext>,
) -> anyhow::Result<usize> {
    ctx.synchronize()?;
    job.rdzv.barrier()?;
    let free = ctx.mem_get_info()?.0;
    job.rdzv.barrier()?;
    Ok(free)
}

fn needs_two_ranks(job: &Job) -> anyhow::Result<()> {
    if job.world() < 2 {
        return Err(Skip("needs 2 or more ranks".into()).into());
    }
    Ok(())
}

/// `r` as anyhow, once its error is the typed `PglError::RanksDisagree` (a success passes on, for
/// `expect_error` to report).
fn ranks_disagree<T>(what: &str, r: Result<T, PglError>) -> anyhow::Result<anyhow::Result<T>> {
    if let Err(e) = &r {
        anyhow::ensure!(
            matches!(e, PglError::RanksDisagree(_)),
            "{what}: expected PglError::RanksDisagree, got {e:?}"
        );
    }
    Ok(r.map_err(anyhow::Error::from))
}

/// The error every rank must see, checked for `expected` text.
fn expect_error<T>(what: &str, r: anyhow::Result<T>, expected: &[&str]) -> anyhow::Result<()> {
    match r {
        Ok(_) => anyhow::bail!("{what}: allocation succeeded but should have failed"),
        Err(e) => {
            let text = format!("{e:#}");
            for piece in expected {
                anyhow::ensure!(
                    text.contains(piece),
                    "{what}: error does not mention {piece:?}: {text}"
                );
            }
            Ok(())
        }
    }
}

fn shape_mismatch(job: &mut Job) -> anyhow::Result<()> {
    needs_two_ranks(job)?;
    let last = job.world() - 1;
    let n = if job.rank() == last { 17 } else { 16 };
    let ctx = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .ctx
        .clone();
    let r = Pgl::<f32>::alloc(&mut job.rdzv, &ctx, Shape::vector(n), Backend::Vmm);
    let r = ranks_disagree("shape mismatch", r)?;
    expect_error(
        "shape mismatch",
        r,
        &[
            "ranks disagree",
            &format!("rank {last} asked for shape (1, 1, 1, 17)"),
        ],
    )
}

fn backend_mismatch(job: &mut Job) -> anyhow::Result<()> {
    needs_two_ranks(job)?;
    let backend = if job.rank() == 0 {
        Backend::Ipc
    } else {
        Backend::Vmm
    };
    let ctx = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .ctx
        .clone();
    let r = Pgl::<f32>::alloc(&mut job.rdzv, &ctx, Shape::vector(16), backend);
    let r = ranks_disagree("backend mismatch", r)?;
    expect_error(
        "backend mismatch",
        r,
        &[
            "ranks disagree",
            "rank 0 asked for shape (1, 1, 1, 16) of f32 with the ipc backend",
            "rank 1 asked for",
        ],
    )
}

fn too_large(job: &mut Job) -> anyhow::Result<()> {
    let ctx = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .ctx
        .clone();
    // 8 TiB per rank.
    let r = Pgl::<u64>::alloc(
        &mut job.rdzv,
        &ctx,
        Shape::new(1, 1, 1 << 20, 1 << 20),
        Backend::Vmm,
    );
    // Rank 0 is named alone ("rank 0: …") or with the ranks that failed with the same text
    // (ranks sharing its GPU: "ranks 0, 2: …").
    let text = match r {
        Ok(_) => anyhow::bail!("too large: an 8 TiB PGL was allocated"),
        Err(e) => format!("{e:#}"),
    };
    anyhow::ensure!(
        text.contains("does not fit") && (text.contains("rank 0:") || text.contains("ranks 0, ")),
        "too large: error does not say it does not fit and name rank 0: {text}"
    );
    Ok(())
}

/// On machines that forbid multicast (NCCL_NVLS_ENABLE=0), or without the opt-in, setting it up
/// is refused before any multicast call. Never run where multicast is opted in.
fn multicast_refused(job: &mut Job) -> anyhow::Result<()> {
    if std::env::var("WEFT_ALLOW_MULTICAST").as_deref() == Ok("1") {
        return Err(Skip(
            "WEFT_ALLOW_MULTICAST=1: this machine opted in, so the refusal is not tested here"
                .into(),
        )
        .into());
    }
    let ctx = job
        .gpu()
        .map_err(|w| anyhow::anyhow!("no GPU: {w}"))?
        .ctx
        .clone();
    let pgl: Pgl<u32> = Pgl::alloc(&mut job.rdzv, &ctx, Shape::vector(1024), Backend::Vmm)?;
    let r = bind_multicast(
        &mut job.rdzv,
        &pgl,
        &MulticastOptIn::nvlink_multicast_is_allowed_on_this_machine(),
    );
    pgl.free(&mut job.rdzv)?;
    expect_error(
        "multicast",
        r.map_err(anyhow::Error::from),
        &["NVLink multicast refused"],
    )
}
