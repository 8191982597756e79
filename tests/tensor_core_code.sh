#!/usr/bin/env bash
# The tensor-core attention kernels are tensor-core code on both targets: nvcc's PTX of
# kernels/cuda/attention_mma.cu for sm_80 and sm_90 has mma.sync m16n8k16 (BF16 -> FP32) and ldmatrix
# in every *_mma_kernel entry, and the nvcc build's ptxas report (build/ptxas/, written by
# scripts/nvcc_with_resources.sh) shows each of those entries for sm_80 and sm_90 with no spills.
# A planted PTX entry without mma.sync proves the entry check fires.
# Usage: tensor_core_code.sh <nvcc> <source root> <ptxas report dir>
set -euo pipefail
nvcc=$1 root=$2 reports=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for arch in 80 90; do
  "$nvcc" -std=c++17 -I"$root/include" -ptx -arch=sm_$arch "$root/kernels/cuda/attention_mma.cu" -o "$tmp/attention_mma.sm_$arch.ptx"
done
# a planted entry: an "_mma_kernel" with FMAs only
printf '.visible .entry planted_mma_kernel(\n)\n{\n\tfma.rn.f32 %%f1, %%f2, %%f3, %%f4;\n\tret;\n}\n' >"$tmp/planted.ptx"
python3 - "$tmp" "$reports/attention_mma.cu.o.ptxas" <<'EOF'
import re, sys
tmp, report = sys.argv[1], sys.argv[2]

def entries(text):  # name -> body of every kernel entry
    out = {}
    for m in re.finditer(r"\.entry\s+(\S+)\(", text):
        end = text.find("\n}\n", m.end())
        out[m.group(1)] = text[m.end():end]
    return out

def missing(text):  # the mma entries lacking an instruction they must have
    bad = []
    for name, body in entries(text).items():
        if "_mma_kernel" not in name:
            continue
        for need in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ldmatrix.sync.aligned.m8n8.x4"):
            if need not in body:
                bad.append(f"{name}: no {need}")
    return bad

status = 0
if not missing(open(f"{tmp}/planted.ptx").read()):
    print("tensor_core_code: the planted FMA-only entry passed the check"); status = 1
for arch in ("80", "90"):
    text = open(f"{tmp}/attention_mma.sm_{arch}.ptx").read()
    names = [n for n in entries(text) if "_mma_kernel" in n]
    if len(names) != 6:
        print(f"tensor_core_code: sm_{arch}: {len(names)} mma kernel entries, expected 6 (forward, dK/dV, dQ at D = 64, 128)"); status = 1
    for b in missing(text):
        print(f"tensor_core_code: sm_{arch}: {b}"); status = 1
    mmas = text.count("mma.sync.aligned.m16n8k16")
    print(f"tensor_core_code: sm_{arch}: {len(names)} entries, {mmas} mma.sync, {text.count('ldmatrix.sync')} ldmatrix")

lines = open(report).read().splitlines()
seen = set()
for i, line in enumerate(lines):
    m = re.search(r"Compiling entry function '(\S*_mma_kernel\S*)' for '(sm_\d+)'", line)
    if not m:
        continue
    seen.add((m.group(1), m.group(2)))
    spill = next((l for l in lines[i + 1:i + 4] if "spill" in l), "")
    regs = next((l for l in lines[i + 1:i + 4] if "registers" in l), "")
    if not re.search(r"\b0 bytes spill stores, 0 bytes spill loads", spill):
        print(f"tensor_core_code: {m.group(1)} {m.group(2)} spills: {spill.strip()}"); status = 1
    short = re.sub(r".*(attention_\w+?_mma_kernel)ILi(\d+).*", r"\1<\2>", m.group(1))
    print(f"tensor_core_code: {m.group(2)} {short}: {regs.strip()}")
for arch in ("sm_80", "sm_90"):
    n = sum(1 for _, a in seen if a == arch)
    if n != 6:
        print(f"tensor_core_code: the ptxas report has {n} mma kernel entries for {arch}, expected 6"); status = 1
print("tensor_core_code: " + ("FAIL" if status else "every mma kernel has mma.sync and ldmatrix on sm_80 and sm_90, and no spills"))
sys.exit(status)
EOF
