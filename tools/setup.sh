#!/usr/bin/env bash
# Installs the Debian packages ckpt needs (idempotent, non-interactive), then configures and
# builds with ccache. Usage: tools/setup.sh [build-dir]   (default: build)
# CKPT_BUILD_TARGETS="a b" builds only those targets (default: all); CKPT_TORCH_VENV=0 skips the
# PyPI PyTorch venv that only tests and benchmarks use.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  liburing-dev libzstd-dev libxxhash-dev libabsl-dev libisal-dev
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  librocksdb-dev libgtest-dev libgmock-dev
  libcli11-dev libspdlog-dev nlohmann-json3-dev libcpp-httplib-dev
  clang libclang-rt-14-dev fio file
  pybind11-dev python3-dev python3-numpy python3-torch etcd-server etcd-client openssl libssl-dev
  libcurl4-openssl-dev libpugixml-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# CUDA lives outside PATH on Debian images that ship it under /usr/local/cuda.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
JOBS="${CKPT_JOBS:-2}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
fi
TARGETS=()
for t in ${CKPT_BUILD_TARGETS:-}; do TARGETS+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGETS[@]}"

# PyTorch from PyPI in a virtual environment, for the Python tests and benchmarks (besides Debian's
# python3-torch). CKPT_TORCH_VENV=0 skips it; those tests then fail, naming the missing interpreter.
if [ "${CKPT_TORCH_VENV:-1}" != 0 ]; then
  tools/torch-venv.sh "$BUILD_DIR/torch-venv"
fi
