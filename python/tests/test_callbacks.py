"""Preemption hooks, victim policies and event sinks written in Python."""

import pytest

import pagedkv as pk


class Hooks:
    def __init__(self):
        self.calls = []

    def on_preempt(self, victim, mode):
        self.calls.append((victim, mode))


class Sink:
    def __init__(self):
        self.events = []

    def on_event(self, event):
        self.events.append(event)


def fill(m, seqs, n=8):
    for seq in seqs:
        m.add_sequence(seq, list(range(seq * 100, seq * 100 + n)))
        m.allocate_slots(seq, n)
    m.take_step_ops()


def test_hooks_and_policy_decide_the_victim():
    hooks = Hooks()
    seen = []

    def policy(running, requester):
        seen.append(([s.id for s in running], requester))
        return max(running, key=lambda s: s.id).id  # a plain id: the manager's mode

    m = pk.KvCacheManager(layer_groups=pk.full_attention(6), block_size=4, preemption_hooks=hooks,
                          victim_policy=policy)
    fill(m, [1, 2, 3])
    m.add_sequence(4, list(range(8)))
    m.allocate_slots_or_preempt(4, 8)
    assert seen == [([1, 2, 3], 4)]
    assert hooks.calls == [(3, pk.PreemptionMode.RECOMPUTE)]
    m.check_invariants()


def test_policy_can_choose_swap_or_give_up():
    choices = iter([pk.Preemption(victim=1, mode=pk.PreemptionMode.SWAP), None])
    m = pk.KvCacheManager(layer_groups=pk.full_attention(4, 4), block_size=4,
                          victim_policy=lambda running, requester: next(choices))
    fill(m, [1, 2])
    m.add_sequence(3, list(range(8)))
    m.allocate_slots_or_preempt(3, 8)
    assert m.sequence(1).state == pk.SequenceState.SWAPPED
    m.take_step_ops()
    m.add_sequence(4, list(range(8)))
    with pytest.raises(pk.ResourceExhausted):
        m.allocate_slots_or_preempt(4, 8)  # the policy gave up


def test_event_sink_in_python_sees_stored_removed_and_cleared():
    sink = Sink()
    m = pk.KvCacheManager(layer_groups=pk.full_attention(2), block_size=4, event_sink=sink)
    fill(m, [1])
    m.free(1)
    fill(m, [2])  # evicts sequence 1's cached blocks
    m.reset_prefix_cache()
    kinds = [type(e).__name__ for e in sink.events]
    # Grouped as vLLM groups them: one BlockStored per call, one BlockRemoved per block.
    assert kinds == ["BlockStored", "BlockRemoved", "BlockRemoved", "BlockStored",
                     "AllBlocksCleared"]
    stored, removed = sink.events[0], sink.events[1:3]
    assert len(stored.block_hashes) == 2 and stored.parent_hash is None
    assert stored.token_ids == list(range(100, 108))
    assert [e.block_hashes[0] for e in removed] == stored.block_hashes[::-1]  # tail first


def test_exceptions_in_callbacks_surface_after_the_call_and_state_stays_valid():
    class Boom(Exception):
        pass

    class BadSink:
        def on_event(self, event):
            raise Boom("sink")

    m = pk.KvCacheManager(layer_groups=pk.full_attention(8), block_size=4, event_sink=BadSink())
    m.add_sequence(1, list(range(8)))
    with pytest.raises(Boom, match="sink"):
        m.allocate_slots(1, 8)
    assert m.sequence(1).num_computed_tokens == 8  # the call itself completed
    m.check_invariants()

    def bad_policy(running, requester):
        raise Boom("policy")

    class BadHooks:
        def on_preempt(self, victim, mode):
            raise Boom("hooks")

    m = pk.KvCacheManager(layer_groups=pk.full_attention(2), block_size=4, victim_policy=bad_policy)
    fill(m, [1])
    m.add_sequence(2, list(range(8)))
    with pytest.raises(Boom, match="policy"):
        m.allocate_slots_or_preempt(2, 8)
    assert m.sequence(1).state == pk.SequenceState.RUNNING  # a raising policy gives up

    m = pk.KvCacheManager(layer_groups=pk.full_attention(2), block_size=4,
                          preemption_hooks=BadHooks())
    fill(m, [1])
    with pytest.raises(Boom, match="hooks"):
        m.preempt(1, pk.PreemptionMode.RECOMPUTE)
    assert m.sequence(1).state == pk.SequenceState.WAITING
    m.check_invariants()


@pytest.mark.parametrize("result, message", [
    ("x", "victim policy returned str; expected a Preemption, an int sequence id or None"),
    (1.0, "victim policy returned float; expected a Preemption, an int sequence id or None"),
    ([1], "victim policy returned list; expected a Preemption, an int sequence id or None"),
    (True, "victim policy returned bool; expected a Preemption, an int sequence id or None"),
    (2**70, "victim policy returned 1180591620717411303424, outside the sequence id range "
            r"\[-9223372036854775808, 9223372036854775807\]; expected a Preemption, an int "
            "sequence id or None"),
])
def test_a_policy_returning_a_wrong_type_raises_type_error(result, message):
    m = pk.KvCacheManager(layer_groups=pk.full_attention(2), block_size=4, victim_policy=lambda r,
                          q: result)
    fill(m, [1])
    m.add_sequence(2, list(range(8)))
    with pytest.raises(TypeError, match=f"^{message}$"):
        m.allocate_slots_or_preempt(2, 8)
    assert m.sequence(1).state == pk.SequenceState.RUNNING  # a wrong answer gives up
    m.check_invariants()


def test_a_policy_may_return_a_numpy_integer_id():
    np = pytest.importorskip("numpy")
    m = pk.KvCacheManager(layer_groups=pk.full_attention(2), block_size=4, victim_policy=lambda r,
                          q: np.int64(1))
    fill(m, [1])
    m.add_sequence(2, list(range(8)))
    m.allocate_slots_or_preempt(2, 8)
    assert m.sequence(1).state == pk.SequenceState.WAITING


def test_a_callback_calling_back_into_its_manager_is_refused():
    class Reentrant:
        def on_preempt(self, victim, mode):
            m.free(victim)  # the C++ API forbids this: the manager is mid-call

    m = pk.KvCacheManager(layer_groups=pk.full_attention(2), block_size=4,
                          preemption_hooks=Reentrant())
    fill(m, [1])
    with pytest.raises(pk.FailedPrecondition, match="a callback called a mutating method"):
        m.preempt(1, pk.PreemptionMode.RECOMPUTE)
    assert m.sequence(1).state == pk.SequenceState.WAITING  # the preemption itself happened
    m.free(1)  # and the manager is usable again
    m.check_invariants()


def test_callbacks_referring_to_their_manager_are_garbage_collected():
    import gc

    collected = []

    class Hooks:
        def __init__(self):
            self.manager = None

        def on_preempt(self, victim, mode):
            pass

        def __del__(self):
            collected.append(True)

    hooks = Hooks()
    hooks.manager = pk.KvCacheManager(layer_groups=pk.full_attention(2), preemption_hooks=hooks,
                                      victim_policy=lambda r, q: hooks.manager and None)
    class PoolSink(Sink):
        pool = None

    sink = PoolSink()
    sink.pool = pk.BlockPool(num_blocks=2, event_sink=sink)
    del hooks, sink
    gc.collect()
    assert collected == [True]
