#!/usr/bin/env bash
# Creates the Python venv that the KV event tests and the reference router use
# (pyzmq, msgspec, prometheus_client from PyPI), unless it already has them.
# Usage: bash scripts/python-venv.sh [VENV_DIR]   (default: build/.venv-events)
#   CMake's PAGEDKV_EVENTS_PYTHON defaults to <build dir>/.venv-events/bin/python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/.venv-events}
packages=(pyzmq msgspec prometheus_client)
if [ -x "$venv/bin/python" ] &&
  "$venv/bin/python" -c "import zmq, msgspec, prometheus_client" 2>/dev/null; then
  exit 0
fi
echo "python-venv: creating $venv with ${packages[*]}" >&2
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}"
