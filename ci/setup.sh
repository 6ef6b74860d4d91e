#!/usr/bin/env bash
# Installs what building weft needs on a machine with only the Rust toolchain:
#   - the CUDA 13.0 compiler from PyPI wheels into .toolchain/cuda (git-ignored);
#   - libclang for bindgen (Debian package libclang-dev).
# Idempotent: a second run checks and does nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$root/.toolchain/cuda"
nvcc="$target/nvidia/cu13/bin/nvcc"
wheels=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
)

if [ -x "$nvcc" ] && [ -f "$target/.weft-wheels" ] && [ "$(cat "$target/.weft-wheels")" = "${wheels[*]}" ]; then
  echo "ci/setup.sh: CUDA compiler already in $target"
else
  echo "ci/setup.sh: installing ${wheels[*]} into $target"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "ci/setup.sh: the CUDA compiler comes from PyPI wheels and needs pip: python3 -m pip is missing." >&2
    echo "  Install it (Debian/Ubuntu: apt-get install python3-pip; elsewhere: python3 -m ensurepip --user)," >&2
    echo "  or skip this step by pointing NVCC at a CUDA 13.0 nvcc (or CUDA_HOME at a CUDA 13.0 toolkit)." >&2
    exit 1
  fi
  rm -rf "$target"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" "${wheels[@]}"
  echo "${wheels[*]}" > "$target/.weft-wheels"
fi
"$nvcc" --version | tail -n 2

# bindgen needs libclang's C library (libclang.so / libclang-N.so), not libclang-cpp.
if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* >/dev/null 2>&1; then
  echo "ci/setup.sh: installing libclang-dev for bindgen"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq libclang-dev >/dev/null
fi
echo "ci/setup.sh: done"
