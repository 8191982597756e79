#!/usr/bin/env bash
# The training smoke of scripts/gpu_check.sh, what a user's GPU node should pass: one run config
# trained twice on the CUDA backend per optimizer; the two runs' last checkpoints must be
# byte-identical (weights, optimizer state, trainer state: the CUDA backend is deterministic), and the validation perplexity within 2% of the
# CPU backend's for the same config and data.
#
#   training_smoke.sh MULTINORM CONFIG REFERENCE WORK OUT_JSON OPTIMIZER... [-- --set key=value ...]
#
# OPTIMIZER: a name, or swan:PRODUCTS (optimizer.swan.ns_products, e.g. swan:split_tf32), held to the
# reference of its name (the CPU's products are FP32).
#
# REFERENCE: a JSON file {"<optimizer>": {"val_ppl": P, ...}} of the CPU backend's perplexities
# (scripts/gpu_check/smoke_reference.json for the bundled quickstart data), or "cpu": train once on
# the CPU backend here to make it (the dry run's tiny model). The --set arguments go to every run
# (the data paths; output_dir and backend are set here). OUT_JSON: {"bound": 0.02, "runs": [{"optimizer",
# "identical", "differing", "val_ppl", "reference_ppl", "relative", "ok", "seconds", "tokens_per_s",
# "step_s" (a training step, micro-batches and update, averaged), "cuda_graphs" (result.json's: replays, device loops)}]}.
# Exits 0 when every optimizer passed, 1 otherwise.
set -uo pipefail
[ $# -ge 6 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
mn=$1 config=$2 reference=$3 work=$4 out=$5
shift 5
optimizers=() sets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do optimizers+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
sets=("$@")
mkdir -p "$work"
rows=()  # "optimizer|what differs or failed, comma-separated"
fails=0
for opt in "${optimizers[@]}"; do
  echo "== $opt"
  name=${opt%%:*} dir=${opt//:/_} variant=()
  [ "$name" != "$opt" ] && variant=(--set optimizer.swan.ns_products="${opt#*:}")
  for run in a b; do
    rm -rf "$work/${dir}_$run"
    t0=$(date +%s.%N)
    if ! "$mn" train -c "$config" "${sets[@]}" --set optimizer.name="$name" "${variant[@]}" --set backend=cuda --set output_dir="$work/${dir}_$run"; then
      echo "training_smoke: $opt run $run failed"
      rows+=("$opt|run $run failed")
      continue 2
    fi
    echo "$opt run $run: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
  done
  if [ "$reference" = cpu ] && [ ! -f "$work/${name}_cpu/result.json" ]; then
    rm -rf "$work/${name}_cpu"
    "$mn" train -c "$config" "${sets[@]}" --set optimizer.name="$name" --set backend=cpu --set output_dir="$work/${name}_cpu" --quiet ||
      { echo "training_smoke: the CPU reference run of $name failed"; rows+=("$opt|the CPU reference run failed"); continue; }
  fi
  # The newest checkpoint of each run, its state file by file (run_config.json and the manifest's
  # checksum of it name the run's own output_dir: they differ by design).
  last=$(ls -d "$work/${dir}_a"/checkpoints/step_* 2>/dev/null | sort | tail -1)
  differing=()
  if [ -z "$last" ]; then
    differing=("no checkpoint")
  else
    for f in model.safetensors optimizer.bin trainer_state.json config.json; do
      cmp -s "$last/$f" "$work/${dir}_b/checkpoints/$(basename "$last")/$f" || differing+=("$(basename "$last")/$f")
    done
  fi
  rows+=("$opt|$(IFS=,; echo "${differing[*]:-}")")
done
# The perplexities and the verdict, in one JSON (any python3).
python3 - "$reference" "$work" "$out" "${rows[@]}" <<'PY' || fails=$((fails + 1))
import json, os, sys
reference, work, out, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
BOUND = 0.02
ref = None if reference == "cpu" else json.load(open(reference))
def result(d):
    try:
        return json.load(open(os.path.join(d, "result.json")))
    except (OSError, ValueError):
        return {}
runs, ok_all = [], True
for row in rows:
    opt, differing = row.split("|", 1)
    name = opt.split(":")[0]  # swan:split_tf32 is held to swan's reference
    differing = [d for d in differing.split(",") if d]
    a = result(os.path.join(work, opt.replace(":", "_") + "_a"))
    ref_ppl = result(os.path.join(work, name + "_cpu")).get("final_val_ppl") if ref is None else (ref.get(name) or {}).get("val_ppl")
    ppl = a.get("final_val_ppl")
    rel = abs(ppl - ref_ppl) / ref_ppl if ppl and ref_ppl else None
    ok = not differing and rel is not None and rel <= BOUND
    ok_all &= ok
    runs.append({"optimizer": opt, "identical": not differing, "differing": differing, "val_ppl": ppl, "reference_ppl": ref_ppl,
                 "relative": rel, "ok": ok, "updates": a.get("updates"), "seconds": a.get("wall_s"), "tokens_per_s": a.get("tokens_per_s"),
                 "step_s": a["update_s"] / a["updates"] if a.get("updates") else None, "cuda_graphs": a.get("cuda_graphs"),
                 "reference": "the CPU backend, trained here" if ref is None else (ref.get(name) or {}).get("measured", "")})
    print(f"{opt}: runs {'byte-identical' if not differing else 'differ in ' + ', '.join(differing)}; validation perplexity {ppl} "
          f"against the CPU's {ref_ppl} ({'%.2f%%' % (100 * rel) if rel is not None else 'n/a'}, bound {100 * BOUND:.0f}%)")
json.dump({"bound": BOUND, "runs": runs}, open(out, "w"), indent=1)
sys.exit(0 if ok_all and runs else 1)
PY
exit $((fails > 0))
