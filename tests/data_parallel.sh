#!/usr/bin/env bash
# Data parallelism over MPI on CPUs: `mpirun -np 2 multinorm train` must train the same model as one
# process with the same global batch (each rank takes half of every step, gradients are summed), its
# evaluation must cover the same tokens, a resumed 2-rank run must be bit-exact with a continuous one,
# and a global batch the ranks cannot share is refused.
# usage: data_parallel.sh <multinorm binary>
set -euo pipefail
bin=$(realpath "$1") fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
# Global batch 16 = 4 micro-batches of 4 for one process, 2 per rank for two: accumulation and the
# sum over ranks add the same gradients in another order. One OpenMP thread per rank (two ranks on two cores); root is allowed, as in CI containers.
mpi=(mpirun -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1)
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
cat > run.json <<JSON
{"model": {"config": {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 2, "max_position_embeddings": 64}},
 "data": {"train": "shards/c4-train.*.tok", "validation": "shards/c4-validation.*.tok", "tokenizer": "tok.model"},
 "batch": {"global_batch": 16, "micro_batch": 4, "seq_len": 32},
 "optimizer": {"name": "sinkgd", "fallback": "adam", "lr": 0.02},
 "schedule": {"total_steps": 6, "warmup_steps": 1},
 "eval": {"every": 3, "tokens": 1000000}, "checkpoint": {"every": 3},
 "precision": {"params": "fp32", "optimizer_states": "fp32"}, "threads": 1}
JSON
passes=0
for loss in micro_batch_mean token_mean; do
  "$bin" train -c run.json --set output_dir=one_$loss --set batch.loss_normalization=$loss --quiet > /dev/null
  "${mpi[@]}" "$bin" train -c run.json --set output_dir=two_$loss --set batch.loss_normalization=$loss --quiet \
    > /dev/null
  # Same losses, gradient norms and validation losses to FP32 summation-order accuracy.
  /usr/bin/python3 - one_$loss/metrics.jsonl two_$loss/metrics.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [r["type"] for r in a] == [r["type"] for r in b], "different records"
worst = 0.0
for x, y in zip(a, b):
    keys = ("loss", "grad_norm", "tokens") if x["type"] == "train" else ("val_loss", "val_tokens")
    for k in keys:
        rel = abs(x[k] - y[k]) / max(abs(x[k]), 1e-12)
        worst = max(worst, rel)
        assert rel < 1e-5, (x["step"], k, x[k], y[k])
print(f"1 rank vs 2 ranks: {len(a)} records, worst relative difference {worst:.2e}")
PY
  passes=$((passes + 1))
done
test -f two_micro_batch_mean/result.json && test -d two_micro_batch_mean/checkpoints/step_00000006
# Resume with two ranks: bit-exact with the continuous two-rank run.
"${mpi[@]}" "$bin" train -c run.json --set output_dir=resumed --max-updates 3 --quiet > /dev/null
"${mpi[@]}" "$bin" train -c run.json --set output_dir=resumed --resume --quiet > /dev/null
cmp resumed/checkpoints/step_00000006/model.safetensors two_micro_batch_mean/checkpoints/step_00000006/model.safetensors
cmp resumed/checkpoints/step_00000006/optimizer.bin two_micro_batch_mean/checkpoints/step_00000006/optimizer.bin
passes=$((passes + 1))
# A global batch of 12 cannot be split into micro-batches of 4 over 2 ranks.
if "${mpi[@]}" "$bin" train -c run.json --set output_dir=bad --set batch.global_batch=12 --quiet 2> err.txt; then
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
