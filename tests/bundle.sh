#!/usr/bin/env bash
# The relocatable bundle (scripts/bundle.sh) from this build, unpacked into an empty directory: every
# library its files need resolves inside it (or is glibc's, or CUDA's, which the node provides), the
# binary runs from there (--version, info, a 2-update CPU training run, doctor on the emulated plugin),
# the bundled Open MPI launches two ranks, and gpu_check's smoke data and scripts are inside (a smoke
# file other than the one its reference names is refused).
# usage: bundle.sh <source dir> <build dir> <emulated plugin>
set -uo pipefail
src=$1 build=$2 plugin=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# gpu_check's smoke data: here the tests' tiny shards, with a reference naming their hashes.
mkdir -p "$tmp/smoke_src" && (cd "$tmp/smoke_src" && source "$src/tests/fixtures/tiny_shards.sh" && make_tiny_shards "$build/multinorm" &&
  mv shards tokens && mv tok.model tokenizer.model) || fail "the smoke's tiny shards"
python3 - "$tmp/smoke_src" "$tmp/smoke_reference.json" "$src/scripts/gpu_check" <<'PY' || fail "the smoke's reference"
import json, os, sys
d, out, here = sys.argv[1:]
sys.path.insert(0, here)
from smoke_hash import content_hash
names = ["tokens/c4-train.00000-of-00002.tok", "tokens/c4-validation.00000-of-00001.tok", "tokenizer.model"]
files = {n: content_hash(f"{d}/{n}") for n in names}
json.dump({"files": files, "sinkgd": {"val_ppl": 300.0}, "swan": {"val_ppl": 300.0}}, open(out, "w"))
# A shard made again from the same corpus differs in its header's input time and header CRC only: the
# same hash. A token changed is another.
shard = f"{d}/tokens/c4-validation.00000-of-00001.tok"
raw = bytearray(open(shard, "rb").read())
again = bytearray(raw); again[96:104] = (123456789).to_bytes(8, "little"); again[124:128] = b"\x01\x02\x03\x04"
changed = bytearray(raw); changed[130] ^= 1
for name, blob in (("again", again), ("changed", changed)):
    open(f"{shard}.{name}", "wb").write(blob)
assert content_hash(f"{shard}.again") == files["tokens/c4-validation.00000-of-00001.tok"], "a remade shard's time changed its hash"
assert content_hash(f"{shard}.changed") != files["tokens/c4-validation.00000-of-00001.tok"], "a changed token kept the hash"
for name in ("again", "changed"):
    os.remove(f"{shard}.{name}")
PY
export MULTINORM_SMOKE_DATA=$tmp/smoke_src MULTINORM_SMOKE_REFERENCE=$tmp/smoke_reference.json
# The kernels are checked by the emulation's racecheck in the op and model tests; here the command
# line is.
export MULTINORM_EMU_RACECHECK=0
# A smoke file that is not the one the reference was measured on is refused, named, before anything is built.
cp -r "$tmp/smoke_src" "$tmp/smoke_bad" && printf 'x' >> "$tmp/smoke_bad/tokenizer.model"
out=$(MULTINORM_SMOKE_DATA=$tmp/smoke_bad MULTINORM_BUNDLE_FROM=$build MULTINORM_BUNDLE_OUT=$tmp/bad bash "$src/scripts/bundle.sh" 2>&1) &&
  fail "a smoke file with other bytes was bundled"
grep -q "smoke_bad/tokenizer.model is not the file .* was measured on" <<<"$out" || fail "the refused smoke file was not named: $out"
[ ! -e "$tmp/bad" ] || fail "a refused bundle left $tmp/bad"

MULTINORM_BUNDLE_FROM=$build MULTINORM_BUNDLE_OUT=$tmp/dist MULTINORM_BUNDLE_XZ=-0 bash "$src/scripts/bundle.sh" || fail "bundle.sh"
tarball=$(ls "$tmp"/dist/multinorm-*-linux-x86_64.tar.xz) || fail "no tarball"
size=$(stat -c %s "$tarball")
[ "$size" -lt $((64 << 20)) ] || fail "the tarball is $size bytes (over 64 MB)"
mkdir "$tmp/node" && tar -C "$tmp/node" -xJf "$tarball" || fail "unpacking"
root=$(ls -d "$tmp"/node/multinorm-*)

# Every ELF file: its libraries resolve inside the bundle, or are the node's glibc or CUDA.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-)[.-]'
files=0
while IFS= read -r f; do
  head -c 4 "$f" | grep -q ELF || continue
  files=$((files + 1))
  readelf -d "$f" | grep -q 'RUNPATH.*\$ORIGIN' || fail "$f has no \$ORIGIN RUNPATH"
  while read -r soname arrow path rest; do
    [ "$arrow" = "=>" ] || continue
    if [[ $soname =~ $provided ]]; then continue; fi
    case "$path" in "$root"/*) ;; *) fail "$f: $soname resolves to $path, outside the bundle";; esac
  done < <(env -i ldd "$f" 2>&1)
done < <(find "$root" -type f)
[ "$files" -gt 40 ] || fail "only $files ELF files in the bundle"

# The glibc each file needs (its newest GLIBC_ symbol version), printed for every file. Ours need at
# most 2.34 (RHEL 9; Ubuntu 22.04 has 2.35); Debian 12's libstdc++ (arc4random), libgcc_s
# (_dl_find_object) and libevent (Open MPI's launcher: arc4random) need 2.35 and 2.36, which makes the
# bundle's floor 2.36: any other file above 2.34 fails, naming the symbols that pull it up.
# glibc_check ALLOWED_REGEX: prints the table; 1 and the reason when a file not allowed needs > 2.34.
glibc_check() {
  local f rel need symbols
  while IFS= read -r f; do
    head -c 4 "$f" | grep -q ELF || continue
    rel=${f#"$root"/}
    need=$(objdump -T "$f" 2>/dev/null | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sort -V | tail -1)
    printf '  %-12s %s\n' "${need:-none}" "$rel"
    [ -n "$need" ] && [ "$(printf '%s\n' "$need" GLIBC_2.34 | sort -V | tail -1)" != GLIBC_2.34 ] || continue
    symbols=$(objdump -T "$f" | awk '/GLIBC_2\.3[5-9]/ {print $NF}' | sort -u | tr '\n' ' ')
    [[ $rel =~ $1 ]] || { echo "$rel needs $need ($symbols): more than GLIBC_2.34"; return 1; }
    echo "               (Debian 12's build; $need for: $symbols)"
  done < <(find "$root" -type f | sort)
}
echo "bundle: the newest glibc symbol version each ELF file needs:"
glibc_check '^lib/(libstdc\+\+\.so\.6|libgcc_s\.so\.1|libevent_core-2\.1\.so\.7)$' || fail "a bundled file needs a newer glibc (above)"
# The check fires: with libstdc++ left out of the allowed files, it names libstdc++ and arc4random.
out=$(glibc_check '^lib/(libgcc_s\.so\.1|libevent_core-2\.1\.so\.7)$') && fail "the glibc check passed with libstdc++ not allowed"
grep -q "lib/libstdc++.so.6 needs GLIBC_2.36 (arc4random" <<<"$out" || fail "the planted glibc failure was not named: $(tail -1 <<<"$out")"

for f in share/multinorm/smoke/tokens/c4-train.00000-of-00002.tok share/multinorm/smoke/tokens/c4-validation.00000-of-00001.tok \
  share/multinorm/smoke/tokenizer.model scripts/gpu_check/smoke_reference.json scripts/gpu_check/training_smoke.sh scripts/gpu_check/run_gtests.py; do
  [ -s "$root/$f" ] || fail "the bundle lacks $f"
done

cd "$tmp"
out=$("$root/bin/multinorm" --version) && grep -q "^multinorm " <<<"$out" || fail "--version"
test -f "$root/share/multinorm/docs/training-on-c4.md" || fail "the bundle ships no docs (errors name docs/*.md)"
out=$("$root/bin/multinorm" info --config "$root/share/multinorm/configs/models/llama_60m.json") && grep -qE "total +58,073,600" <<<"$out" || fail "info"
source "$src/tests/fixtures/tiny_shards.sh"
make_tiny_shards "$root/bin/multinorm"
# The fixture's run, 2 updates of 4 sequences on the CPU.
"$root/bin/multinorm" config -c run.json --set batch.global_batch=4 --set batch.micro_batch=2 --set schedule.total_steps=2 \
  --set backend=cpu --set eval.every=2 --set eval.tokens=500 --set checkpoint.every=2 -o run.json
"$root/bin/multinorm" train -c run.json --set output_dir=runs/one --quiet > train.txt || { cat train.txt; fail "training from the bundle"; }
[ -d runs/one/checkpoints/step_00000002 ] || fail "no checkpoint after 2 updates"
# The bundled Open MPI: two ranks train, and every library and component the launcher and the ranks
# load comes from the bundle (the loader's log of each process, LD_DEBUG_OUTPUT).
mpirun_bin=${MULTINORM_TEST_MPIRUN:-$root/bin/mpirun}  # (another mpirun here proves the check fires)
LD_DEBUG=files LD_DEBUG_OUTPUT=$tmp/ld "$mpirun_bin" -np 2 --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -x LD_DEBUG -x LD_DEBUG_OUTPUT \
  "$root/bin/multinorm" train -c run.json --set output_dir=runs/two --quiet > mpi.txt 2>&1 || { cat mpi.txt; fail "mpirun -np 2 from the bundle"; }
[ -d runs/two/checkpoints/step_00000002 ] || { cat mpi.txt; fail "no checkpoint from the 2-rank run"; }
# bin/mpirun is the graceful launcher (scripts/mpirun_graceful.sh): the ranks' status, not mpirun's.
rc=0; "$root/bin/mpirun" -np 2 --oversubscribe --allow-run-as-root "$root/bin/multinorm" train -c run.json --set batch.micro_batch=3 > refused.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "not a multiple of batch.micro_batch" refused.txt || { cat refused.txt; fail "bin/mpirun: a refused config exited $rc, expected 2"; }
grace=$("$root/bin/mpirun" -np 1 --allow-run-as-root bash -c 'echo "$OMPI_MCA_odls_base_sigkill_timeout ${MULTINORM_STATUS_FILE:+status}"')
[ "$grace" = "60 status" ] || fail "bin/mpirun does not give the ranks scripts/mpirun_graceful.sh's grace and status file: '$grace'"
# (PMIx's optional plugins, pmix_mca_*, are the node's when it has them: scripts/bundle.sh)
loaded=$(cat "$tmp"/ld.* | grep -oE 'file=/[^ ]*(libmpi|libopen-(pal|rte)|libpmix|mca_)[^ ]*' | grep -v '/pmix_mca_' | sort -u)
[ "$(grep -c mca_ <<<"$loaded")" -gt 10 ] || fail "the ranks' loader logs show no Open MPI components: $loaded"
outside=$(grep -v "file=$root/" <<<"$loaded")
[ -z "$outside" ] || fail "Open MPI loaded from outside the bundle: $(head -3 <<<"$outside")"
# doctor from the bundle on the emulated plugin (the op checks; tests/doctor.sh runs the rest)
MULTINORM_CUDA_PLUGIN=$plugin "$root/bin/multinorm" doctor --model llama_tiny --batch 1 --seq 16 --only op --no-bench --report doctor.json > doctor.txt ||
  { tail -20 doctor.txt; fail "doctor from the bundle"; }
# The first GPU call ships with what it runs, and finds the bundle's binaries from there (its
# environment section only; tests/gpu_check.sh runs the rest).
for f in scripts/gpu_check.sh scripts/mpirun_graceful.sh scripts/slurm/train.sbatch scripts/slurm/sweep.sbatch scripts/gpu_check/report.py scripts/gpu_check/hf_logits.py bench/torch_llama.py bench/attention_sdpa.py; do
  test -f "$root/$f" || fail "the bundle lacks $f"
done
MULTINORM_CUDA_PLUGIN=$plugin bash "$root/scripts/gpu_check.sh" --dry --only environment "$tmp/gpu_check" > gpu_check.txt 2>&1 ||
  { tail -20 gpu_check.txt; fail "scripts/gpu_check.sh from the bundle"; }
/usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert r['gpu_check']['layout'] == 'bundle' and r['sections']['environment']['status'] == 'ok', r['gpu_check']" "$tmp/gpu_check/gpu_check.json" ||
  fail "scripts/gpu_check.sh from the bundle: not the bundle's layout, or its environment failed"
echo "bundle: $(basename "$tarball"), $((size >> 20)) MB, $files ELF files resolve inside it; runs, trains, mpirun -np 2, doctor, gpu_check.sh"
