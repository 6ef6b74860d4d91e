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
    let names = series_names(files);
    let mut cases: Vec<String> = Vec::new();
    let mut series = match kind {
        Kind::Speedup => {
            title.push_str(": speedup over the baseline (baseline ms / measured ms)");
            speedup_series(files, &names, &mut cases)
        }
        Kind::Bandwidth => {
            title.push_str(": bandwidth against size (GB/s)");
            bandwidth_series(files, &names)
        }
    };
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
    if let Some(word) = strip_common_word(&mut cases) {
        title = format!("{title} [{word}]");
    }
    Ok(Chart {
        title,
        kind,
        series,
        cases,
    })
}

/// Each file's series name: its stem, or its path where two files share a stem.
fn series_names(files: &[(PathBuf, ResultsFile)]) -> Vec<String> {
    let stem = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned());
    let stems: Vec<Option<String>> = files.iter().map(|(p, _)| stem(p)).collect();
    let unique = (1..stems.len()).all(|i| !stems[..i].contains(&stems[i]));
    files
        .iter()
        .zip(stems)
        .map(|((p, _), s)| match (unique, s) {
            (true, Some(s)) => s,
            _ => p.display().to_string(),
        })
        .collect()
}

/// One series per file: each row's ratio at its case's x index (`cases` gathers the cases of
/// every file, first seen first).
fn speedup_series(
    files: &[(PathBuf, ResultsFile)],
    names: &[String],
    cases: &mut Vec<String>,
) -> Vec<Series> {
    let mut series = Vec::new();
    for ((_, file), name) in files.iter().zip(names) {
        let mut points = Vec::new();
        for row in &file.rows {
            let Some(ratio) = row.ratio.filter(|r| r.is_finite()) else {
                continue;
            };
            let label = row.label();
            let x = cases.iter().position(|c| *c == label).unwrap_or_else(|| {
                cases.push(label);
                cases.len() - 1
            });
            points.push((x as f64, ratio));
        }
        series.push(Series {
            label: name.clone(),
            points,
            dashed: false,
        });
    }
    series
}

/// Per file, one series per op (or method and SM count) of its rows' bandwidth against bytes,
/// and a dashed one of the baseline's where the rows carry it.
fn bandwidth_series(files: &[(PathBuf, ResultsFile)], names: &[String]) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for ((_, file), name) in files.iter().zip(names) {
        for row in &file.rows {
            let Some(bytes) = row.num("bytes").filter(|b| *b > 0.0) else {
                continue;
            };
            let key = series_key(row);
            let baseline = row.text("baseline").unwrap_or("baseline");
            let lines = [
                (first(row, &BANDWIDTH), format!("{name} {key}"), false),
                (
                    first(row, &BASELINE_BANDWIDTH),
                    format!("{name} {key}: {baseline}"),
                    true,
                ),
            ];
            for (value, label, dashed) in lines {
                let Some(v) = value.filter(|v| v.is_finite()) else {
                    continue;
                };
                match series.iter_mut().find(|s| s.label == label) {
                    Some(s) => s.points.push((bytes, v)),
                    None => series.push(Series {
                        label,
                        points: vec![(bytes, v)],
                        dashed,
                    }),
                }
            }
        }
    }
    series
}

/// Strips a first word every case shares (the op: "reduce_scatter 16x8192x4096") and returns
/// it, for the title.
fn strip_common_word(cases: &mut [String]) -> Option<String> {
    let word = cases.first()?.split_once(' ')?.0.to_string();
    let prefix = format!("{word} ");
    if !cases.iter().all(|c| c.starts_with(&prefix)) {
        return None;
    }
    for c in cases.iter_mut() {
        c.drain(..prefix.len());
    }
    Some(word)
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
