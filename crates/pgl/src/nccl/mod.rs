//! NCCL communicators created through the rendezvous, with a checked, typed API.
//!
//! Thin by design: each method is one NCCL call on a caller-given stream, returning errors that
//! carry NCCL's own last-error text. Buffers are cudarc device slices; contexts used with this
//! module should have cudarc's event tracking disabled (weft synchronises explicitly).
//!
//! Bounded waits: [`Communicator::synchronize`] waits for a stream's work with NCCL's
//! asynchronous errors polled, at most a budget ([`TIMEOUT_VAR`], default [`DEFAULT_TIMEOUT`]);
//! past it, or on an error, the communicator is aborted (ncclCommAbort, its kernels stop) and the
//! error names the operation, this rank and the budget, and the peers on this host that exited or
//! have made fewer calls on the communicator (progress.rs); every later call fails at once.
//! Init is bounded: the communicator is first made non-blocking (a rank that never joins costs
//! the budget; unless NCCL_COMM_BLOCKING=1, which NCCL lets override the config), then, unless
//! [`NONBLOCKING_VAR`]=1 asks for a non-blocking communicator, a blocking one (NCCL's launch
//! latency per call) is split from it, polled within the budget as well, and the first torn down.
//! Non-blocking, group ends, calls that need connection setup and teardown are bounded by the
//! same budget too; blocking, they are not.

use crate::error::{typed, typed_with, NcclFailure, PglError};
use crate::nccl_budget::{self, Unsettled};
pub use crate::nccl_budget::{timeout_from, Waits, DEFAULT_TIMEOUT, NONBLOCKING_VAR, TIMEOUT_VAR};
use crate::Bootstrap;
use anyhow::{bail, Context};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{result as nc, sys, Id};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod calls;
mod progress;
use calls::Group;
use progress::ProgressBoard;

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Avg,
}

impl ReduceOp {
    fn raw(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        }
    }
}

/// The variable NCCL reads to enable NVLink SHARP (NVLS, multicast), and weft's opt-in to leave
/// it to NCCL. NVLS uses NVLink multicast, which can put shared GPUs out of service: weft's
/// communicators run with it off unless the user asks for it.
pub const NVLS_VAR: &str = "NCCL_NVLS_ENABLE";
pub const NVLS_OPT_IN_VAR: &str = "WEFT_NCCL_NVLS";

/// What [`NVLS_VAR`] must be set to before NCCL reads it, given the two variables' values: "0"
/// unless the user already set it (their choice stands) or opted in with `WEFT_NCCL_NVLS=1`.
pub fn nvls_override(
    nccl_nvls_enable: Option<&str>,
    weft_opt_in: Option<&str>,
) -> Option<&'static str> {
    match (nccl_nvls_enable, weft_opt_in.map(str::trim)) {
        (Some(_), _) => None,
        (None, Some("1")) => None,
        (None, _) => Some("0"),
    }
}

/// Sets NCCL_NVLS_ENABLE=0 in this process (see [`nvls_override`]) before its first
/// communicator: NCCL reads the variable when it initialises a communicator.
fn keep_nvls_off() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let current = std::env::var(NVLS_VAR).ok();
        let opt_in = std::env::var(NVLS_OPT_IN_VAR).ok();
        if let Some(v) = nvls_override(current.as_deref(), opt_in.as_deref()) {
            // Before the process's first NCCL communicator, from the thread that creates it
            // (weft's own threads do not read the environment).
            std::env::set_var(NVLS_VAR, v);
        }
    });
}

/// True when libnccl can be loaded (checked before any NCCL call; a missing library would panic).
pub fn is_available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// An error naming the missing library unless [`is_available`] (`who`: e.g. "rank 3: ").
fn require_nccl(who: &str) -> anyhow::Result<()> {
    if !is_available() {
        return Err(PglError::Unsupported(format!(
            "{who}libnccl.so could not be loaded (install NCCL or set LD_LIBRARY_PATH)"
        ))
        .into());
    }
    Ok(())
}

/// An argument refused before anything was enqueued.
fn nccl_argument(text: String) -> anyhow::Error {
    nccl_error(NcclFailure::Argument, text)
}

/// An NCCL error of `failure` with `text`, as anyhow (the public calls type it again).
fn nccl_error(failure: NcclFailure, text: String) -> anyhow::Error {
    PglError::Nccl { failure, text }.into()
}

/// NCCL's version as (major, minor, patch).
pub fn version() -> Result<(i32, i32, i32), PglError> {
    typed(require_nccl(""))?;
    let v = nc::get_nccl_version().map_err(|e| PglError::Nccl {
        failure: NcclFailure::Failed(e.0 as i32),
        text: format!("ncclGetVersion failed: {e:?}"),
    })?;
    Ok((v / 10000, (v % 10000) / 100, v % 100))
}

/// One rank's member of a communicator spanning every rank of the rendezvous.
pub struct Communicator {
    comm: sys::ncclComm_t,
    ctx: Arc<CudaContext>,
    rank: usize,
    world: usize,
    /// The bound on every wait and whether the communicator is non-blocking.
    waits: Waits,
    /// Set once by [`Communicator::abort`]; `comm` is then never passed to NCCL again (but
    /// by the deferred ncclCommAbort below).
    aborted: AtomicBool,
    /// NCCL groups open on this thread through this communicator; an abort requested inside
    /// one is deferred until the outermost ends (NCCL would otherwise free the communicator
    /// while the group still holds its queued operations).
    groups: AtomicUsize,
    /// An abort requested inside a group, run when the outermost group ends.
    abort_pending: AtomicBool,
    /// This host's progress board of the communicator (none where it could not be made): how
    /// far each local rank is, to name the peer a timed-out wait waits for.
    board: Option<ProgressBoard>,
}

// SAFETY: an ncclComm_t may be used from any thread as long as calls on it are not concurrent;
// `&mut self`-free methods below are each a single enqueue, and weft drives a communicator from
// one thread at a time (the harness holds it behind a Mutex).
unsafe impl Send for Communicator {}

/// Wraps an NCCL call's result with the call's name and NCCL's last-error text.
fn check(
    call: &str,
    comm: sys::ncclComm_t,
    r: Result<nc::NcclStatus, nc::NcclError>,
) -> anyhow::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e) => Err(nccl_error(
            NcclFailure::Failed(e.0 as i32),
            format!("{call} failed: {:?}: {}", e.0, last_error(comm)),
        )),
    }
}

/// NCCL's last error text (for `comm`, or the thread's when null).
fn last_error(comm: sys::ncclComm_t) -> String {
    // SAFETY: ncclGetLastError accepts any communicator (or null) and returns a C string.
    unsafe {
        let p = sys::ncclGetLastError(comm);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A fresh NCCL unique id (rank 0's part of making a communicator). NCCL starts its bootstrap
/// root for it, which lives until every rank of the communicator has checked in.
pub fn new_unique_id() -> Result<[u8; 128], PglError> {
    typed(require_nccl(""))?;
    keep_nvls_off();
    let id = Id::new().map_err(|e| PglError::Nccl {
        failure: NcclFailure::Failed(e.0 as i32),
        text: format!("ncclGetUniqueId failed: {:?}", e.0),
    })?;
    let mut out = [0u8; 128];
    for (dst, src) in out.iter_mut().zip(id.internal()) {
        *dst = *src as u8;
    }
    Ok(out)
}

impl Communicator {
    /// Collective: every rank of `rdzv` must call it. Rank 0 creates the unique id and the
    /// rendezvous broadcasts it; each rank then joins on `ctx`'s device.
    pub fn new(rdzv: &mut dyn Bootstrap, ctx: &Arc<CudaContext>) -> Result<Self, PglError> {
        Self::with_max_ctas(rdzv, ctx, None)
    }

    /// As [`Communicator::new`], with NCCL's kernels limited to `max_ctas` CTAs (ncclConfig_t
    /// maxCTAs; None: NCCL's choice). For overlap: a GEMM that leaves that many SMs free then
    /// runs beside every collective of this communicator. Every rank must pass the same value.
    /// Its waits come from [`Waits::from_env`].
    pub fn with_max_ctas(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        max_ctas: Option<u32>,
    ) -> Result<Self, PglError> {
        Self::with_waits(rdzv, ctx, max_ctas, Waits::from_env()?)
    }

    /// As [`Communicator::with_max_ctas`], waiting as `waits` says (every rank must pass the
    /// same `nonblocking`).
    pub fn with_waits(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        max_ctas: Option<u32>,
        waits: Waits,
    ) -> Result<Self, PglError> {
        typed_with(|| -> anyhow::Result<Self> {
            // Every rank checks before the broadcast, so a rank without NCCL fails them all at once.
            require_nccl(&format!("rank {}: ", rdzv.rank()))?;
            let id_bytes: Vec<u8> = if rdzv.rank() == 0 {
                new_unique_id()?.to_vec()
            } else {
                Vec::new()
            };
            let id_bytes = rdzv
                .broadcast(0, &id_bytes)
                .context("broadcasting the NCCL unique id")?;
            let id: [u8; 128] = id_bytes.as_slice().try_into().map_err(|_| {
                anyhow::anyhow!(
                    "NCCL unique id from rank 0 has {} bytes, expected 128",
                    id_bytes.len()
                )
            })?;
            Self::join(&id, rdzv.rank(), rdzv.world(), ctx, max_ctas, waits)
        })
    }

    /// Joins the communicator of `id` as `rank` of `world` on `ctx`'s device (the other ranks
    /// must join with the same id, world, `max_ctas` and `waits.nonblocking`). The init is
    /// non-blocking whatever `waits.nonblocking` asks and waits at most `waits.budget` for all of
    /// them (past it the half-made communicator is aborted and the error says so); a blocking
    /// communicator is then split from it, that split polled within the budget too, and the
    /// first torn down (at most a minute more). NCCL_COMM_BLOCKING=1 in the environment overrides
    /// the non-blocking init (NCCL reads it over the config): the init is then unbounded.
    pub fn from_unique_id(
        id: &[u8; 128],
        rank: usize,
        world: usize,
        ctx: &Arc<CudaContext>,
        max_ctas: Option<u32>,
        waits: Waits,
    ) -> Result<Self, PglError> {
        typed(Self::join(id, rank, world, ctx, max_ctas, waits))
    }

    fn join(
        id: &[u8; 128],
        rank: usize,
        world: usize,
        ctx: &Arc<CudaContext>,
        max_ctas: Option<u32>,
        waits: Waits,
    ) -> anyhow::Result<Self> {
        require_nccl(&format!("rank {rank}: "))?;
        if rank >= world {
            return Err(nccl_argument(format!(
                "NCCL communicator: rank {rank} is not below world {world}"
            )));
        }
        keep_nvls_off();
        // The communicator's own config: blocking is NCCL's default (blocking, or
        // NCCL_COMM_BLOCKING) unless asked for non-blocking.
        let mut config = default_config();
        if waits.nonblocking {
            config.blocking = 0;
        }
        if let Some(ctas) = max_ctas {
            if !(1..=64).contains(&ctas) {
                return Err(nccl_argument(format!(
                    "NCCL maxCTAs must be 1..=64, got {ctas}"
                )));
            }
            config.maxCTAs = ctas as i32;
            config.minCTAs = 1;
        }
        let mut internal = [0 as core::ffi::c_char; 128];
        for (dst, src) in internal.iter_mut().zip(id) {
            *dst = *src as core::ffi::c_char;
        }
        // Mapped before joining, so that once the join is done every rank has mapped it.
        let board = open_board(id, rank, world);
        ctx.bind_to_thread()?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let what = format!(
            "ncclCommInitRankConfig(rank {rank} of {world}{})",
            max_ctas.map_or(String::new(), |c| format!(", maxCTAs {c}"))
        );
        // The init is always non-blocking, so that a rank that never joins costs the budget, not
        // forever; a blocking communicator is then split from it (`split_blocking`).
        let mut init_config = config;
        init_config.blocking = 0;
        // SAFETY: out-parameter; the config is NCCL_CONFIG_INITIALIZER's with fields set.
        let r = unsafe {
            sys::ncclCommInitRankConfig(
                &mut comm,
                world as i32,
                sys::ncclUniqueId { internal },
                rank as i32,
                &mut init_config,
            )
        };
        if comm.is_null() {
            check(&what, std::ptr::null_mut(), r.result())?;
            bail!("{what} returned no communicator");
        }
        let mut init = Self::wrap(
            comm,
            ctx,
            rank,
            world,
            Waits {
                nonblocking: true,
                ..waits
            },
        );
        init.board = board;
        // The call returns at once and the joining goes on in NCCL's threads, polled within the
        // budget; past it (or on an error) `finish` aborts the half-made communicator
        // (ncclCommAbort is NCCL's cleanup for it), and Drop then leaves it alone.
        init.finish(&what, r.result())?;
        // Every rank mapped the board before joining: the file can go (each host has its own).
        if let Some(b) = &init.board {
            b.unlink();
        }
        if waits.nonblocking {
            return Ok(init);
        }
        init.split_blocking(config, waits)
    }

    fn wrap(
        comm: sys::ncclComm_t,
        ctx: &Arc<CudaContext>,
        rank: usize,
        world: usize,
        waits: Waits,
    ) -> Self {
        Self {
            comm,
            ctx: ctx.clone(),
            rank,
            world,
            waits,
            aborted: AtomicBool::new(false),
            groups: AtomicUsize::new(0),
            abort_pending: AtomicBool::new(false),
            board: None,
        }
    }

    /// The blocking communicator of the same ranks (ncclCommSplit, every rank one color, ranks
    /// kept), then this non-blocking one torn down. On a non-blocking parent the split runs in
    /// NCCL's threads: it is polled within the budget like the init (past it, or on an error,
    /// both communicators are aborted and the error names the split).
    fn split_blocking(
        mut self,
        mut config: sys::ncclConfig_t,
        waits: Waits,
    ) -> anyhow::Result<Self> {
        let what = format!(
            "ncclCommSplit(rank {} of {}: the blocking communicator from the non-blocking init)",
            self.rank, self.world
        );
        self.ctx.bind_to_thread()?;
        // NCCL's thread stores the new communicator here (a release store) when the split ends,
        // successfully or not; this thread reads it (acquire) only after the parent's state has
        // left ncclInProgress, or after aborting the parent, which joins that thread.
        let slot = Box::new(AtomicPtr::new(std::ptr::null_mut()));
        // SAFETY: a valid, initialised communicator; `slot` (an AtomicPtr has the layout of the
        // pointer it holds) outlives NCCL's use of it as argued above; the config as above.
        let r = unsafe {
            sys::ncclCommSplit(self.comm, 0, self.rank as i32, slot.as_ptr(), &mut config)
        };
        let settled = match r.result() {
            Ok(_) => nccl_budget::settle(self.comm, self.waits.budget),
            Err(e) => Err(Unsettled::Failed(e.0)),
        };
        if let Err(u) = settled {
            let e = self.fail(&what, u); // aborts the parent: NCCL's split thread has ended
            let child = slot.load(Ordering::Acquire);
            if !child.is_null() {
                // SAFETY: a communicator NCCL made and nobody else holds.
                let _ = unsafe { nc::comm_abort(child) };
            }
            return Err(e);
        }
        let child = slot.load(Ordering::Acquire);
        if child.is_null() {
            self.abort();
            bail!("{what} ended without a communicator");
        }
        let mut split = Self::wrap(child, &self.ctx, self.rank, self.world, waits);
        split.board = self.board.take();
        // The new communicator's own state (its init ran inside the split): an error aborts it.
        split.finish(&what, Ok(nc::NcclStatus::InProgress))?;
        drop(self); // finalize and destroy, non-blocking: within the budget
        Ok(split)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// How this communicator waits ([`Waits`]).
    pub fn waits(&self) -> Waits {
        self.waits
    }

    /// Whether the communicator was aborted (after a wait past the budget or an NCCL error):
    /// every call then fails, and the job should end.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Aborts the communicator (ncclCommAbort): NCCL's work on it stops (ncclCommAbort waits
    /// for its kernels to notice) and its resources are freed; every later call fails.
    /// Idempotent. Inside [`Communicator::group`] the ncclCommAbort itself runs when the
    /// outermost group ends.
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            if self.groups.load(Ordering::Acquire) > 0 {
                self.abort_pending.store(true, Ordering::Release);
            } else {
                self.abort_now();
            }
        }
    }

    fn abort_now(&self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the communicator is valid, no group holds its operations, and with `aborted`
        // set no later call passes it to NCCL.
        let _ = unsafe { nc::comm_abort(self.comm) };
    }

    /// Waits until `stream`'s work (this communicator's collectives on it included) has
    /// finished, polling NCCL for asynchronous errors meanwhile, at most the budget; past it or
    /// on an error the communicator is aborted and the error names `what`.
    pub fn synchronize(&self, stream: &CudaStream, what: &str) -> Result<(), PglError> {
        typed_with(|| -> anyhow::Result<()> {
            self.usable(what)?;
            self.ctx.bind_to_thread()?;
            nccl_budget::drain(self.comm, stream.cu_stream(), self.waits.budget)
                .map_err(|u| self.fail(what, u))
        })
    }

    /// Runs `f` (this communicator's calls) inside one NCCL group, so they launch together
    /// (NCCL's ncclGroupStart / ncclGroupEnd); the group is ended, and its launch waited out
    /// within the budget, even when `f` fails.
    pub fn group<R>(&self, f: impl FnOnce() -> anyhow::Result<R>) -> Result<R, PglError> {
        typed(self.usable("ncclGroupStart"))?;
        let group = typed(Group::start(self))?;
        let out = f();
        let ended = group.end();
        let out = typed(out)?;
        typed(ended)?;
        Ok(out)
    }

    /// A collective call whose arguments passed, about to be enqueued: counted on the progress
    /// board (every rank counts the same collectives; point-to-point calls are not counted).
    fn count_collective(&self) {
        if let Some(b) = &self.board {
            b.count_call();
        }
    }

    /// An error unless the communicator can take another call (refused once aborted).
    fn usable(&self, what: &str) -> anyhow::Result<()> {
        if self.is_aborted() {
            return Err(nccl_error(
                NcclFailure::Aborted,
                format!(
                    "rank {} of {}: {what}: the NCCL communicator was aborted after an earlier failure",
                    self.rank, self.world
                ),
            ));
        }
        Ok(())
    }

    /// The result of a call: ncclInProgress waited out within the budget; an error (but a bad
    /// argument, which leaves the communicator sound) aborts the communicator.
    fn finish(&self, what: &str, res: Result<nc::NcclStatus, nc::NcclError>) -> anyhow::Result<()> {
        match res {
            Ok(nc::NcclStatus::InProgress) => {
                self.usable(what)?;
                nccl_budget::settle(self.comm, self.waits.budget).map_err(|u| self.fail(what, u))
            }
            Err(e) if e.0 != sys::ncclResult_t::ncclInvalidArgument => {
                Err(self.fail(what, Unsettled::Failed(e.0)))
            }
            // A refused argument leaves the communicator sound: `Argument`, not aborted.
            Err(e) => Err(nccl_argument(format!(
                "rank {} of {}: {what} refused an argument: {:?}: {}",
                self.rank,
                self.world,
                e.0,
                last_error(self.comm)
            ))),
            Ok(_) => Ok(()),
        }
    }

    /// Aborts the communicator and words why.
    fn fail(&self, what: &str, u: Unsettled) -> anyhow::Error {
        let detail = last_error(self.comm);
        self.abort();
        let failure = match &u {
            Unsettled::Failed(e) => NcclFailure::Failed(*e as i32),
            Unsettled::TimedOut(t) => NcclFailure::TimedOut {
                budget: self.waits.budget,
                waited: *t,
            },
            Unsettled::Cuda(e) => NcclFailure::Stream(*e as i32),
        };
        let how = match u {
            Unsettled::Failed(e) => format!(
                "failed ({e:?}{})",
                if detail.is_empty() {
                    String::new()
                } else {
                    format!("; NCCL's last error on this thread: {detail}")
                }
            ),
            Unsettled::TimedOut(t) => format!(
                "did not complete within its budget of {:.1} s ({TIMEOUT_VAR} or the caller's Waits; {:.1} s waited): a peer rank probably stopped or never made the matching call ({})",
                self.waits.budget.as_secs_f64(),
                t.as_secs_f64(),
                self.board.as_ref().map_or_else(
                    || "no progress board to say which".to_string(),
                    |b| b.diagnose()
                )
            ),
            Unsettled::Cuda(e) => format!("failed: its stream reported {e:?}"),
        };
        nccl_error(
            failure,
            format!(
                "rank {} of {}: NCCL {what} {how}; the communicator was aborted",
                self.rank, self.world
            ),
        )
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if self.is_aborted() {
            return; // ncclCommAbort freed it
        }
        // Finalize flushes outstanding operations (non-blocking: waited out within the budget,
        // at most a minute), then destroy. Errors cannot be returned here: they are reported and
        // the communicator is aborted instead.
        let _ = self.ctx.bind_to_thread();
        let budget = self.waits.budget.min(Duration::from_secs(60));
        // SAFETY: the communicator is valid and used by no one else once dropped.
        let finalized = match unsafe { nc::comm_finalize(self.comm) } {
            Ok(nc::NcclStatus::InProgress) => {
                nccl_budget::settle(self.comm, budget).map_err(|u| format!("{u:?}"))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(format!("{:?}", e.0)),
        };
        let done = finalized.and_then(|()| {
            // SAFETY: finalized; destroy frees it.
            unsafe { nc::comm_destroy(self.comm) }
                .map(|_| ())
                .map_err(|e| format!("{:?}", e.0))
        });
        if let Err(e) = done {
            log::error!(
                "rank {}: NCCL communicator teardown failed ({e}); aborting it",
                self.rank
            );
            self.abort();
        }
    }
}

/// The communicator's progress board on this host, in the user's private runtime directory (the
/// rendezvous socket's); none, with the reason logged, where it cannot be made.
fn open_board(id: &[u8; 128], rank: usize, world: usize) -> Option<ProgressBoard> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| std::path::PathBuf::from("/tmp"));
    let made = crate::socket_trust::private_dir_in(&base)
        .and_then(|dir| Ok(ProgressBoard::open(&dir, id, rank, world)?));
    match made {
        Ok(b) => Some(b),
        Err(e) => {
            log::warn!("rank {rank}: no NCCL progress board ({e:#}): a timed-out wait will not name its peer");
            None
        }
    }
}

/// NCCL_CONFIG_INITIALIZER of nccl.h 2.28: every field "undefined" (NCCL's defaults).
fn default_config() -> sys::ncclConfig_t {
    const UNDEF_INT: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: 22800,
        blocking: UNDEF_INT,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
    }
}

#[cfg(test)]
mod tests {
    use super::nvls_override;

    #[test]
    fn nvls_is_off_unless_asked_for() {
        // Nothing set: weft turns it off.
        assert_eq!(nvls_override(None, None), Some("0"));
        assert_eq!(nvls_override(None, Some("0")), Some("0"));
        assert_eq!(nvls_override(None, Some("yes")), Some("0"));
        // The opt-in leaves NCCL's default.
        assert_eq!(nvls_override(None, Some("1")), None);
        assert_eq!(nvls_override(None, Some(" 1 ")), None);
        // A value the user set stands, whatever it is.
        assert_eq!(nvls_override(Some("1"), None), None);
        assert_eq!(nvls_override(Some("0"), Some("1")), None);
    }
}
