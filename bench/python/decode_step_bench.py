"""One decode step of 256 running sequences from Python, in ns per sequence-token.

The Python counterpart of BM_DecodeStep (bench/allocator_bench.cc): each sequence appends
one token and reserves its slot (a new block every 16 tokens, hashed and indexed when
full), then the step's copies are taken. Three ways:
  per-sequence  append_tokens() + allocate_slots() per sequence, as a naive port would;
  batched       append_tokens_batch() + allocate_slots_batch(): two calls per step;
  batched+tables  the same, plus write_block_tables() into preallocated arrays.
Targets (issue 12): batched <= 150 ns, per-sequence <= 1,000 ns per sequence-token.

Usage: python bench/python/decode_step_bench.py [--steps N] [--repeats R]
Prints the best and median of R timed runs of N steps each (the best is the figure with
the least interference from other processes).
"""

import argparse
import statistics
import time

import numpy as np

import pagedkv as pk

NUM_SEQS, PROMPT, BLOCK, MAX_LEN = 256, 64, 16, 4096


def admitted_manager():
    m = pk.KvCacheManager(layer_groups=pk.full_attention(NUM_SEQS * MAX_LEN // BLOCK + 64),
                          block_size=BLOCK)
    for s in range(NUM_SEQS):
        m.add_sequence(s, np.arange(s * PROMPT, (s + 1) * PROMPT, dtype=np.int32))
        m.allocate_slots(s, PROMPT)
    m.take_step_ops()  # the step ends
    return m


def per_sequence(m, steps):
    token = [7]
    for _ in range(steps):
        for s in range(NUM_SEQS):
            m.append_tokens(s, token)
            m.allocate_slots(s, 1)
        m.take_step_ops()  # the step ends


def batched(m, steps, tables=False):
    seqs = np.arange(NUM_SEQS, dtype=np.int64)
    tokens = np.full(NUM_SEQS, 7, dtype=np.int32)
    block_table = np.zeros((NUM_SEQS, MAX_LEN // BLOCK), dtype=np.int32)
    context_lens = np.zeros(NUM_SEQS, dtype=np.int32)
    for _ in range(steps):
        m.append_tokens_batch(seqs, tokens)
        batch = m.allocate_slots_batch(seqs, 1)
        if not batch.ok:
            raise RuntimeError(f"decode step failed: {batch.errors}")
        if tables:
            m.write_block_tables(seqs, block_table, context_lens)
        m.take_step_ops()  # the step ends


def measure(run, steps, repeats):
    """ns per sequence-token of `repeats` runs of `steps` steps, each on a fresh batch."""
    figures = []
    for _ in range(repeats):
        m = admitted_manager()
        start = time.perf_counter_ns()
        run(m, steps)
        figures.append((time.perf_counter_ns() - start) / (steps * NUM_SEQS))
    return min(figures), statistics.median(figures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="decode steps per run")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per variant")
    args = parser.parse_args()
    if PROMPT + args.steps > MAX_LEN:
        parser.error(f"--steps must be at most {MAX_LEN - PROMPT}")
    print(f"decode step, {NUM_SEQS} sequences, block_size {BLOCK}, {args.steps} steps x "
          f"{args.repeats} runs")
    print(f"{'variant':<16} {'best ns/seq-token':>18} {'median':>10} {'target':>8}")
    variants = [
        ("per-sequence", per_sequence, 1000),
        ("batched", batched, 150),
        ("batched+tables", lambda m, n: batched(m, n, tables=True), None),
    ]
    for name, run, target in variants:
        best, median = measure(run, args.steps, args.repeats)
        shown = f"<= {target}" if target else "-"
        print(f"{name:<16} {best:>18.1f} {median:>10.1f} {shown:>8}")


if __name__ == "__main__":
    main()
