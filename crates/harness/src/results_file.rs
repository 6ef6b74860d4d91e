//! The results files' shared schema, read back with serde (`weft plot`, and the test that every
//! committed file under `results/` follows it): an envelope naming the suite, device, commit,
//! date and command, and rows `{case, weft_ms, baseline, baseline_ms, ratio, …}` whose further
//! fields are the suite's own. A row's `ratio`, where it has one with both times, is
//! `baseline_ms / weft_ms`. (In the PyTorch peer files the measured op is async-TP: their rows
//! have `baseline_ms` and `ratio` = seq ÷ async-TP, and no `weft_ms`.)

use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

#[derive(Debug, Deserialize)]
pub struct ResultsFile {
    pub suite: String,
    /// The GPU's name (e.g. "NVIDIA H200").
    pub device: String,
    /// GPUs in the job (the PyTorch peer files written up to the a83d516 runs do not say).
    #[serde(default)]
    pub gpus: Option<u32>,
    #[serde(default)]
    pub driver: Option<String>,
    pub commit: String,
    pub date: String,
    pub command: String,
    /// `results` in the PyTorch peer files written up to the a83d516 runs.
    #[serde(alias = "results")]
    pub rows: Vec<Row>,
}

#[derive(Debug, Deserialize)]
pub struct Row {
    /// What the row measured (the tuner's, the interference bench's and the peer files' rows
    /// are keyed by their fields instead).
    #[serde(default)]
    pub case: Option<String>,
    #[serde(default)]
    pub weft_ms: Option<f64>,
    #[serde(default)]
    pub baseline_ms: Option<f64>,
    #[serde(default)]
    pub ratio: Option<f64>,
    /// The suite's own fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl Row {
    /// A numeric field (`null`, absent or not a number: None).
    pub fn num(&self, key: &str) -> Option<f64> {
        self.fields.get(key).and_then(Value::as_f64)
    }

    pub fn text(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    /// The row's name: `case`, else its shape or op fields joined.
    pub fn label(&self) -> String {
        if let Some(c) = &self.case {
            return c.clone();
        }
        let mut parts = Vec::new();
        if let Some(op) = self.text("op") {
            parts.push(op.to_string());
        }
        if let (Some(m), Some(n), Some(k)) = (self.num("m"), self.num("n"), self.num("k")) {
            parts.push(format!("{m}x{n}x{k}"));
        }
        if let Some(b) = self.text("b_layout") {
            parts.push(format!("B={b}"));
        }
        parts.join(" ")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResultsFileError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a results file: {source}")]
    Schema {
        path: String,
        source: serde_json::Error,
    },
    #[error(
        "{path}: row {row} ({label}): ratio {ratio} is not baseline_ms / weft_ms = {expected}"
    )]
    Ratio {
        path: String,
        row: usize,
        label: String,
        ratio: f64,
        expected: f64,
    },
    #[error("{path}: no rows")]
    Empty { path: String },
}

impl ResultsFile {
    /// Where the numbers come from, in one line.
    pub fn provenance(&self) -> String {
        let gpus = self.gpus.map_or_else(String::new, |g| format!(" x{g}"));
        let driver = self
            .driver
            .as_deref()
            .map_or_else(String::new, |d| format!(", driver {d}"));
        format!(
            "{}, {}{gpus}{driver}, commit {}, {}: {}",
            self.suite, self.device, self.commit, self.date, self.command
        )
    }

    /// `path` read and checked: the schema, at least one row, and every row's ratio.
    pub fn load(path: &Path) -> Result<Self, ResultsFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ResultsFileError::Read {
            path: shown.clone(),
            source,
        })?;
        let file: ResultsFile =
            serde_json::from_str(&text).map_err(|source| ResultsFileError::Schema {
                path: shown.clone(),
                source,
            })?;
        if file.rows.is_empty() {
            return Err(ResultsFileError::Empty { path: shown });
        }
        for (i, row) in file.rows.iter().enumerate() {
            if let (Some(w), Some(b), Some(r)) = (row.weft_ms, row.baseline_ms, row.ratio) {
                let expected = b / w;
                if w > 0.0 && (r - expected).abs() > 1e-6 * expected.abs().max(1.0) {
                    return Err(ResultsFileError::Ratio {
                        path: shown,
                        row: i,
                        label: row.label(),
                        ratio: r,
                        expected,
                    });
                }
            }
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn results_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results")
    }

    fn json_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                json_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "json") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_committed_results_file_follows_the_schema() {
        let mut files = Vec::new();
        json_files(&results_dir(), &mut files);
        assert!(
            files.len() > 100,
            "found only {} results files",
            files.len()
        );
        let failures: Vec<String> = files
            .iter()
            .filter_map(|f| ResultsFile::load(f).err().map(|e| e.to_string()))
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-results-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    const ENVELOPE: &str = r#""suite": "s", "device": "d", "commit": "c", "date": "2026-11-27", "command": "weft bench s""#;

    #[test]
    fn a_wrong_ratio_a_missing_field_and_no_rows_are_refused() {
        let good = write(
            "good.json",
            &format!(
                r#"{{{ENVELOPE}, "rows": [{{"case": "x", "weft_ms": 2.0, "baseline_ms": 3.0, "ratio": 1.5, "bytes": 8}}]}}"#
            ),
        );
        let file = ResultsFile::load(&good).unwrap();
        assert_eq!(file.rows[0].num("bytes"), Some(8.0));
        let wrong = write(
            "wrong.json",
            &format!(
                r#"{{{ENVELOPE}, "rows": [{{"case": "x", "weft_ms": 2.0, "baseline_ms": 3.0, "ratio": 0.667}}]}}"#
            ),
        );
        assert!(matches!(
            ResultsFile::load(&wrong),
            Err(ResultsFileError::Ratio { row: 0, .. })
        ));
        let no_commit = write(
            "no-commit.json",
            r#"{"suite": "s", "device": "d", "date": "x", "command": "y", "rows": [{"case": "x"}]}"#,
        );
        let e = ResultsFile::load(&no_commit).unwrap_err().to_string();
        assert!(e.contains("missing field `commit`"), "{e}");
        let empty = write("empty.json", &format!(r#"{{{ENVELOPE}, "rows": []}}"#));
        assert!(matches!(
            ResultsFile::load(&empty),
            Err(ResultsFileError::Empty { .. })
        ));
    }
}
