#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, describe the paper's models and
# measure the hand-written model's training throughput.
# (Training on the embedded default corpus joins this script as the trainer lands: see README.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bin=${MULTINORM_BUILD_DIR:-build}/multinorm
"$bin" devices
echo
"$bin" info --config configs/c4/llama_60m_sinkgd.json
echo
for m in llama_130m llama_350m llama_1b; do
  "$bin" info --config configs/models/$m.json | sed -n '/^memory as in the paper/,/^  swan/p' | sed "1s/^/$m: /"
done
echo
"$bin" bench model --config configs/models/llama_tiny.json --batch 16 --steps 3 --torch off
