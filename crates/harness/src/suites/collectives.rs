//! weft-collectives: AllReduce (one-shot, two-shot, in place), ReduceScatter and AllGather in f32,
//! bf16 and f16, checked element by element against a CPU reference built from every rank's
//! regenerated inputs (small integers: every sum is exact, so results compare bit for bit).
//! One `Collectives` per trial runs a sequence of counts (1, 7, random small and large) twice
//! with fresh inputs, so staging slots and round numbers are reused across calls of different
//! grids; further setups make every large call many rounds (64 KiB slots, 3 blocks), keep to the
//! simple protocol, send everything up to 8 MiB per sender by the LL protocol, or everything of
//! whole 16-byte vectors up to 16 MiB by the sentinel protocol. The sentinel protocol's one change
//! of bits (an all-ones element arrives as 0x7f..f) is checked on its own.

use crate::data::{check_equal, shared_seed, small_ints, Elem};
use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::{sys, CudaStream};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_collectives::{
    Algorithm, AllReduceChoice, CollectiveElement, CollectiveError, Collectives, Options, Protocol,
};

#[derive(Clone, Copy, Debug)]
enum Op {
    AllReduce(AllReduceChoice),
    AllReduceInPlace(AllReduceChoice),
    ReduceScatter,
    AllGather,
}

macro_rules! typed {
    ($name:expr, $op:expr) => {
        vec![
            Case::gpu(format!("collectives::{}::f32", $name), |j| {
                trial::<f32>(j, $op)
            }),
            Case::gpu(format!("collectives::{}::bf16", $name), |j| {
                trial::<bf16>(j, $op)
            }),
            Case::gpu(format!("collectives::{}::f16", $name), |j| {
                trial::<f16>(j, $op)
            }),
        ]
    };
}

pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(typed!(
        "all_reduce::one_shot",
        Op::AllReduce(AllReduceChoice::OneShot)
    ));
    v.extend(typed!(
        "all_reduce::two_shot",
        Op::AllReduce(AllReduceChoice::TwoShot)
    ));
    v.extend(typed!(
        "all_reduce::in_place",
        Op::AllReduceInPlace(AllReduceChoice::Auto)
    ));
    v.extend(typed!(
        "all_reduce::in_place_two_shot",
        Op::AllReduceInPlace(AllReduceChoice::TwoShot)
    ));
    v.extend(typed!("reduce_scatter", Op::ReduceScatter));
    v.extend(typed!("all_gather", Op::AllGather));
    v.push(Case::gpu("collectives::sentinel_bits::f32", |j| {
        sentinel_bits::<f32>(j)
    }));
    v.push(Case::gpu("collectives::sentinel_bits::bf16", |j| {
        sentinel_bits::<bf16>(j)
    }));
    v.push(Case::gpu("collectives::sentinel_bits::f16", |j| {
        sentinel_bits::<f16>(j)
    }));
    v.push(Case::gpu("collectives::graph_replay::f32", graph_replay));
    v.push(Case::gpu(
        "collectives::sentinel_back_to_back::f32",
        sentinel_back_to_back,
    ));
    v.push(Case::gpu(
        "collectives::errors::lengths_alignment_options",
        errors,
    ));
    v
}

/// Per-rank counts (AllReduce: the buffer; ReduceScatter: the output; AllGather: the input).
fn counts(seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    vec![
        1,
        7,
        rng.random_range(8..5000),
        rng.random_range(100_000..1_500_000),
        4096,
        1 << 18, // whole 16-byte vectors, 0.5–1 MiB: the sentinel protocol by default
    ]
}

fn trial<T: Elem + CollectiveElement>(job: &mut Job, op: Op) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let stream = super::gpu(job)?.1;
    // Default; small slots (many rounds, sentinel and LL only up to 64 KiB); the simple protocol
    // only; the same with many rounds; LL up to 8 MiB per sender (many LL blocks); sentinel up to
    // 16 MiB per sender (many sentinel blocks).
    let setups = [
        Options::default(),
        Options {
            slot_bytes: Some(64 << 10),
            blocks: Some(3),
            ..Options::default()
        },
        Options {
            ll_max_bytes: 0,
            sentinel_max_bytes: 0,
            ..Options::default()
        },
        // Many rounds with the grid changing from call to call (blocks by size).
        Options {
            slot_bytes: Some(64 << 10),
            ll_max_bytes: 0,
            sentinel_max_bytes: 0,
            ..Options::default()
        },
        Options {
            ll_max_bytes: u64::MAX,
            sentinel_max_bytes: 0,
            slot_bytes: Some(16 << 20),
            ..Options::default()
        },
        Options {
            ll_max_bytes: 0,
            sentinel_max_bytes: 16 << 20,
            slot_bytes: Some(16 << 20),
            ..Options::default()
        },
    ];
    for base in setups {
        let options = match op {
            Op::AllReduce(choice) | Op::AllReduceInPlace(choice) => Options {
                all_reduce: choice,
                ..base
            },
            _ => base,
        };
        let mut coll = Collectives::new(&mut job.rdzv, &stream, options)?;
        for pass in 0..2u64 {
            for (k, n) in counts(seed).into_iter().enumerate() {
                let s = seed.wrapping_add(100 * pass + k as u64);
                run_and_check::<T>(job, &mut coll, &stream, op, n, s).map_err(|e| {
                    e.context(format!(
                        "{op:?} {} n={n} seed={s} options {options:?}",
                        T::NAME
                    ))
                })?;
            }
        }
        coll.free(&mut job.rdzv)?;
    }
    Ok(())
}

fn run_and_check<T: Elem + CollectiveElement>(
    job: &Job,
    coll: &mut Collectives,
    stream: &Arc<CudaStream>,
    op: Op,
    n: usize,
    seed: u64,
) -> anyhow::Result<()> {
    let (rank, world) = (job.rank(), job.world());
    let input_len = match op {
        Op::ReduceScatter => n * world,
        _ => n,
    };
    let inputs: Vec<Vec<i32>> = (0..world).map(|r| small_ints(seed, r, input_len)).collect();
    let sum = |i: usize| inputs.iter().map(|v| v[i]).sum::<i32>();
    let want: Vec<T> = match op {
        Op::AllReduce(_) | Op::AllReduceInPlace(_) => {
            (0..n).map(|i| T::from_small_int(sum(i))).collect()
        }
        Op::ReduceScatter => (0..n)
            .map(|i| T::from_small_int(sum(rank * n + i)))
            .collect(),
        Op::AllGather => inputs
            .iter()
            .flatten()
            .map(|&x| T::from_small_int(x))
            .collect(),
    };
    let mine: Vec<T> = inputs[rank].iter().map(|&x| T::from_small_int(x)).collect();
    let input = stream.clone_htod(&mine)?;
    let got = match op {
        Op::AllReduceInPlace(_) => {
            let mut buf = input;
            coll.all_reduce_in_place(&mut buf)?;
            coll.synchronize()?;
            stream.clone_dtoh(&buf)?
        }
        _ => {
            let mut output = stream.clone_htod(&vec![T::poison(); want.len()])?;
            match op {
                Op::AllReduce(_) => coll.all_reduce(&input, &mut output)?,
                Op::ReduceScatter => coll.reduce_scatter(&input, &mut output)?,
                _ => coll.all_gather(&input, &mut output)?,
            }
            coll.synchronize()?;
            stream.clone_dtoh(&output)?
        }
    };
    check_equal(&format!("rank {rank}"), &got, &want)
}

/// One CUDA graph holding an AllReduce, a ReduceScatter and an AllGather, replayed with fresh
/// inputs each time: every replay must take new round numbers (they live on the device), or its
/// waits would pass on the previous replay's flags and read stale staging.
fn graph_replay(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let stream = super::gpu(job)?.1;
    let (rank, world) = (job.rank(), job.world());
    // Three simple-protocol calls, a small sentinel AllReduce (whole 16-byte vectors) and a small
    // LL one (not).
    let (n, m, l) = (300_001, 1000, 999);
    let mut coll = Collectives::new(&mut job.rdzv, &stream, Options::default())?;
    for (count, want) in [(m, Protocol::Sentinel), (l, Protocol::LowLatency)] {
        let path = coll.all_reduce_path::<f32>(count);
        let g = coll.geometry::<f32>(path, count)?;
        anyhow::ensure!(
            g.protocol == want,
            "graph replay: an AllReduce of {count} f32 takes {:?}, the trial needs {want:?}",
            g.protocol
        );
    }
    let mut ins = [
        stream.alloc_zeros::<f32>(n)?,
        stream.alloc_zeros::<f32>(n * world)?,
        stream.alloc_zeros::<f32>(n)?,
        stream.alloc_zeros::<f32>(m)?,
        stream.alloc_zeros::<f32>(l)?,
    ];
    let mut outs = [
        stream.alloc_zeros::<f32>(n)?,
        stream.alloc_zeros::<f32>(n)?,
        stream.alloc_zeros::<f32>(n * world)?,
        stream.alloc_zeros::<f32>(m)?,
        stream.alloc_zeros::<f32>(l)?,
    ];
    stream.synchronize()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let captured = (|| -> Result<(), CollectiveError> {
        let [o0, o1, o2, o3, o4] = &mut outs;
        coll.all_reduce(&ins[0], o0)?;
        coll.reduce_scatter(&ins[1], o1)?;
        coll.all_gather(&ins[2], o2)?;
        coll.all_reduce(&ins[3], o3)?;
        coll.all_reduce(&ins[4], o4)
    })();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or_else(|| anyhow::anyhow!("the capture produced no graph"))?;
    for replay in 0..4u64 {
        let s = seed.wrapping_add(replay);
        let inputs: Vec<[Vec<i32>; 5]> = (0..world)
            .map(|r| {
                [
                    small_ints(s, r, n),
                    small_ints(s ^ 1, r, n * world),
                    small_ints(s ^ 2, r, n),
                    small_ints(s ^ 3, r, m),
                    small_ints(s ^ 4, r, l),
                ]
            })
            .collect();
        for k in 0..5 {
            let v: Vec<f32> = inputs[rank][k].iter().map(|&x| x as f32).collect();
            stream.memcpy_htod(&v, &mut ins[k])?;
            let len = outs[k].len();
            stream.memcpy_htod(&vec![f32::NAN; len], &mut outs[k])?;
        }
        graph.launch()?;
        coll.synchronize()?;
        let sum = |k: usize, i: usize| inputs.iter().map(|v| v[k][i]).sum::<i32>() as f32;
        let want: [Vec<f32>; 5] = [
            (0..n).map(|i| sum(0, i)).collect(),
            (0..n).map(|i| sum(1, rank * n + i)).collect(),
            inputs
                .iter()
                .flat_map(|v| v[2].iter().map(|&x| x as f32))
                .collect(),
            (0..m).map(|i| sum(3, i)).collect(),
            (0..l).map(|i| sum(4, i)).collect(),
        ];
        for (k, what) in [
            "all_reduce",
            "reduce_scatter",
            "all_gather",
            "all_reduce sentinel",
            "all_reduce LL",
        ]
        .iter()
        .enumerate()
        {
            check_equal(
                &format!("replay {replay} {what} rank {rank} seed {s}"),
                &stream.clone_dtoh(&outs[k])?,
                &want[k],
            )?;
        }
    }
    drop(graph);
    coll.free(&mut job.rdzv)?;
    Ok(())
}

/// Element bits for [`sentinel_bits`]: the all-ones pattern (the protocol's sentinel, a NaN) and
/// what the protocol sends in its place (0x7f..f, another NaN).
trait SentinelBits: Elem + CollectiveElement {
    const ALL_ONES: Self;
    const SENT_AS: Self;
    fn bits(self) -> u32;
}
impl SentinelBits for f32 {
    const ALL_ONES: Self = f32::from_bits(u32::MAX);
    const SENT_AS: Self = f32::from_bits(0x7fff_ffff);
    fn bits(self) -> u32 {
        self.to_bits()
    }
}
impl SentinelBits for bf16 {
    const ALL_ONES: Self = bf16::from_bits(0xffff);
    const SENT_AS: Self = bf16::from_bits(0x7fff);
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}
impl SentinelBits for f16 {
    const ALL_ONES: Self = f16::from_bits(0xffff);
    const SENT_AS: Self = f16::from_bits(0x7fff);
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}

/// The sentinel protocol's one change of bits, written out here: an AllGather (by the sentinel
/// protocol) of inputs holding all-ones elements at random places returns them as 0x7f..f on
/// every rank, every other element exactly; an AllReduce returns NaN exactly where some rank's
/// element was all ones, the same bits on every rank, and the exact sums elsewhere. Without the
/// substitution the receiver would wait for those elements until its bound expired.
fn sentinel_bits<T: SentinelBits>(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let stream = super::gpu(job)?.1;
    let (rank, world) = (job.rank(), job.world());
    let n = 4096; // whole 16-byte vectors in f32 and bf16: the sentinel protocol by default
    let mut coll = Collectives::new(&mut job.rdzv, &stream, Options::default())?;
    let g = coll.geometry::<T>(Algorithm::AllGather, n)?;
    anyhow::ensure!(
        g.protocol == Protocol::Sentinel,
        "{n} elements of {} did not take the sentinel protocol: {g:?}",
        T::NAME
    );
    // Rank r's input: small integers, all ones where the seeded draw says so.
    let ones: Vec<Vec<bool>> = (0..world)
        .map(|r| {
            let mut rng = StdRng::seed_from_u64(seed ^ (r as u64 + 1));
            (0..n)
                .map(|i| i == r || rng.random_range(0..16) == 0)
                .collect()
        })
        .collect();
    let input_of = |r: usize| -> Vec<T> {
        small_ints(seed, r, n)
            .into_iter()
            .zip(&ones[r])
            .map(|(x, &one)| {
                if one {
                    T::ALL_ONES
                } else {
                    T::from_small_int(x)
                }
            })
            .collect()
    };
    let input = stream.clone_htod(&input_of(rank))?;
    let mut gathered = stream.clone_htod(&vec![T::from_small_int(0); n * world])?;
    coll.all_gather(&input, &mut gathered)?;
    let mut summed = stream.clone_htod(&vec![T::from_small_int(0); n])?;
    coll.all_reduce(&input, &mut summed)?;
    coll.synchronize()?;
    let want_gathered: Vec<u32> = (0..world)
        .flat_map(|r| input_of(r).into_iter())
        .map(|x| {
            if x.bits() == T::ALL_ONES.bits() {
                T::SENT_AS.bits()
            } else {
                x.bits()
            }
        })
        .collect();
    let got: Vec<u32> = stream
        .clone_dtoh(&gathered)?
        .into_iter()
        .map(|x| x.bits())
        .collect();
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want_gathered[i]) {
        anyhow::bail!(
            "all_gather rank {rank}: element {i} has bits {:#x}, expected {:#x}",
            got[i],
            want_gathered[i]
        );
    }
    let summed = stream.clone_dtoh(&summed)?;
    check_sums(job, "all_reduce one-shot", &summed, &ones, seed)?;
    coll.free(&mut job.rdzv)?;
    // The two-shot AllReduce (its sums pushed by the sentinel protocol too) and ReduceScatter.
    let mut coll = Collectives::new(
        &mut job.rdzv,
        &stream,
        Options {
            all_reduce: AllReduceChoice::TwoShot,
            ..Options::default()
        },
    )?;
    let g = coll.geometry::<T>(Algorithm::AllReduceTwoShot, n)?;
    anyhow::ensure!(g.protocol == Protocol::Sentinel, "two-shot of {n}: {g:?}");
    let mut summed = stream.clone_htod(&vec![T::from_small_int(0); n])?;
    coll.all_reduce(&input, &mut summed)?;
    coll.synchronize()?;
    check_sums(
        job,
        "all_reduce two-shot",
        &stream.clone_dtoh(&summed)?,
        &ones,
        seed,
    )?;
    if world > 1 {
        // ReduceScatter of m per rank (whole 16-byte vectors): rank r's shard is elements r·m..
        // of the sums.
        let m = n / world / 8 * 8;
        let g = coll.geometry::<T>(Algorithm::ReduceScatter, m)?;
        anyhow::ensure!(
            g.protocol == Protocol::Sentinel,
            "reduce_scatter of {m}: {g:?}"
        );
        let mut part = stream.clone_htod(&vec![T::from_small_int(0); m])?;
        coll.reduce_scatter(&input.slice(..m * world), &mut part)?;
        coll.synchronize()?;
        let got = stream.clone_dtoh(&part)?;
        check_nan_sums("reduce_scatter", rank, &got, rank * m, &ones, seed, n)?;
    }
    coll.free(&mut job.rdzv)?;
    Ok(())
}

/// AllReduce results with all-ones inputs at `ones`: as [`check_nan_sums`], and the same bits on
/// every rank.
fn check_sums<T: SentinelBits>(
    job: &mut Job,
    what: &str,
    summed: &[T],
    ones: &[Vec<bool>],
    seed: u64,
) -> anyhow::Result<()> {
    check_nan_sums(what, job.rank(), summed, 0, ones, seed, summed.len())?;
    let bits: Vec<u8> = summed.iter().flat_map(|x| x.bits().to_le_bytes()).collect();
    let all = job.rdzv.all_gather(&bits)?;
    anyhow::ensure!(
        all.iter().all(|b| *b == bits),
        "{what}: the ranks' results differ in their bits"
    );
    Ok(())
}

/// `got[i]` is the sum over ranks of element `offset + i` of their n inputs (small integers from
/// `seed`, all ones at `ones`): NaN exactly where some rank's element was all ones, the exact sum
/// elsewhere.
fn check_nan_sums<T: SentinelBits>(
    what: &str,
    rank: usize,
    got: &[T],
    offset: usize,
    ones: &[Vec<bool>],
    seed: u64,
    n: usize,
) -> anyhow::Result<()> {
    let ints: Vec<Vec<i32>> = (0..ones.len()).map(|r| small_ints(seed, r, n)).collect();
    for (i, &x) in got.iter().enumerate() {
        let j = offset + i;
        let nan = ones.iter().any(|o| o[j]);
        let ok = if nan {
            x.is_poison() // NaN for the float types
        } else {
            x == T::from_small_int(ints.iter().map(|v| v[j]).sum())
        };
        anyhow::ensure!(
            ok,
            "{what} rank {rank}: element {i} is {x:?} (NaN expected: {nan})"
        );
    }
    Ok(())
}

/// Many sentinel calls enqueued back to back with no synchronisation between them (one-round and
/// two-round launches interleaved, sizes and grids changing from call to call, programmatic launch
/// on where the ranks have GPUs of their own), each into its own output, all checked at the end:
/// slot reuse and the reset of the sentinel from one call to the next are seen only this way.
fn sentinel_back_to_back(job: &mut Job) -> anyhow::Result<()> {
    let seed = shared_seed(job)?;
    let stream = super::gpu(job)?.1;
    let (rank, world) = (job.rank(), job.world());
    let sizes = [4096usize, 1000, 1 << 16, 24, 1 << 18, 4];
    for choice in [AllReduceChoice::OneShot, AllReduceChoice::TwoShot] {
        let mut coll = Collectives::new(
            &mut job.rdzv,
            &stream,
            Options {
                all_reduce: choice,
                ..Options::default()
            },
        )?;
        let mut calls = Vec::new();
        for k in 0..24usize {
            let n = sizes[k % sizes.len()] * 4; // f32 elements: whole 16-byte vectors
            let op = [Op::AllReduce(choice), Op::ReduceScatter, Op::AllGather][k % 3];
            let (algo, count) = match op {
                Op::AllReduce(_) => (coll.all_reduce_path::<f32>(n), n),
                Op::ReduceScatter => (Algorithm::ReduceScatter, n),
                _ => (Algorithm::AllGather, n),
            };
            let g = coll.geometry::<f32>(algo, count)?;
            if g.protocol != Protocol::Sentinel {
                continue; // (a two-shot of shards too small to hold data everywhere)
            }
            let s = seed.wrapping_add(1000 + k as u64);
            let input_len = if matches!(op, Op::ReduceScatter) {
                n * world
            } else {
                n
            };
            let output_len = if matches!(op, Op::AllGather) {
                n * world
            } else {
                n
            };
            let inputs: Vec<Vec<i32>> = (0..world).map(|r| small_ints(s, r, input_len)).collect();
            let mine: Vec<f32> = inputs[rank].iter().map(|&x| x as f32).collect();
            let input = stream.clone_htod(&mine)?;
            let mut output = stream.clone_htod(&vec![f32::NAN; output_len])?;
            match op {
                Op::AllReduce(_) => coll.all_reduce(&input, &mut output)?,
                Op::ReduceScatter => coll.reduce_scatter(&input, &mut output)?,
                _ => coll.all_gather(&input, &mut output)?,
            }
            calls.push((op, n, inputs, input, output, g));
        }
        anyhow::ensure!(
            calls.len() >= 16,
            "only {} of 24 calls took the sentinel protocol",
            calls.len()
        );
        coll.synchronize()?;
        for (k, (op, n, inputs, _input, output, g)) in calls.iter().enumerate() {
            let sum = |i: usize| inputs.iter().map(|v| v[i]).sum::<i32>() as f32;
            let want: Vec<f32> = match op {
                Op::AllReduce(_) => (0..*n).map(sum).collect(),
                Op::ReduceScatter => (0..*n).map(|i| sum(rank * n + i)).collect(),
                _ => inputs.iter().flatten().map(|&x| x as f32).collect(),
            };
            check_equal(
                &format!("{choice:?} call {k} ({op:?} of {n}, {g:?}) rank {rank}"),
                &stream.clone_dtoh(output)?,
                &want,
            )?;
        }
        coll.free(&mut job.rdzv)?;
    }
    Ok(())
}

/// A buffer at an address that is not device memory (a stand-in for another device's buffer):
/// the driver says so, and the call is refused before a kernel could fault on it.
struct HostAddress {
    addr: u64,
    len: usize,
    stream: Arc<CudaStream>,
}

impl cudarc::driver::DeviceSlice<f32> for HostAddress {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl cudarc::driver::DevicePtr<f32> for HostAddress {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        (self.addr, cudarc::driver::SyncOnDrop::Record(None))
    }
}

/// Wrong lengths, a misaligned buffer, a buffer that is not the device's, bad options and options
/// that differ between ranks get their named errors, on every rank, and the `Collectives` still
/// works afterwards (nothing was launched).
fn errors(job: &mut Job) -> anyhow::Result<()> {
    let stream = super::gpu(job)?.1;
    let world = job.world();
    let bad = Collectives::new(
        &mut job.rdzv,
        &stream,
        Options {
            blocks: Some(0),
            ..Options::default()
        },
    );
    match bad {
        Err(CollectiveError::Options(msg)) if msg.contains("blocks 0 must be in") => {}
        Err(e) => anyhow::bail!(
            "blocks = 0 was refused, but not as CollectiveError::Options naming it: {e}"
        ),
        Ok(_) => anyhow::bail!("blocks = 0 was accepted"),
    }
    if world > 1 {
        // Every rank's options are valid, but rank 0 cuts calls into other blocks.
        let blocks = Some(if job.rank() == 0 { 4 } else { 8 });
        let differ = Collectives::new(
            &mut job.rdzv,
            &stream,
            Options {
                blocks,
                ..Options::default()
            },
        );
        match differ {
            Err(CollectiveError::Options(msg)) if msg.contains("ranks disagree") => {}
            Err(e) => anyhow::bail!(
                "differing options were refused, but not as Options(ranks disagree): {e}"
            ),
            Ok(_) => anyhow::bail!("ranks with different block counts were accepted"),
        }
    }

    let mut coll = Collectives::new(&mut job.rdzv, &stream, Options::default())?;
    // One element more than 64 · world: room for the misaligned view a[1..65] at any world.
    let a = stream.alloc_zeros::<f32>(64 * world + 1)?;
    let mut b = stream.alloc_zeros::<f32>(64 * world)?;
    let e = coll
        .all_reduce(&a.slice(..64), &mut b.slice_mut(..63))
        .unwrap_err();
    anyhow::ensure!(
        matches!(
            e,
            CollectiveError::Length {
                buffer: "output",
                len: 63,
                expected: 64,
                ..
            }
        ),
        "{e}"
    );
    if world > 1 {
        let e = coll
            .reduce_scatter(&a.slice(..64), &mut b.slice_mut(..64))
            .unwrap_err();
        anyhow::ensure!(
            matches!(
                e,
                CollectiveError::Length {
                    buffer: "input",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = coll
        .all_gather(&a.slice(1..65), &mut b.slice_mut(..64 * world))
        .unwrap_err();
    anyhow::ensure!(
        matches!(
            e,
            CollectiveError::Misaligned {
                buffer: "input",
                ..
            }
        ),
        "{e}"
    );
    let host = vec![0u128; 16]; // 256 bytes, 16-byte aligned: only the device check can refuse it
    let not_device = HostAddress {
        addr: host.as_ptr() as u64,
        len: 64,
        stream: stream.clone(),
    };
    let e = coll
        .all_reduce(&not_device, &mut b.slice_mut(..64))
        .unwrap_err();
    anyhow::ensure!(
        matches!(
            e,
            CollectiveError::WrongDevice {
                buffer: "input",
                ..
            }
        ),
        "{e}"
    );
    // Still usable: a real call after the refusals.
    run_and_check::<f32>(
        job,
        &mut coll,
        &stream,
        Op::AllReduce(AllReduceChoice::Auto),
        1000,
        7,
    )?;
    coll.free(&mut job.rdzv)?;
    Ok(())
}
