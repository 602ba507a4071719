"""The prefix cache's host tier and retention priorities from Python: demotion on eviction,
promotion on a host hit, the step's copies run by KvStorage, priorities and their expiry on
an injected clock. The scenarios and values are those of tests/host_tier_test.cc."""

import numpy as np
import pytest

import pagedkv as pk

BLOCK_SIZE = 4  # a prompt of 8 tokens fills two blocks, A0 (tokens 100..103) and A1


def tokens(n, start):
    return list(range(start, start + n))


def chain(prompt):
    """The chained hashes of a prompt's full blocks, as the manager computes them."""
    hashes = []
    for i in range(0, len(prompt) - BLOCK_SIZE + 1, BLOCK_SIZE):
        hashes.append(pk.hash_block(hashes[-1] if hashes else None, prompt[i:i + BLOCK_SIZE]))
    return hashes


def tiered(device_blocks, host_blocks, events=None):
    return pk.KvCacheManager(layer_groups=pk.full_attention(device_blocks, host_blocks),
                             block_size=BLOCK_SIZE, enable_host_cache=True, event_sink=events)


def prefill(m, seq, prompt, **options):
    """Prefills prompt as one step (taking its copies) and leaves the sequence running."""
    m.add_sequence(seq, prompt, **options)
    m.allocate_slots(seq, len(prompt) - m.match_prefix(seq))
    m.take_step_ops()


def table(m, seq):
    return m.sequence(seq).block_table.tolist()


def copies(ops):
    return [(op.src, op.dst, op.num_tokens) for op in ops]


def describe(events):
    return [(type(e).__name__, e.block_hashes, e.medium) for e in events]


def test_an_evicted_cached_block_is_demoted_to_a_host_block():
    events = pk.KvEventBuffer()
    m = tiered(device_blocks=3, host_blocks=2, events=events)
    a = tokens(8, 100)
    ha = chain(a)
    prefill(m, 1, a)  # blocks 0, 1 hold A0, A1
    m.free(1)  # released tail first: device queue [2 (clean), 1, 0]
    events.take()

    # 12 new tokens take block 2 (clean), then evict 1 (A1) and 0 (A0): both are demoted,
    # into host blocks 0 and 1, in eviction order.
    m.add_sequence(2, tokens(12, 200))
    m.allocate_slots(2, 12)
    assert table(m, 2) == [2, 1, 0]
    s = m.stats()
    assert (s.evictions, s.blocks_demoted, s.cached_host_blocks, s.used_host_blocks) == (2, 2, 2, 2)

    # The device loses both, then the host gains each with its parent and tokens.
    e = events.take()
    D, H = pk.Medium.DEVICE, pk.Medium.HOST
    assert describe(e) == [("BlockRemoved", [ha[1]], D), ("BlockRemoved", [ha[0]], D),
                           ("BlockStored", [ha[1]], H), ("BlockStored", [ha[0]], H),
                           ("BlockStored", chain(tokens(12, 200)), D)]
    assert e[2].parent_hash == ha[0] and e[2].token_ids == tokens(4, 104)
    assert e[3].parent_hash is None and e[3].token_ids == tokens(4, 100)

    # The demote copies read the evicted device blocks before the step refills them.
    ops = m.take_step_ops()
    assert copies(ops.demote) == [(1, 0, BLOCK_SIZE), (0, 1, BLOCK_SIZE)]
    assert ops.swap_out == [] and ops.promote == []
    assert ops.copy_on_write == []
    assert m.stats().used_host_blocks == 0  # released once the engine took the copies
    m.check_invariants()


def test_a_host_hit_is_promoted_with_a_copy_and_counts_as_a_hit():
    events = pk.KvEventBuffer()
    m = tiered(device_blocks=3, host_blocks=2, events=events)
    a = tokens(8, 100)
    ha, hb = chain(a), chain(tokens(12, 200))
    prefill(m, 1, a)
    m.free(1)
    prefill(m, 2, tokens(12, 200))  # demotes A1 -> host 0, A0 -> host 1
    m.free(2)  # device queue [0, 1, 2]: B2, B1, B0 cached, tail first
    events.take()

    # A + one token: no device hit; A0 in host 1, A1 in host 0. The two device blocks for the
    # copies, 0 and 1, held B2 and B1: each trades places with the host block promoted into
    # it (an exchange), so B2 goes to host 1 and B1 to host 0.
    m.add_sequence(3, a + [999])
    assert m.match_prefix(3) == 8
    assert table(m, 3) == [0, 1]
    s = m.stats()
    assert (s.prefix_hit_tokens, s.host_hit_tokens, s.blocks_promoted, s.blocks_demoted,
            s.cached_host_blocks, s.host_evictions) == (8, 8, 2, 4, 2, 0)
    D, H = pk.Medium.DEVICE, pk.Medium.HOST
    assert describe(events.take()) == [
        ("BlockRemoved", [hb[2]], D), ("BlockRemoved", [hb[1]], D),
        ("BlockRemoved", [ha[0]], H), ("BlockStored", [hb[2]], H),
        ("BlockRemoved", [ha[1]], H), ("BlockStored", [hb[1]], H),
        ("BlockStored", [ha[0], ha[1]], D)]  # one event for the run

    assert m.allocate_slots(3, 1).tolist() == [8]  # block 2; B0 dropped (no free host block)
    ops = m.take_step_ops()
    assert copies(ops.exchange) == [(0, 1, BLOCK_SIZE), (1, 0, BLOCK_SIZE)]
    assert ops.promote == [] and ops.demote == []
    m.check_invariants()


def test_the_host_tier_evicts_its_least_recently_demoted_block_first():
    m = tiered(device_blocks=2, host_blocks=2)
    prompts = [tokens(4, 100 * (i + 1)) for i in range(5)]
    for seq, prompt in enumerate(prompts):
        prefill(m, seq, prompt)
        m.free(seq)
    # 100.. went to host 0, 200.. to host 1, then 300.. evicted 100.. (the host's LRU).
    s = m.stats()
    assert (s.blocks_demoted, s.host_evictions, s.cached_host_blocks) == (3, 1, 2)
    m.add_sequence(10, prompts[0] + [1])
    assert m.match_prefix(10) == 0  # gone from both tiers
    m.free(10)
    m.add_sequence(11, prompts[1] + [1])
    assert m.match_prefix(11) == 4  # from the host
    assert m.stats().host_hit_tokens == 4
    m.check_invariants()


def test_storage_runs_the_step_copies_in_order_and_a_promotion_restores_the_kv():
    spec = pk.KvCacheSpec(num_layers=1, num_kv_heads=1, head_dim=2, dtype=pk.DType.FLOAT32,
                          block_size=BLOCK_SIZE)
    storage = pk.KvStorage(spec, 3, device=pk.Device.CPU, num_host_blocks=2)
    k, host_k = np.from_dlpack(storage.k_cache(0)), np.from_dlpack(storage.host_k_cache(0))
    m = tiered(device_blocks=3, host_blocks=2)

    def step(kv_writes):
        """One engine step: the copies in the documented order, then the step's K/V."""
        storage.run_step_ops(m.take_step_ops())
        for block, value in kv_writes.items():
            k[block] = value

    a = tokens(8, 100)
    m.add_sequence(1, a)
    m.allocate_slots(1, 8)
    step({0: 1.0, 1: 2.0})  # A0 in block 0, A1 in block 1
    m.free(1)
    m.add_sequence(2, tokens(12, 200))
    m.allocate_slots(2, 12)  # evicts A1 and A0 into host blocks 0 and 1
    step({2: 3.0, 1: 4.0, 0: 5.0})  # demoted before seq 2 overwrites them
    assert host_k[:, 0, 0, 0].tolist() == [2.0, 1.0]
    m.free(2)
    m.add_sequence(3, a + [999])
    assert m.match_prefix(3) == 8
    m.allocate_slots(3, 1)
    step({})
    assert table(m, 3) == [0, 1, 2]
    assert k[:2, 0, 0, 0].tolist() == [1.0, 2.0]  # A0 and A1 back from the host
    assert (k[0] == 1.0).all() and (k[1] == 2.0).all()

    # Only whole blocks move between the tiers.
    with pytest.raises(ValueError, match="num_tokens"):
        storage.demote([pk.BlockCopy(0, 0, 1)])
    with pytest.raises(ValueError, match="num_tokens"):
        storage.promote(np.array([[0, 0, 2]], np.int32))


def test_host_tier_and_retention_options_are_validated():
    with pytest.raises(ValueError, match=r"enable_host_cache needs num_host_blocks > 0 in every "
                                         "group"):
        pk.KvCacheManager(layer_groups=pk.full_attention(4), block_size=4, enable_host_cache=True)
    with pytest.raises(ValueError, match="enable_host_cache needs enable_prefix_caching"):
        pk.KvCacheManager(layer_groups=pk.full_attention(4, 2), block_size=4,
                          enable_host_cache=True, enable_prefix_caching=False)
    assert tiered(4, 2).options.enable_host_cache
    assert not pk.KvCacheManager(layer_groups=pk.full_attention(4)).options.enable_host_cache

    m = pk.KvCacheManager(layer_groups=pk.full_attention(4), block_size=4)
    p = tokens(5, 0)
    R = pk.RetentionRange
    for ranges, message in (([R(priority=101)], "priority 101"),
                            ([R(begin=8, end=4)], r"\[8, 4\)"),
                            ([R(priority=90, duration_ms=-1)], "duration_ms -1")):
        with pytest.raises(ValueError, match=message):
            m.add_sequence(1, p, retention=ranges)
    assert len(m) == 0
    with pytest.raises(TypeError):
        m.add_sequence(1, p, retention=[(0, 4, 90, 0)])  # RetentionRange objects only


def test_retention_range_defaults_and_constants():
    r = pk.RetentionRange()
    assert (r.begin, r.end, r.priority, r.duration_ms) == (0, 2**31 - 1, 35, 0)
    assert (pk.MIN_RETENTION_PRIORITY, pk.DEFAULT_RETENTION_PRIORITY,
            pk.MAX_RETENTION_PRIORITY) == (0, 35, 100)
    assert pk.RetentionRange(end=512, priority=90) == pk.RetentionRange(
        begin=0, end=512, priority=90, duration_ms=0)
    assert pk.RetentionRange(priority=90) != pk.RetentionRange(priority=91)
    assert pk.RetentionRange() != (0, 2**31 - 1, 35, 0)  # only a RetentionRange is equal
    assert repr(pk.RetentionRange(end=4, priority=90, duration_ms=7)) == \
        "RetentionRange(begin=0, end=4, priority=90, duration_ms=7)"


def retention_scenario(priority, duration_ms=0, clock=None, before_eviction=None):
    """A system prompt's block A0 kept at `priority`, then two other prompts; with priority
    90 the device queue ends [1, 2 | 0]: A0 after the default priority's list although it
    is the least recently used. Returns the manager and whether A0 survives a two-block
    allocation."""
    m = pk.KvCacheManager(layer_groups=pk.full_attention(3), block_size=BLOCK_SIZE, clock=clock)
    retention = [pk.RetentionRange(begin=0, end=4, priority=priority, duration_ms=duration_ms)]
    prefill(m, 1, tokens(5, 100), retention=retention)  # blocks 0 (A0, full) and 1
    m.free(1)
    prefill(m, 2, tokens(4, 200))  # block 1
    m.free(2)
    prefill(m, 3, tokens(4, 300))  # block 2
    m.free(3)
    if before_eviction is not None:
        before_eviction()
    prefill(m, 4, tokens(8, 400))  # two blocks: evicts the first two of the queue
    m.add_sequence(5, tokens(4, 100) + [7])
    return m, m.match_prefix(5) == 4


def test_a_higher_retention_priority_outlives_lru_order():
    m, kept = retention_scenario(priority=90)
    assert kept and m.stats().evictions == 2
    m.check_invariants()
    # At the default priority A0 is the least recently used, evicted first.
    _, kept = retention_scenario(priority=pk.DEFAULT_RETENTION_PRIORITY)
    assert not kept


@pytest.mark.parametrize("later, kept", [(9, True), (10, False)])
def test_a_retention_duration_expires_on_the_managers_clock(later, kept):
    # A0 is freed at time 0 with 10 ms of priority 90; at 10 ms it returns to its LRU place,
    # the head of the queue.
    now = [0]

    def advance():
        now[0] = later

    m, survived = retention_scenario(priority=90, duration_ms=10, clock=lambda: now[0],
                                     before_eviction=advance)
    assert survived == kept
    m.check_invariants()


def cached_pool(clock):
    """Four blocks of one token, cached as a chain and freed one by one in id order, block 1
    with priority 90 for 10 ms: queue [0, 2, 3, 1]."""
    pool = pk.BlockPool(num_blocks=4, block_size=1, clock=clock)
    assert pool.allocate(4).tolist() == [0, 1, 2, 3]
    parent = None
    for b in range(4):
        h = pk.BlockHash(b + 1, 0)
        assert pool.cache_full_block(b, h, b - 1 if b else -1, parent, [10 + b])
        parent = h
    pool.set_retention(1, 90, duration_ms=10)
    for b in range(4):
        pool.free([b])
    assert pool.free_queue_order().tolist() == [0, 2, 3, 1]
    return pool


@pytest.mark.parametrize("later, queue, priority", [
    (9, [2, 3, 1], 90),  # before the duration passes, block 1 keeps its priority
    (10, [1, 2, 3], pk.DEFAULT_RETENTION_PRIORITY),  # after: where its release put it
])
def test_block_pool_retention_expires_on_an_injected_clock(later, queue, priority):
    now = [0]
    pool = cached_pool(lambda: now[0])  # freed at time 0
    now[0] = later
    assert pool.allocate(1).tolist() == [0]
    assert pool.free_queue_order().tolist() == queue
    assert pool.retention_priority(1) == priority
    pool.check_invariants()


def test_set_retention_validates_and_keeps_the_higher_priority():
    pool = pk.BlockPool(num_blocks=2, block_size=1)
    with pytest.raises(pk.FailedPrecondition, match="block 0 is free"):
        pool.set_retention(0, 90)
    (b,) = pool.allocate(1)
    with pytest.raises(ValueError, match=r"block 2 outside \[0, 2\)"):
        pool.set_retention(2, 90)
    with pytest.raises(ValueError, match="priority -1"):
        pool.set_retention(b, -1)
    with pytest.raises(ValueError, match="duration_ms -5"):
        pool.set_retention(b, 50, -5)
    with pytest.raises(ValueError):
        pool.retention_priority(2)
    pool.set_retention(b, 80)
    pool.set_retention(b, 60)  # lower: ignored
    assert pool.retention_priority(b) == 80


def test_a_pool_reports_its_medium_in_events():
    events = pk.KvEventBuffer()
    pool = pk.BlockPool(num_blocks=1, block_size=1, event_sink=events, medium=pk.Medium.HOST)
    pool.allocate(1)
    h = pk.hash_block(None, [5])
    pool.cache_full_block(0, h, -1, None, [5])
    pool.uncache(0)
    assert describe(events.take()) == [("BlockStored", [h], pk.Medium.HOST),
                                       ("BlockRemoved", [h], pk.Medium.HOST)]


def test_stats_asdict_has_the_host_tier_counters():
    m = tiered(device_blocks=3, host_blocks=2)
    prefill(m, 1, tokens(8, 100))
    m.free(1)
    prefill(m, 2, tokens(12, 200))
    d = m.stats()._asdict()
    assert {k: d[k] for k in ("cached_host_blocks", "host_hit_tokens", "blocks_demoted",
                              "blocks_promoted", "host_evictions")} == {
        "cached_host_blocks": 2, "host_hit_tokens": 0, "blocks_demoted": 2,
        "blocks_promoted": 0, "host_evictions": 0}


# --- the clock as a Python callback ---------------------------------------------------------

def freed_with_duration(clock):
    """A manager whose free() reads the clock: sequence 1's first block has a duration."""
    m = pk.KvCacheManager(layer_groups=pk.full_attention(4), block_size=BLOCK_SIZE, clock=clock)
    m.add_sequence(1, tokens(5, 0),
                   retention=[pk.RetentionRange(priority=90, duration_ms=5)])
    m.allocate_slots(1, 5)
    m.take_step_ops()
    return m


def test_a_clock_that_raises_surfaces_after_the_call_and_state_stays_valid():
    class Boom(Exception):
        pass

    def clock():
        raise Boom("clock")

    m = freed_with_duration(clock)
    with pytest.raises(Boom, match="clock"):
        m.free(1)
    assert 1 not in m  # the call itself completed
    m.check_invariants()

    m = freed_with_duration(lambda: 1.5)
    with pytest.raises(TypeError, match="clock returned float; expected an int"):
        m.free(1)
    m.check_invariants()

    pool = pk.BlockPool(num_blocks=1, block_size=1, clock=clock)
    pool.allocate(1)
    pool.cache_full_block(0, pk.BlockHash(1, 2), -1, None, [3])
    pool.set_retention(0, 90, 5)
    with pytest.raises(Boom):
        pool.free([0])
    assert pool.num_free_blocks() == 1
    pool.check_invariants()


@pytest.mark.parametrize("result, message", [
    ("5", "clock returned str; expected an int of milliseconds"),
    (True, "clock returned bool; expected an int of milliseconds"),
    (2**70, r"clock returned 1180591620717411303424, outside the int64 range "
            r"\[-9223372036854775808, 9223372036854775807\]; expected an int of milliseconds"),
])
def test_a_clock_returning_a_wrong_type_raises_type_error(result, message):
    m = freed_with_duration(lambda: result)
    with pytest.raises(TypeError, match=f"^{message}$"):
        m.free(1)
    m.check_invariants()


def test_a_clock_may_return_a_numpy_integer():
    np = pytest.importorskip("numpy")
    freed_with_duration(lambda: np.int64(3)).free(1)


def test_a_clock_calling_back_into_its_manager_is_refused():
    def clock():
        m.add_sequence(9, [1])  # the C++ API forbids this: the manager is mid-call
        return 0

    m = freed_with_duration(clock)
    with pytest.raises(pk.FailedPrecondition, match="a callback called a mutating method"):
        m.free(1)
    assert len(m) == 0
    m.check_invariants()


def test_a_clock_referring_to_its_manager_is_garbage_collected():
    import gc
    import weakref

    class Clock:
        manager = None

        def __call__(self):
            return 0

    clock = Clock()
    clock.manager = pk.KvCacheManager(layer_groups=pk.full_attention(2), clock=clock)
    pool_clock = Clock()
    pool_clock.manager = pk.BlockPool(num_blocks=2, clock=pool_clock)
    refs = [weakref.ref(clock), weakref.ref(pool_clock)]
    del clock, pool_clock
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_admission_reused_drops_blocks_never_reused_and_demotes_them_once_they_come_back():
    m = pk.KvCacheManager(layer_groups=pk.full_attention(3, 4), block_size=BLOCK_SIZE,
                          enable_host_cache=True, host_admission=pk.HostAdmission.REUSED)
    assert m.options.host_admission == pk.HostAdmission.REUSED
    a = tokens(8, 100)
    prefill(m, 1, a)
    m.free(1)
    # B0..B2 evict A1 and A0: never hit, so dropped; their hashes become ghosts.
    prefill(m, 2, tokens(12, 200))
    s = m.stats()
    assert (s.evictions, s.blocks_not_admitted, s.blocks_demoted) == (2, 2, 0)
    m.free(2)
    # A again, computed while its hashes are ghosts (evicting B2 and B1, dropped too).
    prefill(m, 3, a)
    s = m.stats()
    assert (s.blocks_not_admitted, s.ghost_hits) == (4, 2)
    m.free(3)
    # C evicts B0 (dropped), then A1 and A0: reused, so demoted.
    prefill(m, 4, tokens(12, 300))
    s = m.stats()
    assert (s.blocks_not_admitted, s.blocks_demoted, s.cached_host_blocks) == (5, 2, 2)
    assert m.group_stats(0).ghost_hits == 2
    m.check_invariants()


def test_adaptive_eviction_keeps_a_reused_prompt_through_one_off_prompts():
    # The scan of tests/examples/simulator/simulator_test.cc through the manager: a
    # 2-block prompt used twice, then three one-off 2-block prompts before each of its next
    # 5 uses, in a 5-block pool. LRU evicts it every time; the adaptive policy keeps it (frequent).
    hits = {}
    for policy in (pk.EvictionPolicy.LRU, pk.EvictionPolicy.ADAPTIVE):
        m = pk.KvCacheManager(layer_groups=pk.full_attention(5), block_size=BLOCK_SIZE,
                              eviction_policy=policy)
        assert m.options.eviction_policy == policy
        reused = tokens(8, 100)
        prompts = [reused, reused]
        for r in range(5):
            prompts += [tokens(8, 1000 + 100 * (3 * r + i)) for i in range(3)] + [reused]
        for seq, prompt in enumerate(prompts):
            prefill(m, seq, prompt + [7])  # one token past the blocks: every block can hit
            m.free(seq)
        m.check_invariants()
        hits[policy] = m.stats().prefix_hit_tokens
    assert hits[pk.EvictionPolicy.LRU] == 8
    assert hits[pk.EvictionPolicy.ADAPTIVE] == 8 * 6
    pool = pk.BlockPool(num_blocks=2, eviction_policy=pk.EvictionPolicy.ADAPTIVE)
    assert pool.stats().recent_ghost_hits == 0
