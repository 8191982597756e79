#!/usr/bin/env bash
# lint_cuda.sh's rules fire: a tree with one planted violation of each must fail with each message,
# and the same tree without them must pass.
set -uo pipefail
lint=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/kernels/cuda"
cat >"$d/kernels/cuda/clean.cu" <<'CU'
__global__ void ok(float* x, long n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = 0;
}
CU
bash "$lint" "$d" >/dev/null || { echo "lint_cuda_planted: the clean tree fails"; bash "$lint" "$d"; exit 1; }
cat >"$d/kernels/cuda/planted.cu" <<'CU'
#include <cooperative_groups.h>
__global__ void bad(float* x, long n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = 0;
  extern __shared__ float s[];
  asm volatile("bar.sync 0;");
#if __CUDA_ARCH__ >= 800
#endif
}
void host() { bad<<<1, 1>>>(nullptr, 0); cudaStreamSynchronize(0); }
CU
cat >"$d/kernels/cuda/planted_event.cu" <<'CU'
void wait_for(cudaEvent_t e) { cudaEventSynchronize(e); }
CU
out=$(bash "$lint" "$d")
rc=$?
status=0
[ $rc -ne 0 ] || { echo "lint_cuda_planted: the planted tree passes"; status=1; }
for m in "<<< >>>" "extern __shared__" "inline assembly" "architecture branch" "grid-wide synchronisation" "formed in 32 bits" "host wait outside the queue"; do
  grep -qF "$m" <<<"$out" || { echo "lint_cuda_planted: no '$m' message"; status=1; }
done
grep -qF "planted_event.cu" <<<"$out" || { echo "lint_cuda_planted: an event wait outside cuda_queue.cu is not reported"; status=1; }
[ $status -eq 0 ] && echo "lint_cuda_planted: every rule fires"
exit $status
