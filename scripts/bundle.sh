#!/usr/bin/env bash
# A relocatable build for GPU nodes that lack this machine's packages (oneDNN, SentencePiece, LAPACK,
# Open MPI, ...): dist/multinorm-<version>-linux-x86_64.tar.xz with
#   bin/multinorm, bin/multinorm_tests, bin/mpirun (the bundled Open MPI's launcher, through
#     scripts/mpirun_graceful.sh: a scheduler's SIGTERM stops the ranks with their checkpoint)
#   lib/libmultinorm_cuda.so and every shared library these need except glibc's and CUDA's
#   openmpi/   Open MPI's launcher, daemon, components and help files (bin/mpirun sets OPAL_PREFIX)
#   share/multinorm/{configs,docs,README.md}, BUNDLE.txt (what is inside, what the node must provide)
#   scripts/slurm/*.sbatch: SLURM jobs (one run, a sweep) that requeue themselves after a stop
#   scripts/gpu_check.sh and scripts/gpu_check/, bench/*.py: a GPU node's verdicts and figures in one
#     call, and the PyTorch baselines it runs (docs/performance.md#a-gpu-node-in-one-call-scriptsgpu_checksh)
#   share/multinorm/smoke/: gpu_check's training smoke data, shards of the default corpus (train shard
#     0, validation shard 0) and its tokenizer, packed only when their SHA-256 are those
#     scripts/gpu_check/smoke_reference.json (the CPU backend's perplexities on them) names
# Every ELF file finds its libraries through RUNPATH ($ORIGIN/../lib). Not bundled: the CUDA driver,
# cuBLASLt and NCCL (hundreds of MB; every GPU node has them): the binary finds them at run time in
# LD_LIBRARY_PATH, the CUDA toolkit (/usr/local/cuda*/lib64, $CUDA_HOME) or a Python environment's
# nvidia/*/lib, and `multinorm doctor` says which it loaded (docs/gpu-nodes.md).
#
#   bash scripts/bundle.sh                  portable build (-march=x86-64-v3) in build-bundle/, then pack
#   MULTINORM_BUNDLE_FROM=build bash ...    pack an existing build (its -march is the build's)
#   MULTINORM_BUNDLE_OUT=dir                where the tarball goes (default dist/)
#   MULTINORM_BUNDLE_XZ=-1                  xz level (default -6)
#   MULTINORM_SMOKE_DATA=dir                the smoke's data (default data/default: scripts/quickstart.sh's)
#   MULTINORM_SMOKE_REFERENCE=file          its reference (default scripts/gpu_check/smoke_reference.json)
#   MULTINORM_BUNDLE_SMOKE=off              no smoke data (gpu_check then skips its training section)
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$(pwd)
version=$(sed -n 's/^project(multinorm VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
name="multinorm-${version}-linux-x86_64"
out=${MULTINORM_BUNDLE_OUT:-$root_dir/dist}
build=${MULTINORM_BUNDLE_FROM:-}
for tool in patchelf ldd readelf xz; do
  command -v $tool >/dev/null || { echo "bundle: $tool is missing (bash scripts/install-deps.sh installs it)" >&2; exit 1; }
done

# The training smoke's data, checked before anything is built: the files the reference names, with
# its hashes (a corpus built elsewhere, or a newer tokenizer, would make the comparison meaningless).
smoke_data=${MULTINORM_SMOKE_DATA:-$root_dir/data/default}
smoke_reference=${MULTINORM_SMOKE_REFERENCE:-$root_dir/scripts/gpu_check/smoke_reference.json}
if [ "${MULTINORM_BUNDLE_SMOKE:-on}" != off ]; then
  python3 - "$smoke_data" "$smoke_reference" "$root_dir/scripts/gpu_check" <<'PY' || exit 1
import json, os, sys
data, ref_path, here = sys.argv[1:]
sys.path.insert(0, here)
from smoke_hash import content_hash  # a shard's hash leaves out the corpus files' times
fix = ("make it with bash scripts/quickstart.sh (data/default), remeasure the reference with bash "
       "scripts/gpu_check/smoke_reference.sh (about 25 minutes on 2 cores), or bundle without the smoke: MULTINORM_BUNDLE_SMOKE=off")
try:
    ref = json.load(open(ref_path))
    files = ref["files"]
except (OSError, ValueError, KeyError) as e:
    sys.exit(f"bundle: the smoke's reference {ref_path}: {e}")
for name, want in sorted(files.items()):
    p = os.path.join(data, name)
    if not os.path.isfile(p):
        sys.exit(f"bundle: the training smoke's data: {p} is missing; {fix}")
    got = content_hash(p)
    if got != want:
        sys.exit(f"bundle: the training smoke's data: {p} is not the file {ref_path} was measured on "
                 f"(SHA-256 of its content {got[:16]}..., expected {want[:16]}...); {fix}")
PY
fi

if [ -z "$build" ]; then
  build=build-bundle
  # x86-64-v3 (AVX2, FMA): every GPU node's CPU of the last decade; the AVX-512 and AMX paths are
  # chosen at run time where the CPU has them.
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMULTINORM_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target multinorm multinorm_tests
fi
build=$(cd "$build" && pwd)
[ -x "$build/multinorm" ] || { echo "bundle: no multinorm binary in $build" >&2; exit 1; }

stage_parent=$(mktemp -d)
trap 'rm -rf "$stage_parent"' EXIT
stage="$stage_parent/$name"
mkdir -p "$stage/bin" "$stage/lib" "$stage/share/multinorm"
cp "$build/multinorm" "$build/multinorm_tests" "$stage/bin/"
[ -f "$build/libmultinorm_cuda.so" ] && cp "$build/libmultinorm_cuda.so" "$stage/lib/"
cp -r configs "$stage/share/multinorm/configs"
cp -r docs README.md "$stage/share/multinorm/"  # the docs errors and help name
# The first GPU call (scripts/gpu_check.sh) and what it runs, at the paths they have in the source tree.
mkdir -p "$stage/scripts/gpu_check" "$stage/bench"
cp scripts/gpu_check.sh scripts/mpirun_graceful.sh "$stage/scripts/"
mkdir -p "$stage/scripts/slurm" && cp scripts/slurm/*.sbatch "$stage/scripts/slurm/"
cp scripts/gpu_check/*.py scripts/gpu_check/training_smoke.sh "$stage/scripts/gpu_check/"
cp bench/*.py "$stage/bench/"
if [ "${MULTINORM_BUNDLE_SMOKE:-on}" != off ]; then
  cp "$smoke_reference" "$stage/scripts/gpu_check/smoke_reference.json"
  for smoke_file in $(python3 -c 'import json, sys; print(" ".join(sorted(json.load(open(sys.argv[1]))["files"])))' "$smoke_reference"); do
    mkdir -p "$(dirname "$stage/share/multinorm/smoke/$smoke_file")"
    cp "$smoke_data/$smoke_file" "$stage/share/multinorm/smoke/$smoke_file"
  done
fi

# What the node provides: glibc (the loader's own libraries) and CUDA (driver, runtime, cuBLAS, NCCL).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-)[.-]'

# Open MPI: the launcher (orterun), the daemon, the components and the help files, under openmpi/ as
# their prefix; OPAL_PREFIX relocates every path Open MPI derives from it.
components_rel=""
if readelf -d "$build/multinorm" | grep -q 'libmpi\.so' && command -v ompi_info >/dev/null; then
  prefix=$(ompi_info --path prefix --parsable | sed -n 's/^path:prefix://p')
  pkglibdir=$(ompi_info --path pkglibdir --parsable | sed -n 's/^path:pkglibdir://p')
  pkgdatadir=$(ompi_info --path pkgdatadir --parsable | sed -n 's/^path:pkgdatadir://p')
  bindir=$(ompi_info --path bindir --parsable | sed -n 's/^path:bindir://p')
  components_rel=${pkglibdir#"$prefix"/}
  mkdir -p "$stage/openmpi/bin" "$stage/openmpi/$components_rel" "$stage/openmpi/${pkgdatadir#"$prefix"/}"
  cp "$bindir/orterun" "$bindir/orted" "$stage/openmpi/bin/"
  ln -s orterun "$stage/openmpi/bin/mpirun"
  cp -r "$pkgdatadir/." "$stage/openmpi/${pkgdatadir#"$prefix"/}/"
  for c in "$pkglibdir"/*.so; do
    # a component whose own libraries this machine lacks would not load here either
    if ! ldd "$c" | grep -q 'not found'; then cp "$c" "$stage/openmpi/$components_rel/"; fi
  done
  # (libpmix, Open MPI's process-management library, is bundled; its three optional plugins
  # (compression, Slurm resource manager) are not: it runs without them, tested.)
  cat >"$stage/bin/mpirun" <<'SH'
#!/usr/bin/env bash
# The bundled Open MPI's mpirun, relocated (Open MPI finds its components and help files under
# OPAL_PREFIX), through scripts/mpirun_graceful.sh: SIGTERM to it, or to every process of the job,
# stops the ranks after their update with a checkpoint (exit 75). The cluster's own MPI: BUNDLE.txt.
here=$(cd "$(dirname "$0")/.." && pwd)
export OPAL_PREFIX="$here/openmpi"
export PATH="$here/bin:$here/openmpi/bin:$PATH"
MULTINORM_MPIRUN="$here/openmpi/bin/orterun" exec bash "$here/scripts/mpirun_graceful.sh" "$@"
SH
  chmod +x "$stage/bin/mpirun"
fi

# Every library any ELF file in the stage needs (ldd lists the whole closure), but the provided ones.
elves=$(find "$stage" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print)
for f in $elves; do
  ldd "$f" 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if [[ $soname =~ $provided ]]; then continue; fi
  [ -e "$stage/lib/$soname" ] || cp -L "$path" "$stage/lib/$soname"
done

# RUNPATH: each file finds the bundle's lib/ relative to itself.
for f in $(find "$stage" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print); do
  dir=$(dirname "${f#"$stage"/}")
  up=$(echo "$dir" | awk -F/ '{s=""; for (i = 1; i <= NF; ++i) s = s "../"; print s}')
  chmod u+w "$f"
  patchelf --set-rpath "\$ORIGIN/${up}lib" "$f"
done
for f in "$stage"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done

# The newest glibc symbol version anything needs: the oldest glibc a node may have.
glibc=$(for f in $(find "$stage" -type f -name '*' -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print); do
  readelf -V "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'
done | sort -t. -k2,2n -k3,3n -u | tail -1)
cuda_version=""
[ -f "$stage/lib/libmultinorm_cuda.so" ] && cuda_version=$(readelf -d "$stage/lib/libmultinorm_cuda.so" | grep -o 'libcublasLt\.so\.[0-9]*' | head -1)
commit=$(git -C "$root_dir" rev-parse --short HEAD 2>/dev/null || echo unknown)
{
  echo "multinorm $version ($commit), built $(date -u +%Y-%m-%d) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo
  echo "The node must provide:"
  echo "  glibc >= ${glibc#GLIBC_} (the newest symbol version any file here uses)"
  if [ -n "$cuda_version" ]; then
    echo "  for the CUDA backend: an NVIDIA driver for CUDA $(readelf -d "$stage/lib/libmultinorm_cuda.so" | grep -o 'libcublasLt\.so\.[0-9]*' | head -1 | sed 's/.*\.//') (R580 or newer for CUDA 13),"
    echo "  ${cuda_version} and libnccl.so.2, found in LD_LIBRARY_PATH, \$CUDA_HOME/lib64,"
    echo "  /usr/local/cuda*/lib64 or a Python environment's site-packages/nvidia/*/lib"
  fi
  echo
  echo "Check the node:        bin/multinorm doctor"
  echo "Every figure at once:  bash scripts/gpu_check.sh OUT_DIR   (8 minutes at most; JSON and Markdown reports)"
  echo "Data parallel (bundled Open MPI, one node): bin/mpirun -np 8 bin/multinorm train -c CONFIG"
  echo "With the cluster's own Open MPI 4.x: put its lib directory first in LD_LIBRARY_PATH (it then"
  echo "  wins over the bundled copy) and launch with scripts/mpirun_graceful.sh (MULTINORM_MPIRUN=its"
  echo "  mpirun) or srun. Another MPI (MPICH, Intel MPI)"
  echo "  is not ABI-compatible: build from source against it."
  echo
  echo "Bundled libraries:"
  (cd "$stage/lib" && ls -1 | sed 's/^/  /')
} >"$stage/BUNDLE.txt"

mkdir -p "$out"
tarball="$out/$name.tar.xz"
tar -C "$stage_parent" -cf - "$name" | xz ${MULTINORM_BUNDLE_XZ:--6} -T0 >"$tarball"
echo "bundle: $tarball ($(du -h "$tarball" | cut -f1); needs ${glibc:-glibc})"
