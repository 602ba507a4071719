"""Layer groups (hybrid models) from Python: a manager with a full and a sliding-window
group, its tables and slots per group, blocks released behind the window, hits across
groups, partial-block reuse, per-group stats and events; KvCacheConfig's pool split."""

import numpy as np
import pytest

import pagedkv as pk

FULL, SWA, CHUNKED = (pk.AttentionKind.FULL, pk.AttentionKind.SLIDING_WINDOW,
                      pk.AttentionKind.CHUNKED_LOCAL)


def hybrid(window_blocks=5, **kw):
    """2-token blocks: a full group of 8 blocks and a sliding window of 4 tokens."""
    return pk.KvCacheManager(block_size=2, layer_groups=[
        pk.LayerGroup(kind=FULL, num_blocks=8),
        pk.LayerGroup(kind=SWA, window=4, num_blocks=window_blocks)], **kw)


def step(m, seq, token):
    m.append_tokens(seq, [token])
    slots = m.allocate_slots(seq, 1)
    m.take_step_ops()
    return slots


def test_groups_and_their_options():
    m = hybrid()
    assert m.num_groups() == 2
    assert m.layer_group(0) == pk.LayerGroup(kind=FULL, num_blocks=8)
    assert m.layer_group(1) == pk.LayerGroup(kind=SWA, window=4, num_blocks=5)
    assert repr(m.layer_group(1)) == ("LayerGroup(kind=AttentionKind.SLIDING_WINDOW, window=4, "
                                      "num_blocks=5, num_host_blocks=0)")
    assert [g.kind for g in m.options.layer_groups] == [FULL, SWA]
    assert not m.options.enable_partial_block_reuse
    assert m.stats().num_blocks == 8  # group 0's pool
    single = pk.KvCacheManager(layer_groups=pk.full_attention(4, 2))
    assert single.num_groups() == 1
    assert single.layer_group(0) == pk.LayerGroup(kind=FULL, num_blocks=4, num_host_blocks=2)
    with pytest.raises(ValueError, match=r"layer_group: layer group 2 outside \[0, 2\)"):
        m.layer_group(2)
    with pytest.raises(ValueError, match=r"group_stats: layer group -1 outside \[0, 2\)"):
        m.group_stats(-1)


def test_bad_layer_groups_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="no layer_groups; a model of full-attention layers has "
                                         r"one: full_attention\(num_blocks\)"):
        pk.KvCacheManager(layer_groups=[])
    with pytest.raises(TypeError):  # layer_groups is required
        pk.KvCacheManager()
    with pytest.raises(ValueError, match="num_blocks 0 must be > 0"):
        pk.KvCacheManager(layer_groups=pk.full_attention(0))
    with pytest.raises(ValueError, match=r"layer_groups\[1\] \(sliding_window\)"):
        pk.KvCacheManager(layer_groups=[pk.LayerGroup(num_blocks=4),
                                        pk.LayerGroup(kind=SWA, num_blocks=4)])
    with pytest.raises(ValueError, match="need a full-attention group"):
        pk.KvCacheManager(layer_groups=[pk.LayerGroup(kind=SWA, window=4, num_blocks=4)])
    with pytest.raises(TypeError):  # an int32 field: nanobind's int conversion
        pk.LayerGroup(num_blocks=2**31)


def test_slots_tables_and_window_releases_per_group():
    m = hybrid()
    m.add_sequence(1, [1, 2, 3, 4, 5, 6, 7, 8])
    assert m.match_prefix(1) == 0
    assert m.allocate_slots(1, 8).tolist() == list(range(8))
    assert m.slot_mapping(0).tolist() == list(range(8))
    assert m.slot_mapping(1).tolist() == list(range(8))
    m.take_step_ops()
    # Token 8 attends to 5..8: the window group releases blocks 0 and 1 (cached, free).
    assert step(m, 1, 9).tolist() == [8]
    assert m.slot_mapping(1).tolist() == [8]
    view = m.sequence(1, 1)
    assert view.block_table.tolist() == [pk.NO_BLOCK, pk.NO_BLOCK, 2, 3, 4]
    assert view.first_held_block == 2 and view.group == 1
    assert m.sequence(1).block_table.tolist() == [0, 1, 2, 3, 4]
    assert m.sequence(1).first_held_block == 0
    step(m, 1, 10)  # token 9 attends to 6..9: block 2 released
    assert m.sequence(1, group=1).first_held_block == 3
    # Token 10 needs a new block: the full group takes clean block 5, the window group has
    # none clean left and evicts its least recently released cached block, 0.
    assert step(m, 1, 11).tolist() == [10]
    assert m.slot_mapping(1).tolist() == [0]
    assert m.sequence(1, 1).block_table.tolist() == [-1, -1, -1, 3, 4, 0]

    tables = m.build_block_tables([1], group=1)
    assert tables.block_table.tolist() == [[pk.PADDING_BLOCK] * 3 + [3, 4, 0]]
    assert tables.context_lens.tolist() == [11]
    assert m.build_block_tables([1]).block_table.tolist() == [[0, 1, 2, 3, 4, 5]]
    block_table, lens = np.full((1, 8), 77, np.int32), np.zeros(1, np.int32)
    m.write_block_tables([1], block_table, lens, group=1)
    assert block_table.tolist() == [[0, 0, 0, 3, 4, 0, 0, 0]] and lens.tolist() == [11]
    indptr, indices, last = np.zeros(2, np.int32), np.zeros(6, np.int32), np.zeros(1, np.int32)
    m.write_csr_block_tables([1], indptr, indices, last, group=1)
    assert (indptr.tolist(), indices.tolist(), last.tolist()) == ([0, 6], [0, 0, 0, 3, 4, 0], [1])

    full, window = m.group_stats(0), m.group_stats(1)
    assert (full.used_blocks, full.released_blocks, full.evictions) == (6, 0, 0)
    assert (window.used_blocks, window.cached_free_blocks, window.released_blocks,
            window.evictions) == (3, 2, 3, 1)
    assert window._asdict()["released_blocks"] == 3
    for bad in (2, -1):
        with pytest.raises(ValueError, match=rf"layer group {bad} outside \[0, 2\)"):
            m.slot_mapping(bad)
        with pytest.raises(ValueError, match=rf"build_block_tables: layer group {bad} outside"):
            m.build_block_tables([1], group=bad)
        with pytest.raises(ValueError, match=rf"sequence: layer group {bad} outside"):
            m.sequence(1, bad)
        with pytest.raises(ValueError, match=rf"write_block_tables: layer group {bad} outside"):
            m.write_block_tables([1], block_table, lens, group=bad)
    with pytest.raises(TypeError):
        m.slot_mapping(2**31)  # beyond int32: nanobind's int conversion
    m.check_invariants()


def test_a_hit_needs_every_group_and_the_window_group_can_cut_it():
    m = hybrid()
    m.add_sequence(1, [1, 2, 3, 4, 5, 6, 7, 8])
    m.match_prefix(1)
    m.allocate_slots(1, 8)
    m.take_step_ops()
    for token in (9, 10, 11):  # as above: the window group evicts its block 0 ([1, 2])
        step(m, 1, token)
    m.free(1)
    m.take_step_ops()
    # Blocks 0 and 1 are cached in the full group, but a 2-block hit needs block 0 in the
    # window group (position 4 attends to 1..4): gone, so no hit at all.
    m.add_sequence(2, [1, 2, 3, 4, 77])
    assert m.match_prefix(2) == 0
    m.free(2)
    # A 4-block hit needs blocks 2 and 3 there (position 8 attends to 5..8): both cached.
    m.add_sequence(3, [1, 2, 3, 4, 5, 6, 7, 8, 50])
    assert m.match_prefix(3) == 8
    assert m.sequence(3, 1).block_table.tolist() == [-1, -1, 2, 3]
    assert m.sequence(3, 1).first_held_block == 2
    assert m.sequence(3, 0).block_table.tolist() == [0, 1, 2, 3]
    assert (m.group_stats(0).hit_blocks, m.group_stats(1).hit_blocks) == (4, 2)
    stats = m.stats()
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (8 + 5 + 9, 8)
    # Token 8 goes into a new block of each group: the clean block sequence 1 freed first
    # (its unhashed last block goes to the head of the free queue), 5 and 0.
    assert m.allocate_slots(3, 1).tolist() == [10]
    assert m.slot_mapping(1).tolist() == [0]
    m.check_invariants()


def test_batched_slots_per_group():
    m = hybrid(window_blocks=8)
    for seq, prompt in ((1, [1, 2, 3]), (2, [4, 5, 6, 7, 8])):
        m.add_sequence(seq, prompt)
    batch = m.allocate_slots_batch([1, 2], [3, 5])
    assert batch.ok and batch.slots.tolist() == [0, 1, 2, 4, 5, 6, 7, 8]
    assert len(batch.group_slots) == 2
    assert batch.group_slots[0] is batch.slots
    assert batch.group_slots[1].tolist() == [0, 1, 2, 4, 5, 6, 7, 8]
    assert m.batch_slot_mapping(1).tolist() == batch.group_slots[1].tolist()
    m.take_step_ops()
    m.append_tokens_batch([1, 2], [9, 9])
    out = np.zeros(2, np.int64)
    batch = m.allocate_slots_batch([1, 2], 1, out=out)
    assert out.tolist() == [3, 9] and batch.group_slots[0] is out
    assert batch.group_slots[1].tolist() == [3, 9]
    with pytest.raises(ValueError, match=r"batch_slot_mapping: layer group 2 outside"):
        m.batch_slot_mapping(2)
    # One group: group_slots holds slots alone.
    single = pk.KvCacheManager(layer_groups=pk.full_attention(4), block_size=2)
    single.add_sequence(1, [1, 2])
    b = single.allocate_slots_batch([1], [2])
    assert len(b.group_slots) == 1 and b.group_slots[0].tolist() == [0, 1]


def test_partial_block_reuse_copies_in_every_group():
    m = hybrid(window_blocks=8, enable_partial_block_reuse=True)
    assert m.options.enable_partial_block_reuse
    m.add_sequence(1, [1, 2, 3, 4, 5, 6, 7, 8])
    m.allocate_slots(1, 8)
    m.take_step_ops()
    m.free(1)
    # 3 full blocks, then the first token of block 3 ([7, 8]) through a copy-on-write copy.
    m.add_sequence(2, [1, 2, 3, 4, 5, 6, 7, 99, 100])
    assert m.match_prefix(2) == 7
    copies = m.take_step_ops().copy_on_write
    assert [(c.src, c.num_tokens, c.group) for c in copies] == [(3, 1, 0), (3, 1, 1)]
    assert m.stats().partial_hit_tokens == 1
    assert m.stats()._asdict()["partial_hit_tokens"] == 1
    m.check_invariants()


def test_each_group_storage_runs_its_own_copies():
    """KvStorage(..., layer_group=g), a hybrid model's storage per group: run_step_ops()
    runs the copies of its group, and a single-list call refuses another group's copy."""
    m = hybrid(window_blocks=8)
    m.add_sequence(1, [1, 2, 3])
    m.allocate_slots(1, 3)
    m.take_step_ops()
    m.fork(1, 2)
    m.append_tokens(2, [5])
    m.allocate_slots(2, 1)  # block 1 (one token) is shared: a copy-on-write in each group
    ops = m.take_step_ops()
    assert ops.copy_on_write == [pk.BlockCopy(1, 2, 1), pk.BlockCopy(1, 2, 1, group=1)]
    spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=1, head_dim=4, dtype=pk.DType.FLOAT32,
                          block_size=2)
    storages = [pk.KvStorage(spec, 8, device=pk.Device.CPU, layer_group=g) for g in (0, 1)]
    assert [s.layer_group for s in storages] == [0, 1]
    pools = [np.from_dlpack(s.k_cache(0)) for s in storages]
    for g, pool in enumerate(pools):
        pool[:] = np.arange(pool.size, dtype=np.float32).reshape(pool.shape) + 1000 * g
    before = [pool.copy() for pool in pools]
    for storage in storages:
        storage.run_step_ops(ops)
    for g, pool in enumerate(pools):
        expected = before[g].copy()
        expected[2, :, :1] = before[g][1, :, :1]  # the group's copy ran once
        np.testing.assert_array_equal(pool, expected)
    with pytest.raises(ValueError, match="group"):
        storages[1].copy_blocks([pk.BlockCopy(1, 2, 1)])
    with pytest.raises(ValueError, match="layer_group -1"):
        pk.KvStorage(spec, 8, device=pk.Device.CPU, layer_group=-1)


def test_events_name_the_group_of_a_hybrid_manager_only():
    events = pk.KvEventBuffer()
    m = hybrid(event_sink=events)
    m.add_sequence(1, [1, 2, 3, 4, 5])
    m.allocate_slots(1, 5)
    stored = [e for e in events.take() if isinstance(e, pk.BlockStored)]
    assert [(e.group.index, e.group.kind, e.group.window, len(e.block_hashes))
            for e in stored] == [(0, FULL, 0, 2), (1, SWA, 4, 2)]
    assert repr(stored[1].group) == "EventGroup(index=1, kind=AttentionKind.SLIDING_WINDOW, window=4)"
    assert stored[0].block_hashes == stored[1].block_hashes  # one chain, cached in each group
    plain = pk.KvEventBuffer()
    single = pk.KvCacheManager(layer_groups=pk.full_attention(4), block_size=2, event_sink=plain)
    single.add_sequence(1, [1, 2, 3])
    single.allocate_slots(1, 3)
    assert [e.group for e in plain.take()] == [None]


def test_first_attended():
    assert pk.first_attended(FULL, 0, 100) == 0
    assert pk.first_attended(SWA, 4, 8) == 5
    assert pk.first_attended(SWA, 4, 2) == 0
    assert pk.first_attended(CHUNKED, 8, 13) == 8
    with pytest.raises(ValueError, match="first_attended: window 0 must be > 0 for chunked_local"):
        pk.first_attended(CHUNKED, 0, 5)
    with pytest.raises(ValueError, match="first_attended: pos -1 must be >= 0"):
        pk.first_attended(SWA, 4, -1)


def gemma3_config():
    """Gemma-3-27B: 52 sliding-window layers of 1,024 tokens and 10 full ones."""
    shape = dict(num_kv_heads=16, head_dim=128)
    return pk.KvCacheConfig([
        pk.KvCacheGroup(kind=SWA, window=1024, shape=pk.KvCacheSpec(num_layers=52, **shape)),
        pk.KvCacheGroup(kind=FULL, shape=pk.KvCacheSpec(num_layers=10, **shape))],
        dtype=pk.DType.BFLOAT16, block_size=16)


def test_kv_cache_config_and_the_budget_split():
    config = gemma3_config()
    config.validate()
    assert config.num_groups() == 2 and config.num_layers() == 62
    assert config.bytes_per_token(0) == 425984  # 2 x 52 x 16 x 128 x 2
    assert config.bytes_per_token() == 507904
    assert config.page_bytes(1) == 16 * 81920
    assert config.group_spec(0).dtype == pk.DType.BFLOAT16
    assert config.min_bytes_per_sequence(32768) == 3120562176
    assert config.tokens_attended(0, 32768) == 1024 and config.tokens_attended(1, 100) == 100
    assert config.blocks_per_sequence(0, 32768) == 66  # ceil((1023 + 16) / 16) + 1
    assert config.blocks_per_sequence(1, 32768) == 2048
    split = config.split_budget(64 << 30, 32768)
    assert [g.kind for g in split.groups] == [SWA, FULL]
    assert [g.window for g in split.groups] == [1024, 0]
    assert split.used_bytes + split.lost_bytes == split.budget_bytes == 64 << 30
    assert split.pool_bytes == [g.num_blocks * config.page_bytes(i)
                                for i, g in enumerate(split.groups)]
    assert split.target_tokens == 32768 and split.cached_tokens == 0
    assert config.max_sequences(split, 32768) == 21  # as docs/allocator.md has it
    # Counting 262,144 cached tokens: the full pool stops at 16,384 + 2,048 blocks and
    # the sliding pool takes the rest (tests/kv_cache_config_test.cc works it out).
    cached = config.split_budget(64 << 30, 32768, cached_tokens=262144)
    assert [g.num_blocks for g in cached.groups] == [6537, 18432]
    assert cached.cached_tokens == 262144
    # The split's groups are what the manager takes.
    m = pk.KvCacheManager(block_size=16, layer_groups=split.groups)
    assert [m.layer_group(g).num_blocks for g in range(2)] == [g.num_blocks for g in split.groups]


def test_kv_cache_config_errors_name_the_value():
    config = gemma3_config()
    with pytest.raises(ValueError, match=r"tokens_attended: group 2 outside \[0, 2\)"):
        config.tokens_attended(2, 10)
    with pytest.raises(ValueError, match="budget"):
        config.split_budget(-1, 32768)
    with pytest.raises(ValueError, match=r"cached_tokens is -1, must be in \[0, 2\^50\]"):
        config.split_budget(1 << 30, 32768, cached_tokens=-1)
    bad = pk.KvCacheConfig([pk.KvCacheGroup(kind=CHUNKED, window=0)])
    with pytest.raises(ValueError, match="window"):
        bad.blocks_per_sequence(0, 100)  # refused, not a division by zero
    with pytest.raises(ValueError):
        pk.KvCacheConfig([]).validate()


def test_state_group_slots_checkpoints_and_restores():
    """A STATE group: a slot per started sequence, a checkpoint at the prompt's last full
    block (saved during the step's computation), restored by a later prompt's hit."""
    m = pk.KvCacheManager(block_size=4, layer_groups=[
        pk.LayerGroup(kind=FULL, num_blocks=16),
        pk.LayerGroup(kind=pk.AttentionKind.STATE, num_blocks=8)])
    m.add_sequence(1, list(range(100, 110)))
    m.allocate_slots(1, 10)
    assert m.write_state_slots([1], 1) == [0]
    assert list(m.slot_mapping(1)) == [-1] * 10
    ops = m.take_step_ops()
    assert [(s.seq, s.position, s.src, s.dst, s.group) for s in ops.save_state] == [
        (1, 8, 0, 1, 1)]
    m.free(1)
    m.add_sequence(2, list(range(100, 108)) + [200, 201, 202, 203])
    assert m.match_prefix(2) == 8
    ops = m.take_step_ops()
    assert ops.copy_state == [pk.BlockCopy(1, 0, 4, group=1)]
    assert m.group_stats(1).checkpoints_restored == 1
    with pytest.raises(ValueError, match="state group"):
        m.write_state_slots([2], 0)
    # The group's storage runs the restore: checkpoint slot 1 into the sequence's slot 0,
    # every layer's conv and recurrent state (4 + 2 fp32 values, 24 bytes a layer).
    shape = pk.StateShape(num_layers=2, conv_elements=4, recurrent_elements=2,
                          conv_dtype=pk.DType.FLOAT32, recurrent_dtype=pk.DType.FLOAT32)
    storage = pk.KvStorage.create_state(shape, 8, device=pk.Device.CPU, layer_group=1)
    assert storage.holds_state and storage.layer_group == 1 and storage.bytes == 2 * 8 * 24
    layers = [np.from_dlpack(storage.state_cache(layer)) for layer in range(2)]
    assert layers[0].shape == (8, 24) and layers[0].dtype == np.uint8
    for layer, slots in enumerate(layers):
        slots[1].view(np.float32)[:] = [layer + 0.5 * i for i in range(6)]
    storage.run_step_ops(ops)
    for layer, slots in enumerate(layers):
        assert list(slots[0].view(np.float32)) == [layer + 0.5 * i for i in range(6)]
        assert not slots[2].any()
    with pytest.raises(ValueError, match="no K/V pools"):
        storage.k_cache(0)
    with pytest.raises(ValueError, match="a state shape of 0 layers"):
        pk.KvStorage.create_state(pk.StateShape(num_layers=0, conv_elements=4), 8)


def test_state_shape_in_a_kv_cache_config():
    # Qwen3-Next's Gated DeltaNet layer in bf16: conv 3 x (2 x 16 x 128 + 32 x 128) and
    # recurrent 32 x 128 x 128 elements.
    shape = pk.StateShape(num_layers=36, conv_elements=3 * (2 * 16 * 128 + 32 * 128),
                          recurrent_elements=32 * 128 * 128, conv_dtype=pk.DType.BFLOAT16,
                          recurrent_dtype=pk.DType.BFLOAT16)
    assert shape.bytes_per_layer() == 2 * (24576 + 524288) == 1097728
    assert shape.bytes() == 36 * 1097728
    group = pk.KvCacheGroup(kind=pk.AttentionKind.STATE, state=shape)
    assert group.state.num_layers == 36
    config = pk.KvCacheConfig([pk.KvCacheGroup(kind=FULL, shape=pk.KvCacheSpec(
        num_layers=12, num_kv_heads=2, head_dim=256)), group])
    config.validate()
    assert config.checkpoints_per_sequence == 2


def test_shared_block_pool():
    # Both groups draw from one pool of 8 blocks: distinct ids, the fit summed over groups.
    m = pk.KvCacheManager(block_size=2, shared_block_pool=True, window_eviction_classes=False,
                          layer_groups=[pk.LayerGroup(kind=FULL, num_blocks=8),
                                        pk.LayerGroup(kind=SWA, window=4, num_blocks=8)])
    assert m.options.shared_block_pool and not m.options.window_eviction_classes
    m.add_sequence(1, [1, 2, 3, 4, 5, 6])
    m.allocate_slots(1, 6)
    full, window = (list(m.sequence(1, g).block_table) for g in (0, 1))
    assert full == [0, 1, 2] and window == [3, 4, 5]
    assert m.stats().used_blocks == 6
    m.take_step_ops()
    m.add_sequence(2, [7, 8, 9, 10])
    with pytest.raises(pk.ResourceExhausted, match="in the pool all groups share"):
        m.allocate_slots(2, 4)  # 2 blocks per group, 2 free
    m.check_invariants()
    with pytest.raises(ValueError, match="shared_block_pool: layer_groups\\[1\\].num_blocks 6"):
        pk.KvCacheManager(block_size=2, shared_block_pool=True,
                          layer_groups=[pk.LayerGroup(kind=FULL, num_blocks=8),
                                        pk.LayerGroup(kind=SWA, window=4, num_blocks=6)])
