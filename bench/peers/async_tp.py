"""PyTorch async-TP's fused GEMM + collective ops next to PyTorch's sequential path (baselines for weft).

--op reduce-scatter: every rank holds A (M x K, bf16, row-major) and B (K x N, bf16); the result is
the sum over ranks of A @ B, scattered along M (scatter_dim 0): each rank gets M/world rows x N. A
shape MxNxK is the LOCAL GEMM shape.
  seq       torch.matmul(A, B), then dist.reduce_scatter_tensor(out, C, op=SUM)     (cuBLAS, then NCCL)
  async-tp  torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group_name)
            (torch/distributed/_symmetric_memory/__init__.py: the M/world-row GEMM chunk for each peer
            is written to a symmetric-memory buffer, peers pull it while the next chunk computes,
            then one kernel sums the world partials)
  check     every element within world * 2^-7 * sum_r |A_r @ B_r| of seq (weft's sum-over-ranks bound)

--op all-gather: every rank holds a shard of A (M/world rows x K) and its own B (K x N), bf16; the
result on every rank is AllGather_rows(A shards) @ B (M x N), weft's AllGatherGemm. M is the
gathered rows, as in `weft bench overlap-all-gather`.
  seq       dist.all_gather_into_tensor(A, A_shard), then torch.matmul(A, B)   (NCCL, then cuBLAS)
  async-tp  torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0, group_name)[1][0]
            (the shards are copied into a symmetric-memory buffer chunk by chunk while the GEMM of
            the chunks already present runs)
  check     every element within 2^-7 * (|A| @ |B|) of seq (two bf16 GEMMs of the same inputs)

B is either a transposed view of a row-major N x K weight ("nk", what nn.Linear hands to Inductor's
micro_pipeline_tp pass, column-major K x N) or a row-major K x N matrix ("kn", weft's layout); both
paths get the same B.

Method: CUDA events on the current stream; 10 warm-up calls of each path; then N iterations (default
50), each timing seq and async-tp once, each call timed alone. Before every timed call: a 256 MiB
scratch write flushes L2, then torch.cuda.synchronize + dist.barrier + torch.cuda.synchronize so the
ranks start together. A and B are refilled with randn * K^-1/4 every 10 iterations (outside the timed
region). Per path: the median over the N calls on each rank, then the max of the medians over ranks.
The check runs once per shape on fresh inputs (results also finite). Rank 0 prints a line per shape
and writes --json after every shape; the exit status is 1 if any check failed or any shape raised.

  torchrun --standalone --nproc_per_node 4 bench/peers/async_tp.py --op all-gather --json out.json
  mpirun --allow-run-as-root -np 4 python3 bench/peers/async_tp.py --op reduce-scatter --json out.json
"""
import argparse, datetime, json, os, re, statistics, subprocess, sys, warnings

# Under mpirun: take the rank from Open MPI and rendezvous on this host.
for var, ompi in (("RANK", "OMPI_COMM_WORLD_RANK"), ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                  ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")):
    if var not in os.environ and ompi in os.environ:
        os.environ[var] = os.environ[ompi]
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
# NVLink multicast stays off (shared hosts); set before torch/NCCL read them.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem  # defines torch.ops.symm_mem.*

DEFAULT_SHAPES = {
    "reduce-scatter": [f"{m}x8192x{k}" for m in (4096, 8192, 16384) for k in (1024, 2048, 7168)] + ["16384x16384x2048"],
    # weft's default AllGather grid (crates/harness/src/bench/grid.rs).
    "all-gather": ["32x4096x8192", "128x4096x8192", "512x4096x8192", "8192x2048x8192", "16384x2048x8192",
                   "8192x8192x2048", "16384x8192x2048", "4096x8192x8192"],
}
p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--op", required=True, choices=sorted(DEFAULT_SHAPES), help="the fused op to measure")
p.add_argument("--shapes", default=None, help="comma-separated MxNxK (default: the op's grid)")
p.add_argument("--b-layout", default="nk", help="comma list of nk (B = W.t(), W row-major N x K) and kn")
p.add_argument("--iters", type=int, default=50)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--regen", type=int, default=10, help="refill A and B every this many iterations")
p.add_argument("--seed", type=int, default=1234)
p.add_argument("--json", default=None)
p.add_argument("--commit", default=None, help="the weft commit this ran from (default: git rev-parse, else $WEFT_COMMIT)")
args = p.parse_args()
args.shapes = args.shapes or ",".join(DEFAULT_SHAPES[args.op])

rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
dev = torch.device("cuda", local)
torch.cuda.set_device(dev)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
group_name = dist.group.WORLD.group_name
torch.manual_seed(args.seed + rank)

# enable_symm_mem_for_group: needed before 2.11, deprecated (FutureWarning, "no need to call") from 2.11.
TORCH_MINOR = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
enable_state = "not called (deprecated in torch >= 2.11)"
def enable_symm_mem(why):
    global enable_state
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group_name)
    enable_state = f"called ({why})"
if TORCH_MINOR < (2, 11) and hasattr(symm_mem, "enable_symm_mem_for_group"):
    enable_symm_mem(f"torch {torch.__version__} < 2.11")

def seq_rs(A, B):
    C = torch.matmul(A, B)
    out = C.new_empty(C.shape[0] // world, C.shape[1])
    dist.reduce_scatter_tensor(out, C, op=dist.ReduceOp.SUM)
    return out

def fused_rs(A, B):
    return torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "sum", 0, group_name)

def bound_rs(A, B):
    """world * 2^-7 * sum_r |A_r @ B_r| on this rank's rows."""
    partial = torch.matmul(A, B).float().abs()
    bound = partial.new_empty(partial.shape[0] // world, partial.shape[1])
    dist.reduce_scatter_tensor(bound, partial, op=dist.ReduceOp.SUM)
    return bound.mul_(world / 128.0)

def seq_ag(A_shard, B):
    A = A_shard.new_empty(A_shard.shape[0] * world, A_shard.shape[1])
    dist.all_gather_into_tensor(A, A_shard)
    return torch.matmul(A, B)

def fused_ag(A_shard, B):
    return torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0, group_name)[1][0]

def bound_ag(A_shard, B):
    """2^-7 * (|A| @ |B|) with A the gathered shards."""
    full = A_shard.new_empty(A_shard.shape[0] * world, A_shard.shape[1])
    dist.all_gather_into_tensor(full, A_shard)
    return torch.matmul(full.float().abs(), B.float().abs()).mul_(1.0 / 128.0)

# Per op: (seq, fused, bound, rows of A a rank holds for a shape's M, the fused call as recorded).
OPS = {
    "reduce-scatter": (seq_rs, fused_rs, bound_rs, lambda m: m,
                       "torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, 'sum', 0, group_name)"),
    "all-gather": (seq_ag, fused_ag, bound_ag, lambda m: m // world,
                   "torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [B], 0, group_name)"),
}
seq, fused, bound_of, a_rows, fused_call = OPS[args.op]

def fused_first(A, B):
    """First fused call of a shape; if it raises before the group was enabled, enable it and retry once."""
    try:
        return fused(A, B)
    except Exception as e:
        if enable_state.startswith("called") or not hasattr(symm_mem, "enable_symm_mem_for_group"):
            raise
        enable_symm_mem(f"after error: {type(e).__name__}: {e}"[:300])
        return fused(A, B)

def all_max(values):
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()

scratch = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

def timed(fn, A, B):
    scratch.zero_()  # flush L2
    torch.cuda.synchronize(); dist.barrier(device_ids=[local]); torch.cuda.synchronize()
    start.record(); fn(A, B); end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)

def check(A, B):
    """(error or None, ok, max |async-tp - seq|) on this rank, within the op's bound."""
    ref = seq(A, B)
    try:
        got = fused_first(A, B)
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:500], False, float("nan")
    bound = bound_of(A, B)
    diff = (got.float() - ref.float()).abs()
    ok = bool(torch.isfinite(got).all()) and bool((diff <= bound + 1e-6).all())
    return None, ok, diff.max().item()

def finite_or_none(x):
    return x if x == x and abs(x) != float("inf") else None

def symm_mem_backend():
    try:
        return symm_mem.get_backend(dev)
    except Exception:  # absent before ~2.9
        return None

def weft_commit():
    if args.commit:
        return args.commit
    try:
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return os.environ.get("WEFT_COMMIT", "unknown")

def driver_version():
    """The NVIDIA driver's version (nvidia-smi), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(local)],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        return out or None
    except Exception:
        return None


SEQ_NAME = {"reduce-scatter": "seq: the matmul, then NCCL reduce-scatter",
            "all-gather": "seq: NCCL all-gather, then the matmul"}

# The envelope and rows of weft's results files (crates/harness/src/results_file.rs).
results, failed = [], False
report = {"suite": f"async-tp-{args.op}", "device": torch.cuda.get_device_name(dev), "gpus": world,
          "driver": driver_version(), "commit": weft_commit(),
          "torch": torch.__version__,
          "nccl": ".".join(map(str, torch.cuda.nccl.version())) if isinstance(torch.cuda.nccl.version(), tuple)
                  else torch.cuda.nccl.version(),
          "cuda": torch.version.cuda, "world": world, "iterations": args.iters, "warmup": args.warmup,
          "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
          "symm_mem_backend": symm_mem_backend(),
          "env": {v: os.environ.get(v) for v in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
          "method": "CUDA events per call; L2 flush (256 MiB write) + barrier before each; median per rank, max over ranks",
          "rows": results}

for layout in args.b_layout.split(","):
    assert layout in ("nk", "kn"), f"--b-layout: {layout}"
    for shape in args.shapes.split(","):
        m, n, k = (int(x) for x in shape.lower().split("x"))
        assert m % world == 0, f"M={m} is not a multiple of world={world}"
        A = torch.empty(a_rows(m), k, dtype=torch.bfloat16, device=dev)
        W = torch.empty((n, k) if layout == "nk" else (k, n), dtype=torch.bfloat16, device=dev)
        B = W.t() if layout == "nk" else W
        def regen():
            A.normal_(0.0, k ** -0.25); W.normal_(0.0, k ** -0.25)
        row = {"case": f"{m}x{n}x{k} B={layout}", "m": m, "n": n, "k": k, "b_layout": layout}
        regen()
        err, ok, mad = check(A, B)
        e_any, mad, bad = all_max([err is not None, mad, not ok])
        if e_any:  # every rank skips async-tp; record the first rank's error
            errs = [None] * world
            dist.all_gather_object(errs, err)
            row["error"] = next(f"rank {r}: {x}" for r, x in enumerate(errs) if x)
        seq_t, fused_t = [], []
        for _ in range(args.warmup):
            seq(A, B)
            if not e_any:
                fused(A, B)
        for i in range(args.iters):
            if i % args.regen == 0:
                regen()
            seq_t.append(timed(seq, A, B))
            if not e_any:
                fused_t.append(timed(fused, A, B))
        seq_ms, fused_ms = all_max([statistics.median(seq_t), statistics.median(fused_t) if fused_t else float("nan")])
        speedup = finite_or_none(seq_ms / fused_ms) if not e_any else None
        # baseline_ms / ratio: the schema's names for seq and seq / async-tp (no weft_ms here).
        row.update(seq_ms=seq_ms, async_tp_ms=finite_or_none(fused_ms), speedup=speedup,
                   baseline=SEQ_NAME[args.op], baseline_ms=seq_ms, ratio=speedup,
                   max_abs_diff=finite_or_none(mad), ok=(not bad) if not e_any else None,
                   path=f"{fused_call}; "
                        f"enable_symm_mem_for_group {enable_state}")
        failed |= bool(bad) or bool(e_any)
        results.append(row)
        if rank == 0:
            tail = f"ERROR {row['error']}" if e_any else \
                f"async-tp {fused_ms:8.3f} ms  seq/async {seq_ms / fused_ms:6.3f}  max|diff| {mad:.3g} {'ok' if not bad else 'FAIL'}"
            print(f"{m}x{n}x{k} B={layout}  seq {seq_ms:8.3f} ms  {tail}", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(report, f, indent=1)
        del A, W, B
        torch.cuda.empty_cache()

dist.barrier(device_ids=[local])
dist.destroy_process_group()
sys.exit(1 if failed else 0)
