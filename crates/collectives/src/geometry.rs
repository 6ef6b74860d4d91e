//! Which kernel path a call takes and how it is cut into rounds and blocks: pure functions of the
//! call's size, the world and the options, the same on every rank.

use weft_kernels::abi;

/// The kernel's algorithm (`weft_collective_params.algo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Every rank pushes its whole input to every peer and sums locally: (world − 1) × size over
    /// the links per rank, one round trip of latency.
    AllReduceOneShot,
    /// Reduce-scatter push, the owner sums its shard, all-gather push: 2 (world − 1) / world × size
    /// per rank, two round trips.
    AllReduceTwoShot,
    ReduceScatter,
    AllGather,
}

impl Algorithm {
    pub fn code(self) -> i32 {
        (match self {
            Algorithm::AllReduceOneShot => abi::WEFT_COLL_ALL_REDUCE_ONE_SHOT,
            Algorithm::AllReduceTwoShot => abi::WEFT_COLL_ALL_REDUCE_TWO_SHOT,
            Algorithm::ReduceScatter => abi::WEFT_COLL_REDUCE_SCATTER,
            Algorithm::AllGather => abi::WEFT_COLL_ALL_GATHER,
        }) as i32
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::AllReduceOneShot => "all_reduce one-shot",
            Algorithm::AllReduceTwoShot => "all_reduce two-shot",
            Algorithm::ReduceScatter => "reduce_scatter",
            Algorithm::AllGather => "all_gather",
        }
    }
}

/// How an AllReduce is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReduceChoice {
    /// One-shot at two ranks (it moves as many bytes as two-shot there, with one round trip less)
    /// and up to [`ONE_SHOT_MAX_BYTES`] beyond ([`ONE_SHOT_MAX_BYTES_SIMPLE`] where the two-shot
    /// would take the simple protocol); two-shot above.
    #[default]
    Auto,
    OneShot,
    TwoShot,
}

/// Above this size, at more than two ranks, `Auto` takes two-shot when the two-shot would go by
/// the sentinel protocol. With the sentinel protocol in both (commit 571ba02, four H200s, graph
/// replay), two-shot took 7.7 µs against one-shot's 8.9 at 512 KiB and world 4 (6.7 against 7.2
/// at world 3), 9.7 against 13.3 at 1 MiB; one-shot 6.5 against 7.2 at 256 KiB (5.4 against 6.0
/// at world 3): `results/collectives/sweep-nvidia-h200-x4-2026-11-27-571ba02/`. With the launches
/// spread over their blocks (26e694a): one-shot 6.33 against 6.38 at 256 KiB and world 4, 8.70
/// against 7.20 at 512 KiB (world 3: 5.20 against 5.57, 6.99 against 6.42):
/// `results/collectives/spread-nvidia-h200-x4-2026-11-27/one-vs-two-shot/`.
pub const ONE_SHOT_MAX_BYTES: u64 = 256 << 10;

/// As [`ONE_SHOT_MAX_BYTES`] when the two-shot would go by the simple protocol (at 512 KiB
/// one-shot took 20.5 µs against two-shot's best 21.3 at four H200s, 17.8 against 19.9 at three:
/// `results/collectives/sweep-nvidia-h200-x4-2026-11-26/`).
pub const ONE_SHOT_MAX_BYTES_SIMPLE: u64 = 512 << 10;

/// The AllReduce algorithm for a call of `bytes` at `world` ranks; `sentinel_two_shot`: a two-shot
/// of this call would go by the sentinel protocol.
pub fn all_reduce_algorithm(
    choice: AllReduceChoice,
    world: usize,
    bytes: u64,
    sentinel_two_shot: bool,
) -> Algorithm {
    let one_shot_max = if sentinel_two_shot {
        ONE_SHOT_MAX_BYTES
    } else {
        ONE_SHOT_MAX_BYTES_SIMPLE
    };
    match choice {
        AllReduceChoice::OneShot => Algorithm::AllReduceOneShot,
        AllReduceChoice::TwoShot => Algorithm::AllReduceTwoShot,
        AllReduceChoice::Auto if world <= 2 || bytes <= one_shot_max => Algorithm::AllReduceOneShot,
        AllReduceChoice::Auto => Algorithm::AllReduceTwoShot,
    }
}

/// How data travel (`weft_collective_params.protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Data into staging slots, then a release flag per block and round: full link bandwidth.
    Simple,
    /// Low latency, one round: each 4-byte word travels with its round number in one 8-byte
    /// store and the receiver polls the words themselves (no flag, no fence); half the bandwidth.
    LowLatency,
    /// One round, Lamport-style: data pushed in place (16-byte stores) into slots that hold a
    /// sentinel (every bit set) where no data is; the receiver polls until no element of a vector
    /// is the sentinel, uses it and sets it back. One NVLink hop of latency, full bandwidth.
    Sentinel,
}

impl Protocol {
    pub fn code(self) -> i32 {
        (match self {
            Protocol::Simple => abi::WEFT_COLL_PROTO_SIMPLE,
            Protocol::LowLatency => abi::WEFT_COLL_PROTO_LL,
            Protocol::Sentinel => abi::WEFT_COLL_PROTO_SENTINEL,
        }) as i32
    }
}

/// An LL launch gets a block per [`THREADS`] words (one word per thread: its latency is one poll
/// per word a thread owns), at least [`LL_MIN_BLOCKS`] and at most [`LL_MAX_BLOCKS`] (the
/// sweep on two, three and four H200s: 16 blocks took AllReduce from 8 to 64 KiB about 1 µs
/// below 1–8 blocks, and 64 blocks beat 16–32 on AllReduce at 128–256 KiB; ReduceScatter and
/// AllGather at 4–8 KiB moved by at most 0.25 µs either way, and at 128 KiB on four GPUs 16
/// blocks beat 64 by 0.3–0.4 µs there — one rule for all three ops, measured before and after in
/// `results/collectives/before-after-nvidia-h200-x4-2026-11-26/`).
pub const LL_MIN_BLOCKS: u32 = 16;
pub const LL_MAX_BLOCKS: u32 = 64;
/// A sentinel launch gets a block per [`SENTINEL_BYTES_PER_BLOCK`] of what a rank sends each peer,
/// between [`SENTINEL_MIN_BLOCKS`] and [`SENTINEL_MAX_BLOCKS`], and the vectors spread evenly over
/// the blocks: a thread per 16-byte vector, whole warps, at most [`THREADS`] a block
/// ([`sentinel_threads`]). Spread this way, a small call's NVLink stores leave from every block's
/// SM instead of from the first few blocks' (512 vectors each before); on two and four H200s
/// that took up to 0.3 µs (world 2) and 0.6 µs (world 4) off calls of 8 KiB to 1 MiB, 64 blocks
/// beat 16–32 from 128 KiB a peer and 128 from 256 KiB; below that, 64 blocks were within
/// 0.05 µs of the better of 16 and 32 either way and up to 0.1 µs ahead of the count a block per
/// 2 KiB gave (the blocks beyond the vectors' warps idle):
/// `results/collectives/spread-nvidia-h200-x4-2026-11-27/`. Before, with 512
/// threads a block: `results/collectives/kernel-ab-nvidia-h200-x2-2026-11-27/sentinel.log`,
/// `results/collectives/sweep-nvidia-h200-x4-2026-11-27-6ac0cc8/`.
pub const SENTINEL_BYTES_PER_BLOCK: u64 = 2 << 10;
pub const SENTINEL_MIN_BLOCKS: u32 = 64;
pub const SENTINEL_MAX_BLOCKS: u32 = 128;
/// Threads per block of the collective kernels (kThreads in collectives.cu): every launch of the
/// simple and LL protocols has exactly this many (the simple protocol's loops assume it).
pub const THREADS: u32 = 512;

/// Threads a block of a sentinel launch of `blocks` blocks gets for `vectors` 16-byte vectors
/// per peer: an even share, in whole warps, at most [`THREADS`] (more vectors than threads: the
/// kernel's threads take several, strided over the grid).
pub fn sentinel_threads(vectors: u64, blocks: u32) -> u32 {
    let warps = vectors.div_ceil(u64::from(blocks.max(1))).div_ceil(32);
    warps.clamp(1, u64::from(THREADS / 32)) as u32 * 32
}

/// Rounds up to this many bytes (per sender and receiver) get a block per [`BYTES_PER_BLOCK`].
pub const SMALL_ROUND_BYTES: u64 = 4 << 20;

/// Bytes one block pushes per round (per peer) before another block is added, when the caller
/// does not fix the block count (8 KiB: at three and four H200s a block per 32 KiB left rounds of
/// 0.3–1.3 MiB 5–60 % slower than 64 blocks; at two the two agreed).
pub const BYTES_PER_BLOCK: u64 = 8 << 10;

/// A launch's cut: `weft_collective_params` fields and the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub protocol: Protocol,
    pub count: u64,
    pub shard: u64,
    pub window: u64,
    pub rounds: u32,
    pub blocks: u32,
    /// Threads per block: [`THREADS`], or fewer for a small sentinel launch.
    pub threads: u32,
}

/// The limits a cut obeys (from [`crate::Options`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub slot_bytes: u64,
    /// Bytes of one sentinel slot (a multiple of 16); payloads up to this that are whole 16-byte
    /// vectors go by the sentinel protocol; 0 never.
    pub sentinel_bytes: u64,
    /// Largest payload per sender (bytes) sent with the LL protocol; 0 never.
    pub ll_max_bytes: u64,
    pub blocks: Option<u32>,
    pub max_blocks: u32,
}

/// `count` as the kernel reads it (AllReduce: the buffer; ReduceScatter: the output per rank;
/// AllGather: the input per rank). `count` > 0, `slot_bytes` a positive multiple of 16.
/// Sentinel where the payload is whole 16-byte vectors and what a rank sends each peer in a round
/// (two-shot: a shard of whole vectors, two rounds, every shard holding data) fits a sentinel
/// slot; else LL where the algorithm allows it (not two-shot) and the payload fits both
/// `ll_max_bytes` and a slot at 8 bytes per 4-byte word; else the simple protocol in rounds.
/// None when the call would take more than u32::MAX rounds, or its size in bytes (or rounded
/// up to whole 16-byte vectors) would pass 2^64.
pub fn geometry(
    algo: Algorithm,
    count: u64,
    world: usize,
    elem_bytes: usize,
    limits: Limits,
) -> Option<Geometry> {
    let Limits {
        slot_bytes,
        sentinel_bytes,
        ll_max_bytes,
        blocks,
        max_blocks,
    } = limits;
    // None beyond 2^64 bytes (no buffer is that large; wrapping would pick LL for a huge call).
    let payload = count.checked_mul(elem_bytes as u64)?;
    let words = payload.div_ceil(4);
    let vec = (16 / elem_bytes) as u64;
    // What each rank sends each peer per round: two-shot, a shard of whole vectors; else all.
    let shard = match algo {
        Algorithm::AllReduceTwoShot => count
            .div_ceil(world as u64)
            .div_ceil(vec)
            .checked_mul(vec)?,
        _ => count,
    };
    if payload.is_multiple_of(16) {
        let rounds = if algo == Algorithm::AllReduceTwoShot {
            2
        } else {
            1
        };
        let sent = shard.checked_mul(elem_bytes as u64)?; // per sender and round
                                                          // Two-shot only where every shard holds data: then each rank's round R + 3 sends wait for
                                                          // data the receiver sent after its round-R launch ended (collectives.cu); with empty
                                                          // shards that would hold only through a third rank.
        let every_shard = rounds == 1 || shard.saturating_mul(world as u64 - 1) < count;
        if sent <= sentinel_bytes && every_shard {
            let auto = sent
                .div_ceil(SENTINEL_BYTES_PER_BLOCK)
                .clamp(SENTINEL_MIN_BLOCKS.into(), SENTINEL_MAX_BLOCKS.into())
                as u32;
            let blocks = blocks.unwrap_or(auto).clamp(1, max_blocks);
            return Some(Geometry {
                protocol: Protocol::Sentinel,
                count,
                shard,
                window: shard,
                rounds,
                blocks,
                threads: sentinel_threads(sent / 16, blocks),
            });
        }
    }
    // 8 bytes a word in the slot (words ≤ slot / 8: no product to wrap).
    if algo != Algorithm::AllReduceTwoShot && payload <= ll_max_bytes && words <= slot_bytes / 8 {
        let auto =
            (words.div_ceil(THREADS as u64).min(LL_MAX_BLOCKS as u64) as u32).max(LL_MIN_BLOCKS);
        return Some(Geometry {
            protocol: Protocol::LowLatency,
            count,
            shard: count,
            window: count,
            rounds: 1,
            blocks: blocks.unwrap_or(auto).clamp(1, max_blocks),
            threads: THREADS,
        });
    }
    let slot_elems = slot_bytes / elem_bytes as u64;
    let window = slot_elems.min(shard.div_ceil(vec).checked_mul(vec)?);
    let rounds = u32::try_from(shard.div_ceil(window)).ok()?;
    let window_bytes = window * elem_bytes as u64;
    // Up to 4 MiB a round: a block per 8 KiB, at most 64 (more blocks cost more than they move
    // there); larger rounds: every block allowed (their release fences then overlap the most).
    let auto = if window_bytes <= SMALL_ROUND_BYTES {
        (window_bytes.div_ceil(BYTES_PER_BLOCK) as u32).min(64)
    } else {
        max_blocks
    };
    let blocks = blocks.unwrap_or(auto).clamp(1, max_blocks);
    Some(Geometry {
        protocol: Protocol::Simple,
        count,
        shard,
        window,
        rounds,
        blocks,
        threads: THREADS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_one_shot_at_two_ranks_and_for_small_sizes() {
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::Auto, 2, 1 << 30, false),
            Algorithm::AllReduceOneShot
        );
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::Auto, 8, 4096, true),
            Algorithm::AllReduceOneShot
        );
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::Auto, 8, 256 << 10, true),
            Algorithm::AllReduceOneShot
        );
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::Auto, 8, (256 << 10) + 1, true),
            Algorithm::AllReduceTwoShot
        );
        // Where the two-shot would take the simple protocol: one-shot up to 512 KiB.
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::Auto, 8, 512 << 10, false),
            Algorithm::AllReduceOneShot
        );
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::Auto, 8, (512 << 10) + 1, false),
            Algorithm::AllReduceTwoShot
        );
        assert_eq!(
            all_reduce_algorithm(AllReduceChoice::TwoShot, 2, 16, true),
            Algorithm::AllReduceTwoShot
        );
    }

    #[test]
    fn rounds_cover_the_shard_in_whole_vectors() {
        for (algo, count, world, eb) in [
            (Algorithm::AllReduceOneShot, 1, 2, 4),
            (Algorithm::AllReduceOneShot, 1_000_003, 2, 2),
            (Algorithm::AllReduceTwoShot, 7, 3, 4),
            (Algorithm::AllReduceTwoShot, (1 << 28) + 5, 8, 2),
            (Algorithm::ReduceScatter, 12345, 4, 4),
            (Algorithm::AllGather, 1 << 26, 2, 4),
        ] {
            let g = geometry(algo, count, world, eb, simple(32)).unwrap();
            let vec = 16 / eb as u64;
            assert_eq!(g.window % vec, 0, "{algo:?} {count}");
            assert!(g.window * eb as u64 <= 4 << 20);
            assert!(
                g.window * g.rounds as u64 >= g.shard,
                "{algo:?} {count}: rounds leave a gap"
            );
            assert!(
                g.window * (g.rounds as u64 - 1) < g.shard,
                "{algo:?} {count}: an empty round"
            );
            assert!((1..=32).contains(&g.blocks));
            if algo == Algorithm::AllReduceTwoShot {
                assert!(g.shard * world as u64 >= count && g.shard.is_multiple_of(vec));
            }
        }
    }

    #[test]
    fn blocks_grow_with_the_round_and_respect_the_cap() {
        let small = geometry(Algorithm::AllReduceOneShot, 1024, 2, 4, simple(32)).unwrap();
        assert_eq!((small.rounds, small.blocks), (1, 1));
        let mid = geometry(Algorithm::AllReduceOneShot, 1 << 16, 2, 4, simple(64)).unwrap();
        assert_eq!(mid.blocks, 32); // 256 KiB / 8 KiB
        let capped = geometry(Algorithm::AllReduceOneShot, 1 << 20, 2, 4, simple(128)).unwrap();
        assert_eq!(capped.blocks, 64); // 4 MiB round: at most 64
        let large = Limits {
            slot_bytes: 16 << 20,
            ..simple(128)
        };
        let large = geometry(Algorithm::AllReduceOneShot, 1 << 22, 2, 4, large).unwrap();
        assert_eq!((large.rounds, large.blocks), (1, 128)); // a 16 MiB round: every block
        let fixed = geometry(
            Algorithm::AllGather,
            1 << 18,
            2,
            4,
            Limits {
                blocks: Some(200),
                max_blocks: 16,
                ..simple(32)
            },
        )
        .unwrap();
        assert_eq!(fixed.blocks, 16);
    }

    #[test]
    fn too_many_rounds_is_none() {
        let tiny = Limits {
            slot_bytes: 16,
            ..simple(1)
        };
        assert!(geometry(Algorithm::AllGather, 1 << 34, 2, 4, tiny).is_none());
        assert!(geometry(Algorithm::AllGather, 1 << 30, 2, 4, tiny).is_some());
    }

    fn simple(max_blocks: u32) -> Limits {
        Limits {
            slot_bytes: 4 << 20,
            sentinel_bytes: 0,
            ll_max_bytes: 0,
            blocks: None,
            max_blocks,
        }
    }

    #[test]
    fn low_latency_up_to_its_limit_and_never_two_shot() {
        let ll = Limits {
            ll_max_bytes: 64 << 10,
            ..simple(64)
        };
        let g = geometry(Algorithm::AllReduceOneShot, 16 << 10, 2, 4, ll).unwrap(); // 64 KiB
        assert_eq!(
            (g.protocol, g.rounds, g.blocks),
            (Protocol::LowLatency, 1, 32)
        ); // 16 Ki words / 512 threads
        let tiny = geometry(Algorithm::AllReduceOneShot, 16, 2, 4, ll).unwrap();
        assert_eq!(tiny.blocks, LL_MIN_BLOCKS);
        let wide = Limits {
            ll_max_bytes: 1 << 20,
            max_blocks: 128,
            ..ll
        };
        let big = geometry(Algorithm::AllReduceOneShot, 1 << 18, 2, 4, wide).unwrap(); // 1 MiB
        assert_eq!(
            (big.protocol, big.blocks),
            (Protocol::LowLatency, LL_MAX_BLOCKS)
        );
        let few = Limits {
            max_blocks: 4,
            ..ll
        };
        assert_eq!(
            geometry(Algorithm::AllReduceOneShot, 16, 2, 4, few)
                .unwrap()
                .blocks,
            4
        );
        assert_eq!(
            geometry(Algorithm::AllReduceOneShot, (16 << 10) + 1, 2, 4, ll)
                .unwrap()
                .protocol,
            Protocol::Simple
        );
        assert_eq!(
            geometry(Algorithm::AllReduceTwoShot, 16, 8, 4, ll)
                .unwrap()
                .protocol,
            Protocol::Simple
        );
        assert_eq!(
            geometry(Algorithm::ReduceScatter, 3, 4, 2, ll)
                .unwrap()
                .protocol,
            Protocol::LowLatency
        );
        // The slot bounds LL too: 8 bytes per word.
        let tight = Limits {
            slot_bytes: 4096,
            ll_max_bytes: 1 << 20,
            ..simple(64)
        };
        assert_eq!(
            geometry(Algorithm::AllGather, 512, 2, 4, tight)
                .unwrap()
                .protocol,
            Protocol::LowLatency
        );
        assert_eq!(
            geometry(Algorithm::AllGather, 513, 2, 4, tight)
                .unwrap()
                .protocol,
            Protocol::Simple
        );
    }

    #[test]
    fn sentinel_for_whole_vectors_up_to_its_slot() {
        let limits = Limits {
            sentinel_bytes: 1 << 20,
            ll_max_bytes: 256 << 10,
            ..simple(128)
        };
        let cut = |algo, count, eb| geometry(algo, count, 2, eb, limits).unwrap();
        let tiny = cut(Algorithm::AllReduceOneShot, 4, 4); // 16 bytes
        assert_eq!(
            (tiny.protocol, tiny.rounds, tiny.blocks),
            (Protocol::Sentinel, 1, SENTINEL_MIN_BLOCKS)
        );
        assert_eq!(tiny.threads, 32);
        // A block per 2 KiB a peer, its vectors spread: 192 KiB, 96 blocks of 128 threads.
        let mid = cut(Algorithm::AllReduceOneShot, 3 << 14, 4);
        assert_eq!((mid.blocks, mid.threads), (96, 128));
        // ReduceScatter counts the output: 16 KiB a peer, 64 blocks (the least) of 32 threads.
        let rs = cut(Algorithm::ReduceScatter, 1 << 12, 4);
        assert_eq!((rs.blocks, rs.threads), (SENTINEL_MIN_BLOCKS, 32));
        let big = cut(Algorithm::AllGather, 1 << 18, 4); // 1 MiB: 128 blocks of 512 threads
        assert_eq!((big.blocks, big.threads), (SENTINEL_MAX_BLOCKS, THREADS));
        assert_eq!(
            cut(Algorithm::ReduceScatter, 8, 2).protocol,
            Protocol::Sentinel
        );
        // Not whole vectors: LL; above the sentinel slot: simple.
        assert_eq!(
            cut(Algorithm::AllReduceOneShot, 7, 2).protocol,
            Protocol::LowLatency
        );
        assert_eq!(
            cut(Algorithm::AllReduceOneShot, (1 << 18) + 4, 4).protocol,
            Protocol::Simple
        );
        // Two-shot: shards of whole vectors (here 300 → 152 elements at world 2), two rounds.
        let two = cut(Algorithm::AllReduceTwoShot, 300, 4);
        assert_eq!(
            (two.protocol, two.shard, two.window, two.rounds),
            (Protocol::Sentinel, 152, 152, 2)
        );
        // Shards that would leave the last ones empty (5 vectors at world 8: one-vector shards,
        // ranks 5.. get none): simple.
        let eight = geometry(Algorithm::AllReduceTwoShot, 20, 8, 4, limits).unwrap();
        assert_eq!(eight.protocol, Protocol::Simple);
        let full = geometry(Algorithm::AllReduceTwoShot, 8 * 4, 4, 4, limits).unwrap();
        assert_eq!((full.protocol, full.shard), (Protocol::Sentinel, 8));
        // A shard of just over 1 MiB: simple.
        assert_eq!(
            cut(Algorithm::AllReduceTwoShot, (1 << 19) + 4, 4).protocol,
            Protocol::Simple
        );
        let capped = Limits {
            max_blocks: 8,
            ..limits
        };
        let few = geometry(Algorithm::AllGather, 1 << 18, 2, 4, capped).unwrap();
        // 65536 vectors over 8 blocks: THREADS a block, 16 vectors a thread.
        assert_eq!((few.blocks, few.threads), (8, THREADS));
        // The LL and simple protocols: every launch THREADS a block.
        assert_eq!(cut(Algorithm::AllReduceOneShot, 7, 2).threads, THREADS);
        assert_eq!(
            cut(Algorithm::AllReduceOneShot, (1 << 18) + 4, 4).threads,
            THREADS
        );
    }

    #[test]
    fn sentinel_threads_share_the_vectors_in_whole_warps() {
        assert_eq!(sentinel_threads(1, 16), 32);
        assert_eq!(sentinel_threads(16 * 32, 16), 32);
        assert_eq!(sentinel_threads(16 * 32 + 1, 16), 64);
        assert_eq!(sentinel_threads(16 * 512, 16), THREADS);
        assert_eq!(sentinel_threads(u64::MAX, 1), THREADS);
        assert_eq!(sentinel_threads(100, 0), 128); // no blocks: as one
    }

    /// Hostile sizes and limits (counts up to 2^64, any world, any slot, LL limit and block
    /// request): geometry never panics, and every cut it returns keeps the kernel inside its
    /// staging slots and covers the data — checked in 128-bit arithmetic written out here.
    mod hostile_sizes {
        use super::super::*;
        use proptest::prelude::*;

        fn algorithm() -> impl Strategy<Value = Algorithm> {
            prop_oneof![
                Just(Algorithm::AllReduceOneShot),
                Just(Algorithm::AllReduceTwoShot),
                Just(Algorithm::ReduceScatter),
                Just(Algorithm::AllGather),
            ]
        }

        fn count() -> impl Strategy<Value = u64> {
            // Small, large, any, and where count × element size or the rounding to whole
            // vectors passes 2^64.
            prop_oneof![
                1u64..100_000,
                1u64..1 << 40,
                any::<u64>().prop_map(|c| c.max(1)),
                (0u64..1 << 20).prop_map(|k| (1 << 63) + k),
                (0u64..1 << 20).prop_map(|k| (1 << 62) + k),
                (0u64..64).prop_map(|k| u64::MAX - k),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(4096))]
            #[test]
            fn every_cut_fits_its_slots_and_covers_the_data(
                algo in algorithm(),
                count in count(),
                world in 1usize..1025,
                eb in prop_oneof![Just(2usize), Just(4usize)],
                slot_16s in 1u64..=(1 << 26),
                ll_max_bytes in prop_oneof![Just(0u64), 0u64..(1 << 22), any::<u64>()],
                sentinel_16s in prop_oneof![Just(0u64), 0u64..=(1 << 26)],
                blocks in proptest::option::of(any::<u32>()),
                max_blocks in 1u32..=128,
            ) {
                let slot_bytes = 16 * slot_16s; // a positive multiple of 16, at most 1 GiB
                let sentinel_bytes = 16 * sentinel_16s; // as Options::sentinel_bytes_at makes it
                let limits = Limits { slot_bytes, sentinel_bytes, ll_max_bytes, blocks, max_blocks };
                let Some(g) = geometry(algo, count, world, eb, limits) else {
                    return Ok(());
                };
                let (eb, vec) = (eb as u128, 16 / eb as u128);
                let (count128, slot) = (count as u128, slot_bytes as u128);
                prop_assert!((1..=max_blocks).contains(&g.blocks));
                prop_assert_eq!(g.count, count);
                match g.protocol {
                    Protocol::Sentinel => {
                        let (payload, shard) = (count128 * eb, g.shard as u128);
                        prop_assert!(payload % 16 == 0, "sentinel payload {} not whole vectors", payload);
                        prop_assert!(shard * eb <= sentinel_bytes as u128, "sentinel shard of {} bytes", shard * eb);
                        prop_assert_eq!(g.window, g.shard);
                        if algo == Algorithm::AllReduceTwoShot {
                            prop_assert_eq!(g.rounds, 2);
                            prop_assert!(shard * world as u128 >= count128 && shard % vec == 0);
                            prop_assert!(shard * (world as u128 - 1) < count128, "an empty shard");
                        } else {
                            prop_assert_eq!((g.rounds, g.shard), (1, count));
                        }
                        // Whole warps, at most THREADS, and no more warps than the vectors need.
                        let threads = g.threads as u128;
                        prop_assert!(threads.is_multiple_of(32) && (32..=THREADS as u128).contains(&threads));
                        let vectors = shard * eb / 16;
                        prop_assert!(threads == 32 || (threads - 32) * (g.blocks as u128) < vectors,
                            "{} threads a block for {} vectors over {} blocks", threads, vectors, g.blocks);
                        // ... and a thread per vector unless every block has THREADS.
                        prop_assert!(threads == THREADS as u128 || threads * (g.blocks as u128) >= vectors,
                            "{} threads a block leave vectors of {} over {} blocks", threads, vectors, g.blocks);
                    }
                    Protocol::LowLatency => {
                        prop_assert_eq!(g.threads, THREADS);
                        let payload = count128 * eb;
                        prop_assert!(algo != Algorithm::AllReduceTwoShot);
                        prop_assert!(payload <= ll_max_bytes as u128, "LL for {} bytes", payload);
                        prop_assert!(8 * payload.div_ceil(4) <= slot, "LL words overflow the slot");
                        prop_assert_eq!((g.rounds, g.shard, g.window), (1, count, count));
                    }
                    Protocol::Simple => {
                        prop_assert_eq!(g.threads, THREADS);
                        let (shard, window) = (g.shard as u128, g.window as u128);
                        prop_assert!(window >= 1 && window * eb <= slot, "window {} elements", window);
                        prop_assert!(window % vec == 0, "window {} not whole vectors", window);
                        prop_assert!(window * g.rounds as u128 >= shard, "rounds leave a gap");
                        prop_assert!(window * (g.rounds as u128 - 1) < shard, "an empty round");
                        if algo == Algorithm::AllReduceTwoShot {
                            prop_assert!(shard * world as u128 >= count128 && shard % vec == 0);
                        } else {
                            prop_assert_eq!(shard, count128);
                        }
                    }
                }
            }
        }
    }
}
