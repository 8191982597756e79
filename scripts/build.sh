#!/usr/bin/env bash
# Configures and builds multinorm into ./build (Release; the CUDA plugin too when nvcc is found).
#   bash scripts/build.sh [extra cmake args, e.g. -DMULTINORM_CUDA=OFF]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${MULTINORM_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
