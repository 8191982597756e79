"""The reports of scripts/gpu_check.sh: OUT/gpu_check.json and OUT/gpu_check.md from OUT/steps.tsv,
OUT/logs/*.log and OUT/raw/*. Standard library only (it runs under any python3).

    python3 scripts/gpu_check/report.py OUT

Sections: environment, doctor, tests, training, sanitizer, step_vs_torch, gemm, attention, hf_logits, optimizers, nccl,
profile (on request).
Each has a status: failed when one of its steps failed or its figures say so (a failed or crashed
test, runs that differ or a perplexity off the CPU's, a sanitizer finding, a sanitizer run cut by its
time limit (no verdict is no pass), logits beyond their bound) or a step that exited 0 left no figure
("no figure"), skipped when none of its steps ran (with why), else ok. A section whose figures this
script cannot read is failed, with why, not a crash.
Exits 1 when a section failed, or when the check stopped early (no GPU, the CUDA emulation).
"""
import csv
import json
import math
import os
import re
import sys
import time

TAIL_CHARS = 2500


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows


def tail(path, chars=TAIL_CHARS):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text[-chars:]


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def num(d, key):
    """d[key] where d is a dict and that is a finite number, else None (a figure missing)."""
    v = d.get(key) if isinstance(d, dict) else None
    return v if finite(v) else None


class Report:
    def __init__(self, out):
        self.out = out
        self.raw = os.path.join(out, "raw")
        self.meta = load_json(os.path.join(self.raw, "meta.json")) or {}
        self.steps = self.read_steps()
        self.by_id = {s["id"]: s for s in self.steps}

    def read_steps(self):
        steps = []
        with open(os.path.join(self.out, "steps.tsv")) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) < 8:
                    continue
                s = {"id": p[0], "section": p[1], "status": p[2], "seconds": float(p[3] or 0), "limit_s": float(p[4] or 0),
                     "exit_status": int(p[5]) if p[5] else None, "reason": p[6], "command": p[7].strip()}
                if s["status"] != "skipped":
                    s["output_tail"] = tail(os.path.join(self.out, "logs", s["id"] + ".log"))
                steps.append(s)
        return steps

    def raw_path(self, name):
        return os.path.join(self.raw, name)

    def section_status(self, ids, data_failed=None, data_skipped=None, figures=None):
        """failed / skipped / ok from the steps `ids` and what the figures say. figures: {step id: whether
        it left its figure}; a step that exited 0 without one fails the section ("no figure")."""
        steps = [self.by_id[i] for i in ids if i in self.by_id]
        failed = [s for s in steps if s["status"] == "failed"]
        no_figure = [s for s in steps if s["status"] == "ok" and figures is not None and s["id"] in figures and not figures[s["id"]]]
        if failed or data_failed or no_figure:
            why = ([f"{s['id']}: {s['reason']}" for s in failed] + [f"{s['id']}: failed: no figure (it exited 0)" for s in no_figure] +
                   ([data_failed] if data_failed else []))
            return "failed", "; ".join(why)
        ran = [s for s in steps if s["status"] == "ok"]
        if not ran:
            if not steps and self.meta.get("stopped"):
                return "skipped", "not run: the check stopped early (" + self.meta["stopped"] + ")"
            return "skipped", "; ".join(sorted({s["reason"] for s in steps})) or "no step ran"
        if data_skipped:
            return "skipped", data_skipped
        return "ok", ""

    # ---- the peak MFU is counted against ---------------------------------------------------------
    def peak_tflops(self):
        o = self.meta.get("peak_tflops_override")
        if o:
            return float(o), "GPU_CHECK_PEAK_TFLOPS"
        for m in ("60m", "1b"):
            d = load_json(self.raw_path(f"doctor_llama_{m}.json")) or {}
            for s in d.get("steps", []):
                if finite(s.get("peak_tflops")):
                    return float(s["peak_tflops"]), "multinorm doctor's table of BF16 dense peaks"
        if self.meta.get("peak_matched"):  # the peak `bench model --peak` used, for this GPU
            for m in ("60m", "1b"):
                b = load_json(self.raw_path(f"step_ours_llama_{m}.json"))
                mfu, gflops = num(b, "mfu_" + self.meta.get("peak_name", "")), num(b, "gflops")
                if mfu and gflops:
                    return gflops / 1e3 / mfu, f"multinorm bench model's {self.meta['peak_name']} peak"
        return None, "no BF16 peak known for this device (GPU_CHECK_PEAK_TFLOPS sets one)"


def environment(r):
    stopped = r.meta.get("stopped")
    status, reason = r.section_status(["environment"], "stopped: " + stopped if stopped else None)
    env = {"status": status, "reason": reason, "python": load_json(r.raw_path("python.json")),
           "layout": r.meta.get("layout"), "gpu": r.meta.get("gpu_name"), "plugin": r.meta.get("plugin"),
           "nvidia_lib_dirs": [d for d in (r.meta.get("nvidia_lib_dirs") or "").split(":") if d],
           "sanitizer": r.meta.get("sanitizer") or None, "ncu": r.meta.get("ncu") or None}
    devices = r.raw_path("devices.txt")
    if os.path.exists(devices):
        env["devices"] = open(devices, errors="replace").read().strip()[:4000]
    smi = r.raw_path("nvidia_smi.csv")
    if os.path.exists(smi):
        env["nvidia_smi"] = open(smi).read().strip()
    for name in ("doctor_llama_60m.json", "doctor_llama_1b.json"):
        d = load_json(r.raw_path(name))
        if d and "environment" in d:
            e = d["environment"]
            env["doctor_environment"] = {k: e.get(k) for k in ("plugin", "driver_version", "runtime_version", "cublaslt", "nccl", "devices")}
            break
    return env


def doctor_model(r, m):
    d = load_json(r.raw_path(f"doctor_llama_{m}.json"))
    if d is None:
        return None
    checks = [c for c in d.get("checks", []) if isinstance(c, dict)]
    failing = [{"name": c.get("name", "?"), "section": c.get("section", "?"), "dtype": c.get("dtype"), "error": c.get("error"),
                "bound": c.get("bound"), "failure": c.get("failure", ""), "kernels": c.get("kernels")} for c in checks if not c.get("ok")]
    name = next((x["model"] for x in checks + d.get("steps", []) if "model" in x), f"llama_{m}")
    out = {"slot": f"llama_{m}", "model": name, "ok": d.get("ok"), "checks": len(checks), "failed": len(failing), "failing": failing}
    if "error" in d:
        out["error"] = d["error"]
    for s in d.get("steps", []):
        keys = ("model", "batch", "seq", "step_seconds", "step_seconds_eager", "graph_speedup", "tokens_per_s", "tflops", "mfu", "peak_tflops",
                "mfu_note", "launches_per_step", "host_waits_per_step", "host_drains_per_step", "host_waits_per_step_eager",
                "host_drains_per_step_eager", "kernel_ms", "predicted_on", "error", "step_seconds_graphs_waited", "graphs_in_timed_steps", "warnings")
        step = {k: s[k] for k in keys if k in s}
        step["kernels"] = [dict({"name": k.get("name", "?"), "launches": k.get("launches"), "ms": num(k, "ms")},
                                **({"predicted_ms": k["predicted_ms"], "measured_over_predicted": k["ms"] / k["predicted_ms"]}
                                   if num(k, "predicted_ms") and num(k, "ms") is not None else {}))
                           for k in s.get("kernels", []) if isinstance(k, dict)]
        out["step"] = step
    return out, d.get("nccl")


def doctor(r):
    models, failed = [], []
    nccl = None
    figures = {}
    for m in ("60m", "1b"):
        got = doctor_model(r, m)
        figures[f"doctor_llama_{m}"] = got is not None
        if got is None:
            continue
        row, n = got
        models.append(row)
        nccl = nccl or n
        if row["failed"] or row.get("ok") is False:
            names = ", ".join(c["name"] for c in row["failing"]) or row.get("error", "not ok")
            failed.append(f"{row['model']}: {names}")
    status, reason = r.section_status(["doctor_llama_60m", "doctor_llama_1b"], "; ".join(failed) or None, figures=figures)
    return {"status": status, "reason": reason, "models": models}, nccl


def nccl_section(n):
    if not n:
        return {"status": "skipped", "reason": "no doctor report"}
    if "skipped" in n:
        return {"status": "skipped", "reason": n["skipped"]}
    rows = [{"name": c.get("name"), "bytes": c.get("bytes"), "bus_bandwidth_gbs": c.get("bus_bandwidth_gbs"),
             "exact": c.get("wrong_elements") == 0} for c in n.get("collectives", [])]
    bad = n.get("error") or ("wrong elements" if any(not x["exact"] for x in rows) else "")
    return {"status": "failed" if bad else "ok", "reason": bad, "gpus": n.get("gpus"), "collectives": rows}


def torch_modes(rows):
    """{mode: tokens/s} and {mode: error} from torch_llama.py's progress lines."""
    tps, errors, summary = {}, {}, {}
    for x in rows:
        if "mode" in x:
            if finite(x.get("tokens_per_s")) and x["tokens_per_s"] > 0:
                tps[x["mode"]] = x["tokens_per_s"]
            else:
                errors[x["mode"]] = x.get("error", "no tokens/s in its line")
        elif "tokens_per_s" in x:
            summary = summary or x  # the eager run's (the compiled run's says the same of the model)
    return tps, errors, summary


def step_vs_torch(r):
    peak, peak_source = r.peak_tflops()
    rows = []
    problems = []
    figures = {}
    for m in ("60m", "1b"):
        ours = load_json(r.raw_path(f"step_ours_llama_{m}.json"))
        ours_tps, ours_gflops = num(ours, "train_tokens_per_s"), num(ours, "gflops")
        figures[f"step_ours_llama_{m}"] = bool(ours_tps and ours_gflops)
        tps, errors, summary = torch_modes(load_jsonl(r.raw_path(f"step_torch_llama_{m}.jsonl")) +
                                           load_jsonl(r.raw_path(f"step_compile_llama_{m}.jsonl")))
        compile_step = r.by_id.get(f"step_compile_llama_{m}")
        if "bf16_sdpa_compile" not in tps and "bf16_sdpa_compile" not in errors and compile_step:
            errors["bf16_sdpa_compile"] = f"{compile_step['status']}: {compile_step['reason']}"  # timed out, not run
        if ours is None and not tps and not errors:
            continue
        row = {"slot": f"llama_{m}", "model": (ours or {}).get("model", f"llama_{m}"), "batch": r.meta.get("step_batch"),
               "seq": r.meta.get("step_seq")}
        if ours_tps and ours_gflops:
            row["ours_tokens_per_s"] = ours_tps
            row["ours_flops_per_token"] = ours_gflops * 1e9 / ours_tps
            row["ours_tflops"] = ours_gflops / 1e3
            row["ours_backend"] = ours.get("gemm_engine")
            row["ours_timed"] = ours.get("timed")
            row["ours_cuda_graph_replays"] = ours.get("cuda_graph_replays")
        if summary:
            row["torch_flops_per_token"] = summary.get("flops_per_token")
            row["torch_version"] = summary.get("torch")
            row["torch_attention"] = summary.get("attention")
            row["torch_device"] = summary.get("device_name", summary.get("device"))
        fpt = row.get("ours_flops_per_token") or row.get("torch_flops_per_token")
        for mode, key in (("bf16_sdpa", "torch_eager"), ("bf16_sdpa_compile", "torch_compile")):
            if mode in tps:
                row[key + "_tokens_per_s"] = tps[mode]
                if fpt:
                    row[key + "_tflops"] = tps[mode] * fpt / 1e12
                if "ours_tokens_per_s" in row:
                    row["ratio_to_" + key] = row["ours_tokens_per_s"] / tps[mode]
            elif mode in errors:
                row[key + "_error"] = errors[mode]
        if peak:
            for key in ("ours", "torch_eager", "torch_compile"):
                if key + "_tflops" in row:
                    row[key + "_mfu"] = row[key + "_tflops"] / peak
        if "torch_eager_tokens_per_s" not in row and f"step_torch_llama_{m}" in r.by_id and r.by_id[f"step_torch_llama_{m}"]["status"] == "ok":
            problems.append(f"llama_{m}: PyTorch eager gave no figure ({errors.get('bf16_sdpa', 'no output')})")
        rows.append(row)
    # torch.compile is optional: its failure is in the rows, not the section's status
    ids = [f"step_{w}_llama_{m}" for m in ("60m", "1b") for w in ("ours", "torch")]
    status, reason = r.section_status(ids, "; ".join(problems) or None, figures=figures)
    return {"status": status, "reason": reason, "peak_tflops": peak, "peak_source": peak_source, "rows": rows,
            "flops": "per token: 6 x GEMM parameters + 12 x L x T x C (multinorm's count, both sides); MFU against the BF16 dense peak"}


SDPA_VARIANTS = ("torch", "flash", "cudnn")  # PyTorch's choice, FlashAttention-2 forced, cuDNN attention forced


def optimizers(r):
    """bench optim --backend cuda: one update of the whole model per optimizer (the best of its rounds)."""
    rows, figures = [], {}
    slots = ("quickstart", "llama_60m", "llama_1b")
    for slot in slots:
        d = load_json(r.raw_path(f"optim_{slot}.json"))
        figures[f"optim_{slot}"] = bool(d and d.get("optimizers"))
        if not figures[f"optim_{slot}"]:
            continue
        o = d["optimizers"]
        row = {"slot": slot, "model": d.get("model")}
        for k in ("sinkgd", "swan", "adam", "swan_fp32"):  # swan_fp32: where SWAN splits its products, the same with FP32 ones
            row[k + "_step_s"] = num(o.get(k, {}), "step_s")
        for k in ("swan_over_sinkgd", "swan_over_swan_fp32", "sinkgd_over_adam", "sinkgd_gb_s", "adam_gb_s", "copy_gb_s"):
            row[k] = num(d, k)
        # SWAN's eager step, kernel by kernel (bench optim --profile): its slowest ten, and its batched
        # products (cuBLASLt's) wherever they rank (on the emulation the CPU's times order the kernels)
        prof = [k for k in (d.get("profiles") or {}).get("swan", []) if isinstance(k, dict)]
        row["swan_profile"] = prof[:10] + [k for k in prof[10:] if str(k.get("name", "")).startswith("gemm ")]
        rows.append(row)
    status, reason = r.section_status([f"optim_{s}" for s in slots], figures=figures)
    return {"status": status, "reason": reason, "rows": rows}


def gemm(r):
    """bench gemm --backend cuda -c llama_1b: each GEMM of the micro-batch alone, beside its M, N, K rounded up to 64."""
    lines = load_jsonl(r.raw_path("gemm_llama_1b.jsonl"))
    ref = next((x["reference"] for x in lines if "reference" in x), None)
    total = next((x["total"] for x in lines if "total" in x), None)
    rows = [x for x in lines if "product" in x]
    status, reason = r.section_status(["gemm_llama_1b"], figures={"gemm_llama_1b": bool(ref and total and rows)})
    return {"status": status, "reason": reason, "reference": ref, "total": total, "rows": rows}


# Nsight Compute's details page as CSV: a row per (launch, metric). The figures kept of each launch.
PROFILE_METRICS = {"Duration": "duration_us", "DRAM Throughput": "dram_pct", "Memory Throughput": "memory_pct",
                   "Compute (SM) Throughput": "sm_pct", "Achieved Occupancy": "achieved_occupancy_pct",
                   "Theoretical Occupancy": "theoretical_occupancy_pct", "Registers Per Thread": "registers", "Waves Per SM": "waves_per_sm",
                   "Warp Cycles Per Issued Instruction": "cycles_per_issue"}
TIME_UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")


def ncu_number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def ncu_launches(path):
    """[{kernel, grid, block, the PROFILE_METRICS figures, stalls: [(reason, warps a cycle), ...] largest first}]
    from `ncu --csv --page details --log-file`; the tool's own lines (==PROF==, ==WARNING==) skipped."""
    try:
        with open(path, errors="replace") as f:
            lines = [line for line in f if line.startswith('"')]
    except OSError:
        return []
    launches = {}
    for row in csv.DictReader(lines):
        key = row.get("ID")
        if ncu_number(key) is None or "Metric Name" not in row:  # (a header line repeated)
            continue
        name = row.get("Kernel Name", "?")
        short = re.search(r"\w+_kernel", name)  # demangled names carry the namespace and template arguments
        x = launches.setdefault(key, {"kernel": short.group(0) if short else name, "grid": row.get("Grid Size"), "block": row.get("Block Size"),
                                      "stalls": []})
        name, value = row["Metric Name"], ncu_number(row.get("Metric Value"))
        if value is None:
            continue
        if name == "Duration":
            scale = TIME_UNITS_US.get((row.get("Metric Unit") or "").strip())
            value = value * scale if scale else None
        stall = STALL.fullmatch(name)
        if stall:
            x["stalls"].append((stall.group(1), value))
        elif name in PROFILE_METRICS and value is not None:
            field = PROFILE_METRICS[name]
            if not field.endswith("_pct") or (row.get("Metric Unit") or "").strip() == "%":  # (not a section's byte/s of that name)
                x[field] = value
    for x in launches.values():
        x["stalls"].sort(key=lambda s: -s[1])
    return [launches[k] for k in sorted(launches, key=lambda k: ncu_number(k) or 0)]


def profile(r):
    """Nsight Compute on our kernels (on request: --only profile): llama_1b's micro-batch and one update per optimizer."""
    ids = ["profile_llama_1b_step", "profile_llama_1b_update"]
    runs = {i: ncu_launches(r.raw_path(i + ".csv")) for i in ids}
    errors = []  # ncu's own errors (no access to the counters, an unknown metric) go to its --log-file
    for i in ids:
        try:
            with open(r.raw_path(i + ".csv"), errors="replace") as f:
                errors += [f"{i}: {line.strip()}" for line in f if line.startswith("==ERROR==")][:3]
        except OSError:
            pass
    status, reason = r.section_status(ids, "; ".join(errors)[:600] or None, figures={i: bool(runs[i]) for i in ids})
    return {"status": status, "reason": reason, "runs": runs}


def sdpa_variant(x):
    v = x.get("variant")
    if v in ("flash", "cudnn"):
        return v
    if v == "default":
        return "torch"
    kernel = str(x.get("kernel", ""))
    return "flash" if "flash" in kernel else "cudnn" if "cudnn" in kernel else "torch"


def attention(r):
    sdpa = [x for x in load_jsonl(r.raw_path("attention_sdpa.jsonl")) if "kernel" in x]
    ours_rows = [x for x in load_jsonl(r.raw_path("attention_ours.jsonl")) if "seq" in x]
    rows = []
    missing = []
    shapes = [s for s in (r.meta.get("attention_shapes") or "").split(",") if s]
    for shape in shapes:
        B, H, T, D = (int(v) for v in shape.split("x"))
        row = {"batch": B, "heads": H, "seq": T, "head_dim": D}
        ours = next((x for x in ours_rows if (x.get("batch"), x.get("heads"), x.get("seq"), x.get("head_dim")) == (B, H, T, D)), None)
        fwd, fb = num(ours, "forward_tflops"), num(ours, "forward_backward_tflops")
        if fwd and fb:
            row["ours_forward_tflops"], row["ours_forward_backward_tflops"] = fwd, fb
        else:
            missing.append(shape)
        for x in sdpa:
            if (x.get("batch"), x.get("heads"), x.get("seq"), x.get("head_dim")) != (B, H, T, D):
                continue
            key = sdpa_variant(x)
            if x.get("sdpa_backend"):
                row[key + "_sdpa_backend"] = x["sdpa_backend"]
            fwd, fb = num(x, "forward_tflops"), num(x, "forward_backward_tflops")
            if "error" in x or not (fwd and fb):
                row[key + "_error"] = x.get("error", "no figure in its line")
                continue
            row[key + "_kernel"] = x.get("kernel")
            row[key + "_forward_tflops"] = fwd
            row[key + "_forward_backward_tflops"] = fb
        for key in SDPA_VARIANTS:
            for p in ("forward", "forward_backward"):
                a, b = row.get(f"ours_{p}_tflops"), row.get(f"{key}_{p}_tflops")
                if a and b:
                    row[f"ratio_{p}_to_{key}"] = a / b
        if len(row) > 4:
            rows.append(row)
    problem = None
    sdpa_step = r.by_id.get("attention_sdpa")
    if sdpa_step and sdpa_step["status"] == "ok" and not any("torch_forward_tflops" in x for x in rows):
        first = next((x["error"] for x in sdpa if "error" in x), "no output")
        problem = f"PyTorch gave no attention figure ({str(first)[:300]})"
    figures = {"attention_ours": not missing}
    status, reason = r.section_status(["attention_ours", "attention_sdpa"], problem, figures=figures)
    if missing and status == "failed" and "attention_ours: failed: no figure" in reason:
        reason = reason.replace("attention_ours: failed: no figure (it exited 0)",
                                "attention_ours: failed: no figure (it exited 0) for " + ", ".join(missing))
    return {"status": status, "reason": reason, "rows": rows,
            "flops": "causal: 4 B H D T(T+1)/2 forward, 2.5x that backward (FlashAttention's convention)"}


def hf_logits(r):
    d = load_json(r.raw_path("hf_logits.json"))
    if not isinstance(d, dict):
        d = None
    status, reason = r.section_status(["hf_export", "hf_compare"],
                                      d.get("reason") if d and d.get("status") == "failed" else None,
                                      d.get("reason") if d and d.get("status") == "skipped" else None,
                                      figures={"hf_compare": d is not None})
    out = {"status": status, "reason": reason}
    if d:
        out.update({k: v for k, v in d.items() if k not in ("status", "reason")})
    return out


def gtest_results(r):
    """(tests, passed, failed, skipped, failing names, crashed names, source) from run_gtests.py's
    JSON, else gtest's own JSON, else its log."""
    g = load_json(r.raw_path("gtest_runs.json"))
    if g:
        by = {}
        for t in g.get("tests", []):
            by.setdefault(t.get("result"), []).append(t.get("name", "?"))
        failing, crashed = by.get("failed", []), by.get("crashed", [])
        rounds = len(g.get("rounds", []))
        source = "run_gtests.py" + (f" ({rounds} processes: a crash, then the tests after it)" if rounds > 1 else "")
        if not g.get("complete"):
            source += "; incomplete: " + (f"{len(g.get('crashes', []))} crashes" if g.get("crashes") else "cut before the last test")
        return (len(g.get("tests", [])), len(by.get("passed", [])), len(failing) + len(crashed), len(by.get("skipped", [])),
                failing + crashed, crashed, source, g.get("complete", False))
    g = load_json(r.raw_path("gtest.json"))
    if g:
        names, skipped, tests = [], 0, 0
        for suite in g.get("testsuites", []):
            for t in suite.get("testsuite", []):
                tests += 1
                if t.get("failures"):
                    names.append(f"{suite.get('name', '?')}.{t.get('name', '?')}")
                elif t.get("result") == "SKIPPED":
                    skipped += 1
        return tests, tests - len(names) - skipped, len(names), skipped, names, [], "gtest JSON", True
    log = tail(os.path.join(r.out, "logs", "tests_cuda.log"), 10 ** 7)
    if not log:
        return None
    ok = len(re.findall(r"^\[       OK \] ", log, re.M))
    failing = sorted(set(re.findall(r"^\[  FAILED  \] (\S+)(?: \(|,|$)", log, re.M)))
    skipped = len(re.findall(r"^\[  SKIPPED \] \S+ \(", log, re.M))
    return ok + len(failing) + skipped, ok, len(failing), skipped, failing, [], "the log (no gtest JSON: the binary stopped early)", False


def tests(r):
    got = gtest_results(r)
    out = {}
    data_failed = None
    if got:
        total, passed, failed, skipped, names, crashed, source, complete = got
        out = {"tests": total, "passed": passed, "failed": failed, "skipped": skipped, "failing": names, "crashed": crashed,
               "counted_from": source, "complete": complete}
        if failed:
            data_failed = f"{failed} failed" + (f" ({len(crashed)} crashed the binary)" if crashed else "") + ": " + ", ".join(names[:10])
    status, reason = r.section_status(["tests_cuda"], data_failed, figures={"tests_cuda": got is not None and got[0] > 0})
    return dict({"status": status, "reason": reason}, **out)


def training(r):
    """The training smoke (gpu_check/training_smoke.sh): per optimizer, the two runs byte-identical and
    the validation perplexity within its bound of the CPU backend's."""
    d = load_json(r.raw_path("training_smoke.json"))
    bad = []
    for x in (d or {}).get("runs", []):
        if not x.get("identical"):
            bad.append(f"{x['optimizer']}: the two runs differ ({', '.join(x.get('differing') or [])})")
        rel = x.get("relative")
        if rel is None:
            bad.append(f"{x['optimizer']}: no validation perplexity to compare")
        elif rel > d.get("bound", 0.02):
            bad.append(f"{x['optimizer']}: validation perplexity {x['val_ppl']:.2f}, the CPU's {x['reference_ppl']:.2f} "
                       f"({100 * rel:.2f}% apart, bound {100 * d.get('bound', 0.02):.0f}%)")
    status, reason = r.section_status(["training_smoke"], "; ".join(bad) or None, figures={"training_smoke": bool(d and d.get("runs"))})
    return dict({"status": status, "reason": reason}, **({"bound": d.get("bound"), "runs": d.get("runs", [])} if d else {}))


def update_graph(g):
    """result.json's cuda_graphs in a few words: the update's captures and replays, and its device loops
    (SWAN's Newton-Schulz ended by WHILE nodes) or the runtime's refusal of them."""
    if not g:
        return ""
    words = f"{g.get('update_captures')} captured, {g.get('updates_replayed')} replayed"
    if g.get("device_loops_refused"):
        words += ", device loops refused"
    elif g.get("device_loops"):
        words += f", {g['device_loops']} device loop(s)"
    return words + (f"; gave up: {g['gave_up']}" if g.get("gave_up") else "")


# How compute-sanitizer says it cannot run here (a device or driver it does not support, no permission).
REFUSED = re.compile(r"not supported|Unable to|unsupported|No CUDA-capable|insufficient permissions|ERR_NVGPUCTRPERM", re.I)


def refused_at_start(log):
    """The tool's refusal, where it refused before the program printed anything: one of its own lines
    ("========= ...") saying so, ahead of the first line of the program's. None otherwise (a program
    that failed, printing "not supported" itself, is a failure, not a refusal)."""
    for line in log.splitlines():
        if not line.strip():
            continue
        if not line.startswith("========="):
            return None  # the program ran
        if REFUSED.search(line):
            return line.strip().lstrip("= ").strip()
    return None


def sanitizer_summary(log):
    """(errors, warnings) from the last summary: memcheck's "ERROR SUMMARY: N errors", racecheck's
    "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"; (None, None) without one."""
    race = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", log)
    if race:
        return int(race[-1][1]), int(race[-1][2])
    m = re.findall(r"ERROR SUMMARY: (\d+) errors?", log)
    return (int(m[-1]), 0) if m else (None, None)


SANITIZER_TARGETS = ("training", "kernels", "attention")


def sanitizer(r):
    runs, failed = [], []
    for tool in ("memcheck", "racecheck"):
        for target in SANITIZER_TARGETS:
            s = r.by_id.get(f"{tool}_{target}")
            if not s:
                continue
            run = {"tool": tool, "target": target, "status": s["status"], "reason": s["reason"]}
            if s["status"] != "skipped":
                log = tail(os.path.join(r.out, "logs", s["id"] + ".log"), 10 ** 7)
                run["errors"], run["warnings"] = sanitizer_summary(log)
                refused = refused_at_start(log) if run["errors"] is None and s["status"] == "failed" else None
                timed_out = s["status"] == "failed" and s["reason"].startswith("timed out")
                if refused:
                    run["status"], run["reason"] = "skipped", "compute-sanitizer refused: " + refused[:200]
                elif run["errors"]:
                    run["status"], run["reason"] = "failed", f"{run['errors']} {tool} error(s)" + (
                        f", {run['warnings']} warning(s)" if run["warnings"] else "")
                elif run["warnings"]:  # racecheck's possible hazards: a finding to look at, not a pass
                    run["status"], run["reason"] = "failed", f"{run['warnings']} {tool} warning(s) (hazards reported as warnings)"
                elif timed_out:  # no verdict is no pass
                    run["status"], run["reason"] = "failed", s["reason"] + " before the tool's summary: no verdict"
                elif s["status"] == "ok" and run["errors"] is None:
                    run["status"], run["reason"] = "failed", "no figure: the tool printed no summary"
                if run["status"] == "failed":
                    failed.append(f"{tool} {target}: {run['reason']}")
            runs.append(run)
    statuses = {x["status"] for x in runs}
    if failed:
        status, reason = "failed", "; ".join(failed)
    elif statuses <= {"skipped"}:
        status, reason = "skipped", "; ".join(sorted({x["reason"] for x in runs})) or "no run"
        if not runs and r.meta.get("stopped"):
            reason = "not run: the check stopped early (" + r.meta["stopped"] + ")"
    else:
        status, reason = "ok", ""
    return {"status": status, "reason": reason, "runs": runs}


def build(out):
    r = Report(out)

    def guarded(name, fn, *args):  # a figure this script cannot read fails its section, named; the rest still report
        try:
            return fn(*args)
        except Exception as e:
            return {"status": "failed", "reason": f"report.py could not read the {name} figures ({type(e).__name__}: {e})"[:600]}

    got = guarded("doctor", doctor, r)
    doc, nccl = got if isinstance(got, tuple) else (got, None)
    sections = {"environment": guarded("environment", environment, r), "doctor": doc, "tests": guarded("tests", tests, r),
                "training": guarded("training", training, r), "sanitizer": guarded("sanitizer", sanitizer, r),
                "step_vs_torch": guarded("step_vs_torch", step_vs_torch, r), "attention": guarded("attention", attention, r),
                "hf_logits": guarded("hf_logits", hf_logits, r), "optimizers": guarded("optimizers", optimizers, r), "gemm": guarded("gemm", gemm, r),
                "nccl": guarded("nccl", nccl_section, nccl), "profile": guarded("profile", profile, r)}
    finished = r.meta.get("finished", time.time())
    report = {"gpu_check": {"dry": r.meta.get("dry"), "layout": r.meta.get("layout"), "host": r.meta.get("host"),
                            "multinorm": r.meta.get("version"),
                            "gpu": r.meta.get("gpu_name"), "only": r.meta.get("only") or None,
                            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.meta.get("started", 0))),
                            "wall_s": finished - r.meta.get("started", finished), "budget_s": r.meta.get("budget_s"),
                            "stopped": r.meta.get("stopped") or None},
              "ok": not r.meta.get("stopped") and not any(s["status"] == "failed" for s in sections.values()),
              "sections": sections, "steps": r.steps}
    return report


# ---- Markdown ----------------------------------------------------------------------------------------
def fmt(x, digits=3):
    if x is None:
        return "—"
    if isinstance(x, float):
        if x == 0 or not math.isfinite(x):
            return str(x)
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"
    return str(x)


def pct(x):
    return "—" if x is None else f"{100 * x:.1f}%"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in row) + " |" for row in rows]
    return lines


def markdown(rep):
    g, s = rep["gpu_check"], rep["sections"]
    md = [f"# gpu_check: {'ok' if rep['ok'] else 'FAILED'}", "",
          f"{g['multinorm'] or 'multinorm'}; {g['started']}, {g['wall_s']:.0f} s of a {g['budget_s']} s budget; host {g['host']}, GPU {g['gpu'] or '—'}, "
          f"{g['layout']} layout{', DRY RUN (the emulated plugin, PyTorch on the CPU, tiny shapes: no figure here is a GPU' + chr(39) + 's)' if g['dry'] else ''}"
          f"{', only ' + g['only'] if g['only'] else ''}.", ""]
    if g.get("stopped"):
        md += [f"**Stopped early: {g['stopped']}.** The sections after the environment did not run.", ""]
    md += ["## Sections", ""]
    md += table(["section", "status", "why"], [[k, v.get("status"), v.get("reason", "")] for k, v in s.items()])
    st = s["step_vs_torch"]
    md += ["", "## Training step against PyTorch (same GPU, same model and micro-batch)", "",
           f"{st.get('flops', '—')}; peak {fmt(st.get('peak_tflops'))} TFLOP/s ({st.get('peak_source', '—')}). "
           "Forward and backward of one micro-batch, no optimizer update (its MFU is not the doctor's below); "
           "ours replayed from CUDA graphs, as the trainer runs it.", ""]
    md += table(["model", "B x T", "ours tokens/s", "ours MFU (fwd+bwd, no optimizer)", "PyTorch eager (SDPA) tokens/s", "MFU (no optimizer)",
                 "ours / eager", "torch.compile (per block) tokens/s", "MFU (no optimizer)", "ours / compile"],
                [[x.get("model"), f"{x.get('batch')} x {x.get('seq')}", fmt(x.get("ours_tokens_per_s")), pct(x.get("ours_mfu")),
                  fmt(x.get("torch_eager_tokens_per_s")), pct(x.get("torch_eager_mfu")), fmt(x.get("ratio_to_torch_eager")),
                  fmt(x.get("torch_compile_tokens_per_s")) if "torch_compile_tokens_per_s" in x else "failed: " + str(x.get("torch_compile_error", "—"))[:120],
                  pct(x.get("torch_compile_mfu")), fmt(x.get("ratio_to_torch_compile"))] for x in st.get("rows", [])])
    at = s["attention"]
    md += ["", "## Attention against scaled_dot_product_attention (TFLOP/s)", "", at.get("flops", "—") + ". "
           "SDPA: the kernel PyTorch picks (named); FA2 and cuDNN: that kernel forced.", ""]
    md += table(["B x H x T x D", "ours fwd", "SDPA fwd", "ours / SDPA", "ours fwd+bwd", "SDPA fwd+bwd", "ours / SDPA", "SDPA picked",
                 "FA2 fwd+bwd", "ours / FA2", "cuDNN fwd+bwd", "ours / cuDNN"],
                [[f"{x.get('batch')} x {x.get('heads')} x {x.get('seq')} x {x.get('head_dim')}", fmt(x.get("ours_forward_tflops")),
                  fmt(x.get("torch_forward_tflops")), fmt(x.get("ratio_forward_to_torch")), fmt(x.get("ours_forward_backward_tflops")),
                  fmt(x.get("torch_forward_backward_tflops")), fmt(x.get("ratio_forward_backward_to_torch")), x.get("torch_sdpa_backend", "—"),
                  fmt(x.get("flash_forward_backward_tflops")) if "flash_error" not in x else "n/a: " + str(x["flash_error"])[:80],
                  fmt(x.get("ratio_forward_backward_to_flash")),
                  fmt(x.get("cudnn_forward_backward_tflops")) if "cudnn_error" not in x else "n/a: " + str(x["cudnn_error"])[:80],
                  fmt(x.get("ratio_forward_backward_to_cudnn"))] for x in at.get("rows", [])])
    gm = s["gemm"]
    md += ["", "## llama_1b's GEMMs alone (`bench gemm`, 32 x 256; 'aligned': M, N, K rounded up to 64)", "",
           f"status {gm.get('status')}{': ' + gm['reason'] if gm.get('reason') else ''}."]
    if gm.get("reference") and gm.get("total"):
        ref, tot = gm["reference"], gm["total"]
        md += ["", f"Reference {ref['m']}^3: {fmt(ref['tflops'])} TFLOP/s. A micro-batch's GEMMs: {fmt(1e3 * tot['seconds'])} ms, "
                   f"{fmt(tot['tflops'])} TFLOP/s ({pct(tot['of_reference'])} of the reference); aligned: {fmt(1e3 * tot['aligned_seconds'])} ms.", ""]
        md += table(["product", "count", "M x N x K", "ops", "ms", "TFLOP/s", "of ref", "aligned ms", "aligned TFLOP/s", "ms a micro-batch"],
                    [[x["product"], x["count"], f"{x['m']} x {x['n']} x {x['k']}", x["ops"], fmt(1e3 * x["seconds"]), fmt(x["tflops"]),
                      pct(x["of_reference"]), fmt(1e3 * x["aligned"]["seconds"]), fmt(x["aligned"]["tflops"]), fmt(1e3 * x["seconds"] * x["count"])]
                     for x in gm.get("rows", [])])
    md += doctor_markdown(s["doctor"])
    h = s["hf_logits"]
    md += ["", "## Exported llama_60m loaded by transformers", "", f"status {h.get('status')}{': ' + h['reason'] if h.get('reason') else ''}."]
    fallback = h.get("fallback") if isinstance(h.get("fallback"), dict) else {}
    for label, d in (("transformers", h), ("fallback (" + str(fallback.get("against", "")) + ")", fallback)):
        if d and all(finite(d.get(k)) for k in ("relative_error", "bound", "max_abs_error", "max_abs_logit", "argmax_agreement")):
            md += ["", f"{label}: {d.get('tokens', h.get('tokens'))} tokens, relative error {d['relative_error']:.3e} (bound {d['bound']:g}), "
                       f"max abs error {d['max_abs_error']:.3e} of logits up to {d['max_abs_logit']:.3g}, argmax agreement {pct(d['argmax_agreement'])}."]
    t = s["tests"]
    md += ["", "## CUDA tests", "", f"status {t.get('status')}: {t.get('passed', '—')} passed, {t.get('failed', '—')} failed, "
                                     f"{t.get('skipped', '—')} skipped of {t.get('tests', '—')}{'; failing: ' + ', '.join(t['failing']) if t.get('failing') else ''}"
                                     f"{'; crashed the binary: ' + ', '.join(t['crashed']) if t.get('crashed') else ''} "
                                     f"(counted from {t.get('counted_from', '—')})."]
    op = s["optimizers"]
    md += ["", "## One optimizer update of the whole model (`bench optim --backend cuda`, the best of its rounds)", "",
           f"status {op.get('status')}{': ' + op['reason'] if op.get('reason') else ''}.", ""]
    ms = lambda x: "—" if x is None else f"{1e3 * x:.3g}"
    md += table(["model", "SinkGD ms", "SWAN ms", "SWAN, FP32 products, ms", "Adam ms", "SWAN / SinkGD", "SinkGD / Adam", "SinkGD GB/s", "Adam GB/s",
                 "copy GB/s"],
                [[x.get("model"), ms(x.get("sinkgd_step_s")), ms(x.get("swan_step_s")), ms(x.get("swan_fp32_step_s")), ms(x.get("adam_step_s")),
                  fmt(x.get("swan_over_sinkgd")),
                  fmt(x.get("sinkgd_over_adam")), fmt(x.get("sinkgd_gb_s")), fmt(x.get("adam_gb_s")), fmt(x.get("copy_gb_s"))]
                 for x in op.get("rows", [])])
    for x in op.get("rows", []):
        if x.get("swan_profile"):
            md += ["", f"SWAN's step at {x.get('model')} ({x['slot']}), eager, each kernel by CUDA events, beside its roofline:", ""]
            md += table(["kernel", "launches", "ms", "predicted ms", "predicted launches"],
                        [[k.get("name"), k.get("launches"), fmt(k.get("ms")), fmt(k.get("predicted_ms")), k.get("predicted_launches", "—")]
                         for k in x["swan_profile"]])
    tr = s["training"]
    md += ["", "## Training smoke (the quickstart on the GPU, twice per optimizer)", "",
           f"status {tr.get('status')}{': ' + tr['reason'] if tr.get('reason') else ''}.", ""]
    md += table(["optimizer", "updates", "two runs", "validation perplexity", "CPU backend's", "apart", "seconds a run", "tokens/s", "step ms",
                 "update graph"],
                [[x.get("optimizer"), fmt(x.get("updates")), "byte-identical" if x.get("identical") else "differ: " + ", ".join(x.get("differing") or []),
                  fmt(x.get("val_ppl"), 5), fmt(x.get("reference_ppl"), 5), pct(x.get("relative")), fmt(x.get("seconds")), fmt(x.get("tokens_per_s")),
                  ms(x.get("step_s")), update_graph(x.get("cuda_graphs"))]
                 for x in tr.get("runs", [])])
    md += ["", "## compute-sanitizer", "", f"status {s['sanitizer'].get('status')}{': ' + s['sanitizer']['reason'] if s['sanitizer'].get('reason') else ''}.", ""]
    md += table(["tool", "target", "status", "errors", "warnings", "why"],
                [[x["tool"], x["target"], x["status"], fmt(x.get("errors")), fmt(x.get("warnings")), x["reason"]] for x in s["sanitizer"].get("runs", [])])
    n = s["nccl"]
    md += ["", "## NCCL", "", f"status {n.get('status')}{': ' + n['reason'] if n.get('reason') else ''}."]
    if n.get("collectives"):
        md += [""] + table(["collective", "MB", "bus GB/s", "exact"],
                           [[c["name"], fmt((c["bytes"] or 0) / 1e6), fmt(c["bus_bandwidth_gbs"]), c["exact"]] for c in n["collectives"]])
    md += profile_markdown(s["profile"])
    md += ["", "## Steps", ""]
    md += table(["step", "section", "status", "seconds", "limit s", "why"],
                [[x["id"], x["section"], x["status"], f"{x['seconds']:.1f}", f"{x['limit_s']:.0f}", x["reason"]] for x in rep["steps"]])
    for x in rep["steps"]:
        if x["status"] == "failed":
            md += ["", f"### {x['id']}: output tail", "", "```", x.get("output_tail", "").rstrip()[-1500:], "```"]
    return "\n".join(md) + "\n"


def graphs_waited_speedup(step):
    """The eager step's time over the graphed one's with each update waited for at once (None when not measured)."""
    e, g = num(step, "step_seconds_eager"), num(step, "step_seconds_graphs_waited")
    return e / g if e and g else None


def timed_graphs(g):
    """The timed graphed steps' replays and captures: "5, 5 / 0, 0" (micro-batch, update)."""
    if not isinstance(g, dict):
        return "—"
    return (f"{g.get('micro_batch_replays', '?')}, {g.get('update_replays', '?')} / "
            f"{g.get('micro_batch_captures', '?')}, {g.get('update_captures', '?')}")


def doctor_markdown(d):
    md = ["", "## multinorm doctor", "", f"status {d.get('status')}{': ' + d['reason'] if d.get('reason') else ''}. "
          "Its MFU is of a whole training step as the trainer runs it (micro-batch B x T below, forward, backward and the "
          "optimizer update): not the step table's above (forward and backward of its micro-batch only).", ""]
    models = d.get("models", [])
    md += table(["model", "checks", "failed", "B x T", "tokens/s", "MFU (step with the update)", "graphs speed-up",
                 "graphs, update waited for: speed-up", "timed steps: replays / captures (micro-batch, update)",
                 "host waits / drains a step (trainer)", "eager waits / drains"],
                [[m.get("model"), m.get("checks"), m.get("failed"), f"{m.get('step', {}).get('batch', '—')} x {m.get('step', {}).get('seq', '—')}",
                  fmt(m.get("step", {}).get("tokens_per_s")), pct(m.get("step", {}).get("mfu")), fmt(m.get("step", {}).get("graph_speedup")),
                  fmt(graphs_waited_speedup(m.get("step", {}))), timed_graphs(m.get("step", {}).get("graphs_in_timed_steps")),
                  f"{m.get('step', {}).get('host_waits_per_step', '—')} / {m.get('step', {}).get('host_drains_per_step', '—')}",
                  f"{m.get('step', {}).get('host_waits_per_step_eager', '—')} / {m.get('step', {}).get('host_drains_per_step_eager', '—')}"]
                 for m in models])
    for m in models:
        for w in m.get("step", {}).get("warnings", []):
            md += ["", f"- {m['model']}: warning: {w}"]
    for m in models:
        for c in m.get("failing", []):
            md += ["", f"- FAILED {m['model']} {c['section']} {c['name']} ({c['dtype']}): error {fmt(c['error'])} (bound {fmt(c['bound'])}) {c['failure']}"]
        k = m.get("step", {}).get("kernels", [])
        if k:
            md += ["", f"{m['model']}: the slowest kernels of one step, measured and predicted ({m['step'].get('predicted_on', 'no roofline for this device')}):", ""]
            md += table(["kernel", "launches", "ms", "predicted ms", "measured / predicted"],
                        [[x["name"], x["launches"], fmt(x["ms"]), fmt(x.get("predicted_ms")), fmt(x.get("measured_over_predicted"))] for x in k[:15]])
    return md


def profile_markdown(p):
    md = ["", "## Nsight Compute (on request: --only profile)", "", f"status {p.get('status')}{': ' + p['reason'] if p.get('reason') else ''}."]
    for run, launches in (p.get("runs") or {}).items():
        if not launches:
            continue
        md += ["", f"{run}: one launch of each kernel and launch configuration ({len(launches)}); stalls in warps a cycle per issue:", ""]
        md += table(["kernel", "grid", "block", "us", "DRAM %", "memory %", "SM %", "occupancy % (achieved / theoretical)", "registers",
                     "waves / SM", "cycles / issue", "stalls (largest three)"],
                    [[x["kernel"], x.get("grid"), x.get("block"), fmt(x.get("duration_us")), fmt(x.get("dram_pct")), fmt(x.get("memory_pct")),
                      fmt(x.get("sm_pct")), f"{fmt(x.get('achieved_occupancy_pct'))} / {fmt(x.get('theoretical_occupancy_pct'))}",
                      fmt(x.get("registers")), fmt(x.get("waves_per_sm")), fmt(x.get("cycles_per_issue")),
                      ", ".join(f"{n} {v:.2g}" for n, v in x["stalls"][:3]) or "—"] for x in launches])
    return md


def clean(x):
    """NaN and infinities as null: the report stays strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x


def main():
    out = sys.argv[1]
    rep = clean(build(out))
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(rep, f, indent=1, allow_nan=False, default=str)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown(rep))
    for name, sec in rep["sections"].items():
        print(f"  {name:14s} {sec['status']}{': ' + sec['reason'] if sec.get('reason') else ''}")
    sys.exit(0 if rep["ok"] else 1)


if __name__ == "__main__":
    main()
