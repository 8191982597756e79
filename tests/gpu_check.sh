#!/usr/bin/env bash
# scripts/gpu_check.sh in its dry mode (the emulated plugin, PyTorch on the CPU, tiny shapes), so the
# first GPU call is known to work before a GPU is lent:
#   1. every section and step, with a stand-in compute-sanitizer on PATH (it runs the program and
#      reports no error): statuses as expected here, every figure positive and finite, both sides of
#      the step comparison counting the same FLOPs, the exported model's logits equal to PyTorch's
#      within the FP32 bound, and a Markdown report with its tables;
#   2. a planted wrong kernel (MULTINORM_EMU_PLANT=rmsnorm_forward) fails the doctor section, named,
#      while both reports are written and the script exits 1;
#   3. a sanitizer that finds errors fails its run; one that refuses the device is a skip, said so;
#   4. a step that would start past the budget is skipped, and that is no failure;
#   5. stopped from outside (SIGTERM), it stops the running step and still writes both reports.
# usage: gpu_check.sh <source dir> <multinorm> <multinorm_tests> <emulated plugin>
set -uo pipefail
src=$1
export GPU_CHECK_MULTINORM=$2 GPU_CHECK_TESTS=$3 MULTINORM_CUDA_PLUGIN=$4 GPU_CHECK_PYTHON=/usr/bin/python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "gpu_check: /usr/bin/python3 has no torch (python3-torch): skipped"; exit 77; }

# The stand-in sanitizer: runs the program; STUB_ERRORS_TOOL's runs report 2 errors (exit 86, the
# script's --error-exitcode), STUB_REFUSE_TOOL's are refused as compute-sanitizer refuses a device.
mkdir "$tmp/bin"
cat >"$tmp/bin/compute-sanitizer" <<'SH'
#!/usr/bin/env bash
tool=""
while [ $# -gt 0 ]; do
  case $1 in
    --version) echo "stand-in compute-sanitizer (tests/gpu_check.sh)"; exit 0 ;;
    --tool) tool=$2; shift 2 ;;
    --error-exitcode | --print-limit | --target-processes) shift 2 ;;
    *) break ;;
  esac
done
echo "========= COMPUTE-SANITIZER (stand-in, $tool)"
if [ "$tool" = "${STUB_REFUSE_TOOL:-}" ]; then echo "========= Error: Device not supported"; exit 1; fi
"$@"; rc=$?
if [ "$tool" = "${STUB_ERRORS_TOOL:-}" ]; then echo "========= ERROR SUMMARY: 2 errors"; exit 86; fi
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
SH
chmod +x "$tmp/bin/compute-sanitizer"

# 1. The whole dry run. A peak of 0.001 TFLOP/s stands in for a GPU's, so that MFU is computed.
start=$(date +%s)
PATH="$tmp/bin:$PATH" GPU_CHECK_PEAK_TFLOPS=0.001 bash "$src/scripts/gpu_check.sh" --dry "$tmp/all" > "$tmp/all.txt" 2>&1
rc=$?
wall=$(($(date +%s) - start))
[ $rc -eq 0 ] || { tail -40 "$tmp/all.txt"; fail "the dry run exited $rc"; }
/usr/bin/python3 - "$tmp/all" <<'PY' || { cat "$tmp/all/gpu_check.md"; fail "the dry run's report (above)"; }
import json, math, sys
d = sys.argv[1]
r = json.load(open(d + "/gpu_check.json"))
md = open(d + "/gpu_check.md").read()
s = r["sections"]
pos = lambda x: isinstance(x, (int, float)) and math.isfinite(x) and x > 0
assert r["ok"] is True and r["gpu_check"]["dry"] is True and r["gpu_check"]["layout"] == "build", r["gpu_check"]
expected = {"environment": "ok", "doctor": "ok", "step_vs_torch": "ok", "attention": "ok", "hf_logits": "skipped",
            "tests": "ok", "sanitizer": "ok", "nccl": "skipped"}
assert {k: v["status"] for k, v in s.items()} == expected, {k: (v["status"], v.get("reason")) for k, v in s.items()}
assert len(r["steps"]) == 18 and all(x["status"] == "ok" for x in r["steps"]), [(x["id"], x["status"], x["reason"]) for x in r["steps"]]
assert all(x["seconds"] <= x["limit_s"] for x in r["steps"]), "a step ran past its limit"

for m in s["doctor"]["models"]:  # 52 and 50 checks at one layer; the trainer's path waits once a step, never drains
    st = m["step"]
    assert m["checks"] >= 40 and m["failed"] == 0, m
    assert pos(st["tokens_per_s"]) and pos(st["step_seconds"]) and pos(st["graph_speedup"]), st
    assert (st["host_waits_per_step"], st["host_drains_per_step"], st["host_waits_per_step_eager"], st["host_drains_per_step_eager"]) == (1, 0, 1, 1), st
    assert {"attention_forward_mma", "sinkgd_rows"} <= {k["name"] for k in st["kernels"]} and all(pos(k["ms"]) for k in st["kernels"]), st

rows = s["step_vs_torch"]["rows"]
assert [x["slot"] for x in rows] == ["llama_60m", "llama_1b"], rows
for x in rows:
    for k in ("ours_tokens_per_s", "torch_eager_tokens_per_s", "ratio_to_torch_eager", "ours_mfu", "torch_eager_mfu"):
        assert pos(x.get(k)), (k, x)
    # the same FLOPs per token on both sides (6 x GEMM parameters + 12 L T C), to rounding
    assert abs(x["ours_flops_per_token"] / x["torch_flops_per_token"] - 1) < 1e-9, x
    assert abs(x["ours_mfu"] - x["ours_tflops"] / 0.001) < 1e-9 * x["ours_mfu"], x
    assert pos(x.get("torch_compile_tokens_per_s")) or "torch.compile" in x.get("torch_compile_error", ""), x  # none in PyTorch 1.13

att = s["attention"]["rows"]
assert [(x["seq"], x["head_dim"]) for x in att] == [(32, 64), (64, 64), (32, 128), (64, 128)], att
for x in att:
    for k in ("ours_forward_tflops", "ours_forward_backward_tflops", "torch_forward_tflops", "torch_forward_backward_tflops",
              "ratio_forward_to_torch", "ratio_forward_backward_to_torch"):
        assert pos(x.get(k)), (k, x)

h = s["hf_logits"]
assert h["reason"] == "transformers not installed", h
# FP32 on both sides (our emulated CUDA backend, PyTorch CPU): measured 1.8e-7; the bound is the GPU's
assert h["tokens"] == 16 and h["fallback"]["relative_error"] <= 1e-4 and h["fallback"]["max_abs_error"] < 1e-3, h

t = s["tests"]
assert (t["tests"], t["passed"], t["failed"], t["failing"]) == (3, 3, 0, []), t
runs = s["sanitizer"]["runs"]
assert len(runs) == 4 and all(x["status"] == "ok" and x["errors"] == 0 for x in runs), runs
assert s["nccl"]["reason"] == "1 GPU visible", s["nccl"]

assert md.startswith("# gpu_check: ok"), md[:200]
for header in ("| section | status | why |", "| model | B x T | ours tokens/s", "| B x H x T x D |", "| step | section | status |"):
    assert header in md, header
print("gpu_check dry run: %d sections, %d steps, llama_60m slot %.0f tokens/s ours, %.0f PyTorch" %
      (len(s), len(r["steps"]), rows[0]["ours_tokens_per_s"], rows[0]["torch_eager_tokens_per_s"]))
PY
echo "gpu_check: the dry run took $wall s"
# (export --logits past the model's positions is refused, naming both)
out=$("$GPU_CHECK_MULTINORM" export -c "$tmp/all/work/tiny_model.json" -o "$tmp/too_long" --logits 257 2>&1) && fail "export --logits 257 ran"
grep -q "export --logits 257: more than the model's max_position_embeddings (256)" <<<"$out" || fail "export --logits 257: $out"

# 2. A planted wrong kernel: the doctor section fails, naming it; both reports are still written.
MULTINORM_EMU_PLANT=rmsnorm_forward bash "$src/scripts/gpu_check.sh" --dry --only doctor_llama_60m "$tmp/planted" > "$tmp/planted.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/planted.txt"; fail "a planted wrong kernel: exit $rc, expected 1"; }
/usr/bin/python3 - "$tmp/planted" <<'PY' || fail "the planted run's report"
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/gpu_check.json"))
s = r["sections"]
assert r["ok"] is False and s["doctor"]["status"] == "failed", s["doctor"]
assert "rmsnorm_forward_backward" in s["doctor"]["reason"], s["doctor"]["reason"]
assert [c["name"] for c in s["doctor"]["models"][0]["failing"]] == ["rmsnorm_forward_backward"] * 2, s["doctor"]["models"][0]["failing"]  # FP32 and BF16
for name in ("step_vs_torch", "attention", "tests", "sanitizer"):
    assert s[name]["status"] == "skipped" and "not selected" in s[name]["reason"], (name, s[name])
assert open(d + "/gpu_check.md").read().startswith("# gpu_check: FAILED")
PY
echo "gpu_check: a planted wrong kernel fails the doctor section, named; both reports written, exit 1"

# 3. Sanitizer findings fail their run; a refused device is a skip with the tool's words.
PATH="$tmp/bin:$PATH" STUB_ERRORS_TOOL=memcheck STUB_REFUSE_TOOL=racecheck \
  bash "$src/scripts/gpu_check.sh" --dry --only sanitizer "$tmp/san" > "$tmp/san.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/san.txt"; fail "sanitizer errors: exit $rc, expected 1"; }
/usr/bin/python3 - "$tmp/san/gpu_check.json" <<'PY' || fail "the sanitizer run's report"
import json, sys
s = json.load(open(sys.argv[1]))["sections"]["sanitizer"]
got = {(x["tool"], x["target"]): (x["status"], x.get("errors"), x["reason"]) for x in s["runs"]}
assert s["status"] == "failed", s
for target in ("training", "attention"):
    assert got[("memcheck", target)][:2] == ("failed", 2), got
    assert got[("racecheck", target)][0] == "skipped" and "refused: Error: Device not supported" in got[("racecheck", target)][2], got
PY
echo "gpu_check: sanitizer errors fail their run; a refused device is skipped, with the tool's words"

# 4. Out of time: a step that would start with under 5 s of the budget left is skipped, not failed.
GPU_CHECK_BUDGET_S=2 bash "$src/scripts/gpu_check.sh" --dry --only tests "$tmp/late" > "$tmp/late.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -20 "$tmp/late.txt"; fail "a budget spent: exit $rc, expected 0"; }
/usr/bin/python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['sections']['tests']
assert t['status'] == 'skipped' and 'out of time' in t['reason'], t" "$tmp/late/gpu_check.json" || fail "the budget run's report"

# 5. Stopped from outside mid-step: the running step is stopped and recorded, the reports written.
bash "$src/scripts/gpu_check.sh" --dry "$tmp/stopped" > "$tmp/stopped.txt" 2>&1 &
pid=$!
sleep 4
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/stopped.txt"; fail "stopped from outside: exit $rc, expected 1"; }
/usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert [x['reason'] for x in r['steps']][-1] == 'interrupted (SIGTERM or SIGINT)', r['steps']" "$tmp/stopped/gpu_check.json" ||
  fail "the stopped run's report does not record the interrupted step"
echo "gpu_check: passed"
