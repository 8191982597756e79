#!/usr/bin/env bash
# The binary as a user runs it: exit codes and the key lines of its output.
# usage: cli_smoke.sh <multinorm binary> <source dir>
set -u
bin=$1 src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
check() {  # check <description> <expected exit code> <pattern in output> -- command...
  local what=$1 code=$2 pattern=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $what (exit $rc, expected $code; pattern: $pattern)"; echo "$out" | head -20
    fails=$((fails + 1))
  else
    passes=$((passes + 1))
  fi
}
models=$src/configs/models
check "version" 0 "^multinorm [0-9]+\.[0-9]+" -- "$bin" --version
check "bench model --predict a100" 0 "attention [0-9.]+ ms = [0-9.]+% of the GEMM time" -- "$bin" bench model --config "$models/llama_60m.json" --predict a100
check "bench model --predict h100: launches" 0 "launches: [0-9]+ per micro-batch .*, [0-9]+ per update" -- "$bin" bench model --config "$models/llama_60m.json" --predict h100
# BF16 gradients over 8 ranks: two FP32 slots of the largest bucket, llama_1b's embedding (32000 x 2048 x 4 B x 2 = 0.488 GiB)
check "info 1b --ranks 8: FP32 staging" 0 "FP32 staging \(2 gradient buckets\) +0\.488 GiB" -- "$bin" info --config "$src/configs/c4/llama_1b_sinkgd.json" --ranks 8
check "info 60m params" 0 "total +58,073,600" -- "$bin" info --config "$models/llama_60m.json"
check "info 60m adam MEM" 0 "adam .* 0\.32G" -- "$bin" info --config "$models/llama_60m.json"
check "info 60m sinkgd MEM" 0 "sinkgd .* 0\.23G" -- "$bin" info --config "$models/llama_60m.json"
check "info 1b sinkgd MEM" 0 "sinkgd .* 2\.98G" -- "$bin" info --config "$models/llama_1b.json"
check "info run config, backend falls back" 0 "backend auto -> cpu \(auto: " -- "$bin" info --config "$src/configs/c4/llama_60m_sinkgd.json" --set backend=auto
check "info --json" 0 "\"total\": 58073600" -- "$bin" info --json --config "$models/llama_60m.json"
# Per-rank memory with the optimizer sharded by tensor over 8 ranks: Adam's 0.216 GiB of states on
# llama_60m (58M x 2 states x 2 bytes) falls to the largest share, the embedding's 0.061 GiB.
# The FP32 staging in the plan's arena layout: a tiny model at F = 86 in one gradient bucket (the
# whole arena) stages 4 bytes a parameter on the CPU, and on a GPU the padding too: the down
# projection's 128-byte rows' (2 layers x 32 rows x 42) and the gate and up projections' zero rows
# (2 layers x 2 x 2 rows x 32).
/usr/bin/python3 -c "import json; r = json.load(open('$src/tests/fixtures/tiny_run.json')); r['model']['config']['intermediate_size'] = 86; json.dump(r, open('$tmp/f86.json', 'w'))"
for b in cpu:0 cuda:$((2 * 32 * 42 + 2 * 2 * 2 * 32)); do
  staged=$("$bin" info --config "$tmp/f86.json" --set backend=${b%%:*} --ranks 2 --json 2>&1 |
    /usr/bin/python3 -c "import json, sys; j = json.load(sys.stdin); print(j['data_parallel']['reduction_staging_bytes'] - 4 * (j['parameters']['total'] + ${b##*:}))")
  if [ "$staged" = 0 ]; then passes=$((passes + 1)); else echo "FAIL: info --ranks 2 ${b%%:*} plan: FP32 staging off by $staged bytes"; fails=$((fails + 1)); fi
done
check "info --ranks: sharded states" 0 "optimizer states, sharded \(ZeRO-1\) +0\.061 GiB" -- "$bin" info --config "$src/configs/c4/llama_60m_adam.json" --ranks 8 --set batch.micro_batch=64
check "info --ranks: replicated states" 0 "optimizer states, replicated +0\.216 GiB" -- "$bin" info --config "$src/configs/c4/llama_60m_adam.json" --ranks 8 --set batch.micro_batch=64
check "info activation override" 0 "micro-batch 4 x seq 128" -- "$bin" info --config "$src/configs/c4/llama_60m_adam.json" --micro-batch 4 --seq-len 128
check "devices" 0 "backend auto -> cpu" -- "$bin" devices
check "config resolves" 0 "\"iterations\": 5" -- "$bin" config --config "$src/configs/c4/llama_60m_sinkgd.json"
check "config override" 0 "\"lr\": 0.001" -- "$bin" config --config "$src/configs/c4/llama_60m_sinkgd.json" --set optimizer.lr=0.001
check "typo gets suggestion, exit 2" 2 "did you mean 'optimizer.lr'" -- "$bin" config --config "$src/configs/c4/llama_60m_sinkgd.json" --set optimizer.lrr=1
check "bad override value" 2 "--set optimizer.lr=abc: expected a number" -- "$bin" info --config "$src/configs/c4/llama_60m_sinkgd.json" --set optimizer.lr=abc
check "missing file" 2 "nope.json: cannot open" -- "$bin" info --config "$tmp/nope.json"
echo '{"model": {"config": "'"$models"'/llama_tiny.json"}, "optimzer": {}}' > "$tmp/typo.json"
check "unknown section" 2 "typo.json: optimzer: unknown key \(did you mean 'optimizer'\?\)" -- "$bin" info --config "$tmp/typo.json"
check "unknown subcommand: a usage error, status 2" 2 "subcommand is required" -- "$bin" frobnicate
check "reference" 0 "optimizer.sinkgd.iterations" -- "$bin" config --reference
check "export init" 0 "wrote .*/hf/model.safetensors \(7,358,720|wrote .*model.safetensors \(7358720 parameters, bf16\)" -- "$bin" export --config "$models/llama_tiny.json" --out "$tmp/hf"
check "export re-read" 0 "fp32" -- "$bin" export --config "$models/llama_tiny.json" --from "$tmp/hf" --out "$tmp/hf32" --dtype fp32
check "export wrong architecture" 2 "config.json: vocab_size is 8192, the run's model has 32000" -- "$bin" export --config "$models/llama_60m.json" --from "$tmp/hf" --out "$tmp/x"
# The CUDA backend from the normal binary, through the emulated plugin (kernels run on the CPU).
emu=$(dirname "$bin")/libmultinorm_cuda_emulated.so
if [ -f "$emu" ]; then
  check "emulated plugin detected" 0 "CUDA emulation on the CPU" -- env MULTINORM_CUDA_PLUGIN="$emu" "$bin" devices
  check "auto never picks the emulation" 0 "backend auto -> cpu \(auto: the CUDA plugin is the CPU emulation" -- env MULTINORM_CUDA_PLUGIN="$emu" "$bin" devices
  check "bench model on the CUDA backend: per-kernel table" 0 "attention_forward_mma +4 .*[0-9]+\.[0-9]+ *$" -- env MULTINORM_CUDA_PLUGIN="$emu" "$bin" bench model --config "$models/llama_tiny.json" --backend cuda --batch 1 --seq 32 --steps 1 --warmup 0 --torch off
  # SWAN timed with its split TF32 products and, beside them, with FP32 ones (forced split at a tiny k)
  echo '{"model": {"config": {"vocab_size": 101, "hidden_size": 32, "intermediate_size": 40, "num_hidden_layers": 1, "num_attention_heads": 2,
         "max_position_embeddings": 32}}, "batch": {"global_batch": 1, "micro_batch": 1, "seq_len": 8},
         "optimizer": {"swan": {"ns_products": "split_tf32", "ns_steps": 4}}}' > "$tmp/split.json"
  check "bench optim: SWAN split against FP32 products" 0 "SWAN with split TF32 products \(from k = 0\) / with FP32 products: [0-9.]+" -- env MULTINORM_CUDA_PLUGIN="$emu" "$bin" bench optim --config "$tmp/split.json" --backend cuda --steps 1
  check "cuda without a usable plugin" 2 "backend cuda requested, but it cannot be used" -- env MULTINORM_CUDA_PLUGIN="$tmp/none.so" "$bin" bench model --config "$models/llama_tiny.json" --backend cuda --torch off
fi
echo "cli_smoke: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
