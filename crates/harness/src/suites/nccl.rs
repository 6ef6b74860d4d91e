//! NCCL collectives through weft's communicator, checked element by element against a CPU
//! reference built from every rank's regenerated inputs. Each trial runs three sizes: one
//! element, a small random count and a large random count, with fresh seeds.

use crate::data::{check_equal, shared_seed, small_ints, Elem};
use crate::job::Job;
use crate::trials::{Case, Skip};
use cudarc::driver::{sys, CudaSlice, CudaStream};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_pgl::nccl::{new_unique_id, Communicator, ReduceOp, Waits, TIMEOUT_VAR};
use weft_pgl::{NcclFailure, PglError};
use weft_signal_gemm::timing::time_flushed_aligned_waiting;
use weft_signal_gemm::GemmError;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("nccl::all_reduce::f32_sum", |j| {
            all_reduce::<f32>(j, ReduceOp::Sum)
        }),
        Case::gpu("nccl::all_reduce::bf16_sum", |j| {
            all_reduce::<bf16>(j, ReduceOp::Sum)
        }),
        Case::gpu("nccl::all_reduce::f64_sum", |j| {
            all_reduce::<f64>(j, ReduceOp::Sum)
        }),
        Case::gpu("nccl::all_reduce::i32_sum", |j| {
            all_reduce::<i32>(j, ReduceOp::Sum)
        }),
        Case::gpu("nccl::all_reduce::f32_max", |j| {
            all_reduce::<f32>(j, ReduceOp::Max)
        }),
        Case::gpu("nccl::reduce_scatter::f32_sum", reduce_scatter::<f32>),
        Case::gpu("nccl::reduce_scatter::bf16_sum", reduce_scatter::<bf16>),
        Case::gpu("nccl::all_gather::f32", all_gather::<f32>),
        Case::gpu("nccl::all_gather::bf16", all_gather::<bf16>),
        Case::gpu("nccl::all_to_all::f32", all_to_all::<f32>),
        Case::gpu("nccl::send_recv::ring_f32", send_recv_ring::<f32>),
        Case::gpu("nccl::bounded::init_without_peers", |j| {
            init_without_peers(j, true)
        }),
        Case::gpu("nccl::bounded::blocking_init_without_peers", |j| {
            init_without_peers(j, false)
        }),
        Case::gpu(
            "nccl::bounded::collective_a_peer_never_joins",
            collective_a_peer_never_joins,
        ),
        Case::gpu(
            "nccl::bounded::timing_a_peer_never_joins",
            timing_a_peer_never_joins,
        ),
        Case::gpu(
            "nccl::bounded::nonblocking_all_reduce",
            nonblocking_all_reduce,
        ),
    ]
}

/// The budget the bounded trials give NCCL, and how far past it their error may come.
pub(super) const TRIAL_BUDGET: Duration = Duration::from_secs(3);
pub(super) const TRIAL_SLACK: Duration = Duration::from_secs(20);

/// Checks that `r` is the bounded-wait error, within budget + slack of `t0`.
/// The error must be weft-pgl's typed NCCL timeout (`PglError::Nccl` with
/// `NcclFailure::TimedOut`, through any context, or inside an op's `GemmError::Pgl`), naming the
/// budget's variable and the abort.
pub(super) fn expect_bounded<T, E: Into<anyhow::Error>>(
    what: &str,
    t0: Instant,
    r: Result<T, E>,
) -> anyhow::Result<()> {
    let took = t0.elapsed();
    let e = match r {
        Ok(_) => anyhow::bail!("{what} succeeded, but a peer never took part"),
        Err(e) => e.into(),
    };
    // weft-pgl's error itself (a communicator's call), or inside weft-signal-gemm's (an op's).
    let timed_out = |p: &PglError| {
        matches!(
            p,
            PglError::Nccl {
                failure: NcclFailure::TimedOut { .. },
                ..
            }
        )
    };
    let typed = e.downcast_ref::<PglError>().is_some_and(timed_out)
        || matches!(e.downcast_ref::<GemmError>(), Some(GemmError::Pgl(p)) if timed_out(p));
    let e = format!("{e:#}");
    anyhow::ensure!(
        typed,
        "{what}: expected weft-pgl's typed NCCL timeout (PglError::Nccl, TimedOut), got: {e}"
    );
    anyhow::ensure!(
        e.contains("did not complete within") && e.contains(TIMEOUT_VAR) && e.contains("aborted"),
        "{what}: expected the bounded-wait error naming {TIMEOUT_VAR}, got: {e}"
    );
    anyhow::ensure!(
        took >= TRIAL_BUDGET && took <= TRIAL_BUDGET + TRIAL_SLACK,
        "{what}: the error came after {took:?}, expected the budget {TRIAL_BUDGET:?} (+ {TRIAL_SLACK:?} at most)"
    );
    Ok(())
}

/// Polls `stream` until its work has ended, at most `limit`.
pub(super) fn stream_idle_within(stream: &CudaStream, limit: Duration) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        // SAFETY: a valid stream of the current context.
        match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => return Ok(()),
            sys::CUresult::CUDA_ERROR_NOT_READY if t0.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(1))
            }
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                anyhow::bail!("the stream was still busy {limit:?} after the abort (NCCL's kernel did not stop)")
            }
            e => anyhow::bail!("the stream reported {e:?} after the abort"),
        }
    }
}

/// Every rank makes a communicator of world 2 from an id no other process has: the init can
/// never complete, and must fail after the budget (an init that blocked would wait forever),
/// for a non-blocking communicator and for a blocking one (whose init is non-blocking too).
fn init_without_peers(job: &mut Job, nonblocking: bool) -> anyhow::Result<()> {
    let gpu = job.gpu().map_err(|r| anyhow::anyhow!("no GPU: {r}"))?;
    let id = new_unique_id()?;
    let t0 = Instant::now();
    let waits = Waits {
        budget: TRIAL_BUDGET,
        nonblocking,
    };
    let r = Communicator::from_unique_id(&id, 0, 2, &gpu.ctx, None, waits);
    expect_bounded("a communicator of 2 ranks that only this rank joins", t0, r)
}

/// A communicator of the job's ranks besides the job's own (trials that abort it), with `waits`.
fn second_communicator(job: &mut Job, waits: Waits) -> anyhow::Result<Communicator> {
    job.comm()?; // ignored with the reason when ranks share a GPU (NCCL refuses them)
    let ctx = job
        .gpu()
        .map_err(|r| anyhow::anyhow!("no GPU: {r}"))?
        .ctx
        .clone();
    let made = Communicator::with_waits(&mut job.rdzv, &ctx, None, waits);
    weft_pgl::agree(
        &mut job.rdzv,
        "a second communicator",
        made.map_err(anyhow::Error::from),
    )
}

/// On a blocking communicator of its own, after one all-reduce every rank joins, rank 0 starts
/// another the others never call: its bounded synchronize must fail after the budget, abort the
/// communicator and leave the stream usable (a plain synchronize would wait forever); every rank
/// then aborts its own communicator (a peer's teardown after an abort could block).
fn collective_a_peer_never_joins(job: &mut Job) -> anyhow::Result<()> {
    rank_0_alone(
        job,
        "the all-reduce only rank 0 calls",
        |comm, stream, buf| {
            comm.all_reduce_in_place(buf, ReduceOp::Sum, stream)?;
            Ok(comm.synchronize(stream, "an all-reduce only rank 0 calls")?)
        },
    )
}

/// As collective_a_peer_never_joins, with rank 0's all-reduces timed as `Auto`'s first use times
/// its candidates (`time_flushed_aligned_waiting`, waiting through the communicator): the timing
/// must end with the bounded error, where a plain stream synchronize in it would wait forever.
fn timing_a_peer_never_joins(job: &mut Job) -> anyhow::Result<()> {
    rank_0_alone(
        job,
        "timed all-reduces only rank 0 calls",
        |comm, stream, buf| {
            let mut flush = stream.alloc_zeros::<u8>(1 << 20)?;
            let mut tiny = stream.alloc_zeros::<f32>(1)?;
            time_flushed_aligned_waiting(
                stream,
                1,
                3,
                &mut flush,
                // Lined up by a one-element all-reduce on the same communicator, as `Auto`'s
                // timing does: after the bounded wait aborted it, the line-ups fail at once and
                // the wait's error must still be the one returned.
                || Ok(comm.all_reduce_in_place(&mut tiny, ReduceOp::Sum, stream)?),
                || Ok(comm.all_reduce_in_place(&mut *buf, ReduceOp::Sum, stream)?),
                || Ok(comm.synchronize(stream, "timed all-reduces only rank 0 calls")?),
            )
            .map(drop)
        },
    )
}

/// After one all-reduce every rank joins on a blocking communicator of its own, rank 0 alone
/// makes `call` (collectives the others never join), which must fail with the bounded error,
/// abort the communicator and leave the stream usable.
fn rank_0_alone(
    job: &mut Job,
    what: &str,
    call: impl FnOnce(&Communicator, &Arc<CudaStream>, &mut CudaSlice<f32>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if job.world() < 2 {
        return Err(Skip("needs two ranks (a peer that never calls)".into()).into());
    }
    let waits = Waits {
        budget: TRIAL_BUDGET,
        nonblocking: false,
    };
    let comm = second_communicator(job, waits)?;
    let rank = job.rank();
    let ctx = comm.context().clone();
    // Every rank reaches each `agree` below whatever fails before it.
    let joined = (|| -> anyhow::Result<_> {
        let stream = ctx.new_stream()?;
        let mut buf = stream.alloc_zeros::<f32>(1 << 20)?;
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream)?;
        comm.synchronize(&stream, "an all-reduce every rank calls")?;
        Ok((stream, buf))
    })();
    let (stream, mut buf) =
        match weft_pgl::agree(&mut job.rdzv, "an all-reduce every rank calls", joined) {
            Ok(x) => x,
            Err(e) => {
                comm.abort();
                return Err(e);
            }
        };
    let outcome = (|| -> anyhow::Result<()> {
        if rank != 0 {
            return Ok(());
        }
        let t0 = Instant::now();
        let r = call(&comm, &stream, &mut buf);
        // The error names the peer it waits for: rank 1 made one call (the joint all-reduce),
        // this rank more (NCCL's progress board). Unless rank 1 runs on another host (or the
        // board could not be made), where the error says so instead.
        let named = match &r {
            Err(e) => {
                let text = format!("{e:#}");
                let behind = text.contains("rank 1 (pid ")
                    && text.contains(" has made 1 calls on this communicator");
                let elsewhere = text.contains("not seen on this host's board")
                    || text.contains("no progress board");
                if behind || elsewhere {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!(
                        "{what}: the bounded error does not name rank 1 as behind: {text}"
                    ))
                }
            }
            Ok(()) => Ok(()), // expect_bounded reports it
        };
        let checked = named
            .and_then(|()| expect_bounded(what, t0, r))
            .and_then(|()| {
                anyhow::ensure!(comm.is_aborted(), "the communicator was not aborted");
                let again = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &stream);
                anyhow::ensure!(
                    again.is_err_and(|e| e.to_string().contains("aborted")),
                    "a call on the aborted communicator did not fail naming the abort"
                );
                Ok(())
            });
        // The aborted kernel must end, leaving the stream (and the context) usable.
        stream_idle_within(&stream, TRIAL_SLACK)?;
        checked
    })();
    // The others abort only once rank 0 is done, so their teardown cannot reach it as an error.
    let agreed = weft_pgl::agree(&mut job.rdzv, &format!("rank 0's {what}"), outcome);
    comm.abort();
    drop(comm);
    agreed
}

/// A non-blocking communicator (init, calls and teardown polled within the budget) sums small
/// integers exactly like the blocking one.
fn nonblocking_all_reduce(job: &mut Job) -> anyhow::Result<()> {
    let waits = Waits {
        budget: Duration::from_secs(60),
        nonblocking: true,
    };
    let seed = shared_seed(job)?;
    let comm = second_communicator(job, waits)?;
    let (rank, world) = (job.rank(), job.world());
    let run = (|| -> anyhow::Result<()> {
        let stream = comm.context().new_stream()?;
        for n in [1usize, 1000, 300_000] {
            let inputs: Vec<Vec<i32>> = (0..world).map(|r| small_ints(seed, r, n)).collect();
            let want: Vec<f32> = (0..n)
                .map(|i| inputs.iter().map(|v| v[i]).sum::<i32>() as f32)
                .collect();
            let send = stream.clone_htod(&to_elems::<f32>(&inputs[rank]))?;
            let mut recv = stream.clone_htod(&vec![f32::NAN; n])?;
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum, &stream)?;
            comm.synchronize(&stream, "a non-blocking all-reduce")?;
            check_equal(
                &format!("non-blocking all_reduce f32 n={n} seed={seed}"),
                &stream.clone_dtoh(&recv)?,
                &want,
            )?;
        }
        Ok(())
    })();
    if run.is_err() {
        comm.abort();
    }
    drop(comm);
    weft_pgl::agree(&mut job.rdzv, "a non-blocking all-reduce", run)
}

/// Element counts per trial: 1, a small and a large random count (per rank block).
fn counts(seed: u64) -> [usize; 3] {
    let mut rng = StdRng::seed_from_u64(seed);
    [
        1,
        rng.random_range(2..1000),
        rng.random_range(100_000..2_000_000),
    ]
}

fn to_elems<T: Elem>(v: &[i32]) -> Vec<T> {
    v.iter().map(|&x| T::from_small_int(x)).collect()
}

fn all_reduce<T: Elem>(job: &mut Job, op: ReduceOp) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (comm, gpu) = job.comm_and_gpu()?;
    for (k, n) in counts(seed).into_iter().enumerate() {
        let s = seed.wrapping_add(k as u64);
        let inputs: Vec<Vec<i32>> = (0..world).map(|r| small_ints(s, r, n)).collect();
        let want: Vec<T> = (0..n)
            .map(|i| {
                let col = inputs.iter().map(|v| v[i]);
                T::from_small_int(match op {
                    ReduceOp::Sum => col.sum(),
                    ReduceOp::Max => col.max().unwrap(),
                    ReduceOp::Min => col.min().unwrap(),
                    ReduceOp::Avg => unreachable!("not exercised: inexact"),
                })
            })
            .collect();
        let send = gpu.stream.clone_htod(&to_elems::<T>(&inputs[rank]))?;
        let mut recv = gpu.stream.clone_htod(&vec![T::poison(); n])?;
        comm.all_reduce(&send, &mut recv, op, &gpu.stream)?;
        let got = gpu.stream.clone_dtoh(&recv)?;
        check_equal(
            &format!("all_reduce {} {op:?} n={n} seed={s}", T::NAME),
            &got,
            &want,
        )?;
    }
    Ok(())
}

fn reduce_scatter<T: Elem>(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (comm, gpu) = job.comm_and_gpu()?;
    for (k, n) in counts(seed).into_iter().enumerate() {
        let s = seed.wrapping_add(k as u64);
        let inputs: Vec<Vec<i32>> = (0..world).map(|r| small_ints(s, r, n * world)).collect();
        let want: Vec<T> = (0..n)
            .map(|i| T::from_small_int(inputs.iter().map(|v| v[rank * n + i]).sum()))
            .collect();
        let send = gpu.stream.clone_htod(&to_elems::<T>(&inputs[rank]))?;
        let mut recv = gpu.stream.clone_htod(&vec![T::poison(); n])?;
        comm.reduce_scatter(&send, &mut recv, ReduceOp::Sum, &gpu.stream)?;
        let got = gpu.stream.clone_dtoh(&recv)?;
        check_equal(
            &format!("reduce_scatter {} n={n} seed={s}", T::NAME),
            &got,
            &want,
        )?;
    }
    Ok(())
}

fn all_gather<T: Elem>(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (comm, gpu) = job.comm_and_gpu()?;
    for (k, n) in counts(seed).into_iter().enumerate() {
        let s = seed.wrapping_add(k as u64);
        let want: Vec<T> = (0..world)
            .flat_map(|r| to_elems::<T>(&small_ints(s, r, n)))
            .collect();
        let send = gpu
            .stream
            .clone_htod(&to_elems::<T>(&small_ints(s, rank, n)))?;
        let mut recv = gpu.stream.clone_htod(&vec![T::poison(); n * world])?;
        comm.all_gather(&send, &mut recv, &gpu.stream)?;
        let got = gpu.stream.clone_dtoh(&recv)?;
        check_equal(
            &format!("all_gather {} n={n} seed={s}", T::NAME),
            &got,
            &want,
        )?;
    }
    Ok(())
}

/// Block p of rank r's input goes to rank p: rank r receives block r of every rank's input.
fn all_to_all<T: Elem>(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (comm, gpu) = job.comm_and_gpu()?;
    for (k, n) in counts(seed).into_iter().enumerate() {
        let s = seed.wrapping_add(k as u64);
        let want: Vec<T> = (0..world)
            .flat_map(|p| to_elems::<T>(&small_ints(s, p, n * world)[rank * n..(rank + 1) * n]))
            .collect();
        let send = gpu
            .stream
            .clone_htod(&to_elems::<T>(&small_ints(s, rank, n * world)))?;
        let mut recv = gpu.stream.clone_htod(&vec![T::poison(); n * world])?;
        comm.all_to_all(&send, &mut recv, &gpu.stream)?;
        let got = gpu.stream.clone_dtoh(&recv)?;
        check_equal(
            &format!("all_to_all {} n={n} seed={s}", T::NAME),
            &got,
            &want,
        )?;
    }
    Ok(())
}

/// Each rank sends to rank+1 and receives from rank−1 (mod world).
fn send_recv_ring<T: Elem>(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let (rank, world) = (job.rank(), job.world());
    let (comm, gpu) = job.comm_and_gpu()?;
    let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
    for (k, n) in counts(seed).into_iter().enumerate() {
        let s = seed.wrapping_add(k as u64);
        let want: Vec<T> = to_elems(&small_ints(s, from, n));
        let send = gpu
            .stream
            .clone_htod(&to_elems::<T>(&small_ints(s, rank, n)))?;
        let mut recv = gpu.stream.clone_htod(&vec![T::poison(); n])?;
        comm.send_recv(&send, to, &mut recv, from, &gpu.stream)?;
        let got = gpu.stream.clone_dtoh(&recv)?;
        check_equal(
            &format!("send_recv {} n={n} from rank {from} seed={s}", T::NAME),
            &got,
            &want,
        )?;
    }
    Ok(())
}
