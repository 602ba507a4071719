"""paged_decode_attention on PyTorch CUDA tensors: the same bits eagerly, under a CUDA
graph and run by run; close to the C++ CPU reference. Skipped without torch or a GPU."""

import numpy as np
import pytest

import pagedkv as pk

torch = pytest.importorskip("torch", reason="PyTorch is not installed: CUDA tests skipped")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device visible to PyTorch: CUDA tests skipped", allow_module_level=True)
if not pk.cuda_device_available():
    pytest.skip(f"pagedkv has no CUDA: {pk.cuda_unavailable_reason()}", allow_module_level=True)

BLOCK, KV_HEADS, Q_HEADS, HEAD_DIM, NUM_BLOCKS = 16, 8, 32, 128, 512


def inputs(dtype, lens, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK, HEAD_DIM, generator=g).to(dtype)
    q = torch.randn(len(lens), Q_HEADS, HEAD_DIM, generator=g).to(dtype)
    max_blocks = max(-(-n // BLOCK) for n in lens)
    table = torch.randperm(NUM_BLOCKS, generator=g)[: len(lens) * max_blocks]
    table = table.reshape(len(lens), max_blocks).to(torch.int32)
    return q, k, v, table, torch.tensor(lens, dtype=torch.int32)


def decode(q, k, v, table, lens, **kw):
    out = torch.empty_like(q)
    pk.paged_decode_attention(q, k, v, table, lens, out, **kw)
    return out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cuda_matches_cpu_reference_and_is_deterministic(dtype):
    lens = [1, 15, 16, 17, 97, 0, 2048, 33]
    q, k, v, table, ctx = inputs(dtype, lens)
    cuda = [t.cuda() for t in (q, k, v, table, ctx)]
    first = decode(*cuda, max_context_len=max(lens))
    second = decode(*cuda, max_context_len=max(lens))
    torch.cuda.synchronize()
    assert torch.equal(first, second)
    cpu = decode(*(t.float() if t.is_floating_point() else t for t in (q, k, v, table, ctx)))
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}[dtype]
    assert (first.float().cpu() - cpu).abs().max().item() <= tol


def test_cuda_graph_replay_gives_the_same_bits():
    lens = [300, 5, 4096, 64]
    q, k, v, table, ctx = (t.cuda() for t in inputs(torch.bfloat16, lens, seed=1))
    eager = decode(q, k, v, table, ctx, max_context_len=4096)
    workspace = torch.empty(
        pk.decode_workspace_bytes(q, k, v, table, ctx, max_context_len=4096), dtype=torch.uint8,
        device="cuda")
    out = torch.empty_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture, as CUDA graphs require
        pk.paged_decode_attention(q, k, v, table, ctx, out, max_context_len=4096,
                                  workspace=workspace)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    out.zero_()
    with torch.cuda.graph(graph):
        pk.paged_decode_attention(q, k, v, table, ctx, out, max_context_len=4096,
                                  workspace=workspace)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_write_kv_and_storage_on_cuda():
    spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                          dtype=pk.DType.BFLOAT16, block_size=BLOCK)
    storage = pk.KvStorage(spec, 8, device=pk.Device.CUDA, num_host_blocks=2)
    k_cache = torch.from_dlpack(storage.k_cache(0))
    v_cache = torch.from_dlpack(storage.v_cache(0))
    assert k_cache.is_cuda and k_cache.dtype == torch.bfloat16
    k = torch.randn(3, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    slots = torch.tensor([0, 17, 33], dtype=torch.int64, device="cuda")
    pk.write_kv(k, k, slots, k_cache, v_cache)
    storage.copy_blocks([pk.BlockCopy(src=1, dst=5, num_tokens=2)])
    torch.cuda.synchronize()
    assert torch.equal(k_cache[1, :, 1], k[1]) and torch.equal(k_cache[5, :, 1], k[1])
    with pytest.raises(ValueError, match="cpu"):
        pk.write_kv(k.cpu(), k.cpu(), slots, k_cache, v_cache)  # mixed devices


def test_host_tier_copies_on_cuda_round_trip_a_block():
    spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                          dtype=pk.DType.BFLOAT16, block_size=BLOCK)
    storage = pk.KvStorage(spec, 8, device=pk.Device.CUDA, num_host_blocks=2)
    k_cache = torch.from_dlpack(storage.k_cache(0))
    v_cache = torch.from_dlpack(storage.v_cache(0))
    k = torch.randn(KV_HEADS, BLOCK, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k_cache[3] = k
    v_cache[3] = -k
    storage.demote([pk.BlockCopy(src=3, dst=1, num_tokens=BLOCK)])  # device 3 -> host 1
    storage.synchronize()
    host_k = torch.from_dlpack(storage.host_k_cache(0))
    assert torch.equal(host_k[1], k.cpu())
    k_cache[3].zero_()  # the device block is reused
    storage.promote(np.array([[1, 6, BLOCK]], np.int32))  # host 1 -> device 6
    storage.synchronize()
    assert torch.equal(k_cache[6], k) and torch.equal(v_cache[6], -k)
