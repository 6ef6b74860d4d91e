#!/usr/bin/env bash
# The GEMM checks on one GPU with a prebuilt release binary: bash ci/gpu-gemm.sh [LOG_DIR]
# `weft test gemm::` (every GEMM trial), then `weft bench gemm --json LOG_DIR/gemm.json`.
# cuBLAS (the baseline) is loaded at run time: when libcublas.so.13 is not on the loader's path,
# the CUDA toolkit's lib64 or the nvidia-cublas wheel's lib directory is added.
set -uo pipefail
weft="${WEFT:-target/release/weft}"
logs="${1:-gpu-logs}"
mkdir -p "$logs"
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so'; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), "lib"))' 2>/dev/null)"; do
    if [ -n "$d" ] && ls "$d"/libcublas.so* >/dev/null 2>&1; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "cuBLAS from $d"
      break
    fi
  done
fi
status=0
"$weft" test gemm:: 2>&1 | tee "$logs/gemm-tests.log" || status=1
"$weft" bench gemm --json "$logs/gemm.json" 2>&1 | tee "$logs/gemm-bench.log" || status=1
exit $status
