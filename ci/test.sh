#!/usr/bin/env bash
# weft's test command (the README's, and what .ci/run calls). On a machine with nothing but the
# Rust toolchain: installs the CUDA compiler and libclang (ci/setup.sh), checks formatting
# (rustfmt) and lints (clippy -D warnings), builds every crate and
# packages every library crate (cargo package, which builds each package as a user would get it),
# compiles every kernels/**/*.cu for sm_90a, runs the CPU unit and process tests, then the `weft`
# harness trials on 1 rank and on several local ranks: 3 without a GPU (the GPU trials are then
# reported as ignored with the reason) or with 3 GPUs or more; one per GPU on a 2-GPU machine (3
# ranks there would share a GPU, which needs MPS: ci/gpu-shared.sh); on a 1-GPU machine only the
# 1-rank run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash ci/setup.sh
for c in fmt clippy; do
  cargo "$c" --version >/dev/null 2>&1 || { echo "ci/test.sh: cargo $c is missing: rustup component add rustfmt clippy" >&2; exit 1; }
done
cargo fmt --all -- --check
cargo build --release --locked --workspace
cargo clippy --release --locked --workspace --all-targets -- -D warnings
echo "== cargo package: every library crate packaged and its package built (offline, from the lock)"
# The verification builds each package against the others through a local registry, whose
# packages cargo extracts once per name and version into its registry sources and then reuses:
# weft's from an earlier run (same version, older code) would be built instead of these.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/weft-*-[0-9]*
NVCC="${NVCC:-$root/.toolchain/cuda/nvidia/cu13/bin/nvcc}" \
  cargo package --workspace --exclude weft-harness --exclude weft-testkit --exclude weft-example-own-kernel --exclude weft-example-gemm-reduce-scatter --exclude weft-example-moe-dispatch-combine --exclude weft-example-collectives --exclude weft-example-kernel-barrier --locked --offline
cargo test --release --locked --workspace
echo "== weft test (1 rank)"
target/release/weft test
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
fi
case "$gpus" in
  0) ranks=3 ;;  # no GPU: the multi-rank CPU trials; the GPU ones show as ignored
  1) ranks=0 ;;
  2) ranks=2 ;;
  *) ranks=3 ;;
esac
if [ "$ranks" -gt 0 ]; then
  echo "== weft launch -n $ranks -- weft test ($ranks local ranks, $gpus GPUs)"
  target/release/weft launch -n "$ranks" -- target/release/weft test
else
  echo "== one GPU: multi-rank trials need ranks sharing it under MPS: bash ci/gpu-shared.sh LOGS"
fi
