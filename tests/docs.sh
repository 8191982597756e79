#!/usr/bin/env bash
# The documentation's commands and links are true: every command in a code block of README.md or
# docs/*.md that runs multinorm (directly, or after mpirun/srun/env/time or VAR=value assignments)
# parses — subcommand, flags and values, checked by the binary itself in parse-only mode
# (MULTINORM_PARSE_ONLY=1), without running the job — and every relative link resolves to a file.
# Every command's --help (the top level's and each subcommand's) ends with an example line, which
# parses too. A planted page with a wrong flag and a broken link proves the checks fire.
# Usage: docs.sh <multinorm binary> <source root>
set -uo pipefail
bin=$1 root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/planted/docs"
cat >"$tmp/planted/README.md" <<'EOF'
See [the guide](docs/missing.md).
```bash
multinorm train --config a.json --no-such-flag
```
EOF
python3 - "$bin" "$root" "$tmp/planted" <<'EOF'
import glob, os, re, shlex, subprocess, sys
binary, root, planted = sys.argv[1:4]
LAUNCHERS = {"mpirun", "mpiexec", "srun", "env", "time", "nohup", "timeout"}
ENV = dict(os.environ, MULTINORM_PARSE_ONLY="1")

def pages(top):
    return [os.path.join(top, "README.md")] + sorted(glob.glob(os.path.join(top, "docs", "*.md")))

def commands(text):
    """(line number, argv after multinorm) of every multinorm command in the page's code blocks."""
    out, in_block, pending, start = [], False, "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        line = re.sub(r"^\s*\$ ", "", line)
        if not pending:
            start = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full, pending = pending + line, ""
        try:
            tokens = shlex.split(full, comments=True)
        except ValueError:
            continue
        for op in ("|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "&"):
            if op in tokens:
                tokens = tokens[:tokens.index(op)]
        idx = next((i for i, t in enumerate(tokens) if os.path.basename(t) == "multinorm"), None)
        if idx is None:
            continue
        before = tokens[:idx]
        launched = before and os.path.basename(before[0]) in LAUNCHERS
        if before and not launched and not all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", t) for t in before):
            continue  # not a command (an output line, a sentence)
        out.append((start, tokens[idx + 1:]))
    return out

def check(top):
    failures, count = [], 0
    for page in pages(top):
        if not os.path.exists(page):
            continue
        text = open(page, encoding="utf-8").read()
        rel = os.path.relpath(page, top)
        for n, args in commands(text):
            count += 1
            r = subprocess.run([binary] + args, env=ENV, capture_output=True, text=True)
            if r.returncode != 0:
                msg = (r.stderr or r.stdout).strip().splitlines()
                failures.append(f"{rel}:{n}: multinorm {' '.join(args)}: {msg[0] if msg else 'exit ' + str(r.returncode)}")
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if not os.path.exists(path):
                n = text[:m.start()].count("\n") + 1
                failures.append(f"{rel}:{n}: link to {target}: no such file")
    return failures, count

def subcommands(path):
    r = subprocess.run([binary] + path + ["--help"], capture_output=True, text=True)
    lines, subs, in_subs = r.stdout.splitlines(), [], False
    for line in lines:
        if line.startswith("Subcommands:"):
            in_subs = True
        elif in_subs and re.match(r"^  (\S+)\s", line):
            subs.append(re.match(r"^  (\S+)", line).group(1))
        elif in_subs and line.strip() == "":
            in_subs = False
    return [l for l in lines if l.strip()], subs

def check_help(path=[]):
    failures, count = [], 0
    lines, subs = subcommands(path)
    name = " ".join(["multinorm"] + path)
    last = lines[-1] if lines else ""
    if not last.startswith("Example: "):
        failures.append(f"{name} --help: the last line is not an example: {last!r}")
    else:
        tokens = shlex.split(last[len("Example: "):])
        idx = next((i for i, t in enumerate(tokens) if os.path.basename(t) == "multinorm"), None)
        r = subprocess.run([binary] + tokens[idx + 1:], env=ENV, capture_output=True, text=True) if idx is not None else None
        count += 1
        if r is None or r.returncode != 0:
            failures.append(f"{name} --help: its example does not parse: {last}")
    for s in subs:
        f, c = check_help(path + [s])
        failures += f
        count += c
    return failures, count

planted_failures, _ = check(planted)
status = 0
for what in ("--no-such-flag", "docs/missing.md"):
    if not any(what in f for f in planted_failures):
        print(f"docs: the planted page's {what} was not reported"); status = 1
failures, count = check(root)
help_failures, examples = check_help()
failures += help_failures
for f in failures:
    print("docs: " + f)
if failures:
    status = 1
print(f"docs: {count} multinorm commands parsed, links checked in {len(pages(root))} pages, {examples} help examples parsed" + (": FAIL" if status else ""))
sys.exit(status)
EOF
