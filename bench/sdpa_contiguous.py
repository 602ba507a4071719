"""Contiguous-KV baseline for bench/decode_kernel_bench.cu: PyTorch SDPA decode.

For every (batch, context, group) of the kernel benchmark (8 KV heads, head_dim 128, bf16),
times torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True) with one
query token per sequence over contiguous K/V, the way the paged kernel is timed: CUDA events
around each call, median of --runs calls after warm-up, cold L2 (calls rotate over enough
copies of K/V to cover 3x the L2 size when one copy is smaller).

Writes lines "batch context group microseconds" (the format decode_kernel_bench --sdpa=
reads) to --out, and prints a table. Exits 0 with a message when torch or a GPU is missing.
"""

import argparse
import statistics
import sys

BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192, 32768)
GROUPS = (1, 4, 8)
KV_HEADS = 8
HEAD_DIM = 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="sdpa_contiguous.txt")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--peak-gbps", type=float, default=4800.0)
    args = parser.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"sdpa_contiguous: skipped, no torch ({e})")
        return 0
    if not torch.cuda.is_available():
        print("sdpa_contiguous: skipped, no CUDA device")
        return 0
    device = torch.device("cuda")
    l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, L2 {l2_bytes >> 20} MiB")
    print(f"{'batch':>5} {'context':>7} {'group':>5} {'us':>10} {'% peak':>7}")
    lines = []
    for batch in BATCHES:
        for context in CONTEXTS:
            kv_bytes = 2 * batch * KV_HEADS * context * HEAD_DIM * 2
            copies = max(1, min(64, -(-3 * l2_bytes // kv_bytes)))
            ks = [torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=device,
                              dtype=torch.bfloat16) for _ in range(copies)]
            vs = [torch.randn_like(k) for k in ks]
            for group in GROUPS:
                q = torch.randn(batch, KV_HEADS * group, 1, HEAD_DIM, device=device,
                                dtype=torch.bfloat16)
                for i in range(5):
                    F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies],
                                                   enable_gqa=True)
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                times = []
                for i in range(args.runs):
                    start.record()
                    F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies],
                                                   enable_gqa=True)
                    stop.record()
                    stop.synchronize()
                    times.append(start.elapsed_time(stop) * 1000.0)
                us = statistics.median(times)
                moved = kv_bytes + 2 * q.numel() * 2
                pct = 100.0 * moved / (us * 1e-6) / (args.peak_gbps * 1e9)
                print(f"{batch:>5} {context:>7} {group:>5} {us:>10.2f} {pct:>6.1f}%", flush=True)
                lines.append(f"{batch} {context} {group} {us:.3f}\n")
            del ks, vs
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        f.writelines(lines)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
