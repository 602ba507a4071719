#!/usr/bin/env bash
# Runs pagedkv-decode with every --fault in fp32, bf16 and fp8 KV over seeds and request
# counts, and checks that each run exercised what the fault breaks, verified a sequence
# that went through it, and failed verification (docs/decode-loop.md, "The fault sweep").
# Prints one line per run and a summary; exits 1 if any run was not caught that way, 2 on
# a usage error.
#
# usage: scripts/fault-sweep.sh PATH/TO/pagedkv-decode [EXTRA FLAGS...]
#   e.g. scripts/fault-sweep.sh build/examples/decode_loop/pagedkv-decode --device cpu
# Environment: FAULT_SWEEP_SEEDS (default "1 2 3 4 5"), FAULT_SWEEP_REQUESTS (default
# "16 64 256"), FAULT_SWEEP_DTYPES (default "fp32 bf16 fp8"). Extra flags go to every run.
#
# Each fault gets flags that exercise what it breaks in every configuration. Budgets are
# given for fp32 and scaled to hold the same number of blocks in each dtype:
#   skip-copies      the default workload: every 4th request forks 2..4 samples, whose
#                    first appends copy the prompt's shared partial block (copy-on-write)
#   skip-swap-in,    --preemption swap with a 1 MiB (32-block) budget: sequences are
#   corrupt-swap-in  preempted by swap and swapped back in
#   skip-promote     4 system prompts in turn, a 1.5 MiB (48-block) budget and a 2 MiB
#                    host tier: evicted prefixes are demoted and promoted back
#   keep-rejected    --speculative 4 --draft replay: greedy sequences verify replayed
#                    drafts, a quarter of them wrong, which the fault keeps
# Every run verifies 8 sequences (one per mechanism fits: --verify picks one for each the
# run exercised first).
set -u -o pipefail

if [[ $# -lt 1 || ! -x "$1" ]]; then
  echo "usage: $0 PATH/TO/pagedkv-decode [EXTRA FLAGS...] (not executable: ${1:-none})" >&2
  exit 2
fi
binary=$1
shift
seeds=${FAULT_SWEEP_SEEDS:-1 2 3 4 5}
request_counts=${FAULT_SWEEP_REQUESTS:-16 64 256}
dtypes=${FAULT_SWEEP_DTYPES:-fp32 bf16 fp8}
faults=${FAULT_SWEEP_FAULTS:-skip-copies skip-swap-in corrupt-swap-in skip-promote keep-rejected}

# MiB of an fp32 budget, scaled to the same number of blocks of `dtype`.
scaled_mb() {
  local fp32_mb=$1 dtype=$2
  case $dtype in
    fp32) echo "$fp32_mb" ;;
    bf16 | fp16) awk -v mb="$fp32_mb" 'BEGIN { print mb / 2 }' ;;
    fp8) awk -v mb="$fp32_mb" 'BEGIN { print mb / 4 }' ;;
    *) echo "unknown dtype $dtype" >&2 && exit 2 ;;
  esac
}

fault_flags() {
  local fault=$1 dtype=$2
  case $fault in
    skip-copies) echo "" ;;
    skip-swap-in | corrupt-swap-in)
      echo "--preemption swap --kv-budget-mb $(scaled_mb 1 "$dtype")" ;;
    skip-promote)
      echo "--system-prompts 4 --kv-budget-mb $(scaled_mb 1.5 "$dtype")" \
        "--host-cache-mb $(scaled_mb 2 "$dtype")" ;;
    keep-rejected) echo "--speculative 4 --draft replay" ;;
  esac
}

# Reads a --json summary on stdin; prints the run's outcome and its evidence on one line:
# CAUGHT (verification failed, a verified sequence went through what the fault breaks),
# MISSED (it passed anyway), UNCOVERED (exercised, but no verified sequence went through
# it), NOT-EXERCISED, or ERROR (no summary).
summarize() {
  python3 -c '
import json, sys
try:
    s = json.load(sys.stdin)
except ValueError:
    print("ERROR no JSON summary")
    sys.exit()
fault, verify = s["fault"], s["verify"]
failed = [q for q in verify["sequences"] if q["verdict"] == "FAIL"]
broken = ",".join(fault["mechanisms"])
if not fault["exercised"]:
    outcome = "NOT-EXERCISED"
elif not fault["covered"]:
    outcome = "UNCOVERED"
else:
    outcome = "MISSED" if verify["passed"] else "CAUGHT"
through = sum(s["mechanism_sequences"][m] for m in fault["mechanisms"])
verified, bound = len(verify["sequences"]), verify["bound"]
diff = "non-finite" if verify["max_logit_diff"] is None else verify["max_logit_diff"]
print(f"{outcome} {broken}: {through} sequences through it; {len(failed)} of {verified} "
      f"verified failed, max logit diff {diff}, bound {bound}")
'
}

printf '%-16s %-5s %4s %8s  %-13s %6s  %s\n' fault dtype seed requests outcome seconds evidence
declare -A counts=()
total=0
start=$SECONDS
for fault in $faults; do
  for dtype in $dtypes; do
    for requests in $request_counts; do
      for seed in $seeds; do
        read -ra flags <<<"$(fault_flags "$fault" "$dtype")"
        args=(--kv-dtype "$dtype" --seed "$seed" --requests "$requests" --verify 8
          --fault "$fault" "${flags[@]}" "$@" --json)
        run_start=$(date +%s.%N)
        line=$("$binary" "${args[@]}" 2>/dev/null | summarize)
        seconds=$(awk -v a="$run_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        outcome=${line%% *}
        [[ -n $outcome ]] || outcome=ERROR
        counts[$outcome]=$((${counts[$outcome]:-0} + 1))
        total=$((total + 1))
        printf '%-16s %-5s %4s %8s  %-13s %6s  %s\n' "$fault" "$dtype" "$seed" "$requests" \
          "$outcome" "$seconds" "${line#* }"
      done
    done
  done
done

summary=""
for outcome in CAUGHT MISSED UNCOVERED NOT-EXERCISED ERROR; do
  summary+=" $outcome ${counts[$outcome]:-0}"
done
echo "fault sweep: $total runs in $((SECONDS - start)) s:$summary"
[[ ${counts[CAUGHT]:-0} -eq $total ]]
