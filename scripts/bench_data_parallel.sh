#!/usr/bin/env bash
# Data parallelism on this machine: 2 ranks x 1 thread (MPI, gradients in buckets) against 1 rank x
# 2 threads, same global batch, on llama_tiny and llama_20m (seq 256, BF16), and how much of the
# gradient reduction the overlap hides: 1 - (exposed communication with overlap) / (without), both
# measured in this run. Exposed communication (metrics.jsonl's comm_exposed_s) is the time rank 0
# waited for the reduction after its backward pass, less the time it waited for the slower rank's
# backward to end (load skew, not communication); medians over the timed updates.
# usage: scripts/bench_data_parallel.sh [multinorm binary] [updates]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:-$root/build/multinorm}") updates=${2:-12}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
# A generated C4-format corpus and tokenizer (the tests' fixture), re-tokenized into 256-token rows.
source "$root/tests/fixtures/tiny_shards.sh"
make_tiny_shards "$bin" > /dev/null
"$bin" data tokenize -i 'c4-*.json.gz' -t tok.model -o shards256 --seq-len 256 > /dev/null 2>&1
mpi=(mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to core -x OMP_NUM_THREADS=1)
printf '%-10s %10s %10s %6s %11s %12s %12s %7s\n' model "1x2 tok/s" "2x1 tok/s" ratio "skew wait" "comm no-ovl" "comm overlap" hidden
for model in llama_tiny llama_20m; do
  cat > run.json <<JSON
{"model": {"config": "$root/configs/models/$model.json"},
 "data": {"train": "shards256/c4-train.*.tok", "tokenizer": "tok.model"},
 "batch": {"global_batch": 16, "micro_batch": 4, "seq_len": 256},
 "optimizer": {"name": "sinkgd", "fallback": "adam", "lr": 0.02},
 "schedule": {"total_steps": $updates, "warmup_steps": 1}, "eval": {"every": 0}, "checkpoint": {"every": 0},
 "parallel": {"bucket_mb": 4}}
JSON
  OMP_NUM_THREADS=2 "$bin" train -c run.json --set threads=2 --set output_dir=one --quiet > /dev/null
  "${mpi[@]}" "$bin" train -c run.json --set threads=1 --set output_dir=overlap --quiet > /dev/null
  "${mpi[@]}" "$bin" train -c run.json --set threads=1 --set output_dir=blocking --set parallel.overlap=false --quiet > /dev/null
  /usr/bin/python3 - "$model" <<'PY'
import json, statistics, sys
def timed(d):  # the updates after the first two (warm-up: allocation, first GEMM plans)
    rows = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    return [r for r in rows if r["type"] == "train"][2:]
def med(d, k): return statistics.median(r[k] for r in timed(d))
one, ovl = med("one", "tokens_per_s"), med("overlap", "tokens_per_s")
blk, w_ovl = med("blocking", "comm_exposed_s"), med("overlap", "comm_exposed_s")
skew = med("blocking", "comm_wait_s") - blk
print(f"{sys.argv[1]:<10} {one:10.0f} {ovl:10.0f} {ovl / one:6.2f} {skew * 1e3:9.1f}ms {blk * 1e3:10.1f}ms "
      f"{w_ovl * 1e3:10.1f}ms {100 * (1 - w_ovl / blk):6.0f}%")
PY
  rm -rf one overlap blocking
done
