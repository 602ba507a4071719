#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA source differs from what clang-format makes of it with the
# root .clang-format. Usage: bash scripts/check-format.sh   (clang-format -i FILE fixes one)
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z '*.cc' '*.h' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run -Werror
echo "check-format: $(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | wc -l) files formatted"
