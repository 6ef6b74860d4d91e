//! Checks every op makes the same way: the request is the same on every rank, the GEMM options
//! leave the methods their SMs, a launch matches its plan, and a CUDA graph capture only records
//! methods a replay can run.

use super::candidates::OpKind;
use super::env::OverlapEnv;
use super::method::{Method, MethodChoice};
use crate::dtype::GemmElement;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::plan::{GemmOptions, GemmShape};
use anyhow::Context;
use cudarc::driver::{sys, CudaStream, ValidAsZeroBits};
use cudarc::nccl::NcclType;
use std::sync::Arc;
use weft_collectives::{CollectiveElement, Collectives};
use weft_pgl::Bootstrap;
use weft_pgl::PglElement;

/// An element type an op can produce: a GEMM output NCCL and weft's collectives can reduce and a
/// PGL can hold.
pub trait OpElement:
    GemmElement + NcclType + PglElement + ValidAsZeroBits + CollectiveElement
{
}
impl<T: GemmElement + NcclType + PglElement + ValidAsZeroBits + CollectiveElement> OpElement for T {}

/// Collective: the options suit an op (checked on every rank alike), and every rank asks for the
/// same op; the error names the ranks that differ. `op_checks` is the op's own checks' outcome,
/// with anything more every rank must agree on (e.g. a digest of the routing) as text.
#[allow(clippy::too_many_arguments)]
pub(crate) fn agree_on_request(
    rdzv: &mut dyn Bootstrap,
    env: &OverlapEnv,
    stream: &Arc<CudaStream>,
    kind: OpKind,
    shape: GemmShape,
    options: &GemmOptions,
    choice: &MethodChoice,
    capturable: bool,
    op_checks: anyhow::Result<String>,
) -> anyhow::Result<()> {
    let local =
        op_checks.and_then(|extra| check_options(env, stream, kind, options).map(|()| extra));
    let extra = crate::error::agree(
        rdzv,
        &format!("checking the {} request", kind.title()),
        local,
    )?;
    let describe = format!(
        "{} {shape} {options:?} {choice} capturable={capturable}{extra}",
        kind.title()
    );
    let all = rdzv
        .all_gather(describe.as_bytes())
        .context("comparing the ranks' requests")?;
    let differing: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| d.as_slice() != describe.as_bytes())
        .map(|(r, d)| format!("rank {r} asked for {}", String::from_utf8_lossy(d)))
        .collect();
    require!(
        differing.is_empty(),
        RanksDisagree,
        "ranks asked for different ops: this rank asked for {describe}; {}",
        differing.join("; ")
    );
    require!(
        rdzv.world() == env.world(),
        Options,
        "{}: the rendezvous has {} ranks, the environment {}",
        kind.title(),
        rdzv.world(),
        env.world()
    );
    Ok(())
}

fn check_options(
    env: &OverlapEnv,
    stream: &Arc<CudaStream>,
    kind: OpKind,
    options: &GemmOptions,
) -> anyhow::Result<()> {
    let title = kind.title();
    require!(
        options.beta == 0.0,
        Options,
        "{title}: beta must be 0 (the op's output is its own buffer), have {}",
        options.beta
    );
    require!(
        options.sm_margin == 0 && options.comm_ctas == 0,
        Options,
        "{title}: sm_margin and comm_ctas must be 0 (the methods set them), have {} and {}",
        options.sm_margin,
        options.comm_ctas
    );
    require!(
        stream.context().cu_ctx() == env.context().cu_ctx(),
        Options,
        "{title}: the stream is on another context than the op's environment"
    );
    Ok(())
}

/// The op's element type is the options' dtype (`what`: "output", "input").
pub(crate) fn check_dtype<T: GemmElement>(
    kind: OpKind,
    shape: GemmShape,
    what: &str,
    options_dtype: crate::Dtype,
) -> anyhow::Result<()> {
    require!(
        options_dtype == T::DTYPE,
        Options,
        "{} {shape}: the op's {what} is {} but GemmOptions::{what} is {options_dtype}",
        kind.title(),
        T::DTYPE
    );
    Ok(())
}

/// A launch's stream is the plan's, its input dtype the plan's, and each input (name, given
/// elements, needed elements) large enough.
pub(crate) fn check_launch<TI: GemmElement>(
    kind: OpKind,
    planned: &Arc<CudaStream>,
    stream: &Arc<CudaStream>,
    options: &GemmOptions,
    inputs: &[(&str, usize, usize)],
) -> anyhow::Result<()> {
    let title = kind.title();
    require!(
        stream.cu_stream() == planned.cu_stream(), Options,
        "{title}: launched on another stream than the one it was planned with (plan one op per stream)"
    );
    require!(
        TI::DTYPE == options.input,
        Options,
        "{title}: planned for {} inputs, given {}",
        options.input,
        TI::DTYPE
    );
    for &(name, have, need) in inputs {
        require!(
            have >= need,
            Length,
            "{title}: {name} holds {have} elements, needs {need}"
        );
    }
    Ok(())
}

/// Refuses to record `method` into a CUDA graph capture when a replay could not run it.
pub(crate) fn check_capture(stream: &Arc<CudaStream>, method: &Method) -> anyhow::Result<()> {
    if method.family().capturable() {
        return Ok(());
    }
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: an out-parameter for a live stream.
    unsafe { sys::cuStreamIsCapturing(stream.cu_stream(), &mut status) }
        .result()
        .context("cuStreamIsCapturing")?;
    require!(
        status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, Options,
        "{method} cannot be captured into a CUDA graph (its kernels carry host-side epochs a replay would repeat): plan the op with capturable = true"
    );
    Ok(())
}

/// The GEMM of a sequential method: cuBLAS (`seq-cublas`) or weft's (`seq-weft`).
pub(crate) enum SeqGemm {
    Cublas(crate::cublas::CublasGemm),
    Weft(crate::gemm::Gemm),
}

impl SeqGemm {
    /// `method`'s GEMM (SeqCublas or SeqWeft) for `shape` on `stream`'s device; weft's names
    /// `rank` in its give-up reports.
    pub fn new(
        method: &Method,
        stream: &Arc<CudaStream>,
        shape: GemmShape,
        options: GemmOptions,
        rank: usize,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            Ok(match method {
                Method::SeqCublas => {
                    SeqGemm::Cublas(crate::cublas::CublasGemm::new(stream, shape, options)?)
                }
                Method::SeqWeft => {
                    // Launched plain only: Auto may take the 128 x 192 tiles too.
                    let tile = match options.tile {
                        crate::plan::TileChoice::Auto => crate::plan::TileChoice::AutoPlain,
                        other => other,
                    };
                    let options = GemmOptions { tile, ..options };
                    let mut gemm = crate::gemm::Gemm::new(stream.context(), shape, options)?;
                    gemm.set_rank(rank);
                    SeqGemm::Weft(gemm)
                }
                other => refuse!(Options, "{other} is not a sequential method"),
            })
        })
    }

    /// D = A · B on `stream` (cuBLAS: on the stream it was made with, the op's planned one).
    pub fn launch<TI: GemmElement, TO: GemmElement>(
        &self,
        stream: &Arc<CudaStream>,
        a: &cudarc::driver::CudaSlice<TI>,
        b: &cudarc::driver::CudaSlice<TI>,
        d: &mut cudarc::driver::CudaSlice<TO>,
    ) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            match self {
                SeqGemm::Cublas(g) => g.launch(a, b, d).map_err(anyhow::Error::from),
                SeqGemm::Weft(g) => g.launch(stream, a, b, d).map_err(anyhow::Error::from),
            }
        })
    }
}

/// Collective: the `seq-collectives` method's weft collectives on `stream`, their staging slots
/// sized by [`op_slot_bytes`] for the op's largest buffer (`message_bytes`), every other option
/// at its default.
pub(crate) fn op_collectives(
    rdzv: &mut dyn Bootstrap,
    stream: &Arc<CudaStream>,
    message_bytes: u64,
) -> anyhow::Result<Collectives> {
    let defaults = weft_collectives::Options::default();
    let slot = op_slot_bytes(defaults.slot_bytes_at(rdzv.world()), message_bytes);
    let options = weft_collectives::Options {
        slot_bytes: Some(slot),
        ..defaults
    };
    Collectives::new(rdzv, stream, options)
        .with_context(|| format!("weft collectives with {slot}-byte staging slots"))
}

/// Staging slots for an op whose largest buffer is `message_bytes`: what one rank sends another
/// in any call is at most that buffer, and the LL protocol carries it in twice the bytes (a round
/// number beside every 4-byte word), so twice it, in whole 16-byte vectors, at least
/// `MIN_SLOT_BYTES`, at most the collectives' default slot (`default_slot`).
pub(crate) fn op_slot_bytes(default_slot: u64, message_bytes: u64) -> u64 {
    default_slot.min(
        message_bytes
            .saturating_mul(2)
            .checked_next_multiple_of(16)
            .unwrap_or(u64::MAX)
            .max(MIN_SLOT_BYTES),
    )
}

/// The smallest staging slot `op_collectives` makes.
const MIN_SLOT_BYTES: u64 = 64 << 10;

#[cfg(test)]
mod tests {
    use super::op_slot_bytes;

    #[test]
    fn op_slots_hold_twice_the_largest_buffer_up_to_the_default() {
        let default = 16 << 20;
        // 256 KiB of bf16 (16 × 8192): the LL protocol's 512 KiB.
        assert_eq!(op_slot_bytes(default, 256 << 10), 512 << 10);
        // Tiny and odd sizes: at least 64 KiB, whole 16-byte vectors.
        assert_eq!(op_slot_bytes(default, 100), 64 << 10);
        assert_eq!(op_slot_bytes(default, 40_001), 80_016);
        // Large buffers take the default slots (the calls then run in rounds).
        assert_eq!(op_slot_bytes(default, 512 << 20), default);
        assert_eq!(op_slot_bytes(default, u64::MAX), default);
    }
}
