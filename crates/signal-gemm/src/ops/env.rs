//! What the ops of one rank share: the GPU's context, the NCCL communicator over every rank,
//! communicators limited to a few CTAs (the signal method's, made on first need), the choice
//! cache, how `Auto` measures, the machine's description that keys the cache, and the
//! wave-group tuner's profile of the machine where one is loaded (its predictions stand in for
//! measurements of the signal path).

use super::cache::ChoiceCache;
use super::candidates::OpKind;
use super::choose::AutoPolicy;
use super::key::machine_fingerprint;
use super::method::Method;
use crate::error::GemmError;
use crate::plan::{GemmOptions, GemmPlan, GemmShape};
use crate::tuner::{predict_overlap, Op, TuningProfile};
use crate::wave_groups::WaveGroups;
use anyhow::{ensure, Context};
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::{Arc, Mutex};
use weft_pgl::nccl::Communicator;
use weft_pgl::Bootstrap;

/// A communicator the ops of one rank share (NCCL communicators are used by one thread at a
/// time: each launch holds the lock while it enqueues, and an op's `synchronize` while it waits
/// for its stream, at most the communicator's budget).
pub type SharedComm = Arc<Mutex<Communicator>>;

pub struct OverlapEnv {
    ctx: Arc<CudaContext>,
    comm: SharedComm,
    limited: Vec<(u32, SharedComm)>,
    cache: ChoiceCache,
    policy: AutoPolicy,
    machine: String,
    world: usize,
    rank: usize,
    tuning: Option<TuningProfile>,
}

/// The variable naming a tuning file (`weft tune --out`) every `OverlapEnv` loads.
pub const TUNING_VAR: &str = "WEFT_TUNING";

impl OverlapEnv {
    /// Collective over `rdzv`'s ranks: creates an NCCL communicator over them, describes the
    /// machine and, on rank 0, opens the choice cache at [`ChoiceCache::default_path`] (the other
    /// ranks hear its answers). The context must have cudarc's event tracking off (weft orders
    /// its streams itself).
    pub fn new(rdzv: &mut dyn Bootstrap, ctx: &Arc<CudaContext>) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            let comm = Communicator::new(rdzv, ctx)?;
            let cache = if rdzv.rank() == 0 {
                let path = ChoiceCache::default_path()?;
                ChoiceCache::open(&path)
                    .with_context(|| format!("opening the choice cache {}", path.display()))
            } else {
                Ok(ChoiceCache::in_memory())
            };
            let cache = crate::error::agree(rdzv, "opening the choice cache", cache)?;
            Self::with_communicator(rdzv, ctx, comm, cache).map_err(anyhow::Error::from)
        })
    }

    /// Collective: as [`OverlapEnv::new`] with a communicator of the caller's (over the same ranks
    /// in the same order) and a cache of the caller's (only rank 0's is read and written).
    pub fn with_communicator(
        rdzv: &mut dyn Bootstrap,
        ctx: &Arc<CudaContext>,
        comm: Communicator,
        cache: ChoiceCache,
    ) -> Result<Self, GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<Self> {
            ensure!(
                comm.world() == rdzv.world() && comm.rank() == rdzv.rank(),
                "the communicator is rank {} of {}, the rendezvous rank {} of {}",
                comm.rank(),
                comm.world(),
                rdzv.rank(),
                rdzv.world()
            );
            ensure!(
                comm.context().cu_ctx() == ctx.cu_ctx(),
                "the communicator is on another GPU's context than the ops'"
            );
            ensure!(
                !ctx.is_event_tracking(),
                "the overlapped ops need the context's event tracking off (CudaContext::disable_event_tracking): with it on, a buffer handed to a second stream waits for everything before it"
            );
            // Collective; a rank that fails before its first exchange makes the others' wait end
            // at the rendezvous timeout.
            let machine = machine_fingerprint(rdzv, ctx)
                .context("describing the machine for the choice cache")?;
            let mut env = Self {
                ctx: ctx.clone(),
                comm: Arc::new(Mutex::new(comm)),
                limited: Vec::new(),
                cache,
                policy: AutoPolicy::default(),
                machine,
                world: rdzv.world(),
                rank: rdzv.rank(),
                tuning: None,
            };
            // Every rank takes part (a rank without the variables too), so a setting or a file
            // one rank cannot read fails every rank alike.
            let loaded = AutoPolicy::from_env()
                .map(|p| env.policy = p)
                .map_err(anyhow::Error::from)
                .and_then(|()| match std::env::var_os(TUNING_VAR) {
                    None => Ok(()),
                    Some(path) => {
                        let path = std::path::PathBuf::from(path);
                        TuningProfile::load(&path)
                            .map_err(anyhow::Error::from)
                            .and_then(|p| Ok(env.set_tuning(p)?))
                            .with_context(|| {
                                format!("loading the tuning file {} ({TUNING_VAR})", path.display())
                            })
                    }
                });
            crate::error::agree(
                rdzv,
                "reading the ops' settings (WEFT_AUTO_BUDGET_S, WEFT_TUNING)",
                loaded,
            )?;
            Ok(env)
        })
    }

    /// Uses `profile` (`weft tune`'s file) to predict the signal path of GEMM + AllReduce
    /// instead of measuring it at first use. Refused if it was made on another machine shape
    /// (SM count, world size).
    pub fn set_tuning(&mut self, profile: TuningProfile) -> Result<(), GemmError> {
        crate::error::typed_with(|| -> anyhow::Result<()> {
            let sms = crate::gemm::device_sms(&self.ctx)?;
            profile.check_machine(sms, self.world as u32)?;
            self.tuning = Some(profile);
            Ok(())
        })
    }

    pub fn tuning(&self) -> Option<&TuningProfile> {
        self.tuning.as_ref()
    }

    /// The tuner's predicted ms of `method` for this op and shape, where it models the method
    /// (the signal path of GEMM + AllReduce) and a profile is loaded.
    pub(crate) fn predict(
        &self,
        kind: OpKind,
        shape: GemmShape,
        options: GemmOptions,
        method: &Method,
    ) -> Option<f64> {
        let profile = self.tuning.as_ref()?;
        let (OpKind::AllReduce, Method::Signal { sm_margin, waves }) = (kind, method) else {
            return None;
        };
        let sms = crate::gemm::device_sms(&self.ctx).ok()?;
        let plan = GemmPlan::new(
            sms,
            shape,
            GemmOptions {
                sm_margin: *sm_margin,
                ..options
            },
        )
        .ok()?;
        let groups = WaveGroups::new(&plan, waves).ok()?;
        predict_overlap(profile, Op::AllReduce, &plan, &groups).ok()
    }

    pub fn set_policy(&mut self, policy: AutoPolicy) {
        self.policy = policy;
    }

    pub fn policy(&self) -> &AutoPolicy {
        &self.policy
    }

    pub fn cache(&self) -> &ChoiceCache {
        &self.cache
    }

    pub(crate) fn cache_mut(&mut self) -> &mut ChoiceCache {
        &mut self.cache
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn comm(&self) -> &SharedComm {
        &self.comm
    }

    pub fn machine(&self) -> &str {
        &self.machine
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// This rank (the rendezvous's and the communicator's).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Collective on first use of `max_ctas`: a communicator whose kernels use at most that many
    /// CTAs (NCCL beside a GEMM that leaves as many SMs free).
    pub(crate) fn limited_comm(
        &mut self,
        rdzv: &mut dyn Bootstrap,
        max_ctas: u32,
    ) -> anyhow::Result<SharedComm> {
        if let Some((_, c)) = self.limited.iter().find(|(m, _)| *m == max_ctas) {
            return Ok(c.clone());
        }
        let c = Arc::new(Mutex::new(Communicator::with_max_ctas(
            rdzv,
            &self.ctx,
            Some(max_ctas),
        )?));
        self.limited.push((max_ctas, c.clone()));
        Ok(c)
    }
}

/// The communicator behind `comm`, for one launch's enqueues.
pub(crate) fn lock(comm: &SharedComm) -> anyhow::Result<std::sync::MutexGuard<'_, Communicator>> {
    comm.lock().map_err(|_| {
        anyhow::anyhow!(
            "the ops' NCCL communicator is unusable: a thread panicked while enqueueing on it"
        )
    })
}

/// Waits for `stream`, where NCCL calls of `comm` may be queued, within the communicator's budget
/// while polling NCCL's asynchronous errors: a peer that never joins such a call ends in an error
/// naming `what`, the budget and the abort, where a plain stream synchronize waits forever.
pub(crate) fn synchronize_with(
    comm: &SharedComm,
    stream: &CudaStream,
    what: &str,
) -> anyhow::Result<()> {
    lock(comm)?
        .synchronize(stream, what)
        .map_err(anyhow::Error::from)
}
