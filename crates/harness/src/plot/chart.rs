//! What `weft plot` draws, from results files: the series and the x axis's case names.

use super::Kind;
use crate::results_file::{ResultsFile, Row};
use std::path::{Path, PathBuf};

/// One line of the chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

/// What is drawn: series over a categorical (speedup) or a log-size (bandwidth) x axis.
pub struct Chart {
    pub title: String,
    pub kind: Kind,
    pub series: Vec<Series>,
    /// Speedup: the case names, by x index.
    pub cases: Vec<String>,
}

/// Bandwidth columns, in the order they are preferred: bus bandwidth (nccl-tests), then plain.
pub const BANDWIDTH: [&str; 4] = ["busbw_gbs", "weft_busbw_gbs", "gbs", "weft_gbs"];
const BASELINE_BANDWIDTH: [&str; 2] = ["baseline_busbw_gbs", "baseline_gbs"];

pub fn chart(files: &[(PathBuf, ResultsFile)], kind: Option<Kind>) -> anyhow::Result<Chart> {
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
    // Series are named by file stem, or by path where two files share a stem.
    let stem = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned());
    let stems: Vec<Option<String>> = files.iter().map(|(p, _)| stem(p)).collect();
    let unique = (1..stems.len()).all(|i| !stems[..i].contains(&stems[i]));
    let name = |p: &Path| match (unique, stem(p)) {
        (true, Some(s)) => s,
        _ => p.display().to_string(),
    };
    let mut series = Vec::new();
    let mut cases: Vec<String> = Vec::new();
    match kind {
        Kind::Speedup => {
            title.push_str(": speedup over the baseline (baseline ms / measured ms)");
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
