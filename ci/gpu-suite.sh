#!/usr/bin/env bash
# The GPU acceptance run on one multi-GPU host, with a prebuilt release binary:
#   bash ci/gpu-suite.sh [LOG_DIR]
# weft info; `weft test` under mpirun and under `weft launch` on every GPU, and on 3 ranks;
# plain `weft`; `weft bench nccl` with its results JSON. Logs and JSON go to LOG_DIR.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0); weft never uses it unless opted in.
set -uo pipefail
weft="${WEFT:-target/release/weft}"
logs="${1:-gpu-logs}"
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
n=$(nvidia-smi -L | wc -l)
mpirun_cmd=(mpirun --allow-run-as-root --bind-to none)
status=0
step() { # name, command…
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$logs/$name.log"
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
}
step info "$weft" info
step mpirun-test "${mpirun_cmd[@]}" -np "$n" "$weft" test
step launch-test "$weft" launch -n "$n" -- "$weft" test
[ "$n" -gt 3 ] && step mpirun-test-3 "${mpirun_cmd[@]}" -np 3 "$weft" test
step default "$weft"
step bench-nccl "${mpirun_cmd[@]}" -np "$n" "$weft" bench nccl --json "$logs/nccl.json"
exit $status
