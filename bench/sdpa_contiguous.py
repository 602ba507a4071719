"""Contiguous-KV baselines for bench/decode_kernel_bench.cu: PyTorch SDPA decode.

GQA: for every (batch, context, group) of the kernel benchmark (8 KV heads, head_dim 128,
bf16), times torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True) with
one query token per sequence over contiguous K/V.

MLA: for every (batch, context, heads) of the benchmark's MLA grid, the same call over the
latent as a single-KV-head MQA: q [batch, heads, 1, 576], k = the latents [batch, 1, context,
576], v = their first 512 elements (a view of k, so the latent is stored once), scale
1 / sqrt(192): what paged_mla_decode computes, on a contiguous cache.

Both are timed the way the paged kernels are: CUDA events around each call, median of --runs
calls after warm-up, cold L2 (calls rotate over enough copies of K/V to cover 3x the L2 size
when one copy is smaller).

Writes lines "batch context group microseconds" (the format decode_kernel_bench --sdpa=
reads) to --out, lines "batch context heads microseconds" (for --sdpa_mla=) to --mla-out,
and prints tables. Exits 0 with a message when torch or a GPU is missing.
"""

import argparse
import statistics
import sys

BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192, 32768)
GROUPS = (1, 4, 8)
KV_HEADS = 8
HEAD_DIM = 128
MLA_BATCHES = (1, 16, 64, 128)
MLA_CONTEXTS = (2048, 8192, 32768)
MLA_HEADS = (16, 32, 64, 128)
MLA_DIM = 576  # kv_lora_rank 512 + rope 64
MLA_RANK = 512


def median_us(torch, call, copies, runs):
    """Median microseconds of call(i) over `runs` calls (CUDA events), after 5 warm-ups."""
    for i in range(5):
        call(i % copies)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(runs):
        start.record()
        call(i % copies)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)


def mla_baseline(torch, F, device, l2_bytes, args):
    """SDPA over contiguous latents for the MLA grid; returns the output lines."""
    print(f"{'batch':>5} {'context':>7} {'heads':>5} {'us':>10} {'% peak':>7}  (MLA)")
    lines = []
    for batch in MLA_BATCHES:
        for context in MLA_CONTEXTS:
            latent_bytes = batch * context * MLA_DIM * 2
            copies = max(1, min(64, -(-3 * l2_bytes // latent_bytes)))
            latents = [torch.randn(batch, 1, context, MLA_DIM, device=device,
                                   dtype=torch.bfloat16) for _ in range(copies)]
            for heads in MLA_HEADS:
                q = torch.randn(batch, heads, 1, MLA_DIM, device=device, dtype=torch.bfloat16)

                def call(i, q=q):
                    c = latents[i]
                    return F.scaled_dot_product_attention(
                        q, c, c[..., :MLA_RANK], scale=192 ** -0.5, enable_gqa=True)

                try:
                    us = median_us(torch, call, copies, args.runs)
                except RuntimeError as e:  # no backend for this shape
                    print(f"{batch:>5} {context:>7} {heads:>5} skipped: {e}".splitlines()[0])
                    continue
                moved = latent_bytes + batch * heads * (MLA_DIM + MLA_RANK) * 2
                pct = 100.0 * moved / (us * 1e-6) / (args.peak_gbps * 1e9)
                print(f"{batch:>5} {context:>7} {heads:>5} {us:>10.2f} {pct:>6.1f}%", flush=True)
                lines.append(f"{batch} {context} {heads} {us:.3f}\n")
            del latents
            torch.cuda.empty_cache()
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="sdpa_contiguous.txt")
    parser.add_argument("--mla-out", default="sdpa_mla.txt")
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
                us = median_us(torch, lambda i, q=q: F.scaled_dot_product_attention(
                    q, ks[i], vs[i], enable_gqa=True), copies, args.runs)
                moved = kv_bytes + 2 * q.numel() * 2
                pct = 100.0 * moved / (us * 1e-6) / (args.peak_gbps * 1e9)
                print(f"{batch:>5} {context:>7} {group:>5} {us:>10.2f} {pct:>6.1f}%", flush=True)
                lines.append(f"{batch} {context} {group} {us:.3f}\n")
            del ks, vs
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        f.writelines(lines)
    print(f"wrote {args.out}")
    mla_lines = mla_baseline(torch, F, device, l2_bytes, args)
    with open(args.mla_out, "w") as f:
        f.writelines(mla_lines)
    print(f"wrote {args.mla_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
