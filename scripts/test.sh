#!/usr/bin/env bash
# The whole test suite on a fresh machine: install dependencies, build, run every test (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# One test at a time: every test uses all cores (OpenMP), and two at once oversubscribe them.
ctest --test-dir "${MULTINORM_BUILD_DIR:-build}" --output-on-failure
