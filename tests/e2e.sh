#!/usr/bin/env bash
# End to end through the command line, on generated text: corpus -> tokenizer -> shards -> train
# with each optimizer -> resume -> eval -> sweep of two runs and their comparison -> compare -> generate.
# usage: e2e.sh <multinorm binary>
set -euo pipefail
bin=$(realpath "$1") fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
"$bin" data verify 'shards/*.tok' | grep -q "3 shard(s) verified"
passes=0
# Tokenizing says what it will do, then each file with the progress and an ETA.
"$bin" data tokenize -i 'c4-*.json.gz' -t tok.model -o shards_again --seq-len 32 2> progress.txt > /dev/null
grep -qE "^tokenize: 3 file\(s\) to tokenize \([0-9.]+ MB of json.gz\), 0 already complete" progress.txt
[ "$(grep -cE '^tokenize: \[[1-3]/3 files, [0-9.]+ of [0-9.]+ MB, [0-9.]+ MB/s, ETA [0-9]+:[0-9]{2}:[0-9]{2}\] c4-' progress.txt)" = 3 ]
grep -qE '^tokenize: \[3/3 files, ([0-9.]+) of \1 MB, .*ETA 0:00:00\]' progress.txt
passes=$((passes + 1))
for opt in sinkgd swan adam adamw sgd; do
  "$bin" train -c run.json --set optimizer.name=$opt --set output_dir=runs/$opt --max-updates 3 --quiet > out.txt
  "$bin" train -c run.json --set optimizer.name=$opt --set output_dir=runs/$opt --resume --quiet > out.txt
  grep -q "validation: loss" out.txt
  test -f runs/$opt/result.json
  test -d runs/$opt/checkpoints/step_00000006
  passes=$((passes + 1))
done
"$bin" eval --checkpoint runs/sinkgd --json | grep -q '"perplexity"'
passes=$((passes + 1))
# Resuming without --resume is refused.
if "$bin" train -c run.json --set output_dir=runs/sinkgd --quiet 2> err.txt; then echo "FAIL: retrain without --resume"; exit 1; fi
grep -q "already holds checkpoints" err.txt
passes=$((passes + 1))
cat > sweep.json <<JSON
{"base": "run.json", "output_dir": "runs/sweep", "set": {"schedule.total_steps": 4},
 "grid": {"optimizer.name": ["sinkgd", "adam"]}}
JSON
"$bin" sweep sweep.json --quiet > sweep.txt
grep -q "name=sinkgd" runs/sweep/summary.md && grep -q "name=adam" runs/sweep/summary.md
test -f runs/sweep/summary.csv
"$bin" sweep sweep.json > sweep2.txt 2>&1   # re-running skips finished runs
grep -q "already finished, skipped" sweep2.txt
passes=$((passes + 1))
# The sweep's optimizer comparison (the Adam run is the reference), and `compare` by hand.
grep -q "## Optimizer comparison" runs/sweep/summary.md
grep -q "| name=adam (reference) | adam |" runs/sweep/comparison.md
test -f runs/sweep/comparison.csv && test -f runs/sweep/comparison.json
"$bin" compare runs/sinkgd runs/adam runs/swan --out cmp > cmp.txt
grep -q "adam (reference)" cmp.txt && test -f cmp/comparison.md && test -f cmp/comparison.csv
test "$(wc -l < cmp/comparison.csv)" -eq 4  # header + 3 runs
# --reference under another spelling of a listed run's path: the run is not counted twice.
"$bin" compare runs/sinkgd runs/adam --reference ./runs//adam --out cmp --quiet
test "$(wc -l < cmp/comparison.csv)" -eq 3
# A run on other sequences is refused, naming the difference (exit status 2), or kept and flagged.
"$bin" train -c run.json --set batch.seq_len=16 --set output_dir=runs/seq16 --quiet > /dev/null
if "$bin" compare runs/adam runs/seq16 --out cmp 2> err.txt; then echo "FAIL: compare accepted another seq_len"; exit 1; fi
grep -q "runs/seq16: batch.seq_len 16 (reference 32)" err.txt
"$bin" compare runs/adam runs/seq16 --out cmp --allow-mismatch --quiet
grep -q "NOT COMPARABLE: batch.seq_len 16" cmp/comparison.md
passes=$((passes + 1))
# Interchange: export a checkpoint's weights in Hugging Face form and start a run from them.
"$bin" export --config run.json --from runs/adam/checkpoints/step_00000006 --out hf --dtype bf16 > /dev/null
"$bin" train -c run.json --set model.init_from=hf --set output_dir=runs/from_hf --max-updates 1 --quiet > out.txt
grep -q "trained 1 updates" out.txt
passes=$((passes + 1))
"$bin" generate --checkpoint runs/adam --prompt "the model" --tokens 8 --seed 1 > gen.txt 2>/dev/null
grep -q "^the model" gen.txt
"$bin" generate --checkpoint runs/adam --prompt "the model" --tokens 8 --seed 1 --no-kv-cache > gen_nocache.txt 2>/dev/null
grep -q "^the model" gen_nocache.txt
passes=$((passes + 1))
# A checkpoint directory is self-sufficient: copied away from its run, eval and generate still work.
mkdir copied && cp -r runs/adam/checkpoints/step_00000006 copied/
"$bin" eval --checkpoint copied/step_00000006 --json | grep -q '"perplexity"'
"$bin" generate --checkpoint copied/step_00000006 --prompt "the model" --tokens 4 > /dev/null 2>&1
passes=$((passes + 1))
echo "e2e: $passes passed, 0 failed"
