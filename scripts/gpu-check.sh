#!/usr/bin/env bash
# The one prepared command for a machine with a GPU (sized for one H200, < 8 minutes):
# builds the library, tests, kernel benchmark and decode-loop example with CUDA, runs the
# CUDA tests ([gpu]), bench/decode_kernel_bench.cu, then the decode loop on the device
# with dense verification. Writes OUT_DIR/gpu-check.log (everything printed)
# and OUT_DIR/gpu-check.json (test summary, benchmark results, timings).
# Usage: bash scripts/gpu-check.sh [OUT_DIR]   (default: $OUT, else build-gpu/gpu-check)
#   PAGEDKV_CUDA_ARCH (default 90) picks the architecture compiled (80 for A100).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-build-gpu/gpu-check}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu-check.log") 2>&1
start=$(date +%s)
build=${BUILD_DIR:-build-gpu}
arch=${PAGEDKV_CUDA_ARCH:-90}
step() { echo "== $* ($(( $(date +%s) - start )) s)"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true

# RelWithDebInfo, the build type CI checks warning-clean (GCC 12 -O3 raises false
# -Wmaybe-uninitialized errors elsewhere); device code is optimized by ptxas either way.
step "configure and build (sm_$arch)"
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
build_rc=0
timeout 330 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$out/configure.log" 2>&1 || build_rc=$?
tail -3 "$out/configure.log"
if [ $build_rc -eq 0 ]; then
  timeout 330 cmake --build "$build" --target pagedkv_tests decode_kernel_bench pagedkv-decode \
    -j"$(nproc)" 2>&1 | grep -Ev '^\[[0-9]+/[0-9]+\] (Building|Linking)'
  build_rc=${PIPESTATUS[0]}  # no `|| true` above: it would reset PIPESTATUS
fi
build_s=$(( $(date +%s) - start ))

step "CUDA tests"
tests_rc=1
tests_summary="not run"
if [ $build_rc -eq 0 ]; then
  timeout 150 "$build/tests/pagedkv_tests" "[gpu]" -d yes 2>&1 | tee "$out/tests.log" | \
    grep -Ev '^[0-9.]+ s: ' | tail -40
  tests_rc=${PIPESTATUS[0]}
  grep -E '^[0-9.]+ s: ' "$out/tests.log" || true
  tests_summary=$(grep -E 'test cases|All tests passed' "$out/tests.log" | tail -1)
fi
tests_s=$(( $(date +%s) - start ))

step "kernel benchmark"
bench_rc=1
if [ $build_rc -eq 0 ]; then
  timeout 200 "$build/bench/decode_kernel_bench" --json="$out/decode_kernel_bench.json"
  bench_rc=$?
fi

step "decode loop on the device"
decode_rc=1
if [ $build_rc -eq 0 ]; then
  timeout 120 "$build/examples/decode_loop/pagedkv-decode" --device cuda --verify 4
  decode_rc=$?
fi
total_s=$(( $(date +%s) - start ))

bench_json=null
[ -s "$out/decode_kernel_bench.json" ] && bench_json=$(cat "$out/decode_kernel_bench.json")
summary_json=$(printf '%s' "$tests_summary" | sed 's/\\/\\\\/g; s/"/\\"/g')
cat > "$out/gpu-check.json" <<JSON
{"build_rc": $build_rc, "build_s": $build_s,
 "tests_rc": $tests_rc, "tests_summary": "$summary_json", "tests_s": $(( tests_s - build_s )),
 "bench_rc": $bench_rc, "decode_loop_rc": $decode_rc, "total_s": $total_s,
 "bench": $bench_json}
JSON
step "done: build rc $build_rc, tests rc $tests_rc ($tests_summary), bench rc $bench_rc, decode loop rc $decode_rc"
echo "wrote $out/gpu-check.log and $out/gpu-check.json"
[ $build_rc -eq 0 ] && [ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ $decode_rc -eq 0 ]
