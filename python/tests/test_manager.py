"""KvCacheManager from Python: every operation, and Status -> exception mapping."""

import numpy as np
import pytest

import pagedkv as pk


def make(num_blocks=16, block_size=4, num_host_blocks=0, **kw):
    return pk.KvCacheManager(layer_groups=pk.full_attention(num_blocks, num_host_blocks),
                             block_size=block_size, **kw)


def prefill(m, seq, prompt):
    m.add_sequence(seq, prompt)
    cached = m.match_prefix(seq)
    return cached, m.allocate_slots(seq, len(prompt) - cached)


def test_prefill_decode_and_free():
    m = make()
    cached, slots = prefill(m, 7, list(range(10)))
    assert cached == 0
    assert slots.dtype == np.int64
    assert slots.tolist() == list(range(10))  # blocks 0, 1, 2 in order
    m.append_tokens(7, [99])
    assert m.allocate_slots(7, 1).tolist() == [10]
    view = m.sequence(7)
    assert view.state == pk.SequenceState.RUNNING
    assert view.num_computed_tokens == 11
    assert view.tokens.tolist() == list(range(10)) + [99]
    assert view.block_table.tolist() == [0, 1, 2]
    assert 7 in m and m.contains(7) and len(m) == m.num_sequences() == 1
    m.free(7)
    assert 7 not in m
    m.check_invariants()


def test_prefix_hit_and_stats():
    m = make()
    prefill(m, 1, list(range(9)))
    m.take_step_ops()  # the step ends: its K/V counts as written
    m.free(1)
    m.add_sequence(2, np.arange(9, dtype=np.int32))
    assert m.match_prefix(2) == 8  # two full blocks; never the last token
    stats = m.stats()
    assert stats.prefix_query_tokens == 18 and stats.prefix_hit_tokens == 8  # both prompts
    assert stats.num_blocks == 16
    assert set(stats._asdict()) >= {"used_blocks", "free_blocks", "cached_free_blocks", "evictions"}
    m.reset_prefix_cache()
    m.add_sequence(3, list(range(9)))
    assert m.match_prefix(3) == 0
    m.check_invariants()


def test_peek_prefix_reports_the_hit_without_claiming_it():
    m = make()
    prefill(m, 1, list(range(9)))
    m.take_step_ops()
    m.free(1)
    m.add_sequence(2, list(range(9)))
    stats = m.stats()
    hit = m.peek_prefix(2)
    assert isinstance(hit, pk.PrefixHit)
    assert hit.num_tokens == 8 and hit.num_partial_tokens == 0
    (group,) = hit.groups
    assert isinstance(group, pk.PrefixHitGroup)
    assert group.blocks == [0, 1]
    assert group.num_free_hits == 2 and group.num_new_blocks == 0 and group.blocks_taken == 2
    # Nothing changed: the counters, the free blocks, the sequence (the eviction order:
    # tests/prefix_hit_test.cc).
    assert m.stats().prefix_query_tokens == stats.prefix_query_tokens
    assert m.stats().free_blocks == stats.free_blocks
    assert m.sequence(2).num_computed_tokens == 0
    m.check_invariants()
    assert m.match_prefix(2) == hit.num_tokens
    assert m.sequence(2).block_table.tolist() == group.blocks
    assert m.stats().free_blocks == stats.free_blocks - group.blocks_taken
    with pytest.raises(KeyError, match="99"):
        m.peek_prefix(99)
    with pytest.raises(pk.FailedPrecondition, match="peek_prefix"):
        m.peek_prefix(2)  # holds its claim
    m.check_invariants()


def test_counters_asdict_and_repr_list_every_field():
    m = make()
    prefill(m, 1, list(range(9)))
    pool = pk.BlockPool(num_blocks=4, block_size=4)
    for stats, name in ((m.stats(), "KvCacheManager.Stats"),
                        (m.group_stats(0), "KvCacheManager.GroupStats"),
                        (pool.stats(), "BlockPool.Stats")):
        fields = {n for n in dir(stats) if not n.startswith("_")}
        d = stats._asdict()
        assert set(d) == fields
        assert all(getattr(stats, k) == v for k, v in d.items())
        assert repr(stats) == name + "(" + ", ".join(f"{k}={v}" for k, v in d.items()) + ")"
    assert m.stats().used_blocks == 3 and m.group_stats(0).used_blocks == 3


def test_tokens_accepted_as_lists_and_arrays_of_any_int_dtype():
    m = make()
    m.add_sequence(1, [1, 2, 3])
    m.add_sequence(2, np.array([1, 2, 3], dtype=np.int64))
    m.add_sequence(3, (1, 2, 3))
    for s in (1, 2, 3):
        assert m.sequence(s).tokens.tolist() == [1, 2, 3]
    with pytest.raises(TypeError):
        m.add_sequence(4, np.array([1.5, 2.0]))


def test_fork_and_copy_on_write():
    m = make()
    prefill(m, 1, list(range(6)))  # block 1 half full
    m.take_step_ops()  # end the step
    m.fork(1, 2)
    assert m.sequence(2).block_table.tolist() == m.sequence(1).block_table.tolist()
    m.append_tokens(2, [50])
    m.allocate_slots(2, 1)
    copies = m.take_step_ops().copy_on_write
    assert len(copies) == 1
    op = copies[0]
    assert isinstance(op, pk.BlockCopy)
    assert op == pk.BlockCopy(src=1, dst=op.dst, num_tokens=2) and op.dst not in (0, 1)
    assert m.stats().cow_copies == 1
    m.check_invariants()


def test_preempt_swap_and_swap_in():
    m = make(num_host_blocks=8)
    prefill(m, 1, list(range(8)))
    m.take_step_ops()
    m.preempt(1, pk.PreemptionMode.SWAP)
    assert m.sequence(1).state == pk.SequenceState.SWAPPED
    ops = m.take_step_ops()
    assert len(ops.swap_out) == 2 and ops.swap_in == [] and not ops.empty()
    assert m.take_step_ops().empty()  # a step's ops are taken once
    m.swap_in(1)
    assert m.sequence(1).state == pk.SequenceState.RUNNING
    assert len(m.take_step_ops().swap_in) == 2
    assert m.stats().preemptions_swap == 1
    m.check_invariants()


def test_allocate_slots_or_preempt_uses_the_default_policy():
    m = make(num_blocks=3)
    prefill(m, 1, list(range(8)))
    m.take_step_ops()
    m.add_sequence(2, list(range(100, 108)))
    with pytest.raises(pk.ResourceExhausted):
        m.allocate_slots(2, 8)
    slots = m.allocate_slots_or_preempt(2, 8)
    assert len(slots) == 8
    assert m.sequence(1).state == pk.SequenceState.WAITING
    assert m.stats().preemptions_recompute == 1


def test_running_sequences_and_options():
    m = make(watermark_blocks=1, preemption_mode=pk.PreemptionMode.SWAP, num_host_blocks=2)
    prefill(m, 5, [1, 2])
    prefill(m, 6, [3, 4])
    assert [s.id for s in m.running_sequences()] == [5, 6]
    o = m.options
    assert (o.block_size, o.watermark_blocks) == (4, 1)
    assert o.layer_groups == pk.full_attention(16, 2)
    assert o.preemption_mode == pk.PreemptionMode.SWAP and o.enable_prefix_caching


@pytest.mark.parametrize(
    "call, exc, message",
    [
        (lambda m: m.free(42), KeyError, "unknown sequence 42"),
        (lambda m: m.append_tokens(42, [1]), KeyError, "42"),
        (lambda m: m.add_sequence(1, [1]), pk.AlreadyExists, "1"),
        (lambda m: m.add_sequence(9, []), ValueError, "empty"),
        (lambda m: m.allocate_slots(1, -1), ValueError, "-1"),
        (lambda m: m.allocate_slots(2, 1000), ValueError, "1000"),
        (lambda m: m.match_prefix(1), pk.FailedPrecondition, "waiting"),
        (lambda m: m.preempt(2, pk.PreemptionMode.RECOMPUTE), pk.FailedPrecondition, "2"),
        (lambda m: m.swap_in(1), pk.FailedPrecondition, "1"),
        (lambda m: m.fork(42, 43), KeyError, "42"),
        (lambda m: m.fork(1, 2), pk.AlreadyExists, "2"),
        (lambda m: m.build_block_tables([2]), pk.FailedPrecondition, "2"),
        (lambda m: m.sequence(42), KeyError, "42"),
    ],
)
def test_errors_map_to_exceptions_with_the_status_message(call, exc, message):
    m = make()
    prefill(m, 1, [1, 2, 3])
    m.add_sequence(2, [4, 5])
    before = m.stats()._asdict()
    with pytest.raises(exc) as info:
        call(m)
    assert message in str(info.value)
    assert m.stats()._asdict() == before  # nothing changed
    m.check_invariants()


def test_resource_exhausted_is_a_runtime_error_and_changes_nothing():
    m = make(num_blocks=3)
    prefill(m, 1, [1])
    m.add_sequence(2, list(range(12)))
    with pytest.raises(pk.ResourceExhausted, match="need 3 blocks"):
        m.allocate_slots(2, 12)
    assert issubclass(pk.ResourceExhausted, RuntimeError)
    assert issubclass(pk.AlreadyExists, ValueError)
    assert m.stats().used_blocks == 1


def test_invalid_options_raise_value_error():
    with pytest.raises(ValueError, match="num_blocks"):
        pk.KvCacheManager(layer_groups=pk.full_attention(0))
    with pytest.raises(ValueError):
        pk.KvCacheManager(layer_groups=pk.full_attention(4), watermark_blocks=4)


def test_block_tables_into_caller_arrays():
    m = make()
    prefill(m, 1, list(range(9)))
    prefill(m, 2, [7])
    table = np.full((3, 4), -5, dtype=np.int32)
    lens = np.zeros(3, dtype=np.int32)
    m.write_block_tables([1, 2], table, lens)
    assert table[:2].tolist() == [[0, 1, 2, 0], [3, 0, 0, 0]]
    assert lens[:2].tolist() == [9, 1]
    indptr, indices, last = (np.zeros(3, np.int32), np.zeros(4, np.int32), np.zeros(2, np.int32))
    m.write_csr_block_tables([1, 2], indptr, indices, last)
    assert indptr.tolist() == [0, 3, 4] and indices.tolist() == [0, 1, 2, 3] and last.tolist() == [1, 1]
    with pytest.raises(ValueError):
        m.write_block_tables([1, 2], np.zeros((2, 2), np.int32), lens)  # 3 blocks > 2
    with pytest.raises(TypeError):
        m.write_block_tables([1, 2], np.zeros((2, 4), np.int64), lens)  # wrong dtype


def test_hash_block_matches_the_pool_index():
    m = make(event_sink=(buf := pk.KvEventBuffer()))
    prefill(m, 1, [1, 2, 3, 4, 5])
    (stored,) = buf.take()
    assert isinstance(stored, pk.BlockStored)
    assert stored.block_hashes == [pk.hash_block(None, [1, 2, 3, 4])]
    assert stored.parent_hash is None and stored.token_ids == [1, 2, 3, 4] and stored.block_size == 4
    h = pk.hash_block(None, [1, 2, 3, 4])
    assert h != pk.hash_block(None, [1, 2, 3, 4], extra_keys=[7]) and hash(h) == hash(pk.BlockHash(h.lo, h.hi))


def test_release_claim_gives_a_waiting_sequences_prefix_back():
    m = make(num_blocks=4, block_size=2)
    prefill(m, 1, list(range(5)))  # blocks 0 1 2
    m.take_step_ops()  # the step ends
    m.free(1)
    m.add_sequence(2, list(range(5)))
    assert m.match_prefix(2) == 4
    assert m.stats().free_blocks == 2
    m.release_claim(2)
    m.check_invariants()
    stats = m.stats()
    assert (stats.free_blocks, stats.cached_free_blocks, stats.claims_released) == (4, 2, 1)
    assert stats._asdict()["claims_released"] == 1
    assert m.sequence(2).num_computed_tokens == 0
    m.release_claim(2)  # no claim: unchanged
    assert m.stats().claims_released == 1
    assert m.match_prefix(2) == 4  # may claim again
    m.allocate_slots(2, 1)
    with pytest.raises(pk.FailedPrecondition, match="sequence is running"):
        m.release_claim(2)
    with pytest.raises(KeyError, match="unknown sequence 9"):
        m.release_claim(9)


def test_a_claim_is_released_before_a_running_sequence_is_preempted():
    class Hooks:
        def __init__(self):
            self.preempted, self.released = [], []

        def on_preempt(self, victim, mode):
            self.preempted.append(victim)

        def on_claim_released(self, seq):
            self.released.append(seq)

    hooks = Hooks()
    m = make(num_blocks=4, block_size=2, preemption_hooks=hooks)
    prefill(m, 1, list(range(6)))  # blocks 0 1 2, full and cached
    m.take_step_ops()
    m.free(1)
    m.add_sequence(2, list(range(7)))
    assert m.match_prefix(2) == 6  # claims 0 1 2, waiting
    prefill(m, 3, [50, 51])  # block 3
    m.take_step_ops()
    m.append_tokens(3, [0])
    with pytest.raises(pk.ResourceExhausted):
        m.allocate_slots(3, 1)
    assert m.allocate_slots_or_preempt(3, 1).tolist() == [4]  # block 2, evicted
    assert hooks.preempted == [] and hooks.released == [2]
    assert m.sequence(2).state == pk.SequenceState.WAITING
    assert m.sequence(2).num_computed_tokens == 0
    assert m.stats().claims_released == 1
    m.check_invariants()
