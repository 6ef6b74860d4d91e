#!/usr/bin/env bash
# weft's test command (the README's, and what .ci/run calls). On a machine with nothing but the
# Rust toolchain: installs the CUDA compiler and libclang (ci/setup.sh), builds every crate and
# compiles every kernels/**/*.cu for sm_90a, runs the CPU unit and process tests, then the `weft`
# harness trials on 1 rank and on 3 local ranks. Without a GPU the GPU trials are reported as
# ignored with the reason; on a GPU machine they run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash ci/setup.sh
cargo build --release --locked --workspace
cargo test --release --locked --workspace
echo "== weft test (1 rank)"
target/release/weft test
echo "== weft launch -n 3 -- weft test (3 local ranks)"
target/release/weft launch -n 3 -- target/release/weft test
