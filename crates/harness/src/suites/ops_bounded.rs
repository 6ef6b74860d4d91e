//! The overlapped ops' NCCL methods are bounded: each op (seq-cublas, on a communicator with a
//! short budget) runs once with every rank, then rank 0 alone launches it again; its
//! `synchronize` must fail after the budget naming the budget's variable and the abort, and leave
//! its stream usable, where a plain stream synchronize would wait forever for the absent peer.
//! Needs NCCL: one rank per GPU.

use super::gpu;
use super::nccl::{expect_bounded, stream_idle_within, TRIAL_BUDGET, TRIAL_SLACK};
use crate::gemm_data::{uniform, upload};
use crate::job::Job;
use crate::trials::{Case, Skip};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use std::sync::Arc;
use std::time::Instant;
use weft_pgl::nccl::{Communicator, Waits};
use weft_signal_gemm::ops::{
    AllGatherGemm, ChoiceCache, GemmAllReduce, GemmAllToAll, GemmReduceScatter, Method,
    MethodChoice, OpKind, OverlapEnv,
};
use weft_signal_gemm::{GemmOptions, GemmShape};

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("ops::bounded::all_reduce_seq_a_peer_never_launches", |j| {
            peer_never_launches(j, OpKind::AllReduce)
        }),
        Case::gpu(
            "ops::bounded::reduce_scatter_seq_a_peer_never_launches",
            |j| peer_never_launches(j, OpKind::ReduceScatter),
        ),
        Case::gpu("ops::bounded::all_gather_seq_a_peer_never_launches", |j| {
            peer_never_launches(j, OpKind::AllGather)
        }),
        Case::gpu("ops::bounded::all_to_all_seq_a_peer_never_launches", |j| {
            peer_never_launches(j, OpKind::AllToAll)
        }),
    ]
}

fn peer_never_launches(job: &mut Job, kind: OpKind) -> anyhow::Result<()> {
    if job.world() < 2 {
        return Err(Skip("needs two ranks (a peer that never launches)".into()).into());
    }
    if let Some(why) = job.shared_gpu() {
        return Err(Skip(why.to_string()).into());
    }
    let (ctx, stream) = gpu(job)?;
    let waits = Waits {
        budget: TRIAL_BUDGET,
        nonblocking: false,
    };
    let made = Communicator::with_waits(&mut job.rdzv, &ctx, None, waits);
    let comm = weft_pgl::agree(
        &mut job.rdzv,
        "a communicator with a short budget",
        made.map_err(anyhow::Error::from),
    )?;
    let mut env =
        OverlapEnv::with_communicator(&mut job.rdzv, &ctx, comm, ChoiceCache::in_memory())?;
    let (rank, world) = (job.rank(), job.world() as u32);
    let shape = GemmShape::new(128 * world, 256, 128);
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    let seq = MethodChoice::Exact(Method::SeqCublas);
    let base = GemmOptions::default();
    let seed = 0x0b0d ^ rank as u64;
    let a = upload(&stream, &uniform::<bf16>(seed, m * k))?;
    let b = upload(&stream, &uniform::<bf16>(seed ^ 1, k * n))?;
    let rdzv = &mut job.rdzv;
    // Every op and its inputs, planned collectively (every rank alike).
    let mut op = match kind {
        OpKind::AllReduce => {
            let op =
                GemmAllReduce::<bf16>::plan(rdzv, &mut env, &stream, shape, base, &seq, false)?;
            Ops::AllReduce(op, a, b)
        }
        OpKind::ReduceScatter => {
            let op =
                GemmReduceScatter::<bf16>::plan(rdzv, &mut env, &stream, shape, base, &seq, false)?;
            Ops::ReduceScatter(op, a, b)
        }
        OpKind::AllGather => {
            let op =
                AllGatherGemm::<bf16>::plan(rdzv, &mut env, &stream, shape, base, &seq, false)?;
            let shard = upload(&stream, &uniform::<bf16>(seed ^ 2, m / world as usize * k))?;
            let d = stream.alloc_zeros::<bf16>(m * n)?;
            Ops::AllGather(op, shard, b, d)
        }
        OpKind::AllToAll => {
            // Row i of every rank to rank i % world: every pair exchanges rows.
            let routes: Vec<Vec<u32>> = (0..world)
                .map(|_| (0..shape.m).map(|i| i % world).collect())
                .collect();
            let op = GemmAllToAll::<bf16>::plan(
                rdzv, &mut env, &stream, shape, base, &routes, &seq, false,
            )?;
            Ops::AllToAll(op, a, b)
        }
    };
    // Every rank reaches each `agree` below whatever fails before it.
    let joined = op.launch_and_sync(&stream);
    if let Err(e) = weft_pgl::agree(&mut job.rdzv, "an op every rank launches", joined) {
        abort(&env);
        return Err(e);
    }
    let outcome = (|| -> anyhow::Result<()> {
        if rank != 0 {
            return Ok(());
        }
        let t0 = Instant::now();
        let r = op.launch_and_sync(&stream);
        // From the op's synchronize (its NCCL wait names the op and method), not from a launch.
        if let Err(e) = &r {
            let text = format!("{e:#}");
            anyhow::ensure!(
                text.contains(kind.title()) && text.contains("(seq-cublas)"),
                "{}: the bounded error does not come from the op's synchronize: {text}",
                kind.title()
            );
        }
        expect_bounded(&format!("{} launched by rank 0 alone", kind.title()), t0, r)?;
        // The aborted communicator's kernel must end, leaving the stream usable.
        stream_idle_within(&stream, TRIAL_SLACK)
    })();
    // The others abort only once rank 0 is done, so their teardown cannot reach it as an error.
    let agreed = weft_pgl::agree(&mut job.rdzv, "rank 0's bounded op", outcome);
    abort(&env);
    drop(op);
    agreed
}

fn abort(env: &OverlapEnv) {
    if let Ok(c) = env.comm().lock() {
        c.abort();
    }
}

enum Ops {
    AllReduce(GemmAllReduce<bf16>, CudaSlice<bf16>, CudaSlice<bf16>),
    ReduceScatter(GemmReduceScatter<bf16>, CudaSlice<bf16>, CudaSlice<bf16>),
    AllGather(
        AllGatherGemm<bf16>,
        CudaSlice<bf16>,
        CudaSlice<bf16>,
        CudaSlice<bf16>,
    ),
    AllToAll(GemmAllToAll<bf16>, CudaSlice<bf16>, CudaSlice<bf16>),
}

impl Ops {
    /// One launch on `stream` (the op's), then the op's synchronize.
    fn launch_and_sync(&mut self, stream: &Arc<CudaStream>) -> anyhow::Result<()> {
        match self {
            Ops::AllReduce(op, a, b) => {
                op.launch(stream, a, b)?;
                op.synchronize().map_err(anyhow::Error::from)
            }
            Ops::ReduceScatter(op, a, b) => {
                op.launch(stream, a, b)?;
                op.synchronize().map_err(anyhow::Error::from)
            }
            Ops::AllGather(op, shard, b, d) => {
                op.copy_shard(stream, shard)?;
                op.launch(stream, b, d)?;
                op.synchronize().map_err(anyhow::Error::from)
            }
            Ops::AllToAll(op, a, b) => {
                op.launch(stream, a, b)?;
                op.synchronize().map_err(anyhow::Error::from)
            }
        }
    }
}
