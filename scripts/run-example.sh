#!/usr/bin/env bash
# Sets up and runs the main job: installs the dependencies, builds the example decode loop
# (CUDA kernels too when nvcc exists) and runs it with its defaults.
# Usage: bash scripts/run-example.sh [decode loop flags, e.g. --device cpu --requests 16]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target pagedkv-decode
exec "$build/examples/decode_loop/pagedkv-decode" "$@"
