//! Results files: `{"suite", "device", "gpus", "driver", "commit", "date", "command", "rows"}`
//! (docs/DESIGN.md §5, the schema in results_file.rs), shared by every timing suite so runs can be
//! compared and plotted.

use crate::json::Json;
use crate::results_file::{ResultsFile, ResultsFileError};

/// Where and how a timing run was made.
pub struct RunMeta {
    pub suite: String,
    pub device: String,
    pub gpus: usize,
    pub driver: String,
    pub commit: String,
    pub date: String,
    pub command: String,
}

impl RunMeta {
    /// The results file of a run's `rows` (each read through the rows' schema; `path` names the
    /// file in errors).
    pub fn results_file(
        &self,
        rows: Vec<Json>,
        path: &str,
    ) -> Result<ResultsFile, ResultsFileError> {
        let envelope = ResultsFile {
            suite: self.suite.clone(),
            device: self.device.clone(),
            gpus: Some(self.gpus as u32),
            driver: Some(self.driver.clone()),
            commit: self.commit.clone(),
            date: self.date.clone(),
            command: self.command.clone(),
            rows: Vec::new(),
        };
        ResultsFile::with_rows(envelope, rows, path)
    }
}

/// Today's UTC date as YYYY-MM-DD.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil_date((secs / 86_400) as i64)
}

/// Days since 1970-01-01 → "YYYY-MM-DD" (Howard Hinnant's civil_from_days).
fn civil_date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// A plain-text table, right-aligned columns (printed by rank 0), also writable as CSV.
pub struct Table {
    pub headers: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].len())
                    .chain([self.headers[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| {
            cells
                .iter()
                .zip(&widths)
                .map(|(s, w)| format!("{s:>w$}"))
                .collect::<Vec<_>>()
                .join("  ")
        };
        let mut out = line(self.headers.clone());
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
            out.push('\n');
        }
        out
    }

    /// The header line of a table printed row by row (each column at least as wide as its
    /// header and 9 characters, so rows printed before the widest cell is known line up mostly).
    pub fn render_header(&self) -> String {
        let cells: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        self.render_row(&cells)
    }

    /// One row at the widths of [`render_header`](Self::render_header).
    pub fn render_row(&self, cells: &[String]) -> String {
        cells
            .iter()
            .zip(&self.headers)
            .map(|(c, h)| format!("{c:>w$}", w = h.len().max(9)))
            .collect::<Vec<_>>()
            .join("  ")
    }

    /// RFC 4180 CSV (the `csv` crate): cells holding commas, quotes or newlines are quoted.
    pub fn csv(&self) -> anyhow::Result<String> {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record(&self.headers)?;
        for r in &self.rows {
            w.write_record(r)?;
        }
        Ok(String::from_utf8(
            w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_778), "2026-11-21");
    }

    #[test]
    fn table_aligns_columns() {
        let t = Table {
            headers: vec!["op", "ms"],
            rows: vec![vec!["all_reduce".into(), "1.5".into()]],
        };
        assert_eq!(t.render(), "        op   ms\nall_reduce  1.5\n");
        assert_eq!(t.csv().unwrap(), "op,ms\nall_reduce,1.5\n");
    }

    #[test]
    fn csv_quotes_cells_with_commas_and_quotes() {
        let t = Table {
            headers: vec!["case", "groups"],
            rows: vec![vec!["signal \"a\"".into(), "[1,10]".into()]],
        };
        let text = t.csv().unwrap();
        assert_eq!(text, "case,groups\n\"signal \"\"a\"\"\",\"[1,10]\"\n");
        // Read back with the same crate: two columns, the cells as written.
        let mut r = csv::Reader::from_reader(text.as_bytes());
        let row = r.records().next().unwrap().unwrap();
        assert_eq!((row.len(), &row[0], &row[1]), (2, "signal \"a\"", "[1,10]"));
    }
}
