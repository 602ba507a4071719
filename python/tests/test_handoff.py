"""Speculative decoding and hand-offs between engines from Python: draft slots and their
verdict, export_sequence / import_slots / complete_import, and their errors."""

import numpy as np
import pytest

import pagedkv as pk


def make(num_blocks=8):
    return pk.KvCacheManager(layer_groups=pk.full_attention(num_blocks), block_size=4)


def decoding(m, seq=1, prompt=tuple(range(100, 110)), sampled=500):
    """seq's prompt computed in a step that ended, its sampled token appended."""
    m.add_sequence(seq, list(prompt))
    assert m.match_prefix(seq) == 0
    m.allocate_slots(seq, len(prompt))
    m.take_step_ops()
    m.append_tokens(seq, [sampled])


def test_drafts_get_slots_and_rejected_ones_roll_back():
    m = make()
    decoding(m)
    # Token 10 and the drafts at 11-13: block 2's last two slots, then block 3.
    slots = m.allocate_draft_slots(1, 1, [501, 502, 503])
    assert slots.dtype == np.int64 and slots.tolist() == [10, 11, 12, 13]
    assert m.sequence(1).num_computed_tokens == 14
    with pytest.raises(pk.FailedPrecondition, match="has not ended"):
        m.accept_draft(1, 1)
    m.take_step_ops()
    m.accept_draft(1, 1)
    view = m.sequence(1)
    assert view.tokens.tolist()[10:] == [500, 501]
    assert view.block_table.tolist() == [0, 1, 2]  # block 3 held only rejected drafts
    assert m.stats().draft_tokens == 3 and m.stats().accepted_draft_tokens == 1
    with pytest.raises(ValueError, match="0 new tokens and 1 drafts"):
        m.allocate_draft_slots(1, 0, [7])
    with pytest.raises(pk.FailedPrecondition, match="holds no drafts"):
        m.accept_draft(1, 0)
    m.check_invariants()


def test_a_request_hands_off_from_one_manager_to_another():
    prefill, decode = make(), make()
    decoding(prefill)
    sent = prefill.export_sequence(1)
    assert isinstance(sent, pk.KvExport)
    assert sent.seq == 1 and sent.tokens == list(range(100, 110))
    assert len(sent.block_hashes) == 2
    assert [(g.first_entry, g.blocks) for g in sent.groups] == [(0, [0, 1, 2])]
    assert 1 not in prefill and prefill.stats().pinned_blocks == 3

    decode.add_sequence(1, sent.tokens + [500])
    assert decode.match_prefix(1) == 0
    wanted = decode.import_slots(1, len(sent.tokens))
    assert isinstance(wanted, pk.KvImport)
    assert (wanted.num_local_tokens, wanted.num_tokens) == (0, 10)
    assert [(g.first_entry, g.blocks) for g in wanted.groups] == [(0, [0, 1, 2])]
    with pytest.raises(pk.FailedPrecondition, match="imported tokens pending"):
        decode.build_block_tables([1])
    decode.take_step_ops()  # then the transfer fills the blocks; block 1 arrives corrupt
    assert decode.complete_import(1, [1]) == 4
    assert decode.sequence(1).block_table.tolist() == [0]
    assert decode.stats().imported_tokens == 4
    assert decode.stats().discarded_import_tokens == 6
    assert decode.allocate_slots(1, 7).size == 7  # the rest is recomputed
    prefill.release_export(1)
    assert prefill.stats().pinned_blocks == 0
    prefill.check_invariants()
    decode.check_invariants()


def test_hand_off_errors_name_the_value_and_change_nothing():
    m = make()
    with pytest.raises(KeyError):
        m.export_sequence(3)
    with pytest.raises(KeyError):
        m.release_export(3)
    m.add_sequence(2, list(range(11)))
    with pytest.raises(ValueError, match=r"num_tokens 12 outside \(0, 11\]"):
        m.import_slots(2, 12)
    m.import_slots(2, 8)
    m.take_step_ops()
    with pytest.raises(ValueError, match=r"3 verified blocks in group 0 outside \[0, 2\]"):
        m.complete_import(2, [3])
    with pytest.raises(ValueError, match="int32"):
        m.complete_import(2, [2**40])
    assert m.sequence(2).num_computed_tokens == 8
    assert m.complete_import(2, np.array([2], dtype=np.int32)) == 8
    m.check_invariants()
