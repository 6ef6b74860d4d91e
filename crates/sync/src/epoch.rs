//! Epoch bookkeeping: counters are never reset between launches, so each launch needs to know
//! how far they have already risen.
//!
//! Scheme: a counter buffer is used in *steps*. A step is one round of whatever protocol the
//! kernel runs at every coordinate: one signal from the single producer of a coordinate (the
//! counter rises by 1), or one barrier (it rises by `world`). The host keeps the number of steps
//! all launches so far have taken (the epoch); a launch that takes `n` steps gets the current epoch
//! as its base, and its k-th wait (k from 0) targets `(base + k + 1) * per_step`. Targets compare
//! with `>=`, so a fast producer's early signal for step k + 1 never hides step k, and a launch
//! can start while a peer's previous launch is still finishing.

/// Steps taken on one counter buffer so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epoch {
    steps: u64,
}

impl Epoch {
    /// Steps taken by every launch so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Reserves `n` steps for the next launch and returns its base.
    pub fn begin(&mut self, n: u64) -> u64 {
        let base = self.steps;
        self.steps = self
            .steps
            .checked_add(n)
            .expect("a u64 counter cannot overflow in practice");
        base
    }

    /// Back to zero, together with the counters (see `Counters::reset`).
    pub fn reset(&mut self) {
        self.steps = 0;
    }
}

/// Target of the k-th wait (from 0) in a launch with epoch `base`, each step adding `per_step`.
pub fn target(base: u64, k: u64, per_step: u64) -> u64 {
    (base + k + 1) * per_step
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_kernels::abi;

    #[test]
    fn launches_continue_where_the_last_stopped() {
        let mut e = Epoch::default();
        assert_eq!(e.begin(100_000), 0);
        assert_eq!(e.begin(3), 100_000);
        assert_eq!(e.steps(), 100_003);
        assert_eq!(target(100_000, 0, 1), 100_001);
        // Barrier epochs: the kernel's `epoch` argument is base + k + 1; its target is world * that.
        assert_eq!(target(100_000, 2, 4), unsafe {
            abi::weft_barrier_target(4, 100_003)
        });
        e.reset();
        assert_eq!(e.begin(1), 0);
    }

    /// A small deterministic scheduler over `world` ranks running `laps` barriers in two launches
    /// (epoch bases from `Epoch`, no synchronisation between the launches), each rank an explicit
    /// state machine of the device barrier: arrive = fence, then add 1 to every rank's counter
    /// (one add per scheduling step, in the device's order); pass = its own counter reaches
    /// target(base, k, world). For every interleaving the pseudo-random scheduler picks:
    /// - nobody passes barrier e before every rank has begun arriving at e, and all finish;
    /// - every rank that passes e is guaranteed to see every rank's writes from before its e-th
    ///   arrival. Guarantees are tracked as vector clocks along release -> acquire edges: an add
    ///   carries what its rank had acquired plus its own arrival (the fence is cumulative), and
    ///   an acquire of a counter synchronises with every add it includes (release sequence).
    ///   This also covers the case where a fast rank's next-epoch add completes a slower rank's
    ///   count before a third rank's add arrives: the third rank's writes still reach it through
    ///   the fast rank, which had acquired them.
    #[test]
    fn barrier_targets_hold_under_random_interleavings_and_lapping() {
        for world in [1usize, 2, 3, 4, 8] {
            for seed in 0..50u64 {
                simulate(world, 40, seed);
            }
        }
    }

    fn simulate(world: usize, laps: u64, seed: u64) {
        #[derive(Clone, Copy)]
        enum Pc {
            Arriving { next_peer: usize },
            Waiting,
            Done,
        }
        let max =
            |a: &mut Vec<u64>, b: &[u64]| a.iter_mut().zip(b).for_each(|(x, y)| *x = (*x).max(*y));
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut epoch = Epoch::default();
        let launches = [laps / 2, laps - laps / 2];
        let bases: Vec<u64> = launches.iter().map(|&n| epoch.begin(n)).collect();
        let mut counter = vec![0u64; world];
        let mut started = vec![0u64; world]; // arrivals each rank has begun
                                             // seen[r][q]: the latest arrival of q whose earlier writes r is guaranteed to see.
        let mut seen = vec![vec![0u64; world]; world];
        let mut released = seen.clone(); // what each rank's current arrival releases
        let mut included = seen.clone(); // what an acquire of each rank's counter synchronises with
                                         // Per rank: (launch, lap within launch, program counter).
        let mut state: Vec<(usize, u64, Pc)> = vec![(0, 0, Pc::Arriving { next_peer: 0 }); world];
        let mut steps = 0u64;
        while state.iter().any(|s| !matches!(s.2, Pc::Done)) {
            steps += 1;
            assert!(
                steps < 1_000_000,
                "no progress: deadlock (world {world}, seed {seed})"
            );
            let r = (next() % world as u64) as usize;
            let (launch, k, pc) = state[r];
            match pc {
                Pc::Done => {}
                Pc::Arriving { next_peer } => {
                    if next_peer == 0 {
                        started[r] += 1;
                        released[r] = seen[r].clone();
                        released[r][r] = started[r];
                    }
                    let dst = (r + 1 + next_peer) % world;
                    counter[dst] += 1;
                    let carried = released[r].clone();
                    max(&mut included[dst], &carried);
                    state[r].2 = if next_peer + 1 == world {
                        Pc::Waiting
                    } else {
                        Pc::Arriving {
                            next_peer: next_peer + 1,
                        }
                    };
                }
                Pc::Waiting => {
                    let e = bases[launch] + k + 1;
                    if counter[r] >= target(bases[launch], k, world as u64) {
                        let acquired = included[r].clone();
                        max(&mut seen[r], &acquired);
                        for q in 0..world {
                            assert!(started[q] >= e, "rank {r} passed barrier {e} before rank {q} arrived (world {world}, seed {seed})");
                            assert!(seen[r][q] >= e, "rank {r} passed barrier {e} without seeing rank {q}'s writes (world {world}, seed {seed})");
                        }
                        let (launch, k) = if k + 1 == launches[launch] {
                            (launch + 1, 0)
                        } else {
                            (launch, k + 1)
                        };
                        state[r] = if launch == launches.len() {
                            (launch, k, Pc::Done)
                        } else {
                            (launch, k, Pc::Arriving { next_peer: 0 })
                        };
                    }
                }
            }
        }
        assert!(counter.iter().all(|&c| c == world as u64 * laps));
        assert_eq!(epoch.steps(), laps);
    }
}
