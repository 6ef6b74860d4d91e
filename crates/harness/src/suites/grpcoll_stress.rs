//! Back-to-back group collectives that would expose a stale or early read: two input sets A and B
//! (and, accumulating, a prior output) are first run once each and checked against the float64
//! CPU reference; then 10^4 native launches alternate A and B with no host synchronisation,
//! each preceded by a stream-ordered copy of its input and by a reset of the output (poison, or
//! the prior when accumulating), and each output is compared bit for bit on the GPU with the
//! verified output of the same input. An early read of an input still being rewritten, a write
//! that lands after the next reset, or a converted staging row read before it is complete would
//! show as a difference.

use super::grpcoll::{cast_blocks, gpu_stream, reduce_blocks, values, Cfg};
use super::grpcoll_reference::{
    cast_reference, check, reduce_reference, round_to, GElem, Op, ReduceInputs,
};
use crate::data::shared_seed;
use crate::job::Job;
use crate::trials::Case;
use crate::word_compare::WordCompare;
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use half::bf16;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::sync::Arc;
use weft_grpcoll::pattern::{cast_metas, reduce_metas};
use weft_grpcoll::{GroupCast, GroupCollective, GroupReduce, Options, ReduceOp};
use weft_pgl::DType;

const ITERATIONS: usize = 10_000;
const ROW_ELEMS: usize = 136;
const SMS: u32 = 16;
/// Value streams of the two input sets and of the prior output.
const SETS: [u64; 2] = [11, 12];
const PRIOR: u64 = 13;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("grpcoll::stress::cast::bf16", |j| {
            stress::<bf16>(
                j,
                None,
                Cfg {
                    comm: None,
                    accumulate: false,
                    tensors: 1,
                },
            )
        }),
        Case::gpu("grpcoll::stress::cast::f32_via_bf16", |j| {
            stress::<f32>(
                j,
                None,
                Cfg {
                    comm: Some(DType::Bf16),
                    accumulate: false,
                    tensors: 1,
                },
            )
        }),
        Case::gpu("grpcoll::stress::reduce::sum::bf16", |j| {
            stress::<bf16>(
                j,
                Some(Op::Sum),
                Cfg {
                    comm: None,
                    accumulate: false,
                    tensors: 1,
                },
            )
        }),
        Case::gpu(
            "grpcoll::stress::reduce::avg::accumulate::f32_via_f16",
            |j| {
                stress::<f32>(
                    j,
                    Some(Op::Avg),
                    Cfg {
                        comm: Some(DType::F16),
                        accumulate: true,
                        tensors: 1,
                    },
                )
            },
        ),
    ]
}

/// A stream-ordered device-to-device copy.
fn copy(stream: &Arc<CudaStream>, dst: u64, src: u64, bytes: usize) -> anyhow::Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: both ranges lie in live allocations of at least `bytes` bytes owned by the trial.
    let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.cu_stream()) };
    anyhow::ensure!(
        r == sys::CUresult::CUDA_SUCCESS,
        "device copy failed: {r:?}"
    );
    Ok(())
}

fn ptr<T: cudarc::driver::DeviceRepr>(s: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    s.device_ptr(stream).0
}

/// `op` None: GroupCast; else GroupReduce with that op (sum or avg).
fn stress<T: GElem>(job: &mut Job, op: Option<Op>, cfg: Cfg) -> anyhow::Result<()> {
    match op {
        None => {
            let seed = shared_seed(job)?;
            let (rank, world) = (job.rank(), job.world());
            let comm = cfg.comm.unwrap_or(T::DTYPE);
            let blocks = cast_blocks(&mut StdRng::seed_from_u64(seed), world, 1, true);
            let metas = cast_metas(world, &blocks);
            let mut ins = Vec::new();
            let mut wants = Vec::new();
            for set in SETS {
                let all: Vec<Vec<f64>> = (0..world)
                    .map(|r| {
                        values::<T>(seed, set, 0, 0, r, metas[r].input_rows * ROW_ELEMS)
                            .into_iter()
                            .map(|x| x.to_f64())
                            .collect()
                    })
                    .collect();
                wants.push(
                    cast_reference(&blocks, world, &all, ROW_ELEMS, rank)
                        .into_iter()
                        .map(|v| round_to(comm, v))
                        .collect::<Vec<_>>(),
                );
                ins.push(values::<T>(
                    seed,
                    set,
                    0,
                    0,
                    rank,
                    metas[rank].input_rows * ROW_ELEMS,
                ));
            }
            let opts = Options {
                sms: Some(SMS),
                comm_dtype: cfg.comm,
                accumulate: false,
            };
            let stream = gpu_stream(job)?;
            let plan = GroupCast::<T>::new(&mut job.rdzv, &stream, &metas[rank], ROW_ELEMS, opts)?;
            let out_rows = metas[rank].output_rows;
            run_loop(
                job,
                plan,
                seed,
                "cast".into(),
                cfg,
                Expected {
                    inputs: ins,
                    wants,
                    scales: None,
                    out_rows,
                },
            )
        }
        Some(op) => {
            let seed = shared_seed(job)?;
            let (rank, world) = (job.rank(), job.world());
            let comm = cfg.comm.unwrap_or(T::DTYPE);
            let blocks = reduce_blocks(&mut StdRng::seed_from_u64(seed), world, 1, true);
            let metas = reduce_metas(world, &blocks);
            let out_rows = metas[rank].output_rows;
            let prior: Vec<f64> = values::<T>(seed, PRIOR, 0, 0, rank, out_rows * ROW_ELEMS)
                .into_iter()
                .map(|x| x.to_f64())
                .collect();
            let (mut ins, mut wants, mut scales) = (Vec::new(), Vec::new(), Vec::new());
            for set in SETS {
                let all: Vec<Vec<f64>> = (0..world)
                    .map(|r| {
                        values::<T>(seed, set, 0, 0, r, metas[r].input_rows * ROW_ELEMS)
                            .into_iter()
                            .map(|x| round_to(comm, x.to_f64()))
                            .collect()
                    })
                    .collect();
                let x = ReduceInputs {
                    ins: &all,
                    lses: &[],
                    prior: cfg.accumulate.then_some((prior.as_slice(), &[][..])),
                    row_elems: ROW_ELEMS,
                    lse_per_row: 0,
                };
                let (w, _, s) = reduce_reference(&blocks, world, &x, op, rank);
                wants.push(w);
                scales.push(s);
                ins.push(values::<T>(
                    seed,
                    set,
                    0,
                    0,
                    rank,
                    metas[rank].input_rows * ROW_ELEMS,
                ));
            }
            let rop = if op == Op::Sum {
                ReduceOp::Sum
            } else {
                ReduceOp::Avg
            };
            let opts = Options {
                sms: Some(SMS),
                comm_dtype: cfg.comm,
                accumulate: cfg.accumulate,
            };
            let stream = gpu_stream(job)?;
            let plan =
                GroupReduce::<T>::new(&mut job.rdzv, &stream, &metas[rank], ROW_ELEMS, rop, opts)?;
            run_loop(
                job,
                plan,
                seed,
                format!("reduce {op:?}"),
                cfg,
                Expected {
                    inputs: ins,
                    wants,
                    scales: Some(scales),
                    out_rows,
                },
            )
        }
    }
}

/// This rank's two input sets, the expected output of each (with the reduce tolerance's scales)
/// and its output rows.
struct Expected<T> {
    inputs: Vec<Vec<T>>,
    wants: Vec<Vec<f64>>,
    scales: Option<Vec<Vec<f64>>>,
    out_rows: usize,
}

/// The verified runs, then the back-to-back loop; frees the plan.
fn run_loop<T: GElem, P: GroupCollective<T>>(
    job: &mut Job,
    mut plan: P,
    seed: u64,
    what_op: String,
    cfg: Cfg,
    e: Expected<T>,
) -> anyhow::Result<()> {
    let rank = job.rank();
    let stream = gpu_stream(job)?;
    let comm = cfg.comm.unwrap_or(T::DTYPE);
    let Expected {
        inputs,
        wants,
        scales,
        out_rows,
    } = e;
    let out_len = plan.output().len();
    let elem = std::mem::size_of::<T>();
    let (input, output) = (plan.input().local_ptr(), plan.output().local_ptr());
    let what = |s: usize| {
        format!(
            "{} {what_op} via {} stress, input set {s}, seed {seed}, rank {rank}",
            T::DTYPE.name(),
            comm.name()
        )
    };
    // Device copies of both input sets, of the output's reset value (the prior rows when
    // accumulating, poison past them), and of the verified output of each set.
    let buffers = (|| -> anyhow::Result<_> {
        let mut reset: Vec<T> = if cfg.accumulate {
            values::<T>(seed, PRIOR, 0, 0, rank, out_rows * ROW_ELEMS)
        } else {
            Vec::new()
        };
        reset.resize(out_len, T::poison());
        let reset = stream.clone_htod(&reset)?;
        let sets: Vec<CudaSlice<T>> = inputs
            .iter()
            .map(|v| stream.clone_htod(v))
            .collect::<Result<_, _>>()?;
        let verified: Vec<CudaSlice<T>> = (0..2)
            .map(|_| stream.clone_htod(&vec![T::poison(); out_len]))
            .collect::<Result<_, _>>()?;
        anyhow::ensure!(
            (out_len * elem).is_multiple_of(4),
            "stress output of {} bytes is not whole 32-bit words",
            out_len * elem
        );
        Ok((reset, sets, verified))
    })();
    let enqueue = |plan: &mut P,
                   (reset, sets, _): &(CudaSlice<T>, Vec<CudaSlice<T>>, Vec<CudaSlice<T>>),
                   s: usize|
     -> anyhow::Result<()> {
        copy(
            &stream,
            input,
            ptr(&sets[s], &stream),
            inputs[s].len() * elem,
        )?;
        copy(&stream, output, ptr(reset, &stream), out_len * elem)?;
        Ok(plan.run()?)
    };
    // Each input set once, checked against the reference and kept as the verified output; every
    // rank must agree before the loop (a rank that stopped here would leave the others waiting).
    let verified = buffers.and_then(|bufs| {
        for s in 0..2 {
            enqueue(&mut plan, &bufs, s)?;
            plan.synchronize()?;
            let got = super::grpcoll::read(plan.output())?;
            check(
                &what(s),
                &got,
                &wants[s],
                scales.as_ref().map(|v| v[s].as_slice()),
            )?;
            copy(&stream, ptr(&bufs.2[s], &stream), output, out_len * elem)?;
        }
        Ok(bufs)
    });
    let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll stress trial (verified runs)", verified).and_then(|bufs| {
        // Back to back: every output equal to the verified one of its input set.
        let mut cmp = WordCompare::load(&stream)?;
        cmp.reset(&stream)?;
        for i in 0..ITERATIONS {
            enqueue(&mut plan, &bufs, i % 2)?;
            cmp.enqueue_raw(&stream, output, ptr(&bufs.2[i % 2], &stream), out_len * elem)?;
        }
        plan.synchronize()?;
        if let Some(d) = cmp.take(&stream)? {
            anyhow::bail!(
                "{}: over {ITERATIONS} back-to-back runs, {} words differed from the verified outputs (first at word {})",
                what(0),
                d.words,
                d.first_word
            );
        }
        Ok(())
    });
    let checked = weft_pgl::agree(&mut job.rdzv, "grpcoll stress trial", checked);
    plan.free(&mut job.rdzv)?;
    checked
}
