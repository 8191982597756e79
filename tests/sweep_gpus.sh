#!/usr/bin/env bash
# `multinorm sweep --gpus --gpus-per-run` on a node of 4 GPUs (the emulated CUDA plugin, told to
# report 4 devices): each run sees only its own GPUs (CUDA_VISIBLE_DEVICES: its result.json names
# the first device it sees), runs of 2 GPUs are launched with mpirun as 2 data-parallel ranks, and a second
# invocation skips the finished runs.
# usage: sweep_gpus.sh <multinorm binary> <emulated CUDA plugin> <mpirun>
set -uo pipefail
bin=$(realpath "$1") plugin=$(realpath "$2") mpirun=$3
fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
fail() { echo "FAIL: $*"; exit 1; }
export MULTINORM_CUDA_PLUGIN=$plugin MULTINORM_EMU_DEVICES=4
# The kernels are checked by the emulation's racecheck in the op and model tests; here the command
# line is.
export MULTINORM_EMU_RACECHECK=0
# mpirun as root (CI containers) and 2 ranks on any core count
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
"$bin" config -c run.json --set backend=cuda --set schedule.total_steps=2 --set eval.tokens=200 --set checkpoint.every=0 -o run.json
cat > sweep.json <<JSON
{"base": "run.json", "output_dir": "runs/sweep", "grid": {"seed": [1, 2, 3, 4]}}
JSON
# run_device RUN: the first device the run's rank 0 saw; run_ranks RUN: its ranks (result.json)
result() { /usr/bin/python3 -c "import json; print(json.load(open('runs/sweep/$1/result.json'))['$2'])"; }
run_device() { result "$1" backend_choice | sed -n 's/.*the first: CUDA emulation on the CPU (test instrument), device \([0-9]*\)).*/\1/p'; }
run_ranks() { result "$1" ranks; }

# One GPU per run: four runs at once, on GPUs 0, 1, 2, 3.
"$bin" sweep sweep.json --gpus 0-3 > one.txt 2>&1 || { cat one.txt runs/sweep/*/train.log; fail "sweep --gpus 0-3"; }
devices=""
for s in 1 2 3 4; do devices+="$(run_device seed=$s)$(run_ranks seed=$s) "; done
[ "$devices" = "01 11 21 31 " ] || { cat one.txt; fail "one GPU per run: (device, ranks) of each run: $devices"; }
grep -c "^sweep: starting seed=[1-4] on GPU [0-3]$" one.txt | grep -qx 4 || { cat one.txt; fail "the sweep does not say where each run went"; }
echo "sweep_gpus: --gpus 0-3: four runs, each on its own GPU (devices and ranks: $devices)"

# Two GPUs per run: two runs at once, each 2 ranks under mpirun, on GPUs 0-1 and 2-3.
rm -rf runs/sweep
"$bin" sweep sweep.json --gpus 0-3 --gpus-per-run 2 --mpirun "$mpirun" > two.txt 2>&1 || { cat two.txt runs/sweep/*/train.log; fail "--gpus-per-run 2"; }
devices=""
for s in 1 2 3 4; do devices+="$(run_device seed=$s)$(run_ranks seed=$s) "; done
# runs 1 and 2 start on the two slots; 3 and 4 take whichever slot frees first
[[ "$devices" =~ ^"02 22 "(02|22)" "(02|22)" "$ ]] || { cat two.txt; fail "two GPUs per run: (device, ranks) of each run: $devices"; }
grep -q "^sweep: starting seed=1 on GPU 0,1 (.*mpirun -np 2)$" two.txt || { cat two.txt; fail "the sweep does not say how it launched"; }
result seed=1 backend_choice | grep -q "; 2 visible," || fail "a 2-GPU run does not see 2 GPUs: $(result seed=1 backend_choice)"
"$bin" sweep sweep.json --gpus 0-3 --gpus-per-run 2 --mpirun "$mpirun" > again.txt 2>&1 || fail "the sweep again"
[ "$(grep -c 'already finished, skipped' again.txt)" = 4 ] || { cat again.txt; fail "a second sweep did not skip the finished runs"; }
echo "sweep_gpus: --gpus 0-3 --gpus-per-run 2: two runs at a time, 2 ranks each, on GPUs 0-1 and 2-3; resumable"

# Refused: a slot size that does not divide the GPUs; a batch the slot's ranks cannot share.
out=$("$bin" sweep sweep.json --gpus 0-2 --gpus-per-run 2 2>&1) && fail "3 GPUs in slots of 2 accepted"
grep -q "does not divide the 3 GPUs of --gpus" <<<"$out" || fail "no reason for 3 GPUs in slots of 2: $out"
out=$("$bin" sweep sweep.json --gpus 0-2 --gpus-per-run 3 2>&1) && fail "a global batch of 8 over 3 ranks accepted"
grep -q "with --gpus-per-run 3: .*batch.global_batch 8 is not a multiple of batch.micro_batch x ranks = 4 x 3" <<<"$out" || fail "no reason: $out"
echo "sweep_gpus: passed"
