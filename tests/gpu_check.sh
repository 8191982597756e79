#!/usr/bin/env bash
# scripts/gpu_check.sh in its dry mode (the emulated plugin, PyTorch on the CPU, tiny shapes), so the
# first GPU call is known to work before a GPU is lent:
#   1. every section and step, with a stand-in compute-sanitizer on PATH (it runs the program and
#      reports no error, in memcheck's and racecheck's own summary lines): statuses as expected here,
#      every figure positive and finite, both sides of the step comparison counting the same FLOPs,
#      our step timed from CUDA graph replays, the exported model's logits equal to PyTorch's within
#      the FP32 bound, a Markdown report with its tables; the report folder holds the two reports and
#      gpu_check_logs.tar.gz only (the exported model stays in --work);
#   2. a planted wrong kernel (MULTINORM_EMU_PLANT=rmsnorm_forward) fails the doctor section, named,
#      while both reports are written and the script exits 1; its temporary work folder is removed;
#   3. sanitizer verdicts: errors (memcheck's and racecheck's summaries) and racecheck warnings fail
#      their run; a tool that refuses the device at start is a skip, said so, while a run that fails
#      after the program printed "not supported" is a failure; a timeout fails its run (no verdict
#      is no pass), and a SIGKILL before the limit is not called a timeout;
#   4. a step that would start past the budget is skipped, and that is no failure;
#   5. stopped from outside (SIGTERM), it stops the running step and still writes both reports;
#   6. a bench that exits 0 without its figures (no JSON, a key missing) fails its section, "no
#      figure", and the report script does not crash;
#   7. not dry, on a machine whose plugin is the CUDA emulation: the python's nvidia/*/lib folders
#      lead LD_LIBRARY_PATH, MULTINORM_CUDA_PLUGIN is the plugin found, and it stops after the
#      environment step, saying why, with both reports;
#   8. a test that crashes the binary (Planted.CrashWhenAsked) is recorded as crashed and fails the
#      tests section, and the tests after it still run, in a new process;
#   9. the sanitizer's kernels and attention targets on a node (their gtest filters) launch every
#      kernel of ours between them, by the emulation's launch log against the launches in
#      kernels/cuda/*.cu, and their tests pass here;
#  10. the profile runs on request only (--only profile), a stand-in ncu's CSV read into its table.
# usage: gpu_check.sh <source dir> <multinorm> <multinorm_tests> <emulated plugin>
set -uo pipefail
src=$1
export GPU_CHECK_MULTINORM=$2 GPU_CHECK_TESTS=$3 MULTINORM_CUDA_PLUGIN=$4 GPU_CHECK_PYTHON=/usr/bin/python3
# The emulation's racecheck is off: the kernels are checked by it in the op and model tests; what is
# tested here is the script (a fifth of its time was racecheck's).
export MULTINORM_EMU_RACECHECK=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "gpu_check: /usr/bin/python3 has no torch (python3-torch): skipped"; exit 77; }

# The stand-in sanitizer: runs the program and prints the tool's summary (memcheck: "ERROR SUMMARY",
# racecheck: "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"). STUB_ERRORS_TOOL's runs
# report 2 errors (exit 86, the script's --error-exitcode), STUB_WARNINGS_TOOL's 1 warning (exit 0),
# STUB_REFUSE_TOOL's are refused as compute-sanitizer refuses a device (before the program runs),
# STUB_LATE_TOOL's program fails printing "not supported" (no summary), STUB_HANG_TOOL's hang,
# STUB_KILL_TOOL's die of SIGKILL at once.
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
summary() {  # ERRORS WARNINGS
  if [ "$tool" = racecheck ]; then echo "========= RACECHECK SUMMARY: $(($1 + $2)) hazards displayed ($1 errors, $2 warnings)"
  else echo "========= ERROR SUMMARY: $1 errors"; fi
}
echo "========= COMPUTE-SANITIZER (stand-in, $tool)"
if [ "$tool" = "${STUB_REFUSE_TOOL:-}" ]; then echo "========= Error: Device not supported"; exit 1; fi
if [ "$tool" = "${STUB_KILL_TOOL:-}" ]; then kill -KILL $$; fi
if [ "$tool" = "${STUB_HANG_TOOL:-}" ]; then sleep 300; exit 0; fi
"$@"; rc=$?
if [ "$tool" = "${STUB_LATE_TOOL:-}" ]; then echo "the program: operation not supported (stand-in)"; exit 1; fi
if [ "$tool" = "${STUB_ERRORS_TOOL:-}" ]; then summary 2 0; exit 86; fi
if [ "$tool" = "${STUB_WARNINGS_TOOL:-}" ]; then summary 0 1; exit $rc; fi
summary 0 0
exit $rc
SH
chmod +x "$tmp/bin/compute-sanitizer"

# The stand-in ncu: takes Nsight Compute's options, writes its details page as CSV (a row per launch and
# metric, as `ncu --csv --page details` does) for two launches into --log-file, with a tool line
# before it and its header repeated, records its arguments in $STUB_NCU_ARGS and runs the program;
# with STUB_NCU_ERROR set it writes ncu's refusal of the counters there instead and exits 1.
cat >"$tmp/bin/ncu" <<'SH'
#!/usr/bin/env bash
log=/dev/stdout
[ -n "${STUB_NCU_ARGS:-}" ] && printf '%s\n' "$*" >>"$STUB_NCU_ARGS"
while [ $# -gt 0 ]; do
  case $1 in
    --csv) shift ;;
    --log-file) log=$2; shift 2 ;;
    --*) shift 2 ;;
    *) break ;;
  esac
done
if [ -n "${STUB_NCU_ERROR:-}" ]; then
  echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters (stand-in)" >"$log"
  exit 1
fi
row() {  # ID KERNEL GRID SECTION METRIC UNIT VALUE
  printf '"%s","4242","multinorm","node","%s","1","7","(256, 1, 1)","%s","0","9.0","%s","%s","%s","%s"\n' "$@"
}
{
  echo "==PROF== Connected to process 4242 (stand-in ncu, tests/gpu_check.sh)"
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "GPU Speed Of Light Throughput" "Duration" "msecond" "1.25"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "GPU Speed Of Light Throughput" "DRAM Throughput" "%" "59.10"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "Occupancy" "Achieved Occupancy" "%" "23.40"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "Launch Statistics" "Registers Per Thread" "register/thread" "71"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "Command line profiler metrics" "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio" "" "0.50"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "Command line profiler metrics" "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" "" "3.20"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "GPU Speed Of Light Throughput" "Memory Throughput" "%" "76.00"
  row 0 "void multinorm::cuda::(anonymous namespace)::rmsnorm_backward_rows_kernel<__nv_bfloat16>(...)" "(256, 1, 1)" "Memory Workload Analysis" "Memory Throughput" "byte/second" "2,800,000,000,000"
  echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
  row 1 cross_entropy_chunk_kernel "(1024, 1, 1)" "GPU Speed Of Light Throughput" "Duration" "usecond" "12,400.5"
  row 1 cross_entropy_chunk_kernel "(1024, 1, 1)" "GPU Speed Of Light Throughput" "Compute (SM) Throughput" "%" "57.00"
  row 1 cross_entropy_chunk_kernel "(1024, 1, 1)" "Command line profiler metrics" "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio" "" "n/a"
} >"$log"
"$@"
SH
chmod +x "$tmp/bin/ncu"

# 1. The whole dry run. A peak of 0.001 TFLOP/s stands in for a GPU's, so that MFU is computed.
start=$(date +%s)
PATH="$tmp/bin:$PATH" GPU_CHECK_PEAK_TFLOPS=0.001 bash "$src/scripts/gpu_check.sh" --dry --work "$tmp/work" "$tmp/all" > "$tmp/all.txt" 2>&1
rc=$?
wall=$(($(date +%s) - start))
[ $rc -eq 0 ] || { tail -40 "$tmp/all.txt"; fail "the dry run exited $rc"; }
# What comes back from a node: the two reports and one archive (of logs/, raw/, steps.tsv) under 16 MiB.
[ "$(cd "$tmp/all" && ls -A | sort | tr '\n' ' ')" = "gpu_check.json gpu_check.md gpu_check_logs.tar.gz " ] ||
  fail "the report folder holds more than the reports and the archive: $(ls -A "$tmp/all")"
[ "$(stat -c %s "$tmp/all/gpu_check_logs.tar.gz")" -lt $((16 << 20)) ] || fail "gpu_check_logs.tar.gz is over 16 MiB"
mkdir "$tmp/unpacked" && tar -xzf "$tmp/all/gpu_check_logs.tar.gz" -C "$tmp/unpacked" || fail "gpu_check_logs.tar.gz does not unpack"
for f in steps.tsv logs/environment.log logs/attention_ours.log raw/meta.json raw/attention_ours.jsonl raw/step_ours_llama_60m.json; do
  [ -s "$tmp/unpacked/$f" ] || fail "gpu_check_logs.tar.gz lacks $f"
done
[ -s "$tmp/work/hf_llama_60m/multinorm_logits.safetensors" ] || fail "the exported model is not in the --work folder"
/usr/bin/python3 - "$tmp/all" "$tmp/unpacked" <<'PY' || { cat "$tmp/all/gpu_check.md"; fail "the dry run's report (above)"; }
import json, math, sys
d, raw = sys.argv[1], sys.argv[2] + "/raw"
r = json.load(open(d + "/gpu_check.json"))
md = open(d + "/gpu_check.md").read()
s = r["sections"]
pos = lambda x: isinstance(x, (int, float)) and math.isfinite(x) and x > 0
assert r["ok"] is True and r["gpu_check"]["dry"] is True and r["gpu_check"]["layout"] == "build", r["gpu_check"]
expected = {"environment": "ok", "doctor": "ok", "tests": "ok", "training": "ok", "sanitizer": "ok", "step_vs_torch": "ok", "attention": "ok",
            "hf_logits": "skipped", "optimizers": "ok", "gemm": "ok", "nccl": "skipped", "profile": "skipped"}
assert {k: v["status"] for k, v in s.items()} == expected, {k: (v["status"], v.get("reason")) for k, v in s.items()}
assert "on request only" in s["profile"]["reason"], s["profile"]  # (the stand-in ncu is on PATH)
ran = [x for x in r["steps"] if x["section"] != "profile"]
assert len(ran) == 25 and all(x["status"] == "ok" for x in ran), [(x["id"], x["status"], x["reason"]) for x in r["steps"]]
assert all(x["seconds"] <= x["limit_s"] for x in r["steps"]), "a step ran past its limit"
assert s["environment"]["python"]["offline"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, s["environment"]["python"]

for m in s["doctor"]["models"]:  # 52 and 50 checks at one layer; the trainer's path waits once a step, never drains
    st = m["step"]
    assert m["checks"] >= 40 and m["failed"] == 0, m
    assert pos(st["tokens_per_s"]) and pos(st["step_seconds"]) and pos(st["graph_speedup"]), st
    assert (st["host_waits_per_step"], st["host_drains_per_step"], st["host_waits_per_step_eager"], st["host_drains_per_step_eager"]) == (1, 0, 1, 1), st
    assert {"attention_forward_mma", "sinkgd_row_norms", "sinkgd_col_partials"} <= {k["name"] for k in st["kernels"]} and all(pos(k["ms"]) for k in st["kernels"]), st
    # the one timed graphed step replayed both graphs and captured none; the graphs timed again, waited for
    assert st["graphs_in_timed_steps"] == {"micro_batch_captures": 0, "micro_batch_replays": 1, "update_captures": 0, "update_replays": 1}, st
    assert pos(st["step_seconds_graphs_waited"]), st
assert "| 1, 1 / 0, 0 |" in md, "the doctor table's timed replays / captures"
assert [m["step"]["batch"] for m in s["doctor"]["models"]] == [1, 2], s["doctor"]["models"]  # llama_1b's slot: --step-batch

rows = s["step_vs_torch"]["rows"]
assert [x["slot"] for x in rows] == ["llama_60m", "llama_1b"], rows
for x in rows:
    for k in ("ours_tokens_per_s", "torch_eager_tokens_per_s", "ratio_to_torch_eager", "ours_mfu", "torch_eager_mfu"):
        assert pos(x.get(k)), (k, x)
    # the same FLOPs per token on both sides (6 x GEMM parameters + 12 L T C), to rounding
    assert abs(x["ours_flops_per_token"] / x["torch_flops_per_token"] - 1) < 1e-9, x
    assert abs(x["ours_mfu"] - x["ours_tflops"] / 0.001) < 1e-9 * x["ours_mfu"], x
    # timed as the trainer runs it: the one timed step replayed a CUDA graph, no per-op profiling
    assert x["ours_cuda_graph_replays"] == 1 and x["ours_timed"].startswith("CUDA graphs"), x
    assert pos(x.get("torch_compile_tokens_per_s")) or "torch.compile" in x.get("torch_compile_error", ""), x  # none in PyTorch 1.13
ours = json.load(open(raw + "/step_ours_llama_60m.json"))
assert ours["profile_s"]["attention"] > 0 and ours["kernels"], ours  # the profiles, from untimed steps

# bench gemm: the tiny model's 12 projection GEMMs and the loss head's 3, each with its aligned twin;
# the micro-batch's total is the products' times their counts
g = s["gemm"]
assert g["reference"]["m"] == 128 and pos(g["reference"]["tflops"]), g
# the dry run's model has F = 172, off 16-byte packs in BF16: the gate/up projection by halves (Linear::halves)
assert [x["product"] for x in g["rows"]][:3] == ["qkv forward", "qkv backward_input", "qkv backward_weight"] and len(g["rows"]) == 18, g["rows"]
assert [x["product"] for x in g["rows"]][6:8] == ["gate forward", "gate backward_input"] and g["rows"][7]["k"] == 176, g["rows"]
assert all(pos(x["seconds"]) and pos(x["aligned"]["seconds"]) and x["aligned"]["n"] % 64 == 0 for x in g["rows"]), g["rows"]
assert abs(sum(x["seconds"] * x["count"] for x in g["rows"]) / g["total"]["seconds"] - 1) < 1e-9, g["total"]
assert "## llama_1b's GEMMs alone" in md, md

att = s["attention"]["rows"]
assert [(x["seq"], x["head_dim"]) for x in att] == [(32, 64), (64, 64), (32, 128), (64, 128)], att
for x in att:
    for k in ("ours_forward_tflops", "ours_forward_backward_tflops", "torch_forward_tflops", "torch_forward_backward_tflops",
              "ratio_forward_to_torch", "ratio_forward_backward_to_torch"):
        assert pos(x.get(k)), (k, x)
# one process for every shape; each warmed up for 150 ms, each window at least 50 ms (or --steps calls)
lines = [json.loads(l) for l in open(raw + "/attention_ours.jsonl") if l.startswith("{")]
assert len(lines) == 4 and all(l["warmup_s"] >= 0.15 and l["forward_calls"] * l["forward_s"] >= 0.0499 for l in lines), lines
sdpa = [json.loads(l) for l in open(raw + "/attention_sdpa.jsonl") if l.startswith("{")]
assert all(l["variant"] == "default" and l["warmup_s"] >= 0.15 for l in sdpa if "seq" in l), sdpa

h = s["hf_logits"]
assert h["reason"] == "transformers not installed", h
# FP32 on both sides (our emulated CUDA backend, PyTorch CPU): measured 1.8e-7; the bound is the GPU's
assert h["tokens"] == 16 and h["fallback"]["relative_error"] <= 1e-4 and h["fallback"]["max_abs_error"] < 1e-3, h

t = s["tests"]
assert (t["tests"], t["passed"], t["failed"], t["skipped"], t["failing"], t["complete"]) == (4, 3, 0, 1, [], True), t
# the smoke: the tiny model trained twice per optimizer on the emulated GPU, byte-identical, and the
# perplexity of the CPU backend's run here within 2% (measured: 0.0% and 0.0% apart)
tr = s["training"]
assert [x["optimizer"] for x in tr["runs"]] == ["sinkgd", "swan", "swan:split_tf32"], tr
for x in tr["runs"]:
    assert x["identical"] and x["differing"] == [] and x["updates"] == 3 and pos(x["val_ppl"]) and x["relative"] <= 0.02, x
    # the update's graph, and SWAN's Newton-Schulz in it ended by device loops (WHILE nodes)
    g = x["cuda_graphs"]
    assert pos(x["step_s"]) and g["update_captures"] == 1 and g["device_loops_refused"] == 0, x
    assert (g["device_loops"] > 0) == x["optimizer"].startswith("swan"), x
assert "device loop(s)" in md and md.count("1 captured, ") == 3, md
op = s["optimizers"]["rows"]  # one update of each optimizer, SWAN's beside SinkGD's
assert [x["slot"] for x in op] == ["quickstart", "llama_60m", "llama_1b"] and all(pos(x[k + "_step_s"]) for x in op for k in ("sinkgd", "swan", "adam")), op
# bench optim --profile: SWAN's eager step kernel by kernel, its batched Newton-Schulz products beside their roofline
for x in op:
    names = {k["name"]: k for k in x["swan_profile"]}
    assert "gemm fp32 batched (cuBLASLt)" in names and pos(names["gemm fp32 batched (cuBLASLt)"]["predicted_ms"]), x["swan_profile"]
assert "SWAN's step at" in md, md
runs = s["sanitizer"]["runs"]
assert len(runs) == 6 and all(x["status"] == "ok" and x["errors"] == 0 and x["warnings"] == 0 for x in runs), runs
assert s["nccl"]["reason"] == "1 GPU visible", s["nccl"]

assert md.startswith("# gpu_check: ok"), md[:200]
for header in ("| section | status | why |", "| model | B x T | ours tokens/s | ours MFU (fwd+bwd, no optimizer) |", "| B x H x T x D |",
               "| step | section | status |", "| tokens/s | MFU (step with the update) |", "| model | SinkGD ms | SWAN ms | SWAN, FP32 products, ms |"):
    assert header in md, header
print("gpu_check dry run: %d sections, %d steps, llama_60m slot %.0f tokens/s ours, %.0f PyTorch" %
      (len(s), len(r["steps"]), rows[0]["ours_tokens_per_s"], rows[0]["torch_eager_tokens_per_s"]))
PY
echo "gpu_check: the dry run took $wall s"
# (export --logits past the model's positions is refused, naming both)
out=$("$GPU_CHECK_MULTINORM" export -c "$tmp/work/tiny_model.json" -o "$tmp/too_long" --logits 257 2>&1) && fail "export --logits 257 ran"
grep -q "export --logits 257: more than the model's max_position_embeddings (256)" <<<"$out" || fail "export --logits 257: $out"

# 2. A planted wrong kernel: the doctor section fails, naming it; both reports are still written.
mkdir "$tmp/tmpdir"
TMPDIR=$tmp/tmpdir MULTINORM_EMU_PLANT=rmsnorm_forward bash "$src/scripts/gpu_check.sh" --dry --only doctor_llama_60m "$tmp/planted" > "$tmp/planted.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/planted.txt"; fail "a planted wrong kernel: exit $rc, expected 1"; }
[ -z "$(ls -A "$tmp/tmpdir")" ] || fail "the temporary work folder was left behind: $(ls -A "$tmp/tmpdir")"
/usr/bin/python3 - "$tmp/planted" <<'PY' || fail "the planted run's report"
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/gpu_check.json"))
s = r["sections"]
assert r["ok"] is False and s["doctor"]["status"] == "failed", s["doctor"]
assert "rmsnorm_forward_backward" in s["doctor"]["reason"], s["doctor"]["reason"]
assert [c["name"] for c in s["doctor"]["models"][0]["failing"]] == ["rmsnorm_forward_backward"] * 2, s["doctor"]["models"][0]["failing"]  # FP32 and BF16
for name in ("step_vs_torch", "attention", "tests", "training", "sanitizer"):
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
for target in ("training", "kernels", "attention"):
    assert got[("memcheck", target)][:2] == ("failed", 2), got
    assert got[("racecheck", target)][0] == "skipped" and "refused: Error: Device not supported" in got[("racecheck", target)][2], got
PY
# racecheck's own summary with errors; a program that fails printing "not supported" is no refusal
PATH="$tmp/bin:$PATH" STUB_ERRORS_TOOL=racecheck STUB_LATE_TOOL=memcheck \
  bash "$src/scripts/gpu_check.sh" --dry --only sanitizer "$tmp/san2" > "$tmp/san2.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/san2.txt"; fail "racecheck errors: exit $rc, expected 1"; }
# racecheck warnings are findings; a SIGKILL at once is no timeout
PATH="$tmp/bin:$PATH" STUB_WARNINGS_TOOL=racecheck STUB_KILL_TOOL=memcheck \
  bash "$src/scripts/gpu_check.sh" --dry --only sanitizer "$tmp/san3" > "$tmp/san3.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/san3.txt"; fail "racecheck warnings: exit $rc, expected 1"; }
# a run that times out fails: no verdict is no pass (the budget cuts the first run's limit; the others
# are skipped)
PATH="$tmp/bin:$PATH" STUB_HANG_TOOL=memcheck GPU_CHECK_BUDGET_S=8 \
  bash "$src/scripts/gpu_check.sh" --dry --only sanitizer "$tmp/san4" > "$tmp/san4.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/san4.txt"; fail "a sanitizer timeout: exit $rc, expected 1"; }
/usr/bin/python3 - "$tmp" <<'PY' || fail "the sanitizer runs' reports"
import json, sys
t = sys.argv[1]
def runs(name):
    s = json.load(open(f"{t}/{name}/gpu_check.json"))["sections"]["sanitizer"]
    return s, {(x["tool"], x["target"]): x for x in s["runs"]}
s, got = runs("san2")
for target in ("training", "kernels", "attention"):
    x = got[("racecheck", target)]
    assert (x["status"], x["errors"], x["warnings"]) == ("failed", 2, 0) and "2 racecheck error(s)" in x["reason"], x
    x = got[("memcheck", target)]
    assert x["status"] == "failed" and x["errors"] is None and x["reason"] == "exit status 1", x
s, got = runs("san3")
for target in ("training", "kernels", "attention"):
    x = got[("racecheck", target)]
    assert (x["status"], x["errors"], x["warnings"]) == ("failed", 0, 1) and "1 racecheck warning(s)" in x["reason"], x
    x = got[("memcheck", target)]
    assert x["status"] == "failed" and x["reason"].startswith("killed by SIGKILL (exit status 137)"), x
s, got = runs("san4")
assert s["status"] == "failed", s
x = got[("memcheck", "training")]
assert x["status"] == "failed" and x["reason"].startswith("timed out after") and x["reason"].endswith("no verdict"), x
assert all(got[k]["status"] == "skipped" and "out of time" in got[k]["reason"] for k in got if k != ("memcheck", "training")), got
PY
echo "gpu_check: sanitizer errors and racecheck warnings fail their run; a refused device is skipped, with the tool's words;"
echo "  a program's own failure is a failure, a timeout a failure, an early SIGKILL no timeout"

# 4. Out of time: a step that would start with under 5 s of the budget left is skipped, not failed.
GPU_CHECK_BUDGET_S=2 bash "$src/scripts/gpu_check.sh" --dry --only tests "$tmp/late" > "$tmp/late.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -20 "$tmp/late.txt"; fail "a budget spent: exit $rc, expected 0"; }
/usr/bin/python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['sections']['tests']
assert t['status'] == 'skipped' and 'out of time' in t['reason'], t" "$tmp/late/gpu_check.json" || fail "the budget run's report"

# 5. Stopped from outside mid-step: the running step is stopped and recorded, the reports written.
# The signal goes once the training smoke (tens of seconds) has started: a fixed delay could land
# between steps, on the smoke's shard preparation, when no step is running (the first steps take
# 3-5 s, depending on the machine).
bash "$src/scripts/gpu_check.sh" --dry "$tmp/stopped" > "$tmp/stopped.txt" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q '^gpu_check: training_smoke (at most' "$tmp/stopped.txt" && break
  sleep 0.1
done
grep -q '^gpu_check: training_smoke (at most' "$tmp/stopped.txt" || fail "the stopped run never reached its training smoke"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/stopped.txt"; fail "stopped from outside: exit $rc, expected 1"; }
/usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert [x['reason'] for x in r['steps']][-1] == 'interrupted (SIGTERM or SIGINT)', r['steps']" "$tmp/stopped/gpu_check.json" ||
  fail "the stopped run's report does not record the interrupted step"

# 6. A bench that exits 0 without its figures: the section fails, "no figure"; the report still comes.
cat >"$tmp/bin/multinorm-nofigure" <<SH
#!/usr/bin/env bash
case "\$1 \$2" in
  "bench model") echo '{"model": "llama_tiny"}' ;;  # no train_tokens_per_s
  "bench attention") echo "not JSON at all" ;;
  *) exec "$GPU_CHECK_MULTINORM" "\$@" ;;
esac
SH
chmod +x "$tmp/bin/multinorm-nofigure"
GPU_CHECK_MULTINORM=$tmp/bin/multinorm-nofigure bash "$src/scripts/gpu_check.sh" --dry --only step_ours_llama_60m,attention_ours \
  "$tmp/nofigure" > "$tmp/nofigure.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/nofigure.txt"; fail "no figure: exit $rc, expected 1"; }
/usr/bin/python3 - "$tmp/nofigure/gpu_check.json" <<'PY' || fail "the no-figure run's report"
import json, sys
s = json.load(open(sys.argv[1]))["sections"]
assert s["step_vs_torch"]["status"] == "failed" and "step_ours_llama_60m: failed: no figure" in s["step_vs_torch"]["reason"], s["step_vs_torch"]
assert s["attention"]["status"] == "failed" and "attention_ours: failed: no figure" in s["attention"]["reason"], s["attention"]
PY
echo "gpu_check: a bench that exits 0 without its figures fails its section"

# 7. Not dry, where the plugin is the CUDA emulation: the python's wheels' library folders lead
# LD_LIBRARY_PATH, the plugin found is the one used, and it stops after the environment step.
mkdir -p "$tmp/site/nvidia/cublas/lib" "$tmp/site/nvidia/nccl/lib"
PYTHONPATH=$tmp/site GPU_CHECK_PLUGIN=$MULTINORM_CUDA_PLUGIN MULTINORM_CUDA_PLUGIN= \
  bash "$src/scripts/gpu_check.sh" --work "$tmp/work_real" "$tmp/real" > "$tmp/real.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/real.txt"; fail "not dry on the emulation: exit $rc, expected 1"; }
mkdir "$tmp/real_unpacked" && tar -xzf "$tmp/real/gpu_check_logs.tar.gz" -C "$tmp/real_unpacked" || fail "the stopped run's archive"
/usr/bin/python3 - "$tmp" "$MULTINORM_CUDA_PLUGIN" <<'PY' || { cat "$tmp/real/gpu_check.md"; fail "the stopped run's report"; }
import json, os, sys
t, plugin = sys.argv[1], sys.argv[2]
r = json.load(open(t + "/real/gpu_check.json"))
meta = json.load(open(t + "/real_unpacked/raw/meta.json"))
s = r["sections"]
assert r["ok"] is False and "CUDA emulation" in r["gpu_check"]["stopped"], r["gpu_check"]
assert s["environment"]["status"] == "failed" and "stopped: multinorm devices reports the CUDA emulation" in s["environment"]["reason"], s["environment"]
assert [x["id"] for x in r["steps"]] == ["environment"], r["steps"]
for name in ("doctor", "step_vs_torch", "attention", "tests", "training", "sanitizer"):
    assert s[name]["status"] == "skipped" and "stopped early" in s[name]["reason"], (name, s[name])
libs = [os.path.realpath(t + "/site/nvidia/" + d + "/lib") for d in ("cublas", "nccl")]
assert meta["nvidia_lib_dirs"].split(":")[:2] == libs and meta["ld_library_path"].startswith(":".join(libs)), meta
assert meta["plugin"] == plugin and f"CUDA plugin: {plugin}" in open(t + "/real_unpacked/raw/devices.txt").read(), meta
assert open(t + "/real/gpu_check.md").read().startswith("# gpu_check: FAILED")
PY
echo "gpu_check: not dry on the emulation, it stops after the environment step, saying why"

# 8. A test that crashes the binary: recorded, the section failed, and the tests after it ran.
MULTINORM_TEST_PLANT_CRASH=1 bash "$src/scripts/gpu_check.sh" --dry --only tests "$tmp/crash" > "$tmp/crash.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/crash.txt"; fail "a planted crash: exit $rc, expected 1"; }
/usr/bin/python3 - "$tmp/crash/gpu_check.json" <<'PY' || fail "the planted crash's report"
import json, sys
t = json.load(open(sys.argv[1]))["sections"]["tests"]
assert t["status"] == "failed" and t["crashed"] == ["Planted.CrashWhenAsked"] and "crashed the binary" in t["reason"], t
assert (t["tests"], t["passed"], t["failed"], t["complete"]) == (4, 3, 1, True) and "2 processes" in t["counted_from"], t
PY
echo "gpu_check: a test that crashes the binary is recorded, and the tests after it run"

# 9. The sanitizer's kernels and attention targets on a node launch every kernel of ours between
# them (the emulation's launch log).
filters=$(bash "$src/scripts/gpu_check.sh" --sanitizer-filters) || fail "--sanitizer-filters"
launched=$tmp/launched.txt
for target in kernels attention; do
  f=$(sed -n "s/^$target //p" <<<"$filters")
  [ -n "$f" ] || fail "no $target filter in: $filters"
  MULTINORM_EMU_LAUNCH_LOG=$launched MULTINORM_TEST_CUDA_PLUGIN=$MULTINORM_CUDA_PLUGIN "$GPU_CHECK_TESTS" \
    --gtest_filter="$f" > "$tmp/census_$target.txt" 2>&1 || { tail -30 "$tmp/census_$target.txt"; fail "the sanitizer's $target tests on the emulation"; }
done
grep -ho 'launch("[a-z_0-9]*"' "$src"/kernels/cuda/*.cu | sed 's/launch("//; s/"//' | sort -u > "$tmp/all_kernels.txt"
missing=$(sort -u "$launched" | comm -23 "$tmp/all_kernels.txt" -)
[ -z "$missing" ] || fail "kernels no sanitizer target launches: $(echo $missing)"
echo "gpu_check: the sanitizer's targets launch all $(wc -l < "$tmp/all_kernels.txt") kernels"

# 10. The profile, on request: ncu on the micro-batch and the update, our kernels only (SWAN's and
# cuBLASLt's not), its CSV read into a table (durations to microseconds whatever the unit, thousands
# separators, a byte/s figure of a percentage's name and a value that is no number left out, a
# repeated header no launch, stalls largest first); ncu's own error fails the section, quoted; without
# --only profile it does not run (1. above).
PATH="$tmp/bin:$PATH" STUB_NCU_ARGS=$tmp/ncu_args bash "$src/scripts/gpu_check.sh" --dry --only profile "$tmp/prof" > "$tmp/prof.txt" 2>&1
rc=$?
[ $rc -eq 0 ] || { tail -20 "$tmp/prof.txt"; fail "the profile run: exit $rc"; }
/usr/bin/python3 - "$tmp/prof" "$tmp/ncu_args" <<'PY' || { cat "$tmp/prof/gpu_check.md"; fail "the profile run's report (above)"; }
import json, sys
r = json.load(open(sys.argv[1] + "/gpu_check.json"))
p = r["sections"]["profile"]
assert p["status"] == "ok", p
for run in ("profile_llama_1b_step", "profile_llama_1b_update"):
    a, b = p["runs"][run]
    assert a["kernel"] == "rmsnorm_backward_rows_kernel" and a["grid"] == "(256, 1, 1)", a
    assert (a["duration_us"], a["dram_pct"], a["memory_pct"], a["achieved_occupancy_pct"], a["registers"]) == (1250.0, 59.1, 76.0, 23.4, 71.0), a
    assert a["stalls"] == [["long_scoreboard", 3.2], ["barrier", 0.5]], a["stalls"]
    assert (b["kernel"], b["duration_us"], b["sm_pct"], b["stalls"]) == ("cross_entropy_chunk_kernel", 12400.5, 57.0, []), b
    assert len(p["runs"][run]) == 2, p["runs"][run]  # (the repeated header line is no launch)
assert all(r["sections"][k]["status"] == "skipped" for k in r["sections"] if k not in ("profile", "nccl")), r["sections"]
assert "## Nsight Compute" in open(sys.argv[1] + "/gpu_check.md").read()
args = open(sys.argv[2]).read().splitlines()
assert len(args) == 2 and all(":2 --clock-control none" in x for x in args), args
assert all("--kernel-name-base demangled " in x for x in args), args  # each template instance its own launches
assert "--kernel-id ::regex:(^|[^a-z_])(copy_rows|cross_entropy|" in args[0] and " bench model " in args[0], args
assert "--kernel-id ::regex:(^|[^a-z_])(sinkgd|" in args[1] and "|step|scale)[a-z_]*_kernel([^a-z_]|$):2" in args[1] and " bench optim " in args[1], args
import re
update = re.compile(args[1].split("::regex:")[1].split(":2 ")[0])  # the update's kernels, and not SWAN's
assert all(update.search(k) for k in ("step_kernel", "step_many_kernel", "sinkgd_row_norms_kernel", "sinkgd_col_partials_kernel", "scale_kernel")), update.pattern
assert not any(update.search(k) for k in ("ns_step_end_kernel", "swan_apply_kernel", "sm90_xmma_gemm_bf16", "splitKreduce_kernel")), update.pattern
assert all("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio" in x for x in args), args
PY
PATH="$tmp/bin:$PATH" STUB_NCU_ERROR=1 bash "$src/scripts/gpu_check.sh" --dry --only profile_llama_1b_step "$tmp/prof_err" > "$tmp/prof_err.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { tail -20 "$tmp/prof_err.txt"; fail "ncu's error: exit $rc, expected 1"; }
/usr/bin/python3 - "$tmp/prof_err/gpu_check.json" <<'PY' || fail "ncu's error in the report"
import json, sys
p = json.load(open(sys.argv[1]))["sections"]["profile"]
assert p["status"] == "failed" and "ERR_NVGPUCTRPERM" in p["reason"] and "profile_llama_1b_step: exit status 1" in p["reason"], p
PY
echo "gpu_check: the profile on request: ncu's CSV read into its table, its error quoted"
echo "gpu_check: passed"
