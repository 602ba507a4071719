"""The attention kernels' layer-group arguments from Python (CPU reference kernels on NumPy
arrays): sliding-window and chunked-local decode and extend, attention sinks, the MLA
decode over a latent cache written K-only; argument checks."""

import numpy as np
import pytest

import pagedkv as pk

BLOCK, KV_HEADS, Q_HEADS, HEAD_DIM = 4, 2, 4, 64
SWA, CHUNKED = pk.AttentionKind.SLIDING_WINDOW, pk.AttentionKind.CHUNKED_LOCAL


def gather(cache, row, length):
    """[length, heads, D] of one sequence (HND cache), through its table row."""
    return np.stack([cache[row[t // BLOCK], :, t % BLOCK] for t in range(length)]).astype(
        np.float64)


def reference(q, k, v, first, last, sinks=None, scale=None):
    """q [Q_HEADS, D] attending to tokens [first, last] of k, v [len, KV_HEADS, D]."""
    group = Q_HEADS // KV_HEADS
    scale = scale or 1 / np.sqrt(q.shape[-1])
    out = np.zeros((Q_HEADS, v.shape[-1]))
    for h in range(Q_HEADS):
        kk, vv = k[first:last + 1, h // group], v[first:last + 1, h // group]
        s = kk @ q[h].astype(np.float64) * scale
        top = s.max() if sinks is None else max(s.max(), sinks[h])
        p = np.exp(s - top)
        denominator = p.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top))
        out[h] = p @ vv / denominator
    return out


def cache_and_table(rng, lens, num_blocks=32):
    k = rng.standard_normal((num_blocks, KV_HEADS, BLOCK, HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((num_blocks, KV_HEADS, BLOCK, HEAD_DIM)).astype(np.float32)
    max_blocks = max(-(-n // BLOCK) for n in lens)
    ids = rng.permutation(np.arange(1, num_blocks))[:len(lens) * max_blocks]
    return k, v, ids.reshape(len(lens), max_blocks).astype(np.int32), np.array(lens, np.int32)


@pytest.mark.parametrize("kind,window", [(SWA, 6), (CHUNKED, 8)])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_windowed_decode_reads_only_the_window(kind, window, num_splits):
    rng = np.random.default_rng(7)
    k_cache, v_cache, table, lens = cache_and_table(rng, [3, 13, 22])
    # Released entries (wholly before each window) hold PADDING_BLOCK, and block 0 is NaN:
    # a kernel that read them would return NaN.
    k_cache[pk.PADDING_BLOCK], v_cache[pk.PADDING_BLOCK] = np.nan, np.nan
    for i, n in enumerate(lens):
        first = pk.first_attended(kind, window, int(n) - 1)
        table[i, :first // BLOCK] = pk.PADDING_BLOCK
    q = rng.standard_normal((3, Q_HEADS, HEAD_DIM)).astype(np.float32)
    out = np.zeros_like(q)
    pk.paged_decode_attention(q, k_cache, v_cache, table, lens, out, kind=kind, window=window,
                              num_splits=num_splits)
    for i, n in enumerate(lens):
        n = int(n)
        first = pk.first_attended(kind, window, n - 1)
        k, v = gather(k_cache, table[i], n), gather(v_cache, table[i], n)
        np.testing.assert_allclose(out[i], reference(q[i], k, v, first, n - 1), rtol=1e-4,
                                   atol=1e-5)
    assert pk.decode_workspace_bytes(q, k_cache, v_cache, table, lens, num_splits=1, kind=kind,
                                     window=window) == 0


def test_sinks_join_the_softmax_denominator_in_decode_and_extend():
    rng = np.random.default_rng(8)
    k_cache, v_cache, table, lens = cache_and_table(rng, [5, 9])
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    q = rng.standard_normal((2, Q_HEADS, HEAD_DIM)).astype(np.float32)
    out = np.zeros_like(q)
    lse = np.zeros((2, Q_HEADS), np.float32)
    pk.paged_decode_attention(q, k_cache, v_cache, table, lens, out, sinks=sinks, lse=lse)
    for i, n in enumerate(lens):
        k, v = gather(k_cache, table[i], n), gather(v_cache, table[i], n)
        np.testing.assert_allclose(out[i], reference(q[i], k, v, 0, n - 1, sinks), rtol=1e-4,
                                   atol=1e-5)
    # Extend: the last 3 tokens of each sequence as new queries, sliding window 4, sinks.
    qe = rng.standard_normal((6, Q_HEADS, HEAD_DIM)).astype(np.float32)
    oe = np.zeros_like(qe)
    indptr = np.array([0, 3, 6], np.int32)
    pk.paged_extend_attention(qe, k_cache, v_cache, table, lens, indptr, oe, kind=SWA, window=4,
                              sinks=sinks)
    for i, n in enumerate(lens):
        k, v = gather(k_cache, table[i], n), gather(v_cache, table[i], n)
        for j in range(3):
            pos = n - 3 + j
            expected = reference(qe[3 * i + j], k, v, pk.first_attended(SWA, 4, pos), pos, sinks)
            np.testing.assert_allclose(oe[3 * i + j], expected, rtol=1e-4, atol=1e-5)


def test_window_and_sink_arguments_are_checked():
    rng = np.random.default_rng(9)
    k_cache, v_cache, table, lens = cache_and_table(rng, [5])
    q = np.zeros((1, Q_HEADS, HEAD_DIM), np.float32)
    out = np.zeros_like(q)
    with pytest.raises(ValueError, match="window"):
        pk.paged_decode_attention(q, k_cache, v_cache, table, lens, out, kind=SWA, window=0)
    with pytest.raises(ValueError, match="sinks has shape"):
        pk.paged_decode_attention(q, k_cache, v_cache, table, lens, out,
                                  sinks=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="sinks has dtype float64"):
        pk.paged_decode_attention(q, k_cache, v_cache, table, lens, out, sinks=np.zeros(4))


RANK, ROPE, HEADS = 16, 8, 4


def test_mla_decode_over_a_latent_cache_written_k_only():
    rng = np.random.default_rng(10)
    latent = np.zeros((8, 1, BLOCK, RANK + ROPE), np.float32)
    m = pk.KvCacheManager(layer_groups=pk.full_attention(8), block_size=BLOCK)
    for seq, n in ((1, 6), (2, 11)):
        m.add_sequence(seq, list(range(n)))
    batch = m.allocate_slots_batch([1, 2], [6, 11])
    values = rng.standard_normal((17, 1, RANK + ROPE)).astype(np.float32)
    pk.write_kv(values, None, batch.slots, latent, None)  # K only: the latents
    tables = m.build_block_tables([1, 2])
    q = rng.standard_normal((2, HEADS, RANK + ROPE)).astype(np.float32)
    out = np.zeros((2, HEADS, RANK), np.float32)
    lse = np.zeros((2, HEADS), np.float32)
    scale = 0.125
    pk.paged_mla_decode(q, latent, tables.block_table, tables.context_lens, out,
                        kv_lora_rank=RANK, sm_scale=scale, lse=lse, num_splits=2)
    for i, (begin, n) in enumerate(((0, 6), (6, 11))):
        lat = values[begin:begin + n, 0].astype(np.float64)
        for h in range(HEADS):
            s = lat @ q[i, h].astype(np.float64) * scale
            p = np.exp(s - s.max())
            np.testing.assert_allclose(out[i, h], p @ lat[:, :RANK] / p.sum(), rtol=1e-4,
                                       atol=1e-5)
            np.testing.assert_allclose(lse[i, h], s.max() + np.log(p.sum()), rtol=1e-5)
    ws = pk.mla_decode_workspace_bytes(q, latent, tables.block_table, tables.context_lens,
                                       kv_lora_rank=RANK, num_splits=2)
    assert ws == 2 * 2 * HEADS * (RANK + 2) * 4  # splits x seqs x heads x (rank + m, l) fp32


def test_mla_and_k_only_arguments_are_checked():
    latent = np.zeros((4, 1, BLOCK, RANK + ROPE), np.float32)
    table, lens = np.zeros((1, 1), np.int32), np.array([2], np.int32)
    q = np.zeros((1, HEADS, RANK + ROPE), np.float32)
    out = np.zeros((1, HEADS, RANK), np.float32)
    with pytest.raises(ValueError, match=r"kv_lora_rank 25 must be in \[1, 24\]"):
        pk.paged_mla_decode(q, latent, table, lens, out, kv_lora_rank=25, sm_scale=0.1)
    with pytest.raises(ValueError, match="out has shape"):
        pk.paged_mla_decode(q, latent, table, lens, np.zeros((1, HEADS, RANK + ROPE), np.float32),
                            kv_lora_rank=RANK, sm_scale=0.1)
    with pytest.raises(ValueError, match="sm_scale"):
        pk.paged_mla_decode(q, latent, table, lens, out, kv_lora_rank=RANK, sm_scale=0.0)
    k = np.zeros((1, 1, RANK + ROPE), np.float32)
    slots = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="v is None but v_cache is given"):
        pk.write_kv(k, None, slots, latent, latent)
    with pytest.raises(ValueError, match="v_cache is None but v is given"):
        pk.write_kv(k, k, slots, latent, None)
