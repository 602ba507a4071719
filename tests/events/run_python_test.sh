#!/usr/bin/env bash
# Runs a Python test with the KV-events venv's interpreter. Exits 77 (CTest: skipped) with
# the reason when the venv or one of its packages is missing; scripts/python-venv.sh
# creates it (scripts/test.sh does so before building).
# Usage: run_python_test.sh PYTHON SCRIPT [ARGS...]
python=$1
shift
if [ ! -x "$python" ]; then
  echo "SKIPPED: no $python; run scripts/python-venv.sh to create it"
  exit 77
fi
if ! "$python" -c "import zmq, msgspec, prometheus_client" 2>/dev/null; then
  echo "SKIPPED: $python lacks pyzmq, msgspec or prometheus_client; run scripts/python-venv.sh"
  exit 77
fi
exec "$python" "$@"
