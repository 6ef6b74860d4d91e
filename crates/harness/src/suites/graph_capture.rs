//! signal-gemm II under CUDA graph capture: a whole overlapped run (GEMM, group waits, NCCL
//! calls on the communication stream, restore) captured once and replayed. The group counters
//! are rearmed by their waits, so every replay is the same work; the replays' outputs are
//! compared on the GPU, bit for bit, with eager runs' verified outputs.

use super::gpu;
use super::overlap::{reference, Reference};
use crate::bench::overlap_ops::Signal;
use crate::data::shared_seed;
use crate::gemm_data::{download, poisoned, uniform, upload};
use crate::job::Job;
use crate::reduce_check::{check_within, pick_rows};
use crate::trials::Case;
use crate::word_compare::WordCompare;
use cudarc::driver::sys;
use half::bf16;
use weft_signal_gemm::tuner::Op;
use weft_signal_gemm::{
    Gemm, GemmOptions, GemmPlan, GemmShape, Scheduling, TileChoice, WaveGroups,
};

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("graph_capture::all_reduce_overlap_replays", |j| {
            replays(j, Op::AllReduce)
        }),
        Case::gpu("graph_capture::reduce_scatter_overlap_replays", |j| {
            replays(j, Op::ReduceScatter)
        }),
        Case::gpu(
            "graph_capture::dynamic_schedule_is_refused",
            dynamic_refused,
        ),
    ]
}

const REPLAYS: usize = 200;

/// Two input sets, each run eagerly and checked against cuBLAS then NCCL; then the run captured
/// once (inputs and output at fixed addresses) and replayed REPLAYS times, the inputs switched
/// between replays by device copies and the output poisoned before each: every replay's output
/// equals its set's eager output bit for bit.
fn replays(job: &mut Job, op: Op) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(2048, 1024, 256);
    let options = GemmOptions {
        tile: TileChoice::N128,
        sm_margin: 100,
        scheduling: Scheduling::Static,
        ..GemmOptions::default()
    };
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let (rank, world) = (job.rank(), job.world());
    let plan = GemmPlan::new(weft_signal_gemm::device_sms(&ctx)?, shape, options)?;
    let one_wave_each = WaveGroups::uniform(&plan, 1)?.waves().to_vec();
    let mut ov = Signal::new(op, &stream, shape, options, &one_wave_each, world, rank)?;
    let rows = ov.rows(shape.m);
    let mut sets = Vec::new();
    let mut verified = Vec::new();
    let mut out = poisoned::<bf16>(&stream, rows.len() * n)?;
    for set in 0..2u64 {
        let s = seed ^ (set << 40) ^ ((rank as u64) << 50);
        let a = upload(&stream, &uniform::<bf16>(s, m * k))?;
        let b = upload(&stream, &uniform::<bf16>(s ^ 1, k * n))?;
        let r: Reference = reference(job, shape, options, &a, &b)?;
        ov.run(&stream, job.comm()?, &a, &b, &mut out)?;
        stream.synchronize()?;
        ov.check()?;
        let (want, bound) = (pick_rows(&r.want, &rows, n), pick_rows(&r.bound, &rows, n));
        check_within(
            &format!("eager run, input set {set} (against cuBLAS + NCCL)"),
            &download(&stream, &out)?,
            &want,
            &bound,
            n,
        )?;
        verified.push(stream.clone_dtod(&out)?);
        sets.push((a, b));
    }
    // The captured run reads these and writes `out`.
    let mut a = stream.clone_dtod(&sets[0].0)?;
    let mut b = stream.clone_dtod(&sets[0].1)?;
    stream.synchronize()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = ov.run(&stream, job.comm()?, &a, &b, &mut out);
    // End the capture whatever happened, so the stream is usable for the error path.
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or_else(|| anyhow::anyhow!("the capture produced no graph"))?;
    let mut cmp = WordCompare::load(&stream)?;
    cmp.reset(&stream)?;
    for it in 0..REPLAYS {
        let set = it % 2;
        stream.memcpy_dtod(&sets[set].0, &mut a)?;
        stream.memcpy_dtod(&sets[set].1, &mut b)?;
        super::overlap::poison_bf16(&stream, &mut out)?;
        graph.launch()?;
        cmp.enqueue(&stream, &out, &verified[set])?;
    }
    let diff = cmp.take(&stream)?;
    ov.check()?;
    if let Some(d) = diff {
        anyhow::bail!(
            "{REPLAYS} graph replays: {} words differed from the eager results (first word {})",
            d.words,
            d.first_word
        );
    }
    Ok(())
}

/// A dynamically scheduled GEMM refuses to be captured (a replay would reuse a stale claim base),
/// with an error naming the fix, before anything is captured; the stream stays usable.
fn dynamic_refused(job: &mut Job) -> anyhow::Result<()> {
    let (ctx, stream) = gpu(job)?;
    let shape = GemmShape::new(1024, 1024, 256);
    let options = GemmOptions {
        sm_margin: 100,
        scheduling: Scheduling::Dynamic,
        ..GemmOptions::default()
    };
    let gemm = Gemm::new(&ctx, shape, options)?;
    let a = poisoned::<bf16>(&stream, 1024 * 256)?;
    let b = poisoned::<bf16>(&stream, 1024 * 256)?;
    let mut out = poisoned::<bf16>(&stream, 1024 * 1024)?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let r = gemm.launch(&stream, &a, &b, &mut out);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    match r {
        Ok(()) => anyhow::bail!("a dynamically scheduled GEMM was captured; expected a refusal"),
        Err(e) if format!("{e:#}").contains("Scheduling::Static") => {}
        Err(e) => anyhow::bail!("error {e:#} does not name Scheduling::Static"),
    }
    drop(graph?);
    gemm.launch(&stream, &a, &b, &mut out)?; // outside a capture it runs
    stream.synchronize()?;
    gemm.check().map_err(anyhow::Error::from)
}
