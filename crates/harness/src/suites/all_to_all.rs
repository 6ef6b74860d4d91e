//! signal-gemm II, All-to-All: every rank's GEMM output rows routed to ranks (MoE-style
//! dispatch) through the row-slots reorder map, overlapped with grouped ncclSend/ncclRecv,
//! checked bit for bit against an independent path: each rank's standard-layout GEMM,
//! all-gathered by NCCL, the routed rows picked on the host in the documented order.

use super::gpu;
use super::overlap::{back_to_back, poison_bf16, random_case, random_groups};
use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_signal_gemm::overlap::AllToAllOverlap;
use weft_signal_gemm::{Dtype, Gemm, GemmOptions, GemmPlan, GemmShape, KSplits, TileChoice};

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu(
            "all_to_all::matches_weft_gemm_then_nccl_all_gather",
            all_to_all_vs_gathered,
        ),
        Case::gpu("all_to_all::stress_back_to_back", all_to_all_stress),
        Case::gpu("all_to_all::bad_inputs_are_rejected", bad_inputs),
    ]
}

/// Every rank's routing (the same on every rank: drawn from `rng`), by pattern: uniform, all to
/// one rank, skewed (half the rows to rank 0), or in contiguous runs.
pub(super) fn random_routes(
    rng: &mut StdRng,
    world: usize,
    m: usize,
) -> (Vec<Vec<u32>>, &'static str) {
    let pattern = rng.random_range(0..4);
    let target = rng.random_range(0..world) as u32;
    let routes = (0..world)
        .map(|_| {
            let run = rng.random_range(1..=64usize);
            (0..m)
                .map(|row| match pattern {
                    0 => rng.random_range(0..world) as u32,
                    1 => target,
                    2 => {
                        if rng.random_bool(0.5) {
                            0
                        } else {
                            rng.random_range(0..world) as u32
                        }
                    }
                    _ => ((row / run) % world) as u32,
                })
                .collect()
        })
        .collect();
    (
        routes,
        ["uniform", "all to one rank", "skewed", "contiguous runs"][pattern],
    )
}

/// The independent path: this rank's standard-layout GEMM, all-gathered by NCCL, the rows routed
/// here picked as [`expected`] says.
fn gathered_expectation(
    job: &mut Job,
    stream: &Arc<CudaStream>,
    reference: &Gemm,
    (a, b): (&CudaSlice<bf16>, &CudaSlice<bf16>),
    routes: &[Vec<u32>],
) -> anyhow::Result<(Vec<bf16>, Vec<(u32, u32)>)> {
    let GemmShape { m, n, .. } = reference.plan().shape;
    let (m, n, world) = (m as usize, n as usize, job.world());
    let mut standard = poisoned::<bf16>(stream, m * n)?;
    reference.launch(stream, a, b, &mut standard)?;
    let mut gathered = poisoned::<bf16>(stream, world * m * n)?;
    job.comm()?.all_gather(&standard, &mut gathered, stream)?;
    let gathered = download(stream, &gathered)?;
    reference.check()?;
    Ok(expected(&gathered, routes, job.rank(), m, n))
}

/// The rows routed to `rank`, source by source, each source's in increasing row order (the
/// order the map documents), from every rank's standard output (`gathered`, world × m × n).
fn expected(
    gathered: &[bf16],
    routes: &[Vec<u32>],
    rank: usize,
    m: usize,
    n: usize,
) -> (Vec<bf16>, Vec<(u32, u32)>) {
    let mut rows = Vec::new();
    let mut sources = Vec::new();
    for (s, r) in routes.iter().enumerate() {
        for (row, &d) in r.iter().enumerate() {
            if d as usize == rank {
                rows.extend_from_slice(&gathered[(s * m + row) * n..(s * m + row + 1) * n]);
                sources.push((s as u32, row as u32));
            }
        }
    }
    (rows, sources)
}

/// GEMM + All-to-All through signals equals weft's standard-layout GEMM all-gathered by NCCL
/// and routed on the host, bit for bit, for random ragged shapes, tiles, clusters, schedules,
/// groupings and routings (uniform, all to one rank, skewed, runs), twice per plan.
fn all_to_all_vs_gathered(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed); // the same shapes, groups and routes on every rank
    for i in 0..8u64 {
        let (shape, options) = random_case(&mut rng, 2048, Dtype::Bf16);
        let plan = GemmPlan::new(weft_signal_gemm::device_sms(&ctx)?, shape, options)?;
        let parts = random_groups(&mut rng, &plan);
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        let (routes, pattern) = random_routes(&mut rng, world, m);
        let ov = AllToAllOverlap::new(&stream, shape, options, Some(&parts), &routes, rank)?;
        let reference = Gemm::new(&ctx, shape, options)?;
        for round in 0..2u64 {
            let s = seed ^ (i << 20) ^ (round << 40) ^ ((rank as u64) << 50);
            let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
            let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
            let (want, sources) =
                gathered_expectation(job, &stream, &reference, (&a, &b), &routes)?;
            let (comm, _) = job.comm_and_gpu()?;
            // At least one element: a rank may send or receive nothing (device buffers cannot be empty).
            let mut staging = poisoned::<bf16>(&stream, ov.staging_len().max(1))?;
            let mut received = poisoned::<bf16>(&stream, ov.received_len().max(1))?;
            let mut out = poisoned::<bf16>(&stream, (ov.map().rows() * n).max(1))?;
            ov.run(&stream, comm, &a, &b, &mut staging, &mut received, &mut out)?;
            stream.synchronize()?;
            ov.check()?;
            let what = format!("case {i} round {round}: {} groups {} routing {pattern} rank {rank} of {world} seed {seed}", ov.gemm().plan().describe(), ov.groups());
            anyhow::ensure!(
                ov.map().rows() == sources.len(),
                "{what}: {} rows received, {} routed here",
                ov.map().rows(),
                sources.len()
            );
            for (i, src) in sources.iter().enumerate() {
                anyhow::ensure!(
                    ov.map().source_row(i) == *src,
                    "{what}: output row {i} named as {:?}, expected {src:?}",
                    ov.map().source_row(i)
                );
            }
            let got = download(&stream, &out)?[..want.len()].to_vec();
            if let Some(e) = got
                .iter()
                .zip(&want)
                .position(|(g, w)| g.to_bits() != w.to_bits())
            {
                anyhow::bail!(
                    "{what}: output ({}, {}) (source {:?}) is {}, the gathered GEMM's {}",
                    e / n,
                    e % n,
                    sources[e / n],
                    got[e],
                    want[e]
                );
            }
        }
    }
    Ok(())
}

/// 10⁴ back-to-back overlapped runs with no host synchronisation, alternating two input sets,
/// staging and received buffers poisoned before each: every output bit-equal to its set's
/// verified one (a stale or early read shows as a difference).
fn all_to_all_stress(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(2048, 1024, 128);
    let options = GemmOptions {
        tile: TileChoice::N128,
        sm_margin: 100,
        // Whole tiles, as the reordered launches run them (the reference adds in their order).
        k_splits: KSplits::Fixed(1),
        ..GemmOptions::default()
    };
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let mut rng = StdRng::seed_from_u64(seed);
    let routes: Vec<Vec<u32>> = (0..world)
        .map(|_| (0..m).map(|_| rng.random_range(0..world) as u32).collect())
        .collect();
    let ov = AllToAllOverlap::new(&stream, shape, options, None, &routes, rank)?;
    anyhow::ensure!(
        ov.groups().count() >= 3,
        "stress plan {} has {} groups",
        ov.gemm().plan().describe(),
        ov.groups().count()
    );
    let reference = Gemm::new(&ctx, shape, options)?;
    let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
    let mut received = poisoned::<bf16>(&stream, ov.received_len())?;
    let rows = ov.map().rows();
    let mut inputs = Vec::new();
    let mut verified = Vec::new();
    for set in 0..2u64 {
        let s = seed ^ (set << 40) ^ ((rank as u64) << 50);
        let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
        let (want, _) = gathered_expectation(job, &stream, &reference, (&a, &b), &routes)?;
        let (comm, _) = job.comm_and_gpu()?;
        let mut out = poisoned::<bf16>(&stream, rows * n)?;
        ov.run(&stream, comm, &a, &b, &mut staging, &mut received, &mut out)?;
        stream.synchronize()?;
        ov.check()?;
        anyhow::ensure!(
            download(&stream, &out)?
                .iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits()),
            "stress input set {set}: differs from the gathered GEMM"
        );
        inputs.push((a, b));
        verified.push(out);
    }
    let (comm, _) = job.comm_and_gpu()?;
    back_to_back(&stream, &verified, |it, out| {
        poison_bf16(&stream, &mut staging)?;
        poison_bf16(&stream, &mut received)?;
        let (a, b) = &inputs[it % 2];
        ov.run(&stream, comm, a, b, &mut staging, &mut received, out)
            .map_err(anyhow::Error::from)
    })?;
    ov.check().map_err(anyhow::Error::from)
}

/// Misuse gets an error that names it.
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let (_ctx, stream): (_, Arc<CudaStream>) = gpu(job)?;
    let shape = GemmShape::new(1024, 1024, 256);
    let options = GemmOptions {
        sm_margin: 100,
        ..GemmOptions::default()
    };
    let expect = |r: anyhow::Result<()>, needle: &str| -> anyhow::Result<()> {
        match r {
            Ok(()) => anyhow::bail!("accepted; expected an error containing {needle:?}"),
            Err(e) if format!("{e:#}").contains(needle) => Ok(()),
            Err(e) => anyhow::bail!("error {e:#} does not mention {needle:?}"),
        }
    };
    let good: Vec<Vec<u32>> = (0..world)
        .map(|s| (0..1024).map(|row| ((row + s) % world) as u32).collect())
        .collect();
    let mut short = good.clone();
    short[0].pop();
    expect(
        AllToAllOverlap::new(&stream, shape, options, None, &short, rank)
            .map(|_| ())
            .map_err(anyhow::Error::from),
        "has 1023 rows",
    )?;
    let mut far = good.clone();
    far[world - 1][7] = world as u32;
    expect(
        AllToAllOverlap::new(&stream, shape, options, None, &far, rank)
            .map(|_| ())
            .map_err(anyhow::Error::from),
        &format!("routes row 7 to rank {world}"),
    )?;
    expect(
        AllToAllOverlap::new(&stream, shape, options, None, &good, world)
            .map(|_| ())
            .map_err(anyhow::Error::from),
        &format!("rank {world} of {world}"),
    )?;
    let ov = AllToAllOverlap::new(&stream, shape, options, None, &good, rank)?;
    let a = poisoned::<bf16>(&stream, 1024 * 256)?;
    let b = poisoned::<bf16>(&stream, 1024 * 256)?;
    let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
    let mut received = poisoned::<bf16>(&stream, ov.received_len())?;
    let mut out = poisoned::<bf16>(&stream, ov.map().rows() * 1024)?;
    let mut short_staging = poisoned::<bf16>(&stream, ov.staging_len() - 1)?;
    let mut short_out = poisoned::<bf16>(&stream, ov.map().rows() * 1024 - 1)?;
    let (comm, _) = job.comm_and_gpu()?;
    expect(
        ov.run(
            &stream,
            comm,
            &a,
            &b,
            &mut short_staging,
            &mut received,
            &mut out,
        )
        .map_err(anyhow::Error::from),
        "staging buffer",
    )?;
    expect(
        ov.run(
            &stream,
            comm,
            &a,
            &b,
            &mut staging,
            &mut received,
            &mut short_out,
        )
        .map_err(anyhow::Error::from),
        "output has",
    )?;
    // Refused before anything is enqueued: the next run still works.
    ov.run(&stream, comm, &a, &b, &mut staging, &mut received, &mut out)?;
    stream.synchronize()?;
    ov.check()?;
    Ok(())
}
