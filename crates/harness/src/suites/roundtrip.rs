//! A round trip through an embedded kernel: build, embedding, shared ABI header and launch path.

use crate::job::Job;
use crate::trials::Case;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use weft_kernels::abi::weft_roundtrip_params;
use weft_kernels::cubins;

pub fn cases() -> Vec<Case> {
    vec![
        Case::gpu("kernels::roundtrip", roundtrip),
        Case::gpu(
            "kernels::word_compare_finds_differences",
            word_compare_finds_differences,
        ),
    ]
}

/// The harness's device-side bitwise comparison (used to check large outputs every repetition):
/// equal buffers give None; flipped words give their count and the first one.
fn word_compare_finds_differences(job: &mut Job) -> anyhow::Result<()> {
    let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
    let stream = &gpu.stream;
    let mut cmp = crate::word_compare::WordCompare::load(stream)?;
    let mut rng = StdRng::seed_from_u64(7);
    let n = 3_000_017usize;
    let a: Vec<u32> = (0..n).map(|_| rng.random()).collect();
    let d_a = stream.clone_htod(&a)?;
    let same = cmp.differ(stream, &d_a, &stream.clone_htod(&a)?)?;
    anyhow::ensure!(
        same.is_none(),
        "equal buffers reported as different: {same:?}"
    );
    let mut b = a.clone();
    let flips = [n - 1, 12_345, 2_999_000, 40];
    for &i in &flips {
        b[i] ^= 1 << rng.random_range(0..32);
    }
    let got = cmp.differ(stream, &d_a, &stream.clone_htod(&b)?)?;
    let want = crate::word_compare::Difference {
        words: flips.len() as u64,
        first_word: 40,
    };
    anyhow::ensure!(
        got == Some(want),
        "flipped words {flips:?}: reported {got:?}, expected {want:?}"
    );
    Ok(())
}

fn roundtrip(job: &mut Job) -> anyhow::Result<()> {
    let rank = job.rank();
    let gpu = job.gpu().map_err(|why| anyhow::anyhow!("no GPU: {why}"))?;
    let module = cubins::HARNESS_ROUNDTRIP.load(&gpu.ctx)?;
    let func = module.load_function("weft_roundtrip")?;
    let mut rng = StdRng::seed_from_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
    );
    for n in [1usize, 1000, rng.random_range(1..5_000_000)] {
        let input: Vec<f32> = (0..n).map(|_| rng.random_range(-1e3f32..1e3)).collect();
        // A power of two: the product is exact, so fused or unfused multiply-add agree bit for bit.
        let scale = [0.25f32, 0.5, 2.0, 4.0][rng.random_range(0..4)];
        let d_in = gpu.stream.clone_htod(&input)?;
        let mut d_out = gpu.stream.clone_htod(&vec![f32::NAN; n])?;
        let params = weft_roundtrip_params {
            input: cudarc::driver::DevicePtr::device_ptr(&d_in, &gpu.stream).0,
            output: cudarc::driver::DevicePtrMut::device_ptr_mut(&mut d_out, &gpu.stream).0,
            n: n as u64,
            scale,
            rank: rank as i32,
        };
        let cfg = LaunchConfig {
            grid_dim: (264, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: params point at n-element buffers that live until the copy below completes.
        unsafe { gpu.stream.launch_builder(&func).arg(&params).launch(cfg)? };
        let out = gpu.stream.clone_dtoh(&d_out)?;
        let want: Vec<f32> = input.iter().map(|x| x * scale + rank as f32).collect();
        crate::data::check_equal(&format!("roundtrip n={n} scale={scale}"), &out, &want)?;
    }
    Ok(())
}
