"""NumPy views of block tables: zero copy, and when a view stops being refreshed."""

import gc

import numpy as np

import pagedkv as pk


def running_manager():
    m = pk.KvCacheManager(layer_groups=pk.full_attention(32), block_size=4)
    for seq, n in ((1, 9), (2, 3)):
        m.add_sequence(seq, list(range(seq * 100, seq * 100 + n)))
        m.allocate_slots(seq, n)
    return m


def data_ptr(a):
    return a.__array_interface__["data"][0]


def test_views_share_memory_with_the_tables():
    m = running_manager()
    t = m.build_block_tables([1, 2])
    assert np.shares_memory(t.block_table, t.block_table)  # same buffer on every access
    assert data_ptr(t.block_table) == data_ptr(t.block_table)
    assert t.block_table.shape == (2, 3) and t.block_table.dtype == np.int32
    assert t.context_lens.tolist() == [9, 3] and t.num_seqs == 2 and t.max_blocks == 3


def test_a_view_outlives_the_tables_and_the_manager():
    m = running_manager()
    table = m.build_block_tables([1, 2]).block_table
    expected = table.copy()
    del m
    gc.collect()
    assert (table == expected).all()


def test_rebuild_keeps_live_views_unchanged_and_reuses_buffers_once_they_are_gone():
    m = running_manager()
    t = m.build_block_tables([1, 2])
    old = t.block_table
    old_values = old.copy()
    m.build_block_tables([2], out=t)  # a view is alive: new buffers, old view untouched
    assert (old == old_values).all() and t.block_table.shape == (1, 1)
    assert not np.shares_memory(old, t.block_table)
    del old
    gc.collect()
    m.build_block_tables([1, 2], out=t)  # no view alive: rebuilt in place (grown)
    ptr = data_ptr(t.block_table)  # this temporary view dies at once
    same = m.build_block_tables([1, 2], out=t)
    assert same is t
    assert data_ptr(t.block_table) == ptr  # no view alive: the buffers were reused
    assert t.block_table.tolist() == [[0, 1, 2], [3, 0, 0]]


def test_sequence_arrays_are_snapshots():
    m = running_manager()
    tokens = m.sequence(1).tokens
    m.append_tokens(1, [5])
    assert len(tokens) == 9 and len(m.sequence(1).tokens) == 10
