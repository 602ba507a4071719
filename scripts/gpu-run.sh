#!/usr/bin/env bash
# The GPU check, run on a machine with a GPU over a bundle from scripts/gpu-bundle.sh
# (one run, about 8 minutes on an H200), from the repository root:
#   1. the [gpu] tests: the CUDA half of every backend test case (kernels against the CPU
#      and fp64 references: write_kv, GQA decode and extend, windowed (sliding window,
#      chunked local), sinks, MLA decode, argument errors; storage copies), and the
#      CUDA-only ones (caller workspace, graphs);
#   2. compute-sanitizer memcheck, racecheck and initcheck on the [sanitize][gpu] tests
#      (every kernel variant on small shapes, the windowed, sink and MLA ones included);
#   3. PyTorch SDPA on contiguous KV (bench/sdpa_contiguous.py: GQA, and MLA as a
#      single-KV-head MQA over the latent), then the kernel benchmark (gqa, window and mla
#      grids) with that baseline beside every figure;
#   4. the decode loop on the device (the llama preset, the hybrid swa preset on the
#      windowed kernels, and MLA with 512 + 64 latents: the CUDA MLA kernel takes those
#      dims only, so the CPU CTests' 64 + 16 preset cannot run there), and the
#      verification matrix when present (scripts/decode-verify-matrix.sh).
# Writes OUT_DIR/gpu-run.log (everything printed) and OUT_DIR/gpu-run.json (exit codes,
# summaries, every benchmark row). Exits non-zero when a step failed.
# Usage: bash scripts/gpu-run.sh [BUNDLE_DIR] [OUT_DIR]
#   defaults: build-gpu/bundle and $OUT, else build-gpu/gpu-run.
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=$(cd "${1:-build-gpu/bundle}" && pwd)
out=${2:-${OUT:-build-gpu/gpu-run}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu-run.log") 2>&1
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=$bundle/bin
start=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - start )) s)"; }
json_string() { printf '"%s"' "$(printf '%s' "$1" | tr '\n' ' ' | sed 's/\\/\\\\/g; s/"/\\"/g')"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true

step "CUDA tests"
timeout 240 "$bin/pagedkv_tests" "[gpu]" -d yes > "$out/tests.log" 2>&1
tests_rc=$?
grep -Ev '^[0-9.]+ s: ' "$out/tests.log" | tail -25
grep -E '^[0-9.]+ s: ' "$out/tests.log"
tests_summary=$(grep -E 'test cases|All tests passed' "$out/tests.log" | tail -1)

sanitizer_json=""
sanitizers_rc=0
if command -v compute-sanitizer > /dev/null; then
  for tool in memcheck racecheck initcheck; do
    step "compute-sanitizer $tool"
    timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$bin/pagedkv_tests" "[sanitize][gpu]" > "$out/sanitizer-$tool.log" 2>&1
    rc=$?
    tail -3 "$out/sanitizer-$tool.log"
    [ $rc -eq 0 ] || sanitizers_rc=1
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool.log" | tail -1)
    sanitizer_json+="\"$tool\": {\"rc\": $rc, \"summary\": $(json_string "$summary")}, "
  done
else
  echo "compute-sanitizer not found"
  sanitizers_rc=1
fi

step "PyTorch SDPA on contiguous KV"
timeout 180 python3 bench/sdpa_contiguous.py --out "$out/sdpa_contiguous.txt" \
  --mla-out "$out/sdpa_mla.txt"
sdpa_rc=$?

step "kernel benchmark"
timeout 240 "$bin/decode_kernel_bench" --json="$out/decode_kernel_bench.json" \
  --sdpa="$out/sdpa_contiguous.txt" --sdpa_mla="$out/sdpa_mla.txt"
bench_rc=$?

step "decode loop on the device"
timeout 60 "$bin/pagedkv-decode" --device cuda --verify 4
decode_rc=$?
step "decode loop on the device: hybrid model (swa, windowed layer groups)"
timeout 90 "$bin/pagedkv-decode" --device cuda --model swa --kv-dtype bf16 --verify 8
swa_rc=$?
step "decode loop on the device: MLA (512 + 64 latents, absorbed; CUDA needs 16-bit q)"
timeout 120 "$bin/pagedkv-decode" --device cuda --model mla --kv-lora-rank 512 --qk-rope-dim 64 \
  --kv-dtype bf16 --verify 8
mla_rc=$?
matrix_rc=null
if [ -f scripts/decode-verify-matrix.sh ]; then
  step "decode-loop verification matrix"
  timeout 150 bash scripts/decode-verify-matrix.sh "$bin/pagedkv-decode" --device cuda
  matrix_rc=$?
fi
total_s=$(( $(date +%s) - start ))

bench_json=null
[ -s "$out/decode_kernel_bench.json" ] && bench_json=$(cat "$out/decode_kernel_bench.json")
cat > "$out/gpu-run.json" <<JSON
{"tests_rc": $tests_rc, "tests_summary": $(json_string "$tests_summary"),
 "sanitizers": {${sanitizer_json}"rc": $sanitizers_rc},
 "sdpa_rc": $sdpa_rc, "bench_rc": $bench_rc, "decode_loop_rc": $decode_rc,
 "decode_loop_swa_rc": $swa_rc, "decode_loop_mla_rc": $mla_rc,
 "verify_matrix_rc": $matrix_rc, "total_s": $total_s,
 "bench": $bench_json}
JSON
step "done: tests $tests_rc ($tests_summary), sanitizers $sanitizers_rc, sdpa $sdpa_rc, bench $bench_rc, decode loop $decode_rc (swa $swa_rc, mla $mla_rc), matrix $matrix_rc"
echo "wrote $out/gpu-run.log and $out/gpu-run.json"
[ $tests_rc -eq 0 ] && [ $sanitizers_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ $decode_rc -eq 0 ] &&
  [ $swa_rc -eq 0 ] && [ $mla_rc -eq 0 ] &&
  { [ "$matrix_rc" = null ] || [ "$matrix_rc" -eq 0 ]; }
