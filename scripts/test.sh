#!/usr/bin/env bash
# Sets up and runs every test: installs the dependencies, configures, builds, runs CTest.
# Usage: bash scripts/test.sh [extra cmake -D options]
#   BUILD_DIR (default build) picks the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${BUILD_DIR:-build}
bash scripts/python-venv.sh "$build/.venv-events" ||
  echo "test.sh: no Python venv (offline?): the KV event tests will be skipped" >&2
cmake -S . -B "$build" -G Ninja "$@"
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
