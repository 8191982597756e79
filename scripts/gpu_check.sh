#!/usr/bin/env bash
# The first call on a lent GPU node: every figure we need, in one call of at most 8 minutes on one
# H100, into one JSON and one Markdown report (docs/performance.md#a-gpu-node-in-one-call-scriptsgpu_checksh).
#
#   bash scripts/gpu_check.sh OUT_DIR                 on a GPU node (the bundle unpacked, or a build tree)
#   bash scripts/gpu_check.sh --dry OUT_DIR           here: the emulated plugin, PyTorch on the CPU, tiny
#                                                     shapes (GPU_CHECK_DRY=1 does the same); tests/gpu_check.sh
#   bash scripts/gpu_check.sh --only doctor,attention OUT_DIR   only these sections (or step names);
#                                                     --only profile: Nsight Compute, on request only
#   --work DIR      the work files (the exported model, ~240 MB at llama_60m; configs) there, kept;
#                   default: a temporary folder, removed at the end
#   --no-pack       leave logs/, raw/ and steps.tsv in OUT_DIR instead of packing them
#   --sanitizer-filters   print the gtest filters of the sanitizer's kernels and attention targets
# Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md (always, whatever fails) and
# OUT_DIR/gpu_check_logs.tar.gz (each step's output in logs/, the raw figures in raw/, steps.tsv):
# those three files and nothing else, for a return channel of a few files of 16 MiB. Exits 0 when no
# section failed, 1 otherwise, 2 on a usage error. Every step runs under `timeout` and records ok,
# failed (its exit status, timed out, or killed) or skipped (why); none stops the script, except
# that on a GPU node (not --dry) it stops after the environment step, with both reports, when
# `multinorm devices` sees no GPU or the CUDA emulation. SIGTERM or ^C stops the running step and
# writes the reports of what ran. logs/ and raw/ are the script's: a folder used before loses them.
#
# Sections and their steps, in the order they run (most wanted first: the correctness verdicts, then
# the figures), with each step's time limit in seconds and, in brackets, what one H100 is expected to
# take (estimates from the run of 2026-11-27, where one was measured):
#   environment   environment 20 [6]: versions, `multinorm devices`, nvidia-smi, PyTorch, the tools
#   doctor        doctor_llama_60m 90 [35]: every check at llama_60m's shapes, a timed step (per-kernel
#                 measured and predicted time, host waits and drains), NCCL when >1 GPU is visible
#   tests         tests_cuda 90 [35]: the CUDA tests of multinorm_tests on the GPU, through
#                 gpu_check/run_gtests.py: a test that crashes the binary is recorded and the tests
#                 after it run in a new process, so one crash hides nothing
#   training      training_smoke 180 [80, before SWAN's split TF32 run]: configs/quickstart.json on
#                 the GPU (the bundled shards of the default corpus), SinkGD, SWAN and SWAN with split
#                 TF32 products, each trained twice: the last checkpoints byte-identical, the
#                 validation perplexity within 2% of the CPU backend's (gpu_check/smoke_reference.json,
#                 measured on the same shards; SWAN's for both SWAN runs: the CPU's products are FP32)
#   optimizers    optim_quickstart 30, optim_llama_60m 30 [4]: `bench optim --backend cuda --profile`, one
#                 update of the whole model by SinkGD, SWAN and Adam (the quickstart's run config: its
#                 SWAN settings), then one more eager step of each with every kernel's time beside its
#                 roofline (optim_llama_1b 90 [27] comes before doctor_llama_1b)
#   sanitizer     memcheck and racecheck, each on three targets: training (a tiny model's updates and
#                 timed step through `doctor`, the trainer's path with graphs), kernels (every kernel
#                 family's CudaVsCpu tests but attention's) and attention (the tensor-core and SIMT
#                 attention tests): memcheck_* 30, 60, 25 [3, 4, 1], racecheck_* 45, 120, 30 [-, 79, 6];
#                 on a node racecheck skips the training target: with cuBLASLt's kernels instrumented
#                 the tiny model's update checks did not finish in 115 s, and leaving them out
#                 (--kernel-name-exclude) crashed the sanitizer at the first GEMM ("failed to handle
#                 a hardware exception"; H100, 2026-11-27). The kernels and attention targets launch
#                 every kernel of ours between them (tests/gpu_check.sh checks that on the emulation).
#                 A run cut by its limit is a failure, not a pass.
#   step_vs_torch step_ours_llama_60m 30 [2], step_torch_llama_60m 30 [7], step_ours_llama_1b 45 [15],
#                 step_torch_llama_1b 45 [10]: micro-batch 32 x 256, BF16, PyTorch eager with SDPA; ours
#                 timed replaying CUDA graphs (as the trainer runs), profiled in separate steps
#   gemm          gemm_llama_1b 40: `bench gemm`, each of llama_1b's GEMMs alone at 32 x 256, beside the same
#                 product with M, N, K rounded up to 64, against the device's 8192^3 GEMM
#   attention     attention_ours 30 [3], attention_sdpa 30 [16]: T 256, 1024, 2048 x D 64, 128, all in
#                 one process each; SDPA as PyTorch picks it, FlashAttention-2 and cuDNN forced
#   hf_logits     hf_export 20 [3], hf_compare 30 [14]: llama_60m exported, loaded by transformers
#   optimizers    optim_llama_1b 90 [27, before the FP32 row]: as optim_llama_60m, and SWAN with FP32 products beside
#                 its split TF32 ones (predicted 2 s an update with FP32 products on an H100, 6.5 on an A100)
#   doctor        doctor_llama_1b 60 [33]: the op checks at llama_1b's shapes (4 x 256) and a timed step at 32 x 256
#                 (the whole SinkGD update: micro-batch, update, graphs)
#   step_vs_torch step_compile_llama_60m 60 [25], step_compile_llama_1b 90 [23]: PyTorch under
#                 torch.compile, each transformer block compiled on its own (the compile time does not
#                 grow with depth; last: it mostly compiles; a failure or timeout is recorded in the
#                 comparison's row and does not fail the section)
#   profile       profile_llama_1b_step 150, profile_llama_1b_update 120: on request only (--only
#                 profile, a call of its own): Nsight Compute on the second launch of each of our
#                 kernels (each template instance), llama_1b's micro-batch at 32 x 256 and one
#                 update per optimizer (bench optim), into a table of speed of light, occupancy and
#                 warp stalls
# Expected about 400 s in all (an H200 took 355 s on 2026-11-28, before the gemm step and the
# optimizers' profiles). The limits add up to 1,320 s (and the profile's 270 s, on request); the
# deadline GPU_CHECK_BUDGET_S (default 450 s) caps them: a step is cut to what is left, one that
# would start with under 5 s left is skipped, so the call ends by about 460 s (under 8 minutes) with
# its reports written.
#
# Environment: GPU_CHECK_PYTHON (the python3 with PyTorch; default: the first python3 on PATH, then
# /usr/bin/python3, that imports torch), GPU_CHECK_PEAK_TFLOPS (the BF16 dense peak for MFU where the
# doctor knows none for this GPU), GPU_CHECK_BUDGET_S, GPU_CHECK_MULTINORM / GPU_CHECK_TESTS /
# GPU_CHECK_PLUGIN (the binaries, when neither layout below holds them), MULTINORM_CUDA_PLUGIN (dry:
# the emulated plugin, default build/libmultinorm_cuda_emulated.so; on a GPU node the script sets it
# to the plugin it found, so multinorm, the tests and the report use the same one).
# On a GPU node the plugin needs libcublasLt.so.13 and libnccl.so.2, which a bare node may have only
# in the python's pip wheels (PyTorch for CUDA 13 installs them): the script asks that python for its
# site-packages' nvidia/*/lib folders and puts them first in LD_LIBRARY_PATH. The python steps run
# with HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 (a node has no network).
# Layouts: a bundle (bin/multinorm, bin/multinorm_tests, lib/libmultinorm_cuda.so,
# share/multinorm/configs) or a build tree (build/multinorm, build/multinorm_tests,
# build/libmultinorm_cuda.so, configs/), found from this script's directory.
set -uo pipefail

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
dry=${GPU_CHECK_DRY:-0} only="" out="" work="" pack=1 print_filters=0
while [ $# -gt 0 ]; do
  case $1 in
    --dry) dry=1 ;;
    --only) only=${2:-}; shift ;;
    --only=*) only=${1#--only=} ;;
    --work) work=${2:-}; [ -n "$work" ] || { echo "gpu_check.sh: --work needs a folder" >&2; exit 2; }; shift ;;
    --work=*) work=${1#--work=} ;;
    --no-pack) pack=0 ;;
    --sanitizer-filters) print_filters=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu_check.sh: one output folder, not '$out' and '$1'" >&2; exit 2; }; out=$1 ;;
  esac
  shift
done
# The sanitizer's gtest filters on a node. kernels: every kernel family's CudaVsCpu test (one
# emulation mode: on a GPU the modes are the same run) but attention's and the GEMMs' (cuBLASLt's own
# kernels), and the update statistics; attention: the tensor-core shapes with several query blocks at
# B x H = 8 (T = 1024 is left to tests_cuda: racecheck's shared-memory tracking would take most of its
# limit there), and the SIMT kernels (FP32). The two launch every kernel of ours between them
# (tests/gpu_check.sh: the emulation's launch log); the training target adds the trainer's path.
# SWAN's tall, wide and square shapes are left out: their kernels are the ones its Gram-size batches
# and split-TF32 tests launch, and under racecheck that test alone took 37 s, the target 120+ s
# without a verdict (H200, 2026-11-28).
node_kernels_filter='Emulation/CudaVsCpu.*/forward_workers2:CudaBackend.UpdateStatisticsAndClippingWhereTheGradientsAre-*Matmul*:*AttentionForwardBackward*:*ModelForwardBackward*:*OneTrainingUpdatePerOptimizer*:*HostWaits*:*SwanUpdateOnTallWideSquareAndVectorShapes*'
node_attention_filter='Shapes/TensorCoreAttention.*/B2_*:Backends/Ops.AttentionForwardBackward/cuda:Backends/OpsBf16.Attention/cuda:Emulation/CudaVsCpu.AttentionForwardBackward/forward_workers2'
if [ "$print_filters" = 1 ]; then
  printf 'kernels %s\nattention %s\n' "$node_kernels_filter" "$node_attention_filter"
  exit 0
fi

[ -n "$out" ] || { echo "gpu_check.sh: the output folder is missing" >&2; usage >&2; exit 2; }
[ "$dry" = 1 ] || dry=0
mkdir -p "$out/logs" "$out/raw" || { echo "gpu_check.sh: cannot create $out" >&2; exit 2; }
out=$(cd "$out" && pwd)
# The work files (the exported model is ~240 MB) stay out of the report folder.
work_owned=0
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_work.XXXXXX") || { echo "gpu_check.sh: cannot create a work folder" >&2; exit 2; }
  work_owned=1
fi
mkdir -p "$work" || { echo "gpu_check.sh: cannot create $work" >&2; exit 2; }
work=$(cd "$work" && pwd)
case $work/ in "$out"/*) echo "gpu_check.sh: --work must not be inside the report folder $out" >&2; exit 2 ;; esac
[ "$work_owned" = 0 ] || trap 'rm -rf "$work"' EXIT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
started=$(date +%s)
budget_s=${GPU_CHECK_BUDGET_S:-450}
deadline=$((started + budget_s))
: >"$out/steps.tsv"
# A folder used before: its reports and figures go (logs/ and raw/ are this script's own).
rm -rf "$out/gpu_check.json" "$out/gpu_check.md" "$out/gpu_check_logs.tar.gz" "$out/work" "$out"/raw/* "$out"/logs/*
gpu_name="" peak_name=a100 attention_shapes="" step_batch=0 step_seq=0 model_60m="" model_1b="" stopped="" nvidia_lib_dirs=""
json_str() {  # a JSON string of $1
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/ }
  printf '"%s"' "${s//$'\n'/ }"
}

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
fi
# multinorm, the tests and the report all use this plugin (on a node: the real one found above).
export MULTINORM_CUDA_PLUGIN=$plugin
bench_dir=$root/bench
# No network on a node: transformers and the hub must not try it (a timeout per file otherwise).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

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

# On a node, cuBLASLt 13 and NCCL 2 may exist only in that python's pip wheels
# (site-packages/nvidia/*/lib): first in LD_LIBRARY_PATH, for the plugin and its tests.
if [ "$dry" = 0 ] && [ -n "$report_py" ]; then
  nvidia_lib_dirs=$("$report_py" - 2>/dev/null <<'PY'
import glob, os, site
roots = []
try:
    import nvidia  # the wheels' namespace package
    roots += list(getattr(nvidia, "__path__", []))
except Exception:
    pass
try:
    roots += [os.path.join(p, "nvidia") for p in site.getsitepackages() + [site.getusersitepackages()]]
except Exception:
    pass
dirs = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))):
        d = os.path.realpath(d)
        if os.path.isdir(d) and d not in dirs:
            dirs.append(d)
print(":".join(dirs))
PY
  )
  [ -z "$nvidia_lib_dirs" ] || export LD_LIBRARY_PATH=$nvidia_lib_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

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
tiny=$work/tiny_model.json
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
  doctor_60m_only=(--only op --only checkpoint) doctor_1b_only=(--only op --step-batch 2)
  step_batch=1 step_seq=16 step_steps=1 step_warmup=0 torch_device=cpu
  attention_seqs="32 64" attention_tokens=64 attention_width=128 attention_steps=1 attention_warmup=0
  logits_tokens=16 optim_steps=1 gemm_reference=128 optim_quickstart=$tiny
  # (Planted.CrashWhenAsked skips unless tests/gpu_check.sh plants its crash)
  tests_filter='Planted.CrashWhenAsked:Backends/Ops.RmsNormForwardBackward/cuda:Backends/OpsBf16.Attention/cuda:CudaBackend.LateCopiesArriveAtTheirFence'
  san_training=(--batch 1 --seq 16 --only checkpoint --no-bench)
  san_kernels_filter='Emulation/CudaVsCpu.RopeForwardBackward/forward_workers2'
  san_attention_filter='Backends/OpsBf16.Attention/cuda'
  # the smoke: the tests' generated corpus and tokenizer, the tiny model, 3 updates; the CPU reference
  # trained here
  smoke_optimizers=(sinkgd swan swan:split_tf32) smoke_reference=cpu
else
  model_60m=$configs/models/llama_60m.json model_1b=$configs/models/llama_1b.json
  doctor_shape=(--steps 3 --warmup 1)
  # llama_1b's timed step at 32 x 256: the whole SinkGD update the paper's model trains by (its op
  # checks stay at 4 x 256, the CPU backend's side of them)
  doctor_60m_only=() doctor_1b_only=(--only op --step-batch 32)
  step_batch=32 step_seq=256 step_steps=10 step_warmup=3 torch_device=cuda
  # FlashAttention-2's benchmark: 16k tokens a call, width H x D = 2048
  attention_seqs="256 1024 2048" attention_tokens=16384 attention_width=2048 attention_steps=20 attention_warmup=3
  logits_tokens=128 optim_steps=3 gemm_reference=8192 optim_quickstart=$configs/quickstart.json
  # docs/gpu-nodes.md's filter, and the tensor-core attention's shapes (named without "cuda")
  tests_filter='*cuda*:*Cuda*:LargeShapes*:*TensorCoreAttention*'
  san_training=(--batch 2 --seq 64 --only update --steps 1 --warmup 0)
  san_kernels_filter=$node_kernels_filter
  san_attention_filter=$node_attention_filter
  smoke_optimizers=(sinkgd swan swan:split_tf32) smoke_reference=$here/gpu_check/smoke_reference.json
fi

# ---- the reports -------------------------------------------------------------------------------------
# write_reports: gpu_check.json and gpu_check.md from what the steps left; returns the exit status.
write_reports() {
  local rc=1
  cat >"$out/raw/meta.json" <<EOF
{"dry": $([ "$dry" = 1 ] && echo true || echo false), "layout": "$layout", "multinorm": "$mn", "tests_binary": "$tests_bin",
 "plugin": "$plugin", "python": "${py:-}", "sanitizer": "${sanitizer:-}", "ncu": "${ncu:-}", "only": "$only",
 "stopped": $(json_str "$stopped"), "nvidia_lib_dirs": $(json_str "$nvidia_lib_dirs"), "ld_library_path": $(json_str "${LD_LIBRARY_PATH:-}"),
 "work": $(json_str "$work"), "packed": $([ "$pack" = 1 ] && echo true || echo false),
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
  [ "$pack" = 1 ] && pack_logs
  echo "gpu_check: $(($(date +%s) - started)) s; reports: $out/gpu_check.json, $out/gpu_check.md$([ "$pack" = 1 ] && echo ", $out/gpu_check_logs.tar.gz")"
  return $rc
}
# pack_logs: logs/, raw/ and steps.tsv into gpu_check_logs.tar.gz, then gone from the folder; a log
# over 4 MiB keeps its first 256 KiB and last 3 MiB (the channel back takes files of 16 MiB).
pack_logs() {
  local f size
  for f in "$out"/logs/*.log; do
    [ -f "$f" ] || continue
    size=$(stat -c %s "$f")
    if [ "$size" -gt $((4 << 20)) ]; then
      { head -c $((256 << 10)) "$f"; printf '\n[gpu_check: %s bytes cut from the middle of this log]\n' "$((size - (256 << 10) - (3 << 20)))"
        tail -c $((3 << 20)) "$f"; } >"$f.cut" && mv "$f.cut" "$f"
    fi
  done
  if tar -czf "$out/gpu_check_logs.tar.gz.part" -C "$out" logs raw steps.tsv && mv "$out/gpu_check_logs.tar.gz.part" "$out/gpu_check_logs.tar.gz"; then
    rm -rf "$out/logs" "$out/raw" "$out/steps.tsv"
  else
    rm -f "$out/gpu_check_logs.tar.gz.part"
    echo "gpu_check: could not pack logs/ and raw/: left in $out"
  fi
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
  local t0 t1 rc status reason="" seconds
  t0=$(date +%s.%N)
  # In the background, so that a signal to this script is handled at once (a trap waits for a
  # foreground child); timeout leads its own process group, which the trap stops.
  timeout --kill-after=5 "$limit" "$@" >"$out/logs/$id.log" 2>&1 &
  step_pid=$! step_running=("$id" "$section" "$limit" "$cmd")
  wait $step_pid
  rc=$?
  step_pid=""
  t1=$(date +%s.%N)
  seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  # timeout exits 124, or 137 when its SIGKILL (5 s after the SIGTERM) ended the step; a 137 well
  # before the limit is another SIGKILL (the kernel's out-of-memory killer, say), a 124 the step's own.
  if [ $rc -eq 0 ]; then status=ok
  elif { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && awk -v s="$seconds" -v l="$limit" 'BEGIN { exit !(s >= l - 0.5) }'; then
    status=failed reason="timed out after $limit s"
  elif [ $rc -eq 137 ]; then status=failed reason="killed by SIGKILL (exit status 137) after $seconds s, before its $limit s limit (out of memory?)"
  else status=failed reason="exit status $rc"
  fi
  record "$id" "$section" "$status" "$seconds" "$limit" "$rc" "$reason" "$cmd"
  echo "gpu_check: $id: $status${reason:+ ($reason)}"
}
skip_step() {  # ID SECTION REASON
  if selected "$1" "$2"; then record "$1" "$2" skipped 0 0 "" "$3" ""; else record "$1" "$2" skipped 0 0 "" "not selected (--only $only)" ""; fi
}

# ---- the steps ---------------------------------------------------------------------------------------
export mn py out bench_dir tiny plugin dry sanitizer ncu torch_device layout tests_bin

# What multinorm sees (the stop below reads it), once: the environment step prints it.
timeout 30 "$mn" devices >"$out/raw/devices.txt" 2>&1
environment_step() {
  echo "== multinorm"; "$mn" --version
  echo "== LD_LIBRARY_PATH"; echo "${LD_LIBRARY_PATH:-}"
  echo "== devices"; cat "$out/raw/devices.txt"
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
import json, os, platform, sys
import torch
r = {"python": sys.executable, "python_version": platform.python_version(), "torch": torch.__version__,
     "offline": {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")},
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
gpu_name=$(sed -n 's/^  \[0\] \([^,]*\),.*/\1/p' "$out/raw/devices.txt" 2>/dev/null | head -1)
# On a node, no GPU or the CPU emulation would make every figure below meaningless: stop here.
if [ "$dry" = 0 ]; then
  if [ ! -f "$plugin" ]; then
    stopped="no CUDA plugin at $plugin (GPU_CHECK_PLUGIN names one)"
  elif grep -qi "emulation" <<<"$gpu_name"; then
    stopped="multinorm devices reports the CUDA emulation, not a GPU ($gpu_name; plugin $plugin)"
  elif [ -z "$gpu_name" ]; then
    stopped="multinorm devices sees no GPU: $(grep -m1 -E '^GPUs:|error' "$out/raw/devices.txt" | cut -c1-400)"
    [ -s "$out/raw/devices.txt" ] || stopped="multinorm devices printed nothing (plugin $plugin)"
  fi
  if [ -n "$stopped" ]; then
    echo "gpu_check: stopped: $stopped"
    write_reports
    exit 1
  fi
fi
peak_matched=true
case $gpu_name in
  *H200*) peak_name=h200 ;;  # (GH200 too)
  *H100* | *H800*) peak_name=h100 ;;
  *A100* | *A800*) peak_name=a100 ;;
  *) peak_name=a100 peak_matched=false ;;  # (its MFU and predictions would be an A100's: not used)
esac

run_step doctor_llama_60m doctor 90 "$mn" doctor --model "$model_60m" "${doctor_shape[@]}" "${doctor_60m_only[@]}" \
  --report "$out/raw/doctor_llama_60m.json"

# The CUDA tests, a crash recorded and the tests after it run in a new process (run_gtests.py).
if [ -n "$report_py" ]; then
  run_step tests_cuda tests 90 "$report_py" "$here/gpu_check/run_gtests.py" --out "$out/raw/gtest_runs.json" \
    --env MULTINORM_TEST_CUDA_PLUGIN="$plugin" -- "$tests_bin" --gtest_filter="$tests_filter"
else
  run_step tests_cuda tests 90 env MULTINORM_TEST_CUDA_PLUGIN="$plugin" "$tests_bin" --gtest_filter="$tests_filter" \
    --gtest_output=json:"$out/raw/gtest.json"
fi

# The training smoke: the quickstart (dry: the tests' tiny corpus and model) trained twice per
# optimizer on the GPU, against the CPU backend's perplexity.
smoke_sets=() smoke_config=""
if [ "$dry" = 1 ]; then
  if [ -f "$root/tests/fixtures/tiny_shards.sh" ] && selected training_smoke training; then
    smoke_dir=$work/smoke_data
    mkdir -p "$smoke_dir"
    (cd "$smoke_dir" && source "$root/tests/fixtures/tiny_shards.sh" && make_tiny_shards "$mn") >"$out/logs/smoke_data.log" 2>&1
    smoke_config=$smoke_dir/run.json
    smoke_sets=(--set data.train="$smoke_dir/shards/c4-train.*.tok" --set data.validation="$smoke_dir/shards/c4-validation.*.tok"
                --set data.tokenizer="$smoke_dir/tok.model" --set optimizer.swan.ns_steps=10 --set schedule.total_steps=3 --quiet)
  fi
elif [ -d "$root/share/multinorm/smoke" ]; then
  smoke_dir=$root/share/multinorm/smoke
  smoke_config=$configs/quickstart.json
  smoke_sets=(--set data.train="$smoke_dir/tokens/c4-train.*.tok" --set data.validation="$smoke_dir/tokens/c4-validation.*.tok"
              --set data.tokenizer="$smoke_dir/tokenizer.model" --quiet)
fi
if [ -n "$smoke_config" ] && [ -f "$smoke_config" ]; then
  run_step training_smoke training 180 bash "$here/gpu_check/training_smoke.sh" "$mn" "$smoke_config" "$smoke_reference" \
    "$work/smoke" "$out/raw/training_smoke.json" "${smoke_optimizers[@]}" -- "${smoke_sets[@]}"
else
  skip_step training_smoke training "no smoke data: the bundle's share/multinorm/smoke (scripts/bundle.sh packs it from data/default)"
fi

# One optimizer update of the whole model per optimizer (SWAN's beside SinkGD's and Adam's).
optim_step() {  # SLOT CONFIG LIMIT
  run_step "optim_$1" optimizers "$3" bash -c '"$0" "$@" > "$out/raw/optim_'"$1"'.json"' "$mn" bench optim --backend cuda -c "$2" --steps $optim_steps \
    --profile --peak $peak_name --json
}
optim_step quickstart "$optim_quickstart" 30
optim_step llama_60m "$model_60m" 30

# compute-sanitizer: a tiny model's updates and timed step (graphs, the trainer's path), every kernel
# family's tests, the attention tests. --error-exitcode marks a finding apart from the program's own
# failure. Nothing is left out of racecheck: excluding cuBLASLt's kernels crashed it on an H100.
for tool in memcheck racecheck; do
  case $tool in memcheck) limits=(30 60 25) ;; *) limits=(45 120 30) ;; esac
  if [ -z "$sanitizer" ]; then
    why="compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)"
    for target in training kernels attention; do skip_step "${tool}_$target" sanitizer "$why"; done
    continue
  fi
  san=("$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 --target-processes all)
  if [ "$tool" = racecheck ] && [ "$dry" = 0 ]; then
    skip_step racecheck_training sanitizer "no verdict in reach on a GPU: racecheck with cuBLASLt's kernels instrumented did not finish the tiny model's update checks in 115 s (H100, 2026-11-27); memcheck covers this target, racecheck every kernel of ours through the kernels and attention targets"
  else
    run_step "${tool}_training" sanitizer ${limits[0]} "${san[@]}" "$mn" doctor --model "$tiny" "${san_training[@]}" \
      --report "$out/raw/${tool}_training_doctor.json"
  fi
  run_step "${tool}_kernels" sanitizer ${limits[1]} env MULTINORM_TEST_CUDA_PLUGIN="$plugin" "${san[@]}" "$tests_bin" \
    --gtest_filter="$san_kernels_filter"
  run_step "${tool}_attention" sanitizer ${limits[2]} env MULTINORM_TEST_CUDA_PLUGIN="$plugin" "${san[@]}" "$tests_bin" \
    --gtest_filter="$san_attention_filter"
done

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

# llama_1b's GEMMs one by one, as the backend runs them and with their extents rounded up to 64.
run_step gemm_llama_1b gemm 40 bash -o pipefail -c '"$0" "$@" | tee "$out/raw/gemm_llama_1b.jsonl"' "$mn" bench gemm --backend cuda \
  -c "$model_1b" --batch $step_batch --seq $step_seq --reference $gemm_reference --json

# Our attention kernels alone, then PyTorch's scaled_dot_product_attention on the same shapes.
attention_shapes=""
for D in 64 128; do
  for T in $attention_seqs; do attention_shapes+="$((attention_tokens / T))x$((attention_width / D))x${T}x${D},"; done
done
attention_shapes=${attention_shapes%,}
# Every shape in one process (a JSON line each, as it finishes): one CUDA context, one plugin load.
run_step attention_ours attention 30 bash -o pipefail -c '"$0" "$@" | tee "$out/raw/attention_ours.jsonl"' "$mn" bench attention \
  --backend cuda --shapes "$attention_shapes" --steps "$attention_steps" --warmup "$attention_warmup" --json
if [ -n "$py" ]; then
  run_step attention_sdpa attention 30 bash -o pipefail -c '"$0" "$@" | tee "$out/raw/attention_sdpa.jsonl"' "${py_env[@]}" "$py" "$bench_dir/attention_sdpa.py" \
    --shapes "$attention_shapes" --device $torch_device --steps $attention_steps --warmup $((attention_warmup > 0 ? attention_warmup : 1))
else
  skip_step attention_sdpa attention "$torch_missing"
fi

# llama_60m exported (a seeded init), our logits of it on the CUDA backend, transformers' of the same.
# (in the work folder: the FP32 model is ~240 MB, too big for the report folder)
cat >"$work/export_run.json" <<EOF
{"model": {"config": "$model_60m"}, "backend": "cuda", "seed": 1}
EOF
rm -rf "$work/hf_llama_60m"
run_step hf_export hf_logits 20 "$mn" export -c "$work/export_run.json" -o "$work/hf_llama_60m" --dtype fp32 --logits $logits_tokens
if [ ! -s "$work/hf_llama_60m/multinorm_logits.safetensors" ]; then
  skip_step hf_compare hf_logits "no logits of ours to compare (hf_export did not write them)"
elif [ -n "$py" ]; then
  run_step hf_compare hf_logits 30 "${py_env[@]}" "$py" "$here/gpu_check/hf_logits.py" "$work/hf_llama_60m" --device $torch_device \
    --out "$out/raw/hf_logits.json"
else
  skip_step hf_compare hf_logits "$torch_missing"
fi

optim_step llama_1b "$model_1b" 90

run_step doctor_llama_1b doctor 60 "$mn" doctor --model "$model_1b" "${doctor_shape[@]}" "${doctor_1b_only[@]}" \
  --report "$out/raw/doctor_llama_1b.json"

# The small model first: its figure comes back even when llama_1b's compile runs out of time.
torch_step step_compile_llama_60m "$model_60m" bf16_sdpa_compile 60
torch_step step_compile_llama_1b "$model_1b" bf16_sdpa_compile 90

# Nsight Compute on request only (--only profile: a call of its own, as its replays would spend the
# figures' budget): the second launch of each of our kernels (--kernel-id counts a kernel's launches
# by its demangled name, so each template instance, SinkGD's rows kinds among them, is profiled: by
# the function's name alone an H200 run of 2026-11-28 profiled one of the update's two rows kinds)
# in llama_1b's micro-batch at 32 x 256 and in one update per optimizer,
# each with its speed of light, occupancy, launch shape and where its warps stall, at the clocks it
# runs at (not ncu's locked base clock): the measured reasons docs/cuda.md gives for a kernel off its
# prediction. cuBLASLt's kernels and SWAN's are not profiled. A kernel's name is matched whole: a
# letter or underscore on neither side.
profile_sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats)
profile_stalls=""
for reason in long_scoreboard short_scoreboard barrier wait math_pipe_throttle mio_throttle lg_throttle not_selected no_instruction branch_resolving; do
  profile_stalls+="${profile_stalls:+,}smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio"
done
profile_step() {  # SLOT LIMIT KERNEL_NAMES COMMAND...
  local id=profile_$1 limit=$2 re="(^|[^a-z_])($3)[a-z_]*_kernel([^a-z_]|\$)"
  shift 3
  if [ -z "$only" ]; then skip_step "$id" profile "on request only: --only profile, a call of its own"; return; fi
  if [ -z "$ncu" ]; then skip_step "$id" profile "ncu not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)"; return; fi
  run_step "$id" profile "$limit" "$ncu" --target-processes all --kernel-name-base demangled --kernel-id "::regex:$re:2" \
    --clock-control none "${profile_sections[@]}" --metrics "$profile_stalls" --csv --page details --log-file "$out/raw/$id.csv" "$@"
}
profile_step llama_1b_step 150 'copy_rows|cross_entropy|rmsnorm|swiglu|attention|rope|embedding|bitonic|add_rows|accumulate_loss|convert' \
  "$mn" bench model -c "$model_1b" --backend cuda --batch $step_batch --seq $step_seq --steps 1 --warmup 1 --torch off
profile_step llama_1b_update 120 'sinkgd|sum_squares|clip_gradients|update_statistics|step|scale' \
  "$mn" bench optim -c "$model_1b" --backend cuda --steps 1

write_reports
exit $?
