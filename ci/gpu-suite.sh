#!/usr/bin/env bash
# The GPU acceptance run on one multi-GPU host, with a prebuilt release binary:
#   bash ci/gpu-suite.sh [LOG_DIR] [BENCH_SUITES…]
# weft info; `weft test` under mpirun and under `weft launch` on every GPU, on 3 and 2 ranks, and
# as one process (single-process PGL trials); plain `weft`; then `weft bench SUITE --json
# LOG_DIR/SUITE.json` for each suite (default: every suite). Logs: LOG_DIR/tests.log, bench.log.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); weft never uses it unless opted in.
set -uo pipefail
weft="${WEFT:-target/release/weft}"
logs="${1:-gpu-logs}"
shift || true
suites=("$@")
[ ${#suites[@]} -gt 0 ] || mapfile -t suites < <("$weft" bench --list)
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
n=$(nvidia-smi -L | wc -l)
mpirun=(mpirun --allow-run-as-root --bind-to none)
status=0
step() { # log, name, command…
  local log=$1 name=$2; shift 2
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$log"
  [ $rc -eq 0 ] || status=1
}
t="$logs/tests.log"
step "$t" info "$weft" info
step "$t" "test on $n ranks (mpirun)" "${mpirun[@]}" -np "$n" "$weft" test
step "$t" "test on $n ranks (weft launch)" "$weft" launch -n "$n" -- "$weft" test
[ "$n" -gt 3 ] && step "$t" "test on 3 ranks" "${mpirun[@]}" -np 3 "$weft" test
[ "$n" -gt 2 ] && step "$t" "test on 2 ranks (GPUs 0,1)" env CUDA_VISIBLE_DEVICES=0,1 "${mpirun[@]}" -x CUDA_VISIBLE_DEVICES -np 2 "$weft" test
step "$t" "test in one process ($n GPUs)" "$weft" test
step "$t" "plain weft" "$weft"
grep -E '^test result|FAILED|failed' "$t"
for s in "${suites[@]}"; do
  step "$logs/bench.log" "bench $s" "${mpirun[@]}" -np "$n" "$weft" bench "$s" --json "$logs/$s.json"
done
exit $status
