//! GEMM operands for trials and benchmarks: fresh random values in [-1, 1] rounded to the input
//! dtype, a NaN-poisoned output, and host copies.

use cudarc::driver::{CudaSlice, CudaStream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use weft_signal_gemm::GemmElement;

/// `count` values uniform in [-1, 1] as `T`.
pub fn uniform<T: GemmElement>(seed: u64, count: usize) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| T::from_f64(rng.random_range(-1.0f64..=1.0)))
        .collect()
}

/// A device copy of `values` (the upload completes before this returns).
pub fn upload<T: GemmElement>(
    stream: &Arc<CudaStream>,
    values: &[T],
) -> anyhow::Result<CudaSlice<T>> {
    let d = stream.clone_htod(values)?;
    stream.synchronize()?;
    Ok(d)
}

/// A device buffer of `count` NaNs, so an element the kernel never writes fails every
/// tolerance check.
pub fn poisoned<T: GemmElement>(
    stream: &Arc<CudaStream>,
    count: usize,
) -> anyhow::Result<CudaSlice<T>> {
    upload(stream, &vec![T::from_f64(f64::NAN); count])
}

/// Overwrites every element of `d` with NaN.
pub fn poison<T: GemmElement>(
    stream: &Arc<CudaStream>,
    d: &mut CudaSlice<T>,
) -> anyhow::Result<()> {
    stream.memcpy_htod(&vec![T::from_f64(f64::NAN); d.len()], d)?;
    stream.synchronize()?;
    Ok(())
}

pub fn download<T: GemmElement>(
    stream: &Arc<CudaStream>,
    d: &CudaSlice<T>,
) -> anyhow::Result<Vec<T>> {
    let v = stream.clone_dtoh(d)?;
    stream.synchronize()?;
    Ok(v)
}

/// Rank `rank`'s receive of a ReduceScatter of a RANK_BANDS buffer (`staging`, stored with
/// `groups`), simulated by copies: its part of every group's range, into the layout
/// `RankBandMap::restore` reads. No communication, so every world size runs on one GPU.
pub fn band_receive<T: GemmElement>(
    stream: &Arc<CudaStream>,
    map: &weft_signal_gemm::RankBandMap,
    groups: &weft_signal_gemm::WaveGroups,
    staging: &CudaSlice<T>,
    rank: usize,
    ranks: usize,
) -> anyhow::Result<CudaSlice<T>> {
    let mut received = poisoned::<T>(stream, map.received_len())?;
    for g in 0..groups.count() {
        let (send, recv) = map.group_ranges(groups.orders(g));
        let part = send.len() / ranks;
        let mine = send.start + rank * part..send.start + (rank + 1) * part;
        stream.memcpy_dtod(&staging.slice(mine), &mut received.slice_mut(recv))?;
    }
    Ok(received)
}
