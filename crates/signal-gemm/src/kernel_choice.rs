//! Which of a plan's GEMM kernels a launch runs: the fusions it asks for (`FusionNeeds`), the
//! smallest fusion set that has them (`FusionSet`, `GemmConfig`'s kFusions in
//! kernels/include/weft/gemm/config.cuh) and the kernel of that set the plan has
//! (`KernelVariant::of`, `GemmKernels`).

use crate::dtype::GemmElement;
use crate::gemm::LaunchExtras;
use crate::plan::{FusionSet, GemmPlan};
use crate::reorder::OutputLayout;
use cudarc::driver::CudaFunction;

impl<TO: GemmElement> LaunchExtras<'_, TO> {
    /// The smallest fusion set that has every fusion this launch asks for. The timeline and early
    /// release are not fusions (every kernel has them).
    pub fn fusion_set(&self) -> FusionSet {
        self.fusion_needs().set()
    }
    /// Which fusions the launch asks for. Destructured field by field: a new field of
    /// `LaunchExtras` does not compile until it is counted here.
    fn fusion_needs(&self) -> FusionNeeds {
        let LaunchExtras {
            flags,
            copy_dst,
            trace,
            timeline: _,
            early_release: _,
            groups,
            layout,
            row_slots,
            peer,
            peer_rows,
            all_reduce,
            all_gather,
        } = self;
        FusionNeeds {
            layout: *layout,
            others: flags.is_some()
                || copy_dst.is_some()
                || trace.is_some()
                || groups.is_some()
                || row_slots.is_some(),
            peer: peer.is_some(),
            peer_rows: peer_rows.is_some(),
            all_gather: all_gather.is_some(),
            all_reduce: all_reduce.is_some(),
        }
    }
}

/// The fusions a launch asks for, as [`LaunchExtras::fusion_set`] reads them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FusionNeeds {
    layout: OutputLayout,
    /// Tile flags, the test communicator's copy, a trace, wave-group counters or row slots:
    /// fusions only the kernel with every fusion has.
    others: bool,
    /// The fused methods' targets: PEER_REDUCE's, PEER_ROWS', the AllGather's, the AllReduce's.
    peer: bool,
    peer_rows: bool,
    all_gather: bool,
    all_reduce: bool,
}

impl FusionNeeds {
    fn set(self) -> FusionSet {
        let method = (self.peer, self.peer_rows, self.all_gather, self.all_reduce);
        match (self.others, self.layout, method) {
            (false, OutputLayout::Standard, (false, false, false, false)) => FusionSet::None,
            (false, OutputLayout::PeerReduce { .. }, (true, false, false, false)) => {
                FusionSet::PeerReduce
            }
            (false, OutputLayout::PeerRows { .. }, (false, true, false, false)) => {
                FusionSet::PeerRows
            }
            (false, OutputLayout::Standard, (false, false, true, false)) => FusionSet::AllGather,
            (false, OutputLayout::Standard, (false, false, false, true)) => FusionSet::AllReduce,
            _ => FusionSet::All,
        }
    }
}

/// Which of a plan's kernels a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelVariant {
    /// Every fusion compiled in: any launch that uses one.
    Fused,
    /// One fused method's fusion alone compiled in ([`FusionSet`]): a launch whose fusions are
    /// that set's, on a plan that has the kernel ([`GemmPlan::has_method_kernel`]). (The
    /// PEER_REDUCE and PEER_ROWS kernels have no communicator: communicator CTAs, which those
    /// methods refuse anyway, would end at once, as in the kernel with every fusion with no
    /// comm_op and no tile flags.)
    Method(FusionSet),
    /// Neither fusions nor split-K: an unsplit plain launch.
    Plain,
    /// Split-K without fusions: a plain launch that splits (`sched.k_splits` > 1 at launch).
    PlainSplit,
}

/// What a launch asks of its kernel, for [`KernelVariant::of`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchNeeds {
    /// [`LaunchExtras::fusion_set`].
    pub(crate) set: FusionSet,
    /// Whether the plan has the kernel of `set` alone ([`GemmPlan::has_method_kernel`]).
    pub(crate) method_kernel: bool,
    /// The launch's splits (1 unless fusion-free).
    pub(crate) k_splits: u32,
}

impl KernelVariant {
    /// The one place a launch's kernel is decided: only a fusion-free launch may split (the
    /// caller sets its splits to 1 otherwise), and a split launch needs the split path.
    pub(crate) fn of(n: LaunchNeeds) -> Self {
        match n.set {
            FusionSet::None if n.k_splits > 1 => Self::PlainSplit,
            FusionSet::None => Self::Plain,
            FusionSet::PeerReduce
            | FusionSet::PeerRows
            | FusionSet::AllGather
            | FusionSet::AllReduce
                if n.method_kernel =>
            {
                Self::Method(n.set)
            }
            _ => Self::Fused,
        }
    }
}

/// A plan's kernel with the fusions compiled in, the plain one (`LaunchExtras::fusion_free`),
/// for split-K plans the plain one with split-K (split launches only: the split path slows
/// the unsplit kernels), and the fused methods' own ([`MethodKernels`]).
pub(crate) struct GemmKernels {
    /// None where the plan's tile has no fused kernel ([`GemmPlan::has_fused_kernel`]).
    pub(crate) fused: Option<CudaFunction>,
    /// The fused methods' own kernels (PEER_REDUCE, AllGather, AllReduce, PEER_ROWS), each
    /// where the plan has it ([`GemmPlan::has_method_kernel`]).
    pub(crate) methods: MethodKernels,
    pub(crate) plain: CudaFunction,
    pub(crate) plain_split: Option<CudaFunction>,
}

/// A plan's kernels with one fused method's fusion each, where it has them.
pub(crate) struct MethodKernels {
    peer_reduce: Option<CudaFunction>,
    all_gather: Option<CudaFunction>,
    all_reduce: Option<CudaFunction>,
    peer_rows: Option<CudaFunction>,
}

impl MethodKernels {
    /// The sets with a kernel of their own.
    pub(crate) const SETS: [FusionSet; 4] = [
        FusionSet::PeerReduce,
        FusionSet::AllGather,
        FusionSet::AllReduce,
        FusionSet::PeerRows,
    ];
    pub(crate) fn load(
        plan: &GemmPlan,
        mut load: impl FnMut(String) -> anyhow::Result<CudaFunction>,
    ) -> anyhow::Result<Self> {
        let mut one = |set| -> anyhow::Result<Option<CudaFunction>> {
            Ok(if plan.has_method_kernel(set) {
                Some(load(plan.method_kernel_name(set))?)
            } else {
                None
            })
        };
        Ok(Self {
            peer_reduce: one(FusionSet::PeerReduce)?,
            all_gather: one(FusionSet::AllGather)?,
            all_reduce: one(FusionSet::AllReduce)?,
            peer_rows: one(FusionSet::PeerRows)?,
        })
    }
    pub(crate) fn get(&self, set: FusionSet) -> Option<&CudaFunction> {
        match set {
            FusionSet::PeerReduce => self.peer_reduce.as_ref(),
            FusionSet::AllGather => self.all_gather.as_ref(),
            FusionSet::AllReduce => self.all_reduce.as_ref(),
            FusionSet::PeerRows => self.peer_rows.as_ref(),
            FusionSet::None | FusionSet::All => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{AllGatherSource, AllReduceTarget, PeerReduceTarget, PeerRowsTarget};
    use half::bf16;
    use weft_kernels::abi::weft_sync_counters;

    // The _plain kernels have split-K compiled out: a split launch on one would silently run
    // every tile whole (correct, without the split's speed).
    #[test]
    fn split_launches_run_the_split_kernel() {
        let of = |set, k_splits| {
            KernelVariant::of(LaunchNeeds {
                set,
                method_kernel: true,
                k_splits,
            })
        };
        assert_eq!(of(FusionSet::None, 3), KernelVariant::PlainSplit);
        assert_eq!(of(FusionSet::None, 1), KernelVariant::Plain);
        assert_eq!(of(FusionSet::All, 1), KernelVariant::Fused);
        assert_eq!(of(FusionSet::All, 3), KernelVariant::Fused);
    }

    // A fused method's own kernel where the plan has it; the kernel with every fusion where not.
    #[test]
    fn method_launches_run_their_own_kernel() {
        let of = |set, method_kernel| {
            KernelVariant::of(LaunchNeeds {
                set,
                method_kernel,
                k_splits: 1,
            })
        };
        for set in [
            FusionSet::PeerReduce,
            FusionSet::AllGather,
            FusionSet::AllReduce,
            FusionSet::PeerRows,
        ] {
            assert_eq!(of(set, true), KernelVariant::Method(set));
            assert_eq!(of(set, false), KernelVariant::Fused);
        }
        assert_eq!(of(FusionSet::All, true), KernelVariant::Fused);
    }

    // Any fusion beside a method's (tile flags, the test copy, a trace, wave groups, row slots:
    // GPU objects, so summarised here) sends the launch to the kernel with every fusion.
    #[test]
    fn other_fusions_beside_a_method_need_every_fusion() {
        let needs = |layout, others, method: [bool; 4]| FusionNeeds {
            layout,
            others,
            peer: method[0],
            peer_rows: method[1],
            all_gather: method[2],
            all_reduce: method[3],
        };
        let reduce = OutputLayout::PeerReduce { ranks: 2 };
        let rows = OutputLayout::PeerRows { ranks: 2, rows: 8 };
        let standard = OutputLayout::Standard;
        for (layout, method, set) in [
            (reduce, [true, false, false, false], FusionSet::PeerReduce),
            (rows, [false, true, false, false], FusionSet::PeerRows),
            (standard, [false, false, true, false], FusionSet::AllGather),
            (standard, [false, false, false, true], FusionSet::AllReduce),
            (standard, [false; 4], FusionSet::None),
        ] {
            assert_eq!(needs(layout, false, method).set(), set);
            assert_eq!(needs(layout, true, method).set(), FusionSet::All);
        }
    }

    // A fused method's own kernel has every other fusion compiled out: only a launch whose
    // fusions are exactly that method's may run it; one that adds another fusion, or the method's
    // fusion in another layout, gets the kernel with all of them.
    #[test]
    fn fusion_sets_are_the_smallest_that_fit() {
        let bar = weft_sync_counters::default();
        let peer = PeerReduceTarget {
            maps: 0,
            ranks: 2,
            bar,
            epoch: 0,
        };
        let all_reduce = AllReduceTarget {
            flags: 0,
            flag_target: 0,
            comm: None,
        };
        let all_gather = AllGatherSource {
            maps: 0,
            rows: 0,
            bar,
            epoch: 0,
            copy: None,
            host_copy: false,
        };
        let reduce_layout = OutputLayout::PeerReduce { ranks: 2 };
        let rows = PeerRowsTarget {
            ptrs: 0,
            table: 0,
            table_rows: 0,
            bar,
            epoch: 0,
        };
        let rows_layout = OutputLayout::PeerRows { ranks: 2, rows: 8 };
        let set = |e: LaunchExtras<'_, bf16>| e.fusion_set();
        assert_eq!(set(LaunchExtras::default()), FusionSet::None);
        assert_eq!(
            set(LaunchExtras {
                layout: reduce_layout,
                peer: Some(peer),
                early_release: true,
                ..Default::default()
            }),
            FusionSet::PeerReduce
        );
        assert_eq!(
            set(LaunchExtras {
                all_gather: Some(all_gather),
                ..Default::default()
            }),
            FusionSet::AllGather
        );
        assert_eq!(
            set(LaunchExtras {
                layout: rows_layout,
                peer_rows: Some(rows),
                ..Default::default()
            }),
            FusionSet::PeerRows
        );
        assert_eq!(
            set(LaunchExtras {
                all_reduce: Some(all_reduce),
                ..Default::default()
            }),
            FusionSet::AllReduce
        );
        // The method's fusion with the wrong layout or without its target, or with another.
        for e in [
            LaunchExtras {
                peer: Some(peer),
                ..Default::default()
            },
            LaunchExtras {
                layout: reduce_layout,
                ..Default::default()
            },
            LaunchExtras {
                layout: reduce_layout,
                peer: Some(peer),
                all_reduce: Some(all_reduce),
                ..Default::default()
            },
            LaunchExtras {
                layout: reduce_layout,
                peer: Some(peer),
                all_gather: Some(all_gather),
                ..Default::default()
            },
            LaunchExtras {
                layout: OutputLayout::TileOrder,
                all_reduce: Some(all_reduce),
                ..Default::default()
            },
            LaunchExtras {
                layout: OutputLayout::RowSlots { slots: 4 },
                all_gather: Some(all_gather),
                ..Default::default()
            },
            LaunchExtras {
                all_gather: Some(all_gather),
                all_reduce: Some(all_reduce),
                ..Default::default()
            },
            LaunchExtras {
                layout: rows_layout,
                ..Default::default()
            },
            LaunchExtras {
                layout: reduce_layout,
                peer_rows: Some(rows),
                ..Default::default()
            },
            LaunchExtras {
                layout: rows_layout,
                peer_rows: Some(rows),
                peer: Some(peer),
                ..Default::default()
            },
        ] {
            assert_eq!(set(e), FusionSet::All);
        }
    }
}
