#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in their own build folder, replays each
# target's seed corpus and saved regressions, then fuzzes every target for SECONDS, all
# targets in parallel.
#
# Usage: bash scripts/fuzz.sh [SECONDS] [TARGET...]
#   SECONDS  fuzzing time per target (default 60); 0 only replays the corpus.
#   TARGET   manager, hash, ... (default: every fuzz/*_fuzzer.cc).
# Environment:
#   BUILD_DIR  build folder (default build-fuzz); logs and new inputs go under it.
#   MERGE=1    afterwards, merge the new inputs that add edges into fuzz/corpus/<target>/.
#   FUZZ_SECONDS_<target>  fuzzing time of one target instead of SECONDS (a small target
#              that saturates in seconds then leaves the cores to the others).
#   FUZZ_BUILD_ONLY=1  only configure and build the targets (.ci/run builds them early,
#              while other tests run).
#   FUZZ_ARGS  extra libFuzzer flags for the fuzzing runs (default: -max_len=1024
#              -len_control=0: long inputs from the start, since each byte drives the ops).
# A crash, leak, timeout or failed check exits 1; the input is copied to
# fuzz/regressions/<target>/, which tests/fuzz_regression_test.cc replays. Commit it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
build=${BUILD_DIR:-build-fuzz}

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*_fuzzer.cc; do
    name=$(basename "$f" .cc)
    targets+=("${name%_fuzzer}")
  done
fi

bash scripts/install-deps.sh
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPAGEDKV_BUILD_FUZZ=ON -DPAGEDKV_ENABLE_CUDA=OFF -DPAGEDKV_BUILD_TESTS=OFF \
    -DPAGEDKV_BUILD_BENCH=OFF -DPAGEDKV_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target pagedkv_fuzzers
[ "${FUZZ_BUILD_ONLY:-0}" != 1 ] || exit 0

status=0
save_artifacts() {  # target, artifact folder
  local target=$1 dir=$2
  mkdir -p "fuzz/regressions/$target"
  for a in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*; do
    [ -f "$a" ] || continue
    cp "$a" "fuzz/regressions/$target/"
    echo "fuzz: $target failed; input saved as fuzz/regressions/$target/$(basename "$a")" >&2
  done
}

echo "== fuzz: replaying seed corpus and regressions"
for t in "${targets[@]}"; do
  bin="$build/fuzz/${t}_fuzzer"
  mkdir -p "fuzz/corpus/$t" "fuzz/regressions/$t"
  art="$build/fuzz-artifacts/$t/replay"
  rm -rf "$art" && mkdir -p "$art"
  if ! "$bin" -runs=0 -artifact_prefix="$art/" "fuzz/corpus/$t" "fuzz/regressions/$t" \
      >"$build/fuzz-replay-$t.log" 2>&1; then
    tail -n 60 "$build/fuzz-replay-$t.log" >&2
    save_artifacts "$t" "$art"
    status=1
  else
    echo "$t: $(find "fuzz/corpus/$t" "fuzz/regressions/$t" -type f | wc -l) inputs replayed cleanly"
  fi
done
[ "$status" -eq 0 ] || exit 1
[ "$seconds" -gt 0 ] || exit 0

echo "== fuzz: running ${targets[*]} in parallel"
declare -A pids run_seconds
for t in "${targets[@]}"; do
  override="FUZZ_SECONDS_$t"
  run_seconds[$t]=${!override:-$seconds}
  bin="$build/fuzz/${t}_fuzzer"
  work="$build/fuzz-work/$t"
  art="$build/fuzz-artifacts/$t/run"
  rm -rf "$art" && mkdir -p "$work" "$art"
  # New inputs go to $work (first folder); the seed corpus is only read.
  # shellcheck disable=SC2086
  "$bin" -max_total_time="${run_seconds[$t]}" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
    -max_len=1024 -len_control=0 -artifact_prefix="$art/" ${FUZZ_ARGS:-} "$work" "fuzz/corpus/$t" >"$build/fuzz-$t.log" 2>&1 &
  pids[$t]=$!
done
for t in "${targets[@]}"; do
  if ! wait "${pids[$t]}"; then
    echo "== fuzz: $t FAILED; end of $build/fuzz-$t.log:" >&2
    tail -n 80 "$build/fuzz-$t.log" >&2
    save_artifacts "$t" "$build/fuzz-artifacts/$t/run"
    status=1
  fi
done

echo "== fuzz: summary (edges = cov, from the last status line)"
for t in "${targets[@]}"; do
  log="$build/fuzz-$t.log"
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
  rate=$(grep -E '^stat::average_exec_per_sec' "$log" | awk '{print $2}' || true)
  cov=$(echo "$last" | grep -oE 'cov: [0-9]+' | awk '{print $2}' || true)
  ft=$(echo "$last" | grep -oE 'ft: [0-9]+' | awk '{print $2}' || true)
  echo "$t: ${run_seconds[$t]} s, ${execs:-?} executions, ${rate:-?} exec/s, edges (cov) ${cov:-?}, features ${ft:-?}"
  if [ "${MERGE:-0}" = 1 ] && [ "$status" -eq 0 ]; then
    # Edges only (no hit counts), which keeps the committed corpus small.
    "$build/fuzz/${t}_fuzzer" -merge=1 -use_counters=0 "fuzz/corpus/$t" "$build/fuzz-work/$t" \
      >/dev/null 2>&1
    echo "$t: corpus now $(ls "fuzz/corpus/$t" | wc -l) inputs"
  fi
done
exit "$status"
