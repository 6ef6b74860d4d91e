//! One rank's view of the job: its launcher variables, the rendezvous with the other ranks, its
//! GPU (or why there is none) and, created on first use, its NCCL communicator.

use crate::trials::Skip;
use anyhow::Context;
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;
use std::time::Duration;
use weft_pgl::gpu::{self, GpuAvailability};
use weft_pgl::nccl::Communicator;
use weft_pgl::rank_env::RankEnv;
use weft_pgl::rendezvous::Rendezvous;
use weft_signal_gemm::ops::OverlapEnv;

/// How long ranks wait for each other at start-up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The GPU this rank drives: its primary context (cudarc event tracking off — weft synchronises
/// explicitly) and a stream for the suites.
pub struct Gpu {
    pub ordinal: usize,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
}

pub struct Job {
    pub env: RankEnv,
    pub rdzv: Rendezvous,
    gpu: Result<Gpu, String>,
    comm: Option<Communicator>,
    /// The overlapped ops' environment (its own communicator, the choice cache), made on first use.
    overlap: Option<OverlapEnv>,
    /// Set when some ranks drive the same GPU (`WEFT_SHARED_GPU=1`): what it rules out.
    shared_gpu: Option<String>,
}

impl Job {
    /// Reads the launcher's variables, meets the other ranks and opens this rank's GPU if any.
    pub fn start() -> anyhow::Result<Self> {
        let env = RankEnv::from_env().context("reading the launcher's rank variables")?;
        let rdzv = Rendezvous::connect(&env, CONNECT_TIMEOUT)
            .with_context(|| format!("rank {} of {}: rendezvous", env.rank, env.world))?;
        let gpu = match gpu::probe() {
            GpuAvailability::Absent { reason } => Err(reason),
            GpuAvailability::Present { count } => Ok(open_gpu(&env, count)?),
        };
        let mut job = Self {
            env,
            rdzv,
            gpu,
            comm: None,
            overlap: None,
            shared_gpu: None,
        };
        job.shared_gpu = job.find_shared_gpus()?;
        Ok(job)
    }

    /// All-gathers (host, GPU UUID) and names the ranks that drive one GPU together, if any.
    fn find_shared_gpus(&mut self) -> anyhow::Result<Option<String>> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let id = match &self.gpu {
            Ok(g) => format!("{}/{:?}", host.trim(), g.ctx.uuid()?.bytes),
            Err(_) => String::new(),
        };
        let all = self
            .rdzv
            .all_gather(id.as_bytes())
            .context("all-gathering GPU identities")?;
        let mut pairs = Vec::new();
        for (a, ia) in all.iter().enumerate() {
            if let Some(b) = all[..a].iter().position(|ib| !ia.is_empty() && ib == ia) {
                pairs.push(format!("ranks {b} and {a}"));
            }
        }
        Ok((!pairs.is_empty()).then(|| {
            format!(
                "{} share a GPU ({}=1): NCCL refuses two ranks on one GPU and timings would be meaningless",
                pairs.join(", "),
                gpu::SHARED_GPU_VAR
            )
        }))
    }

    /// Why this job cannot use NCCL or time anything: ranks share a GPU. `None` normally.
    pub fn shared_gpu(&self) -> Option<&str> {
        self.shared_gpu.as_deref()
    }

    pub fn rank(&self) -> usize {
        self.env.rank
    }

    pub fn world(&self) -> usize {
        self.env.world
    }

    /// This rank's GPU, or the reason it has none (GPU trials are ignored with that reason).
    pub fn gpu(&self) -> Result<&Gpu, &str> {
        self.gpu.as_ref().map_err(|r| r.as_str())
    }

    /// The NCCL communicator over all ranks; collective on first call. When ranks share a GPU
    /// the error is a [`Skip`]: trials that need NCCL are then reported as ignored.
    pub fn comm(&mut self) -> anyhow::Result<&Communicator> {
        if let Some(why) = &self.shared_gpu {
            return Err(Skip(why.clone()).into());
        }
        if self.comm.is_none() {
            let gpu = self
                .gpu
                .as_ref()
                .map_err(|r| anyhow::anyhow!("no GPU: {r}"))?;
            self.comm = Some(Communicator::new(&mut self.rdzv, &gpu.ctx)?);
        }
        Ok(self.comm.as_ref().unwrap())
    }

    /// The rendezvous and the overlapped ops' environment (collective on first call: it makes a
    /// communicator and reads the default choice cache). A [`Skip`] when ranks share a GPU.
    pub fn overlap(&mut self) -> anyhow::Result<(&mut Rendezvous, &mut OverlapEnv)> {
        if let Some(why) = &self.shared_gpu {
            return Err(Skip(why.clone()).into());
        }
        if self.overlap.is_none() {
            let gpu = self
                .gpu
                .as_ref()
                .map_err(|r| anyhow::anyhow!("no GPU: {r}"))?;
            self.overlap = Some(OverlapEnv::new(&mut self.rdzv, &gpu.ctx)?);
        }
        Ok((&mut self.rdzv, self.overlap.as_mut().unwrap()))
    }

    /// The communicator together with the GPU (both borrowed at once).
    pub fn comm_and_gpu(&mut self) -> anyhow::Result<(&Communicator, &Gpu)> {
        self.comm()?;
        let gpu = self
            .gpu
            .as_ref()
            .map_err(|r| anyhow::anyhow!("no GPU: {r}"))?;
        Ok((self.comm.as_ref().unwrap(), gpu))
    }
}

fn open_gpu(env: &RankEnv, count: usize) -> anyhow::Result<Gpu> {
    let ordinal = gpu::device_for_rank(env, count)?;
    let ctx = CudaContext::new(ordinal)
        .with_context(|| format!("rank {}: opening GPU {ordinal}", env.rank))?;
    // SAFETY: weft orders its streams itself (events, synchronize) and frees nothing in use.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream()?;
    Ok(Gpu {
        ordinal,
        ctx,
        stream,
    })
}
