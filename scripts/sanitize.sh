#!/usr/bin/env bash
# The C++ tests under sanitizers. Not part of CI's time budget (each mode rebuilds the tree with
# instrumentation): run by hand before a release or after touching memory-sensitive code (the shard
# reader, kernels, the CUDA emulation).
#   bash scripts/sanitize.sh asan [gtest filter]   AddressSanitizer + UndefinedBehaviorSanitizer, every
#                                                 test (the emulated CUDA kernels included), build-asan/
#   bash scripts/sanitize.sh tsan                  ThreadSanitizer on the emulated CUDA kernels only
#                                                 (fiber-annotated emulation; tiny shapes), build-tsan/
#   bash scripts/sanitize.sh                       both
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
filter=${2:-*}

if [ "$mode" = asan ] || [ "$mode" = all ]; then
  flags="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMULTINORM_CUDA=OFF -DMULTINORM_NATIVE=ON \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  cmake --build build-asan -j "$(nproc)" --target multinorm_tests multinorm cuda_emulation_tests
  # OpenMP's runtime keeps thread pools alive at exit: leak reports from libgomp are not ours.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  build-asan/multinorm_tests --gtest_filter="$filter"
  build-asan/tests/cuda_emulation_tests
fi

if [ "$mode" = tsan ] || [ "$mode" = all ]; then
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMULTINORM_CUDA=OFF -DMULTINORM_NATIVE=ON \
    -DCMAKE_CXX_FLAGS="-O1 -g -fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  cmake --build build-tsan -j "$(nproc)" --target multinorm_tests cuda_emulation_tests
  export TSAN_OPTIONS=halt_on_error=1
  build-tsan/tests/cuda_emulation_tests
  # The CUDA backend's op and model tests against the FP64 references, several emulation workers and
  # both fiber orders. No CPU backend, and host-side OpenMP (weight init) on one thread: libgomp is not
  # instrumented, so its barriers would look like races.
  for order in forward random; do
    OMP_NUM_THREADS=1 MULTINORM_EMU_ORDER=$order MULTINORM_EMU_WORKERS=3 build-tsan/multinorm_tests \
      --gtest_filter='Backends/Ops.*/cuda:Backends/OpsBf16.*/cuda:Backends/ModelOn.*/cuda'
  done
  # The optimizer kernels against a single-threaded CPU reference (forward order, 3 workers).
  OMP_NUM_THREADS=1 MULTINORM_TEST_CPU_THREADS=1 build-tsan/multinorm_tests \
    --gtest_filter='*CudaVsCpu.SinkGD*forward*:*CudaVsCpu.Adam*forward*:*CudaVsCpu.Stochastic*forward*'

fi
