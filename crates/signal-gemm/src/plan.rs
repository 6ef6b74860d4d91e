//! The GEMM plan: shape, dtypes, layouts and SM budget, validated once (no GPU needed), with the
//! tile shape and grid chosen and the schedule fixed. A [`crate::Gemm`] launches a plan.

use crate::dtype::Dtype;
use crate::error::GemmError;
use crate::error::{refuse, require};
use crate::schedule::{list_schedule, ScheduledTile};
use weft_kernels::abi::{
    weft_gemm_k_blocks, weft_gemm_order_count, weft_gemm_schedule, weft_gemm_smem_bytes,
    weft_gemm_split_begin, weft_gemm_tiles_m, weft_gemm_tiles_n, WEFT_GEMM_EPI_PIPELINED,
    WEFT_GEMM_EPI_WHOLE_TILE, WEFT_GEMM_MAX_K_SPLITS, WEFT_GEMM_THREADS, WEFT_GEMM_TILE_K,
    WEFT_GEMM_TILE_M,
};

/// The fusions a GEMM kernel carries (`GemmConfig`'s kFusions, kernels/include/weft/gemm/
/// config.cuh): a launch runs the smallest kernel that has what it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusionSet {
    /// None (the plain kernel): [`LaunchExtras::fusion_free`].
    None,
    /// The fused ReduceScatter's alone: the PEER_REDUCE layout with its peer target.
    PeerReduce,
    /// The fused AllGather's alone: its A source, standard layout.
    AllGather,
    /// The fused AllReduce's alone: its tile flags (and communicator CTAs), standard layout.
    AllReduce,
    /// The fused All-to-All's alone: the PEER_ROWS layout with its target.
    PeerRows,
    /// Every fusion, picked at run time: any other combination.
    All,
}

/// D (m × n) = alpha · A (m × k) · B + beta · D.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

impl GemmShape {
    pub const fn new(m: u32, n: u32, k: u32) -> Self {
        Self { m, n, k }
    }
}

impl std::fmt::Display for GemmShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.m, self.n, self.k)
    }
}

/// How B is stored (A is always m × k row-major, D m × n row-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// k × n row-major.
    KxN,
    /// n × k row-major: the usual weight layout (D = A · Bᵀ).
    NxK,
}

impl BLayout {
    pub fn name(self) -> &'static str {
        match self {
            BLayout::KxN => "kn",
            BLayout::NxK => "nk",
        }
    }
}

/// Output tile: 128 × 256, 128 × 192 or 128 × 128, or chosen from the shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileChoice {
    /// 128 × 256 or 128 × 128 from the shape: the widths with fused kernels, so any launch.
    Auto,
    /// 128 × 256, 128 × 192 (clusters of 1) or 128 × 128 from the shape: for GEMMs launched
    /// without fusions only ([`crate::Gemm::launch`]); a fused launch of a plan that got 128 × 192
    /// is refused.
    AutoPlain,
    N256,
    /// Plain launches only (no fusion: the kernels exist without them), clusters of 1: fills the
    /// SMs where 128 × 256 tiles leave a wave short. A fused launch of such a plan is refused.
    N192,
    N128,
}

/// The epilogue variant (kernels/include/weft/abi/gemm.h, WEFT_GEMM_EPI_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpilogueChoice {
    /// Pipelined, unless split-K needs the whole-tile one (16-bit outputs, 128 × 256 tiles).
    /// Auto once picked whole-tile at K ≤ 2048 as well; since the plain kernels (af7ad0c) the
    /// pipelined epilogue was as fast or faster there on every GEMM of the LLM grid (1.02–1.20×)
    /// and every fused method's quick grid
    /// (results/gemm/plain-kernels-nvidia-h200-x2-2026-11-26/README.md).
    Auto,
    /// Two buffers per consumer, chunk by chunk; the deepest pipeline.
    Pipelined,
    /// One buffer per chunk: a single barrier per tile, one stage fewer (16-bit outputs, 128 × 256).
    WholeTile,
}

/// How compute CTAs get their tiles (the tiles' orders are the same either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheduling {
    /// CTA c runs orders c, c + CTAs, …: fixed, listed by [`GemmPlan::schedule`].
    Static,
    /// Each CTA claims its next order from a device counter: a CTA that starts late (its SM held
    /// by a communication kernel) runs fewer tiles instead of delaying the whole GEMM. Needs
    /// cluster_m 1. Launches of one [`crate::Gemm`] must then be ordered (one stream).
    Dynamic,
}

/// Split-K: each tile's K cut into work units that run on separate CTAs, the last adding the
/// others' fp32 partials before it stores (kernels/include/weft/abi/gemm.h, "Split-K"). For shapes
/// with fewer tiles than SMs, or a last wave that leaves most of them idle. Applies to plain
/// launches (standard layout, no signals or fused collective); other launches of the plan run
/// every tile whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KSplits {
    /// Chosen from the shape and grid (1 with clusters, communicator CTAs or an sm_margin: a
    /// plan that leaves SMs to another kernel runs beside it, and a statically scheduled split
    /// waits for CTAs that only start once SMs free up).
    Auto,
    /// This many work units per tile (1: none), at most the K blocks and WEFT_GEMM_MAX_K_SPLITS.
    Fixed(u32),
}

/// Everything about a GEMM besides its shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmOptions {
    pub input: Dtype,
    pub output: Dtype,
    pub b_layout: BLayout,
    /// SMs left free for other kernels (communication): the compute grid is SMs − sm_margin −
    /// comm_ctas CTAs, rounded down to whole clusters (and, with clusters, to as many as can be
    /// resident at once: [`crate::Gemm`] may shrink it).
    pub sm_margin: u32,
    /// CTAs of the communicator role, launched after the compute CTAs on SMs of their own.
    pub comm_ctas: u32,
    pub tile: TileChoice,
    /// Cluster rows per L2 group of the schedule (None: chosen from the grid).
    pub group_m: Option<u32>,
    /// CTAs per thread-block cluster along M (1 or 2): with 2, the two CTAs compute vertically
    /// adjacent tiles and load their shared B tile once, half each, with TMA multicast.
    pub cluster_m: u32,
    pub epilogue: EpilogueChoice,
    pub scheduling: Scheduling,
    pub k_splits: KSplits,
    pub alpha: f32,
    pub beta: f32,
}

impl Default for GemmOptions {
    fn default() -> Self {
        Self {
            input: Dtype::Bf16,
            output: Dtype::Bf16,
            b_layout: BLayout::NxK,
            sm_margin: 0,
            comm_ctas: 0,
            tile: TileChoice::Auto,
            group_m: None,
            cluster_m: 1,
            epilogue: EpilogueChoice::Auto,
            scheduling: Scheduling::Static,
            k_splits: KSplits::Auto,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// A validated GEMM: what to launch and in which order its tiles run.
#[derive(Clone, Debug)]
pub struct GemmPlan {
    pub shape: GemmShape,
    pub options: GemmOptions,
    /// The device's SM count the plan was made for.
    pub sms: u32,
    pub(crate) sched: weft_gemm_schedule,
    /// WEFT_GEMM_EPI_PIPELINED or WEFT_GEMM_EPI_WHOLE_TILE.
    pub(crate) epilogue: u32,
}

/// Relative throughput per output element of the tile widths against 128 × 256 on the main loop
/// (narrower tiles reload A more often per output and issue narrower wgmma): used only to choose
/// between them. 128 × 192: fitted on `weft bench gemm-llm`'s grid on one H200
/// (results/gemm/n192-nvidia-h200-2026-11-26/README.md): every value from 0.94 to 0.98 picks
/// the same tiles there (12 of its 88 rows move to 192, each faster; 128 × 128 stays at 0.85,
/// which any value from 0.75 to 0.95 ties with there).
const N128_RELATIVE_SPEED: f64 = 0.85;
const N192_RELATIVE_SPEED: f64 = 0.96;

impl GemmPlan {
    /// Validates `shape` and `options` for a device with `sms` SMs.
    pub fn new(sms: u32, shape: GemmShape, options: GemmOptions) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let GemmShape { m, n, k } = shape;
            for (name, v) in [("m", m), ("n", n), ("k", k)] {
                require!(v > 0, Shape, "GEMM shape {shape}: {name} is 0");
                require!(v % 16 == 0, Shape, "GEMM shape {shape}: {name} = {v} is not a multiple of 16 (weft's GEMM needs m, n, k multiples of 16)");
                require!(
                    v < (1 << 31),
                    Shape,
                    "GEMM shape {shape}: {name} = {v} does not fit a TMA coordinate (< 2^31)"
                );
            }
            require!(
                matches!(options.input, Dtype::Bf16 | Dtype::F16),
                Options,
                "GEMM input dtype {} is not supported: A and B must be bf16 or f16",
                options.input
            );
            require!(
                options.alpha.is_finite() && options.beta.is_finite(),
                Options,
                "GEMM alpha {} / beta {} must be finite",
                options.alpha,
                options.beta
            );
            require!(sms > 0, Unsupported, "device reports no SMs");
            let reserved = options.sm_margin as u64 + options.comm_ctas as u64;
            require!(
                reserved < sms as u64,
                Options,
                "sm_margin {} + comm_ctas {} leaves no SM of {sms} for the GEMM",
                options.sm_margin,
                options.comm_ctas
            );
            require!(
                matches!(options.cluster_m, 1 | 2),
                Options,
                "cluster_m = {} is not supported (1 or 2)",
                options.cluster_m
            );
            require!(
                options.scheduling == Scheduling::Static || options.cluster_m == 1, Options,
                "dynamic scheduling needs cluster_m 1 (the CTAs of a cluster run their tiles in lockstep), have {}",
                options.cluster_m
            );
            require!(
                options.comm_ctas.is_multiple_of(options.cluster_m), Options,
                "comm_ctas = {} is not a multiple of cluster_m = {} (communicator CTAs come in whole clusters)",
                options.comm_ctas,
                options.cluster_m
            );
            // Whole clusters only.
            let ctas = (sms - options.sm_margin - options.comm_ctas) / options.cluster_m
                * options.cluster_m;
            require!(
                ctas > 0,
                Options,
                "no whole cluster of {} CTAs fits the SMs left ({sms} - sm_margin - comm_ctas)",
                options.cluster_m
            );
            require!(
                options.tile != TileChoice::N192 || options.cluster_m == 1,
                Options,
                "128x192 tiles have kernels for clusters of 1 only (asked: cluster_m {})",
                options.cluster_m
            );
            let tile_n = match options.tile {
                TileChoice::N256 => 256,
                TileChoice::N192 => 192,
                TileChoice::N128 => 128,
                TileChoice::Auto => auto_tile_n(shape, ctas, false),
                TileChoice::AutoPlain => auto_tile_n(shape, ctas, options.cluster_m == 1),
            };
            let mut sched = weft_gemm_schedule {
                m,
                n,
                k,
                tile_m: WEFT_GEMM_TILE_M,
                tile_n,
                tile_k: WEFT_GEMM_TILE_K,
                cluster_m: options.cluster_m,
                group_m: 1,
                ctas,
                tm_offset: 0,
                tm_blocks: 0,
                k_splits: 1,
            };
            // SAFETY (all weft_gemm_* calls): pure functions of the struct, from the C header.
            let units_m = unsafe { weft_gemm_tiles_m(sched) }.div_ceil(sched.cluster_m);
            sched.group_m = match options.group_m {
                Some(0) => refuse!(Options, "group_m must be at least 1"),
                Some(g) => g.min(units_m),
                None => auto_group_m(ctas, tile_n).min(units_m).max(1),
            };
            let k_blocks = unsafe { weft_gemm_k_blocks(sched) };
            let tiles = unsafe { weft_gemm_tiles_m(sched) } as u64
                * unsafe { weft_gemm_tiles_n(sched) } as u64;
            // The whole-tile epilogue exists for 16-bit outputs with 128 x 256 tiles.
            let whole_ok = options.output.bytes() == 2 && tile_n == 256;
            sched.k_splits = match options.k_splits {
                KSplits::Fixed(s) => {
                    require!(
                        (1..=WEFT_GEMM_MAX_K_SPLITS).contains(&s) && s <= k_blocks, Shape,
                        "GEMM shape {shape}: k_splits = {s} must be 1 to {} and at most the {k_blocks} K blocks of 64",
                        WEFT_GEMM_MAX_K_SPLITS
                    );
                    require!(
                        s == 1 || (options.cluster_m == 1 && options.comm_ctas == 0), Options,
                        "GEMM shape {shape}: split-K (k_splits = {s}) needs cluster_m 1 and no communicator CTAs (have {} and {})",
                        options.cluster_m,
                        options.comm_ctas
                    );
                    s
                }
                // Not where the kernel would need another epilogue than the one asked for or Auto's
                // (16-bit 128 x 256 tiles split only with the whole-tile epilogue, whose pipeline is a
                // stage shorter: on the grid's one such shape, 512 x 5120 x 8192, 3 splits ran 2.6 %
                // slower than whole tiles).
                KSplits::Auto
                    if options.cluster_m == 1
                        && options.comm_ctas == 0
                        && options.sm_margin == 0
                        && !(whole_ok && options.epilogue != EpilogueChoice::WholeTile) =>
                {
                    auto_k_splits(tiles, k_blocks, ctas)
                }
                KSplits::Auto => 1,
            };
            // Orders, work units and tile indices are 32-bit in the schedule (abi/gemm.h) and the
            // kernels: a plan whose work units would not fit is refused (no shape whose D fits in a
            // GPU's memory comes near). Counted here in 64 bits: weft_gemm_order_count would wrap.
            let orders = units_m as u64
                * options.cluster_m as u64
                * unsafe { weft_gemm_tiles_n(sched) } as u64;
            let works = orders * sched.k_splits as u64;
            require!(
                works <= u32::MAX as u64, Shape,
                "GEMM shape {shape}: {orders} tile orders x {} splits exceed the schedule's 32-bit counts ({})",
                sched.k_splits,
                u32::MAX
            );
            // The 16-bit 128 x 256 kernels split K only with the whole-tile epilogue
            // (kernels/include/weft/gemm/config.cuh, kSplitK).
            let split_needs_whole = sched.k_splits > 1 && whole_ok;
            let epilogue = match options.epilogue {
                EpilogueChoice::Pipelined => {
                    require!(
                        !split_needs_whole, Options,
                        "GEMM shape {shape}: split-K with 16-bit outputs and 128x256 tiles needs the whole-tile epilogue (asked: pipelined)"
                    );
                    WEFT_GEMM_EPI_PIPELINED
                }
                EpilogueChoice::WholeTile => {
                    require!(whole_ok, Options, "the whole-tile epilogue needs a 16-bit output and 128x256 tiles (have {} output, 128x{tile_n})", options.output);
                    WEFT_GEMM_EPI_WHOLE_TILE
                }
                EpilogueChoice::Auto => {
                    if split_needs_whole {
                        WEFT_GEMM_EPI_WHOLE_TILE
                    } else {
                        WEFT_GEMM_EPI_PIPELINED
                    }
                }
            };
            Ok(Self {
                shape,
                options,
                sms,
                sched,
                epilogue,
            })
        })
    }

    /// Output tile width (128, 192 or 256); tiles are 128 rows.
    pub fn tile_n(&self) -> u32 {
        self.sched.tile_n
    }
    /// Whether the plan's kernels include the fused one ([`Self::kernel_name`]): not for 128 × 192
    /// tiles, which serve plain launches only.
    pub fn has_fused_kernel(&self) -> bool {
        self.sched.tile_n != 192
    }
    /// Whether the plan has the kernel with `set`'s fusion alone ([`Self::method_kernel_name`]):
    /// the fused tiles with the pipelined epilogue (whole-tile plans run the kernel with every
    /// fusion; a whole-tile PEER_REDUCE kernel was measured slower than the pipelined one).
    pub fn has_method_kernel(&self, set: FusionSet) -> bool {
        match set {
            FusionSet::None => true,
            FusionSet::All => self.has_fused_kernel(),
            FusionSet::PeerReduce
            | FusionSet::AllGather
            | FusionSet::AllReduce
            | FusionSet::PeerRows => self.has_fused_kernel() && !self.whole_tile_epilogue(),
        }
    }
    /// An error naming the tile unless [`Self::has_fused_kernel`]: what the fused methods check
    /// when they plan, before any launch.
    pub fn require_fused_kernel(&self) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            require!(
                self.has_fused_kernel(), Options,
                "GEMM {}: 128x{} tiles have plain kernels only, and this GEMM is launched with fusions: plan it with TileChoice::Auto, N128 or N256",
                self.shape,
                self.sched.tile_n
            );
            Ok(())
        })
    }
    pub fn tile_m(&self) -> u32 {
        self.sched.tile_m
    }
    /// Compute CTAs of the persistent grid.
    pub fn ctas(&self) -> u32 {
        self.sched.ctas
    }
    pub fn group_m(&self) -> u32 {
        self.sched.group_m
    }
    pub fn cluster_m(&self) -> u32 {
        self.sched.cluster_m
    }
    pub fn whole_tile_epilogue(&self) -> bool {
        self.epilogue == WEFT_GEMM_EPI_WHOLE_TILE
    }
    /// The same plan on fewer compute CTAs (whole clusters), e.g. when fewer clusters than SMs
    /// allow can be resident at once.
    pub fn with_ctas(&self, ctas: u32) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            require!(
                ctas > 0 && ctas.is_multiple_of(self.sched.cluster_m) && ctas <= self.sched.ctas,
                Options,
                "{ctas} CTAs for {}",
                self.describe()
            );
            let mut p = self.clone();
            p.sched.ctas = ctas;
            Ok(p)
        })
    }
    /// The same plan with its order rotated by `tiles` tile rows (tile row tm runs where tm −
    /// tiles would; the fused AllGather starts each rank at its own shard). With clusters, both
    /// `tiles` and the tile rows must be whole clusters.
    pub fn with_tm_offset(&self, tiles: u32) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let cm = self.sched.cluster_m;
            require!(
                tiles.is_multiple_of(cm) && self.tiles_m().is_multiple_of(cm), Options,
                "rotating {} by {tiles} tile rows: with clusters of {cm} both the rotation and the {} tile rows must be whole clusters",
                self.describe(),
                self.tiles_m()
            );
            let mut p = self.clone();
            p.sched.tm_offset = tiles % self.tiles_m();
            Ok(p)
        })
    }
    /// The same plan visiting its tile rows as `blocks` equal blocks in turn (cluster row u of
    /// the order in block u % blocks): every wave then holds rows of every block (the fused
    /// ReduceScatter's owners), instead of one block after another. The blocks must be whole
    /// cluster rows.
    pub fn with_tm_blocks(&self, blocks: u32) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let cm = self.sched.cluster_m;
            let units = self.tiles_m() / cm;
            require!(
                blocks >= 1 && self.tiles_m().is_multiple_of(cm) && units.is_multiple_of(blocks), Options,
                "visiting {} as {blocks} blocks of tile rows: its {} tile rows (clusters of {cm}) do not split into {blocks} equal blocks of whole clusters",
                self.describe(),
                self.tiles_m()
            );
            let mut p = self.clone();
            p.sched.tm_blocks = blocks;
            Ok(p)
        })
    }
    pub fn tiles_m(&self) -> u32 {
        unsafe { weft_gemm_tiles_m(self.sched) }
    }
    pub fn tiles_n(&self) -> u32 {
        unsafe { weft_gemm_tiles_n(self.sched) }
    }
    pub fn tiles(&self) -> u32 {
        self.tiles_m() * self.tiles_n()
    }
    pub fn k_blocks(&self) -> u32 {
        unsafe { weft_gemm_k_blocks(self.sched) }
    }
    /// Scheduled orders (tiles plus phantoms of partial clusters).
    pub fn orders(&self) -> u32 {
        unsafe { weft_gemm_order_count(self.sched) }
    }
    /// Work units per tile in a plain launch (split-K; 1: none). Other launches run whole tiles.
    pub fn k_splits(&self) -> u32 {
        self.sched.k_splits
    }
    /// K blocks of split `split` of every tile (split-K; the whole K without it).
    pub fn split_k_blocks(&self, split: u32) -> std::ops::Range<u32> {
        // SAFETY: a pure function of the struct.
        unsafe {
            weft_gemm_split_begin(self.sched, split)..weft_gemm_split_begin(self.sched, split + 1)
        }
    }
    /// Waves of the persistent grid: ⌈orders ÷ CTAs⌉.
    pub fn waves(&self) -> u32 {
        self.orders().div_ceil(self.ctas())
    }
    /// Threads per CTA and dynamic shared memory per CTA of the kernel.
    pub fn block_threads(&self) -> u32 {
        WEFT_GEMM_THREADS
    }
    pub fn smem_bytes(&self) -> u32 {
        unsafe { weft_gemm_smem_bytes(self.sched.tile_n, self.epilogue) }
    }
    /// The kernel's entry point with the fusions compiled in (kernels/gemm/instantiate.cuh spells
    /// the same names): the one for launches with signals, another output layout, a fused
    /// collective or a trace.
    pub fn kernel_name(&self) -> String {
        format!(
            "weft_gemm_{}_{}_{}_{}_c{}{}",
            self.options.input.name(),
            self.options.output.name(),
            self.options.b_layout.name(),
            self.sched.tile_n,
            self.sched.cluster_m,
            if self.whole_tile_epilogue() { "_w" } else { "" }
        )
    }
    /// The same kernel with the fusions compiled out (`GemmConfig`'s kFusionsNone), for plain launches:
    /// a third of the code, and faster on short GEMMs (crates/signal-gemm/README.md).
    pub fn plain_kernel_name(&self) -> String {
        format!("{}_plain", self.kernel_name())
    }
    /// The kernel with one fused method's fusion alone compiled in (every other fusion out;
    /// `GemmConfig`'s kFusions), for launches whose fusions are that method's: `_pr`, `_ag`,
    /// `_ar`, `_a2a`; the kernel with every fusion for [`FusionSet::All`], the plain one for `None`.
    pub fn method_kernel_name(&self, set: FusionSet) -> String {
        match set {
            FusionSet::None => self.plain_kernel_name(),
            FusionSet::PeerReduce => format!("{}_pr", self.kernel_name()),
            FusionSet::AllGather => format!("{}_ag", self.kernel_name()),
            FusionSet::AllReduce => format!("{}_ar", self.kernel_name()),
            FusionSet::PeerRows => format!("{}_a2a", self.kernel_name()),
            FusionSet::All => self.kernel_name(),
        }
    }
    /// The plain kernel with split-K, for this plan's split launches (`k_splits` > 1; clusters
    /// of 1): the `_plain` one has the split path compiled out.
    pub fn plain_split_kernel_name(&self) -> String {
        format!("{}_plain_split", self.kernel_name())
    }
    /// Every tile with its execution order, wave and CTA (the kernel's own scheduler function).
    /// With dynamic scheduling the orders and waves hold, the CTAs are decided at run time.
    pub fn schedule(&self) -> Vec<ScheduledTile> {
        list_schedule(self.sched)
    }
    /// Floating-point operations of one GEMM (2·m·n·k).
    pub fn flops(&self) -> f64 {
        2.0 * self.shape.m as f64 * self.shape.n as f64 * self.shape.k as f64
    }
    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        format!(
            "{} {}→{} B {} tile 128x{} cluster {} epilogue {} ctas {}{} group_m {} waves {}{}",
            self.shape,
            self.options.input,
            self.options.output,
            self.options.b_layout.name(),
            self.sched.tile_n,
            self.sched.cluster_m,
            if self.whole_tile_epilogue() {
                "whole"
            } else {
                "pipelined"
            },
            self.sched.ctas,
            if self.options.scheduling == Scheduling::Dynamic {
                " (dynamic)"
            } else {
                ""
            },
            self.sched.group_m,
            self.waves(),
            if self.sched.k_splits > 1 {
                format!(" split_k {}", self.sched.k_splits)
            } else {
                String::new()
            }
        )
    }
}

/// The tile width with the smallest predicted time, waves × tile area ÷ relative speed, among
/// 128 and 256 (and 192 with `with_192`); ties go to the wider tile.
fn auto_tile_n(shape: GemmShape, ctas: u32, with_192: bool) -> u32 {
    let cost = |tile_n: u32, speed: f64| {
        let tiles = shape.m.div_ceil(WEFT_GEMM_TILE_M) as u64 * shape.n.div_ceil(tile_n) as u64;
        let waves = tiles.div_ceil(ctas as u64);
        waves as f64 * (WEFT_GEMM_TILE_M * tile_n) as f64 / speed
    };
    let mut best = (256, cost(256, 1.0));
    let narrower = [
        (192, N192_RELATIVE_SPEED, with_192),
        (128, N128_RELATIVE_SPEED, true),
    ];
    for (tile_n, speed, allowed) in narrower {
        let c = cost(tile_n, speed);
        if allowed && c < best.1 {
            best = (tile_n, c);
        }
    }
    best.0
}

/// Split-K's cost model, in K blocks of the plan's tile, fitted to `weft bench gemm-llm` on one
/// H200 (results/gemm/nvidia-h200-x2-2026-11-26-split-k-first.json, 128 × 128 tiles unsplit and
/// split 2 and 3 at 3008 × 4096 × 4096; it then predicted split 4 within 3 %): a wave of units
/// takes its units' K blocks, plus the fill and epilogue, plus per earlier split its partial
/// written by one CTA and read by the last.
const UNIT_OVERHEAD_K_BLOCKS: f64 = 8.5;
const SPLIT_OVERHEAD_K_BLOCKS: f64 = 3.75;
/// Splits only pay when they save this fraction of the predicted time.
const SPLIT_MIN_GAIN: f64 = 0.1;

/// Work units per tile with the smallest predicted time (each split keeps at least 4 K blocks);
/// 1 unless that saves SPLIT_MIN_GAIN. With fewer units than CTAs the model is optimistic (fewer
/// CTAs each load faster): on the grid's one-wave shapes it predicted 1.8× for splits that gave
/// 1.4×, but ranked them right.
fn auto_k_splits(tiles: u64, k_blocks: u32, ctas: u32) -> u32 {
    let cost = |s: u32| {
        let waves = (tiles * s as u64).div_ceil(ctas as u64) as f64;
        waves
            * (k_blocks.div_ceil(s) as f64
                + UNIT_OVERHEAD_K_BLOCKS
                + (s - 1) as f64 * SPLIT_OVERHEAD_K_BLOCKS)
    };
    let max = (k_blocks / 4).clamp(1, WEFT_GEMM_MAX_K_SPLITS);
    let best = (1..=max)
        .min_by(|&a, &b| cost(a).total_cmp(&cost(b)))
        .unwrap_or(1);
    if cost(best) <= cost(1) * (1.0 - SPLIT_MIN_GAIN) {
        best
    } else {
        1
    }
}

/// Group height g minimising a wave's operand traffic g·tile_m + (ctas/g)·tile_n.
fn auto_group_m(ctas: u32, tile_n: u32) -> u32 {
    ((ctas as f64 * tile_n as f64 / WEFT_GEMM_TILE_M as f64)
        .sqrt()
        .round() as u32)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> GemmOptions {
        GemmOptions::default()
    }

    /// The refusal's text, once its kind is `kind` (by name).
    fn refusal(r: Result<GemmPlan, GemmError>, kind: &str) -> String {
        let e = r.expect_err("the plan was accepted");
        let got = match &e {
            GemmError::Shape(_) => "Shape",
            GemmError::Options(_) => "Options",
            GemmError::Length(_) => "Length",
            GemmError::Unsupported(_) => "Unsupported",
            _ => "another kind",
        };
        assert_eq!(got, kind, "{e:?}");
        e.to_string()
    }

    #[test]
    fn rejects_shapes_that_are_not_multiples_of_16() {
        let e = refusal(
            GemmPlan::new(132, GemmShape::new(1000, 512, 256), opts()),
            "Shape",
        );
        assert!(e.contains("m = 1000 is not a multiple of 16"), "{e}");
        let e = refusal(
            GemmPlan::new(132, GemmShape::new(1024, 512, 24), opts()),
            "Shape",
        );
        assert!(e.contains("k = 24"), "{e}");
        let e = refusal(
            GemmPlan::new(132, GemmShape::new(0, 512, 256), opts()),
            "Shape",
        );
        assert!(e.contains("m is 0"), "{e}");
    }

    #[test]
    fn rejects_f32_inputs_and_too_many_reserved_sms() {
        let e = refusal(
            GemmPlan::new(
                132,
                GemmShape::new(256, 256, 256),
                GemmOptions {
                    input: Dtype::F32,
                    ..opts()
                },
            ),
            "Options",
        );
        assert!(e.contains("input dtype f32"), "{e}");
        let e = refusal(
            GemmPlan::new(
                132,
                GemmShape::new(256, 256, 256),
                GemmOptions {
                    sm_margin: 130,
                    comm_ctas: 2,
                    ..opts()
                },
            ),
            "Options",
        );
        assert!(e.contains("leaves no SM"), "{e}");
    }

    #[test]
    fn grid_and_names_follow_the_options() {
        let p = GemmPlan::new(
            132,
            GemmShape::new(8192, 8192, 8192),
            GemmOptions {
                sm_margin: 8,
                output: Dtype::F32,
                b_layout: BLayout::KxN,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(p.ctas(), 124);
        assert_eq!(p.tile_n(), 256);
        assert_eq!(p.kernel_name(), "weft_gemm_bf16_f32_kn_256_c1");
        assert_eq!(p.plain_kernel_name(), "weft_gemm_bf16_f32_kn_256_c1_plain");
        // The suffixes kernels/gemm/instantiate.cuh pastes.
        for (set, name) in [
            (FusionSet::None, "weft_gemm_bf16_f32_kn_256_c1_plain"),
            (FusionSet::All, "weft_gemm_bf16_f32_kn_256_c1"),
            (FusionSet::PeerReduce, "weft_gemm_bf16_f32_kn_256_c1_pr"),
            (FusionSet::AllGather, "weft_gemm_bf16_f32_kn_256_c1_ag"),
            (FusionSet::AllReduce, "weft_gemm_bf16_f32_kn_256_c1_ar"),
            (FusionSet::PeerRows, "weft_gemm_bf16_f32_kn_256_c1_a2a"),
        ] {
            assert_eq!(p.method_kernel_name(set), name);
            assert!(p.has_method_kernel(set), "{set:?}");
        }
        // The methods' own kernels exist with the pipelined epilogue only.
        let whole = GemmPlan::new(
            132,
            GemmShape::new(8192, 8192, 8192),
            GemmOptions {
                tile: TileChoice::N256,
                epilogue: EpilogueChoice::WholeTile,
                ..opts()
            },
        )
        .unwrap();
        assert!(whole.whole_tile_epilogue());
        assert!(whole.has_method_kernel(FusionSet::All));
        // 128 × 192 tiles have plain kernels only.
        let n192 = GemmPlan::new(
            132,
            GemmShape::new(8192, 8192, 8192),
            GemmOptions {
                tile: TileChoice::N192,
                ..opts()
            },
        )
        .unwrap();
        assert!(n192.has_method_kernel(FusionSet::None));
        for set in [
            FusionSet::PeerReduce,
            FusionSet::AllGather,
            FusionSet::AllReduce,
            FusionSet::PeerRows,
        ] {
            assert!(!whole.has_method_kernel(set), "{set:?}");
            assert!(!n192.has_method_kernel(set), "{set:?}");
        }
        assert!(!n192.has_method_kernel(FusionSet::All));
        assert_eq!(
            p.plain_split_kernel_name(),
            "weft_gemm_bf16_f32_kn_256_c1_plain_split"
        );
        let p = GemmPlan::new(
            132,
            GemmShape::new(8192, 8192, 8192),
            GemmOptions {
                sm_margin: 7,
                cluster_m: 2,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(p.ctas(), 124, "whole clusters");
        assert_eq!(
            p.kernel_name(),
            "weft_gemm_bf16_bf16_nk_256_c2",
            "K = 8192: pipelined epilogue"
        );
        let short_k = GemmPlan::new(132, GemmShape::new(8192, 8192, 1024), opts()).unwrap();
        assert_eq!(
            short_k.kernel_name(),
            "weft_gemm_bf16_bf16_nk_256_c1",
            "short K: pipelined epilogue too"
        );
        assert!(short_k.smem_bytes() <= 232448);
        assert!(GemmPlan::new(
            132,
            GemmShape::new(256, 256, 256),
            GemmOptions {
                output: Dtype::F32,
                epilogue: EpilogueChoice::WholeTile,
                ..opts()
            }
        )
        .is_err());
        assert!(GemmPlan::new(
            132,
            GemmShape::new(256, 256, 256),
            GemmOptions {
                cluster_m: 2,
                comm_ctas: 3,
                ..opts()
            }
        )
        .is_err());
        assert_eq!(p.tiles(), 64 * 32);
        assert_eq!(p.k_blocks(), 128);
        assert!(p.smem_bytes() <= 232448);
    }

    /// Every kernel a plan can name — fused, plain, and for plans that may split K the plain
    /// split one — is in its input's cubin (the name and its NUL in the ELF string table).
    #[test]
    fn every_kernel_a_plan_names_is_in_the_cubin() {
        use weft_kernels::cubins;
        let has = |image: &[u8], name: &str| {
            let needle = [name.as_bytes(), b"\0"].concat();
            image.windows(needle.len()).any(|w| w == needle)
        };
        let mut split_names = 0;
        for input in [Dtype::Bf16, Dtype::F16] {
            let image = match input {
                Dtype::Bf16 => cubins::GEMM_GEMM_BF16.image,
                _ => cubins::GEMM_GEMM_F16.image,
            };
            for output in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
                for b_layout in [BLayout::NxK, BLayout::KxN] {
                    for tile in [TileChoice::N128, TileChoice::N192, TileChoice::N256] {
                        for cluster_m in [1, 2] {
                            for epilogue in [EpilogueChoice::Pipelined, EpilogueChoice::WholeTile] {
                                let o = GemmOptions {
                                    input,
                                    output,
                                    b_layout,
                                    tile,
                                    cluster_m,
                                    epilogue,
                                    ..opts()
                                };
                                let Ok(p) = GemmPlan::new(132, GemmShape::new(512, 512, 512), o)
                                else {
                                    // whole-tile with a 32-bit output or narrower tiles;
                                    // 192-wide tiles in clusters of 2
                                    continue;
                                };
                                // The fused kernel exists exactly where the plan says so.
                                let name = p.kernel_name();
                                assert_eq!(has(image, &name), p.has_fused_kernel(), "{name}");
                                let name = p.plain_kernel_name();
                                assert!(has(image, &name), "{name} is not in the cubin");
                                let split = GemmPlan::new(
                                    132,
                                    GemmShape::new(512, 512, 512),
                                    GemmOptions {
                                        k_splits: KSplits::Fixed(2),
                                        ..o
                                    },
                                );
                                if let Ok(p) = split {
                                    let name = p.plain_split_kernel_name();
                                    assert!(has(image, &name), "{name} is not in the cubin");
                                    split_names += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        // Every cluster-1 (input, output, layout, tile, epilogue) a plan can split: 2 inputs x
        // (3 outputs x 2 layouts x 128- and 192-wide pipelined, f32 256-wide pipelined x 2
        // layouts, 2 16-bit outputs x 2 layouts x 256-wide whole-tile).
        assert_eq!(split_names, 2 * (3 * 2 * 2 + 2 + 2 * 2));
    }

    /// A rotated order visits every tile once, and its first orders are the rotation's rows.
    #[test]
    fn rotation_keeps_every_tile_once_and_starts_at_the_offset() {
        for cluster_m in [1, 2] {
            let p = GemmPlan::new(
                132,
                GemmShape::new(2048, 1024, 256),
                GemmOptions {
                    cluster_m,
                    tile: TileChoice::N256,
                    ..opts()
                },
            )
            .unwrap();
            let r = p.with_tm_offset(8).unwrap();
            let mut seen: Vec<(u32, u32)> = r.schedule().iter().map(|t| (t.tm, t.tn)).collect();
            let first = r
                .schedule()
                .iter()
                .min_by_key(|t| t.order)
                .map(|t| t.tm)
                .unwrap();
            assert_eq!(first, 8);
            seen.sort();
            let all: Vec<(u32, u32)> = (0..16)
                .flat_map(|tm| (0..4).map(move |tn| (tm, tn)))
                .collect();
            assert_eq!(seen, all);
        }
        let p = GemmPlan::new(
            132,
            GemmShape::new(384, 1024, 256),
            GemmOptions {
                cluster_m: 2,
                ..opts()
            },
        )
        .unwrap();
        assert!(
            p.with_tm_offset(2)
                .unwrap_err()
                .to_string()
                .contains("whole clusters"),
            "3 tile rows with clusters of 2"
        );
    }

    /// Blocks visited in turn: every tile once, consecutive cluster rows of the order in
    /// consecutive blocks, the blocks' own rows in order; with a rotation on top as well.
    #[test]
    fn blocks_in_turn_keep_every_tile_once_and_alternate_owners() {
        for (cluster_m, blocks, offset) in [
            (1, 2, 0),
            (1, 4, 0),
            (2, 2, 0),
            (2, 4, 0),
            (1, 2, 8),
            (2, 4, 4),
        ] {
            let p = GemmPlan::new(
                132,
                GemmShape::new(4096, 1024, 256),
                GemmOptions {
                    cluster_m,
                    tile: TileChoice::N256,
                    group_m: Some(1),
                    ..opts()
                },
            )
            .unwrap();
            let b = p
                .with_tm_blocks(blocks)
                .unwrap()
                .with_tm_offset(offset)
                .unwrap();
            let mut sched = b.schedule();
            sched.sort_by_key(|t| t.order);
            let mut seen: Vec<(u32, u32)> = sched.iter().map(|t| (t.tm, t.tn)).collect();
            seen.sort();
            let all: Vec<(u32, u32)> = (0..32)
                .flat_map(|tm| (0..4).map(move |tn| (tm, tn)))
                .collect();
            assert_eq!(seen, all, "cluster {cluster_m} blocks {blocks}");
            // group_m 1: the order walks one cluster row at a time, across the columns.
            let rows: Vec<u32> = sched
                .iter()
                .step_by(4 * cluster_m as usize)
                .map(|t| t.tm / cluster_m * cluster_m)
                .collect();
            let per_block = 32 / blocks;
            for (u, &tm) in rows.iter().enumerate() {
                let unrotated = (tm + 32 - offset) % 32;
                assert_eq!(
                    unrotated / per_block,
                    u as u32 % blocks,
                    "cluster {cluster_m} blocks {blocks}: row {u} of the order is tile row {tm}"
                );
            }
        }
        let p = GemmPlan::new(132, GemmShape::new(384, 1024, 256), opts()).unwrap();
        assert!(
            p.with_tm_blocks(2)
                .unwrap_err()
                .to_string()
                .contains("equal blocks"),
            "3 tile rows in 2 blocks"
        );
    }

    #[test]
    fn auto_tile_prefers_fewer_waves() {
        // 2048x1024: 16x4 = 64 tiles of 128x256 (one partial wave of 132) vs 128 tiles of 128x128
        // (also one wave): same waves, half the tile area -> 128 wins.
        let p = GemmPlan::new(132, GemmShape::new(2048, 1024, 1024), opts()).unwrap();
        assert_eq!(p.tile_n(), 128);
        let p = GemmPlan::new(132, GemmShape::new(8192, 8192, 1024), opts()).unwrap();
        assert_eq!(p.tile_n(), 256);
    }

    #[test]
    fn auto_plain_takes_192_where_it_saves_a_wave_or_fills_one() {
        let plain = |cluster_m| GemmOptions {
            tile: TileChoice::AutoPlain,
            cluster_m,
            ..opts()
        };
        // 512 x 6144: 4 x 24 = 96 tiles of 128 x 256 (one wave, 36 SMs idle) or 4 x 32 = 128 of
        // 128 x 192 (one wave): 32768 against 24576 / 0.96 = 25600 elements per CTA -> 192.
        let shape = GemmShape::new(512, 6144, 4096);
        let p = GemmPlan::new(132, shape, plain(1)).unwrap();
        assert_eq!((p.tile_n(), p.has_fused_kernel()), (192, false));
        // Auto keeps to the widths with fused kernels; clusters of 2 have no 192 kernel.
        assert_eq!(GemmPlan::new(132, shape, opts()).unwrap().tile_n(), 256);
        assert_eq!(GemmPlan::new(132, shape, plain(2)).unwrap().tile_n(), 256);
        // 3008 x 7168: 24 x 28 = 672 tiles of 128 x 256 (6 waves: 196608) or 24 x 38 = 912 of
        // 128 x 192 (7 waves: 172032 / 0.96 = 179200) -> 192.
        let p = GemmPlan::new(132, GemmShape::new(3008, 7168, 8192), plain(1)).unwrap();
        assert_eq!(p.tile_n(), 192);
        // 8192 x 8192: 64 x 32 = 2048 tiles (16 waves: 524288) against 64 x 43 = 2752 (21 waves:
        // 516096 / 0.96 = 537600) -> 256.
        let p = GemmPlan::new(132, GemmShape::new(8192, 8192, 4096), plain(1)).unwrap();
        assert_eq!(p.tile_n(), 256);
        // Auto never plans 192, whatever the shape (its plans must serve fused launches).
        for m in (256..=8192).step_by(752) {
            for n in (256..=16384).step_by(1040) {
                let p = GemmPlan::new(132, GemmShape::new(m, n, 1024), opts()).unwrap();
                assert_ne!(p.tile_n(), 192, "{m} x {n}");
            }
        }
        // A fused method's check names the tile and the choices that have fused kernels.
        let e = GemmPlan::new(132, shape, plain(1))
            .unwrap()
            .require_fused_kernel()
            .unwrap_err();
        assert!(
            format!("{e}").contains("128x192 tiles have plain kernels only"),
            "{e}"
        );
        GemmPlan::new(132, shape, opts())
            .unwrap()
            .require_fused_kernel()
            .unwrap();
        // 192 in clusters of 2 is refused by name.
        let e = GemmPlan::new(
            132,
            shape,
            GemmOptions {
                tile: TileChoice::N192,
                cluster_m: 2,
                ..opts()
            },
        )
        .unwrap_err();
        assert!(format!("{e}").contains("clusters of 1 only"), "{e}");
    }

    #[test]
    fn split_k_is_chosen_where_tiles_leave_sms_idle() {
        // 512 x 1280: 40 tiles of 128 x 128 on 132 CTAs, 128 K blocks: 3 splits fill 120 CTAs.
        let p = GemmPlan::new(132, GemmShape::new(512, 1280, 8192), opts()).unwrap();
        assert_eq!((p.tile_n(), p.k_splits()), (128, 3));
        assert!(p.describe().ends_with("split_k 3"), "{}", p.describe());
        // The splits cover K once, in order, none empty.
        let ranges: Vec<_> = (0..3).map(|s| p.split_k_blocks(s)).collect();
        assert_eq!(ranges, vec![0..42, 42..85, 85..128]);
        // Many tiles, or a short K: none.
        for shape in [
            GemmShape::new(16384, 8192, 8192),
            GemmShape::new(512, 1280, 128),
            GemmShape::new(16, 16, 16),
        ] {
            assert_eq!(
                GemmPlan::new(132, shape, opts()).unwrap().k_splits(),
                1,
                "{shape}"
            );
        }
        // Clusters and communicator CTAs run whole tiles, as a 16-bit 128 x 256 plan that asks
        // for the pipelined epilogue (the split kernel would need the whole-tile one).
        for o in [
            GemmOptions {
                cluster_m: 2,
                ..opts()
            },
            GemmOptions {
                comm_ctas: 4,
                ..opts()
            },
            GemmOptions {
                tile: TileChoice::N256,
                epilogue: EpilogueChoice::Pipelined,
                ..opts()
            },
        ] {
            let p = GemmPlan::new(132, GemmShape::new(512, 1280, 8192), o).unwrap();
            assert_eq!(p.k_splits(), 1);
        }
        // A 16-bit 128 x 256 plan (at any K) splits only when asked for the whole-tile
        // epilogue, or asked to split (then it takes that epilogue).
        let n256 = |epilogue, k_splits| GemmOptions {
            tile: TileChoice::N256,
            epilogue,
            k_splits,
            ..opts()
        };
        let shape = GemmShape::new(512, 2048, 8192);
        let plan = |o| GemmPlan::new(132, shape, o).unwrap();
        assert_eq!(
            plan(n256(EpilogueChoice::Auto, KSplits::Auto)).k_splits(),
            1
        );
        let p = plan(n256(EpilogueChoice::WholeTile, KSplits::Auto));
        assert!(
            p.k_splits() > 1 && p.whole_tile_epilogue(),
            "{}",
            p.describe()
        );
        let p = plan(n256(EpilogueChoice::Auto, KSplits::Fixed(2)));
        assert!(
            p.k_splits() == 2 && p.whole_tile_epilogue(),
            "{}",
            p.describe()
        );
    }

    #[test]
    fn split_k_requests_are_checked() {
        let shape = GemmShape::new(512, 1280, 1024); // 16 K blocks
        let err = |o: GemmOptions| format!("{:#}", GemmPlan::new(132, shape, o).unwrap_err());
        let fixed = |s| GemmOptions {
            k_splits: KSplits::Fixed(s),
            ..opts()
        };
        assert!(err(fixed(0)).contains("k_splits = 0 must be 1 to 16"));
        assert!(err(fixed(17)).contains("k_splits = 17"));
        let short = GemmPlan::new(132, GemmShape::new(512, 1280, 128), fixed(3)).unwrap_err();
        assert!(
            format!("{short:#}").contains("at most the 2 K blocks"),
            "{short:#}"
        );
        assert!(err(GemmOptions {
            cluster_m: 2,
            ..fixed(2)
        })
        .contains("needs cluster_m 1 and no communicator CTAs"));
        assert!(err(GemmOptions {
            tile: TileChoice::N256,
            epilogue: EpilogueChoice::Pipelined,
            ..fixed(2)
        })
        .contains("needs the whole-tile epilogue"));
        // f32 outputs keep the pipelined epilogue; 16 splits of one K block each are fine.
        let p = GemmPlan::new(
            132,
            shape,
            GemmOptions {
                output: Dtype::F32,
                tile: TileChoice::N256,
                epilogue: EpilogueChoice::Pipelined,
                ..fixed(16)
            },
        )
        .unwrap();
        assert_eq!(p.k_splits(), 16);
        assert_eq!(p.split_k_blocks(15), 15..16);
    }

    mod hostile_options {
        use super::*;
        use proptest::prelude::*;

        /// A dimension: mostly near the sizes GEMMs have, sometimes anything at all.
        fn dim() -> impl Strategy<Value = u32> {
            prop_oneof![
                4 => (0u32..=2048).prop_map(|v| v * 16),
                1 => 0u32..=40_000,
                1 => any::<u32>(),
                1 => (1u32..=(1 << 27)).prop_map(|v| v * 16),
            ]
        }

        fn options() -> impl Strategy<Value = GemmOptions> {
            (
                (0usize..3, 0usize..3, any::<bool>(), 0usize..5, 0usize..3),
                (
                    prop_oneof![0u32..=140, any::<u32>()],
                    prop_oneof![0u32..=140, any::<u32>()],
                ),
                (
                    0u32..=3,
                    any::<bool>(),
                    prop_oneof![Just(None), (0u32..=70).prop_map(Some)],
                ),
                prop_oneof![Just(KSplits::Auto), (0u32..=20).prop_map(KSplits::Fixed)],
                prop_oneof![
                    Just(1.0f32),
                    Just(f32::NAN),
                    Just(f32::INFINITY),
                    -4.0f32..4.0
                ],
            )
                .prop_map(
                    |(
                        (i, o, nk, t, e),
                        (sm_margin, comm_ctas),
                        (cluster_m, dynamic, group_m),
                        k_splits,
                        beta,
                    )| {
                        let dtypes = [Dtype::Bf16, Dtype::F16, Dtype::F32];
                        GemmOptions {
                            input: dtypes[i],
                            output: dtypes[o],
                            b_layout: if nk { BLayout::NxK } else { BLayout::KxN },
                            sm_margin,
                            comm_ctas,
                            tile: [
                                TileChoice::Auto,
                                TileChoice::AutoPlain,
                                TileChoice::N128,
                                TileChoice::N192,
                                TileChoice::N256,
                            ][t],
                            group_m,
                            cluster_m,
                            epilogue: [
                                EpilogueChoice::Auto,
                                EpilogueChoice::Pipelined,
                                EpilogueChoice::WholeTile,
                            ][e],
                            scheduling: if dynamic {
                                Scheduling::Dynamic
                            } else {
                                Scheduling::Static
                            },
                            k_splits,
                            alpha: 1.0,
                            beta,
                        }
                    },
                )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]
            /// Whatever it is given, GemmPlan::new returns (no panic) and accepts only what the
            /// kernels can run, checked here against the rules written out independently: shape
            /// and dtypes, SMs, clusters, tile and epilogue, splits, the 32-bit counts of the
            /// schedule, shared memory, and the kernels it names being in the cubin.
            #[test]
            fn accepts_only_what_the_kernels_run(
                m in dim(), n in dim(), k in dim(), sms in prop_oneof![Just(132u32), 0u32..=200], o in options()
            ) {
                let shape = GemmShape::new(m, n, k);
                let Ok(p) = GemmPlan::new(sms, shape, o) else { return Ok(()); };
                for v in [m, n, k] {
                    prop_assert!(v > 0 && v % 16 == 0 && v < (1 << 31));
                }
                prop_assert!(matches!(o.input, Dtype::Bf16 | Dtype::F16));
                prop_assert!(o.beta.is_finite());
                prop_assert!((o.sm_margin as u64 + o.comm_ctas as u64) < sms as u64);
                prop_assert!(matches!(o.cluster_m, 1 | 2));
                prop_assert!(o.scheduling == Scheduling::Static || o.cluster_m == 1);
                prop_assert!(p.ctas() > 0 && p.ctas() % o.cluster_m == 0);
                prop_assert!(p.ctas() <= sms - o.sm_margin - o.comm_ctas);
                let tile_n = p.tile_n();
                prop_assert!([128, 192, 256].contains(&tile_n));
                prop_assert!(tile_n != 192 || o.cluster_m == 1);
                if !matches!(o.tile, TileChoice::AutoPlain | TileChoice::N192) {
                    prop_assert!(tile_n != 192);
                }
                if p.whole_tile_epilogue() {
                    prop_assert!(o.output.bytes() == 2 && tile_n == 256);
                }
                let k_blocks = k.div_ceil(64);
                let splits = p.k_splits();
                prop_assert!((1..=16).contains(&splits) && splits <= k_blocks);
                prop_assert!(splits == 1 || (o.cluster_m == 1 && o.comm_ctas == 0));
                let tiles = (m as u64).div_ceil(128) * (n as u64).div_ceil(tile_n as u64);
                let orders = (m as u64).div_ceil(128).div_ceil(o.cluster_m as u64) * o.cluster_m as u64 * (n as u64).div_ceil(tile_n as u64);
                prop_assert!(orders * splits as u64 <= u32::MAX as u64);
                prop_assert_eq!(p.orders() as u64, orders);
                prop_assert!(tiles <= orders);
                prop_assert!(p.smem_bytes() <= 232_448);
                let image = match o.input {
                    Dtype::Bf16 => weft_kernels::cubins::GEMM_GEMM_BF16.image,
                    _ => weft_kernels::cubins::GEMM_GEMM_F16.image,
                };
                let has = |name: &str| {
                    let needle = [name.as_bytes(), b"\0"].concat();
                    image.windows(needle.len()).any(|w| w == needle)
                };
                prop_assert!(has(&p.plain_kernel_name()), "{}", p.plain_kernel_name());
                prop_assert_eq!(has(&p.kernel_name()), p.has_fused_kernel());
                if splits > 1 {
                    prop_assert!(has(&p.plain_split_kernel_name()), "{}", p.plain_split_kernel_name());
                }
            }
        }
    }
}
