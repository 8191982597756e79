#!/usr/bin/env bash
# The first call on a lent GPU node: every figure we need, in one call of at most 8 minutes on one
# H100, into one JSON and one Markdown report (docs/performance.md#first-gpu-run-scriptsgpu_checksh).
#
#   bash scripts/gpu_check.sh OUT_DIR                 on a GPU node (the bundle unpacked, or a build tree)
#   bash scripts/gpu_check.sh --dry OUT_DIR           here: the emulated plugin, PyTorch on the CPU, tiny
#                                                     shapes (GPU_CHECK_DRY=1 does the same); tests/gpu_check.sh
#   bash scripts/gpu_check.sh --only doctor,attention OUT_DIR   only these sections (or step names)
#
# Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md (always, whatever fails), each step's output
# in OUT_DIR/logs/, the raw figures in OUT_DIR/raw/. Exits 0 when no section failed, 1 otherwise, 2 on
# a usage error. Every step runs under `timeout` and records ok, failed (its exit status, or timed
# out) or skipped (why); none stops the script. SIGTERM or ^C stops the running step and writes the
# reports of what ran. logs/ and raw/ are the script's: a folder used before loses their old files.
#
# Sections and their steps, in the order they run (most wanted first), with each step's time limit in
# seconds and, in brackets, what one H100 is expected to take (estimates: no GPU has run this yet):
#   environment   environment 20 [5]: versions, `multinorm devices`, nvidia-smi, PyTorch, the tools
#   doctor        doctor_llama_60m 90 [45]: every check at llama_60m's shapes, a timed step (per-kernel
#                 measured and predicted time, host waits and drains), NCCL when >1 GPU is visible
#   step_vs_torch step_ours_llama_60m 30 [10], step_torch_llama_60m 30 [10], step_ours_llama_1b 45 [20],
#                 step_torch_llama_1b 45 [15]: micro-batch 32 x 256, BF16, PyTorch eager with SDPA
#   attention     attention_ours 30 [12], attention_sdpa 30 [10]: T 256, 1024, 2048 x D 64, 128
#   hf_logits     hf_export 20 [5], hf_compare 30 [12]: llama_60m exported, loaded by transformers
#   tests         tests_cuda 60 [35]: the CUDA tests of multinorm_tests on the GPU
#   doctor        doctor_llama_1b 60 [40]: the op checks and a timed step at llama_1b's shapes
#   sanitizer     memcheck_training 30, memcheck_attention 25, racecheck_training 35,
#                 racecheck_attention 30 [80 together]: compute-sanitizer on a tiny model's updates
#                 and timed step, and on the attention tests
#   step_vs_torch step_compile_llama_1b 90 [75], step_compile_llama_60m 60 [35]: PyTorch under
#                 torch.compile (last: it mostly compiles; a failure or timeout is recorded in the
#                 comparison's row and does not fail the section)
# Expected about 420 s in all. The limits add up to 760 s; the deadline GPU_CHECK_BUDGET_S (default
# 440 s) caps them: a step is cut to what is left, one that would start with under 5 s left is
# skipped, so the call ends by about 450 s (7.5 minutes) with its reports written.
#
# Environment: GPU_CHECK_PYTHON (the python3 with PyTorch; default: the first python3 on PATH, then
# /usr/bin/python3, that imports torch), GPU_CHECK_PEAK_TFLOPS (the BF16 dense peak for MFU where the
# doctor knows none for this GPU), GPU_CHECK_BUDGET_S, GPU_CHECK_MULTINORM / GPU_CHECK_TESTS /
# GPU_CHECK_PLUGIN (the binaries, when neither layout below holds them), MULTINORM_CUDA_PLUGIN (dry:
# the emulated plugin, default build/libmultinorm_cuda_emulated.so).
# Layouts: a bundle (bin/multinorm, bin/multinorm_tests, lib/libmultinorm_cuda.so,
# share/multinorm/configs) or a build tree (build/multinorm, build/multinorm_tests,
# build/libmultinorm_cuda.so, configs/), found from this script's directory.
set -uo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
dry=${GPU_CHECK_DRY:-0} only="" out=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry) dry=1 ;;
    --only) only=${2:-}; shift ;;
    --only=*) only=${1#--only=} ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu_check.sh: one output folder, not '$out' and '$1'" >&2; exit 2; }; out=$1 ;;
  esac
  shift
done
[ -n "$out" ] || { echo "gpu_check.sh: the output folder is missing" >&2; usage >&2; exit 2; }
[ "$dry" = 1 ] || dry=0
mkdir -p "$out/logs" "$out/raw" "$out/work" || { echo "gpu_check.sh: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
started=$(date +%s)
budget_s=${GPU_CHECK_BUDGET_S:-440}
deadline=$((started + budget_s))
: >"$out/steps.tsv"
# A folder used before: its reports and figures go (logs/ and raw/ are this script's own).
rm -f "$out/gpu_check.json" "$out/gpu_check.md" "$out"/raw/*.json "$out"/raw/*.jsonl "$out"/raw/*.csv "$out"/logs/*.log
gpu_name="" peak_name=a100 attention_shapes="" step_batch=0 step_seq=0 model_60m="" model_1b=""

# ---- where the binaries are -----------------------------------------------------------------------
if [ -x "$root/bin/multinorm" ]; then
  layout=bundle mn=$root/bin/multinorm tests_bin=$root/bin/multinorm_tests plugin=$root/lib/libmultinorm_cuda.so
  configs=$root/share/multinorm/configs emulated=$root/lib/libmultinorm_cuda_emulated.so
else
  layout=build mn=$root/build/multinorm tests_bin=$root/build/multinorm_tests plugin=$root/build/libmultinorm_cuda.so
  configs=$root/configs emulated=$root/build/libmultinorm_cuda_emulated.so
fi
mn=${GPU_CHECK_MULTINORM:-$mn} tests_bin=${GPU_CHECK_TESTS:-$tests_bin} plugin=${GPU_CHECK_PLUGIN:-$plugin}
if [ "$dry" = 1 ]; then
  plugin=${MULTINORM_CUDA_PLUGIN:-$emulated}
  export MULTINORM_CUDA_PLUGIN=$plugin
fi
bench_dir=$root/bench

# The python3 with PyTorch (the node's own); any python3 still writes the reports.
py="" py_note=""
for cand in ${GPU_CHECK_PYTHON:-} python3 /usr/bin/python3; do
  command -v "$cand" >/dev/null 2>&1 || continue
  if "$cand" -c "import torch" >/dev/null 2>&1; then py=$(command -v "$cand"); break; fi
  [ -n "$py_note" ] || py_note=$(command -v "$cand")
done
report_py=${py:-$py_note}
# PyTorch's own oneDNN dies with SIGILL in its AMX kernels on AMX CPUs (tests/CMakeLists.txt): the
# dry run's CPU PyTorch is capped below them, as `bench model` caps it.
py_env=()
[ "$dry" = 1 ] && py_env=(env ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16)
torch_missing=""
[ -n "$py" ] || torch_missing="no python3 that imports torch (tried: ${GPU_CHECK_PYTHON:-} python3 /usr/bin/python3; GPU_CHECK_PYTHON names one)"

# The sanitizer and the profiler: PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin (newest first).
find_cuda_tool() {
  local d
  command -v "$1" 2>/dev/null && return 0
  for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda $(ls -d /usr/local/cuda-* 2>/dev/null | sort -rV); do
    [ -x "$d/bin/$1" ] && { echo "$d/bin/$1"; return 0; }
  done
  return 1
}
sanitizer=$(find_cuda_tool compute-sanitizer || true)
ncu=$(find_cuda_tool ncu || true)

# ---- shapes: a GPU node's, or the dry run's tiny ones --------------------------------------------
# The tiny model: doctor's fixture (tests/fixtures/doctor_model.json) with room for 256 positions
# and every key PyTorch's LLaMA reads; one layer of one head in the dry run (the emulation is slow).
tiny=$out/work/tiny_model.json
if [ "$dry" = 1 ]; then
  layers=1 width=64 heads=1 ffn=172 vocab=256
else
  layers=2 width=128 heads=2 ffn=344 vocab=1000
fi
cat >"$tiny" <<EOF
{"vocab_size": $vocab, "hidden_size": $width, "intermediate_size": $ffn, "num_hidden_layers": $layers,
 "num_attention_heads": $heads, "max_position_embeddings": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
 "initializer_range": 0.02, "tie_word_embeddings": false}
EOF
if [ "$dry" = 1 ]; then
  model_60m=$tiny model_1b=$tiny
  doctor_shape=(--batch 1 --seq 16 --steps 1 --warmup 0)
  doctor_60m_only=(--only op --only checkpoint) doctor_1b_only=(--only op)
  step_batch=1 step_seq=16 step_steps=1 step_warmup=0 torch_device=cpu
  attention_seqs="32 64" attention_tokens=64 attention_width=128 attention_steps=1 attention_warmup=0
  logits_tokens=16
  tests_filter='Backends/Ops.RmsNormForwardBackward/cuda:Backends/OpsBf16.Attention/cuda:CudaBackend.LateCopiesArriveAtTheirFence'
  san_training=(--batch 1 --seq 16 --only checkpoint --no-bench)
  san_attention_filter='Backends/OpsBf16.Attention/cuda'
else
  model_60m=$configs/models/llama_60m.json model_1b=$configs/models/llama_1b.json
  doctor_shape=(--steps 3 --warmup 1)
  doctor_60m_only=() doctor_1b_only=(--only op)
  step_batch=32 step_seq=256 step_steps=10 step_warmup=3 torch_device=cuda
  # FlashAttention-2's benchmark: 16k tokens a call, width H x D = 2048
  attention_seqs="256 1024 2048" attention_tokens=16384 attention_width=2048 attention_steps=20 attention_warmup=3
  logits_tokens=128
  # docs/gpu-nodes.md's filter, and the tensor-core attention's shapes (named without "cuda")
  tests_filter='*cuda*:*Cuda*:LargeShapes*:*TensorCoreAttention*'
  san_training=(--batch 2 --seq 64 --only update --steps 1 --warmup 0)
  # (the tensor-core shapes with several query blocks at B x H = 8; T = 1024 is left to tests_cuda:
  # racecheck's shared-memory tracking would take most of its limit there)
  san_attention_filter='Shapes/TensorCoreAttention.*/B2_*:Backends/Ops.AttentionForwardBackward/cuda:Backends/OpsBf16.Attention/cuda'
fi

# ---- the reports -------------------------------------------------------------------------------------
# write_reports: gpu_check.json and gpu_check.md from what the steps left; returns the exit status.
write_reports() {
  local rc=1
  cat >"$out/raw/meta.json" <<EOF
{"dry": $([ "$dry" = 1 ] && echo true || echo false), "layout": "$layout", "multinorm": "$mn", "tests_binary": "$tests_bin",
 "plugin": "$plugin", "python": "${py:-}", "sanitizer": "${sanitizer:-}", "ncu": "${ncu:-}", "only": "$only",
 "budget_s": $budget_s, "started": $started, "finished": $(date +%s), "host": "$(hostname)", "peak_name": "$peak_name", "peak_matched": ${peak_matched:-false},
 "gpu_name": "$gpu_name", "peak_tflops_override": "${GPU_CHECK_PEAK_TFLOPS:-}", "attention_shapes": "$attention_shapes",
 "version": "$("$mn" --version 2>/dev/null | head -1)", "step_batch": $step_batch, "step_seq": $step_seq, "model_60m": "$model_60m", "model_1b": "$model_1b"}
EOF
  if [ -n "$report_py" ]; then
    "$report_py" "$here/gpu_check/report.py" "$out" && rc=0 || rc=$?
  fi
  if [ ! -s "$out/gpu_check.json" ] || [ ! -s "$out/gpu_check.md" ]; then
    # No python3, or the report script failed: the steps' table as it is, so the call still returns it.
    {
      echo "# gpu_check (the report script failed: the steps only)"
      echo
      echo "| step | section | status | seconds | reason |"
      echo "|---|---|---|---|---|"
      awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $7 }' "$out/steps.tsv"
    } >"$out/gpu_check.md"
    awk -F'\t' 'BEGIN { printf "{\"ok\": false, \"error\": \"the report script failed\", \"steps\": [" }
      { gsub(/["\\]/, "", $7); printf "%s{\"id\": \"%s\", \"section\": \"%s\", \"status\": \"%s\", \"seconds\": %s, \"reason\": \"%s\"}", (NR > 1 ? ", " : ""), $1, $2, $3, $4, $7 }
      END { print "]}" }' "$out/steps.tsv" >"$out/gpu_check.json"
    rc=1
  fi
  echo "gpu_check: $(($(date +%s) - started)) s; reports: $out/gpu_check.json, $out/gpu_check.md"
  return $rc
}
# Stopped from outside (a scheduler's SIGTERM, ^C): the reports of what ran, then exit 1.
step_pid="" step_running=()
interrupted() {
  echo "gpu_check: interrupted"
  if [ -n "$step_pid" ]; then
    kill -TERM -- -"$step_pid" 2>/dev/null
    record "${step_running[0]}" "${step_running[1]}" failed 0 "${step_running[2]}" "" "interrupted (SIGTERM or SIGINT)" "${step_running[3]}"
  fi
  write_reports
  exit 1
}
trap interrupted TERM INT

# ---- running a step --------------------------------------------------------------------------------
selected() {  # step section: whether --only names either
  [ -z "$only" ] && return 0
  case ",$only," in *",$1,"* | *",$2,"*) return 0 ;; esac
  return 1
}
# record ID SECTION STATUS SECONDS LIMIT RC REASON COMMAND
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$out/steps.tsv"; }
# run_step ID SECTION LIMIT_S COMMAND...: runs it under timeout, its output in logs/ID.log.
run_step() {
  local id=$1 section=$2 limit=$3
  shift 3
  local cmd
  cmd=$(printf '%q ' "$@")
  if ! selected "$id" "$section"; then record "$id" "$section" skipped 0 "$limit" "" "not selected (--only $only)" "$cmd"; return 0; fi
  local left=$((deadline - $(date +%s)))
  if [ "$left" -lt 5 ]; then
    record "$id" "$section" skipped 0 "$limit" "" "out of time: the ${budget_s} s budget is spent" "$cmd"
    return 0
  fi
  [ "$left" -lt "$limit" ] && limit=$left
  echo "gpu_check: $id (at most $limit s)"
  local t0 t1 rc status reason=""
  t0=$(date +%s.%N)
  # In the background, so that a signal to this script is handled at once (a trap waits for a
  # foreground child); timeout leads its own process group, which the trap stops.
  timeout --kill-after=5 "$limit" "$@" >"$out/logs/$id.log" 2>&1 &
  step_pid=$! step_running=("$id" "$section" "$limit" "$cmd")
  wait $step_pid
  rc=$?
  step_pid=""
  t1=$(date +%s.%N)
  if [ $rc -eq 0 ]; then status=ok
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=failed reason="timed out after $limit s"
  else status=failed reason="exit status $rc"
  fi
  record "$id" "$section" "$status" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" "$limit" "$rc" "$reason" "$cmd"
  echo "gpu_check: $id: $status${reason:+ ($reason)}"
}
skip_step() {  # ID SECTION REASON
  if selected "$1" "$2"; then record "$1" "$2" skipped 0 0 "" "$3" ""; else record "$1" "$2" skipped 0 0 "" "not selected (--only $only)" ""; fi
}

# ---- the steps ---------------------------------------------------------------------------------------
export mn py out bench_dir tiny plugin dry sanitizer ncu torch_device layout tests_bin

environment_step() {
  echo "== multinorm"; "$mn" --version
  echo "== devices"; "$mn" devices
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv | tee "$out/raw/nvidia_smi.csv"
  else echo "nvidia-smi: not found"; fi
  echo "== tools"; echo "compute-sanitizer: ${sanitizer:-not found}"; echo "ncu: ${ncu:-not found}"
  [ -n "$sanitizer" ] && "$sanitizer" --version | tail -2
  echo "== cpu"; grep -m1 'model name' /proc/cpuinfo; nproc
  echo "== python"
  [ -n "$py" ] || { echo "no python3 with torch"; return 0; }
  "$py" - "$out/raw/python.json" <<'PY'
import json, platform, sys
import torch
r = {"python": sys.executable, "python_version": platform.python_version(), "torch": torch.__version__,
     "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
     "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention"), "compile": hasattr(torch, "compile")}
if torch.cuda.is_available():
    r["device_name"] = torch.cuda.get_device_name(0)
    r["device_count"] = torch.cuda.device_count()
try:
    import transformers
    r["transformers"] = transformers.__version__
except ImportError:
    r["transformers"] = None
json.dump(r, open(sys.argv[1], "w"), indent=1)
print(json.dumps(r))
PY
}
export -f environment_step
run_step environment environment 20 bash -c environment_step

# The GPU's name picks the roofline `bench model` prints its predicted column and MFU for.
gpu_name=$(sed -n 's/^  \[0\] \([^,]*\),.*/\1/p' "$out/logs/environment.log" 2>/dev/null | head -1)
[ -n "$gpu_name" ] || gpu_name=$(timeout 20 "$mn" devices 2>/dev/null | sed -n 's/^  \[0\] \([^,]*\),.*/\1/p' | head -1)
peak_matched=true
case $gpu_name in
  *H200*) peak_name=h200 ;;  # (GH200 too)
  *H100* | *H800*) peak_name=h100 ;;
  *A100* | *A800*) peak_name=a100 ;;
  *) peak_name=a100 peak_matched=false ;;  # (its MFU and predictions would be an A100's: not used)
esac

run_step doctor_llama_60m doctor 90 "$mn" doctor --model "$model_60m" "${doctor_shape[@]}" "${doctor_60m_only[@]}" \
  --report "$out/raw/doctor_llama_60m.json"

# Our step, then PyTorch's eager one, on the same GPU, model and micro-batch (torch.compile at the end).
torch_step() {  # ID MODEL_CONFIG MODES LIMIT
  if [ -z "$py" ]; then skip_step "$1" step_vs_torch "$torch_missing"; return; fi
  run_step "$1" step_vs_torch "$4" bash -o pipefail -c '"$0" "$@" | tee "$out/raw/'"$1"'.jsonl"' "${py_env[@]}" "$py" \
    "$bench_dir/torch_llama.py" --config "$2" --batch $step_batch --seq $step_seq --steps $step_steps --warmup 2 --device $torch_device \
    --modes "$3" --progress
}
for m in 60m 1b; do
  case $m in 60m) cfg=$model_60m limit=30 ;; *) cfg=$model_1b limit=45 ;; esac
  run_step "step_ours_llama_$m" step_vs_torch $limit bash -c '"$0" "$@" > "$out/raw/step_ours_llama_'$m'.json"' "$mn" bench model \
    -c "$cfg" --backend cuda --batch $step_batch --seq $step_seq --steps $step_steps --warmup $step_warmup --torch off --peak $peak_name --json
  torch_step "step_torch_llama_$m" "$cfg" bf16_sdpa $limit
done

# Our attention kernels alone, then PyTorch's scaled_dot_product_attention on the same shapes.
attention_shapes=""
for D in 64 128; do
  for T in $attention_seqs; do attention_shapes+="$((attention_tokens / T))x$((attention_width / D))x${T}x${D},"; done
done
attention_shapes=${attention_shapes%,}
attention_ours() {  # every shape, even after one fails; exit 1 when any did
  local s B H T D rc=0
  for s in ${attention_shapes//,/ }; do
    IFS=x read -r B H T D <<<"$s"
    "$mn" bench attention --backend cuda --batch "$B" --heads "$H" --seq "$T" --head-dim "$D" --steps "$attention_steps" \
      --warmup "$attention_warmup" --json >"$out/raw/attention_ours_${T}_${D}.json" || { rc=1; echo "bench attention failed at $s"; }
    cat "$out/raw/attention_ours_${T}_${D}.json"
  done
  return $rc
}
export attention_shapes attention_steps attention_warmup
export -f attention_ours
run_step attention_ours attention 30 bash -c attention_ours
if [ -n "$py" ]; then
  run_step attention_sdpa attention 30 bash -o pipefail -c '"$0" "$@" | tee "$out/raw/attention_sdpa.jsonl"' "${py_env[@]}" "$py" "$bench_dir/attention_sdpa.py" \
    --shapes "$attention_shapes" --device $torch_device --steps $attention_steps --warmup $((attention_warmup > 0 ? attention_warmup : 1))
else
  skip_step attention_sdpa attention "$torch_missing"
fi

# llama_60m exported (a seeded init), our logits of it on the CUDA backend, transformers' of the same.
cat >"$out/work/export_run.json" <<EOF
{"model": {"config": "$model_60m"}, "backend": "cuda", "seed": 1}
EOF
rm -rf "$out/work/hf_llama_60m"
run_step hf_export hf_logits 20 "$mn" export -c "$out/work/export_run.json" -o "$out/work/hf_llama_60m" --dtype fp32 --logits $logits_tokens
if [ ! -s "$out/work/hf_llama_60m/multinorm_logits.safetensors" ]; then
  skip_step hf_compare hf_logits "no logits of ours to compare (hf_export did not write them)"
elif [ -n "$py" ]; then
  run_step hf_compare hf_logits 30 "${py_env[@]}" "$py" "$here/gpu_check/hf_logits.py" "$out/work/hf_llama_60m" --device $torch_device \
    --out "$out/raw/hf_logits.json"
else
  skip_step hf_compare hf_logits "$torch_missing"
fi

run_step tests_cuda tests 60 env MULTINORM_TEST_CUDA_PLUGIN="$plugin" "$tests_bin" --gtest_filter="$tests_filter" \
  --gtest_output=json:"$out/raw/gtest.json"

run_step doctor_llama_1b doctor 60 "$mn" doctor --model "$model_1b" "${doctor_shape[@]}" "${doctor_1b_only[@]}" \
  --report "$out/raw/doctor_llama_1b.json"

# compute-sanitizer: a tiny model's training updates and timed step (graphs, the trainer's path), and
# the attention tests. --error-exitcode marks a finding apart from the program's own failure.
for tool in memcheck racecheck; do
  case $tool in memcheck) l_train=30 l_att=25 ;; *) l_train=35 l_att=30 ;; esac
  if [ -z "$sanitizer" ]; then
    why="compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)"
    skip_step "${tool}_training" sanitizer "$why"
    skip_step "${tool}_attention" sanitizer "$why"
    continue
  fi
  san=("$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 --target-processes all)
  run_step "${tool}_training" sanitizer $l_train "${san[@]}" "$mn" doctor --model "$tiny" "${san_training[@]}" \
    --report "$out/raw/${tool}_training_doctor.json"
  run_step "${tool}_attention" sanitizer $l_att env MULTINORM_TEST_CUDA_PLUGIN="$plugin" "${san[@]}" "$tests_bin" \
    --gtest_filter="$san_attention_filter"
done

torch_step step_compile_llama_1b "$model_1b" bf16_sdpa_compile 90
torch_step step_compile_llama_60m "$model_60m" bf16_sdpa_compile 60

write_reports
exit $?
