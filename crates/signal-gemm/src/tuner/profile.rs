//! What the tuner knows about a machine: a plain-text tuning file `weft tune` writes and
//! [`TuningProfile::load`] reads. One record per line, fields separated by spaces:
//!
//! ```text
//! weft-tuning 1 <world> <sms> <device name…>
//! comm <op> <max_ctas|default> <bytes> <ms>      one point of a collective's curve
//! gemm <m> <n> <k> <sm_margin> <tile_n> <ms> <waves>  weft's GEMM alone
//! cublas <m> <n> <k> <ms>                        cuBLAS alone
//! restore <op> <ms_per_mib>                      the restore kernel per MiB of output
//! contention <op> <sm_margin> <factor>           NCCL's slowdown beside the GEMM (fitted)
//! ```

use crate::error::GemmError;
use crate::plan::GemmShape;
use anyhow::{bail, ensure, Context};
use std::fmt::Write as _;
use std::path::Path;

/// The collective after the GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    AllReduce,
    ReduceScatter,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
        }
    }

    pub fn parse(s: &str) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            match s {
                "all_reduce" => Ok(Op::AllReduce),
                "reduce_scatter" => Ok(Op::ReduceScatter),
                _ => bail!("unknown collective {s:?} (all_reduce, reduce_scatter)"),
            }
        })
    }
}

/// A collective's time against its send size, NCCL limited to `max_ctas` CTAs (None: NCCL's
/// default), sizes increasing.
#[derive(Clone, Debug, PartialEq)]
pub struct CommCurve {
    pub op: Op,
    pub max_ctas: Option<u32>,
    /// (send bytes, ms)
    pub points: Vec<(u64, f64)>,
}

impl CommCurve {
    /// The time for `bytes`: linear between the two nearest samples in log(bytes) of the
    /// bandwidth; below the first sample its time, above the last its bandwidth.
    pub fn ms(&self, bytes: u64) -> f64 {
        let p = &self.points;
        if bytes == 0 {
            return 0.0;
        }
        if bytes <= p[0].0 {
            return p[0].1;
        }
        let last = p[p.len() - 1];
        if bytes >= last.0 {
            return last.1 * bytes as f64 / last.0 as f64;
        }
        let i = p.partition_point(|&(b, _)| b <= bytes); // p[i-1].0 <= bytes < p[i].0
        let (b0, t0) = p[i - 1];
        let (b1, t1) = p[i];
        let (bw0, bw1) = (b0 as f64 / t0, b1 as f64 / t1);
        let f = ((bytes as f64).ln() - (b0 as f64).ln()) / ((b1 as f64).ln() - (b0 as f64).ln());
        bytes as f64 / (bw0 + f * (bw1 - bw0))
    }
}

/// weft's GEMM alone on the SMs a margin leaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmSample {
    pub shape: GemmShape,
    pub sm_margin: u32,
    pub tile_n: u32,
    pub ms: f64,
    pub waves: u32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TuningProfile {
    pub device: String,
    pub world: u32,
    pub sms: u32,
    pub comm: Vec<CommCurve>,
    pub gemm: Vec<GemmSample>,
    /// cuBLAS alone: (shape, ms).
    pub cublas: Vec<(GemmShape, f64)>,
    /// The restore: (op, ms per MiB of output).
    pub restore: Vec<(Op, f64)>,
    /// NCCL's time multiplier while the GEMM shares the GPU: (op, sm_margin = NCCL's CTAs,
    /// factor), fitted by `weft tune` to measured overlaps (1 when absent).
    pub contention: Vec<(Op, u32, f64)>,
}

impl TuningProfile {
    /// Refuses a profile measured on another machine shape than this job's.
    pub fn check_machine(&self, sms: u32, world: u32) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            ensure!(
                self.sms == sms && self.world == world,
                "the tuning profile was measured on {} ranks of {} SMs ({}), this job has {world} ranks of {sms} SMs: run `weft tune` here",
                self.world,
                self.sms,
                self.device
            );
            Ok(())
        })
    }

    /// The curve of `op` with NCCL limited to `max_ctas` (None: its default).
    pub fn curve(&self, op: Op, max_ctas: Option<u32>) -> Result<&CommCurve, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<&CommCurve> {
            self.comm
                .iter()
                .find(|c| c.op == op && c.max_ctas == max_ctas)
                .with_context(|| {
                    format!(
                        "the tuning profile has no {} curve for max_ctas {max_ctas:?}",
                        op.name()
                    )
                })
        })
    }

    /// The SM margins profiled for the GEMM (each also a curve's CTA limit).
    pub fn margins(&self) -> Vec<u32> {
        let mut m: Vec<u32> = self.gemm.iter().map(|g| g.sm_margin).collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// One wave of weft's GEMM for `shape` (tiles 128 × `tile_n`) at `sm_margin`, in ms. A
    /// profiled shape's own time ÷ its waves; otherwise the nearest profiled shape with that
    /// margin and tile width (distance in log m, log n, log k), its wave time scaled by k (a wave
    /// computes whole tiles: time ∝ its K loop).
    pub fn gemm_wave_ms(
        &self,
        shape: GemmShape,
        sm_margin: u32,
        tile_n: u32,
    ) -> Result<f64, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<f64> {
            let same = self
                .gemm
                .iter()
                .filter(|g| g.sm_margin == sm_margin && g.tile_n == tile_n);
            let near = nearest(same.map(|g| (g.shape, g)), shape).with_context(|| {
                format!(
                    "the tuning profile has no GEMM with 128 x {tile_n} tiles at sm_margin {sm_margin}"
                )
            })?;
            Ok(near.ms / f64::from(near.waves) * f64::from(shape.k) / f64::from(near.shape.k))
        })
    }

    pub fn contention(&self, op: Op, sm_margin: u32) -> f64 {
        self.contention
            .iter()
            .find(|c| c.0 == op && c.1 == sm_margin)
            .map_or(1.0, |c| c.2)
    }

    /// cuBLAS alone for `shape`: profiled, or the nearest profiled shape scaled by FLOPs.
    pub fn cublas_ms(&self, shape: GemmShape) -> Result<f64, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<f64> {
            let (s, ms) = nearest(self.cublas.iter().map(|(s, ms)| (*s, (*s, *ms))), shape)
                .context("the tuning profile has no cuBLAS times")?;
            Ok(ms * flops(shape) / flops(s))
        })
    }

    pub fn restore_ms_per_mib(&self, op: Op) -> Result<f64, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<f64> {
            self.restore
                .iter()
                .find(|r| r.0 == op)
                .map(|r| r.1)
                .with_context(|| {
                    format!("the tuning profile has no restore time for {}", op.name())
                })
        })
    }

    pub fn to_text(&self) -> String {
        let mut s = format!(
            "weft-tuning 1 {} {} {}\n",
            self.world, self.sms, self.device
        );
        for c in &self.comm {
            let ctas = c.max_ctas.map_or("default".to_string(), |n| n.to_string());
            for (b, ms) in &c.points {
                let _ = writeln!(s, "comm {} {ctas} {b} {ms:.6}", c.op.name());
            }
        }
        for g in &self.gemm {
            let GemmShape { m, n, k } = g.shape;
            let _ = writeln!(
                s,
                "gemm {m} {n} {k} {} {} {:.6} {}",
                g.sm_margin, g.tile_n, g.ms, g.waves
            );
        }
        for (GemmShape { m, n, k }, ms) in &self.cublas {
            let _ = writeln!(s, "cublas {m} {n} {k} {ms:.6}");
        }
        for (op, ms) in &self.restore {
            let _ = writeln!(s, "restore {} {ms:.6}", op.name());
        }
        for (op, margin, f) in &self.contention {
            let _ = writeln!(s, "contention {} {margin} {f:.6}", op.name());
        }
        s
    }

    pub fn parse(text: &str) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let mut lines = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty());
            let (_, head) = lines.next().context("empty tuning file")?;
            let h: Vec<&str> = head.splitn(5, ' ').collect();
            ensure!(
                h.len() >= 4 && h[0] == "weft-tuning" && h[1] == "1",
                "not a weft tuning file (version 1): first line {head:?}"
            );
            let mut p = TuningProfile {
                world: h[2].parse().context("world size")?,
                sms: h[3].parse().context("SM count")?,
                device: h.get(4).unwrap_or(&"").to_string(),
                ..Default::default()
            };
            for (i, line) in lines {
                let f: Vec<&str> = line.split_whitespace().collect();
                let num = |j: usize| -> anyhow::Result<f64> {
                    f.get(j)
                        .with_context(|| format!("line {}: too few fields", i + 1))?
                        .parse::<f64>()
                        .with_context(|| format!("line {}: field {j}", i + 1))
                };
                let shape = || -> anyhow::Result<GemmShape> {
                    Ok(GemmShape::new(
                        num(1)? as u32,
                        num(2)? as u32,
                        num(3)? as u32,
                    ))
                };
                match f[0] {
                    "comm" => {
                        let op = Op::parse(f.get(1).copied().unwrap_or(""))?;
                        let ctas = match f.get(2).copied() {
                            Some("default") => None,
                            Some(n) => Some(
                                n.parse()
                                    .with_context(|| format!("line {}: max_ctas", i + 1))?,
                            ),
                            None => bail!("line {}: too few fields", i + 1),
                        };
                        let point = (num(3)? as u64, num(4)?);
                        match p.comm.iter_mut().find(|c| c.op == op && c.max_ctas == ctas) {
                            Some(c) => c.points.push(point),
                            None => p.comm.push(CommCurve {
                                op,
                                max_ctas: ctas,
                                points: vec![point],
                            }),
                        }
                    }
                    "gemm" => p.gemm.push(GemmSample {
                        shape: shape()?,
                        sm_margin: num(4)? as u32,
                        tile_n: num(5)? as u32,
                        ms: num(6)?,
                        waves: num(7)? as u32,
                    }),
                    "cublas" => p.cublas.push((shape()?, num(4)?)),
                    "restore" => p
                        .restore
                        .push((Op::parse(f.get(1).copied().unwrap_or(""))?, num(2)?)),
                    "contention" => p.contention.push((
                        Op::parse(f.get(1).copied().unwrap_or(""))?,
                        num(2)? as u32,
                        num(3)?,
                    )),
                    other => bail!("line {}: unknown record {other:?}", i + 1),
                }
            }
            let positive = |x: f64| x > 0.0 && x.is_finite();
            ensure!(
                p.world >= 1 && p.sms >= 1,
                "world size {} and SM count {} must be at least 1",
                p.world,
                p.sms
            );
            for c in &mut p.comm {
                c.points.sort_by_key(|x| x.0);
                ensure!(
                    c.points.iter().all(|x| x.0 > 0 && positive(x.1)),
                    "{} curve: a size or time that is not positive",
                    c.op.name()
                );
            }
            for g in &p.gemm {
                ensure!(
                    positive(g.ms) && g.waves >= 1 && g.tile_n > 0,
                    "gemm record for {}: time, waves and tile width must be positive",
                    g.shape
                );
            }
            ensure!(
                p.cublas.iter().all(|c| positive(c.1)),
                "a cublas record with a time that is not positive"
            );
            ensure!(
                p.restore.iter().all(|r| r.1 >= 0.0 && r.1.is_finite()),
                "a restore record with a negative time"
            );
            ensure!(
                p.contention.iter().all(|c| positive(c.2)),
                "a contention factor that is not positive"
            );
            Ok(p)
        })
    }

    pub fn load(path: &Path) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let text = std::fs::read_to_string(path).with_context(|| {
                format!(
                    "reading the tuning file {} (make one with `weft tune`)",
                    path.display()
                )
            })?;
            Self::parse(&text).with_context(|| format!("tuning file {}", path.display()))
        })
    }
}

fn flops(s: GemmShape) -> f64 {
    2.0 * f64::from(s.m) * f64::from(s.n) * f64::from(s.k)
}

/// The item whose shape is nearest `want` in (log m, log n, log k).
fn nearest<T>(items: impl Iterator<Item = (GemmShape, T)>, want: GemmShape) -> Option<T> {
    let d = |s: GemmShape| {
        let l = |a: u32, b: u32| (f64::from(a).ln() - f64::from(b).ln()).powi(2);
        l(s.m, want.m) + l(s.n, want.n) + l(s.k, want.k)
    };
    items.min_by(|a, b| d(a.0).total_cmp(&d(b.0))).map(|x| x.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TuningProfile {
        TuningProfile {
            device: "NVIDIA H200".into(),
            world: 4,
            sms: 132,
            comm: vec![CommCurve {
                op: Op::AllReduce,
                max_ctas: Some(32),
                points: vec![(1 << 20, 0.02), (1 << 30, 4.0)],
            }],
            gemm: vec![GemmSample {
                shape: GemmShape::new(4096, 4096, 1024),
                sm_margin: 32,
                tile_n: 256,
                ms: 0.2,
                waves: 4,
            }],
            cublas: vec![(GemmShape::new(4096, 4096, 1024), 0.15)],
            restore: vec![(Op::AllReduce, 0.002)],
            contention: vec![(Op::AllReduce, 32, 1.25)],
        }
    }

    #[test]
    fn text_round_trip() {
        let p = sample();
        assert_eq!(TuningProfile::parse(&p.to_text()).unwrap(), p);
        assert!(TuningProfile::parse("hello")
            .unwrap_err()
            .to_string()
            .contains("not a weft tuning file"));
        assert!(TuningProfile::parse("weft-tuning 1 4 132 x\nbogus 1")
            .unwrap_err()
            .to_string()
            .contains("unknown record"));
        assert!(TuningProfile::parse("weft-tuning 1 0 132 x")
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        let zero_waves = p.to_text().replace("0.200000 4", "0.200000 0");
        assert!(TuningProfile::parse(&zero_waves)
            .unwrap_err()
            .to_string()
            .contains("waves"));
        assert!(p.check_machine(132, 4).is_ok());
        assert!(p
            .check_machine(132, 8)
            .unwrap_err()
            .to_string()
            .contains("run `weft tune` here"));
    }

    #[test]
    fn curve_interpolates_bandwidth_and_extrapolates() {
        let c = &sample().comm[0];
        assert_eq!(c.ms(1 << 20), 0.02);
        assert_eq!(c.ms(1 << 10), 0.02); // latency floor
        assert!((c.ms(1 << 31) - 8.0).abs() < 1e-9); // last bandwidth
        let mid = c.ms(1 << 25); // between: bandwidth between the two samples'
        let bw = (1u64 << 25) as f64 / mid;
        assert!(bw > (1u64 << 20) as f64 / 0.02 && bw < (1u64 << 30) as f64 / 4.0);
    }

    #[test]
    fn unseen_shapes_use_the_nearest_neighbour() {
        let p = sample();
        assert!(
            (p.gemm_wave_ms(GemmShape::new(4096, 4096, 2048), 32, 256)
                .unwrap()
                - 0.1)
                .abs()
                < 1e-12
        );
        assert!(p
            .gemm_wave_ms(GemmShape::new(4096, 4096, 2048), 32, 128)
            .is_err());
        assert!((p.cublas_ms(GemmShape::new(8192, 4096, 1024)).unwrap() - 0.3).abs() < 1e-12);
        assert!(p
            .gemm_wave_ms(GemmShape::new(4096, 4096, 1024), 16, 256)
            .is_err());
    }
}
