#!/usr/bin/env bash
# Starts a redis-server on a free loopback port (no persistence) and runs
# remote_kv_store_bench against it for batches of 1 and 8, which also runs redis-benchmark
# with the same values and pipelining and prints the ratio (docs/remote.md, Throughput).
# Everything runs under $PIN (default: taskset -c 0, one core for the caller, the store's
# I/O thread, redis-server and redis-benchmark alike; PIN= to use every core).
# Usage: bash scripts/remote-bench.sh BUILD_DIR [value_kib=2048] [values=128] [repeats=3]
set -euo pipefail
build=${1:?usage: remote-bench.sh BUILD_DIR [value_kib] [values] [repeats]}
value_kib=${2:-2048}
values=${3:-128}
repeats=${4:-3}
pin=${PIN-taskset -c 0}
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$pin redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
server=$!
trap 'kill $server' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
for batch in 1 8; do
  $pin "$build/bench/remote_kv_store_bench" "redis://127.0.0.1:$port" "$value_kib" "$values" \
    "$batch" "$repeats"
done
