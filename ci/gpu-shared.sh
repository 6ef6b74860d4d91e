#!/usr/bin/env bash
# Multi-rank correctness on a machine with fewer GPUs than ranks: each rank count in RANKS (default
# "2 3 4") runs `weft test [FILTER]` with the ranks sharing the GPU(s) (WEFT_SHARED_GPU=1) under
# MPS, so that their kernels run at once and can wait on each other (without MPS the processes'
# kernels time-slice and cross-rank waits crawl). Trials that need NCCL (which refuses two ranks on
# one GPU) are reported as ignored with that reason. Timings mean nothing in this mode.
#   bash ci/gpu-shared.sh LOGDIR [FILTER]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:?usage: ci/gpu-shared.sh LOGDIR [FILTER]}"
filter="${2:-}"
weft="$root/target/release/weft"
mkdir -p "$out"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/weft-mps CUDA_MPS_LOG_DIRECTORY=/tmp/weft-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d || { echo "ci/gpu-shared.sh: could not start the MPS control daemon"; exit 1; }
trap 'echo quit | nvidia-cuda-mps-control' EXIT
status=0
# The GPUs the ranks see (nvidia-smi lists the host's whatever CUDA_VISIBLE_DEVICES says).
gpus=$(nvidia-smi -L | wc -l)
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
for n in ${RANKS:-2 3 4}; do
  echo "== $n ranks sharing $gpus GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}): weft test $filter"
  WEFT_SHARED_GPU=1 "$weft" launch -n "$n" -- "$weft" test $filter 2>&1 | tee "$out/shared-$n.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
exit $status
