#!/usr/bin/env bash
# Fails when a kernel of cuda/*.cu spills registers on sm_80 or sm_90.
# Compiles each file with nvcc -Xptxas -v (the flags of the library build) and reads the
# "bytes spill stores / loads" line ptxas prints for every entry function. Prints one line
# per kernel and architecture: registers, spill stores, spill loads.
# Usage: bash scripts/check-spills.sh   (skips, exit 0, when nvcc is not installed)
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${CUDACXX:-/usr/local/cuda/bin/nvcc}
if ! [ -x "$nvcc" ]; then
  echo "check-spills: skipped, nvcc not found at $nvcc"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for source in cuda/*.cu; do
  "$nvcc" -std=c++20 -O2 -Iinclude -Isrc -Icuda \
    --generate-code=arch=compute_80,code=sm_80 --generate-code=arch=compute_90,code=sm_90 \
    -Xptxas -v -c "$source" -o "$tmp/out.o" > "$tmp/ptxas.log" 2>&1 || {
    cat "$tmp/ptxas.log"
    echo "check-spills: $source does not compile"
    exit 1
  }
  # ptxas -v: "Compiling entry function 'NAME' for 'sm_XX'", then a line with
  # "N bytes spill stores, M bytes spill loads", then "Used R registers".
  awk -v source="$source" '
    /Compiling entry function/ {
      match($0, /function .[^'"'"']*/); name = substr($0, RSTART + 10, RLENGTH - 10)
      match($0, /for .sm_[0-9]+/); arch = substr($0, RSTART + 5, RLENGTH - 5)
    }
    /bytes spill stores/ {
      for (i = 1; i <= NF; i++) { if ($i == "spill" && $(i + 1) ~ /stores/) st = $(i - 2);
                                 if ($i == "spill" && $(i + 1) ~ /loads/) ld = $(i - 2) }
    }
    /Used [0-9]+ registers/ {
      match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5)
      printf "%s %s regs=%s spill_stores=%s spill_loads=%s %s\n", arch, source, regs, st, ld, name
    }' "$tmp/ptxas.log" > "$tmp/kernels.txt"
  if command -v c++filt > /dev/null; then
    c++filt < "$tmp/kernels.txt" | sed -E 's/\(pagedkv::AttentionParams\)|\(pagedkv::WriteKvParams\)|\(pagedkv::internal::CopyBlocksParams\)//'
  else
    cat "$tmp/kernels.txt"
  fi
  if [ ! -s "$tmp/kernels.txt" ]; then
    echo "check-spills: no kernels found in $source (ptxas output format changed?)"
    status=1
  fi
  if grep -Eq "spill_stores=[1-9]|spill_loads=[1-9]" "$tmp/kernels.txt"; then
    echo "check-spills: register spills in $source"
    status=1
  fi
done
[ $status -eq 0 ] && echo "check-spills: no register spills"
exit $status
