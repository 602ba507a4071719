#!/usr/bin/env bash
# Sets up and runs every test: installs the dependencies, configures, builds, runs CTest.
# Then builds the Python package with pip in a fresh virtual environment and runs its
# pytest suite (python/tests).
# Usage: bash scripts/test.sh [extra cmake -D options]
#   A Release build unless the options name another CMAKE_BUILD_TYPE (run-example.sh
#   builds the same folder the same way, so neither rebuilds the other's work).
#   BUILD_DIR (default build) picks the build folder.
#   PYTHON_TESTS=0 skips the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build=${BUILD_DIR:-build}
bash scripts/python-venv.sh "$build/.venv-events" ||
  echo "test.sh: no Python venv (offline?): the KV event tests will be skipped" >&2
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --output-junit ctest-results.xml \
  --test-output-size-passed 262144
# Every Catch2 test case ran once, or was reported skipped: none passes without running.
# (It reads each case's summary line from the JUnit output, which CTest truncates at 1 KiB
# for passing tests by default: the property tests print more.)
python3 scripts/check-test-counts.py "$build" "$build/ctest-results.xml"

if [ "${PYTHON_TESTS:-1}" = 1 ]; then
  # The wheel `pip install .` builds for a user (build isolation, scikit-build-core and
  # nanobind from PyPI), CPU kernels only: the CUDA ones are compiled and checked by the
  # build above. It stays in $build/wheels, where .ci/run's integration step installs it.
  venv="$build/python-venv"
  python3 -m venv --clear "$venv"
  rm -rf "$build/wheels"
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/pip" wheel -q --no-deps -w "$build/wheels" . \
    -Ccmake.define.PAGEDKV_ENABLE_CUDA=OFF
  "$venv/bin/pip" install -q "$build"/wheels/pagedkv-*.whl pytest
  # Exit code 5 means "no tests collected" (a -k selection, say), not a failure.
  "$venv/bin/python" -m pytest -q -rs python/tests || [ $? -eq 5 ]
fi
