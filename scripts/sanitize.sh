#!/usr/bin/env bash
# The test suite's C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
# (Debug-level checks on an -O1 build). Not part of CI's time budget: run by hand before a release
# or after touching memory-sensitive code (the shard reader, kernels).
#   bash scripts/sanitize.sh [gtest filter, default: everything]
set -euo pipefail
cd "$(dirname "$0")/.."
filter=${1:-*}
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMULTINORM_CUDA=OFF -DMULTINORM_NATIVE=ON \
  -DCMAKE_CXX_FLAGS="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-asan -j "$(nproc)" --target multinorm_tests multinorm
# OpenMP's runtime keeps thread pools alive at exit: leak reports from libgomp are not ours.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
build-asan/multinorm_tests --gtest_filter="$filter"
