#!/usr/bin/env bash
# Installs multinorm's build and test dependencies from Debian's packages. Idempotent: packages
# already present are skipped, and nothing is downloaded when nothing is missing.
#   bash scripts/install-deps.sh            # build + test dependencies
#   MULTINORM_DEPS_MINIMAL=1 bash ...       # skip the Python cross-check packages (torch, numpy)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libdnnl-dev                 # oneDNN: the CPU GEMM library (BF16 brgemm on AVX512_BF16)
  libomp-dev                  # OpenMP runtime headers (g++ uses libgomp; oneDNN's Debian build too)
  libsentencepiece-dev sentencepiece
  nlohmann-json3-dev libcli11-dev libgtest-dev
  libopenmpi-dev openmpi-bin  # optional at build time: data parallelism over MPI
  zlib1g-dev
  liblapack-dev               # dsyevd: SWAN's exact FP64 whitening path
  libboost-context-dev        # fibers of the emulated CUDA build (kernels run on the CPU in tests)
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (src/train/tensorboard_event.proto)
  patchelf                    # scripts/bundle.sh: RUNPATH $ORIGIN/../lib in the relocatable bundle
  universal-ctags             # scripts/function_lengths.sh (a test): every function's length
)
if [ -z "${MULTINORM_DEPS_MINIMAL:-}" ]; then
  packages+=(python3 python3-torch python3-numpy python3-matplotlib python3-sentencepiece python3-protobuf)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
