#!/usr/bin/env bash
# Runs pagedkv-decode's teacher-forced verification over the decode-loop matrix of
# docs/decode-loop.md (issue 10's table in bf16, plus fp32, fp16 and fp8 defaults, and a
# bf16 run whose evicted prefixes are served from the host tier) and
# prints one line per row: PASS/FAIL, the flags, and the verification summary (sequences
# identical / near-tie / failed, the largest logit difference and the dtype's bound).
# Exits 1 if any row fails, 2 on a usage error.
#
# usage: scripts/decode-verify-matrix.sh PATH/TO/pagedkv-decode [EXTRA FLAGS...]
#   e.g. scripts/decode-verify-matrix.sh build/examples/decode_loop/pagedkv-decode --device cuda
# Extra flags go to every row (the rows themselves use --requests 64 --verify 8).
# Environment: DECODE_MATRIX_QUICK=1 runs a 16-request variant of each row (CTest).
set -u -o pipefail

if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 PATH/TO/pagedkv-decode [EXTRA FLAGS...] (not executable: ${1:-none})" >&2
  exit 2
fi
binary=$1
shift

common=(--requests 64 --verify 8)
if [[ ${DECODE_MATRIX_QUICK:-0} == 1 ]]; then
  common=(--requests 16 --max-new-tokens 12 --system-prompt-len 96 --kv-budget-mb 0.5 --verify 6)
fi

rows=(
  "--kv-dtype bf16"
  "--kv-dtype bf16 --kv-budget-mb 64"
  "--kv-dtype bf16 --block-size 8"
  "--kv-dtype bf16 --preemption recompute"
  "--kv-dtype bf16 --preemption swap"
  "--kv-dtype bf16 --seed 2"
  "--kv-dtype fp32"
  "--kv-dtype fp16"
  "--kv-dtype fp8"
  "--kv-dtype fp8 --preemption swap"
  "--kv-dtype bf16 --system-prompts 4 --kv-budget-mb 0.75 --host-cache-mb 1"
)

failed=0
for row in "${rows[@]}"; do
  # shellcheck disable=SC2206  # a row is a list of flags
  args=("${common[@]}" $row "$@")
  output=$("$binary" "${args[@]}" 2>&1)
  status=$?
  # The "verify" line and the counts line after it.
  summary=$(printf '%s\n' "$output" | sed -n '/^verify /{n;p;}' | sed 's/^ *//')
  if [[ $status -eq 0 ]]; then
    verdict=PASS
  else
    verdict=FAIL
    failed=1
  fi
  printf '%s  %-40s  %s\n' "$verdict" "$row" "${summary:-exit status $status}"
  if [[ $verdict == FAIL ]]; then
    printf '%s\n' "$output" | sed -n '/^verify /,$p' | sed 's/^/      /'
    [[ -z $summary ]] && printf '%s\n' "$output" | tail -5 | sed 's/^/      /'
  fi
done
exit $failed
