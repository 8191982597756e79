#!/usr/bin/env bash
# lint_layers.sh fires: a tree with an include upward (the model including the optimizer), one into
# a backend's internals (the model including kernels/cpu) and a file in no layer must fail, naming
# each; the same tree without them must pass.
set -uo pipefail
lint=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir -p "$d/include/multinorm" "$d/src/model" "$d/src/optim" "$d/kernels/cpu"
for h in error backend optimizer llama_model; do echo "#pragma once" > "$d/include/multinorm/$h.h"; done
echo '#include "multinorm/error.h"' > "$d/kernels/cpu/cpu_kernels.h"
printf '#include "multinorm/backend.h"\n#include "multinorm/llama_model.h"\n' > "$d/src/model/llama_model.cpp"
printf '#include "multinorm/optimizer.h"\n#include "multinorm/llama_model.h"\n' > "$d/src/optim/optimizer.cpp"
bash "$lint" "$d" > /dev/null || { echo "lint_layers_planted: the clean tree fails"; bash "$lint" "$d"; exit 1; }
printf '#include "multinorm/optimizer.h"\n' > "$d/src/model/planted_upward.cpp"
printf '#include "../../kernels/cpu/cpu_kernels.h"\n' > "$d/src/model/planted_internals.cpp"
mkdir -p "$d/src/nowhere" && echo '#include "multinorm/error.h"' > "$d/src/nowhere/stray.cpp"
out=$(bash "$lint" "$d")
rc=$?
fails=0
[ $rc -ne 0 ] || { echo "lint_layers_planted: the planted tree passes"; fails=1; }
for want in "src/model/planted_upward.cpp (model) includes multinorm/optimizer.h (optim): an include upward" \
            "src/model/planted_internals.cpp (model) includes ../../kernels/cpu/cpu_kernels.h (backends): an include upward" \
            "src/nowhere/stray.cpp: in no layer"; do
  grep -qF "$want" <<< "$out" || { echo "lint_layers_planted: not reported: $want"; fails=1; }
done
[ $fails = 0 ] && echo "lint_layers_planted: the three planted violations are reported, the clean tree passes"
exit $fails
