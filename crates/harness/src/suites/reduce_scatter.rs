//! signal-gemm II, ReduceScatter: the rank-bands reorder map and its restore, and GEMM +
//! ReduceScatter overlapped with NCCL, checked against independent paths (the standard-layout
//! GEMM bit for bit; cuBLAS then a sum over ranks by NCCL within the derived bf16 bound).

use super::gpu;
use super::overlap::{
    back_to_back, poison_bf16, random_case, random_groups, reference, with_budget, Reference,
};
use crate::data::shared_seed;
use crate::gemm_data::{band_receive, download, poisoned, uniform, upload};
use crate::job::Job;
use crate::reduce_check::{check_within, pick_rows};
use crate::trials::Case;
use cudarc::driver::{CudaContext, CudaStream};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use weft_signal_gemm::overlap::ReduceScatterOverlap;
use weft_signal_gemm::{
    Dtype, Gemm, GemmElement, GemmOptions, GemmPlan, GemmShape, GroupCounters, LaunchExtras,
    OutputLayout, RankBandMap, Restore, TileChoice, WaveGroups, MAX_BAND_RANKS,
};

pub fn cases() -> Vec<Case> {
    let round_trips: [(u32, fn(&mut Job) -> anyhow::Result<()>); MAX_BAND_RANKS as usize] = [
        (1, round_trip_for::<1>),
        (2, round_trip_for::<2>),
        (3, round_trip_for::<3>),
        (4, round_trip_for::<4>),
        (5, round_trip_for::<5>),
        (6, round_trip_for::<6>),
        (7, round_trip_for::<7>),
        (8, round_trip_for::<8>),
    ];
    let mut cases: Vec<Case> = round_trips
        .into_iter()
        .map(|(ranks, body)| {
            Case::gpu(
                format!("reduce_scatter::rank_bands_round_trip_is_bitwise::ranks_{ranks}"),
                body,
            )
        })
        .collect();
    cases.extend([
        Case::gpu(
            "reduce_scatter::matches_cublas_then_nccl",
            reduce_scatter_vs_sequential,
        ),
        Case::gpu("reduce_scatter::stress_back_to_back", reduce_scatter_stress),
        Case::gpu("reduce_scatter::bad_inputs_are_rejected", bad_inputs),
    ]);
    cases
}

/// For random shapes, dtypes, tiles, clusters, schedules and groupings, cut for `ranks` ranks (no
/// NCCL: each rank's receive is simulated by copying part r of every group's range): every
/// rank's restored rows equal the standard-layout GEMM's rows they name, bit for bit, and
/// together they are every row once (RankBandMap's unit test); every band slot holds finite
/// values where its tile has data, exactly 0 where it has none, and a short band's unused slot
/// rows stay unwritten.
fn round_trip_for<const RANKS: u32>(job: &mut Job) -> anyhow::Result<()> {
    rank_bands_round_trip(job, RANKS)
}

fn rank_bands_round_trip(job: &mut Job, ranks: u32) -> anyhow::Result<()> {
    let seed = shared_seed(job)?.wrapping_add(job.rank() as u64 + 1000 * u64::from(ranks));
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..6 {
        let output = [Dtype::Bf16, Dtype::F16, Dtype::F32][i % 3];
        let (shape, options) = random_case(&mut rng, 1024, output);
        match output {
            Dtype::Bf16 => band_round_trip::<bf16>(
                &ctx,
                &stream,
                &mut rng,
                shape,
                options,
                ranks,
                seed + i as u64,
            ),
            Dtype::F16 => band_round_trip::<f16>(
                &ctx,
                &stream,
                &mut rng,
                shape,
                options,
                ranks,
                seed + i as u64,
            ),
            Dtype::F32 => band_round_trip::<f32>(
                &ctx,
                &stream,
                &mut rng,
                shape,
                options,
                ranks,
                seed + i as u64,
            ),
        }
        .map_err(|e| {
            e.context(format!(
                "case {i}: {shape} {options:?} {ranks} ranks seed {seed}"
            ))
        })?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn band_round_trip<TO: GemmElement>(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    rng: &mut StdRng,
    shape: GemmShape,
    options: GemmOptions,
    ranks: u32,
    seed: u64,
) -> anyhow::Result<()> {
    let gemm = Gemm::new(ctx, shape, options)?;
    let plan = gemm.plan().clone();
    let groups = WaveGroups::new(&plan, &random_groups(rng, &plan))?;
    let counters = with_budget(GroupCounters::new(stream, groups.clone(), 0)?, ctx)?;
    let layout = OutputLayout::RankBands { ranks };
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let a = upload(stream, &uniform::<bf16>(seed, m * k))?;
    let b = upload(stream, &uniform::<bf16>(seed ^ 1, k * n))?;
    let mut standard = poisoned::<TO>(stream, m * n)?;
    gemm.launch(stream, &a, &b, &mut standard)?;
    let mut staging = poisoned::<TO>(stream, layout.elements(&plan) as usize)?;
    gemm.launch_with(
        stream,
        &a,
        &b,
        &mut staging,
        LaunchExtras {
            groups: Some(&counters),
            layout,
            ..Default::default()
        },
    )?;
    for g in 0..groups.count() {
        counters.wait(stream, g)?;
    }
    stream.synchronize()?;
    gemm.check()?;
    counters.check()?;
    let want = download(stream, &standard)?;
    let bits = |v: TO| v.to_f64().to_bits(); // f16/bf16/f32 -> f64 is injective
    for rank in 0..ranks {
        let map = RankBandMap::new(stream, &plan, ranks, rank)?;
        let received = band_receive(
            stream,
            &map,
            &groups,
            &staging,
            rank as usize,
            ranks as usize,
        )?;
        let rows = map.rows() as usize;
        let mut out = poisoned::<TO>(stream, rows * n)?;
        map.restore(stream, &received, &mut out, Restore::Copy)?;
        let got = download(stream, &out)?;
        for i in 0..rows {
            let g = map.global_row(i as u32) as usize;
            for c in 0..n {
                anyhow::ensure!(
                    bits(got[i * n + c]) == bits(want[g * n + c]),
                    "groups {groups}, rank {rank} of {ranks}: output row {i} (standard row {g}) column {c} is {}, the standard GEMM's {}",
                    got[i * n + c].to_f64(),
                    want[g * n + c].to_f64()
                );
            }
        }
    }
    check_band_slots(&download(stream, &staging)?, &plan, &groups, ranks)
}

/// Every band slot of a RANK_BANDS buffer, located as abi/gemm.h documents it (a tile's 16 atoms of
/// 8 rows dealt in order, band r getting 16 / ranks atoms and one more if r < 16 % ranks; group
/// g's range holds `ranks` parts of its order count slots each, part r holding band r of each
/// of its tiles; a slot has the largest band's rows).
fn check_band_slots<T: GemmElement>(
    staging: &[T],
    plan: &GemmPlan,
    groups: &WaveGroups,
    ranks: u32,
) -> anyhow::Result<()> {
    let (tile_m, tile_n) = (plan.tile_m() as usize, plan.tile_n() as usize);
    let (m, n) = (plan.shape.m as usize, plan.shape.n as usize);
    let world = ranks as usize;
    let atoms = |r: usize| 16 / world + usize::from(r < 16 % world);
    let band_start = |r: usize| 8 * (0..r).map(atoms).sum::<usize>();
    let band_rows = 8 * atoms(0);
    let real: std::collections::HashMap<u32, (usize, usize)> = plan
        .schedule()
        .iter()
        .map(|t| (t.order, (t.tm as usize, t.tn as usize)))
        .collect();
    for g in 0..groups.count() {
        let orders = groups.orders(g);
        let count = orders.len();
        for order in orders.clone() {
            let (rows, cols) = match real.get(&order) {
                Some(&(tm, tn)) => ((m - tm * tile_m).min(tile_m), (n - tn * tile_n).min(tile_n)),
                None => (0, 0), // a phantom: zeros
            };
            for r in 0..ranks as usize {
                let slot = orders.start as usize * ranks as usize
                    + r * count
                    + (order - orders.start) as usize;
                let band_len = 8 * atoms(r);
                for w in 0..band_rows {
                    let y = band_start(r) + w; // row in the tile
                    for c in 0..tile_n {
                        let v = staging[(slot * band_rows + w) * tile_n + c].to_f64();
                        let ok = if w >= band_len {
                            v.is_nan() // never written (poison)
                        } else if y < rows && c < cols {
                            v.is_finite()
                        } else {
                            v == 0.0
                        };
                        anyhow::ensure!(
                            ok,
                            "order {order} band {r} (slot {slot}): element ({w}, {c}) is {v}; the band has {band_len} rows, the tile {rows} x {cols} data"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// The reference's rows that `map` names (values and bounds), for comparing with its output.
fn reference_rows(r: &Reference, map: &RankBandMap, n: usize) -> (Vec<bf16>, Vec<f32>) {
    let rows: Vec<u32> = (0..map.rows()).map(|i| map.global_row(i)).collect();
    (pick_rows(&r.want, &rows, n), pick_rows(&r.bound, &rows, n))
}

/// GEMM + ReduceScatter through signals equals cuBLAS then a sum over ranks by NCCL, on every
/// row this rank owns, for random ragged shapes, tiles, clusters, schedules and groupings, twice
/// per plan (fresh inputs).
fn reduce_scatter_vs_sequential(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (ctx, stream) = gpu(job)?;
    let mut rng = StdRng::seed_from_u64(seed); // the same shapes and groups on every rank
    for i in 0..8u64 {
        let (shape, options) = random_case(&mut rng, 2048, Dtype::Bf16);
        let plan = GemmPlan::new(weft_signal_gemm::device_sms(&ctx)?, shape, options)?;
        let parts = random_groups(&mut rng, &plan);
        let ov = ReduceScatterOverlap::new(
            &stream,
            shape,
            options,
            Some(&parts),
            world as u32,
            rank as u32,
        )?;
        let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
        for round in 0..2u64 {
            let s = seed ^ (i << 20) ^ (round << 40) ^ ((rank as u64) << 50);
            let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
            let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
            let r = reference(job, shape, options, &a, &b)?;
            let (comm, _) = job.comm_and_gpu()?;
            let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
            let mut received = poisoned::<bf16>(&stream, ov.received_len())?;
            let mut out = poisoned::<bf16>(&stream, ov.map().rows() as usize * n)?;
            ov.run(
                &stream,
                comm,
                &a,
                &b,
                &mut staging,
                &mut received,
                &mut out,
                Restore::Copy,
            )?;
            stream.synchronize()?;
            ov.check()?;
            let (want, bound) = reference_rows(&r, ov.map(), n);
            let what = format!(
                "case {i} round {round}: {} groups {} rank {rank} of {world} ({} rows) seed {seed}",
                ov.gemm().plan().describe(),
                ov.groups(),
                ov.map().rows()
            );
            check_within(
                &format!("{what} (against cuBLAS + NCCL)"),
                &download(&stream, &out)?,
                &want,
                &bound,
                n,
            )?;
        }
    }
    Ok(())
}

/// 10⁴ back-to-back overlapped GEMM + ReduceScatter runs with no host synchronisation,
/// alternating two input sets, the staging and received buffers poisoned (NaN) before every
/// run: each output compared on the GPU, bit for bit, with the verified first result of its set.
fn reduce_scatter_stress(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (_ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(2048, 1024, 128);
    let options = GemmOptions {
        tile: TileChoice::N128,
        sm_margin: 100,
        ..GemmOptions::default()
    };
    let ov = ReduceScatterOverlap::new(&stream, shape, options, None, world as u32, rank as u32)?;
    anyhow::ensure!(
        ov.groups().count() >= 3,
        "stress plan {} has {} groups",
        ov.gemm().plan().describe(),
        ov.groups().count()
    );
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let rows = ov.map().rows() as usize;
    let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
    let mut received = poisoned::<bf16>(&stream, ov.received_len())?;
    let mut inputs = Vec::new();
    let mut verified = Vec::new();
    for set in 0..2u64 {
        let s = seed ^ (set << 40) ^ ((rank as u64) << 50);
        let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
        let r = reference(job, shape, options, &a, &b)?;
        let (comm, _) = job.comm_and_gpu()?;
        let mut out = poisoned::<bf16>(&stream, rows * n)?;
        ov.run(
            &stream,
            comm,
            &a,
            &b,
            &mut staging,
            &mut received,
            &mut out,
            Restore::Copy,
        )?;
        stream.synchronize()?;
        ov.check()?;
        let (want, bound) = reference_rows(&r, ov.map(), n);
        check_within(
            &format!("stress input set {set} (against cuBLAS + NCCL)"),
            &download(&stream, &out)?,
            &want,
            &bound,
            n,
        )?;
        inputs.push((a, b));
        verified.push(out);
    }
    let (comm, _) = job.comm_and_gpu()?;
    back_to_back(&stream, &verified, |it, out| {
        poison_bf16(&stream, &mut staging)?;
        poison_bf16(&stream, &mut received)?;
        let (a, b) = &inputs[it % 2];
        ov.run(
            &stream,
            comm,
            a,
            b,
            &mut staging,
            &mut received,
            out,
            Restore::Copy,
        )
        .map_err(anyhow::Error::from)
    })?;
    ov.check().map_err(anyhow::Error::from)
}

/// Misuse gets an error that names it.
fn bad_inputs(job: &mut Job) -> anyhow::Result<()> {
    let (rank, world) = (job.rank() as u32, job.world() as u32);
    let (ctx, stream) = gpu(job)?;
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
    let gemm = Gemm::new(&ctx, shape, options)?;
    let plan = gemm.plan().clone();
    let a = poisoned::<bf16>(&stream, 1024 * 256)?;
    let b = poisoned::<bf16>(&stream, 1024 * 256)?;
    let nine = OutputLayout::RankBands {
        ranks: MAX_BAND_RANKS + 1,
    };
    let mut big = poisoned::<bf16>(&stream, 4 * 1024 * 1024)?;
    expect(
        gemm.launch_with(
            &stream,
            &a,
            &b,
            &mut big,
            LaunchExtras {
                layout: nine,
                ..Default::default()
            },
        )
        .map_err(anyhow::Error::from),
        "1 to 8 ranks",
    )?;
    expect(
        RankBandMap::new(&stream, &plan, world, world)
            .map(|_| ())
            .map_err(anyhow::Error::from),
        &format!("rank {world} of {world}"),
    )?;
    expect(
        ReduceScatterOverlap::new(
            &stream,
            shape,
            GemmOptions {
                beta: 1.0,
                ..options
            },
            None,
            world,
            rank,
        )
        .map(|_| ())
        .map_err(anyhow::Error::from),
        "beta",
    )?;
    let ov = ReduceScatterOverlap::new(&stream, shape, options, None, world, rank)?;
    let n = 1024usize;
    let mut staging = poisoned::<bf16>(&stream, ov.staging_len())?;
    let mut received = poisoned::<bf16>(&stream, ov.received_len())?;
    let mut out = poisoned::<bf16>(&stream, ov.map().rows() as usize * n)?;
    let mut short_received = poisoned::<bf16>(&stream, ov.received_len() - 1)?;
    let mut short_out = poisoned::<bf16>(&stream, ov.map().rows() as usize * n - 1)?;
    let mut short_staging = poisoned::<bf16>(&stream, ov.staging_len() - 1)?;
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
            Restore::Copy,
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
            &mut short_received,
            &mut out,
            Restore::Copy,
        )
        .map_err(anyhow::Error::from),
        "slot buffer",
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
            Restore::Copy,
        )
        .map_err(anyhow::Error::from),
        "output has",
    )?;
    if world < MAX_BAND_RANKS {
        let other = ReduceScatterOverlap::new(&stream, shape, options, None, world + 1, rank)?;
        let mut other_staging = poisoned::<bf16>(&stream, other.staging_len())?;
        let mut other_received = poisoned::<bf16>(&stream, other.received_len())?;
        let mut other_out = poisoned::<bf16>(&stream, other.map().rows() as usize * n)?;
        expect(
            other
                .run(
                    &stream,
                    comm,
                    &a,
                    &b,
                    &mut other_staging,
                    &mut other_received,
                    &mut other_out,
                    Restore::Copy,
                )
                .map_err(anyhow::Error::from),
            "made for rank",
        )?;
    }
    // Refused before anything is enqueued: the next run still works.
    ov.run(
        &stream,
        comm,
        &a,
        &b,
        &mut staging,
        &mut received,
        &mut out,
        Restore::Copy,
    )?;
    stream.synchronize()?;
    ov.check()?;
    Ok(())
}
