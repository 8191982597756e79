#!/usr/bin/env bash
# `multinorm doctor` on the emulated plugin at a tiny shape (fixtures/doctor_model.json: 2 layers of
# width 128, two heads of 64 so the tensor-core attention runs, a vocabulary of 1000): every check
# passes, the report holds each section; then a planted wrong kernel (MULTINORM_EMU_PLANT:
# rmsnorm_forward skips its last block) fails it, with exit status 1 and that kernel named.
# usage: doctor.sh <multinorm binary> <emulated plugin>
set -uo pipefail
bin=$1 plugin=$2 model=$(realpath "$(dirname "$0")/fixtures/doctor_model.json")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export MULTINORM_CUDA_PLUGIN=$plugin
# The kernels are checked by the emulation's racecheck in the op and model tests; here the command
# line is.
export MULTINORM_EMU_RACECHECK=0
fail() { echo "FAIL: $*"; exit 1; }

out=$("$bin" doctor --model "$model" --batch 1 --seq 16 --steps 1 --warmup 0 --report "$tmp/ok.json" 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" | tail -30; fail "doctor on the emulated plugin exited $rc"; }
/usr/bin/python3 - "$tmp/ok.json" <<'PY' || fail "the report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["ok"] is True, "ok"
env = r["environment"]
assert env["plugin"]["emulated"] is True and env["devices"][0]["cc"] == "8.0", env
sections = {c["section"] for c in r["checks"]}
assert sections == {"op", "optimizer", "update", "checkpoint"}, sections
names = {c["name"] for c in r["checks"]}
for n in ["matmul", "matmul_residual", "embedding_backward", "rmsnorm_forward_backward", "rope_forward_backward", "attention_forward_backward",
          "attention_decode", "swiglu_forward_backward", "cross_entropy", "linear_cross_entropy", "sum_squares_scale_convert",
          "sinkgd", "swan", "sinkgd_many", "adam", "sgd", "adam_many", "two updates, sinkgd", "round trip cuda -> cpu"]:
    assert n in names, n
assert all(c["ok"] and c["error"] <= c["bound"] for c in r["checks"])
step = r["steps"][0]
assert step["tokens_per_s"] > 0 and "mfu_note" in step, step
# the trainer's path: one host wait a step (the statistics' read, the loss with them); timed eagerly
# with each update waited for at once (a drain a step), and as the trainer runs, replayed CUDA
# graphs and the statistics read behind the next micro-batch (no drain)
assert step["host_waits_per_step"] == 1 and step["host_drains_per_step"] == 0, step
assert step["host_waits_per_step_eager"] == 1 and step["host_drains_per_step_eager"] == 1, step
assert step["launches_per_step"] > 50 and step["graph_speedup"] > 0, step  # 91 at 2 layers
# the timed graphed step replayed both graphs and captured none (a capture there would be timed);
# the graphs timed once more with the update waited for at once
assert step["graphs_in_timed_steps"] == {"micro_batch_captures": 0, "micro_batch_replays": 1, "update_captures": 0, "update_replays": 1}, step
assert step["step_seconds_graphs_waited"] > 0, step
kernels = {k["name"] for k in step["kernels"]}
assert {"attention_forward_mma", "sinkgd_row_norms", "sinkgd_col_partials", "gemm bf16 (cuBLASLt)"} <= kernels, kernels  # BF16, D = 64: the tensor-core attention
print("doctor report: %d checks, %d kernels timed" % (len(r["checks"]), len(kernels)))
PY

out=$(MULTINORM_EMU_PLANT=rmsnorm_forward "$bin" doctor --model "$model" --batch 1 --seq 16 --only op --no-bench --report "$tmp/bad.json" 2>&1)
rc=$?
[ $rc -eq 1 ] || { echo "$out" | tail; fail "a planted wrong kernel: exit $rc, expected 1"; }
grep -qE "FAIL +op +rmsnorm_forward_backward .*kernels: .*rmsnorm_forward" <<<"$out" || { echo "$out"; fail "the planted kernel is not named"; }
[ "$(grep -c '^  FAIL' <<<"$out")" -eq 2 ] || { echo "$out"; fail "other checks failed too"; }
echo "doctor: passes on the emulated plugin; a planted wrong kernel fails it, named"
