"""The CPU kernels and KvStorage through DLPack (NumPy arrays here), against a NumPy
reference; argument checks."""

import numpy as np
import pytest

import pagedkv as pk

BLOCK, KV_HEADS, Q_HEADS, HEAD_DIM = 4, 2, 4, 64


def random_cache(rng, num_blocks, layout=pk.KvLayout.HND, dtype=np.float32):
    shape = ((num_blocks, KV_HEADS, BLOCK, HEAD_DIM) if layout == pk.KvLayout.HND
             else (num_blocks, BLOCK, KV_HEADS, HEAD_DIM))
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))


def gather(cache, row, length, layout):
    """[length, KV_HEADS, HEAD_DIM] K (or V) of one sequence, through its table row."""
    tokens = []
    for t in range(length):
        block, offset = row[t // BLOCK], t % BLOCK
        tokens.append(cache[block, :, offset] if layout == pk.KvLayout.HND
                      else cache[block, offset])
    return np.stack(tokens).astype(np.float64)


def reference_attention(q, k, v, causal_limit):
    """q [n, Q_HEADS, D]; k, v [len, KV_HEADS, D]; row i attends to tokens < causal_limit[i]."""
    group = Q_HEADS // KV_HEADS
    out = np.zeros(q.shape, np.float64)
    for i in range(q.shape[0]):
        for h in range(Q_HEADS):
            kk, vv = k[: causal_limit[i], h // group], v[: causal_limit[i], h // group]
            scores = kk @ q[i, h].astype(np.float64) / np.sqrt(HEAD_DIM)
            p = np.exp(scores - scores.max())
            out[i, h] = (p / p.sum()) @ vv
    return out


def tables(rng, lens, num_blocks):
    max_blocks = max(-(-n // BLOCK) for n in lens)
    ids = rng.permutation(num_blocks)[: len(lens) * max_blocks].reshape(len(lens), max_blocks)
    return ids.astype(np.int32), np.array(lens, np.int32)


@pytest.mark.parametrize("layout", [pk.KvLayout.HND, pk.KvLayout.NHD])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_numpy(layout, num_splits):
    rng = np.random.default_rng(1)
    k_cache, v_cache = random_cache(rng, 32, layout)
    block_table, lens = tables(rng, [1, 7, 13], 32)
    q = rng.standard_normal((3, Q_HEADS, HEAD_DIM)).astype(np.float32)
    out = np.zeros_like(q)
    lse = np.zeros((3, Q_HEADS), np.float32)
    pk.paged_decode_attention(q, k_cache, v_cache, block_table, lens, out, layout=layout,
                              lse=lse, num_splits=num_splits)
    for i, n in enumerate(lens):
        k = gather(k_cache, block_table[i], n, layout)
        v = gather(v_cache, block_table[i], n, layout)
        np.testing.assert_allclose(out[i : i + 1], reference_attention(q[i : i + 1], k, v, [n]),
                                   rtol=1e-4, atol=1e-5)
    assert np.isfinite(lse).all()


def test_decode_fp16():
    rng = np.random.default_rng(2)
    k_cache, v_cache = random_cache(rng, 8, dtype=np.float16)
    block_table, lens = tables(rng, [9], 8)
    q = rng.standard_normal((1, Q_HEADS, HEAD_DIM)).astype(np.float16)
    out = np.zeros_like(q)
    pk.paged_decode_attention(q, k_cache, v_cache, block_table, lens, out)
    k, v = gather(k_cache, block_table[0], 9, pk.KvLayout.HND), gather(v_cache, block_table[0], 9, pk.KvLayout.HND)
    np.testing.assert_allclose(out.astype(np.float64), reference_attention(q, k, v, [9]),
                               rtol=2e-2, atol=2e-3)


def test_write_kv_then_extend_with_the_manager_and_storage():
    """A prefill on the allocator, KvStorage and the CPU kernels, against NumPy."""
    rng = np.random.default_rng(3)
    spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                          dtype=pk.DType.FLOAT32, block_size=BLOCK)
    storage = pk.KvStorage(spec, 16, device=pk.Device.CPU)
    k_cache, v_cache = storage.k_cache(0), storage.v_cache(0)
    m = pk.KvCacheManager(layer_groups=pk.full_attention(16), block_size=BLOCK)
    prompts = {1: 6, 2: 9}
    for seq, n in prompts.items():
        m.add_sequence(seq, list(range(n)))
    batch = m.allocate_slots_batch([1, 2], list(prompts.values()))
    n_total = sum(prompts.values())
    k_new = rng.standard_normal((n_total, KV_HEADS, HEAD_DIM)).astype(np.float32)
    v_new = rng.standard_normal((n_total, KV_HEADS, HEAD_DIM)).astype(np.float32)
    pk.write_kv(k_new, v_new, batch.slots, k_cache, v_cache)
    t = m.build_block_tables([1, 2])
    q = rng.standard_normal((n_total, Q_HEADS, HEAD_DIM)).astype(np.float32)
    out = np.zeros_like(q)
    qo_indptr = np.array([0, 6, 15], np.int32)
    pk.paged_extend_attention(q, k_cache, v_cache, t.block_table, t.context_lens, qo_indptr, out)
    k_np = np.from_dlpack(k_cache)
    for i, (begin, end) in enumerate(((0, 6), (6, 15))):
        n = end - begin
        k = gather(k_np, t.block_table[i], n, pk.KvLayout.HND)
        np.testing.assert_array_equal(k, k_new[begin:end])  # write_kv put each token in its slot
        v = gather(np.from_dlpack(v_cache), t.block_table[i], n, pk.KvLayout.HND)
        expected = reference_attention(q[begin:end], k, v, list(range(1, n + 1)))
        np.testing.assert_allclose(out[begin:end], expected, rtol=1e-4, atol=1e-5)


def test_storage_copy_and_swap_through_block_copies_and_arrays():
    spec = pk.KvCacheSpec(num_layers=2, num_kv_heads=1, head_dim=64, dtype=pk.DType.FLOAT32,
                          block_size=2)
    storage = pk.KvStorage(spec, 4, device=pk.Device.CPU, num_host_blocks=2)
    assert storage.bytes == 4 * spec.bytes_per_block() and storage.host_bytes == 2 * spec.bytes_per_block()
    k1 = np.from_dlpack(storage.k_cache(1))
    assert k1.shape == (4, 1, 2, 64)
    k1[0] = 1.0
    storage.copy_blocks([pk.BlockCopy(src=0, dst=3, num_tokens=1)])
    assert (k1[3, 0, 0] == 1.0).all() and (k1[3, 0, 1] == 0.0).all()  # first token only
    storage.swap_out(np.array([[0, 1, 2]], np.int32))
    assert (np.from_dlpack(storage.host_k_cache(1))[1] == 1.0).all()
    storage.swap_in([pk.BlockCopy(1, 2, 2)])
    assert (k1[2] == 1.0).all()
    with pytest.raises(ValueError, match="dst"):
        storage.copy_blocks([pk.BlockCopy(0, 9, 1)])
    with pytest.raises(IndexError):
        storage.k_cache(2)
    storage.synchronize()


def test_argument_checks_name_the_argument():
    rng = np.random.default_rng(4)
    k_cache, v_cache = random_cache(rng, 8)
    block_table, lens = tables(rng, [5, 3], 8)
    q = np.zeros((2, Q_HEADS, HEAD_DIM), np.float32)
    out = np.zeros_like(q)
    cases: list[tuple[dict, str]] = [
        (dict(q=q.astype(np.float64)), "q has dtype float64"),
        (dict(out=out[:1]), "out has shape"),
        (dict(block_table=block_table.astype(np.int64)), "block_table has dtype int64"),
        (dict(context_lens=lens[:1]), "context_lens has shape"),
        (dict(v_cache=v_cache[:4]), "v_cache"),
        (dict(k_cache=k_cache.transpose(0, 1, 3, 2), v_cache=v_cache.transpose(0, 1, 3, 2)),
         "head_dim"),
        (dict(q=np.zeros((2, Q_HEADS, 32), np.float32)), "head_dim"),
        (dict(q=np.zeros((2, Q_HEADS, HEAD_DIM * 2), np.float32)[:, :, ::2]), "C-contiguous"),
    ]
    for change, message in cases:
        args = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                    context_lens=lens, out=out)
        args.update(change)
        with pytest.raises(ValueError, match=message):
            pk.paged_decode_attention(**args)
    bad_table = block_table.copy()
    bad_table[0, 0] = 99
    with pytest.raises(ValueError, match="99"):
        pk.paged_decode_attention(q, k_cache, v_cache, bad_table, lens, out)
    with pytest.raises(ValueError, match="slot_mapping has dtype int32"):
        pk.write_kv(np.zeros((1, KV_HEADS, HEAD_DIM), np.float32),
                    np.zeros((1, KV_HEADS, HEAD_DIM), np.float32), np.zeros(1, np.int32),
                    k_cache, v_cache)


def test_decode_workspace_bytes():
    rng = np.random.default_rng(5)
    k_cache, v_cache = random_cache(rng, 8)
    block_table, lens = tables(rng, [5, 3], 8)
    q = np.zeros((2, Q_HEADS, HEAD_DIM), np.float32)
    assert pk.decode_workspace_bytes(q, k_cache, v_cache, block_table, lens, num_splits=1) == 0
    assert pk.decode_workspace_bytes(q, k_cache, v_cache, block_table, lens, num_splits=2) == \
        2 * 2 * Q_HEADS * (HEAD_DIM + 2) * 4
