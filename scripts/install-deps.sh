#!/usr/bin/env bash
# Installs the Debian packages pagedkv builds on, skipping those already present.
# Usage: bash scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libabsl-dev libxxhash-dev libfmt-dev catch2 libbenchmark-dev
  clang libclang-rt-14-dev python3 python3-dev python3-venv
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev prometheus-cpp-dev curl
  nlohmann-json3-dev clang-format
  redis-server redis-tools libhiredis-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
