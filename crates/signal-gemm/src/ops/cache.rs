//! The choice cache: what `Auto` measured at first use, kept for later processes on the same
//! machine. One file per machine (host) in the per-user cache directory, JSON lines:
//!
//! ```text
//! {"weft_choices":2}
//! <crc32 of the JSON, 8 hex digits> {"key":{…},"measured_m":8192,"results":[{"method":"seq-cublas","ms":0.83},…]}
//! ```
//!
//! Trust: a line whose checksum, JSON or values are wrong is corrupt and dropped (named in
//! [`ChoiceCache::problems`]), so its choice is measured again; an entry of another machine or
//! weft version never matches a key (keys hold both), and stale-version entries are dropped on
//! the next write. Writes are atomic (a temporary file renamed over the old) and serialised
//! between processes by a lock file (bounded wait); each write merges into what is on disk, so
//! concurrent writers of different keys all keep theirs.

use super::key::{weft_version, ChoiceKey};
use super::method::Method;
use crate::error::GemmError;
use anyhow::{ensure, Context};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The environment variable naming the cache file (overrides the default place).
pub const CACHE_VAR: &str = "WEFT_CHOICES";
const HEADER: &str = r#"{"weft_choices":2}"#;
/// How long a write waits for another process's lock on the file.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// One candidate's measurement: the slowest rank's median ms, or why it could not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The measurements behind one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: ChoiceKey,
    /// The M the candidates were measured at (within the key's range).
    pub measured_m: u32,
    pub results: Vec<Outcome>,
}

impl Entry {
    /// Checks the values a file could hold wrongly (the checksum catches accidents, this catches
    /// well-formed nonsense): every method parses, every time is finite and positive, each result
    /// has a time or an error, and measured_m lies in the key's range.
    fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.key.covers(self.measured_m),
            "measured at M = {} outside its range ({}, {}]",
            self.measured_m,
            self.key.m_lo,
            self.key.m_hi
        );
        ensure!(!self.results.is_empty(), "no results");
        for r in &self.results {
            r.method.parse::<Method>()?;
            match (r.ms, &r.error) {
                (Some(ms), None) => ensure!(
                    ms.is_finite() && ms > 0.0,
                    "{}: time {ms} is not a positive number",
                    r.method
                ),
                (None, Some(_)) => {}
                _ => anyhow::bail!("{}: needs either a time or an error", r.method),
            }
        }
        Ok(())
    }

    fn to_line(&self) -> anyhow::Result<String> {
        let json = serde_json::to_string(self).context("encoding a choice")?;
        Ok(format!("{:08x} {json}", crc32fast::hash(json.as_bytes())))
    }

    fn from_line(line: &str) -> anyhow::Result<Self> {
        let (crc, json) = line.split_once(' ').context("no checksum")?;
        let crc =
            u32::from_str_radix(crc, 16).with_context(|| format!("checksum {crc:?} is not hex"))?;
        ensure!(
            crc == crc32fast::hash(json.as_bytes()),
            "checksum mismatch (the line was changed or cut)"
        );
        let entry: Entry = serde_json::from_str(json).context("bad JSON")?;
        entry.validate()?;
        Ok(entry)
    }
}

/// The cached choices of one machine, optionally backed by a file.
#[derive(Debug, Default)]
pub struct ChoiceCache {
    path: Option<PathBuf>,
    entries: Vec<Entry>,
    problems: Vec<String>,
}

impl ChoiceCache {
    /// A cache that is never written: every choice is measured again in a new process.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// `$WEFT_CHOICES` if set, else `choices-<host>.jsonl` in `$XDG_CACHE_HOME/weft` or
    /// `~/.cache/weft`.
    pub fn default_path() -> Result<PathBuf, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<PathBuf> {
            if let Some(p) = std::env::var_os(CACHE_VAR).filter(|p| !p.is_empty()) {
                return Ok(PathBuf::from(p));
            }
            let dir = std::env::var_os("XDG_CACHE_HOME")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .filter(|p| !p.is_empty())
                        .map(|h| PathBuf::from(h).join(".cache"))
                })
                .with_context(|| {
                    format!("no cache directory: set {CACHE_VAR}, XDG_CACHE_HOME or HOME")
                })?;
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            let host: String = host
                .trim()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let host = if host.is_empty() {
                "localhost".to_string()
            } else {
                host
            };
            Ok(dir.join("weft").join(format!("choices-{host}.jsonl")))
        })
    }

    /// The entries in `path` (none if it does not exist yet); corrupt lines are dropped and named
    /// in [`problems`](Self::problems). New entries are written back there.
    pub fn open(path: &Path) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let (entries, problems) = read_entries(path)?;
            Ok(Self {
                path: Some(path.to_path_buf()),
                entries,
                problems,
            })
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// What was wrong with the file when it was read (each dropped line and why).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    pub fn lookup(&self, key: &ChoiceKey) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.key == key)
    }

    /// Keeps `entry` (replacing the one of its key) and, for a file-backed cache, merges it into
    /// the file under its lock: the file is re-read, the entry replaces its key's, stale-version
    /// and corrupt lines are dropped, and the result is renamed over the file.
    pub fn record(&mut self, entry: Entry) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            entry
                .validate()
                .context("refusing to record an invalid choice")?;
            self.entries.retain(|e| e.key != entry.key);
            self.entries.push(entry.clone());
            let Some(path) = self.path.clone() else {
                return Ok(());
            };
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| {
                    format!("creating the choice cache directory {}", dir.display())
                })?;
            }
            let _lock = FileLock::acquire(&path)?;
            let (mut on_disk, _) = read_entries(&path)?;
            on_disk.retain(|e| e.key != entry.key && e.key.version == weft_version());
            on_disk.push(entry);
            write_atomically(&path, &on_disk)?;
            self.entries = on_disk;
            Ok(())
        })
    }
}

/// The valid entries of `path` and a note per dropped line.
fn read_entries(path: &Path) -> anyhow::Result<(Vec<Entry>, Vec<String>)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Ok((
                Vec::new(),
                vec![format!("{}: not UTF-8 text; ignored", path.display())],
            ))
        }
        Err(e) => {
            return Err(e).with_context(|| format!("reading the choice cache {}", path.display()))
        }
    };
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some(HEADER) {
        return Ok((
            Vec::new(),
            vec![format!(
                "{}: not a weft choice cache (first line is not {HEADER}); ignored",
                path.display()
            )],
        ));
    }
    let (mut entries, mut problems) = (Vec::new(), Vec::new());
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match Entry::from_line(line) {
            Ok(e) => {
                entries.retain(|x: &Entry| x.key != e.key);
                entries.push(e);
            }
            Err(e) => problems.push(format!("{} line {}: {e:#}; dropped", path.display(), i + 2)),
        }
    }
    Ok((entries, problems))
}

fn write_atomically(path: &Path, entries: &[Entry]) -> anyhow::Result<()> {
    let mut text = format!("{HEADER}\n");
    for e in entries {
        text.push_str(&e.to_line()?);
        text.push('\n');
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing the choice cache {}", path.display()))
}

/// An exclusive advisory lock on `<cache file>.lock`, released on drop.
struct FileLock(File);

impl FileLock {
    fn acquire(path: &Path) -> anyhow::Result<Self> {
        let lock_path = path.with_extension("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening the lock file {}", lock_path.display()))?;
        let start = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self(file)),
                Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                    "the choice cache lock {} was held by another process for over {} s",
                    lock_path.display(),
                    LOCK_WAIT.as_secs()
                ),
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", lock_path.display()))
                }
            }
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::candidates::OpKind;
    use crate::{GemmOptions, GemmShape};

    fn key(n: u32) -> ChoiceKey {
        ChoiceKey::new(
            OpKind::AllReduce,
            GemmShape::new(8192, n, 2048),
            &GemmOptions::default(),
            false,
            2,
            "test machine",
        )
    }

    fn entry(n: u32, ms: f64) -> Entry {
        Entry {
            key: key(n),
            measured_m: 8192,
            results: vec![
                Outcome {
                    method: "seq-cublas".into(),
                    ms: Some(ms),
                    error: None,
                },
                Outcome {
                    method: "distfuse:16".into(),
                    ms: None,
                    error: Some("refused on rank 1".into()),
                },
            ],
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trip_replacement_and_keying() {
        let dir = temp_dir("round-trip");
        let path = dir.join("c.jsonl");
        let mut c = ChoiceCache::open(&path).unwrap();
        assert!(c.entries().is_empty() && c.problems().is_empty());
        c.record(entry(8192, 1.0)).unwrap();
        c.record(entry(4096, 2.0)).unwrap();
        c.record(entry(8192, 3.0)).unwrap();
        let again = ChoiceCache::open(&path).unwrap();
        assert_eq!(again.entries().len(), 2);
        assert!(again.problems().is_empty(), "{:?}", again.problems());
        assert_eq!(again.lookup(&key(8192)).unwrap().results[0].ms, Some(3.0));
        let mut other = key(8192);
        other.world = 4;
        assert!(again.lookup(&other).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_lines_are_dropped_and_named() {
        let dir = temp_dir("corrupt");
        let path = dir.join("c.jsonl");
        let mut c = ChoiceCache::open(&path).unwrap();
        c.record(entry(8192, 1.0)).unwrap();
        c.record(entry(4096, 2.0)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // A changed digit (checksum mismatch), a cut line, valid JSON with a nonsense time (its
        // checksum recomputed, as a hand edit would), and a good line.
        let flipped = lines[1].replacen("1.0", "7.0", 1);
        let cut = &lines[2][..lines[2].len() / 2];
        let json = serde_json::to_string(&entry(2048, -5.0)).unwrap();
        let nonsense = format!("{:08x} {json}", crc32fast::hash(json.as_bytes()));
        let good = entry(1024, 4.0).to_line().unwrap();
        std::fs::write(
            &path,
            format!("{}\n{flipped}\n{cut}\n{nonsense}\n{good}\n", lines[0]),
        )
        .unwrap();
        let c = ChoiceCache::open(&path).unwrap();
        assert_eq!(c.entries().len(), 1);
        assert_eq!(c.entries()[0].key, key(1024));
        let p = c.problems().join("\n");
        assert_eq!(c.problems().len(), 3, "{p}");
        assert!(
            p.contains("line 2") && p.contains("checksum mismatch"),
            "{p}"
        );
        assert!(p.contains("line 3"), "{p}");
        assert!(
            p.contains("line 4") && p.contains("not a positive number"),
            "{p}"
        );
        // Not a cache at all: ignored, named, and rewritten on the next record.
        std::fs::write(&path, "hello\n").unwrap();
        let mut c = ChoiceCache::open(&path).unwrap();
        assert!(c.entries().is_empty() && c.problems()[0].contains("not a weft choice cache"));
        c.record(entry(8192, 1.0)).unwrap();
        assert_eq!(ChoiceCache::open(&path).unwrap().entries().len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stale_versions_never_match_and_are_dropped_on_write() {
        let dir = temp_dir("stale");
        let path = dir.join("c.jsonl");
        let mut old = entry(8192, 1.0);
        old.key.version = "weft-signal-gemm 0.0.1 kernels 00000000".into();
        std::fs::write(&path, format!("{HEADER}\n{}\n", old.to_line().unwrap())).unwrap();
        let mut c = ChoiceCache::open(&path).unwrap();
        assert_eq!(c.entries().len(), 1);
        assert!(
            c.lookup(&key(8192)).is_none(),
            "an entry of another weft version matched"
        );
        c.record(entry(4096, 2.0)).unwrap();
        let c = ChoiceCache::open(&path).unwrap();
        assert_eq!(c.entries().len(), 1);
        assert_eq!(c.entries()[0].key, key(4096));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn invalid_entries_are_not_recorded() {
        let mut c = ChoiceCache::in_memory();
        let mut e = entry(8192, 1.0);
        e.measured_m = 100;
        assert!(format!("{:#}", c.record(e).unwrap_err()).contains("outside its range"));
        let mut e = entry(8192, 1.0);
        e.results[0].method = "teleport".into();
        assert!(format!("{:#}", c.record(e).unwrap_err()).contains("unknown method"));
        assert!(c.entries().is_empty());
    }

    /// Writers in several threads and processes' worth of caches, each with its own keys, at
    /// once: every key survives (each write merges under the lock) and the file stays valid.
    #[test]
    fn concurrent_writers_keep_every_entry() {
        let dir = temp_dir("concurrent");
        let path = dir.join("c.jsonl");
        let writers: Vec<_> = (0..8u32)
            .map(|w| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut c = ChoiceCache::open(&path).unwrap();
                    for i in 0..10u32 {
                        c.record(entry(1024 + 16 * (w * 10 + i), 1.0 + f64::from(i)))
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let c = ChoiceCache::open(&path).unwrap();
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert_eq!(c.entries().len(), 80);
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_path_honours_the_variable() {
        // Read-only check of the rule (the variable itself is not changed: tests run in threads).
        if let Some(p) = std::env::var_os(CACHE_VAR).filter(|p| !p.is_empty()) {
            assert_eq!(ChoiceCache::default_path().unwrap(), PathBuf::from(p));
        } else if std::env::var_os("XDG_CACHE_HOME").is_none() && std::env::var_os("HOME").is_some()
        {
            let p = ChoiceCache::default_path().unwrap();
            assert!(
                p.to_string_lossy().contains(".cache/weft/choices-"),
                "{}",
                p.display()
            );
        }
    }
}
