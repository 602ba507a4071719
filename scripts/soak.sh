#!/usr/bin/env bash
# Soak: builds pagedkv-soak (Release, no CUDA) and runs the property driver on every core
# for SECONDS: every operation compared with the reference model, the KV data flow checked
# after every step, check_invariants() every 64 operations (tests/soak_main.cc). Prints the
# operations checked and the failures; exits 1 on a failure, with the seed and run that
# replay it.
# Usage: scripts/soak.sh SECONDS [SEED]   (BUILD_DIR, default build-soak; THREADS, default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: scripts/soak.sh SECONDS [SEED]" >&2
  exit 2
fi
seconds=$1
build=${BUILD_DIR:-build-soak}
threads=${THREADS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPAGEDKV_ENABLE_CUDA=OFF \
  -DPAGEDKV_BUILD_BENCH=OFF -DPAGEDKV_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" --target pagedkv-soak -j "$(nproc)" >/dev/null
args=("$seconds" --threads "$threads")
[ $# -eq 2 ] && args+=(--seed "$2")
exec "$build/tests/pagedkv-soak" "${args[@]}"
