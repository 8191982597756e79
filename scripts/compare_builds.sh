#!/usr/bin/env bash
# Trains the same short runs with two builds of multinorm and compares their checkpoints byte for
# byte: a change to the trainer, the optimizer or a backend that should not change the math must
# leave every weight, optimizer state and trainer state where it was. Build the reference from the
# commit to compare against in a second tree (git worktree add ../ref <commit>; scripts/build.sh).
# CPU kernels dispatch by ISA, so compare two builds on one machine, never against stored bytes.
#   bash scripts/compare_builds.sh <reference build dir> <candidate build dir>
# Runs (the test fixtures' tiny run: a 2-layer model, 6 updates, a checkpoint every 3): the CPU
# backend with SinkGD (stochastic rounding, clipping), SWAN, Adam and a divergence rollback; 2 MPI
# ranks, replicated and sharded; the emulated CUDA backend with SinkGD and SWAN, graphs on and off,
# and 2 emulated NCCL ranks. run_config.json and the manifest may differ where the config schema
# did (printed); everything else must be equal.
set -euo pipefail
ref=$(realpath "$1") new=$(realpath "$2")
here=$(realpath "$(dirname "$0")")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$here/../tests/fixtures/tiny_shards.sh"
make_tiny_shards "$new/multinorm"
export MULTINORM_EMU_RACECHECK=0 OMP_NUM_THREADS=1
# Only the keys both builds know (a resolved config would carry every key of one build's schema).
python3 - <<'PY'
import json
r = json.load(open("run.json"))
r["batch"]["micro_batch"] = 2
r["optimizer"] = {"rounding": "stochastic", "grad_clip": 0.5}
r["checkpoint"]["keep_last"] = 4
r["threads"] = 1
json.dump(r, open("run.json", "w"), indent=1)
PY
mkdir -p ref new
for side in ref new; do ln -s ../shards ../tok.model ../run.json $side/; done
mpi() { mpirun -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -x MULTINORM_CUDA_PLUGIN -x MULTINORM_EMU_RACECHECK "$@"; }
# run NAME [mpi] [--set ...]: the run with both builds, into ref/NAME and new/NAME
run() {
  local name=$1; shift
  local launch=()
  if [ "${1:-}" = mpi ]; then launch=(mpi); shift; fi
  for side in ref new; do
    local build=${!side}
    (cd $side && MULTINORM_CUDA_PLUGIN=$build/libmultinorm_cuda_emulated.so "${launch[@]}" "$build/multinorm" train -c run.json --quiet \
      --set output_dir=runs/$name "$@" > "$name.log" 2>&1) || { echo "$side/$name failed:"; tail -5 "$side/$name.log"; exit 1; }
  done
}
# The rollback: 4 updates, then lr 1e6 from the checkpoint of update 3; update 5 blows the weights up,
# a later loss trips, the run rolls back with lr x 1e-9 and completes.
rollback() {
  for side in ref new; do
    local build=${!side}
    (cd $side && "$build/multinorm" train -c run.json --quiet --set output_dir=runs/rollback --set optimizer.name=adam --max-updates 4 > /dev/null 2>&1 &&
      "$build/multinorm" train -c run.json --quiet --set output_dir=runs/rollback --set optimizer.name=adam --resume --allow-config-change \
      --set optimizer.lr=1e6 --set divergence.action=rollback --set divergence.rollback_lr_factor=1e-9 > rollback.log 2>&1) ||
      { echo "$side/rollback failed:"; tail -5 "$side/rollback.log"; exit 1; }
  done
}
run cpu_sinkgd
run cpu_swan --set optimizer.name=swan
run cpu_adam --set optimizer.name=adam --set optimizer.grad_clip=0
rollback
run mpi2_replicated mpi --set parallel.shard_optimizer=false
run mpi2_sharded mpi --set parallel.shard_optimizer=true
run mpi2_sharded_swan mpi --set optimizer.name=swan --set parallel.shard_optimizer=true
run cuda_sinkgd --set backend=cuda
run cuda_sinkgd_eager --set backend=cuda --set cuda_graphs=false
run cuda_swan --set backend=cuda --set optimizer.name=swan
run cuda_swan_eager --set backend=cuda --set optimizer.name=swan --set cuda_graphs=false
run nccl2_sharded mpi --set backend=cuda --set parallel.shard_optimizer=true

fails=0 files=0 shown=0
for dir in new/runs/*; do
  name=${dir#new/runs/} old=ref/runs/${dir#new/runs/}
  grep -q '"type":"divergence"' "$dir/metrics.jsonl" && echo "$name: $(grep -c '"type":"divergence"' "$dir/metrics.jsonl") divergence record(s)"
  for ck in "$dir"/checkpoints/step_*; do
    step=${ck##*/}
    for f in model.safetensors optimizer.bin trainer_state.json config.json; do
      files=$((files + 1))
      cmp -s "$old/checkpoints/$step/$f" "$ck/$f" || { echo "DIFFERS: $name/$step/$f"; fails=$((fails + 1)); }
    done
    if ! cmp -s "$old/checkpoints/$step/run_config.json" "$ck/run_config.json" && [ $shown -eq 0 ]; then
      shown=1
      echo "run_config.json differs where the schema did (shown once):"
      diff <(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=1, sort_keys=True))" "$old/checkpoints/$step/run_config.json") \
           <(python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=1, sort_keys=True))" "$ck/run_config.json") | grep '^[<>]' || true
    fi
  done
  [ -d "$old/checkpoints" ] && [ "$(ls $old/checkpoints)" = "$(ls $dir/checkpoints)" ] ||
    { echo "DIFFERS: $name: checkpoints $(ls $old/checkpoints | tr '\n' ' ')vs $(ls $dir/checkpoints | tr '\n' ' ')"; fails=$((fails + 1)); }
done
echo "compare_builds: $files files compared over $(ls new/runs | wc -l) runs, $fails differ"
[ $fails -eq 0 ]
