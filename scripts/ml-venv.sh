#!/usr/bin/env bash
# Creates, once per machine, the virtual environment of the tests and examples that run real
# models: torch (PyPI's only build is a CUDA one, about 3 GB with its nvidia wheels; it runs
# on the CPU too), transformers, and what reads GGUF and safetensors checkpoints. Later calls
# find it ready and return at once; pip's cache keeps a second machine's install off the
# network where it survives. Prints the environment's path on its last line.
# Usage: bash scripts/ml-venv.sh     (PAGEDKV_ML_VENV picks the folder)
set -euo pipefail
venv=${PAGEDKV_ML_VENV:-$HOME/.cache/pagedkv/ml-venv}
# Bump when the pins change: an environment made from other pins is made again.
stamp="$venv/.pagedkv-ml-venv-1"
if [ -f "$stamp" ]; then
  echo "$venv"
  exit 0
fi
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
"${pip[@]}" torch==2.15.0 transformers==5.23.0 safetensors accelerate gguf numpy pytest
touch "$stamp"
echo "$venv"
