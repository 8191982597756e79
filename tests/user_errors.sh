#!/usr/bin/env bash
# What a new user meets first, asserted: each mistake gets the right diagnosis, names the file and the
# key, says what to do next, and leaves nothing behind.
#   - checkpoint verify / eval on a path that does not exist, on a run directory with no checkpoint;
#   - train without shards or without the tokenizer: the config, the key and `data tokenize` named,
#     no run directory created;
#   - relative paths: model.config in a file resolves against the file's folder, given with --set
#     against the working directory; a shipped model's name works wherever a model config does;
#   - usage errors exit 2; --help shows defaults (integers, inside their ranges; none on flags); every
#     help example names files that exist, parses, and its run config splits over its ranks;
#   - info --ranks refuses a batch that does not split over the ranks, as train does;
#   - a model vocabulary rounded up past the tokenizer's is accepted, a smaller one refused;
#   - backend cuda without a GPU refuses to start, naming the escape.
# usage: user_errors.sh <multinorm binary> <source dir>
set -uo pipefail
bin=$(realpath "$1") src=$(realpath "$2") fixtures=$(realpath "$(dirname "$0")/fixtures")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
source "$fixtures/tiny_shards.sh"
make_tiny_shards "$bin"
passes=0
fail() { echo "FAIL: $*"; exit 1; }
# expect <what> <exit status> <pattern> -- command...: the status, and the pattern in the output
expect() {
  local what=$1 code=$2 pattern=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  [ $rc -eq "$code" ] || { echo "$out" | head -20; fail "$what: exit $rc, expected $code"; }
  grep -qE -- "$pattern" <<<"$out" || { echo "$out" | head -20; fail "$what: the output does not say '$pattern'"; }
  passes=$((passes + 1))
}
"$bin" config -c run.json --set backend=cpu --set threads=1 --set schedule.total_steps=2 -o run.json

# ---- checkpoints that are not there ----
expect "verify, no such path" 2 "checkpoint verify runs/nope: no such file or directory" -- "$bin" checkpoint verify runs/nope
mkdir -p runs/empty/checkpoints && echo '{}' > runs/empty/config.json
expect "verify, a run with no checkpoint" 2 "runs/empty: a run directory with no checkpoint yet" -- "$bin" checkpoint verify runs/empty
expect "eval, a run with no checkpoint" 2 "--checkpoint runs/empty: a run directory with no checkpoint yet" -- "$bin" eval --checkpoint runs/empty
expect "generate, no such path" 2 "--checkpoint runs/nope: no such file or directory" -- "$bin" generate --checkpoint runs/nope --prompt x
mkdir -p somewhere
expect "eval, neither" 2 "neither a checkpoint \(no model.safetensors\) nor a run directory" -- "$bin" eval --checkpoint somewhere
"$bin" train -c run.json --set output_dir=runs/ok --quiet > /dev/null || fail "a tiny run"
expect "verify, a run" 0 "runs/ok/checkpoints/step_00000002: ok" -- "$bin" checkpoint verify runs/ok

# ---- a run that cannot start leaves nothing ----
expect "train without shards" 2 "run.json: data.train: shards/none-\*.tok: no file matches \(relative to the working directory $tmp\): make the shards with .multinorm data tokenize." -- \
  "$bin" train -c run.json --set "data.train=shards/none-*.tok" --set output_dir=runs/noshards
[ -e runs/noshards ] && fail "train without shards created runs/noshards: $(ls -A runs/noshards)"
expect "train without the tokenizer" 2 "run.json: data.tokenizer: gone.model does not exist" -- \
  "$bin" train -c run.json --set data.tokenizer=gone.model --set output_dir=runs/notok
[ -e runs/notok ] && fail "train without the tokenizer created runs/notok"
passes=$((passes + 1))

# ---- paths and model names ----
mkdir -p sub models
"$bin" config -c run.json --set model.config="$src/configs/models/llama_tiny.json" -o sub/run.json
/usr/bin/python3 - <<'PY'
import json
d = json.load(open("sub/run.json"))
m = d["model"]["config"]
json.dump(m, open("models/mine.json", "w"))            # relative to the working directory
json.dump(dict(m, hidden_size=64), open("sub/mine.json", "w"))  # relative to sub/run.json
d["model"]["config"] = "mine.json"
json.dump(d, open("sub/run.json", "w"))
PY
expect "model.config in a file: the file's folder" 0 '"hidden_size": 64' -- "$bin" config -c sub/run.json
expect "model.config with --set: the working directory" 0 "\"hidden_size\": $(/usr/bin/python3 -c "import json; print(json.load(open('models/mine.json'))['hidden_size'])")" -- \
  "$bin" config -c sub/run.json --set model.config=models/mine.json
expect "model.config by name" 0 '"hidden_size": 2048' -- "$bin" config -c sub/run.json --set model.config=llama_1b
expect "info by name" 0 "model llama_1b \(.*configs/models/llama_1b.json\)" -- "$bin" info -c llama_1b
expect "an unknown name" 2 "model llama_2b: no configs/models/llama_2b.json" -- "$bin" info -c llama_2b

# ---- the command line ----
expect "a missing option: usage, status 2" 2 "--input is required" -- "$bin" data tokenize
expect "an unknown option: status 2" 2 "The following argument was not expected: --bogus" -- "$bin" info -c llama_60m --bogus
expect "defaults in --help" 0 "--seq-len INT=256" -- "$bin" data tokenize --help
expect "no sentinel defaults in --help" 0 "--max-updates INT +stop after" -- "$bin" train --help
# Every example of every --help: the files it names exist (configs) or are what the docs make.
for sub in "train" "eval" "sweep" "compare" "generate" "info" "config" "devices" "doctor" "checkpoint" "checkpoint verify" \
  "data" "data train-tokenizer" "data tokenize" "data inspect" "data verify" "export" "bench model" "bench optim" "bench data" "bench attention"; do
  ex=$("$bin" $sub --help | sed -n 's/^Example: //p')
  [ -n "$ex" ] || fail "$sub --help has no example"
  for f in $(grep -oE "configs/[A-Za-z0-9_/.-]+\.json" <<<"$ex"); do
    [ -f "$src/$f" ] || fail "$sub --help: the example names $f, which does not exist"
  done
  grep -qE "shard_[0-9]+\.bin|\*\.bin|t5-spiece" <<<"$ex" && fail "$sub --help: an example names files the tool never makes: $ex"
  # A launcher in front (mpirun, scripts/mpirun_graceful.sh): the script exists, and N ranks.
  ranks=1
  if [[ $ex =~ ^(bash\ ([^ ]+)\ |mpirun\ )-np\ ([0-9]+)\ (multinorm .*)$ ]]; then
    [ -z "${BASH_REMATCH[2]}" ] || [ -f "$src/${BASH_REMATCH[2]}" ] || fail "$sub --help: the example's ${BASH_REMATCH[2]} does not exist"
    ranks=${BASH_REMATCH[3]} ex=${BASH_REMATCH[4]}
  fi
  # It parses: MULTINORM_PARSE_ONLY=1 checks the command line without running it.
  (cd "$src" && eval "MULTINORM_PARSE_ONLY=1 \"\$bin\" ${ex#multinorm }" > /dev/null 2>&1) ||
    fail "$sub --help: the example does not parse: $ex"
  # A run config on N ranks: the batch splits as `train` will require (`info --ranks` checks it).
  if [[ $ex =~ ^multinorm\ (train|info)\ .*--config\ ([^ ]+) ]]; then
    [[ $ex =~ --ranks\ ([0-9]+) ]] && ranks=${BASH_REMATCH[1]}
    out=$(cd "$src" && "$bin" info --config "$(sed -E 's/.*--config ([^ ]+).*/\1/' <<<"$ex")" --ranks "$ranks" 2>&1) ||
      fail "$sub --help: the example's config does not train on $ranks rank(s): $out"
  fi
done
passes=$((passes + 1))
# info --ranks checks the batch arithmetic as train will, and says the micro-batch that would fit.
expect "info --ranks: a batch that does not split" 2 \
  "batch.global_batch 512 is not a multiple of batch.micro_batch x ranks = 256 x 8 \(on 8 ranks: --set batch.micro_batch=64\)" -- \
  "$bin" info -c "$src/configs/c4/llama_60m_sinkgd.json" --ranks 8
expect "info --ranks: one that does" 0 "data parallel over 8 ranks" -- \
  "$bin" info -c "$src/configs/c4/llama_60m_sinkgd.json" --ranks 8 --set batch.micro_batch=64
# Help as integers, defaults inside their ranges, flags without a default.
"$bin" config --reference | grep -q "e+1" && fail "config --reference renders an integer bound in exponent form"
"$bin" train --help | grep -- "--max-consecutive-skips" | grep -q "=0" && fail "train --help: --max-consecutive-skips shows a default outside its range"
"$bin" data tokenize --help | grep -q "{false}" && fail "data tokenize --help: a flag shows {false}"
passes=$((passes + 1))

# ---- vocabulary: rounded up is fine, smaller is not ----
for v in 256 512 2048; do
  /usr/bin/python3 -c "
import json
d = json.load(open('run.json')); d['model']['config']['vocab_size'] = $v
json.dump(d, open('run_v$v.json', 'w'))"
done
"$bin" train -c run_v512.json --set output_dir=runs/vocab512 --quiet > /dev/null 2>&1 ||
  fail "a model vocabulary of 512 over the tokenizer's 300 was refused"
passes=$((passes + 1))
expect "a vocabulary smaller than the tokenizer's" 2 "tokenized with a vocabulary of 300, the model has only 256 embeddings" -- \
  "$bin" train -c run_v256.json --set output_dir=runs/vocab256
expect "a large gap is noted" 0 "1748 of the model's 2048 embeddings are past the tokenizer's 300 pieces" -- \
  "$bin" train -c run_v2048.json --set output_dir=runs/vocab2048

# ---- a schedule that reads its data more than once says so ----
expect "one pass" 0 "data: 300 sequences in 2 training shard\(s\); the schedule reads 16 of them \(0.05 epochs\)$" -- \
  "$bin" train -c run.json --set output_dir=runs/once
expect "repeated data" 0 "the schedule reads 800 of them \(2.67 epochs: it repeats its data\)" -- \
  "$bin" train -c run.json --set schedule.total_steps=100 --max-updates 1 --set output_dir=runs/twice

# ---- backend cuda with no GPU (here: no plugin at all) ----
expect "backend cuda without a GPU" 2 "backend cuda requested, but it cannot be used: .*--set backend=cpu trains on the CPU" -- \
  env MULTINORM_CUDA_PLUGIN="$tmp/none.so" "$bin" train -c run.json --set backend=cuda --set output_dir=runs/nogpu
[ -e runs/nogpu ] && fail "backend cuda without a GPU created runs/nogpu"
# `devices` on a machine without an NVIDIA driver (the nvcc-built plugin beside the binary, no driver
# loaded) says so, instead of the runtime's "driver version is insufficient".
if [ -f "$(dirname "$bin")/libmultinorm_cuda.so" ] && [ ! -e /proc/driver/nvidia/version ]; then
  expect "devices without a driver" 0 "GPUs: none \(no NVIDIA driver on this machine: libcuda.so.1 not found\)$" -- env -u MULTINORM_CUDA_PLUGIN "$bin" devices
fi
echo "user_errors: $passes passed, 0 failed"
