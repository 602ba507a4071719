#!/usr/bin/env bash
# Adds vLLM 0.33.0 to the ML environment of scripts/ml-venv.sh (path in $1), once: the
# wheel without its dependencies (they would replace the environment's torch and
# transformers pins), then the modules its scheduler, config and request classes import.
# The vLLM tests (python/tests/integrations/test_vllm_*.py) drive that scheduler on CPU.
# Idempotent: a stamp in the environment marks the install done.
# Usage: bash scripts/ml-venv.d/vllm.sh VENV
set -euo pipefail
venv=${1:?usage: vllm.sh VENV}
stamp="$venv/.pagedkv-vllm-0.33.0-2"
[ -f "$stamp" ] && exit 0
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
# Import-time dependencies of vllm.v1.core.sched.scheduler, vllm.config and
# vllm.v1.request (found by importing them until nothing was missing; ENGINES.md), pinned
# to the versions the vLLM tests last passed with, so that a new release of one cannot
# change the environment under them.
deps=(cbor2==6.3.0 pyzmq==27.3.0 aiohttp==3.14.5 openai-harmony==0.0.8 openai==3.63.0
  pillow==13.0.0 pybase64==1.5.1 cachetools==8.0.3 msgspec==0.23.0 cloudpickle==3.1.3
  uvloop==0.23.0 py-cpuinfo==9.0.0 prometheus_client==0.26.0 xgrammar==0.2.9
  fastapi==0.165.0 partial-json-parser==0.2.1.1.post7 llguidance==1.9.1 einops==0.8.2)
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
