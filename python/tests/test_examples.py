"""The Python example and benchmark run (small sizes) and report what they claim."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(script, *args):
    result = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True,
                            text=True, timeout=300, check=True)
    return result.stdout


def test_engine_loop_on_cpu_hits_preempts_and_copies():
    out = run("examples/python/engine_loop.py", "--device", "cpu", "--requests", "12")
    assert "CPU: 15 sequences finished" in out  # 12 requests, 3 of them with 2 samples
    hits = int(out.split("prefix cache: ")[1].split()[0])
    preemptions = int(out.split("preemptions (recompute): ")[1].split(",")[0])
    copies = int(out.split("copy-on-write copies: ")[1].split(",")[0])
    assert hits > 0 and preemptions > 0 and copies > 0


def test_engine_loop_with_a_host_tier_promotes_and_generates_the_same_tokens():
    args = ("examples/python/engine_loop.py", "--device", "cpu", "--requests", "24")
    plain = run(*args)
    tiered = run(*args, "--host-blocks", "64")
    host_hits = int(tiered.split("host tier: ")[1].split()[0])
    promoted = int(tiered.split("demoted, ")[1].split()[0])
    assert host_hits > 0 and promoted > 0
    # Promotion brings back exactly the K/V that eviction took (skipping the storage's
    # demote or promote copies changes the tokens).
    crc = "generated tokens crc32: "
    assert tiered.split(crc)[1].split()[0] == plain.split(crc)[1].split()[0]


def test_decode_step_bench_prints_every_variant():
    out = run("bench/python/decode_step_bench.py", "--steps", "5", "--repeats", "1")
    for variant in ("per-sequence", "batched", "batched+tables"):
        assert variant in out
