#!/usr/bin/env bash
# The tests that run pagedkv inside real models and engines (Hugging Face transformers,
# vLLM's scheduler: python/tests/integrations). They need torch and the engines, which
# scripts/ml-venv.sh installs once per machine (about 3.5 GB, so not in the README's test
# command, where these tests report skipped); the package is built into that environment,
# then pytest runs them there.
# Usage: bash scripts/test-integrations.sh [pytest arguments]
#   PAGEDKV_VLLM_SRC: vLLM's source tree for test_vllm_upstream_scheduler.py (default: the
#   tests/ of its sdist that scripts/ml-venv.d/vllm-tests.sh puts into the environment).
#   PAGEDKV_WHEEL_DIR: install the pagedkv wheel found there (built from this checkout)
#   instead of building the package again.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! venv=$(bash scripts/ml-venv.sh | tail -1); then
  echo "test-integrations.sh: the ML environment could not be installed (offline?);" \
    "the integration tests report skipped in the README's test command" >&2
  exit 0
fi
for extra in scripts/ml-venv.d/*.sh; do
  [ -f "$extra" ] && bash "$extra" "$venv"
done
# vLLM's own scheduler tests (scripts/ml-venv.d/vllm-tests.sh), unless the caller names
# a checkout (or sets PAGEDKV_VLLM_SRC empty to skip them).
if [ -z "${PAGEDKV_VLLM_SRC+set}" ] && [ -d "$venv/vllm-0.33.0-src/tests" ]; then
  export PAGEDKV_VLLM_SRC="$venv/vllm-0.33.0-src"
fi
if [ -n "${PAGEDKV_WHEEL_DIR:-}" ]; then
  # A wheel of this checkout that test.sh just built (.ci/run): not built twice.
  "$venv/bin/pip" install -q --force-reinstall --no-deps "$PAGEDKV_WHEEL_DIR"/pagedkv-*.whl
else
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/pip" install -q . \
    -Ccmake.define.PAGEDKV_ENABLE_CUDA=OFF
fi
HF_HUB_OFFLINE=1 "$venv/bin/python" -m pytest -q -rs python/tests/integrations "$@"
