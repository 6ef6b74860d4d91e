//! `weft plot RESULTS.json… [--out PATH.png|.svg] [--kind speedup|bandwidth]`: a chart of results
//! files (schema: results_file.rs). Speedup against shape: each row's `ratio` (baseline ÷ weft)
//! by case (in the PyTorch peer files the measured op is async-TP), one series per file, so the same suite from two machines or commits overlays.
//! Bandwidth against size: rows with `bytes`, GB/s (bus bandwidth where the suite gives it)
//! against bytes on a log axis, one series per file and op (or method and SM count), the
//! baseline's dashed where the rows carry it. Drawn by plotters; text in DejaVu Sans, embedded
//! (assets/, with its licence), so no system font is needed.
//!
//! Files: this one (flags, the command, tests), `chart.rs` (what to draw, from the files),
//! `draw.rs` (drawing it with plotters).

mod chart;
mod draw;

use crate::results_file::ResultsFile;
use chart::chart;
use clap::{Parser, ValueEnum};
use draw::draw_to;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// `ratio` (baseline ÷ the measured op) by case.
    Speedup,
    /// GB/s against bytes.
    Bandwidth,
}

#[derive(Debug, Parser)]
#[command(
    name = "weft plot",
    about = "Draw results files: speedup against shape, or bandwidth against size (PNG or SVG)"
)]
pub struct PlotArgs {
    /// Results files (`results/<suite>/<kind>-<date>.json`); several overlay as series.
    #[arg(required = true, value_name = "RESULTS.json")]
    pub files: Vec<PathBuf>,
    /// Where to write: `.png` or `.svg` (default: the first file's path with `.png`).
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// What to draw (default: bandwidth when the rows have `bytes`, else speedup).
    #[arg(long, value_enum)]
    pub kind: Option<Kind>,
}

/// Parses `args` (after `plot`), draws, and returns the path written.
pub fn command(args: &[String]) -> anyhow::Result<PathBuf> {
    let args = PlotArgs::try_parse_from(
        std::iter::once("weft plot".to_string()).chain(args.iter().cloned()),
    )?;
    let files = args
        .files
        .iter()
        .map(|p| ResultsFile::load(p).map(|f| (p.clone(), f)))
        .collect::<Result<Vec<_>, _>>()?;
    for (path, f) in &files {
        println!("{}: {}", path.display(), f.provenance());
    }
    let chart = chart(&files, args.kind)?;
    // Default: the first file's name with .png, in the current directory (not beside the
    // committed results).
    let out = args.out.unwrap_or_else(|| {
        let stem = args.files[0].file_stem().unwrap_or_default();
        PathBuf::from(stem).with_extension("png")
    });
    draw_to(&chart, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::draw::human_bytes;
    use super::*;
    use std::path::Path;

    fn committed(rel: &str) -> String {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../results")
            .join(rel)
            .display()
            .to_string()
    }

    fn out(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join(name)
    }

    /// Pixels of the PNG at `path` that are neither white nor grey (the series' colours).
    fn coloured_pixels(path: &Path) -> (u32, u32, usize) {
        let img = image::open(path).unwrap().to_rgb8();
        let coloured = img
            .pixels()
            .filter(|p| {
                let [r, g, b] = p.0;
                let (hi, lo) = (r.max(g).max(b), r.min(g).min(b));
                hi - lo > 60
            })
            .count();
        (img.width(), img.height(), coloured)
    }

    #[test]
    fn speedup_of_two_committed_grids_as_png_and_svg() {
        let png = out("rs.png");
        let files = [
            committed("overlap-reduce-scatter/nvidia-h200-x2-2026-11-27-a83d516.json"),
            committed("overlap-reduce-scatter/nvidia-h200-x4-2026-11-27-a83d516.json"),
        ];
        let mut args: Vec<String> = files.to_vec();
        args.extend(["--out".into(), png.display().to_string()]);
        assert_eq!(command(&args).unwrap(), png);
        let (w, h, coloured) = coloured_pixels(&png);
        assert_eq!((w, h), (1400, 800));
        // Two series of 13 points with lines: thousands of coloured pixels (a blank chart,
        // only axes and text, has none).
        assert!(coloured > 2000, "{coloured} coloured pixels");
        let svg = out("rs.svg");
        let mut args: Vec<String> = files.to_vec();
        args.extend(["--out".into(), svg.display().to_string()]);
        command(&args).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("16384x8192x7168"), "case labels missing");
        assert!(
            text.contains("nvidia-h200-x4-2026-11-27-a83d516"),
            "legend missing"
        );
    }

    #[test]
    fn bandwidth_of_a_committed_nccl_table() {
        let png = out("nccl.png");
        let args = vec![
            committed("nccl/nvidia-h200-x4-2026-11-27-40463e6.json"),
            "-o".into(),
            png.display().to_string(),
        ];
        command(&args).unwrap();
        let (_, _, coloured) = coloured_pixels(&png);
        assert!(coloured > 2000, "{coloured} coloured pixels");
    }

    #[test]
    fn bad_requests_are_refused_by_name() {
        let f = committed("nccl/nvidia-h200-x4-2026-11-27-40463e6.json");
        let e = command(&[f.clone(), "-o".into(), out("x.jpg").display().to_string()]).unwrap_err();
        assert!(
            format!("{e:#}").contains("must end in .png or .svg"),
            "{e:#}"
        );
        let e = command(&["no/such/file.json".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("no/such/file.json"), "{e:#}");
        // The tuner's rows have no bytes: nothing to draw as bandwidth.
        let tune = committed("tune/nvidia-h200-x4-2026-11-27-a83d516.json");
        let e = command(&[
            tune,
            "--kind".into(),
            "bandwidth".into(),
            "-o".into(),
            out("t.png").display().to_string(),
        ])
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("nothing to draw as Bandwidth"),
            "{e:#}"
        );
        assert!(command(&[]).is_err(), "no files");
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human_bytes(8.0), "8 B");
        assert_eq!(human_bytes(4096.0), "4 KiB");
        assert_eq!(human_bytes(1.5 * 1024.0 * 1024.0), "1.5 MiB");
        assert_eq!(human_bytes(1024.0 * 1024.0 * 1024.0), "1 GiB");
    }
}
