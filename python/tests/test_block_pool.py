"""BlockPool from Python: allocation, refs, caching, and id validation."""

import pytest

import pagedkv as pk


def test_allocate_touch_free_and_cache():
    buf = pk.KvEventBuffer()
    pool = pk.BlockPool(num_blocks=4, block_size=2, event_sink=buf)
    blocks = pool.allocate(2)
    assert blocks.tolist() == [0, 1]
    h = pk.hash_block(None, [5, 6])
    assert pool.cache_full_block(0, h, -1, None, [5, 6])
    assert not pool.cache_full_block(0, h, -1, None, [5, 6])  # hashed already
    assert pool.is_cached(0) and pool.cached_hash(0) == h and pool.cached_hash(1) is None
    assert pool.find_cached(h, -1, [5, 6]) == 0
    assert pool.find_cached(h, -1, [5, 7]) == -1  # verified, not just hashed
    pool.touch(0)
    assert pool.ref_count(0) == 2
    pool.free(blocks[::-1])
    pool.free([0])
    assert pool.num_free_blocks() == 4
    # Freed blocks without a hash go to the head (reused first), cached ones to the tail.
    assert pool.free_queue_order().tolist() == [1, 2, 3, 0]
    s = pool.stats()
    assert (s.used_blocks, s.free_blocks, s.cached_free_blocks, s.cached_blocks) == (0, 4, 1, 1)
    pool.uncache(0)
    pool.reset_prefix_cache()
    kinds = [type(e).__name__ for e in buf.take()]
    assert kinds == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    pool.check_invariants()


def test_exhaustion_and_invalid_ids_raise_and_change_nothing():
    pool = pk.BlockPool(num_blocks=2, block_size=4)
    with pytest.raises(pk.ResourceExhausted, match="need 3 blocks"):
        pool.allocate(3)
    (b,) = pool.allocate(1)
    for call in (lambda: pool.touch(2), lambda: pool.ref_count(-1), lambda: pool.uncache(5),
                 lambda: pool.is_cached(2), lambda: pool.cached_hash(-1),
                 lambda: pool.free([b, 7]), lambda: pool.allocate(-1),
                 lambda: pool.find_cached(pk.BlockHash(1, 2), 9, [1, 2, 3, 4]),
                 lambda: pool.cache_full_block(b, pk.BlockHash(1, 2), -1, None, [1, 2]),
                 lambda: pool.cache_full_block(b, pk.BlockHash(1, 2), 3, None, [1, 2, 3, 4])):
        with pytest.raises(ValueError):
            call()
    # The C++ pool's own checks: a double free and caching a free block.
    with pytest.raises(pk.FailedPrecondition, match="block 1 .*ref_count 0: a double free"):
        pool.free([1])
    with pytest.raises(pk.FailedPrecondition, match="a double free"):
        pool.free([b, b])
    with pytest.raises(pk.FailedPrecondition, match="block 1 is free"):
        pool.cache_full_block(1, pk.BlockHash(1, 2), -1, None, [1, 2, 3, 4])
    assert pool.ref_count(b) == 1 and pool.num_free_blocks() == 1
    pool.check_invariants()
    with pytest.raises(ValueError):
        pk.BlockPool(num_blocks=-1)
