#!/usr/bin/env bash
# Adds vLLM 0.33.0 to the ML environment of scripts/ml-venv.sh (path in $1), once: the
# wheel without its dependencies (they would replace the environment's torch and
# transformers pins), then the modules its scheduler, config and request classes import.
# The vLLM tests (python/tests/integrations/test_vllm_*.py) drive that scheduler on CPU.
# Idempotent: a stamp in the environment marks the install done.
# Usage: bash scripts/ml-venv.d/vllm.sh VENV
set -euo pipefail
venv=${1:?usage: vllm.sh VENV}
stamp="$venv/.pagedkv-vllm-0.33.0-1"
[ -f "$stamp" ] && exit 0
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
# Import-time dependencies of vllm.v1.core.sched.scheduler, vllm.config and
# vllm.v1.request (found by importing them until nothing was missing; ENGINES.md).
deps=(cbor2 pyzmq aiohttp openai-harmony openai pillow pybase64 cachetools msgspec
  cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi partial-json-parser
  llguidance einops)
if ! { "${pip[@]}" --no-deps vllm==0.33.0 && "${pip[@]}" "${deps[@]}" &&
  VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "import vllm.v1.core.sched.scheduler" \
    >/dev/null 2>&1; }; then
  # Like scripts/ml-venv.sh offline: the vLLM tests then report skipped (no vllm module).
  "$venv/bin/pip" uninstall -q -y vllm >/dev/null 2>&1 || true
  echo "vllm.sh: vLLM 0.33.0 could not be installed or imported in $venv (offline?);" \
    "the vLLM tests report skipped" >&2
  exit 0
fi
touch "$stamp"
