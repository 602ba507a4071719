"""Time per scheduler step of vLLM 0.33.0's scheduler, stock and on pagedkv (decode steps).

Both schedulers run the same requests (a 32-token prompt each, decoding up to
max_model_len) with fake model outputs; once all are decoding, rounds alternate between
the two (interleaved, so that a slower period of a shared machine hits both), each round
timing `steps` steps of schedule() + update_from_output() (the fake output is built
outside the timed part). Prints the median step time of each and their ratio.

Usage (in the environment of scripts/test-integrations.sh, VLLM_TARGET_DEVICE=cpu):
    python bench/python/vllm_scheduler_bench.py [--running 256 1024] [--rounds 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests", "integrations"))

import vllm_traces as vt  # noqa: E402


def make(running: int, block_size: int, pagedkv: bool):
    max_model_len = 1024
    config = vt.TraceConfig(
        block_size=block_size,
        num_blocks=running * (max_model_len // block_size) + 1,
        max_num_seqs=running,
        max_num_batched_tokens=running * 32,
        max_model_len=max_model_len,
        enable_prefix_caching=True,
        watermark=0.0,
    )
    sched = vt.make_scheduler(config, pagedkv)
    for i in range(running):
        prompt = [(i * 7 + j) % vt.VOCAB for j in range(32)]
        sched.add_request(vt.make_request(vt.NewRequest(f"r{i}", prompt, max_model_len - 32), block_size))
    # Prefill everything: then each step is a decode step of every request.
    out = sched.schedule()
    sched.update_from_output(out, vt.model_output(sched, out))
    assert len(sched.running) == running, (len(sched.running), running)
    return sched


def step_times(sched, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        mro = vt.model_output(sched, out)
        t2 = time.perf_counter()
        sched.update_from_output(out, mro)
        t3 = time.perf_counter()
        assert len(out.num_scheduled_tokens) == len(sched.running)
        times.append((t1 - t0) + (t3 - t2))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    print(f"vLLM 0.33.0 scheduler, decode steps, block_size {args.block_size}, "
          f"{args.rounds} interleaved rounds of {args.steps} steps")
    for running in args.running:
        if args.rounds * args.steps + 1 > 1024 - 32:
            raise SystemExit("rounds * steps must stay below the 992 decode tokens per request")
        scheds = {name: make(running, args.block_size, name == "pagedkv") for name in ("vllm", "pagedkv")}
        per = {name: [] for name in scheds}
        for _ in range(args.rounds):
            for name, sched in scheds.items():
                per[name] += step_times(sched, args.steps)
        med = {name: statistics.median(t) * 1e3 for name, t in per.items()}
        print(f"{running:5d} running: vLLM {med['vllm']:.3f} ms/step, pagedkv {med['pagedkv']:.3f} "
              f"ms/step, pagedkv / vLLM = {med['pagedkv'] / med['vllm']:.2f}")


if __name__ == "__main__":
    main()
