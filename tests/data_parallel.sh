#!/usr/bin/env bash
# Data parallelism over MPI on CPUs (mpirun --oversubscribe, 2 and 3 ranks):
#  - N updates on 2 and 3 ranks equal N updates of one process with the same global batch, for SinkGD,
#    SWAN and Adam, with and without the sharded optimizer and the overlapped bucket reduction; the
#    four modes of one world size are bitwise identical (same buckets, same reduction order);
#  - both loss normalisations; evaluation covers the same tokens;
#  - resume of a sharded 3-rank run is bit-exact; a checkpoint resumes on another world size;
#  - a rank killed mid-run (SIGKILL) ends the run within a bound, the last checkpoint resumes; a
#    stalled rank (SIGSTOP) makes the other exit after parallel.timeout_s, naming rank and update;
#  - a global batch the ranks cannot share, and another MPI's launcher, are refused.
# usage: data_parallel.sh <multinorm binary>
set -euo pipefail
bin=$(realpath "$1") fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'kill -CONT $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
cd "$tmp"
# One OpenMP thread per rank (ranks share the cores); root is allowed, as in CI containers.
mpi() { local n=$1; shift; mpirun -np "$n" --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 "$@"; }
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
# Global batch 12 = 6 micro-batches of 2 for one process, 3 per rank for two, 2 for three. Tiny
# buckets (0.01 MiB: a layer each) so several are in flight during the backward pass.
"$bin" config -c run.json --set batch.global_batch=12 --set batch.micro_batch=2 --set optimizer.lr=0.02 --set optimizer.grad_clip=1.0 \
  --set eval.tokens=1000000 --set precision.params=fp32 --set precision.optimizer_states=fp32 --set threads=1 \
  --set parallel.bucket_mb=0.01 -o run.json
passes=0
# compare.py ONE OTHER METRIC_BOUND WEIGHT_BOUND: per-update loss, gradient norm and validation loss
# (relative), and the final weights (max difference relative to the tensor's largest element).
cat > compare.py <<'PY'
import json, struct, sys
import numpy as np
one, other, metric_bound, weight_bound = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
a, b = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in (one, other))
assert [r["type"] for r in a] == [r["type"] for r in b], "different records"
worst = 0.0
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "tokens", "val_loss", "val_tokens"):
        if k in x:
            worst = max(worst, abs(x[k] - y[k]) / max(abs(x[k]), 1e-12))
def weights(d):
    raw = open(d + "/checkpoints/step_00000006/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32)
            for k, v in head.items() if k != "__metadata__"}
wa, wb = weights(one), weights(other)
ww = max(float(np.max(np.abs(wa[k] - wb[k])) / max(np.max(np.abs(wa[k])), 1e-30)) for k in wa)
print(f"  {other} vs {one}: metrics {worst:.1e} (bound {metric_bound:.0e}), weights {ww:.1e} (bound {weight_bound:.0e})")
assert worst < metric_bound and ww < weight_bound, "beyond the bound"
PY

# 1. Ranks x optimizers x (sharded, overlapped): against one process. The sums over ranks add the
# micro-batch gradients in another order than one process's accumulation: FP32 reduction-order
# differences, measured (2 and 3 ranks): metrics SinkGD 1.6e-7, Adam 2.3e-7, SWAN 1.1e-5; final
# weights SinkGD 4.3e-6, Adam 2.0e-5, SWAN 3.0e-4 (Newton-Schulz stops on a tolerance, so a tiny
# difference can cost or save an iteration). Bounds about 5x those.
declare -A metric_bound=([sinkgd]=1e-6 [adam]=1e-6 [swan]=5e-5) weight_bound=([sinkgd]=2e-5 [adam]=1e-4 [swan]=1.5e-3)
for opt in sinkgd swan adam; do
  "$bin" train -c run.json --set output_dir=one_$opt --set optimizer.name=$opt --quiet > /dev/null
  for n in 2 3; do
    for shard in true false; do
      for overlap in true false; do
        d=r${n}_${opt}_shard-${shard}_overlap-${overlap}
        mpi $n "$bin" train -c run.json --set output_dir=$d --set optimizer.name=$opt --set parallel.shard_optimizer=$shard \
          --set parallel.overlap=$overlap --quiet > /dev/null
        /usr/bin/python3 compare.py one_$opt $d "${metric_bound[$opt]}" "${weight_bound[$opt]}"
      done
    done
    # One world size, four modes: the same buckets and the same sums, so the same bits (weights and
    # optimizer state: a sharded run's checkpoint is the file an unsharded one writes).
    for d in r${n}_${opt}_shard-*; do
      cat $d/checkpoints/step_00000006/{model.safetensors,optimizer.bin} | md5sum
    done | sort -u | wc -l | grep -qx 1 || { echo "FAIL: $opt on $n ranks: the modes differ"; exit 1; }
    echo "  $opt, $n ranks: sharded/replicated x overlapped/not: identical checkpoints"
  done
done
passes=$((passes + 1))

# 2. Both loss normalisations (micro-batch mean weighs every rank's micro-batches; token mean every
# counted target of the global step).
for loss in micro_batch_mean token_mean; do
  "$bin" train -c run.json --set output_dir=one_$loss --set batch.loss_normalization=$loss --quiet > /dev/null
  mpi 3 "$bin" train -c run.json --set output_dir=three_$loss --set batch.loss_normalization=$loss --quiet > /dev/null
  /usr/bin/python3 compare.py one_$loss three_$loss 1e-6 2e-5
done
passes=$((passes + 1))

# 3. Resume: a sharded 3-rank run stopped at update 3 and resumed is bit-exact with the continuous
# one (each owner reloads its tensors' state from the gathered file); a 2-rank checkpoint resumes
# on 3 ranks and on one process (the files and the data cursor do not depend on the world size).
mpi 3 "$bin" train -c run.json --set output_dir=resumed --max-updates 3 --quiet > /dev/null
mpi 3 "$bin" train -c run.json --set output_dir=resumed --resume --quiet > /dev/null
for f in model.safetensors optimizer.bin; do
  cmp resumed/checkpoints/step_00000006/$f r3_sinkgd_shard-true_overlap-true/checkpoints/step_00000006/$f
done
for n in 3 1; do
  mpi 2 "$bin" train -c run.json --set output_dir=moved_$n --set optimizer.name=adam --max-updates 3 --quiet > /dev/null
  mpi $n "$bin" train -c run.json --set output_dir=moved_$n --set optimizer.name=adam --resume --quiet > /dev/null
  /usr/bin/python3 compare.py one_adam moved_$n "${metric_bound[adam]}" "${weight_bound[adam]}"
done
passes=$((passes + 1))

# 3b. BF16 gradients are summed in FP32 in two staging slots of the largest bucket: tiny buckets (a
# layer each, so the slots are reused many times, narrowed back while later buckets are in flight)
# give the same bits as one bucket (every element's sum is the same FP32 addition either way; two
# ranks, so the order of a sum cannot differ), replicated and sharded, overlapped or not. The log
# states the staging: two slots of the largest bucket, not the arena.
bf16=(--set precision.params=bf16 --set precision.optimizer_states=bf16)
for shard in false true; do
  mpi 2 "$bin" train -c run.json "${bf16[@]}" --set parallel.shard_optimizer=$shard --set parallel.bucket_mb=1000 \
    --set output_dir=bf16_one_$shard > bf16_one_$shard.log 2>&1
  for overlap in true false; do
    # three staging slots when not overlapped: slot reuse at another distance, the same bits
    slots=2; [ $overlap = false ] && slots=3
    mpi 2 "$bin" train -c run.json "${bf16[@]}" --set parallel.shard_optimizer=$shard --set parallel.overlap=$overlap \
      --set parallel.staging_buckets=$slots --set output_dir=bf16_tiny_${shard}_$overlap > bf16_tiny_${shard}_$overlap.log 2>&1
    for f in model.safetensors optimizer.bin; do
      cmp bf16_one_$shard/checkpoints/step_00000006/$f bf16_tiny_${shard}_$overlap/checkpoints/step_00000006/$f ||
        { echo "FAIL: BF16 gradients in tiny buckets (shard $shard, overlap $overlap) differ from one bucket: $f"; exit 1; }
    done
  done
done
one=$(grep -o 'in 1 bucket(s) of ~1000 MiB (FP32 staging [0-9.]* MiB' bf16_one_false.log | grep -o '[0-9.]* MiB$')
tiny=$(grep -oE 'in [0-9]+ bucket\(s\) of ~0 MiB \(FP32 staging [0-9.]+ MiB' bf16_tiny_false_true.log | grep -oE '[0-9.]+ MiB$')
# one bucket: one slot of the whole arena; a layer a bucket: two slots of the largest bucket (the embedding)
[ -n "$one" ] && [ -n "$tiny" ] && /usr/bin/python3 -c "import sys; o, t = float('$one'.split()[0]), float('$tiny'.split()[0]); sys.exit(0 if 0 < t < o else 1)" ||
  { echo "FAIL: FP32 staging: one bucket '$one', tiny buckets '$tiny'"; exit 1; }
echo "  BF16 gradients, 2 ranks: tiny buckets = one bucket, bit for bit; FP32 staging $tiny (one bucket: $one)"
passes=$((passes + 1))

# 4. No hangs. A long run (checkpoint every 2 updates); rank 1 is killed, or stopped, mid-run.
# pid_of_rank RUN_DIR RANK: the process of that rank (its environment names the rank).
pid_of_rank() {
  local p
  for p in $(pgrep -f "output_dir=$1" || true); do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo $p; return; fi
  done
}
wait_for_checkpoints() {  # RUN_DIR: until two checkpoints were written (up to 120 s)
  for _ in $(seq 1200); do
    [ "$(ls "$1/checkpoints" 2>/dev/null | grep -c '^step_[0-9]*$')" -ge 2 ] && return
    sleep 0.1
  done
  echo "FAIL: $1 wrote no checkpoint"; exit 1
}
long=(train -c run.json --set schedule.total_steps=100000 --set checkpoint.every=2 --set eval.every=0 --set parallel.timeout_s=3)
for how in KILL STOP; do
  d=fault_$how
  mpi 2 "$bin" "${long[@]}" --set output_dir=$d > $d.log 2>&1 &
  launcher=$!
  wait_for_checkpoints $d
  victim=$(pid_of_rank $d 1)
  [ -n "$victim" ] || { echo "FAIL: rank 1 of $d not found"; exit 1; }
  start=$(date +%s.%N)
  kill -$how "$victim"
  rc=0; wait $launcher || rc=$?
  took=$(echo "$(date +%s.%N) - $start" | bc)
  kill -CONT "$victim" 2>/dev/null || true
  # Bound: SIGKILL is seen by mpirun at once (it then terminates rank 0); SIGSTOP costs the 3 s
  # collective timeout, then MPI_Abort. 30 s leaves room for a loaded CI machine.
  [ "$rc" -ne 0 ] || { echo "FAIL: $how of rank 1: the run exited 0"; cat $d.log; exit 1; }
  (( $(echo "$took < 30" | bc) )) || { echo "FAIL: $how of rank 1: the others took ${took}s to exit"; cat $d.log; exit 1; }
  if [ $how = STOP ]; then
    # (the stop may land in an update, in reading its statistics or in a checkpoint: "during the
    # checkpoint of update N")
    grep -Eq "rank 0 of 2: .* during (the checkpoint of |the statistics of )?update [0-9]+ did not complete within 3 s \(parallel.timeout_s\)" $d.log \
      || { echo "FAIL: no timeout message naming rank 0 and the update"; cat $d.log; exit 1; }
  else
    grep -Eq "rank 0 of 2: (terminated by signal 15|SIGTERM received) during (update [0-9]+|the checkpoint of update [0-9]+)|exited on signal 9" $d.log \
      || { echo "FAIL: no message naming the killed rank or where rank 0 was"; cat $d.log; exit 1; }
  fi
  # The newest checkpoint is complete and resumes (on one process: another world size).
  last=$(ls $d/checkpoints | grep '^step_[0-9]*$' | tail -1)
  step=$((10#${last#step_}))
  "$bin" "${long[@]}" --set output_dir=$d --resume --max-updates $((step + 2)) --quiet > /dev/null
  test -d $d/checkpoints/$(printf 'step_%08d' $((step + 2)))
  echo "  rank 1 ${how}ed: the run ended in ${took}s (exit $rc); $last resumed"
done
passes=$((passes + 1))

# 5. A global batch of 12 cannot be split into micro-batches of 4 over 2 ranks.
if mpi 2 "$bin" train -c run.json --set output_dir=bad --set batch.micro_batch=4 --quiet 2> err.txt; then
  echo "FAIL: global batch 12 accepted with 2 ranks x micro-batch 4"; exit 1
fi
grep -q "batch.global_batch 12 is not a multiple of batch.micro_batch x ranks = 4 x 2" err.txt
passes=$((passes + 1))
# Another MPI's launcher (MPICH's Hydra sets PMI_SIZE; Slurm's srun SLURM_STEP_NUM_TASKS) starts
# singletons: each would be "rank 0 of 1" writing the same run directory. Refused, naming the variable.
for var in PMI_SIZE SLURM_STEP_NUM_TASKS; do
  if env "$var=2" "$bin" train -c run.json --set output_dir=lone --quiet 2> err.txt; then
    echo "FAIL: $var=2 with one MPI rank was accepted"; exit 1
  fi
  grep -q "the launcher says 2 ranks ($var), but MPI sees 1" err.txt || { cat err.txt; exit 1; }
  test ! -e lone/checkpoints
done
passes=$((passes + 1))
echo "data_parallel: $passes passed, 0 failed"
