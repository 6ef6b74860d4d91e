//! `weft plot RESULTS.json… [--out PATH.png|.svg] [--kind speedup|bandwidth]`: a chart of results
//! files (schema: results_file.rs). Speedup against shape: each row's `ratio` (baseline ÷ weft)
//! by case, one series per file, so the same suite from two machines or commits overlays.
//! Bandwidth against size: rows with `bytes`, GB/s (bus bandwidth where the suite gives it)
//! against bytes on a log axis, one series per file and op (or method and SM count), the
//! baseline's dashed where the rows carry it. Drawn by plotters; text in DejaVu Sans, embedded
//! (assets/, with its licence), so no system font is needed.

use crate::results_file::{ResultsFile, Row};
use clap::{Parser, ValueEnum};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// `ratio` (baseline ÷ weft) by case.
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

/// One line of the chart.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

/// What is drawn: series over a categorical (speedup) or a log-size (bandwidth) x axis.
struct Chart {
    title: String,
    kind: Kind,
    series: Vec<Series>,
    /// Speedup: the case names, by x index.
    cases: Vec<String>,
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
    let out = args
        .out
        .unwrap_or_else(|| args.files[0].with_extension("png"));
    draw_to(&chart, &out)?;
    Ok(out)
}

/// Bandwidth columns, in the order they are preferred: bus bandwidth (nccl-tests), then plain.
const BANDWIDTH: [&str; 4] = ["busbw_gbs", "weft_busbw_gbs", "gbs", "weft_gbs"];
const BASELINE_BANDWIDTH: [&str; 2] = ["baseline_busbw_gbs", "baseline_gbs"];

fn chart(files: &[(PathBuf, ResultsFile)], kind: Option<Kind>) -> anyhow::Result<Chart> {
    let has_bytes = files
        .iter()
        .all(|(_, f)| f.rows.iter().any(|r| r.num("bytes").is_some()));
    let kind = kind.unwrap_or(if has_bytes {
        Kind::Bandwidth
    } else {
        Kind::Speedup
    });
    let suites: Vec<&str> = files.iter().map(|(_, f)| f.suite.as_str()).collect();
    let mut title = suites[0].to_string();
    if suites.iter().any(|s| *s != suites[0]) {
        title = suites.join(", ");
    }
    let name = |p: &Path| {
        p.file_stem().map_or_else(
            || p.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
    };
    let mut series = Vec::new();
    let mut cases: Vec<String> = Vec::new();
    match kind {
        Kind::Speedup => {
            title.push_str(": speedup over the baseline (baseline ms / weft ms)");
            for (path, file) in files {
                let mut points = Vec::new();
                for row in &file.rows {
                    let Some(ratio) = row.ratio.filter(|r| r.is_finite()) else {
                        continue;
                    };
                    let label = row.label();
                    let x = match cases.iter().position(|c| *c == label) {
                        Some(i) => i,
                        None => {
                            cases.push(label);
                            cases.len() - 1
                        }
                    };
                    points.push((x as f64, ratio));
                }
                series.push(Series {
                    label: name(path),
                    points,
                    dashed: false,
                });
            }
        }
        Kind::Bandwidth => {
            title.push_str(": bandwidth against size (GB/s)");
            for (path, file) in files {
                let mut keyed: Vec<Series> = Vec::new();
                for row in &file.rows {
                    let Some(bytes) = row.num("bytes").filter(|b| *b > 0.0) else {
                        continue;
                    };
                    let key = series_key(row);
                    let lines = [
                        (
                            first(row, &BANDWIDTH),
                            format!("{} {key}", name(path)),
                            false,
                        ),
                        (
                            first(row, &BASELINE_BANDWIDTH),
                            format!(
                                "{} {key}: {}",
                                name(path),
                                row.text("baseline").unwrap_or("baseline")
                            ),
                            true,
                        ),
                    ];
                    for (value, label, dashed) in lines {
                        let Some(v) = value.filter(|v| v.is_finite()) else {
                            continue;
                        };
                        match keyed.iter_mut().find(|s| s.label == label) {
                            Some(s) => s.points.push((bytes, v)),
                            None => keyed.push(Series {
                                label,
                                points: vec![(bytes, v)],
                                dashed,
                            }),
                        }
                    }
                }
                series.extend(keyed);
            }
        }
    }
    series.retain(|s| !s.points.is_empty());
    anyhow::ensure!(
        !series.is_empty(),
        "nothing to draw as {kind:?}: no row of {} has {}",
        files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        match kind {
            Kind::Speedup => "a ratio".to_string(),
            Kind::Bandwidth => format!("bytes and one of {}", BANDWIDTH.join(", ")),
        }
    );
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    // A first word every case shares (the op: "reduce_scatter 16x8192x4096") goes to the title.
    if let Some(word) = cases
        .first()
        .and_then(|c| c.split_once(' '))
        .map(|w| w.0.to_string())
    {
        let prefix = format!("{word} ");
        if cases.iter().all(|c| c.starts_with(&prefix)) {
            for c in &mut cases {
                c.drain(..prefix.len());
            }
            title = format!("{title} [{word}]");
        }
    }
    Ok(Chart {
        title,
        kind,
        series,
        cases,
    })
}

fn first(row: &Row, keys: &[&str]) -> Option<f64> {
    keys.iter().find_map(|k| row.num(k))
}

/// A bandwidth row's series within its file: op, else method and SM count.
fn series_key(row: &Row) -> String {
    if let Some(op) = row.text("op") {
        return op.to_string();
    }
    let method = row.text("method").unwrap_or("weft");
    match row.num("sms") {
        Some(sms) => format!("{method} {sms} SMs"),
        None => method.to_string(),
    }
}

fn draw_to(chart: &Chart, out: &Path) -> anyhow::Result<()> {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The embedded font parses (checked by the plot tests).
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
    let size = (1400u32, 800u32);
    match out.extension().and_then(|e| e.to_str()) {
        Some("png") => {
            let root = BitMapBackend::new(out, size).into_drawing_area();
            draw(chart, &root)?;
            root.present()
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))
        }
        Some("svg") => {
            let root = SVGBackend::new(out, size).into_drawing_area();
            draw(chart, &root)?;
            root.present()
                .map_err(|e| anyhow::anyhow!("writing {}: {e}", out.display()))
        }
        _ => anyhow::bail!("{}: the output must end in .png or .svg", out.display()),
    }
}

fn draw<DB: DrawingBackend>(chart: &Chart, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing the chart: {e}");
    root.fill(&WHITE).map_err(fail)?;
    let ys = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1));
    let y_max = ys.fold(0.0f64, f64::max) * 1.1;
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&chart.title, ("sans-serif", 24))
        .margin(16)
        .y_label_area_size(70);
    match chart.kind {
        Kind::Speedup => {
            let n = chart.cases.len();
            let y_min = chart
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
                .fold(1.0f64, f64::min)
                .min(1.0)
                * 0.9;
            let mut ctx = builder
                .x_label_area_size(230)
                .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), y_min..y_max.max(1.1))
                .map_err(fail)?;
            let cases = &chart.cases;
            ctx.configure_mesh()
                .x_labels(n.min(60))
                .x_label_formatter(&|x| {
                    let i = x.round();
                    if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < cases.len() {
                        cases[i as usize].chars().take(40).collect()
                    } else {
                        String::new()
                    }
                })
                // After label_style, which sets both axes' style.
                .label_style(("sans-serif", 14))
                .x_label_style(
                    ("sans-serif", 13)
                        .into_font()
                        .transform(FontTransform::Rotate90),
                )
                .y_desc("baseline ms / weft ms")
                .draw()
                .map_err(fail)?;
            ctx.draw_series(LineSeries::new(
                [(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
                BLACK.mix(0.5),
            ))
            .map_err(fail)?;
            draw_series(&mut ctx, &chart.series)?;
        }
        Kind::Bandwidth => {
            let xs = chart
                .series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0));
            let (lo, hi) = xs.fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
            let mut ctx = builder
                .x_label_area_size(60)
                .build_cartesian_2d((lo..hi * 1.5).log_scale().base(2.0), 0.0..y_max.max(1.0))
                .map_err(fail)?;
            ctx.configure_mesh()
                .x_desc("bytes")
                .y_desc("GB/s")
                .x_label_formatter(&|b| human_bytes(*b))
                .label_style(("sans-serif", 14))
                .draw()
                .map_err(fail)?;
            draw_series(&mut ctx, &chart.series)?;
        }
    }
    Ok(())
}

/// The series with markers and a legend (baselines dashed).
fn draw_series<'a, DB: DrawingBackend + 'a, X, Y>(
    ctx: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    series: &[Series],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("drawing the chart: {e}");
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = color.stroke_width(2);
        let drawn = if s.dashed {
            ctx.draw_series(DashedLineSeries::new(s.points.iter().copied(), 6, 4, style))
                .map_err(fail)?
        } else {
            ctx.draw_series(LineSeries::new(s.points.iter().copied(), style))
                .map_err(fail)?
        };
        drawn
            .label(&s.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(fail)?;
    }
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(fail)?;
    Ok(())
}

fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{} {}", (v * 10.0).round() / 10.0, UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

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
