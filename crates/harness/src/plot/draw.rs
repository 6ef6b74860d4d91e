//! `weft plot`'s drawing: a [`Chart`] onto a PNG or SVG by plotters, text in the embedded font.

use super::chart::{Chart, Series};
use super::Kind;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

pub fn draw_to(chart: &Chart, out: &Path) -> anyhow::Result<()> {
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
                .x_label_area_size(280)
                .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), y_min..y_max.max(1.1))
                .map_err(fail)?;
            let cases = &chart.cases;
            ctx.configure_mesh()
                // One grid line per case; the case names are drawn below, rotated (the mesh
                // centres a rotated label on its tick, so half of it would lie over the plot).
                .x_labels(n.max(1))
                .x_label_formatter(&|_| String::new())
                .label_style(("sans-serif", 14))
                .y_desc("baseline ms / measured ms")
                .draw()
                .map_err(fail)?;
            let name_style = TextStyle::from(
                ("sans-serif", 13)
                    .into_font()
                    .transform(FontTransform::Rotate90),
            )
            .pos(Pos::new(HPos::Left, VPos::Center));
            for (i, case) in cases.iter().enumerate() {
                let (x, y) = ctx.backend_coord(&(i as f64, y_min));
                let name: String = case.chars().take(38).collect();
                root.draw_text(&name, &name_style, (x, y + 6))
                    .map_err(fail)?;
            }
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

pub fn human_bytes(b: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{} {}", (v * 10.0).round() / 10.0, UNITS[u])
}
