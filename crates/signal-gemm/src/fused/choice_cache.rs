//! Choices the fused methods measure at first use (a method, a communicator or worker CTA count)
//! and keep for later runs on the same machine: a plain-text file, one choice per line.
//!
//! ```text
//! weft-choices 1
//! <question> <m> <n> <k> <world> <sms> <method> <count> <ms> <device name…>
//! ```
//!
//! A question names what was chosen, e.g. `all_reduce.fused-inter.workers` (the count for that
//! method) or `all_gather.method` (the fastest method, with its count). A choice holds only for
//! the same shape, world size, SM count and device; a later measurement of the same question
//! replaces it.

use crate::plan::GemmShape;
use anyhow::{bail, ensure, Context};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One answer: a method name and its CTA count (0 where the method has none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub method: String,
    pub count: u32,
}

impl Candidate {
    pub fn new(method: &str, count: u32) -> Self {
        Self {
            method: method.to_string(),
            count,
        }
    }
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.count == 0 {
            write!(f, "{}", self.method)
        } else {
            write!(f, "{} with {} CTAs", self.method, self.count)
        }
    }
}

/// Where a choice holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChoiceKey {
    pub question: String,
    pub shape: GemmShape,
    pub world: u32,
    pub sms: u32,
    pub device: String,
}

/// A measured choice: the fastest candidate and its time (the slowest rank's median, ms).
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub key: ChoiceKey,
    pub answer: Candidate,
    pub ms: f64,
}

/// The choices of one machine, optionally backed by a file (written on every new choice).
#[derive(Debug, Default)]
pub struct ChoiceCache {
    path: Option<PathBuf>,
    choices: Vec<Choice>,
}

const HEADER: &str = "weft-choices 1";

impl ChoiceCache {
    /// A cache that is never written: every choice is measured again in a new process.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// The file `WEFT_CHOICES` names, else `weft-choices.txt` in the working directory.
    pub fn default_path() -> PathBuf {
        std::env::var_os("WEFT_CHOICES")
            .map_or_else(|| PathBuf::from("weft-choices.txt"), PathBuf::from)
    }

    /// The choices in `path` (none if it does not exist yet); new ones are written back there.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let choices = match std::fs::read_to_string(path) {
            Ok(text) => {
                Self::parse(&text).with_context(|| format!("choice file {}", path.display()))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading the choice file {}", path.display()))
            }
        };
        Ok(Self {
            path: Some(path.to_path_buf()),
            choices,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn choices(&self) -> &[Choice] {
        &self.choices
    }

    pub fn lookup(&self, key: &ChoiceKey) -> Option<&Choice> {
        self.choices.iter().find(|c| &c.key == key)
    }

    /// Keeps `choice` (replacing one for the same key) and rewrites the file, if any.
    pub fn record(&mut self, choice: Choice) -> anyhow::Result<()> {
        ensure!(
            !choice.key.question.contains(char::is_whitespace)
                && !choice.answer.method.contains(char::is_whitespace),
            "a choice's question and method are single words: {:?} / {:?}",
            choice.key.question,
            choice.answer.method
        );
        self.choices.retain(|c| c.key != choice.key);
        self.choices.push(choice);
        if let Some(path) = &self.path {
            std::fs::write(path, self.to_text())
                .with_context(|| format!("writing the choice file {}", path.display()))?;
        }
        Ok(())
    }

    pub fn to_text(&self) -> String {
        let mut s = format!("{HEADER}\n");
        for c in &self.choices {
            let k = &c.key;
            let _ = writeln!(
                s,
                "{} {} {} {} {} {} {} {} {:.6} {}",
                k.question,
                k.shape.m,
                k.shape.n,
                k.shape.k,
                k.world,
                k.sms,
                c.answer.method,
                c.answer.count,
                c.ms,
                k.device
            );
        }
        s
    }

    fn parse(text: &str) -> anyhow::Result<Vec<Choice>> {
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, h)) if h.trim() == HEADER => {}
            _ => bail!("not a weft choice file (its first line must be {HEADER:?})"),
        }
        let mut choices = Vec::new();
        for (i, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            ensure!(
                f.len() >= 10,
                "line {}: {} fields, a choice has 10 (the device name may have more)",
                i + 1,
                f.len()
            );
            let int = |j: usize, what: &str| -> anyhow::Result<u32> {
                f[j].parse().with_context(|| {
                    format!("line {}: {what} {:?} is not a whole number", i + 1, f[j])
                })
            };
            let ms: f64 = f[8]
                .parse()
                .with_context(|| format!("line {}: time {:?}", i + 1, f[8]))?;
            ensure!(
                ms > 0.0 && ms.is_finite(),
                "line {}: time {ms} is not positive",
                i + 1
            );
            choices.push(Choice {
                key: ChoiceKey {
                    question: f[0].to_string(),
                    shape: GemmShape::new(int(1, "m")?, int(2, "n")?, int(3, "k")?),
                    world: int(4, "world")?,
                    sms: int(5, "SM count")?,
                    device: f[9..].join(" "),
                },
                answer: Candidate::new(f[6], int(7, "count")?),
                ms,
            });
        }
        Ok(choices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(question: &str, count: u32) -> Choice {
        Choice {
            key: ChoiceKey {
                question: question.into(),
                shape: GemmShape::new(8192, 2048, 8192),
                world: 4,
                sms: 132,
                device: "NVIDIA H100 80GB HBM3".into(),
            },
            answer: Candidate::new("fused-inter", count),
            ms: 1.25,
        }
    }

    #[test]
    fn file_round_trip_and_replacement() {
        let dir = std::env::temp_dir().join(format!("weft-choices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.txt");
        let _ = std::fs::remove_file(&path);
        let mut cache = ChoiceCache::open(&path).unwrap();
        assert!(cache.choices().is_empty());
        cache
            .record(choice("all_gather.fused-inter.comm_ctas", 16))
            .unwrap();
        cache.record(choice("all_reduce.method", 8)).unwrap();
        cache
            .record(choice("all_gather.fused-inter.comm_ctas", 32))
            .unwrap();
        let again = ChoiceCache::open(&path).unwrap();
        assert_eq!(again.choices().len(), 2);
        let key = choice("all_gather.fused-inter.comm_ctas", 0).key;
        assert_eq!(again.lookup(&key).unwrap().answer.count, 32);
        let mut other = key.clone();
        other.world = 2;
        assert!(again.lookup(&other).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_files_are_named() {
        assert!(ChoiceCache::parse("hello")
            .unwrap_err()
            .to_string()
            .contains("not a weft choice file"));
        let short = format!("{HEADER}\nq 1 2 3 4 5 m 1 0.5\n");
        assert!(ChoiceCache::parse(&short)
            .unwrap_err()
            .to_string()
            .contains("9 fields"));
        let neg = format!("{HEADER}\nq 1 2 3 4 5 m 1 -0.5 dev\n");
        assert!(ChoiceCache::parse(&neg)
            .unwrap_err()
            .to_string()
            .contains("not positive"));
        let word = format!("{HEADER}\nq 1 x 3 4 5 m 1 0.5 dev\n");
        assert!(format!("{:#}", ChoiceCache::parse(&word).unwrap_err()).contains("n \"x\""));
        let mut cache = ChoiceCache::in_memory();
        assert!(cache.record(choice("two words", 1)).is_err());
    }
}
