"""The batched step calls against the per-sequence calls: after the same random operation
sequences, two managers hold identical tables, slots and stats."""

import random

import numpy as np
import pytest

import pagedkv as pk

BLOCK = 4


class Victims:
    def __init__(self):
        self.seqs = []

    def on_preempt(self, victim, mode):
        self.seqs.append(victim)


def make(mode=pk.PreemptionMode.RECOMPUTE, host_cache=False):
    hooks = Victims()
    m = pk.KvCacheManager(layer_groups=pk.full_attention(24, 8), block_size=BLOCK,
                          enable_host_cache=host_cache, preemption_mode=mode,
                          preemption_hooks=hooks)
    return m, hooks


def per_sequence_allocate(m, hooks, seqs, counts, preempt):
    """What allocate_slots_batch documents, written with per-sequence calls."""
    slots, status = [], []
    hooks.seqs.clear()
    for seq, n in zip(seqs, counts):
        try:
            if seq in hooks.seqs:
                raise pk.FailedPrecondition("preempted by an earlier sequence of this batch")
            call = m.allocate_slots_or_preempt if preempt else m.allocate_slots
            slots.extend(call(seq, n).tolist())
            status.append(pk.StatusCode.OK)
        except (KeyError, ValueError, RuntimeError) as e:
            slots.extend([-1] * max(n, 0))
            status.append({KeyError: pk.StatusCode.NOT_FOUND,
                           pk.AlreadyExists: pk.StatusCode.ALREADY_EXISTS,
                           ValueError: pk.StatusCode.INVALID_ARGUMENT,
                           pk.ResourceExhausted: pk.StatusCode.RESOURCE_EXHAUSTED,
                           pk.FailedPrecondition: pk.StatusCode.FAILED_PRECONDITION}[type(e)])
    return slots, [int(s) for s in status]


def per_sequence_append(m, seqs, tokens):
    status = []
    for seq, tok in zip(seqs, tokens):
        try:
            m.append_tokens(seq, [tok])
            status.append(0)
        except KeyError:
            status.append(int(pk.StatusCode.NOT_FOUND))
    return status


def snapshot(m):
    running = [s.id for s in m.running_sequences()]
    t = m.build_block_tables(running)
    seqs = {}
    for seq in range(40):
        if seq in m:
            v = m.sequence(seq)
            seqs[seq] = (v.state, v.tokens.tolist(), v.block_table.tolist(),
                         v.host_blocks.tolist(), v.num_computed_tokens)
    ops = m.take_step_ops()
    return (running, t.block_table.tolist(), t.context_lens.tolist(), t.indices.tolist(),
            m.stats()._asdict(), seqs, ops.copy_on_write,
            (ops.swap_out, ops.demote, ops.swap_in, ops.promote, ops.exchange))


@pytest.mark.parametrize("host_cache", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_batched_calls_match_per_sequence_calls(seed, host_cache):
    rng = random.Random(seed)
    mode = pk.PreemptionMode.SWAP if seed % 2 else pk.PreemptionMode.RECOMPUTE
    a, a_hooks = make(mode, host_cache)  # per-sequence calls
    b, b_hooks = make(mode, host_cache)  # batched calls
    next_id = 0
    for step in range(60):
        op = rng.random()
        if op < 0.25:  # admit a request (shared prefixes make prefix hits)
            prompt = [rng.randrange(3)] * rng.randrange(4, 10) + [rng.randrange(100)]
            for m in (a, b):
                m.add_sequence(next_id, prompt)
                cached = m.match_prefix(next_id)
            next_id += 1
        elif op < 0.35 and next_id:  # free one
            seq = rng.randrange(next_id)
            for m in (a, b):
                if seq in m:
                    m.free(seq)
        elif op < 0.38 and next_id:  # swap a swapped one back in, when it fits
            swapped = [s for s in range(next_id)
                       if s in a and a.sequence(s).state == pk.SequenceState.SWAPPED]
            if swapped:
                seq = rng.choice(swapped)
                for m in (a, b):
                    try:
                        m.swap_in(seq)
                    except pk.ResourceExhausted:
                        pass
        elif op < 0.45 and next_id:  # fork a running one
            running = [s.id for s in a.running_sequences()]
            if running:
                parent = rng.choice(running)
                for m in (a, b):
                    m.fork(parent, next_id)
                next_id += 1
        else:  # a decode (or prefill) step over a random batch, unknown ids included
            seqs = rng.sample(range(next_id + 2), min(next_id + 2, rng.randrange(1, 8)))
            tokens = [rng.randrange(100) for _ in seqs]
            assert b.append_tokens_batch(np.array(seqs, np.int64), np.array(tokens, np.int32)
                                         ).status.tolist() == per_sequence_append(a, seqs, tokens)
            counts = []
            for seq in seqs:
                if seq in a:
                    v = a.sequence(seq)
                    counts.append(len(v.tokens) - v.num_computed_tokens)
                else:
                    counts.append(1)
            preempt = rng.random() < 0.5
            expected_slots, expected_status = per_sequence_allocate(a, a_hooks, seqs, counts,
                                                                    preempt)
            b_hooks.seqs.clear()
            batch = b.allocate_slots_batch(seqs, counts, preempt=preempt)
            assert batch.slots.tolist() == expected_slots
            assert batch.status.tolist() == expected_status
            assert sorted(batch.errors) == sorted(s for s, c in zip(seqs, expected_status) if c)
            assert a_hooks.seqs == b_hooks.seqs
        assert snapshot(a) == snapshot(b)
        a.check_invariants()
        b.check_invariants()


def test_batch_into_caller_array_with_scalar_count():
    m, _ = make()
    for seq in (1, 2):
        m.add_sequence(seq, [seq] * 3)
    out = np.zeros(8, np.int64)
    batch = m.allocate_slots_batch(np.array([1, 2], np.int64), 3, out=out)
    assert batch.slots is out and batch.ok
    assert out[:6].tolist() == [0, 1, 2, 4, 5, 6]
    with pytest.raises(ValueError, match="out holds 1 slots"):
        m.allocate_slots_batch([1], 2, out=np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="2 num_new_tokens for 1 sequences"):
        m.allocate_slots_batch([1], [1, 1])


def test_append_tokens_batch_with_indptr():
    m, _ = make()
    for seq in (1, 2):
        m.add_sequence(seq, [0])
    result = m.append_tokens_batch([1, 2, 9], [5, 6, 7, 8], indptr=[0, 3, 4, 4])
    assert result.status.tolist() == [0, 0, int(pk.StatusCode.NOT_FOUND)]
    assert isinstance(result.errors[9], KeyError) and not result.ok
    assert m.sequence(1).tokens.tolist() == [0, 5, 6, 7]
    assert m.sequence(2).tokens.tolist() == [0, 8]
    with pytest.raises(ValueError, match="indptr"):
        m.append_tokens_batch([1], [5], indptr=[0, 2])


def test_batch_arguments_are_checked_before_anything_changes():
    m, _ = make()
    m.add_sequence(1, [0])
    m.add_sequence(2, [0])
    with pytest.raises(ValueError, match="1 num_new_tokens for 2 sequences"):
        m.allocate_slots_batch([1, 2], [1])  # one count for all is an int
    with pytest.raises(ValueError, match="1 tokens for 2 sequences"):
        m.append_tokens_batch([1, 2], [5])
    with pytest.raises(ValueError, match="0 indptr entries for 2 sequences"):
        m.append_tokens_batch([1, 2], [5, 6], indptr=[])  # not "one token each"
    assert [m.sequence(s).tokens.tolist() for s in (1, 2)] == [[0], [0]]
    assert m.stats().used_blocks == 0
    m.check_invariants()


def test_a_hook_that_raises_in_a_batch_surfaces_after_the_call():
    class Boom(Exception):
        pass

    class Hooks:
        def on_preempt(self, victim, mode):
            raise Boom(victim)

    m = pk.KvCacheManager(layer_groups=pk.full_attention(4), block_size=BLOCK,
                          preemption_hooks=Hooks())
    for seq in (1, 2):
        m.add_sequence(seq, list(range(10 * seq, 10 * seq + 8)))
    assert m.allocate_slots_batch([1, 2], 8).ok
    m.take_step_ops()
    m.add_sequence(3, [9] * 4)
    with pytest.raises(Boom, match="2"):  # the latest arrival of the lowest priority
        m.allocate_slots_batch([3, 2], [4, 0], preempt=True)
    # The batch ran to its end: 3 admitted, 2 preempted (and not re-admitted by its entry).
    assert m.sequence(3).state == pk.SequenceState.RUNNING
    assert m.sequence(2).state == pk.SequenceState.WAITING
    m.check_invariants()
