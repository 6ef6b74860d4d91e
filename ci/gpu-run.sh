#!/usr/bin/env bash
# Runs `weft ARGS…` on every local GPU under mpirun (one rank per GPU) with a prebuilt binary:
#   bash ci/gpu-run.sh ARGS…
#   bash ci/gpu-run.sh --plain [ARGS…]   weft itself, no launcher (plain `weft` starts its ranks)
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); cuBLAS (loaded at run time) is found as in
# ci/gpu-gemm.sh; WEFT_CHOICES, WEFT_TUNING, WEFT_JOB_SECRET, WEFT_RDZV_INSECURE, WEFT_NCCL_TIMEOUT_S, WEFT_NCCL_NONBLOCKING, WEFT_SEED, WEFT_AUTO_BUDGET_S, WEFT_TRIAL_TIMEOUT, WEFT_COLL_*,
# WEFT_GRPCOLL_SMS, WEFT_GRPCOLL_BULK_KIB, WEFT_GRPCOLL_BULK_STAGES and WEFT_OVERLAP_COMM_BLOCKS
# reach every rank when set.
set -uo pipefail
weft="${WEFT:-target/release/weft}"
export NCCL_NVLS_ENABLE=0
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)"; do
    if [ -n "$d" ] && ls "$d"/libcublas.so* >/dev/null 2>&1; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi
if [ "${1:-}" = "--plain" ]; then
  shift
  exec "$weft" "$@"
fi
n=${RANKS:-$(nvidia-smi -L | wc -l)}
pass=(-x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
for v in WEFT_CHOICES WEFT_TUNING WEFT_JOB_SECRET WEFT_RDZV_INSECURE WEFT_NCCL_TIMEOUT_S WEFT_NCCL_NONBLOCKING WEFT_SEED WEFT_AUTO_BUDGET_S WEFT_TRIAL_TIMEOUT WEFT_BENCH_TIMEOUT WEFT_COLL_SLOT_BYTES WEFT_COLL_BLOCKS WEFT_COLL_MAX_BLOCKS WEFT_COLL_ALL_REDUCE WEFT_COLL_LL_MAX_BYTES WEFT_COLL_SENTINEL_MAX_BYTES WEFT_COLL_PDL WEFT_GRPCOLL_SMS WEFT_GRPCOLL_BULK_KIB WEFT_GRPCOLL_BULK_STAGES WEFT_OVERLAP_COMM_BLOCKS; do
  [ -n "${!v:-}" ] && pass+=(-x "$v")
done
exec mpirun --allow-run-as-root --bind-to none "${pass[@]}" -np "$n" "$weft" "$@"
