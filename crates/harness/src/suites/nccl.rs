//! NCCL collectives through weft's communicator, checked element by element against a CPU
//! reference built from every rank's regenerated inputs. Each trial runs three sizes: one
//! element, a small random count and a large random count, with fresh seeds.

use crate::data::{check_equal, shared_seed, small_ints, Elem};
use crate::job::Job;
use crate::trials::Case;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weft_pgl::nccl::ReduceOp;

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
    ]
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
