//! The results files' shared schema, written and read with serde (every bench suite writes through
//! it; `weft plot`, and the test that every committed file under `results/` follows it, read it):
//! an envelope naming the suite, device, commit, date and command, and rows `{case, weft_ms,
//! baseline, baseline_ms, ratio, …}` whose further fields are the suite's own. A row's `ratio`, where it has one with both times, is
//! `baseline_ms / weft_ms`. (In the PyTorch peer files the measured op is async-TP: their rows
//! have `baseline_ms` and `ratio` = seq ÷ async-TP, and no `weft_ms`.)

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::Path;

#[derive(Debug, Deserialize, Serialize)]
pub struct ResultsFile {
    pub suite: String,
    /// The GPU's name (e.g. "NVIDIA H200").
    pub device: String,
    /// GPUs in the job (the PyTorch peer files written up to the a83d516 runs do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    pub commit: String,
    pub date: String,
    pub command: String,
    /// `results` in the PyTorch peer files written up to the a83d516 runs.
    #[serde(alias = "results")]
    pub rows: Vec<Row>,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct Row {
    /// What the row measured (the tuner's, the interference bench's and the peer files' rows
    /// are keyed by their fields instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    #[error("{path}: row {row} does not follow the rows' schema: {source}")]
    Row {
        path: String,
        row: usize,
        source: serde_json::Error,
    },
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

    /// A file of the suite's `rows` (JSON objects) under `envelope` (its rows ignored), each row
    /// read through the schema and the whole checked as [`ResultsFile::load`] checks a file;
    /// `path` names it in errors.
    pub fn with_rows(
        envelope: ResultsFile,
        rows: Vec<serde_json::Value>,
        path: &str,
    ) -> Result<Self, ResultsFileError> {
        let rows = rows
            .into_iter()
            .enumerate()
            .map(|(row, mut v)| {
                whole_numbers_as_integers(&mut v);
                serde_json::from_value(v).map_err(|source| ResultsFileError::Row {
                    path: path.to_string(),
                    row,
                    source,
                })
            })
            .collect::<Result<Vec<Row>, _>>()?;
        let file = ResultsFile { rows, ..envelope };
        file.check(path)?;
        Ok(file)
    }

    /// The file's text (the schema's fields first in each row, then the suite's in its order):
    /// the envelope pretty-printed, each row on one line (so that a diff of two
    /// runs shows rows).
    pub fn render(&self) -> Result<String, serde_json::Error> {
        let serde_json::Value::Object(fields) = serde_json::to_value(self)? else {
            unreachable!("a struct serializes to an object");
        };
        let mut out = String::from("{\n");
        let last = fields.len().saturating_sub(1);
        for (i, (key, value)) in fields.iter().enumerate() {
            out.push_str(&format!("  {}: ", serde_json::to_string(key)?));
            match value {
                serde_json::Value::Array(rows) if key == "rows" && !rows.is_empty() => {
                    out.push_str("[\n");
                    for (j, row) in rows.iter().enumerate() {
                        let sep = if j + 1 < rows.len() { "," } else { "" };
                        out.push_str(&format!("    {}{sep}\n", serde_json::to_string(row)?));
                    }
                    out.push_str("  ]");
                }
                other => out.push_str(&serde_json::to_string(other)?),
            }
            out.push_str(if i < last { ",\n" } else { "\n" });
        }
        out.push_str("}\n");
        Ok(out)
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
        file.check(&shown)?;
        Ok(file)
    }

    /// At least one row, and every row's ratio is baseline_ms / weft_ms where it has all three.
    fn check(&self, path: &str) -> Result<(), ResultsFileError> {
        let shown = path.to_string();
        let file = self;
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
        Ok(())
    }
}

/// Whole numbers a suite gave as floats (shapes, CTA counts) written as integers, as they were
/// measured: `4096`, not `4096.0`.
fn whole_numbers_as_integers(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Number(n) => {
            if let Some(x) = n
                .as_f64()
                .filter(|x| n.is_f64() && x.fract() == 0.0 && x.abs() < 9.0e15)
            {
                *v = Value::from(x as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Json;
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

    fn envelope() -> ResultsFile {
        ResultsFile {
            suite: "s".into(),
            device: "d".into(),
            gpus: Some(2),
            driver: Some("580".into()),
            commit: "c".into(),
            date: "2026-11-28".into(),
            command: "weft bench s".into(),
            rows: Vec::new(),
        }
    }

    #[test]
    fn what_the_suites_write_reads_back_one_row_per_line() {
        let rows = vec![
            crate::json::obj([
                ("case", Json::from("a \"quoted\" case")),
                ("m", Json::from(4096.0)),
                ("weft_ms", Json::from(2.0)),
                ("baseline_ms", Json::from(3.0)),
                ("ratio", Json::from(1.5)),
                (
                    "nested",
                    Json::Array(vec![crate::json::obj([("x", Json::Null)])]),
                ),
            ]),
            crate::json::obj([("op", Json::from("all_reduce")), ("weft_ms", Json::Null)]),
        ];
        let file = ResultsFile::with_rows(envelope(), rows, "mem").unwrap();
        let text = file.render().unwrap();
        // The suite's own fields keep their order after the schema's; absent options are left out.
        assert!(
            text.contains(
                "\n    {\"case\":\"a \\\"quoted\\\" case\",\"weft_ms\":2.0,\"baseline_ms\":3.0,\"ratio\":1.5,\"m\":4096,\"nested\":[{\"x\":null}]},\n    {\"op\":\"all_reduce\"}\n  ]\n}\n"
            ),
            "{text}"
        );
        assert!(text.starts_with("{\n  \"suite\": \"s\",\n  \"device\": \"d\",\n  \"gpus\": 2,"));
        let path = write("round-trip.json", &text);
        let back = ResultsFile::load(&path).unwrap();
        assert_eq!(back.rows.len(), 2);
        assert_eq!(back.rows[0].num("m"), Some(4096.0));
        assert_eq!(back.rows[1].label(), "all_reduce");
        assert_eq!(back.render().unwrap(), text);
    }

    #[test]
    fn a_suite_row_off_the_schema_is_refused_when_written() {
        let bad = vec![crate::json::obj([("weft_ms", Json::from("fast"))])];
        assert!(matches!(
            ResultsFile::with_rows(envelope(), bad, "mem"),
            Err(ResultsFileError::Row { row: 0, .. })
        ));
        let wrong_ratio = vec![crate::json::obj([
            ("weft_ms", Json::from(2.0)),
            ("baseline_ms", Json::from(3.0)),
            ("ratio", Json::from(2.0)),
        ])];
        assert!(matches!(
            ResultsFile::with_rows(envelope(), wrong_ratio, "mem"),
            Err(ResultsFileError::Ratio { row: 0, .. })
        ));
        assert!(matches!(
            ResultsFile::with_rows(envelope(), Vec::new(), "mem"),
            Err(ResultsFileError::Empty { .. })
        ));
    }

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
