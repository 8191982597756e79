"""Runs a GoogleTest binary so that one crash hides nothing: when the process dies inside a test (a
signal, abort, an exit status other than 0 or 1), that test is recorded as crashed and the binary is
run again with every test already reported excluded, until the filter is exhausted. Standard library
only (it runs under any python3).

    python3 run_gtests.py --out RESULT.json [--env K=V ...] -- BINARY --gtest_filter=FILTER [args...]

Prints the binary's output as it comes. RESULT.json (rewritten after every round, so a step cut by its
time limit still leaves what ran):
    {"rounds": [{"filter": ..., "exit": N, "signal": S|null}], "tests": [{"name": ..., "result":
     "passed"|"failed"|"skipped"|"crashed", "ms": N|null}], "crashes": [{"test": ..., "exit": ...,
     "signal": ..., "tail": "the last lines before it"}], "complete": true|false}
Exits 0 when every test passed or skipped, 1 otherwise (a failure or a crash), 2 on a usage error.
"""
import json
import os
import re
import signal
import subprocess
import sys

RUN = re.compile(r"^\[ RUN      \] (\S+)")
DONE = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+?)(?:,| \(|$)")
MAX_ROUNDS = 40  # a binary that crashes in every test still ends


def run_round(argv, env, tests, by_name):
    """One run of the binary; returns (exit status, signal or None, the test it died in or None, tail)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace")
    current, tail = None, []
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail = (tail + [line.rstrip("\n")])[-30:]
        m = RUN.match(line)
        if m:
            current = m.group(1)
            continue
        m = DONE.match(line)
        if m and current is not None and m.group(2) == current:
            result = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[m.group(1)]
            ms = re.search(r"\((\d+) ms\)", line)
            entry = {"name": current, "result": result, "ms": int(ms.group(1)) if ms else None}
            tests.append(entry)
            by_name[current] = entry
            current = None
    rc = proc.wait()
    sig = -rc if rc < 0 else (rc - 128 if rc > 128 else None)
    return rc, sig, current, "\n".join(tail)


def main():
    args = sys.argv[1:]
    if "--" not in args:
        print(__doc__, file=sys.stderr)
        return 2
    own, argv = args[: args.index("--")], args[args.index("--") + 1:]
    out, env = None, dict(os.environ)
    i = 0
    while i < len(own):
        if own[i] == "--out" and i + 1 < len(own):
            out, i = own[i + 1], i + 2
        elif own[i] == "--env" and i + 1 < len(own) and "=" in own[i + 1]:
            k, v = own[i + 1].split("=", 1)
            env[k], i = v, i + 2
        else:
            print(f"run_gtests.py: unknown argument {own[i]}", file=sys.stderr)
            return 2
    if not out or not argv:
        print(__doc__, file=sys.stderr)
        return 2
    positive = "*"
    rest = []
    for a in argv[1:]:
        if a.startswith("--gtest_filter="):
            positive = a.split("=", 1)[1]
        else:
            rest.append(a)
    if "-" in positive:  # a filter with its own negative part: ours are added to it
        positive, negative = positive.split("-", 1)
        negative = [n for n in negative.split(":") if n]
    else:
        negative = []
    result = {"rounds": [], "tests": [], "crashes": [], "complete": False}
    by_name = {}

    def write():
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, out)

    # A scheduler's SIGTERM (the step's time limit): write what ran, then stop.
    def stopped(signum, _frame):
        write()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stopped)

    for _ in range(MAX_ROUNDS):
        filt = positive + ("-" + ":".join(negative + sorted(by_name)) if negative or by_name else "")
        rc, sig, crashed_in, tail = run_round([argv[0], "--gtest_filter=" + filt] + rest, env, result["tests"], by_name)
        result["rounds"].append({"filter": filt if len(filt) < 2000 else filt[:2000] + "...", "exit": rc, "signal": sig})
        if rc in (0, 1) and crashed_in is None:
            result["complete"] = True
            write()
            break
        if crashed_in is None:  # it died outside any test (start-up, tear-down): nothing to exclude
            result["crashes"].append({"test": None, "exit": rc, "signal": sig, "tail": tail})
            write()
            break
        entry = {"name": crashed_in, "result": "crashed", "ms": None}
        result["tests"].append(entry)
        by_name[crashed_in] = entry
        result["crashes"].append({"test": crashed_in, "exit": rc, "signal": sig, "tail": tail})
        print(f"run_gtests.py: {crashed_in} crashed (exit status {rc}); running the tests after it", flush=True)
        write()
    else:
        print(f"run_gtests.py: {MAX_ROUNDS} crashes: stopped", flush=True)
    write()
    bad = [t for t in result["tests"] if t["result"] in ("failed", "crashed")]
    return 1 if bad or not result["complete"] else 0


if __name__ == "__main__":
    sys.exit(main())
