#!/usr/bin/env bash
# The CPU backend's side of gpu_check's training smoke: configs/quickstart.json trained on the CPU
# over the smoke's shards of the default corpus (train shard 0, validation shard 0), SinkGD and SWAN,
# each run's final validation perplexity written with the hash of every file it read (smoke_hash.py) to
# scripts/gpu_check/smoke_reference.json. scripts/bundle.sh packs those files only when their hashes
# match, so the GPU's perplexity is always compared with the CPU's on the same data.
#
#   bash scripts/gpu_check/smoke_reference.sh [DATA_DIR]    DATA_DIR: default data/default (quickstart.sh's)
#
# About 25 minutes on 2 cores (two 300-update runs of a 20M model). Needs build/multinorm.
set -euo pipefail
cd "$(dirname "$0")/../.."
data=${1:-data/default}
bin=${MULTINORM_BUILD_DIR:-build}/multinorm
out=scripts/gpu_check/smoke_reference.json
train=$(ls "$data"/tokens/c4-train.00000-of-*.tok 2>/dev/null | head -1) || true
validation=$(ls "$data"/tokens/c4-validation.00000-of-*.tok 2>/dev/null | head -1) || true
[ -n "$train" ] && [ -n "$validation" ] && [ -f "$data/tokenizer.model" ] ||
  { echo "smoke_reference: no shards in $data/tokens or no $data/tokenizer.model (bash scripts/quickstart.sh makes them)" >&2; exit 1; }
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
for opt in sinkgd swan; do
  echo "== $opt on the CPU backend"
  "$bin" train -c configs/quickstart.json --set data.train="$train" --set data.validation="$validation" \
    --set data.tokenizer="$data/tokenizer.model" --set optimizer.name=$opt --set backend=cpu --set output_dir="$runs/$opt" --quiet
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
python3 - "$data" "$runs" "$out" "$commit" "$cpu" "$(nproc)" "$train" "$validation" <<'PY'
import json, os, sys, time
data, runs, out, commit, cpu, cores, train, validation = sys.argv[1:]
sys.path.insert(0, "scripts/gpu_check")
from smoke_hash import content_hash
files = {os.path.relpath(p, data): content_hash(p) for p in (train, validation, os.path.join(data, "tokenizer.model"))}
ref = {"what": "configs/quickstart.json on the CPU backend over these files: gpu_check's training smoke compares the GPU's "
               "validation perplexity with these (scripts/gpu_check/training_smoke.sh)",
       "measured": f"multinorm {commit}, CPU backend, {cpu}, {cores} cores, {time.strftime('%Y-%m-%d', time.gmtime())}",
       "files": files}
for opt in ("sinkgd", "swan"):
    r = json.load(open(os.path.join(runs, opt, "result.json")))
    ref[opt] = {"val_ppl": r["final_val_ppl"], "val_loss": r["final_val_loss"], "updates": r["updates"],
                "measured": ref["measured"]}
with open(out, "w") as f:
    json.dump(ref, f, indent=1)
    f.write("\n")
print(f"smoke_reference: {out}: sinkgd {ref['sinkgd']['val_ppl']:.3f}, swan {ref['swan']['val_ppl']:.3f}")
PY
