#!/usr/bin/env bash
# The CUDA sources' portability rules (docs/cuda.md), checked on every CI run:
#   - kernels launch only through launch() in kernels/cuda/cuda_compat.h: no <<< >>> elsewhere;
#   - dynamic shared memory only through MN_DYNAMIC_SHARED: no `extern __shared__` elsewhere;
#   - no inline assembly (asm / PTX) and no __CUDA_ARCH__ branches in kernel files: inline PTX lives
#     in kernels/cuda/warp_matrix.cuh only, whose every primitive has an emulated path that follows
#     the PTX ISA's fragment layouts (tests/test_warp_matrix.cpp);
#   - no grid-wide synchronisation (cooperative groups' grid sync, spinning on another block's flag);
#   - the host waits for the device only through the backend's queue (kernels/cuda/cuda_queue.cu:
#     its waits, fences, reads and upload ring), which counts the waits (environment.cu's NCCL
#     self-test, outside the backend, the profiler's event reads, which only profiling runs make, and
#     check.cu's synchronisation after each launch in debug builds, a diagnostic mode, excepted);
#   - a grid-wide index or stride (blockIdx.x * blockDim.x, gridDim.x * blockDim.x) is formed in 64
#     bits: in 32 bits it wraps past 2^31 elements (a 7B model's gradient arena is 6.7e9).
# A rule is broken when a pattern appears in code (comment lines are skipped).
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"
files=$(ls kernels/cuda/*.cu kernels/cuda/*.cuh kernels/cuda/*.h 2>/dev/null)
fail=0
check() {  # pattern, allowed file (or ""), message
  local hits
  hits=$(grep -nHE "$1" $files | grep -vE '^[^:]+:[0-9]+:\s*//' | grep -v "^$2:" || true)
  [ -z "$2" ] && hits=$(grep -nHE "$1" $files | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
  if [ -n "$hits" ]; then
    echo "lint_cuda: $3:"
    echo "$hits"
    fail=1
  fi
}
check '<<<' kernels/cuda/cuda_compat.h "a kernel launched with <<< >>> outside launch() (kernels/cuda/cuda_compat.h)"
check 'extern[[:space:]]+__shared__' kernels/cuda/cuda_compat.h "extern __shared__ outside MN_DYNAMIC_SHARED"
check '(^|[^_[:alnum:]])(asm|__asm__)[[:space:]]*(volatile)?[[:space:]]*\(' kernels/cuda/warp_matrix.cuh "inline assembly outside kernels/cuda/warp_matrix.cuh"
check '__CUDA_ARCH__' "" "an architecture branch in a kernel file"
check 'cooperative_groups|this_grid|grid\.sync|cudaLaunchCooperativeKernel' "" "grid-wide synchronisation"
# a product of two 32-bit built-ins with neither side widened first
wide='(int64_t|size_t|uint64_t|long)'
hits=$(grep -nHE '(blockIdx|gridDim)\.[xyz][[:space:]]*\*[[:space:]]*blockDim\.[xyz]|blockDim\.[xyz][[:space:]]*\*[[:space:]]*(blockIdx|gridDim)\.[xyz]' $files |
  grep -vE '^[^:]+:[0-9]+:\s*//' | grep -vE "${wide}\((blockIdx|gridDim|blockDim)\.[xyz]\)[[:space:]]*\*|\*[[:space:]]*${wide}\((blockIdx|gridDim|blockDim)\.[xyz]\)" || true)
if [ -n "$hits" ]; then
  echo "lint_cuda: a grid-wide index or stride formed in 32 bits (write int64_t(blockIdx.x) * blockDim.x):"
  echo "$hits"
  fail=1
fi
# every host wait goes through kernels/cuda/cuda_queue.cu, which counts it
hits=$(grep -nHE 'cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize' $files | grep -vE '^[^:]+:[0-9]+:\s*//' |
  grep -vE '^kernels/cuda/(cuda_queue|check|environment|profiler)\.cu:' || true)
if [ -n "$hits" ]; then
  echo "lint_cuda: a host wait outside the queue (kernels/cuda/cuda_queue.cu), which counts them:"
  echo "$hits"
  fail=1
fi
if [ $fail -eq 0 ]; then echo "lint_cuda: $(echo $files | wc -w) files clean"; fi
exit $fail
