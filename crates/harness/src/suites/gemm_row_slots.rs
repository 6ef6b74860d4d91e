//! The GEMM's row-slots layout with a caller's table that points past D: the table check launched
//! before the GEMM (kernels/gemm/row_slots_check.cu) must report the entry (BAD_INDEX: tile, row,
//! the slot it holds and D's slot count) and trap, so the GEMM never stores outside D. The trap poisons every context of its process, so the GEMM runs in a child
//! process (`weft __gemm-row-slots-child ORDINAL RANK`), as the sync timeout trials do. The report
//! names the rank the GEMM was given (CHILD_RANK, not 0, so that a report that loses it fails at
//! any world size) and the part of the kernel that gave up.

use crate::job::Job;
use crate::trials::{Case, Skip};
use cudarc::driver::CudaContext;
use half::bf16;
use std::time::Duration;
use weft_kernels::abi::WEFT_GEMM_NO_SLOT;
use weft_signal_gemm::{Gemm, GemmOptions, GemmShape, LaunchExtras, OutputLayout, RowSlotTable};

pub const CHILD_COMMAND: &str = "__gemm-row-slots-child";
/// The rank the child's GEMM is told it is.
const CHILD_RANK: usize = 3;

/// D's slots, and the one bad entry: tile 1, row 77 holds slot SLOTS (one past the last).
const SLOTS: u32 = 16;
const BAD_TILE: usize = 1;
const BAD_ROW: usize = 77;

pub fn cases() -> Vec<Case> {
    vec![Case::gpu(
        "gemm::errors::row_slot_table_past_d",
        row_slot_table_past_d,
    )]
}

fn row_slot_table_past_d(job: &mut Job) -> anyhow::Result<()> {
    if let Some(why) = job.shared_gpu() {
        return Err(Skip(format!(
            "a trapping kernel would end every rank's context under MPS: {why}"
        ))
        .into());
    }
    let ordinal = job
        .gpu()
        .map_err(|why| anyhow::anyhow!("no GPU: {why}"))?
        .ordinal;
    let rank = CHILD_RANK;
    let args = [
        CHILD_COMMAND.to_string(),
        ordinal.to_string(),
        rank.to_string(),
    ];
    let out = super::child::run_bounded(&args, Duration::from_secs(60))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(message) = stdout.lines().find_map(|l| l.strip_prefix("message ")) else {
        anyhow::bail!(
            "the row-slots child reported nothing ({}): stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // One tile row: tile (tm 0, tn 1) has index 1 in any raster order.
    let needles = [
        format!("rank {rank} (GEMM row-slots check): GEMM row-slots table check"),
        format!("(b 0, d 0, row {BAD_TILE}, col {BAD_ROW})"),
        format!("it holds {SLOTS}, but what it indexes has only {SLOTS}"),
    ];
    for n in &needles {
        anyhow::ensure!(
            message.contains(n.as_str()),
            "expected {n:?} in the report, got: {message}"
        );
    }
    Ok(())
}

/// `weft __gemm-row-slots-child ORDINAL RANK`: plans a GEMM of two tiles with the row-slots
/// layout over SLOTS slots as rank RANK, gives it a table whose only used entry (tile BAD_TILE,
/// row BAD_ROW) points one past D's slots, and prints `message <the GEMM's error report>` (or
/// `message none`).
pub fn child(args: &[String]) -> anyhow::Result<()> {
    let [ordinal, rank] = args else {
        anyhow::bail!("usage: weft {CHILD_COMMAND} ORDINAL RANK");
    };
    let ctx = CudaContext::new(ordinal.parse()?)?;
    let stream = ctx.default_stream();
    let shape = GemmShape::new(128, 512, 64);
    let options = GemmOptions {
        tile: weft_signal_gemm::TileChoice::N256,
        ..GemmOptions::default()
    };
    let mut gemm = Gemm::new(&ctx, shape, options)?;
    gemm.set_rank(rank.parse()?);
    let tiles = gemm.plan().tiles() as usize;
    anyhow::ensure!(tiles == 2, "the child's GEMM has {tiles} tiles, expected 2");
    let mut table = vec![WEFT_GEMM_NO_SLOT; tiles * 128];
    table[BAD_TILE * 128 + BAD_ROW] = SLOTS;
    let table = stream.clone_htod(&table)?;
    let a = stream.clone_htod(&vec![bf16::ONE; 128 * 64])?;
    let b = stream.clone_htod(&vec![bf16::ONE; 512 * 64])?;
    // D holds exactly SLOTS slots of tile_n columns.
    let mut d = stream.alloc_zeros::<bf16>(SLOTS as usize * 256)?;
    let extras = LaunchExtras {
        layout: OutputLayout::RowSlots { slots: SLOTS },
        row_slots: Some(RowSlotTable::new(&table)),
        ..Default::default()
    };
    // The check may trap before the GEMM's launch is issued (that launch then fails): the report
    // in the error slot is what counts either way.
    let launched = gemm
        .launch_with(&stream, &a, &b, &mut d, extras)
        .map_err(anyhow::Error::from);
    let synced = launched.and_then(|()| Ok(stream.synchronize()?));
    let message = match gemm.check() {
        Err(e) => format!("{e:#}"),
        Ok(()) => match synced {
            Err(e) => format!("no report; the launch or stream failed: {e:#}"),
            Ok(()) => "none".into(),
        },
    };
    println!("message {}", message.replace('\n', " "));
    Ok(())
}
