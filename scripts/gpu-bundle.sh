#!/usr/bin/env bash
# Builds what the GPU check runs and packs it into one folder that runs on a GPU machine
# without this machine's build dependencies (Abseil, xxHash, fmt, Catch2): the CUDA test
# binary, the kernel benchmark and the decode loop, plus every shared library `ldd` lists
# except the C runtime and the CUDA driver, which that machine has. Debug info is stripped
# so the bundle stays far below the 64 MiB a device run carries.
# Usage: bash scripts/gpu-bundle.sh [BUNDLE_DIR]     (default build-gpu/bundle)
#   PAGEDKV_CUDA_ARCH (default 90) picks the architecture compiled (80 for A100).
# Then, on the GPU machine, from the repository root: bash scripts/gpu-run.sh BUNDLE_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-build-gpu/bundle}
build=${BUILD_DIR:-build-gpu}
arch=${PAGEDKV_CUDA_ARCH:-90}
bash scripts/install-deps.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > /dev/null
cmake --build "$build" --target pagedkv_tests decode_kernel_bench pagedkv-decode -j"$(nproc)"
test -f "$build/bench/decode_kernel_bench" || {
  echo "gpu-bundle: the build has no CUDA (nvcc missing?): nothing to run on a GPU" >&2
  exit 1
}
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
cp "$build/tests/pagedkv_tests" "$build/bench/decode_kernel_bench" \
  "$build/examples/decode_loop/pagedkv-decode" "$bundle/bin/"
for binary in "$bundle"/bin/*; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|libcuda|ld-linux[^/]*)\.so' |
  xargs -r cp -L -t "$bundle/lib"
strip --strip-debug "$bundle"/bin/* "$bundle"/lib/*
echo "gpu-bundle: $bundle ($(du -sh "$bundle" | cut -f1)) for sm_$arch:"
ls -la "$bundle/bin" "$bundle/lib" | grep -v '^total'
