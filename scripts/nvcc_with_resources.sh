#!/usr/bin/env bash
# CMake's compiler launcher for the CUDA plugin's sources: runs the nvcc command it is given (built
# with -Xptxas=-v) and keeps ptxas' report of registers, shared memory and spills per kernel in
# <dir>/<object>.ptxas, where the emulated build reads its launch limits (kernels/cuda/emulation/
# launch_limits.h). The report is printed only when MULTINORM_PTXAS_VERBOSE is set, or on failure.
#   nvcc_with_resources.sh <dir> <verbose 0|1> nvcc args...
set -uo pipefail
dir=$1 verbose=$2
shift 2
object=unknown
prev=
for a in "$@"; do
  if [ "$prev" = "-o" ]; then object=$(basename "$a"); fi
  prev=$a
done
mkdir -p "$dir"
log="$dir/$object.ptxas"
"$@" 2>"$log.tmp"
rc=$?
# ptxas' info lines go to the report; anything else nvcc said (warnings are errors here) to stderr.
grep -E '^ptxas info|^    [0-9]+ bytes stack frame' "$log.tmp" >"$log"
others=$(grep -vE '^ptxas info|^    [0-9]+ bytes stack frame' "$log.tmp")
rm -f "$log.tmp"
[ -n "$others" ] && printf '%s\n' "$others" >&2
if [ "$verbose" = 1 ]; then cat "$log" >&2; fi
exit $rc
